"""A part's error crosses a process boundary whole: every error type advcli raises survives
pickling (a --jobs worker's error is pickled to the parent, a Ray task's too), with its type,
its message and its fields."""

from __future__ import annotations

import inspect
import pickle

import pytest

from advcli.errors import AdvcliError, InputChanged, MissingRoles
from advcli.run.runner import results_in_order


def _every_error_type() -> list[type[AdvcliError]]:
    """advcli's error types: AdvcliError and its subclasses in every imported module of the
    package (the modules with one are imported here first)."""
    import advcli.read.batch
    import advcli.torch.tensors
    import advcli.write.atomic

    found, todo = [], [AdvcliError]
    while todo:
        kind = todo.pop()
        found.append(kind)
        todo.extend(kind.__subclasses__())
    return [kind for kind in found if kind.__module__.startswith(advcli.__name__)]


# The arguments each type that takes its own is made with; the others take a message.
ARGUMENTS = {
    InputChanged: ("run/step-1.parquet", "size 10 → 12", "the output was left"),
    MissingRoles: (
        "dump.parquet",
        {"group": "no group column: expected 'uid'"},
        ". The file has 'a'",
        {"group": None, "trajectory": "traj"},
        ("--group-col", "a"),
    ),
}


def test_the_types_are_all_found():
    names = {kind.__name__ for kind in _every_error_type()}
    assert {"AdvcliError", "UsageError", "SettingsError", "InputChanged", "MissingRoles"} <= names
    assert {"OutputAppeared", "TurnRewardError", "RewardError"} <= names


@pytest.mark.parametrize("kind", _every_error_type(), ids=lambda kind: kind.__name__)
def test_every_error_type_survives_pickling(kind):
    arguments = ARGUMENTS.get(kind, ("file.parquet: column 'x' is null",))
    # A type with arguments of its own must be listed above, or this test says nothing of it.
    own = inspect.signature(kind.__init__).parameters
    assert kind in ARGUMENTS or list(own) in (["self", "args", "kwargs"], ["self"]), kind
    error = kind(*arguments)
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is kind
    assert str(copy) == str(error)
    assert vars(copy) == vars(error)


def _missing_roles(part: int) -> int:
    """A part's work that fails as a dump with a missing role does (module level: it pickles)."""
    if part == 1:
        raise MissingRoles(*ARGUMENTS[MissingRoles])
    return part


@pytest.mark.process
def test_a_workers_error_reaches_the_parent_as_raised():
    results = results_in_order([0, 1, 2], _missing_roles, elsewhere=_missing_roles, jobs=2)
    with pytest.raises(MissingRoles) as raised:
        list(results)
    assert raised.value.flags == ("--group-col", "a")
    assert str(raised.value).endswith("These options read it: --group-col a")
