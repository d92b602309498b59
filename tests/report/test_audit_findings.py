"""``audit``'s findings (issue 47): each kind reproduces the field's report it is named for,
from the report's description. The trainer's advantages are worked by hand or by plain Python
from the trainer's (buggy) formula; the expected kinds are given by hand."""

from __future__ import annotations

import math

import polars as pl
import pytest
from audit_dumps import audit_rows, audited_frame, kinds
from reference import reference_advantages

from advcli.run.audit import audit
from advcli.settings.resolve import expected_rule

# Three sound groups of one-row trajectories that every test shares, so that the rule is told.
SOUND = [
    ("s1", 0, 0, 0.0, 2),
    ("s1", 1, 0, 1.0, 2),
    ("s1", 2, 0, 1.0, 2),
    ("s2", 3, 0, 0.0, 2),
    ("s2", 4, 0, 0.0, 2),
    ("s2", 5, 0, 1.0, 2),
    ("s2", 6, 0, 0.5, 2),
    ("s3", 7, 0, 2.0, 2),
    ("s3", 8, 0, -1.0, 2),
]


def grpo(rows, epsilon: float = 1e-6) -> list[float]:
    return reference_advantages(rows, level="trajectory", estimator="grpo", epsilon=epsilon)


def one_group(name: str, scores: list[float], first: int = 100) -> list[tuple]:
    return [(name, first + i, 0, score, 2) for i, score in enumerate(scores)]


def sample_std(values: list[float]) -> float:
    mean = math.fsum(values) / len(values)
    return math.sqrt(math.fsum((v - mean) ** 2 for v in values) / (len(values) - 1))


def test_near_zero_std_blowup(tmp_path) -> None:
    """NeMo-RL PR #4161: rewards equal but for float residue (0.1 + 0.2 against 0.3), divided
    by their residue std with no epsilon where the std is positive: advantages of order 1."""
    rows = SOUND + one_group("r", [0.1 + 0.2, 0.3, 0.3, 0.3])
    found = grpo(rows, epsilon=0.0)
    assert max(abs(a) for a in found[-4:]) > 1
    report = audit_rows(tmp_path, rows, found)
    assert kinds(report) == ["near-zero-std-blowup"]
    (finding,) = report["findings"]
    assert (finding["groups"], finding["rows"], finding["example"]["group"]) == (1, 4, "r")


def test_low_precision_advantages(tmp_path) -> None:
    """OpenRLHF PR #1334: rewards [1, 1, 1, 1.0078125] whose mean bfloat16 rounds to 1: the
    trainer's advantages are about [0, 0, 0, 2] where the rule's are [-0.5, -0.5, -0.5, 1.5]."""
    rows = SOUND + one_group("b", [1.0, 1.0, 1.0, 1.0078125])
    found = [*grpo(SOUND), 0.0, 0.0, 0.0, 2.0]
    report = audit_rows(tmp_path, rows, found)
    assert kinds(report) == ["low-precision-advantages"]
    (finding,) = report["findings"]
    example = finding["example"]["rows"]
    assert [row["found"] for row in example] == [0.0, 0.0, 0.0, 2.0]
    # The std, 0.0039, is not much larger than epsilon 1e-6: the rule's are 0.03% smaller.
    assert [row["expected"] for row in example] == pytest.approx([-0.5, -0.5, -0.5, 1.5], rel=1e-3)


def test_a_trainer_in_bfloat16_is_named_by_its_rule(tmp_path) -> None:
    """Every advantage rounded to bfloat16's 8 significant bits: the rule is still named, and
    its rows are a low-precision finding."""
    rows = SOUND + one_group("t", [0.3, 0.7, 0.1, 0.9, 0.35])
    exact = reference_advantages(rows, level="trajectory", estimator="grpo", std="population")

    def bfloat16(value: float) -> float:
        if value == 0:
            return 0.0
        step = 2.0 ** (math.floor(math.log2(abs(value))) - 7)
        return round(value / step) * step

    report = audit_rows(tmp_path, rows, [bfloat16(a) for a in exact])
    assert (report["rule"]["estimator"], report["rule"]["std_ddof"]) == ("grpo", 0)
    assert "low-precision-advantages" in kinds(report)


def test_penalty_over_epsilon(tmp_path) -> None:
    """verl-agent: a tied group whose one row carries a -0.1 penalty the statistics did not
    see, divided by epsilon alone: A = -0.1 / 1e-6 = -1e5."""
    rows = SOUND + one_group("p", [1.0, 1.0, 1.0, 1.0])
    found = [*grpo(SOUND), 0.0, 0.0, -0.1 / 1e-6, 0.0]
    report = audit_rows(tmp_path, rows, found)
    assert kinds(report) == ["penalty-over-epsilon"]
    assert report["findings"][0]["rows"] == 1


def test_batch_as_one_group(tmp_path) -> None:
    """slime #1414: groups of uneven size normalized as one batch, so three rewards of 5.0 get
    a non-zero advantage, not 0."""
    rows = (
        one_group("u0", [5.0, 5.0, 5.0], 0)
        + one_group("u1", [0.0, 1.0, 0.0, 1.0, 1.0], 10)
        + one_group("u2", [2.0, 0.0], 20)
        + one_group("u3", [1.0, 0.0, 0.0, 4.0], 30)
        + one_group("u4", [3.0, 1.0, 2.0, 0.0, 6.0, 2.0], 40)
        + one_group("u5", [0.0, 4.0], 50)
    )
    scores = [row[3] for row in rows]
    mean, std = math.fsum(scores) / len(scores), sample_std(scores)
    found = [(s - mean) / (std + 1e-6) for s in scores]
    report = audit_rows(tmp_path, rows, found)
    assert kinds(report) == ["batch-as-one-group"]
    (finding,) = report["findings"]
    assert (finding["groups"], finding["rows"]) == (6, len(rows))
    assert finding["example"]["group"] == "u0"
    assert finding["example"]["baseline"] == pytest.approx(mean)
    assert finding["example"]["divisor"] == pytest.approx(std + 1e-6)
    assert [row["found"] for row in finding["example"]["rows"]] == pytest.approx(
        [(5.0 - mean) / (std + 1e-6)] * 3, rel=1e-6
    )


def test_merged_groups(tmp_path) -> None:
    """NeMo-RL PR #3882: two prompts with identical tokens taken for one group: their rows
    share one baseline; every other group keeps its own."""
    merged = one_group("m1", [0.0, 1.0, 1.0], 100) + one_group("m2", [0.0, 0.0, 0.5, 1.0], 200)
    together = [(0, row[1], 0, row[3], 2) for row in merged]
    rows = SOUND + merged
    report = audit_rows(tmp_path, rows, [*grpo(SOUND), *grpo(together)])
    assert kinds(report) == ["merged-groups"]
    (finding,) = report["findings"]
    assert (finding["groups"], finding["rows"]) == (2, 7)
    assert finding["example"]["groups"] == 2


def test_equal_rewards_nonzero_advantage(tmp_path) -> None:
    """verl PR #4598: five rewards of 0.2, whose float32 mean came out 0.20000003: each gets
    (0.2 - 0.20000003) / (0 + 1e-6) = -0.03, not 0."""
    rows = SOUND + one_group("e", [0.2] * 5)
    found = [*grpo(SOUND), *[(0.2 - 0.20000003) / 1e-6] * 5]
    report = audit_rows(tmp_path, rows, found)
    assert kinds(report) == ["equal-rewards-nonzero-advantage"]
    assert report["findings"][0]["rows"] == 5


def test_zero_earlier_steps(tmp_path) -> None:
    """SkyRL #1492 / PR #1507: with step-wise trajectories every step but the last got
    advantage 0."""
    rows = [
        ("z", "a", 0, 1.0, 2),
        ("z", "a", 1, 1.0, 2),
        ("z", "a", 2, 1.0, 2),
        ("z", "b", 0, 0.0, 2),
        ("z", "b", 1, 0.0, 2),
        ("z", "c", 0, 1.0, 2),
        ("z", "d", 0, 0.0, 2),
        ("z", "d", 1, 0.0, 2),
    ]
    rule = reference_advantages(rows, level="trajectory", estimator="grpo")
    last = [i == len(rows) - 1 or rows[i + 1][1] != row[1] for i, row in enumerate(rows)]
    found = [a if is_last else 0.0 for a, is_last in zip(rule, last, strict=True)]
    report = audit_rows(tmp_path, rows, found)
    assert report["rule"]["level"] == "trajectory"
    assert kinds(report) == ["zero-earlier-steps"]
    assert report["findings"][0]["rows"] == 4


def test_sign_flip(tmp_path) -> None:
    """TRL PR #5026: advantages divided by the group's mean + 1e-4, which flips their signs
    where the mean is negative."""
    flipped = [-2.0, -1.0, 0.0]
    rows = SOUND + one_group("f", flipped)
    mean = math.fsum(flipped) / 3
    found = [*grpo(SOUND, epsilon=1e-4), *[(s - mean) / (mean + 1e-4) for s in flipped]]
    report = audit_rows(tmp_path, rows, found)
    assert report["rule"]["epsilon"] == 1e-4
    assert kinds(report) == ["sign-flip"]


def test_unexplained(tmp_path) -> None:
    rows = SOUND + one_group("x", [0.0, 1.0, 2.0])
    found = [*grpo(SOUND), 0.3, -0.7, 0.1]
    report = audit_rows(tmp_path, rows, found)
    assert kinds(report) == ["unexplained"]
    assert report["findings"][0]["example"]["group"] == "x"


def test_per_token_advantages_are_set_apart(tmp_path) -> None:
    """A row whose response tokens carry different advantages (GAE) is reported, and not
    audited: the other rows still name the rule."""
    frame = audited_frame(SOUND, grpo(SOUND)).with_columns(
        pl.when(pl.int_range(pl.len()) == 4)
        .then(pl.lit([0.5, -0.25], dtype=pl.List(pl.Float32)))
        .otherwise(pl.col("advantages"))
        .alias("advantages")
    )
    path = tmp_path / "per_token.parquet"
    frame.write_parquet(path)
    report = audit([path])
    assert report["rows"]["audited"] == len(SOUND) - 1
    assert kinds(report) == ["per-token-advantages"]
    (finding,) = report["findings"]
    assert (
        finding["example"]["rows"][0] | {"found_low": -0.25, "found_high": 0.5}
        == (finding["example"]["rows"][0])
    )


def test_a_clean_dump_has_no_finding(tmp_path) -> None:
    report = audit_rows(tmp_path, SOUND, grpo(SOUND))
    assert report["findings"] == []
    assert report["verdict"].startswith("clean: ")


def test_unexpected_rule(tmp_path) -> None:
    """--expect names the rule believed run: a rule found otherwise is a finding with the rows
    the believed rule does not explain; a setting the dump cannot tell is no mismatch."""
    rows = [
        ("A", "a", 0, 1.0, 2),
        ("A", "a", 1, 1.0, 2),
        ("A", "b", 0, 0.0, 2),
        ("A", "c", 0, 1.0, 2),
    ]
    path = tmp_path / "turn.parquet"
    audited_frame(rows, reference_advantages(rows, level="turn", estimator="grpo")).write_parquet(
        path
    )
    believed = expected_rule("estimator=grpo,level=trajectory")
    report = audit([path], expect=believed)
    assert kinds(report) == ["unexpected-rule", "turn-level-counting"]
    finding = report["findings"][0]
    example = finding["example"]
    assert example["differs"] == ["level"]
    assert (example["expected_rule"], example["found_rule"]) == (
        {"level": "trajectory", "estimator": "grpo"},
        {"level": "turn", "estimator": "grpo"},
    )
    # At trajectory level a's and c's score 1 against b's 0: sqrt(1/3) std-units above the mean;
    # at turn level (three rows of 1, one of 0) the rows of 1 are 0.5 std-units above it.
    assert [row["expected"] for row in example["rows"]] == pytest.approx(
        [1 / math.sqrt(3), 1 / math.sqrt(3), -2 / math.sqrt(3), 1 / math.sqrt(3)], rel=1e-5
    )
    assert (finding["groups"], finding["rows"]) == (1, 4)
    # Epsilon 1e-8 or 1e-6: nothing on this dump tells them apart.
    assert kinds(audit([path], expect=expected_rule("level=turn,epsilon=1e-8"))) == [
        "turn-level-counting"
    ]
    population = audit([path], expect=expected_rule("recipe=rllm,level=turn"))
    assert population["findings"][0]["example"]["differs"] == ["std_ddof"]


def test_a_real_difference_at_a_large_scale_is_no_residue(tmp_path) -> None:
    """Rewards of 2e6 and 2e6 + 1 differ by 1, not by float residue: their advantages of order
    1 are the rule's, and a clean dump has no finding."""
    rows = SOUND + one_group("large", [2e6, 2e6, 2e6, 2e6 + 1])
    assert audit_rows(tmp_path, rows, grpo(rows))["findings"] == []


def test_a_row_the_rule_gives_0_is_no_sign_flip(tmp_path) -> None:
    rows = SOUND + one_group("m", [0.0, 1.0, 2.0])
    found = grpo(rows)
    found[-2] = 0.3  # the middle row, 0 by the rule
    assert kinds(audit_rows(tmp_path, rows, found)) == ["unexplained"]


def test_groups_of_the_same_scores_are_no_merged_groups(tmp_path) -> None:
    """Eight groups of 0/1 rewards whose advantages are twice grpo's (no rule's): groups of the
    same scores have the same line, but its baseline is each group's own mean."""
    rows = [(f"g{g}", f"{g}-{i}", 0, float(i % 2), 2) for g in range(8) for i in range(4)]
    found = [2 * a for a in reference_advantages(rows, level="trajectory", estimator="grpo")]
    report = audit_rows(tmp_path, rows, found)
    assert report["rule"] is None
    assert kinds(report) == ["unexplained"]


@pytest.mark.parametrize("epsilon", [1e-5, 1e-3, 0.1])
def test_an_epsilon_no_candidate_has_is_read_off_the_dump(tmp_path, epsilon) -> None:
    """A trainer's epsilon outside the table (0, 1e-8, 1e-6, 1e-4) is the rows' implied one:
    named, and no finding (before, its rows were taken for bfloat16 rounding)."""
    # Scores 1e-3 apart: a std small enough for each epsilon to show.
    rows = [(f"g{g}", f"{g}-{i}", 0, (g + i * i) % 3 / 1000, 2) for g in range(8) for i in range(4)]
    report = audit_rows(tmp_path, rows, grpo(rows, epsilon=epsilon))
    assert (report["rule"]["epsilon"], report["rule"]["rows_matched"]) == (epsilon, len(rows))
    assert report["findings"] == []


def test_a_group_of_equal_scores_merged_with_one_that_varies(tmp_path) -> None:
    """NeMo-RL PR #3882 with binary rewards: a prompt whose rollouts all failed merged with one
    whose rollouts vary. The tied group's rows lie on the other's line: merged-groups, both."""
    merged = one_group("v", [0.0, 1.0, 1.0, 0.0], 100) + one_group("t", [0.0] * 4, 200)
    together = [(0, row[1], 0, row[3], 2) for row in merged]
    report = audit_rows(tmp_path, SOUND + merged, [*grpo(SOUND), *grpo(together)])
    assert [(f["kind"], f["groups"], f["rows"]) for f in report["findings"]] == [
        ("merged-groups", 2, 8)
    ]


def test_a_rule_spelled_otherwise_is_no_unexpected_rule(tmp_path) -> None:
    """grpo at scale none is drgrpo: expecting it is no mismatch, and a bug's rows (a flipped
    group) are that bug's finding alone."""
    rows = SOUND + one_group("f", [-2.0, -1.0, 0.0])
    found = reference_advantages(rows, level="trajectory", estimator="drgrpo")
    found[-3], found[-1] = -found[-3], -found[-1]
    path = tmp_path / "drgrpo.parquet"
    audited_frame(rows, found).write_parquet(path)
    report = audit([path], expect=expected_rule("estimator=grpo,scale=none"))
    assert report["rule"]["estimator"] == "drgrpo"
    assert kinds(report) == ["sign-flip"]


def test_a_few_rows_explained_by_chance_name_no_rule(tmp_path) -> None:
    """Every group merged with another (NeMo-RL PR #3882 throughout): no rule explains half the
    rows, so none is named; the findings still say what happened."""
    rows, found = [], []
    for pair in range(4):
        first = one_group(f"a{pair}", [0.0, 1.0, float(pair)], 10 * pair)
        second = one_group(f"b{pair}", [0.5, 2.0], 10 * pair + 5)
        rows += first + second
        found += grpo([(0, row[1], 0, row[3], 2) for row in first + second])
    report = audit_rows(tmp_path, rows, found)
    assert report["rule"] is None
    assert report["verdict"] == "no rule of the table explains any of the trainer's advantages"
    assert kinds(report) == ["merged-groups"]
    assert report["findings"][0]["example"]["rows"][0]["expected"] is None


def test_rules_that_explain_as_many_other_rows_do_not_fit_alike(tmp_path) -> None:
    """Three groups divided by the sample std and three by the population std: each std
    explains as many rows, not the same ones, so neither fits alike."""
    rows = [(f"g{g}", f"{g}-{i}", 0, i + g / 2, 2) for g in range(6) for i in range(4)]
    sample = reference_advantages(rows, level="trajectory", estimator="grpo")
    population = reference_advantages(rows, level="trajectory", estimator="grpo", std="population")
    found = [
        s if row[0] in ("g0", "g1", "g2") else p
        for row, s, p in zip(rows, sample, population, strict=True)
    ]
    rule = audit_rows(tmp_path, rows, found)["rule"]
    assert rule["std_ddof"] == 1 and "std_ddof" not in rule["alike"]
    assert rule["rows_matched"] == 12


def test_a_rule_changed_between_steps_read_as_one(tmp_path) -> None:
    """Two step files audited as one, the first grpo at trajectory level, the second at turn
    level (trajectories of one or two turns in both): the rule named is the first's, and the
    finding on the second's rows says that turn-level grpo gives them whole."""

    def step(name: str, groups: int) -> list[tuple]:
        return [
            (f"{name}{g}", f"{name}{g}-{t}", turn, float((g + t) % 3), 2)
            for g in range(groups)
            for t in range(4)
            for turn in range(1 + t % 2)
        ]

    first, second = step("a", 4), step("b", 2)
    found_second = reference_advantages(second, level="turn", estimator="grpo")
    audited_frame(first, grpo(first)).write_parquet(tmp_path / "step1.parquet")
    audited_frame(second, found_second).write_parquet(tmp_path / "step2.parquet")
    report = audit([tmp_path])
    assert (report["rule"]["level"], report["rule"]["rows_matched"]) == ("trajectory", 24)
    (finding,) = report["findings"]
    assert (finding["groups"], finding["rows"]) == (2, 12)
    assert finding["example"]["explained_by"] == {
        "level": "turn",
        "estimator": "grpo",
        "scale": "group",
        "singleton": "raw",
        "epsilon": 1e-6,
        "std_ddof": 1,
    }
    assert finding["report"].endswith("which audit --by shows step by step")


def test_no_other_rule_is_named_for_a_bug(tmp_path) -> None:
    """A group whose signs the trainer flipped: no rule of the table gives it, so none is
    named beside the finding."""
    flipped = one_group("f", [0.0, 1.0, 3.0])
    report = audit_rows(tmp_path, SOUND + flipped, [*grpo(SOUND), *(-a for a in grpo(flipped))])
    assert kinds(report) == ["sign-flip"]
    assert "explained_by" not in report["findings"][0]["example"]
