"""Every language model, built by name from its config block.

    model = build_model("esn", vocab_size, config)     # config: the validated SHARED_CONFIG
"""

from __future__ import annotations

import math

from reservoir.models.attention_readout import ReservoirAttention
from reservoir.models.base import LanguageModel
from reservoir.models.baselines import LSTM, NGram, Transformer
from reservoir.models.reservoirs import ESN, NVAR, DeepESN, DeepLinearReservoir, LinearReservoir, ReservoirLM
from reservoir.models.retention import FrozenRetention
from reservoir.platform.messages import OneLineError

__all__ = ["LanguageModel", "ReservoirLM", "ESN", "DeepESN", "LinearReservoir", "DeepLinearReservoir",
           "NVAR", "FrozenRetention", "ReservoirAttention", "Transformer", "LSTM",
           "NGram", "build_model", "MODEL_NAMES", "check_vocabulary", "ModelSettingsError", "trainer_of"]

_BUILDERS = {
    "esn": lambda v, cfg, c: ESN(v, cfg, c["SEED"]),
    "deep_esn": lambda v, cfg, c: DeepESN(v, cfg, c["SEED"]),
    "linear_reservoir": lambda v, cfg, c: LinearReservoir(v, cfg, c["SEED"]),
    "deep_linear_reservoir": lambda v, cfg, c: DeepLinearReservoir(v, cfg, c["SEED"], c["SEQ_LEN"]),
    "nvar": lambda v, cfg, c: NVAR(v, cfg, c["SEED"]),
    "frozen_retention": lambda v, cfg, c: FrozenRetention(v, cfg, c["SEQ_LEN"]),
    "reservoir_attention": lambda v, cfg, c: ReservoirAttention(v, cfg, c["SEED"], c["SEQ_LEN"]),
    "transformer": lambda v, cfg, c: Transformer(v, cfg, c["SEQ_LEN"]),
    "lstm": lambda v, cfg, c: LSTM(v, cfg),
    "ngram": lambda v, cfg, c: NGram(v, cfg),
}
MODEL_NAMES = tuple(_BUILDERS)


def trainer_of(name: str, config: dict) -> str:
    """How the runner fits model ``name`` under ``config`` (its ``trainer``), known before it is built: counts
    for the n-gram, a closed-form ridge solve for a reservoir whose readout is 'ridge', gradient steps else."""
    if name == "ngram":
        return "counts"
    return "ridge" if config[name.upper()].get("readout") == "ridge" else "sgd"


class ModelSettingsError(OneLineError, ValueError):
    """Model settings that the data refuses, known once its vocabulary is: reported as one line."""


NGRAM_KEY_BITS = 63  # the n-gram stores an n-gram as one int64: vocab ** order must stay below 2 ** 63


def check_vocabulary(config: dict, vocab_size: int) -> None:
    """Settings that only fail with the data's vocabulary: refused before any run folder exists."""
    if "ngram" in config["MODELS"]:
        order = config["NGRAM"]["order"]
        if vocab_size ** order >= 2 ** NGRAM_KEY_BITS:
            highest = max(k for k in range(1, order) if vocab_size ** k < 2 ** NGRAM_KEY_BITS)
            raise ModelSettingsError(f"NGRAM.order={order} with a vocabulary of {vocab_size} tokens needs keys of "
                                     f"{math.ceil(order * math.log2(vocab_size))} bits (the n-gram's are 63): use "
                                     f"NGRAM.order<={highest}, or a smaller VOCAB_SIZE")


# Options added to a model after runs of it were recorded, with the value that builds the model as
# it was: a run folder's config.json (read by RESUME, sample.py, compare.py) lacks them.
ADDED_OPTIONS = {"TRANSFORMER": {"recipe": "gpt2", "rotary": None, "swiglu": None, "rmsnorm": None, "qk_norm": False,
                                 "trained": "everything"},
                 "LINEAR_RESERVOIR": {"train_recurrence": False},
                 "DEEP_LINEAR_RESERVOIR": {"train_recurrence": False},
                 "RESERVOIR_ATTENTION": {"train_recurrence": False}}


def with_added_options(config: dict) -> dict:
    """A recorded config with the options its blocks lack filled as those runs were built (RESUME validates it
    next, which would otherwise fill them with today's defaults: the transformer's recipe is '++' now)."""
    return {key: {**ADDED_OPTIONS[key], **value} if key in ADDED_OPTIONS and isinstance(value, dict) else value
            for key, value in config.items()}


def build_model(name: str, vocab_size: int, config: dict) -> LanguageModel:
    """The model ``name`` with hyper-parameters from ``config[name.upper()]``, seeded by SEED."""
    import torch

    torch.manual_seed(config["SEED"])  # trained weights start the same way in every run
    block = name.upper()
    return _BUILDERS[name](vocab_size, {**ADDED_OPTIONS.get(block, {}), **config[block]}, config)
