"""Text from the data or the command line (ids, column names, step labels, paths) is shown as
written in every view: rich markup, emoji codes, mathtext, HTML and Markdown syntax and line breaks
in it are not read as such, and a long id is shortened in the terminal and Markdown while the JSON
report keeps it whole."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest
from conftest import dump_frame
from typer.testing import CliRunner

from advcli.cli.app import app

pytest.importorskip("matplotlib")

# Each hostile text, and how a Markdown cell writes it so that it renders as the text itself.
MARKDOWN = {
    "[/x]": r"\[/x\]",
    "[bold red]x": r"\[bold red\]x",
    "$^$": "$^$",
    r"$\frac{1}{2}$": r"$\\frac{1}{2}$",
    "<script>": "&lt;script&gt;",
    "a|b": r"a\|b",
    "new\nline": r"new\\nline",
    ":smile:": ":smile:",
}
TEXTS = list(MARKDOWN)


def terminal_form(text: str) -> str:
    """How the terminal writes a text: a line break as the two characters \\n."""
    return text.replace("\n", "\\n")


def invoke(*args: object, columns: int = 400):
    # Wide enough that no cell of these tests is folded across lines.
    runner = CliRunner(env={"COLUMNS": str(columns)})
    return runner.invoke(app, [str(a) for a in args], catch_exceptions=False)


def hostile_dump(path: Path) -> Path:
    """A group per hostile text, named by it, with a one-turn and a two-turn trajectory (so the
    two levels differ and every group is listed); each trajectory id is its group's text and a
    suffix."""
    rows = [
        (text, f"{text}/t{t}", turn, float(t + g % 2), 3)
        for g, text in enumerate(TEXTS)
        for t in range(2)
        for turn in range(t + 1)
    ]
    dump_frame(rows).write_parquet(path)
    return path


def test_compare_shows_ids_literally_in_every_view(tmp_path):
    dump = hostile_dump(tmp_path / "hostile.parquet")
    files = {kind: tmp_path / f"report.{kind}" for kind in ("json", "md", "png", "html")}
    result = invoke(
        "compare",
        dump,
        "--top",
        "20",
        "--json",
        files["json"],
        "--markdown",
        files["md"],
        "--plot",
        files["png"],
        "--html",
        files["html"],
    )
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    for text in TEXTS:
        assert f" {terminal_form(text)} " in result.stdout, text
        assert f" {terminal_form(text)}/t1 " in result.stdout, text
    assert "😄" not in result.stdout

    markdown = files["md"].read_text()
    for text, cell in MARKDOWN.items():
        assert f"| {cell} |" in markdown, text
        assert f"| {cell}/t1 |" in markdown, text
    assert "<script>" not in markdown and "new\nline" not in markdown

    summary = json.loads(files["json"].read_text())
    assert {group["group"] for group in summary["top_groups"]} == set(TEXTS)
    assert {entry["trajectory"] for entry in summary["top_trajectories"]} == {
        f"{text}/t{t}" for text in TEXTS for t in range(2)
    }

    image = pytest.importorskip("matplotlib.image").imread(files["png"])
    assert image.ndim == 3 and image.shape[0] > 100
    html = files["html"].read_text()
    assert "<script>" not in html and "&lt;script&gt;" in html
    assert "data:image/png;base64," in html


def test_step_labels_and_the_step_column_are_shown_literally(tmp_path):
    rows = [
        (g, f"{g}-{t}", turn, float(t), 2)
        for g in range(2)
        for t in range(2)
        for turn in range(t + 1)
    ]
    per_step = dump_frame(rows)
    column = "[bold red]x"
    dump = tmp_path / "steps.parquet"
    pl.concat(
        [per_step.with_columns(pl.lit(label).alias(column)) for label in TEXTS]
    ).write_parquet(dump)
    report_json, report_md, plot = tmp_path / "r.json", tmp_path / "r.md", tmp_path / "r.png"
    result = invoke(
        "compare", dump, "--by", column, "--json", report_json, "--markdown", report_md,
        "--plot", plot,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "Traceback" not in result.output
    assert f"By {column}" in result.stdout
    for label in TEXTS:
        assert f" {terminal_form(label)} │" in result.stdout, label
    markdown = report_md.read_text()
    for label, cell in MARKDOWN.items():
        assert f"| {cell} |" in markdown, label
    summary = json.loads(report_json.read_text())
    assert summary["by_step"]["by"] == column
    assert [entry["step"] for entry in summary["by_step"]["steps"]] == sorted(TEXTS)
    assert pytest.importorskip("matplotlib.image").imread(plot).ndim == 3


def test_column_names_are_shown_literally(tmp_path):
    names = {
        "group": "[/x]",
        "trajectory": "[bold red]x",
        "turn": r"$\frac{1}{2}$",
        "reward": "<script>|a",
        "mask": "new\nline",
    }
    dump = tmp_path / "named.parquet"
    rows = [
        (g, f"{g}-{t}", turn, float(t), 2)
        for g in range(2)
        for t in range(2)
        for turn in range(t + 1)
    ]
    dump_frame(rows).rename(
        {
            "data_id": names["group"],
            "rollout_id": names["trajectory"],
            "turn_index": names["turn"],
            "token_level_rewards": names["reward"],
            "response_mask": names["mask"],
        }
    ).write_parquet(dump)
    options = [
        "--group-col", names["group"], "--traj-col", names["trajectory"],
        "--turn-col", names["turn"], "--reward-col", names["reward"],
        "--mask-col", names["mask"],
    ]  # fmt: skip
    report = tmp_path / "report.md"
    result = invoke("compute", dump, "-o", tmp_path / "out.parquet", "--report", report, *options)
    assert result.exit_code == 0, result.output
    for role, name in names.items():
        assert f"{role} column" in result.stderr
        assert f" {terminal_form(name)}: " in result.stderr, role
    markdown = report.read_text()
    for role, cell in (
        ("group", r"\[/x\]"),
        ("trajectory", r"\[bold red\]x"),
        ("turn", r"$\\frac{1}{2}$"),
        ("reward", r"&lt;script&gt;\|a"),
        ("mask", r"new\\nline"),
    ):
        assert f"| {role} | {cell} |" in markdown, role

    inspected = invoke("inspect", dump, *options)
    assert inspected.exit_code == 0, inspected.output
    for name in names.values():
        assert f" {terminal_form(name)} " in inspected.stdout, name
    as_json = json.loads(invoke("inspect", dump, *options, "--json").stdout)
    assert {role: entry["column"] for role, entry in as_json["columns"].items()} == names


def test_paths_are_shown_literally(tmp_path):
    # Written paths hold markup; the input's holds none of '[' '*' '?', which would make it a glob.
    written_to = tmp_path / "[bold red]x $^$ <script> a|b [i]\nc"
    read_from = tmp_path / "$^$ <script> a|b\nc"
    written_to.mkdir()
    read_from.mkdir()
    sampled = written_to / "sample.parquet"
    written = invoke("sample", sampled, "--groups", "3", "--rollouts", "2")
    assert written.exit_code == 0, written.output
    assert f"trajectories to {terminal_form(str(sampled))}\n" in written.stderr
    dump = read_from / "dump.parquet"
    dump.write_bytes(sampled.read_bytes())

    config = written_to / "[bold]x.toml"
    config.write_text("top = 5\n")
    output, report = written_to / "out.parquet", written_to / "report.md"
    computed = invoke("compute", dump, "-o", output, "--report", report, "--config", config)
    assert computed.exit_code == 0, computed.output
    assert f"{terminal_form(str(output))} (parquet)" in computed.stderr
    assert f"report: {terminal_form(str(report))}\n" in computed.stderr
    assert f" {terminal_form(str(config))} " in computed.stderr
    # The Markdown report names its input in a code span, where nothing is markup.
    assert f"Inputs: `{terminal_form(str(dump))}`." in report.read_text()

    compared = invoke("compare", dump, "--config", config)
    assert compared.exit_code == 0, compared.output
    assert f"config: {terminal_form(str(config))}\n" in compared.stdout


def test_backticks_in_a_path_keep_the_code_span_whole(tmp_path):
    folder = tmp_path / "a``b`"
    folder.mkdir()
    assert invoke("sample", folder / "dump.parquet", "--groups", "2", "-q").exit_code == 0
    report = tmp_path / "r.md"
    assert invoke("compare", folder, "--markdown", report, "-q").exit_code == 0
    # A fence longer than the longest run of backticks inside.
    assert f"Inputs: ```{folder}/dump.parquet```." in report.read_text()


# 256 KiB: a head, a body and a tail, so the shortened form is known by hand: the first 31
# characters, an ellipsis, the last 32.
LONG_ID = "H" + "m" * (256 * 1024 - 2) + "T"
LONG_ID_SHOWN = "H" + "m" * 30 + "…" + "m" * 31 + "T"


def long_id_dump(path: Path, group: str) -> Path:
    """The long-id group (two trajectories of 1 and 2 turns), a short group beside it, and a
    singleton group named by the id, which inspect lists as an example."""
    rows = [
        (group, "t0", 0, 1.0, 2),
        (group, "t1", 0, 0.0, 2),
        (group, "t1", 1, 0.0, 2),
        ("short", "a", 0, 1.0, 2),
        ("short", "b", 0, 0.0, 2),
        (group + "!", "only", 0, 1.0, 2),
    ]
    dump_frame(rows).write_parquet(path)
    return path


def timed_cli(*args: object) -> tuple[float, subprocess.CompletedProcess]:
    environment = {**os.environ, "COLUMNS": "200", "PYTHONPATH": os.getcwd()}
    started = time.perf_counter()
    result = subprocess.run(
        [sys.executable, "-m", "advcli", *map(str, args)],
        capture_output=True,
        env=environment,
        check=False,
    )
    return time.perf_counter() - started, result


@pytest.mark.process
def test_a_256_kib_id_is_shortened_in_the_views_and_whole_in_json(tmp_path):
    short_dump = long_id_dump(tmp_path / "short.parquet", "g")
    long_dump = long_id_dump(tmp_path / "long.parquet", LONG_ID)
    short_seconds, short = timed_cli("compare", short_dump)
    report_json, report_md = tmp_path / "r.json", tmp_path / "r.md"
    long_seconds, long = timed_cli(
        "compare", long_dump, "--json", report_json, "--markdown", report_md
    )
    assert short.returncode == 0 and long.returncode == 0, long.stderr
    assert b"Traceback" not in long.stderr
    assert long_seconds < short_seconds + 1.0
    assert len(long.stdout) < 200_000
    terminal = long.stdout.decode()
    # The terminal shortens it further, to what its table rows have room for.
    shown_in_terminal = re.findall(r"Hm*…m*T", terminal)
    assert shown_in_terminal and all(len(text) <= len(LONG_ID_SHOWN) for text in shown_in_terminal)
    assert "longer than 64 characters are shown shortened" in " ".join(terminal.split())
    assert "longer than 64" not in short.stdout.decode()

    markdown = report_md.read_text()
    assert len(markdown) < 200_000
    assert f"| {LONG_ID_SHOWN} |" in markdown
    assert "longer than 64 characters are shown shortened" in markdown
    summary = json.loads(report_json.read_text())
    assert LONG_ID in {group["group"] for group in summary["top_groups"]}

    _, inspected = timed_cli("inspect", long_dump)
    assert inspected.returncode == 0, inspected.stderr
    assert len(inspected.stdout) < 200_000
    text = inspected.stdout.decode()
    assert "H" + "m" * 30 + "…" + "m" * 30 + "T!" in text
    assert "longer than 64 characters are shown shortened" in " ".join(text.split())


def test_a_path_with_a_line_break_and_an_escape_is_shown_escaped_in_the_html(tmp_path):
    # The page names its inputs as the other views do: a control character as its escape, not
    # the raw byte (an ESC, a line break, which the page would show as nothing or a space).
    folder = tmp_path / "c\x1b[31mred\nx"
    folder.mkdir()
    assert invoke("sample", folder / "dump.parquet", "--groups", "2", "-q").exit_code == 0
    page, notes = tmp_path / "r.html", tmp_path / "r.md"
    compared = invoke("compare", folder, "--html", page, "--markdown", notes, "-q")
    assert compared.exit_code == 0, compared.output
    shown = f"{tmp_path}/c\\x1b[31mred\\nx/dump.parquet"
    assert f"<p>Inputs: {shown}. advcli " in page.read_text()
    assert f"Inputs: `{shown}`. advcli " in notes.read_text()
