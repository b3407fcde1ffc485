"""``Run``: the results folder of one run, written as the run goes.

    results/<run>/config.json, tokenizer.json     at the start (the tokenizer: the folder alone can sample)
    results/<run>/metrics.jsonl, train_log.jsonl  appended per evaluation / loss read, and sent to the trackers
    results/<run>/summary.json, samples.txt       rewritten whole when a model finishes
    results/<run>/checkpoints/                    <model>.pt (the first seed), <model>-seed<N>.pt (further SEEDS)
    results/<run>/tb/, wandb/, *.png              TensorBoard / W&B files, plots

Only the main process writes; every JSON file is replaced atomically.
"""

from __future__ import annotations

import datetime
import json
import platform
from pathlib import Path

import torch

from reservoir.data.tokenizers import tokenizer_hash
from reservoir.models.registry import PLUGINS
from reservoir.platform import device as dev
from reservoir.platform.files import append_line, atomic_write_text
from reservoir.platform.machine import instruction_set, processor
from reservoir.platform.messages import warn
from reservoir.run.checkpoint import (
    checkpoint_file,
)
from reservoir.run.folders import Claim, claim_run_folder
from reservoir.run.records import (
    INTEGRITY_KEY,
    SUMMARY_FIELDS,
    ResultsError,
    _integrity,
    finite_or_none,
    read_json,
    read_metrics,
    read_run_config,
    run_seeds,
    write_json_atomic,
)
from reservoir.run.tracking import Trackers
from reservoir.run.trained import load_tokenizer


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
                "device": {"kind": info.kind, "name": info.name, "processor": processor(), "isa": instruction_set(),
                           "precision": info.precision,
                           "world_size": info.world_size, "spmd_devices": info.spmd_devices,
                           "replicas": info.replicas, "per_device_batch": per_device, "global_batch": global_batch,
                           "tokens_per_step": global_batch and global_batch * effective["SEQ_LEN"]},
                "data": data, "started": datetime.datetime.now().isoformat(timespec="seconds")}
            if effective.get("PLUGINS"):  # the code of its own families, known again by hash (load_trained)
                content["plugins"] = {p: PLUGINS[p] for p in effective["PLUGINS"]}
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
