"""How the codebase talks to the researcher: one tag, status lines and warnings.

Status lines go through ``tqdm.write`` so they never tear a progress bar, and only
the main process speaks (pass ``main=False`` elsewhere). Progress is a tqdm bar on a
terminal and a plain line every few seconds anywhere else (a log file would otherwise
collect thousands of carriage-return updates on one line).
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

TAG = "[ReservoirNLP]"


class OneLineError(Exception):
    """An error the researcher can act on: every root script prints it as one line ("error: ...",
    exit status 1) and never a traceback. Each concern's error derives from it (ConfigError,
    DataError, ResultsError, ...), so a script catches this one type."""


def say(message: str, main: bool = True, file=None) -> None:
    """A status line (``file``: stdout unless given; a script whose stdout is its product says it on stderr)."""
    if main:
        file = file or sys.stdout
        tqdm.write(f"{TAG} {message}", file=file)
        file.flush()


def warn(message: str) -> None:
    print(f"{TAG} WARNING: {message}", file=sys.stderr, flush=True)


def first_line(error: BaseException, width: int = 200) -> str:
    """What an exception says, in one line for a message of ours: its first line, cut to ``width``
    characters, or its type's name where it says nothing."""
    text = str(error).strip()
    return text.splitlines()[0][:width] if text else type(error).__name__


class PlainProgress:
    """tqdm's small interface (update, n, set_postfix_str, close) as one plain line every ``every`` seconds."""

    def __init__(self, total: float, desc: str, every: float = 10.0, disable: bool = False, file=None,
                 delay: float = 0.0):
        self.total, self.desc, self.every, self.disable, self.delay = total, desc, every, disable, delay
        self.file = file or sys.stderr
        self.n, self.postfix = 0.0, ""
        self._started = self._printed = time.monotonic()

    def update(self, amount: float = 1) -> None:
        self.n += amount
        if time.monotonic() - self._printed >= self.every:
            self._print()

    def set_postfix_str(self, text: str) -> None:
        self.postfix = text

    def _print(self) -> None:
        self._printed = time.monotonic()
        if not self.disable and self._printed - self._started >= self.delay:
            elapsed = self._printed - self._started
            done = f"{100 * self.n / self.total:3.0f}%" if self.total else f"{self.n:,.0f}"  # no total: a count
            line = f"{TAG} {self.desc}: {done} after {elapsed:.0f}s"
            print(f"{line}, {self.postfix}" if self.postfix else line, file=self.file, flush=True)

    def close(self) -> None:
        self._print()
        self.disable = True  # closing twice prints once


def progress(total: float, desc: str, disable: bool = False, delay: float = 0.0, **tqdm_options):
    """A progress bar on a terminal, plain periodic lines elsewhere (log files, notebooks' pipes);
    with ``delay``, nothing at all for work that ends within that many seconds."""
    if sys.stderr.isatty():
        return tqdm(total=total, desc=desc, disable=disable, delay=delay, **tqdm_options)
    return PlainProgress(total, desc, disable=disable, delay=delay)
