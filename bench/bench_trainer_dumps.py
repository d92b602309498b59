"""Time `compare` on trainers' own JSON-lines dumps against their floor, and print the ratios.

Two dumps of ``--rows`` rows, written the way the trainers write them (see
tests/trainers/test_nemo_rl_dump.py and test_prime_rl_traces.py): NeMo-RL's
``train_data_step{N}.jsonl`` (every field a list of one value, 16 prompt and up to 32 response
tokens a row, groups of 8) and prime-rl's ``traces.jsonl`` (a verifiers Episode a line with one
trace, groups of 8). For each, as whole processes, interleaved ``--runs`` times (medians):

- ``compare FILE`` against a Polars scan that selects the same fields of the same file, the
  floor for JSON lines: the ratio of their times;
- the peak memory of ``compare FILE`` against that of ``compare`` over the same rows as Parquet.

    python bench/bench_trainer_dumps.py                 # 1,000,000 rows, 3 runs
    python bench/bench_trainer_dumps.py --rows 100000 --runs 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl

GROUP = 8
PROMPT, RESPONSE = 16, 32


def nemo_rl(rows: int, seed: int = 1) -> pl.DataFrame:
    """A NeMo-RL train data batch of ``rows`` rows: each field a one-row slice."""
    rng = np.random.default_rng(seed)
    width = PROMPT + RESPONSE
    prompts = np.repeat(rng.integers(1, 50_000, size=(rows // GROUP, PROMPT)), GROUP, axis=0)
    ids = np.concatenate([prompts, rng.integers(1, 50_000, size=(rows, RESPONSE))], axis=1)
    lengths = rng.integers(1, RESPONSE + 1, size=rows)
    position = np.arange(width)
    mask = ((position >= PROMPT) & (position < PROMPT + lengths[:, None])).astype(np.int64)
    ids = np.where((mask == 1) | (position < PROMPT), ids, 0)
    advantages = np.repeat(rng.normal(size=(rows, 1)), width, axis=1)
    one = pl.Series  # each field is a list of one value: a value wrapped once more
    return pl.DataFrame(
        {
            "content": pl.Series([[["user: q", "assistant: a"]]] * rows),
            "rewards": one(rng.integers(0, 2, size=rows).astype(np.float64)).reshape((rows, 1)),
            "input_lengths": one(PROMPT + lengths).reshape((rows, 1)),
            "token_ids": one(ids.ravel()).reshape((rows, 1, width)),
            "token_loss_mask": one(mask.ravel()).reshape((rows, 1, width)),
            "sample_loss_mask": one(np.ones(rows)).reshape((rows, 1)),
            "advantages": one(advantages.ravel()).reshape((rows, 1, width)),
            "idx": np.arange(rows),
        }
    ).with_columns(
        pl.col("rewards", "input_lengths", "sample_loss_mask").arr.to_list(),
        pl.col("token_ids", "token_loss_mask", "advantages")
        .arr.to_list()
        .list.eval(pl.element().arr.to_list()),
    )


def prime_rl(rows: int, seed: int = 2) -> pl.DataFrame:
    """prime-rl episodes of one trace: a user node and a sampled assistant node each."""
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, RESPONSE + 1, size=rows)
    sampled = [[True] * int(length) for length in lengths]
    nodes = pl.DataFrame(
        {
            "prompt": pl.Series([[False] * PROMPT] * rows),
            "sampled": pl.Series(sampled),
            "ids": pl.Series([list(range(int(length))) for length in lengths]),
        }
    ).select(
        pl.concat_list(
            pl.struct(
                pl.lit(False).alias("sampled"),
                pl.lit(list(range(PROMPT))).alias("token_ids"),
                pl.col("prompt").alias("mask"),
            ),
            pl.struct(
                pl.lit(True).alias("sampled"),
                pl.col("ids").alias("token_ids"),
                pl.col("sampled").alias("mask"),
            ),
        ).alias("nodes")
    )["nodes"]
    scores = rng.integers(0, 2, size=rows).astype(np.float64)
    trace = pl.DataFrame(
        {
            "id": [f"trace-{row}" for row in range(rows)],
            "agent": pl.Series([{"name": "agent", "trainable": True}] * rows),
            "nodes": nodes,
            "rewards": pl.Series([{"correct": {"score": s, "weight": 1.0}} for s in scores]),
            "ok": np.ones(rows, dtype=bool),
        }
    ).select(pl.struct(pl.all()).implode().over(pl.int_range(pl.len())).alias("traces"))
    return pl.DataFrame(
        {
            "id": [f"episode-{row}" for row in range(rows)],
            "group": pl.Series([{"id": f"g{row // GROUP}"} for row in range(rows)]),
            "ok": np.ones(rows, dtype=bool),
        }
    ).with_columns(trace["traces"])


FIELDS = {
    "nemo-rl": ["token_ids", "token_loss_mask", "rewards", "advantages"],
    "prime-rl": ["group", "traces"],
}


def timed(command: list[str]) -> tuple[float, int]:
    """A whole process's wall seconds and peak resident memory (bytes)."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(process.pid, 0)
    if status != 0:
        raise SystemExit(f"{' '.join(command)} failed ({status})")
    return time.perf_counter() - started, usage.ru_maxrss * 1024


def scan(path: Path, fields: list[str]) -> list[str]:
    code = f"import polars as pl; pl.scan_ndjson({str(path)!r}).select({fields!r}).collect()"
    return [sys.executable, "-c", code]


def compare(path: Path) -> list[str]:
    return [sys.executable, "-m", "advcli", "compare", str(path), "-q", "--json", os.devnull]


MAKERS = {"nemo-rl": nemo_rl, "prime-rl": prime_rl}


def write(folder: Path, trainer: str, rows: int) -> None:
    """The trainer's dump as JSON lines and as Parquet, in ``folder``."""
    frame = MAKERS[trainer](rows)
    frame.write_ndjson(folder / f"{trainer}.jsonl")
    frame.write_parquet(folder / f"{trainer}.parquet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--write", nargs=2, metavar=("FOLDER", "TRAINER"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write:
        write(Path(args.write[0]), args.write[1], args.rows)
        return
    with tempfile.TemporaryDirectory(prefix="advcli-bench-dumps-") as folder:
        for trainer in MAKERS:
            # Written by a process of its own: a child's peak memory counts the pages of the
            # process it was started from, which must stay small.
            writer = [sys.executable, __file__, "--rows", str(args.rows), "--write", folder]
            subprocess.run([*writer, trainer], check=True)
            jsonl, parquet = Path(folder, f"{trainer}.jsonl"), Path(folder, f"{trainer}.parquet")
            figures: dict[str, list[tuple[float, int]]] = {"compare": [], "scan": [], "parquet": []}
            for _ in range(args.runs):
                figures["compare"].append(timed(compare(jsonl)))
                figures["scan"].append(timed(scan(jsonl, FIELDS[trainer])))
                figures["parquet"].append(timed(compare(parquet)))
            seconds = {name: statistics.median(t for t, _ in figures[name]) for name in figures}
            peak = {name: statistics.median(m for _, m in figures[name]) for name in figures}
            size = jsonl.stat().st_size / 2**20
            print(f"{trainer}: {args.rows:,} rows, {size:,.0f} MiB of JSON lines")
            for name in figures:
                print(f"  {name:8} {seconds[name]:7.2f} s  peak {peak[name] / 2**20:7.0f} MiB")
            print(f"  compare / scan: {seconds['compare'] / seconds['scan']:.2f}x (target 1.5x)")
            ratio = peak["compare"] / peak["parquet"]
            print(f"  peak, JSON lines / Parquet: {ratio:.2f}x (target 1.5x)")


if __name__ == "__main__":
    main()
