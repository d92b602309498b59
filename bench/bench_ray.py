"""Where `compute --engine ray` spends its time on one machine (a script, not a test).

Each engine runs the three stages in a fresh process, timed one by one through the library calls
the command makes: cluster start-up (Ray only), stage 1 (read the key columns and check every
row), stage 2 (statistics, on the driver for both engines) and stage 3 (stream every column and
write the output). The whole command's wall time is measured too, as a user sees it.

    python bench/bench_ray.py                     # 1M turn rows × ~128 tokens, 3 runs each
    python bench/bench_ray.py --rows 200000 --runs 1
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_compute import DEFAULT_MAX_TURNS, advcli, make_dump

STAGES = (
    "import",
    "start-up",
    "stage 1 (keys)",
    "stage 2 (statistics)",
    "stage 3 (write)",
    "shut-down",
)
# Not part of a run's own work: what a long-lived cluster (--address) would not pay each time.
OVERHEAD = ("import", "start-up", "shut-down")


def stages(engine: str, source: str, output: str) -> dict[str, float]:
    """The stage times of one compute run, in this process."""
    from advcli.run.commands import start_engine
    from advcli.run.loading import load_dump, opened
    from advcli.settings.config import AdvantageConfig, ColumnNames, Engine, OutputFormat

    config = AdvantageConfig()
    times: dict[str, float] = {}
    started = time.perf_counter()
    if engine == "ray":
        import ray
    times["import"] = time.perf_counter() - started
    with opened([source]) as dataset:
        started = time.perf_counter()
        start_engine(Engine(engine), None)
        times["start-up"] = time.perf_counter() - started

        started = time.perf_counter()
        dump = load_dump(dataset, ColumnNames(), engine=Engine(engine), mask_needed_for="bench")
        times["stage 1 (keys)"] = time.perf_counter() - started

        started = time.perf_counter()
        advantages = dump.advantages(config)
        times["stage 2 (statistics)"] = time.perf_counter() - started

        started = time.perf_counter()
        if engine == "ray":
            from advcli.run import ray_engine

            ray_engine.write_advantages(dataset, dump, advantages, config, Path(output))
        else:
            import polars as pl

            from advcli.keys import ROW, SCORE
            from advcli.write.rows import write_advantages

            row_values = advantages.rows(dump.projection).select(
                ROW, pl.col(SCORE, "advantage").cast(pl.Float32)
            )
            write_advantages(
                dataset,
                [(dataset, dump.columns, row_values)],
                Path(output),
                output_format=OutputFormat.PARQUET,
            )
        times["stage 3 (write)"] = time.perf_counter() - started
    started = time.perf_counter()
    if engine == "ray":
        import ray

        ray.shutdown()
    times["shut-down"] = time.perf_counter() - started
    return times


def ray_floor(source: str) -> dict[str, float]:
    """Ray Data's own cost for the passes the engine makes, with nothing of advcli's in them: a
    read with a no-op map whose (empty) blocks come back to the driver (stage 1's shape), and a
    read with a no-op map written as a Parquet folder (stage 3's shape); after one warm-up pass."""
    import ray

    from advcli.run import ray_engine

    ray_engine.start(None)

    def read_pass() -> None:
        dataset = ray.data.read_parquet(source)
        ray.get(dataset.map_batches(_empty, batch_format="pyarrow").to_arrow_refs())

    def write_pass() -> None:
        with tempfile.TemporaryDirectory() as folder:
            ray.data.read_parquet(source).map_batches(_same, batch_format="pyarrow").write_parquet(
                folder
            )

    read_pass()
    times = {}
    for name, work in (("read pass", read_pass), ("write pass", write_pass)):
        started = time.perf_counter()
        work()
        times[name] = time.perf_counter() - started
    ray.shutdown()
    return times


def _empty(batch):  # type: ignore[no-untyped-def]
    return batch.slice(0, 0)


def _same(batch):  # type: ignore[no-untyped-def]
    return batch


def stage_run(engine: str, source: Path) -> dict[str, float]:
    with tempfile.TemporaryDirectory(dir=source.parent) as folder:
        output = str(Path(folder) / "out.parquet")
        finished = subprocess.run(
            [sys.executable, __file__, "--stages", engine, str(source), output],
            capture_output=True,
            text=True,
            check=True,
        )
    return json.loads(finished.stdout.strip().splitlines()[-1])


def command_run(engine: str, source: Path) -> float:
    with tempfile.TemporaryDirectory(dir=source.parent) as folder:
        output = Path(folder) / "out.parquet"
        started = time.perf_counter()
        subprocess.run(
            advcli("compute", str(source), "-o", str(output), "--engine", engine, "-q"),
            check=True,
            capture_output=True,
        )
        return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", type=Path, default=Path("bench/data"))
    parser.add_argument("--stages", nargs=3, metavar=("ENGINE", "SOURCE", "OUTPUT"))
    parser.add_argument("--ray-floor", metavar="SOURCE")
    args = parser.parse_args()
    if args.stages:
        print(json.dumps(stages(*args.stages)))
        return
    if args.ray_floor:
        print(json.dumps(ray_floor(args.ray_floor)))
        return

    args.data.mkdir(parents=True, exist_ok=True)
    source = args.data / f"dump-{args.rows}-{args.tokens}.parquet"
    rows, size = make_dump(source, args.rows, args.tokens, DEFAULT_MAX_TURNS)
    print(f"{rows:,} rows, {size / 2**20:,.0f} MiB, {os.cpu_count()} CPUs; medians of {args.runs}")
    measured: dict[str, dict[str, list[float]]] = {"local": {}, "ray": {}}
    commands: dict[str, list[float]] = {"local": [], "ray": []}
    for _ in range(args.runs):
        for engine in ("local", "ray"):
            for stage, seconds in stage_run(engine, source).items():
                measured[engine].setdefault(stage, []).append(seconds)
            commands[engine].append(command_run(engine, source))
    print(f"{'':<24}{'local s':>10}{'ray s':>10}{'ratio':>8}")
    totals = {"local": 0.0, "ray": 0.0}
    for stage in STAGES:
        local = statistics.median(measured["local"][stage])
        ray = statistics.median(measured["ray"][stage])
        if stage not in OVERHEAD:
            totals["local"] += local
            totals["ray"] += ray
        ratio = f"{ray / local:>7.1f}x" if local > 0.01 else f"{'':>8}"
        print(f"{stage:<24}{local:>10.2f}{ray:>10.2f}{ratio}")
    print(
        f"{'stages 1-3':<24}{totals['local']:>10.2f}{totals['ray']:>10.2f}"
        f"{totals['ray'] / totals['local']:>7.1f}x"
    )
    floors = [
        json.loads(
            subprocess.run(
                [sys.executable, __file__, "--ray-floor", str(source)],
                capture_output=True,
                text=True,
                check=True,
            )
            .stdout.strip()
            .splitlines()[-1]
        )
        for _ in range(args.runs)
    ]
    read_floor = statistics.median(f["read pass"] for f in floors)
    write_floor = statistics.median(f["write pass"] for f in floors)
    print(
        f"Ray Data alone, no advcli work: a read pass {read_floor:.2f} s (stage 1's shape), a "
        f"read-and-write pass {write_floor:.2f} s (stage 3's shape): a floor of "
        f"{read_floor + write_floor:.2f} s for stages 1 and 3, "
        f"{(read_floor + write_floor) / totals['local']:.1f}x the local engine's stages 1-3"
    )
    local_cmd, ray_cmd = (statistics.median(commands[e]) for e in ("local", "ray"))
    print(
        f"{'the whole command':<24}{local_cmd:>10.2f}{ray_cmd:>10.2f}{ray_cmd / local_cmd:>7.1f}x"
    )


if __name__ == "__main__":
    main()
