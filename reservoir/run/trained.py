"""A finished run opened again: its tokenizer (checked against the hash its config recorded) and a
model restored from its checkpoint, for sample.py and compare.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from reservoir.config import ConfigError, load_plugins
from reservoir.data.tokenizers import TOKENIZERS, tokenizer_hash
from reservoir.models import build_model
from reservoir.models.registry import changed_plugins, family_of
from reservoir.platform.messages import warn
from reservoir.run.checkpoint import (
    CheckpointError,
    checkpoint_file,
    checkpoint_identity,
    load_checkpoint,
    restore_model,
)
from reservoir.run.records import ResultsError, divergence, read_json, read_run_config, run_seeds


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


@dataclass
class TrainedRun:
    path: Path
    model: str
    config: dict  # the effective config the run trained with
    summaries: list[dict]
    step: int  # the training step of the loaded checkpoint
    finished: bool
    seed: int  # the training seed of the loaded model (one of the run's SEEDS)


def load_run_plugins(run_dir: Path, config_json: dict) -> None:
    """The plugins whose families a run trained, loaded as it named them; one line if a file is gone or has
    changed since the run recorded its hash."""
    try:
        load_plugins(config_json["effective_config"].get("PLUGINS"))
    except ConfigError as e:
        raise ResultsError(f"{run_dir} trained families from a plugin: {e}") from None
    for said in changed_plugins(config_json.get("plugins")):
        warn(f"{run_dir} was trained with plugin {said}: its models are rebuilt from today's code")


def load_trained(run_dir: str | Path, model_name: str | None = None, train_seed: int | None = None):
    """(model on the CPU, tokenizer, TrainedRun) for ``model_name`` trained with ``train_seed`` in
    ``run_dir``; without a name, the run's best finished model (of that seed, if given); without a
    seed, the run's first seed (or the best model's)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ResultsError(f"{run_dir} is not a folder; give a run folder such as results/<run>")
    config_json = read_run_config(run_dir)
    config = config_json["effective_config"]
    load_run_plugins(run_dir, config_json)
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
    if model_name not in config["MODELS"]:  # a family's name, as the run's table shows it (transformer++)
        model_name = next((m for m in config["MODELS"] if family_of(m, config.get(m.upper()) or {}) == model_name),
                          model_name)
    if model_name not in config["MODELS"]:
        raise ResultsError(f"MODEL={model_name!r} is not a model of this run (its models: "
                           f"{', '.join(config['MODELS'])})")
    train_seed = seeds[0] if train_seed is None else train_seed
    checkpoint = checkpoint_file(run_dir, model_name, train_seed, seeds)
    if not checkpoint.is_file():
        records = [r for r in summaries if r.get("model") == model_name and r.get("seed", train_seed) == train_seed]
        if records and records[-1].get("status") == "diverged":
            raise CheckpointError(f"{checkpoint} does not exist: {model_name} (seed {train_seed}) "
                                  f"{divergence(records[-1])} before its first checkpoint, so there is no model to "
                                  f"load; train it again "
                                  f"({records[-1].get('advice') or 'with a lower learning rate'})")
        if records:
            raise CheckpointError(f"{checkpoint} is not in this copy of {run_dir}: {model_name} (seed {train_seed}) "
                                  "finished there and its records are here, but checkpoints stay on the machine that "
                                  "trained it (they are never committed); run this there, or train the point again")
        raise CheckpointError(f"{checkpoint} does not exist: {model_name} has not reached a checkpoint in this run")
    tokenizer = load_tokenizer(run_dir, config_json)
    payload = load_checkpoint(checkpoint, checkpoint_identity(model_name, {**config, "SEED": train_seed}, tokenizer))
    model = build_model(model_name, tokenizer.vocab_size, {**config, "SEED": train_seed})
    restore_model(model, payload, checkpoint)
    run = TrainedRun(run_dir, model_name, config, summaries, payload["progress"]["step"], bool(payload["finished"]),
                     train_seed)
    return model, tokenizer, run
