"""Time ``advcli audit`` against ``advcli compare`` on the same dump, and print the ratio.

The dump is ``advcli sample``'s (as bench_compute.py makes it), with the advantages a trainer
would have written: ``advcli compute --level turn`` (verl's GRPO at turn level) stands in for
the trainer. ``audit`` reads those advantages beside the key columns and fits every candidate
rule; ``compare`` computes both levels and its report. Each runs as a whole process, the two
interleaved ``--runs`` times; the figures are medians, with the peak RSS of each.

    python bench/bench_audit.py                     # 1M turn rows x ~128 tokens, 3 runs
    python bench/bench_audit.py --rows 200000 --runs 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_compute import DEFAULT_MAX_TURNS, advcli, make_dump, run

DATA = Path(__file__).resolve().parent / "data"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    arguments = parser.parse_args()
    DATA.mkdir(exist_ok=True)
    dump = DATA / f"audit-{arguments.rows}-{arguments.tokens}.parquet"
    trained = DATA / f"audit-{arguments.rows}-{arguments.tokens}-turn-level.parquet"
    rows, _ = make_dump(dump, arguments.rows, arguments.tokens, DEFAULT_MAX_TURNS)
    if not trained.exists():
        run(advcli("compute", str(dump), "--level", "turn", "-o", str(trained), "-q"))
    commands = {
        "compare": advcli("compare", str(trained), "-q"),
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


if __name__ == "__main__":
    main()
