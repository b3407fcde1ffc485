"""The budget ladder: every model at several FLOP budgets, a fitted curve per model, one plot.

    python scaling.py                                      # the default ladder (about 2 h on 2 cores)
    python scaling.py BUDGETS=1e12,2e12,4e12,8e12,1.6e13 STUDY=small DATASET=path/to/tinystories
    python scaling.py ... MODELS=transformer,esn SEEDS=1,2,3     # any TinyStories.py KEY=VALUE

Study keys: BUDGETS (FLOP budgets, at least two, increasing; default 2.5e12,5e12,1e13,2e13,4e13),
STUDY (the folder under RESULTS_DIR, default 'scaling'). Everything else is a TinyStories.py
setting held for every point; the study's own defaults are the six models of the comparison,
SEEDS=1337,1338 and no time limit (compute alone ends each fit, so the machine's load does not
change the ladder). Each budget is an ordinary run folder RESULTS_DIR/STUDY/flops-<budget>;
running the same command again skips finished points and resumes an interrupted one.
Writes RESULTS_DIR/STUDY/scaling.json and scaling.png, and prints the table.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from pathlib import Path

from configs import parse_overrides, split_arguments, wants_help
from reservoir.messages import TAG, OneLineError, say
from reservoir.scaling import STUDY_KEYS, Study, StudyExit, format_report, plot_scaling, write_report

HERE = Path(__file__).resolve().parent


def run_point(args: list[str]) -> int:
    """One point as its own TinyStories.py process; a SIGTERM to the study is passed on to it (Ctrl-C
    reaches it directly, from the terminal), so it checkpoints before the study stops."""
    proc = subprocess.Popen([sys.executable, str(HERE / "TinyStories.py"), *args])
    previous = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGINT)}
    signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the point decides how to stop; its exit code says
    try:
        return proc.wait()
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def main(argv: list[str]) -> int:
    if wants_help(argv):
        print(__doc__)
        return 0
    try:
        study = Study.from_args(*split_arguments(argv, STUDY_KEYS), parse_overrides)
        study.run(run_point)
        report = study.report()
        path = write_report(report, study.path)
        png = plot_scaling(report, study.path / "scaling.png")
    except OneLineError as e:
        raise SystemExit(f"error: {e}") from None
    except StudyExit as e:
        print(f"{TAG} study stopped: {e}", file=sys.stderr, flush=True)
        return e.code
    print(f"\n{TAG} study {study.name}: validation bits/char (mean ± sd over seeds) by training FLOPs\n"
          f"{format_report(report)}", flush=True)
    say(f"report: {path}")
    say(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
