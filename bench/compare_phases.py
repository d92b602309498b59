"""Where `advcli compare`'s peak memory is: its steps run one by one, as `compare` runs them, with
the process's RSS sampled every few milliseconds and its highest value printed for each step.

    python bench/compare_phases.py bench/data/rollouts-2000000-128.parquet
    python bench/compare_phases.py bench/data/rollouts-4000000-128.parquet

Run it on both dumps of `bench_compute.py --rows 2000000`: the step whose peak sets the command's
peak at each size says what the growth from one to the other is made of. At the end of stage 2 it
also prints the size of what is alive then. One run each; peak RSS varies by some 30 MiB from run
to run.
"""

from __future__ import annotations

import sys
import threading
import time
from dataclasses import replace

from advcli._runtime.process import tune_allocator

# As the command line sets them, before Polars loads.
tune_allocator()

import polars as pl  # noqa: E402

from advcli import __version__  # noqa: E402
from advcli.advantages.estimators import AdvantageConfig, Advantages, Level  # noqa: E402
from advcli.advantages.levels import TurnLevel, turn_level  # noqa: E402
from advcli.advantages.units import Trajectories  # noqa: E402
from advcli.read.scan import release_freed_memory  # noqa: E402
from advcli.report.bias import bias_report  # noqa: E402
from advcli.run.loading import load_dump, opened  # noqa: E402

PAGE_BYTES = 4096
SAMPLE_SECONDS = 0.003


def resident_mib() -> float:
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES / 2**20


class PeakSampler:
    """The highest RSS seen since the last :meth:`step`, sampled on a thread."""

    def __init__(self) -> None:
        self.highest = resident_mib()
        self.started = time.perf_counter()
        threading.Thread(target=self._sample, daemon=True).start()

    def _sample(self) -> None:
        while True:
            self.highest = max(self.highest, resident_mib())
            time.sleep(SAMPLE_SECONDS)

    def step(self, name: str) -> None:
        time.sleep(4 * SAMPLE_SECONDS)  # one more sample of the step's end
        now = resident_mib()
        print(
            f"{time.perf_counter() - self.started:6.2f} s  {name:<40} peak {self.highest:6.0f} MiB"
            f"  at its end {now:6.0f} MiB",
            flush=True,
        )
        self.highest = now


def print_held(
    projection: pl.DataFrame, trajectories: Trajectories, turn: TurnLevel, trajectory: Advantages
) -> None:
    """What is alive at the end of stage 2, by Polars' and numpy's own sizes: the data whose
    size follows the dump's (the rest of the peak does not)."""
    held = {
        "key projection": projection.estimated_size(),
        "the index's row -> trajectory": trajectories.of_row.nbytes,
        "the index's table": trajectories.table.estimated_size(),
        # Its first rows are the index table's own column.
        "the turn level summed per trajectory": turn.per_trajectory.drop(
            "turn_first_row"
        ).estimated_size(),
        # Its other columns are the index table's.
        "the trajectory level's score and advantage": trajectory.units.select(
            "score", "advantage"
        ).estimated_size(),
        "both levels' group figures": turn.groups.estimated_size()
        + trajectory.groups.estimated_size(),
    }
    for name, size in held.items():
        print(f"          held: {name:<44} {size / 2**20:6.0f} MiB", flush=True)
    total = sum(held.values())
    per_row = (held["key projection"] + held["the index's row -> trajectory"]) / projection.height
    per_trajectory = (total - per_row * projection.height) / trajectories.count
    print(
        f"          held: {'all of it':<44} {total / 2**20:6.0f} MiB"
        f" ({per_row:.0f} bytes a row + {per_trajectory:.0f} a trajectory)",
        flush=True,
    )


def main() -> None:
    sampler = PeakSampler()
    config = AdvantageConfig()
    with opened([sys.argv[1]]) as dataset:
        dump = load_dump(dataset)
        sampler.step(f"stage 1: {dump.projection.height:,} rows")
        trajectories = dump.trajectories
        sampler.step(f"the index: {trajectories.count:,} trajectories")
        turn_advantages = dump.advantages(replace(config, level=Level.TURN))
        sampler.step("turn level: advantages")
        turn = turn_level(turn_advantages, trajectories)
        del turn_advantages
        sampler.step("turn level: summed per trajectory")
        trajectory = dump.advantages(replace(config, level=Level.TRAJECTORY))
        sampler.step("trajectory level")
        print_held(dump.projection, trajectories, turn, trajectory)
        settings = dump.report_settings()
        del dump, trajectories
        trajectory = trajectory.without_index()
        release_freed_memory()
        bias_report(turn, trajectory, config=config, settings=settings, version=__version__)
        sampler.step("the report")


if __name__ == "__main__":
    main()
