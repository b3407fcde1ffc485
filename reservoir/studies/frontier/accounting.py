"""ELEMENTWISE=<study folder>: the study's points re-read under the element-wise convention (run/elementwise.py).

The FLOP convention counts products only, so a frozen recurrence's element-wise work is free under it. This counts
one training step of every configuration the grid trained (a family at a size preset: its step's cost does not
depend on the rate, and its batch scales the part that grows with the batch) under both conventions, on the model
built from a recorded point's settings, and writes ``<study>/elementwise-cost.json`` (committed, signed). The report
then gives each grid point its cost under the element-wise convention, its recorded FLOPs times its step's ratio of
the two conventions (no retraining: a point's cost is its step's cost times its steps), and from those:

- each family's lower envelope under it: the configurations the FLOP convention chose at each budget, each at its
  cost under this one (bits/char: their mean over seeds), and the curve L(C) = E + A·(C/C0)^−α fitted through
  them. Another cell of the same budget could cost a little less under this convention, by at most the spread of
  the family's ratios of the two conventions (``ratio``: a few percent), which the report gives;
- at each budget, the gap of each class's best family to the reference at the reference's envelope cost, read on
  both fitted envelopes, beside the same gap on the FLOP convention's fits; the interval is ±1.96 x the two fits'
  root-mean-square residuals combined (what the fits' errors give where a fit is read);
- the compute multiplier under it, and where the ranking of the families by multiplier changes.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from reservoir.models import build_model, with_added_options
from reservoir.platform.files import repository_path
from reservoir.run.elementwise import CONVENTION, StepCount, training_step
from reservoir.run.records import ResultsError, write_signed_json
from reservoir.run.trained import load_run_plugins
from reservoir.studies.budgets import point_name
from reservoir.studies.curves import compute_on_curve, fit_curve, interpolated_compute, loss_on_curve, lower_front
from reservoir.studies.frontier.grid import RESERVOIR_CLASSES, FrontierError, of_class
from reservoir.studies.frontier.records import read_measured
from reservoir.studies.store import PointRecords

ELEMENTWISE_FILE = "elementwise-cost.json"
Z95 = 1.96


def configuration(family: str, size: str) -> str:
    return f"{family}/{size}"


def read_counts(study_path: Path) -> dict | None:
    """The study's element-wise counts, checked; None where they have not been counted."""
    return read_measured(study_path, ELEMENTWISE_FILE, "the study's element-wise counts", "ELEMENTWISE")


def count_study(folder: Path, rows: list[dict], command: str) -> dict:
    """One step of every (family, size preset) the grid trained, counted under both conventions."""
    records, counted = PointRecords(folder), {}
    for r in rows:
        key = configuration(r["family"], r["size"])
        if key in counted or r["envelope_seed"]:
            continue
        point = folder / r["cell"] / point_name(r["budget"])
        recorded = records.config(point)
        load_run_plugins(point, recorded)
        config = with_added_options(dict(recorded["effective_config"]))
        vocab = recorded["data"]["vocab_size"]
        model = build_model(config["MODELS"][0], vocab, config)
        step = training_step(model, vocab, int(config["SEQ_LEN"]), config["WEIGHT_DECAY"], config["GRAD_CLIP"])
        counted[key] = {"point": repository_path(point), **step.__dict__, "micro_batches": int(config["GRAD_ACCUM"])}
    if not counted:
        raise ResultsError(f"{folder} has no grid point yet: run the study first")
    return {"command": command, "convention": CONVENTION, "torch": torch.__version__,
            "configurations": dict(sorted(counted.items()))}


def write_counts(folder: Path, content: dict) -> Path:
    write_signed_json(Path(folder) / ELEMENTWISE_FILE, content)
    return Path(folder) / ELEMENTWISE_FILE


def _step(counts: dict, row: dict) -> tuple[StepCount, int] | None:
    entry = counts["configurations"].get(configuration(row["family"], row["size"]))
    if entry is None:
        return None
    fields = {k: entry[k] for k in ("products_per_sequence", "elementwise_per_sequence", "elementwise_per_step")}
    return StepCount(**fields), entry["micro_batches"]


def elementwise_cost(counts: dict, row: dict) -> float | None:
    """A grid point's training cost under the element-wise convention: its recorded FLOPs times its step's ratio
    of the two conventions. A step whose products disagree with the record (the model's code changed since the
    count) is refused in one line."""
    found = _step(counts, row)
    if found is None or not row.get("train_flops"):
        return None
    step, micro = found
    products = step.products(row["batch_size"], micro)
    recorded = row["train_flops"] / row["train_steps"]
    if not math.isclose(products, recorded, rel_tol=1e-6):
        raise FrontierError(f"{ELEMENTWISE_FILE} counts {configuration(row['family'], row['size'])}'s step at "
                            f"{products:.6g} FLOPs by the FLOP convention, its record {row['folder']} at "
                            f"{recorded:.6g}: the counts are stale; count again (python scaling.py "
                            "ELEMENTWISE=<study>)")
    return row["train_flops"] * step.flops(row["batch_size"], micro) / products


def _within(front: list[dict], cost: float) -> bool:
    return bool(front) and front[0]["cost"] <= cost <= front[-1]["cost"]


def _gap(fits: dict, f: str, ref: str, at: float) -> dict | None:
    """``f``'s gap to ``ref`` at ``at`` on their fitted curves, with the interval their residuals give."""
    mine, theirs = loss_on_curve(fits.get(f, {}), at), loss_on_curve(fits.get(ref, {}), at)
    if mine is None or theirs is None:
        return None
    spread = Z95 * math.hypot(fits[f]["rms_residual"], fits[ref]["rms_residual"]) / theirs
    gap = mine / theirs - 1
    return {"gap": gap, "ci95": [gap - spread, gap + spread]}


def _needed(front: list[dict], fit: dict, loss: float) -> tuple[float | None, str]:
    """The cost at which the reference reaches ``loss``: log-log between its envelope points, else on its fit."""
    between = interpolated_compute([(p["cost"], p["bpc"]) for p in front], loss)
    if between is not None:
        return between, "interpolated"
    on_fit = compute_on_curve(fit, loss)
    return (on_fit, "extrapolated") if on_fit is not None else (None, "beyond")


def _ranking(multipliers: dict, budget: float) -> list[str]:
    """The families by their compute multiplier at ``budget``, largest first."""
    values = {f: {r["budget"]: r for r in rows}.get(budget, {}).get("multiplier") for f, rows in multipliers.items()}
    return sorted((f for f, v in values.items() if v is not None), key=lambda f: (-values[f], f))


def elementwise_view(rows: list[dict], counts: dict, report: dict) -> dict:
    """frontier.json's ``elementwise``: the envelopes, fits, gaps, multipliers and ranking changes under the
    element-wise convention, beside the FLOP convention's (``report``: build_frontier's content)."""
    reference, budgets = report["reference"], report["budgets"]
    costed = [(r, elementwise_cost(counts, r)) for r in rows if not r["envelope_seed"] and r["val_bpc"] is not None]
    missing = sorted({configuration(r["family"], r["size"]) for r, c in costed if c is None})
    cost_of = {(r["cell"], r["budget"]): c for r, c in costed}
    moved = {f: [{**p, "cost": cost_of.get((p["cell"], p["budget"]))} for p in points]
             for f, points in report["envelope"].items()}  # the FLOP envelope's points at their element-wise cost
    envelopes = {f: [{"cost": p["cost"], "bpc": p["bpc_mean"], "cell": p["cell"]} for p in lower_front(
        [p for p in points if p["cost"]], lambda p: p["cost"], lambda p: p["bpc_mean"])] for f, points in moved.items()}
    envelopes = {f: front for f, front in envelopes.items() if front}
    fits = {f: fit_curve([p["cost"] for p in front], [p["bpc"] for p in front], budgets[0])
            for f, front in envelopes.items()}
    gaps = []
    for ref in moved.get(reference, []):
        if ref["cost"] is None:
            continue
        row = {"budget": ref["budget"], "cost": ref["cost"], "classes": {}}
        for kind in RESERVOIR_CLASSES:
            read = {f: _gap(fits, f, reference, ref["cost"]) for f in of_class(kind)
                    if f in envelopes and _within(envelopes[f], ref["cost"])}
            read = {f: gap for f, gap in read.items() if gap is not None}
            best = min(read, key=lambda f: (read[f]["gap"], f), default=None)
            row["classes"][kind] = None if best is None else {
                "family": best, **read[best], "flop_convention": _gap(report["fits"], best, reference, ref["budget"])}
        gaps.append(row)
    multipliers = {}
    for f, points in moved.items():
        out = []
        for p in points:
            if p["cost"] is None:
                continue
            needed, how = _needed(envelopes.get(reference, []), fits.get(reference, {}), p["bpc_mean"])
            out.append({"budget": p["budget"], "cost": p["cost"], "bpc": p["bpc_mean"], "reference_cost": needed,
                        "multiplier": needed / p["cost"] if needed else None, "how": how})
        multipliers[f] = out
    changes = []
    for b in budgets:
        flop, elem = _ranking(report["compute_multiplier"], b), _ranking(multipliers, b)
        swapped = [[a, c] for i, a in enumerate(flop) for c in flop[i + 1:]
                   if a in elem and c in elem and elem.index(c) < elem.index(a)]  # a above c, now below
        if swapped:
            changes.append({"budget": b, "swapped": swapped})
    ratios = {f: sorted(p["cost"] / p["train_flops"] for p in points if p["cost"]) for f, points in moved.items()}
    return {"convention": counts["convention"], "command": counts["command"], "torch": counts["torch"],
            "missing": missing, "ratio": {f: [r[0], r[-1]] for f, r in ratios.items() if r},
            "envelopes": envelopes, "fits": fits, "gaps": gaps, "compute_multiplier": multipliers,
            "ranking_changes": changes}
