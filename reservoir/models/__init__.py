"""Every language model, built by name from its config block.

    model = build_model("esn", vocab_size, config)     # config: the validated SHARED_CONFIG
"""

from __future__ import annotations

import math

from reservoir.models.attention_readout import ReservoirAttention
from reservoir.models.base import LanguageModel
from reservoir.models.baselines import LSTM, NGram, Transformer
from reservoir.models.registry import (
    FLOAT,
    FROZEN_TRANSITION,
    INT,
    LOG,
    MODELS,
    RESERVOIR,
    TRAINED,
    Family,
    presets,
    register,
)
from reservoir.models.reservoirs import ESN, NVAR, DeepESN, DeepLinearReservoir, LinearReservoir, ReservoirLM
from reservoir.models.retention import FrozenRetention
from reservoir.platform.messages import OneLineError

__all__ = ["LanguageModel", "ReservoirLM", "ESN", "DeepESN", "LinearReservoir", "DeepLinearReservoir",
           "NVAR", "FrozenRetention", "ReservoirAttention", "Transformer", "LSTM",
           "NGram", "build_model", "MODEL_NAMES", "model_names", "check_vocabulary", "ModelSettingsError", "trainer_of",
           "Family", "register", "RESERVOIR", "FROZEN_TRANSITION", "TRAINED", "draw_seed", "draws_at_random"]


def _ridge_or_sgd(block: dict) -> str:
    return "ridge" if block.get("readout") == "ridge" else "sgd"


# sweep.py's search spaces, with the ranges reservoirpy's tutorials and the literature use (log-uniform spectral
# radius 1e-2..10, leak rate 1e-3..1, input scaling 1e-2..10, ridge 1e-8..10; a learning rate 1e-4..1e-2 for
# gradient-trained models). Keys are the runner's own override names.
def _reservoir_search(block: str) -> dict:
    return {f"{block}.spectral_radius": (LOG, 1e-2, 10.0), f"{block}.leak_rate": (LOG, 1e-3, 1.0),
            f"{block}.input_scaling": (LOG, 1e-2, 10.0), f"{block}.ridge": (LOG, 1e-8, 10.0)}


def _gradient_search(block: str) -> dict:  # the transformer's keys: an equal search for every gradient family
    return {"LEARNING_RATE": (LOG, 1e-4, 1e-2), f"{block}.dropout": (FLOAT, 0.0, 0.3), "WEIGHT_DECAY": (LOG, 1e-4, 0.3)}


def draw_seed(config: dict) -> int:
    """The seed of a reservoir's random draw (its frozen matrices and eigenvalues): DRAW_SEED, or the run's seed;
    its trained weights and data order follow SEED alone, so the two vary apart. A record made before DRAW_SEED
    drew with its seed."""
    drawn = config.get("DRAW_SEED")
    return config["SEED"] if drawn is None else drawn


# The built-in families. Size presets: trained parameters on TinyStories' 77 characters in the comments; the
# studies' grids default to xs to l, and xxs and xl are the steps beyond its edges, for a grid that grows to
# contain its optimum. The echo state network is a grid family with a readout trained on cross-entropy (a ridge
# readout is solved in one pass, not stepped: the studies keep it as a reference line, an `esn` run as before);
# each with the reservoir a sweep of its readout chose (docs/runs.md), SHARED_CONFIG's ESN block being the ridge
# readout's. The deep ESN, NVAR and the n-gram have no presets: they are references, not grid families.
_SOFTMAX_RESERVOIR = {"spectral_radius": 0.9, "leak_rate": 1.0, "input_scaling": 12.0}
_MLP_RESERVOIR = {"spectral_radius": 1.0, "leak_rate": 0.9, "input_scaling": 4.4}
_BUILT_IN = [
    Family("esn", lambda v, b, c: ESN(v, b, draw_seed(c)), fit=_ridge_or_sgd,
           variants={"esn+softmax": {"readout": "softmax", **_SOFTMAX_RESERVOIR},
                     "esn+mlp": {"readout": "mlp", **_MLP_RESERVOIR}},
           search=_reservoir_search("ESN"), kind=RESERVOIR, sizes=presets(
        ("units",),  # trained parameters with a softmax readout (with the MLP's 256 hidden units)
        xxs=(500,), xs=(1000,), s=(2000,),  # 45k (169k), 83k (298k), 160k (556k)
        m=(4000,), l=(8000,), xl=(16000,))),  # 314k (1.07M), 622k (2.1M), 1.24M (4.2M)
    Family("deep_esn", lambda v, b, c: DeepESN(v, b, draw_seed(c)), fit=_ridge_or_sgd, variants={},
           search={**_reservoir_search("DEEP_ESN"), "DEEP_ESN.inter_scaling": (LOG, 1e-2, 10.0)}, kind=RESERVOIR),
    Family("linear_reservoir", lambda v, b, c: LinearReservoir(v, b, draw_seed(c)), kind=RESERVOIR,
           added_options={"train_recurrence": False},
           search={"LEARNING_RATE": (LOG, 1e-4, 1e-2), "LINEAR_RESERVOIR.r_min": (FLOAT, 0.0, 0.95),
                   "LINEAR_RESERVOIR.input_scaling": (LOG, 1e-2, 10.0), "WEIGHT_DECAY": (LOG, 1e-4, 0.3)},
           sizes=presets(("units", "embed_dim", "readout_hidden"),
        xxs=(96, 24, 96), xs=(128, 32, 128), s=(192, 48, 256),  # 28k, 50k, 135k
        m=(256, 64, 512), l=(384, 64, 1024), xl=(512, 96, 2048))),  # 341k, 939k, 2.4M
    Family("deep_linear_reservoir", lambda v, b, c: DeepLinearReservoir(v, b, draw_seed(c), c["SEQ_LEN"]),
           kind=FROZEN_TRANSITION,
           added_options={"train_recurrence": False}, search=_gradient_search("DEEP_LINEAR_RESERVOIR"), sizes=presets(
        ("layers", "units", "width", "mix_hidden"),
        xxs=(2, 48, 48, 96), xs=(2, 64, 64, 128), s=(3, 96, 96, 192),  # 56k, 93k, 260k
        m=(4, 128, 128, 256), l=(4, 192, 192, 384), xl=(5, 256, 256, 512))),  # 575k, 1.25M, 2.7M
    Family("nvar", lambda v, b, c: NVAR(v, b, draw_seed(c)), fit=_ridge_or_sgd, variants={}, kind=RESERVOIR, search={
        "NVAR.delays": (INT, 1, 8), "NVAR.input_dim": (INT, 4, 16), "NVAR.ridge": (LOG, 1e-8, 10.0)}),
    Family("frozen_retention", lambda v, b, c: FrozenRetention(v, b, c["SEQ_LEN"]),
           # a trained gate on what enters the frozen state (still a reservoir), and the control that trains what
           # the state forgets (content-dependent decays: no longer a reservoir)
           variants={"frozen_retention": {}, "frozen_retention+write": {"write_gate": True},
                     "frozen_retention+forget": {"forget_gate": True}}, added_options={"forget_gate": False},
           kind={"frozen_retention": FROZEN_TRANSITION, "frozen_retention+write": FROZEN_TRANSITION,
                 "frozen_retention+forget": TRAINED},  # its decays trained: a control, no longer frozen
           search=_gradient_search("FROZEN_RETENTION"), sizes=presets(
        ("layers", "width", "ffn_hidden"),
        xxs=(2, 32, 128), xs=(2, 48, 192), s=(3, 64, 256),  # 28k, 65k, 167k
        m=(4, 96, 384), l=(4, 128, 512), xl=(4, 192, 768))),  # 491k, 868k, 1.94M
    Family("reservoir_attention", lambda v, b, c: ReservoirAttention(v, b, draw_seed(c), c["SEQ_LEN"]),
           variants={"reservoir_attention": {}, "reservoir_attention+write": {"write_gate": True}}, kind=RESERVOIR,
           added_options={"train_recurrence": False, "write_gate": False},
           search=_gradient_search("RESERVOIR_ATTENTION"), sizes=presets(
        ("units", "width", "layers"),
        xxs=(96, 32, 1), xs=(128, 48, 1), s=(192, 64, 2),  # 24k, 51k, 139k
        m=(256, 96, 2), l=(256, 128, 3), xl=(384, 160, 4))),  # 294k, 688k, 1.4M
    Family("transformer", lambda v, b, c: Transformer(v, b, c["SEQ_LEN"]),
           variants={"transformer": {"recipe": "gpt2"}, "transformer++": {"recipe": "++"}},
           # the recipe was GPT-2's before it was a setting: a run recorded then is built as it was
           added_options={"recipe": "gpt2", "rotary": None, "swiglu": None, "rmsnorm": None, "qk_norm": False,
                          "trained": "everything"}, search=_gradient_search("TRANSFORMER"), sizes=presets(
        ("n_layer", "n_embd"),
        xxs=(2, 32), xs=(2, 48), s=(3, 64),  # 27k, 66k, 163k
        m=(4, 96), l=(4, 128), xl=(6, 160))),  # 467k, 820k, 1.86M
    Family("lstm", lambda v, b, c: LSTM(v, b), search=_gradient_search("LSTM"), sizes=presets(
        ("embed_dim", "hidden"),
        xxs=(24, 64), xs=(32, 96), s=(48, 160),  # 28k, 60k, 150k
        m=(64, 256), l=(64, 384), xl=(96, 576))),  # 354k, 726k, 1.6M
    Family("ngram", lambda v, b, c: NGram(v, b), fit="counts", variants={}, search={"NGRAM.order": (INT, 2, 8)}),
]
for _family in _BUILT_IN:
    register(_family)
MODEL_NAMES = tuple(MODELS)  # the built-in models; model_names() adds those the plugins loaded declare


def trainer_of(name: str, config: dict) -> str:
    """How the runner fits model ``name`` under ``config`` (its ``trainer``), known before it is built: counts
    for the n-gram, a closed-form ridge solve for a reservoir whose readout is 'ridge', gradient steps else."""
    return MODELS[name].trainer(config[name.upper()])


def model_names() -> tuple[str, ...]:
    """Every model MODELS may name: the built-in families, then those the plugins loaded declared."""
    return tuple(MODELS)


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


# Options added to a model after runs of it were recorded (each family's added_options), with the value that builds
# the model as it was: a run folder's config.json (read by RESUME, sample.py, compare.py) lacks them.
ADDED_OPTIONS = {family.block: family.added_options for family in MODELS.values() if family.added_options}


def with_added_options(config: dict) -> dict:
    """A recorded config with the options its blocks lack filled as those runs were built (RESUME validates it
    next, which would otherwise fill them with today's defaults: the transformer's recipe is '++' now)."""
    return {key: {**ADDED_OPTIONS[key], **value} if key in ADDED_OPTIONS and isinstance(value, dict) else value
            for key, value in config.items()}


def draws_at_random(name: str, vocab_size: int, config: dict) -> bool:
    """Whether the model's frozen part (its buffers and untrained parameters) is drawn at random: built with two
    DRAW_SEEDs, does any differ? A set transition (frozen retention's decays) or a model with nothing frozen draws
    nothing, and its seeds' spread is all training."""
    import torch

    def frozen(draw: int) -> dict:
        model = build_model(name, vocab_size, {**config, "DRAW_SEED": draw})
        return {**{k: b for k, b in model.named_buffers()},
                **{k: p for k, p in model.named_parameters() if not p.requires_grad}}

    one, two = frozen(1), frozen(2)
    return any(not torch.equal(one[k].to_dense() if one[k].layout != torch.strided else one[k],
                               two[k].to_dense() if two[k].layout != torch.strided else two[k]) for k in one)


def build_model(name: str, vocab_size: int, config: dict) -> LanguageModel:
    """The model ``name`` with hyper-parameters from ``config[name.upper()]``, seeded by SEED."""
    import torch

    torch.manual_seed(config["SEED"])  # trained weights start the same way in every run
    block = name.upper()
    family = MODELS[name]
    model = family.build(vocab_size, {**ADDED_OPTIONS.get(block, {}), **config[block]}, config)
    if family.flops:
        model.declared_flops = dict(family.flops)  # what FLOP counting adds for it (reservoir/run/flops.py)
    return model
