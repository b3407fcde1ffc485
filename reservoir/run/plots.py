"""Plots of one or more runs' results: what TinyStories.py draws at the end of a run and plot_results.py
draws for any runs.

    written = plot_runs([run_dir, ...], out)    # the PNGs (PLOTS says what each shows)

One run: the PNGs go into its folder; several: into ``out`` (default <first run's
parent>/comparison). Each model keeps one colour in every plot and every comparison;
runs are told apart by line style and named by RUN_NAME (else data and date). Runs
on different data are never ranked on one axis: each data source gets its own panel.
"""

from __future__ import annotations

import re
import textwrap
import zlib
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # files only: runs on headless machines
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from reservoir.config import SHARED_CONFIG  # noqa: E402
from reservoir.models.registry import family_of  # noqa: E402
from reservoir.run.records import read_json, read_metrics  # noqa: E402
from reservoir.run.tables import aggregate, seed_groups  # noqa: E402

PLOTS = {  # file: what it shows (also the --help text)
    "bpc_vs_tokens.png": "validation bits/char against training tokens (mean over seeds, band: min to max)",
    "bpc_vs_seconds.png": "the same against training wall-clock seconds",
    "bpc_vs_flops.png": "the same against training FLOPs (matrix products; see reservoir/run/flops.py)",
    "final_bpc.png": "final bits/char per model, ± the 95% interval (one seed) or the sd over seeds",
    "bpc_vs_params.png": "final bits/char against trainable parameters (log scale)",
    "bpc_vs_train_flops.png": "final bits/char against total training FLOPs (compute-matched comparisons)",
    "throughput.png": "training tokens per second (log scale)",
}
RUN_STYLES = ["-", "--", ":", "-."]
MARKERS = ["o", "s", "^", "D", "v", "P"]
ONE_PASS_NOTE = "a lone square: a one-pass fit (ridge readout, n-gram counts), scored once at the end of its pass"
SCORED_ONCE_NOTE = "a lone square: a model evaluated once, at the end of its budget (EVAL_POINTS=1)"
REFERENCE_NOTE = "dashed line: n-gram (no trained parameters, no FLOPs), for reference"


def load_run(path: Path) -> dict:
    config = read_json(path / "config.json", "the run's config")
    summary = read_json(path / "summary.json", "the run's summary") if (path / "summary.json").exists() else []
    return {"name": path.name, "config": config, "summary": summary, "metrics": read_metrics(path)}


# one colour per family, the same in every plot (a run's, a study's, the probes', the generation cost's): each
# built-in family its own, named here so that no plot's order or company changes it; a gated twin is not its base's
FAMILY_COLOURS = {
    "transformer++": "#1f77b4", "transformer": "#17becf", "random_transformer": "#aec7e8", "lstm": "#2ca02c",
    "frozen_retention": "#d62728", "frozen_retention+write": "#ff7f0e", "frozen_retention+forget": "#e377c2",
    "reservoir_attention": "#9467bd", "reservoir_attention+write": "#bcbd22", "deep_linear_reservoir": "#8c564b",
    "linear_reservoir": "#393b79", "esn": "#000000", "deep_esn": "#843c39", "nvar": "#7b4173", "ngram": "#7f7f7f",
}  # linear_reservoir's indigo: olive beside reservoir_attention+write's yellow-green was hard to tell apart
OTHER_COLOURS = ["#98df8a", "#ffbb78", "#c5b0d5", "#c49c94", "#f7b6d2", "#dbdb8d", "#9edae5", "#637939"]


def family_colour(family: str) -> str:
    """The colour of a family (a study family's name, ``transformer++``) in every plot; a plugin's, or a variant
    this file does not name, one of OTHER_COLOURS by its name (the same in every process)."""
    if family in FAMILY_COLOURS:
        return FAMILY_COLOURS[family]
    return OTHER_COLOURS[zlib.crc32(family.encode("utf-8")) % len(OTHER_COLOURS)]


NESTED_MARKERS = "osD^vP*Xh<>p"


def nested_marker(k: int, count: int) -> dict:
    """The k-th of ``count`` families' marker in a plot where their points may coincide: each its own hollow
    shape, smaller and drawn higher the later it comes, so a point on another's stays visible around it."""
    return {"marker": NESTED_MARKERS[k % len(NESTED_MARKERS)], "markersize": 12 - 6 * k / max(1, count - 1),
            "markerfacecolor": "none", "markeredgewidth": 1.5, "zorder": 2 + k}


def run_family(run: dict, model: str) -> str:
    """The family a run's model is, as its table names it (``transformer`` in the '++' recipe: transformer++)."""
    effective = run["config"].get("effective_config") or {}
    return family_of(model, effective.get(model.upper()) or {}, SHARED_CONFIG.get(model.upper()))


def run_label(run: dict) -> str:
    """RUN_NAME, else the data source and the date the run started."""
    requested = run["config"].get("requested_config", {})
    if requested.get("RUN_NAME"):
        return requested["RUN_NAME"]
    started = run["config"].get("started", "")[:16].replace("T", " ")
    return f"{_data_source(run)}, {started}" if started else run["name"]


def _data_source(run: dict) -> str:
    return re.sub(r"[^ ,:]*/", "", run["config"]["data"]["data_description"])  # no folders


def by_data(runs: list[dict]) -> list[tuple[str, list[dict]]]:
    groups: dict[str, list[dict]] = {}
    for run in runs:
        groups.setdefault(_data_source(run), []).append(run)
    return list(groups.items())


def _panels(runs: list[dict], title: str, height: float = 4.5):
    groups = by_data(runs)
    fig, axes = plt.subplots(1, len(groups), figsize=(7 * len(groups) + 3, height), squeeze=False)
    devices = sorted({f"{r['config']['device']['name']} ({r['config']['device']['precision']})" for r in runs})
    fig.suptitle(textwrap.fill(f"{title} · device: {'; '.join(devices)}", 110), fontsize=9)
    for ax, (source, _) in zip(axes[0], groups, strict=True):
        ax.set_title(textwrap.fill(f"data: {source}", 70), fontsize=8)
    return fig, axes[0], groups


def _save(fig, ax, out: Path, handles: list, notes: list[str]) -> Path:
    extra = [Line2D([], [], color="none", label=textwrap.fill(note, 40)) for note in notes]
    ax.legend(handles=handles + extra, fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # outside
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


def _log_axes(ax, xlabel: str, ylabel: str) -> None:
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)


def _legend(runs: list[dict], models: list[str], references=()) -> list:
    """A line per family, as drawn (a reference dashed), and a line style per run where there are several."""
    handles = [Line2D([], [], color=family_colour(m), lw=1 if m in references else 2,
                      ls="--" if m in references else "-", label=m) for m in models]
    if len(runs) > 1:
        handles += [Line2D([], [], color="black", ls=RUN_STYLES[i % len(RUN_STYLES)], label=run_label(run))
                    for i, run in enumerate(runs)]
    return handles


def learning_curve(rows: list[dict], x_key: str) -> tuple[list[float], list[float], list[float], list[float]]:
    """(x, mean, low, high) of one model's evaluations over its seeds, matched by evaluation index."""
    seeds: dict[int, list[dict]] = {}
    for row in sorted(rows, key=lambda r: r["step"]):
        seeds.setdefault(row.get("seed", 0), []).append(row)
    length = min(len(curve) for curve in seeds.values())
    xs, mean, low, high = [], [], [], []
    for k in range(length):
        points = [curve[k] for curve in seeds.values()]
        values = [p["val_bpc"] for p in points]
        xs.append(max(sum(p.get(x_key) or 0 for p in points) / len(points), 1e-3))
        mean.append(sum(values) / len(values))
        low.append(min(values))
        high.append(max(values))
    return xs, mean, low, high


def _curves(runs, x_key, xlabel, title, out: Path) -> Path | None:
    fig, axes, groups = _panels(runs, title)
    models, lone, drawn, references = [], set(), False, set()
    for ax, (_, group) in zip(axes, groups, strict=True):
        for run in group:
            style = RUN_STYLES[runs.index(run) % len(RUN_STYLES)]
            for model in dict.fromkeys(m["model"] for m in run["metrics"]):
                rows = [m for m in run["metrics"] if m["model"] == model and m.get("val_bpc") is not None
                        and m.get(x_key) is not None]
                if not rows:
                    continue
                xs, mean, low, high = learning_curve(rows, x_key)
                family = run_family(run, model)
                colour = family_colour(family)
                models += [family] if family not in models else []
                drawn = True
                if model == "ngram" and x_key == "flops":  # counts, not FLOPs: a point decades left of the rest
                    ax.axhline(mean[-1], color=colour, ls="--", lw=1)
                    references.add(family)
                    continue
                if len(xs) == 1:  # scored once: a one-pass fit at the end of its pass, or EVAL_POINTS=1
                    ax.plot(xs, mean, "s", color=colour, markersize=8)
                    one_pass = any(r["model"] == model and r.get("bound_by") == "data" for r in run["summary"])
                    lone.add(ONE_PASS_NOTE if one_pass else SCORED_ONCE_NOTE)
                    continue
                ax.plot(xs, mean, style, marker="o", markersize=3, color=colour)
                if any(h > lo for h, lo in zip(high, low, strict=True)):
                    ax.fill_between(xs, low, high, color=colour, alpha=0.2, lw=0)
        _log_axes(ax, xlabel, "validation bits / character (lower is better)")
    if not drawn:
        plt.close(fig)
        return None
    notes = sorted(lone) + ([REFERENCE_NOTE] if references else [])
    return _save(fig, axes[-1], out, _legend(runs, models, references), notes)


def _finals(run: dict) -> list[dict]:
    """A run's table rows, each with the family its model is."""
    return [{**row, "family": run_family(run, row["model"])} for row in
            (aggregate(group) for _, group in seed_groups(run["summary"]))]


def _spread(row: dict) -> float:
    return row.get("val_bpc_sd") or row.get("val_bpc_ci95") or 0.0


def _bars(runs, value, xlabel, title, out: Path, references: bool, log: bool = False) -> Path:
    groups = by_data(runs)
    rows_per_panel = [[(run, r) for run in group for r in _finals(run) if r.get(value) is not None]
                      for _, group in groups]
    fig, axes, _ = _panels(runs, title, height=0.45 * max(len(rows) for rows in rows_per_panel) + 2.2)
    several = len(runs) > 1
    for ax, rows in zip(axes, rows_per_panel, strict=True):
        rows.sort(key=lambda row: row[1][value], reverse=not references)
        labels = [f"{r['family']} ({run_label(run)})" if several else r["family"] for run, r in rows]
        errors = [_spread(r) for _, r in rows] if references else None
        bars = ax.barh(labels, [r[value] for _, r in rows], color=[family_colour(r["family"]) for _, r in rows],
                       xerr=errors, capsize=3 if references else 0)
        for bar, (_, r) in zip(bars, rows, strict=True):
            if r.get("cut_at") is not None:  # not at its budget: hatched, and said beside its number
                bar.set_hatch("//")
                bar.set_edgecolor("black")
        for i, (_, r) in enumerate(rows):
            seeds = f" (mean of {r['scored_seeds']} seeds)" if r["scored_seeds"] > 1 else ""
            cut = "" if r.get("cut_at") is None else f", cut by TIME_BUDGET_S at {100 * r['cut_at']:.0f}% of its budget"
            label = f" {r[value]:,.3f}{seeds}{cut}" if references else f" {r[value]:,.0f}"
            ax.text(r[value] + (_spread(r) if references else 0), i, label, va="center", fontsize=8)
        if references:  # every n-gram is a reference line: models left of it beat counting
            ngrams = [(run, r) for run, r in rows if r["model"] == "ngram"]
            for k, (run, r) in enumerate(ngrams):
                order = run["config"]["effective_config"]["NGRAM"]["order"]
                ax.axvline(r[value], color=family_colour("ngram"), ls="--", lw=1)
                where = f" ({run_label(run)})" if several else ""
                ax.text(r[value], len(rows) - 0.4 - 0.35 * k, f" {order}-gram{where}",  # one label per line
                        color=family_colour("ngram"), fontsize=8)
        if log:
            ax.set_xscale("log")
        ax.invert_yaxis()
        ax.set_xlabel(xlabel)
    fig.tight_layout()
    fig.savefig(out, dpi=120)
    plt.close(fig)
    return out


DODGE = 1.04  # the factor between two points of one x, side by side on a log axis
DODGE_NOTE = "points of (nearly) one x stand side by side, in order of their scores: runs of one budget"


def _coinciding(points: list) -> list[list]:
    """``points`` (x first) in groups whose x lie within DODGE of each other."""
    groups: list[list] = []
    for point in sorted(points, key=lambda p: p[0]):
        if groups and point[0] <= groups[-1][0][0] * DODGE:
            groups[-1].append(point)
        else:
            groups.append([point])
    return [g for g in groups if len(g) > 1]


def _dodged(points: list) -> tuple[list, bool]:
    """``points`` (x, record, ...) with those of (nearly) one x spread side by side around it, best score first (a
    budget every model spent in full would put them all on one vertical line), and whether any were moved."""
    out, crowded = [], set()
    for group in _coinciding(points):
        centre = group[0][0]
        for k, point in enumerate(sorted(group, key=lambda p: p[1]["val_bpc"])):
            out.append((centre * DODGE ** (k - (len(group) - 1) / 2), *point[1:]))
            crowded.add(id(point))
    return out + [p for p in points if id(p) not in crowded], bool(crowded)


def _scatter(runs, x_key, xlabel, title, out: Path) -> Path | None:
    """Final bits/char against a size or cost, one marker per run; models without one (the n-gram has no
    trained parameters, and counts rather than FLOPs) are reference lines."""
    fig, axes, groups = _panels(runs, title)
    models, drawn, references, side_by_side = [], False, set(), False
    for ax, (_, group) in zip(axes, groups, strict=True):
        points = []
        for run in group:
            marker = MARKERS[runs.index(run) % len(MARKERS)]
            for r in _finals(run):
                if r.get("val_bpc") is None:
                    continue
                colour = family_colour(r["family"])
                models += [r["family"]] if r["family"] not in models else []
                x = r.get(x_key)
                if r["model"] == "ngram" or not x:
                    ax.axhline(r["val_bpc"], color=colour, ls="--", lw=1)
                    references.add(r["family"])
                    continue
                points.append((x, r, marker, colour))
        placed, moved = _dodged(points)
        side_by_side |= moved
        for x, r, marker, colour in placed:
            ax.errorbar([x], [r["val_bpc"]], yerr=[_spread(r)], fmt=marker, color=colour, markersize=7, capsize=3)
            drawn = True
        _log_axes(ax, xlabel, "final validation bits / character (lower is better)")
    if not drawn:
        plt.close(fig)
        return None
    handles = [Line2D([], [], color=family_colour(m), lw=1, ls="--", label=m) if m in references else
               Line2D([], [], color=family_colour(m), marker="o", ls="", label=m) for m in models]
    if len(runs) > 1:
        handles += [Line2D([], [], color="black", marker=MARKERS[i % len(MARKERS)], ls="", label=run_label(run))
                    for i, run in enumerate(runs)]
    notes = [REFERENCE_NOTE] if references else []
    if side_by_side:
        notes.append(DODGE_NOTE)
    return _save(fig, axes[-1], out, handles, notes)


def plot_runs(paths: list[Path], out: Path | None = None) -> list[Path]:
    runs = [load_run(Path(p)) for p in paths]
    out = Path(out) if out else (Path(paths[0]) if len(paths) == 1 else Path(paths[0]).parent / "comparison")
    out.mkdir(parents=True, exist_ok=True)
    written = []
    if any(r["metrics"] for r in runs):
        for x_key, xlabel, file in (("tokens", "training tokens", "bpc_vs_tokens.png"),
                                    ("seconds", "training wall-clock seconds", "bpc_vs_seconds.png"),
                                    ("flops", "training FLOPs", "bpc_vs_flops.png")):
            written.append(_curves(runs, x_key, xlabel, f"Validation bits/char vs {xlabel}", out / file))
    if any(r["summary"] for r in runs):
        written.append(_bars(runs, "val_bpc", "final validation bits / character (lower is better)",
                             "Final validation bits/char", out / "final_bpc.png", references=True))
        written.append(_scatter(runs, "params_trainable", "trainable parameters",
                                "Final bits/char vs trainable parameters", out / "bpc_vs_params.png"))
        written.append(_scatter(runs, "train_flops", "training FLOPs", "Final bits/char vs training compute",
                                out / "bpc_vs_train_flops.png"))
        written.append(_bars(runs, "tokens_per_second", "training tokens / second (log scale)",
                             "Training throughput", out / "throughput.png", references=False, log=True))
    return [path for path in written if path is not None]
