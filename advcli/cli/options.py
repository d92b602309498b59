"""The options several commands share, as ``Annotated`` types so that each command's signature
is one line per option, and the one function that turns a reading command's options into the
library's settings."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import Path
from typing import Annotated, Any, NamedTuple, TypeVar, cast

import typer

from advcli.cli.option_table import SAVED_KEYS, option
from advcli.cli.saved_options import read_config
from advcli.errors import SettingsError, UsageError
from advcli.settings.config import (
    AdvantageConfig,
    AnchorScope,
    ColumnNames,
    Engine,
    Estimator,
    GigpoNorm,
    Level,
    PerTurn,
    RewardMode,
    Scale,
    Singleton,
    StdDenominator,
    StepGroups,
    StepTerm,
    TrajScore,
)
from advcli.settings.recipes import OUTCOME_RECIPES, PER_TURN_RECIPES, RECIPES, Recipe, recipe_sets
from advcli.settings.resolve import DEFAULTS, OPTION_WORDS, SETTING_NAMES, resolve_config

# More threads than this only cost memory on any machine advcli runs on.
MAX_THREADS = 1024


# Options shared by the commands that read a dump.
Inputs = Annotated[
    list[str] | None,
    typer.Argument(
        help="Parquet, JSON-lines or Arrow files, globs or directories, read as one dataset; '-' "
        "reads Parquet, an Arrow IPC stream or JSON lines from stdin.",
        show_default=False,
    ),
]
DIALECT_DEFAULT = "[default: the trainer's name for it: see the docs' input schema page]"
GroupCol = Annotated[str | None, option("--group-col", help=f"Group column {DIALECT_DEFAULT}.")]
GroupSize = Annotated[
    int | None,
    option(
        "--group-size",
        min=1,
        help="For dumps with no group id (TRL, OpenRLHF): each block of this many consecutive "
        "rows is a group.",
    ),
]
TrajCol = Annotated[str | None, option("--traj-col", help=f"Trajectory column {DIALECT_DEFAULT}.")]
TurnCol = Annotated[
    str | None,
    option("--turn-col", help=f"Turn-order column {DIALECT_DEFAULT}."),
]
RewardCol = Annotated[
    str | None,
    option(
        "--reward-col",
        help=f"Reward column: a list of token rewards (summed) or a scalar {DIALECT_DEFAULT}.",
    ),
]
MaskCol = Annotated[
    str | None,
    option(
        "--mask-col",
        help=f"Response mask (list of 0/1) or response length (int) {DIALECT_DEFAULT}.",
    ),
]
LevelOpt = Annotated[
    Level, option("--level", help="Which unit counts once in its group's statistics.")
]
EstimatorOpt = Annotated[Estimator, option("--estimator", help="Advantage estimator.")]
EpsilonOpt = Annotated[float, option("--epsilon", min=0.0, help="Added to the group std.")]
TrajScoreOpt = Annotated[
    TrajScore | None,
    option(
        "--traj-score",
        help="Rule for a trajectory whose rows carry different scores [default: error].",
    ),
]
ScaleOpt = Annotated[
    Scale | None,
    option(
        "--scale",
        help="grpo/grpo_passk/grpo_loo divisor: group std, batch std or none [default: group].",
    ),
]
StdOpt = Annotated[
    StdDenominator | None,
    option(
        "--std",
        help="The std's denominator: n - 1 (sample, as torch.std and verl) or n (population, "
        "as np.std and rLLM) [default: sample].",
    ),
]
SingletonOpt = Annotated[
    Singleton,
    option("--singleton", help="A single-unit group keeps its raw score, or gets 0."),
]
AnchorCol = Annotated[
    str | None,
    option(
        "--anchor-col",
        help="gigpo: the anchor state (string, integer, or a list or struct of them; equal "
        f"values are one step group) {DIALECT_DEFAULT}.",
    ),
]
StepRewardCol = Annotated[
    str | None,
    option(
        "--step-reward-col",
        help=f"gigpo: each step's own reward, discounted by --gamma {DIALECT_DEFAULT}.",
    ),
]
StepReturnCol = Annotated[
    str | None,
    option(
        "--step-return-col",
        help="gigpo: each step's already discounted return, used as it is (instead of "
        "--step-reward-col).",
    ),
]
RecipeOpt = Annotated[
    Recipe | None,
    option(
        "--recipe",
        help="a peer's rule (options given beside it win); gigpo as a peer computes it "
        "(implies --estimator gigpo): "
        + "; ".join(
            f"{recipe.value}: {settings.describe()}" for recipe, settings in RECIPES.items()
        )
        + "; per-turn rewards as a peer computes them: "
        + "; ".join(
            f"{recipe.value}: {settings.describe()}"
            for recipe, settings in PER_TURN_RECIPES.items()
        )
        + "; outcome rewards as a peer computes them: "
        + "; ".join(
            f"{recipe.value}: {outcome.describe()}" for recipe, outcome in OUTCOME_RECIPES.items()
        )
        + ".",
    ),
]
GammaOpt = Annotated[
    float | None,
    option(
        "--gamma",
        help="gigpo's step returns' and per-turn rewards' discount, in [0, 1] "
        f"[default: {StepTerm().gamma:g}].",
    ),
]
RewardModeOpt = Annotated[
    RewardMode,
    option(
        "--reward-mode",
        help="outcome: every row carries its trajectory's reward; per-turn: each row's reward is "
        "its own turn's, its score the reward-to-go, each row a unit of its step group.",
    ),
]
StepGroupsOpt = Annotated[
    StepGroups | None,
    option(
        "--step-groups",
        help="per-turn: normalize within the rows at one turn position (turn), the same over "
        "every trajectory of the group, one without that turn counting 0 (turn-padded), every "
        f"row of the group (pooled) or equal anchors (anchor) [default: {PerTurn().groups.value}].",
    ),
]
StepWeightOpt = Annotated[
    float | None,
    option(
        "--step-weight",
        help=f"gigpo: ω, the step term's weight, >= 0 [default: {StepTerm().weight:g}].",
    ),
]
GigpoNormOpt = Annotated[
    GigpoNorm | None,
    option(
        "--gigpo-norm",
        help="gigpo: both terms as (x - mean) / (1 + epsilon) or (x - mean) / (std + epsilon) "
        f"[default: {StepTerm().norm.value}].",
    ),
]
AnchorScopeOpt = Annotated[
    AnchorScope | None,
    option(
        "--anchor-scope",
        help="gigpo: equal anchors form a step group within a task group, or across the batch "
        f"[default: {StepTerm().scope.value}].",
    ),
]


EngineOpt = Annotated[
    Engine,
    option(
        "--engine",
        help="local: Polars on this machine; ray: Ray Data (needs advcli[ray]), writing a "
        "Parquet dataset folder.",
    ),
]
CompareEngineOpt = Annotated[
    Engine,
    option(
        "--engine",
        help="local: Polars on this machine; ray: Ray Data reads the dump (needs advcli[ray], "
        "Parquet inputs) and this machine makes the report; with --by, one Ray task "
        "compares each part (a file, or a value of the column).",
    ),
]
AddressOpt = Annotated[
    str | None,
    option("--address", help="Ray cluster address (e.g. auto) [default: a new local one]."),
]
DropDuplicatesOpt = Annotated[
    bool,
    option(
        "--drop-duplicates",
        help="Count each set of identical rows (a trainer's padding copies) once in the "
        "statistics [default: every row counts, as the trainer counted it].",
    ),
]
ThreadsOpt = Annotated[
    int | None,
    option(
        "--threads",
        min=1,
        max=MAX_THREADS,
        help="Threads for Polars and Arrow [default: all cores].",
    ),
]
ConfigOpt = Annotated[
    Path | None,
    option(
        "--config",
        is_eager=True,
        callback=read_config,
        show_default=False,
        help="TOML file of saved options [default: ./advcli.toml, else the [tool.advcli] table "
        "of ./pyproject.toml]. Keys are the long option names without dashes: "
        f"{', '.join(SAVED_KEYS)}; each command takes those it has, and a [compute], [compare], "
        "[inspect], [audit] or [watch] table overrides them for that command. Options on "
        "the command line win.",
    ),
]


FailAboveOpt = Annotated[
    float | None,
    option(
        "--fail-above",
        help="Exit 3 when the largest per-trajectory |advantage difference| (the report's "
        "advantage_diff_max, one trajectory's) exceeds this.",
    ),
]


class FailOn(str, Enum):
    MATERIAL = "material"
    SEVERE = "severe"


FailOnOpt = Annotated[
    FailOn | None,
    option(
        "--fail-on",
        help="Exit 3 when the assessment's level reaches this one (with --by: the whole run's "
        "or any step's).",
    ),
]


def _shared(name: str, annotation: object, default: object = None) -> inspect.Parameter:
    return inspect.Parameter(
        name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=annotation
    )


# The options the reading commands share and read only through dump_settings (ctx.params): a
# command takes them by with_options, so that its own signature lists what it reads itself.
COLUMN_OPTIONS = (
    _shared("group_col", GroupCol),
    _shared("group_size", GroupSize),
    _shared("traj_col", TrajCol),
    _shared("turn_col", TurnCol),
    _shared("reward_col", RewardCol),
    _shared("mask_col", MaskCol),
    _shared("anchor_col", AnchorCol),
)
STEP_COLUMN_OPTIONS = (
    _shared("step_reward_col", StepRewardCol),
    _shared("step_return_col", StepReturnCol),
)
LEVEL_OPTION = _shared("level", LevelOpt, DEFAULTS.level)
SETTING_OPTIONS = (
    _shared("estimator", EstimatorOpt, DEFAULTS.estimator),
    _shared("epsilon", EpsilonOpt, DEFAULTS.epsilon),
    _shared("traj_score", TrajScoreOpt),
    _shared("scale", ScaleOpt),
    _shared("singleton", SingletonOpt, DEFAULTS.singleton),
    _shared("std", StdOpt),
    _shared("recipe", RecipeOpt),
    _shared("reward_mode", RewardModeOpt, RewardMode.OUTCOME),
    _shared("step_groups", StepGroupsOpt),
    _shared("gamma", GammaOpt),
    _shared("step_weight", StepWeightOpt),
    _shared("gigpo_norm", GigpoNormOpt),
    _shared("anchor_scope", AnchorScopeOpt),
)

CommandT = TypeVar("CommandT", bound=Callable[..., Any])


def with_options(*shared: inspect.Parameter) -> Callable[[CommandT], CommandT]:
    """Add the ``shared`` options to a command: Typer reads them from its signature, after the
    command's own, and they reach the command only through ``ctx.params``
    (:func:`dump_settings`), not as its arguments."""

    def add(command: CommandT) -> CommandT:
        own = inspect.signature(command, eval_str=True)
        names = {parameter.name for parameter in shared}

        @functools.wraps(command)
        def with_shared(*args: Any, **kwargs: Any) -> Any:
            return command(*args, **{k: v for k, v in kwargs.items() if k not in names})

        parameters = [*own.parameters.values(), *shared]
        with_shared.__signature__ = own.replace(parameters=parameters)  # type: ignore[attr-defined]
        # Typer and the saved options read each option's type from the annotations.
        with_shared.__annotations__ = {p.name: p.annotation for p in parameters}
        return cast(CommandT, with_shared)

    return add


class DumpSettings(NamedTuple):
    """What a reading command's options say: which columns play which role, and how the
    advantages are computed."""

    names: ColumnNames
    config: AdvantageConfig


def dump_settings(ctx: typer.Context) -> DumpSettings:
    """The settings of a reading command, from the options above as the command declares them.

    Typer keeps every option's value in ``ctx.params`` under its parameter name, the setting's
    own (:data:`advcli.settings.resolve.SETTING_NAMES`): the options given, typed or saved, are
    resolved as every face's settings are. An option a command does not have (compare's
    --level, inspect's estimator options) is not given.
    """
    given = {name: ctx.params[name] for name in SETTING_NAMES if _given(ctx, name)}
    if "recipe" in given and not _saved(ctx, "recipe"):
        for name in recipe_sets(Recipe(given["recipe"])):
            if name in given and _saved(ctx, name):
                del given[name]
    names = _column_names(ctx)
    if "gamma" in given and names.step_return is not None:
        gamma = f"'gamma' in {ctx.params['config_path']}" if _saved(ctx, "gamma") else "--gamma"
        returns = names.named_in.get("step_return", "--step-return-col")
        raise SettingsError(
            f"{gamma} discounts step rewards, and {returns} names returns discounted already "
            f"('{names.step_return}'): give one of the two (a step reward column for rewards)"
        )
    try:
        return DumpSettings(names, resolve_config(given, OPTION_WORDS))
    except SettingsError as error:
        raise SettingsError(_saved_named(ctx, str(error), given)) from None


def _saved_named(ctx: typer.Context, message: str, given: Mapping[str, Any]) -> str:
    """``message``, saying where each option it names came from when it was saved, not typed
    (a message that names ``--level`` blames a flag the user may never have typed)."""
    saved = [
        option
        for name in given
        if _saved(ctx, name) and (option := OPTION_WORDS.name(name)) in message
    ]
    if not saved:
        return message
    where = ", ".join(f"{option} is '{option.removeprefix('--')}'" for option in saved)
    return f"{message} ({where} in {ctx.params['config_path']})"


def _given(ctx: typer.Context, parameter: str) -> bool:
    """Whether ``parameter`` was given, on the command line or in the saved options."""
    source = ctx.get_parameter_source(parameter)
    return source is not None and source.name in ("COMMANDLINE", "DEFAULT_MAP", "ENVIRONMENT")


def _column_names(ctx: typer.Context) -> ColumnNames:
    """The column options, each role saying where it was named when the saved mapping named it
    (inspect's reasons then name the file and key, not the option)."""
    given = ctx.params
    saved = {
        role: f"'{option.removeprefix('--')}' in {given['config_path']}"
        for role, parameter, option in (
            ("group", "group_col", "--group-col"),
            ("trajectory", "traj_col", "--traj-col"),
            ("turn", "turn_col", "--turn-col"),
            ("reward", "reward_col", "--reward-col"),
            ("mask", "mask_col", "--mask-col"),
            ("anchor", "anchor_col", "--anchor-col"),
            ("step_reward", "step_reward_col", "--step-reward-col"),
            ("step_return", "step_return_col", "--step-return-col"),
        )
        if _saved(ctx, parameter)
    }
    group, group_size = given["group_col"], given["group_size"]
    # --group-col and --group-size exclude each other: the one typed wins over the one saved.
    if group is not None and group_size is not None:
        if _saved(ctx, "group_col") and not _saved(ctx, "group_size"):
            group = None
            saved.pop("group", None)
        elif _saved(ctx, "group_size") and not _saved(ctx, "group_col"):
            group_size = None
    return ColumnNames(
        group,
        given["traj_col"],
        given["turn_col"],
        given["reward_col"],
        given["mask_col"],
        group_size,
        anchor=given.get("anchor_col"),
        step_reward=given.get("step_reward_col"),
        step_return=given.get("step_return_col"),
        named_in=saved,
    )


def _saved(ctx: typer.Context, parameter: str) -> bool:
    """Whether ``parameter``'s value came from the saved mapping."""
    source = ctx.get_parameter_source(parameter)
    return source is not None and source.name == "DEFAULT_MAP"


def check_fail_above(fail_above: float | None, settings: DumpSettings) -> None:
    """Refuse a ``--fail-above`` that is no bound, or that the report in force has no figure for."""
    if fail_above is not None and not (math.isfinite(fail_above) and fail_above >= 0):
        # A difference in absolute value is never below 0: a negative bound would trip always.
        raise typer.BadParameter("must be a finite number, 0 or more", param_hint="'--fail-above'")
    if fail_above is not None and settings.config.per_turn is not None:
        raise UsageError(
            "--fail-above reads the outcome report's largest advantage difference; under "
            "--reward-mode per-turn pass --fail-on (the level of advcli's --step-groups)"
        )
