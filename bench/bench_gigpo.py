"""Benchmark `advcli compute --estimator gigpo` against `--estimator grpo` on one dump (a script,
not a test).

The dump is bench_compute.py's (made by `advcli sample`) with two columns added: `anchor`, a
20-character state hash, and `step_reward`. Within a group, the rows of one turn share one
anchor with probability 1/5 and have their own otherwise, so about a fifth of the steps are in a
step group of several rows. Both commands read that one file and write Parquet, `-q`.

Every measurement runs in a fresh process and the commands alternate, so that drift on a shared
machine hits all alike; medians are reported, with peak RSS from the child's `ru_maxrss`. The
stage times come from `advcli.pipeline.compute`'s `on_stage` callback, in fresh processes too.

    python bench/bench_gigpo.py                          # 1M turn rows × ~128 tokens, 3 runs
    python bench/bench_gigpo.py --rows 200000 --runs 1 --json bench/results-gigpo.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compute import DEFAULT_MAX_TURNS, advcli, machine, make_dump, run, write_results

# One in SHARED_ONE_IN rows of a (group, turn) takes the state those rows share.
SHARED_ONE_IN = 4

# Run in a child process, like every measurement: a child forked from a large parent reports the
# parent's size as its own peak RSS.
ANCHOR_COPY = f"""
import sys
import polars as pl

shared = pl.struct("data_id", "rollout_id").hash(seed=3) % {SHARED_ONE_IN} == 0
state = pl.when(shared).then(pl.struct("data_id", "turn_index").hash(seed=4))
state = state.otherwise(pl.struct("data_id", "rollout_id", "turn_index").hash(seed=4))
draw = pl.struct("data_id", "rollout_id", "turn_index").hash(seed=5) % 10
(
    pl.scan_parquet(sys.argv[1])
    .with_columns(
        state.cast(pl.String).str.pad_start(20, "0").alias("anchor"),
        pl.when(draw == 0).then(1.0).when(draw == 1).then(-0.1).otherwise(0.0)
        .cast(pl.Float32).alias("step_reward"),
    )
    .sink_parquet(sys.argv[2], row_group_size=200_000)
)
"""

GIGPO = ("--estimator", "gigpo", "--anchor-col", "anchor", "--step-reward-col", "step_reward")
# label, compute's options; the first is the baseline every ratio is over.
CONFIGS: list[tuple[str, tuple[str, ...]]] = [
    ("grpo", ("--estimator", "grpo")),
    ("gigpo", GIGPO),
    ("gigpo --gamma 0.95", (*GIGPO, "--gamma", "0.95")),
    ("gigpo --recipe trinity", (*GIGPO, "--recipe", "trinity")),
]

# The three stages of one compute run, timed in this process through on_stage.
STAGE_TIMES = """
import json, sys, time
from pathlib import Path
from advcli._runtime.process import tune_allocator
tune_allocator()
from advcli.run.commands import compute
from advcli.settings.config import AdvantageConfig, ColumnNames, Estimator, StepTerm
estimator, gamma, source, output = sys.argv[1:]
step = StepTerm(gamma=float(gamma)) if estimator == "gigpo" else None
config = AdvantageConfig(estimator=Estimator(estimator), step=step)
names = ColumnNames(anchor="anchor", step_reward="step_reward")
marks = [("opening", time.perf_counter())]
compute([source], Path(output), config, names=names, force=True,
        on_stage=lambda stage: marks.append((stage, time.perf_counter())))
marks.append(("end", time.perf_counter()))
print(json.dumps({name: after - at for (name, at), (_, after) in zip(marks, marks[1:])}))
"""
STAGED = [("grpo", "grpo", "1"), ("gigpo", "gigpo", "1"), ("gigpo --gamma 0.95", "gigpo", "0.95")]


def timed_commands(
    configs: list[tuple[str, list[str]]], source: Path, output: str, runs: int, width: int
) -> dict[str, dict[str, object]]:
    """Each ``compute`` of ``configs`` (a label and its options) over ``source``, interleaved
    ``runs`` times: a table of the medians (time, ratio to the first, peak RSS) and its JSON."""
    seconds: dict[str, list[float]] = {label: [] for label, _ in configs}
    peaks: dict[str, list[int]] = {label: [] for label, _ in configs}
    for _ in range(runs):
        for label, options in configs:
            took, peak = run(
                advcli("compute", str(source), "-o", output, "--force", "-q", *options)
            )
            seconds[label].append(took)
            peaks[label].append(peak)
    baseline = statistics.median(seconds[configs[0][0]])
    print(f"\n{'command':<{width}}{'compute s':>10}{'ratio':>7}{'peak RSS MiB':>14}")
    figures: dict[str, dict[str, object]] = {}
    for label, _ in configs:
        median = statistics.median(seconds[label])
        peak = statistics.median(peaks[label])
        figures[label] = {
            "seconds": median,
            "ratio": median / baseline,
            "peak_rss": peak,
            "runs": seconds[label],
            "peak_rss_runs": peaks[label],
        }
        print(f"{label:<{width}}{median:>10.2f}{median / baseline:>7.2f}{peak / 2**20:>14.0f}")
    return figures


def timed_stages(
    cases: dict[str, Callable[[], dict[str, float]]], runs: int, width: int
) -> dict[str, dict[str, object]]:
    """Each case's stage times (a fresh process each), interleaved ``runs`` times: a table of
    the medians and its JSON."""
    times: dict[str, list[dict[str, float]]] = {label: [] for label in cases}
    for _ in range(runs):
        for label, stages in cases.items():
            times[label].append(stages())
    names = list(next(iter(times.values()))[0])
    print(f"\n{'stage s':<{width}}" + "".join(f"{name:>22}" for name in names))
    figures: dict[str, dict[str, object]] = {}
    for label, measured in times.items():
        medians = {name: statistics.median(run[name] for run in measured) for name in names}
        figures[label] = {"seconds": medians, "runs": measured}
        print(f"{label:<{width}}" + "".join(f"{medians[n]:>22.2f}" for n in names), flush=True)
    return figures


def anchor_copy(path: Path) -> Path:
    """The dump with `anchor` and `step_reward` columns: made once, next to it."""
    copy = path.with_name(f"{path.stem}-anchors.parquet")
    if not copy.exists():
        run([sys.executable, "-c", ANCHOR_COPY, str(path), str(copy)])
    return copy


def stage_times(estimator: str, gamma: str, source: Path, output: str) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, "-c", STAGE_TIMES, estimator, gamma, str(source), output],
        check=True,
        capture_output=True,
        text=True,
    )
    times: dict[str, float] = json.loads(result.stdout)
    return times


def anchored_dump(description: str) -> tuple[argparse.Namespace, Path]:
    """The command line of this script and of bench_per_turn.py (the dump's size, the runs,
    where the data goes, a JSON file for the results), and the anchored dump it asks for."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tokens", type=int, default=128, help="mean tokens per turn row")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("bench/data"))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    args.data.mkdir(parents=True, exist_ok=True)
    base = args.data / f"rollouts-{args.rows}-{args.tokens}.parquet"
    make_dump(base, args.rows, args.tokens, DEFAULT_MAX_TURNS)
    return args, anchor_copy(base)


def main() -> None:
    args, source = anchored_dump(__doc__.splitlines()[0])
    steps = (
        pl.scan_parquet(source)
        .group_by("data_id", "anchor")
        .agg(pl.len().alias("rows"))
        .select(
            pl.len().alias("step_groups"),
            pl.col("rows").sum().alias("rows"),
            pl.col("rows").filter(pl.col("rows") > 1).sum().alias("shared_rows"),
        )
        .collect()
        .row(0, named=True)
    )
    output = str(args.data / "out-gigpo.parquet")
    results: dict = {
        "machine": machine(),
        "dump": {**steps, "bytes": source.stat().st_size, "tokens_per_row": args.tokens},
    }
    print(
        f"{source}: {steps['rows']:,} rows, {steps['step_groups']:,} step groups, "
        f"{steps['shared_rows'] / steps['rows']:.1%} of rows in a shared one",
        flush=True,
    )

    results["commands"] = timed_commands(CONFIGS, source, output, args.runs, width=24)
    cases = {
        label: functools.partial(stage_times, estimator, gamma, source, output)
        for label, estimator, gamma in STAGED
    }
    results["stages"] = timed_stages(cases, args.runs, width=24)

    Path(output).unlink(missing_ok=True)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
