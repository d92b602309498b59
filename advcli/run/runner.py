"""The one part runner: each part's work, its results in the parts' order as they come, in this
process, shared with ``--jobs`` worker processes, or as Ray tasks (:func:`results_in_order`).

A run is a fold over its parts: ``compare --by`` merges each part's figures into the run's as
they come, ``compute --by file`` streams each file's rows to the output after the files before
it, and ``watch`` reports each step file as it appears (a run of one part each). What differs
between them is the work of one part and the fold; where the work runs is this module's.
"""

from __future__ import annotations

import multiprocessing
import pickle
import signal
from collections.abc import Callable, Generator, Sequence
from multiprocessing.pool import AsyncResult, Pool
from typing import TypeVar

from advcli._runtime.signals import held
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
    jobs, engine
        ``--jobs``: this process and ``jobs - 1`` worker processes; ``--engine ray``: one Ray
        task a part.
    """
    if engine == Engine.RAY:
        assert elsewhere is not None
        results: Generator[ResultT, None, None] = load_ray_engine().run_parts(elsewhere, tasks)
        return results
    if jobs > 1 and len(tasks) > 1:
        assert elsewhere is not None
        return _in_workers(tasks, here, elsewhere, jobs)
    return (here(task) for task in tasks)


def _pickled(work: Callable[[TaskT], ResultT], task: TaskT) -> bytes:
    """``work`` on ``task`` in a worker process, its result pickled there, to be unpickled by
    this process's main thread: unpickled by the pool's result thread, its frames would run
    Polars there, which raises a Ctrl-C as KeyboardInterrupt in whatever thread runs it. That
    ended the result thread and left the run waiting for ever for the results it would have
    passed on."""
    return pickle.dumps(work(task))


def _in_workers(
    tasks: Sequence[TaskT],
    here: Callable[[TaskT], ResultT],
    elsewhere: Callable[[TaskT], ResultT],
    jobs: int,
) -> Generator[ResultT, None, None]:
    """``tasks`` shared by this process and ``jobs - 1`` spawned workers, results in part order
    as they come. This process takes the next part whenever the one due is still running in a
    worker, so that it works while the workers start (each imports advcli anew) and ``jobs``
    processes work at once. A part that fails here is raised when its turn comes, as with one
    job: the first failing part in order is the one named. The workers leave Ctrl-C to this
    process, which ends them, as it does on an error in any part."""
    workers = min(jobs, len(tasks)) - 1
    pool = multiprocessing.get_context("spawn").Pool(
        workers, initializer=signal.signal, initargs=(signal.SIGINT, signal.SIG_IGN)
    )
    results: dict[int, AsyncResult[bytes] | ResultT | AdvcliError] = {}
    handed, failed_here = 0, False
    try:
        for due in range(len(tasks)):
            while True:
                handed = _hand_to_workers(pool, elsewhere, tasks, results, handed, 2 * workers)
                waiting = results[due]
                if (
                    not isinstance(waiting, AsyncResult)
                    or waiting.ready()
                    or handed == len(tasks)
                    or failed_here
                ):
                    break
                try:
                    results[handed] = here(tasks[handed])
                except AdvcliError as error:
                    results[handed], failed_here = error, True
                handed += 1
            result = results.pop(due)
            if isinstance(result, AdvcliError):
                raise result
            if isinstance(result, AsyncResult):
                unpickled: ResultT = pickle.loads(result.get())
                yield unpickled
            else:
                yield result
    except AdvcliError:
        # A part failed: the parts still in the workers (two a worker at most) end, unread, in
        # the join below. terminate() may kill a worker while it writes its result and holds the
        # result queue's lock, which the pool's task thread then waits on for ever, and
        # terminate() joins that thread (a CI run hung so, in this very error's path).
        raise
    except BaseException:
        # Held: an interrupt raised again inside terminate() (as one raised where nothing could
        # catch it is) would leave a worker alive for the join below to wait on for ever.
        with held():
            pool.terminate()
        raise
    finally:
        with held():
            pool.close()
            pool.join()


def _hand_to_workers(
    pool: Pool,
    work: Callable[[TaskT], ResultT],
    tasks: Sequence[TaskT],
    results: dict[int, AsyncResult[bytes] | ResultT | AdvcliError],
    handed: int,
    limit: int,
) -> int:
    """The parts from number ``handed`` on to the workers, in order, until ``limit`` of theirs
    are unfinished (one waiting behind each running one, so that a worker never waits for this
    process); returns the number of parts handed out so far."""
    running = sum(1 for r in results.values() if isinstance(r, AsyncResult) and not r.ready())
    while running < limit and handed < len(tasks):
        results[handed] = pool.apply_async(_pickled, (work, tasks[handed]))
        handed, running = handed + 1, running + 1
    return handed
