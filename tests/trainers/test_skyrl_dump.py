"""SkyRL's own ``dumped_data/global_step_{N}_training_input.pkl``, read with no options.

Written here as SkyRL writes it (NovaSky-AI/SkyRL at a956457): with ``trainer.dump_data_batch``
``RayPPOTrainer.train`` pops ``rewards`` and the metadata's ``uids`` and ``is_last_step``
(``skyrl/train/trainer.py`` l.435-439) and ``dump_data`` pickles the ``TrainingInputBatch``
(l.441-446, 1236-1242; ``TensorBatch.save``: ``pickle.dump``). The batch pickles through its
``__reduce__``, ``(_rebuild_tensor_batch, (TrainingInputBatch, state))``, its tensors in
``state`` as numpy bytes, or ``torch.save`` bytes for a dtype numpy has not
(``skyrl/backends/skyrl_train/training_batch.py`` l.17-35, 113-117, 244-281). The tests build
that module's two names under its own path so the pickle names them as SkyRL's does.

SkyRL's GRPO (``ppo_utils.py`` l.1343-1393): a row's score is its rewards summed; a group is
the rows of one uid, a run of rows (``policy_prompt_boundaries``, ``preprocess.py`` l.286-313);
``(score - mean) / (std + 1e-6)`` with torch's unbiased std, a group of one row divided by 1;
that advantage on each response token. ``pad_training_input_batch`` (l.504-570) appends
``pad_size`` copies of row 0 with an all-0 loss mask and uids ``pad{i}``.
"""

from __future__ import annotations

import json
import math
import os
import pickle
import random
import sys
import types
from pathlib import Path

import numpy as np
import pytest
from conftest import error_line

torch = pytest.importorskip("torch")

MODULE = "skyrl.backends.skyrl_train.training_batch"


def _rebuild_tensor_batch(cls, state):
    raise AssertionError("advcli must not call SkyRL's own function")


class TrainingInputBatch(dict):
    """SkyRL's batch as it pickles: ``__reduce__`` to its rebuild function and its state."""

    def __init__(self, tensors: dict, metadata: dict):
        super().__init__(tensors)
        self.metadata = metadata

    def __reduce__(self):
        return (_rebuild_tensor_batch, (type(self), self.state()))

    def state(self) -> dict:
        return {
            "batch_dict": {key: serialized(value) for key, value in self.items()},
            "batch_size": len(next(iter(self.values()))),
            "device": torch.device("cpu"),
            "metadata": self.metadata,
        }


def serialized(value):
    """``_serialize_tensor``: numpy bytes, or torch.save bytes for bfloat16."""
    if value is None:
        return None
    try:
        array = value.numpy()
    except TypeError:
        buffer = __import__("io").BytesIO()
        torch.save(value, buffer)
        return {"format": "torch", "data": buffer.getvalue()}
    return {
        "format": "numpy",
        "data": array.tobytes(),
        "shape": array.shape,
        "dtype": str(array.dtype),
    }


@pytest.fixture
def skyrl_module(monkeypatch):
    """SkyRL's module path, holding the two names its pickle refers to."""
    module = types.ModuleType(MODULE)
    for name, obj in (
        ("_rebuild_tensor_batch", _rebuild_tensor_batch),
        ("TrainingInputBatch", TrainingInputBatch),
    ):
        obj.__module__ = MODULE
        setattr(module, name, obj)
    monkeypatch.setitem(sys.modules, MODULE, module)
    # Its packages, which an import of it goes through.
    parts = MODULE.split(".")
    for depth in range(1, len(parts)):
        name = ".".join(parts[:depth])
        monkeypatch.setitem(sys.modules, name, sys.modules.get(name, types.ModuleType(name)))
    return module


def grpo(scores: list[float], uids: list[str]) -> list[float]:
    """SkyRL's GRPO over the rows of each uid, in plain Python."""
    out = []
    for uid, score in zip(uids, scores, strict=True):
        group = [s for u, s in zip(uids, scores, strict=True) if u == uid]
        if len(group) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(group) / len(group)
            std = math.sqrt(sum((s - mean) ** 2 for s in group) / (len(group) - 1))
        out.append((score - mean) / (std + 1e-6))
    return out


def step_batch(seed: int, prompts: int = 3, samples: int = 4, dp: int = 5, bf16: bool = False):
    """A step's batch after compute_advantages_and_returns and the pops, padded to ``dp``
    ranks: (the batch, each real row's uid, tokens and advantage)."""
    rng = random.Random(seed)
    width = 6
    uids = [f"p{p}" for p in range(prompts) for _ in range(samples)]
    rewards = [float(rng.randint(0, 3)) for _ in uids]
    lengths = [rng.randint(1, width) for _ in uids]
    pad = math.ceil(len(uids) / dp) * dp - len(uids)
    uids += [f"pad{i}" for i in range(pad)]
    rewards += [rewards[0]] * pad
    lengths += [lengths[0]] * pad
    rows = len(uids)
    response_mask = torch.zeros(rows, width, dtype=torch.int64)
    for row, length in enumerate(lengths):
        response_mask[row, width - length :] = 1  # left-padded: real tokens on the right
    loss_mask = response_mask.float()
    loss_mask[rows - pad :] = 0
    advantages = torch.tensor(grpo(rewards, uids), dtype=torch.float32)[:, None] * response_mask
    runs, start = [], 0
    real = rows - pad
    for end in range(1, real + 1):
        if end == real or uids[end] != uids[start]:
            runs.append((start, end))
            start = end
    metadata = {
        "policy_mini_batch_boundaries": [(0, rows)],
        "policy_prompt_boundaries": runs,
        "response_length": width,
        "avg_response_length": sum(lengths) / rows,
        "pad_size": pad,
        "metrics": {"avg_final_rewards": sum(rewards) / rows},
    }
    tensors = {
        "sequences": torch.zeros(rows, width + 3, dtype=torch.int64),
        "attention_mask": torch.ones(rows, width + 3, dtype=torch.int64),
        "response_mask": response_mask,
        "loss_mask": loss_mask,
        "rollout_logprobs": None,
        "action_log_probs": torch.zeros(rows, width),
        "values": None,
        "returns": advantages.clone(),
        "advantages": advantages.to(torch.bfloat16) if bf16 else advantages,
    }
    truth = {
        "uids": uids[:real],
        "tokens": lengths[:real],
        "advantages": grpo(rewards, uids)[:real],
    }
    return TrainingInputBatch(tensors, metadata), truth


def dump(folder: Path, step: int, batch) -> Path:
    """``dump_data``: the batch pickled to dumped_data/global_step_{N}_training_input.pkl."""
    path = folder / "dumped_data" / f"global_step_{step}_training_input.pkl"
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("wb") as file:
        pickle.dump(batch, file)
    return path


def test_inspect_reads_groups_rows_and_skyrls_advantages(run, tmp_path, skyrl_module):
    batch, truth = step_batch(1)
    path = dump(tmp_path, 3, batch)
    result = run("inspect", path, "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["counts"]["groups"] == len(set(truth["uids"]))
    assert summary["counts"]["trajectories"] == summary["counts"]["rows"] == len(truth["uids"])
    assert summary["counts"]["tokens"] == sum(truth["tokens"])
    assert summary["padding_rows"] == 3  # 12 rows padded to 15 for 5 ranks
    assert summary["scores"] is None and summary["zero_std_groups"] is None
    advantages = summary["trainer_advantages"]
    assert advantages["rows"] == 12 and advantages["rows_without"] == 0
    assert advantages["min"] == pytest.approx(min(truth["advantages"]), abs=1e-5)
    assert advantages["max"] == pytest.approx(max(truth["advantages"]), abs=1e-5)
    assert advantages["mean"] == pytest.approx(np.mean(truth["advantages"]), abs=1e-5)
    assert summary["inputs"]["trainer"] == "SkyRL"
    assert summary["columns"]["trainer_advantage"]["column"] == "advantages:first"
    terminal = run("inspect", path)
    assert terminal.exit_code == 0, terminal.stderr
    assert "n/a: the dump holds no rewards" in terminal.stdout


def test_compare_and_compute_say_the_rewards_were_removed(run, tmp_path, skyrl_module):
    path = dump(tmp_path, 3, step_batch(2)[0])
    out = ("-o", tmp_path / "out.parquet")
    for command in (("compare", path), ("compute", path, *out), ("audit", path)):
        line = error_line(run(*command))
        assert line.startswith(f"Error: {path}: SkyRL removes the rewards (and the uids and ")
        assert "write them where compute_advantages_and_returns still has them" in line
    assert not (tmp_path / "out.parquet").exists()


def test_bfloat16_advantages_are_read(run, tmp_path, skyrl_module):
    batch, truth = step_batch(3, bf16=True)
    summary = json.loads(run("inspect", dump(tmp_path, 1, batch), "--json").stdout)
    # bfloat16 keeps 8 bits of mantissa.
    assert summary["trainer_advantages"]["max"] == pytest.approx(max(truth["advantages"]), rel=1e-2)


def test_a_dumped_data_folder_is_each_step(run, tmp_path, skyrl_module):
    for step in (10, 2):
        dump(tmp_path, step, step_batch(step)[0])
    result = run("inspect", tmp_path / "dumped_data", "--json")
    assert result.exit_code == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["counts"]["rows"] == 24 and summary["padding_rows"] == 6
    assert summary["inputs"]["files"] == [
        str(tmp_path / "dumped_data/global_step_2_training_input.pkl"),
        str(tmp_path / "dumped_data/global_step_10_training_input.pkl"),
    ]


class Planted:
    """What a pickle may name to run code as it is loaded."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_naming_another_class_is_refused_unrun(run, tmp_path):
    marker = tmp_path / "ran"
    path = tmp_path / "dumped_data/global_step_1_training_input.pkl"
    path.parent.mkdir()
    path.write_bytes(pickle.dumps({"batch_dict": Planted(marker)}))
    line = error_line(run("inspect", path))
    assert line == (
        f"Error: {path}: the pickle names posix.system, which advcli does not load: a SkyRL "
        f"batch names only {MODULE}._rebuild_tensor_batch, TrainingInputBatch and "
        "torch.device, and advcli never runs a dump's code"
    )
    assert not marker.exists()


def test_a_pickle_of_another_shape_is_one_error(run, tmp_path):
    path = tmp_path / "global_step_4_training_input.pkl"
    path.write_bytes(pickle.dumps([1, 2, 3]))
    assert error_line(run("inspect", path)) == (
        f"Error: {path}: not SkyRL's TrainingInputBatch pickled by its __reduce__ (SkyRL since "
        "2026-03), which advcli reads"
    )
    path.write_bytes(pickle.dumps([1, 2, 3])[:-4])
    assert error_line(run("inspect", path)).startswith(f"Error: {path}: not a readable pickle (")


def test_a_batch_without_its_prompt_boundaries_is_one_error(run, tmp_path, skyrl_module):
    batch, _ = step_batch(5)
    del batch.metadata["policy_prompt_boundaries"]
    path = dump(tmp_path, 5, batch)
    assert error_line(run("inspect", path)) == (
        f"Error: {path}: the metadata has no 'policy_prompt_boundaries' (SkyRL keeps them since "
        "2026-06), so its prompt groups cannot be told"
    )


def test_a_folder_read_keeps_each_steps_groups_apart(run, tmp_path, skyrl_module):
    truths = []
    for step in (1, 2):
        batch, truth = step_batch(step, prompts=2 + step, samples=2)
        dump(tmp_path, step, batch)
        truths.append(truth)
    summary = json.loads(run("inspect", tmp_path / "dumped_data", "--json").stdout)
    # Each file's ranges are numbered from 0: read as one batch they stay each step's.
    assert summary["counts"]["groups"] == sum(len(set(t["uids"])) for t in truths) == 7


@pytest.mark.parametrize(
    ("breaks", "expected"),
    [
        (
            lambda state: state["batch_dict"]["advantages"].update(format="torch", data=b"junk"),
            "tensor 'advantages' is not readable (",
        ),
        (
            lambda state: state["metadata"].update(policy_prompt_boundaries=[0, 4, 8, 12]),
            "the metadata's 'policy_prompt_boundaries' do not cover its 12 rows",
        ),
        (
            lambda state: state["metadata"].update(policy_prompt_boundaries=[{"a": 1}]),
            "the metadata's 'policy_prompt_boundaries' do not cover its 12 rows",
        ),
        (
            lambda state: state["batch_dict"].update(advantages=serialized(torch.zeros(15, 2))),
            "its tensors 'loss_mask', 'response_mask' and 'advantages' are not of one shape",
        ),
    ],
)
def test_a_damaged_batch_is_one_error(run, tmp_path, skyrl_module, breaks, expected):
    batch, _ = step_batch(6)
    state = batch.state()
    breaks(state)
    path = tmp_path / "global_step_6_training_input.pkl"
    path.write_bytes(pickle.dumps(_Reduced(state)))
    assert error_line(run("inspect", path)).startswith(f"Error: {path}: {expected}")


class _Reduced:
    """A batch's pickle as SkyRL writes it, from a state given as it is."""

    def __init__(self, state: dict):
        self.state = state

    def __reduce__(self):
        return (_rebuild_tensor_batch, (TrainingInputBatch, self.state))
