"""The trainers' dialects: each trainer's names for the roles (group, trajectory, turn, reward,
mask) as its batch holds them, which dialect a schema speaks, and the names people give a role by
hand (:func:`named_like`)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

import polars as pl

Role = Literal[
    "group", "trajectory", "turn", "reward", "mask", "anchor", "step_reward", "step_return"
]
ROLES: tuple[Role, ...] = ("group", "trajectory", "turn", "reward", "mask")
# GiGPO's roles, read only for --estimator gigpo.
STEP_ROLES: tuple[Role, ...] = ("anchor", "step_reward", "step_return")
# The option that names each role's column.
OPTIONS: dict[Role, str] = {
    "group": "--group-col",
    "trajectory": "--traj-col",
    "turn": "--turn-col",
    "reward": "--reward-col",
    "mask": "--mask-col",
    "anchor": "--anchor-col",
    "step_reward": "--step-reward-col",
    "step_return": "--step-return-col",
}

VERL_REWARDS = ("token_level_rewards", "token_level_scores")


@dataclass(frozen=True)
class Dialect:
    """One trainer's names for the roles, as its batch holds them.

    A dump speaks a dialect when it has every column of ``signature``. Each role lists the
    trainer's names for it; an empty ``trajectory`` means each row is a whole trajectory (the
    trainer keeps a multi-turn episode in one row), an empty ``group`` that the groups are
    contiguous blocks of rows (``--group-size``).
    """

    trainer: str
    signature: tuple[str, ...]
    group: tuple[str, ...]
    trajectory: tuple[str, ...]
    turn: tuple[str, ...] = ()
    reward: tuple[str, ...] = VERL_REWARDS
    mask: tuple[str, ...] = ("response_mask",)
    # advcli's names that mean something else in this trainer's batch, never read for a role.
    not_read: tuple[str, ...] = ()
    # Columns a dump of this dialect never has: a dump with one speaks another dialect.
    excludes: tuple[str, ...] = ()
    # The trainer's flag of a trajectory's last step (SkyRL's step-wise batches): a trajectory's
    # score is that row's reward, as the trainer's estimator reads it.
    last_step: tuple[str, ...] = ()
    # With no trajectory column: a trajectory is a run of rows ending at a last-step row.
    trajectory_from_last_step: bool = False
    # A trajectory's rows may differ (verl-agent's invalid-action penalty): where no
    # --traj-score is chosen, the trainer's own rule scores them, --traj-score own.
    own_row_scores: bool = False
    # The trainer pads its batch with copies of whole rows, each repeating its row's turn, and
    # repeats a turn no other way (ROLL's batch_adjust_mode copy): rows alike in every key and
    # in reward and mask are such copies, token ids or not.
    copies_repeat_turns: bool = False
    # The ids (a regular expression, matched whole) of the rows a trainer pads its batch with.
    padding_ids: str | None = None
    # Whether a dump that speaks no dialect is looked at for this dialect's outcome names
    # (ROLL's 'step' is as often a training step, its 'traj_id' a name people give by hand).
    names_elsewhere: bool = True
    # GiGPO's roles (STEP_ROLES): the anchor state, a step's reward, its discounted return.
    anchor: tuple[str, ...] = ()
    step_reward: tuple[str, ...] = ()
    step_return: tuple[str, ...] = ()
    # The trainer's reward of each turn (step) on its own, read as the reward under
    # --reward-mode per-turn in place of ``reward`` (an outcome score, where the two differ).
    turn_reward: tuple[str, ...] = ()

    def names(self, role: Role) -> tuple[str, ...]:
        return tuple(getattr(self, role))


# The trainers' dialects, in the order of the docs' trainers table. The most specific dialect a
# dump speaks (the one whose signature holds every other matching signature) decides; two that
# neither contains are an error, so no order here is ever a tie-break.
ADVCLI = Dialect(
    "advcli",
    ("data_id", "rollout_id"),
    group=("data_id",),
    trajectory=("rollout_id",),
    turn=("turn_index",),
    reward=("token_level_rewards", "score", "reward"),
    mask=("response_mask", "response_length"),
    anchor=("anchor",),
    step_reward=("step_reward",),
    step_return=("step_return",),
    # A step's own reward (write_batch writes a trainer's per-step reward here) is its turn's.
    turn_reward=("step_reward",),
)
DIALECTS = (
    ADVCLI,
    Dialect(
        "agent-lightning",
        ("data_id_list", "rollout_id_list"),
        group=("data_id_list",),
        trajectory=("rollout_id_list",),
        turn=("turn_index_list",),
    ),
    Dialect(
        "verl-agent",
        ("uid", "traj_uid"),
        group=("uid",),
        trajectory=("traj_uid",),
        # Its batch's per-step environment reward is 'rewards'; its 'step_rewards' are the
        # returns already discounted with algorithm.gamma (gigpo/core_gigpo.py).
        anchor=("anchor_obs",),
        step_reward=("rewards",),
        step_return=("step_rewards",),
        # Its outcome, on every row's last token, is the episode's summed reward.
        turn_reward=("rewards",),
        own_row_scores=True,
    ),
    Dialect("verl (v1 multi-trajectory)", ("uid", "session_id"), ("uid",), ("session_id",)),
    Dialect("verl", ("uid",), group=("uid",), trajectory=()),
    Dialect(
        "SkyRL",
        ("uids", "trajectory_ids"),
        group=("uids",),
        trajectory=("trajectory_ids",),
        reward=("rewards",),
        mask=("loss_mask",),
        # SkyRL's response_mask covers every response token; its loss mask is loss_mask.
        not_read=("response_mask",),
        last_step=("is_last_step",),
        # pad_batch appends rows with uids and trajectory_ids "pad0", "pad1", ... and loss_mask 0.
        padding_ids=r"pad\d+",
        # Step-wise, each step row's 'rewards' is that step's own environment reward.
        turn_reward=("rewards",),
    ),
    Dialect(
        # skyrl 0.4.0 stores no trajectory_ids: its step-wise advantage recovers trajectories from
        # is_last_step alone, and so does advcli.
        "SkyRL 0.4.0",
        ("uids", "is_last_step"),
        group=("uids",),
        trajectory=(),
        reward=("rewards",),
        mask=("loss_mask",),
        not_read=("response_mask",),
        excludes=("trajectory_ids",),
        last_step=("is_last_step",),
        trajectory_from_last_step=True,
        padding_ids=r"pad\d+",
        turn_reward=("rewards",),
    ),
    Dialect(
        "rLLM",
        ("episode_ids", "trajectory_ids"),
        group=("trajectory_ids",),
        trajectory=("episode_ids",),
        reward=("traj_rewards",),
    ),
    Dialect("rLLM (AgentPPOTrainer)", ("uid", "idxs"), group=("uid",), trajectory=("idxs",)),
    Dialect(
        # ROLL's agentic batch (its env managers' non_tensor_batch): one row per environment step
        # (StepEnvManager) or per trajectory (TrajEnvManager). Its 'scores' is a step's reward on
        # its last token under StepEnvManager; every estimator's outcome is 'episode_scores'.
        "ROLL",
        ("traj_group_id", "traj_id"),
        group=("traj_group_id",),
        trajectory=("traj_id",),
        turn=("step",),
        reward=("episode_scores",),
        names_elsewhere=False,
        anchor=("state_hash",),
        step_reward=("step_scores",),
        turn_reward=("step_scores",),
        copies_repeat_turns=True,
    ),
    Dialect(
        "OpenRLHF",
        ("action_mask",),
        group=(),
        trajectory=(),
        reward=("rewards",),
        mask=("action_mask",),
    ),
    Dialect(
        "TRL",
        ("completion_mask",),
        group=(),
        trajectory=(),
        reward=("rewards",),
        mask=("completion_mask",),
    ),
)

# The step roles' names of trainers whose batches advcli reads in no dialect of their own, for
# a dump whose dialect names none: Trinity-RFT's experience info (gigpo_advantage.py).
STEP_NAMES: dict[Role, tuple[tuple[str, str], ...]] = {
    "anchor": (("Trinity-RFT", "env_state_hash"),),
    "step_reward": (("Trinity-RFT", "step_reward"),),
    "step_return": (),
}


# Where a trainer makes one column from another, both may be in its batch; the derived one is
# what its estimators read. verl: token_level_rewards = token_level_scores - the KL penalty.
DERIVED_FROM = {"token_level_rewards": "token_level_scores"}


# Names people and trainers give a role, compared with case and separators dropped
# ("ConversationID", "episode_idx", "rollout_uuid"): a stem, then an id suffix.
_ID_SUFFIX = "(id|ids|idx|index|uuid|uid|key|no|num|number)"
NAME_PATTERNS: dict[Role, re.Pattern[str]] = {
    "group": re.compile(f"(group|prompt|question|task|instance|problem|query){_ID_SUFFIX}?"),
    "trajectory": re.compile(
        f"(traj|trajectory|rollout|episode|session|conversation|convo|dialog|dialogue){_ID_SUFFIX}?"
    ),
    # Not "ids": rLLM's step_ids are strings that name a step.
    "turn": re.compile("(turn|step)(id|idx|index|no|num|number)?"),
    "reward": re.compile("(reward|rewards|score|scores|return)"),
    "mask": re.compile("(mask|responsemask|lossmask|actionmask)"),
}


def named_like(role: Role, name: str) -> bool:
    """Whether ``name`` says ``role`` (any case; ``_id``, ``_idx``, ``_uuid``, ``Id`` forms)."""
    return NAME_PATTERNS[role].fullmatch(re.sub(r"[^a-z0-9]", "", name.lower())) is not None


def dialect_named(trainer: str | None) -> Dialect | None:
    """The dialect of ``trainer`` (as :attr:`Dialect.trainer` names it), None for none."""
    return next((dialect for dialect in DIALECTS if dialect.trainer == trainer), None)


def dialect_of(schema: pl.Schema) -> tuple[Dialect | None, tuple[Dialect, Dialect] | None]:
    """The dialect with the widest signature the schema has (and None), or, when two tie,
    (None, the two)."""
    columns = set(schema.names())
    matching = [
        d for d in DIALECTS if set(d.signature) <= columns and not columns & set(d.excludes)
    ]
    if not matching:
        return None, None
    widest = max(len(d.signature) for d in matching)
    top = [d for d in matching if len(d.signature) == widest]
    if len(top) > 1:
        return None, (top[0], top[1])
    return top[0], None


def signed(dialect: Dialect) -> str:
    """The trainer with its signature, for messages: ``verl's (uid)``."""
    return f"{dialect.trainer}'s ({', '.join(dialect.signature)})"


def all_names(role: Role) -> tuple[str, ...]:
    """Every dialect's names for ``role`` (less those of a dialect whose names are read only in
    its own dumps), for a dump that speaks none of them; a name that another dialect gives
    another role (rLLM's group ``trajectory_ids`` is SkyRL's trajectory) is left out, since
    without the dialect it says nothing."""
    dialects = [d for d in DIALECTS if d.names_elsewhere]
    elsewhere = {
        name for d in dialects for other in ROLES if other != role for name in d.names(other)
    }
    return tuple(
        dict.fromkeys(name for d in dialects for name in d.names(role) if name not in elsewhere)
    )


def trainer_of(name: str) -> str:
    """The first trainer (in the table's order) whose dialect names the column ``name``."""
    for dialect in DIALECTS:
        if any(name in dialect.names(role) for role in (*ROLES, *STEP_ROLES)):
            return dialect.trainer
    return next(
        trainer for role in STEP_ROLES for trainer, known in STEP_NAMES[role] if known == name
    )


def step_names(role: Role, dialect: Dialect | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The names of step role ``role``: the dump's dialect's own, and then advcli's and the other
    trainers' (less a name some trainer gives an outcome role: SkyRL's token 'rewards')."""
    own = dialect.names(role) if dialect is not None else ()
    taken = {name for d in DIALECTS for other in ROLES for name in d.names(other)}
    names = [*ADVCLI.names(role), *(name for _, name in STEP_NAMES[role])]
    names += [name for d in DIALECTS for name in d.names(role)]
    return own, tuple(
        name for name in dict.fromkeys(names) if name not in taken and name not in own
    )
