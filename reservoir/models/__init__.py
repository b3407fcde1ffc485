"""Every language model, built by name from its config block.

    model = build_model("esn", vocab_size, config)     # config: the validated SHARED_CONFIG
"""

from __future__ import annotations

from .base import LanguageModel
from .baselines import LSTM, NGram, Transformer
from .reservoirs import ESN, NVAR, DeepESN, DeepLinearReservoir, LinearReservoir, ReservoirLM

__all__ = ["LanguageModel", "ReservoirLM", "ESN", "DeepESN", "LinearReservoir", "DeepLinearReservoir",
           "NVAR", "Transformer", "LSTM",
           "NGram", "build_model", "MODEL_NAMES"]

_BUILDERS = {
    "esn": lambda v, cfg, c: ESN(v, cfg, c["SEED"]),
    "deep_esn": lambda v, cfg, c: DeepESN(v, cfg, c["SEED"]),
    "linear_reservoir": lambda v, cfg, c: LinearReservoir(v, cfg, c["SEED"]),
    "deep_linear_reservoir": lambda v, cfg, c: DeepLinearReservoir(v, cfg, c["SEED"], c["SEQ_LEN"]),
    "nvar": lambda v, cfg, c: NVAR(v, cfg, c["SEED"]),
    "transformer": lambda v, cfg, c: Transformer(v, cfg, c["SEQ_LEN"]),
    "lstm": lambda v, cfg, c: LSTM(v, cfg),
    "ngram": lambda v, cfg, c: NGram(v, cfg),
}
MODEL_NAMES = tuple(_BUILDERS)


def build_model(name: str, vocab_size: int, config: dict) -> LanguageModel:
    """The model ``name`` with hyper-parameters from ``config[name.upper()]``, seeded by SEED."""
    import torch

    torch.manual_seed(config["SEED"])  # trained weights start the same way in every run
    return _BUILDERS[name](vocab_size, config[name.upper()], config)
