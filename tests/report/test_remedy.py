"""The remedy table and the verdict's words: each trainer's dump (real Parquet in that trainer's
dialect, through the CLI) gets that trainer's change first and advcli's after it, and nothing
else; a dump whose trainer is unknown gets every trainer's; no remedy names a config key its
cited source does not hold; the verdict's sentence says which level gives what.

The facts each remedy states are read from the trainers' released code, cited in
docs/reference/trainer-sources.md ("Remedies"). Expected advantages are hand-computed here or
come from tests/reference.py, never from advcli.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import polars as pl
import pytest
from conftest import ROOT
from reference import reference_advantages
from typer.testing import CliRunner

from advcli.cli.app import app
from advcli.dump import write_batch
from advcli.read.dialects import DIALECTS
from advcli.report.verdict import GIGPO_REMEDIES, REMEDIES, remedies_for

SAMPLE = ROOT / "sample_data" / "rollouts.parquet"
SOURCES = ROOT / "docs" / "reference" / "trainer-sources.md"

# Two groups, each a 1-turn success and a 4-turn failure (README's example), 2 tokens a row.
TRAJECTORIES = [("g0", "a", 1.0, 1), ("g0", "b", 0.0, 4), ("g1", "c", 1.0, 1), ("g1", "d", 0.0, 4)]
TOKENS = 2


def _rows() -> list[tuple[str, str, int, float]]:
    return [
        (group, traj, turn, score)
        for group, traj, score, turns in TRAJECTORIES
        for turn in range(turns)
    ]


def _rewards(scores: list[float]) -> pl.Series:
    return pl.Series([[0.0] * (TOKENS - 1) + [score] for score in scores])


def _mask(length: int) -> pl.Series:
    return pl.Series([[1] * TOKENS] * length, dtype=pl.List(pl.Int8))


def dialect_dump(trainer: str, path: Path) -> Path:
    """The example trajectories with the column names and types of ``trainer``'s batch
    (docs/reference/trainer-sources.md): ids as strings, rewards on each row's last token."""
    rows = _rows()
    group = [f"{r[0]}-uuid" for r in rows]
    trajectory = [f"{r[0]}-{r[1]}" for r in rows]
    turn = [r[2] for r in rows]
    scores = [r[3] for r in rows]
    last = [i + 1 == len(rows) or rows[i + 1][1] != r[1] for i, r in enumerate(rows)]
    columns: dict[str, pl.Series | list] = {
        "verl-agent": {"uid": group, "traj_uid": trajectory, "token_level_rewards": None},
        "agent-lightning": {
            "data_id_list": group,
            "rollout_id_list": trajectory,
            "turn_index_list": turn,
            "token_level_scores": None,
        },
        "verl (v1 multi-trajectory)": {
            "uid": group,
            "session_id": [ord(r[1]) for r in rows],
            "token_level_rewards": None,
        },
        "verl": {"uid": group, "trajectory_id": trajectory, "token_level_rewards": None},
        "SkyRL": {
            "uids": group,
            "trajectory_ids": trajectory,
            "is_last_step": last,
            "rewards": None,
        },
        "SkyRL 0.4.0": {"uids": group, "is_last_step": last, "rewards": None},
        "rLLM": {"trajectory_ids": group, "episode_ids": trajectory, "traj_rewards": None},
        "rLLM (AgentPPOTrainer)": {
            "uid": group,
            "idxs": [ord(r[1]) for r in rows],
            "token_level_scores": None,
        },
        "ROLL": {
            "traj_group_id": group,
            "traj_id": trajectory,
            "step": turn,
            "episode_scores": scores,
        },
        "hand-named": {"prompt_id": group, "traj_id": trajectory, "turn": turn, "reward": scores},
    }[trainer]
    frame = pl.DataFrame(
        {name: _rewards(scores) if value is None else value for name, value in columns.items()}
    )
    if trainer != "hand-named":
        mask = "loss_mask" if trainer.startswith("SkyRL") else "response_mask"
        frame = frame.with_columns(_mask(len(rows)).alias(mask))
    frame.write_parquet(path)
    return path


def compare_json(run, path: Path) -> dict:
    result = run("compare", path, "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


# Each dialect's trainer as its advice names it, and words its change must hold.
OWN_ADVICE = {
    "verl-agent": (
        "verl-agent",
        ["advcli.verl.compute_advantage(batch, ...)", "RayPPOTrainer.fit", "-1e5", "1 + epsilon"],
    ),
    "agent-lightning": (
        "agent-lightning",
        [
            # Its shipped config sets both: the advice is not to turn on what is on.
            "nothing to change with agent-lightning's own config",
            "algorithm.enable_rollout_level_advantage=true",
            "actor_rollout_ref.actor.policy_loss.loss_mode=per_rollout_mean",
            "config of your own that leaves the first key out",
        ],
    ),
    "verl (v1 multi-trajectory)": (
        "verl (v1 multi-trajectory)",
        [
            "compute_advantage_for_multi_trajectories",
            'data.non_tensor_batch["session_id"]',
            "advcli.verl.compute_advantage(data, adv_estimator=",
        ],
    ),
    "verl": (
        "verl",
        ["trainer.use_v1=true", "TrainerBase._compute_advantage", "RayPPOTrainer.fit"],
    ),
    "SkyRL": ("SkyRL", ["nothing to change", "generator.step_wise_trajectories=true"]),
    "SkyRL 0.4.0": ("SkyRL", ["nothing to change", "is_last_step"]),
    "rLLM": ("rLLM", ['group_key="trajectory_ids"', 'trajectory_key="episode_ids"']),
    "rLLM (AgentPPOTrainer)": (
        "rLLM (AgentPPOTrainer)",
        ["rllm.stepwise_advantage.mode=broadcast"],
    ),
    "ROLL": (
        "ROLL",
        ["reward_normalization.grouping", "advcli.torch.compute_advantage", "traj_index=traj_id"],
    ),
}


@pytest.mark.parametrize("trainer", list(OWN_ADVICE))
def test_a_trainers_dump_gets_its_own_change_first_and_only_what_applies(run, tmp_path, trainer):
    report = compare_json(run, dialect_dump(trainer, tmp_path / "dump.parquet"))
    assert report["settings"]["reading"]["trainer"] == trainer
    assert report["assessment"]["level"] == "severe"
    remedy = report["assessment"]["remedy"]
    assert remedy["trainer"] == trainer
    label, words = OWN_ADVICE[trainer]
    assert [entry["trainer"] for entry in remedy["advice"]] == [label, "advcli"]
    own = remedy["advice"][0]
    for word in words:
        assert word in own["change"], word
    assert own["source"]
    assert "compute_mean_std_cross_steps=" not in json.dumps(report)
    # The verdict names the trainer's own change, then advcli's, and no other trainer's.
    others = {r.trainer for r in REMEDIES.values()} - {label, "advcli"}
    brief = report["verdict"].rsplit("count each trajectory once", 1)[1]
    assert brief.startswith(f" ({label}")
    # advcli's part is its command alone: how the training step changes is the trainer's.
    assert brief.endswith("; or advcli compute --level trajectory).")
    assert not [other for other in others if f"{other}:" in brief]


def test_the_markdown_and_html_say_what_to_change_for_the_dumps_trainer(run, tmp_path):
    dump = dialect_dump("agent-lightning", tmp_path / "dump.parquet")
    markdown, page = tmp_path / "r.md", tmp_path / "r.html"
    result = run("compare", dump, "--markdown", markdown, "--html", page, "-q")
    assert result.exit_code == 0, result.stderr
    section = markdown.read_text().split("## What to change\n\n", 1)[1].split("\n\n", 1)[0]
    lines = section.splitlines()[2:]
    assert [line.split(" | ", 1)[0] for line in lines] == ["| agent-lightning", "| advcli"]
    assert "algorithm.enable_rollout_level_advantage=true" in section
    html = page.read_text()
    table = html.split("<h2>What to change</h2>", 1)[1].split("</table>", 1)[0]
    assert re.findall(r"<tr><td>([^<]*)</td>", table) == ["agent-lightning", "advcli"]


def test_the_terminal_says_what_to_change(run, tmp_path):
    result = run("compare", dialect_dump("verl-agent", tmp_path / "dump.parquet"))
    assert result.exit_code == 0, result.stderr
    text = result.stdout
    table = text.split("What to change", 1)[1].split("Verdict", 1)[0]
    assert "verl-agent" in table and "advcli" in table and "agent-lightning" not in table
    said = " ".join(table.split())
    assert "in RayPPOTrainer.fit for GRPO with advcli.verl.compute_advantage(batch, ...)" in said


@pytest.mark.parametrize("trainer", ["agent-lightning", "verl-agent", "ROLL"])
def test_the_terminal_keeps_every_config_key_of_a_change_on_one_line(run, tmp_path, trainer):
    # An 80-column terminal: a table column would fold a long key (
    # actor_rollout_ref.actor.policy_loss.loss_mode=per_rollout_mean) over two lines.
    dump = dialect_dump(trainer, tmp_path / "dump.parquet")
    result = CliRunner(env={"COLUMNS": "80"}).invoke(app, ["compare", str(dump)])
    assert result.exit_code == 0, result.output
    section = result.stdout.split("What to change", 1)[1].split("Verdict", 1)[0]
    lines = section.splitlines()
    for entry in compare_json(run, dump)["assessment"]["remedy"]["advice"]:
        assert any(line.startswith(f"{entry['trainer']}: ") for line in lines)
        for word in entry["change"].split():
            assert any(word in line for line in lines), word


@pytest.mark.parametrize("trainer", ["verl-agent", "agent-lightning", "ROLL"])
def test_a_batch_advcli_wrote_gets_its_trainers_change(run, tmp_path, trainer):
    # write_batch writes the batch in advcli's layout; its metadata names the trainer whose
    # batch it was, and the report's advice is that trainer's.
    batch = pl.read_parquet(dialect_dump(trainer, tmp_path / "dump.parquet")).to_dict()
    write_batch({name: column.to_list() for name, column in batch.items()}, tmp_path / "steps")
    report = compare_json(run, tmp_path / "steps")
    reading = report["settings"]["reading"]
    assert reading["trainer"] == trainer
    assert reading["read_as"] == (
        f"advcli's layout, written by advcli.dump.write_batch from {trainer}'s batch"
    )
    advice = report["assessment"]["remedy"]["advice"]
    assert [entry["trainer"] for entry in advice] == [trainer, "advcli"]
    assert f"count each trajectory once ({trainer}: " in report["verdict"]


@pytest.mark.parametrize("dump", ["advcli", "hand-named"])
def test_a_dump_whose_trainer_is_unknown_gets_every_trainers_change(run, tmp_path, dump):
    # advcli's own schema is what write_batch writes from any trainer's batch.
    path = SAMPLE if dump == "advcli" else dialect_dump(dump, tmp_path / "dump.parquet")
    report = compare_json(run, path)
    remedy = report["assessment"]["remedy"]
    assert remedy["trainer"] == (None if dump == "hand-named" else "advcli")
    names = [entry["trainer"] for entry in remedy["advice"]]
    assert names[0] == "advcli"
    assert set(names) == {r.trainer for r in REMEDIES.values()}
    assert len(names) == len(set(names))
    assert "What to change lists each trainer's" in report["verdict"]


def test_every_dialect_has_a_remedy():
    assert {dialect.trainer for dialect in DIALECTS} == set(REMEDIES)
    for dialect in DIALECTS:
        assert remedies_for(dialect.trainer)[0] is REMEDIES[dialect.trainer]


# A config key as a remedy states one: dotted lower-case names, not a file (x.py, x.yaml), not
# advcli's own module path, not an attribute of a name (Class.method), not Python code (a call,
# a subscript: x.y(…), x.y[…], [… x.y]).
CONFIG_KEY = re.compile(r"(?<![\w./])[a-z_]+(?:\.[a-z_]+)+(?![\w(\[\]])")


def test_no_remedy_names_a_config_key_its_source_does_not_cite():
    cited = SOURCES.read_text()
    for remedy in {*REMEDIES.values(), *GIGPO_REMEDIES.values()}:
        named = {
            key
            for text in (remedy.change, remedy.brief)
            for key in CONFIG_KEY.findall(text)
            if not key.startswith("advcli.") and not key.endswith((".py", ".yaml"))
        }
        assert named <= set(remedy.config_keys), (remedy.trainer, named)
        for key in remedy.config_keys:
            assert key in remedy.source, (remedy.trainer, key)
            assert f"`{key}`" in cited, (remedy.trainer, key)
        # verl-agent's keyword is a function's default, never a config key.
        for text in (remedy.change, remedy.brief, remedy.source, *remedy.config_keys):
            assert "algorithm.compute_mean_std_cross_steps" not in text
            assert "compute_mean_std_cross_steps=" not in text


def test_the_docs_never_give_the_keyword_as_a_config_key():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = page.read_text()
        assert "algorithm.compute_mean_std_cross_steps" not in text, page
        assert "compute_mean_std_cross_steps=False" not in text, page


def _verdict_sentence(verdict: str) -> str:
    return next(s for s in verdict.split(". ") if s.startswith("Counting every turn"))


@pytest.mark.parametrize(
    ("long_scores", "words"),
    [
        # Turn level: success (1 - 0.2) / 0.447 = +1.789, each failing turn -0.2 / 0.447 = -0.447;
        # trajectory level ±0.707. diff (trajectory - turn): long -0.260, short -1.082.
        (
            (1.0, 0.0),
            "0.260 more advantage on average than counting each trajectory once, "
            "and shorter ones 1.082 more",
        ),
        # The long trajectory succeeds: turn level -1.789 and +0.447, so the signs turn.
        (
            (0.0, 1.0),
            "0.260 less advantage on average than counting each trajectory once, "
            "and shorter ones 1.082 less",
        ),
    ],
)
def test_the_verdict_says_which_level_gives_what(run, write_dump, long_scores, words):
    short, long = long_scores
    rows = [("g", "short", 0, short, 1)] + [("g", "long", t, long, 1) for t in range(4)]
    report = compare_json(run, write_dump(rows))
    assert _verdict_sentence(report["verdict"]) == (
        f"Counting every turn gives trajectories with ≥ 3 turns {words}"
    )


def test_the_verdict_on_the_sample_is_the_hand_computed_one(run):
    frame = pl.read_parquet(SAMPLE)
    rows = [
        (g, t, turn, sum(rewards), sum(mask))
        for g, t, turn, rewards, mask in frame.select(
            "data_id", "rollout_id", "turn_index", "token_level_rewards", "response_mask"
        ).iter_rows()
    ]
    turn = reference_advantages(rows, level="turn", estimator="grpo")
    trajectory = reference_advantages(rows, level="trajectory", estimator="grpo")
    per: dict[tuple, list[int]] = {}
    for position, row in enumerate(rows):
        per.setdefault((row[0], row[1]), []).append(position)
    # A trajectory's turn-level advantage is the mean of its rows'; diff = trajectory - turn.
    diffs = {
        key: (
            len(positions),
            trajectory[positions[0]] - sum(turn[p] for p in positions) / len(positions),
        )
        for key, positions in per.items()
    }
    long = [d for n, d in diffs.values() if n >= 3]
    short = [d for n, d in diffs.values() if n < 3]
    long_mean, short_mean = sum(long) / len(long), sum(short) / len(short)
    assert long_mean < 0 and short_mean < 0  # counting every turn gives both more
    sentence = _verdict_sentence(compare_json(run, SAMPLE)["verdict"])
    assert sentence == (
        f"Counting every turn gives trajectories with ≥ 3 turns {-long_mean:.3f} more advantage "
        f"on average than counting each trajectory once, and shorter ones {-short_mean:.3f} more"
    )


def test_under_gigpo_the_change_keeps_the_step_term(run, tmp_path):
    """A verl-agent dump compared under gigpo gets verl-agent's gigpo line, then advcli's, both
    naming gigpo's recipe (GRPO's lines would drop the step term)."""
    frame = pl.DataFrame(
        {
            "uid": ["a", "a", "a", "b", "b"],
            "traj_uid": ["a1", "a1", "a2", "b1", "b2"],
            "token_level_rewards": [[0.0, 1.0], [0.0, 1.0], [0.0, 0.0], [0.0, 1.0], [0.0, 0.0]],
            "response_mask": [[1, 1]] * 5,
            "anchor_obs": ["s0", "s1", "s0", "t0", "t0"],
            "rewards": [0.0, 1.0, 0.0, 1.0, 0.0],
        }
    )
    source = tmp_path / "va.parquet"
    frame.write_parquet(source)
    result = run("compare", source, "--estimator", "gigpo", "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    advice = json.loads(result.stdout)["assessment"]["remedy"]["advice"]
    assert [entry["trainer"] for entry in advice] == ["verl-agent", "advcli"]
    assert all('adv_estimator="gigpo"' in entry["change"] for entry in advice)


def test_rolls_gigpo_route_is_the_command_lines_roll_recipe_at_trajectory_level(run, tmp_path):
    """The ROLL gigpo line's advcli.torch call gives advcli compute --recipe roll --level
    trajectory's numbers on the same rows."""
    torch = pytest.importorskip("torch")
    from advcli.torch import compute_advantage

    frame = pl.DataFrame(
        {
            "traj_group_id": ["a", "a", "a", "a", "b", "b", "b"],
            "traj_id": ["a1", "a1", "a2", "a3", "b1", "b2", "b2"],
            "step": [0, 1, 0, 0, 0, 0, 1],
            "episode_scores": [1.0, 1.0, 0.0, 1.0, 0.0, 1.0, 1.0],
            "step_scores": [0.0, 1.0, 0.0, 1.0, 0.0, 0.0, 1.0],
            "state_hash": ["h0", "h1", "h0", "h0", "h0", "h0", "h2"],
        }
    )
    source, output = tmp_path / "roll.parquet", tmp_path / "out.parquet"
    frame.write_parquet(source)
    options = ("--recipe", "roll", "--level", "trajectory", "--no-tokens", "-q")
    result = run("compute", source, "-o", output, *options)
    assert result.exit_code == 0, result.stderr
    expected = pl.read_parquet(output)["advantage"].to_list()
    scores = torch.tensor(frame["episode_scores"].to_list())[:, None]
    got, _ = compute_advantage(
        scores, torch.ones_like(scores),
        index=frame["traj_group_id"].to_numpy(), traj_index=frame["traj_id"].to_numpy(),
        turn_index=frame["step"].to_numpy(), estimator="gigpo", recipe="roll",
        level="trajectory", anchor_index=frame["state_hash"].to_numpy(),
        step_rewards=torch.tensor(frame["step_scores"].to_list()),
    )  # fmt: skip
    assert got[:, 0].tolist() == pytest.approx(expected, abs=1e-6)
