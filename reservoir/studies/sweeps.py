"""Hyper-parameter sweeps on Optuna: every model family tuned the same way, on one machine or many.

    study = open_study(sweep.name, sweep.storage, sweep.folder, sweep.seed, sweep.worker)  # storage: the workers' hub
    run_trials(study, sweep, run_experiment)    # sweep: a Sweep (model, trials, space, ...)
    best = write_outputs(study, sweep.model, sweep.folder, sweep.fixed)   # best.json + Optuna's plots

A trial is an ordinary run (its own results folder under ``results/sweeps/<name>/trials/``);
its objective is the model's final validation bits/char, and its periodic evaluations feed
a median pruner. Storage is a journal file in the sweep's folder by default (safe for several
local processes), or any SQLAlchemy URL (``SWEEP_STORAGE=postgresql+psycopg2://...``), through
which any number of machines work on one study: Optuna's storage hands out trial numbers and
holds the results, so there is no queue of our own.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import socket
import threading
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

from reservoir.config import parse_overrides
from reservoir.models.registry import INT, LOG, MODELS
from reservoir.models.settings import model_settings
from reservoir.platform import stopping
from reservoir.platform.files import atomic_write_text, portable_path, portable_paths_in
from reservoir.platform.machine import process_start
from reservoir.platform.messages import OneLineError, say, warn
from reservoir.run.records import run_seeds
from reservoir.studies.storage import open_rdb, shown, storage_errors

SEARCH_SPACES = {name: dict(family.search) for name, family in MODELS.items() if family.search}  # the built-in


def search_spaces() -> dict[str, dict]:
    """Every family's search space (``Family.search_space``), those a loaded plugin declares among them."""
    return {name: space for name, family in MODELS.items() if (space := family.search_space())}


_RANGE = re.compile(r"^\s*(log|float|int)\s*\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)\s*$")


class SweepError(OneLineError, ValueError):
    """A sweep that cannot run as asked: reported as one line, nothing in an existing study touched."""


class StorageLost(OneLineError, RuntimeError):
    """The study's database went away mid-sweep: one line; the same command continues once it is back."""


def storage_lost(storage_url: str | None, error: BaseException) -> StorageLost:
    cause = error.__cause__ or error
    reason = " ".join(str(cause).split())[:160] or type(cause).__name__
    return StorageLost(f"the sweep storage {shown(storage_url)} was lost mid-sweep ({reason}); the trial in "
                       "progress does not count toward TRIALS: restart the database, then run the same command "
                       "again to continue the study")


class _QuietEndings(logging.Filter):
    """Drops Optuna's traceback for a trial that ended because the sweep was stopped, its storage lost or a
    one-line error met: the sweep says that in one line of its own; every other failure is logged in full."""

    def __init__(self):
        super().__init__()
        self.trials: set[int] = set()
        # looked up once, not per record; a OneLineError (data that cannot be read, ...) is said by the sweep
        self.endings = (stopping.Stopped, KeyboardInterrupt, OneLineError, *storage_errors())

    def filter(self, record: logging.LogRecord) -> bool:
        ended = record.exc_info and isinstance(record.exc_info[1], self.endings)
        match = re.match(r"Trial (\d+) failed", record.getMessage())
        if ended and match:
            self.trials.add(int(match.group(1)))
        return not (ended or (match and int(match.group(1)) in self.trials))


class _QuietConnectionLoss(logging.Filter):
    """Drops Optuna's multi-line warning when a query meets a closed database connection (it retries the
    query another way, which meets the same loss): the sweep's own line says the storage was lost."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "OperationalError" not in record.getMessage()


def _counted(trial, reruns: set[int]) -> bool:
    """Whether a trial counts toward TRIALS: finished, pruned, or failed for a reason of its own (one
    that a stop, a lost storage or a dead worker interrupted is re-run instead)."""
    from optuna.trial import TrialState

    if trial.state in (TrialState.COMPLETE, TrialState.PRUNED):
        return True
    return trial.state == TrialState.FAIL and not trial.user_attrs.get("interrupted") and trial.number not in reruns


def _reruns(trials) -> set[int]:
    return {t.user_attrs["rerun_of"] for t in trials if isinstance(t.user_attrs.get("rerun_of"), int)}


def enqueue_rerun(study, trial) -> None:
    """Queue ``trial``'s settings again (keeping whether they were the study's starting settings)."""
    attrs = {"rerun_of": trial.number}
    if trial.user_attrs.get("starting_settings"):
        attrs["starting_settings"] = True
    study.enqueue_trial(trial.params, user_attrs=attrs)


def _fail_silent_workers(study) -> bool:
    """Fail the trials whose worker stopped beating (a host that died or lost the database; the storage's
    heartbeats say so after their grace period), which queues their settings again (``enqueue_rerun``, the
    storage's callback): Optuna does this only as a worker starts a trial, so a sweep with nothing left to start
    would keep them RUNNING for good. Whether any was failed."""
    import optuna
    from optuna.trial import TrialState

    running = {t.number: t for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))}
    if not running:
        return False
    with warnings.catch_warnings():  # heartbeats are marked experimental
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)
    failed = [t for t in study.get_trials(deepcopy=False, states=(TrialState.FAIL,)) if t.number in running]
    for trial in failed:
        say(f"sweep {study.study_name}: trial {trial.number}'s worker ({trial.user_attrs.get('worker')} on "
            f"{trial.user_attrs.get('host')}) stopped beating; its settings are run again")
    return bool(failed)


def _worker_gone(trial) -> bool:
    """Whether ``trial``'s worker process has ended: only for a worker on this machine that recorded its pid
    (a worker elsewhere cannot be checked from here; PostgreSQL's heartbeats cover those)."""
    pid = trial.user_attrs.get("pid")
    if not isinstance(pid, int) or trial.user_attrs.get("host") != socket.gethostname():
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:  # alive, another user's
        return False
    started = trial.user_attrs.get("pid_started")
    return started is not None and process_start(pid) != started  # the pid now belongs to another process


def parse_search(text: str, known_keys) -> dict:
    """``'ESN.spectral_radius=log(0.1,3) ESN.leak_rate=float(0.1,1)'`` -> {key: (kind, low, high)}."""
    space = {}
    for item in text.replace(";", " ").split():
        key, eq, spec = item.partition("=")
        match = _RANGE.match(spec) if eq else None
        if not match:
            raise SweepError(f"SEARCH entry {item!r} is not KEY=log(low,high), float(low,high) or int(low,high)")
        kind, low, high = match.group(1), float(match.group(2)), float(match.group(3))
        if not low < high or (kind == LOG and low <= 0):
            raise SweepError(f"SEARCH entry {item!r}: need low < high (and low > 0 for log)")
        if kind == INT:
            low, high = int(low), int(high)
        space[normalise_key(key, known_keys)] = (kind, low, high)
    if not space:
        raise SweepError("SEARCH is empty; give entries like SEARCH='ESN.spectral_radius=log(0.1,3)'")
    return space


def normalise_key(key: str, known_keys) -> str:
    """``esn.spectral_radius`` -> ``ESN.spectral_radius``, refusing keys the config does not have."""
    block, dot, name = key.partition(".")
    canonical = f"{block.upper()}.{name.lower()}" if dot else block.upper()
    if canonical not in known_keys:
        raise SweepError(f"search-space key {key!r} is not a setting of this project (e.g. ESN.spectral_radius, "
                         "LEARNING_RATE); see python TinyStories.py --help")
    return canonical


def suggest(trial, space: dict) -> dict:
    values = {}
    for key, (kind, low, high) in space.items():
        if kind == INT:
            values[key] = trial.suggest_int(key, int(low), int(high))
        else:
            values[key] = trial.suggest_float(key, low, high, log=kind == LOG)
    return values


def current_settings(config: dict, space: dict) -> dict:
    """The values ``config`` already has for the searched keys (those inside their range): a study's
    first trial, so a sweep never reports a best worse than what it started from."""
    values = {}
    for key, (kind, low, high) in space.items():
        block, dot, name = key.partition(".")
        value = config[block][name] if dot else config[key]
        if isinstance(value, (int, float)) and not isinstance(value, bool) and low <= value <= high:
            values[key] = int(value) if kind == INT else float(value)
    return values


def override_line(params: dict) -> str:
    """The settings as the runner's command line takes them: ``ESN.spectral_radius=1.21 ...``."""
    return " ".join(f"{key}={value!r}" for key, value in params.items())


def _storage(storage_url: str | None, folder: Path):

    if not storage_url:
        from optuna.storages.journal import JournalFileBackend, JournalStorage

        try:
            return JournalStorage(JournalFileBackend(str(folder / "journal.log")))
        except OSError as e:
            raise SweepError(f"cannot open the sweep journal {folder / 'journal.log'} ({e.strerror})") from None
    return open_rdb(storage_url, 30, enqueue_rerun, SweepError, "SWEEP_STORAGE")  # a dead worker's trial: again


def open_study(name: str, storage_url: str | None, folder: Path, seed: int, worker: int):
    """The study ``name`` in ``storage_url`` (default: a journal file in ``folder``), created or continued."""
    import optuna

    folder.mkdir(parents=True, exist_ok=True)
    storage = _storage(storage_url, folder)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=5)
    study = optuna.create_study(study_name=name, storage=storage, pruner=pruner, direction="minimize",
                                load_if_exists=True)
    # workers draw different candidates, and so does a continued study: a sampler seeded as the first command's
    # replays its draws, and the trials after a restart measured settings already measured
    done = len(study.get_trials(deepcopy=False))
    study.sampler = optuna.samplers.TPESampler(seed=seed + 7919 * worker + 104729 * done)
    return study


@dataclass(frozen=True)
class Sweep:
    """What one sweep command asks for (sweep.py's keys), its fixed settings and its folder."""

    model: str
    trials: int  # finished trials of the whole study, all workers together
    name: str
    storage: str | None  # an SQLAlchemy URL; None: a journal file in ``folder``
    space: dict  # key -> distribution, as parse_search makes them
    worker: int  # this worker's index (its sampler's seed differs)
    fixed: list[str]  # TinyStories.py KEY=VALUE held for every trial
    folder: Path  # results/sweeps/<name>
    seed: int  # the fixed settings' SEED: seeds the sampler (with the worker's index)


def run_trials(study, sweep: Sweep, run_one, refused: tuple[type[Exception], ...] = ()) -> None:
    """Run trials until the study holds ``sweep.trials`` finished ones (all workers together); a trial
    that was interrupted (a stop, a lost storage, a dead worker) does not count and is run again.

    ``run_one(config, on_evaluation)`` runs one experiment and returns its Run; ``parse(args)``
    turns KEY=VALUE arguments into a validated config; ``refused``: the errors with which either
    refuses a trial's settings (the trial fails; the sweep goes on).
    """
    import optuna
    from optuna.trial import TrialState

    model, trials, fixed, folder, space, worker = (sweep.model, sweep.trials, sweep.fixed, sweep.folder, sweep.space,
                                                   sweep.worker)

    def objective(trial):
        params = suggest(trial, space)
        run_dir = folder / "trials"
        args = [*fixed, f"MODELS={[model]}", f"RESULTS_DIR={run_dir}", f"RUN_NAME=trial-{trial.number:04d}",
                "PLOTS=False", "RESUME=None", *[f"{k}={v!r}" for k, v in params.items()]]
        try:
            config = parse_overrides(args)
        except refused as e:  # settings the search space allows but this data cannot build (say, n-gram keys)
            warn(f"trial {trial.number}: {e}; recorded as failed")
            return math.nan
        trial.set_user_attr("run_dir", str(run_dir / f"trial-{trial.number:04d}"))
        trial.set_user_attr("host", socket.gethostname())
        trial.set_user_attr("worker", f"{worker} (pid {os.getpid()})")
        trial.set_user_attr("pid", os.getpid())  # a RUNNING trial whose process is gone is run again
        trial.set_user_attr("pid_started", process_start(os.getpid()))
        started = time.perf_counter()

        first_seed = run_seeds(config)[0]  # with SEEDS, the first seed's curve feeds the pruner

        def on_evaluation(record):  # periodic evaluations only: pruning a finished model would discard it
            if (record.get("val_bpc") is not None and record["model"] == model and not record.get("final")
                    and record.get("seed") == first_seed):
                trial.report(record["val_bpc"], record["step"])
                if trial.should_prune():
                    raise optuna.TrialPruned(f"pruned at step {record['step']}")

        try:
            run = run_one(config, on_evaluation)
        except (stopping.Stopped, KeyboardInterrupt):
            trial.set_user_attr("interrupted", True)  # re-run when the study continues, not counted
            raise
        except refused as e:
            warn(f"trial {trial.number}: {e}; recorded as failed")
            return math.nan
        except OneLineError:  # not the trial's settings (the data, a disk): it measured nothing, so it is run
            trial.set_user_attr("interrupted", True)  # again when the study continues, and does not count
            raise
        trial.set_user_attr("seconds", round(time.perf_counter() - started, 1))
        records = [r for r in run.summaries() if r["model"] == model]  # one per seed
        diverged = next((r for r in records if r.get("val_bpc") is None), None)
        if diverged is not None:
            warn(f"trial {trial.number}: {model} diverged ({diverged.get('reason')}); recorded as failed")
            return math.nan  # Optuna records a NaN objective as a failed trial
        return sum(r["val_bpc"] for r in records) / len(records)  # the mean over SEEDS

    if not study.trials:  # a new study first measures the settings it would replace
        starting = model_settings(parse_overrides([*fixed, f"MODELS={[model]}"]), model)
        study.enqueue_trial(current_settings(starting, space),
                            user_attrs={"starting_settings": True}, skip_if_exists=True)  # workers race
    _fail_silent_workers(study)
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        if _worker_gone(trial):  # a killed worker (SIGKILL, a crash) left it RUNNING: it never ends by itself
            say(f"sweep {study.study_name}: trial {trial.number}'s worker ({trial.user_attrs.get('worker')}) is "
                "gone; its settings are run again")
            study._storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
            study._storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            enqueue_rerun(study, trial)
    existing = study.get_trials(deepcopy=False)
    reruns = _reruns(existing)
    for trial in existing:  # a trial a stop interrupted is measured again, starting settings included
        if trial.state == TrialState.FAIL and trial.user_attrs.get("interrupted") and trial.number not in reruns:
            say(f"sweep {study.study_name}: trial {trial.number} was interrupted; its settings are run again")
            enqueue_rerun(study, trial)
    existing = study.get_trials(deepcopy=False)  # with the reruns just queued
    finished = sum(_counted(t, reruns) for t in existing)
    waiting = sum(t.state == TrialState.WAITING for t in existing)  # reruns: run them whatever TRIALS says
    if finished >= trials and not waiting:
        say(f"sweep {study.study_name}: already holds {finished} finished trials (TRIALS={trials}); nothing to run")
        return

    def enough(study, _trial):  # all workers together: stop once TRIALS trials count
        trials_now = study.get_trials(deepcopy=False)
        if sum(_counted(t, _reruns(trials_now)) for t in trials_now) >= trials:
            study.stop()

    quiet, quiet_storage, lost = _QuietEndings(), _QuietConnectionLoss(), storage_errors()
    optuna_log, storage_log = logging.getLogger("optuna.study._optimize"), logging.getLogger(
        "optuna.storages._rdb.storage")
    thread_hook = threading.excepthook

    def heartbeat_died(args):  # Optuna's heartbeat thread meeting a lost database: the trial's end says it
        if not issubclass(args.exc_type, lost):
            thread_hook(args)

    optuna_log.addFilter(quiet)
    storage_log.addFilter(quiet_storage)
    threading.excepthook = heartbeat_died
    try:
        study.optimize(objective, n_trials=max(trials - finished, waiting), catch=(), callbacks=[enough])
    finally:
        optuna_log.removeFilter(quiet)
        storage_log.removeFilter(quiet_storage)
        threading.excepthook = thread_hook
    if _fail_silent_workers(study):  # a host went silent while this one ran the last trials: its settings now
        run_trials(study, sweep, run_one, refused)


def write_outputs(study, model: str, folder: Path, fixed: list[str]) -> dict:
    """best.json, and Optuna's plots as PNGs, in the sweep's folder; returns best.json's content."""
    from optuna.trial import TrialState

    complete = [t for t in study.trials if t.state == TrialState.COMPLETE]
    if not complete:
        raise SweepError(f"sweep {study.study_name} has no completed trial yet; nothing to report")
    best = study.best_trial
    seconds = [t.user_attrs["seconds"] for t in complete if "seconds" in t.user_attrs]
    summary = {
        "study": study.study_name, "model": model, "best_value_bpc": best.value, "best_trial": best.number,
        "best_params": best.params, "override": override_line(best.params),
        "fixed_settings": [portable_paths_in(a) for a in fixed],  # a record a reader clones names no machine's paths
        "best_is_starting_settings": bool(best.user_attrs.get("starting_settings")),
        "run_dir": portable_path(best.user_attrs.get("run_dir")), "host": best.user_attrs.get("host"),
        "trials": _state_counts(study.trials),
        "seconds_per_completed_trial": round(sum(seconds) / len(seconds), 1) if seconds else None,
    }
    atomic_write_text(folder / "best.json", json.dumps(summary, indent=2) + "\n")
    _plots(study, folder)
    return summary


def _state_counts(trials) -> dict:
    """Trials by state; 'interrupted': failed ones that were (or will be) run again, not in 'fail'."""
    from optuna.trial import TrialState

    reruns = _reruns(trials)
    interrupted = [t for t in trials if t.state == TrialState.FAIL and not _counted(t, reruns)]
    counts = {state.name.lower(): sum(t.state == state for t in trials)
              for state in (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL, TrialState.RUNNING)}
    return {**counts, "fail": counts["fail"] - len(interrupted), "interrupted": len(interrupted)}


def _plots(study, folder: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import optuna.visualization.matplotlib as views

    for name, draw in (("optimization_history", views.plot_optimization_history),
                       ("param_importances", views.plot_param_importances), ("slice", views.plot_slice)):
        try:
            with warnings.catch_warnings():  # Optuna marks its matplotlib views experimental
                warnings.simplefilter("ignore")
                draw(study)
            plt.savefig(folder / f"{name}.png", dpi=110, bbox_inches="tight")
        except Exception as e:  # noqa: BLE001 - e.g. importances need two finished trials: skip that plot
            warn(f"sweep plot {name} skipped ({type(e).__name__}: {str(e)[:120]})")
        finally:
            plt.close("all")
