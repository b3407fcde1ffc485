"""One run, from a validated config to its results folder: training and evaluation (with FLOPs counted),
checkpoints, the folder's records, trackers, samples, the table and the plots.

    run = run_experiment(config)        # config: reservoir.config.parse_overrides([...])
"""

from reservoir.run.checkpoint import CheckpointError
from reservoir.run.experiment import run_experiment
from reservoir.run.records import ResultsError, point_scores, read_json, read_run_config, read_summary
from reservoir.run.tables import format_table
from reservoir.run.trained import load_trained
from reservoir.run.writer import Run

__all__ = ["CheckpointError", "run_experiment", "ResultsError", "point_scores", "read_json", "read_run_config",
           "read_summary", "format_table", "load_trained", "Run"]
