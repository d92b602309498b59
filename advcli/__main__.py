"""The ``advcli`` command's entry point (also ``python -m advcli``).

It owns the process: standard streams that were closed get ``/dev/null``, signals get their
handler before anything heavy is imported, and a signal ends the run with one line and exit code
128 + its number, whatever was running when it came.
"""

import atexit
import gc
import os
import signal
import sys
from typing import NoReturn

from advcli._runtime.process import (
    flush_stdout,
    guard_standard_streams,
    silence_stdout,
    single_blas_thread,
    tune_allocator,
)
from advcli._runtime.signals import (
    exit_status,
    handle_signals,
    hold_signals_until_exit,
    received_signal,
    signal_message,
)


def main() -> None:
    guard_standard_streams()
    code: str | int | None = 0
    failed_write = None
    try:
        # Inside the try: a Ctrl-C that comes once the handler is in place, while the rest of
        # this sets up, ends like any other.
        handle_signals()
        tune_allocator()
        single_blas_thread()
        from advcli.cli.app import app

        app(prog_name="advcli")
    except SystemExit as done:
        code = done.code
    except KeyboardInterrupt:  # before the command line could take it over
        code = exit_status(signal.SIGINT)
    except BrokenPipeError:  # help or version text into a closed pipe
        silence_stdout()
        code = exit_status(signal.SIGPIPE)
    except OSError as error:  # help or version text onto a full disk
        silence_stdout()  # what its buffer holds would fail again at exit
        failed_write = error.strerror or type(error).__name__
    except Exception:
        # The interrupt raised inside code that turns it into an error of its own: Python wraps
        # an exception from a class attribute's __set_name__ (rich's import has one) in a
        # RuntimeError. The signal names the exit below; any other error is a bug to show.
        if received_signal() is None:
            raise
    # From here on no signal interrupts: the last flush and the interpreter's shutdown run
    # Python code that a handler would cut short.
    signum = hold_signals_until_exit()
    # What is alive now is freed with the process: the collections of the interpreter's exit
    # would walk the tens of thousands of objects the imports made, for no file or resource
    # (every output is closed and published by now, and atexit's handlers run regardless).
    gc.freeze()
    failed_write = failed_write or flush_stdout()
    if signum is None and code == exit_status(signal.SIGINT):
        # A KeyboardInterrupt raised by a library (Polars has its own SIGINT handler).
        signum = signal.SIGINT
    if signum is not None:
        # Polars' cancelled tasks may still report, as panics, up to the end of the process.
        from advcli._runtime.native_stderr import native_stderr_to_null

        native_stderr_to_null()
        # Also when a library swallowed the interrupt and the command ran on: never exit 0.
        sys.stderr.write(signal_message(signum) + "\n")
        _end_without_teardown(exit_status(signum))
    elif failed_write is not None and code == 0:
        sys.stderr.write(f"Error: standard output: cannot write ({failed_write})\n")
        code = 1
    sys.exit(code)


def _end_without_teardown(code: int) -> NoReturn:
    """End a run a signal ended: the exit handlers run (a local Ray cluster is stopped), the
    interpreter's teardown does not. The cancelled queries' native threads may still be running,
    and tearing the interpreter down under them aborted the process (SIGABRT, seen under load
    in CI) after its one line was printed; a run ended by a signal has nothing else to finish."""
    atexit._run_exitfuncs()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
