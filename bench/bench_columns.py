"""`compute --columns keys` against `--columns all` and against plain Polars passes, on a
trainer-like dump, and where the time between them goes.

The dump is advcli's sample (the keys, `token_level_rewards`, `response_mask`) with what a
trainer's batch also holds: prompt token ids (`prompts`, 192 to 704 a row), response token ids
(`responses`) and two per-token log-prob columns (`old_log_probs`, `ref_log_prob`), about
500 MB at 250k rows. Both Polars passes take the advantages precomputed (one `compute --columns
none --no-tokens` run before the timing) and write the same output as `--columns keys` (the
keys, `score`, `advantage` and `advantages` = mask × advantage), computing nothing:

- the **Polars pass** reads the keys and the mask, once: the floor of a tool given the
  advantages;
- **Polars, two passes** first reads what advcli's stage 1 reads (the keys, the rewards' sums,
  the mask's sums) and then makes the same pass: the floor of a tool that must find the
  advantages first, since a row's advantage needs its whole group and the token lists are too
  large to hold between the two.

Neither checks a row (nulls, masks of 0 and 1, lengths, repeated turns), computes statistics,
checks that the input is unchanged before it publishes, nor publishes atomically; advcli does
all of it. Every run is a fresh process; the runs alternate, and the medians and the median of
the per-round ratios are printed, then each program's time split into its parts (in-process
timings of the same runs: `--columns keys` through the library with `on_stage`, the Polars pass
timing itself), so that the gap is shown part by part. The subprocesses may write Python's
byte-code caches (whatever PYTHONDONTWRITEBYTECODE says), as an installed package has them.

    python bench/bench_columns.py                        # 250k rows, 3 rounds
    python bench/bench_columns.py --rows 50000 --runs 1  # a quick look
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from advcli.write.sample import sample_table

CHUNK_GROUPS = 2_000
# Turns a sample trajectory takes on average at the default --max-turns (bench_compute.py).
TURNS_PER_TRAJECTORY = 2.8

# Prints the seconds its import of Polars and its passes took, as "import A, key read B, pass C".
POLARS_PASS = """
import sys
import time

started = time.perf_counter()
import polars as pl

imported = time.perf_counter()
dump, precomputed, output, passes = sys.argv[1:]
if passes == "2":
    pl.scan_parquet(dump).select(
        "data_id",
        "rollout_id",
        "turn_index",
        pl.col("token_level_rewards").cast(pl.List(pl.Float64)).list.sum(),
        pl.col("response_mask").list.sum(),
    ).collect(engine="streaming")
read = time.perf_counter()
keys = pl.scan_parquet(dump).select("data_id", "rollout_id", "turn_index", "response_mask")
values = pl.scan_parquet(precomputed).select("score", "advantage")
pl.concat([keys, values], how="horizontal").select(
    "data_id",
    "rollout_id",
    "turn_index",
    "score",
    "advantage",
    advantages=pl.col("response_mask").cast(pl.List(pl.Float32)) * pl.col("advantage"),
).sink_parquet(output)
print(
    f"import {imported - started}, key read {read - imported}, pass {time.perf_counter() - read}"
)
"""


# `compute --columns keys` through the command line in a fresh process, timed inside: prints
# the seconds of the library's imports, of the command line up to its call of the library, and
# of each stage, as "imports A, command line B, opening C, reading keys D, ...".
PHASES = """
import sys
import time

started = time.perf_counter()
from advcli._runtime.process import single_blas_thread, tune_allocator

tune_allocator()  # as the entry point does, before Polars and numpy load
single_blas_thread()
import advcli.run.commands as pipeline

marks = [("imports", time.perf_counter())]
library = pipeline.compute


def timed(*args, **kwargs):
    marks.append(("command line", time.perf_counter()))
    kwargs["on_stage"] = lambda name: marks.append((name, time.perf_counter()))
    summary = library(*args, **kwargs)
    marks.append(("end", time.perf_counter()))
    return summary


pipeline.compute = timed
sys.argv = ["advcli", "compute", *sys.argv[1:]]
from advcli.__main__ import main

try:
    main()
except SystemExit:
    pass
times = [marks[0][1] - started] + [b[1] - a[1] for a, b in zip(marks, marks[1:])]
names = ["imports", "command line", "opening", *(name for name, _ in marks[2:-1])]
print(", ".join(f"{name} {seconds}" for name, seconds in zip(names, times)))
"""

# The imports alone: Polars (the passes'), and the three libraries advcli's stages use.
IMPORTS = {
    "import polars": "import polars",
    "import polars, pyarrow, numpy": "import polars, pyarrow.parquet, numpy",
}


def _lists(lengths: np.ndarray, values: np.ndarray) -> pa.ListArray:
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int32)
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))


def make_dump(path: Path, rows: int) -> None:
    """The trainer-like dump, written a chunk of groups at a time."""
    rng = np.random.default_rng(0)
    groups = round(rows / (8 * TURNS_PER_TRAJECTORY))
    writer, written = None, 0
    for first in range(0, groups, CHUNK_GROUPS):
        table = sample_table(groups=min(CHUNK_GROUPS, groups - first), tokens=128, seed=first)
        table = table.set_column(0, "data_id", pc.add(table["data_id"], first))
        table = table.slice(0, rows - written)
        lengths = pc.list_value_length(table["response_mask"]).to_numpy()
        prompt_lengths = rng.integers(192, 705, table.num_rows)
        tokens = int(lengths.sum())
        table = (
            table.append_column(
                "prompts",
                _lists(prompt_lengths, rng.integers(0, 150_000, prompt_lengths.sum(), np.int32)),
            )
            .append_column("responses", _lists(lengths, rng.integers(0, 150_000, tokens, np.int32)))
            .append_column(
                "old_log_probs", _lists(lengths, -rng.exponential(1, tokens).astype("f4"))
            )
            .append_column(
                "ref_log_prob", _lists(lengths, -rng.exponential(1, tokens).astype("f4"))
            )
        )
        if writer is None:
            writer = pq.ParquetWriter(path, table.schema)
        writer.write_table(table)
        written += table.num_rows
        if written >= rows:
            break
    assert writer is not None
    writer.close()


def seconds(command: list[str], env: dict[str, str]) -> tuple[float, float, str]:
    """The wall time of ``command`` in a fresh process, the CPU time it took (its threads'
    together: steadier than the wall time on a busy machine), and what it printed."""
    before, started = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    wall, after = time.perf_counter() - started, resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, done.stdout.strip()


def parts(printed: str) -> dict[str, float]:
    """``"name 1.5, other 2.0"`` as ``{"name": 1.5, "other": 2.0}``."""
    return {
        name: float(value) for name, value in (item.rsplit(" ", 1) for item in printed.split(", "))
    }


def breakdown(times: dict[str, list[float]], printed: dict[str, list[str]]) -> list[str]:
    """Each program's median time split into its parts: the medians of the parts its runs
    printed (`--columns keys`: the same command timed inside, ``PHASES``), and what the wall
    time leaves besides them (Python's start and exit)."""

    def wall(name: str) -> float:
        return statistics.median(times[name])

    def part(name: str, key: str) -> float:
        return statistics.median(parts(line)[key] for line in printed[name])

    def rest(name: str, keys: tuple[str, ...]) -> float:
        return wall(name) - sum(part(name, key) for key in keys)

    stages = ("opening", "reading keys", "computing statistics", "writing output")
    library = ("imports", "command line", *stages)
    polars = ("import", "key read", "pass")
    two = "polars, two passes"
    rows = {
        "Python's start and exit": (
            rest("phases", library),
            rest("polars", polars),
            rest(two, polars),
        ),
        "imports (the library's)": (
            part("phases", "imports"),
            part("polars", "import"),
            part(two, "import"),
        ),
        "the command line (Typer, its modules)": (part("phases", "command line"), 0.0, 0.0),
        "reading keys (stage 1)": (
            part("phases", "opening") + part("phases", "reading keys"),
            part("polars", "key read"),
            part(two, "key read"),
        ),
        "statistics (stage 2)": (part("phases", "computing statistics"), 0.0, 0.0),
        "the write (stage 3), the pass": (
            part("phases", "writing output"),
            part("polars", "pass"),
            part(two, "pass"),
        ),
        "total (median wall time)": (wall("phases"), wall("polars"), wall(two)),
    }
    lines = [f"{'':38} {'keys':>8} {'Polars':>8} {'2 passes':>8}"]
    for name, values in rows.items():
        lines.append(f"{name:38} " + " ".join(f"{value:8.2f}" for value in values))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dump", type=Path, help="where the dump is kept (made if missing)")
    args = parser.parse_args()
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        dump = args.dump or folder / "trainer.parquet"
        if not dump.exists():
            make_dump(dump, args.rows)
        rows = pl.scan_parquet(dump).select(pl.len()).collect().item()
        print(f"dump: {rows:,} rows, {dump.stat().st_size / 1e6:,.0f} MB", flush=True)
        advcli = [sys.executable, "-m", "advcli", "compute", str(dump), "-q", "--force", "-o"]
        precomputed = folder / "precomputed.parquet"
        subprocess.run(
            [*advcli, str(precomputed), "--columns", "none", "--no-tokens"], check=True, env=env
        )
        polars_pass = [sys.executable, "-c", POLARS_PASS, str(dump), str(precomputed)]
        commands = {
            "all": [*advcli, str(folder / "all.parquet")],
            "keys": [*advcli, str(folder / "keys.parquet"), "--columns", "keys"],
            "polars": [*polars_pass, str(folder / "polars.parquet"), "1"],
            "polars, two passes": [*polars_pass, str(folder / "polars2.parquet"), "2"],
            "phases": [
                sys.executable,
                "-c",
                PHASES,
                *advcli[4:],
                str(folder / "phases.parquet"),
                "--columns",
                "keys",
            ],
            **{name: [sys.executable, "-c", code] for name, code in IMPORTS.items()},
        }
        for command in commands.values():  # warm-up: the page cache and the byte-code caches
            seconds(command, env)
        keys = pl.read_parquet(folder / "keys.parquet")
        for name in ("polars", "polars2"):
            assert keys.equals(pl.read_parquet(folder / f"{name}.parquet")), (
                f"--columns keys and the {name} pass wrote different outputs"
            )
        times: dict[str, list[float]] = {name: [] for name in commands}
        cpu: dict[str, list[float]] = {name: [] for name in commands}
        printed: dict[str, list[str]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, command in commands.items():
                wall, seconds_of_cpu, output = seconds(command, env)
                times[name].append(wall)
                cpu[name].append(seconds_of_cpu)
                printed[name].append(output)
    for name in ("all", "keys", "polars", "polars, two passes", *IMPORTS):
        print(
            f"{name:>30}: {statistics.median(times[name]):6.2f} s, CPU "
            f"{statistics.median(cpu[name]):6.2f} s (medians of {args.runs})"
        )

    def ratio(numerator: str, denominator: str) -> str:
        def of(values: dict[str, list[float]]) -> float:
            pairs = zip(values[numerator], values[denominator], strict=True)
            return statistics.median(a / b for a, b in pairs)

        return f"{of(times):.2f}x (CPU {of(cpu):.2f}x)"

    print(f"all / keys: {ratio('all', 'keys')} (target >= 3)")
    print(f"keys / Polars pass: {ratio('keys', 'polars')} (target <= 1.2)")
    print(f"keys / Polars, two passes: {ratio('keys', 'polars, two passes')}")
    print("where the time goes, in seconds (medians; keys: `--columns keys`):")
    for line in breakdown(times, printed):
        print("  " + line)
    print(
        "what the Polars passes do not do: check any row, compute the statistics, check that "
        "the input is unchanged, publish atomically"
    )


if __name__ == "__main__":
    main()
