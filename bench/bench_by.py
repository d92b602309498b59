"""Time `compare --by step` against the plain `compare` of the same dump, and print the ratio.

The dump holds ``--steps`` training steps (a ``step`` column) of ``--groups`` groups each, whose
group ids repeat in every step, as a dataset index does; the plain report reads the same rows as
one batch with ids made unique. The two are timed in this process, interleaved ``--runs`` times;
the figures are medians.

    python bench/bench_by.py                  # 1,000 steps
    python bench/bench_by.py --steps 20000 --groups 2 --runs 1
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import polars as pl

from advcli.run.commands import compare
from advcli.write.sample import sample_table


def dumps(folder: Path, steps: int, groups: int) -> tuple[Path, Path]:
    """The run with a ``step`` column, and the same rows with group ids unique across steps."""
    one_step = pl.from_arrow(sample_table(groups=groups, rollouts=4, seed=3))
    assert isinstance(one_step, pl.DataFrame)
    run = pl.concat(
        [one_step.with_columns(step=pl.lit(step)) for step in range(steps)], rechunk=True
    )
    by_step, plain = folder / "by-step.parquet", folder / "plain.parquet"
    run.write_parquet(by_step)
    run.with_columns(pl.col("data_id") + pl.col("step") * groups).drop("step").write_parquet(plain)
    return by_step, plain


def seconds(call) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--groups", type=int, default=4)
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        by_step, plain = dumps(Path(folder), args.steps, args.groups)
        pairs = [
            (
                seconds(lambda: compare([str(plain)])),
                seconds(lambda: compare([str(by_step)], by="step")),
            )
            for _ in range(args.runs)
        ]
    plain_seconds = statistics.median(plain for plain, _ in pairs)
    by_seconds = statistics.median(by for _, by in pairs)
    ratio = statistics.median(by / plain for plain, by in pairs)
    print(f"medians of {args.runs} interleaved runs")
    print(f"compare:           {plain_seconds:.3f} s")
    print(f"compare --by step: {by_seconds:.3f} s ({args.steps:,} steps)")
    print(f"ratio:             {ratio:.2f} (median of the pairs' ratios)")


if __name__ == "__main__":
    main()
