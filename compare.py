"""Is model A better than model B? A paired comparison on the same validation targets.

    python compare.py results/<run>:<model> results/<run>:<model> [KEY=VALUE ...]
    python compare.py results/push-480:deep_linear_reservoir results/rigour-480:ngram
    python compare.py results/r1 results/r2 TOKENS=65536 DEVICE=cuda OUT=a-vs-b.json
    python compare.py results/s1+results/s2:lstm results/r:transformer   # seeds of two runs, pooled
    python compare.py results/r:deep_linear_reservoir results/r:transformer DIAGNOSTICS=True  # by position, recall
    python compare.py exports/my-lstm results/r:ngram    # an exported model (export.py), or hf://user/name

A side without ':<model>' is its run's best finished model; runs joined by '+' pool their
seeds. Every seed the runs finished is re-scored from its checkpoint, on the targets every
run's final evaluation scored (TOKENS to change that), each with its run's evaluation settings.
Prints A's and B's bits/char (next to what the runs recorded) and A - B with a 95% paired
bootstrap interval; writes the same to OUT (default:
<first run of A>/comparisons/<model A>[+<A's other runs>]-vs-<B's runs, joined by +>-<model B>.json).
Run it from the folder the runs were started in, so their DATASET paths and cache resolve.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from configs import ConfigError, parse_options
from reservoir.platform.entry import entry_point
from reservoir.platform.files import atomic_write_text
from reservoir.platform.messages import TAG, OneLineError
from reservoir.studies.comparison import Side, compare, describe
from reservoir.studies.diagnostics import format_diagnostics, plot_diagnostics

KEYS = {
    "TOKENS": "validation targets scored (default: what both runs' final evaluations scored)",
    "DEVICE": "'cpu' (default) | 'cuda' | 'auto'; on XLA the scoring runs on the CPU",
    "OUT": "where the JSON report goes (default: <run A>/comparisons/...)",
    "DIAGNOSTICS": "True: also A and B by position in the story and on recall targets (table, JSON and a PNG)",
}


def default_report_name(side_a: Side, side_b: Side) -> str:
    """<model A>-vs-<run of B>-<model B>.json, with every further pooled run named (+<run>) on both
    sides: a comparison of pooled seeds never overwrites the one of a single run."""
    more_a = "".join(f"+{d.name}" for d in side_a.run_dirs[1:])
    runs_b = "+".join(d.name for d in side_b.run_dirs)
    return f"{side_a.model}{more_a}-vs-{runs_b}-{side_b.model}.json"


def parse_args(argv: list[str]) -> tuple[Side, Side, dict]:
    sides = [a for a in argv if "=" not in a]
    if len(sides) != 2 or any(a.startswith("-") for a in sides):
        usage = __doc__.split("\n\n")[0] + "\n\nKeys:\n" + "\n".join(f"  {k:<8} {v}" for k, v in KEYS.items())
        if argv and argv[0] in ("-h", "--help"):
            print(usage)
            raise SystemExit(0)
        raise SystemExit(f"error: give two sides, each a run folder with an optional :<model>\n\n{usage}")
    try:
        options = parse_options([a for a in argv if "=" in a], KEYS, text_keys=("DEVICE", "OUT"))
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    if not isinstance(options.get("DIAGNOSTICS", False), bool):
        raise SystemExit(f"error: DIAGNOSTICS must be True or False, got {options['DIAGNOSTICS']!r}")
    tokens = options.get("TOKENS")
    if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
        raise SystemExit(f"error: TOKENS must be a positive integer, got {tokens!r}")
    return Side.parse(sides[0]), Side.parse(sides[1]), options


@entry_point
def main(argv: list[str]) -> int:
    side_a, side_b, options = parse_args(argv)
    try:
        report = compare(side_a, side_b, options.get("TOKENS"), options.get("DEVICE", "cpu"),
                         options.get("DIAGNOSTICS", False))
    except OneLineError as e:
        raise SystemExit(f"error: {e}") from None
    out = Path(options.get("OUT") or side_a.run_dirs[0] / "comparisons" / default_report_name(side_a, side_b))
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, json.dumps(report, indent=2) + "\n")
    print(describe(report), flush=True)
    if "diagnostics" in report:
        labels = [f"{side_a.model} (A)", f"{side_b.model} (B)"]
        print(format_diagnostics(report["diagnostics"], *labels), flush=True)
        png = out.with_suffix(".png")
        plot_diagnostics(report["diagnostics"], *labels, png)
        print(f"{TAG} plot: {png}", file=sys.stderr)
    print(f"{TAG} report: {out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
