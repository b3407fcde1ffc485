"""How busy the machine was while a model trained: a wall-clock budget means little without it.

    with MachineLoad() as load:
        ...                                   # train
    load.report()   # {'runnable_mean', 'load_avg_1min', 'cores', 'cpu_share', 'oversubscribed'}

A background thread reads the kernel's count of runnable threads (``/proc/loadavg``, fourth field,
this process's own busy threads included) every ``interval`` seconds; elsewhere it falls back to
the 1-minute load average. ``cpu_share`` is the CPU time this process got over the wall time
times the cores its compute threads could use (a one-thread run that kept its core has a share of 1).
The machine counts as *oversubscribed* when more threads wanted to run, on average, than it has
cores (with half a core of slack) *and* this process got less than ``FULL_SHARE`` of them: the
model then got less than the machine, and its tokens/s and time-budgeted score understate it.
(Threads of ``nice``d work are counted as runnable but take little from a process at normal
priority; the CPU share keeps them from raising the flag.)

What this machine is (``processor``, ``instruction_set``, ``usable_cores``) is read here alone, and each may be
pretended, as a test aid, so that what depends on the machine is tried as another machine would run it:

    RESERVOIR_PRETEND_PROCESSOR="AMD EPYC 7B13"   # the processor name every record of a run names
    RESERVOIR_PRETEND_ISA=AVX2                    # the float kernels torch dispatches to, as recorded
    RESERVOIR_PRETEND_CORES=2                     # the cores a study counts (WORKERS=auto, threads)

Only what is reported changes: the kernels that run are this machine's (ATEN_CPU_CAPABILITY chooses them).
"""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

from reservoir.platform.messages import OneLineError

SLACK = 0.5  # runnable threads above the cores (on average) before a run counts as oversubscribed
FULL_SHARE = 0.9  # ... and only if this process got less than this share of the cores
LOADAVG = Path("/proc/loadavg")


PRETEND = {"processor": "RESERVOIR_PRETEND_PROCESSOR", "isa": "RESERVOIR_PRETEND_ISA",
           "cores": "RESERVOIR_PRETEND_CORES"}  # what this machine reports -> the variable that overrides it


class MachineError(OneLineError):
    """A pretended machine that cannot be (an empty name, cores that are not a positive whole number)."""


def pretended(fact: str) -> str | None:
    """The value ``PRETEND[fact]`` overrides ``fact`` with, None where it is not set."""
    value = os.environ.get(PRETEND[fact])
    if value is None:
        return None
    if not value.strip():
        raise MachineError(f"{PRETEND[fact]} is set but empty: give the {fact} to report, or unset it")
    return value.strip()


_IMPORTED = time.time()  # where /proc cannot say when the process started: close to it


def process_start(pid: int | str = "self") -> int | None:
    """When process ``pid`` started, in clock ticks since boot (Linux's /proc): with the pid, what tells a live
    process from a later one that reused its pid. None where /proc does not say."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[19])  # field 22, counted after the command's name
    except (OSError, ValueError, IndexError):
        return None


def process_seconds() -> float:
    """Seconds since this process started (Linux: its start time in /proc, so the interpreter's and torch's
    start-up count too; elsewhere since this module was imported)."""
    started = process_start()
    try:
        uptime = float(Path("/proc/uptime").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        started = None
    if started is None:
        return time.time() - _IMPORTED
    return max(0.0, uptime - started / os.sysconf("SC_CLK_TCK"))


def usable_cores() -> int:
    """The cores this process may use (its affinity), or RESERVOIR_PRETEND_CORES."""
    if (cores := pretended("cores")) is not None:
        if not cores.isdigit() or int(cores) < 1:
            raise MachineError(f"RESERVOIR_PRETEND_CORES={cores}: give a whole number of cores, at least 1")
        return int(cores)
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def runnable_threads() -> float:
    """Threads that are running or waiting for a core right now (the reader itself not counted)."""
    try:
        running = LOADAVG.read_text().split()[3].split("/")[0]
        return max(0.0, float(running) - 1)
    except (OSError, IndexError, ValueError):
        return os.getloadavg()[0]


class MachineLoad:
    def __init__(self, threads: int | None = None, interval: float = 1.0):
        self.interval, self.threads = interval, threads  # threads: the process's compute threads (None: a core each)
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name="machine-load", daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.samples.append(runnable_threads())

    def __enter__(self) -> MachineLoad:
        self._wall, self._cpu = time.perf_counter(), _process_cpu_seconds()
        self.samples.append(runnable_threads())
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.samples.append(runnable_threads())
        self.wall, self.cpu = time.perf_counter() - self._wall, _process_cpu_seconds() - self._cpu

    def report(self) -> dict:
        cores = usable_cores()
        mean = sum(self.samples) / len(self.samples)
        share = self.cpu / max(self.wall * min(cores, self.threads or cores), 1e-9)
        return {"runnable_mean": round(mean, 2), "runnable_max": round(max(self.samples), 2),
                "load_avg_1min": round(os.getloadavg()[0], 2), "cores": cores, "cpu_share": round(share, 3),
                "oversubscribed": is_oversubscribed(mean, cores, share)}


def is_oversubscribed(runnable_mean: float, cores: int, cpu_share: float) -> bool:
    """More threads wanted the cores than there were, and this process got less than its full share."""
    return runnable_mean > cores + SLACK and cpu_share < FULL_SHARE


def _process_cpu_seconds() -> float:
    times = os.times()
    return times.user + times.system


def processor() -> str:
    """The processor's model name (/proc/cpuinfo; elsewhere what the platform says), recorded with every run: one
    setting trained on two kinds of processor may score differently (their float kernels differ, and training
    amplifies that), and the records then say which ran where."""
    import platform

    if (name := pretended("processor")) is not None:
        return name
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace").splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.partition(":")[2].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


ISA_NAMES = ("DEFAULT", "AVX2", "AVX512", "VSX", "ZVECTOR", "SVE128", "SVE256", "SVE512")  # torch's CPU kernels


def check_pretended() -> None:
    """Every RESERVOIR_PRETEND_* value checked at once, as each entry point starts (before any data is read or any
    model trained): a processor named, a known instruction set, a whole number of cores >= 1. Only what is set
    is read: the machine's own facts are read where a run records them."""
    pretended("processor")
    if pretended("cores") is not None:
        usable_cores()
    isa = pretended("isa")
    if isa is not None and isa.upper() not in ISA_NAMES:
        raise MachineError(f"RESERVOIR_PRETEND_ISA={isa}: give one of the instruction sets torch's CPU kernels "
                           f"report ({', '.join(ISA_NAMES)}), or unset it")


def instruction_set() -> str:
    """The widest vector instructions torch's CPU kernels dispatch to here ('AVX512', 'AVX2', 'DEFAULT', ...;
    ATEN_CPU_CAPABILITY lowers it), or RESERVOIR_PRETEND_ISA: with the processor, what decides a run's floats."""
    if (isa := pretended("isa")) is not None:
        return isa.upper()
    import torch

    try:
        return str(torch.backends.cpu.get_cpu_capability())
    except (AttributeError, RuntimeError):  # a torch before 2.1
        return "unknown"
