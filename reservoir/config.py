"""The one place for experiment settings.

``SHARED_CONFIG`` is a plain dict: edit it, or override any key on the command
line as ``KEY=VALUE`` (``python TinyStories.py USE_TPU=True BATCH_SIZE=64``).
Values are parsed as Python literals; keys are case-insensitive. Every key is
documented by the comment on its line (``--help`` prints those comments).
"""

from __future__ import annotations

import ast
import copy
import difflib
import io
import math
import tokenize
from pathlib import Path

from reservoir.models.settings import PER_MODEL
from reservoir.platform.messages import OneLineError

SHARED_CONFIG = {
    # --- device -----------------------------------------------------------
    "USE_TPU": False,  # ask for a TPU (torch_xla); falls back to GPU, then CPU, with a warning
    "DEVICE": "auto",  # 'auto' (TPU, CUDA, CPU) | 'tpu' | 'cuda' | 'cpu'; an unavailable explicit choice is an error
    "PRECISION": "auto",  # 'auto' (TPU bf16, CUDA bf16/fp16, CPU fp32) | 'fp32' | 'bf16' | 'fp16' (CUDA only)
    "SEED": 1337,  # seeds every random choice: data order, weights, reservoirs, sampling
    "SEEDS": None,  # train every model once per seed, e.g. SEEDS=1337,1338,1339 (mean ± sd reported); None: SEED
    "DRAW_SEED": None,  # seeds a reservoir's random draw alone (its frozen matrices, eigenvalues); None: each seed
    # --- optimisation -----------------------------------------------------
    "BATCH_SIZE": None,  # sequences per step per device (before the TPU multiplier); None: each model's batch_size
    "LEARNING_RATE": None,  # peak rate of gradient-trained models (before the TPU multiplier); None: each model's
    "SEQ_LEN": 128,  # tokens per training window (each window holds SEQ_LEN + 1 tokens)
    "NUM_WORKERS": 0,  # DataLoader worker processes (forced to 0 on TPU)
    "TPU_BATCH_MULTIPLIER": 2,  # on TPU, BATCH_SIZE is multiplied by this
    "TPU_LR_MULTIPLIER": 1.2,  # on TPU, LEARNING_RATE is multiplied by this
    "TPU_PARALLEL": "single",  # TPU cores: 'single' | 'spmd' (one process, batch sharded over all chips) | 'launch'
    "XLA_CACHE_DIR": None,  # persistent XLA compile cache folder (one sub-folder per process); None: off
    "GRAD_ACCUM": 1,  # micro-batches per optimizer step (effective batch = BATCH_SIZE x GRAD_ACCUM x devices)
    "GRAD_CLIP": 1.0,  # clip the global gradient norm to this (0: no clipping)
    "WEIGHT_DECAY": 0.01,  # AdamW weight decay on matrices (never on biases, norms, embeddings)
    "WARMUP_STEPS": 50,  # linear learning-rate warm-up (cosine: at most a tenth of the budget; wsd: exactly)
    "MIN_LR_FRACTION": 0.1,  # the decay (cosine or cooldown) ends at LEARNING_RATE x this
    "LR_SCHEDULE": "cosine",  # 'cosine' (decay over the budget) | 'wsd' (warm-up, stable, cooldown: branchable)
    "COOLDOWN_FRACTION": 0.2,  # wsd: the last this share of the budget decays the learning rate
    "COOLDOWN_SHAPE": "1-sqrt",  # wsd: the cooldown's shape, '1-sqrt' (Hägele et al. 2024) | 'linear'
    "STABLE_FROM": None,  # wsd: a run folder of a smaller budget whose stable phase each fit continues from
    "ADAM_BETA2": 0.95,  # AdamW's second-moment decay (nanoGPT's Shakespeare-char run uses 0.99)
    "ADAM_BETA2_REF_TOKENS": None,  # tokens per step at which ADAM_BETA2 holds; others: a fixed half-life in tokens
    "GRADIENT_CHECKPOINTING": False,  # recompute activations in backward (less memory, ~30% slower)
    "COMPILE": False,  # torch.compile the training step, the evaluations and the decode step on CPU/CUDA (XLA
    # compiles every step already): its compile is held off the clock; where it wins, see docs/hardware.md
    # --- budget: training of each model stops at whichever comes first ----
    "MAX_STEPS": None,  # optimizer steps per model (None: no step limit)
    "TOKEN_BUDGET": None,  # training tokens per model, all devices together (None: no token limit)
    "TIME_BUDGET_S": None,  # training seconds per model after warm-up (None: none); it moves with the machine's
    # load, so the table marks a fit it ends short of its FLOP budget 'cut'
    "FLOP_BUDGET": 3.125e12,  # training FLOPs per model (products, run/flops.py): load-independent (None: off)
    "EVAL_POINTS": 16,  # evaluations per model, log-spaced over its budget, the last one final (1: final only)
    "EVAL_EVERY": None,  # evaluate every this many steps instead of EVAL_POINTS (and always at the end)
    "LOG_EVERY": 25,  # fetch the loss from the device every this many steps (the only host sync in the loop)
    "CHECKPOINT_EVERY": 500,  # checkpoint every this many steps (and always at the end of each model); 0: end only
    "CHECKPOINT_EVERY_S": 300.0,  # also checkpoint after this many training seconds (a kill loses at most that); 0: off
    "RESUME": None,  # a run folder, or 'latest', to continue: finished models are kept, the interrupted one resumes
    # --- samples ----------------------------------------------------------
    "SAMPLE_PROMPTS": ["Once upon a time", "One day, a little", "Tom and his"],  # one story per prompt per model
    "SAMPLE_TOKENS": 200,  # tokens generated per sample (stops early at end of story)
    "SAMPLE_TEMPERATURE": 0.8,  # sampling temperature (0: greedy)
    "SAMPLE_TOP_K": 40,  # sample among the k likeliest tokens (None: all)
    # --- data -------------------------------------------------------------
    "DATASET": "auto",  # 'auto' (hub, DATA_DIR, else synthetic) | 'tinystories' | 'shakespeare' | 'synthetic' | path
    "DATA_DIR": "data",  # where 'auto' finds TinyStories*.txt, 'shakespeare' input.txt (or shakespeare/); the fetch
    # writes data/tinystories/ (DATASET=data/tinystories) and data/shakespeare/
    "TRAIN_PATH": None,  # explicit training file (overrides DATASET's files); .txt or .jsonl with a 'text' field
    "VAL_PATH": None,  # explicit validation file; None means a held-out tail of the training stories
    "VAL_FRACTION": 0.05,  # share of stories held out for validation when there is no validation file
    "MAX_TRAIN_STORIES": None,  # cap on training stories (None: all), keeps laptop runs small
    "MAX_TRAIN_CHARS": 50_000_000,  # cap on training characters (None: all); the default outlasts a 75 s budget
    "SYNTHETIC_STORIES": 6000,  # stories the built-in synthetic corpus generates (train + validation)
    "CACHE_DIR": "data_cache",  # hub downloads, trained tokenizers and token caches
    "HF_DATASET": "roneneldan/TinyStories",  # what DATASET='tinystories' loads with datasets (a hub name or folder)
    "TOKENIZER": "char",  # 'char' (one token per character) | 'bpe' (byte-level BPE trained on the train split)
    "VOCAB_SIZE": 4096,  # BPE vocabulary size (char vocabularies come from the data)
    "TOKENIZER_TRAIN_CHARS": 20_000_000,  # BPE is trained on the first this many training characters (None: all)
    "EVAL_TOKENS": 32768,  # validation tokens per periodic evaluation, the same for every model and run
    "FINAL_EVAL_TOKENS": 262144,  # validation tokens of each model's final evaluation (None: the whole split)
    "TRAIN_EVAL_TOKENS": 65536,  # training-split tokens the final evaluation also scores (train/val gap), at most
    # as many as it scores of validation; None: off
    "EVAL_MODE": "stream",  # 'stream': state carried, or overlapping windows | 'windows': windows from empty context
    "EVAL_STRIDE": None,  # stream mode: stride of windowed models' overlapping windows (None: SEQ_LEN // 2)
    # --- models: MODELS names them, each has one block of hyper-parameters (override as ESN.units=500)
    # Each family's block (its learning_rate and batch_size too) is its best configuration at the default budget
    # in the frontier study (results/frontier-tinystories, one seed; python scaling.py REPORT=results)
    "MODELS": ["ngram", "esn", "transformer", "lstm", "frozen_retention", "reservoir_attention",
               "deep_linear_reservoir", "linear_reservoir"],  # trained and compared, in order
    "PLUGINS": [],  # your own families: .py files (or modules) that declare them; MODELS may then name them
    # (docs/extending.md)
    "ESN": {"units": 1700, "spectral_radius": 0.3, "leak_rate": 1.0, "input_scaling": 3.0, "degree": 10,
            "rc_connectivity": 0.1, "input_connectivity": 0.1, "bias_scaling": 0.5, "washout": 0,
            "readout": "ridge", "ridge": 0.01, "readout_hidden": 256, "include_input": True,
            "fit_stride": 1, "learning_rate": 3e-3,
            "batch_size": 32},  # echo state network; fit_stride: ridge-fit every n-th state (faster fit)
    "DEEP_ESN": {"units": 500, "layers": 2, "spectral_radius": 0.9, "leak_rate": 0.3, "input_scaling": 1.0,
                 "degree": 10, "rc_connectivity": 0.1, "input_connectivity": 0.1, "bias_scaling": 0.5,
                 "inter_scaling": 0.5, "inter_connectivity": 0.1, "washout": 0, "readout": "ridge", "ridge": 1.0,
                 "readout_hidden": 256, "include_input": True,
                 "learning_rate": 3e-3, "batch_size": 32},  # stacked reservoirs, readout over all layers
    "LINEAR_RESERVOIR": {"units": 256, "r_min": 0.8, "r_max": 0.999, "max_phase": 6.283, "input_scaling": 1.0,
                         "embed_dim": 64, "readout_hidden": 512,
                         "train_recurrence": False,
                         "learning_rate": 6e-3, "batch_size": 8},  # fixed diagonal complex recurrence + MLP readout
    "DEEP_LINEAR_RESERVOIR": {"layers": 3, "units": 96, "width": 96, "mix_hidden": 192, "embed_dim": 64,
                              "taps": 4, "tau_min": 2.0, "tau_max": 1000.0, "max_phase": 3.1416,
                              "dropout": 0.25, "train_recurrence": False, "learning_rate": 6e-3,
                              "batch_size": 16},  # frozen linear recurrences + trained mixing (deep SSM)
    "NVAR": {"delays": 4, "input_dim": 12, "readout": "ridge", "ridge": 1.0, "readout_hidden": 256,
             "include_input": True, "washout": 0,
             "learning_rate": 3e-3, "batch_size": 32},  # delayed inputs + quadratic monomials
    "FROZEN_RETENTION": {"layers": 2, "heads": 4, "width": 48, "ffn_hidden": 192, "tau_min": 2.0,
                         "tau_max": 1000.0, "rotation_base": 10000.0, "dropout": 0.0,
                         "train_recurrence": False, "conv_width": 0,
                         "write_gate": False, "forget_gate": False, "learning_rate": 6e-3,
                         "batch_size": 4},  # RetNet retention, decays and rotations frozen; write_gate: a trained
    # gate on what enters the state (still a reservoir); forget_gate: trained content-dependent decays (not one)
    "RESERVOIR_ATTENTION": {"units": 192, "tau_min": 1.0, "tau_max": 1000.0, "max_phase": 3.1416,
                            "input_scaling": 1.0, "width": 64, "layers": 2, "heads": 4, "dropout": 0.0,
                            "reservoir": True, "train_recurrence": False, "write_gate": False, "learning_rate": 3e-3,
                            "batch_size": 2},  # frozen reservoir states + a trained attention readout
    "TRANSFORMER": {"n_layer": 2, "n_head": 4, "n_embd": 48, "dropout": 0.0, "recipe": "++", "rotary": None,
                    "swiglu": None, "rmsnorm": None,
                    "qk_norm": False, "trained": "everything", "learning_rate": 3e-3,
                    "batch_size": 4},  # recipe 'gpt2' | '++' (rotary, SwiGLU, RMSNorm); None parts: the recipe's;
    # trained 'everything' | 'embeddings' (the random-transformer control: blocks frozen at initialisation)
    "LSTM": {"embed_dim": 48, "hidden": 160, "layers": 1, "dropout": 0.0, "learning_rate": 6e-3,
             "batch_size": 2},  # LSTM baseline
    "NGRAM": {"order": 5, "discount": 0.75, "learning_rate": None,
              "batch_size": 32},  # interpolated absolute-discounting n-gram (discount tuned); counted, no rate
    # --- outputs ----------------------------------------------------------
    "RESULTS_DIR": "results",  # every run writes a new folder under here
    "RUN_NAME": None,  # name of the run folder; None means a timestamp
    "PLOTS": True,  # write the PNG plots at the end of the run (plot_results.py)
    "LOGGERS": [],  # trackers besides the run's own files ('csv', always on): 'tensorboard' (<run>/tb/), 'wandb'
    "WANDB_PROJECT": "reservoir-nlp",  # W&B project of LOGGERS=['wandb'] (WANDB_MODE=offline logs locally)
}

# Validation rules for values whose type alone does not say what is allowed.
# A rule is (predicate, description of what is allowed).
_CHOICES = {
    "DEVICE": ("auto", "tpu", "cuda", "cpu"),
    "PRECISION": ("auto", "fp32", "bf16", "fp16"),
    "TOKENIZER": ("char", "bpe"),
    "TPU_PARALLEL": ("single", "spmd", "launch"),
    "EVAL_MODE": ("stream", "windows"),
    "LR_SCHEDULE": ("cosine", "wsd"),
    "COOLDOWN_SHAPE": ("1-sqrt", "linear"),
}
_POSITIVE = {"BATCH_SIZE", "LEARNING_RATE", "SEQ_LEN", "TPU_BATCH_MULTIPLIER", "TPU_LR_MULTIPLIER",
             "MAX_TRAIN_STORIES", "MAX_TRAIN_CHARS", "SYNTHETIC_STORIES", "TOKENIZER_TRAIN_CHARS", "VOCAB_SIZE",
             "EVAL_TOKENS", "FINAL_EVAL_TOKENS", "TRAIN_EVAL_TOKENS", "EVAL_STRIDE",
             "GRAD_ACCUM", "MAX_STEPS", "TOKEN_BUDGET", "TIME_BUDGET_S", "EVAL_EVERY", "LOG_EVERY",
             "FLOP_BUDGET", "EVAL_POINTS", "ADAM_BETA2_REF_TOKENS",
             "SAMPLE_TOP_K"}
_NON_NEGATIVE = {"NUM_WORKERS", "SEED", "DRAW_SEED", "GRAD_CLIP", "WEIGHT_DECAY", "WARMUP_STEPS",
                 "CHECKPOINT_EVERY", "CHECKPOINT_EVERY_S", "SAMPLE_TOKENS", "SAMPLE_TEMPERATURE"}
_LOGGERS = ("csv", "tensorboard", "wandb")
_FRACTION = {"VAL_FRACTION", "COOLDOWN_FRACTION", "ADAM_BETA2"}  # strictly between 0 and 1
_UNIT_INTERVAL = {"MIN_LR_FRACTION"}  # 0 to 1 inclusive
# Rules inside the per-model blocks, by hyper-parameter name.
_BLOCK_CHOICES = {"readout": ("ridge", "softmax", "mlp"), "recipe": ("gpt2", "++"),
                  "trained": ("everything", "embeddings")}
_BLOCK_SWITCHES = {"rotary", "swiglu", "rmsnorm"}  # True, False, or None: as the block's recipe says
_BLOCK_UNIT_INTERVAL = {"leak_rate", "rc_connectivity", "input_connectivity", "inter_connectivity", "dropout",
                        "r_min", "r_max", "discount"}
_BLOCK_OPTIONAL = {"learning_rate": float, "batch_size": int}  # None: the run's LEARNING_RATE / BATCH_SIZE
_BLOCK_MAY_BE_ZERO = {"degree", "washout", "dropout", "ridge", "bias_scaling", "max_phase", "conv_width"}
# Keys whose value may be None, with the type they take otherwise.
_OPTIONAL = {"BATCH_SIZE": int, "LEARNING_RATE": float, "RUN_NAME": str, "TRAIN_PATH": str, "VAL_PATH": str,
             "MAX_TRAIN_STORIES": int, "MAX_TRAIN_CHARS": int,
             "MAX_STEPS": int, "TOKEN_BUDGET": int, "TIME_BUDGET_S": float, "RESUME": str, "SAMPLE_TOP_K": int,
             "XLA_CACHE_DIR": str, "FINAL_EVAL_TOKENS": int, "TRAIN_EVAL_TOKENS": int, "EVAL_STRIDE": int,
             "EVAL_EVERY": int,
             "FLOP_BUDGET": float, "SEEDS": list, "TOKENIZER_TRAIN_CHARS": int, "STABLE_FROM": str,
             "ADAM_BETA2_REF_TOKENS": int, "DRAW_SEED": int}


# Keys added after runs began to record their configs: RESUME fills them into an older run's settings from
# their defaults, which train as those runs trained (cosine, β2 0.95; tested; TRAIN_EVAL_TOKENS only adds a
# score); any other key a saved run lacks is damage, refused.
ADDED_KEYS = ("PLUGINS", "LR_SCHEDULE", "COOLDOWN_FRACTION", "COOLDOWN_SHAPE", "STABLE_FROM", "ADAM_BETA2",
              "ADAM_BETA2_REF_TOKENS", "FROZEN_RETENTION", "RESERVOIR_ATTENTION", "TRAIN_EVAL_TOKENS", "COMPILE",
              "DRAW_SEED")


def recorded_keys_missing(saved: dict) -> list[str]:
    """Keys a saved run's requested config must hold and does not: every key of SHARED_CONFIG but those
    added since (ADDED_KEYS) and the blocks of models it does not train."""
    models = {str(m).upper() for m in saved.get("MODELS") or []}
    return [k for k in SHARED_CONFIG if k not in saved and k not in ADDED_KEYS
            and not (isinstance(SHARED_CONFIG[k], dict) and k not in models)]


class ConfigError(OneLineError, ValueError):
    """A user mistake in the configuration: reported as one line, no traceback."""


_RIDGE_READOUT = {
    "readout": "'ridge' (closed form), 'softmax' or 'mlp' (trained by AdamW on cross-entropy)",
    "ridge": "the ridge readout's L2 penalty", "readout_hidden": "the 'mlp' readout's hidden units",
    "include_input": "the readout also sees the current token (one-hot)",
    "washout": "states discarded at the start of the ridge fit (the reservoir forgetting its zero start)",
}
_RATE_AND_BATCH = {"learning_rate": "AdamW's peak rate for this model (LEARNING_RATE=None: this one)",
                   "batch_size": "sequences a step for this model (BATCH_SIZE=None: this one)"}
_ESN_INPUT = {
    "spectral_radius": "the recurrent matrix's largest |eigenvalue| (under 1: the echo state property)",
    "leak_rate": "the share of the new state each step takes (1: no leak)",
    "input_scaling": "the input weights' scale", "degree": "recurrent connections per unit (0: rc_connectivity)",
    "rc_connectivity": "the recurrent matrix's density where degree is 0",
    "input_connectivity": "the input matrix's density", "bias_scaling": "the fixed bias' scale",
}
_DECAYS = {"tau_min": "the shortest memory (steps) of the frozen decays, spaced log-uniformly up to tau_max",
           "tau_max": "the longest memory (steps) of the frozen decays",
           "max_phase": "the frozen rotations' phases are uniform in [0, max_phase]",
           "train_recurrence": "True: the decays and rotations are trained too (a control: no longer frozen)"}
# one line for every setting of a built-in block, shown by --help beside its block (a plugin declares its own)
SETTING_COMMENTS = {
    "ESN": {"units": "reservoir units", **_ESN_INPUT, **_RIDGE_READOUT,
            "fit_stride": "the ridge fit reads every n-th state (a faster fit)", **_RATE_AND_BATCH},
    "DEEP_ESN": {"units": "units per reservoir layer", "layers": "reservoirs stacked, each reading the one below",
                 **_ESN_INPUT, "inter_scaling": "the scale of each layer's input from the layer below",
                 "inter_connectivity": "the density of the layer-to-layer weights", **_RIDGE_READOUT,
                 **_RATE_AND_BATCH},
    "LINEAR_RESERVOIR": {"units": "complex diagonal recurrences (frozen)",
                         "r_min": "the recurrences' smallest |eigenvalue| (the shortest memory)",
                         "r_max": "their largest |eigenvalue| (the longest memory)",
                         "max_phase": _DECAYS["max_phase"], "input_scaling": "the input projection's scale",
                         "embed_dim": "the trained token embedding's width",
                         "readout_hidden": "the MLP readout's units",
                         "train_recurrence": _DECAYS["train_recurrence"], **_RATE_AND_BATCH},
    "DEEP_LINEAR_RESERVOIR": {"layers": "layers of frozen recurrences with trained mixing between them",
                              "units": "frozen diagonal recurrences per layer", "width": "each layer's trained width",
                              "mix_hidden": "the hidden units of each layer's trained mixing MLP",
                              "embed_dim": "the trained token embedding's width",
                              "taps": "the last tokens the input sees explicitly (NVAR-style delays)", **_DECAYS,
                              "dropout": "dropout in the trained mixing", **_RATE_AND_BATCH},
    "NVAR": {"delays": "the last inputs concatenated (Gauthier et al. 2021)",
             "input_dim": "each input's width (a fixed random projection of the token)", **_RIDGE_READOUT,
             **_RATE_AND_BATCH},
    "FROZEN_RETENTION": {"layers": "retention layers", "heads": "retention heads per layer",
                         "width": "the model width", "ffn_hidden": "the feed-forward's hidden units",
                         "tau_min": _DECAYS["tau_min"], "tau_max": _DECAYS["tau_max"],
                         "rotation_base": "the base of the frozen rotations' angles (as RoPE's)",
                         "dropout": "the dropout rate (0: none)", "train_recurrence": _DECAYS["train_recurrence"],
                         "conv_width": "a trained causal convolution over the last inputs feeding q, k, v (0: none)",
                         "write_gate": "a trained gate on what enters the state (the transition stays frozen)",
                         "forget_gate": "trained content-dependent decays (the transition is then trained)",
                         **_RATE_AND_BATCH},
    "RESERVOIR_ATTENTION": {"units": "frozen reservoir units whose states the readout attends over",
                            **{k: _DECAYS[k] for k in ("tau_min", "tau_max", "max_phase")},
                            "input_scaling": "the frozen input projection's scale",
                            "width": "the trained attention readout's width", "layers": "attention readout layers",
                            "heads": "attention heads", "dropout": "dropout in the readout",
                            "reservoir": "False: the same readout over the inputs alone (the no-recurrence control)",
                            "train_recurrence": _DECAYS["train_recurrence"],
                            "write_gate": "a trained gate on what enters the reservoir (its transition stays frozen)",
                            **_RATE_AND_BATCH},
    "TRANSFORMER": {"n_layer": "transformer blocks", "n_head": "attention heads", "n_embd": "the model width",
                    "dropout": "the dropout rate (0: none)",
                    "recipe": "'gpt2' (learned positions, GELU, LayerNorm) | '++' (rotary, SwiGLU, RMSNorm)",
                    "rotary": "rotary positions (None: the recipe's)",
                    "swiglu": "a SwiGLU feed-forward (None: the recipe's)",
                    "rmsnorm": "RMSNorm instead of LayerNorm (None: the recipe's)",
                    "qk_norm": "normalise queries and keys before attention",
                    "trained": "'everything' | 'embeddings' (the random-transformer control)", **_RATE_AND_BATCH},
    "LSTM": {"embed_dim": "the token embedding's width", "hidden": "hidden units per layer", "layers": "LSTM layers",
             "dropout": "dropout between layers", **_RATE_AND_BATCH},
    "NGRAM": {"order": "the longest context counted, in tokens (5: four tokens of context)",
              "discount": "the absolute discount subtracted from each count", "learning_rate": "unused (counted)",
              "batch_size": "sequences a step where the run's shapes need one (counting reads every token)"},
}


def default_config() -> dict:
    return copy.deepcopy(SHARED_CONFIG)


def key_comments() -> dict[str, str]:
    """The comment written next to each key of SHARED_CONFIG in this file (shown by --help)."""
    source = Path(__file__).read_text(encoding="utf-8")
    block = next(node for node in ast.parse(source).body
                 if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "SHARED_CONFIG")
    key_on_line = {line: k.value for k, v in zip(block.value.keys, block.value.values, strict=True)
                   for line in range(k.lineno, v.end_lineno + 1)}  # a block's comment may close its last line
    comments: dict[str, str] = {}
    last = None  # (the key whose comment the line before ends, that line)
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type != tokenize.COMMENT:
            continue
        text, line = tok.string.lstrip("# ").strip(), tok.start[0]
        if line in key_on_line:
            comments[key_on_line[line]], last = text, (key_on_line[line], line)
        elif last and line == last[1] + 1 and not text.startswith("---"):  # the comment goes on, a line of its own
            comments[last[0]], last = f"{comments[last[0]]} {text}", (last[0], line)
    return {**comments, **{block: family.comment or f"{family.name} (from {family.source})"
                           for block, family in _PLUGIN_FAMILIES.items()}}


def help_text(config: dict | None = None) -> str:
    config = SHARED_CONFIG if config is None else config
    comments = key_comments()
    width = max(len(k) for k in config)
    lines = ["Usage: python TinyStories.py [KEY=VALUE ...]   (keys are case-insensitive)", "",
             "Values are Python literals or plain words. Lists: comma-separated words need no quotes,",
             "a Python list must be quoted for the shell:",
             "  python TinyStories.py MODELS=esn,lstm LOGGERS=tensorboard",
             "  python TinyStories.py \"MODELS=['esn', 'lstm']\" \"SAMPLE_PROMPTS=['Once upon a time']\"",
             "  python TinyStories.py ESN.units=500 TRANSFORMER.n_layer=2     # one hyper-parameter of a block",
             ""]
    for key, value in config.items():
        lines.append(f"  {key:<{width}}  default {value!r}")
        if comments.get(key):
            lines.append(f"  {'':<{width}}    {comments[key]}")
        settings = ({k: comment for k, (_, comment) in _PLUGIN_FAMILIES[key].settings.items()}
                    if key in _PLUGIN_FAMILIES else SETTING_COMMENTS.get(key, {}))
        for setting, comment in settings.items():
            lines.append(f"  {'':<{width}}    {key}.{setting}: {comment}")
    families = study_families()
    lines += ["", "Study families (python scaling.py FAMILIES=...), each a model with its options set:"]
    wide = max(width, *map(len, families))
    lines += [f"  {family:<{wide}}  {as_run}" for family, as_run in families.items()]
    return "\n".join(lines)


def study_families() -> dict[str, str]:
    """{study family: the settings a run names it by} ('frozen_retention+write': 'MODELS=frozen_retention
    FROZEN_RETENTION.write_gate=True'), for every family a study's FAMILIES may name."""
    import reservoir.models  # noqa: F401 - the built-in families registered
    from reservoir.models.registry import STUDY_FAMILIES

    out = {}
    for family, (model, options) in STUDY_FAMILIES.items():
        block = [f"{model.upper()}.{k}={v!r}" if isinstance(v, str) else f"{model.upper()}.{k}={v}"
                 for k, v in options.items()]
        out[family] = " ".join([f"MODELS={model}", *block])
    return out


def _closest_key(name: str, keys) -> str:
    match = difflib.get_close_matches(name.upper(), list(keys), n=1, cutoff=0.4)
    return f"; did you mean {match[0]}?" if match else f"; valid keys: {', '.join(keys)}"


def parse_literal(text: str):
    """Python literal if it parses as one, else the raw string (so DEVICE=cpu works unquoted)."""
    lowered = text.strip().lower()
    if lowered in ("true", "yes", "on"):
        return True
    if lowered in ("false", "no", "off"):
        return False
    if lowered in ("none", "null"):
        return None
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def is_number(value) -> bool:
    """A finite int or float, not a bool (1e400 is read as infinity, nan as not a number: neither is one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def is_integer(value) -> bool:
    """A number with no fractional part (3 or 3.0; not 3.5, True, or 1e400)."""
    return is_number(value) and int(value) == value


def _coerce(key: str, value, default):
    """Return ``value`` with the type of ``default``, or raise ConfigError saying what is allowed."""
    if value is None and (default is None or key in _OPTIONAL):
        return None
    expected = _OPTIONAL.get(key, type(default))
    if expected is bool:
        if isinstance(value, bool):
            return value
        if value in (0, 1):
            return bool(value)
        raise ConfigError(f"{key} must be True or False, got {value!r}")
    if expected is int:
        if not is_integer(value):
            raise ConfigError(f"{key} must be an integer, got {value!r}")
        return int(value)
    if expected is float:
        if not is_number(value):
            raise ConfigError(f"{key} must be a finite number, got {value!r}")
        return float(value)
    if expected is str:
        if not isinstance(value, str):
            raise ConfigError(f"{key} must be a string, got {value!r}")
        return value
    if expected in (list, tuple):
        if isinstance(value, str):
            value = [v.strip() for v in value.split(",") if v.strip()]
        elif isinstance(value, int) and not isinstance(value, bool):  # SEEDS=1337: a list of one
            value = [value]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key} must be a list, got {value!r}")
        return expected(value)
    if expected is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{key} must be a dict, got {value!r}")
        return value
    return value


_PLUGIN_FAMILIES: dict = {}  # a plugin family's settings block -> its declaration (registry.Family)


def load_plugins(plugins) -> list[str]:
    """Import the PLUGINS a config names (reservoir/models/registry.py) and add each family they declare to
    SHARED_CONFIG as a settings block, so MODELS, NAME.setting=..., --help and validation know it. Returns them
    as a list (``PLUGINS=a.py,b.py`` is two)."""
    if not plugins:  # a run recorded before PLUGINS existed has None
        return []
    plugins = list(_coerce("PLUGINS", parse_literal(plugins) if isinstance(plugins, str) else plugins, []))
    from reservoir.models.registry import MODELS, PluginError  # torch only for a run that names a plugin
    from reservoir.models.registry import load_plugins as import_plugins

    try:
        import_plugins(plugins)
    except PluginError as e:
        raise ConfigError(str(e)) from None
    for family in MODELS.values():
        if family.settings is None or family.block in _PLUGIN_FAMILIES:
            continue
        if family.block in SHARED_CONFIG:
            raise ConfigError(f"plugin {family.source}: family {family.name!r} would take the settings block "
                              f"{family.block}, which is a run setting already: give the family another name")
        SHARED_CONFIG[family.block] = {k: declared[0] for k, declared in family.settings.items()}
        _PLUGIN_FAMILIES[family.block] = family
    return plugins


def _plugin_checks(config: dict) -> None:
    """A plugin family's own check of its block (settings that cannot build together), as one line."""
    for name in config["MODELS"]:
        family = _PLUGIN_FAMILIES.get(str(name).upper())
        refusal = family and family.check and family.check(config[family.block])
        if refusal:
            raise ConfigError(f"{family.block}: {refusal}")


def model_blocks() -> list[str]:
    return [k for k, v in SHARED_CONFIG.items() if isinstance(v, dict)]


def _validate_block(block: str, values: dict) -> dict:
    defaults = SHARED_CONFIG[block]
    checked = {}
    for name, value in values.items():
        if name not in defaults:
            match = difflib.get_close_matches(name, list(defaults), n=1, cutoff=0.4)
            hint = f"; did you mean {block}.{match[0]}?" if match else f"; valid: {', '.join(defaults)}"
            raise ConfigError(f"unknown hyper-parameter {block}.{name}{hint}")
        label = f"{block}.{name}"
        if name in _BLOCK_OPTIONAL and value is None:  # the run's LEARNING_RATE / BATCH_SIZE
            checked[name] = None
            continue
        value = _coerce(label, value, _BLOCK_OPTIONAL[name](1) if name in _BLOCK_OPTIONAL else defaults[name])
        if name in _BLOCK_SWITCHES and value not in (None, True, False):
            raise ConfigError(f"{label} must be True, False or None (None: as {block}.recipe says), got {value!r}")
        if name in _BLOCK_CHOICES and value not in _BLOCK_CHOICES[name]:
            raise ConfigError(f"{label} must be one of {' | '.join(map(repr, _BLOCK_CHOICES[name]))}, got {value!r}")
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            if name in _BLOCK_UNIT_INTERVAL and not 0 <= value <= 1:
                raise ConfigError(f"{label} must be between 0 and 1, got {value!r}")
            if value < 0 or (value == 0 and name not in _BLOCK_MAY_BE_ZERO):
                raise ConfigError(f"{label} must be {'>= 0' if name in _BLOCK_MAY_BE_ZERO else '> 0'}, got {value!r}")
        checked[name] = value
    return {**copy.deepcopy(defaults), **checked}


def _check_model_blocks(config: dict) -> None:
    """Settings that are each valid but cannot build together: refused before any folder exists."""
    transformer = config["TRANSFORMER"]
    if transformer["n_embd"] % transformer["n_head"]:
        raise ConfigError(f"TRANSFORMER.n_embd={transformer['n_embd']} must be divisible by "
                          f"TRANSFORMER.n_head={transformer['n_head']}")
    rotary = transformer["recipe"] == "++" if transformer["rotary"] is None else transformer["rotary"]
    if rotary and (transformer["n_embd"] // transformer["n_head"]) % 2:
        raise ConfigError(f"rotary positions turn pairs of channels: TRANSFORMER.n_embd={transformer['n_embd']} "
                          f"must split into TRANSFORMER.n_head={transformer['n_head']} heads of an even size")
    ring = config["LINEAR_RESERVOIR"]
    if ring["r_min"] > ring["r_max"] or ring["r_max"] >= 1:
        raise ConfigError(f"LINEAR_RESERVOIR needs r_min <= r_max < 1 (a stable recurrence), got "
                          f"r_min={ring['r_min']}, r_max={ring['r_max']}")
    for block in ("DEEP_LINEAR_RESERVOIR", "FROZEN_RETENTION", "RESERVOIR_ATTENTION"):
        deep = config[block]
        if deep["tau_min"] > deep["tau_max"]:
            raise ConfigError(f"{block} needs tau_min <= tau_max (time constants in characters), got "
                              f"tau_min={deep['tau_min']}, tau_max={deep['tau_max']}")
    readout = config["RESERVOIR_ATTENTION"]
    if readout["width"] % readout["heads"]:
        raise ConfigError(f"RESERVOIR_ATTENTION.width={readout['width']} must be divisible by "
                          f"RESERVOIR_ATTENTION.heads={readout['heads']}")
    retention = config["FROZEN_RETENTION"]
    if retention["width"] % retention["heads"] or (retention["width"] // retention["heads"]) % 2:
        raise ConfigError(f"FROZEN_RETENTION.width={retention['width']} must split into "
                          f"FROZEN_RETENTION.heads={retention['heads']} heads of an even size")


def validate(config: dict) -> dict:
    """Check every key and value; return the config with values coerced to their types."""
    load_plugins(config.get("PLUGINS"))
    checked = {}
    for key, value in config.items():
        if key not in SHARED_CONFIG:
            raise ConfigError(f"unknown config key {key}{_closest_key(key, SHARED_CONFIG)}")
        value = _coerce(key, value, SHARED_CONFIG[key])
        if key in _CHOICES and value not in _CHOICES[key]:
            allowed = " | ".join(repr(c) for c in _CHOICES[key])
            raise ConfigError(f"{key} must be one of {allowed}, got {value!r}")
        if value is None:
            checked[key] = value
            continue
        if isinstance(SHARED_CONFIG[key], dict):
            checked[key] = _validate_block(key, value)
            continue
        if key in _POSITIVE and not value > 0:
            raise ConfigError(f"{key} must be > 0, got {value!r}")
        if key in _NON_NEGATIVE and value < 0:
            raise ConfigError(f"{key} must be >= 0, got {value!r}")
        if key in _FRACTION and not 0 < value < 1:
            raise ConfigError(f"{key} must be between 0 and 1 (exclusive), got {value!r}")
        if key in _UNIT_INTERVAL and not 0 <= value <= 1:
            raise ConfigError(f"{key} must be between 0 and 1, got {value!r}")
        checked[key] = value
    for key in SHARED_CONFIG:
        checked.setdefault(key, copy.deepcopy(SHARED_CONFIG[key]))
    known_models = [b.lower() for b in model_blocks()]
    for name in checked["MODELS"]:
        if name not in known_models:
            match = difflib.get_close_matches(str(name), known_models, n=1, cutoff=0.4)
            hint = f"; did you mean {match[0]}?" if match else ""
            families = study_families()  # an error's path: the registry only now
            if name in families:  # a study's family: a model with its options set
                hint = f" (a study's family: a run names it as {families[name]})"
            raise ConfigError(f"unknown model {name!r} in MODELS{hint} (models: {', '.join(known_models)})")
    if not checked["MODELS"]:
        raise ConfigError("MODELS is empty; name at least one model, e.g. MODELS=esn,transformer")
    unknown = [name for name in checked["LOGGERS"] if name not in _LOGGERS]
    if unknown:
        raise ConfigError(f"unknown logger {unknown[0]!r} in LOGGERS (loggers: {', '.join(_LOGGERS)}), "
                          "e.g. LOGGERS=tensorboard,wandb")
    if checked["SEEDS"] is not None:
        checked["SEEDS"] = _seeds(checked["SEEDS"])
    if not checked["SAMPLE_PROMPTS"] or not all(isinstance(p, str) and p for p in checked["SAMPLE_PROMPTS"]):
        raise ConfigError("SAMPLE_PROMPTS must be a list of non-empty strings, "
                          "e.g. SAMPLE_PROMPTS=['Once upon a time']")
    name = checked["RUN_NAME"]
    if name is not None and (not name.strip() or name in (".", "..") or any(c in name for c in "/\\\0")):
        raise ConfigError(f"RUN_NAME must be a plain folder name (no '/', '\\', '.' or '..'), got {name!r}; "
                          "the run folder is always RESULTS_DIR/RUN_NAME")
    _check_model_blocks(checked)
    _plugin_checks(checked)
    for key, own in PER_MODEL.items():  # None: each model's own, which every model of the run must then have
        counted = ("ngram",) if own == "learning_rate" else ()  # the n-gram counts: it has no rate
        lacking = [m for m in checked["MODELS"] if checked[key] is None and m not in counted
                   and (checked.get(str(m).upper()) or {}).get(own) is None]
        if lacking:
            block = str(lacking[0]).upper()
            raise ConfigError(f"{key}=None means each model's own {block}.{own}, and {block}.{own} is None too: set "
                              f"{block}.{own}=..., or {key}=... for every model")
    if checked["TOKENIZER"] == "bpe":  # the vocabulary is known now; a char vocabulary once the data is read
        from reservoir.models import ModelSettingsError, check_vocabulary  # here: configs alone needs no torch

        try:
            check_vocabulary(checked, checked["VOCAB_SIZE"])
        except ModelSettingsError as e:
            raise ConfigError(str(e)) from None
    budgets = ("MAX_STEPS", "TOKEN_BUDGET", "TIME_BUDGET_S", "FLOP_BUDGET")
    if not checked["RESUME"] and not any(checked[k] for k in budgets):  # a resumed run keeps its own budget
        raise ConfigError("no training budget: set at least one of MAX_STEPS, TOKEN_BUDGET, TIME_BUDGET_S, "
                          "FLOP_BUDGET")
    if checked["LR_SCHEDULE"] == "wsd" and not any(checked[k] for k in ("MAX_STEPS", "TOKEN_BUDGET", "FLOP_BUDGET")) \
            and not checked["RESUME"]:
        raise ConfigError("LR_SCHEDULE='wsd' places its cooldown by steps, tokens or FLOPs, not seconds: set "
                          "FLOP_BUDGET, MAX_STEPS or TOKEN_BUDGET")
    if checked["STABLE_FROM"] and checked["LR_SCHEDULE"] != "wsd":
        raise ConfigError("STABLE_FROM continues a wsd run's stable phase: set LR_SCHEDULE='wsd' too")
    if checked["USE_TPU"] and checked["DEVICE"] in ("cuda", "cpu"):
        raise ConfigError(f"USE_TPU=True contradicts DEVICE={checked['DEVICE']!r}; set one of them")
    return checked


def _seeds(value: list) -> list[int]:
    seeds = []
    for item in value:
        number = parse_literal(item) if isinstance(item, str) else item
        if isinstance(number, bool) or not isinstance(number, int) or number < 0:
            raise ConfigError(f"SEEDS must be non-negative integers, got {item!r}; e.g. SEEDS=1337,1338,1339")
        seeds.append(number)
    if not seeds or len(set(seeds)) != len(seeds):
        raise ConfigError(f"SEEDS must name at least one seed, each once, got {value!r}; e.g. SEEDS=1337,1338,1339")
    return seeds


def key_value(arg: str) -> tuple[str, str | None, str] | None:
    """``KEY=VALUE`` or ``BLOCK.sub=VALUE`` as (KEY upper-cased, sub lower-cased or None, VALUE as written);
    None for an argument with no '='. Every root script reads its arguments through this."""
    name, eq, text = arg.partition("=")
    if not eq:
        return None
    key, dot, sub = name.strip().partition(".")
    return key.strip().upper(), sub.strip().lower() if dot else None, text


def split_arguments(args: list[str], keys) -> tuple[dict[str, str], list[str]]:
    """A script's own ``KEY=VALUE`` arguments (KEY one of ``keys``) as {KEY: VALUE text}, and every other
    argument in its order: the TinyStories.py settings or positional arguments the script handles apart."""
    own, rest = {}, []
    for arg in args:
        parsed = key_value(arg)
        if parsed is not None and parsed[1] is None and parsed[0] in keys:
            own[parsed[0]] = parsed[2].strip()
        else:
            rest.append(arg)
    return own, rest


def parse_options(args: list[str], keys, text_keys=()) -> dict:
    """A script's ``KEY=VALUE`` options -> {KEY: value}: keys case-insensitive, values Python literals
    (``parse_literal``) except those of ``text_keys``, kept as written (paths, prompts, names). Anything
    that is not KEY=VALUE with one of ``keys`` is a ConfigError that lists them."""
    options = {}
    for arg in args:
        parsed = key_value(arg)
        if parsed is None or parsed[1] is not None or parsed[0] not in keys:
            raise ConfigError(f"{arg!r} is not one of {', '.join(keys)} as KEY=VALUE")
        key, _, text = parsed
        options[key] = text if key in text_keys else parse_literal(text)
    return options


def wants_help(argv: list[str]) -> bool:
    return any(a.upper().replace(" ", "") in ("-H", "--HELP", "HELP=1", "HELP=TRUE") for a in argv)


def parse_overrides(args: list[str], base: dict | None = None) -> dict:
    """Apply ``KEY=VALUE`` arguments to ``base`` (default SHARED_CONFIG) and validate the result."""
    config = default_config() if base is None else copy.deepcopy(base)
    load_plugins(named_plugins(args, config.get("PLUGINS")))  # their blocks, before any of their settings is set
    for arg in args:
        parsed = key_value(arg)
        if parsed is None:
            raise ConfigError(f"argument {arg!r} is not KEY=VALUE (try --help for the list of keys)")
        key, sub, text = parsed
        if key not in SHARED_CONFIG:
            raise ConfigError(f"unknown config key {arg.partition('=')[0].strip()}{_closest_key(key, SHARED_CONFIG)}")
        if sub is not None:
            if not isinstance(SHARED_CONFIG[key], dict):
                raise ConfigError(f"{key} has no sub-keys; write {key}=VALUE")
            config[key] = {**config.get(key, SHARED_CONFIG[key]), sub: parse_literal(text)}  # a plugin's: new
        else:
            config[key] = parse_literal(text)
    return validate(config)


def named_plugins(args: list[str], otherwise):
    """What the last PLUGINS=... of a command line names, else ``otherwise``."""
    named = [parsed for parsed in map(key_value, args) if parsed and parsed[:2] == ("PLUGINS", None)]
    return parse_literal(named[-1][2]) if named else otherwise


def given_settings(args: list[str]) -> list[str]:
    """The settings a command line names, in its order, as ``KEY`` or ``BLOCK.sub`` (``ESN.units``):
    what RESUME compares with the saved run. Call it on arguments ``parse_overrides`` accepted."""
    named = {}
    for key, sub, _ in filter(None, map(key_value, args)):
        named[key if sub is None else f"{key}.{sub}"] = True
    return list(named)


def config_from_argv(argv: list[str]) -> dict:
    """The validated config for a command line; prints help or a one-line error and exits."""
    if wants_help(argv):
        try:
            load_plugins(named_plugins(argv, []))  # their families' settings too
        except ConfigError as e:
            raise SystemExit(f"error: {e}") from None
        print(help_text())
        raise SystemExit(0)
    try:
        return parse_overrides(argv)
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
