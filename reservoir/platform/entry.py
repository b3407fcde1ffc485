"""How every root script starts and ends, the same for each:

    @entry_point
    def main(argv: list[str]) -> int: ...

Before ``main`` runs, the RESERVOIR_PRETEND_* variables are checked (a bad one is one line before any data is read
or any model trained); a reader that closes the pipe early (``python scaling.py --help | head -1``) ends the script
quietly, as a C tool ends on SIGPIPE, with no BrokenPipeError traceback.
"""

from __future__ import annotations

import functools
import os
import signal
import sys

from reservoir.platform.machine import check_pretended
from reservoir.platform.messages import OneLineError


def entry_point(main):
    @functools.wraps(main)
    def run(argv: list[str]) -> int:
        try:
            check_pretended()
        except OneLineError as e:
            raise SystemExit(f"error: {e}") from None
        try:
            try:
                return main(argv)
            finally:  # a closed pipe is found here (on a SystemExit too), not as Python exits
                sys.stdout.flush()
        except BrokenPipeError:
            # what is left to print goes nowhere (Python's own exit flush would otherwise raise again)
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 128 + signal.SIGPIPE
    return run
