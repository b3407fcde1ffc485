"""What a fixed state can hold: every frontier family on multi-query associative recall and selective copying,
at three state sizes each (reservoir/studies/probes.py; the tasks in reservoir/data/recall.py).

    python probes.py                                   # the whole set: records in results/probes/
    python probes.py TASKS=mqar FAMILIES=lstm,transformer++ LEARNING_RATES=1e-3 STEPS=300
    python probes.py WORKERS=1                         # one run at a time (default: one per core)

Probe keys: TASKS (mqar, copying), FAMILIES (the frontier's, and random_transformer), LEARNING_RATES (each
size keeps its best), STEPS (training steps of 32 fresh sequences), SEEDS, WORKERS, RESULTS_DIR. Running the
same command again trains only what is not recorded yet. Writes results/probes/probes.jsonl (every run,
committed), probes.md and probes.png; `python scaling.py REPORT=results` adds them to REPORT.md.
"""

from __future__ import annotations

import sys

from configs import split_arguments, wants_help
from reservoir.platform import stopping
from reservoir.platform.entry import entry_point
from reservoir.platform.messages import TAG, OneLineError, say
from reservoir.studies.probes import PROBE_KEYS, ProbeSet, run_probe_set, write_probe_report


@entry_point
def main(argv: list[str]) -> int:
    if wants_help(argv):
        print(__doc__)
        return 0
    try:
        own, settings = split_arguments(argv, PROBE_KEYS)
        if settings:
            raise OneLineError(f"{settings[0]} is not a probe key (the keys: {', '.join(PROBE_KEYS)})")
        probes = ProbeSet.from_args(own)
        records = run_probe_set(probes, say)
        for path in write_probe_report(records, probes.folder):
            say(f"wrote {path}")
    except OneLineError as e:
        raise SystemExit(f"error: {e}") from None
    except stopping.Stopped as e:
        print(f"{TAG} probes stopped by {e.signal_name}: {e.saved}", file=sys.stderr, flush=True)
        return e.exit_code
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
