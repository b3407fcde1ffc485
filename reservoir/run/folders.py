"""Which folder a run writes: a new one under RESULTS_DIR, or the one ``RESUME`` names, locked for
the life of the run. A new run always gets a new folder; only ``RESUME`` writes into an old one, and only
with the settings it was started with.
"""

from __future__ import annotations

import datetime
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from reservoir.data.tokens import corpus_differences
from reservoir.platform.files import Busy, StorageError, lock_folder, remove_stale_temporaries
from reservoir.platform.messages import warn
from reservoir.run.checkpoint import (
    CheckpointError,
    checkpoint_file,
    load_checkpoint,
)
from reservoir.run.records import ResultsError, read_json, read_run_config, run_seeds

WHERE_KEYS = ("RESULTS_DIR", "CACHE_DIR")  # where a run is found and caches kept: RESUME may name others
DATA_KEYS = ("DATASET", "DATA_DIR", "TRAIN_PATH", "VAL_PATH")  # where its data is: RESUME may name others, if
# they hold the same text (check_same_corpus)


def find_run_dir(results_dir: str, resume: str) -> Path:
    """The folder ``RESUME`` names: a path, a run name under RESULTS_DIR, or 'latest'."""
    root = Path(results_dir)
    if resume == "latest":
        runs = [p for p in root.glob("*/config.json")] if root.is_dir() else []
        if not runs:
            raise ResultsError(f"RESUME='latest' but {root}/ holds no runs; start one with python TinyStories.py")
        return max(runs, key=lambda p: p.stat().st_mtime).parent
    for candidate in (Path(resume), root / resume):
        if (candidate / "config.json").is_file():
            return candidate
    raise ResultsError(f"RESUME={resume!r}: no run folder with a config.json there (or under {root}/); "
                       "give a folder like results/<run> or RESUME=latest")


def resumed_config(saved: dict, given: dict, named) -> dict:
    """The saved run's requested config, refusing command-line changes to it.

    ``named``: the settings the command line gave ("SEQ_LEN", "ESN.units"). One that disagrees with the
    saved run (its default value or not) would silently mix two experiments in one folder. Only where
    the run folder, caches and data are (RESULTS_DIR, CACHE_DIR; DATASET, DATA_DIR, TRAIN_PATH, VAL_PATH) may
    differ: they are taken from the command, and the data checked to be the same text once it is read.
    """
    def value(config: dict, name: str):
        key, _, sub = name.partition(".")
        block = config.get(key)
        return (block.get(sub) if isinstance(block, dict) else None) if sub else block

    places = (*WHERE_KEYS, *DATA_KEYS)
    changed = [n for n in named if n != "RESUME" and n not in places and value(given, n) != value(saved, n)]
    if changed:
        raise ResultsError(f"RESUME continues a run with its own settings; {', '.join(changed)} differ from the "
                           "saved run: drop them, or start a new run")
    where = {k: given[k] for k in places if k in named}
    return {**saved, **where, "RESUME": given["RESUME"]}


def check_same_corpus(run_dir: Path, data: dict) -> None:
    """RESUME continues a run on the text it trained on, found by its content wherever it lies now."""
    recorded = read_run_config(run_dir).get("data") or {}
    differ = corpus_differences(recorded, data)
    if differ:
        raise ResultsError(f"the data here is not the corpus {run_dir} trained on ({'; '.join(differ[:2])}): resume "
                           "with the run's own data (DATASET, DATA_DIR, TRAIN_PATH: the same text, at any path), or "
                           "start a new run")


def _new_run_dir(results_dir: str, run_name: str | None) -> Path:
    root = Path(results_dir)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ResultsError(f"cannot create RESULTS_DIR {root}: {e.strerror}; choose a writable RESULTS_DIR") from None
    if run_name:
        path = root / run_name
        try:
            path.mkdir()
        except FileExistsError:
            raise ResultsError(f"{path} already exists and results are never overwritten; choose another RUN_NAME, "
                               f"or continue it with RESUME={path}") from None
        except OSError as e:
            raise ResultsError(f"cannot create {path}: {e.strerror}; choose a writable RESULTS_DIR") from None
        return path
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    for n in range(1000):
        path = root / (stamp if n == 0 else f"{stamp}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
        except OSError as e:  # e.g. RESULTS_DIR is itself a read-only mount: it exists, nothing can go in it
            raise ResultsError(f"cannot create a run folder in RESULTS_DIR {root}: {e.strerror}; choose a "
                               "writable RESULTS_DIR") from None
    raise ResultsError(f"could not create a new run folder under {root}")


@dataclass
class Claim:
    """A run folder this process may write: locked for the life of the run (the OS releases the
    lock if the process dies), and whether it was created now (and may be removed if nothing ran)."""

    path: Path
    created: bool
    lock_fd: int | None = None

    def release(self) -> None:
        if self.lock_fd is not None:
            os.close(self.lock_fd)  # closing the descriptor drops the flock
            self.lock_fd = None

    def discard_if_unused(self) -> bool:
        """Remove a folder created by this run in which no model reached a checkpoint (so RESUME=latest
        never picks an empty run); True if it was removed."""
        if not self.created or (self.path / "summary.json").exists() or any(self.path.glob("checkpoints/*.pt")):
            return False
        self.release()
        shutil.rmtree(self.path, ignore_errors=True)
        return True


def _lock(path: Path) -> int:
    try:
        return lock_folder(path)
    except Busy as e:
        raise ResultsError(f"{path} is in use by another run ({e.holder}); wait for it to finish, or start a new "
                           "run instead of resuming this one") from None
    except StorageError as e:
        raise ResultsError(f"cannot lock {path} for this run ({e}); is the folder writable?") from None


def claim_run_folder(config: dict, resume_dir: Path | None) -> Claim:
    """The folder this run writes, locked: ``resume_dir``, or a new one under RESULTS_DIR.

    Temporaries an interrupted write left there are removed (no other run can be writing now).
    """
    created = resume_dir is None
    path = _new_run_dir(config["RESULTS_DIR"], config["RUN_NAME"]) if created else Path(resume_dir)
    claim = Claim(path, created, _lock(path))
    for folder in (path, path / "checkpoints"):
        removed = remove_stale_temporaries(folder) if folder.is_dir() else []
        if removed:
            warn(f"removed {len(removed)} unfinished temporary file(s) an interrupted write left in {folder}")
    return claim


def resume_outlook(run_dir: Path | None, config: dict) -> str:
    """What ``RESUME`` would do with this run folder, in one sentence (said when a run is stopped)."""
    if run_dir is None or not (Path(run_dir) / "config.json").exists():
        return "Nothing was saved that RESUME could continue; start the run again."
    run_dir = Path(run_dir)
    summary = read_json(run_dir / "summary.json", "the run's summary") if (run_dir / "summary.json").exists() else []
    finished = {(r["model"], r.get("seed")) for r in summary}
    seeds = run_seeds(config)
    pending = [(m, s) for s in seeds for m in config["MODELS"] if (m, s) not in finished]
    if not pending:
        return "Every model is finished; nothing to resume."
    (model, seed), step = pending[0], None
    checkpoint = checkpoint_file(run_dir, model, seed, seeds)
    if checkpoint.exists():
        try:
            step = load_checkpoint(checkpoint, {}, tensors=False)["progress"]["step"]
        except (CheckpointError, KeyError, TypeError):
            step = None
    where = f"from its checkpoint at step {step}" if step is not None else "from step 0 (it has no checkpoint)"
    names = [m if len(seeds) == 1 else f"{m} (seed {s})" for m, s in sorted(finished, key=str)]
    done = f" ({', '.join(names)} finished, kept)" if finished else ""
    which = model if len(seeds) == 1 else f"{model} (seed {seed})"
    return f"python TinyStories.py RESUME={run_dir} continues {which} {where}{done}."
