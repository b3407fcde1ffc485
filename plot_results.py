"""Plot one or more runs' results (written by TinyStories.py at the end of each run).

    python plot_results.py results/<run> [results/<other run> ...] [OUT=DIR]

One run: the PNGs go into its folder; several: into OUT (default <first run's
parent>/comparison). Each model keeps one colour in every plot and every comparison;
runs are told apart by line style and named by RUN_NAME (else data and date). Runs
on different data are never ranked on one axis: each data source gets its own panel.
"""

import sys
from pathlib import Path

from configs import ConfigError, parse_options, wants_help
from reservoir.platform.entry import entry_point
from reservoir.platform.messages import OneLineError
from reservoir.run.plots import PLOTS, plot_runs

KEYS = {"OUT": "where the PNGs go (default: the run's folder; several runs: <parent>/comparison)"}


def usage() -> str:
    keys = "\n".join(f"  {key:<6} {what}" for key, what in KEYS.items())
    plots = "\n".join(f"  {name:<24} {what}" for name, what in PLOTS.items())
    return f"{__doc__}\nKeys:\n{keys}\n\nPlots written (when the runs hold the numbers they need):\n{plots}"


@entry_point
def main(argv: list[str]) -> int:
    if wants_help(argv):
        print(usage())
        return 0
    runs = [Path(a) for a in argv if "=" not in a]
    try:
        if not runs or any(str(r).startswith("-") for r in runs):
            raise ConfigError("give one or more run folders (results/<run>), then OUT=DIR if you like; "
                              "python plot_results.py --help says more")
        options = parse_options([a for a in argv if "=" in a], KEYS, text_keys=("OUT",))
        written = plot_runs(runs, options.get("OUT"))
    except OneLineError as e:
        raise SystemExit(f"error: {e}") from None
    if not written:
        raise SystemExit("error: these runs have no evaluations yet; nothing to plot")
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
