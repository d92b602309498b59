"""The bias report's views and the defects found trying it as a new user: the HTML page in a
real headless browser, --by steps, the worst trajectories, the verdict's thresholds, Markdown
cells, --help text, uuid ids in terminal tables, trajectory-level scores in inspect."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import uuid
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from conftest import ROOT
from PIL import Image
from typer.testing import CliRunner

from advcli.cli.app import app
from advcli.report.verdict import THRESHOLDS, assess
from advcli.report.views import (
    TOP_GROUP_HEADERS,
    TOP_TRAJECTORY_HEADERS,
    counted,
    distinct_chars,
)

SAMPLE = ROOT / "sample_data" / "rollouts.parquet"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _steps(tmp_path: Path) -> Path:
    """Three step files of the sample with distinct group ids and a `step` column; step 2 keeps
    single-turn trajectories only (no bias there)."""
    folder = tmp_path / "steps"
    folder.mkdir(parents=True)
    sample = pl.read_parquet(SAMPLE)
    for step in range(3):
        frame = sample.with_columns(
            (pl.col("data_id") + 1000 * step).alias("data_id"), pl.lit(10 * step).alias("step")
        )
        if step == 2:
            frame = frame.filter(pl.col("turn_index") == 0)
        frame.write_parquet(folder / f"step-{step}.parquet")
    return folder


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (.ci/run installs it)")
def test_html_page_renders_in_a_headless_browser(run, tmp_path):
    page = tmp_path / "report.html"
    result = run("compare", _steps(tmp_path), "--by", "step", "--html", page, "-q")
    assert result.exit_code == 0, result.output
    html = page.read_text()
    # Self-contained: nothing is fetched.
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html)
    assert 'src="data:image/png;base64,' in html

    browser = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        [*browser, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120
    ).stdout
    text = re.sub(r"<[^>]+>", " ", dom)
    summary = json.loads(run("compare", _steps(tmp_path / "again"), "--json", "-", "-q").stdout)
    assert summary["verdict"].split(".")[0] in text
    for heading in (
        "What to change",
        "How the dump was read",
        "By turn count",
        "Loss weight by turn count",
        "By step",
        "Most affected",
    ):
        assert heading in text
    # How the dump was read: the trainer, each role's column and why, the settings, the inputs.
    words = " ".join(text.split())
    assert "trainer advcli" in words and "estimator grpo" in words
    assert "group data_id 'data_id' is the group column of advcli's dumps" in words
    assert f"advcli {summary['settings']['advcli_version']}" in words
    assert "<img" in dom

    shot = tmp_path / "shot.png"
    subprocess.run(
        [*browser, f"--screenshot={shot}", "--window-size=1280,2000", page.as_uri()],
        capture_output=True,
        timeout=120,
    )
    pixels = np.asarray(Image.open(shot).convert("L"))
    # Not blank: dark text and the figure's colours on a light page.
    assert pixels.min() < 60 and (pixels < 200).mean() > 0.02


def test_by_step_gives_each_steps_own_report(run, tmp_path):
    folder = _steps(tmp_path)
    combined = json.loads(run("compare", folder, "--by", "file", "--json", "-", "-q").stdout)
    steps = combined["by_step"]["steps"]
    assert combined["by_step"]["by"] == "file"
    # Each file is named by its step, the number its name holds within the folder.
    assert [s["step"] for s in steps] == [0, 1, 2]
    # Each step's figures are those of a compare on that file alone.
    for entry, path in zip(steps, sorted(folder.iterdir()), strict=True):
        alone = json.loads(run("compare", path, "--json", "-", "-q").stdout)
        assert entry["advantage_diff_mean"] == alone["trajectories"]["advantage_diff_mean"]
        assert entry["rows"] == alone["counts"]["rows"]
    # Single-turn trajectories only: no bias at step 2.
    assert steps[2]["advantage_diff_mean"] == 0 and steps[2]["level"] == "negligible"
    by_column = json.loads(run("compare", folder, "--by", "step", "--json", "-", "-q").stdout)
    assert [s["step"] for s in by_column["by_step"]["steps"]] == [0, 10, 20]
    missing = run("compare", folder, "--by", "epoch", "-q")
    assert missing.exit_code == 1 and "column 'epoch' (--by) not found" in missing.stderr


def test_worst_trajectories_are_sorted_by_the_difference(run):
    summary = json.loads(run("compare", SAMPLE, "--json", "-", "-q", "--top", "5").stdout)
    worst = summary["top_trajectories"]
    assert len(worst) == 5
    diffs = [abs(entry["diff"]) for entry in worst]
    assert diffs == sorted(diffs, reverse=True)
    assert diffs[0] == pytest.approx(summary["trajectories"]["advantage_diff_max"])
    first = worst[0]
    assert first["diff"] == pytest.approx(first["advantage_trajectory"] - first["advantage_turn"])


def _summary(diff_mean: float, flips: int, trajectories: int = 1000) -> dict:
    return {
        "trajectories": {"advantage_diff_mean": diff_mean, "sign_flips": flips},
        "counts": {"trajectories": trajectories},
        "loss_weights": None,
        "settings": {"reading": {"trainer": "verl-agent"}},
    }


@pytest.mark.parametrize(
    ("diff_mean", "flips", "level"),
    [
        (0.0, 0, "negligible"),
        (0.009, 0, "negligible"),
        (0.01, 0, "material"),  # the material threshold itself
        (0.0, 1, "material"),  # any sign flip
        (0.099, 10, "material"),  # 1 % of 1000 trajectories is not beyond 1 %
        (0.1, 0, "severe"),
        (0.0, 11, "severe"),  # 1.1 % flips
    ],
)
def test_verdict_thresholds(diff_mean, flips, level):
    assessment = assess(_summary(diff_mean, flips))
    assert assessment["level"] == level
    assert assessment["thresholds"] == THRESHOLDS
    assert (assessment["remedy"] is None) == (level == "negligible")


def test_verdict_names_the_remedy(run):
    summary = json.loads(run("compare", SAMPLE, "--json", "-", "-q").stdout)
    assert summary["assessment"]["level"] == "severe"
    # The sample is in advcli's own schema, which write_batch writes from any trainer: every
    # trainer's change is listed, advcli's first, and the verdict names advcli's.
    remedy = summary["assessment"]["remedy"]
    assert remedy["trainer"] == "advcli"
    assert remedy["advice"][0]["trainer"] == "advcli"
    assert "advcli compute --level trajectory" in summary["verdict"]
    assert "compute_mean_std_cross_steps" not in summary["verdict"]


def test_markdown_cells_escape_pipes(run, tmp_path):
    report = tmp_path / "r.md"
    assert run("compare", SAMPLE, "--markdown", report, "-q").exit_code == 0
    text = report.read_text()
    assert r"\|advantage diff\|" in text
    for table in re.findall(r"(?:^\|.*\|\n)+", text, flags=re.M):
        widths = {len(re.findall(r"(?<!\\)\|", line)) for line in table.splitlines()}
        assert len(widths) == 1, table


def test_help_keeps_brackets_and_defaults(run):
    text = run("compare", "--help").stdout
    assert "advcli[plot]" in text and "advcli[ray]" in text
    assert "[default: error]" in text and "[default: group]" in text
    assert not re.search(r"\s\.\s*$", text, flags=re.M)


def _uuid_dump(tmp_path: Path, ids: list[str]) -> Path:
    """Two trajectories of one and two turns in each group of ``ids``, trajectory ids made by
    suffixing the group's."""
    rows = [
        (ids[g], f"{ids[g]}-r{r}", t, float((g + r + t) % 2), 2)
        for g in range(len(ids))
        for r in range(2)
        for t in range(r + 1)
    ]
    path = tmp_path / "uuids.parquet"
    pl.DataFrame(
        rows,
        schema=["data_id", "rollout_id", "turn_index", "score", "response_length"],
        orient="row",
    ).write_parquet(path)
    return path


def _terminal_table(stdout: str, title: str) -> list[list[str]]:
    """The cells of the rows of a terminal table, each row one line."""
    table = stdout.split(title)[1].split("\n\n")[0]
    rows = [line for line in table.splitlines() if "│" in line]
    return [[cell.strip() for cell in row.split("│")] for row in rows]


def test_long_ids_fit_an_80_column_terminal_and_stay_apart(tmp_path):
    ids = [str(uuid.UUID(int=i + 1)) for i in range(4)]
    result = CliRunner(env={"COLUMNS": "80"}).invoke(
        app, ["compare", str(_uuid_dump(tmp_path, ids)), "--traj-score", "last"]
    )
    assert result.exit_code == 0, result.output
    groups = _terminal_table(result.stdout, "Most affected groups")
    trajectories = _terminal_table(result.stdout, "Most affected trajectories")
    # One line a row: a row with a folded id would add lines with an empty number cell.
    assert len(groups) == len(ids) and all(row[1] for row in groups)
    assert len(trajectories) == 2 * len(ids) and all(row[2] for row in trajectories)
    assert all(len(line) <= 80 for line in result.stdout.splitlines())
    # Each shown id is the head and tail of exactly one whole id, and no two look alike.
    for shown_ids, whole in (
        ([row[0] for row in groups], ids),
        ([row[1] for row in trajectories], [f"{i}-r{r}" for i in ids for r in range(2)]),
    ):
        found = []
        for text in shown_ids:
            head, tail = text.split("…")
            found += [[w for w in whole if w.startswith(head) and w.endswith(tail)]]
        assert all(len(one) == 1 for one in found), found
        assert len({one[0] for one in found}) == len(set(shown_ids))
    note = "Ids too long for the terminal's width are shown shortened (head…tail)"
    assert note in " ".join(result.stdout.split())


@pytest.mark.parametrize("width", [60, 80, 100, 140])
@pytest.mark.parametrize("ids", ["short", "uuids", "by step"])
def test_the_id_tables_keep_every_column_within_the_width(tmp_path, width, ids):
    names = [str(uuid.UUID(int=i + 1)) if ids == "uuids" else f"g{i}" for i in range(4)]
    path = _uuid_dump(tmp_path, names)
    options = ["--traj-score", "last"]
    if ids == "by step":
        # Two steps of the same groups: each group keyed by its step and its id.
        frame = pl.read_parquet(path)
        pl.concat([frame.with_columns(step=pl.lit(step)) for step in (0, 1)]).write_parquet(path)
        options += ["--by", "step"]
    result = CliRunner(env={"COLUMNS": str(width)}).invoke(app, ["compare", str(path), *options])
    assert result.exit_code == 0, result.output
    assert max(len(line) for line in result.stdout.splitlines()) <= width
    for title, headers in (
        ("Most affected groups", TOP_GROUP_HEADERS),
        ("Most affected trajectories", TOP_TRAJECTORY_HEADERS),
    ):
        # Each line of the header has a rule between every two of the columns.
        head = result.stdout.split(title)[1].split("━")[0].splitlines()[1:]
        assert head and all(line.count("┃") == len(headers) - 1 for line in head), head
    if ids == "by step" and width >= 80:
        groups = _terminal_table(result.stdout, "Most affected groups")
        assert {row[0] for row in groups} == {
            f"step={t}, group=g{g}" for t in (0, 1) for g in range(4)
        }


def test_ids_alike_but_in_their_middle_are_folded_whole(tmp_path):
    # Shortened to what an 80-column row has room for, these would all look alike.
    ids = [f"{'a' * 20}{i}{'b' * 20}" for i in range(4)]
    result = CliRunner(env={"COLUMNS": "80"}).invoke(
        app, ["compare", str(_uuid_dump(tmp_path, ids)), "--traj-score", "last"]
    )
    assert result.exit_code == 0, result.output
    # Folded, an id continues on the next lines of its cell: the group column of the groups
    # table, read top to bottom, holds every id whole.
    column = "".join(row[0] for row in _terminal_table(result.stdout, "Most affected groups"))
    assert "…" not in column and all(i in column for i in ids)


@pytest.mark.parametrize(
    ("ids", "chars", "expected"),
    [
        # uuids counted up differ in their last character: the tail tells them apart at once.
        ([str(uuid.UUID(int=i + 1)) for i in range(3)], 12, 12),
        # Differing at index 6: a head of (chars - 1) // 2 characters holds it from 15 on.
        ([f"aaaaaa{i}{'b' * 30}" for i in range(3)], 12, 15),
        # Alike as whole ids too: nothing to tell apart.
        (["x" * 40, "x" * 40], 12, 12),
        # Never past the documents' limit, where the JSON is the place to read them.
        ([f"{'a' * 40}{i}{'b' * 40}" for i in range(2)], 12, 64),
    ],
)
def test_distinct_chars_widens_until_ids_stay_apart(ids, chars, expected):
    assert distinct_chars(ids, chars) == expected


def test_long_ids_are_whole_on_a_wide_terminal(tmp_path):
    ids = [str(uuid.UUID(int=i + 1)) for i in range(4)]
    path = _uuid_dump(tmp_path, ids)
    result = CliRunner(env={"COLUMNS": "200"}).invoke(
        app, ["compare", str(path), "--traj-score", "last"], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "…" not in result.stdout and "shortened" not in result.stdout
    groups = _terminal_table(result.stdout, "Most affected groups")
    assert sorted(row[0] for row in groups) == sorted(ids)


def test_inspect_shows_trajectory_level_scores(run, tmp_path):
    # One 3-turn failure and one 1-turn success: rows succeed 25 %, trajectories 50 %.
    path = tmp_path / "rate.parquet"
    pl.DataFrame(
        {"data_id": [0] * 4, "rollout_id": [0, 0, 0, 1], "score": [0.0, 0.0, 0.0, 1.0]}
    ).write_parquet(path)
    report = json.loads(run("inspect", path, "--json").stdout)
    assert report["scores"]["mean"] == 0.25
    assert report["trajectory_scores"]["mean"] == 0.5
    assert report["trajectory_scores"]["values"] == {"0": 1, "1": 1}


def test_by_file_keeps_a_file_without_rows(run, tmp_path):
    folder = _steps(tmp_path)
    empty = folder / "step-1.parquet"
    pl.read_parquet(empty).head(0).write_parquet(empty)
    summary = json.loads(run("compare", folder, "--by", "file", "--json", "-", "-q").stdout)
    steps = summary["by_step"]["steps"]
    assert [s["rows"] for s in steps][1] == 0 and len(steps) == 3
    assert steps[1]["level"] is None and steps[1]["advantage_diff_mean"] is None


def test_terminal_view_holds_every_section(run):
    text = run("compare", SAMPLE).stdout
    for heading in (
        "Most affected groups",
        "Most affected trajectories (|diff|)",
        "Loss weight by turn count",
        "bias: severe",
        "What to change",
    ):
        assert heading in " ".join(text.split()) or heading in text, heading


@pytest.mark.parametrize(
    ("count", "noun", "plural", "said"),
    [
        (1, "row", None, "1 row"),
        (0, "row", None, "0 rows"),
        (2, "duplicated row", None, "2 duplicated rows"),
        (1_024, "copy", "copies", "1,024 copies"),
        (1, "copy", "copies", "1 copy"),
    ],
)
def test_counted_says_one_thing_in_the_singular(count, noun, plural, said):
    assert counted(count, noun, plural) == said


@pytest.mark.parametrize("width", [80, 100, 140])
def test_loss_mode_names_break_only_after_their_hyphens(width):
    result = CliRunner(env={"COLUMNS": str(width)}).invoke(app, ["compare", str(SAMPLE)])
    assert result.exit_code == 0, result.output
    table = result.stdout.split("Loss weight by turn count", 1)[1]
    head = table.split("━")[0].splitlines()[1:]
    columns = zip(*([cell.strip() for cell in line.split("┃")] for line in head), strict=True)
    names = []
    for column in columns:
        pieces = [piece for piece in column if piece]
        # Every line of a name but its last ends at one of its hyphens.
        assert all(piece.endswith("-") for piece in pieces[:-1]), pieces
        names.append("".join(pieces))
    assert names == [
        "turns",
        "token-mean",
        "token-sum",
        "seq-mean-token-sum",
        "seq-mean-token-mean",
        "seq-mean-token-sum-norm",
        "per-rollout-mean",
    ]
    assert max(len(line) for line in result.stdout.splitlines()) <= width


def test_inspect_shows_float32_scores_as_the_report_shows_numbers(run, tmp_path):
    # float32 -0.1 is -0.10000000149011612 once widened: the terminal shows six significant
    # digits, the JSON every digit.
    path = tmp_path / "f32.parquet"
    pl.DataFrame(
        {
            "data_id": [0, 0, 0],
            "rollout_id": ["a", "a", "b"],
            "turn_index": [0, 1, 0],
            "score": pl.Series([0.0, -0.1, 1.0], dtype=pl.Float32),
        }
    ).write_parquet(path)
    text = " ".join(run("inspect", path).stdout.split())
    assert "group=0, trajectory=a, scores=[0, -0.1]" in text
    summary = json.loads(run("inspect", path, "--json").stdout)
    assert summary["inconsistent_trajectories"]["examples"][0]["scores"] == [
        0.0,
        float(np.float32(-0.1)),
    ]
