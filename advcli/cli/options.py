"""The options several commands share, as ``Annotated`` types so that each command's signature
is one line per option, and the one function that turns a reading command's options into the
library's settings."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, NamedTuple, TypeVar

import typer

from advcli.cli.saved_options import read_config
from advcli.settings import (
    AdvantageConfig,
    ColumnNames,
    Engine,
    Estimator,
    Level,
    Scale,
    Singleton,
    TrajScore,
)

# More threads than this only cost memory on any machine advcli runs on.
MAX_THREADS = 1024

# Option defaults are the settings' own.
DEFAULTS = AdvantageConfig()

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
GroupCol = Annotated[
    str | None, typer.Option("--group-col", help=f"Group column {DIALECT_DEFAULT}.")
]
GroupSize = Annotated[
    int | None,
    typer.Option(
        "--group-size",
        min=1,
        help="For dumps with no group id (TRL, OpenRLHF): each block of this many consecutive "
        "rows is a group.",
    ),
]
TrajCol = Annotated[
    str | None, typer.Option("--traj-col", help=f"Trajectory column {DIALECT_DEFAULT}.")
]
TurnCol = Annotated[
    str | None,
    typer.Option("--turn-col", help=f"Turn-order column {DIALECT_DEFAULT}."),
]
RewardCol = Annotated[
    str | None,
    typer.Option(
        "--reward-col",
        help=f"Reward column: a list of token rewards (summed) or a scalar {DIALECT_DEFAULT}.",
    ),
]
MaskCol = Annotated[
    str | None,
    typer.Option(
        "--mask-col",
        help=f"Response mask (list of 0/1) or response length (int) {DIALECT_DEFAULT}.",
    ),
]
LevelOpt = Annotated[
    Level, typer.Option("--level", help="Which unit counts once in its group's statistics.")
]
EstimatorOpt = Annotated[Estimator, typer.Option("--estimator", help="Advantage estimator.")]
EpsilonOpt = Annotated[float, typer.Option("--epsilon", min=0.0, help="Added to the group std.")]
TrajScoreOpt = Annotated[
    TrajScore | None,
    typer.Option(
        "--traj-score",
        help="Rule for a trajectory whose rows carry different scores [default: error].",
    ),
]
ScaleOpt = Annotated[
    Scale | None,
    typer.Option(
        "--scale", help="grpo/grpo_passk divisor: group std, batch std or none [default: group]."
    ),
]
SingletonOpt = Annotated[
    Singleton,
    typer.Option("--singleton", help="A single-unit group keeps its raw score, or gets 0."),
]


EngineOpt = Annotated[
    Engine,
    typer.Option(
        "--engine",
        help="local: Polars on this machine; ray: Ray Data (needs advcli[ray]), writing a "
        "Parquet dataset folder.",
    ),
]
CompareEngineOpt = Annotated[
    Engine,
    typer.Option(
        "--engine",
        help="local: Polars on this machine; ray: Ray Data reads the dump (needs advcli[ray], "
        "Parquet inputs) and this machine makes the report.",
    ),
]
AddressOpt = Annotated[
    str | None,
    typer.Option("--address", help="Ray cluster address (e.g. auto) [default: a new local one]."),
]
DropDuplicatesOpt = Annotated[
    bool,
    typer.Option(
        "--drop-duplicates",
        help="Count each set of identical rows (a trainer's padding copies) once in the "
        "statistics [default: every row counts, as the trainer counted it].",
    ),
]
ThreadsOpt = Annotated[
    int | None,
    typer.Option(
        "--threads",
        min=1,
        max=MAX_THREADS,
        help="Threads for Polars and Arrow [default: all cores].",
    ),
]
ConfigOpt = Annotated[
    Path | None,
    typer.Option(
        "--config",
        is_eager=True,
        callback=read_config,
        show_default=False,
        help="TOML file of saved options [default: ./advcli.toml, else the [tool.advcli] table "
        "of ./pyproject.toml]. Keys are the long option names without dashes: group-col, "
        "group-size, traj-col, turn-col, reward-col, mask-col, level, estimator, epsilon, "
        "traj-score, scale, singleton, loss-weight, loss-scale-factor, no-tokens, top, by, "
        "drop-duplicates, "
        "fail-above, fail-on, engine, address, threads; each command takes those it has, and a "
        "[compute], [compare] or [inspect] table overrides them for that command. Options on "
        "the command line win.",
    ),
]


class DumpSettings(NamedTuple):
    """What a reading command's options say: which columns play which role, and how the
    advantages are computed."""

    names: ColumnNames
    config: AdvantageConfig


Choice = TypeVar("Choice", TrajScore, Scale)


def dump_settings(ctx: typer.Context) -> DumpSettings:
    """The settings of a reading command, from the options above as the command declares them.

    Typer keeps every option's value in ``ctx.params`` under its parameter name, so the settings
    are built here, the same way for every command. An option a command does not have (compare's
    --level, inspect's estimator options) leaves the settings' default. Each choice is made its
    settings type again because older Typer releases keep a choice's text there.
    """
    given = ctx.params
    config = AdvantageConfig(
        level=Level(given.get("level", DEFAULTS.level)),
        estimator=Estimator(given.get("estimator", DEFAULTS.estimator)),
        epsilon=given.get("epsilon", DEFAULTS.epsilon),
        traj_score=_chosen(TrajScore, given.get("traj_score")),
        scale=_chosen(Scale, given.get("scale")),
        singleton=Singleton(given.get("singleton", DEFAULTS.singleton)),
    )
    return DumpSettings(_column_names(ctx), config)


def _chosen(choice: type[Choice], value: object) -> Choice | None:
    return None if value is None else choice(value)


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
        named_in=saved,
    )


def _saved(ctx: typer.Context, parameter: str) -> bool:
    """Whether ``parameter``'s value came from the saved mapping."""
    source = ctx.get_parameter_source(parameter)
    return source is not None and source.name == "DEFAULT_MAP"
