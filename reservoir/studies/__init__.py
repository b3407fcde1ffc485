"""Many runs read together: the budget ladder, the sweeps, the paired comparison of two runs and its
diagnostics, the points of a study run side by side; the fair frontier in ``reservoir.studies.frontier``."""

from reservoir.studies.budgets import StudyError, parse_budgets, point_name
from reservoir.studies.comparison import Side, compare, describe
from reservoir.studies.curves import fit_curve
from reservoir.studies.ladder import Study
from reservoir.studies.runner import run_point, run_points

__all__ = ["StudyError", "parse_budgets", "point_name", "Side", "compare", "describe", "fit_curve", "Study",
           "run_point", "run_points"]
