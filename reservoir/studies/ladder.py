"""The budget ladder: every model trained at several FLOP budgets, a curve fitted per model.

    study = Study.from_args(*split_arguments(args, STUDY_KEYS))  # STUDY_KEYS, then run settings
    study.run(run_point)                            # each budget an ordinary run folder (resumed if interrupted)
    report = study.report()                         # scaling.json: points, fits, gaps, crossovers
    plot_scaling(report, study.path / "scaling.png")

A point is ``python TinyStories.py ... FLOP_BUDGET=<budget> RESULTS_DIR=<study> RUN_NAME=flops-<budget>``,
run by the caller's ``run_point(args) -> exit code``, so resume, compare.py, sample.py and the plots
work on it as on any run. Re-running the same study skips finished points and resumes an
interrupted one from its checkpoint: a killed study loses at most CHECKPOINT_EVERY_S of one point.

The fit per model is L(C) = E + A·(C / C₀)^(−α) (Kaplan et al. 2020; Hoffmann et al. 2022) by
least squares (curves.py) over every seed's point, C₀ the smallest budget (which keeps A of the
order of the losses); the uncertainties are the square roots of the covariance's diagonal.
A model whose fits all ended on their data (one pass of a closed-form fit, n-gram counts) has no
compute to scale: it is reported and drawn as a reference line, not fitted.
"""

from __future__ import annotations

import os
import statistics
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from reservoir.config import parse_overrides
from reservoir.platform.messages import say, warn
from reservoir.run.records import ResultsError, point_scores, read_json, read_summary, run_seeds, write_json_atomic
from reservoir.studies.budgets import StudyError, parse_budgets, point_name, step_cost, study_name
from reservoir.studies.curves import crossovers, curve, figure, fit_curve, log_axes
from reservoir.studies.runner import exit_status, hold_study

STUDY_KEYS = ("BUDGETS", "STUDY")


DEFAULT_BUDGETS = (2.5e12, 5e12, 1e13, 2e13, 4e13)  # ~2 h for the default models and seeds on 2 CPU cores


DEFAULT_SETTINGS = {  # what a study sets unless the command line says otherwise
    "MODELS": ["transformer", "lstm", "deep_linear_reservoir", "linear_reservoir", "esn", "ngram"],
    "SEEDS": [1337, 1338],
    "TIME_BUDGET_S": None,  # compute alone ends every fit: the ladder does not depend on the machine's load
    "PLOTS": False,  # one plot for the study instead of a set per point
}


REFERENCE = "transformer"  # gaps are measured to this model


@dataclass
class Study:
    name: str
    budgets: list[float]
    settings: list[str]  # TinyStories.py KEY=VALUE held for every point (the study's defaults first)
    config: dict  # the validated settings of a point (without its budget)
    path: Path = field(init=False)

    def __post_init__(self):
        self.path = Path(self.config["RESULTS_DIR"]) / self.name

    @classmethod
    def from_args(cls, own: dict[str, str], settings: list[str]) -> Study:
        """The study of a command line: ``own``, its STUDY_KEYS (as config.split_arguments parts them
        from the rest), and ``settings``, the run settings that ``parse_overrides(args) -> config`` checks."""
        budgets = parse_budgets(own["BUDGETS"]) if "BUDGETS" in own else list(DEFAULT_BUDGETS)
        name = study_name(own, "scaling")
        given = {arg.partition("=")[0].strip().upper() for arg in settings}
        defaults = [f"{key}={value!r}" for key, value in DEFAULT_SETTINGS.items() if key not in given]
        for arg in settings:
            if arg.partition("=")[0].strip().upper() in ("FLOP_BUDGET", "RUN_NAME", "RESUME"):
                raise StudyError(f"{arg.partition('=')[0].strip()} is set by the study for each point; "
                                 "give the ladder as BUDGETS=... and the folder as STUDY=...")
        config = parse_overrides([*defaults, *settings, f"FLOP_BUDGET={budgets[0]}"])  # refused now, not mid-study
        return cls(name, budgets, [*defaults, *settings], config)

    def point_args(self, budget: float) -> list[str]:
        """The TinyStories.py arguments of one point: a new run, or the resumption of an interrupted one."""
        folder = self.path / point_name(budget)
        where = [f"RESULTS_DIR={self.path}", f"FLOP_BUDGET={budget!r}"]
        if (folder / "config.json").exists():
            return [*self.settings, *where, f"RESUME={folder}"]
        return [*self.settings, *where, f"RUN_NAME={point_name(budget)}"]

    def finished(self, budget: float) -> bool:
        """Every model and seed of the point is recorded (finished, or diverged: a result too)."""
        summary = self.path / point_name(budget) / "summary.json"
        if not summary.exists():
            return False
        done = {(r.get("model"), r.get("seed")) for r in read_summary(summary.parent, "the point's summary")}
        return {(m, s) for m in self.config["MODELS"] for s in run_seeds(self.config)} <= done

    def check_smallest_budget(self) -> None:
        """Refuse a ladder whose smallest budget cannot pay one step of a gradient-trained model, before any
        point trains (the point would refuse it only after the models before it had trained)."""
        for name in self.config["MODELS"]:
            per_step, _ = step_cost(name, self.config)
            if per_step is not None and per_step > self.budgets[0]:
                raise StudyError(f"BUDGETS: the smallest, {self.budgets[0]:.3g} FLOPs, does not cover one training "
                                 f"step of {name} ({per_step:.3g} FLOPs); raise BUDGETS, or lower BATCH_SIZE")

    def run(self, run_point) -> None:
        """Train every point not yet finished, smallest budget first; ``run_point(args) -> exit code``."""
        self.check_smallest_budget()
        lock = hold_study(self.path, self.name)  # one runner per study: a second copy stops here
        try:
            for k, budget in enumerate(self.budgets, 1):
                if self.finished(budget):
                    say(f"study {self.name}: point {k}/{len(self.budgets)} ({budget:.3g} FLOPs) finished, skipped")
                    continue
                say(f"study {self.name}: point {k}/{len(self.budgets)}, FLOP_BUDGET={budget:.3g} "
                    f"-> {self.path / point_name(budget)}")
                code = exit_status(run_point(self.point_args(budget)))
                if code != 0:  # a signal may land while a finished point exits: then it is finished, and kept
                    what = "finished as the study was stopped" if self.finished(budget) else "stopped"
                    raise StudyExit(code, f"the point at {budget:.3g} FLOPs {what} (exit code {code}, its message "
                                          "is above); every finished point is kept")
        finally:
            os.close(lock)

    def records(self) -> list[dict]:
        """Every recorded (model, seed) of every point, with the point's budget."""
        out = []
        for budget in self.budgets:
            summary = self.path / point_name(budget) / "summary.json"
            if summary.exists():
                out.extend({**r, **point_scores(r, summary.parent), "budget": budget}
                           for r in read_summary(summary.parent, "the point's summary"))
        return out

    def report(self) -> dict:
        return build_report(self.records(), self.budgets, self.config["MODELS"],
                            {"study": self.name, "path": str(self.path), "settings": self.settings})


class StudyExit(Exception):
    """A point ended without finishing: the study stops there, with the point's exit code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


def _points(records: list[dict], models: list[str], budgets: list[float]) -> dict:
    """Per model and budget: bits/char mean ± sd over seeds and what the fits were."""
    table: dict = {}
    for model in models:
        rows = []
        for budget in budgets:
            group = [r for r in records if r["model"] == model and r["budget"] == budget]
            scored = [r for r in group if r.get("val_bpc") is not None]
            if not group:
                continue
            bpc = [r["val_bpc"] for r in scored]
            rows.append({
                "budget": budget, "seeds": len(group), "scored_seeds": len(scored),
                "bpc_per_seed": bpc, "bpc_mean": statistics.fmean(bpc) if bpc else None,
                "bpc_sd": statistics.stdev(bpc) if len(bpc) > 1 else None,
                "bpc_ci95": statistics.fmean(r["val_bpc_ci95"] for r in scored if r.get("val_bpc_ci95") is not None)
                if any(r.get("val_bpc_ci95") is not None for r in scored) else None,
                "train_flops": statistics.fmean(r["train_flops"] for r in group if r.get("train_flops"))
                if any(r.get("train_flops") for r in group) else None,
                "tokens": statistics.fmean(r["train_tokens"] for r in group),
                "epochs": statistics.fmean(r["epochs"] for r in group if r.get("epochs") is not None)
                if any(r.get("epochs") is not None for r in group) else None,
                "train_seconds": statistics.fmean(r["train_seconds"] for r in group),
                "params_trained": group[0]["params_trained"],
                "params_frozen": group[0]["params_total"] - group[0]["params_trained"],
                "bound_by": sorted({r.get("bound_by") or "?" for r in group}),
                "diverged_seeds": [r["seed"] for r in group if r.get("status") == "diverged"],
            })
        table[model] = rows
    return table


def build_report(records: list[dict], budgets: list[float], models: list[str], about: dict) -> dict:
    points = _points(records, models, budgets)
    c0 = budgets[0]
    fits, references = {}, {}
    for model, rows in points.items():
        compute_bound = [r for r in rows if r["bpc_mean"] is not None and r["bound_by"] != ["data"]]
        if rows and not compute_bound:
            last = [r for r in rows if r["bpc_mean"] is not None]
            references[model] = {"bpc": last[-1]["bpc_mean"] if last else None,
                                 "reason": "every fit ended on its data: no compute to scale"}
            continue
        xs, ys = [], []
        for r in compute_bound:
            for value in r["bpc_per_seed"]:
                xs.append(r["train_flops"] or r["budget"])
                ys.append(value)
        fits[model] = fit_curve(xs, ys, c0)
        if not fits[model]["converged"]:
            warn(f"scaling: no curve for {model}: {fits[model]['reason']}; its points are still written")
    gaps = {}
    reference = {r["budget"]: r["bpc_mean"] for r in points.get(REFERENCE, []) if r["bpc_mean"] is not None}
    for model, rows in points.items():
        gaps[model] = [{"budget": r["budget"], "gap_percent": 100 * (r["bpc_mean"] - reference[r["budget"]])
                        / reference[r["budget"]]} for r in rows
                       if r["bpc_mean"] is not None and r["budget"] in reference and model != REFERENCE]
    return {**about, "budgets": budgets, "models": models, "reference_model": REFERENCE,
            "curve": "bits/char = E + A * (train_flops / C0) ** -alpha", "points": points, "fits": fits,
            "references": references, "gap_to_reference": gaps,
            "crossovers": crossovers(fits, budgets[0], budgets[-1])}


def write_report(report: dict, folder: Path) -> Path:
    path = Path(folder) / "scaling.json"
    write_json_atomic(path, report)
    return path


def read_report(folder: Path) -> dict:
    path = Path(folder) / "scaling.json"
    if not path.exists():
        raise ResultsError(f"{path} is missing: run python scaling.py first")
    return read_json(path, "the scaling report")


def format_report(report: dict) -> str:
    """The ladder as a table: bits/char (mean ± sd over seeds) per model and budget, and each gap."""
    budgets = report["budgets"]
    head = f"{'model':<22}" + "".join(f"{b:>16.2e}" for b in budgets) + "   fit: E + A (C/C0)^-alpha"
    lines = [head, "-" * len(head)]
    for model, rows in report["points"].items():
        by_budget = {r["budget"]: r for r in rows}
        cells = []
        for b in budgets:
            r = by_budget.get(b)
            if r is None or r["bpc_mean"] is None:
                cells.append(f"{'-':>16}")
                continue
            sd = f"±{r['bpc_sd']:.3f}" if r["bpc_sd"] is not None else ""
            cells.append(f"{r['bpc_mean']:.3f}{sd}".rjust(16))
        fit = report["fits"].get(model)
        if fit and fit.get("converged"):
            note = f"   E={fit['E']:.3f} A={fit['A']:.3f} alpha={fit['alpha']:.3f}"
        elif model in report["references"]:
            note = "   (data-bound: reference line)"
        else:
            note = f"   (no fit: {fit['reason']})" if fit else ""
        lines.append(f"{model:<22}" + "".join(cells) + note)
    for model, gaps in report["gap_to_reference"].items():
        if gaps:
            by_budget = {g["budget"]: g["gap_percent"] for g in gaps}
            lines.append(f"{'gap ' + model:<22}" + "".join(
                f"{by_budget[b]:>+15.1f}%" if b in by_budget else f"{'-':>16}" for b in budgets))
    for cross in report["crossovers"]:
        where = "within the ladder" if cross["within_ladder"] else "extrapolated"
        lines.append(f"crossover: {cross['models'][0]} / {cross['models'][1]} at {cross['budget']:.2e} FLOPs "
                     f"({where}); {cross['better_above']} better above")
    return "\n".join(lines)


@figure(dpi=120)
def plot_scaling(report: dict):
    """Bits/char against training FLOPs (points ± sd, fitted curves, data-bound models as lines), and
    each model's gap to the transformer in percent."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    budgets = report["budgets"]
    from reservoir.run.plots import family_colour

    colours = {m: family_colour(m) for m in report["models"]}
    fig, (loss_ax, gap_ax) = plt.subplots(1, 2, figsize=(13, 5))
    grid = np.geomspace(budgets[0] / 1.5, budgets[-1] * 1.5, 200)
    for model, rows in report["points"].items():
        rows = [r for r in rows if r["bpc_mean"] is not None]
        if not rows:
            continue
        colour = colours[model]
        if model in report["references"]:
            loss_ax.axhline(report["references"][model]["bpc"], color=colour, linestyle="--",
                            label=f"{model} (all data, {report['references'][model]['bpc']:.3f})")
            continue
        x = [r["train_flops"] or r["budget"] for r in rows]
        loss_ax.errorbar(x, [r["bpc_mean"] for r in rows], yerr=[r["bpc_sd"] or 0 for r in rows], fmt="o",
                         color=colour, capsize=3, label=model)
        fit = report["fits"].get(model, {})
        if fit.get("converged"):
            loss_ax.plot(grid, curve(grid, fit["E"], fit["A"], fit["alpha"], fit["C0"]), color=colour, alpha=0.7,
                         label=f"{model} fit: E={fit['E']:.2f}, α={fit['alpha']:.2f}")
    for model, gaps in report["gap_to_reference"].items():
        if gaps and model not in report["references"]:
            gap_ax.plot([g["budget"] for g in gaps], [g["gap_percent"] for g in gaps], "o-", color=colours[model],
                        label=model)
    gap_ax.axhline(0, color="grey", linewidth=0.8)
    for ax, label in ((loss_ax, "validation bits/char"), (gap_ax, f"gap to the {report['reference_model']} (%)")):
        log_axes(ax, "training FLOPs (reservoir/run/flops.py)", label, legend_size=7)
    loss_ax.set_title(f"study {report.get('study', '')}: bits/char against compute")
    gap_ax.set_title(f"each model's gap to the {report['reference_model']} at the same budget")
    return fig
