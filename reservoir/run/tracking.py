"""Experiment trackers: where a run's numbers go besides its own files.

    trackers = Trackers.open(config, run_dir, info)      # LOGGERS: 'csv' (always), 'tensorboard', 'wandb'
    trackers.log(model, seed, step, {"train/loss": 2.1, ...})
    trackers.finish_model(model, seed, summary_record)
    trackers.close()

``csv`` is the run folder's own metrics.jsonl / train_log.jsonl (run/writer.py), always
written. TensorBoard gets one folder per model and seed under ``<run>/tb/``, so its
charts overlay the models; W&B gets one run per model and seed, grouped by the run
folder's name. Only the main process tracks. Values arrive as Python numbers that the
training loop has already read, so tracking adds no device sync.
"""

from __future__ import annotations

import os
from pathlib import Path

from reservoir.platform.messages import OneLineError

_OFFLINE_WANDB_MODES = ("offline", "disabled", "dryrun")


class TrackingError(OneLineError, RuntimeError):
    """A tracker that cannot start (missing package, no login): reported as one line at start."""


def check_available(loggers: list[str]) -> None:
    """Fail at start, in one line, if a chosen tracker cannot work (not mid-run)."""
    if "tensorboard" in loggers:
        try:
            import tensorboard  # noqa: F401  - torch.utils.tensorboard needs the package
        except ImportError:
            raise TrackingError("LOGGERS asks for 'tensorboard' but the tensorboard package is missing: "
                                "pip install tensorboard, or drop it from LOGGERS") from None
    if "wandb" in loggers:
        try:
            import wandb
        except ImportError:
            raise TrackingError("LOGGERS asks for 'wandb' but the wandb package is missing: pip install wandb, "
                                "or drop it from LOGGERS") from None
        if os.environ.get("WANDB_MODE", "").lower() not in _OFFLINE_WANDB_MODES and not _wandb_api_key(wandb):
            raise TrackingError("LOGGERS asks for 'wandb' but W&B has no login: run `wandb login` (or set "
                                "WANDB_API_KEY), or log locally with WANDB_MODE=offline")


def _wandb_api_key(wandb) -> str | None:
    if os.environ.get("WANDB_API_KEY"):
        return os.environ["WANDB_API_KEY"]
    try:  # env, then the netrc entry `wandb login` writes
        return wandb.Api(api_key=None, timeout=5).api_key
    except Exception:  # noqa: BLE001 - any failure to find a key means: not logged in
        return None


def hyper_parameters(config: dict, model: str, seed: int) -> dict:
    """The run's settings as flat scalars: top-level keys, and the model's own block as BLOCK.key."""
    flat = {"model": model, "seed": seed}
    for key, value in config.items():
        if isinstance(value, dict):
            if key.lower() == model:
                flat.update({f"{key}.{k}": _scalar(v) for k, v in value.items()})
        else:
            flat[key] = _scalar(value)
    return flat


def _scalar(value):
    return value if isinstance(value, (bool, int, float, str)) else repr(value)


class Trackers:
    """The chosen trackers of one run; every method is a no-op for trackers not chosen."""

    def __init__(self, loggers: list[str], run_dir: Path, config: dict, project: str):
        self.loggers, self.run_dir, self.config, self.project = list(loggers), Path(run_dir), config, project
        self._tb: dict[tuple[str, int], object] = {}
        self._wandb: dict[tuple[str, int], object] = {}

    @classmethod
    def open(cls, config: dict, run_dir: Path, is_main_process: bool) -> Trackers:
        """The trackers LOGGERS names (none on other processes); ``check_available`` first, at start."""
        loggers = [name for name in config["LOGGERS"] if name != "csv"] if is_main_process else []
        return cls(loggers, run_dir, config, config["WANDB_PROJECT"])

    def _tensorboard(self, model: str, seed: int):
        key = (model, seed)
        if key not in self._tb:
            from torch.utils.tensorboard import SummaryWriter

            self._tb[key] = SummaryWriter(str(self.run_dir / "tb" / model / f"seed{seed}"))
        return self._tb[key]

    def _wandb_run(self, model: str, seed: int):
        key = (model, seed)
        if key not in self._wandb:
            import wandb

            self._wandb[key] = wandb.init(
                project=self.project, group=self.run_dir.name, name=f"{self.run_dir.name}/{model}/seed{seed}",
                job_type="train", tags=[model, f"seed{seed}"], dir=str(self.run_dir),
                config=hyper_parameters(self.config, model, seed), reinit="create_new",
                settings=wandb.Settings(quiet=True))
            self._wandb[key].define_metric("step")
            self._wandb[key].define_metric("*", step_metric="step")  # charts against the training step
        return self._wandb[key]

    def log(self, model: str, seed: int, step: int, values: dict) -> None:
        """Scalars of one model at one training step (``None`` values are left out)."""
        values = {k: float(v) for k, v in values.items() if v is not None}
        if "tensorboard" in self.loggers:
            writer = self._tensorboard(model, seed)
            for tag, value in values.items():
                writer.add_scalar(tag, value, global_step=step)
        if "wandb" in self.loggers:
            self._wandb_run(model, seed).log({**values, "step": step})

    def finish_model(self, model: str, seed: int, record: dict) -> None:
        """The model's final numbers next to its settings, then its writers are closed."""
        finals = {f"final/{k}": float(record[k]) for k in ("val_bpc", "val_loss", "train_seconds",
                                                            "tokens_per_second", "params_trainable")
                  if isinstance(record.get(k), (int, float))}
        if "tensorboard" in self.loggers:
            writer = self._tensorboard(model, seed)
            writer.add_hparams(hyper_parameters(self.config, model, seed), finals, run_name=".")
            writer.close()
            del self._tb[(model, seed)]
        if "wandb" in self.loggers:
            wandb_run = self._wandb_run(model, seed)
            wandb_run.summary.update(finals)
            wandb_run.finish()
            del self._wandb[(model, seed)]

    def close(self) -> None:
        for writer in self._tb.values():
            writer.close()
        for wandb_run in self._wandb.values():
            wandb_run.finish()
        self._tb.clear()
        self._wandb.clear()
