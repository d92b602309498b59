"""The one resolver: the settings as given to AdvantageConfig, with one precedence, the same
from every face (the command line's options, saved options, advcli.torch's keywords), and its
errors in the caller's words. The expected configs are written out by hand from the rules the
docs state (a given setting wins over a recipe's, a recipe over the defaults)."""

from __future__ import annotations

import pytest
import typer
import typer.main

from advcli.cli.app import app
from advcli.cli.options import dump_settings
from advcli.errors import SettingsError, UsageError
from advcli.settings.config import (
    AdvantageConfig,
    AnchorScope,
    Estimator,
    GigpoNorm,
    Level,
    PerTurn,
    Scale,
    Singleton,
    StepGroups,
    StepTerm,
    TrajScore,
)
from advcli.settings.resolve import KEYWORD_WORDS, OPTION_WORDS, resolve_config

ROLL_STEP = StepTerm(gamma=0.95, norm=GigpoNorm.MEAN_STD, scope=AnchorScope.BATCH, min_std=1e-6)
LIGHTRFT = PerTurn(groups=StepGroups.TURN_REWARDS, variance_epsilon=1e-9)

# (settings given, the config they resolve to)
CASES = [
    ({}, AdvantageConfig()),
    ({"level": "turn", "estimator": "rloo"}, AdvantageConfig(Level.TURN, Estimator.RLOO)),
    (
        {"estimator": "grpo", "scale": "batch", "epsilon": 0.5, "traj_score": "last"},
        AdvantageConfig(epsilon=0.5, scale=Scale.BATCH, traj_score=TrajScore.LAST),
    ),
    # gigpo without a recipe: the step term's defaults, the level's default.
    ({"estimator": "gigpo"}, AdvantageConfig(estimator=Estimator.GIGPO, step=StepTerm())),
    (
        {"estimator": "gigpo", "gamma": 0.5, "step_weight": 2.0, "anchor_scope": "batch"},
        AdvantageConfig(
            estimator=Estimator.GIGPO,
            step=StepTerm(gamma=0.5, weight=2.0, scope=AnchorScope.BATCH),
        ),
    ),
    # A gigpo recipe names its estimator and sets its level, step term and singleton rule;
    # ROLL's norm is mean_std, so its ε under mean (0) does not apply.
    (
        {"recipe": "roll"},
        AdvantageConfig(Level.TURN, Estimator.GIGPO, singleton=Singleton.ZERO, step=ROLL_STEP),
    ),
    # ... and each setting given beside it wins.
    (
        {"recipe": "roll", "level": "trajectory", "singleton": "raw", "gamma": 1.0},
        AdvantageConfig(
            Level.TRAJECTORY,
            Estimator.GIGPO,
            singleton=Singleton.RAW,
            step=StepTerm(
                gamma=1.0, norm=GigpoNorm.MEAN_STD, scope=AnchorScope.BATCH, min_std=1e-6
            ),
        ),
    ),
    # Under mean, the recipe's ε (verl-agent's mean_norm subtracts only) unless ε is given.
    (
        {"recipe": "verl-agent"},
        AdvantageConfig(Level.TURN, Estimator.GIGPO, epsilon=0.0, step=StepTerm()),
    ),
    (
        {"recipe": "verl-agent", "epsilon": 0.25},
        AdvantageConfig(Level.TURN, Estimator.GIGPO, epsilon=0.25, step=StepTerm()),
    ),
    (
        {"recipe": "roll", "gigpo_norm": "mean"},
        AdvantageConfig(
            Level.TURN,
            Estimator.GIGPO,
            epsilon=0.0,
            singleton=Singleton.ZERO,
            step=StepTerm(gamma=0.95, scope=AnchorScope.BATCH, min_std=1e-6),
        ),
    ),
    # Per-turn rewards: turn level, the grouping's defaults.
    (
        {"reward_mode": "per-turn"},
        AdvantageConfig(Level.TURN, per_turn=PerTurn()),
    ),
    (
        {"reward_mode": "per-turn", "step_groups": "anchor", "anchor_scope": "batch"},
        AdvantageConfig(
            Level.TURN,
            per_turn=PerTurn(groups=StepGroups.ANCHOR, scope=AnchorScope.BATCH),
        ),
    ),
    # A per-turn recipe implies per-turn rewards and sets ε, the singleton rule, the grouping.
    (
        {"recipe": "lightrft"},
        AdvantageConfig(Level.TURN, epsilon=0.0, singleton=Singleton.ZERO, per_turn=LIGHTRFT),
    ),
    (
        {"recipe": "lightrft", "estimator": "rloo", "epsilon": 0.5, "gamma": 0.9},
        AdvantageConfig(
            Level.TURN,
            Estimator.RLOO,
            epsilon=0.5,
            singleton=Singleton.ZERO,
            per_turn=PerTurn(gamma=0.9, groups=StepGroups.TURN_REWARDS, variance_epsilon=1e-9),
        ),
    ),
]


@pytest.mark.parametrize(("given", "expected"), CASES)
def test_the_settings_given_resolve_by_one_precedence(given, expected):
    assert resolve_config(given) == expected
    # None is not given, and a choice is its value or its member.
    assert resolve_config({**given, "scale": None, "traj_score": None} | given) == expected


def test_a_choice_given_as_its_member_is_the_same_setting():
    given = {"estimator": Estimator.RLOO, "level": Level.TURN, "singleton": Singleton.ZERO}
    assert resolve_config(given) == AdvantageConfig(
        Level.TURN, Estimator.RLOO, singleton=Singleton.ZERO
    )


ADVCLI = typer.main.get_command(app)


def options_of(given: dict[str, object]) -> list[str]:
    """The settings as the command line's options: ``--step-weight 2.0``."""
    return [word for name, value in given.items() for word in (option(name), str(value))]


def option(setting: str) -> str:
    return "--" + setting.replace("_", "-")


@pytest.mark.parametrize(("given", "expected"), CASES)
def test_the_command_line_resolves_its_options_as_the_library_its_keywords(
    given, expected, tmp_path, monkeypatch
):
    monkeypatch.chdir(tmp_path)
    root = typer.Context(ADVCLI, info_name="advcli")
    ctx = ADVCLI.commands["compute"].make_context(
        "compute", ["in.parquet", "-o", "out.parquet", *options_of(given)], parent=root
    )
    assert dump_settings(ctx).config == expected


def toml_value(value: object) -> str:
    return str(value) if isinstance(value, float) else f'"{value}"'


@pytest.mark.parametrize(("given", "expected"), CASES)
def test_saved_options_resolve_as_typed_ones(given, expected, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    saved = "".join(
        f"{option(name).removeprefix('--')} = {toml_value(value)}\n"
        for name, value in given.items()
    )
    (tmp_path / "advcli.toml").write_text(saved)
    root = typer.Context(ADVCLI, info_name="advcli")
    ctx = ADVCLI.commands["compute"].make_context(
        "compute", ["in.parquet", "-o", "out.parquet"], parent=root
    )
    assert dump_settings(ctx).config == expected


ERRORS = [
    # (given, in options' words, in keywords' words)
    (
        {"estimator": "rloo", "gamma": 0.9},
        "--gamma applies to gigpo, not to rloo (--gamma applies to --reward-mode per-turn too)",
        "gamma applies to gigpo, not to rloo (gamma applies to reward_mode='per-turn' too)",
    ),
    (
        {"estimator": "opo", "recipe": "roll", "gigpo_norm": "mean"},
        "--recipe roll and --gigpo-norm apply to gigpo, not to opo",
        "recipe='roll' and gigpo_norm apply to gigpo, not to opo",
    ),
    (
        {"reward_mode": "per-turn", "step_weight": 1.0, "gigpo_norm": "mean_std", "gamma": 0.5},
        "--step-weight and --gigpo-norm apply to gigpo, not to --reward-mode per-turn",
        "step_weight and gigpo_norm apply to gigpo, not to reward_mode='per-turn'",
    ),
    (
        {"step_groups": "pooled"},
        "--step-groups applies to --reward-mode per-turn",
        "step_groups applies to reward_mode='per-turn'",
    ),
    (
        {"recipe": "lightrft", "reward_mode": "outcome"},
        "--recipe lightrft implies --reward-mode per-turn, not --reward-mode outcome",
        "recipe='lightrft' implies reward_mode='per-turn', not reward_mode='outcome'",
    ),
    (
        {"level": "episode"},
        "--level episode is not one of 'trajectory', 'turn'",
        "level='episode' is not one of 'trajectory', 'turn'",
    ),
]


@pytest.mark.parametrize(("given", "in_options", "in_keywords"), ERRORS)
def test_errors_name_the_settings_in_the_callers_words(given, in_options, in_keywords):
    with pytest.raises(SettingsError) as raised:
        resolve_config(given, OPTION_WORDS)
    assert str(raised.value) == in_options
    with pytest.raises(SettingsError) as raised:
        resolve_config(given, KEYWORD_WORDS)
    assert str(raised.value) == in_keywords


def test_a_settings_error_is_a_usage_error_and_a_value_error():
    """The command line exits 2 on it; a library caller catches the ValueError it expects."""
    with pytest.raises(SettingsError) as raised:
        resolve_config({"estimator": "loo"})
    assert isinstance(raised.value, UsageError)
    assert isinstance(raised.value, ValueError)


def test_a_key_that_is_no_setting_is_a_type_error():
    with pytest.raises(TypeError, match="'levle' is not a setting"):
        resolve_config({"levle": "turn"})
