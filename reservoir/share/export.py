"""One trained model of a run folder (a study's point is one too) written as an exported model's folder.

    folder = export_model("results/default-run", "transformer", None, Path("exports/tiny"), "mit")

Only a finished model with its summary record is exported: the card states the record's numbers. TO, the license
and a Hub id to push to are checked before anything is written. The folder is written beside its destination and
renamed onto it whole (into an empty folder given as TO: written inside it, then moved up, the config last), so an
export that fails leaves nothing behind and nothing that was there before is changed. Every file follows the umask.
"""

from __future__ import annotations

import os
import re
import shutil
import tempfile
from pathlib import Path

import torch

from reservoir.models import build_model
from reservoir.models.registry import class_of, family_of
from reservoir.platform.files import current_umask, storage_error
from reservoir.platform.messages import first_line
from reservoir.run.records import (
    check_summary,
    divergence,
    portable_config,
    read_run_config,
    read_summary,
    signed,
    write_json_atomic,
)
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
    check_destination,
    file_sha256,
    is_export,
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
    diverged = [r for r in records if r.get("status") == "diverged"]
    if diverged:
        raise ExportError(f"{run_dir}: {run.model} (seed {run.seed}) {divergence(diverged[-1])}: it has no score for "
                          "its card to state; train it again with the change its record suggests, and export that")
    if not run.finished or not records:
        raise ExportError(f"{run_dir}: {run.model} (seed {run.seed}) has not finished, so it has no record for its "
                          f"card to state: finish the run (python TinyStories.py RESUME={run_dir}) and export it then")
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


LICENSE_ID = re.compile(r"[a-z0-9][a-z0-9.+-]{0,63}")  # the Hub's license ids: mit, apache-2.0, cc-by-4.0, other


def check_license(license_id: str) -> str:
    if not isinstance(license_id, str) or not LICENSE_ID.fullmatch(license_id):
        raise ExportError(f"LICENSE={license_id!r} is not a Hub license id (lower-case letters, digits, '.', '-' and "
                          "'+', such as mit, apache-2.0, cc-by-4.0 or other)")
    return license_id


def check_repository_id(repo: str) -> str:
    """A Hub repository id to push to (user/name), checked before the export is written."""
    from huggingface_hub.utils import HFValidationError, validate_repo_id

    try:
        if repo.count("/") != 1:
            raise HFValidationError("it must be user/name")
        validate_repo_id(repo)
    except HFValidationError as e:
        raise ExportError(f"PUSH={repo!r} is not a Hub repository id: {first_line(e, 160)}; give user/name (letters, "
                          "digits, '-', '_' and '.')") from None
    return repo


def push_export(folder: Path, repo: str, private: bool) -> str:
    """Upload the export at ``folder`` to ``repo`` with huggingface_hub's login; any failure (no network, offline
    mode, no login, no such user) is one line that says the export is written and how to push it later."""
    from reservoir.share.pretrained import Pretrained

    try:
        return str(Pretrained.from_pretrained(str(folder)).push_to_hub(repo, private=private))
    except ExportError:
        raise
    except Exception as e:  # huggingface_hub's and its HTTP client's many errors, all "not pushed"
        cause = " ".join(first_line(e, 200).split())
        raise ExportError(f"the export is written to {folder}, but pushing it to {repo} failed ({type(e).__name__}: "
                          f"{cause}); push it when the Hub is reachable and you are logged in (hf auth login): "
                          f"python -c \"from reservoir.share import Pretrained; Pretrained.from_pretrained("
                          f"'{folder}').push_to_hub('{repo}')\"") from None


def _check_something_finished(run_dir: Path) -> None:
    """A run with no scored model has nothing an export's card could state: say how to finish it (naming one of
    its models would only be refused for the same reason)."""
    if run_dir.is_dir() and not is_export(run_dir) and (run_dir / CONFIG).is_file():
        records = read_summary(run_dir) if (run_dir / "summary.json").is_file() else []
        if not any(r.get("val_bpc") is not None for r in records):
            raise ExportError(f"{run_dir} has no finished model with a score to export: finish the run (python "
                              f"TinyStories.py RESUME={run_dir}), then export it")


def export_model(run_dir: str | Path, model_name: str | None, train_seed: int | None, to: Path,
                 license_id: str) -> Path:
    """The folder ``to`` holding ``model_name`` (trained with ``train_seed``) of ``run_dir``; see the module."""
    run_dir, to = Path(run_dir), Path(to)
    check_license(license_id)
    into_empty = check_destination(to)
    if model_name is None:
        _check_something_finished(run_dir)
    model, tokenizer, run = load_trained(run_dir, model_name, train_seed)
    content = export_config(run_dir, model, tokenizer, run, license_id)
    staging, moved = None, []
    try:
        to.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{to.name}-", dir=to if into_empty else to.parent))
        write_tensors(staging / WEIGHTS, model.state_dict())
        content = signed({**content, "weights_sha256": file_sha256(staging / WEIGHTS)})
        write_json_atomic(staging / CONFIG, content)
        shutil.copyfile(run_dir / TOKENIZER, staging / TOKENIZER)
        (staging / CARD).write_text(model_card(content, license_id), encoding="utf-8")
        for name in (WEIGHTS, CONFIG, TOKENIZER, CARD):  # one rule: safetensors' own writer makes its file 0600
            os.chmod(staging / name, 0o666 & ~current_umask())
        if into_empty:  # the folder given stays (a mount point cannot be renamed onto); the config comes last
            for name in (WEIGHTS, TOKENIZER, CARD, CONFIG):
                os.rename(staging / name, to / name)
                moved.append(to / name)
            staging.rmdir()
        else:
            os.chmod(staging, 0o777 & ~current_umask())  # mkdtemp's 0700 would hide it from colleagues
            staging.rename(to)
    except BaseException as e:
        for path in moved:
            path.unlink(missing_ok=True)
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
        if isinstance(e, OSError):
            raise storage_error(to, e, "give TO a folder this user can write") from None
        raise
    return to

