"""Stories from a trained model: what the runner writes to samples.txt and what sample.py prints.

    model, tokenizer, run = load_trained(run_dir, "transformer")    # the run folder alone is enough
    stories = write_stories(model, tokenizer, prompts, settings, device)

The run folder holds its config (config.json), its tokenizer (tokenizer.json) and each
model's checkpoint (checkpoints/<model>.pt), so a folder copied to another machine
samples there without the original data or token cache.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .checkpoint import CheckpointError, load_checkpoint, restore_model
from .data import EOT, tokenizer_hash
from .models import build_model
from .results import ResultsError, checkpoint_file, load_tokenizer, read_json, read_run_config, run_seeds


@dataclass(frozen=True)
class SampleSettings:
    max_new_tokens: int
    temperature: float
    top_k: int | None
    seed: int
    num_samples: int = 1
    stop_at_end: bool = True  # one story per sample; False: write on through story ends (shown as blank lines)


def decode_story(tokenizer, ids) -> str:
    """Text of ``ids`` with every end of story shown as a blank line, not a literal marker."""
    return tokenizer.decode(np.asarray(ids)).replace(EOT, "\n\n").rstrip()


@torch.no_grad()
def write_stories(model, tokenizer, prompts: list[str], settings: SampleSettings,
                  device: torch.device) -> list[tuple[str, str]]:
    """(prompt, story) for every prompt, ``num_samples`` each, from one generator seeded once:
    the same settings give the same stories on every run."""
    model = model.to(device)
    model.eval()
    generator = torch.Generator().manual_seed(settings.seed)
    stop_id = tokenizer.eot_id if settings.stop_at_end else None
    out = []
    for prompt in prompts:
        ids = torch.from_numpy(np.asarray(tokenizer.encode(prompt), dtype=np.int64)).to(device)
        for _ in range(settings.num_samples):
            story = model.generate(ids, settings.max_new_tokens, temperature=settings.temperature,
                                   top_k=settings.top_k, stop_id=stop_id, generator=generator)
            out.append((prompt, decode_story(tokenizer, story.cpu().numpy())))
    return out


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
    identity = {"model": model_name, "model_config": config[model_name.upper()],
                "vocab_size": tokenizer.vocab_size, "tokenizer_hash": tokenizer_hash(tokenizer),
                "seq_len": config["SEQ_LEN"], "seed": train_seed}
    payload = load_checkpoint(checkpoint, identity)
    model = build_model(model_name, tokenizer.vocab_size, {**config, "SEED": train_seed})
    restore_model(model, payload, checkpoint)
    run = TrainedRun(run_dir, model_name, config, summaries, payload["progress"]["step"], bool(payload["finished"]),
                     train_seed)
    return model, tokenizer, run
