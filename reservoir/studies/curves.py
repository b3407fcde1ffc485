"""Loss against compute: the curve L(C) = E + A·(C / C₀)^(−α) (Kaplan et al. 2020; Hoffmann et al. 2022)
fitted with scipy's ``curve_fit``, where two fits cross, and the log-axes figures the studies draw.
"""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np

MIN_FIT_POINTS = 3  # distinct compute-bound budgets a curve needs (it has three parameters)
FIT_DIGITS = 6  # significant digits a fit keeps: BLAS differs between machines around the 10th, and a report
# regenerated anywhere must be byte-identical (the standard errors are larger than this by orders of magnitude)


def curve(compute, e: float, a: float, alpha: float, c0: float):
    """L(C) = E + A·(C / C₀)^(−α)."""
    return e + a * (np.asarray(compute, dtype=float) / c0) ** (-alpha)


def fit_curve(compute: list[float], bpc: list[float], c0: float) -> dict:
    """E, A, α (± one standard error) of L(C) through the points, with residuals; or why not."""
    from scipy.optimize import OptimizeWarning, curve_fit

    x, y = np.asarray(compute, dtype=float), np.asarray(bpc, dtype=float)
    if len(set(np.round(np.log(x), 6))) < MIN_FIT_POINTS:
        return {"converged": False, "reason": f"fewer than {MIN_FIT_POINTS} compute-bound budgets"}
    p0 = (0.9 * y.min(), max(y.max() - 0.9 * y.min(), 1e-3), 0.3)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", OptimizeWarning)
            params, cov = curve_fit(lambda c, e, a, alpha: curve(c, e, a, alpha, c0), x, y, p0=p0,
                                    bounds=([0.0, 0.0, 0.0], [np.inf, np.inf, 5.0]), maxfev=20000)
    except (RuntimeError, ValueError, OptimizeWarning) as e:
        return {"converged": False, "reason": f"curve_fit did not converge ({e})"}
    errors = np.sqrt(np.diag(cov)) if np.all(np.isfinite(cov)) else np.full(3, np.nan)
    residuals = y - curve(x, *params, c0)
    return {"converged": True, "E": _kept(params[0]), "A": _kept(params[1]), "alpha": _kept(params[2]),
            "E_se": _kept(errors[0]), "A_se": _kept(errors[1]), "alpha_se": _kept(errors[2]), "C0": c0,
            "residuals": [_kept(r) for r in residuals], "rms_residual": _kept(np.sqrt(np.mean(residuals**2))),
            "points": len(y)}


def _kept(value) -> float | None:
    """A fitted number as stored: FIT_DIGITS significant digits; None where it is not finite."""
    return float(f"{float(value):.{FIT_DIGITS}g}") if np.isfinite(value) else None


def crossovers(fits: dict, low: float, high: float) -> list[dict]:
    """Budgets where two fitted curves cross, searched from the ladder's lowest budget up to 100x its highest
    (the question is who wins with more compute; past the ladder a crossover is extrapolated)."""
    grid = np.geomspace(low, high * 100, 2000)
    found = []
    names = [m for m, f in fits.items() if f.get("converged")]
    for i, first in enumerate(names):
        for second in names[i + 1:]:
            a, b = fits[first], fits[second]
            diff = curve(grid, a["E"], a["A"], a["alpha"], a["C0"]) - curve(grid, b["E"], b["A"], b["alpha"], b["C0"])
            for k in np.flatnonzero(np.sign(diff[:-1]) * np.sign(diff[1:]) < 0):
                at = float(math.exp((math.log(grid[k]) + math.log(grid[k + 1])) / 2))
                better = first if diff[k + 1] < 0 else second
                found.append({"models": [first, second], "budget": at, "better_above": better,
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


def save_figure(fig, path: Path, dpi: int) -> Path:
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    plt.close(fig)
    return Path(path)
