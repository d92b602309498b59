"""What reading a dump truthfully costs: the value checks of stage 1 and the duplicate search.

Two dumps of the same rows (advcli's sample, about 1M turn rows at the default size): verl's
`uid` with a trajectory column under a name no trainer uses (`trajectory_id`, found from its
values), compared against the same run naming it with `--traj-col` (no value check), as whole
`advcli compare` processes interleaved A B A B … (medians, and the median of the per-pair ratios);
and verl-agent's layout with no turn and no token ids, whose duplicate search has many candidates,
timed in this process against stage 1.

    python bench/bench_reading.py --groups 40000 --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import polars as pl

from advcli.write.sample import sample_table

ADVCLI = [sys.executable, "-m", "advcli"]


def make_dumps(folder: Path, groups: int) -> dict[str, Path]:
    frame = pl.from_arrow(sample_table(groups=groups, rollouts=8, seed=0))
    ids = frame.select(
        pl.col("data_id").cast(pl.String).alias("uid"),
        (pl.col("data_id").cast(pl.String) + "-" + pl.col("rollout_id").cast(pl.String)).alias(
            "trajectory_id"
        ),
        "token_level_rewards",
        "response_mask",
    )
    paths = {
        "verl + trajectory_id": folder / "verl.parquet",
        "verl-agent, no turns": folder / "verl_agent.parquet",
    }
    ids.write_parquet(paths["verl + trajectory_id"])
    ids.rename({"trajectory_id": "traj_uid"}).write_parquet(paths["verl-agent, no turns"])
    return paths


def seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


def pair(label: str, a: list[str], b: list[str], runs: int) -> None:
    seconds(a)  # warm-up: the page cache and the imports
    times_a, times_b, ratios = [], [], []
    for _ in range(runs):
        first, second = seconds(a), seconds(b)
        times_a.append(first)
        times_b.append(second)
        ratios.append(first / second)
    print(
        f"{label}: A {statistics.median(times_a):.2f} s, B {statistics.median(times_b):.2f} s, "
        f"A/B {statistics.median(ratios):.3f} (median of {runs} pairs)"
    )


def duplicate_search(path: Path, runs: int) -> None:
    """The duplicate search's own time, in this process, against stage 1's."""
    from advcli.read.duplicates import find_duplicates
    from advcli.run.loading import load_dump, opened

    loads, searches = [], []
    with opened([str(path)]) as dataset:
        for _ in range(runs):
            started = time.perf_counter()
            dump = load_dump(dataset)
            loaded = time.perf_counter()
            found = find_duplicates(dataset, dump.columns, dump.projection)
            loads.append(loaded - started)
            searches.append(time.perf_counter() - loaded)
    print(
        f"verl-agent without turns or token ids: stage 1 {statistics.median(loads):.2f} s, the "
        f"duplicate search {statistics.median(searches):.3f} s ({found.count:,} possible copies, "
        f"token ids compared: {found.confirmed})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", type=int, default=40_000)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        dumps = make_dumps(Path(folder), args.groups)
        rows = pl.scan_parquet(dumps["verl + trajectory_id"]).select(pl.len()).collect().item()
        print(f"{rows:,} rows")
        verl = str(dumps["verl + trajectory_id"])
        pair(
            "trajectory found from the values (A) vs named with --traj-col (B)",
            [*ADVCLI, "compare", verl, "--quiet"],
            [*ADVCLI, "compare", verl, "--quiet", "--traj-col", "trajectory_id"],
            args.runs,
        )
        duplicate_search(dumps["verl-agent, no turns"], args.runs)


if __name__ == "__main__":
    main()
