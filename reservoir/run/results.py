"""The results contract: what a run writes and what plots and comparisons read.

    results/<run>/config.json      effective config, versions, device, data, world size; an integrity hash
    results/<run>/metrics.jsonl    one line per evaluation (model, step, tokens, seconds, losses, val_bpc)
    results/<run>/train_log.jsonl  one line per training-loss read (model, step, tokens, seconds, train_loss, lr)
    results/<run>/tokenizer.json   the run's tokenizer, so the folder alone is enough to sample (sample.py)
    results/<run>/tb/, wandb/      TensorBoard / W&B files when LOGGERS asks for them
    results/<run>/summary.json     one record per finished model and seed
    results/<run>/samples.txt      generated stories, per model and seed
    results/<run>/checkpoints/     <model>.pt (the first seed), <model>-seed<N>.pt (further SEEDS)
    results/<run>/*.png            plots

A new run always gets a new folder; only ``RESUME`` writes into an old one. Reading one back is
here too: ``read_run_config`` (checked against its hash), ``load_tokenizer``, and ``load_trained``
(a model restored from its checkpoint, for sample.py and compare.py).
Only the main process writes; every JSON file is replaced atomically.
"""

from __future__ import annotations

import datetime
import fcntl
import hashlib
import json
import math
import os
import platform
import shutil
import statistics
from dataclasses import dataclass
from pathlib import Path

import torch

from reservoir.data.tokenizers import TOKENIZERS, tokenizer_hash
from reservoir.models import build_model
from reservoir.platform import device as dev
from reservoir.platform.files import append_line, atomic_write_text, remove_stale_temporaries
from reservoir.platform.messages import OneLineError, warn
from reservoir.run.checkpoint import CheckpointError, checkpoint_identity, load_checkpoint, restore_model
from reservoir.run.tracking import Trackers

SUMMARY_FIELDS = ("model", "trained", "params_total", "params_trainable", "train_seconds", "train_tokens",
                  "tokens_per_second", "val_loss", "val_ppl", "val_bpc", "device", "precision", "data_source",
                  "tokenizer", "vocab_size", "seed")


class ResultsError(OneLineError, ValueError):
    """A results folder that cannot be used as asked: reported as one line."""


def run_seeds(config: dict) -> list[int]:
    """The seeds every model is trained with: SEEDS, or just SEED."""
    return list(config.get("SEEDS") or [config["SEED"]])


def checkpoint_file(run_dir: Path, model: str, seed: int | None, seeds: list[int] | None) -> Path:
    """Where ``model``'s checkpoint for ``seed`` lives: ``<model>.pt`` for the run's first seed (so a
    one-seed run and sample.py's default read the same file), ``<model>-seed<N>.pt`` for the others."""
    name = model if seed is None or not seeds or seed == seeds[0] else f"{model}-seed{seed}"
    return Path(run_dir) / "checkpoints" / f"{name}.pt"


def finite_or_none(obj):
    """``obj`` with every NaN or infinity replaced by None: result files stay valid JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def write_json_atomic(path: Path, obj) -> None:
    atomic_write_text(path, json.dumps(finite_or_none(obj), indent=2, ensure_ascii=False, allow_nan=False) + "\n")


def read_json(path: Path, what: str):
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{path} is missing: is {Path(path).parent} a ReservoirNLP run folder?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path} ({what}) is not valid JSON ({e}); the run folder is damaged") from None


INTEGRITY_KEY = "integrity"  # config.json's hash of its own content, written with it
WHERE_KEYS = ("RESULTS_DIR", "CACHE_DIR")  # where a run is found and caches kept: RESUME may name others


def _integrity(content: dict) -> str:
    body = {k: v for k, v in content.items() if k != INTEGRITY_KEY}
    text = json.dumps(finite_or_none(body), sort_keys=True, ensure_ascii=False, allow_nan=False,
                      separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


class RecordedConfig(dict):
    """A run's config.json as read: a key it lacks is a one-line ResultsError naming the file and the
    key (``effective_config.MODELS``), never a KeyError traceback in whatever reads it."""

    def __init__(self, content: dict, where: Path, trail: str = ""):
        super().__init__(content)
        self.where, self.trail = where, trail

    def __getitem__(self, key):
        try:
            value = super().__getitem__(key)
        except KeyError:
            raise ResultsError(f"{self.where} is damaged: it has no {self.trail}{key}; start a new run (or "
                               "restore the run folder from a copy)") from None
        return RecordedConfig(value, self.where, f"{self.trail}{key}.") if isinstance(value, dict) else value


_UNCHECKED_SAID: set[Path] = set()


def read_summary(run_dir: Path, what: str = "the run's summary") -> list[dict]:
    """A run's summary.json for a study or report to build on: each record must still match the integrity
    hash the run wrote with it, so an edited score is refused in one line, not reported. (The hash guards
    against accidents and stray edits, not against someone who recomputes it.) Records written before
    summaries carried a hash are used with one warning."""
    path = Path(run_dir) / "summary.json"
    records = read_json(path, what)
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ResultsError(f"{path} is damaged: it is not a list of records; re-run that point (delete the folder)")
    for record in records:
        _verify(record, path, "summaries", f"{path}: the record of {record.get('model')} (seed {record.get('seed')}) "
                "was edited after its run wrote it (its integrity hash no longer matches); undo the edit, or delete "
                "that run folder and run the same command again to redo it")
    return records


def _verify(content: dict, path: Path, older: str, edited: str) -> None:
    """Refuse ``content`` whose integrity hash no longer matches it (``edited``: the one-line error); content
    written before ``older`` carried a hash is used, with one warning per file."""
    recorded = content.get(INTEGRITY_KEY)
    if recorded is None:
        if path not in _UNCHECKED_SAID:
            _UNCHECKED_SAID.add(path)
            warn(f"{path} was written before {older} recorded an integrity hash: used without that check")
    elif recorded != _integrity(content):
        raise ResultsError(edited)


def read_run_config(run_dir: Path) -> RecordedConfig:
    """A run's config.json, trusted only as the run wrote it: its integrity hash must match (an edited
    or damaged file is refused in one line), and a key it lacks is a one-line error when read."""
    path = Path(run_dir) / "config.json"
    content = read_json(path, "the run's config")
    if not isinstance(content, dict):
        raise ResultsError(f"{path} is damaged: it is not a JSON object; start a new run")
    if INTEGRITY_KEY not in content and (content.get("versions") or {}).get("reservoir_nlp"):
        raise ResultsError(f"{path} has lost its integrity hash, though the version that wrote it "
                           f"({content['versions']['reservoir_nlp']}) writes one: a run folder is trusted only as "
                           "the run wrote it; restore the folder from a copy, or start a new run")
    _verify(content, path, "runs", f"{path} was edited or damaged after the run wrote it (its integrity hash no "
            "longer matches): a run folder is trusted only as the run wrote it; undo the edit, or start a new run "
            "with the settings you want")
    return RecordedConfig(content, path)


def load_tokenizer(run_dir: Path, config_json: dict):
    """The run's own tokenizer.json, checked against the hash its config.json recorded."""
    path = Path(run_dir) / "tokenizer.json"
    if not path.is_file():
        raise ResultsError(f"{path} is missing: runs write their tokenizer since sample.py exists; sample from a "
                           "newer run, or copy the tokenizer from data_cache/tokenizers/ into the run folder")
    kind = config_json["data"]["tokenizer"]
    if kind not in TOKENIZERS:
        raise ResultsError(f"{run_dir / 'config.json'} names a tokenizer {kind!r} this version does not know")
    try:
        tokenizer = TOKENIZERS[kind].from_json(path.read_text(encoding="utf-8"))
    except Exception as e:  # noqa: BLE001 - any unreadable tokenizer file gets the same one-line answer
        raise ResultsError(f"{path} is not a readable {kind} tokenizer ({type(e).__name__}); the run folder is "
                           "damaged") from None
    if tokenizer_hash(tokenizer) != config_json["data"]["tokenizer_hash"]:
        raise ResultsError(f"{path} is not the tokenizer this run trained with (hash differs); the run folder "
                           "is damaged")
    return tokenizer


# --------------------------------------------------------------------- a trained model from its folder


@dataclass
class TrainedRun:
    path: Path
    model: str
    config: dict  # the effective config the run trained with
    summaries: list[dict]
    step: int  # the training step of the loaded checkpoint
    finished: bool
    seed: int  # the training seed of the loaded model (one of the run's SEEDS)


def load_trained(run_dir: str | Path, model_name: str | None = None, train_seed: int | None = None):
    """(model on the CPU, tokenizer, TrainedRun) for ``model_name`` trained with ``train_seed`` in
    ``run_dir``; without a name, the run's best finished model (of that seed, if given); without a
    seed, the run's first seed (or the best model's)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ResultsError(f"{run_dir} is not a folder; give a run folder such as results/<run>")
    config_json = read_run_config(run_dir)
    config = config_json["effective_config"]
    summary_path = run_dir / "summary.json"
    summaries = read_json(summary_path, "the run's summary") if summary_path.exists() else []
    seeds = run_seeds(config)
    if train_seed is not None and train_seed not in seeds:
        raise ResultsError(f"TRAIN_SEED={train_seed} is not a seed of this run (its seeds: "
                           f"{', '.join(map(str, seeds))})")
    if model_name is None:
        if not summaries:
            raise ResultsError(f"{run_dir} has no finished model yet; name one with MODEL=<name> "
                               f"(models of this run: {', '.join(config['MODELS'])})")
        scored = [r for r in summaries if r.get("val_bpc") is not None  # diverged models have no score
                  and train_seed in (None, r.get("seed"))]
        if not scored:
            raise ResultsError(f"{run_dir} has no model with a score; name one with MODEL=<name>")
        best = min(scored, key=lambda r: r["val_bpc"])
        model_name, train_seed = best["model"], best.get("seed")
    if model_name not in config["MODELS"]:
        raise ResultsError(f"MODEL={model_name!r} is not a model of this run (its models: "
                           f"{', '.join(config['MODELS'])})")
    train_seed = seeds[0] if train_seed is None else train_seed
    checkpoint = checkpoint_file(run_dir, model_name, train_seed, seeds)
    if not checkpoint.is_file():
        raise CheckpointError(f"{checkpoint} does not exist: {model_name} has not reached a checkpoint in this run")
    tokenizer = load_tokenizer(run_dir, config_json)
    payload = load_checkpoint(checkpoint, checkpoint_identity(model_name, {**config, "SEED": train_seed}, tokenizer))
    model = build_model(model_name, tokenizer.vocab_size, {**config, "SEED": train_seed})
    restore_model(model, payload, checkpoint)
    run = TrainedRun(run_dir, model_name, config, summaries, payload["progress"]["step"], bool(payload["finished"]),
                     train_seed)
    return model, tokenizer, run


def read_metrics(run_dir: Path, file: str = "metrics.jsonl", repair: bool = False) -> list[dict]:
    """The evaluations (or, with ``file="train_log.jsonl"``, the training-loss reads) of a run.

    A last line without its newline is a write that was cut off (a full disk, a kill): it is
    left out, and with ``repair`` cut off the file, saying so. Any other bad row is an error.
    """
    path = Path(run_dir) / file
    if not path.exists():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ResultsError(f"{path} is not UTF-8 text; the run folder is damaged") from None
    lines = text.split("\n")
    torn = lines.pop()  # '' when the file ends with a newline, else a cut-off last write
    if torn.strip():
        if repair:
            with open(path, "r+b") as f:
                f.truncate(len(text.encode("utf-8")) - len(torn.encode("utf-8")))
            warn(f"{path}: its last line was cut off (an interrupted write) and has been removed")
    rows = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ResultsError(f"{path} line {n} is not valid JSON; the run folder is damaged") from None
        if not (isinstance(row, dict) and isinstance(row.get("model"), str) and isinstance(row.get("step"), int)
                and not isinstance(row.get("step"), bool)):
            raise ResultsError(f"{path} line {n} is not a metrics row (an object with a model name and an "
                               "integer step); the run folder is damaged")
        rows.append(row)
    return rows


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
    the run folder and caches are (RESULTS_DIR, CACHE_DIR) may differ: they are taken from the command.
    """
    def value(config: dict, name: str):
        key, _, sub = name.partition(".")
        block = config.get(key)
        return (block.get(sub) if isinstance(block, dict) else None) if sub else block

    changed = [n for n in named if n != "RESUME" and n not in WHERE_KEYS and value(given, n) != value(saved, n)]
    if changed:
        raise ResultsError(f"RESUME continues a run with its own settings; {', '.join(changed)} differ from the "
                           "saved run: drop them, or start a new run")
    where = {k: given[k] for k in WHERE_KEYS if k in named}
    return {**saved, **where, "RESUME": given["RESUME"]}


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
    lock_file = path / ".lock"
    try:
        fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o666)
    except OSError as e:
        raise ResultsError(f"cannot lock {path} for this run ({e.strerror}); is the folder writable?") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.read(fd, 64).decode(errors="replace").strip() or "another process"
        os.close(fd)
        raise ResultsError(f"{path} is in use by another run (pid {holder}); wait for it to finish, or start a new "
                           "run instead of resuming this one") from None
    os.ftruncate(fd, 0)
    os.write(fd, str(os.getpid()).encode())
    return fd


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
            step = load_checkpoint(checkpoint, {})["progress"]["step"]
        except (CheckpointError, KeyError, TypeError):
            step = None
    where = f"from its checkpoint at step {step}" if step is not None else "from step 0 (it has no checkpoint)"
    names = [m if len(seeds) == 1 else f"{m} (seed {s})" for m, s in sorted(finished, key=str)]
    done = f" ({', '.join(names)} finished, kept)" if finished else ""
    which = model if len(seeds) == 1 else f"{model} (seed {seed})"
    return f"python TinyStories.py RESUME={run_dir} continues {which} {where}{done}."


def versions() -> dict:
    from reservoir import __version__

    out = {"python": platform.python_version(), "torch": torch.__version__, "torch_xla": None,
           "reservoir_nlp": __version__}
    try:
        import torch_xla

        out["torch_xla"] = torch_xla.__version__
    except ImportError:
        pass
    return out


class Run:
    """One results folder. Every method is safe to call on every process; only rank 0 writes."""

    def __init__(self, path: Path, info: dev.DeviceInfo, trackers: Trackers | None = None,
                 claim: Claim | None = None):
        self.path, self.info = Path(path), info
        self.writes = info.is_main_process
        self.trackers = trackers
        self.claim = claim
        self.resumed = False  # set by open() for RESUME: fits then say where each model starts
        self.seeds: list[int] | None = None  # set by open(): run_seeds(config); None: one seed
        self.on_evaluation = None  # called with every evaluation row (a sweep's pruner listens here)

    @classmethod
    def open(cls, config: dict, info: dev.DeviceInfo, resume_dir: Path | None = None,
             claimed: Path | None = None) -> Run:
        """The folder to write. ``claimed``: one the parent process already claimed (torch_xla's
        launcher decides it before starting the processes); else rank 0 claims ``resume_dir`` or a
        new folder and shares its path with the other torchrun processes."""
        claim = None
        if claimed is not None:
            path = Path(claimed)
        else:
            if info.world_size > 1 and info.is_xla:
                raise ResultsError("several XLA processes need their run folder decided before the launch "
                                   "(TPU_PARALLEL='launch' does this); do not call Run.open without it")
            claim = claim_run_folder(config, resume_dir) if info.is_main_process else None
            path = dev.broadcast_object(info, str(claim.path) if claim else None)
        path = Path(path)
        if info.is_main_process:
            for file in ("metrics.jsonl", "train_log.jsonl"):  # a cut-off last row is repaired before appending
                read_metrics(path, file, repair=True)
        run = cls(path, info, Trackers.open(config, path, info.is_main_process), claim)
        run.resumed = resume_dir is not None
        run.seeds = run_seeds(config)
        return run

    @property
    def checkpoint_dir(self) -> Path:
        return self.path / "checkpoints"

    def checkpoint_path(self, model: str, seed: int | None = None) -> Path:
        return checkpoint_file(self.path, model, seed, self.seeds)

    def write_config(self, requested: dict, effective: dict, info: dev.DeviceInfo, data: dict) -> None:
        """config.json, with the hash of its content that RESUME, sample.py and compare.py check."""
        per_device = effective["BATCH_SIZE"]  # None: each model's own (its summary records it)
        global_batch = None if per_device is None else per_device * effective["GRAD_ACCUM"] * info.replicas
        if self.writes:
            content = {
                "requested_config": requested, "effective_config": effective, "versions": versions(),
                "device": {"kind": info.kind, "name": info.name, "precision": info.precision,
                           "world_size": info.world_size, "spmd_devices": info.spmd_devices,
                           "replicas": info.replicas, "per_device_batch": per_device, "global_batch": global_batch,
                           "tokens_per_step": global_batch and global_batch * effective["SEQ_LEN"]},
                "data": data, "started": datetime.datetime.now().isoformat(timespec="seconds")}
            write_json_atomic(self.path / "config.json", {**content, INTEGRITY_KEY: _integrity(content)})

    def write_tokenizer(self, tokenizer) -> None:
        """tokenizer.json, so the folder alone is enough to sample; on RESUME, one that is missing or
        damaged is written again from the run's data (whose tokenizer must be the one the run trained with)."""
        if not self.writes:
            return
        path = self.path / "tokenizer.json"
        if self.resumed:
            saved = read_run_config(self.path)  # read once: the hash to match, and the tokenizer's kind
            recorded = saved["data"]["tokenizer_hash"]
            if tokenizer_hash(tokenizer) != recorded:
                raise ResultsError(f"the data here gives another tokenizer than {self.path} trained with (hash "
                                   f"{tokenizer_hash(tokenizer)}, the run's {recorded}); resume with the run's own "
                                   "data (DATASET, DATA_DIR) from the folder it was started in")
            try:
                load_tokenizer(self.path, saved)
                return
            except ResultsError:
                if path.exists():
                    warn(f"{path} was damaged (not the run's tokenizer); written again from the run's data")
        elif path.exists():
            return
        atomic_write_text(path, tokenizer.to_json())

    # --- metrics.jsonl (per evaluation) and train_log.jsonl (per loss read): appended, and sent to the trackers
    def log_metrics(self, record: dict) -> None:
        self._append("metrics.jsonl", record, {"val/loss": record.get("val_loss"), "val/bpc": record.get("val_bpc"),
                                               "val/ppl": record.get("val_ppl")})
        if self.on_evaluation is not None:
            self.on_evaluation(record)

    def log_train(self, record: dict) -> None:
        self._append("train_log.jsonl", record, {"train/loss": record.get("train_loss"), "train/lr": record.get("lr"),
                                                 "train/tokens": record.get("tokens"),
                                                 "train/tokens_per_second": record.get("tokens_per_second")})

    def _append(self, file: str, record: dict, scalars: dict) -> None:
        if not self.writes:
            return
        append_line(self.path / file, json.dumps(finite_or_none(record), allow_nan=False))
        if self.trackers is not None:
            self.trackers.log(record["model"], record.get("seed", 0), record["step"], scalars)

    def forget_metrics(self, model: str, after_step: int, seed: int) -> None:
        """Drop ``model``'s evaluations and loss reads for ``seed`` past ``after_step`` (redone when it resumes)."""
        if not self.writes:
            return
        for file in ("metrics.jsonl", "train_log.jsonl"):
            rows = read_metrics(self.path, file)
            kept = [r for r in rows if r.get("model") != model or r.get("seed", seed) != seed
                    or r.get("step", 0) <= after_step]
            if len(kept) != len(rows):
                atomic_write_text(self.path / file, "".join(json.dumps(r) + "\n" for r in kept))

    def has_final(self, model: str, seed: int) -> bool:
        """Whether metrics.jsonl holds ``model``'s final evaluation for ``seed``."""
        return (self.path / "metrics.jsonl").exists() and any(
            r.get("final") and r.get("model") == model and r.get("seed", seed) == seed for r in read_metrics(self.path))

    # --- summary.json and samples.txt: rewritten whole when a model finishes
    def summaries(self) -> list[dict]:
        path = self.path / "summary.json"
        return read_json(path, "the run's summary") if path.exists() else []

    def finished_models(self) -> set[tuple[str, int]]:
        """(model, seed) pairs with a summary: finished, or diverged (resuming would only diverge again)."""
        return {(r["model"], r.get("seed")) for r in self.summaries()}

    def record_summary(self, record: dict, samples: list[tuple[str, str]]) -> None:
        missing = [f for f in SUMMARY_FIELDS if f not in record]
        if missing:
            raise ValueError(f"summary record lacks {missing}")
        if not self.writes:
            return
        records = [r for r in self.summaries() if (r["model"], r.get("seed")) != (record["model"], record["seed"])]
        entry = {**record, "samples": [{"prompt": p, "text": t} for p, t in samples]}
        records.append({**entry, INTEGRITY_KEY: _integrity(entry)})
        write_json_atomic(self.path / "summary.json", records)
        self._write_samples(records)
        if self.trackers is not None:
            self.trackers.finish_model(record["model"], record["seed"], record)

    def close(self) -> None:
        if self.trackers is not None:
            self.trackers.close()
        if self.claim is not None:
            self.claim.release()

    def _write_samples(self, records: list[dict]) -> None:
        blocks = []
        several = len({r.get("seed") for r in records}) > 1
        for r in records:
            score = f"val {r['val_bpc']:.3f} bits/char" if r.get("val_bpc") is not None else r.get("status", "")
            seed = f" (seed {r.get('seed')})" if several else ""
            blocks.append(f"=== {r['model']}{seed}  ({score})")
            blocks += [f"--- prompt: {s['prompt']!r}\n{s['text']}\n" for s in r["samples"]]
        atomic_write_text(self.path / "samples.txt", "\n".join(blocks) + "\n")


def seed_groups(records: list[dict]) -> list[tuple[str, list[dict]]]:
    """Records grouped by model, in the order models first appear (one record per seed)."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["model"], []).append(r)
    return list(groups.items())


def aggregate(group: list[dict]) -> dict:
    """One model's records over its seeds: mean of every number, ``val_bpc_sd`` across seeds (two or
    more scored seeds), the interval of a single seed, and whether any seed ran oversubscribed."""
    scored = [r for r in group if r.get("val_bpc") is not None]
    first = group[0]
    out = {"model": first["model"], "trained": first.get("trained"), "seeds": len(group), "scored_seeds": len(scored),
           "params_total": first["params_total"], "params_trainable": first["params_trainable"],
           "oversubscribed": any((r.get("machine_load") or {}).get("oversubscribed") for r in group),
           "compile_over_budget": any(r.get("compile_over_budget") for r in group),
           "bound_by": "/".join(sorted({r["bound_by"] for r in group if r.get("bound_by")})) or None}
    for key in ("train_seconds", "train_tokens", "train_flops", "epochs", "compile_seconds"):
        values = [r[key] for r in group if r.get(key) is not None]
        out[key] = statistics.fmean(values) if values else None
    for key in ("val_bpc", "val_ppl", "tokens_per_second"):
        values = [r[key] for r in scored]
        out[key] = statistics.fmean(values) if values else None
    loads = [r["machine_load"] for r in group if r.get("machine_load")]
    out["runnable_mean"] = statistics.fmean([x["runnable_mean"] for x in loads]) if loads else None
    out["cores"] = loads[0]["cores"] if loads else None
    if len(scored) > 1:
        out["val_bpc_sd"] = statistics.stdev(r["val_bpc"] for r in scored)
    out["val_bpc_ci95"] = scored[0].get("val_bpc_ci95") if len(scored) == 1 else None
    if not scored:
        out["diverged_at_step"], out["reason"] = first.get("diverged_at_step"), first.get("reason")
    out["diverged"] = [(r.get("seed"), r.get("diverged_at_step"), r.get("reason")) for r in group
                       if r.get("status") == "diverged"]
    return out


def _ppl(value: float) -> str:
    """Perplexity for a table: two decimals, or a power of ten where it would run to many digits."""
    return f"{value:.2f}" if value < 1e5 else f"{value:.1e}"


def format_table(records: list[dict]) -> str:
    """The final comparison, best bits/char first, one line per model (the mean over its seeds).

    ± is the standard deviation across seeds ('sd') where two or more seeds scored, or the 95% bootstrap
    interval of a single seed's final evaluation ('ci'); the seeds column says how many seeds scored of
    how many ran, and a line names every diverged seed. On XLA a column shows
    each model's warm-up compilation (not charged to the budget). '*' marks a warm-up longer than
    the whole budget, '!' a model trained while the machine was oversubscribed. 'bound by' names the
    limit that ended each fit; 'trained' what training changes (LanguageModel.trained)."""
    rows = [aggregate(group) for _, group in seed_groups(records)]
    compile_column = any(r.get("device_kind") == "tpu" or r.get("compile_over_budget") for r in records)
    seeds_column = any(r["seeds"] > 1 for r in rows)
    width = max([18, *(len(r["model"]) + 2 for r in rows)])  # names line up whatever their length
    head = (f"{'model':<{width}}" + (f"{'seeds':>6}" if seeds_column else "") + f"{'val bits/char ± 95%':>21}"
            f"{'val ppl':>9}{'params (trained)':>22}{'trained':>20}{'train s':>9}{'tokens':>12}{'tok/s':>10}"
            f"{'FLOPs':>10}"
            f"{'epochs':>8}{'load':>9}{'bound by':>10}" + (f"{'compile s':>11}" if compile_column else ""))
    if seeds_column:
        head = head.replace("val bits/char ± 95%", "bits/char ± sd|ci")
    lines = [head, "-" * len(head)]
    for r in sorted(rows, key=lambda r: (r["val_bpc"] is None, r["val_bpc"] or 0.0)):
        params = f"{r['params_total']:,} ({r['params_trainable']:,})"
        seeds = f"{r['scored_seeds']}/{r['seeds']}".rjust(6) if seeds_column else ""
        if r["val_bpc"] is None:  # diverged: no number to rank
            lines.append(f"{r['model']:<{width}}{seeds}{'DIVERGED':>21}{'':>9}{params:>22}{r['trained'] or '':>20}"
                         f"{r['train_seconds']:>9.1f}"
                         f"{r['train_tokens']:>12,.0f}{'':>10}  at step {r.get('diverged_at_step')}: {r.get('reason')}")
            continue
        spread = r.get("val_bpc_sd") if r.get("val_bpc_sd") is not None else r.get("val_bpc_ci95")
        kind = (" sd" if r.get("val_bpc_sd") is not None else " ci") if seeds_column else ""
        score = f"{r['val_bpc']:.3f}" + (f" ± {spread:.3f}{kind}" if spread is not None else "")
        flops = "" if r["train_flops"] is None else f"{r['train_flops']:.2e}"
        epochs = "" if r["epochs"] is None else f"{r['epochs']:.2f}"
        load = "" if r["runnable_mean"] is None else f"{r['runnable_mean']:.1f}/{r['cores']}"
        load += "!" if r["oversubscribed"] else ""
        line = (f"{r['model']:<{width}}{seeds}{score:>21}{_ppl(r['val_ppl']):>9}{params:>22}{r['trained'] or '':>20}"
                f"{r['train_seconds']:>9.1f}"
                f"{r['train_tokens']:>12,.0f}{r['tokens_per_second']:>10,.0f}{flops:>10}{epochs:>8}{load:>9}"
                f"{r['bound_by'] or '':>10}")
        if compile_column:
            seconds = r.get("compile_seconds")
            mark = "*" if r.get("compile_over_budget") else ""
            line += f"{'' if seconds is None else f'{seconds:.1f}{mark}':>11}"
        lines.append(line)
    for r in rows:
        if r["scored_seeds"] and r["diverged"]:
            lines.append(f"{r['model']}: " + "; ".join(f"seed {seed} diverged at step {step} ({reason})"
                                                      for seed, step, reason in r["diverged"])
                         + f"; its score is the mean of the {r['scored_seeds']} that finished")
    if seeds_column:
        lines.append("seeds: scored / trained; ± sd: standard deviation across the scored seeds; ± ci: the 95% "
                     "bootstrap interval of the one scored seed's final evaluation")
    if any(r["oversubscribed"] for r in rows):
        lines.append("! the machine was oversubscribed while this model trained (load: threads wanting a core / "
                     "cores): its tok/s and any time-budgeted score understate it; compare with FLOP_BUDGET")
    if any(r["bound_by"] for r in rows):
        lines.append("bound by: the budget that ended each fit (flops, seconds, steps, tokens), or data: a "
                     "closed-form fit's one pass over all its training data")
    if any(r.get("compile_over_budget") for r in rows):
        lines.append("* warm-up (compilation) took longer than the whole time budget; not charged to it")
    return "\n".join(lines)
