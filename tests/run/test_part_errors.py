"""A part's error crosses a process boundary whole: every error type advcli raises survives
pickling (a --jobs worker's error is pickled to the parent, a Ray task's too), with its type,
its message and its fields."""

from __future__ import annotations

import inspect
import os
import pickle
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from advcli.errors import AdvcliError, InputChanged, MissingRoles
from advcli.run.runner import results_in_order
from advcli.write.sample import write_sample


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


def _killed_in_a_worker(part: int) -> int:
    """Part 1's worker is killed as the out-of-memory killer kills one."""
    if part == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    return part


def _pid(part: int) -> int:
    return os.getpid()


@pytest.mark.process
def test_a_killed_worker_is_an_error_naming_its_part():
    results = results_in_order(
        [0, 1, 2, 3],
        lambda part: part,
        elsewhere=_killed_in_a_worker,
        named=lambda part: f"part-{part}.parquet",
        jobs=2,
    )
    with pytest.raises(AdvcliError) as raised:
        list(results)
    assert str(raised.value) == (
        "part-1.parquet: the worker process comparing it ended without a result (killed by "
        "SIGKILL, as the out-of-memory killer sends); nothing was written"
    )


@pytest.mark.process
def test_jobs_start_no_more_processes_than_cores():
    cores = len(os.sched_getaffinity(0))
    pids = list(results_in_order(list(range(40)), _pid, elsewhere=_pid, jobs=10_000))
    assert len(pids) == 40
    assert 1 < len(set(pids)) <= cores


@pytest.mark.process
@pytest.mark.parametrize(
    ("signum", "after"),
    [
        (signal.SIGINT, 0.3),
        (signal.SIGINT, 1.2),
        (signal.SIGINT, 2.5),
        (signal.SIGTERM, 1.2),
        (signal.SIGTERM, 2.5),
    ],
)
def test_a_signal_to_the_whole_group_ends_the_workers_without_a_traceback(tmp_path, signum, after):
    """Ctrl-C at a terminal (or a SIGTERM to the job) reaches every process of the group: the
    workers (starting, or comparing) print nothing and end with the run, which ends as the
    signal ends any run, leaving no process behind."""
    folder = tmp_path / "run"
    folder.mkdir()
    # Some 4 s of work on 2 cores: the workers start in the first second.
    for step in range(24):
        write_sample(folder / f"step_{step}.parquet", groups=3000, seed=step)
    process = subprocess.Popen(
        [sys.executable, "-m", "advcli", "compare", folder, "--by", "file", "--jobs", "2", "-q"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    time.sleep(after)
    os.killpg(process.pid, signum)
    stdout, stderr = process.communicate(timeout=120)
    if process.returncode == 0:
        pytest.skip(f"the run ended before the signal at {after} s")
    assert (process.returncode, stdout) == (128 + signum, "")
    what = "Interrupted" if signum == signal.SIGINT else "Terminated"
    assert stderr == f"{what}; no partial output was left behind.\n"
    # A process being reaped has its state and command line taken away in turn: a moment.
    deadline = time.monotonic() + 10
    while _alive_in_group(process.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _alive_in_group(process.pid) == []


def _alive_in_group(group: int) -> list[str]:
    """The processes of process group ``group`` still running (not zombies, which have ended
    and wait only for whoever adopted them to reap them), with their command lines."""
    alive = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            # Any process of the machine is read, and a command line need not be UTF-8.
            raw = (stat.parent / "cmdline").read_bytes()
            command = raw.replace(b"\0", b" ").decode(errors="replace")
        except (OSError, IndexError):
            continue  # ended meanwhile
        state, process_group = fields[0], int(fields[2])
        if process_group == group and state != "Z":
            alive.append(f"{stat.parent.name} {command}")
    return alive
