"""How the codebase talks to the researcher: one tag, status lines and warnings.

Status lines go through ``tqdm.write`` so they never tear a progress bar, and only
the main process speaks (pass ``main=False`` elsewhere).
"""

from __future__ import annotations

import sys

from tqdm import tqdm

TAG = "[ReservoirNLP]"


def say(message: str, main: bool = True) -> None:
    if main:
        tqdm.write(f"{TAG} {message}", file=sys.stdout)
        sys.stdout.flush()


def warn(message: str) -> None:
    print(f"{TAG} WARNING: {message}", file=sys.stderr, flush=True)
