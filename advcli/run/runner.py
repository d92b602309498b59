"""The one part runner: each part's work, its results in the parts' order as they come, in this
process, shared with ``--jobs`` worker processes, or as Ray tasks (:func:`results_in_order`).

A run is a fold over its parts: ``compare --by`` merges each part's figures into the run's as
they come, ``compute --by file`` streams each file's rows to the output after the files before
it, and ``watch`` reports each step file as it appears (a run of one part each). What differs
between them is the work of one part and the fold; where the work runs is this module's.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import pickle
import signal
import threading
from collections import deque
from collections.abc import Callable, Generator, Iterator, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, TypeVar

from advcli._runtime.signals import HANDLED_SIGNALS, held
from advcli.errors import AdvcliError
from advcli.run.loading import load_ray_engine
from advcli.settings.config import Engine

TaskT = TypeVar("TaskT")
ResultT = TypeVar("ResultT")


def results_in_order(
    tasks: Sequence[TaskT],
    here: Callable[[TaskT], ResultT],
    *,
    elsewhere: Callable[[TaskT], ResultT] | None = None,
    named: Callable[[TaskT], str] = str,
    jobs: int = 1,
    engine: Engine = Engine.LOCAL,
) -> Generator[ResultT, None, None]:
    """Each task's result in the tasks' order, each as it is taken (close the generator to end
    the run early: the workers end with it).

    Parameters
    ----------
    here
        A task's work in this process, on what this process holds (its opened inputs).
    elsewhere
        The same work in another process or a Ray task, from the task alone (its inputs opened
        there): a module-level function, so that it pickles by name. Needed for ``jobs`` above
        1 and for the Ray engine.
    named
        A task as messages name it (its file, its step): a worker that ends without its
        result is an error naming its part.
    jobs, engine
        ``--jobs``: this process and up to ``jobs - 1`` worker processes, no more processes
        than parts or than the cores this process may run on; ``--engine ray``: one Ray task a
        part.
    """
    if engine == Engine.RAY:
        assert elsewhere is not None
        results: Generator[ResultT, None, None] = load_ray_engine().run_parts(elsewhere, tasks)
        return results
    processes = min(jobs, len(tasks), len(os.sched_getaffinity(0)))
    if processes > 1:
        assert elsewhere is not None
        return _in_workers(tasks, here, elsewhere, named, processes - 1)
    return (here(task) for task in tasks)


def _serve(connection: Connection) -> None:
    """A worker process: each (work, task) received, its result (pickled here, unpickled by the
    parent's main thread) or its error sent back, until None or the parent is gone."""
    # Polars catches SIGINT when it loads, whatever the process started with (see
    # _start_workers): ignored again. A worker lives as long as its parent, which acts on the
    # signals and ends it.
    for signum in HANDLED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    while True:
        try:
            message = connection.recv()
        except EOFError:  # this process's parent is gone
            return
        if message is None:
            return
        work, task = message
        try:
            connection.send(("pickled", pickle.dumps(work(task))))
        except AdvcliError as error:
            connection.send(("error", error))


@dataclass
class _Worker:
    """A worker process, the pipe to it, and the parts it was handed, oldest first (it answers
    them in that order)."""

    process: BaseProcess
    connection: Connection
    parts: deque[int] = field(default_factory=deque)


def _start_workers(count: int) -> list[_Worker]:
    """``count`` spawned worker processes, started with Ctrl-C, SIGTERM and SIGHUP ignored (a
    process keeps an ignored signal through exec, and Python leaves it ignored): a signal sent
    to the whole process group, which reaches them while they import advcli too, neither prints
    a traceback of theirs nor ends one before the run (a dead worker is an error of its part);
    this process takes it and ends them. Meanwhile the signals are blocked here, so that one
    sent while they start waits for this process's handler instead of being ignored."""
    context = multiprocessing.get_context("spawn")
    workers = []
    with _ignoring(HANDLED_SIGNALS):
        for _ in range(count):
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(theirs,), daemon=True)
            process.start()
            theirs.close()
            workers.append(_Worker(process, ours))
    return workers


@contextlib.contextmanager
def _ignoring(signals: Sequence[signal.Signals]) -> Iterator[None]:
    """``signals`` ignored, and blocked in this thread, for the block (only the main thread
    may set a handler: elsewhere nothing changes)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    handlers = {signum: signal.signal(signum, signal.SIG_IGN) for signum in signals}
    try:
        yield
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def _in_workers(
    tasks: Sequence[TaskT],
    here: Callable[[TaskT], ResultT],
    elsewhere: Callable[[TaskT], ResultT],
    named: Callable[[TaskT], str],
    count: int,
) -> Generator[ResultT, None, None]:
    """``tasks`` shared by this process and ``count`` spawned workers, results in part order as
    they come. This process takes the next part whenever the one due is still in a worker, so
    that it works while the workers start (each imports advcli anew) and every process works
    at once. A part that fails is raised when its turn comes, as with one job: the first
    failing part in order is the one named. A worker that ends without its result (killed: the
    out-of-memory killer sends SIGKILL) is an error naming the part it was comparing. The
    workers leave Ctrl-C to this process, which ends them, as it does on an error."""
    workers = _start_workers(count)
    # Each part's outcome: ("value", its result here), ("pickled", a worker's result) or
    # ("error", the AdvcliError it raised).
    results: dict[int, tuple[str, Any]] = {}
    handed, failed_here = 0, False
    finished = False
    try:
        for due in range(len(tasks)):
            while due not in results:
                handed = _hand_to_workers(workers, elsewhere, tasks, handed)
                in_worker = any(due in worker.parts for worker in workers)
                if in_worker and handed < len(tasks) and not failed_here:
                    try:
                        results[handed] = ("value", here(tasks[handed]))
                    except AdvcliError as error:
                        results[handed], failed_here = ("error", error), True
                    handed += 1
                    _collect(workers, results, tasks, named, timeout=0)
                else:
                    _collect(workers, results, tasks, named, timeout=None)
            kind, outcome = results.pop(due)
            if kind == "error":
                raise outcome
            result: ResultT = pickle.loads(outcome) if kind == "pickled" else outcome
            yield result
        finished = True
    finally:
        with held():
            _end_workers(workers, finished)


def _hand_to_workers(
    workers: list[_Worker],
    work: Callable[[TaskT], ResultT],
    tasks: Sequence[TaskT],
    handed: int,
) -> int:
    """The parts from number ``handed`` on to the workers, in order, two a worker at most (one
    waiting behind each running one, so that a worker never waits for this process); returns
    the number of parts handed out so far."""
    for worker in workers:
        while len(worker.parts) < 2 and handed < len(tasks):
            worker.connection.send((work, tasks[handed]))
            worker.parts.append(handed)
            handed += 1
    return handed


def _collect(
    workers: list[_Worker],
    results: dict[int, tuple[str, Any]],
    tasks: Sequence[TaskT],
    named: Callable[[TaskT], str],
    *,
    timeout: float | None,
) -> None:
    """The results the workers have sent, waiting up to ``timeout`` seconds (None: until one
    comes); a worker that ended with parts unanswered is an error naming its oldest part."""
    busy = [worker for worker in workers if worker.parts]
    wait([worker.connection for worker in busy] + [w.process.sentinel for w in busy], timeout)
    for worker in busy:
        try:
            while worker.parts and worker.connection.poll():
                outcome = worker.connection.recv()
                results[worker.parts.popleft()] = outcome
        except EOFError:  # the worker's end of the pipe closed: it ended
            worker.process.join()
        if worker.parts and not worker.process.is_alive():
            raise AdvcliError(
                f"{named(tasks[worker.parts[0]])}: the worker process comparing it ended "
                f"without a result ({_how_it_ended(worker.process.exitcode)}); nothing was "
                "written"
            )


def _how_it_ended(exitcode: int | None) -> str:
    if exitcode is not None and exitcode < 0:
        name = signal.Signals(-exitcode).name
        kill = ", as the out-of-memory killer sends" if -exitcode == signal.SIGKILL else ""
        return f"killed by {name}{kill}"
    return f"exit code {exitcode}"


def _end_workers(workers: list[_Worker], finished: bool) -> None:
    """End the workers: each told to stop once the run finished, else killed (a part failed,
    Ctrl-C, the caller closed the generator): the parts left in them are not wanted."""
    for worker in workers:
        if finished:
            worker.connection.send(None)
        else:
            worker.process.kill()
    for worker in workers:
        worker.process.join()
        worker.connection.close()
