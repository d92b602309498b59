"""The ``advcli`` command's entry point (also ``python -m advcli``).

It owns the process: standard streams that were closed get ``/dev/null``, signals get their
handler before anything heavy is imported, and a signal ends the run with one line and exit code
128 + its number, whatever was running when it came.
"""

import sys

from advcli.process import (
    exit_status,
    flush_stdout,
    guard_standard_streams,
    handle_signals,
    received_signal,
    signal_message,
    tune_allocator,
)


def main() -> None:
    guard_standard_streams()
    handle_signals()
    tune_allocator()
    code: str | int | None = 0
    try:
        from advcli.cli import app

        app(prog_name="advcli")
    except SystemExit as done:
        code = done.code
    except KeyboardInterrupt:  # before the command line could take it over
        code = 130
    failed_write = flush_stdout()
    if failed_write is not None and code == 0:
        sys.stderr.write(f"Error: standard output: cannot write ({failed_write})\n")
        code = 1
    signum = received_signal()
    if signum is not None:
        # Also when a library swallowed the interrupt and the command ran on: never exit 0.
        sys.stderr.write(signal_message(signum) + "\n")
        code = exit_status(signum)
    sys.exit(code)


if __name__ == "__main__":
    main()
