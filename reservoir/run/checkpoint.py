"""Checkpoints: written atomically, read without unpickling code.

    save_checkpoint(path, payload, info)     # rank 0 writes; XLA tensors fetched to the CPU in one go
    payload = load_checkpoint(path, expect)  # CheckpointError (one line) if corrupt or not this run's
    expect = checkpoint_identity(name, config, tokenizer)  # what says a checkpoint is this run's
    restore_model(model, payload, path)      # CheckpointError if the model code has changed since

A checkpoint is a ``torch.save`` of plain containers, numbers and tensors, so
``torch.load(weights_only=True)`` reads it: a file from elsewhere cannot run code. It records the
SHA-256 of its tensors (``tensors_sha256``): torch's reader does not check the bytes of a tensor, so
a flipped byte would otherwise load as a slightly different model. A checkpoint written before the
hash is read with a warning that its tensors cannot be checked; the next save writes one.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch

from reservoir.data.tokenizers import tokenizer_hash
from reservoir.models.settings import PER_MODEL
from reservoir.platform import device as dev
from reservoir.platform.files import atomic_write
from reservoir.platform.messages import OneLineError, first_line, warn

FORMAT = 1
SINCE_LATER = ("replicas", "seed")  # identity keys older checkpoints lack: checked only where present
HASH_KEY = "tensors_sha256"


class CheckpointError(OneLineError, RuntimeError):
    """A checkpoint that cannot be used: reported as one line that says what to do."""


def checkpoint_identity(name: str, config: dict, tokenizer, replicas: int | None = None) -> dict:
    """What a checkpoint of model ``name`` must match to belong to a run with ``config`` and ``tokenizer``:
    the model's settings, the tokenizer, SEQ_LEN and the seed; with ``replicas`` (training resumes:
    the data order and batch depend on it) that too."""
    architecture = {k: v for k, v in config[name.upper()].items() if k not in PER_MODEL.values()}  # not its rate
    identity = {"model": name, "model_config": architecture, "vocab_size": tokenizer.vocab_size,
                "tokenizer_hash": tokenizer_hash(tokenizer), "seq_len": config["SEQ_LEN"], "seed": config["SEED"]}
    if replicas is not None:
        identity["replicas"] = replicas
    return identity


def save_checkpoint(path: str | Path, payload: dict, info: dev.DeviceInfo) -> None:
    """Write ``payload`` to ``path`` atomically: a crash leaves the previous checkpoint or the new one."""
    cpu_payload = dev.to_cpu(info, {"format": FORMAT, **payload})  # every process joins the XLA transfer
    if not info.is_main_process:
        return
    cpu_payload[HASH_KEY] = tensors_sha256(cpu_payload)
    atomic_write(path, lambda tmp: _torch_save(cpu_payload, tmp))


def _torch_save(payload: dict, tmp: str) -> None:
    """``torch.save``, with a failed write (a full disk) raised as the OSError it is: torch's zip writer
    reports one as a RuntimeError ("unexpected pos", "file write failed") that carries no errno."""
    try:
        torch.save(payload, tmp)
    except RuntimeError as e:
        text = str(e)
        if "unexpected pos" in text or "write" in text.lower():
            raise OSError(f"torch.save could not write it ({text.strip().splitlines()[-1][:120]})") from None
        raise


def tensors_sha256(payload) -> str:
    """The SHA-256 of every tensor in ``payload`` (nested dicts, lists, tuples), each with where it sits, its dtype
    and shape, so a changed byte, a swapped tensor or a reshaped one all change it; numbers and text are not in it
    (a changed step or flag is the payload's own business, and torch's reader checks its pickle)."""
    digest = hashlib.sha256()

    def visit(where: str, value) -> None:
        if isinstance(value, torch.Tensor):
            flat = value.detach().to("cpu").contiguous().reshape(-1)
            digest.update(f"{where}|{value.dtype}|{tuple(value.shape)}|".encode())
            digest.update(flat.view(torch.uint8).numpy().tobytes() if flat.numel() else b"")
        elif isinstance(value, dict):
            for key, item in value.items():
                visit(f"{where}/{key}", item)
        elif isinstance(value, (list, tuple)):
            for i, item in enumerate(value):
                visit(f"{where}/{i}", item)

    visit("", {k: v for k, v in payload.items() if k != HASH_KEY})
    return digest.hexdigest()


def _check_tensors(path: Path, payload: dict) -> None:
    """A hash that does not match is a damaged file; a checkpoint written before the hash is used, with a warning
    that its tensors cannot be checked."""
    recorded = payload.get(HASH_KEY)
    if recorded is None:
        warn(f"checkpoint {path} was written before checkpoints recorded a hash of their tensors, so they cannot "
             "be checked: it is used as it is (a resume writes the hash with its next checkpoint)")
    elif recorded != tensors_sha256(payload):
        raise CheckpointError(f"checkpoint {path} is damaged: its tensors do not match the SHA-256 it recorded "
                              "when it was written; restore it from a copy, or delete it to train that model "
                              "again from step 0")


def load_checkpoint(path: str | Path, expect: dict, tensors: bool = True) -> dict:
    """The payload at ``path``, checked to belong to the model and data described by ``expect``, and its tensors
    to be as written (``tensors=False``: a look at its progress alone, whose tensors are not used)."""
    path = Path(path)
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"checkpoint {path} does not exist") from None
    except Exception as e:  # torch raises many types for truncated or foreign files
        raise CheckpointError(f"checkpoint {path} is corrupt or not a ReservoirNLP checkpoint ({first_line(e, 160)}); "
                              f"delete it to restart that model from scratch, or start a new run") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"checkpoint {path} is not a ReservoirNLP checkpoint (format {FORMAT}); "
                              "delete it or start a new run")
    if tensors:
        _check_tensors(path, payload)
    for key, wanted in expect.items():
        if key in SINCE_LATER and key not in payload:
            continue
        found = payload.get(key)
        if key == "model_config" and isinstance(found, dict):  # written with its rate by 0.4.0 for a while
            found = {k: v for k, v in found.items() if k not in PER_MODEL.values()}
        if found != wanted:
            raise CheckpointError(f"checkpoint {path} does not match this run: {key} is {found!r}, "
                                  f"the run has {wanted!r}; resume with the run's own settings or start a new run")
    return payload


def restore_model(model: torch.nn.Module, payload: dict, path: str | Path) -> None:
    """Load the checkpoint's weights into ``model``; a state that this code's model does not have
    (written by another version of it) is a CheckpointError, not a traceback."""
    try:
        model.load_state_dict(payload["model_state"])
    except RuntimeError as e:
        detail = " ".join(str(e).split())[:300]
        raise CheckpointError(f"checkpoint {path} holds a model that this version of the code cannot load "
                              f"({detail}); use the code version that wrote it, or start a new run") from None


def checkpoint_file(run_dir: Path, model: str, seed: int | None, seeds: list[int] | None) -> Path:
    """Where ``model``'s checkpoint for ``seed`` lives: ``<model>.pt`` for the run's first seed (so a
    one-seed run and sample.py's default read the same file), ``<model>-seed<N>.pt`` for the others."""
    name = model if seed is None or not seeds or seed == seeds[0] else f"{model}-seed{seed}"
    return Path(run_dir) / "checkpoints" / f"{name}.pt"
