"""DRAWS=True: how much of a reservoir's spread over seeds is its random draw, and how much its training.

A seed draws a reservoir (its frozen matrices and eigenvalues), starts its trained weights and orders its data; the
± beside an envelope point mixes the two. At the grid's top budget, for the best family of each reservoir class and
the reference, the study draws the envelope configuration with each envelope seed (``DRAW_SEED``) and trains each
draw on each seed (``SEED``): a draws x seeds square, all of it trained on one machine (its diagonal is the
envelope's own runs trained again, and set against their records). A two-way analysis
of variance without replication splits its spread into the draw's, the training's and the residual (their
interaction and the rest), each as the sd it adds, with a 95% interval from the χ² distribution of its mean square
(the residual's taken at its estimate). A family whose frozen part is set rather than drawn (frozen retention's
decays), or that has none (the transformer), draws nothing: its spread is all training, and nothing is trained.
"""

from __future__ import annotations

import math
from decimal import Decimal, localcontext
from pathlib import Path

from reservoir.models import draws_at_random, with_added_options
from reservoir.models.registry import TRAINED, class_of
from reservoir.studies.budgets import point_name
from reservoir.studies.store import PointRecords

SOURCES = ("draw", "training", "residual")


def _chi2_cdf(x: Decimal, df: int) -> Decimal:
    """P(χ²_df ≤ x) for an even ``df``: 1 − e^(−x/2) Σ_{j < df/2} (x/2)^j / j!, in decimal arithmetic (the same
    digits on every machine)."""
    half, term, total = x / 2, Decimal(1), Decimal(1)
    for j in range(1, df // 2):
        term = term * half / j
        total += term
    return 1 - (-half).exp() * total


def chi2_quantile(p: float, df: int) -> float | None:
    """The ``p`` quantile of χ² with ``df`` degrees of freedom, by bisection; None for an odd ``df`` (an incomplete
    square: no interval)."""
    if df <= 0 or df % 2:
        return None
    with localcontext() as context:
        context.prec = 30
        low, high, target = Decimal(0), Decimal(10 * df + 100), Decimal(repr(p))
        for _ in range(120):
            middle = (low + high) / 2
            low, high = (middle, high) if _chi2_cdf(middle, df) < target else (low, middle)
        return float(round((low + high) / 2, 12))


def variance_split(square: dict[tuple[int, int], float]) -> dict | None:
    """{(draw, seed): bits/char} of a complete draws x seeds square (at least 2 x 2) split by source: each mean
    square, its degrees of freedom and the sd the source adds with its 95% interval; None if incomplete."""
    draws, seeds = sorted({d for d, _ in square}), sorted({s for _, s in square})
    if len(draws) < 2 or len(seeds) < 2 or any((d, s) not in square for d in draws for s in seeds):
        return None
    values = [square[d, s] for d in draws for s in seeds]
    mean = sum(values) / len(values)
    by_draw = {d: sum(square[d, s] for s in seeds) / len(seeds) for d in draws}
    by_seed = {s: sum(square[d, s] for d in draws) / len(draws) for s in seeds}
    sums = {"draw": len(seeds) * sum((m - mean) ** 2 for m in by_draw.values()),
            "training": len(draws) * sum((m - mean) ** 2 for m in by_seed.values()),
            "residual": sum((square[d, s] - by_draw[d] - by_seed[s] + mean) ** 2 for d in draws for s in seeds)}
    df = {"draw": len(draws) - 1, "training": len(seeds) - 1, "residual": (len(draws) - 1) * (len(seeds) - 1)}
    ms = {k: sums[k] / df[k] for k in SOURCES}
    per = {"draw": len(seeds), "training": len(draws), "residual": 1}  # runs behind one mean of the source

    def sd(source: str, mean_square: float) -> float:
        extra = mean_square - (ms["residual"] if source != "residual" else 0.0)
        return math.sqrt(max(extra, 0.0) / per[source])

    out = {}
    for source in SOURCES:
        low, high = chi2_quantile(0.975, df[source]), chi2_quantile(0.025, df[source])
        interval = None if low is None else [sd(source, df[source] * ms[source] / low),
                                             sd(source, df[source] * ms[source] / high)]
        out[source] = {"mean_square": ms[source], "df": df[source], "sd": sd(source, ms[source]), "ci95": interval}
    return {"draws": draws, "seeds": seeds, "runs": len(values), "mean": mean,
            "square": {f"{d}/{s}": square[d, s] for d in draws for s in seeds}, **out}


def draws_anything(records: PointRecords, point: Path, family: str) -> bool:
    """Whether ``family``'s model, as ``point`` recorded its settings, draws its frozen part at random (built with two
    draws); a trained family has nothing frozen, and nothing is built to say so."""
    if class_of(family) == TRAINED:
        return False
    recorded = records.config(point)
    config = with_added_options(dict(recorded["effective_config"]))
    return draws_at_random(config["MODELS"][0], recorded["data"]["vocab_size"], config)


def draws_report(records: PointRecords, report: dict, draw_rows: list[dict], budget: float, families: list[str]
                 ) -> list[dict]:
    """Per family of ``families`` (analysis.draw_families): its square at ``budget`` (the draws' runs and the
    envelope's own, drawn with their seed) and its split; or that it draws nothing (its recorded configuration built
    with two draws)."""
    out = []
    at_top = {f: p for f, points in report["envelope"].items() for p in points if p["budget"] == budget}
    for family in families:
        point = at_top[family]
        recorded = {r["seed"]: r["val_bpc"] for r in report["grid_points"]
                    if r["cell"] == point["cell"] and r["budget"] == budget and r["val_bpc"] is not None}
        square = {(r["draw"], r["seed"]): r["val_bpc"] for r in draw_rows
                  if r["cell"] == point["cell"] and r["budget"] == budget and r["val_bpc"] is not None}
        row = {"family": family, "cell": point["cell"], "bpc_sd": point["bpc_sd"], "seeds": point["seeds"]}
        if square:
            again = {s: square[s, s] - recorded[s] for s in recorded if (s, s) in square}  # the diagonal, here
            out.append({**row, "drawn": True, "split": variance_split(square), "runs": len(square),
                        "diagonal_minus_record": {str(s): v for s, v in sorted(again.items())}})
            continue
        drawn = draws_anything(records, records.path / point["cell"] / point_name(budget), family)
        out.append({**row, "drawn": drawn, "split": None, "runs": 0, "why": "not trained yet" if drawn else
                    "nothing frozen" if class_of(family) == TRAINED else "its frozen part is set, not drawn"})
    return out
