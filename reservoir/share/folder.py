"""An exported model's folder, as any huggingface_hub user knows one, written and read back without unpickling.

    config.json        the family, its settings block, the vocabulary, what is frozen; the run's own records
                       (its config and the model's summary record) and the weights' SHA-256, all signed
    model.safetensors  every tensor the model reads, frozen reservoir matrices and eigenvalues included
    tokenizer.json     the run's tokenizer
    README.md          the model card (reservoir/share/card.py)

    folder = local_folder("hf://user/name")     # a folder, or a Hub repository through huggingface_hub's cache
    exported = read_export(folder)              # ExportError (one line) for anything edited, cut short or foreign

A state the model keeps outside tensors (the n-gram's count tables, in ``get_extra_state``) is written as its
tensors under ``<key>/<path>`` and its shape as JSON in the file's metadata: safetensors holds only tensors.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from reservoir.run.records import (
    EXPORTED_WEIGHTS,
    ResultsError,
    check_run_config,
    check_summary,
    read_signed_json,
)

CONFIG, WEIGHTS, TOKENIZER, CARD = "config.json", EXPORTED_WEIGHTS, "tokenizer.json", "README.md"
FILES = (CONFIG, WEIGHTS, TOKENIZER, CARD)
LIBRARY, FORMAT = "reservoir-nlp", 1
EXTRA_STATE = "_extra_state"
SHAPES_KEY = "reservoir_nlp.extra_state"  # the safetensors metadata entry that holds the extra states' shapes


class ExportError(ResultsError):
    """An exported model that cannot be used as asked: one line that says what to do."""


def is_export(folder: Path) -> bool:
    """Whether ``folder`` holds an exported model (its weights file), rather than a run folder."""
    return (Path(folder) / WEIGHTS).is_file()


def hub_id(source: str | Path) -> str | None:
    """The Hub repository ``source`` names (``hf://user/name``, or ``user/name`` where no such folder exists
    here), else None."""
    text = str(source)
    if text.startswith("hf:/"):  # hf://user/name, or as a Path writes it (hf:/user/name)
        return text[len("hf:"):].strip("/")
    parts = text.split("/")
    if len(parts) == 2 and all(parts) and not Path(text).exists() and not text.startswith((".", "~")):
        return text
    return None


def local_folder(source: str | Path, **download) -> Path:
    """The folder on this machine that ``source`` names: itself, or a Hub repository's files in huggingface_hub's
    cache (downloaded through it unless HF_HUB_OFFLINE is set; only the export's own files, never a pickle).
    ``download``: snapshot_download's options (revision, cache_dir, token, ...)."""
    repo = hub_id(source)
    if repo is None:
        return Path(source)
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HFValidationError, LocalEntryNotFoundError, RepositoryNotFoundError

    shown = f"hf://{repo}" if str(source).startswith("hf:") else source  # a Path would show hf:/user/name
    read_as = f"{shown} (no such folder here, so read as the Hub repository {repo})"
    try:
        return Path(snapshot_download(repo, allow_patterns=list(FILES), **download))
    except HFValidationError as e:
        raise ExportError(f"{read_as} is not a Hub repository id (user/name): {str(e).splitlines()[0]}") from None
    except LocalEntryNotFoundError:
        raise ExportError(f"{read_as}: not in this machine's Hugging Face cache, and the Hub cannot be reached "
                          "(offline, or HF_HUB_OFFLINE=1): download it once where the Hub is reachable, or give the "
                          "export's folder") from None
    except RepositoryNotFoundError:
        raise ExportError(f"{read_as}: no such model repository on the Hub (or it is private: log in with "
                          "`hf auth login`)") from None


# ------------------------------------------------------------------ tensors
def flat_tensors(state: dict) -> tuple[dict[str, torch.Tensor], dict]:
    """A state_dict as safetensors holds it: {name: tensor} (each its own contiguous copy: tied weights are two
    entries) and the extra states' shapes, with every tensor in them named ``<key>/<path>``."""
    tensors, shapes = {}, {}

    def walk(value, name: str):
        if isinstance(value, torch.Tensor):
            tensors[name] = value.detach().to("cpu").clone().contiguous()
            return {"tensor": name}
        if isinstance(value, dict):
            return {"dict": {str(k): walk(v, f"{name}/{k}") for k, v in value.items()}}
        if isinstance(value, (list, tuple)):
            return {"list": [walk(v, f"{name}/{i}") for i, v in enumerate(value)]}
        if value is None or isinstance(value, (bool, int, float, str)):
            return {"value": value}
        raise ExportError(f"{name} holds a {type(value).__name__}, which an export cannot carry (tensors, numbers, "
                          "text, lists and dicts only)")

    for key, value in state.items():
        if isinstance(value, torch.Tensor):
            if value.layout != torch.strided:
                value = value.to_dense()
            tensors[key] = value.detach().to("cpu").clone().contiguous()
        else:
            shapes[key] = walk(value, key)
    return tensors, shapes


def state_from(tensors: dict[str, torch.Tensor], shapes: dict) -> dict:
    """``flat_tensors`` undone: the state_dict, extra states rebuilt from their shapes."""
    def build(shape):
        if "tensor" in shape:
            return tensors[shape["tensor"]]
        if "dict" in shape:
            return {k: build(v) for k, v in shape["dict"].items()}
        if "list" in shape:
            return [build(v) for v in shape["list"]]
        return shape["value"]

    inside = {name for name in tensors if any(name.startswith(f"{key}/") for key in shapes)}
    return {**{k: v for k, v in tensors.items() if k not in inside}, **{k: build(s) for k, s in shapes.items()}}


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


# ------------------------------------------------------------------ reading
@dataclass
class Exported:
    folder: Path
    config: dict  # config.json, checked
    run_config: dict  # the run's config.json as the export carries it (a RecordedConfig)
    record: dict  # the model's summary record, checked

    @property
    def model(self) -> str:
        return self.config["model"]

    @property
    def seed(self) -> int:
        return self.config["seed"]


def read_export(source: str | Path) -> Exported:
    """The export at ``source`` (a folder or a Hub id), every record checked against its hash and the weights
    against theirs; nothing here unpickles."""
    folder = local_folder(source)
    if not folder.is_dir():
        raise ExportError(f"{source} is not a folder; give an exported model's folder or a Hub id (hf://user/name)")
    for name in FILES:
        if not (folder / name).is_file():
            raise ExportError(f"{folder / name} is missing: an exported model's folder holds {', '.join(FILES)}; "
                              "export it again (python export.py results/<run> TO=<folder>)")
    remedy = "export the model again (python export.py results/<run> TO=<folder>)"
    config = read_signed_json(folder / CONFIG, "the export's config", remedy, always_signed=True)
    if config.get("library") != LIBRARY or config.get("format") != FORMAT:
        raise ExportError(f"{folder / CONFIG} is not a ReservoirNLP export (library {LIBRARY!r}, format {FORMAT}); "
                          "load it with the library that wrote it")
    for key in ("family", "model", "settings", "vocab_size", "seed", "run", "record", "weights_sha256"):
        if key not in config:
            raise ExportError(f"{folder / CONFIG} is damaged: it has no {key}; {remedy}")
    run_config = check_run_config(config["run"], folder / CONFIG, remedy)
    record = check_summary([config["record"]], folder / CONFIG, remedy)[0]
    weights = file_sha256(folder / WEIGHTS)
    if weights != config["weights_sha256"]:
        raise ExportError(f"{folder / WEIGHTS} is not the file this export wrote (its SHA-256 is {weights[:12]}, the "
                          f"config records {config['weights_sha256'][:12]}): cut short or replaced; {remedy}")
    return Exported(folder, config, run_config, record)


def read_tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict]:
    """The tensors of a safetensors file and the extra states' shapes in its metadata."""
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 - safe_open has no items()
        shapes = json.loads(metadata.get(SHAPES_KEY, "{}"))
    except (SafetensorError, OSError, ValueError) as e:
        raise ExportError(f"{path} is not a readable safetensors file ({str(e).splitlines()[0][:120]}); export "
                          "the model again") from None
    return tensors, shapes


def write_tensors(path: Path, state: dict) -> None:
    from safetensors.torch import save_file

    tensors, shapes = flat_tensors(state)
    save_file(tensors, str(path), metadata={"format": "pt", SHAPES_KEY: json.dumps(shapes, sort_keys=True)})


def check_destination(folder: Path) -> bool:
    """Refuse, before anything is read or written, a ``TO`` an export cannot become: a file, a folder with files in
    it, a path through a file, or a place this process cannot write. True where ``folder`` is an empty folder
    already (it is kept, and the export's files are moved into it)."""
    if folder.is_file() or (folder.exists() and not folder.is_dir()):
        raise ExportError(f"TO={folder} is a file: give a new folder (or an empty one) for the export")
    if folder.is_dir() and any(folder.iterdir()):
        raise ExportError(f"TO={folder} exists and is not empty: an export never writes over files; give a new "
                          "folder, or delete that one first")
    place = folder if folder.is_dir() else next(p for p in folder.absolute().parents if p.exists())
    if not place.is_dir():
        raise ExportError(f"TO={folder} goes through {place}, which is a file, not a folder: give a folder's path")
    if not os.access(place, os.W_OK | os.X_OK):
        cause = "the file system is read-only" if _read_only(place) else "permission denied"
        raise ExportError(f"TO={folder} cannot be written ({place}: {cause}); give a folder this user can write")
    return folder.is_dir()


def _read_only(place: Path) -> bool:
    try:
        return bool(os.statvfs(place).f_flag & os.ST_RDONLY)
    except OSError:
        return False
