"""Ctrl-C at random moments of an advcli run, many times: how each run ended.

    python bench/signal_stress.py bench/data/dump-200000-128.parquet --runs 150 --window 2.0
    python bench/signal_stress.py DUMP --command compare --runs 100 --window 1.5

Each run gets one SIGINT at a random moment between the moment advcli's handlers are in place and
``--window`` seconds later (past the end of the run, so that some land after it). A run ends
well with exit code 130, the one "Interrupted" line and no file left behind (or the whole output,
when it was published before the signal), or, when the signal came after the run was complete,
with exit code 0 and the whole output. Anything else is printed and counted: a panic or a
traceback on stderr, another exit code (−2: killed by the signal), a file left behind.
"""

from __future__ import annotations

import argparse
import collections
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

INTERRUPTED = "Interrupted; no partial output was left behind."


def wait_for_handlers(process: subprocess.Popen) -> None:
    """Until the process catches SIGTERM: advcli's handlers are then in place."""
    status = Path(f"/proc/{process.pid}/status")
    while process.poll() is None:
        caught = next(
            (line.split()[1] for line in status.read_text().splitlines() if "SigCgt" in line), "0"
        )
        if int(caught, 16) & (1 << (signal.SIGTERM - 1)):
            return
        time.sleep(0.0005)


def one_run(dump: str, command: str, moment: float) -> tuple[str, str]:
    """(how the run ended, what it printed on stderr)."""
    with tempfile.TemporaryDirectory() as folder, tempfile.TemporaryDirectory() as tmp:
        output = Path(folder) / "out.parquet"
        args = [sys.executable, "-m", "advcli", command, dump]
        args += ["-o", str(output)] if command == "compute" else ["--json", str(output)]
        env = {**os.environ, "TMPDIR": tmp, "MPLCONFIGDIR": tmp, "RUST_BACKTRACE": "1"}
        process = subprocess.Popen(
            args,
            cwd=folder,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        wait_for_handlers(process)
        time.sleep(moment)
        process.send_signal(signal.SIGINT)
        _, raw = process.communicate()
        stderr = raw.decode(errors="replace")
        left = sorted(os.listdir(folder)) + [f"$TMPDIR/{name}" for name in os.listdir(tmp)]
    if "panicked" in stderr or "stack backtrace" in stderr:
        return "panic", stderr
    if "Traceback" in stderr:
        return "traceback", stderr
    if process.returncode == 130:
        if stderr.splitlines() == [INTERRUPTED] and not left:
            return "130, clean", stderr
        if stderr.splitlines() == [INTERRUPTED] and left == ["out.parquet"]:
            # The output was whole and published; the run was then cut while it ended.
            return "130, after the output was published", stderr
        return f"130, stderr or files wrong ({left})", stderr
    if process.returncode == 0:
        return ("0, after the end" if left == ["out.parquet"] else f"0, files {left}"), stderr
    return f"exit {process.returncode}", stderr


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dump")
    parser.add_argument("--command", choices=["compute", "compare"], default="compute")
    parser.add_argument("--runs", type=int, default=150)
    parser.add_argument("--window", type=float, default=2.0, help="seconds after start-up")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    moments = random.Random(args.seed)
    tally: collections.Counter[str] = collections.Counter()
    dump = str(Path(args.dump).resolve())  # each run works in a folder of its own
    for index in range(args.runs):
        moment = moments.uniform(0, args.window)
        ended, stderr = one_run(dump, args.command, moment)
        tally[ended] += 1
        if ended not in ("130, clean", "130, after the output was published", "0, after the end"):
            print(f"run {index}, SIGINT at {moment:.3f} s: {ended}\n{stderr[-1500:]}", flush=True)
    print(f"{args.runs} runs of advcli {args.command}, SIGINT within {args.window} s:")
    for ended, count in tally.most_common():
        print(f"  {count:4d}  {ended}")


if __name__ == "__main__":
    main()
