"""Points of a study run side by side, each an ordinary ``TinyStories.py`` process.

    codes = run_points([(folder, args), ...], workers)   # exit codes, None for a point never started
    code = run_point(args)                               # one point, in the foreground

Each point runs on one thread (so its score does not depend on how many run together); a SIGTERM to the
study reaches every running point, which checkpoints before it stops.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from reservoir.platform.messages import say

ENTRY_POINT = Path(__file__).resolve().parents[2] / "TinyStories.py"  # the script a point runs


def exit_status(code: int) -> int:
    """A child's return code as a shell's exit status: killed by signal N (Popen's -N) is 128 + N (SIGTERM:
    143), never -N, which sys.exit would turn into 256 - N (241)."""
    return 128 - code if code < 0 else code


def run_point(args: list[str]) -> int:
    """One point as its own TinyStories.py process; a SIGTERM to the study is passed on to it (Ctrl-C
    reaches it directly, from the terminal), so it checkpoints before the study stops."""
    proc = subprocess.Popen([sys.executable, str(ENTRY_POINT), *args])
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the point decides how to stop; its exit code says
    try:
        return proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def run_points(jobs: list[tuple[Path, list[str]]], workers: int) -> list[int | None]:
    """Points side by side, at most ``workers`` at once, each a TinyStories.py process on one thread (so its
    score does not depend on how many run together). With one worker a point prints to the terminal; with
    more, each writes its own log (<study>/logs/) and a line here says when it starts and ends. A SIGTERM
    to the study reaches every running point, which checkpoints before stopping."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    running: dict[int, tuple[subprocess.Popen, object, Path]] = {}
    codes: list[int | None] = [None] * len(jobs)
    stopping_signal = {"sent": None}

    def forward(signum, frame):
        stopping_signal["sent"] = signum
        for proc, _, _ in running.values():
            proc.send_signal(signum)

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the points from the terminal
    pending = list(range(len(jobs)))
    try:
        while pending or running:
            while pending and len(running) < workers and stopping_signal["sent"] is None:
                k = pending.pop(0)
                folder, args = jobs[k]
                command = [sys.executable, str(ENTRY_POINT), *args]
                if workers == 1:
                    running[k] = (subprocess.Popen(command, env=env), None, folder)
                    continue
                log = folder.parent.parent / "logs" / f"{folder.parent.name}@{folder.name}.log"
                log.parent.mkdir(parents=True, exist_ok=True)
                handle = log.open("a", encoding="utf-8")
                running[k] = (subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT), handle,
                              folder)
                say(f"started {folder.parent.name}/{folder.name} (log: {log})")
            if stopping_signal["sent"] is not None:
                pending.clear()
            for k, (proc, handle, folder) in list(running.items()):
                if proc.poll() is None:
                    continue
                codes[k] = proc.returncode
                if handle is not None:
                    handle.close()
                    say(f"{'finished' if proc.returncode == 0 else f'stopped (exit code {proc.returncode})'}: "
                        f"{folder.parent.name}/{folder.name}")
                del running[k]
            time.sleep(0.2)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return [None if code is None else exit_status(code) for code in codes]  # None: never started (a signal came)
