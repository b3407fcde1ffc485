"""A frontier study's vocabulary and grid: the families, their size presets, the study's keys and
defaults, the stages' runs (references, controls), and the grid parsed from a command line.

A cell is one family at one size preset, learning rate and batch size; ``Cell.settings()`` is what
TinyStories.py is given for it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from reservoir.models.registry import (  # noqa: F401 - PRESETS: the studies' too
    FROZEN_TRANSITION,
    MODELS,
    PRESETS,
    RESERVOIR,
    STUDY_FAMILIES,
    class_of,
)
from reservoir.platform.files import portable_path, portable_paths_in
from reservoir.platform.messages import OneLineError
from reservoir.studies.budgets import positive_numbers

# stages after the grid's: a running study may add them
STAGE_KEYS = ("LEAD_BUDGET", "LEADERS", "REFERENCES", "CONTROLS", "CONTEXTS", "EDGES", "HELD", "DRAWS")
LATER_STAGES = ("held",)  # stages a study file names only once asked for: the studies recorded before them unchanged


FRONTIER_KEYS = ("FAMILIES", "SIZES", "LEARNING_RATES", "BATCH_SIZES", "KEEP", "WITHIN", "ENVELOPE_SEEDS",
                 "MIN_STEPS", "MAX_TOKENS_PER_PARAM", "WORKERS", "DEVICES_PER_POINT", "POINTS_PER_DEVICE",
                 "STUDY_STORAGE", "HEARTBEAT",
                 "PLAN", "HOSTS", "REPLAY", *STAGE_KEYS)


class _SizesOfModels(Mapping):
    """model -> its size presets, as its family declares them (reservoir/models: built in, or a plugin's)."""

    def __getitem__(self, model: str) -> dict:
        return MODELS[model].sizes

    def __iter__(self):
        return (model for model, family in MODELS.items() if family.sizes)

    def __len__(self) -> int:
        return sum(1 for _ in self)


# family -> (model, the options that make it that family): the transformer in GPT-2's recipe and in
# Transformer++'s, the LSTM, the reservoirs, and any family a plugin declares (reservoir/models/registry.py)
FAMILIES = STUDY_FAMILIES
SIZES = _SizesOfModels()


DEFAULTS = {"FAMILIES": ["transformer", "transformer++", "lstm", "frozen_retention", "reservoir_attention",
                         "deep_linear_reservoir", "linear_reservoir"],
            "SIZES": ["xs", "s", "m", "l"], "LEARNING_RATES": [1.5e-3, 3e-3, 6e-3, 1.2e-2], "BATCH_SIZES": [8, 16],
            "KEEP": 3, "WITHIN": 0.03, "ENVELOPE_SEEDS": 3, "MIN_STEPS": 300, "MAX_TOKENS_PER_PARAM": 300,
            "WORKERS": "auto", "DEVICES_PER_POINT": 1, "POINTS_PER_DEVICE": "auto", "REPLAY": False}
# WORKERS='auto': one point per device (platform/device.py study_slots): per core on a CPU (two one-thread points
# beat one two-thread point on 2 cores, bench/README.md), per GPU, per TPU chip; DEVICES_PER_POINT: the devices
# (cores, GPUs, chips) one point takes; POINTS_PER_DEVICE: points that share each device at once (a small point leaves
# most of a GPU idle): K processes on a GPU, K points folded into one process on a CPU core or a TPU chip
# (studies/frontier/folding.py); 'auto': what each device's measurement says (platform/device.py AUTO_FOLD), 'probe':
# on a CPU core as many as a short probe of each family, size and batch finds faster; REPLAY=True: points recorded on
# another machine trained again here where a stage needs their checkpoints (the paired comparisons, CONTEXTS)


DEFAULT_BUDGETS = (5e11, 1.25e12, 3.125e12, 7.8125e12, 1.953125e13)  # x2.5 apart


RUN_SETTINGS = {  # what every point sets unless the command line says otherwise
    "LR_SCHEDULE": "wsd",  # budgets branch off one stable phase
    "TIME_BUDGET_S": None,  # compute alone ends every fit: points do not depend on the machine's load
    "PLOTS": False,
    "EVAL_POINTS": 4,
}


OWN_SETTINGS = ("MODELS", "LEARNING_RATE", "BATCH_SIZE", "FLOP_BUDGET", "RUN_NAME", "RESUME", "STABLE_FROM",
                "SEEDS")  # set by the study per point


REFERENCE_FAMILIES = ("transformer", "transformer++")  # the better envelope of the two is "the transformer"
RESERVOIR_CLASSES = (RESERVOIR, FROZEN_TRANSITION)  # the classes set against the transformer, each at its best


class _ReservoirFamilies(Sequence):
    """The study families compared with "the transformer" as reservoirs, as each family declares its class
    (models/registry.py CLASSES): the readout-only reservoirs and the frozen-transition networks, a plugin's
    among them. A write gate learns what enters the frozen state and leaves the transition frozen: still one of
    these; a forget gate trains the transition itself (frozen_retention+forget is a control, not one of these)."""

    def _families(self) -> list[str]:
        return [f for f in STUDY_FAMILIES if class_of(f) in RESERVOIR_CLASSES]

    def __getitem__(self, index):
        return self._families()[index]

    def __iter__(self):  # one pass over the registry (Sequence's own would make one an item)
        return iter(self._families())

    def __len__(self) -> int:
        return len(self._families())


RESERVOIR_FAMILIES = _ReservoirFamilies()


def of_class(kind: str) -> list[str]:
    """The study's reservoir families of one class (models/registry.py CLASSES)."""
    return [f for f in RESERVOIR_FAMILIES if class_of(f) == kind]


# REFERENCES=True: reference lines beside the envelopes, each one pass over the training data (no FLOP cap):
# n-grams of order 1 (the unigram level) to 6, and the ESN across reservoir sizes (data-bound), in the settings
# the studies recorded them with (the literature's common starting point, before the ESN was tuned)
ESN_UNTUNED = ["ESN.spectral_radius=0.9", "ESN.leak_rate=0.3", "ESN.input_scaling=1.0", "ESN.ridge=1.0"]
REFERENCE_RUNS = {**{f"ngram-{k}": ["MODELS=ngram", f"NGRAM.order={k}"] for k in range(1, 7)},
                  **{f"esn-{u}": ["MODELS=esn", f"ESN.units={u}", *ESN_UNTUNED] for u in (500, 1000, 2000, 4000)}}


ONE_PASS = ["FLOP_BUDGET=None", "TOKEN_BUDGET=1000000000000"]  # more tokens than any corpus: the data ends the fit


# CONTROLS=True: what the frozen part is worth, at the grid's top budget. Each reservoir family's envelope
# configuration there trained again with its frozen part trained too ("unfrozen"), or, for the attention readout,
# with no reservoir under it ("attention-only": the readout over the same frozen input, no recurrence)
CONTROLS = {
    # the random transformer (Zhong & Andreas 2024): frozen attention, the attention analogue of a reservoir
    "transformer++": {"random": {"trained": "embeddings"}},
    "frozen_retention": {"unfrozen": {"train_recurrence": True}},
    "reservoir_attention": {"unfrozen": {"train_recurrence": True}, "attention-only": {"reservoir": False}},
    "deep_linear_reservoir": {"unfrozen": {"train_recurrence": True}},
    "linear_reservoir": {"unfrozen": {"train_recurrence": True}},
}

# controls trained on every envelope seed, not the first alone: the random transformer is set beside the top
# budget's envelope (mean ± sd over seeds), where the others are read against the point they control
EVERY_SEED_CONTROLS = ("random",)


class FrontierError(OneLineError, ValueError):
    """A frontier study or report that cannot run as asked: reported as one line."""


class FrontierExit(Exception):
    """Points ended without finishing: the study stops there, with the first point's exit code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


# HELD=True's settings (held.py): axis -> (the setting, a block's own where it starts with '.'; its mark in a cell's
# name). Every grid cell holds them at the study's values; a walk's step sets one of them.
HELD_SETTINGS = {"adam_beta2": ("ADAM_BETA2", "beta2_"), "adam_beta2_tokens": ("ADAM_BETA2_REF_TOKENS", "per"),
                 "weight_decay": ("WEIGHT_DECAY", "wd"), "dropout": (".dropout", "drop")}
WHOLE_NUMBERS = ("adam_beta2_tokens",)  # held settings that are counts


@dataclass(frozen=True)
class Cell:
    """One configuration of a family: a size preset, a learning rate, a batch size; and, for a step of HELD=True's
    walks, ``held``: the held settings it sets otherwise, as (axis, value) pairs (HELD_SETTINGS)."""

    family: str
    size: str
    learning_rate: float
    batch_size: int
    held: tuple = ()

    @property
    def name(self) -> str:
        marks = "".join(f"-{HELD_SETTINGS[axis][1]}{value:g}" for axis, value in self.held)
        return f"{self.family}-{self.size}-lr{self.learning_rate:g}-b{self.batch_size}{marks}"

    @property
    def model(self) -> str:
        return FAMILIES[self.family][0]

    def record(self) -> dict:
        """The cell as the study file lists it (what REPORT reads back)."""
        return {"name": self.name, "family": self.family, "model": self.model, "size": self.size,
                "learning_rate": self.learning_rate, "batch_size": self.batch_size,
                **({"held": dict(self.held)} if self.held else {})}

    def settings(self, control: str | None = None) -> list[str]:
        """TinyStories.py KEY=VALUE for the cell, or for one of its family's CONTROLS."""
        block = self.model.upper()
        options = {**FAMILIES[self.family][1], **SIZES[self.model][self.size],
                   **(CONTROLS[self.family][control] if control else {})}
        held = [f"{block if key.startswith('.') else ''}{key}={int(value) if axis in WHOLE_NUMBERS else value!r}"
                for axis, key, value in ((axis, HELD_SETTINGS[axis][0], value) for axis, value in self.held)]
        return [f"MODELS={self.model}", *(f"{block}.{k}={v!r}" for k, v in options.items()),
                f"LEARNING_RATE={self.learning_rate!r}", f"BATCH_SIZE={self.batch_size}", *held]


def _number_list(key: str, value, kind) -> list:
    example = ",".join(map(str, DEFAULTS[key])) if isinstance(DEFAULTS[key], list) else str(DEFAULTS[key])
    numbers = positive_numbers(key, value, example, FrontierError, integers=kind is int)
    if not numbers:
        raise FrontierError(f"{key} is empty: the grid needs at least one; e.g. {key}={example}")
    return numbers


def _name_list(key: str, value) -> list[str]:
    items = value if isinstance(value, (list, tuple)) else [v.strip() for v in str(value).strip("[]() ").split(",")]
    items = [str(v).strip().strip("'\"") for v in items if str(v).strip()]
    if not items:
        raise FrontierError(f"{key} is empty: the grid needs at least one; e.g. {key}={','.join(DEFAULTS[key][:2])}")
    return items


def parse_grid(own: dict[str, str]) -> dict:
    """The study keys of a command line (text values) as the grid: refused in one line when a family or a
    size preset does not exist, a rate or batch is not positive, or a count is out of range."""
    grid = dict(DEFAULTS)
    if "FAMILIES" in own:
        grid["FAMILIES"] = _name_list("FAMILIES", own["FAMILIES"])
    if "SIZES" in own:
        grid["SIZES"] = _name_list("SIZES", own["SIZES"])
    for key, kind in (("LEARNING_RATES", float), ("BATCH_SIZES", int)):
        if key in own:
            grid[key] = _number_list(key, own[key], kind)
    for key, words in (("WORKERS", ("auto",)), ("POINTS_PER_DEVICE", ("auto", "probe"))):
        word = str(own.get(key, "")).strip().lower()
        if word in words:
            grid[key] = word
            own = {k: v for k, v in own.items() if k != key}
    if not str(own.get("POINTS_PER_DEVICE", "1")).strip().isdigit():
        raise FrontierError(f"POINTS_PER_DEVICE must be a positive integer, auto or probe, got "
                            f"{own['POINTS_PER_DEVICE']!r}")
    for key, kind in (("KEEP", int), ("ENVELOPE_SEEDS", int), ("MIN_STEPS", int), ("MAX_TOKENS_PER_PARAM", float),
                      ("WORKERS", int), ("DEVICES_PER_POINT", int), ("POINTS_PER_DEVICE", int), ("WITHIN", float)):
        if key in own:
            grid[key] = _number_list(key, own[key], kind)[0] if key != "WITHIN" else _fraction(own[key])
    if "REPLAY" in own:
        grid["REPLAY"] = _switch("REPLAY", own["REPLAY"])
    for key in GROWABLE:  # a value given twice is every one of its cells twice: two processes on one point folder
        values = grid[key]
        twice = next((v for k, v in enumerate(values) if v in values[:k]), None)
        if twice is not None:
            shown = ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in values)
            raise FrontierError(f"{key} names {twice!r} twice ({shown}): give each value once")
    for family in grid["FAMILIES"]:
        if family not in FAMILIES:
            raise FrontierError(f"unknown family {family!r} in FAMILIES (families: {', '.join(FAMILIES)})")
        missing = [s for s in grid["SIZES"] if s not in SIZES[FAMILIES[family][0]]]
        if missing:
            raise FrontierError(f"size preset {missing[0]!r} does not exist for {family} (its presets: "
                                f"{', '.join(SIZES[FAMILIES[family][0]])})")
    return grid


def parse_stages(own: dict[str, str], budgets: list[float], grid: dict) -> dict:
    """LEAD_BUDGET (a budget above the grid's: the leaders' top-budget envelope configurations carried there,
    every seed), LEADERS ('auto': the better transformer recipe and the best reservoir family at the top budget;
    or family names), REFERENCES (True: n-grams and the ESN as reference lines) and CONTROLS (True: each
    reservoir family's controls at the grid's top budget), CONTEXTS, EDGES, HELD and DRAWS (True: their stages)."""
    stages = {"lead_budget": None, "leaders": "auto", "references": False, "controls": False, "contexts": False,
              "edges": False, "draws": False}
    if "LEAD_BUDGET" in own and str(own["LEAD_BUDGET"]).strip().lower() not in ("none", ""):
        lead = positive_numbers("LEAD_BUDGET", own["LEAD_BUDGET"], "4e13", FrontierError)
        if len(lead) != 1 or lead[0] <= budgets[-1]:
            raise FrontierError(f"LEAD_BUDGET must be one budget above the largest of BUDGETS ({budgets[-1]:g}), got "
                                f"{own['LEAD_BUDGET']!r}; e.g. LEAD_BUDGET=4e13")
        stages["lead_budget"] = lead[0]
    if "LEADERS" in own and str(own["LEADERS"]).strip().strip("'\"").lower() != "auto":
        stages["leaders"] = _families_named("LEADERS", own["LEADERS"], grid, "LEADERS=auto")
    for key in ("REFERENCES", "CONTROLS", "CONTEXTS", "EDGES", "DRAWS"):
        if key in own:
            stages[key.lower()] = _switch(key, own[key])
    if "HELD" in own:  # True (every family), False, or the families to walk
        text = str(own["HELD"]).strip().strip("'\"").lower()
        stages["held"] = _switch("HELD", text) if text in ("true", "false", "1", "0", "yes", "no") else \
            _families_named("HELD", own["HELD"], grid, "HELD=True for every family")
    return stages


def _families_named(key: str, text, grid: dict, otherwise: str) -> list[str]:
    """A stage's list of the study's families, refused in one line where it names another."""
    named = _name_list(key, text)
    unknown = [f for f in named if f not in grid["FAMILIES"]]
    if unknown:
        raise FrontierError(f"{key} names {unknown[0]!r}, not one of the study's FAMILIES "
                            f"({', '.join(grid['FAMILIES'])}); or {otherwise}")
    return named


def _switch(key: str, text) -> bool:
    value = str(text).strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise FrontierError(f"{key} must be True or False, got {text!r}")
    return value in ("true", "1", "yes")


def _fraction(text) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise FrontierError(f"WITHIN must be a fraction in [0, 1) of the family's best, got {text!r}; e.g. WITHIN=0.03")
    return value


OUTPUT_PLACES = ("RESULTS_DIR", "CACHE_DIR")  # where one machine wrote: a reader repeating a study writes elsewhere
LOCATIONS = ("RESULTS_DIR", "CACHE_DIR", "DATA_DIR", "DATASET", "TRAIN_PATH", "VAL_PATH")  # may differ per machine


def _key(arg: str) -> str:
    return arg.partition("=")[0].strip().upper()


def _placeless(settings: list[str]) -> list[str]:
    """A study's settings less where its data and folders are: the same study continues on another machine."""
    return [a for a in settings if _key(a) not in LOCATIONS]


def portable_settings(settings: list[str]) -> list[str]:
    """A study's settings as its committed study file and report print them: absolute places relative to
    the repository (DATASET=../shared/data/tinystories), so the command names no machine, and none of the
    places a machine wrote to (where a study runs is not what it is: continued from another folder, it is the
    same study, and its file the same)."""
    out = []
    for arg in settings:
        key, equals, value = arg.partition("=")
        if _key(arg) == "PLUGINS" and equals:  # a plugin by its path from the repository (or its module name)
            out.append(f"{key}={portable_paths_in(value)}")
        elif _key(arg) not in OUTPUT_PLACES:
            out.append(f"{key}={portable_path(value)}" if equals and _key(arg) in LOCATIONS else arg)
    return out


GROWABLE = ("FAMILIES", "SIZES", "LEARNING_RATES", "BATCH_SIZES")  # new values: new cells, which join the study


FREE = ("WORKERS", "DEVICES_PER_POINT", "POINTS_PER_DEVICE", "REPLAY")  # how the study runs, not what it measures


def _grid_changes(before: dict, now: dict) -> list[str]:
    """The grid keys a continued study may not take: a list that lost a value, any other changed key."""
    changed = []
    for key in sorted(set(before) | set(now)):
        if key in FREE or before.get(key) == now.get(key):
            continue
        if key in GROWABLE and isinstance(before.get(key), list) and set(before[key]) <= set(now.get(key) or []):
            continue
        changed.append(f"{key} ({before.get(key)!r} there, {now.get(key)!r} here)")
    return changed


def grid_cells(grid: dict) -> list[Cell]:
    return [Cell(f, s, lr, b) for f in grid["FAMILIES"] for s in grid["SIZES"] for lr in grid["LEARNING_RATES"]
            for b in grid["BATCH_SIZES"]]


def study_command(report: dict) -> str:
    """The command that made (and continues) the study, from its study file: the settings and grid keys
    that differ from the study's defaults."""
    defaults = {f"{k}={v!r}" for k, v in RUN_SETTINGS.items()}
    parts = ["python scaling.py FRONTIER=True", f"STUDY={report['study']}"]
    grid_budgets = [b for b in report["budgets"] if b != report.get("lead_budget")]
    if grid_budgets != list(DEFAULT_BUDGETS):
        parts.append("BUDGETS=" + ",".join(f"{b:g}" for b in grid_budgets))
    for key, value in report["grid"].items():
        if value != DEFAULTS.get(key) and key not in FREE:  # WORKERS and the like: each host's own
            parts.append(f"{key}=" + (",".join(map(str, value)) if isinstance(value, list) else str(value)))
    stages = report.get("stages") or {}
    if stages.get("lead_budget"):
        parts.append(f"LEAD_BUDGET={stages['lead_budget']:g}")
    if stages.get("leaders", "auto") != "auto":
        parts.append("LEADERS=" + ",".join(stages["leaders"]))
    if stages.get("references"):
        parts.append("REFERENCES=True")
    if stages.get("controls"):
        parts.append("CONTROLS=True")
    if stages.get("contexts"):
        parts.append("CONTEXTS=True")
    if stages.get("edges"):
        parts.append("EDGES=True")
    if stages.get("held"):
        parts.append("HELD=" + (",".join(stages["held"]) if isinstance(stages["held"], list) else "True"))
    if stages.get("draws"):
        parts.append("DRAWS=True")
    parts += [a for a in portable_settings(report["settings"]) if a not in defaults]  # older files named RESULTS_DIR
    return " ".join(parts)
