"""``audit`` names the rule a trainer's advantages follow (issue 47): every rule of the table
is found back from advantages a plain-Python reference computed (tests/reference.py), and a
setting this dump cannot show is said to fit alike, never named wrongly."""

from __future__ import annotations

import itertools

import pytest
from audit_dumps import audit_rows, kinds
from reference import reference_advantages

# Every setting shows on these rows (but opo's level: a token-weighted mean is the same over
# rows as over trajectories). Trajectories of 1 to 3 turns (the levels differ), tokens 2 to 4
# (opo's baseline differs from the mean); group A's top trajectory of two turns (grpo_passk's
# levels differ: at turn level its rows tie); group B's scores 1e-5 apart with one top unit (a
# std small enough for each epsilon to show, grpo_passk's too); group D alone (the singleton
# rule shows at both levels); group E's negative scores and a top unit well above the second
# (grpo_passk's scale shows).
ROWS = [
    ("A", "a", 0, 1.0, 2),
    ("A", "a", 1, 1.0, 3),
    ("A", "b", 0, 0.0, 4),
    ("A", "c", 0, 0.0, 2),
    ("A", "c", 1, 0.0, 2),
    ("A", "c", 2, 0.0, 3),
    ("A", "d", 0, 0.5, 2),
    ("B", "e", 0, 0.0, 2),
    ("B", "f", 0, 2e-5, 3),
    ("B", "g", 0, 0.0, 4),
    ("B", "h", 0, 1e-5, 2),
    ("B", "h", 1, 1e-5, 2),
    ("D", "i", 0, 3.0, 2),
    ("E", "j", 0, -1.0, 2),
    ("E", "k", 0, 0.5, 3),
    ("E", "k", 1, 0.5, 2),
    ("E", "l", 0, 0.25, 2),
    ("E", "l", 1, 0.25, 4),
    ("E", "m", 0, 2.0, 3),
]

DIVIDING = [
    {
        "estimator": estimator,
        "level": level,
        "scale": scale,
        "singleton": singleton,
        "epsilon": epsilon,
        "std": std,
    }
    for estimator, level, scale, singleton, epsilon, std in itertools.product(
        ("grpo", "grpo_passk"),
        ("trajectory", "turn"),
        ("group", "batch"),
        ("raw", "zero"),
        (0.0, 1e-8, 1e-6, 1e-4),
        ("sample", "population"),
    )
]
# grpo_loo (NeMo-RL's) at its group scale: group B's unit f has other units 1e-5 apart, a
# std small enough for each epsilon to show.
LEAVE_ONE_OUT = [
    {
        "estimator": "grpo_loo",
        "level": level,
        "scale": "group",
        "singleton": singleton,
        "epsilon": epsilon,
        "std": std,
    }
    for level, singleton, epsilon, std in itertools.product(
        ("trajectory", "turn"), ("raw", "zero"), (0.0, 1e-8, 1e-6, 1e-4), ("sample", "population")
    )
]
NOT_DIVIDING = [
    {
        "estimator": estimator,
        "level": level,
        "scale": "none",
        "singleton": singleton,
        "epsilon": 1e-6,
        "std": "sample",
    }
    for estimator, level, singleton in itertools.product(
        ("drgrpo", "rloo", "opo", "grpo_passk", "reinforce_pp_baseline"),
        ("trajectory", "turn"),
        ("raw", "zero"),
    )
]


def expected_settings(used: dict) -> dict:
    """The rule's settings as the audit names them: no epsilon or std where nothing is divided,
    grpo_passk's lone unit 0 under either singleton rule."""
    divides = used["estimator"] in ("grpo", "grpo_passk", "grpo_loo") and used["scale"] != "none"
    return {
        "level": used["level"],
        "estimator": used["estimator"],
        "scale": used["scale"],
        "singleton": "zero" if used["estimator"] == "grpo_passk" else used["singleton"],
        "epsilon": used["epsilon"] if divides else None,
        "std_ddof": {"sample": 1, "population": 0}[used["std"]] if divides else None,
    }


@pytest.mark.parametrize(
    "used",
    DIVIDING + LEAVE_ONE_OUT + NOT_DIVIDING,
    ids=lambda used: "-".join(map(str, used.values())),
)
def test_the_rule_found_is_the_rule_used(used, tmp_path) -> None:
    found = reference_advantages(ROWS, **used)
    report = audit_rows(tmp_path, ROWS, found)
    rule = report["rule"]
    assert rule["rows_matched"] == rule["rows"] == len(ROWS)
    for name, value in expected_settings(used).items():
        if name in rule["alike"]:
            # Only a batch's std (of every score) hides epsilon: none is small enough; and a
            # token-weighted mean is the same over rows as over trajectories.
            assert (name, used["scale"]) == ("epsilon", "batch") or (
                name,
                used["estimator"],
            ) == ("level", "opo")
            assert value in rule["alike"][name]["values"]
        else:
            assert rule[name] == value, name
    counts_turns = used["level"] == "turn" and used["estimator"] != "opo"
    expected_kinds = ["turn-level-counting"] if counts_turns else []
    assert kinds(report) == expected_kinds


def test_what_the_dump_cannot_show_fits_alike(tmp_path) -> None:
    """One-row trajectories, no group of one, no small std: the level, the singleton rule and
    epsilons up to 1e-6 fit alike, each said with why; the rule names the preferred value."""
    rows = [("A", t, 0, float(t % 2), 2) for t in range(4)] + [
        ("B", t, 0, float(t), 2) for t in range(3)
    ]
    report = audit_rows(tmp_path, rows, reference_advantages(rows, level="turn", estimator="grpo"))
    rule = report["rule"]
    assert (rule["level"], rule["singleton"], rule["epsilon"]) == ("trajectory", "raw", 1e-6)
    alike = {name: (entry["values"], entry["why"]) for name, entry in rule["alike"].items()}
    assert alike["level"] == (["trajectory", "turn"], "every trajectory is one row")
    assert alike["singleton"] == (["raw", "zero"], "no group has a single unit")
    assert alike["epsilon"][0] == [1e-6, 1e-8, 0.0]
    assert "epsilon" in alike["epsilon"][1]
    assert kinds(report) == []
