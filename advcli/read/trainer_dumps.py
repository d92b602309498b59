"""Trainers' own dumps, the files a trainer writes as it trains (not its batch, which
:func:`advcli.dump.write_batch` writes), read in advcli's layout with no options.

Such a file names no role as a batch does: verl's ``trainer.rollout_data_dir`` file keeps a
row's group, session and output index in one key, or keeps no group id at all. Each layout is a
:class:`TrainerDump`: the columns it makes from the fields the trainer wrote (Polars expressions
over the scan, so they stream as the file's own columns do and never reach an output), the role
each column plays (a :class:`~advcli.read.file_roles.FileRoles`, as a file advcli wrote names
them), the rules a row must keep for those columns to mean what they say, and the trainer's own
rule for a trajectory's score where its rows differ. :func:`trainer_dump_of` tells the layout
from a file's fields.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import polars as pl

from advcli.errors import AdvcliError
from advcli.read.dialects import dialect_of
from advcli.read.file_roles import TRAINING_STEP, FileRoles
from advcli.settings.config import TrajScore

if TYPE_CHECKING:
    from advcli.read.columns import ColumnRoles

# verl's v1 trainer keys each output "{prompt uuid}_{session}_{output index}" and splits the key
# with rsplit("_", 2): the uuid is everything before the last two underscores.
_VERL_KEY = r"^(.*)_([^_]*)_([0-9]+)$"
_VERL_FIELDS = frozenset(("input", "output", "score"))
_VERL_SOURCE = "verl's trainer.rollout_data_dir dump"
# open-instruct's --save_traces records (open_instruct/rl_utils.py, RolloutRecord).
_OPEN_INSTRUCT_FIELDS = frozenset(
    ("step", "sample_idx", "prompt_idx", "response_tokens", "reward", "advantage")
)
# What prime-rl's effective/ files hold (orchestrator/train_sink.py, metrics.py).
_EFFECTIVE = (
    "these are the traces prime-rl trained on (effective/): it leaves out those whose "
    "advantages are all zero (train.filter_zero_advantages), so a group's statistics here are "
    "over the traces left, not every rollout of its prompt; the all/ file holds every one"
)
# The names of a trainer's step files among other files of its folder, which a folder read
# takes alone: NeMo-RL's log folder also holds val_data_step{N}.jsonl (validation, not a
# training batch) and other logs.
STEP_FILE_NAMES = {
    "NeMo-RL train_data_step{N}.jsonl": re.compile(r"(?:.*/)?train_data_step\d+\.jsonl"),
    # open-instruct's folder: each run's shards beside its {run}_metadata.jsonl.
    "open-instruct {run}_rollouts_{shard}.jsonl": re.compile(r"(?:.*/)?[^/]+_rollouts_\d+\.jsonl"),
    # prime-rl's rollouts/: each step's training episodes, all of them (all/) and those it
    # trained on (effective/), and its evaluations (eval/): a folder read takes all/.
    "prime-rl step_{N}/train/all/traces.jsonl": re.compile(
        r"(?:.*/)?step_\d+/train/all/traces\.jsonl"
    ),
}
# rLLM's episode files as advcli.read.containers translates them, a row a step.
_RLLM_FIELDS = frozenset(
    ("episode_id", "trajectories.name", "trajectories.uid", "trajectories.reward", "steps:index")
)
# slime's rollout dump as advcli.read.containers translates it, a row a sample.
_SLIME_FIELDS = frozenset(
    ("rollout_data.rollout_id", "group_index", "reward", "response_length", "loss_mask")
)
# SkyRL's training input pickle as advcli.read.containers translates it, a row a batch row.
_SKYRL_FIELDS = frozenset(
    (
        "global_step",
        "policy_prompt_boundaries",
        "loss_mask:tokens",
        "advantages:first",
        "pad_size:padding",
    )
)
# NeMo-RL's train_data_step{N}.jsonl (nemo_rl/algorithms/grpo.py, Logger.log_batched_dict_as_jsonl).
_NEMO_RL_FIELDS = frozenset(("token_ids", "token_loss_mask", "rewards", "idx"))


@dataclass(frozen=True)
class TrainerDump:
    """How one trainer's own dump is read in advcli's layout.

    ``made`` names the columns :meth:`columns` adds to every row, from the file's columns
    ``made_from`` (an id's from the one in its place: :meth:`stored`); ``roles`` gives each
    its role, and the file's own columns theirs (its score, its training step).
    ``traj_score`` is the trainer's rule for a trajectory whose rows' scores differ,
    ``traj_score_why`` that rule in words."""

    trainer: str
    layout: str
    roles: FileRoles
    made: tuple[str, ...]
    made_from: tuple[str, ...]
    traj_score: TrajScore | None = None
    traj_score_why: str = ""
    # The trainer keeps a whole trajectory in a row: with no trajectory column each row is one.
    rows_are_trajectories: bool = False
    # What the reading says of every such dump.
    notes: tuple[str, ...] = ()
    # A made column that flags the rows the trainer leaves out of its groups, and what they are.
    left_out: str | None = None
    left_out_label: str = ""
    # The groups are blocks of consecutive rows of one value of this column, as many rows as
    # every run of one value is a multiple of (TRL's num_generations, which it does not write).
    blocks_of: str | None = None
    # Each file holds many training steps, told by a column (open-instruct's shards): a file
    # is no step.
    steps_in_rows: bool = False
    # The column of the advantage the trainer computed for each row (made or the file's own),
    # and what it holds; None where the dump has none.
    advantage: str | None = None
    advantage_why: str = ""
    # Why the dump holds no rewards and how to keep them, where the trainer removed them (its
    # reward column is then made all null); None where it holds them.
    reward_removed: str | None = None
    # The column naming the trainer's file each row came from, which an error on a row names
    # (a translation's rows are no file's lines).
    row_source: str | None = None

    def columns(self) -> list[pl.Expr]:
        """The made columns, as expressions over the file's columns."""
        raise NotImplementedError

    def row_rules(self) -> list[tuple[pl.Expr, str]]:
        """(broken, message) for each rule a row of the file must keep, checked before the
        rules of the roles' columns."""
        return []

    def notes_on(self, groups: pl.Series) -> tuple[str, ...]:
        """What the reading says of the groups it found (``groups``: each row's group key)."""
        return ()

    def block_values(self) -> list[pl.Expr]:
        """What :meth:`group_size` reads of every row: ``key``, the hash of ``blocks_of``."""
        assert self.blocks_of is not None
        return [pl.col(self.blocks_of).hash().alias("key")]

    def group_size(self, values: pl.DataFrame, where: str) -> tuple[int, str]:
        """The size of the groups made of blocks of rows of one ``blocks_of`` value, and why:
        the length every run of one value is a multiple of (an error where that is 1)."""
        runs = values["key"].rle().struct.field("len")
        size = math.gcd(*runs.to_list())
        column = self.blocks_of
        if size < 2:
            lengths = ", ".join(str(length) for length in runs.unique(maintain_order=True).head(5))
            raise AdvcliError(
                f"{where}: the runs of rows of one '{column}' are {lengths} rows long, with no "
                f"common length over 1: {self.trainer}'s groups are blocks of rows of one "
                f"'{column}', as many as its group size; pass --group-size"
            )
        return size, (
            f"blocks of {size} consecutive rows of one '{column}' (every run of rows of one "
            f"'{column}' is a multiple of {size} rows)"
        )

    def keys_taken(self, roles: ColumnRoles) -> bool:
        """Whether ``roles`` read the ids as this dump's reading does (not as options name
        them otherwise)."""
        return all(
            getattr(roles, role) == self.roles.column(role)
            for role in ("group", "trajectory", "turn")
        )

    def stored(self, name: str) -> str:
        """The file's column a column of the reading is read from (itself, where not made)."""
        if name in self.made:
            return self.made_from[self.made.index(name)]
        return name


@dataclass(frozen=True)
class _VerlKeyedRollouts(TrainerDump):
    """verl's v1 trainer's rollout dump: each row one output, keyed in ``uid``."""

    def columns(self) -> list[pl.Expr]:
        key = pl.col("uid")
        return [
            key.str.extract(_VERL_KEY, 1).alias(self.made[0]),
            key.str.extract(_VERL_KEY, 2).alias(self.made[1]),
            key.str.extract(_VERL_KEY, 3).cast(pl.Int64, strict=False).alias(self.made[2]),
        ]

    def row_rules(self) -> list[tuple[pl.Expr, str]]:
        key = pl.col("uid")
        return [
            (key.is_null(), "column 'uid' is null"),
            (
                ~key.str.contains(_VERL_KEY) | key.str.extract(_VERL_KEY, 3).str.len_chars().gt(18),
                "column 'uid' is not verl's output key '{prompt uuid}_{session}_{output index}' "
                "(an integer index)",
            ),
        ]


@dataclass(frozen=True)
class _VerlRollouts(TrainerDump):
    """verl's legacy trainer's rollout dump: each row one trajectory, no ids, rows shuffled."""

    def columns(self) -> list[pl.Expr]:
        return [pl.col("input").hash().alias(self.made[0])]

    def row_rules(self) -> list[tuple[pl.Expr, str]]:
        return [(pl.col("input").is_null(), "column 'input' is null")]

    def notes_on(self, groups: pl.Series) -> tuple[str, ...]:
        sizes = groups.value_counts(name="rows").get_column("rows").value_counts(name="groups")
        if sizes.height < 2:
            return ()
        listed = ", ".join(
            f"{row['groups']:,} of {row['rows']:,} rows"
            for row in sizes.sort("rows").iter_rows(named=True)
        )
        return (
            f"the groups of one 'input' text differ in size ({listed}): verl's groups are "
            "rollout.n rollouts of one prompt, so a larger group may be two prompts of the same "
            "text, which verl keeps apart by an id this dump does not hold (a rollout it "
            "dropped makes a smaller one)",
        )


@dataclass(frozen=True)
class _NemoRlTrainData(TrainerDump):
    """NeMo-RL's ``train_data_step{N}.jsonl``: each row one trajectory, each field a one-row
    slice of the step's batch (a list of one value), no group id."""

    def columns(self) -> list[pl.Expr]:
        reward, mask, *advantages = (pl.col(name).list.first() for name in self.made_from[1:])
        return [
            _nemo_prompt().hash().alias(self.made[0]),
            reward.alias(self.made[1]),
            mask.alias(self.made[2]),
            # The row's advantage is on every token (its prompt's too): the first one.
            *(values.list.first().alias(self.made[3]) for values in advantages),
        ]

    def row_rules(self) -> list[tuple[pl.Expr, str]]:
        rules = [
            (
                pl.col(name).list.len() != 1,
                f"column '{name}' is not a list of one value, as NeMo-RL writes each field of "
                "a row",
            )
            for name in dict.fromkeys(self.made_from)
        ]
        generated = pl.col("token_loss_mask").list.first().list.max()
        rules.append(
            (
                generated.is_null() | (generated < 1),
                "column 'token_loss_mask' marks no generated token, so the prompt that groups "
                "the row (its tokens before the first generated one) cannot be told",
            )
        )
        return rules


@dataclass(frozen=True)
class _TrlCompletions(TrainerDump):
    """TRL's ``completions_{step}.parquet``: each row one completion, a reward column per reward
    function (NaN where it gave none), no group id."""

    def stored(self, name: str) -> str:
        # Both made columns are read from every reward column.
        return ", ".join(self.made_from) if name in self.made else name

    def columns(self) -> list[pl.Expr]:
        # TRL sums the reward functions' values with nansum (its reward_weights default to 1);
        # a completion none of them scored has no score, and TRL leaves it out (left_out).
        known = [
            pl.when(pl.col(name).is_nan()).then(None).otherwise(pl.col(name))
            for name in self.made_from
        ]
        unscored = pl.all_horizontal(value.is_null() for value in known)
        return [
            pl.when(unscored).then(None).otherwise(pl.sum_horizontal(known)).alias(self.made[0]),
            unscored.alias(self.made[1]),
        ]

    def block_values(self) -> list[pl.Expr]:
        return [*super().block_values(), pl.col(self.made[0]).alias("reward"), pl.col("advantage")]

    def group_size(self, values: pl.DataFrame, where: str) -> tuple[int, str]:
        """The runs' common length, or where a prompt was drawn twice in a row in every run
        (which TRL's groups, blocks of num_generations rows, do not show), the one of its
        divisors at which TRL's own 'advantage' column is what TRL's formula gives."""
        longest, why = super().group_size(values, where)
        rewards, trainers = values["reward"].to_numpy(), values["advantage"].to_numpy()
        sizes = [size for size in range(2, longest + 1) if longest % size == 0]
        fitting = [size for size in sizes if _trl_fits(rewards, trainers, size)]
        if len(fitting) == 1 and fitting[0] != longest:
            return fitting[0], (
                f"blocks of {fitting[0]} consecutive rows of one 'prompt', the size at which "
                f"TRL's own 'advantage' column is its formula's (every run of rows of one "
                f"'prompt' is a multiple of {longest}: a prompt drawn twice in a row)"
            )
        if not fitting:
            why += (
                ", though TRL's own 'advantage' column fits no such block size (its "
                "scale_rewards or multi_objective_aggregation is not one advcli knows)"
            )
        return longest, why


@dataclass(frozen=True)
class _OpenInstructRollouts(TrainerDump):
    """open-instruct's ``{run}_rollouts_{shard}.jsonl``: each row one sample, its group the
    position of its prompt in its step's batch."""

    def columns(self) -> list[pl.Expr]:
        return [
            pl.concat_str(pl.col("step"), pl.col("prompt_idx"), separator=":").alias(self.made[0]),
            pl.col("response_tokens").list.len().alias(self.made[1]),
        ]

    def row_rules(self) -> list[tuple[pl.Expr, str]]:
        return [
            (pl.col(name).is_null(), f"column '{name}' is null")
            for name in ("step", "prompt_idx", "response_tokens")
        ]


@dataclass(frozen=True)
class _PrimeRlEpisodes(TrainerDump):
    """prime-rl's ``traces.jsonl``: each line one verifiers Episode, its one trace (an agent's
    run) the trajectory, its group ``group.id``. ``rewards``: the names of its traces'
    rewards."""

    rewards: tuple[str, ...] = ()

    def columns(self) -> list[pl.Expr]:
        trace = pl.col("traces").list.first()
        rewards = trace.struct.field("rewards")
        # A trace's reward is the sum of score x weight over its rewards that are not null.
        reward = pl.sum_horizontal(
            rewards.struct.field(name).struct.field("score")
            * rewards.struct.field(name).struct.field("weight")
            for name in self.rewards
        )
        sampled = pl.element().struct.field("mask").list.sum()
        tokens = trace.struct.field("nodes").list.eval(sampled).list.sum().fill_null(0)
        # prime-rl's GRPO counts the traces without errors, of a trainable agent, with a token
        # to train on: the others are in no group's statistics and get no advantage.
        counted = (
            trace.struct.field("ok")
            & trace.struct.field("agent").struct.field("trainable")
            & (tokens > 0)
        ).fill_null(False)
        one_trace = pl.col("traces").list.len() == 1
        columns = [
            pl.col("group").struct.field("id").alias("group.id"),
            reward.alias("traces:reward"),
            tokens.cast(pl.Int64).alias("traces:tokens"),
            (pl.col("traces").list.len().le(1) & ~(one_trace & counted)).alias("traces:left_out"),
        ]
        if "traces:advantage" in self.made:
            info = trace.struct.field("info")
            columns.append(info.struct.field("advantage").alias("traces:advantage"))
        if "run.work.step" in self.made:
            work = pl.col("run").struct.field("work")
            columns.append(work.struct.field("step").alias("run.work.step"))
        return columns

    def row_rules(self) -> list[tuple[pl.Expr, str]]:
        return [
            (
                pl.col("traces").list.len() > 1,
                "the episode holds several traces (several agents' runs), which prime-rl pools "
                "in its group; advcli reads episodes of one trace",
            )
        ]


@dataclass(frozen=True)
class _RllmSteps(TrainerDump):
    """rLLM's episode files, translated into a row for each step of each trajectory
    (:mod:`advcli.read.containers`): its group ``{task id}:{trajectory name}``."""

    def columns(self) -> list[pl.Expr]:
        # rLLM's task id is the part of the episode id before its first ':' (Episode.task_id).
        task = pl.col("episode_id").str.split(":").list.first()
        return [
            pl.concat_str(task, pl.lit(":"), pl.col("trajectories.name")).alias(self.made[0]),
            pl.coalesce("trajectories.reward", "steps.reward").alias(self.made[1]),
            pl.col("steps:index").is_null().alias(self.made[2]),
        ]

    def row_rules(self) -> list[tuple[pl.Expr, str]]:
        counted = pl.col("steps:index").is_not_null()
        unrewarded = pl.col("trajectories.reward").is_null()
        group = pl.col(self.made[0])
        return [
            (
                unrewarded.filter(counted).any().over(group)
                & unrewarded.not_().filter(counted).any().over(group),
                "the trajectories of its group ('episode_id' task and 'trajectories.name') have "
                "a reward and no reward (null) both, which rLLM's transform refuses: it scores a "
                "group by its trajectories' rewards, or where none has one, their last steps'",
            )
        ]


@dataclass(frozen=True)
class _SlimeSamples(TrainerDump):
    """slime's rollout dump, translated into a row a sample (:mod:`advcli.read.containers`):
    its group ``group_index``."""

    def columns(self) -> list[pl.Expr]:
        # A sample without a loss mask trains on its whole response (slime fills it with ones);
        # a removed one on none of it (slime zeroes its mask, and keeps it in its group).
        length = pl.col("response_length")
        filled = pl.coalesce(pl.col("loss_mask"), pl.lit(1, dtype=pl.Int64).repeat_by(length))
        removed = pl.col("remove_sample").fill_null(False)
        zeros = pl.lit(0, dtype=pl.Int64).repeat_by(length)
        return [pl.when(removed).then(zeros).otherwise(filled).alias(self.made[0])]

    def row_rules(self) -> list[tuple[pl.Expr, str]]:
        return [
            (pl.col("response_length").is_null(), "column 'response_length' is null"),
            (
                pl.col("loss_mask").list.len() != pl.col("response_length"),
                "'loss_mask' is not 'response_length' long, as slime writes it",
            ),
        ]

    def notes_on(self, groups: pl.Series) -> tuple[str, ...]:
        sizes = groups.value_counts(name="rows").get_column("rows").unique()
        if sizes.len() < 2:
            return ()
        return (
            f"the groups differ in size ({', '.join(map(str, sizes.sort().to_list()))} "
            "samples): slime normalizes a step's rewards as one group, not per prompt, when "
            "its samples are not n_samples_per_prompt x rollout_batch_size "
            "(RolloutManager._post_process_rewards), so its own advantages were over the "
            "whole step",
        )


@dataclass(frozen=True)
class _SkyrlTrainingInput(TrainerDump):
    """SkyRL's pickled training input, translated into a row a batch row
    (:mod:`advcli.read.containers`): its groups the prompt ranges of its metadata, its rewards
    removed before the dump."""

    def columns(self) -> list[pl.Expr]:
        # A step's ranges are numbered from 0: its groups are (step, range).
        group = pl.concat_str("global_step", "policy_prompt_boundaries", separator=":")
        return [group.alias(self.made[0]), pl.lit(None, dtype=pl.Float64).alias(self.made[1])]


def _trl_fits(rewards: np.ndarray, trainers: np.ndarray, size: int) -> bool:
    """Whether TRL's advantages over blocks of ``size`` rows (sum_then_normalize: the
    group's mean; divided by its Bessel std + 1e-4, the batch's, or nothing) are ``trainers``,
    to the float32 TRL computes in. An unscored completion (NaN) is left out of each statistic
    and gets 0, as TRL's nanmean, nanstd and nan_to_num do (a group of one scored completion
    has no std: 0 too)."""
    blocks = rewards.reshape(-1, size)
    with warnings.catch_warnings():
        # A block (or batch) of no or one scored completion: NaN, which TRL makes 0.
        warnings.simplefilter("ignore", RuntimeWarning)
        centred = (blocks - np.nanmean(blocks, axis=1, keepdims=True)).ravel()
        group_std = np.repeat(np.nanstd(blocks, axis=1, ddof=1), size)
        batch_std = np.nanstd(rewards, ddof=1)
        candidates = (centred / (group_std + 1e-4), centred / (batch_std + 1e-4), centred)
    return any(
        np.allclose(np.nan_to_num(advantages, nan=0.0), trainers, rtol=1e-4, atol=1e-5)
        for advantages in candidates
    )


def _nemo_prompt() -> pl.Expr:
    """A row's prompt as NeMo-RL groups by it: its token ids before the first generated one
    (the first 1 of its loss mask)."""
    mask = pl.col("token_loss_mask").list.first()
    return pl.col("token_ids").list.first().list.head(mask.list.arg_max())


def trainer_dump_of(schema: pl.Schema, label: str) -> TrainerDump | None:
    """The trainer's dump a file with ``schema`` is (``label`` names it in errors), None for
    one that is not a trainer's own: a batch, advcli's step files, any other table."""
    if _is_prime_rl(schema):
        return _checked(_prime_rl_episodes(schema, label), schema, label)
    if set(schema.names()) >= _OPEN_INSTRUCT_FIELDS:
        for name in ("step", "prompt_idx"):
            if not schema[name].is_integer():
                raise AdvcliError(
                    f"{label}: column '{name}' holds {schema[name]}, where open-instruct writes "
                    "integers: its groups are (step, prompt_idx)"
                )
        return _checked(_open_instruct_rollouts(), schema, label)
    trl = _trl_completions(schema, label)
    if trl is not None:
        return _checked(trl, schema, label)
    if set(schema.names()) >= _NEMO_RL_FIELDS and all(
        isinstance(schema[name], pl.List) for name in _NEMO_RL_FIELDS - {"idx"}
    ):
        return _checked(_nemo_rl_train_data(schema), schema, label)
    if set(schema.names()) >= _RLLM_FIELDS:
        return _checked(_rllm_steps(schema), schema, label)
    if set(schema.names()) >= _SKYRL_FIELDS:
        return _checked(_skyrl_training_input(), schema, label)
    if set(schema.names()) >= _SLIME_FIELDS:
        return _checked(_slime_samples(schema), schema, label)
    dialect, tie = dialect_of(schema)
    if not set(schema.names()) >= _VERL_FIELDS or tie is not None:
        return None
    if dialect is not None and dialect.trainer != "verl":
        return None  # some trainer's batch that also holds decoded text
    if "uid" in schema and schema["uid"] != pl.String:
        raise AdvcliError(
            f"{label}: column 'uid' holds {schema['uid']}, where verl's trainer.rollout_data_dir "
            "dump keys each output '{prompt uuid}_{session}_{output index}'; name the roles' "
            "columns with --group-col and --traj-col"
        )
    return _checked(
        _verl_keyed_rollouts(schema) if "uid" in schema else _verl_rollouts(schema), schema, label
    )


def _checked(dump: TrainerDump, schema: pl.Schema, label: str) -> TrainerDump:
    """``dump``, where no column of the file has the name of one its reading makes."""
    clash = next((name for name in dump.made if name in schema), None)
    if clash is not None:
        raise AdvcliError(
            f"{label}: a column is named '{clash}', the name advcli gives a column it reads "
            f"from '{dump.stored(clash)}' in {dump.layout}; rename it"
        )
    return dump


def _step(schema: pl.Schema) -> tuple[tuple[str, str], ...]:
    return (("step", TRAINING_STEP),) if "step" in schema else ()


def _verl_keyed_rollouts(schema: pl.Schema) -> TrainerDump:
    layout = "verl's trainer.rollout_data_dir dump of the v1 trainer (each output keyed in 'uid')"
    made = ("uid:prompt", "uid:session", "uid:output")
    roles = FileRoles(
        (
            *zip(made, ("group", "trajectory", "turn"), strict=True),
            ("score", "reward"),
            *_step(schema),
        ),
        written_by="verl",
        trainer="verl",
        source=_VERL_SOURCE,
        why=(
            ("group", "the prompt uuid, the part of 'uid' before its last two '_'"),
            ("trajectory", "the session, the part of 'uid' between its last two '_'"),
            ("turn", "the output index, the part of 'uid' after its last '_'"),
            ("reward", "each output's rm_scores summed"),
        ),
    )
    return _VerlKeyedRollouts(
        "verl",
        layout,
        roles,
        made,
        ("uid", "uid", "uid"),
        TrajScore.LAST,
        "a session's score is its final output's, as verl's v1 GRPO scores it "
        "(compute_advantage_for_multi_trajectories)",
    )


def _verl_rollouts(schema: pl.Schema) -> TrainerDump:
    layout = "verl's trainer.rollout_data_dir dump (no ids: each row a trajectory)"
    made = ("input:hash",)
    roles = FileRoles(
        (("input:hash", "group"), ("score", "reward"), *_step(schema)),
        written_by="verl",
        trainer="verl",
        source=_VERL_SOURCE,
        why=(
            (
                "group",
                "the rows of one 'input' text (its hash): the rollouts of one prompt, whose id "
                "the dump does not hold",
            ),
            (
                "trajectory",
                "verl's legacy trainer keeps a whole trajectory in one row: each row is a "
                "trajectory",
            ),
            ("reward", "each row's token_level_scores summed"),
        ),
    )
    return _VerlRollouts("verl", layout, roles, made, ("input",), rows_are_trajectories=True)


def _nemo_rl_train_data(schema: pl.Schema) -> TrainerDump:
    # With dynamic sampling, NeMo-RL writes the reward it trained on as 'filtered_rewards' and
    # 'rewards' as the whole generation batch's.
    reward = "filtered_rewards" if "filtered_rewards" in schema else "rewards"
    # Its advantages, where the file holds them (they are the trainer's, never read).
    advantages = ["advantages"] if "advantages" in schema else []
    made = ("token_ids:prompt", f"{reward}:0", "token_loss_mask:0", *(f"{a}:0" for a in advantages))
    layout = "NeMo-RL's train_data_step{N}.jsonl (no ids: each row a trajectory)"
    roles = FileRoles(
        tuple(zip(made, ("group", "reward", "mask"), strict=False)),
        written_by="NeMo-RL",
        source="NeMo-RL's train data dump",
        why=(
            (
                "group",
                "the rows of one prompt, its 'token_ids' before the first generated token (their "
                "hash), as NeMo-RL groups them",
            ),
            (
                "trajectory",
                "NeMo-RL keeps a whole trajectory in one row (its 'token_loss_mask' covers every "
                "generated turn): each row is a trajectory",
            ),
            ("reward", f"the one value of '{reward}'"),
            ("mask", "the one list of 'token_loss_mask'"),
        ),
    )
    return _NemoRlTrainData(
        "NeMo-RL",
        layout,
        roles,
        made,
        ("token_ids", reward, "token_loss_mask", *advantages),
        rows_are_trajectories=True,
        advantage="advantages:0" if advantages else None,
        advantage_why="the first value of the one list of 'advantages', which NeMo-RL writes on "
        "every token of the row",
    )


def _trl_completions(schema: pl.Schema, label: str) -> TrainerDump | None:
    """TRL's completions file, whose columns are step, prompt, completion, one per reward
    function (and any log_extra columns), advantage, in that order."""
    names = schema.names()
    if names[:3] != ["step", "prompt", "completion"] or names[-1:] != ["advantage"]:
        return None
    between = names[3:-1]
    rewards = tuple(name for name in between if schema[name] in (pl.Float32, pl.Float64))
    if not rewards:
        raise AdvcliError(
            f"{label}: TRL's completions file holds no reward column (a float column between "
            "'completion' and 'advantage'); name the reward with --reward-col"
        )
    listed = ", ".join(f"'{name}'" for name in rewards)
    layout = "TRL's completions_{step}.parquet (no ids: each row a trajectory)"
    roles = FileRoles(
        (("rewards:sum", "reward"), ("step", TRAINING_STEP)),
        written_by="TRL",
        source="TRL's completions file",
        why=(
            (
                "trajectory",
                "TRL keeps a whole completion in one row: each row is a trajectory",
            ),
            (
                "reward",
                f"the sum of {listed} (each float column between 'completion' and 'advantage', "
                "NaN left out as TRL's nansum does, its reward_weights taken as 1; a log_extra "
                "column among them would be summed too: name the reward with --reward-col)",
            ),
        ),
    )
    return _TrlCompletions(
        "TRL",
        layout,
        roles,
        ("rewards:sum", "rewards:unscored"),
        rewards,
        rows_are_trajectories=True,
        left_out="rewards:unscored",
        left_out_label="completions no reward function scored (every reward column NaN or "
        "null), which TRL leaves out of its groups' mean and std with advantage 0",
        blocks_of="prompt",
        advantage="advantage",
        advantage_why="'advantage', the advantage TRL computed for the row",
    )


def _open_instruct_rollouts() -> TrainerDump:
    made = ("step:prompt_idx", "response_tokens:length")
    roles = FileRoles(
        (
            ("step:prompt_idx", "group"),
            ("reward", "reward"),
            ("response_tokens:length", "mask"),
            ("step", TRAINING_STEP),
        ),
        written_by="open-instruct",
        source="open-instruct's rollouts file",
        why=(
            (
                "group",
                "'step' and 'prompt_idx' (the prompt's place in its step's batch, restarted "
                "every step), as open-instruct forms its groups",
            ),
            (
                "trajectory",
                "open-instruct keeps a whole sample in one row: each row is a trajectory",
            ),
            ("reward", "'reward', the verifier's score"),
            ("mask", "the length of 'response_tokens'"),
        ),
    )
    return _OpenInstructRollouts(
        "open-instruct",
        "open-instruct's {run}_rollouts_{shard}.jsonl (each row a trajectory)",
        roles,
        made,
        ("prompt_idx", "response_tokens"),
        rows_are_trajectories=True,
        steps_in_rows=True,
        advantage="advantage",
        advantage_why="'advantage', the advantage open-instruct computed for the row",
    )


def _is_prime_rl(schema: pl.Schema) -> bool:
    """A verifiers Episode a line (prime-rl's monitors/file.py): ids, its group, its traces."""
    if not set(schema.names()) >= {"id", "group", "ok", "traces"}:
        return False
    group, traces = schema["group"], schema["traces"]
    return (
        isinstance(group, pl.Struct)
        and "id" in {field.name for field in group.fields}
        and isinstance(traces, pl.List)
        and isinstance(traces.inner, pl.Struct)
    )


def _struct_fields(dtype: object) -> dict[str, object]:
    """A struct type's fields by name (none for another type, or none at all)."""
    if not isinstance(dtype, pl.Struct):
        return {}
    return {field.name: field.dtype for field in dtype.fields}


def _prime_rl_episodes(schema: pl.Schema, label: str) -> TrainerDump:
    traces_type = schema["traces"]
    assert isinstance(traces_type, pl.List)
    traces = _struct_fields(traces_type.inner)
    rewards = tuple(_struct_fields(traces.get("rewards")))
    for needed in ("ok", "agent", "nodes"):
        if needed not in traces:
            raise AdvcliError(
                f"{label}: prime-rl's traces hold no '{needed}' field here, which advcli reads "
                "to tell the traces prime-rl counts"
            )
    effective = "advantage" in _struct_fields(traces.get("info"))
    stepped = "step" in _struct_fields(_struct_fields(schema.get("run")).get("work"))
    made = (
        "group.id",
        "traces:reward",
        "traces:tokens",
        "traces:left_out",
        *(["traces:advantage"] if effective else []),
        *(["run.work.step"] if stepped else []),
    )
    names = ", ".join(f"'{name}'" for name in rewards) or "none"
    roles = FileRoles(
        (
            ("group.id", "group"),
            ("traces:reward", "reward"),
            ("traces:tokens", "mask"),
            *([("run.work.step", TRAINING_STEP)] if stepped else []),
        ),
        written_by="prime-rl",
        source="prime-rl's traces file",
        why=(
            ("group", "'group.id', the rollout group prime-rl's GRPO normalizes over"),
            (
                "trajectory",
                "each episode's one trace (an agent's run) is a trajectory: each row is one",
            ),
            ("reward", f"the trace's rewards ({names}), score x weight summed, null ones left out"),
            ("mask", "the trace's sampled tokens (its nodes' masks summed)"),
        ),
    )
    return _PrimeRlEpisodes(
        "prime-rl",
        "prime-rl's traces.jsonl (a verifiers Episode a line, each one trace)"
        + (", effective: the traces it trained on" if effective else ""),
        roles,
        made,
        ("group", "traces", "traces", "traces", *(["traces"] if effective else []), "run"),
        rows_are_trajectories=True,
        left_out="traces:left_out",
        left_out_label="traces prime-rl leaves out",
        notes=(
            "prime-rl leaves out of its groups the traces with errors, of an agent not "
            "trainable or with no sampled token, and so does advcli (counted apart)",
            *([_EFFECTIVE] if effective else []),
        ),
        advantage="traces:advantage" if effective else None,
        advantage_why="the trace's 'info.advantage', the advantage prime-rl trained it on",
        rewards=rewards,
    )


def _rllm_steps(schema: pl.Schema) -> TrainerDump:
    made = ("episode_id:group", "rewards:trajectory", "steps:left_out")
    step = (("training_step", TRAINING_STEP),) if "training_step" in schema else ()
    roles = FileRoles(
        (
            ("episode_id:group", "group"),
            ("trajectories.uid", "trajectory"),
            ("steps:index", "turn"),
            ("rewards:trajectory", "reward"),
            *step,
        ),
        written_by="rLLM",
        source="rLLM's episode log",
        why=(
            (
                "group",
                "the episode's task (its 'episode_id' before the first ':') and the trajectory's "
                "'name', as rLLM's transform groups trajectories ('{task_id}:{name}')",
            ),
            ("trajectory", "the trajectory's 'uid'"),
            ("turn", "the step's place in its trajectory's 'steps'"),
            (
                "reward",
                "the trajectory's 'reward', on each of its steps; where it is null, each step's "
                "own 'reward'",
            ),
        ),
    )
    return _RllmSteps(
        "rLLM",
        "rLLM's episodes/{mode}_step_{N}_epoch_{E}/episode_*.json (a row a step)",
        roles,
        made,
        ("episode_id", "trajectories.reward", "steps:index"),
        TrajScore.LAST,
        "a trajectory's score is its reward, or where no trajectory of its group has one, its "
        "last step's reward, as rLLM's transform scores it",
        left_out="steps:left_out",
        left_out_label="trajectories with no step, which rLLM leaves out",
        row_source="episode_file",
        notes=(
            "the episode files are read one folder at a time, each a row a step; rLLM leaves out "
            "of its groups a trajectory with no step, and so does advcli (counted apart)",
        ),
    )


def _slime_samples(schema: pl.Schema) -> TrainerDump:
    roles = FileRoles(
        (
            ("group_index", "group"),
            ("reward", "reward"),
            ("loss_mask:filled", "mask"),
            ("rollout_data.rollout_id", TRAINING_STEP),
        ),
        written_by="slime",
        source="slime's --dump-details dump",
        why=(
            ("group", "'group_index', the prompt's group of n_samples_per_prompt samples"),
            ("trajectory", "slime keeps a whole sample in one row: each row is a trajectory"),
            ("reward", "'reward', the raw reward the rollout scored"),
            (
                "mask",
                "'loss_mask' (ones, as long as the response, where it is null, as slime fills "
                "it; zeros where 'remove_sample', as slime zeroes it)",
            ),
        ),
    )
    return _SlimeSamples(
        "slime",
        "slime's rollout_data/{id}.pt with its train_data/{id}.pt where there is one (a row a "
        "sample)",
        roles,
        ("loss_mask:filled",),
        ("loss_mask",),
        rows_are_trajectories=True,
        notes=(
            "slime counts every sample in its group's statistics, those aborted or removed "
            "('status', 'remove_sample') too, and so does advcli",
        ),
        advantage="train_data.rewards",
        advantage_why="the train file's 'rewards' of the sample (by its 'rollout_position'), "
        "the group-normalized reward slime puts on every response token; null where the step "
        "has no train file",
    )


def _skyrl_training_input() -> TrainerDump:
    roles = FileRoles(
        (
            ("global_step:prompt", "group"),
            ("rewards:removed", "reward"),
            ("loss_mask:tokens", "mask"),
            ("global_step", TRAINING_STEP),
        ),
        written_by="SkyRL",
        source="SkyRL's dumped training input",
        why=(
            (
                "group",
                "the step (the file name's N) and the row's range among its metadata's "
                "'policy_prompt_boundaries', the rows of one prompt (SkyRL's uids, which it "
                "removes before the dump)",
            ),
            (
                "trajectory",
                "each row is a trajectory (a step, in SkyRL's step-wise mode, which the dump "
                "does not tell)",
            ),
            (
                "reward",
                "none, a column of nulls: SkyRL removes 'rewards' from the batch before it "
                "dumps it",
            ),
            ("mask", "the sum of 'loss_mask'"),
        ),
    )
    return _SkyrlTrainingInput(
        "SkyRL",
        "SkyRL's global_step_{N}_training_input.pkl (a row a batch row, no rewards)",
        roles,
        ("global_step:prompt", "rewards:removed"),
        ("policy_prompt_boundaries", "advantages:first"),
        rows_are_trajectories=True,
        left_out="pad_size:padding",
        left_out_label="padding rows SkyRL adds (its metadata's pad_size)",
        notes=(
            "with generator.step_wise_trajectories SkyRL's rows are steps, and it removes the "
            "'is_last_step' flags that end each trajectory before the dump: the dump does not "
            "tell, and each row is read as a trajectory",
        ),
        advantage="advantages:first",
        advantage_why="the row's 'advantages' on its first response token (SkyRL puts a "
        "row's advantage on each of its response tokens)",
        reward_removed=(
            "SkyRL removes the rewards (and the uids and is_last_step flags) from its batch "
            "before trainer.dump_data_batch writes it (RayPPOTrainer.train), so there are no "
            "advantages to compute or compare here; advcli inspect reads its groups, rows and "
            "SkyRL's own advantages. To keep the rewards, write them where "
            "compute_advantages_and_returns still has them (docs/trainers/skyrl.md)"
        ),
    )
