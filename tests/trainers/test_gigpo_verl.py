"""advcli.verl's gigpo on a real verl DataProto shaped as verl-agent's batch at its advantage
step (``uid``, ``traj_uid``, ``anchor_obs``, the per-step ``rewards``, verl-agent's discounted
``step_rewards``), against the independent reference (tests/gigpo_reference.py); and
``write_batch`` carrying the anchor and step reward into a dump that ``advcli compute
--estimator gigpo`` reads with no flags, with the direct call's numbers."""

from __future__ import annotations

import uuid
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from gigpo_reference import GigpoRow, gigpo_recipe, step_returns
from gigpo_rows import agent_rows

torch = pytest.importorskip("torch")
pytest.importorskip("verl")
from verl import DataProto  # noqa: E402

from advcli.dump import write_batch  # noqa: E402
from advcli.errors import AdvcliError  # noqa: E402
from advcli.verl import compute_advantage  # noqa: E402

pytestmark = pytest.mark.peers

WIDTH = 4
# Anchor states as verl-agent's environments give them: text, an image, a dict of fields.
TEXT_STATES = ["You are in the kitchen.", "You see a mug.", "You hold a mug.", "Done."]


def image_state(code: int) -> np.ndarray:
    return np.full((2, 3), code, dtype=np.uint8)


def dict_state(code: int) -> dict:
    # Keys in two orders: the order a dict was made in is no part of the state.
    if code % 2:
        return {"room": f"r{code}", "items": [code, 1]}
    return {"items": [code, 1], "room": f"r{code}"}


STATES = {
    "text": lambda code: TEXT_STATES[code],
    "image": image_state,
    "dict": dict_state,
    "tuple": lambda code: (code, code + 1),
}


def agent_batch(rows: list[GigpoRow], states: str = "text", *, returns_of: float | None = None):
    """A DataProto as verl-agent's fit loop holds it: uuids for ``uid`` and ``traj_uid``, the
    episode score on each row's last response token, ``anchor_obs`` and ``rewards`` as object
    arrays, and (``returns_of``: γ) the ``step_rewards`` tensor verl-agent computes from them."""
    uids = {group: str(uuid.uuid4()) for group in {row.group for row in rows}}
    trajs = {traj: str(uuid.uuid4()) for traj in {row.trajectory for row in rows}}
    count = len(rows)
    rewards = torch.zeros(count, WIDTH)
    rewards[:, -1] = torch.tensor([row.score for row in rows])
    batch = DataProto.from_dict(
        tensors={"token_level_rewards": rewards, "response_mask": torch.ones(count, WIDTH)},
        non_tensors={
            "uid": np.array([uids[row.group] for row in rows], dtype=object),
            "traj_uid": np.array([trajs[row.trajectory] for row in rows], dtype=object),
            "rewards": np.array([np.float32(row.step_reward) for row in rows], dtype=object),
        },
    )
    anchors = np.empty(count, dtype=object)
    anchors[:] = [STATES[states](row.anchor) for row in rows]
    batch.non_tensor_batch["anchor_obs"] = anchors
    if returns_of is not None:
        batch.batch["step_rewards"] = torch.tensor(step_returns(rows, returns_of))
    return batch


def advantages(batch: DataProto, **keywords) -> list[float]:
    return compute_advantage(batch, "gigpo", **keywords).batch["advantages"][:, -1].tolist()


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize(
    ("keywords", "recipe", "norm", "gamma"),
    [
        ({}, "verl-agent upstream", "mean", 1.0),
        ({"gigpo_mode": "mean_std_norm", "gamma": 0.95}, "verl-agent upstream", "mean_std", 0.95),
        (
            {"recipe": "verl-agent-trajectory", "gigpo_norm": "mean_std", "gamma": 0.9},
            "verl-agent with trajectory counting",
            "mean_std",
            0.9,
        ),
        ({"recipe": "trinity"}, "Trinity-RFT", "mean_one", 1.0),
        ({"recipe": "roll", "gamma": 0.95}, "ROLL", "mean_std", 0.95),
    ],
)
def test_each_recipe_gives_the_references_numbers(keywords, recipe, norm, gamma, seed):
    rows = agent_rows(seed)
    expected = gigpo_recipe(rows, recipe, norm=norm, gamma=gamma)
    got = advantages(agent_batch(rows), **keywords)
    assert got == pytest.approx(expected, rel=1e-5, abs=1e-5)


def test_verl_agents_step_rewards_are_its_returns():
    """verl-agent's ``step_rewards`` (discounted with algorithm.gamma before the advantage
    step) are read as returns, not discounted again; the numbers are those of ``rewards``
    discounted with the same γ."""
    rows = agent_rows(5)
    expected = gigpo_recipe(rows, "verl-agent upstream", norm="mean_std", gamma=0.9)
    with_returns = agent_batch(rows, returns_of=0.9)
    got = advantages(with_returns, gamma=0.9, gigpo_mode="mean_std_norm")
    assert got == pytest.approx(expected, abs=1e-5)
    assert advantages(agent_batch(rows), gamma=0.9, gigpo_mode="mean_std_norm") == pytest.approx(
        expected, abs=1e-5
    )


def test_verl_agents_config_keys_are_read():
    rows = agent_rows(6)
    config = {"gigpo": {"step_advantage_w": 0.5, "mode": "mean_std_norm"}}
    by_config = advantages(agent_batch(rows), config=config)
    by_keywords = advantages(agent_batch(rows), step_advantage_w=0.5, gigpo_mode="mean_std_norm")
    expected = gigpo_recipe(rows, "verl-agent upstream", norm="mean_std", gamma=1.0, omega=0.5)
    assert by_config == pytest.approx(expected, abs=1e-5)
    assert by_keywords == by_config
    # verl's flag is grpo's: gigpo's divisor is its mode's, as in verl-agent.
    unread = advantages(agent_batch(rows), config=config, norm_adv_by_std_in_grpo=False)
    assert unread == by_config
    with pytest.raises(ValueError, match=r"step_weight=0\.25 but config\.gigpo\.step_advantage_w"):
        advantages(agent_batch(rows), config=config, step_weight=0.25)


def test_the_step_metrics_are_logged():
    rows = [
        GigpoRow(0, 0, 0, 1.0, 0, 0.0),
        GigpoRow(0, 0, 1, 1.0, 1, 1.0),
        GigpoRow(0, 1, 0, 0.0, 0, 0.0),
        GigpoRow(0, 1, 1, 0.0, 2, 0.0),
    ]
    metrics = compute_advantage(agent_batch(rows), "gigpo").meta_info["metrics"]
    assert metrics["advcli/step_groups"] == 3
    assert metrics["advcli/singleton_step_groups"] == 2
    assert metrics["advcli/singleton_step_row_share"] == 0.5
    assert metrics["advcli/groups"] == 1
    # The episode term's bias: every row counted (scores 1, 1, 0, 0) against each trajectory
    # once (1, 0) gives the same baseline, 0.5.
    assert metrics["advcli/groups/baseline_shift_max"] == 0.0


@pytest.mark.parametrize("states", sorted(STATES))
def test_write_batch_then_compute_gives_the_direct_calls_numbers(states, run, tmp_path: Path):
    rows = agent_rows(7)
    batch = agent_batch(rows, states)
    written = write_batch(batch, tmp_path / "dump")
    frame = pl.read_parquet(written.path)
    assert {"anchor", "step_reward"} <= set(frame.columns)
    # The dump's anchors group the rows as the states do.
    state_of = [row.anchor for row in rows]
    assert _partition(frame["anchor"].to_list()) == _partition(state_of)
    output = tmp_path / "out.parquet"
    result = run(
        "compute", tmp_path / "dump", "-o", output, "-q", "--recipe", "verl-agent",
        "--gigpo-norm", "mean_std", "--gamma", "0.9",
    )  # fmt: skip
    assert result.exit_code == 0, result.stderr
    from_dump = pl.read_parquet(output)["advantage"].to_list()
    direct = advantages(agent_batch(rows, states), gamma=0.9, gigpo_mode="mean_std_norm")
    assert direct == pytest.approx(from_dump, abs=1e-6)
    expected = gigpo_recipe(rows, "verl-agent upstream", norm="mean_std", gamma=0.9)
    assert direct == pytest.approx(expected, abs=1e-5)


def _partition(values: list) -> list[list[int]]:
    """The rows grouped by equal value, as sorted lists of row numbers."""
    groups: dict[str, list[int]] = {}
    for row, value in enumerate(values):
        groups.setdefault(repr(value), []).append(row)
    return sorted(groups.values())


def test_float_anchors_are_refused():
    """Arrays of floats (by the batch's types) and dicts holding floats (by their values)."""
    rows = agent_rows(8)
    for state, message in (
        (lambda code: np.array([0.5, code]), "column 'anchor_obs' \\(anchor\\) has type Float32"),
        (lambda code: {"x": 0.5 * code}, "'anchor_obs' \\(anchor\\) holds Struct"),
    ):
        batch = agent_batch(rows)
        anchors = np.empty(len(rows), dtype=object)
        anchors[:] = [state(row.anchor) for row in rows]
        batch.non_tensor_batch["anchor_obs"] = anchors
        with pytest.raises(ValueError, match=message):
            compute_advantage(batch, "gigpo")


@pytest.mark.parametrize(
    ("states", "message"),
    [
        (({1: "a"}, {"1": "a"}), "has a dict with the key 1, not a string"),
        (([1], ["1"]), "row 1's \\['1'\\] would be read as \\[1\\]"),
        (({"k": [1]}, {"k": ["1"]}), "holds values of more than one type"),
    ],
    ids=["int and str dict keys", "int and str list items", "nested"],
)
def test_anchors_that_one_column_would_merge_are_refused(states, message, tmp_path):
    """Two different states that one column would make one (a struct's field names are strings;
    Polars makes one type of a column's values): an error, in the call and in write_batch,
    never a merged step group."""
    rows = agent_rows(10)
    anchors = np.empty(len(rows), dtype=object)
    anchors[:] = [states[index % 2] for index in range(len(rows))]
    batch = agent_batch(rows)
    batch.non_tensor_batch["anchor_obs"] = anchors
    with pytest.raises(ValueError, match=message):
        compute_advantage(batch, "gigpo")
    with pytest.raises(AdvcliError, match=message):
        write_batch(batch, tmp_path / "dump")


def test_a_batch_without_anchors_is_refused_for_gigpo():
    batch = agent_batch(agent_rows(9))
    batch.non_tensor_batch.pop("anchor_obs")
    with pytest.raises(ValueError, match="anchor"):
        compute_advantage(batch, "gigpo")


def test_gigpo_keywords_are_refused_elsewhere_and_misspelt_ones_everywhere():
    batch = agent_batch(agent_rows(10))
    with pytest.raises(ValueError, match=r"^recipe applies to gigpo, not to grpo$"):
        compute_advantage(batch, "grpo", recipe="trinity")
    with pytest.raises(TypeError, match="unexpected keyword argument 'gigpo_modes'"):
        compute_advantage(batch, "gigpo", gigpo_modes="mean_norm")
    with pytest.raises(ValueError, match="gigpo_mode is one of 'mean_norm', 'mean_std_norm'"):
        compute_advantage(batch, "gigpo", gigpo_mode="std")


@pytest.mark.parametrize("recipe", ["verl-agent", "verl-agent-trajectory", "trinity", "roll"])
def test_the_bias_metrics_are_compares_on_the_written_dump(recipe, run, tmp_path: Path):
    """The episode term's bias in the metrics is the one compare reports under the same
    recipe, for the recipes whose episode term departs from the plain rule too (verl-agent's
    own-row rule, Trinity-RFT's R(τ) of the step rewards)."""
    import json

    rows = agent_rows(3)
    metrics = compute_advantage(agent_batch(rows), "gigpo", recipe=recipe).meta_info["metrics"]
    write_batch(agent_batch(rows), tmp_path / "dump")
    result = run("compare", tmp_path / "dump", "--recipe", recipe, "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    for key in ("baseline_shift_mean", "baseline_shift_max"):
        assert metrics[f"advcli/groups/{key}"] == pytest.approx(report["groups"][key], abs=1e-6)
    diff = report["trajectories"]["advantage_diff_mean"]
    assert metrics["advcli/trajectories/advantage_diff_mean"] == pytest.approx(diff, abs=1e-6)


@pytest.mark.parametrize(("returns_of", "gamma"), [(None, 0.95), (0.9, 0.9)])
def test_verl_agents_gigpo_is_audited_clean(returns_of, gamma, run, tmp_path: Path):
    """verl-agent's batch after its GiGPO (the reference's numbers, ``mean_std_norm``) set as
    its ``advantages``: in the training step (advcli.verl.audit_advantages) and from the dump
    ``write_batch`` writes of it (``advcli audit``), the rule is verl-agent's GiGPO on every
    row, with no finding but its turn-level counting. With verl-agent's ``step_rewards`` (the
    returns, discounted with γ 0.9) no γ is named."""
    import json

    from advcli.verl import audit_advantages

    rows = agent_rows(11)
    found = gigpo_recipe(rows, "verl-agent upstream", norm="mean_std", gamma=gamma)
    batch = agent_batch(rows, returns_of=returns_of)
    batch.batch["advantages"] = torch.tensor(found)[:, None] * batch.batch["response_mask"]
    metrics = audit_advantages(batch)
    assert (metrics["advcli/audit/rule_matched"], metrics["advcli/audit/rows_off"]) == (1.0, 0.0)
    write_batch(batch, tmp_path / "dump", keys=["advantages"])
    result = run("audit", tmp_path / "dump", "--json", "-", "-q")
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["rule"]["step"] == {
        "recipe": "verl-agent",
        "gamma": None if returns_of is not None else gamma,
        "step_weight": 1.0,
        "gigpo_norm": "mean_std",
        "anchor_scope": "group",
    }
    assert report["rule"]["rows_matched"] == len(rows)
    assert [finding["kind"] for finding in report["findings"]] == ["turn-level-counting"]
