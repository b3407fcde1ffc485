"""Points of a study run side by side, each an ordinary ``TinyStories.py`` process.

    lock = hold_study(path, name)                        # one runner per study folder, for its life
    codes = run_points([(folder, args), ...], workers)   # exit codes, None for a point never started
    code = run_point(args)                               # one point, in the foreground

Each point runs on one thread (so its score does not depend on how many run together); a SIGTERM to the
study reaches every running point, which checkpoints before it stops, and a study process that dies
(even by SIGKILL) takes its points with it (Linux: they get the SIGTERM), so none trains on orphaned.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from reservoir.platform.device import Slot, point_slots
from reservoir.platform.files import Busy, lock_folder, make_folder
from reservoir.platform.machine import usable_cores
from reservoir.platform.messages import OneLineError, say, warn

ENTRY_POINT = Path(__file__).resolve().parents[2] / "TinyStories.py"  # the script a point runs


def exit_status(code: int) -> int:
    """A child's return code as a shell's exit status: killed by signal N (Popen's -N) is 128 + N (SIGTERM:
    143), never -N, which sys.exit would turn into 256 - N (241)."""
    return 128 - code if code < 0 else code


class StudyBusy(OneLineError, RuntimeError):
    """Another process runs this study: one line that says which, and what to do."""


def hold_study(path: Path, name: str) -> int:
    """The study folder ``path``, created and locked for as long as the returned descriptor is open (the OS
    drops the lock when the process dies): a second copy of the study's command stops here, before it runs
    any point."""
    make_folder(path)
    try:
        return lock_folder(path)
    except Busy as e:
        raise StudyBusy(f"STUDY {name} ({path}) is being run by {e.holder}; wait for it to finish, or stop it "
                        "(kill -TERM that pid: its points checkpoint), then run the same command again to "
                        "continue it") from None


PR_SET_PDEATHSIG = 1


def _stop_with_the_study() -> None:
    """In a point's process before it starts (Linux): SIGTERM when the study process dies, however it dies,
    so the point checkpoints and stops instead of training on orphaned, holding its folder."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: a killed study's points then run to their end
        return
    if os.getppid() == 1:  # the study died before prctl took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _last_words(log: Path) -> str:
    """What a stopped point said last: its one-line error, or else its log's last line."""
    try:
        with log.open("rb") as handle:
            handle.seek(max(0, log.stat().st_size - 8192))
            lines = [line.strip() for line in handle.read().decode(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    errors = [line for line in lines if line.startswith("error:")]
    return (errors or lines or [""])[-1]


_WARNED: set[int] = set()


def _warn_if_oversubscribed(workers: int) -> None:
    """Once per process: more one-thread points at once than usable cores share the cores (scores stay the same;
    every point, and the study, runs slower)."""
    cores = usable_cores()
    if workers > cores and workers not in _WARNED:
        _WARNED.add(workers)
        warn(f"WORKERS={workers} runs more points at once than the {cores} cores this process may use: they share "
             f"the cores and each runs slower (their scores do not change); WORKERS={cores} finishes sooner")


def run_point(args: list[str]) -> int:
    """One point as its own TinyStories.py process; a SIGTERM to the study is passed on to it (Ctrl-C
    reaches it directly, from the terminal), so it checkpoints before the study stops."""
    proc = subprocess.Popen([sys.executable, str(ENTRY_POINT), *args], preexec_fn=_stop_with_the_study)
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the point decides how to stop; its exit code says
    try:
        return proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


ONE_CORE = point_slots("cpu", ["0"], 1, 1)[0]  # a number of WORKERS: that many of these


def run_points(jobs: list[tuple[Path, list[str]]], workers: int | list[Slot], finished=None, more=None,
               ended=None) -> list[int | None]:
    """Points side by side, one in each of ``workers`` (the slots platform.device.study_slots gives: a core, a
    GPU, a TPU chip block, each with the environment that confines a point's process to it; a number: that
    many one-thread CPU points). With one slot a point prints to the terminal; with more, each writes its own
    log (<study>/logs/) and a line here says when it starts, where, and how it ends, with the point's own
    error when it stops. A SIGTERM to the study reaches every running point, which checkpoints before
    stopping. ``finished(folder) -> bool``: whether a point that exited with a signal has its records
    complete all the same (it finished as the study was stopped). ``more() -> (folder, args) | None``: a point
    to add when a slot is free and ``jobs`` are all started (a shared study claims its next point so, as soon as
    a slot ends its last one); after a None it is not asked again. ``ended(k, code)``: told as the k-th point
    (in the order given) exits, before its slot takes another, or with None if a signal came before it started."""
    slots = [ONE_CORE] * workers if isinstance(workers, int) else list(workers)
    _warn_if_oversubscribed(sum(slot.label == "cpu" for slot in slots))
    free = list(range(len(slots)))  # the slots no point holds now
    running: dict[int, tuple[subprocess.Popen, object, Path, int]] = {}
    jobs = list(jobs)
    codes: list[int | None] = [None] * len(jobs)
    stopping_signal = {"sent": None}

    def forward(signum, frame):
        stopping_signal["sent"] = signum
        for proc, *_ in running.values():
            proc.send_signal(signum)

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the points from the terminal
    pending = list(range(len(jobs)))
    try:
        while pending or running or more is not None:
            while more is not None and not pending and free and stopping_signal["sent"] is None:
                job = more()
                if job is None:
                    more = None
                    break
                jobs.append(job)
                codes.append(None)
                pending.append(len(jobs) - 1)
            if more is not None and stopping_signal["sent"] is not None:
                more = None
            while pending and free and stopping_signal["sent"] is None:
                k, slot = pending.pop(0), free.pop(0)
                folder, args = jobs[k]
                command = [sys.executable, str(ENTRY_POINT), *args]
                env = {**os.environ, **slots[slot].env}
                if len(slots) == 1:
                    running[k] = (subprocess.Popen(command, env=env, preexec_fn=_stop_with_the_study), None, folder,
                                  slot)
                    continue
                log = folder.parent.parent / "logs" / f"{folder.parent.name}@{folder.name}.log"
                make_folder(log.parent)
                handle = log.open("a", encoding="utf-8")
                running[k] = (subprocess.Popen(command, env=env, stdout=handle, stderr=subprocess.STDOUT,
                                               preexec_fn=_stop_with_the_study), handle, folder, slot)
                on = "" if slots[slot].label == "cpu" else f" on {slots[slot].label}"
                say(f"started {folder.parent.name}/{folder.name}{on} (log: {log})")
            if stopping_signal["sent"] is not None:
                for k in pending if ended is not None else []:  # claimed, never started: the caller hands it back
                    ended(k, None)
                pending.clear()
            for k, (proc, handle, folder, slot) in list(running.items()):
                if proc.poll() is None:
                    continue
                codes[k] = proc.returncode
                if handle is not None:
                    handle.close()
                    where, code = f"{folder.parent.name}/{folder.name}", exit_status(proc.returncode)
                    if code == 0:
                        say(f"finished: {where}")
                    elif finished is not None and finished(folder):
                        say(f"finished: {where} (its records are complete; it exited {code} as the study stopped)")
                    else:
                        said = _last_words(Path(handle.name))
                        say(f"stopped (exit code {code}): {where}" + (f": {said}" if said else "")
                            + f" (log: {handle.name})")
                del running[k]
                if ended is not None:
                    ended(k, exit_status(proc.returncode))
                free = sorted([*free, slot])
            time.sleep(0.2)
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    return [None if code is None else exit_status(code) for code in codes]  # None: never started (a signal came)
