"""Stopping early and safely: SIGTERM / Ctrl-C, and models whose training diverges.

    stopping.install()                 # the runner, once per process: SIGTERM and SIGINT set a flag
    if stopping.requested(): ...       # the training loop: finish the step, checkpoint, raise Stopped

Preemptible TPU VMs and cluster schedulers send SIGTERM and kill a little later; Ctrl-C is
SIGINT. The first signal asks the loop to stop after its current step and checkpoint; a second
one aborts at once (SIGINT as KeyboardInterrupt, SIGTERM with its default action). A second is a
person's only when it comes ``SAME_REQUEST_S`` or more after the first: ``timeout`` signals its command
and then the command's whole process group, and ``kill -TERM -<pgid>`` reaches a process that forwards it
as well, so one request can arrive twice within microseconds, and must not lose the steps since the last
checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import signal
import threading
import time
import types

from reservoir.platform.messages import warn

_requested: str | None = None
_requested_at = 0.0  # time.monotonic() of the first signal
SAME_REQUEST_S = 1.0  # a signal this soon after the first is the same request delivered twice, not a person's second
_announce = True  # the first signal says what happens next (a runner's own line may say it instead)


class Stopped(Exception):
    """The run stopped on a signal; ``saved`` says what RESUME continues from."""

    def __init__(self, signal_name: str, model: str | None, saved: str):
        super().__init__(f"stopped by {signal_name}")
        self.signal_name, self.model, self.saved = signal_name, model, saved

    @property
    def exit_code(self) -> int:
        return 128 + int(getattr(signal, self.signal_name, signal.SIGTERM))


class Diverged(Exception):
    """A model whose training produced non-finite numbers: that model stops, the run goes on."""

    def __init__(self, model: str, step: int, reason: str, advice: str, tokens: int = 0, seconds: float = 0.0):
        super().__init__(f"{model} diverged at step {step} ({reason}); {advice}")
        self.model, self.step, self.reason, self.advice = model, step, reason, advice
        self.tokens, self.seconds = tokens, seconds  # how far training got


def repeated(first_at: float | None) -> bool:
    """Whether a signal now is the one first seen at ``first_at`` (time.monotonic()) delivered again."""
    return first_at is not None and time.monotonic() - first_at < SAME_REQUEST_S


def once_per_request(act):
    """A signal handler that calls ``act(signum)`` once per request: the same request delivered again within
    SAME_REQUEST_S (timeout's copy to the group) is dropped, a person's second signal is passed on."""
    first_at: list[float | None] = [None]

    def handler(signum, frame) -> None:
        if not repeated(first_at[0]):
            first_at[0] = time.monotonic()
            act(signum)

    return handler


def _handler(signum, frame) -> None:
    global _requested, _requested_at
    name = signal.Signals(signum).name
    if _requested is not None and repeated(_requested_at):
        return
    if _requested is not None:  # a person's second signal: stop now, whatever is running
        signal.signal(signum, signal.SIG_DFL)
        if signum == signal.SIGINT:
            raise KeyboardInterrupt
        os.kill(os.getpid(), signum)
        return
    _requested, _requested_at = name, time.monotonic()
    if _announce:
        warn(f"{name} received: finishing the current step, then saving a checkpoint "
             f"(send it again to stop at once, losing the work since the last checkpoint)")


def install(announce: bool = True) -> None:
    """Route SIGTERM and SIGINT to the flag. Python lets only the main thread do that; a run started in
    another thread (torch_xla's launcher on XLA:CPU) shares the flag its process's main thread set up.
    ``announce=False``: the first signal is not said (the caller says in its own line how it stopped)."""
    global _requested, _announce
    if threading.current_thread() is not threading.main_thread():
        return
    _requested, _announce = None, announce
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _handler)


@contextlib.contextmanager
def installed(announce: bool = True):
    """``install`` for a with block: the signal handlers from before it are put back after it (a probe set
    called from a longer program leaves that program's Ctrl-C as it was)."""
    before = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGINT)}
    install(announce)
    try:
        yield
    finally:
        if threading.current_thread() is threading.main_thread():
            for signum, handler in before.items():
                signal.signal(signum, handler)


class _Ended(BaseException):  # not an Exception: no "except Exception" on the way swallows it
    """A signal that ends an ``ended_by_a_signal`` block, raised where the block checks for it."""


@contextlib.contextmanager
def ended_by_a_signal():
    """A with block that SIGTERM or SIGINT ends, for work that is nothing until it is whole (a plan's probe): the
    signal is noted, and the block's next ``state.check()`` (between two pieces of its work, never inside a
    library's) ends it; its ``finally`` blocks run (child processes shut down). The state says which signal ended
    it (``signal_name``, None where none did; ``exit_code``: 128 + the signal)."""
    state = types.SimpleNamespace(signal_name=None, exit_code=0)

    def note(signum, frame):
        state.signal_name, state.exit_code = signal.Signals(signum).name, 128 + signum

    def check():
        if state.signal_name is not None:
            raise _Ended

    state.check = check
    before = {signum: signal.signal(signum, note) for signum in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield state
    except _Ended:
        pass
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


def requested() -> str | None:
    """The name of the signal that asked the run to stop, or None."""
    return _requested
