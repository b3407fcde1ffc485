"""Tune one model family with Optuna: every trial is an ordinary run of TinyStories.py.

    python sweep.py MODEL=esn TRIALS=40 SWEEP_NAME=esn-8min [TinyStories.py KEY=VALUE ... as fixed settings]
    python sweep.py MODEL=esn TRIALS=40 SWEEP_NAME=esn-pg SWEEP_STORAGE=postgresql+psycopg2://user@host/db
    python sweep.py MODEL=esn SEARCH="ESN.spectral_radius=log(0.1,3) ESN.leak_rate=float(0.05,1)" ...

Sweep keys: MODEL (required), TRIALS (default 20: finished trials of the whole study, all workers
together), SWEEP_NAME (default <model>-sweep), SWEEP_STORAGE (an SQLAlchemy URL; default a journal
file in results/sweeps/<name>/), SEARCH (replaces the model's declared search space), SWEEP_WORKER
(an index per worker started with the same settings, so their samplers differ). Everything else
is a TinyStories.py setting held fixed for every trial.

The same command on several machines (with one SWEEP_STORAGE) makes them workers on one study;
running it again continues the study. At the end: results/sweeps/<name>/best.json (with the line
to paste into TinyStories.py), Optuna's plots as PNGs, and one summary line.
"""

from __future__ import annotations

import sys
from pathlib import Path

from configs import (
    SHARED_CONFIG,
    ConfigError,
    model_blocks,
    parse_literal,
    parse_overrides,
    split_arguments,
    wants_help,
)
from reservoir.config import load_plugins, named_plugins
from reservoir.data.tokens import prepare_data
from reservoir.models import ModelSettingsError
from reservoir.platform import stopping
from reservoir.platform.entry import entry_point
from reservoir.platform.messages import TAG, OneLineError
from reservoir.run.experiment import run_experiment
from reservoir.studies.storage import lost_storage_in
from reservoir.studies.sweeps import (
    Sweep,
    SweepError,
    open_study,
    parse_search,
    run_trials,
    search_spaces,
    storage_lost,
    write_outputs,
)

SWEEP_KEYS = ("MODEL", "TRIALS", "SWEEP_NAME", "SWEEP_STORAGE", "SEARCH", "SWEEP_WORKER")


def known_keys() -> set[str]:
    keys = {k for k, v in SHARED_CONFIG.items() if not isinstance(v, dict)}
    return keys | {f"{block}.{name}" for block in model_blocks() for name in SHARED_CONFIG[block]}


def parse_args(argv: list[str]) -> Sweep:
    """The sweep a command line asks for; its fixed settings are checked as a run's would be."""
    if wants_help(argv):
        print(__doc__)
        raise SystemExit(0)
    own, fixed = split_arguments(argv, SWEEP_KEYS)
    model = own.get("MODEL", "").lower()
    load_plugins(named_plugins(fixed, []))  # a plugin's families may be swept too
    spaces = search_spaces()
    if model not in spaces:
        raise SweepError(f"MODEL={model or '?'} is not a model to sweep; choose one of {', '.join(spaces)}")
    trials = parse_literal(own.get("TRIALS", "20"))
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise SweepError(f"TRIALS must be a whole number >= 1, got {own.get('TRIALS')!r}")
    worker = parse_literal(own.get("SWEEP_WORKER", "0"))
    if isinstance(worker, bool) or not isinstance(worker, int) or worker < 0:
        raise SweepError(f"SWEEP_WORKER must be a whole number >= 0, got {own.get('SWEEP_WORKER')!r}")
    name = own.get("SWEEP_NAME") or f"{model}-sweep"
    if "/" in name or name in (".", ".."):
        raise SweepError(f"SWEEP_NAME must be a plain name, got {name!r}")
    space = parse_search(own["SEARCH"], known_keys()) if own.get("SEARCH") else spaces[model]
    base = parse_overrides([*fixed, f"MODELS={[model]}"])  # fixed settings checked before a trial,
    prepare_data(base)  # and the data they name read (then cached for the trials): a bad one opens no study
    return Sweep(model, trials, name, own.get("SWEEP_STORAGE") or None, space, worker, fixed,
                 Path(base["RESULTS_DIR"]) / "sweeps" / name, base["SEED"])


@entry_point
def main(argv: list[str]) -> int:
    sweep = None
    try:
        sweep = parse_args(argv)
        study = open_study(sweep.name, sweep.storage, sweep.folder, sweep.seed, sweep.worker)
        run_trials(study, sweep, lambda config, hook: run_experiment(config, on_evaluation=hook),
                   refused=(ConfigError, ModelSettingsError))
        best = write_outputs(study, sweep.model, sweep.folder, sweep.fixed)
    except OneLineError as e:
        raise SystemExit(f"error: {e}") from None
    except (stopping.Stopped, KeyboardInterrupt) as e:
        print(f"{TAG} sweep stopped ({getattr(e, 'signal_name', 'Ctrl-C')}); the trial in progress was interrupted "
              "and does not count: the same command continues the study and runs its settings again.",
              file=sys.stderr, flush=True)
        return getattr(e, "exit_code", 130)
    except Exception as e:  # a lost database, whatever Optuna raised on meeting it
        lost = lost_storage_in(e)
        if lost is None:
            raise
        raise SystemExit(f"error: {storage_lost(sweep.storage if sweep else None, lost)}") from None
    counts = ", ".join(f"{n} {state}" for state, n in best["trials"].items() if n)
    print(f"{TAG} sweep {best['study']}: best {best['best_value_bpc']:.4f} bits/char (trial {best['best_trial']}, "
          f"{counts}); paste: {best['override']}  -> {sweep.folder / 'best.json'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
