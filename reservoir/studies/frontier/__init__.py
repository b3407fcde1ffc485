"""The fair frontier: every family at its best at every budget, and the report built from its records.

    grid      families, size presets, the study's keys; the grid of a command line
    records   a study's points gathered into rows
    analysis  envelopes, IsoFLOP profiles, N_opt, fits, compute multipliers
    report    frontier.json / .md / .png and REPORT.md
    study     the study that runs it all (successive halving over budgets, seeds, stages)
"""

from reservoir.studies.frontier.analysis import build_frontier, report_from_records
from reservoir.studies.frontier.grid import FAMILIES, FRONTIER_KEYS, SIZES, Cell, FrontierError
from reservoir.studies.frontier.report import format_study, headline, write_from_records, write_study
from reservoir.studies.frontier.study import FrontierExit, FrontierStudy, measure_cells

__all__ = ["build_frontier", "report_from_records", "FAMILIES", "FRONTIER_KEYS", "SIZES", "Cell", "FrontierError",
           "format_study", "headline", "write_from_records", "write_study", "FrontierExit", "FrontierStudy",
           "measure_cells"]
