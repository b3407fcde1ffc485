"""Points of a study run side by side, each an ordinary ``TinyStories.py`` process.

    lock = hold_study(path, name)                        # one runner per study folder, for its life
    codes = run_points([(folder, args), ...], workers)   # exit codes, None for a point never started
    code = run_point(args)                               # one point, in the foreground

Each point runs on one thread (so its score does not depend on how many run together), in a process group of
its own: a SIGTERM or Ctrl-C to the study, sent to its pid or to its whole process group (as ``timeout``, a
batch scheduler or a terminal sends it), reaches every running point once, from the study, and the point
checkpoints before it stops (a second signal stops a point at once). A study process that dies (even by
SIGKILL) takes its points with it (Linux: they get the SIGTERM), so none trains on orphaned.

A point on the CPU is forked from multiprocessing's fork server, which has imported torch once: a new Python
spends about 6 s importing torch and torch._dynamo (torch's optimizers import it on first use) before its
point trains, most of a small point's time. The forked process looks to TinyStories.py as a new one would
(its arguments, environment, folder, threads, output; ``ps`` shows its command line). A point on a GPU or a
TPU chip gets a new Python: its device's runtime starts from the environment its slot gives, in a process
where none was started.
"""

from __future__ import annotations

import ctypes
import multiprocessing
import os
import runpy
import signal
import subprocess
import sys
import threading
import time
from multiprocessing import reduction
from pathlib import Path

import setproctitle

from reservoir.platform import stopping
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


# what the fork server imports, once: "__main__" is the study's script (scaling.py), which multiprocessing would
# otherwise import again in each point before it starts
WARM_MODULES = ["__main__", "torch", "torch._dynamo", "configs", "reservoir.run.experiment"]


_LIFELINE: list[int] = []  # a pipe nothing is written to: its read end is handed to each forked point


def _lifeline() -> int:
    """The read end of a pipe whose write end only this (the study's) process holds, for as long as it lives."""
    if not _LIFELINE:
        _LIFELINE.extend(os.pipe())
    return _LIFELINE[0]


def _stop_when_the_study_ends(lifeline: int) -> None:
    """In a forked point: SIGTERM when the study's process ends, however it ends (the read sees end of file),
    so the point checkpoints and stops. PR_SET_PDEATHSIG would watch the fork server, which outlives the study
    while a point it forked runs."""
    def watch():
        while os.read(lifeline, 1):
            pass
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="study-lifeline", daemon=True).start()


class _Descriptor:
    """One of the study's open files, handed to a forked point through the fork server's socket (SCM_RIGHTS):
    the terminal, or the point's log."""

    def __init__(self, fd: int):
        self.fd = fd

    def __reduce__(self):
        return _received, (reduction.DupFd(self.fd),)


def _received(dup) -> int:
    return dup.detach()


def _forked_point(args: list[str], env: dict, cwd: str, stdout: int, stderr: int, lifeline: int,
                  ctrl_c_ignored: bool) -> None:
    """A point's process, forked from the fork server: given what a new ``python TinyStories.py ARGS`` started
    by the study would have (its output, folder, environment, threads, signals), then the script is run."""
    # ps and top show the point's command (set before the environment changes: setproctitle needs its layout)
    setproctitle.setproctitle(" ".join([sys.executable, str(ENTRY_POINT), *args]))
    os.setpgid(0, 0)  # its own group: a signal to the study's group reaches it once, from the study
    as_a_new_process()  # the fork server's SIGTERM was ignored (see _start_fork_server)
    _stop_when_the_study_ends(lifeline)
    for fd, target in ((stdout, 1), (stderr, 2)):
        os.dup2(fd, target)
    for fd in {stdout, stderr} - {1, 2}:
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):  # a new Python's buffering: by line on a terminal
        stream.reconfigure(line_buffering=stream.isatty())
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    import torch  # imported by the fork server; the threads a new process would take from OMP_NUM_THREADS
    torch.set_num_threads(int(env.get("OMP_NUM_THREADS") or usable_cores()))
    signal.signal(signal.SIGINT, signal.SIG_IGN if ctrl_c_ignored else signal.default_int_handler)
    sys.argv = [str(ENTRY_POINT), *args]
    sys.path.insert(0, str(ENTRY_POINT.parent))
    try:
        runpy.run_path(str(ENTRY_POINT), run_name="__main__")
    except KeyboardInterrupt:  # as a new Python ends on an uncaught Ctrl-C: killed by SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)


class _ForkedProcess:
    """A forked point, with the part of subprocess.Popen's interface the runner uses."""

    def __init__(self, process):
        self.process, self.pid = process, process.pid

    @property
    def returncode(self) -> int | None:
        return self.process.exitcode  # -N when killed by signal N, as Popen's

    def poll(self) -> int | None:
        return self.process.exitcode

    def wait(self) -> int:
        self.process.join()
        return self.process.exitcode

    def send_signal(self, signum: int) -> None:
        if self.process.exitcode is None:
            try:
                os.kill(self.pid, signum)
            except ProcessLookupError:  # it ended just now
                pass


def fork_context():
    """multiprocessing's fork server, preloaded with WARM_MODULES, whose processes a study's CPU points (and
    PLAN=True's probes) are forked from; None where the platform has none."""
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return None
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(WARM_MODULES)
    _start_fork_server()
    return context


_FORK_SERVER: list[bool] = []  # started here, once a process


def _start_fork_server() -> None:
    """The fork server, started (once) with SIGTERM ignored: a SIGTERM to the study's process group would end it,
    and the study would then read each point it forked as ended with exit code 255 while the point still trains.
    It ends with the study all the same (its pipe from the study closes); what it forks sets SIGTERM back to the
    default first (``_forked_point``, ``as_a_new_process``)."""
    from multiprocessing import forkserver

    if _FORK_SERVER or threading.current_thread() is not threading.main_thread():
        return  # started already, or by the first point as multiprocessing would start it
    before = signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a signal in these milliseconds is lost: once a study
    try:
        forkserver.ensure_running()
        _FORK_SERVER.append(True)
    finally:
        signal.signal(signal.SIGTERM, before)


def as_a_new_process() -> None:
    """In a process forked from the fork server (a pool's initializer): SIGTERM ends it, as it ends a new one."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def start_point(args: list[str], env: dict, on_cpu: bool, log=None, stderr=None):
    """A point's process, ``python TinyStories.py ARGS`` with ``env``, its output to ``log`` (an open file) or
    to the study's, its errors with its output or to ``stderr`` (an open file): forked from the fork server when
    it runs on the CPU, else a new Python."""
    context = fork_context() if on_cpu else None
    if stderr is None and log is not None:
        stderr = subprocess.STDOUT if context is None else log
    if context is None:
        return subprocess.Popen([sys.executable, str(ENTRY_POINT), *args], env=env, stdout=log, stderr=stderr,
                                preexec_fn=_stop_with_the_study, process_group=0)  # its own group: see above
    out = (1 if log is None else log.fileno(), 2 if stderr is None else stderr.fileno())
    for stream in (sys.stdout, sys.stderr):  # what the study printed comes before what the point prints
        stream.flush()
    process = context.Process(target=_forked_point, name="point", args=(
        args, env, os.getcwd(), *(_Descriptor(fd) for fd in out), _Descriptor(_lifeline()),
        signal.getsignal(signal.SIGINT) is signal.SIG_IGN))
    process.start()
    return _ForkedProcess(process)


def run_point(args: list[str], on_cpu: bool = False) -> int:
    """One point as its own TinyStories.py process (forked, ``on_cpu``: see the module's docstring); a SIGTERM or
    Ctrl-C to the study is passed on to it, so it checkpoints before the study stops (its exit code says how)."""
    proc = start_point(args, dict(os.environ), on_cpu)
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    forward = stopping.once_per_request(proc.send_signal)  # the point decides how to stop
    for signum in previous:
        signal.signal(signum, forward)
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
    error when it stops. A SIGTERM or Ctrl-C to the study reaches every running point once, which checkpoints
    before stopping. ``finished(folder) -> bool``: whether a point that exited with a signal has its records
    complete all the same (it finished as the study was stopped). ``more() -> (folder, args) | None``: a point
    to add when a slot is free and ``jobs`` are all started (a shared study claims its next point so, as soon as
    a slot ends its last one); after a None it is not asked again. ``ended(k, code)``: told as the k-th point
    (in the order given) exits, before its slot takes another, or with None if a signal came before it started."""
    slots = [ONE_CORE] * workers if isinstance(workers, int) else list(workers)
    _warn_if_oversubscribed(sum(slot.label == "cpu" for slot in slots))
    free = list(range(len(slots)))  # the slots no point holds now
    running: dict[int, tuple[subprocess.Popen | _ForkedProcess, object, Path, int]] = {}
    jobs = list(jobs)
    codes: list[int | None] = [None] * len(jobs)
    stopping_signal = {"sent": None}

    def send_to_all(signum):
        stopping_signal["sent"] = signum
        for proc, *_ in running.values():
            proc.send_signal(signum)

    forward = stopping.once_per_request(send_to_all)

    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    for signum in previous:  # the points are in groups of their own: each gets the signal once, from here
        signal.signal(signum, forward)
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
                env, on_cpu = {**os.environ, **slots[slot].env}, slots[slot].label == "cpu"
                if len(slots) == 1:
                    running[k] = (start_point(args, env, on_cpu), None, folder, slot)
                    continue
                log = folder.parent.parent / "logs" / f"{folder.parent.name}@{folder.name}.log"
                make_folder(log.parent)
                handle = log.open("a", encoding="utf-8")
                running[k] = (start_point(args, env, on_cpu, handle), handle, folder, slot)
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
