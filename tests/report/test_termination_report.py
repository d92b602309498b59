"""The termination report (``compare --reward-mode per-turn``, docs/compare.md "Per-turn
rewards"): a hand-computed dump, every grouping against the plain-Python reference on a random
dump, the simulated rollouts of docs/per-turn-rewards.md, the documents and the errors.

Hand case (rloo, gamma 1; ``b`` a leave-one-out baseline, ``d`` the grouping's less turn-padded's):
group g1: a = [1], b = [0, 2], c = [1, 0, 1]; returns a0 1, b0 2, b1 2, c0 2, c1 1, c2 1.
group g2: d = [2], e = [1, 1], f = [0, 1, 1]; returns d0 2, e0 2, e1 1, f0 2, f1 2, f2 1.

turn-padded b: g1 a0 (2+2)/2 = 2, b0 1.5, c0 1.5, b1 (0+1)/2 = 0.5, c1 (0+2)/2 = 1, c2 0;
  g2 t0 2 each (A exactly 0: all equal), e1 (0+2)/2 = 1, f1 (0+1)/2 = 0.5, f2 0.
  A = G − b: g1 −1, 0.5, 0.5, 1.5, 0, 1; g2 0, 0, 0, 0, 1.5, 1 (Σ|A| = 7).
turn: t1 b1 1 (c's G), c1 2, e1 2, f1 1; t2 alone (raw): 0. d at t1: 0.5, 1 | 1, 0.5.
pooled (the group's other five rows): G = 1 -> 8/5, G = 2 -> 7/5 in g1; in g2 G = 2 -> 8/5,
  G = 1 -> 9/5. d: g1 t0 −0.4, −0.1, −0.1; t1 0.9, 0.6; t2 1.6. g2 t0 −0.4 ×3; t1 0.8, 1.1; t2 1.8.
turn-rewards: z at k = r less the others' mean at k (alone: z = r); A = Σ_{k≥t} z:
  g1 z a0 0.5, b0 −1, c0 0.5, b1 2, c1 −2, c2 1 -> A 0.5, 1, 2, −0.5, −1, 1 (a0 b0 b1 c0 c1 c2);
  b = G − A: 0.5, 1, 0, 2.5, 2, 0. d: t0 −1.5, −0.5, 1; t1 −0.5, 1; t2 0.
  g2 z d0 1.5, e0 0, f0 −1.5, e1 0, f1 0, f2 1 -> A 1.5, 0, 0, −0.5, 1, 1 (d0 e0 e1 f0 f1 f2);
  b: 0.5, 2, 1, 2.5, 1, 0. d: t0 −1.5, 0, 0.5; t1 0, 0.5; t2 0.
trajectory (G_0 a 1, b 2, c 2: A −1, 0.5, 0.5; g2 all 2: A 0): b = G_t − A: g1 2, 1.5, 1.5,
  1.5, 0.5, 0.5; g2 = G_t. d: g1 t1 1, −0.5; t2 0.5; g2 t1 0, 1.5; t2 1.

baseline_minus_padded (mean over the two groups of each group's mean d at the turn):
  turn 0, 0.75, 0; pooled (−0.2 − 0.4)/2 = −0.3, (0.75 + 0.95)/2 = 0.85, 1.7;
  turn-rewards −1/3, 0.25, 0; trajectory 0, 0.5, 0.75.
implied bonus (continue − stop of −d): turn-rewards t0 −0.25 − 1.5 = −1.75, t1 −0.75 − 0.25 = −1,
  overall (6·(−1.75) + 4·(−1)) / 10 = −1.45; pooled t0 0.25 − 0.4 = −0.15, t1 0, overall −0.09.
standard errors (the residuals of the module docstring of advcli.report.termination):
  turn-rewards t0: both groups' residuals 0; t1: ∓0.5 -> sqrt(0.5 / 1 / 2) = 0.5; overall
  residuals ∓0.2 -> 0.2. pooled overall residuals ±0.03 -> 0.03.
by length (turn-padded A): 1 turn (a0, d0) −0.5; 2 (b, e) 2/4 = 0.5; 3 (c, f) 4/6; mass 1/7, 2/7,
  4/7; longer than the median (2 turns): 4/7. pooled's signs differ from turn-padded's at c1, c2,
  d0, e0, e1, f0, f2: 7 of 12 rows.
"""

from __future__ import annotations

import json
import math
import random
import re
import shutil
import subprocess
from collections.abc import Hashable

import polars as pl
import pytest
from per_turn_reference import advantages, per_index_sum_advantages, reward_to_go
from test_termination_bias import GAMMA, K, _closed_form, _rollouts
from typer.testing import CliRunner

from advcli import compare
from advcli.cli.app import app
from advcli.settings.config import AdvantageConfig, Estimator, Level, PerTurn

# (group, trajectory, turn, reward), deliberately not in turn order.
HAND = [
    ("g2", "f", 2, 1.0), ("g1", "c", 1, 0.0), ("g1", "a", 0, 1.0), ("g2", "d", 0, 2.0),
    ("g1", "b", 1, 2.0), ("g2", "e", 0, 1.0), ("g1", "c", 0, 1.0), ("g2", "f", 0, 0.0),
    ("g1", "b", 0, 0.0), ("g2", "f", 1, 1.0), ("g1", "c", 2, 1.0), ("g2", "e", 1, 1.0),
]  # fmt: skip
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _write(rows, path):
    pl.DataFrame(
        rows, schema=["data_id", "rollout_id", "turn_index", "score"], orient="row"
    ).write_parquet(path)
    return path


def _report(path, estimator="rloo", gamma=1.0, **options):
    config = AdvantageConfig(
        level=Level.TURN, estimator=Estimator(estimator), per_turn=PerTurn(gamma=gamma, **options)
    )
    return compare(path, config).summary


@pytest.fixture(scope="module")
def hand(tmp_path_factory):
    path = _write(HAND, tmp_path_factory.mktemp("hand") / "hand.parquet")
    return path, _report(path)


def test_hand_case_by_turn_index(hand):
    _, summary = hand
    entries = summary["by_turn_index"]
    assert [(e["turn"], e["rows"], e["groups"]) for e in entries] == [
        (0, 6, 2),
        (1, 4, 2),
        (2, 2, 2),
    ]
    assert [(e["continue_rows"], e["stop_rows"]) for e in entries] == [(4, 2), (2, 2), (0, 2)]
    expected = {
        "turn": [0, 0.75, 0],
        "turn-padded": [0, 0, 0],
        "pooled": [-0.3, 0.85, 1.7],
        "turn-rewards": [-1 / 3, 0.25, 0],
        "trajectory": [0, 0.5, 0.75],
    }
    for name, values in expected.items():
        got = [e["baseline_minus_padded"][name] for e in entries]
        assert got == pytest.approx(values, abs=1e-12), name
    bonus = [e["implied_bonus"]["turn-rewards"] for e in entries]
    assert bonus[:2] == pytest.approx([-1.75, -1.0], abs=1e-12) and bonus[2] is None
    se = [e["implied_bonus_se"]["turn-rewards"] for e in entries]
    assert se[:2] == pytest.approx([0.0, 0.5], abs=1e-12) and se[2] is None
    assert [e["implied_bonus"]["pooled"] for e in entries][:2] == pytest.approx(
        [-0.15, 0], abs=1e-12
    )


def test_hand_case_groupings_and_lengths(hand):
    _, summary = hand
    groupings = summary["groupings"]
    assert groupings["turn-rewards"]["implied_bonus"] == pytest.approx(-1.45, abs=1e-12)
    assert groupings["turn-rewards"]["implied_bonus_se"] == pytest.approx(0.2, abs=1e-12)
    # |−1.45| over the mean |A| of turn-padded under rloo, 7/12.
    relative = groupings["turn-rewards"]["implied_bonus_relative"]
    assert relative == pytest.approx(1.45 * 12 / 7, abs=1e-12)
    assert groupings["pooled"]["implied_bonus"] == pytest.approx(-0.09, abs=1e-12)
    assert groupings["pooled"]["implied_bonus_se"] == pytest.approx(0.03, abs=1e-12)
    assert groupings["pooled"]["sign_flips"] == 7
    assert groupings["pooled"]["sign_flip_share"] == pytest.approx(7 / 12)
    assert groupings["turn-padded"]["long_mass_share"] == pytest.approx(4 / 7)
    lengths = summary["by_length"]
    assert [(e["turns"], e["trajectories"], e["rows"]) for e in lengths] == [
        (1, 2, 2),
        (2, 2, 4),
        (3, 2, 6),
    ]
    padded = [e["mean_advantage"]["turn-padded"] for e in lengths]
    assert padded == pytest.approx([-0.5, 0.5, 2 / 3], abs=1e-12)
    mass = [e["gradient_mass_share"]["turn-padded"] for e in lengths]
    assert mass == pytest.approx([1 / 7, 2 / 7, 4 / 7], abs=1e-12)
    assert sum(e["sign_flips"]["pooled"] for e in lengths) == 7


def test_hand_case_verdict(hand):
    _, summary = hand
    groupings = summary["groupings"]
    for name in ("turn-padded", "turn", "trajectory"):
        assert (
            groupings[name]["verdict"]["safe"]
            and groupings[name]["verdict"]["basis"] == "derivation"
        )
    assert groupings["turn-rewards"]["verdict"]["level"] == "severe"
    assert not groupings["turn-rewards"]["verdict"]["safe"]
    assessment = summary["assessment"]
    assert "turn-rewards" in assessment["biased"] and "turn-padded" in assessment["safe"]
    assert assessment["in_use"] == "turn-padded" and assessment["level"] == "negligible"
    settings = summary["settings"]
    assert settings["reward_mode"] == "per-turn" and settings["gamma"] == 1.0
    assert settings["estimator"] == "rloo" and settings["reference"] == "turn-padded"
    assert settings["groupings"] == ["turn", "turn-padded", "pooled", "turn-rewards", "trajectory"]


def _random_rows(seed: int) -> list[tuple[Hashable, Hashable, int, float]]:
    """Three groups of four trajectories of 1–4 turns, integer rewards, shuffled."""
    rng = random.Random(seed)
    rows = [
        (f"g{g}", f"t{i}", turn, float(rng.randint(-2, 3)))
        for g in range(3)
        for i in range(4)
        for turn in range(rng.randint(1, 4))
    ]
    rng.shuffle(rows)
    return rows


def _reference_advantages(rows, name, estimator, gamma):
    if name == "turn-rewards":
        return per_index_sum_advantages(rows, estimator, gamma=gamma)
    return advantages(rows, name, estimator, gamma=gamma)


def _grouped_mean(pairs):
    """The mean over keys of the mean of each key's values."""
    by_key: dict[Hashable, list[float]] = {}
    for key, value in pairs:
        by_key.setdefault(key, []).append(value)
    return sum(sum(v) / len(v) for v in by_key.values()) / len(by_key)


@pytest.mark.parametrize(("estimator", "gamma"), [("grpo", 1.0), ("drgrpo", 0.5), ("rloo", 0.8)])
def test_every_grouping_against_the_reference(estimator, gamma, tmp_path):
    rows = _random_rows(seed=7)
    summary = _report(_write(rows, tmp_path / "random.parquet"), estimator, gamma)
    centring = "rloo" if estimator == "rloo" else "drgrpo"
    returns = reward_to_go(rows, gamma)
    lengths: dict[tuple[Hashable, Hashable], int] = {}
    for group, trajectory, _, _ in rows:
        lengths[group, trajectory] = lengths.get((group, trajectory), 0) + 1

    def baselines(name):
        centred = _reference_advantages(rows, name, centring, gamma)
        return [g - a for g, a in zip(returns, centred, strict=True)]

    padded = baselines("turn-padded")
    for name in summary["settings"]["groupings"]:
        mine = baselines(name)
        for entry in summary["by_turn_index"]:
            pairs = [
                (row[0], b - p)
                for row, b, p in zip(rows, mine, padded, strict=True)
                if row[2] == entry["turn"]
            ]
            assert entry["baseline_minus_padded"][name] == pytest.approx(
                _grouped_mean(pairs), abs=1e-9
            ), (name, entry["turn"])
        found = _reference_advantages(rows, name, estimator, gamma)
        for entry in summary["by_length"]:
            values = [
                a for row, a in zip(rows, found, strict=True) if lengths[row[:2]] == entry["turns"]
            ]
            assert entry["mean_advantage"][name] == pytest.approx(
                sum(values) / len(values), abs=1e-9
            ), (name, entry["turns"])


def test_simulated_rollouts_flag_the_summed_per_index_rewards(tmp_path):
    """The rollouts of docs/per-turn-rewards.md, where continuing is worth nothing: the report's
    hidden bonus of turn-rewards is the closed form at each turn, turn's is 0, and the verdict
    flags turn-rewards and passes turn-padded."""
    rows, _ = _rollouts(seed=20261201)
    summary = _report(_write(rows, tmp_path / "sim.parquet"), "rloo", GAMMA)
    for entry in summary["by_turn_index"][: K - 1]:
        turn, se = entry["turn"], entry["implied_bonus_se"]["turn-rewards"]
        expected = _closed_form(turn)
        assert abs(expected) > 10 * se
        assert entry["implied_bonus"]["turn-rewards"] == pytest.approx(expected, abs=4 * se)
        assert entry["implied_bonus"]["turn"] == pytest.approx(
            0.0, abs=4 * entry["implied_bonus_se"]["turn"]
        )
    groupings = summary["groupings"]
    assert groupings["turn-rewards"]["verdict"]["level"] == "severe"
    assert groupings["turn-padded"]["verdict"]["safe"]
    assert "turn-rewards" in summary["assessment"]["biased"]
    assert "turn-padded" in summary["assessment"]["safe"]


@pytest.fixture(scope="module")
def documents(hand, tmp_path_factory):
    """The hand case's report through the command line, in every document and on the terminal."""
    path, _ = hand
    folder = tmp_path_factory.mktemp("documents")
    files = {kind: folder / f"report.{kind}" for kind in ("json", "md", "html", "png")}
    runner = CliRunner(env={"COLUMNS": "200"})
    result = runner.invoke(
        app,
        [
            "compare", str(path), "--reward-mode", "per-turn", "--estimator", "rloo",
            "--json", str(files["json"]), "--markdown", str(files["md"]),
            "--html", str(files["html"]), "--plot", str(files["png"]),
        ],
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    return result, files


def test_the_command_line_writes_every_document(hand, documents):
    _, summary = hand
    result, files = documents
    written = json.loads(files["json"].read_text())
    assert written["by_turn_index"] == summary["by_turn_index"]
    assert written["verdict"] == summary["verdict"]
    terminal = " ".join(result.stdout.split())
    for words in ("reward_mode │ per-turn", "gamma │ 1.0", "estimator │ rloo", "Verdict"):
        assert words in terminal
    markdown = files["md"].read_text()
    assert "| reward_mode | per-turn |" in markdown and "| gamma | 1.0 |" in markdown
    assert "| groupings | turn, turn-padded, pooled, turn-rewards, trajectory |" in markdown
    assert "## Baseline − zero-padded baseline by turn index" in markdown
    png = files["png"].read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 20_000
    html = files["html"].read_text()
    assert 'src="data:image/png;base64,' in html
    assert not re.search(r"""(src|href)=["']?(https?:|//)""", html)


@pytest.mark.browser
@pytest.mark.skipif(CHROMIUM is None, reason="needs chromium (.ci/run installs it)")
def test_the_html_page_renders_in_a_headless_browser(documents):
    _, files = documents
    browser = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars"]
    dom = subprocess.run(
        [*browser, "--dump-dom", files["html"].as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout
    words = " ".join(re.sub(r"<[^>]+>", " ", dom).split())
    assert "reward_mode per-turn" in words and "estimator rloo" in words
    assert "Hidden bonus on continuing by turn index" in words and "<img" in dom


def test_compute_report_is_the_same_report(hand, run, tmp_path):
    path, _ = hand
    report = tmp_path / "r.json"
    result = run(
        "compute", path, "-o", tmp_path / "out.parquet", "--no-tokens", "-q",
        "--reward-mode", "per-turn", "--estimator", "rloo", "--report", report,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    compared = run(
        "compare", path, "--reward-mode", "per-turn", "--estimator", "rloo", "--json", "-"
    )
    assert json.loads(report.read_text()) == json.loads(compared.stdout)
    markdown = tmp_path / "r.md"
    result = run(
        "compute", path, "-o", tmp_path / "again.parquet", "--no-tokens", "-q",
        "--reward-mode", "per-turn", "--report", markdown,
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    assert markdown.read_text().startswith("# advcli compare: per-turn rewards")


def test_fail_on_reads_the_grouping_in_use(hand, run):
    path, _ = hand
    common = ("compare", path, "--reward-mode", "per-turn", "--estimator", "rloo", "-q")
    assert run(*common, "--fail-on", "material").exit_code == 0
    tripped = run(*common, "--step-groups", "turn-rewards", "--fail-on", "severe")
    assert tripped.exit_code == 3
    assert "the bias is severe, which reaches --fail-on severe" in tripped.stderr


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("--fail-above", "0.1"), "--fail-above reads the outcome report's"),
        (("--by", "file"), "compare --by does not take --reward-mode per-turn"),
    ],
)
def test_usage_errors(options, message, hand, run):
    path, _ = hand
    result = run("compare", path, "--reward-mode", "per-turn", *options)
    assert result.exit_code == 2
    assert message in " ".join(result.stderr.split())


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"score": None}, "row 1: column 'score' (reward) is null"),
        ({"score": math.nan}, "row 1: column 'score': the score is NaN"),
        ({"turn_index": 3}, "has turns 0, 2, 3 in 'turn_index': per-turn rewards need consecutive"),
        ({"turn_index": 0}, "row 6: duplicate turn: (data_id='g1', rollout_id='c', turn_index=0)"),
    ],
)
def test_bad_rewards_and_turns_reach_compare(change, message, run, tmp_path):
    """A null or NaN reward, a turn gap or a repeat (row 1 is g1's c at turn 1): one Error line,
    exit 1, no report."""
    frame = pl.DataFrame(
        HAND, schema=["data_id", "rollout_id", "turn_index", "score"], orient="row"
    )
    for column, value in change.items():
        frame = frame.with_columns(
            pl.when(pl.int_range(pl.len()) == 1).then(value).otherwise(pl.col(column)).alias(column)
        )
    path = tmp_path / "bad.parquet"
    frame.write_parquet(path)
    report = tmp_path / "r.json"
    result = run("compare", path, "--reward-mode", "per-turn", "--json", report, "-q")
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: ") and message in lines[0], lines
    assert not report.exists()


def test_sample_turn_reward(run, tmp_path):
    path = tmp_path / "sample.parquet"
    result = run("sample", path, "--groups", "4", "--turn-reward", "0.25", "-q")
    assert result.exit_code == 0, result.stderr
    frame = pl.read_parquet(path).with_columns(
        pl.col("token_level_rewards").list.sum().alias("reward"),
        (pl.col("turn_index") == pl.col("turn_index").max().over("data_id", "rollout_id")).alias(
            "last"
        ),
    )
    assert frame.filter(~pl.col("last"))["reward"].to_list() == pytest.approx(
        [0.25] * int((~frame["last"]).sum())
    )
    assert set(frame.filter(pl.col("last"))["reward"].to_list()) <= {0.0, 1.0}
    refused = run("sample", tmp_path / "v.parquet", "--trainer", "verl-agent", "--turn-reward", "1")
    assert refused.exit_code == 2 and "--turn-reward applies to --trainer advcli" in refused.stderr


def test_anchor_groups_are_computed_when_the_dump_has_anchors(run, tmp_path):
    """With an anchor column the anchor grouping is one more, judged on its measured bonus;
    without one, asking for it is the engine's error."""
    frame = pl.DataFrame(
        HAND, schema=["data_id", "rollout_id", "turn_index", "score"], orient="row"
    )
    anchored = tmp_path / "anchored.parquet"
    frame.with_columns(pl.format("s{}", pl.col("turn_index")).alias("anchor")).write_parquet(
        anchored
    )
    result = run(
        "compare", anchored, "--reward-mode", "per-turn", "--anchor-col", "anchor",
        "--json", "-", "-q",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert "anchor" in summary["settings"]["groupings"]
    assert summary["groupings"]["anchor"]["verdict"]["basis"] == "measured"
    # Anchors named by the turn make the anchor step groups the turn's: the same baselines.
    for entry in summary["by_turn_index"]:
        assert entry["baseline_minus_padded"]["anchor"] == pytest.approx(
            entry["baseline_minus_padded"]["turn"], abs=1e-12
        )
    plain = _write(HAND, tmp_path / "plain.parquet")
    missing = run("compare", plain, "--reward-mode", "per-turn", "--step-groups", "anchor", "-q")
    assert missing.exit_code == 1
    assert "--step-groups anchor needs each row's anchor state" in missing.stderr
