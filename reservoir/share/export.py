"""One trained model of a run folder (a study's point is one too) written as an exported model's folder.

    folder = export_model("results/default-run", "transformer", None, Path("exports/tiny"), "mit")

Only a finished model with its summary record is exported: the card states the record's numbers. The folder is
written beside its destination and renamed onto it whole, so an export that fails leaves nothing behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import torch

from reservoir.models import build_model
from reservoir.models.registry import class_of, family_of
from reservoir.platform.files import current_umask
from reservoir.run.records import check_summary, portable_config, read_run_config, signed, write_json_atomic
from reservoir.run.trained import load_trained
from reservoir.share.card import model_card
from reservoir.share.folder import (
    CARD,
    CONFIG,
    FORMAT,
    LIBRARY,
    TOKENIZER,
    WEIGHTS,
    ExportError,
    ensure_new,
    file_sha256,
    write_tensors,
)


def frozen_tensors(model, built) -> list[str]:
    """The state's tensors training left as they were drawn or set: not a trained parameter (nor tied to one), and
    equal to ``built``'s, the same family built afresh with the run's seeds (a closed-form readout is a buffer that
    its fit wrote)."""
    trained = {p.data_ptr() for p in model.parameters() if p.requires_grad}
    fresh = built.state_dict()
    return [name for name, tensor in model.state_dict().items() if isinstance(tensor, torch.Tensor)
            and tensor.data_ptr() not in trained and name in fresh and torch.equal(tensor, fresh[name])]


def export_config(run_dir: Path, model, tokenizer, run, license_id: str) -> dict:
    """config.json's content, unsigned, without the weights' hash."""
    run_config = read_run_config(run_dir)
    records = [r for r in check_summary(run.summaries, run_dir / "summary.json")
               if r.get("model") == run.model and r.get("seed", run.seed) == run.seed]
    if not run.finished or not records:
        raise ExportError(f"{run_dir}: {run.model} (seed {run.seed}) has not finished, so it has no record for its "
                          "card to state: finish the run (python TinyStories.py RESUME=...) and export it then")
    block = run.config[run.model.upper()]
    built = build_model(run.model, tokenizer.vocab_size, {**run.config, "SEED": run.seed})
    family = family_of(run.model, block)
    return {
        "library": LIBRARY, "format": FORMAT, "family": family, "model": run.model, "kind": class_of(family),
        "settings": block, "vocab_size": tokenizer.vocab_size, "seq_len": run.config["SEQ_LEN"], "seed": run.seed,
        "draw_seed": run.config.get("DRAW_SEED"), "trained": model.trained, "frozen": frozen_tensors(model, built),
        "parameters": {"trained": records[0]["params_trainable"],
                       "frozen": records[0]["params_total"] - records[0]["params_trainable"]},
        "tokenizer": {"kind": run_config["data"]["tokenizer"], "hash": run_config["data"]["tokenizer_hash"]},
        "plugins": dict(portable_config(run_config).get("plugins") or {}), "license": license_id,
        "step": run.step, "run": portable_config(run_config), "record": records[-1],
    }


def export_model(run_dir: str | Path, model_name: str | None, train_seed: int | None, to: Path,
                 license_id: str) -> Path:
    """The folder ``to`` holding ``model_name`` (trained with ``train_seed``) of ``run_dir``; see the module."""
    run_dir, to = Path(run_dir), Path(to)
    ensure_new(to)
    model, tokenizer, run = load_trained(run_dir, model_name, train_seed)
    content = export_config(run_dir, model, tokenizer, run, license_id)
    to.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{to.name}-", dir=to.parent))
    try:
        write_tensors(staging / WEIGHTS, model.state_dict())
        content = signed({**content, "weights_sha256": file_sha256(staging / WEIGHTS)})
        write_json_atomic(staging / CONFIG, content)
        shutil.copyfile(run_dir / TOKENIZER, staging / TOKENIZER)
        (staging / CARD).write_text(model_card(content, license_id), encoding="utf-8")
        os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp's 0700 would hide it from colleagues
        staging.rename(to)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return to

