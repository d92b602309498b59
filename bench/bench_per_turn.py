"""Benchmark `advcli compute --reward-mode per-turn`, each `--step-groups` choice, against the
outcome `compute` on one dump (a script, not a test).

The dump is bench_gigpo.py's (bench_compute.py's `advcli sample` dump with an `anchor` state
column), so the anchor grouping has its states and every command reads the same file. The
per-turn commands read the same reward column as the outcome ones (`--reward-col
token_level_rewards`, which confirms the sample's outcome, repeated on each turn, as per-turn
rewards): they differ from the outcome commands in the statistics only. All write Parquet, `-q`.

Every measurement runs in a fresh process and the commands alternate, so that drift on a shared
machine hits all alike; medians are reported with their ratio to the outcome `compute` (its
default, trajectory level grpo), and peak RSS from the child's `ru_maxrss`. The stage times come
from `advcli.pipeline.compute`'s `on_stage` callback, in fresh processes too.

    python bench/bench_per_turn.py                          # 1M turn rows × ~128 tokens, 3 runs
    python bench/bench_per_turn.py --rows 200000 --runs 1 --json bench/results-per-turn.json
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compute import machine, write_results
from bench_gigpo import anchored_dump, timed_commands, timed_stages

from advcli.settings.config import StepGroups

PER_TURN = ("--reward-mode", "per-turn", "--reward-col", "token_level_rewards")
# label, compute's options; the first is the baseline every ratio is over. Every grouping of
# StepGroups is measured, so a new one is picked up.
CONFIGS: list[tuple[str, tuple[str, ...]]] = [
    ("outcome", ()),
    ("outcome --level turn", ("--level", "turn")),
    *(
        (f"per-turn {groups.value}", (*PER_TURN, "--step-groups", groups.value))
        for groups in StepGroups
    ),
    ("per-turn turn-padded γ 0.95", (*PER_TURN, "--gamma", "0.95")),
]

# The three stages of one compute run, timed in this process through on_stage; "outcome" or a
# --step-groups value.
STAGE_TIMES = """
import json, sys, time
from pathlib import Path
from advcli._runtime.process import tune_allocator
tune_allocator()
from advcli.run.commands import compute
from advcli.settings.config import AdvantageConfig, ColumnNames, Level, PerTurn, StepGroups
choice, source, output = sys.argv[1:]
if choice == "outcome":
    config, names = AdvantageConfig(), ColumnNames()
else:
    per_turn = PerTurn(groups=StepGroups(choice))
    config = AdvantageConfig(level=Level.TURN, per_turn=per_turn)
    names = ColumnNames(reward="token_level_rewards")
marks = [("opening", time.perf_counter())]
compute([source], Path(output), config, names=names, force=True,
        on_stage=lambda stage: marks.append((stage, time.perf_counter())))
marks.append(("end", time.perf_counter()))
print(json.dumps({name: after - at for (name, at), (_, after) in zip(marks, marks[1:])}))
"""
STAGED = ["outcome", *(groups.value for groups in StepGroups)]


def stage_times(choice: str, source: Path, output: str) -> dict[str, float]:
    result = subprocess.run(
        [sys.executable, "-c", STAGE_TIMES, choice, str(source), output],
        check=True,
        capture_output=True,
        text=True,
    )
    times: dict[str, float] = json.loads(result.stdout)
    return times


def main() -> None:
    args, source = anchored_dump(__doc__.splitlines()[0])
    dump = (
        pl.scan_parquet(source)
        .select(
            pl.len().alias("rows"),
            pl.struct("data_id", "rollout_id").n_unique().alias("trajectories"),
            pl.col("turn_index").max().alias("max_turn"),
        )
        .collect()
        .row(0, named=True)
    )
    output = str(args.data / "out-per-turn.parquet")
    results: dict = {
        "machine": machine(),
        "dump": {**dump, "bytes": source.stat().st_size, "tokens_per_row": args.tokens},
    }
    print(f"{source}: {dump['rows']:,} rows, {dump['trajectories']:,} trajectories", flush=True)

    results["commands"] = timed_commands(CONFIGS, source, output, args.runs, width=30)
    cases = {choice: functools.partial(stage_times, choice, source, output) for choice in STAGED}
    results["stages"] = timed_stages(cases, args.runs, width=30)

    Path(output).unlink(missing_ok=True)
    write_results(args.json, results)


if __name__ == "__main__":
    main()
