"""Benchmark `advcli compute` against the I/O floor, peak memory at N and 2N rows, and `compare`.

The floor is a Polars streaming pass that reads the same file and writes the same output columns
(every input column, `score`, a constant `advantage`, `advantages` = mask × advantage) with no
statistics: what any tool must pay to rewrite the dump with a per-token column. Every measurement
runs in a fresh process; compute and the floor alternate so that drift on a shared machine hits
both alike. Peak RSS is the child's `ru_maxrss`.

    python bench/bench_compute.py                      # 1M turn rows × ~128 tokens, 3 runs each
    python bench/bench_compute.py --rows 200000 --runs 1 --json bench/results.json
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

import polars as pl

ROLLOUTS = 8
# The sample's trajectories average about 2.8 turns with --max-turns 6.
TURNS_PER_TRAJECTORY = 2.8
CONFIGS = [
    ("trajectory", "grpo"),
    ("turn", "grpo"),
    ("trajectory", "reinforce_pp_baseline"),
    ("turn", "reinforce_pp_baseline"),
]


def floor_pass(source: str, output: str) -> None:
    """The I/O floor: read everything, write everything plus the three output columns."""
    os.environ.setdefault("POLARS_ROW_GROUP_PREFETCH_SIZE", "1")  # the same bound as advcli
    advantage = pl.lit(0.5, dtype=pl.Float32)
    (
        pl.scan_parquet(source)
        .with_columns(
            score=pl.col("token_level_rewards").list.sum().cast(pl.Float32),
            advantage=advantage,
            advantages=pl.col("response_mask").cast(pl.List(pl.Float32)) * advantage,
        )
        .sink_parquet(output)
    )


def run(command: list[str]) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one child process."""
    started = time.perf_counter()
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{process.stderr.read().decode()}")
    process.stderr.close()
    return seconds, usage.ru_maxrss * 1024


def advcli(*args: str) -> list[str]:
    return [sys.executable, "-m", "advcli", *args]


def make_dump(path: Path, rows: int, tokens: int) -> tuple[float, int]:
    groups = max(1, round(rows / (ROLLOUTS * TURNS_PER_TRAJECTORY)))
    if not path.exists():
        seconds, _ = run(
            advcli(
                "sample",
                str(path),
                "--groups",
                str(groups),
                "--rollouts",
                str(ROLLOUTS),
                "--tokens",
                str(tokens),
                "--seed",
                "1",
                "-q",
            )
        )
        print(
            f"made {path} ({pl.scan_parquet(path).select(pl.len()).collect().item():,} rows) "
            f"in {seconds:.1f} s",
            flush=True,
        )
    return pl.scan_parquet(path).select(pl.len()).collect().item(), path.stat().st_size


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tokens", type=int, default=128, help="mean tokens per turn row")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("bench/data"))
    parser.add_argument("--json", type=Path)
    parser.add_argument("--floor", nargs=2, metavar=("SOURCE", "OUTPUT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.floor:
        floor_pass(*args.floor)
        return

    args.data.mkdir(parents=True, exist_ok=True)
    single = args.data / f"rollouts-{args.rows}-{args.tokens}.parquet"
    double = args.data / f"rollouts-{2 * args.rows}-{args.tokens}.parquet"
    n_rows, n_bytes = make_dump(single, args.rows, args.tokens)
    n2_rows, _ = make_dump(double, 2 * args.rows, args.tokens)
    output = str(args.data / "out.parquet")
    floor_command = [sys.executable, __file__, "--floor", str(single), output]

    results: dict = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "polars": pl.__version__,
            "platform": platform.platform(),
        },
        "dump": {"rows": n_rows, "bytes": n_bytes, "tokens_per_row": args.tokens},
        "speed": [],
    }
    print(f"\n{'level':<11}{'estimator':<23}{'compute s':>10}{'floor s':>9}{'ratio':>7}")
    for level, estimator in CONFIGS:
        compute_times, floor_times = [], []
        for _ in range(args.runs):
            floor_times.append(run(floor_command)[0])
            compute_times.append(
                run(
                    advcli(
                        "compute",
                        str(single),
                        "-o",
                        output,
                        "--force",
                        "-q",
                        "--level",
                        level,
                        "--estimator",
                        estimator,
                    )
                )[0]
            )
        compute_s, floor_s = statistics.median(compute_times), statistics.median(floor_times)
        results["speed"].append(
            {
                "level": level,
                "estimator": estimator,
                "compute_s": compute_s,
                "floor_s": floor_s,
                "ratio": compute_s / floor_s,
                "compute_runs": compute_times,
                "floor_runs": floor_times,
            }
        )
        print(
            f"{level:<11}{estimator:<23}{compute_s:>10.2f}{floor_s:>9.2f}"
            f"{compute_s / floor_s:>7.2f}",
            flush=True,
        )

    memory = {}
    for label, path in (("N", single), ("2N", double)):
        memory[label] = max(
            run(advcli("compute", str(path), "-o", output, "--force", "-q"))[1]
            for _ in range(max(1, args.runs - 1))
        )
    growth = memory["2N"] / memory["N"] - 1
    results["memory"] = {
        "rows_N": n_rows,
        "rows_2N": n2_rows,
        "peak_rss_N": memory["N"],
        "peak_rss_2N": memory["2N"],
        "growth": growth,
    }
    print(
        f"\npeak RSS: {memory['N'] / 2**20:.0f} MiB at {n_rows:,} rows, "
        f"{memory['2N'] / 2**20:.0f} MiB at {n2_rows:,} rows: {100 * growth:+.1f}%"
    )

    compare_times = [run(advcli("compare", str(single), "-q"))[0] for _ in range(args.runs)]
    results["compare_s"] = statistics.median(compare_times)
    print(f"compare: {results['compare_s']:.2f} s (median of {args.runs})")
    Path(output).unlink(missing_ok=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
