"""A trained model as the field shares one: ``from_pretrained`` / ``save_pretrained`` / ``push_to_hub`` through
huggingface_hub's ``PyTorchModelHubMixin``, over the export's own safetensors reader (never a pickle).

    model = Pretrained.from_pretrained("exports/tiny")      # or "user/name" / "hf://user/name" on the Hub
    logits = model(ids)                                      # (B, T) token ids -> (B, T, V), as the run's model
    ids = model.tokenizer.encode("Once upon a time")
    model.push_to_hub("user/name")                           # huggingface_hub's upload, its own token handling
"""

from __future__ import annotations

import shutil
from pathlib import Path

import torch
from huggingface_hub import PyTorchModelHubMixin
from torch import nn

from reservoir.config import ConfigError, load_plugins
from reservoir.models import build_model
from reservoir.models.registry import changed_plugins
from reservoir.run.records import ResultsError
from reservoir.run.trained import TrainedRun, load_tokenizer
from reservoir.share.card import check_card
from reservoir.share.folder import (
    FILES,
    WEIGHTS,
    Exported,
    ExportError,
    local_folder,
    read_export,
    read_tensors,
    state_from,
)

REPOSITORY_URL = "https://github.com/reservoir-nlp/reservoir-nlp"


def load_export_plugins(exported: Exported) -> None:
    """The plugin a family comes from, loaded as the run named it and exactly the code it was trained with: each
    file is checked against the SHA-256 the export recorded before it is imported, so changed code never runs."""
    named = exported.run_config["effective_config"].get("PLUGINS")
    family = exported.config["family"]
    if named and not exported.config.get("plugins"):
        raise ExportError(f"{exported.folder}: its family {family} comes from plugins ({named}) whose SHA-256 the "
                          "export does not record, so they were not imported; export the model again")
    changed = changed_plugins(exported.config.get("plugins"))
    if changed:
        raise ExportError(f"{exported.folder}: its family {family} comes from a plugin that was not imported: "
                          f"{changed[0]}; put the plugin file the export was made with where config.json's plugins "
                          "names it")
    try:
        load_plugins(named)
    except ConfigError as e:
        raise ExportError(f"{exported.folder}: its family {family} comes from a plugin that cannot be loaded here "
                          f"({e}); put the plugin where the export names it") from None


def _check_state(model: nn.Module, state: dict, where: Path) -> None:
    """Every tensor the model reads is in the file, with its shape, and nothing else is: one line if not."""
    wanted = model.state_dict()
    missing, unexpected = sorted(set(wanted) - set(state)), sorted(set(state) - set(wanted))
    if missing or unexpected:
        said = "; ".join(part for part in (
            f"missing {', '.join(missing[:3])}{' ...' if len(missing) > 3 else ''}" if missing else "",
            f"not the model's {', '.join(unexpected[:3])}{' ...' if len(unexpected) > 3 else ''}" if unexpected else "")
            if part)
        raise ExportError(f"{where}: its tensors are not those of the family its config names ({said}); export the "
                          "model again")
    for name, tensor in wanted.items():
        if isinstance(tensor, torch.Tensor) and (tuple(state[name].shape), state[name].dtype) != \
                (tuple(tensor.shape), tensor.dtype):
            raise ExportError(f"{where}: {name} is {tuple(state[name].shape)} {state[name].dtype}, the settings in its "
                              f"config give {tuple(tensor.shape)} {tensor.dtype}; export the model again")


def open_export(source: str | Path) -> tuple[nn.Module, object, TrainedRun, Exported]:
    """(model on the CPU, tokenizer, TrainedRun, Exported) for the export at ``source``, every file checked."""
    exported = read_export(source)
    check_card(exported.folder, exported.config, exported.record)
    load_export_plugins(exported)
    config = {**exported.run_config["effective_config"], "SEED": exported.seed}
    tokenizer = load_tokenizer(exported.folder, exported.run_config)
    if tokenizer.vocab_size != exported.config["vocab_size"]:
        raise ExportError(f"{exported.folder}: its tokenizer has {tokenizer.vocab_size} tokens, its config says "
                          f"{exported.config['vocab_size']}; export the model again")
    if config.get(exported.model.upper()) != exported.config["settings"]:
        raise ExportError(f"{exported.folder}: its settings block and the run's own settings disagree; export the "
                          "model again")
    model = build_model(exported.model, tokenizer.vocab_size, config)
    state = state_from(*read_tensors(exported.folder / WEIGHTS))
    _check_state(model, state, exported.folder / WEIGHTS)
    try:
        model.load_state_dict(state)
    except (RuntimeError, KeyError, TypeError, ValueError) as e:
        raise ExportError(f"{exported.folder / WEIGHTS}: the family's model cannot take these tensors "
                          f"({' '.join(str(e).split())[:200]}); export the model again") from None
    model.eval()
    run = TrainedRun(exported.folder, exported.model, exported.run_config["effective_config"], [exported.record],
                     exported.config.get("step", 0), True, exported.seed)
    return model, tokenizer, run, exported


class Pretrained(nn.Module, PyTorchModelHubMixin, library_name="reservoir-nlp", repo_url=REPOSITORY_URL,
                 tags=["reservoir-computing", "language-model"]):
    """An exported model: ``.model`` (the family's LanguageModel, whose logits equal the run's), ``.tokenizer``,
    ``.record`` (its signed summary record) and ``.exported`` (its checked config.json)."""

    def __init__(self, config: dict | None = None):
        super().__init__()
        self.model, self.tokenizer, self.record, self.exported, self.source = None, None, None, None, None

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.model(ids)

    def generate(self, prompt: torch.Tensor, max_new_tokens: int, **options) -> torch.Tensor:
        """The prompt's token ids (``(1, T)``, or 1-D) and at most ``max_new_tokens`` more, in the prompt's shape
        (so ``tokenizer.decode(out[0].tolist())`` reads a (1, T) prompt's story). ``options``: the family's
        ``generate`` options, ``temperature`` (0: greedy), ``top_k``, ``top_p``, ``stop_id`` (the tokenizer's
        end-of-story id stops at a story's end) and ``generator`` (a seeded ``torch.Generator``: the same story
        on every device)."""
        with torch.no_grad():
            out = self.model.generate(prompt, max_new_tokens, **options)
        return out.view(1, -1) if prompt.dim() == 2 else out

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | Path, *, force_download: bool = False, token=None,
                        cache_dir=None, local_files_only: bool = False, revision=None, **_ignored) -> Pretrained:
        """The export at ``pretrained_model_name_or_path`` (a folder, ``user/name`` or ``hf://user/name``), every
        file checked before anything is read into a model: a damaged folder or a missing path is the project's
        one-line ``ExportError``, as the command-line tools say it (the mixin's own reader would first parse
        config.json itself and speak huggingface_hub's errors)."""
        return cls._from_pretrained(model_id=str(pretrained_model_name_or_path), revision=revision,
                                    cache_dir=cache_dir, force_download=force_download,
                                    local_files_only=local_files_only, token=token)

    @classmethod
    def _from_pretrained(cls, *, model_id: str, revision=None, cache_dir=None, force_download=False,
                         local_files_only=False, token=None, **_ignored) -> Pretrained:
        """The export at ``model_id`` (a folder, or a Hub id fetched through huggingface_hub's cache): its
        safetensors and JSON only; the mixin's fallback to a pickled ``pytorch_model.bin`` is never taken."""
        folder = local_folder(model_id, revision=revision, cache_dir=cache_dir, force_download=force_download,
                              local_files_only=local_files_only, token=token)
        wrapper = cls()
        wrapper.model, wrapper.tokenizer, run, exported = open_export(folder)
        wrapper.record, wrapper.exported, wrapper.source = exported.record, exported.config, exported.folder
        return wrapper.eval()

    def _save_pretrained(self, save_directory: Path) -> None:
        """The export's own files, as they were read (their hashes still hold)."""
        for name in FILES:
            shutil.copyfile(Path(self.source) / name, Path(save_directory) / name)


__all__ = ["Pretrained", "open_export", "ResultsError"]
