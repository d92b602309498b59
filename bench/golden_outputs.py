"""Byte-for-byte guard for refactors: every estimator × level × setting × output format on fixed
dumps, every estimator's compare report (JSON and Markdown) and the inspection, hashed, and
compared with the hashes recorded before the change.

    python bench/golden_outputs.py --record bench/golden_outputs.json   # before the change
    python bench/golden_outputs.py --check bench/golden_outputs.json    # after it

Every computed output must be byte-identical. A compare report's JSON may differ in the last
places of its floating-point sums only (they add in another order when the figures are made
another way): the record keeps those documents too (beside it, ``*.reports.json``), and a JSON
report whose bytes changed passes when it is the recorded document but for floats within
:data:`RELATIVE` of each other (or :data:`ABSOLUTE`, for a sum whose terms cancel to nearly 0).

Output bytes also depend on the Polars, pyarrow and torch versions (Parquet files name their
writer), so the record keeps them and a check on other versions says so instead of comparing.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
import sys
import tempfile
from importlib.metadata import version
from pathlib import Path

import polars as pl

from advcli.run.commands import ReportFiles, compare, compute, inspect
from advcli.settings.config import (
    OUTCOME,
    AdvantageConfig,
    Estimator,
    Level,
    Scale,
    Singleton,
    TrajScore,
)
from advcli.write.sample import sample_table

FORMATS = ("parquet", "arrow", "arrows", "npz", "pt")
VERSIONS = ("polars", "pyarrow", "torch", "numpy")
# How far a report's float may move: relative, or absolute for a value near 0 (report figures
# are advantages and weights of order 1e-4 and more; a sum that cancels to 1e-7 may move by
# 1e-18 with another order of its terms).
RELATIVE, ABSOLUTE = 1e-12, 1e-15


def dumps(folder: Path) -> dict[str, list[str]]:
    """The fixed inputs: the shipped sample; a generated dump with non-round scores, split over
    two files; the same with scalar scores and response lengths; one with singleton and zero-std
    groups and scores that disagree within a trajectory."""
    # Copied into the fixed folder: the reports name their input files, and the checkout's own
    # path differs from one clone to the next.
    shipped = folder / "rollouts.parquet"
    shutil.copyfile(Path(__file__).resolve().parent.parent / "sample_data" / shipped.name, shipped)
    generated = pl.from_arrow(sample_table(groups=40, rollouts=6, seed=11)).with_columns(
        token_level_rewards=pl.col("token_level_rewards") * (0.3 + pl.col("data_id") * 0.0137)
    )
    parts = [folder / "part-0.parquet", folder / "part-1.parquet"]
    generated.gather_every(2).write_parquet(parts[0])
    generated.gather_every(2, offset=1).write_parquet(parts[1])
    scalar = folder / "scalar.parquet"
    generated.select(
        "data_id",
        "rollout_id",
        "turn_index",
        pl.col("token_level_rewards").list.sum().alias("score"),
        pl.col("response_mask").list.len().alias("response_length"),
    ).write_parquet(scalar)
    edges = folder / "edges.parquet"
    pl.DataFrame(
        {
            "data_id": [0, 0, 0, 1, 2, 2, 3, 3, 3],
            "rollout_id": ["a", "a", "b", "a", "a", "b", "a", "b", "b"],
            "turn_index": [0, 1, 0, 0, 0, 0, 0, 0, 1],
            "token_level_rewards": [
                [0.0, 1.0],
                [0.0, 0.5],
                [0.25, 0.0],
                [0.7],
                [0.5, 0.0],
                [0.0, 0.5],
                [1.0],
                [0.0],
                [0.2],
            ],
            "response_mask": [[1, 1], [1, 0], [1, 1], [1], [1, 1], [0, 1], [1], [0], [1]],
        },
        schema_overrides={"response_mask": pl.List(pl.Int8)},
    ).write_parquet(edges)
    return {
        "sample": [str(shipped)],
        "generated": [str(p) for p in parts],
        "scalar": [str(scalar)],
        "edges": [str(edges)],
    }


def configs() -> dict[str, AdvantageConfig]:
    out: dict[str, AdvantageConfig] = {}
    for level in Level:
        for estimator in OUTCOME:
            out[f"{level.value}-{estimator.value}"] = AdvantageConfig(
                level=level, estimator=estimator, traj_score=TrajScore.MEAN
            )
        out[f"{level.value}-grpo-batch"] = AdvantageConfig(
            level=level, scale=Scale.BATCH, traj_score=TrajScore.LAST
        )
        out[f"{level.value}-grpo-none-zero"] = AdvantageConfig(
            level=level, scale=Scale.NONE, singleton=Singleton.ZERO, traj_score=TrajScore.MAX
        )
        out[f"{level.value}-rloo-sum-eps0"] = AdvantageConfig(
            level=level, estimator=Estimator.RLOO, traj_score=TrajScore.SUM, epsilon=0.0
        )
    return out


def hashes() -> tuple[dict[str, str], dict[str, object]]:
    """Every output's hash, and the documents of the compare reports' JSON."""
    result: dict[str, str] = {}
    reports: dict[str, object] = {}
    # A fixed folder, not a random one: the reports name their input files.
    folder = Path(tempfile.gettempdir()) / "advcli-golden-outputs"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir()
    try:
        for dump_name, inputs in dumps(folder).items():
            report_files = ReportFiles(json=folder / "r.json", markdown=folder / "r.md")
            for estimator in OUTCOME:
                config = AdvantageConfig(estimator=estimator, traj_score=TrajScore.MEAN)
                compare(inputs, config, files=report_files, force=True)
                for path in (report_files.json, report_files.markdown):
                    key = f"{dump_name}/compare-{estimator.value}/{path.suffix}"  # type: ignore[union-attr]
                    result[key] = hashlib.sha256(path.read_bytes()).hexdigest()  # type: ignore[union-attr]
                    if path == report_files.json:
                        reports[key] = json.loads(path.read_text())  # type: ignore[union-attr]
            inspection = json.dumps(inspect(inputs), sort_keys=True).encode()
            result[f"{dump_name}/inspect"] = hashlib.sha256(inspection).hexdigest()
            for config_name, config in configs().items():
                for fmt in FORMATS:
                    output = folder / f"out.{fmt}"
                    compute(inputs, output, config, output_format=fmt, force=True)  # type: ignore[arg-type]
                    digest = hashlib.sha256(output.read_bytes()).hexdigest()
                    result[f"{dump_name}/{config_name}/{fmt}"] = digest
                    output.unlink()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return result, reports


def float_differences(recorded: object, current: object, path: str = "") -> list[tuple[float, str]]:
    """Each float of ``current`` that is not ``recorded``'s, with its relative difference; a
    difference of anything else (a key, a length, a string, an integer) is a ValueError."""
    if isinstance(recorded, dict) and isinstance(current, dict):
        if recorded.keys() != current.keys():
            raise ValueError(f"{path}: keys {sorted(set(recorded) ^ set(current))} differ")
        return [
            d
            for key in recorded
            for d in float_differences(recorded[key], current[key], f"{path}.{key}")
        ]
    if isinstance(recorded, list) and isinstance(current, list):
        if len(recorded) != len(current):
            raise ValueError(f"{path}: {len(recorded)} entries, now {len(current)}")
        pairs = zip(recorded, current, strict=True)
        return [
            d for i, (a, b) in enumerate(pairs) for d in float_differences(a, b, f"{path}[{i}]")
        ]
    if isinstance(recorded, float) and isinstance(current, float):
        if recorded == current:
            return []
        if abs(recorded - current) > max(RELATIVE * max(abs(recorded), abs(current)), ABSOLUTE):
            raise ValueError(f"{path}: {recorded!r}, now {current!r}")
        return [(abs(recorded - current) / max(abs(recorded), abs(current)), path)]
    if recorded != current or type(recorded) is not type(current):
        raise ValueError(f"{path}: {recorded!r}, now {current!r}")
    return []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--record", type=Path, help="write the hashes to this JSON file")
    group.add_argument("--check", type=Path, help="compare the hashes with this JSON file")
    args = parser.parse_args()
    versions = {name: version(name) for name in VERSIONS}
    current, reports = hashes()
    if args.record:
        args.record.write_text(json.dumps({"versions": versions, "outputs": current}, indent=1))
        _reports_path(args.record).write_text(json.dumps(reports, separators=(",", ":")))
        print(f"recorded {len(current)} outputs in {args.record}")
        return 0
    recorded = json.loads(args.check.read_text())
    if recorded["versions"] != versions:
        print(f"recorded with {recorded['versions']}, running {versions}: re-record first")
        return 2
    documents = json.loads(_reports_path(args.check).read_text())
    differ = sorted(k for k, v in recorded["outputs"].items() if current.get(k) != v)
    changed, moved = [], []
    for key in differ:
        try:
            moved.extend(
                (d, f"{key}{path}") for d, path in float_differences(documents[key], reports[key])
            )
        except (KeyError, ValueError) as error:
            changed.append(f"{key} {error}")
    print(f"{len(current) - len(differ)} of {len(current)} outputs byte-identical")
    if moved:
        largest, where = max(moved)
        print(
            f"{len(differ) - len(changed)} report documents the recorded ones but for "
            f"{len(moved)} floats within {RELATIVE:g} relative or {ABSOLUTE:g} absolute (the "
            f"largest relative difference {largest:.2g}, {where})"
        )
    for key in changed:
        print(f"  changed: {key}")
    return 1 if changed else 0


def _reports_path(record: Path) -> Path:
    return record.with_name(f"{record.stem}.reports.json")


if __name__ == "__main__":
    sys.exit(main())
