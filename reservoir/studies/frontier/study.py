"""The fair frontier: every family at its best at every budget (lower envelopes, IsoFLOP profiles).

    study = FrontierStudy.from_args(own, settings)   # FRONTIER_KEYS, then run settings
    study.run(run_points)        # run_points([args, ...], workers) -> [exit code, ...]
    report = study.report()      # frontier.json: envelopes, grid, IsoFLOP profiles, N_opt, fits, multipliers
    write_study(report, study.path)   # reservoir/report.py: frontier.json, frontier.md and frontier.png

A family is a model with fixed options (``FAMILIES``: the transformer in GPT-2's and in Transformer++'s
recipe, the LSTM and the reservoirs); its grid is size presets (``SIZES``, >= 8x in trained parameters)
x learning rates x batch sizes. A cell at a budget is skipped when it would take fewer than MIN_STEPS
optimizer steps or more than MAX_TOKENS_PER_PARAM tokens per trained parameter (both listed).

Every point trains with the wsd schedule (reservoir/train.py), so a cell's budgets share one stable
phase: the point at the next budget continues the stable phase of the point before it (STABLE_FROM)
and pays only its extension and its own cooldown. Successive halving bounds the cost: a cell goes on to
the next budget only if its point is among the family's KEEP best there, or within WITHIN of the
family's best; cells too large for the budgets so far join when their steps suffice. The envelope
points are then re-run on ENVELOPE_SEEDS seeds in all (mean ± sd). Stages a running study may add
(STAGE_KEYS): the reference lines, the reservoir families' CONTROLS, the leaders at LEAD_BUDGET, and the
paired comparison of the best reservoir family against the transformer.

Each point is an ordinary run folder, RESULTS_DIR/STUDY/<cell>/flops-<budget>, run as its own
TinyStories.py process on one thread (so its score does not depend on WORKERS); a study interrupted
anywhere continues with the same command, and one whose folder holds only the records (no checkpoints,
as committed to git) skips every finished point. ``report_from_records`` rebuilds every output from
the records alone (``python scaling.py REPORT=results/<study>``).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path

from reservoir.config import parse_overrides
from reservoir.models.settings import model_settings
from reservoir.platform.messages import OneLineError, say
from reservoir.run.checkpoint import CheckpointError
from reservoir.run.results import ResultsError, read_json, read_run_config, read_summary, write_json_atomic
from reservoir.studies.ladder import fit_curve, parse_budgets, point_name, positive_numbers, step_cost

# stages after the grid's: a running study may add them
STAGE_KEYS = ("LEAD_BUDGET", "LEADERS", "REFERENCES", "CONTROLS")
FRONTIER_KEYS = ("FAMILIES", "SIZES", "LEARNING_RATES", "BATCH_SIZES", "KEEP", "WITHIN", "ENVELOPE_SEEDS",
                 "MIN_STEPS", "MAX_TOKENS_PER_PARAM", "WORKERS", *STAGE_KEYS)
CONTROL_FOLDER = "controls"  # CONTROLS=True: <study>/controls/<cell>+<control>/flops-<top budget>
COMPARISONS = "comparisons"  # the paired comparison at the top budget: <study>/comparisons/<budget>-<A>-vs-<B>.json
STUDY_FILE = "frontier-study.json"  # the study's grid and settings: what REPORT rebuilds from, and re-runs check

# family -> (model, the options that make it that family)
FAMILIES = {
    "transformer": ("transformer", {"recipe": "gpt2"}),
    "transformer++": ("transformer", {"recipe": "++"}),
    "lstm": ("lstm", {}),
    "frozen_retention": ("frozen_retention", {}),
    "reservoir_attention": ("reservoir_attention", {}),
    "deep_linear_reservoir": ("deep_linear_reservoir", {}),
    "linear_reservoir": ("linear_reservoir", {}),
}
# size presets per model, smallest first; trained parameters on TinyStories' 77 characters in the comments
SIZES = {
    "transformer": {"xs": {"n_layer": 2, "n_embd": 48}, "s": {"n_layer": 3, "n_embd": 64},  # 66k, 163k
                    "m": {"n_layer": 4, "n_embd": 96}, "l": {"n_layer": 4, "n_embd": 128}},  # 467k, 820k
    "lstm": {"xs": {"embed_dim": 32, "hidden": 96}, "s": {"embed_dim": 48, "hidden": 160},  # 60k, 150k
             "m": {"embed_dim": 64, "hidden": 256}, "l": {"embed_dim": 64, "hidden": 384}},  # 354k, 726k
    "frozen_retention": {"xs": {"layers": 2, "width": 48, "ffn_hidden": 192},  # 65k
                         "s": {"layers": 3, "width": 64, "ffn_hidden": 256},  # 167k
                         "m": {"layers": 4, "width": 96, "ffn_hidden": 384},  # 491k
                         "l": {"layers": 4, "width": 128, "ffn_hidden": 512}},  # 868k
    "reservoir_attention": {"xs": {"units": 128, "width": 48, "layers": 1},  # 51k
                            "s": {"units": 192, "width": 64, "layers": 2},  # 139k
                            "m": {"units": 256, "width": 96, "layers": 2},  # 294k
                            "l": {"units": 256, "width": 128, "layers": 3}},  # 688k
    "deep_linear_reservoir": {"xs": {"layers": 2, "units": 64, "width": 64, "mix_hidden": 128},  # 93k
                              "s": {"layers": 3, "units": 96, "width": 96, "mix_hidden": 192},  # 260k
                              "m": {"layers": 4, "units": 128, "width": 128, "mix_hidden": 256},  # 575k
                              "l": {"layers": 4, "units": 192, "width": 192, "mix_hidden": 384}},  # 1.25M
    "linear_reservoir": {"xs": {"units": 128, "embed_dim": 32, "readout_hidden": 128},  # 50k
                         "s": {"units": 192, "embed_dim": 48, "readout_hidden": 256},  # 135k
                         "m": {"units": 256, "embed_dim": 64, "readout_hidden": 512},  # 341k
                         "l": {"units": 384, "embed_dim": 64, "readout_hidden": 1024}},  # 939k
}
DEFAULTS = {"FAMILIES": ["transformer", "transformer++", "lstm", "frozen_retention", "reservoir_attention",
                         "deep_linear_reservoir", "linear_reservoir"],
            "SIZES": ["xs", "s", "m", "l"], "LEARNING_RATES": [1.5e-3, 3e-3, 6e-3, 1.2e-2], "BATCH_SIZES": [8, 16],
            "KEEP": 3, "WITHIN": 0.03, "ENVELOPE_SEEDS": 3, "MIN_STEPS": 300, "MAX_TOKENS_PER_PARAM": 300,
            "WORKERS": 2}  # WORKERS: two one-thread points beat one two-thread point on 2 cores (bench/README.md)
DEFAULT_BUDGETS = (5e11, 1.25e12, 3.125e12, 7.8125e12, 1.953125e13)  # x2.5 apart
RUN_SETTINGS = {  # what every point sets unless the command line says otherwise
    "LR_SCHEDULE": "wsd",  # budgets branch off one stable phase
    "TIME_BUDGET_S": None,  # compute alone ends every fit: points do not depend on the machine's load
    "PLOTS": False,
    "EVAL_POINTS": 4,
}
OWN_SETTINGS = ("MODELS", "LEARNING_RATE", "BATCH_SIZE", "FLOP_BUDGET", "RUN_NAME", "RESUME", "STABLE_FROM",
                "SEEDS")  # set by the study per point
BOUNDS = {"at least": "≥ ", "at most": "≤ "}
REFERENCE_FAMILIES = ("transformer", "transformer++")  # the better envelope of the two is "the transformer"
RESERVOIR_FAMILIES = ("frozen_retention", "reservoir_attention", "deep_linear_reservoir", "linear_reservoir")
# REFERENCES=True: reference lines beside the envelopes, each one pass over the training data (no FLOP cap):
# n-grams of order 1 (the unigram level) to 6, and the ESN across reservoir sizes (data-bound)
REFERENCE_RUNS = {**{f"ngram-{k}": ["MODELS=ngram", f"NGRAM.order={k}"] for k in range(1, 7)},
                  **{f"esn-{u}": ["MODELS=esn", f"ESN.units={u}"] for u in (500, 1000, 2000, 4000)}}
ONE_PASS = ["FLOP_BUDGET=None", "TOKEN_BUDGET=1000000000000"]  # more tokens than any corpus: the data ends the fit
# CONTROLS=True: what the frozen part is worth, at the grid's top budget. Each reservoir family's envelope
# configuration there trained again with its frozen part trained too ("unfrozen"), or, for the attention readout,
# with no reservoir under it ("attention-only": the readout over the same frozen input, no recurrence)
CONTROLS = {
    "frozen_retention": {"unfrozen": {"train_recurrence": True}},
    "reservoir_attention": {"unfrozen": {"train_recurrence": True}, "attention-only": {"reservoir": False}},
    "deep_linear_reservoir": {"unfrozen": {"train_recurrence": True}},
    "linear_reservoir": {"unfrozen": {"train_recurrence": True}},
}


class FrontierError(OneLineError, ValueError):
    """A frontier study or report that cannot run as asked: reported as one line."""


@dataclass(frozen=True)
class Cell:
    """One configuration of a family: a size preset, a learning rate, a batch size."""

    family: str
    size: str
    learning_rate: float
    batch_size: int

    @property
    def name(self) -> str:
        return f"{self.family}-{self.size}-lr{self.learning_rate:g}-b{self.batch_size}"

    @property
    def model(self) -> str:
        return FAMILIES[self.family][0]

    def record(self) -> dict:
        """The cell as the study file lists it (what REPORT reads back)."""
        return {"name": self.name, "family": self.family, "model": self.model, "size": self.size,
                "learning_rate": self.learning_rate, "batch_size": self.batch_size}

    def settings(self, control: str | None = None) -> list[str]:
        """TinyStories.py KEY=VALUE for the cell, or for one of its family's CONTROLS."""
        block = self.model.upper()
        options = {**FAMILIES[self.family][1], **SIZES[self.model][self.size],
                   **(CONTROLS[self.family][control] if control else {})}
        return [f"MODELS={self.model}", *(f"{block}.{k}={v!r}" for k, v in options.items()),
                f"LEARNING_RATE={self.learning_rate!r}", f"BATCH_SIZE={self.batch_size}"]


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
    for key, kind in (("KEEP", int), ("ENVELOPE_SEEDS", int), ("MIN_STEPS", int), ("MAX_TOKENS_PER_PARAM", float),
                      ("WORKERS", int), ("WITHIN", float)):
        if key in own:
            grid[key] = _number_list(key, own[key], kind)[0] if key != "WITHIN" else _fraction(own[key])
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
    reservoir family's controls at the grid's top budget)."""
    stages = {"lead_budget": None, "leaders": "auto", "references": False, "controls": False}
    if "LEAD_BUDGET" in own and str(own["LEAD_BUDGET"]).strip().lower() not in ("none", ""):
        lead = positive_numbers("LEAD_BUDGET", own["LEAD_BUDGET"], "4e13", FrontierError)
        if len(lead) != 1 or lead[0] <= budgets[-1]:
            raise FrontierError(f"LEAD_BUDGET must be one budget above the largest of BUDGETS ({budgets[-1]:g}), got "
                                f"{own['LEAD_BUDGET']!r}; e.g. LEAD_BUDGET=4e13")
        stages["lead_budget"] = lead[0]
    if "LEADERS" in own and str(own["LEADERS"]).strip().strip("'\"").lower() != "auto":
        leaders = _name_list("LEADERS", own["LEADERS"])
        unknown = [f for f in leaders if f not in grid["FAMILIES"]]
        if unknown:
            raise FrontierError(f"LEADERS names {unknown[0]!r}, not one of the study's FAMILIES "
                                f"({', '.join(grid['FAMILIES'])}); or LEADERS=auto")
        stages["leaders"] = leaders
    for key in ("REFERENCES", "CONTROLS"):
        if key in own:
            value = str(own[key]).strip().lower()
            if value not in ("true", "false", "1", "0", "yes", "no"):
                raise FrontierError(f"{key} must be True or False, got {own[key]!r}")
            stages[key.lower()] = value in ("true", "1", "yes")
    return stages


def _fraction(text) -> float:
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not 0 <= value < 1:
        raise FrontierError(f"WITHIN must be a fraction in [0, 1) of the family's best, got {text!r}; e.g. WITHIN=0.03")
    return value


@dataclass
class FrontierStudy:
    name: str
    budgets: list[float]
    grid: dict
    settings: list[str]  # TinyStories.py KEY=VALUE held for every point (the study's defaults first)
    config: dict  # the validated settings of the first cell's first point
    stages: dict = field(default_factory=lambda: {"lead_budget": None, "leaders": "auto", "references": False,
                                                  "controls": False})
    path: Path = field(init=False)

    def __post_init__(self):
        self.path = Path(self.config["RESULTS_DIR"]) / self.name

    @classmethod
    def from_args(cls, own: dict[str, str], settings: list[str]) -> FrontierStudy:
        grid = parse_grid(own)
        budgets = parse_budgets(own["BUDGETS"]) if "BUDGETS" in own else list(DEFAULT_BUDGETS)
        name = own.get("STUDY") or "frontier"
        if not name.strip() or "/" in name or "\\" in name or name in (".", ".."):
            raise FrontierError(f"STUDY must be a plain folder name, got {name!r}")
        for arg in settings:
            key = arg.partition("=")[0].strip().upper().partition(".")[0]
            if key in OWN_SETTINGS:
                raise FrontierError(f"{arg.partition('=')[0].strip()} is set by the frontier study for each point "
                                    "(the grid: FAMILIES, SIZES, LEARNING_RATES, BATCH_SIZES; budgets: BUDGETS; "
                                    "the folder: STUDY)")
        given = {arg.partition("=")[0].strip().upper() for arg in settings}
        defaults = [f"{k}={v!r}" for k, v in RUN_SETTINGS.items() if k not in given]
        study_settings = [*defaults, *settings]
        cells = grid_cells(grid)
        config = None
        for cell in cells:  # every cell's settings refused now, not mid-study
            config = parse_overrides([*study_settings, *cell.settings(), f"FLOP_BUDGET={budgets[0]!r}"])
        if config["LR_SCHEDULE"] != "wsd":
            raise FrontierError("a frontier study branches its budgets off one stable phase: it needs "
                                "LR_SCHEDULE='wsd' (its default); drop LR_SCHEDULE from the command")
        return cls(name, budgets, grid, study_settings, config, parse_stages(own, budgets, grid))

    # --- what runs where
    def cells(self) -> list[Cell]:
        return grid_cells(self.grid)

    def all_budgets(self) -> list[float]:
        return [*self.budgets, *([self.stages["lead_budget"]] if self.stages["lead_budget"] else [])]

    def folder(self, cell: Cell, budget: float, seeds: bool = False) -> Path:
        return self.path / cell.name / (point_name(budget) + ("-seeds" if seeds else ""))

    def point_args(self, cell: Cell, budget: float, previous: float | None) -> list[str]:
        folder = self.folder(cell, budget)
        where = [f"RESULTS_DIR={folder.parent}", f"FLOP_BUDGET={budget!r}"]
        if (folder / "config.json").exists():
            return [*self.settings, *cell.settings(), *where, f"RESUME={folder}"]
        branch = []
        if previous is not None:
            source = self.folder(cell, previous)
            if (source / "checkpoints" / f"{cell.model}-seed{self.config['SEED']}-stable.pt").exists():
                branch = [f"STABLE_FROM={source}"]
        return [*self.settings, *cell.settings(), *where, f"RUN_NAME={folder.name}", *branch]

    def seed_args(self, cell: Cell, budget: float) -> list[str]:
        folder = self.folder(cell, budget, seeds=True)
        where = [f"RESULTS_DIR={folder.parent}", f"FLOP_BUDGET={budget!r}"]
        if (folder / "config.json").exists():
            return [*self.settings, *cell.settings(), *where, f"RESUME={folder}"]
        return [*self.settings, *cell.settings(), *where, f"RUN_NAME={folder.name}",
                f"SEEDS={','.join(map(str, self.extra_seeds()))}"]

    def extra_seeds(self) -> list[int]:
        return [self.config["SEED"] + k for k in range(1, self.grid["ENVELOPE_SEEDS"])]

    def finished(self, folder: Path, seeds: list[int]) -> bool:
        if not (folder / "summary.json").exists():
            return False
        done = {r.get("seed") for r in read_summary(folder, "a point's summary")}
        return set(seeds) <= done

    # --- the plan: which cells each budget can take
    def plan(self, measure) -> dict:
        """{cell name: {budget: None (runnable) or why it is skipped}} from ``measure(cell) -> (FLOPs per step,
        trained parameters, tokens per step)``."""
        plan = {}
        for cell in self.cells():
            per_step, params, tokens_per_step = measure(cell)
            plan[cell.name] = {}
            for budget in self.budgets:
                steps = math.ceil(budget / per_step)
                ratio = steps * tokens_per_step / params
                warmup = self.config["WARMUP_STEPS"]
                if steps < self.grid["MIN_STEPS"] or steps * (1 - self.config["COOLDOWN_FRACTION"]) <= warmup:
                    plan[cell.name][budget] = f"{steps} steps < {max(self.grid['MIN_STEPS'], warmup)}"
                elif ratio > self.grid["MAX_TOKENS_PER_PARAM"]:
                    limit = self.grid["MAX_TOKENS_PER_PARAM"]
                    plan[cell.name][budget] = f"{ratio:.0f} tokens per parameter > {limit:g}"
                else:
                    plan[cell.name][budget] = None
        if not any(reason is None for cells in plan.values() for reason in cells.values()):
            raise FrontierError("every cell of the grid is skipped at every budget (too few steps or too many tokens "
                                "per parameter): widen BUDGETS, add SIZES, or lower MIN_STEPS")
        return plan

    def write_study_file(self, plan: dict) -> None:
        content = {"study": self.name, "budgets": self.budgets, "grid": self.grid, "settings": self.settings,
                   "cells": [c.record() for c in self.cells()],
                   "plan": {name: {repr(b): why for b, why in row.items()} for name, row in plan.items()},
                   "seed": self.config["SEED"], "extra_seeds": self.extra_seeds(), "stages": self.stages}
        path = self.path / STUDY_FILE
        if path.exists():
            before = read_json(path, "the study's grid")
            changed = ["budgets"] if before.get("budgets") != content["budgets"] else []
            changed += _grid_changes(before.get("grid") or {}, self.grid)
            if _placeless(before.get("settings", [])) != _placeless(content["settings"]):
                changed.append("settings")
            if changed:
                raise FrontierError(f"{path} holds another {', '.join(changed)} for STUDY={self.name}: run it with "
                                    "the same command to continue it (a grid list may grow: FAMILIES, SIZES, "
                                    "LEARNING_RATES, BATCH_SIZES), or name a new STUDY")
        self.path.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, content)

    def run(self, run_points, measure) -> None:
        """Every budget, smallest first: run the live cells' points (``run_points([(folder, args), ...], workers)``
        -> exit codes), then keep each family's best; finally the envelope points' extra seeds.
        ``measure(cell) -> (FLOPs per step, trained parameters, tokens per step)`` (``measure_cells``)."""
        plan = self.plan(measure)
        self.write_study_file(plan)
        skipped = sum(reason is not None for row in plan.values() for reason in row.values())
        say(f"frontier {self.name}: {len(plan)} cells x {len(self.budgets)} budgets, {skipped} cell-budgets skipped "
            f"(listed in {self.path / STUDY_FILE})")
        pruned: set[str] = set()
        last_run: dict[str, float] = {}  # cell -> the budget of its latest point
        seed = self.config["SEED"]
        for budget in self.budgets:
            live = [c for c in self.cells() if c.name not in pruned and plan[c.name][budget] is None]
            revived = self._refill(live, pruned, plan, budget, last_run)
            if revived:
                say(f"frontier {self.name}: {budget:.3g} FLOPs: {', '.join(c.name for c in revived)} back, for "
                    "families whose kept cells no longer fit this budget (too many tokens per parameter)")
                live += revived
                pruned -= {c.name for c in revived}
            todo = [c for c in live if not self.finished(self.folder(c, budget), [seed])]
            say(f"frontier {self.name}: {budget:.3g} FLOPs: {len(live)} cells, {len(live) - len(todo)} already "
                f"finished, {len(todo)} to train")
            self._run_all([(self.folder(c, budget), self.point_args(c, budget, last_run.get(c.name))) for c in todo],
                          run_points, budget)
            for c in live:
                last_run[c.name] = budget
            pruned |= self._prune(live, budget)
        winners = envelope_cells(self.records(), self.budgets)
        todo = [(c, b) for c in self.cells() for b in self.budgets
                if (c.family, b) in winners and winners[(c.family, b)] == c.name and self.extra_seeds()
                and not self.finished(self.folder(c, b, seeds=True), self.extra_seeds())]
        todo.sort(key=lambda cell_budget: -cell_budget[1])  # the top budget's first: the claim and comparison
        if todo:
            say(f"frontier {self.name}: the envelope's {len(todo)} points on seeds {self.extra_seeds()}")
            self._run_all([(self.folder(c, b, seeds=True), self.seed_args(c, b)) for c, b in todo], run_points, None)
        self.compare_at_the_top(self.budgets)  # the grid's top budget, the claim: before the hours of the stages
        if self.stages["references"]:
            self._run_references(run_points)
        if self.stages.get("controls"):
            self._run_controls(run_points)
        if self.stages["lead_budget"]:
            self._run_leaders(run_points, measure)
        self.compare_at_the_top()

    def _run_references(self, run_points) -> None:
        jobs = []
        for name, options in REFERENCE_RUNS.items():
            folder = self.path / "references" / name
            if self.finished(folder, [self.config["SEED"]]):
                continue
            jobs.append((folder, [*self.settings, *options, *ONE_PASS, *_continue_or_start(folder)]))
        say(f"frontier {self.name}: {len(REFERENCE_RUNS) - len(jobs)} reference runs finished, {len(jobs)} to run")
        self._run_all(jobs, run_points, None)

    def control_folder(self, cell: Cell, control: str, budget: float) -> Path:
        return self.path / CONTROL_FOLDER / f"{cell.name}+{control}" / point_name(budget)

    def _run_controls(self, run_points) -> None:
        """Each reservoir family's controls at the grid's top budget, on its envelope configuration there and the
        study's first seed, trained from step 0 (a control has no stable phase to branch off)."""
        top, seed = self.budgets[-1], self.config["SEED"]
        winners, cells = envelope_cells(self.records(), self.budgets), {c.name: c for c in self.cells()}
        jobs = []
        for family in self.grid["FAMILIES"]:
            if (family, top) not in winners:
                continue
            cell = cells[winners[(family, top)]]
            for control in CONTROLS.get(family, {}):
                folder = self.control_folder(cell, control, top)
                if self.finished(folder, [seed]):
                    continue
                jobs.append((folder, [*self.settings, *cell.settings(control), f"FLOP_BUDGET={top!r}",
                                      *_continue_or_start(folder)]))
        say(f"frontier {self.name}: the controls at {top:.3g} FLOPs: {len(jobs)} runs to train")
        self._run_all(jobs, run_points, top)

    def leaders(self) -> list[Cell]:
        """The top budget's envelope cells of LEADERS (auto: "the transformer" and the best reservoir family)."""
        report = self.report()
        top = self.budgets[-1]
        at_top = {f: p for f, points in report["envelope"].items() for p in points if p["budget"] == top}
        families = self.stages["leaders"]
        if families == "auto":
            reservoirs = sorted((at_top[f]["bpc_mean"], f) for f in RESERVOIR_FAMILIES if f in at_top)
            families = [f for f in (report["reference"], reservoirs[0][1] if reservoirs else None) if f in at_top]
        cells = {c.name: c for c in self.cells()}
        return [cells[at_top[f]["cell"]] for f in families if f in at_top]

    def _run_leaders(self, run_points, measure) -> None:
        lead, top, seeds = self.stages["lead_budget"], self.budgets[-1], [self.config["SEED"], *self.extra_seeds()]
        jobs = []
        for cell in self.leaders():
            per_step, params, tokens_per_step = measure(cell)
            ratio = math.ceil(lead / per_step) * tokens_per_step / params
            if ratio > self.grid["MAX_TOKENS_PER_PARAM"]:
                say(f"frontier {self.name}: {cell.name} not carried to {lead:.3g} FLOPs: {ratio:.0f} tokens per "
                    f"parameter > {self.grid['MAX_TOKENS_PER_PARAM']:g}")
                continue
            if not self.finished(self.folder(cell, lead), seeds[:1]):
                jobs.append((self.folder(cell, lead), self.point_args(cell, lead, top)))
            if seeds[1:] and not self.finished(self.folder(cell, lead, seeds=True), seeds[1:]):
                jobs.append((self.folder(cell, lead, seeds=True), self.seed_args(cell, lead)))
        say(f"frontier {self.name}: the leaders at {lead:.3g} FLOPs: {len(jobs)} runs to train")
        self._run_all(jobs, run_points, lead)

    def _run_all(self, jobs: list[tuple[Path, list[str]]], run_points, budget: float | None) -> None:
        """``jobs``: (the point's folder, its TinyStories.py arguments)."""
        if not jobs:
            return
        codes = run_points(jobs, self.grid["WORKERS"])  # None: never started (the study was stopped first)
        failed = [code for code in codes if code not in (0, None)]
        if failed or None in codes:
            where = f"at {budget:.3g} FLOPs" if budget else "after the grid"
            waiting = f", {codes.count(None)} not started" if None in codes else ""
            code = failed[0] if failed else 143
            raise FrontierExit(code, f"{len(failed)} point(s) {where} stopped (exit code {code}, messages above)"
                                     f"{waiting}; every finished point is kept and the same command continues")

    def _refill(self, live: list[Cell], pruned: set[str], plan: dict, budget: float, last_run: dict) -> list[Cell]:
        """Cells back for a family with fewer than KEEP live cells at ``budget`` (its kept cells are too small for
        it): its pruned cells that fit, those that lasted to the latest budget first, best there first. Without
        this a family whose best cells are small would have no point at the budgets they cannot take."""
        back = []
        for family in self.grid["FAMILIES"]:
            missing = self.grid["KEEP"] - sum(c.family == family for c in live)
            if missing <= 0:
                continue
            candidates = []
            for c in self.cells():
                if c.family == family and c.name in pruned and plan[c.name][budget] is None and c.name in last_run:
                    record = _first(read_summary(self.folder(c, last_run[c.name]), "a point's summary"),
                                    self.config["SEED"])
                    score = record.get("val_bpc") if record else None
                    if score is not None:
                        candidates.append((-last_run[c.name], score, c.name, c))
            back += [c for *_, c in sorted(candidates)[:missing]]
        return back

    def _prune(self, live: list[Cell], budget: float) -> set[str]:
        """The cells of ``live`` that stop at ``budget``: neither among their family's KEEP best there nor
        within WITHIN of its best (diverged points stop too)."""
        scores = {}
        for c in live:
            record = _first(read_summary(self.folder(c, budget), "a point's summary"), self.config["SEED"])
            scores[c] = record.get("val_bpc") if record else None
        stop = {c.name for c, score in scores.items() if score is None}
        for family in self.grid["FAMILIES"]:
            ranked = sorted((score, c.name) for c, score in scores.items() if score is not None and c.family == family)
            for rank, (score, name) in enumerate(ranked):
                if rank >= self.grid["KEEP"] and score > ranked[0][0] * (1 + self.grid["WITHIN"]):
                    stop.add(name)
        return stop

    def compare_at_the_top(self, budgets: list[float] | None = None) -> Path | None:
        """The paired difference (compare.py, with its diagnostics) between the best reservoir family and "the
        transformer" at the largest of ``budgets`` (default: the lead budget's too) both reached on every seed,
        written to comparisons/ once."""
        from reservoir.studies.comparison import Side, compare, describe

        report = self.report()
        reference, seeds = report["reference"], [self.config["SEED"], *self.extra_seeds()]
        full = {f: {p["budget"]: p for p in points if sorted(p["seeds"]) == seeds}
                for f, points in report["envelope"].items()}
        reservoirs = [f for f in RESERVOIR_FAMILIES if full.get(f)]
        if reference is None or not reservoirs:
            return None
        shared = [b for b in budgets or self.all_budgets()
                  if b in full[reference] and any(b in full[f] for f in reservoirs)]
        if not shared:
            return None
        budget = shared[-1]
        best = min((full[f][budget]["bpc_mean"], f) for f in reservoirs if budget in full[f])[1]
        out = self.path / COMPARISONS / f"{point_name(budget)}-{best}-vs-{reference}.json"
        if out.exists():
            return out

        def side(family):
            cell = full[family][budget]["cell"]
            folders = [self.folder(c, budget, seeds=extra) for c in self.cells() if c.name == cell
                       for extra in (False, True)][: 2 if seeds[1:] else 1]
            return Side(folders, FAMILIES[family][0])

        say(f"frontier {self.name}: the paired comparison at {budget:.3g} FLOPs, {best} against {reference}")
        try:
            result = compare(side(best), side(reference), diagnostics=True)
        except CheckpointError as missing:  # records travel in git, checkpoints do not: the stages go on
            say(f"frontier {self.name}: no paired comparison at {budget:.3g} FLOPs: {missing}. It scores the "
                "points' checkpoints, which stay on the machine that trained them (never committed): run this "
                "command there, or train those points again here (move their folders aside and run it again)")
            return None
        result.update({"budget": budget, "family_a": best, "family_b": reference})
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, result)
        say(describe(result))
        return out

    # --- records and report
    def records(self) -> list[dict]:
        return collect_records(self.path, [c.record() for c in self.cells()], self.all_budgets())

    def report(self) -> dict:
        study = read_json(self.path / STUDY_FILE, "the study's grid")
        return build_frontier(self.records(), study, collect_references(self.path), collect_comparisons(self.path),
                              collect_controls(self.path, study["cells"], self.budgets))


def measure_cells(study: FrontierStudy):
    """``measure(cell)`` for ``FrontierStudy.plan``: each cell's model built on the study's data (prepared
    once, cached for the points) and one training step counted (scaling.step_cost)."""
    from reservoir.data.tokens import prepare_data

    data = prepare_data(study.config)
    seen: dict = {}

    def measure(cell: Cell) -> tuple[float, int, int]:
        key = (cell.family, cell.size, cell.batch_size)
        if key not in seen:
            config = parse_overrides([*study.settings, *cell.settings(), f"FLOP_BUDGET={study.budgets[0]!r}"])
            per_step, params = step_cost(cell.model, config, data)
            if per_step is None:
                raise FrontierError(f"{cell.family} is not gradient-trained: a frontier grid needs learning rates")
            batch = model_settings(config, cell.model)["BATCH_SIZE"]
            seen[key] = (per_step, params, batch * config["GRAD_ACCUM"] * config["SEQ_LEN"])
        return seen[key]

    return measure


class FrontierExit(Exception):
    """Points ended without finishing: the study stops there, with the first point's exit code."""

    def __init__(self, code: int, message: str):
        super().__init__(message)
        self.code = code


LOCATIONS = ("RESULTS_DIR", "CACHE_DIR", "DATA_DIR", "DATASET", "TRAIN_PATH", "VAL_PATH")  # may differ per machine


def _placeless(settings: list[str]) -> list[str]:
    """A study's settings less where its data and folders are: the same study continues on another machine."""
    return [a for a in settings if a.partition("=")[0].strip().upper() not in LOCATIONS]


GROWABLE = ("FAMILIES", "SIZES", "LEARNING_RATES", "BATCH_SIZES")  # new values: new cells, which join the study
FREE = ("WORKERS",)  # how the study runs, not what it measures


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


def _continue_or_start(folder: Path) -> list[str]:
    """Where a stage's run writes: ``folder``, continued if a run already started there."""
    return [f"RESULTS_DIR={folder.parent}",
            f"RESUME={folder}" if (folder / "config.json").exists() else f"RUN_NAME={folder.name}"]


def grid_cells(grid: dict) -> list[Cell]:
    return [Cell(f, s, lr, b) for f in grid["FAMILIES"] for s in grid["SIZES"] for lr in grid["LEARNING_RATES"]
            for b in grid["BATCH_SIZES"]]


def _first(records: list[dict], seed: int) -> dict | None:
    return next((r for r in records if r.get("seed") == seed), None)


def corpus_of(folder: Path) -> str:
    """What a run trained and was scored on, from its config.json (checked): the tokenizer and the splits'
    sizes, so that two studies of one corpus on two machines agree and two corpora never do."""
    data = read_run_config(folder)["data"]
    return (f"{data['tokenizer']} tokenizer {data['tokenizer_hash']}, {data['train_chars']:,} training and "
            f"{data['val_chars']:,} validation characters")


def _scores(record: dict, folder: Path) -> dict:
    """The fields every row of a report takes from a run's record (grid points, references, controls)."""
    return {"seed": record.get("seed"), "status": record.get("status"), "val_bpc": record.get("val_bpc"),
            "val_bpc_ci95": record.get("val_bpc_ci95"), "train_split_bpc": record.get("train_split_bpc"),
            "params_trained": record.get("params_trainable"), "train_flops": record.get("train_flops"),
            "train_tokens": record.get("train_tokens"), "epochs": record.get("epochs"),
            "train_seconds": record.get("train_seconds"), "data_source": record.get("data_source"),
            "folder": str(folder)}


def collect_records(path: Path, cells: list[dict], budgets: list[float]) -> list[dict]:
    """One row per point and seed that has a record: the cell, the budget, the scores, what it cost."""
    rows = []
    for cell in cells:
        for budget in budgets:
            for extra in (False, True):
                folder = path / cell["name"] / (point_name(budget) + ("-seeds" if extra else ""))
                if not (folder / "summary.json").exists():
                    continue
                corpus = corpus_of(folder)
                for r in read_summary(folder, "a point's summary"):
                    fit = r.get("fit") or {}
                    rows.append({**_scores(r, folder), "cell": cell["name"], "family": cell["family"],
                                 "size": cell["size"], "learning_rate": cell["learning_rate"],
                                 "batch_size": cell["batch_size"], "budget": budget, "envelope_seed": extra,
                                 "val_loss": r.get("val_loss"), "train_loss": r.get("train_loss"),
                                 "train_steps": r.get("train_steps"), "corpus": corpus,
                                 "spent_flops": (r.get("train_flops") or 0) - (fit.get("branched_at_flops") or 0),
                                 "spent_seconds": (r.get("train_seconds") or 0) - (fit.get("branched_at_seconds") or 0),
                                 "branched": bool(fit.get("branched_at_flops"))})
    return rows


def study_budgets(study: dict) -> list[float]:
    """A study file's grid budgets, then its lead budget if it has one."""
    lead = (study.get("stages") or {}).get("lead_budget")
    return [*study["budgets"], *([lead] if lead else [])]


def collect_references(path: Path) -> list[dict]:
    """One row per finished reference run (REFERENCES=True): its model, size and scores."""
    rows = []
    for name in REFERENCE_RUNS:
        folder = path / "references" / name
        if not (folder / "summary.json").exists():
            continue
        corpus = corpus_of(folder)
        for r in read_summary(folder, "a reference run's summary"):
            rows.append({**_scores(r, folder), "name": name, "model": r.get("model"), "corpus": corpus})
    return rows


def collect_comparisons(path: Path) -> list[dict]:
    """The paired comparisons the study wrote (compare_at_the_top), smallest budget first."""
    found = []
    for file in sorted((path / COMPARISONS).glob("*.json")) if (path / COMPARISONS).is_dir() else []:
        content = read_json(file, "a paired comparison")
        if not isinstance(content, dict) or not {"a", "b", "bpc_difference", "ci95_low", "ci95_high"} <= set(content):
            raise FrontierError(f"{file} is not a paired comparison (compare.py's JSON); delete it and run the "
                                "study's command again to redo it")
        found.append({**content, "file": file.name})
    return sorted(found, key=lambda c: c.get("budget") or 0)


def collect_controls(path: Path, cells: list[dict], budgets: list[float]) -> list[dict]:
    """One row per finished control run (CONTROLS=True) and seed: the cell it controls, the control, the scores.
    A folder under controls/ that names no cell and control of the study is refused in one line."""
    where = path / CONTROL_FOLDER
    if not where.is_dir():
        return []
    by_name = {c["name"]: c for c in cells}
    rows = []
    for folder in sorted(where.iterdir()):
        if not folder.is_dir() or folder.name == "logs":  # the controls' logs (scaling.run_points), not records
            continue
        name, _, control = folder.name.rpartition("+")
        cell = by_name.get(name)
        if cell is None or control not in CONTROLS.get(cell["family"], {}):
            raise FrontierError(f"{folder} is not a control of this study (<cell>+<control>, the controls: "
                                f"{', '.join(sorted({c for f in CONTROLS.values() for c in f}))}); move it out")
        for budget in budgets:
            point = folder / point_name(budget)
            if not (point / "summary.json").exists():
                continue
            corpus = corpus_of(point)
            for r in read_summary(point, "a control's summary"):
                rows.append({**_scores(r, point), "cell": name, "family": cell["family"], "control": control,
                             "budget": budget, "options": CONTROLS[cell["family"]][control],
                             "trained": r.get("trained"), "corpus": corpus})
    return rows


def envelope_cells(rows: list[dict], budgets: list[float]) -> dict:
    """{(family, budget): the cell with the lowest bits/char on the study's first seed}."""
    best: dict = {}
    for r in rows:
        if r["envelope_seed"] or r["val_bpc"] is None:
            continue
        key = (r["family"], r["budget"])
        if key not in best or r["val_bpc"] < best[key][0]:
            best[key] = (r["val_bpc"], r["cell"])
    return {key: cell for key, (_, cell) in best.items()}


def _interpolated_compute(points: list[tuple[float, float]], loss: float) -> float | None:
    """The compute at which a decreasing envelope (compute, loss) reaches ``loss``, log-log interpolated
    between its points; None outside their range."""
    for (c1, l1), (c2, l2) in zip(points, points[1:], strict=False):
        if min(l1, l2) <= loss <= max(l1, l2) and l1 != l2:
            t = (math.log(loss) - math.log(l1)) / (math.log(l2) - math.log(l1))
            return math.exp(math.log(c1) + t * (math.log(c2) - math.log(c1)))
    return None


def build_frontier(rows: list[dict], study: dict, references: list[dict] | None = None,
                   comparisons: list[dict] | None = None, controls: list[dict] | None = None) -> dict:
    """frontier.json's content from the point rows, the study's grid, its reference runs and its controls."""
    references, controls = references or [], controls or []
    corpora = sorted({r["corpus"] for r in [*rows, *references, *controls] if r.get("corpus")})
    if len(corpora) > 1:
        raise FrontierError(f"the records of study {study['study']} mix corpora ({' | '.join(corpora)}): one "
                            "frontier compares one corpus; keep each study's points in its own STUDY folder")
    sources = sorted({r["data_source"] for r in [*rows, *references] if r.get("data_source")})
    if not rows:
        raise FrontierError(f"study {study['study']} has no point records yet: run it first (python scaling.py "
                            "FAMILIES=... STUDY=...)")
    budgets, families = study_budgets(study), study["grid"]["FAMILIES"]
    winners = envelope_cells(rows, budgets)
    envelope: dict = {f: [] for f in families}
    for (family, budget), cell in sorted(winners.items(), key=lambda kv: kv[0][1]):
        seeds = [r for r in rows if r["cell"] == cell and r["budget"] == budget and r["val_bpc"] is not None]
        bpc = [r["val_bpc"] for r in seeds]
        first = next(r for r in seeds if not r["envelope_seed"])
        split = [r for r in seeds if r.get("train_split_bpc") is not None]  # seeds that scored the training split
        envelope[family].append({
            "budget": budget, "cell": cell, "size": first["size"], "learning_rate": first["learning_rate"],
            "batch_size": first["batch_size"], "params_trained": first["params_trained"],
            "bpc": first["val_bpc"], "bpc_mean": statistics.fmean(bpc), "bpc_sd": statistics.stdev(bpc)
            if len(bpc) > 1 else None, "seeds": [r["seed"] for r in seeds], "bpc_per_seed": bpc,
            "train_loss": first["train_loss"], "val_loss": first["val_loss"], "epochs": first["epochs"],
            "val_bpc_ci95": first.get("val_bpc_ci95"),
            "train_split_bpc": statistics.fmean(r["train_split_bpc"] for r in split) if split else None,
            "val_bpc_of_split_seeds": statistics.fmean(r["val_bpc"] for r in split) if split else None,
            "split_seeds": [r["seed"] for r in split],
            "train_flops": first["train_flops"], "steps": first["train_steps"]})
    isoflop = {f: {repr(b): sorted(({"size": s, "params_trained": p, "bpc": v} for s, p, v in _best_per(
        rows, f, b, "size")), key=lambda x: x["params_trained"]) for b in budgets} for f in families}
    lr_sensitivity = {f: {repr(b): sorted(({"learning_rate": lr, "bpc": v} for lr, _, v in _best_per(
        rows, f, b, "learning_rate")), key=lambda x: x["learning_rate"]) for b in budgets} for f in families}
    fits = {}
    for family, points in envelope.items():
        fits[family] = fit_curve([p["budget"] for p in points], [p["bpc_mean"] for p in points], budgets[0]) \
            if points else {"converged": False, "reason": "no points"}
    reference = _reference(envelope)
    multipliers = _multipliers(envelope, fits, reference)
    spent = {"points": sum(1 for r in rows), "flops": sum(r["spent_flops"] for r in rows),
             "train_cpu_hours": sum(r["spent_seconds"] for r in rows) / 3600,
             "flops_if_unbranched": sum(r["train_flops"] or 0 for r in rows)}
    ran = {r["cell"] + "@" + repr(r["budget"]) for r in rows if not r["envelope_seed"]}
    plan = study.get("plan", {})
    skipped = [{"cell": c, "budget": float(b), "reason": why} for c, row in plan.items() for b, why in row.items()
               if why is not None]
    pruned = [{"cell": c, "budget": float(b)} for c, row in plan.items() for b, why in row.items()
              if why is None and f"{c}@{b}" not in ran]
    return {"study": study["study"], "budgets": budgets, "families": families, "grid": study["grid"],
            "settings": study["settings"], "data_source": sources[0] if sources else None,
            "corpus": corpora[0] if corpora else None, "comparisons": comparisons or [],
            "curve": "bits/char = E + A * (C / C0) ** -alpha over the envelope's points",
            "envelope": envelope, "fits": fits, "n_opt": {f: {repr(p["budget"]): p["params_trained"]
                                                             for p in pts} for f, pts in envelope.items()},
            "isoflop": isoflop, "lr_sensitivity": lr_sensitivity, "reference": reference,
            "compute_multiplier": multipliers, "grid_points": rows, "references": references,
            "controls": _against_envelope(controls, rows),
            "lead_budget": (study.get("stages") or {}).get("lead_budget"), "stages": study.get("stages"),
            "skipped": skipped,
            "not_run_pruned": pruned, "spent": spent}


def _against_envelope(controls: list[dict], rows: list[dict]) -> list[dict]:
    """Each control row with the point it controls: the same cell, budget and seed, unchanged."""
    points = {(r["cell"], r["budget"], r["seed"]): r for r in rows}
    out = []
    for c in controls:
        point = points.get((c["cell"], c["budget"], c["seed"]))
        out.append({**c, "envelope_bpc": point["val_bpc"] if point else None,
                    "envelope_params_trained": point["params_trained"] if point else None,
                    "difference": c["val_bpc"] - point["val_bpc"] if point and None not in (
                        c["val_bpc"], point["val_bpc"]) else None})
    return out


def _best_per(rows, family, budget, key):
    """(value of ``key``, params, best bits/char over the other grid axes) for one family and budget."""
    best: dict = {}
    for r in rows:
        if r["family"] == family and r["budget"] == budget and not r["envelope_seed"] and r["val_bpc"] is not None:
            if r[key] not in best or r["val_bpc"] < best[r[key]][1]:
                best[r[key]] = (r["params_trained"], r["val_bpc"])
    return [(k, p, v) for k, (p, v) in best.items()]


def _reference(envelope: dict) -> str | None:
    """The transformer recipe whose envelope is lower (at the most budgets both reached): 'the transformer'."""
    present = [f for f in REFERENCE_FAMILIES if envelope.get(f)]
    if len(present) < 2:
        return present[0] if present else None
    a, b = ({p["budget"]: p["bpc_mean"] for p in envelope[f]} for f in present)
    shared = set(a) & set(b)
    wins = sum(a[x] < b[x] for x in shared)
    return present[0] if wins * 2 >= len(shared) else present[1]


def _multipliers(envelope: dict, fits: dict, reference: str | None) -> dict:
    """Per family and budget: the FLOPs the reference's envelope needs to reach the family's envelope loss,
    over the budget (> 1: the family is worth more compute than the transformer). Interpolated between the
    reference's points; from its fitted curve outside them (marked extrapolated); None where neither reaches."""
    if reference is None:
        return {}
    ref_points = [(p["budget"], p["bpc_mean"]) for p in envelope[reference]]
    fit = fits.get(reference, {})
    out = {}
    for family, points in envelope.items():
        rows = []
        for p in points:
            needed, how = _interpolated_compute(ref_points, p["bpc_mean"]), "interpolated"
            if needed is None and fit.get("converged") and p["bpc_mean"] > fit["E"]:
                needed, how = fit["C0"] * ((p["bpc_mean"] - fit["E"]) / fit["A"]) ** (-1 / fit["alpha"]), \
                    "extrapolated"
            if needed is None and ref_points:  # past the reference's measured range: a bound, not a value
                if p["bpc_mean"] < min(loss for _, loss in ref_points):
                    needed, how = max(c for c, _ in ref_points), "at least"
                else:
                    needed, how = min(c for c, _ in ref_points), "at most"
            rows.append({"budget": p["budget"], "bpc": p["bpc_mean"], "reference_flops": needed,
                         "multiplier": needed / p["budget"] if needed else None, "how": how})
        out[family] = rows
    return out


# --------------------------------------------------------------------- outputs


def report_from_records(folder: Path) -> dict:
    """A study's report from its committed records alone (no checkpoints needed)."""
    folder = Path(folder)
    if not (folder / STUDY_FILE).exists():
        raise FrontierError(f"{folder} holds no {STUDY_FILE}: not a frontier study folder (REPORT=results/<study>)")
    study = read_json(folder / STUDY_FILE, "the study's grid")
    try:
        rows = collect_records(folder, study["cells"], study_budgets(study))
        references = collect_references(folder)
        controls = collect_controls(folder, study["cells"], study["budgets"])
    except ResultsError:
        raise
    except (KeyError, TypeError) as e:
        raise FrontierError(f"{folder / STUDY_FILE} is damaged ({e}); re-run the study's command") from None
    return build_frontier(rows, study, references, collect_comparisons(folder), controls)


__all__ = ["FrontierStudy", "FrontierError", "FrontierExit", "FAMILIES", "SIZES", "FRONTIER_KEYS", "Cell",
           "build_frontier", "report_from_records", "collect_comparisons", "collect_controls", "collect_references",
           "envelope_cells", "parse_grid"]
