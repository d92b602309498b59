"""Benchmark `advcli compute` against the I/O floor, and the peak memory and time of `compute`,
`compare` and `inspect` at N and 2N rows.

The floor is a streaming pass that reads the same file and writes the same output columns (every
input column, `score`, a constant `advantage`, `advantages` = mask × advantage) with no
statistics: what any tool must pay to rewrite the dump with a per-token column. It is timed with
three readers, since they differ by more than the margin being measured:

- `polars`: `pl.scan_parquet` with Polars' defaults (the floor as the roadmap defines it). It
  decodes ahead of the writer without bound, so its memory grows with the input.
- `polars-bounded`: the same with one row group of read-ahead (`POLARS_ROW_GROUP_PREFETCH_SIZE=1`),
  the memory discipline asked of advcli.
- `arrow`: Arrow decodes the Parquet and Polars writes, as in advcli (`Dataset.scan()`).

Every measurement runs in a fresh process; compute and the floors alternate so that drift on a
shared machine hits all alike. Peak RSS is the child's `ru_maxrss`.

    python bench/bench_compute.py                      # 1M turn rows × ~128 tokens, 3 runs each
    python bench/bench_compute.py --rows 200000 --runs 1 --json bench/results.json
    python bench/bench_compute.py --rows 2000000 --runs 3 --commands-only   # the memory growth
    python bench/bench_compute.py --rows 2000000 --runs 3 --commands-only --max-turns 24
    python bench/bench_compute.py --rows 2000000 --runs 3 --commands-only --string-ids
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
# A sample trajectory takes 1 + binomial(max_turns - 1, p) turns, p estimated here at 0.36 on
# average over successes and failures (2.8 turns with the default --max-turns 6). The made dumps
# have 3.0 (4,286,301 rows in 1,428,568 trajectories), so they come out some 7 % larger than
# --rows asks; the estimate stays, so that the same --rows makes the same dump as before.
EXTRA_TURN_SHARE = 0.36
DEFAULT_MAX_TURNS = 6
CONFIGS = [
    ("trajectory", "grpo"),
    ("turn", "grpo"),
    ("trajectory", "reinforce_pp_baseline"),
    ("turn", "reinforce_pp_baseline"),
]


FLOORS = ("polars", "polars-bounded", "arrow")


def floor_pass(reader: str, source: str, output: str) -> None:
    """The I/O floor: read everything, write everything plus the three output columns."""
    advantage = pl.lit(0.5, dtype=pl.Float32)
    if reader == "arrow":
        from advcli.read.inputs import open_dataset

        frame = open_dataset([source]).scan()
    else:
        frame = pl.scan_parquet(source)
    (
        frame.with_columns(
            score=pl.col("token_level_rewards").list.sum().cast(pl.Float32),
            advantage=advantage,
            advantages=pl.col("response_mask").cast(pl.List(pl.Float32)) * advantage,
        ).sink_parquet(output)
    )


def run(command: list[str], env: dict[str, str] | None = None) -> tuple[float, int]:
    """Wall seconds and peak RSS (bytes) of one child process."""
    started = time.perf_counter()
    process = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env or os.environ.copy()
    )
    _, status, usage = os.wait4(process.pid, 0)
    seconds = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(command)}\n{process.stderr.read().decode()}")
    process.stderr.close()
    return seconds, usage.ru_maxrss * 1024


def machine() -> dict[str, object]:
    """What the figures were measured on, for a bench's JSON."""
    return {
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "polars": pl.__version__,
        "platform": platform.platform(),
    }


def write_results(path: Path | None, results: dict) -> None:
    """A bench's figures as JSON at ``path``, if one was asked for."""
    if path is not None:
        path.write_text(json.dumps(results, indent=2) + "\n")
        print(f"wrote {path}")


def advcli(*args: str) -> list[str]:
    return [sys.executable, "-m", "advcli", *args]


# Stage 1 alone, as the commands run it (the allocator set as the command line sets it): the key
# projection of every row read and checked, then nothing else. Its growth is the part of the
# commands' growth that per-row key state costs.
KEY_PROJECTION_ONLY = """
import sys
from advcli._runtime.process import tune_allocator
tune_allocator()
from advcli.run.loading import load_dump, opened
with opened([sys.argv[1]]) as dataset:
    load_dump(dataset, unique_turns=False)
"""


# The per-trajectory stage 1, as far as Polars builds it: the same per-row expressions as
# stage 1, reduced while the rows stream by to one row of partial sums per trajectory (a streaming
# group-by), with no per-row state kept at all. A lower bound of that design's memory: it leaves
# out the 8-byte hash a row the repeated-turn check would keep.
PER_TRAJECTORY_ONLY = """
import sys
from advcli._runtime.process import tune_allocator
tune_allocator()
import polars as pl
from advcli.read.columns import resolve_columns
from advcli.keys import GROUP, ROW, SCORE, TOKENS, TRAJECTORY
from advcli.run.loading import opened
from advcli.read.projection import KeyExpressions
from advcli.read.scan import closing_sources
from advcli.settings.config import ColumnNames
with opened([sys.argv[1]]) as dataset, closing_sources():
    columns = resolve_columns(dataset.schema, dataset.describe(), ColumnNames())
    plan = KeyExpressions.of(dataset.schema, columns, "__row")
    (
        dataset.scan()
        .with_row_index("__row")
        .select(pl.col("__row").alias(ROW), *plan.exprs)
        .group_by(GROUP, TRAJECTORY)
        .agg(
            pl.len().alias("turns"),
            pl.col(ROW).min().alias("first_row"),
            pl.col(TOKENS).sum(),
            pl.col(SCORE).min().alias("score_min"),
            pl.col(SCORE).max().alias("score_max"),
            pl.col(SCORE).sum().alias("score_sum"),
            (pl.col(SCORE) ** 2).sum().alias("score_squares"),
            pl.col("problem").max(),
        )
        .collect(engine="streaming")
    )
"""

# The allocator giving freed memory back at once (slower): what the commands hold live, without
# the freed memory Polars' allocator keeps for its next allocations.
RETURN_AT_ONCE = "dirty_decay_ms:0,muzzy_decay_ms:0"


def make_dump(path: Path, rows: int, tokens: int, max_turns: int) -> tuple[float, int]:
    turns_per_trajectory = 1 + (max_turns - 1) * EXTRA_TURN_SHARE
    groups = max(1, round(rows / (ROLLOUTS * turns_per_trajectory)))
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
                "--max-turns",
                str(max_turns),
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


# Run in a child process, like every other step: a child forked from a large parent reports the
# parent's size as its own peak RSS (Linux keeps the high-water mark across exec).
STRING_ID_COPY = """
import sys
import polars as pl

def digits(value, width):
    return value.cast(pl.String).str.pad_start(width, "0")

group = digits(pl.col("data_id").hash(seed=1), 20)
(
    pl.scan_parquet(sys.argv[1])
    .with_columns(
        pl.format("{}-{}", group, digits(pl.col("data_id").hash(seed=2) % 10**15, 15)),
        pl.format("{}-{}", group, digits(pl.col("rollout_id"), 15)).alias("rollout_id"),
    )
    .sink_parquet(sys.argv[2], row_group_size=200_000)
)
"""


def string_id_copy(path: Path) -> Path:
    """The dump with its group and trajectory ids as 36-character strings, the size of the uuids
    trainers use (verl's ``uid``): made once, next to it."""
    copy = path.with_name(f"{path.stem}-string-ids.parquet")
    if not copy.exists():
        run([sys.executable, "-c", STRING_ID_COPY, str(path), str(copy)])
    return copy


def floor_run(reader: str, source: Path, output: str) -> tuple[float, int]:
    env = os.environ.copy()
    if reader == "polars-bounded":
        env["POLARS_ROW_GROUP_PREFETCH_SIZE"] = "1"
    return run([sys.executable, __file__, "--floor", reader, str(source), output], env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tokens", type=int, default=128, help="mean tokens per turn row")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("bench/data"))
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--max-turns",
        type=int,
        default=DEFAULT_MAX_TURNS,
        help="most turns per trajectory in the made dumps (6: 3.0 a trajectory on average)",
    )
    parser.add_argument(
        "--string-ids",
        action="store_true",
        help="group and trajectory ids as 36-character strings (a copy of each dump)",
    )
    parser.add_argument(
        "--commands-only",
        action="store_true",
        help="only the commands' peak memory and time at N and 2N rows (no speed table, no floors)",
    )
    parser.add_argument(
        "--floor", nargs=3, metavar=("READER", "SOURCE", "OUTPUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.floor:
        floor_pass(*args.floor)
        return

    args.data.mkdir(parents=True, exist_ok=True)
    turns = "" if args.max_turns == DEFAULT_MAX_TURNS else f"-{args.max_turns}turns"
    single = args.data / f"rollouts-{args.rows}-{args.tokens}{turns}.parquet"
    double = args.data / f"rollouts-{2 * args.rows}-{args.tokens}{turns}.parquet"
    n_rows, n_bytes = make_dump(single, args.rows, args.tokens, args.max_turns)
    n2_rows, _ = make_dump(double, 2 * args.rows, args.tokens, args.max_turns)
    if args.string_ids:
        single, double = string_id_copy(single), string_id_copy(double)
        n_bytes = single.stat().st_size
    output = str(args.data / "out.parquet")

    results: dict = {
        "machine": machine(),
        "dump": {
            "rows": n_rows,
            "bytes": n_bytes,
            "tokens_per_row": args.tokens,
            "max_turns": args.max_turns,
            "string_ids": args.string_ids,
        },
        "speed": [],
    }
    header = "".join(f"{reader + ' s':>17}{'ratio':>7}" for reader in FLOORS)
    if not args.commands_only:
        print(f"\n{'level':<11}{'estimator':<23}{'compute s':>10}{header}")
    for level, estimator in [] if args.commands_only else CONFIGS:
        compute_times: list[float] = []
        floor_times: dict[str, list[float]] = {reader: [] for reader in FLOORS}
        for _ in range(args.runs):
            for reader in FLOORS:
                floor_times[reader].append(floor_run(reader, single, output)[0])
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
        compute_s = statistics.median(compute_times)
        floor_s = {reader: statistics.median(times) for reader, times in floor_times.items()}
        results["speed"].append(
            {
                "level": level,
                "estimator": estimator,
                "compute_s": compute_s,
                "compute_runs": compute_times,
                "floors": {
                    reader: {
                        "seconds": floor_s[reader],
                        "ratio": compute_s / floor_s[reader],
                        "runs": floor_times[reader],
                    }
                    for reader in FLOORS
                },
            }
        )
        cells = "".join(
            f"{floor_s[reader]:>17.2f}{compute_s / floor_s[reader]:>7.2f}" for reader in FLOORS
        )
        print(f"{level:<11}{estimator:<23}{compute_s:>10.2f}{cells}", flush=True)

    # Peak memory at N and 2N rows, medians of --runs fresh processes each (peak RSS varies by
    # some 50 MiB from run to run), N and 2N alternating; every run is kept in the JSON.
    results["memory"] = {"rows_N": n_rows, "rows_2N": n2_rows}
    print()
    commands = {
        "advcli compute": lambda path: advcli("compute", str(path), "-o", output, "--force", "-q"),
        "advcli compare": lambda path: advcli("compare", str(path), "-q"),
        "advcli inspect": lambda path: advcli("inspect", str(path), "--json"),
        "stage 1 alone": lambda path: [sys.executable, "-c", KEY_PROJECTION_ONLY, str(path)],
        "stage 1 per trajectory": lambda path: [
            sys.executable,
            "-c",
            PER_TRAJECTORY_ONLY,
            str(path),
        ],
        "compare, memory back at once": lambda path: advcli("compare", str(path), "-q"),
    }
    environments = {"compare, memory back at once": {"_RJEM_MALLOC_CONF": RETURN_AT_ONCE}}
    programs: dict[str, str | None] = {
        **dict.fromkeys(commands),
        **{f"floor ({reader})": reader for reader in ([] if args.commands_only else FLOORS)},
    }
    for label, reader in programs.items():
        peaks: dict[str, list[int]] = {"N": [], "2N": []}
        seconds: dict[str, list[float]] = {"N": [], "2N": []}
        for _ in range(args.runs):
            for size, path in (("N", single), ("2N", double)):
                if reader is None:
                    env = {**os.environ, **environments.get(label, {})}
                    took, peak = run(commands[label](path), env)
                else:
                    took, peak = floor_run(reader, path, output)
                peaks[size].append(peak)
                seconds[size].append(took)
        median = {size: statistics.median(values) for size, values in peaks.items()}
        growth = median["2N"] / median["N"] - 1
        results["memory"][label] = {
            "peak_rss_N": median["N"],
            "peak_rss_2N": median["2N"],
            "growth": growth,
            "seconds_N": statistics.median(seconds["N"]),
            "seconds_2N": statistics.median(seconds["2N"]),
            "runs_N": peaks["N"],
            "runs_2N": peaks["2N"],
        }
        spread = ", ".join(
            f"{size} {min(values) / 2**20:.0f}–{max(values) / 2**20:.0f}"
            for size, values in peaks.items()
        )
        print(
            f"peak RSS, {label:<24} {median['N'] / 2**20:>6.0f} MiB at N, "
            f"{median['2N'] / 2**20:>6.0f} MiB at 2N: {100 * growth:+.1f}% (MiB: {spread}); "
            f"{statistics.median(seconds['N']):.2f} s / {statistics.median(seconds['2N']):.2f} s",
            flush=True,
        )
    memory = results["memory"]
    ratio = memory["advcli compare"]["peak_rss_2N"] / memory["advcli compute"]["peak_rss_2N"]
    memory["compare_over_compute_2N"] = ratio
    print(f"compare's peak over compute's at 2N rows: {ratio:.2f}")
    Path(output).unlink(missing_ok=True)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
