"""A trained model shared as the field expects: exported to a folder of config.json, model.safetensors, the
tokenizer and a model card from the run's records; loaded back from that folder or a Hub repository, by every
script that takes a run folder.

    export_model("results/<run>", "transformer", None, Path("exports/tiny"), "mit")
    model = Pretrained.from_pretrained("exports/tiny")        # or "user/name" on the Hub
    model, tokenizer, run = load_trained("exports/tiny")      # a run folder, an export or hf://user/name
"""

from __future__ import annotations

from pathlib import Path

from reservoir.run import trained as run_folder
from reservoir.run.records import read_json, read_run_config
from reservoir.share.export import export_model
from reservoir.share.folder import ExportError, hub_id, is_export, local_folder, read_export


def _export_folder(source: str | Path) -> Path | None:
    """The local folder of the export ``source`` names (a Hub id through the cache), None for a run folder."""
    if hub_id(source) is not None:
        return local_folder(source)
    return Path(source) if is_export(Path(source)) else None


def load_trained(source: str | Path, model_name: str | None = None, train_seed: int | None = None):
    """(model on the CPU, tokenizer, TrainedRun) from a run folder (run.trained.load_trained), an exported folder or
    a Hub repository; an export holds one model, so a MODEL or TRAIN_SEED it is not is one line."""
    folder = _export_folder(source)
    if folder is None:
        return run_folder.load_trained(source, model_name, train_seed)
    from reservoir.share.pretrained import open_export

    model, tokenizer, run, exported = open_export(folder)
    if model_name not in (None, exported.model, exported.config["family"]):
        raise ExportError(f"{source} holds {exported.config['family']} alone, not MODEL={model_name}")
    if train_seed not in (None, exported.seed):
        raise ExportError(f"{source} holds the model trained with seed {exported.seed}, not TRAIN_SEED={train_seed}")
    return model, tokenizer, run


def run_records(source: str | Path) -> tuple[Path, dict, list[dict]]:
    """(its local folder, the run's config.json content, its summary records) for a run folder or an export (whose
    config carries its run's config and its one record), as compare.py reads a side."""
    folder = _export_folder(source)
    if folder is None:
        folder = Path(source)
        summary = folder / "summary.json"
        return folder, read_run_config(folder), read_json(summary, "the run's summary") if summary.exists() else []
    exported = read_export(folder)
    return folder, exported.run_config, [exported.record]


def __getattr__(name: str):
    """``Pretrained`` is imported when asked for: huggingface_hub's mixin costs every script 0.2 s to import."""
    if name == "Pretrained":
        from reservoir.share.pretrained import Pretrained

        return Pretrained
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["export_model", "Pretrained", "load_trained", "run_records", "ExportError", "read_export"]
