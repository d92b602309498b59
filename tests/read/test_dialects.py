"""Finding each role's column: the trainers' dialects, ties, suggestions and the docs' table."""

from __future__ import annotations

import re

import polars as pl
import pytest
from conftest import ROOT

from advcli.errors import AdvcliError, UsageError
from advcli.read.columns import resolve_columns
from advcli.read.dialects import DIALECTS
from advcli.read.roles import read_roles
from advcli.settings.config import ColumnNames

SCHEMA_PAGE = (ROOT / "docs" / "input-schema.md").read_text()

TOKENS = pl.Array(pl.Float32, 4)
MASK = pl.Array(pl.Int64, 4)


def _schema(**columns: pl.DataType) -> pl.Schema:
    return pl.Schema(columns)


def _table_rows() -> dict[str, list[str]]:
    """The docs' trainers table: trainer → its cells."""
    start = SCHEMA_PAGE.index("| trainer | signature |")
    rows = {}
    for line in SCHEMA_PAGE[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        rows[cells[0]] = cells[1:]
    return rows


def _names(cell: str) -> tuple[str, ...]:
    return tuple(re.findall(r"`([^`]+)`", cell))


def test_the_docs_table_states_the_dialects():
    table = _table_rows()
    assert list(table) == [dialect.trainer for dialect in DIALECTS]
    for dialect in DIALECTS:
        signature, group, trajectory, turn, reward, mask, _ = table[dialect.trainer]
        assert _names(signature) == dialect.signature + dialect.excludes
        if dialect.excludes:
            assert signature.endswith(f"(no {', '.join(f'`{n}`' for n in dialect.excludes)})")
        assert _names(group) == dialect.group
        if not dialect.group:
            assert group == "blocks of rows"
        if dialect.trajectory_from_last_step:
            assert trajectory == f"runs ending at `{dialect.last_step[0]}`"
        else:
            assert _names(trajectory) == dialect.trajectory
            if not dialect.trajectory:
                assert trajectory == "each row"
        assert _names(turn) == dialect.turn
        assert _names(reward) == dialect.reward
        assert _names(mask) == dialect.mask


@pytest.mark.parametrize(
    ("schema", "expected"),
    [
        (
            _schema(
                data_id_list=pl.String(),
                rollout_id_list=pl.String(),
                turn_index_list=pl.Int64(),
                uid=pl.String(),  # agent-lightning copies the group ids here
                token_level_scores=TOKENS,
                response_mask=MASK,
            ),
            ("data_id_list", "rollout_id_list", "turn_index_list", "token_level_scores"),
        ),
        (
            _schema(
                uid=pl.String(),
                traj_uid=pl.String(),
                rewards=pl.Float64(),  # verl-agent's per-step env reward: not the reward read
                token_level_scores=TOKENS,
                token_level_rewards=TOKENS,
                response_mask=MASK,
            ),
            ("uid", "traj_uid", None, "token_level_rewards"),
        ),
        (
            _schema(
                uids=pl.String(),
                trajectory_ids=pl.String(),
                rewards=TOKENS,
                loss_mask=pl.Array(pl.Float32, 4),
                response_mask=MASK,
                is_last_step=pl.Boolean(),
            ),
            ("uids", "trajectory_ids", None, "rewards"),
        ),
        (
            _schema(
                episode_ids=pl.String(),
                trajectory_ids=pl.String(),
                step_ids=pl.String(),
                traj_rewards=TOKENS,
                step_rewards=TOKENS,
                response_mask=MASK,
            ),
            ("trajectory_ids", "episode_ids", None, "traj_rewards"),
        ),
        (
            _schema(uid=pl.String(), token_level_rewards=TOKENS, response_mask=MASK),
            ("uid", None, None, "token_level_rewards"),
        ),
        (
            # ROLL's StepEnvManager rows: its token-level 'scores' holds the step's reward.
            _schema(
                traj_group_id=pl.String(),
                traj_id=pl.String(),
                step=pl.Int64(),
                episode_scores=pl.Float64(),
                step_scores=pl.Float64(),
                state_hash=pl.String(),
                scores=TOKENS,
                response_mask=pl.Array(pl.Boolean, 4),
            ),
            ("traj_group_id", "traj_id", "step", "episode_scores"),
        ),
    ],
    ids=["agent-lightning", "verl-agent", "SkyRL", "rLLM", "verl", "ROLL"],
)
def test_dialects_resolve_without_flags(schema, expected):
    roles = resolve_columns(schema, "dump", ColumnNames())
    assert (roles.group, roles.trajectory, roles.turn, roles.reward) == expected


def test_rolls_names_are_read_only_in_its_own_dumps():
    """Without ROLL's signature, 'episode_scores' is no reward and 'traj_id' is read for its
    name, as before ROLL had a dialect."""
    schema = _schema(
        prompt_id=pl.String(),
        traj_id=pl.String(),
        episode_scores=pl.Float64(),
        reward=pl.Float64(),
    )
    roles = resolve_columns(schema, "dump", ColumnNames(), mask_needed_for=None)
    assert (roles.dialect, roles.group, roles.trajectory, roles.reward) == (
        None,
        "prompt_id",
        "traj_id",
        "reward",
    )
    assert roles.reasons["trajectory"].startswith("'traj_id' is named like the trajectory")


def test_skyrl_mask_is_its_loss_mask_and_never_its_response_mask():
    schema = _schema(
        uids=pl.String(), trajectory_ids=pl.String(), rewards=TOKENS, response_mask=MASK
    )
    with pytest.raises(AdvcliError, match=r"no mask column .*SkyRL's dumps name it 'loss_mask'"):
        resolve_columns(schema, "dump", ColumnNames())
    assert resolve_columns(schema, "dump", ColumnNames(), mask_needed_for=None).mask is None


def test_dialects_of_equal_width_are_an_error_naming_both():
    schema = _schema(
        uid=pl.String(),
        traj_uid=pl.String(),
        session_id=pl.Int64(),
        token_level_rewards=TOKENS,
        response_mask=MASK,
    )
    with pytest.raises(AdvcliError) as error:
        resolve_columns(schema, "dump", ColumnNames())
    assert "verl-agent's (uid, traj_uid)" in str(error.value)
    assert "verl (v1 multi-trajectory)'s (uid, session_id)" in str(error.value)
    # Both take 'uid' for the group: only the trajectory is in question.
    assert "name the trajectory column with --traj-col" in str(error.value)
    roles = resolve_columns(schema, "dump", ColumnNames(trajectory="traj_uid"))
    assert (roles.group, roles.trajectory) == ("uid", "traj_uid")


def test_two_candidates_for_a_role_are_an_error_naming_both():
    schema = _schema(
        data_id=pl.Int64(), rollout_id=pl.Int64(), score=pl.Float64(), reward=pl.Float64()
    )
    with pytest.raises(
        AdvcliError,
        match="two columns could be the reward: 'score' and 'reward'; pick one with --reward-col",
    ):
        resolve_columns(schema, "dump", ColumnNames(), mask_needed_for=None)
    assert (
        resolve_columns(schema, "dump", ColumnNames(reward="reward"), mask_needed_for=None).reward
        == "reward"
    )


def test_an_advcli_output_read_again_takes_its_reward_not_its_score():
    schema = _schema(
        data_id=pl.Int64(),
        rollout_id=pl.Int64(),
        token_level_rewards=TOKENS,
        response_mask=MASK,
        score=pl.Float32(),
        advantage=pl.Float32(),
    )
    assert resolve_columns(schema, "dump", ColumnNames()).reward == "token_level_rewards"


def test_a_missing_role_lists_the_columns_and_the_nearest_names():
    schema = _schema(
        data_id=pl.Int64(), rolout_id=pl.Int64(), score=pl.Float64(), response_length=pl.Int64()
    )
    with pytest.raises(AdvcliError) as error:
        resolve_columns(schema, "dump", ColumnNames())
    message = str(error.value)
    assert message.startswith("dump: no trajectory column: expected 'rollout_id',")
    assert "The file has 'data_id', 'rolout_id', 'score', 'response_length'" in message
    assert message.endswith("did you mean 'rolout_id'?")


def test_a_mistyped_option_suggests_the_nearest_column():
    schema = _schema(data_id=pl.Int64(), rollout_id=pl.Int64(), score=pl.Float64())
    with pytest.raises(
        AdvcliError, match=r"column 'scroe' .--reward-col. not found.*did you mean 'score'"
    ):
        resolve_columns(schema, "dump", ColumnNames(reward="scroe"), mask_needed_for=None)


def test_long_column_lists_are_cut():
    schema = pl.Schema({f"feature_{i}": pl.Int64() for i in range(30)})
    with pytest.raises(AdvcliError, match="'feature_19' and 10 more"):
        resolve_columns(schema, "dump", ColumnNames())


def test_group_size_stands_in_for_the_group():
    schema = _schema(rewards=pl.Float64(), completion_mask=MASK)
    with pytest.raises(AdvcliError, match=r"TRL's dumps hold no group id.*--group-size"):
        resolve_columns(schema, "dump", ColumnNames())
    roles = resolve_columns(schema, "dump", ColumnNames(group_size=4))
    assert (roles.group, roles.group_size, roles.trajectory, roles.mask) == (
        None,
        4,
        None,
        "completion_mask",
    )
    with pytest.raises(UsageError, match="--group-size and --group-col"):
        resolve_columns(schema, "dump", ColumnNames(group_size=4, group="rewards"))


def test_multidimensional_arrays_are_refused():
    schema = _schema(
        data_id=pl.Int64(),
        rollout_id=pl.Int64(),
        token_level_rewards=pl.Array(pl.Float32, (2, 3)),
        response_mask=MASK,
    )
    with pytest.raises(AdvcliError, match="one-dimensional"):
        resolve_columns(schema, "dump", ColumnNames())


def test_a_uid_dump_that_names_trajectories_is_read_by_them_or_refused():
    """verl's dialect (uid only) reads each row as a trajectory: in a dump that also has
    advcli's 'rollout_id' repeating within groups, the rows are turns and 'rollout_id' is their
    trajectory; one whose 'turn_index' numbers turns with no trajectory column is refused,
    rather than turn-level numbers computed as trajectory-level ones."""
    schema = _schema(
        uid=pl.String(), rollout_id=pl.Int64(), turn_index=pl.Int64(), score=pl.Float64()
    )
    frame = pl.DataFrame(
        {"uid": ["p", "p", "p", "q"], "rollout_id": [0, 0, 1, 2], "turn_index": [0, 1, 0, 0]},
    )
    roles = read_roles(schema, "dump", ColumnNames(), lambda names, limit: frame.select(names))
    assert (roles.group, roles.trajectory, roles.turn) == ("uid", "rollout_id", "turn_index")
    assert "repeat within groups (4 rows, 3 trajectories)" in roles.reasons["trajectory"]

    per_row = frame.with_columns(rollout_id=pl.Series([0, 1, 2, 3]))
    refused = r"column 'turn_index' numbers turns within groups \(2 distinct"
    with pytest.raises(AdvcliError, match=refused):
        read_roles(schema, "dump", ColumnNames(), lambda names, limit: per_row.select(names))
    roles = resolve_columns(
        schema, "dump", ColumnNames(trajectory="rollout_id"), mask_needed_for=None
    )
    assert (roles.group, roles.trajectory, roles.turn) == ("uid", "rollout_id", "turn_index")
