"""Plot one or more runs' results (written by TinyStories.py at the end of each run).

    python plot_results.py results/<run> [results/<other run> ...] [--out DIR]

Writes PNGs: validation bits/char against training tokens and against
wall-clock seconds, final bits/char per model (n-gram references as lines),
and training throughput. One run: into its folder; several: into --out
(default <first run's parent>/comparison).
"""

from __future__ import annotations

import argparse
import re
import sys
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: runs on headless machines
import matplotlib.pyplot as plt  # noqa: E402

from reservoir.results import ResultsError, read_json, read_metrics  # noqa: E402


def load_run(path: Path) -> dict:
    config = read_json(path / "config.json", "the run's config")
    summary = read_json(path / "summary.json", "the run's summary") if (path / "summary.json").exists() else []
    return {"name": path.name, "config": config, "summary": summary, "metrics": read_metrics(path)}


def _context(runs: list[dict]) -> str:
    """'data ... · device ...' for titles; every distinct value if the runs differ."""
    data = sorted({re.sub(r"[^ ,:]*/", "", r["config"]["data"]["data_description"]) for r in runs})  # no folders
    devices = sorted({f"{r['config']['device']['name']} ({r['config']['device']['precision']})" for r in runs})
    return "\n".join(textwrap.fill(line, 80) for line in (f"data: {'; '.join(data)}",
                                                          f"device: {'; '.join(devices)}"))


def _label(run: dict, model: str, several: bool) -> str:
    return f"{run['name']}/{model}" if several else model


def _curves(runs, x_key, xlabel, title, out: Path) -> Path:
    fig, ax = plt.subplots(figsize=(10, 5))
    several = len(runs) > 1
    for run in runs:
        models = dict.fromkeys(m["model"] for m in run["metrics"])
        for model in models:
            rows = sorted((m for m in run["metrics"] if m["model"] == model and m.get("val_bpc") is not None),
                          key=lambda m: m["step"])
            xs, ys = [max(m[x_key], 1e-3) for m in rows], [m["val_bpc"] for m in rows]
            style = "o-" if len(rows) > 1 else "s"  # closed-form fits have one point: the end of their pass
            ax.plot(xs, ys, style, markersize=4 if len(rows) > 1 else 8, label=_label(run, model, several))
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("validation bits / character (lower is better)")
    ax.set_title(f"{title}\n{_context(runs)}", fontsize=9)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside: never hides a point
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _bars(runs, value, xlabel, title, out: Path, references: bool, log: bool = False) -> Path:
    several = len(runs) > 1
    rows = [(_label(run, r["model"], several), r[value], r["model"]) for run in runs for r in run["summary"]
            if r.get(value) is not None]  # a diverged model has no score to draw
    rows.sort(key=lambda row: row[1], reverse=not references)
    fig, ax = plt.subplots(figsize=(8, 0.5 * len(rows) + 2))
    colors = ["#999999" if model == "ngram" else "#3572b0" for _, _, model in rows]
    errors = None
    if references:  # bits/char: the final evaluation's 95% bootstrap interval, where the run has one
        by_label = {_label(run, r["model"], several): r.get("val_bpc_ci95") for run in runs for r in run["summary"]}
        errors = [by_label.get(label) or 0.0 for label, _, _ in rows]
    ax.barh([r[0] for r in rows], [r[1] for r in rows], color=colors, xerr=errors, capsize=3 if errors else 0)
    for i, (_, v, _) in enumerate(rows):
        ax.text(v, i, f" {v:,.3f}" if references else f" {v:,.0f}", va="center", fontsize=8)
    if references:  # every n-gram of these runs is a reference line: models left of it beat counting
        for run in runs:
            for r in run["summary"]:
                if r["model"] == "ngram" and r.get(value) is not None:
                    order = run["config"]["effective_config"]["NGRAM"]["order"]
                    ax.axvline(r[value], color="#d62728", ls="--", lw=1)
                    where = f" ({run['name']})" if several else ""
                    ax.text(r[value], len(rows) - 0.4, f" {order}-gram{where}", color="#d62728", fontsize=8)
    if log:
        ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(f"{title}\n{_context(runs)}", fontsize=9)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def plot_runs(paths: list[Path], out: Path | None = None) -> list[Path]:
    runs = [load_run(Path(p)) for p in paths]
    out = Path(out) if out else (Path(paths[0]) if len(paths) == 1 else Path(paths[0]).parent / "comparison")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if any(r["metrics"] for r in runs):
        written.append(_curves(runs, "tokens", "training tokens", "Validation bits/char vs training tokens",
                               out / "bpc_vs_tokens.png"))
        written.append(_curves(runs, "seconds", "training wall-clock seconds",
                               "Validation bits/char vs training time", out / "bpc_vs_seconds.png"))
    if any(r["summary"] for r in runs):
        written.append(_bars(runs, "val_bpc", "final validation bits / character (lower is better)",
                             "Final validation bits/char", out / "final_bpc.png", references=True))
        written.append(_bars(runs, "tokens_per_second", "training tokens / second (log scale)",
                             "Training throughput", out / "throughput.png", references=False, log=True))
    return written


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", nargs="+", type=Path, help="run folders under results/")
    parser.add_argument("--out", type=Path, default=None, help="where the PNGs go (default: see above)")
    args = parser.parse_args(argv)
    try:
        written = plot_runs(args.runs, args.out)
    except ResultsError as e:
        raise SystemExit(f"error: {e}") from None
    if not written:
        raise SystemExit("error: these runs have no evaluations yet; nothing to plot")
    for path in written:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
