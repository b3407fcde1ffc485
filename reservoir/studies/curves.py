"""Loss against compute: the curve L(C) = E + A·(C / C₀)^(−α) (Kaplan et al. 2020; Hoffmann et al. 2022)
fitted by least squares, where two fits cross, and the log-axes figures the studies draw.

The fit is computed in Python's ``decimal`` arithmetic rather than by scipy's ``curve_fit``: a report must come
out byte for byte the same on every machine, and ``curve_fit`` moves with the machine's numpy dispatch (SIMD
width) and BLAS around a fit's 9th digit, which rounding to any number of digits cannot hide (a value near a
rounding boundary rounds both ways). ``decimal`` is exact software arithmetic, specified to the digit, so the
same points give the same fit everywhere. The curve is linear in E and A for a given α (variable projection):
α is searched on a fixed grid over its bounds, then refined by a fixed number of golden-section steps, with E
and A solved in closed form (both ≥ 0) at each α.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import inspect
import json
import math
import random
from decimal import Context, Decimal, localcontext
from pathlib import Path

import numpy as np

from reservoir.platform.files import atomic_write

MIN_FIT_POINTS = 3  # distinct compute-bound budgets a curve needs (it has three parameters)
FIT_DIGITS = 6  # significant digits a fit keeps (its standard errors are larger by orders of magnitude)
ALPHA_MAX = 5  # α's upper bound: past it the curve is a step, not a power law
ALPHA_GRID = 500  # α searched at ALPHA_MAX / ALPHA_GRID steps before refining: finds the best of several minima
GOLDEN_STEPS = 160  # golden-section steps from one grid step: 0.618^160 of it, far below FIT_DIGITS
PRECISION = 50  # decimal digits of the fit's arithmetic
CROSSOVER_GRID = 2000  # budgets, evenly spaced in log, where crossing curves are looked for
CROSSOVER_PRECISION = 28  # decimal digits there (the budget kept is a grid midpoint, not a refined root)


def curve(compute, e: float, a: float, alpha: float, c0: float):
    """L(C) = E + A·(C / C₀)^(−α)."""
    return e + a * (np.asarray(compute, dtype=float) / c0) ** (-alpha)


def lower_front(items: list, cost, loss) -> list:
    """The ``items`` no cheaper one beats (``cost(item)``, ``loss(item)``), cheapest first: each lower in loss than
    every one before it (a tie in cost goes to the lower loss)."""
    front, best = [], None
    for item in sorted(items, key=lambda i: (cost(i), loss(i))):
        if best is None or loss(item) < best:
            best = loss(item)
            front.append(item)
    return front


def interpolated_compute(points: list[tuple[float, float]], loss: float) -> float | None:
    """The compute at which a decreasing envelope (compute, loss) reaches ``loss``, log-log interpolated
    between its points; None outside their range."""
    for (c1, l1), (c2, l2) in zip(points, points[1:], strict=False):
        if min(l1, l2) <= loss <= max(l1, l2) and l1 != l2:
            t = (math.log(loss) - math.log(l1)) / (math.log(l2) - math.log(l1))
            return math.exp(math.log(c1) + t * (math.log(c2) - math.log(c1)))
    return None


def compute_on_curve(fit: dict, loss: float) -> float | None:
    """The compute at which a fitted L(C) reaches ``loss``; None where it never does (no fit, or ``loss`` at or below
    its floor E)."""
    if not fit.get("converged") or loss <= fit["E"] or fit["A"] <= 0:
        return None
    return fit["C0"] * ((loss - fit["E"]) / fit["A"]) ** (-1 / fit["alpha"])


def loss_on_curve(fit: dict, compute: float) -> float | None:
    """L(C) on a fitted curve in Python's floats (numpy's SIMD power may move the last digit by machine); None
    without a fit."""
    return fit["E"] + fit["A"] * (compute / fit["C0"]) ** -fit["alpha"] if fit.get("converged") else None


def _frozen(value):
    """``value`` as a key: lists and tuples as tuples, all the way down."""
    return tuple(_frozen(v) for v in value) if isinstance(value, (list, tuple)) else value


def _remembered(fit):
    """``fit`` computed once for each set of numbers in a process (a study's reports fit the same points
    several times, in exact arithmetic that takes a tenth of a second a fit); each caller gets its own copy."""
    done: dict = {}

    @functools.wraps(fit)
    def remembered(*args):
        key = _frozen(args)
        if key not in done:
            done[key] = fit(*args)
        return copy.deepcopy(done[key])

    return remembered


@_remembered
def fit_curve(compute: list[float], bpc: list[float], c0: float) -> dict:
    """E, A, α (± one standard error, as ``curve_fit`` estimates it) of L(C) through the points, with residuals;
    or why not. The same points give the same bytes on any machine (the module's docstring says how)."""
    if not all(math.isfinite(v) for v in [*compute, *bpc, c0]) or min(*compute, c0) <= 0:
        return {"converged": False, "reason": "a point's compute or bits/char is not a finite positive number"}
    if len({round(math.log(c), 6) for c in compute}) < MIN_FIT_POINTS:
        return {"converged": False, "reason": f"fewer than {MIN_FIT_POINTS} compute-bound budgets"}
    with localcontext(Context(prec=PRECISION)):
        logs = [(Decimal(c) / Decimal(c0)).ln() for c in compute]
        ys = [Decimal(v) for v in bpc]
        alpha, (sse, e, a, us) = _best_alpha(logs, ys)
        residuals = [y - e - a * u for y, u in zip(ys, us, strict=True)]
        errors = _standard_errors(logs, us, a, sse, len(ys))
        rms = (sse / len(ys)).sqrt()
    return {"converged": True, "E": _kept(e), "A": _kept(a), "alpha": _kept(alpha),
            "E_se": _kept(errors[0]), "A_se": _kept(errors[1]), "alpha_se": _kept(errors[2]), "C0": c0,
            "residuals": [_kept(r) for r in residuals], "rms_residual": _kept(rms), "points": len(ys)}


def _best_alpha(logs: list[Decimal], ys: list[Decimal]) -> tuple[Decimal, tuple]:
    """α in [0, ALPHA_MAX] with the least squared error, and (that error, E, A, the (C/C₀)^−α)."""
    step = Decimal(ALPHA_MAX) / ALPHA_GRID
    grid = [(k * step, _solve(k * step, logs, ys)) for k in range(ALPHA_GRID + 1)]
    best = min(range(len(grid)), key=lambda k: grid[k][1][0])  # the first of equals: a fixed choice
    low, high = grid[max(best - 1, 0)][0], grid[min(best + 1, ALPHA_GRID)][0]
    ratio = (Decimal(5).sqrt() - 1) / 2
    left, right = high - ratio * (high - low), low + ratio * (high - low)
    at_left, at_right = _solve(left, logs, ys), _solve(right, logs, ys)
    for _ in range(GOLDEN_STEPS):
        if at_left[0] <= at_right[0]:
            high, right, at_right = right, left, at_left
            left = high - ratio * (high - low)
            at_left = _solve(left, logs, ys)
        else:
            low, left, at_left = left, right, at_right
            right = low + ratio * (high - low)
            at_right = _solve(right, logs, ys)
    candidates = [grid[best], (left, at_left), (right, at_right)]
    return min(candidates, key=lambda c: c[1][0])


def _solve(alpha: Decimal, logs: list[Decimal], ys: list[Decimal]) -> tuple:
    """At one α: (squared error, E, A, the (C/C₀)^−α) with E, A ≥ 0 the least-squares line through (u, y)."""
    us = [(-alpha * x).exp() for x in logs]
    n = len(ys)
    mean_u, mean_y = sum(us) / n, sum(ys) / n
    suu = sum((u - mean_u) ** 2 for u in us)
    lines = []  # (E, A) candidates: the free line where it keeps E, A >= 0, else the best on each bound
    if suu > 0:
        a = sum((u - mean_u) * (y - mean_y) for u, y in zip(us, ys, strict=True)) / suu
        if a >= 0 and mean_y - a * mean_u >= 0:
            lines.append((mean_y - a * mean_u, a))
    if not lines:
        lines.append((max(mean_y, Decimal(0)), Decimal(0)))
        lines.append((Decimal(0), max(sum(u * y for u, y in zip(us, ys, strict=True)) / sum(u * u for u in us),
                                      Decimal(0))))
    scored = [(sum((y - e - a * u) ** 2 for u, y in zip(us, ys, strict=True)), e, a) for e, a in lines]
    sse, e, a = min(scored, key=lambda s: s[0])
    return sse, e, a, us


def _standard_errors(logs: list[Decimal], us: list[Decimal], a: Decimal, sse: Decimal, n: int) -> list:
    """One standard error of E, A, α: the square roots of the covariance's diagonal, (JᵀJ)⁻¹ · SSE / (n − 3)
    (``curve_fit``'s default); None where the points cannot say (no more points than parameters, or the
    parameters not identifiable: JᵀJ singular)."""
    if n <= 3:
        return [None, None, None]
    rows = [(Decimal(1), u, -a * u * x) for u, x in zip(us, logs, strict=True)]  # ∂L/∂E, ∂L/∂A, ∂L/∂α
    m = [[sum(r[i] * r[j] for r in rows) for j in range(3)] for i in range(3)]
    cofactors = [[m[(i + 1) % 3][(j + 1) % 3] * m[(i + 2) % 3][(j + 2) % 3]
                  - m[(i + 1) % 3][(j + 2) % 3] * m[(i + 2) % 3][(j + 1) % 3] for j in range(3)] for i in range(3)]
    det = sum(m[0][j] * cofactors[0][j] for j in range(3))
    scale = max(abs(v) for row in m for v in row)
    if det <= scale ** 3 * Decimal(10) ** (-PRECISION // 2):
        return [None, None, None]
    variance = sse / (n - 3)
    return [(cofactors[i][i] / det * variance).sqrt() for i in range(3)]


def _kept(value) -> float | None:
    """A fitted number as stored: FIT_DIGITS significant digits; None where there is none."""
    if value is None or not math.isfinite(value):
        return None
    return float(f"{value:.{FIT_DIGITS}g}")  # a Decimal rounded to its digits in decimal, once


GAP_RESAMPLES = 4000  # bootstrap resamples of a gap's slope
GAP_SEED = 0  # Python's random() stream, which Python keeps the same across versions (numpy keeps its
# Generator's methods the same only within one build: its integers() may draw other indices elsewhere)
T_975 = {1: "12.706", 2: "4.303", 3: "3.182", 4: "2.776", 5: "2.571", 6: "2.447", 7: "2.365", 8: "2.306",
         9: "2.262", 10: "2.228"}  # Student's t, two-sided 95%, by degrees of freedom (more: 2.2, a bound)


@_remembered
def gap_slope(points: list[tuple[float, list[float], list[float]]]) -> dict | None:
    """Does the gap grow with compute? ``points``: (compute, one family's bits/char per seed, the reference's).
    The gap at a budget is ln(mean / reference mean); its least-squares slope against log10 compute (per
    decade), with two 95% intervals: a bootstrap over seeds (each budget's seeds of either side resampled with
    replacement, GAP_RESAMPLES times: what seed noise allows) and Student's t on the residuals about the line
    (what the budgets' scatter allows). In ``decimal`` arithmetic on fixed draws, like the fits: the same bytes
    on every machine."""
    if len(points) < 3 or any(not a or not b for _, a, b in points):
        return None
    with localcontext(Context(prec=PRECISION)):
        xs = [Decimal(c).ln() / Decimal(10).ln() for c, _, _ in points]
        mean_x = sum(xs) / len(xs)
        sxx = sum((x - mean_x) ** 2 for x in xs)
        weights = [(x - mean_x) / sxx for x in xs]  # the slope is linear in the gaps: sum(w_i g_i)
        ln_means: dict = {}

        def ln_mean(values) -> Decimal:  # a resample of three seeds has ten distinct means: each ln once
            key = tuple(sorted(values))
            if key not in ln_means:
                ln_means[key] = (sum(Decimal(v) for v in key) / len(key)).ln()
            return ln_means[key]

        gaps = [ln_mean(a) - ln_mean(b) for _, a, b in points]
        slope = sum(w * g for w, g in zip(weights, gaps, strict=True))
        mean_gap = sum(gaps) / len(gaps)
        residuals = [g - mean_gap - slope * (x - mean_x) for g, x in zip(gaps, xs, strict=True)]
        dof = len(points) - 2
        spread = Decimal(T_975.get(dof, "2.2")) * (sum(r * r for r in residuals) / dof / sxx).sqrt()
        draw = random.Random(GAP_SEED).random

        def resamples(values: list) -> list[list[int]]:
            return [[int(draw() * len(values)) for _ in values] for _ in range(GAP_RESAMPLES)]

        picks = [(resamples(a), resamples(b)) for _, a, b in points]
        draws = sorted(sum(w * (ln_mean(a[k] for k in pa[n]) - ln_mean(b[k] for k in pb[n]))
                           for w, (_, a, b), (pa, pb) in zip(weights, points, picks, strict=True))
                       for n in range(GAP_RESAMPLES))
        low, high = draws[int(0.025 * GAP_RESAMPLES)], draws[int(0.975 * GAP_RESAMPLES) - 1]
        return {"slope_per_decade": _kept(slope), "ci95_seeds": [_kept(low), _kept(high)],
                "ci95_residuals": [_kept(slope - spread), _kept(slope + spread)], "gaps": [_kept(g) for g in gaps],
                "resamples": GAP_RESAMPLES, "seed": GAP_SEED}


def crossovers(fits: dict, low: float, high: float) -> list[dict]:
    """Budgets where two fitted curves cross, searched from the ladder's lowest budget up to 100x its highest
    (the question is who wins with more compute; past the ladder a crossover is extrapolated). In decimal
    arithmetic on a fixed grid, as the fits: the same budgets on every machine."""
    names = [m for m, f in fits.items() if f.get("converged")]
    if len(names) < 2:
        return []
    with localcontext(Context(prec=CROSSOVER_PRECISION)):
        log_low, log_high = Decimal(low).ln(), Decimal(high * 100).ln()
        logs = [log_low + (log_high - log_low) * k / (CROSSOVER_GRID - 1) for k in range(CROSSOVER_GRID)]
        values = {m: [Decimal(fits[m]["E"]) + Decimal(fits[m]["A"]) * (-Decimal(fits[m]["alpha"]) * (
            x - Decimal(fits[m]["C0"]).ln())).exp() for x in logs] for m in names}
        found = []
        for i, first in enumerate(names):
            for second in names[i + 1:]:
                diff = [a - b for a, b in zip(values[first], values[second], strict=True)]
                for k in range(CROSSOVER_GRID - 1):
                    if diff[k] * diff[k + 1] < 0:
                        at = float(((logs[k] + logs[k + 1]) / 2).exp())
                        found.append({"models": [first, second], "budget": at,
                                      "better_above": first if diff[k + 1] < 0 else second,
                                      "within_ladder": bool(low <= at <= high)})
    return found


def log_axes(ax, xlabel: str, ylabel: str, legend_size: int) -> None:
    """A study plot's panel: log x, labels, a light grid, a legend where it has labelled lines."""
    ax.set_xscale("log")
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, which="both", alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=legend_size)


FIGURE_SOURCE = "Source"  # the PNG text entry that names what a figure was drawn from


def figure_digest(data, draw) -> str:
    """What a figure is drawn from: the data it plots and the code that draws it."""
    try:
        code = inspect.getsource(draw)
    except (OSError, TypeError):  # installed without its sources: its bytecode, the same for one Python
        code = draw.__code__.co_code.hex()
    text = json.dumps(data, sort_keys=True, default=repr) + code
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def drawn_from(path: Path) -> str | None:
    """The digest a PNG written by ``save_figure`` names; None for any other file, or none."""
    from PIL import Image, UnidentifiedImageError  # matplotlib's own dependency

    try:
        with Image.open(path) as image:
            return getattr(image, "text", {}).get(FIGURE_SOURCE)
    except (OSError, UnidentifiedImageError, SyntaxError, ValueError):
        return None


def save_figure(fig, path: Path, dpi: int, digest: str | None = None) -> Path:
    """``fig`` as a PNG at ``path``, written whole or not at all, naming ``digest`` and no matplotlib version."""
    import matplotlib.pyplot as plt

    metadata = {"Software": None, **({FIGURE_SOURCE: digest} if digest else {})}
    fig.tight_layout()
    try:
        atomic_write(path, lambda tmp: fig.savefig(tmp, format="png", dpi=dpi, metadata=metadata))
    finally:
        plt.close(fig)
    return Path(path)


def figure(dpi: int):
    """``draw(data) -> Figure`` made into ``plot(data, path) -> path``, a figure a report commits. Matplotlib
    versions render their own pixels (3.9 and 3.11 differ in 7-13% of a report's), so a PNG names what it was
    drawn from and one drawn from the same data by the same code is kept as it is: the same records give the same
    files with any matplotlib. New data, or a change to ``draw``, draws it again (a change to a helper it calls
    does not: delete the PNG)."""
    def wrap(draw):
        @functools.wraps(draw)
        def plot(data, path: Path) -> Path:
            digest = figure_digest(data, draw)
            if drawn_from(path) != digest:
                save_figure(draw(data), path, dpi, digest)
            return Path(path)
        return plot
    return wrap
