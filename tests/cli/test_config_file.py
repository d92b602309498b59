"""Saved options: advcli.toml, pyproject's [tool.advcli], --config.

Every test runs in tmp_path (the repository's own pyproject.toml must not be read), writes real
files and runs the real CLI. Expected advantages come from tests/reference.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import polars as pl
import pytest
import typer
from conftest import ROOT, partials
from reference import reference_advantages

from advcli.cli.app import app
from advcli.cli.saved_options import savable

if sys.version_info >= (3, 11):
    import tomllib
else:
    import tomli as tomllib


# verl's names, read with no flags: (group, trajectory, turn, score, tokens).
ROWS = [
    ("a", 0, 0, 1.0, 2),
    ("a", 0, 1, 1.0, 3),
    ("a", 1, 0, 0.0, 1),
    ("a", 2, 0, 0.5, 2),
    ("b", 0, 0, 0.25, 4),
    ("b", 1, 0, 1.0, 1),
    ("b", 1, 1, 1.0, 2),
]

# An odd layout: no trainer's names, scalar rewards, no mask.
ODD_ROWS = [
    ("p1", "t1", 0, 1.0, 0),
    ("p1", "t1", 1, 1.0, 0),
    ("p1", "t2", 0, 0.0, 0),
    ("p2", "t1", 1, 0.5, 0),
    ("p1", "t3", 0, 0.75, 0),
    ("p2", "t1", 0, 0.5, 0),
    ("p2", "t2", 0, 2.0, 0),
    ("p1", "t3", 1, 0.75, 0),
]
ODD_CONFIG = """\
group-col = "prompt_id"
traj-col = "traj_id"
turn-col = "turn"
reward-col = "reward"
estimator = "rloo"

[compute]
no-tokens = true
"""


@pytest.fixture
def dump(tmp_path, monkeypatch, write_dump) -> Path:
    monkeypatch.chdir(tmp_path)
    return write_dump(ROWS)


def advantages(path: Path) -> np.ndarray:
    return pl.read_parquet(path)["advantage"].to_numpy()


def expected(estimator: str, level: str = "trajectory", rows=ROWS) -> list[float]:
    return reference_advantages(rows, level=level, estimator=estimator)


def error_line(result) -> str:
    """The one ``Error:`` line of a run that failed on bad input, with nothing on stdout."""
    assert result.exit_code == 1, result.output
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
    return lines[0]


def usage_message(result) -> str:
    """What the command line says of a bad option value, after "Invalid value for '--x': "."""
    assert result.exit_code == 2, result.output
    line = next(line for line in result.stderr.splitlines() if "Invalid value for" in line)
    return line.split("': ", 1)[1]


def test_advcli_toml_applies_to_compute(run, dump, tmp_path):
    (tmp_path / "advcli.toml").write_text('estimator = "rloo"\nlevel = "turn"\n')
    result = run("compute", dump, "-o", "out.parquet")
    assert result.exit_code == 0, result.stderr
    np.testing.assert_allclose(advantages(tmp_path / "out.parquet"), expected("rloo", "turn"))
    assert "│ config " in result.stderr and "│ advcli.toml " in result.stderr


def test_advcli_toml_beats_pyproject(run, dump, tmp_path):
    (tmp_path / "advcli.toml").write_text('estimator = "rloo"\n')
    (tmp_path / "pyproject.toml").write_text('[tool.advcli]\nestimator = "drgrpo"\n')
    assert run("compute", dump, "-o", "out.parquet").exit_code == 0
    np.testing.assert_allclose(advantages(tmp_path / "out.parquet"), expected("rloo"))


def test_pyproject_tool_table_is_read(run, dump, tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n\n[tool.advcli]\nestimator = "drgrpo"\n'
        '\n[tool.advcli.compute]\nlevel = "turn"\n'
    )
    result = run("compute", dump, "-o", "out.parquet")
    assert result.exit_code == 0, result.stderr
    np.testing.assert_allclose(advantages(tmp_path / "out.parquet"), expected("drgrpo", "turn"))
    assert "│ pyproject.toml " in result.stderr


def test_pyproject_without_the_table_is_ignored(run, dump, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n\n[tool.ruff]\nfix = true\n')
    result = run("compute", dump, "-o", "out.parquet")
    assert result.exit_code == 0, result.stderr
    np.testing.assert_allclose(advantages(tmp_path / "out.parquet"), expected("grpo"))
    assert "config" not in result.stderr


def test_command_line_wins_over_the_file(run, dump, tmp_path):
    (tmp_path / "advcli.toml").write_text('estimator = "rloo"\ngroup-col = "no_such_column"\n')
    result = run(
        "compute", dump, "-o", "out.parquet", "--estimator", "opo", "--group-col", "data_id"
    )
    assert result.exit_code == 0, result.stderr
    np.testing.assert_allclose(advantages(tmp_path / "out.parquet"), expected("opo"))


@pytest.mark.parametrize(
    ("saved", "typed", "level"),
    [
        ('level = "trajectory"\n', ["--recipe", "verl-agent"], "turn"),
        ('estimator = "grpo"\nlevel = "trajectory"\n', ["--recipe", "roll"], "turn"),
        ('level = "turn"\n', ["--recipe", "verl-agent-trajectory"], "trajectory"),
        (
            'level = "trajectory"\n',
            ["--recipe", "verl-agent", "--level", "trajectory"],
            "trajectory",
        ),
        ('recipe = "verl-agent"\nlevel = "trajectory"\n', [], "trajectory"),
    ],
    ids=["saved level", "saved estimator", "saved level turn", "typed level wins", "both saved"],
)
def test_a_typed_recipe_wins_over_the_saved_settings_it_sets(
    run, dump, tmp_path, saved, typed, level
):
    """A recipe is a bundle of settings: typed, it wins over each one it sets that was saved,
    as a typed option wins over the same one saved; an option typed beside it wins over it,
    and one saved beside a saved recipe wins over it too (an option given beside it)."""
    frame = pl.read_parquet(dump).with_columns(
        anchor=pl.lit("s"), step_reward=pl.col("token_level_rewards").list.sum()
    )
    frame.write_parquet(dump)
    (tmp_path / "advcli.toml").write_text(saved)
    result = run("compute", dump, "-o", "out.parquet", *typed)
    assert result.exit_code == 0, result.stderr
    assert f"│ level │ {level} │" in " ".join(result.stderr.split())


def test_an_error_on_a_saved_option_says_it_was_saved(run, dump, tmp_path):
    (tmp_path / "advcli.toml").write_text('scale = "batch"\n')
    result = run("compute", dump, "-o", "out.parquet", "--estimator", "rloo")
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: Invalid value: --scale applies to grpo, grpo_passk, grpo_loo, not to rloo "
        "(--scale is 'scale' in advcli.toml)"
    )


def test_the_file_is_read_before_every_other_option(run, dump, tmp_path):
    """--config is eager, so the file is read before any other option takes its value: found
    with no --config, it reaches the options declared before --config (estimator, level) as
    well as after; given last, an option typed before it still wins."""
    Path("advcli.toml").write_text('estimator = "rloo"\nlevel = "turn"\n')
    assert run("compute", dump, "-o", "found.parquet").exit_code == 0
    np.testing.assert_allclose(advantages(tmp_path / "found.parquet"), expected("rloo", "turn"))
    result = run(
        "compute", dump, "--level", "trajectory", "-o", "out.parquet", "--config", "advcli.toml"
    )
    assert result.exit_code == 0, result.stderr
    np.testing.assert_allclose(advantages(tmp_path / "out.parquet"), expected("rloo"))


def test_command_tables_override_the_flat_keys(run, dump, tmp_path):
    (tmp_path / "advcli.toml").write_text(
        'estimator = "rloo"\nlevel = "turn"\ntop = 2\n\n[compute]\nestimator = "drgrpo"\n'
        "\n[compare]\ntop = 1\n"
    )
    # level and top are flat keys that only some commands have: the others go without them.
    assert run("compute", dump, "-o", "out.parquet").exit_code == 0
    np.testing.assert_allclose(advantages(tmp_path / "out.parquet"), expected("drgrpo", "turn"))
    result = run("compare", dump, "--json", "report.json", "-q")
    assert result.exit_code == 0, result.stderr
    report = json.loads(Path("report.json").read_text())
    assert report["settings"]["estimator"] == "rloo"
    assert len(report["top_groups"]) == 1
    assert run("inspect", dump, "--json").exit_code == 0


def test_explicit_config_path(run, dump, tmp_path):
    (tmp_path / "advcli.toml").write_text('estimator = "drgrpo"\n')
    (tmp_path / "team").mkdir()
    (tmp_path / "team" / "rloo.toml").write_text('estimator = "rloo"\n')
    (tmp_path / "team" / "pyproject.toml").write_text('[tool.advcli]\nestimator = "opo"\n')
    result = run("compute", dump, "-o", "a.parquet", "--config", "team/rloo.toml")
    assert result.exit_code == 0, result.stderr
    np.testing.assert_allclose(advantages(tmp_path / "a.parquet"), expected("rloo"))
    assert "│ team/rloo.toml " in result.stderr
    assert run("compute", dump, "-o", "b.parquet", "--config", "team/pyproject.toml").exit_code == 0
    np.testing.assert_allclose(advantages(tmp_path / "b.parquet"), expected("opo"))


def test_inspect_names_the_config_file(run, dump, tmp_path):
    plain = run("inspect", dump, "--json")
    assert plain.exit_code == 0 and "config" not in json.loads(plain.stdout)
    (tmp_path / "advcli.toml").write_text("threads = 1\n")
    saved = run("inspect", dump, "--json")
    assert saved.exit_code == 0, saved.stderr
    report = json.loads(saved.stdout)
    assert list(report)[-1] == "config" and report.pop("config") == "advcli.toml"
    assert report == json.loads(plain.stdout)
    explicit = run("inspect", dump, "--json", "--config", tmp_path / "advcli.toml")
    assert json.loads(explicit.stdout)["config"] == str(tmp_path / "advcli.toml")
    terminal = run("inspect", dump)
    assert terminal.exit_code == 0 and terminal.stdout.rstrip().endswith("config: advcli.toml")


def test_inspect_says_which_roles_the_file_named(run, dump, tmp_path):
    """A role named in the file is explained by its key and file, one named on the command
    line by its option."""
    (tmp_path / "advcli.toml").write_text('group-col = "data_id"\n')
    report = json.loads(run("inspect", dump, "--json", "--traj-col", "rollout_id").stdout)
    assert report["columns"]["group"]["why"] == "named by 'group-col' in advcli.toml"
    assert report["columns"]["trajectory"]["why"] == "named by --traj-col"


def test_a_typed_group_option_wins_over_the_saved_other_one(run, dump, tmp_path):
    """--group-col and --group-size exclude each other; the one on the command line replaces
    the saved one instead of clashing with it."""
    (tmp_path / "advcli.toml").write_text("group-size = 4\n")
    typed = json.loads(run("inspect", dump, "--json", "--group-col", "data_id").stdout)
    assert typed["columns"]["group"] == {"column": "data_id", "why": "named by --group-col"}
    (tmp_path / "advcli.toml").write_text('group-col = "data_id"\n')
    # The blocks are read (and here contradicted by data_id), not refused as a clash.
    result = run("inspect", dump, "--group-size", "3")
    assert "exclude each other" not in result.stderr
    assert "values change within blocks of --group-size 3 rows" in result.stderr


def test_compare_names_the_config_file(run, dump, tmp_path):
    assert "config:" not in run("compare", dump).stdout
    (tmp_path / "advcli.toml").write_text("top = 2\n")
    result = run("compare", dump)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.rstrip().endswith("config: advcli.toml")


def test_odd_layout_runs_with_no_flags_from_advcli_toml(run, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    pl.DataFrame(
        {
            "prompt_id": [row[0] for row in ODD_ROWS],
            "traj_id": [row[1] for row in ODD_ROWS],
            "turn": [row[2] for row in ODD_ROWS],
            "reward": [row[3] for row in ODD_ROWS],
        }
    ).write_parquet("dump.parquet")
    assert run("compute", "dump.parquet", "-o", "out.parquet").exit_code == 1
    assert not Path("out.parquet").exists()

    Path("advcli.toml").write_text(ODD_CONFIG)
    result = run("compute", "dump.parquet", "-o", "out.parquet")
    assert result.exit_code == 0, result.stderr
    np.testing.assert_allclose(
        advantages(tmp_path / "out.parquet"), expected("rloo", rows=ODD_ROWS), rtol=0, atol=1e-12
    )
    inspected = run("inspect", "dump.parquet", "--json")
    assert inspected.exit_code == 0, inspected.stderr
    columns = json.loads(inspected.stdout)["columns"]
    assert [columns[role]["column"] for role in ("group", "trajectory", "turn", "reward")] == [
        "prompt_id",
        "traj_id",
        "turn",
        "reward",
    ]
    compared = run("compare", "dump.parquet", "--json", "report.json", "-q")
    assert compared.exit_code == 0, compared.stderr
    assert json.loads(Path("report.json").read_text())["counts"]["trajectories"] == 5


BAD_FILES = [
    (
        'group-colum = "prompt_id"\n',
        "key 'group-colum': not an option of compute, compare, watch, inspect or audit; "
        "did you mean 'group-col'?",
    ),
    (
        'palette = "red"\n',
        "key 'palette': not an option of compute, compare, watch, inspect or audit",
    ),
    (
        "[compar]\ntop = 3\n",
        "key 'compar': not an option of compute, compare, watch, inspect or audit; "
        "did you mean 'compare'?",
    ),
    ('output = "out.parquet"\n', "key 'output': --output is given on the command line only"),
    ("force = true\n", "key 'force': --force is given on the command line only"),
    ("config = 'other.toml'\n", "key 'config': --config is given on the command line only"),
    # sample's options are no key of the file, not keys given on the command line only.
    (
        "tokens = false\n",
        "key 'tokens': not an option of compute, compare, watch, inspect or audit; "
        "did you mean 'no-tokens'?",
    ),
    (
        '[compare]\nlevel = "turn"\n',
        "key 'compare.level': compare has no option --level (compute has)",
    ),
    (
        '[compute]\nestimater = "rloo"\n',
        "key 'compute.estimater': compute has no option --estimater; "
        "did you mean 'compute.estimator'?",
    ),
    ("compare = 3\n", "key 'compare': must be a table of compare's options, not an integer (3)"),
    ("[watch]\ntop = 3\n", "key 'watch.top': watch has no option --top (compare has)"),
    ("group-size = 2.5\n", "key 'group-size': must be an integer, not a float (2.5)"),
    ("group-size = true\n", "key 'group-size': must be an integer, not a boolean (True)"),
    ("group-col = 3\n", "key 'group-col': must be a string, not an integer (3)"),
    ('group-col = ["a", "b"]\n', "key 'group-col': must be a string, not an array"),
    ("group-col = { name = 'a' }\n", "key 'group-col': must be a string, not a table"),
    (
        "turn-col = 1979-05-27\n",
        "key 'turn-col': must be a string, not a date or time (1979-05-27)",
    ),
    ('epsilon = "0.1"\n', "key 'epsilon': must be a number, not a string ('0.1')"),
    ("epsilon = nan\n", "key 'epsilon': must be a finite number, not nan"),
    ("[compare]\nfail-above = inf\n", "key 'compare.fail-above': must be a finite number, not inf"),
    (
        '[compute]\nno-tokens = "yes"\n',
        "key 'compute.no-tokens': must be a boolean, not a string ('yes')",
    ),
]


@pytest.mark.parametrize(
    ("text", "message"), BAD_FILES, ids=[message.split(":")[0] for _, message in BAD_FILES]
)
def test_bad_keys_and_values(run, dump, tmp_path, text, message):
    Path("advcli.toml").write_text(text)
    result = run("compute", dump, "-o", "out.parquet")
    assert error_line(result) == f"Error: advcli.toml: {message}"
    assert not (tmp_path / "out.parquet").exists() and not partials(tmp_path / "out.parquet")


@pytest.mark.parametrize(
    ("key", "value", "table"),
    [
        ("estimator", '"ppo"', None),
        ("group-size", "0", None),
        ("epsilon", "-1.0", None),
        ("threads", "2000", None),
        ("traj-score", '"median"', None),
        ("top", "0", "compare"),
    ],
)
def test_values_are_checked_as_the_command_line_checks_them(run, dump, tmp_path, key, value, table):
    """A value out of range or not among the choices gets the command line's own message, with
    the file and key, and exit 1; a bad value in another command's table fails this one too."""
    option = (f"--{key}", value.strip('"'))
    if table is None:
        typed = run("compute", dump, "-o", "x.parquet", *option)
        Path("advcli.toml").write_text(f"{key} = {value}\n")
    else:
        typed = run(table, dump, "-q", *option)
        Path("advcli.toml").write_text(f"[{table}]\n{key} = {value}\n")
    where = key if table is None else f"{table}.{key}"
    line = error_line(run("compute", dump, "-o", "out.parquet"))
    assert line == f"Error: advcli.toml: key '{where}': {usage_message(typed)}"
    assert not (tmp_path / "out.parquet").exists()


@pytest.mark.parametrize(
    ("files", "args", "message"),
    [
        (
            {"advcli.toml": 'estimator = "rloo"\ngroup-col = \n'},
            (),
            "advcli.toml: invalid TOML: Invalid value (at line 2, column 13)",
        ),
        ({"advcli.toml": b'group-col = "\xff"\n'}, (), "advcli.toml: not UTF-8 text"),
        ({}, ("--config", "missing.toml"), "missing.toml: no such config file"),
        (
            {"pyproject.toml": "[tool.ruff]\nfix = true\n"},
            ("--config", "pyproject.toml"),
            "pyproject.toml: no [tool.advcli] table",
        ),
        (
            {"pyproject.toml": "[tool]\nadvcli = 3\n"},
            (),
            "pyproject.toml: key 'tool.advcli': must be a table, not an integer (3)",
        ),
        (
            {"pyproject.toml": "[tool.advcli]\ngroup-size = 0.5\n"},
            (),
            "pyproject.toml: key 'group-size': must be an integer, not a float (0.5)",
        ),
        (
            # A broken pyproject.toml may hold a [tool.advcli] table: not read as absent.
            {"pyproject.toml": "[project\n"},
            (),
            "pyproject.toml: invalid TOML: Expected ']' at the end of a table declaration "
            "(at line 1, column 9)",
        ),
    ],
    ids=[
        "syntax",
        "not-utf8",
        "missing",
        "no-table",
        "tool-advcli-not-table",
        "pyproject-value",
        "broken-pyproject",
    ],
)
def test_bad_files(run, dump, tmp_path, files, args, message):
    for name, content in files.items():
        path = tmp_path / name
        path.write_bytes(content) if isinstance(content, bytes) else path.write_text(content)
    line = error_line(run("compute", dump, "-o", "out.parquet", *args))
    assert line == f"Error: {message}"
    assert not (tmp_path / "out.parquet").exists()


def test_a_folder_named_advcli_toml_is_an_error(run, dump, tmp_path):
    (tmp_path / "advcli.toml").mkdir()
    line = error_line(run("inspect", dump))
    assert line == "Error: advcli.toml: cannot read the config file: Is a directory"


@pytest.mark.process
def test_bad_file_in_a_real_process_is_one_line(dump, tmp_path):
    Path("advcli.toml").write_text("threads = 0\n")
    result = subprocess.run(
        [sys.executable, "-m", "advcli", "compute", str(dump), "-o", "out.parquet"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.startswith("Error: advcli.toml: key 'threads': ")
    assert result.stderr.count("\n") == 1
    assert not (tmp_path / "out.parquet").exists()


def test_help_works_with_a_broken_file(run, dump):
    Path("advcli.toml").write_text("colour = 1\n")
    result = run("compute", "--help")
    assert result.exit_code == 0 and "--config" in result.stdout


def test_saved_keys_of_each_command():
    """Outputs, --force, --quiet and --config are never saved; everything else is, and the help
    of --config lists every saved key."""
    commands = typer.main.get_command(app).commands
    shared = {
        "group-col",
        "group-size",
        "traj-col",
        "turn-col",
        "reward-col",
        "mask-col",
        "threads",
    }
    math = {"estimator", "epsilon", "traj-score", "scale", "singleton", "engine", "address"}
    math |= {"recipe", "gigpo-norm", "reward-mode", "step-groups", "std"}
    gigpo = {"gamma", "step-weight", "anchor-scope", "anchor-col", "step-reward-col"}
    gigpo |= {"step-return-col"}
    saved = {
        name: set(savable(commands[name])) for name in ("compute", "compare", "inspect", "audit")
    }
    assert saved == {
        "compute": shared
        | math
        | gigpo
        | {"level", "loss-weight", "loss-scale-factor", "no-tokens", "columns", "by"}
        | {"drop-duplicates"},
        "compare": shared
        | math
        | gigpo
        | {"top", "by", "jobs", "fail-above", "fail-on", "drop-duplicates"},
        "inspect": shared | {"anchor-col", "anchor-scope", "by"},
        "audit": shared | {"anchor-col", "advantage-col", "fail-on", "expect", "by"},
    }
    config_help = next(p.help for p in commands["compute"].params if p.name == "config_path")
    listed = config_help.split("dashes: ", 1)[1].split(";", 1)[0].split(", ")
    assert set(listed) == set.union(*saved.values())


def test_the_repository_pyproject_has_no_advcli_table():
    """advcli run from the repository's root must not pick up settings of its own."""
    assert "advcli" not in tomllib.loads((ROOT / "pyproject.toml").read_text()).get("tool", {})


@pytest.mark.parametrize(
    ("make", "said"),
    [
        (
            lambda path: os.mkfifo(path),
            "advcli.toml: not a regular file; a config file is a TOML file",
        ),
        (
            lambda path: path.symlink_to("/dev/zero"),
            "advcli.toml: not a regular file; a config file is a TOML file",
        ),
        (
            lambda path: path.symlink_to(path.parent / "gone.toml"),
            "advcli.toml: no such config file (a link whose target is gone)",
        ),
        (
            lambda path: path.write_bytes(b"# " + b"x" * (1 << 20) + b"\n"),
            "advcli.toml: 1,048,579 bytes, too large for a config file (at most 1,048,576)",
        ),
    ],
    ids=["named pipe", "device", "dangling link", "too large"],
)
def test_a_config_file_that_is_no_file_is_an_error_at_once(run, dump, tmp_path, make, said):
    """Nothing waits on it (a pipe with no writer) or reads it for ever (a device), and a link
    to nothing is not taken for no config."""
    make(tmp_path / "advcli.toml")
    assert error_line(run("compare", dump, "-q")) == f"Error: {said}"


def test_a_byte_order_mark_is_read_past(run, dump, tmp_path):
    (tmp_path / "advcli.toml").write_bytes('\ufeffestimator = "rloo"\n'.encode())
    result = run("compute", dump, "-o", "out.parquet")
    assert result.exit_code == 0, result.stderr
    np.testing.assert_allclose(advantages(tmp_path / "out.parquet"), expected("rloo"))
