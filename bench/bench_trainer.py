"""Benchmark the estimators inside a training step (a script, not a test): advcli.torch's
compute_advantage at trajectory level, against verl's own GRPO and a per-row Python loop.

1. bs = 1,000,000 rows with int64 ids, where each trajectory id belongs to one group (a global
   rollout counter): trajectory-level GRPO against verl 0.9.1's
   ``compute_grpo_vectorized_outcome_advantage`` (every row counts; verl has no trajectory level),
   at response_length 1 (the statistics alone) and 32. Target: within 2x.
2. bs = 20,000 rows with uuid-string ids: against the per-row Python loop of the same semantics
   (bench_torch.loop_grpo), and advcli.verl.compute_advantage on the same rows as a verl
   DataProto, without and with its bias metrics (the other level and compare's figures on the
   batch's key projection). Target: >= 50x. Beside them, the floor the string ids set: the
   fastest of three factorizations of the two id columns (advcli.torch's dict pass, Arrow's
   dictionary_encode, Polars' string column then Arrow's), and advcli.torch on the same rows
   with int64 ids.
3. The same as 1 on CUDA, when a device is present.

Each figure is the median of interleaved runs, measured twice: with the machine as it is
(``idle``), and with one core kept busy by a spinning process the script starts and stops
itself (``loaded``: a trainer's data loader or another job, where torch's intra-op threads
would wait for each other). Run from the repository root::

    python bench/bench_trainer.py [--repeats N] [--load idle|loaded|both]
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import subprocess
import sys
import time
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_torch import loop_grpo, make_batch, median_times

from advcli.torch import compute_advantage
from advcli.torch.ids import raw_codes

with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # verl's imports warn (Ray's state API, no megatron)
    from verl import DataProto
    from verl.trainer.ppo.core_algos import compute_grpo_vectorized_outcome_advantage

from advcli.verl import compute_advantage as verl_batch_advantage


def bench_vectorized(repeats: int, device: str) -> list[dict[str, float]]:
    rows = []
    for response_length in (1, 32):
        bs = 1_000_000
        rewards, mask, group, rollout = make_batch(bs, response_length, seed=1)
        # A global rollout counter: each trajectory id belongs to one group.
        trajectory = group * 8 + rollout
        rewards, mask = rewards.to(device), mask.to(device)
        index = torch.from_numpy(group).to(device)
        traj = torch.from_numpy(trajectory).to(device)

        def verl(rewards=rewards, mask=mask, index=index) -> object:  # type: ignore[no-untyped-def]
            return compute_grpo_vectorized_outcome_advantage(rewards, mask, index)

        def ours(rewards=rewards, mask=mask, index=index, traj=traj) -> object:  # type: ignore[no-untyped-def]
            return compute_advantage(rewards, mask, index, traj)

        times = median_times({"verl": verl, "ours": ours}, repeats)
        rows.append(
            {
                "response_length": response_length,
                "verl_ms": times["verl"] * 1e3,
                "ours_ms": times["ours"] * 1e3,
                "ratio": times["ours"] / times["verl"],
            }
        )
    return rows


def bench_loop(repeats: int) -> dict[str, Any]:
    bs, response_length = 20_000, 32
    rewards, mask, group, rollout = make_batch(bs, response_length, seed=0)
    uid = np.array([str(uuid.UUID(int=int(g) + 1)) for g in group], dtype=object)
    traj_uid = np.array(
        [
            str(uuid.uuid5(uuid.NAMESPACE_OID, f"{g}/{r}"))
            for g, r in zip(group, rollout, strict=True)
        ],
        dtype=object,
    )
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": mask},
        non_tensors={"uid": uid, "traj_uid": traj_uid},
    )

    def loop() -> object:
        return loop_grpo(rewards, mask, uid, traj_uid, compute_mean_std_cross_all_data=False)

    def ours() -> object:
        return compute_advantage(rewards, mask, uid, traj_uid)

    def on_batch() -> object:
        return verl_batch_advantage(batch, bias_metrics=False)

    def with_bias() -> object:
        return verl_batch_advantage(batch)

    group_ids, traj_ids = torch.from_numpy(group), torch.from_numpy(group * 8 + rollout)

    def integer_ids() -> object:
        return compute_advantage(rewards, mask, group_ids, traj_ids)

    expected = loop()[0]  # type: ignore[index]
    difference = float((ours()[0] - expected).abs().max())
    factorizations = {
        f"factorize: {name}": functools.partial(_both, codes, uid, traj_uid)
        for name, codes in FACTORIZATIONS.items()
    }
    times = median_times(
        {"loop": loop, "ours": ours, "batch": on_batch, "bias": with_bias}, repeats
    )
    # The calling thread's CPU time, which leaves out what other processes take of its core (a
    # 5 ms call loses a whole time slice when it is preempted, a 200 ms loop its share).
    cpu = median_times(
        {"loop": loop, "ours": ours, "integer_ids": integer_ids} | factorizations,
        repeats,
        clock=time.thread_time,
    )
    fastest = min(factorizations, key=cpu.__getitem__)
    return {
        "loop_ms": times["loop"] * 1e3,
        "ours_ms": times["ours"] * 1e3,
        "batch_ms": times["batch"] * 1e3,
        "bias_ms": times["bias"] * 1e3,
        "speedup": times["loop"] / times["ours"],
        "batch_speedup": times["loop"] / times["batch"],
        "max_abs_diff": difference,
        "cpu_loop_ms": cpu["loop"] * 1e3,
        "cpu_ours_ms": cpu["ours"] * 1e3,
        "cpu_speedup": cpu["loop"] / cpu["ours"],
        "cpu_integer_ids_ms": cpu["integer_ids"] * 1e3,
        "cpu_factorize_ms": {
            name.removeprefix("factorize: "): cpu[name] * 1e3 for name in factorizations
        },
        "cpu_floor_ms": (cpu[fastest] + cpu["integer_ids"]) * 1e3,
        "cpu_floor_speedup": cpu["loop"] / (cpu[fastest] + cpu["integer_ids"]),
    }


def _both(codes: Callable[[np.ndarray], object], uid: np.ndarray, traj_uid: np.ndarray) -> object:
    return codes(uid), codes(traj_uid)


def _dict_pass(ids: np.ndarray) -> object:
    return raw_codes(ids, len(ids), torch.device("cpu"), "ids").values


def _arrow(ids: np.ndarray) -> object:
    return pa.array(ids, type=pa.string()).dictionary_encode().indices


def _polars_arrow(ids: np.ndarray) -> object:
    return pl.Series(ids, dtype=pl.String).to_arrow().dictionary_encode().indices


# Three ways to give each id a code (equal ids, equal codes) without a Python loop.
FACTORIZATIONS: dict[str, Callable[[np.ndarray], object]] = {
    "advcli.torch's dict pass": _dict_pass,
    "Arrow": _arrow,
    "Polars, then Arrow": _polars_arrow,
}


class Spinner:
    """One process spinning on a core while the block runs (started and stopped here)."""

    def __enter__(self) -> Spinner:
        self.process = subprocess.Popen([sys.executable, "-c", "while True: pass"])
        return self

    def __exit__(self, *exc: object) -> None:
        self.process.kill()
        self.process.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=11, help="runs per measurement (median)")
    parser.add_argument(
        "--load",
        choices=("idle", "loaded", "both"),
        default="both",
        help="measure as the machine is, with one core kept busy, or both",
    )
    args = parser.parse_args()
    threads = torch.get_num_threads()
    print(
        f"torch {torch.__version__}, {os.cpu_count()} CPUs, {torch.get_num_threads()} torch "
        f"threads, python {platform.python_version()}; median of interleaved runs"
    )
    for load in ("idle", "loaded"):
        if args.load in (load, "both"):
            print(
                f"\n== {load}"
                + (": one other process spinning on a core" if load == "loaded" else "")
            )
            if load == "loaded":
                with Spinner():
                    report(args.repeats)
            else:
                report(args.repeats)
    print(f"\ntorch threads: {threads} before, {torch.get_num_threads()} after every call")


def report(repeats: int) -> None:
    print(
        "(1) trajectory-level GRPO vs verl's compute_grpo_vectorized_outcome_advantage, "
        "bs=1,000,000, int64 ids, trajectory ids a global counter (target: <= 2x)"
    )
    print(f"{'response_length':>16}{'verl ms':>10}{'advcli ms':>11}{'ratio':>8}")
    for row in bench_vectorized(repeats, "cpu"):
        print(
            f"{row['response_length']:>16}{row['verl_ms']:>10.1f}{row['ours_ms']:>11.1f}"
            f"{row['ratio']:>7.2f}x"
        )

    loop = bench_loop(repeats)
    print(
        "(2) trajectory-level GRPO vs a per-row Python loop, bs=20,000, uuid-string ids, "
        "response_length 32 (target: >= 50x)"
    )
    print(
        f"loop {loop['loop_ms']:.1f} ms; advcli.torch {loop['ours_ms']:.2f} ms "
        f"({loop['speedup']:.0f}x); advcli.verl on a DataProto {loop['batch_ms']:.2f} ms "
        f"({loop['batch_speedup']:.0f}x); max |diff| {loop['max_abs_diff']:.1e}"
    )
    print(
        f"advcli.verl with its bias metrics (both levels, compare's figures) "
        f"{loop['bias_ms']:.2f} ms: +{loop['bias_ms'] - loop['batch_ms']:.2f} ms"
    )
    factorized = ", ".join(f"{name} {ms:.2f}" for name, ms in loop["cpu_factorize_ms"].items())
    print(
        f"the calling thread's CPU time: loop {loop['cpu_loop_ms']:.1f} ms; advcli.torch "
        f"{loop['cpu_ours_ms']:.2f} ms ({loop['cpu_speedup']:.0f}x). The floor of string ids: "
        f"factorizing the two id columns takes {factorized} ms; advcli.torch on int64 ids of "
        f"the same rows {loop['cpu_integer_ids_ms']:.2f} ms; the fastest factorization and "
        f"that {loop['cpu_floor_ms']:.2f} ms ({loop['cpu_floor_speedup']:.0f}x)"
    )

    if torch.cuda.is_available():
        print("(3) as (1), on CUDA")
        for row in bench_vectorized(repeats, "cuda"):
            print(
                f"{row['response_length']:>16}{row['verl_ms']:>10.2f}{row['ours_ms']:>11.2f}"
                f"{row['ratio']:>7.2f}x"
            )
    else:
        print("(3) CUDA: no device on this machine, not measured")


if __name__ == "__main__":
    main()
