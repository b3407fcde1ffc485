"""The budget ladder and the fair frontier: models at several FLOP budgets, curves fitted, one plot.

    python scaling.py                                      # the ladder (about 2 h on 2 cores)
    python scaling.py BUDGETS=1e12,2e12,4e12,8e12,1.6e13 STUDY=small DATASET=path/to/tinystories
    python scaling.py ... MODELS=transformer,esn SEEDS=1,2,3     # any TinyStories.py KEY=VALUE

    python scaling.py FRONTIER=True STUDY=frontier DATASET=...   # every family at its best at every budget
    python scaling.py FAMILIES=transformer++,lstm SIZES=xs,s LEARNING_RATES=2e-3,4e-3 BATCH_SIZES=8,16 ...
    python scaling.py REPORT=results/frontier              # tables and plots again, from the records alone
    python scaling.py REPORT=results                       # every study under results/: results/REPORT.md
    python scaling.py FRONTIER=True STUDY=big STUDY_STORAGE=postgresql+psycopg2://me@db/studies ...  # each host
    python scaling.py EXPORT=results/big STUDY_STORAGE=postgresql+psycopg2://me@db/studies   # records -> files
    python scaling.py FRONTIER=True PLAN=True HOSTS=4 ...     # what it costs here, before anything trains
    python scaling.py GENERATION=results/frontier          # what generating costs each envelope configuration
    python scaling.py GENERATION=exports/<name>            # ... or one exported model (export.py)
    python scaling.py ELEMENTWISE=results/frontier         # each grid configuration's step, element-wise work too

The ladder: study keys BUDGETS (FLOP budgets, at least two, increasing; default 2.5e12,5e12,1e13,2e13,4e13)
and STUDY (the folder under RESULTS_DIR, default 'scaling'). Everything else is a TinyStories.py
setting held for every point; the study's own defaults are the six models of the comparison,
SEEDS=1337,1338 and no time limit (compute alone ends each fit, so the machine's load does not
change the ladder). Each budget is an ordinary run folder RESULTS_DIR/STUDY/flops-<budget>;
running the same command again skips finished points and resumes an interrupted one.
Writes RESULTS_DIR/STUDY/scaling.json and scaling.png, and prints the table.

The frontier (FRONTIER=True, or any of its keys): a grid per family (FAMILIES, SIZES, LEARNING_RATES,
BATCH_SIZES), every point on the wsd schedule so each budget branches off the one before, successive
halving over BUDGETS (KEEP, WITHIN), the envelope re-run on ENVELOPE_SEEDS seeds, WORKERS points at once
(auto: one per CPU core, GPU or TPU chip; DEVICES_PER_POINT each; POINTS_PER_DEVICE on each, folded off a
GPU: auto, probe (a GPU's too) or K), cells
skipped below MIN_STEPS steps or above MAX_TOKENS_PER_PARAM tokens per parameter. Writes frontier.json,
frontier.md and frontier.png in RESULTS_DIR/STUDY (default 'frontier'); reservoir/studies/frontier/ says
more, docs/studies.md how to read the plot.
"""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

from configs import split_arguments, wants_help
from reservoir.platform.device import runs_on_cpu
from reservoir.platform.entry import entry_point
from reservoir.platform.files import repository_path
from reservoir.platform.messages import TAG, OneLineError, say
from reservoir.platform.stopping import ended_by_a_signal
from reservoir.run.records import read_json
from reservoir.share.folder import hub_id, is_export
from reservoir.studies.budgets import StudyError, positive_numbers
from reservoir.studies.frontier.accounting import count_study, write_counts
from reservoir.studies.frontier.analysis import report_from_records
from reservoir.studies.frontier.generation import (
    format_measured,
    measure_export,
    measure_study,
    read_generation,
    write_generation,
)
from reservoir.studies.frontier.grid import FRONTIER_KEYS
from reservoir.studies.frontier.plan import plan_study
from reservoir.studies.frontier.records import STUDY_FILE
from reservoir.studies.frontier.report import format_study, headline, write_from_records, write_study
from reservoir.studies.frontier.shared import export_records
from reservoir.studies.frontier.study import FrontierExit, FrontierStudy, measure_cells
from reservoir.studies.ladder import STUDY_KEYS, Study, StudyExit, format_report, plot_scaling, write_report
from reservoir.studies.runner import run_point, run_points
from reservoir.studies.storage import lost_storage_in, shown


def report_only(folder: str) -> int:
    for path in write_from_records(Path(folder)):
        say(f"wrote {path}")
        if path.name == "frontier.json":
            print(f"{TAG} {path.parent.name}:\n{headline(read_json(path, 'the report'))}", flush=True)
    return 0


def generation_cost(folder: str) -> int:
    """What each family's envelope configuration costs to generate with, into the study's records and report; for
    an exported model (its folder or Hub id), its own costs, printed."""
    path = Path(folder)
    if hub_id(folder) is not None or is_export(path):
        print(format_measured(measure_export(folder)), flush=True)
        return 0
    if not (path / STUDY_FILE).is_file():
        raise StudyError(f"{path} is not a frontier study's folder (it holds no {STUDY_FILE}): "
                         "GENERATION=results/<study>")
    report = report_from_records(path)  # built once: measured from, then written with the measurement in it
    measured = measure_study(path, report, f"python scaling.py GENERATION={repository_path(path)}")
    say(f"wrote {write_generation(path, measured)}")
    for written in write_study({**report, "generation": read_generation(path)}, path):
        say(f"wrote {written}")
    return 0


def elementwise_cost(folder: str) -> int:
    """One training step of every configuration the grid trained, counted with its element-wise work, into the
    study's records and report."""
    path = Path(folder)
    if not (path / STUDY_FILE).is_file():
        raise StudyError(f"{path} is not a frontier study's folder (it holds no {STUDY_FILE}): "
                         "ELEMENTWISE=results/<study>")
    report = report_from_records(path)
    counted = count_study(path, report["grid_points"], f"python scaling.py ELEMENTWISE={repository_path(path)}")
    say(f"wrote {write_counts(path, counted)}")
    for written in write_study(report_from_records(path), path):
        say(f"wrote {written}")
    return 0


def frontier(own: dict, settings: list[str], command: str) -> int:
    planning = own.pop("PLAN", "false").strip().lower() in ("true", "1", "yes")
    if "HOSTS" in own and not planning:
        raise StudyError("HOSTS prices a study for that many hosts, with PLAN=True; the hosts of a running study "
                         "are the machines that run its command (STUDY_STORAGE): add PLAN=True, or leave HOSTS out")
    hosts = positive_numbers("HOSTS", own.pop("HOSTS", "1"), "2", StudyError, integers=True)[0]
    study = FrontierStudy.from_args(own, settings)
    if planning:  # what it costs, before anything trains or is written
        with ended_by_a_signal() as stop:  # a plan is nothing but its answer: stopped, it says so and writes nothing
            answer = plan_study(study, measure_cells(study), hosts, stop.check)
        if stop.signal_name:
            print(f"{TAG} plan for frontier {study.name} stopped by {stop.signal_name}: nothing trained, nothing "
                  "written (the same command plans again)", file=sys.stderr, flush=True)
            return stop.exit_code
        print(answer, flush=True)
        return 0
    try:
        study.run(run_points, measure_cells(study))
    except FrontierExit as e:
        print(f"{TAG} frontier stopped: {e}; the same command continues it: {command}", file=sys.stderr, flush=True)
        return e.code
    except OneLineError:
        raise
    except Exception as e:  # a shared study's database lost mid-study (whatever Optuna raised on meeting it)
        lost = lost_storage_in(e)
        if lost is None:
            raise
        reason = " ".join(str(lost).split())[:160] or type(lost).__name__
        raise StudyError(f"the study storage {shown(study.storage_url)} was lost mid-study ({reason}); every recorded "
                         "point is kept, and points this host finished are recorded when it is back: restart the "
                         "database, then run the same command") from None
    report = study.report()
    for path in write_study(report, study.path):
        say(f"wrote {path}")
    print(format_study(report, "frontier.png", level=1), flush=True)
    return 0


def typed_command(argv: list[str]) -> str:
    """This command as a shell takes it again."""
    return shlex.join(["python", "scaling.py", *argv])


@entry_point
def main(argv: list[str]) -> int:
    if wants_help(argv):
        print(__doc__)
        return 0
    try:
        own, settings = split_arguments(argv, (*STUDY_KEYS, *FRONTIER_KEYS, "FRONTIER", "REPORT", "EXPORT",
                                                "GENERATION", "ELEMENTWISE"))
        if "EXPORT" in own:  # a shared study's records, from its database into committable files
            if set(own) != {"EXPORT", "STUDY_STORAGE"} or settings:
                raise StudyError("EXPORT=results/<study> STUDY_STORAGE=<url> writes a shared study's records and "
                                 "report from its database: give those two alone")
            say(f"wrote {export_records(own['STUDY_STORAGE'], Path(own['EXPORT']))}")
            return report_only(own["EXPORT"])
        if "GENERATION" in own:
            if len(own) > 1 or settings:
                raise StudyError("GENERATION=<study folder> measures what generating costs for each family's envelope "
                                 "configuration at the top grid budget: give it alone")
            return generation_cost(own["GENERATION"])
        if "ELEMENTWISE" in own:
            if len(own) > 1 or settings:
                raise StudyError("ELEMENTWISE=<study folder> counts each grid configuration's training step with its "
                                 "element-wise work: give it alone")
            return elementwise_cost(own["ELEMENTWISE"])
        if "REPORT" in own:
            if len(own) > 1 or settings:
                raise StudyError("REPORT=<study folder> rebuilds a study's tables and plots from its records: "
                                 "give it alone")
            return report_only(own["REPORT"])
        if own.pop("FRONTIER", "false").lower() in ("true", "1", "yes") or any(k in own for k in FRONTIER_KEYS):
            return frontier(own, settings, typed_command(argv))
        study = Study.from_args(own, settings)
        on_cpu = runs_on_cpu(study.config)  # its points forked from the fork server (see runner.py)
        study.run(lambda args: run_point(args, on_cpu=on_cpu))
        report = study.report()
        path = write_report(report, study.path)
        png = plot_scaling(report, study.path / "scaling.png")
    except OneLineError as e:
        raise SystemExit(f"error: {e}") from None
    except StudyExit as e:
        print(f"{TAG} study stopped: {e}; the same command continues it: {typed_command(argv)}", file=sys.stderr,
              flush=True)
        return e.code
    print(f"\n{TAG} study {study.name}: validation bits/char (mean ± sd over seeds) by training FLOPs\n"
          f"{format_report(report)}", flush=True)
    say(f"report: {path}")
    say(f"plot: {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
