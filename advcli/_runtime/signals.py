"""Signals: Ctrl-C, SIGTERM and SIGHUP end a run the way Ctrl-C does, with one line and exit code
128 + N, and a block of code can hold them back.

Python runs a signal's handler in the main thread, but the signal itself may reach any thread
(Polars and Arrow run their own), so masking it in the main thread alone does not hold it back.
:func:`held` holds it in the handler instead: inside the block a signal is recorded, and raised
when the block ends.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any


class Interrupted(KeyboardInterrupt):
    """Ctrl-C or a termination signal. A KeyboardInterrupt, so that every ``finally`` and context
    manager on the way up (a partial file's removal among them) runs as it does for Ctrl-C."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


# The first signal received, even if some library swallowed the exception it raised.
_RECEIVED: list[int] = []
HANDLED_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


# Open :func:`held` blocks; a signal received inside them waits for the outermost to end.
_HOLDING: list[bool] = []


# Whether the interrupt was raised: only once, so a second Ctrl-C cannot cut the cleanup of the
# first.
_RAISED: list[bool] = []


def _raise_interrupted(signum: int, frame: object) -> None:
    if signum not in _RECEIVED[:1]:
        _RECEIVED.append(signum)
    if not _RAISED and not _HOLDING:
        _RAISED.append(True)
        raise Interrupted(_RECEIVED[0])


def _forward_termination(signals: list[int], sigint_ignored: bool) -> None:
    """Wait for SIGTERM/SIGHUP and pass each on as a SIGINT: Polars cancels a running query on
    SIGINT only, so a termination signal would otherwise wait until the query ends (seconds).
    The signal received first still names the exit (143 for SIGTERM)."""
    while True:
        signum = signal.sigwait(signals)
        if not _RECEIVED:
            _RECEIVED.append(signum)
        if sigint_ignored:
            _thread.interrupt_main(signal.Signals(signum))
        else:
            os.kill(os.getpid(), signal.SIGINT)


@contextlib.contextmanager
def held() -> Iterator[None]:
    """Hold Ctrl-C and termination signals back for the block; the first one that arrived
    meanwhile is raised when the (outermost) block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _HOLDING.append(True)
    try:
        yield
    finally:
        _HOLDING.pop()
    if not _HOLDING and _RECEIVED and not _RAISED:
        _RAISED.append(True)
        raise Interrupted(_RECEIVED[0])


def _raise_again_when_unraisable(unraisable: Any) -> None:
    """Python prints, and drops, an exception raised where nothing can catch it: a weakref's
    callback (the import system has one), a ``__del__``. An interrupt raised there is raised
    again at the main thread's next step instead, as if the signal had just come (seen: a Ctrl-C
    during start-up printed "Exception ignored in … Interrupted: SIGINT", and the run went on to
    the end)."""
    if isinstance(unraisable.exc_value, Interrupted) and _RECEIVED:
        _RAISED.clear()
        # From another thread, a moment later: the handler runs at the main thread's next
        # check, which would otherwise come inside this hook, where the exception would be
        # dropped again (threading.Thread.start would wait, and be that check).
        _thread.start_new_thread(_interrupt_main_again, ())
        return
    _PYTHON_UNRAISABLE_HOOK(unraisable)


def _interrupt_main_again() -> None:
    time.sleep(0.005)
    _thread.interrupt_main(signal.Signals(_RECEIVED[0]))


_PYTHON_UNRAISABLE_HOOK = sys.unraisablehook


def handle_signals() -> None:
    """Ctrl-C, SIGTERM and SIGHUP raise :class:`Interrupted` in the main thread (SIGTERM would
    otherwise end the process on the spot and leave its partial file behind). A signal the
    parent ignores (``nohup``, a background job) stays ignored."""
    sys.unraisablehook = _raise_again_when_unraisable
    ignored = [signum for signum in HANDLED_SIGNALS if signal.getsignal(signum) is signal.SIG_IGN]
    for signum in HANDLED_SIGNALS:
        if signum not in ignored:
            signal.signal(signum, _raise_interrupted)
    termination = [s for s in (signal.SIGTERM, signal.SIGHUP) if s not in ignored]
    if termination:
        # Blocked here, before Polars and Arrow start their threads (which inherit the mask), so
        # that only the forwarding thread receives them.
        signal.pthread_sigmask(signal.SIG_BLOCK, termination)
        threading.Thread(
            target=_forward_termination,
            args=(termination, signal.SIGINT in ignored),
            name="advcli-signals",
            daemon=True,
        ).start()
    if signal.SIGINT in ignored:
        # Polars catches SIGINT itself when it loads, whatever the process had chosen; load it
        # now and ignore SIGINT again after it.
        import polars  # noqa: F401

        signal.signal(signal.SIGINT, signal.SIG_IGN)


def hold_signals_until_exit() -> int | None:
    """Block the handled signals for the rest of the process (its shutdown runs Python code that
    a handler would interrupt) and return the first one received, or pending, if any."""
    _HOLDING.append(True)  # for good: no handler raises from here on
    signal.pthread_sigmask(signal.SIG_BLOCK, HANDLED_SIGNALS)
    arrived_signal()
    # Ignored, not only blocked: the mask is the main thread's, and Python's shutdown puts the
    # default action back for a signal it had a handler for, so a Ctrl-C reaching one of Polars'
    # threads then would kill the process (exit -2) after its output was published.
    for signum in HANDLED_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)
    return received_signal()


def received_signal() -> int | None:
    """The first signal :func:`handle_signals` caught, if any."""
    return _RECEIVED[0] if _RECEIVED else None


def arrived_signal() -> int | None:
    """The first signal caught, or else one that reached the process and waits to be: a
    termination signal is blocked in this thread and waits for the forwarding thread to take it.
    An error that raced such a signal (its sender closed the input the next moment) is the
    signal's doing, and is not reported beside it. A waiting signal counts as received."""
    if not _RECEIVED:
        pending = sorted(signal.sigpending() & set(HANDLED_SIGNALS))
        if pending:
            _RECEIVED.append(pending[0])
    return received_signal()


def signal_message(signum: int) -> str:
    """The one line a run ended by a signal prints."""
    what = "Interrupted" if signum == signal.SIGINT else "Terminated"
    return f"{what}; no partial output was left behind."


def exit_status(signum: int) -> int:
    """128 + the signal number, as a shell reports a process the signal ended."""
    return 128 + signum
