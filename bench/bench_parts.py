"""Peak memory and time of `compare DIR --by file` over many step files and of `compare DUMP
--by step` over one dump of as many steps, against one part's `compare`, and `--jobs 2` against
`--jobs 1`; prints the ratios, and the CPU seconds a part takes in one job and in two. Also
`compute DIR --by file` (to Parquet) against one part's `compute`.

Each step file holds ``--groups`` sample groups (about 43k rows at the default), written once
and linked ``--parts`` times (each file is its own batch, so the copies are as many steps); the
dump of ``--parts`` steps holds those rows once a step, with the step's number in a ``step``
column, appended step after step as a trainer writes them (a Parquet row group a step).
Every run is a fresh `advcli compare` process, started from a fresh Python process that reads
its peak RSS (``getrusage(RUSAGE_CHILDREN)``), so no run's memory is counted in another's.
Runs are interleaved ``--runs`` times; the figures are medians.

    python bench/bench_parts.py                     # 50 and 200 parts
    python bench/bench_parts.py --parts 50 --runs 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from advcli.write.sample import write_sample

# Runs `advcli compare` as a child and prints its wall time, CPU time and peak RSS (KiB).
MEASURE = """
import resource, subprocess, sys, time
started = time.perf_counter()
done = subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL)
seconds = time.perf_counter() - started
usage = resource.getrusage(resource.RUSAGE_CHILDREN)
print(done.returncode, seconds, usage.ru_utime + usage.ru_stime, usage.ru_maxrss)
"""


def measure(*args: str, compute: Path | None = None) -> tuple[float, float, float]:
    """Wall seconds, CPU seconds and peak RSS (MiB) of one ``advcli compare`` process, or with
    ``compute`` (its output) one ``advcli compute``."""
    if compute is None:
        command = [sys.executable, "-m", "advcli", "compare", *args, "-q", "--json", "-"]
    else:
        options = ("-o", str(compute), "--force", "-q")
        command = [sys.executable, "-m", "advcli", "compute", *args, *options]
    line = subprocess.run(
        [sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, check=True
    ).stdout.split()
    if line[0] != "0":
        raise SystemExit(f"{' '.join(command[3:])} exited {line[0]}")
    return float(line[1]), float(line[2]), int(line[3]) / 1024


def run_folder(root: Path, one: Path, parts: int) -> Path:
    """A folder of ``parts`` step files, each a link to (or copy of) ``one``."""
    folder = root / f"run-{parts}"
    folder.mkdir()
    for step in range(parts):
        target = folder / f"step_{step:05d}.parquet"
        try:
            os.link(one, target)
        except OSError:
            target.write_bytes(one.read_bytes())
    return folder


def step_dump(root: Path, one: Path, parts: int) -> Path:
    """One dump of ``parts`` steps, each ``one``'s rows with the step's number in ``step``."""
    table = pq.read_table(one)
    path = root / f"steps-{parts}.parquet"
    with pq.ParquetWriter(path, table.schema.append(pa.field("step", pa.int64()))) as writer:
        for step in range(parts):
            writer.write_table(table.append_column("step", pa.array(np.full(len(table), step))))
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--parts", type=int, nargs="+", default=[50, 200])
    parser.add_argument("--groups", type=int, default=1830)
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as name:
        root = Path(name)
        one = root / "step.parquet"
        rows = write_sample(one, groups=args.groups, seed=1)
        folders = {parts: run_folder(root, one, parts) for parts in args.parts}
        dumps = {parts: step_dump(root, one, parts) for parts in args.parts}
        runs: dict[str, list[tuple[float, float, float]]] = {}
        output = root / "advantages.parquet"
        for _ in range(args.runs):
            runs.setdefault("one part", []).append(measure(str(one)))
            runs.setdefault("compute, one part", []).append(measure(str(one), compute=output))
            for parts, folder in folders.items():
                options = (str(folder), "--by", "file")
                label = f"compute, {parts} parts"
                runs.setdefault(label, []).append(measure(*options, compute=output))
            for parts, folder in folders.items():
                for jobs in (1, 2):
                    options = (str(folder), "--by", "file", "--jobs", str(jobs))
                    runs.setdefault(f"{parts} parts, --jobs {jobs}", []).append(measure(*options))
            for parts, dump in dumps.items():
                for jobs in (1, 2):
                    options = (str(dump), "--by", "step", "--jobs", str(jobs))
                    label = f"{parts} steps of one dump, --jobs {jobs}"
                    runs.setdefault(label, []).append(measure(*options))
    figures = {
        label: [statistics.median(run[i] for run in measured) for i in range(3)]
        for label, measured in runs.items()
    }
    seconds, cpu, memory = figures["one part"]
    compute_memory = figures["compute, one part"][2]
    print(f"one part: {rows:,} rows, {seconds:.2f} s, {memory:.0f} MiB")
    for label, (wall, cpu, rss) in figures.items():
        # compute's runs against one part's compute, compare's against one part's compare.
        base = compute_memory if label.startswith("compute") else memory
        print(f"{label:>32}: {wall:6.2f} s, cpu {cpu:6.2f} s, {rss:5.0f} MiB ({rss / base:.2f}x)")
    for parts in args.parts:
        rss = figures[f"compute, {parts} parts"][2]
        print(
            f"compute, {parts} parts: peak RSS {rss / compute_memory:.2f}x one part's compute, "
            f"{rss / memory:.2f}x one part's compare"
        )
    for parts in args.parts:
        for kind, label in (("parts", f"{parts} parts"), ("steps", f"{parts} steps of one dump")):
            one_job, two_jobs = figures[f"{label}, --jobs 1"], figures[f"{label}, --jobs 2"]
            # Each of two jobs runs one thread a pool on this machine's 2 cores, where one job
            # runs two: the CPU a part shows what the second thread's waiting costs.
            print(
                f"{label}: --jobs 2 is {one_job[0] / two_jobs[0]:.2f}x --jobs 1 (target >= 1.7); "
                f"CPU s a {kind[:-1]}: {one_job[1] / parts:.3f} in one job, "
                f"{two_jobs[1] / parts:.3f} in two"
            )
    print(json.dumps({label: [round(x, 3) for x in value] for label, value in figures.items()}))


if __name__ == "__main__":
    main()
