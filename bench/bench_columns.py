"""`compute --columns keys` against `--columns all` and against a plain Polars pass, on a
trainer-like dump.

The dump is advcli's sample (the keys, `token_level_rewards`, `response_mask`) with what a
trainer's batch also holds: prompt token ids (`prompts`, 192 to 704 a row), response token ids
(`responses`) and two per-token log-prob columns (`old_log_probs`, `ref_log_prob`), about
500 MB at 250k rows. The Polars pass is the floor of `--columns keys`: it reads the same input
columns (the keys and the mask), takes the advantages precomputed (one `compute --columns none
--no-tokens` run before the timing) and writes the same output (the keys, `score`, `advantage`
and `advantages` = mask × advantage), computing nothing else. Every run is a fresh process; the
three alternate, and the medians and the median of the per-round ratios are printed.

    python bench/bench_columns.py                        # 250k rows, 3 rounds
    python bench/bench_columns.py --rows 50000 --runs 1  # a quick look
"""

from __future__ import annotations

import argparse
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

from advcli.sample import sample_table

KEYS = ["data_id", "rollout_id", "turn_index"]
CHUNK_GROUPS = 2_000
# Turns a sample trajectory takes on average at the default --max-turns (bench_compute.py).
TURNS_PER_TRAJECTORY = 2.8

POLARS_PASS = """
import sys
import polars as pl

dump, precomputed, output = sys.argv[1:]
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
"""


# Where `--columns keys` spends its time, in a fresh process: the imports, then each stage.
PHASES = """
import sys
import time

started = time.perf_counter()
from pathlib import Path
from advcli.pipeline import compute
from advcli.settings import OutputColumns

marks = [("import", time.perf_counter())]
compute(
    [sys.argv[1]],
    Path(sys.argv[2]),
    force=True,
    columns=OutputColumns.KEYS,
    on_stage=lambda name: marks.append((name, time.perf_counter())),
)
marks.append(("end", time.perf_counter()))
times = [marks[0][1] - started] + [b[1] - a[1] for a, b in zip(marks, marks[1:])]
names = ["imports", "opening", *(name for name, _ in marks[1:-1])]
print(", ".join(f"{name} {seconds:.2f} s" for name, seconds in zip(names, times)))
"""


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


def seconds(command: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run(command, check=True, capture_output=True)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=250_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dump", type=Path, help="where the dump is kept (made if missing)")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        dump = args.dump or folder / "trainer.parquet"
        if not dump.exists():
            make_dump(dump, args.rows)
        rows = pl.scan_parquet(dump).select(pl.len()).collect().item()
        print(f"dump: {rows:,} rows, {dump.stat().st_size / 1e6:,.0f} MB", flush=True)
        advcli = [sys.executable, "-m", "advcli", "compute", str(dump), "-q", "--force", "-o"]
        precomputed = folder / "precomputed.parquet"
        subprocess.run([*advcli, str(precomputed), "--columns", "none", "--no-tokens"], check=True)
        commands = {
            "all": [*advcli, str(folder / "all.parquet")],
            "keys": [*advcli, str(folder / "keys.parquet"), "--columns", "keys"],
            "polars": [
                sys.executable,
                "-c",
                POLARS_PASS,
                str(dump),
                str(precomputed),
                str(folder / "polars.parquet"),
            ],
        }
        for command in commands.values():  # warm-up: the page cache and the imports
            seconds(command)
        assert pl.read_parquet(folder / "keys.parquet").equals(
            pl.read_parquet(folder / "polars.parquet")
        ), "--columns keys and the Polars pass wrote different outputs"
        times: dict[str, list[float]] = {name: [] for name in commands}
        for _ in range(args.runs):
            for name, command in commands.items():
                times[name].append(seconds(command))
        phases = subprocess.run(
            [sys.executable, "-c", PHASES, str(dump), str(folder / "phases.parquet")],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    medians = {name: statistics.median(values) for name, values in times.items()}
    for name, value in medians.items():
        print(f"{name:>7}: {value:6.2f} s (median of {args.runs})")
    speedup = statistics.median(a / k for a, k in zip(times["all"], times["keys"], strict=True))
    floor = statistics.median(k / p for k, p in zip(times["keys"], times["polars"], strict=True))
    print(f"all / keys: {speedup:.2f}x (target >= 3)")
    print(f"keys / Polars pass: {floor:.2f}x (target <= 1.2)")
    print(f"--columns keys by phase: {phases}")


if __name__ == "__main__":
    main()
