"""Time ``advcli audit`` against ``advcli compare`` on the same dump, and print the ratio.

The dump is ``advcli sample``'s (as bench_compute.py makes it), with the advantages a trainer
would have written: ``advcli compute --level turn`` (verl's GRPO at turn level) stands in for
the trainer. ``audit`` reads those advantages beside the key columns and fits every candidate
rule; ``compare`` computes both levels and its report. Each runs as a whole process, the two
interleaved ``--runs`` times; the figures are medians, with the peak RSS of each.

    python bench/bench_audit.py                     # 1M turn rows x ~128 tokens, 3 runs
    python bench/bench_audit.py --rows 200000 --runs 5
    python bench/bench_audit.py --rows 200000 --gigpo   # GiGPO's dump and candidates

``--gigpo`` adds GiGPO's columns to the dump (each row's anchor, one of four states, and its
step reward, 0, 0.5 or 1, drawn with a fixed seed), verl-agent's GiGPO stands in for the
trainer (``compute --recipe verl-agent``), and ``compare --recipe verl-agent`` is the
yardstick: the audit then fits GiGPO's candidates beside the outcome rules.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import polars as pl
from bench_compute import DEFAULT_MAX_TURNS, advcli, make_dump, run

DATA = Path(__file__).resolve().parent / "data"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--gigpo", action="store_true", help="GiGPO's dump and candidates")
    arguments = parser.parse_args()
    DATA.mkdir(exist_ok=True)
    dump = DATA / f"audit-{arguments.rows}-{arguments.tokens}.parquet"
    rows, _ = make_dump(dump, arguments.rows, arguments.tokens, DEFAULT_MAX_TURNS)
    # The trainer's rule, and what compare is told of it (it computes both levels itself).
    rule, compared = ("--level", "turn"), ()
    if arguments.gigpo:
        dump = with_steps(dump)
        rule = compared = ("--recipe", "verl-agent")
    trained = dump.with_name(
        f"{dump.stem}-{'verl-agent' if arguments.gigpo else 'turn-level'}.parquet"
    )
    if not trained.exists():
        run(advcli("compute", str(dump), *rule, "-o", str(trained), "-q"))
    commands = {
        "compare": advcli("compare", str(trained), *compared, "-q"),
        "audit": advcli("audit", str(trained), "-q"),
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    peaks: dict[str, list[int]] = {name: [] for name in commands}
    for _ in range(arguments.runs):
        for name, command in commands.items():
            seconds, peak = run(command)
            times[name].append(seconds)
            peaks[name].append(peak)
    print(f"{rows:,} rows, {arguments.runs} interleaved runs each (medians):")
    for name in commands:
        print(
            f"  {name:8} {statistics.median(times[name]):6.2f} s  "
            f"peak {statistics.median(peaks[name]) / 2**20:6.0f} MiB"
        )
    ratio = statistics.median(times["audit"]) / statistics.median(times["compare"])
    memory = statistics.median(peaks["audit"]) / statistics.median(peaks["compare"])
    print(f"  audit / compare: {ratio:.2f}x the time, {memory:.2f}x the peak")


def with_steps(dump: Path) -> Path:
    """``dump`` with GiGPO's columns, written beside it once: each row's ``anchor`` (one of
    four states) and ``step_reward`` (0, 0.5 or 1), drawn with a fixed seed."""
    path = dump.with_name(f"{dump.stem}-gigpo.parquet")
    if not path.exists():
        frame = pl.read_parquet(dump)
        rng = np.random.default_rng(1)
        frame.with_columns(
            pl.Series("anchor", rng.integers(0, 4, frame.height)),
            pl.Series("step_reward", rng.choice([0.0, 0.5, 1.0], frame.height)),
        ).write_parquet(path)
    return path


if __name__ == "__main__":
    main()
