"""The fair frontier: every family at its best at every budget (lower envelopes, IsoFLOP profiles).

    study = FrontierStudy.from_args(own, settings)   # FRONTIER_KEYS, then run settings
    study.run(run_points, measure_cells(study))   # studies.runner.run_points: the points side by side
    report = study.report()      # frontier.json: envelopes, grid, IsoFLOP profiles, N_opt, fits, multipliers
    write_study(report, study.path)   # report.py: frontier.json, frontier.md and frontier.png

A family is a model with fixed options (``FAMILIES``: the transformer in GPT-2's and in Transformer++'s
recipe, the LSTM and the reservoirs); its grid is size presets (``SIZES``, >= 8x in trained parameters)
x learning rates x batch sizes. A cell at a budget is skipped when it would take fewer than MIN_STEPS
optimizer steps or more than MAX_TOKENS_PER_PARAM tokens per trained parameter (both listed).

Every point trains with the wsd schedule (reservoir/run/train.py), so a cell's budgets share one stable
phase: the point at the next budget continues the stable phase of the point before it (STABLE_FROM)
and pays only its extension and its own cooldown. Successive halving bounds the cost: a cell goes on to
the next budget only if its point is among the family's KEEP best there, or within WITHIN of the
family's best; cells too large for the budgets so far join when their steps suffice. The envelope
points are then re-run on ENVELOPE_SEEDS seeds in all (mean ± sd). Stages a running study may add
(STAGE_KEYS): the reference lines, the CONTROLS, the CONTEXTS, the leaders at LEAD_BUDGET, the paired
comparison of the best reservoir family against the transformer, and the steps beyond the grid's EDGES.

Each point is an ordinary run folder, RESULTS_DIR/STUDY/<cell>/flops-<budget>, run as its own
TinyStories.py process on its own device: a CPU core (one thread, so its score does not depend on WORKERS),
a GPU or a TPU chip block (WORKERS='auto', DEVICES_PER_POINT; platform/device.py). Finished points' records
go into RESULTS_DIR/STUDY/points.jsonl as they finish (studies/store.py), the one file a study commits;
a study interrupted anywhere continues with the same command, and one that holds only its records (a
clone: no point folders, no checkpoints) skips every finished point. ``report_from_records`` rebuilds
every output from the records alone (``python scaling.py REPORT=results/<study>``).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import NamedTuple

from reservoir.config import load_plugins, named_plugins, parse_overrides
from reservoir.models.registry import MODELS, PLUGINS
from reservoir.models.settings import model_settings
from reservoir.platform.device import folded_points, resolve_kind, scans_recurrences, study_slots
from reservoir.platform.files import portable_path
from reservoir.platform.machine import processor
from reservoir.platform.messages import say, warn
from reservoir.run.checkpoint import CheckpointError, checkpoint_file
from reservoir.run.evaluation import CONTEXTS
from reservoir.run.records import ResultsError, read_json, write_json_atomic, write_signed_json
from reservoir.studies.budgets import parse_budgets, point_name, positive_numbers, step_cost, study_name
from reservoir.studies.frontier.analysis import draw_families, envelope_cells, study_report
from reservoir.studies.frontier.contexts import (
    LONG_CONTEXT_FACTOR,
    long_context_folder,
    long_context_settings,
    read_context_scores,
    score_point,
    write_context_scores,
)
from reservoir.studies.frontier.draws import draws_anything
from reservoir.studies.frontier.edges import (
    collect_edge_steps,
    edge_budgets,
    edge_folder,
    edge_walks,
    parse_cell,
    read_edge_file,
    write_edge_file,
)
from reservoir.studies.frontier.folding import fold_jobs, members, probed_folds
from reservoir.studies.frontier.grid import (
    CONTROLS,
    DEFAULT_BUDGETS,
    EVERY_SEED_CONTROLS,
    FAMILIES,
    FREE,
    LATER_STAGES,
    ONE_PASS,
    OWN_SETTINGS,
    PRESETS,
    REFERENCE_RUNS,
    RESERVOIR_FAMILIES,
    RUN_SETTINGS,
    STAGE_KEYS,
    Cell,
    FrontierError,
    FrontierExit,
    _grid_changes,
    _placeless,
    grid_cells,
    parse_grid,
    parse_stages,
    portable_settings,
    study_command,
)
from reservoir.studies.frontier.held import (
    LADDERS,
    collect_held_rows,
    held_budgets,
    held_folder,
    held_moves,
    held_walks,
    recorded_config,
    walked,
)
from reservoir.studies.frontier.records import (
    COMPARISONS,
    CONTROL_FOLDER,
    REPLAYS,
    STUDY_FILE,
    STUDY_FILE_REMEDY,
    _first,
    check_family_definitions,
    check_records_file,
    collect_records,
    collect_references,
    compared_cells,
    draw_folder,
    note_records,
    processor_of,
    read_study_file,
)
from reservoir.studies.runner import hold_study
from reservoir.studies.store import PointRecords


class StageJob(NamedTuple):
    """A point a stage trains: its folder and TinyStories.py arguments, and for a plan the cell it is priced as
    (None: a one-pass reference), its FLOP budget and its seeds."""
    folder: Path
    args: list[str]
    cell: Cell | None = None
    budget: float | None = None
    seeds: int = 1


def compared_families(bpc_at_budget: dict[str, float], held: Iterable[str] = ()) -> list[str]:
    """The reservoir families a study compares with "the transformer", paired, at a budget (``bpc_at_budget``:
    each one's envelope bits/char there): the best, then each write-gated one (a reservoir that chooses what it
    writes, whose interval REPORT gives whether or not it is the best), then each family of ``held`` (those
    whose comparison there is already written) that has an envelope point there: the best of a smaller grid
    stays compared when the grid grows, so its comparison is kept of the envelope as it is now."""
    best = min(bpc_at_budget, key=lambda f: (bpc_at_budget[f], f))
    chosen, held = [best, *(f for f in bpc_at_budget if f.endswith("+write") and f != best)], set(held)
    return [*chosen, *(f for f in bpc_at_budget if f in held and f not in chosen)]


@dataclass
class FrontierStudy:
    name: str
    budgets: list[float]
    grid: dict
    settings: list[str]  # TinyStories.py KEY=VALUE held for every point (the study's defaults first)
    config: dict  # the validated settings of the first cell's first point
    stages: dict = field(default_factory=lambda: {"lead_budget": None, "leaders": "auto", "references": False,
                                                  "controls": False, "contexts": False, "edges": False,
                                                  "draws": False})
    path: Path = field(init=False)
    store: PointRecords = field(init=False, repr=False)
    corpus: str | None = field(default=None, init=False)  # the data's corpus_label, once measure_cells read it
    vocab: int | None = field(default=None, init=False)  # and its vocabulary's size
    _slots: list | None = field(default=None, init=False, repr=False)
    _groups: dict = field(default_factory=dict, init=False, repr=False)  # a folded group's first folder: all of it
    storage_url: str | None = None  # STUDY_STORAGE: the database the hosts of a shared study meet in
    heartbeat_s: float = 30.0  # HEARTBEAT: a host that stops beating for 4x this loses its points to others
    shared: object = field(default=None, init=False, repr=False)
    planned: dict | None = field(default=None, init=False)  # plan.planned_flops: what REPORT sets spent against
    replayed: dict = field(default_factory=dict, init=False)  # (point, seed) -> its record and its replay's score

    def __post_init__(self):
        self.path = Path(self.config["RESULTS_DIR"]) / self.name
        self.store = PointRecords(self.path)

    @classmethod
    def from_args(cls, own: dict[str, str], settings: list[str]) -> FrontierStudy:
        load_plugins(named_plugins(settings, []))  # a plugin's families, before FAMILIES names them
        grid = parse_grid(own)
        budgets = parse_budgets(own["BUDGETS"]) if "BUDGETS" in own else list(DEFAULT_BUDGETS)
        name = study_name(own, "frontier", FrontierError)
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
        study = cls(name, budgets, grid, study_settings, config, parse_stages(own, budgets, grid))
        study.keep_recorded_stages({k for k in own if k in STAGE_KEYS})
        study.storage_url = own.get("STUDY_STORAGE") or None
        if "HEARTBEAT" in own:
            study.heartbeat_s = positive_numbers("HEARTBEAT", own["HEARTBEAT"], "30", FrontierError)[0]
        return study

    def keep_recorded_stages(self, given: set[str]) -> None:
        """A continued study keeps the stages its study file records (they are part of what it found): a stage the
        command leaves out is the recorded one, so no report loses a section. A command that turns a recorded
        stage off, drops a recorded leader or names another lead budget, is refused in one line that gives the
        study's recorded command; one that adds a stage or a leader (a family its grid grew by) adds it."""
        if not (self.path / STUDY_FILE).is_file():
            return
        recorded_file = read_study_file(self.path)
        recorded = recorded_file.get("stages") or {}
        kept = []
        for key, value in recorded.items():
            if (key not in self.stages and key not in LATER_STAGES) or self.stages.get(key) == value:
                continue
            if key.upper() not in given:
                self.stages[key] = value
                kept.append(f"{key.upper()}={own_text(value)}")
            elif key in ("leaders", "held") and isinstance(value, list) and self.stages[key] is True:
                continue  # every family's walks: the named ones' among them
            elif key in ("leaders", "held") and isinstance(value, list) and isinstance(self.stages[key], list) \
                    and set(value) <= set(self.stages[key]):
                continue  # more leaders: the recorded ones' points stand, the new ones' are added
            elif value not in (False, None, "auto"):
                raise FrontierError(f"STUDY={self.name} records {key.upper()}={own_text(value)}; continuing it with "
                                    f"{key.upper()}={own_text(self.stages.get(key))} would drop what that stage found. "
                                    f"Its recorded command continues it: {study_command(recorded_file)}")
        if kept:
            say(f"frontier {self.name}: the command leaves out stages its study file records; kept as recorded: "
                f"{' '.join(kept)} (every stage a study recorded goes on, and its walks, controls and comparisons "
                "stand)")

    # --- what runs where
    def cells(self) -> list[Cell]:
        return grid_cells(self.grid)

    def all_budgets(self) -> list[float]:
        return [*self.budgets, *([self.stages["lead_budget"]] if self.stages["lead_budget"] else [])]

    def folder(self, cell: Cell, budget: float, seeds: bool = False) -> Path:
        return self.path / cell.name / (point_name(budget) + ("-seeds" if seeds else ""))

    def first_seed_record(self, cell: Cell, budget: float) -> dict | None:
        """The cell's record at a grid budget on the study's first seed (the one halving ranks), None if not yet."""
        return _first(self.store.summary(self.folder(cell, budget)) or [], self.config["SEED"])

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

    def direct_args(self, cell: Cell, budget: float, folder: Path) -> list[str]:
        """A stage's point trained from step 0 (no stable phase to branch off) into ``folder``, or continued there."""
        return [*self.settings, *cell.settings(), f"FLOP_BUDGET={budget!r}", *_continue_or_start(folder)]

    def slots(self) -> list:
        """Where this host runs the study's points at once: WORKERS of the slots its devices give (a core, a
        GPU or a TPU chip block each, DEVICES_PER_POINT devices a point), checked when the study starts."""
        if self._slots is None:
            sharing = self.grid.get("POINTS_PER_DEVICE", 1)
            kind = resolve_kind(self.config["DEVICE"], self.config["USE_TPU"])
            if sharing == "probe" and kind == "tpu":
                raise FrontierError("POINTS_PER_DEVICE=probe times folds in the study's own process, on a CPU core "
                                    "or a GPU, and a TPU chip is held by its points' processes: use "
                                    "POINTS_PER_DEVICE=auto (a TPU chip folds up to 8) or a number")
            self._slots = study_slots(self.config, self.grid["WORKERS"], self.grid.get("DEVICES_PER_POINT", 1),
                                      sharing if isinstance(sharing, int) else 1)
        return self._slots

    def _point_finished(self, folder: Path) -> bool:
        """Whether a point (or a folded group, named by its first point's folder) has its records."""
        return all(self.finished(f, self.extra_seeds() if f.name.endswith("-seeds") else [self.config["SEED"]])
                   for f in self._groups.get(folder, [folder]))

    def extra_seeds(self) -> list[int]:
        return [self.config["SEED"] + k for k in range(1, self.grid["ENVELOPE_SEEDS"])]

    def finished(self, folder: Path, seeds: list[int]) -> bool:
        summary = self.store.summary(folder)
        return summary is not None and set(seeds) <= {r.get("seed") for r in summary}

    # --- the plan: which cells each budget can take
    def plan(self, measure) -> dict:
        """{cell name: {budget: None (runnable) or why it is skipped}} from ``measure(cell) -> (FLOPs per step,
        trained parameters, tokens per step)``."""
        plan = {cell.name: {budget: self.skip_reason(cell, budget, measure) for budget in self.budgets}
                for cell in self.cells()}
        if not any(reason is None for cells in plan.values() for reason in cells.values()):
            raise FrontierError("every cell of the grid is skipped at every budget (too few steps or too many tokens "
                                "per parameter): widen BUDGETS, add SIZES, or lower MIN_STEPS")
        return plan

    def skip_reason(self, cell: Cell, budget: float, measure, tokens_per_param: bool = True) -> str | None:
        """Why ``cell`` cannot take ``budget`` (too few optimizer steps, or too many tokens per trained parameter
        where ``tokens_per_param``), or None."""
        per_step, params, tokens_per_step = measure(cell)
        steps = math.ceil(budget / per_step)
        warmup, limit = self.config["WARMUP_STEPS"], self.grid["MAX_TOKENS_PER_PARAM"]
        if steps < self.grid["MIN_STEPS"] or steps * (1 - self.config["COOLDOWN_FRACTION"]) <= warmup:
            return f"{steps} steps < {max(self.grid['MIN_STEPS'], warmup)}"
        if tokens_per_param and steps * tokens_per_step / params > limit:
            return f"{steps * tokens_per_step / params:.0f} tokens per parameter > {limit:g}"
        return None

    def check_corpus(self) -> None:
        """The data here must be the text the study's points trained on (by content: it may have moved to
        another folder or machine), before any point is trained or any record rewritten."""
        if self.corpus is None:
            return
        file = self.path / STUDY_FILE
        there = {read_study_file(self.path).get("corpus")} if file.exists() else set()
        there |= {r.get("corpus") for r in [*self.records(), *collect_references(self.store)]}
        other = sorted(c for c in there - {None, self.corpus})
        if other:
            raise FrontierError(f"STUDY {self.name} trained on another corpus ({other[0]}) than the data of this "
                                f"command ({self.corpus}): continue it with its own data (DATASET: the same text, "
                                "at any path), or name a new STUDY for this corpus")

    def study_content(self, plan: dict) -> dict:
        """frontier-study.json's content: what REPORT rebuilds from, and what a continued study must match."""
        return {"study": self.name, "budgets": self.budgets, "grid": self.grid,
                "settings": portable_settings(self.settings),
                "cells": [c.record() for c in self.cells()],
                "plan": {name: {repr(b): why for b, why in row.items()} for name, row in plan.items()},
                "seed": self.config["SEED"], "extra_seeds": self.extra_seeds(),
                # a stage added later is written once asked for: a study without it keeps its file as it was
                "stages": {k: v for k, v in self.stages.items() if k not in LATER_STAGES or v},
                **({"corpus": self.corpus} if self.corpus else {}),
                **({"planned": self.planned} if self.planned else {}),
                **({"plugins": plugins} if (plugins := self.plugin_code()) else {})}

    def plugin_code(self) -> dict[str, dict]:
        """Each grid family a plugin declared: the plugin (its module, or its file from the repository) and its
        file's SHA-256."""
        code = {}
        for family in self.grid["FAMILIES"]:
            source = MODELS[FAMILIES[family][0]].source
            if source:
                code[family] = {"plugin": portable_path(source), "sha256": PLUGINS[source]}
        return code

    def write_study_file(self, plan: dict) -> None:
        content = self.study_content(plan)
        path = self.path / STUDY_FILE
        if not path.exists() and self.store.has_records():
            raise FrontierError(f"{path} is missing, but {self.path} holds the records of trained points: "
                                f"{STUDY_FILE_REMEDY}")
        if path.exists():
            recorded = read_study_file(self.path)
            check_records_file(recorded, self.store, training=True)  # a clone's lost records: restored
            check_family_definitions(self.store, self.cells())
            changed = study_changes(recorded, content)
            if changed:
                raise FrontierError(f"{path} records STUDY={self.name} otherwise than this command (what differs: "
                                    f"{'; '.join(changed)}): run it with the same command to continue it (a grid "
                                    "list may grow: FAMILIES, SIZES, LEARNING_RATES, BATCH_SIZES), or name a new STUDY")
            if "records" in recorded:
                content["records"] = recorded["records"]
            # how this host runs it (WORKERS and the like) is its own: the study's file keeps what it recorded, and
            # no such setting added since it was written (POINTS_PER_DEVICE)
            content["grid"] = {k: recorded["grid"][k] if k in FREE else v for k, v in content["grid"].items()
                               if k not in FREE or k in recorded["grid"]}
            if "planned" in recorded and recorded["grid"] == content["grid"] and recorded["budgets"] == self.budgets:
                content["planned"] = recorded["planned"]  # what was planned before it ran, until its grid grows
        write_signed_json(path, content)

    def _point_ended(self, code: int | None) -> None:
        """A point that finished goes into points.jsonl at once: a stage runs for hours, and what is committed
        while it runs, or left by a machine that dies, holds every point finished so far. A records file that
        cannot be written now is said here and refused when the stage ends (the other points go on)."""
        if code == 0:
            try:
                self._pack_records()
            except ResultsError as e:
                warn(f"points.jsonl not brought up to date: {e}")

    def _pack_records(self) -> None:
        """points.jsonl from the points here and the records it held, and the study file's note of it."""
        if self.store.pack() is not None and (self.path / STUDY_FILE).exists():
            note_records(self.path, self.store, check=False)

    def run(self, run_points, measure) -> None:
        """Every budget, smallest first: run the live cells' points (``run_points([(folder, args), ...], workers)``
        -> exit codes), then keep each family's best; finally the envelope points' extra seeds.
        ``measure(cell) -> (FLOPs per step, trained parameters, tokens per step)`` (``measure_cells``)."""
        from reservoir.studies.frontier.plan import planned_flops

        plan = self.plan(measure)
        self.slots()  # a device or WORKERS this host cannot give is refused before the study is touched
        self.planned = planned_flops(self, measure)
        lock = hold_study(self.path, self.name)  # one runner per study: a second copy stops here
        try:
            if self.storage_url:  # many hosts, one study: what the others recorded first, their grid checked
                from reservoir.studies.frontier.shared import SharedPoints

                self.shared = SharedPoints(self.storage_url, self.name, self.heartbeat_s)
                self.shared.check_identity(self.study_content(plan), study_changes)
            self.check_corpus()
            # the study file first: a host that joins late (an empty folder) then pulls the others' records beside it
            self.write_study_file(plan)
            if self.shared is not None:
                self.shared.push(self.store, self._point_finished)
                self.shared.pull(self.store)
                self._pack_records()
            self._run_stages(plan, run_points, measure)
        finally:
            os.close(lock)

    def _run_stages(self, plan: dict, run_points, measure) -> None:
        skipped = sum(reason is not None for row in plan.values() for reason in row.values())
        say(f"frontier {self.name}: {len(plan)} cells x {len(self.budgets)} budgets, {skipped} cell-budgets skipped "
            f"(listed in {self.path / STUDY_FILE})")
        seed = self.config["SEED"]
        for budget, live, revived, last_run in self.halving(plan):
            if revived:
                say(f"frontier {self.name}: {budget:.3g} FLOPs: {', '.join(c.name for c in revived)} back, for "
                    "families whose kept cells no longer fit this budget (too many tokens per parameter)")
            todo = [c for c in live if not self.finished(self.folder(c, budget), [seed])]
            say(f"frontier {self.name}: {budget:.3g} FLOPs: {len(live)} cells, {len(live) - len(todo)} already "
                f"finished, {len(todo)} to train")
            self._run_all([(self.folder(c, budget), self.point_args(c, budget, last_run.get(c.name))) for c in todo],
                          run_points, budget)
        winners = envelope_cells(self.records(), self.budgets)
        todo = [(c, b) for c in self.cells() for b in self.budgets
                if (c.family, b) in winners and winners[(c.family, b)] == c.name and self.extra_seeds()
                and not self.finished(self.folder(c, b, seeds=True), self.extra_seeds())]
        todo.sort(key=lambda cell_budget: -cell_budget[1])  # the top budget's first: the claim and comparison
        if todo:
            say(f"frontier {self.name}: the envelope's {len(todo)} points on seeds {self.extra_seeds()}")
            self._run_all([(self.folder(c, b, seeds=True), self.seed_args(c, b)) for c, b in todo], run_points, None)
        # the grid's top budget, the claim: before the hours of the stages
        self.compare_at_the_top(self.budgets, run_points)
        if self.stages["references"]:
            self._run_references(run_points)
        if self.stages.get("controls"):
            self._run_controls(run_points)
        if self.stages.get("contexts"):
            self._run_contexts(run_points)
        if self.stages["lead_budget"]:
            self._run_leaders(run_points, measure)
        self.compare_at_the_top(run_points=run_points)
        if self.stages.get("edges"):
            self._run_edges(run_points, measure)
        if self.stages.get("held"):
            self._run_held(run_points)
        if self.stages.get("draws"):
            self._run_draws(run_points)
        self._pack_records()

    def reference_jobs(self) -> list[StageJob]:
        """The reference runs not finished yet (REFERENCES=True)."""
        jobs = []
        for name, options in REFERENCE_RUNS.items():
            folder = self.path / "references" / name
            if not self.finished(folder, [self.config["SEED"]]):
                jobs.append(StageJob(folder, [*self.settings, *options, *ONE_PASS, *_continue_or_start(folder)]))
        return jobs

    def _run_references(self, run_points) -> None:
        jobs = self.reference_jobs()
        say(f"frontier {self.name}: {len(REFERENCE_RUNS) - len(jobs)} reference runs finished, {len(jobs)} to run")
        self._run_all(jobs, run_points, None)

    def control_folder(self, cell: Cell, control: str, budget: float) -> Path:
        return self.path / CONTROL_FOLDER / f"{cell.name}+{control}" / point_name(budget)

    def control_jobs(self) -> list[StageJob]:
        """Each family's controls at the grid's top budget not finished yet, on its envelope configuration there and
        the study's first seed (every envelope seed for EVERY_SEED_CONTROLS), trained from step 0 (a control has no
        stable phase to branch off)."""
        top, first = self.budgets[-1], [self.config["SEED"]]
        winners, cells = envelope_cells(self.records(), self.budgets), {c.name: c for c in self.cells()}
        jobs = []
        for family in self.grid["FAMILIES"]:
            if (family, top) not in winners:
                continue
            cell = cells[winners[(family, top)]]
            for control in CONTROLS.get(family, {}):
                folder = self.control_folder(cell, control, top)
                seeds = [*first, *self.extra_seeds()] if control in EVERY_SEED_CONTROLS else first
                if self.finished(folder, seeds):
                    continue
                jobs.append(StageJob(folder, [*self.settings, *cell.settings(control), f"FLOP_BUDGET={top!r}",
                                              *_continue_or_start(folder),
                                              *([f"SEEDS={','.join(map(str, seeds))}"] if seeds != first else [])],
                                     cell, top, len(seeds)))
        return jobs

    def _run_controls(self, run_points) -> None:
        jobs = self.control_jobs()
        say(f"frontier {self.name}: the controls at {self.budgets[-1]:.3g} FLOPs: {len(jobs)} runs to train")
        self._run_all(jobs, run_points, self.budgets[-1])

    def draw_jobs(self, report: dict) -> list[StageJob]:
        """DRAWS=True: for each of ``draw_families`` whose frozen part is drawn at random, its envelope configuration
        at the top budget drawn with each envelope seed (DRAW_SEED) and trained on each (SEED), from step 0 (a draw
        of its own has no stable phase to branch off): a draws x seeds square, all of it trained on one machine
        (its diagonal is the envelope's own runs trained again: a record from another processor may score up to
        0.05 bits/char apart, more than a draw moves it). A family that draws nothing (a set transition, or nothing
        frozen) trains none."""
        top, seeds = self.budgets[-1], [self.config["SEED"], *self.extra_seeds()]
        at_top = {f: p for f, points in report["envelope"].items() for p in points if p["budget"] == top}
        cells, jobs = {c.name: c for c in self.cells()}, []
        for family in draw_families(report, top):
            cell = cells[at_top[family]["cell"]]
            if not draws_anything(self.store, self.folder(cell, top), family):
                continue
            for draw in seeds:
                folder = draw_folder(self.path, cell.name, draw, top)
                if not self.finished(folder, seeds):
                    jobs.append(StageJob(folder, [*self.settings, *cell.settings(), f"FLOP_BUDGET={top!r}",
                                                  f"DRAW_SEED={draw}", f"SEEDS={','.join(map(str, seeds))}",
                                                  *_continue_or_start(folder)], cell, top, len(seeds)))
        return jobs

    def _run_draws(self, run_points) -> None:
        jobs = self.draw_jobs(self.report(views=False))
        say(f"frontier {self.name}: the draw against the seed at {self.budgets[-1]:.3g} FLOPs: {len(jobs)} runs to "
            "train")
        self._run_all(jobs, run_points, self.budgets[-1])

    def context_leaders(self, report: dict) -> tuple[dict, list[str]]:
        """The top budget's envelope points ({family: point}) and the families CONTEXTS=True trains at 4 x SEQ_LEN
        (LEADERS; auto: "the transformer" and the best reservoir family)."""
        top = self.budgets[-1]
        at_top = {f: p for f, points in report["envelope"].items() for p in points if p["budget"] == top}
        reservoirs = sorted((at_top[f]["bpc_mean"], f) for f in RESERVOIR_FAMILIES if f in at_top)
        leaders = [f for f in ((report["reference"], reservoirs[0][1] if reservoirs else None)
                               if self.stages["leaders"] == "auto" else self.stages["leaders"]) if f in at_top]
        return at_top, leaders

    def context_jobs(self, report: dict) -> list[StageJob]:
        """The leaders' runs at 4 x SEQ_LEN (CONTEXTS=True) not finished yet, at the same FLOPs and tokens a step."""
        top, seed, seq = self.budgets[-1], self.config["SEED"], self.config["SEQ_LEN"]
        cells = {c.name: c for c in self.cells()}
        at_top, leaders = self.context_leaders(report)
        jobs = []
        for family in leaders:
            cell = cells[at_top[family]["cell"]]
            folder = long_context_folder(self.path, cell.name, top, seq)
            if not self.finished(folder, [seed]):
                jobs.append(StageJob(folder, [*self.settings, *cell.settings(), f"FLOP_BUDGET={top!r}",
                                              *long_context_settings(cell.batch_size, seq),
                                              *_continue_or_start(folder)], cell, top))
        return jobs

    def _run_contexts(self, run_points) -> None:
        """CONTEXTS=True (contexts.py): the top budget's envelope points scored at every evaluation context, and
        the leaders trained at 4 x SEQ_LEN (``context_jobs``), scored the same way."""
        top, seed, seq = self.budgets[-1], self.config["SEED"], self.config["SEQ_LEN"]
        report, cells = self.report(views=False), {c.name: c for c in self.cells()}
        at_top, leaders = self.context_leaders(report)
        jobs = self.context_jobs(report)
        say(f"frontier {self.name}: the leaders at SEQ_LEN={seq * LONG_CONTEXT_FACTOR}, {top:.3g} FLOPs: {len(jobs)} "
            "runs to train")
        self._run_all(jobs, run_points, top)
        known = read_context_scores(self.path) or {}
        rows, data_cache = dict(known.get("rows") or {}), {}
        for family, long in [(f, False) for f in sorted(at_top)] + [(f, True) for f in leaders]:
            name = f"{family}@SEQ_LEN={seq * LONG_CONTEXT_FACTOR}" if long else family
            if name in rows:
                continue
            cell = cells[at_top[family]["cell"]]
            point = long_context_folder(self.path, cell.name, top, seq) if long else self.folder(cell, top)
            try:
                folder = point if long else self.on_this_machine([(cell, top, False)], run_points)[0]
                say(f"frontier {self.name}: {name} scored at contexts {', '.join(map(str, CONTEXTS))} and the stream")
                row = score_point(folder, cell.model, seed, data_cache)
            except CheckpointError as missing:
                say(f"frontier {self.name}: {name} not scored at every context: {missing}")
                continue
            recorded = next((r["val_bpc"] for r in self.store.summary(point) or [] if r.get("seed") == seed), None)
            rows[name] = {**row, "family": family, "cell": cell.name, "seed": seed, "point": self.store.key(point),
                          "recorded_val_bpc": recorded}
            write_context_scores(self.path, {"budget": top, "rows": rows})

    def edge_walks(self) -> list[dict]:
        """Every walk outward from an envelope point on a grid edge (edges.py), as the records have it now."""
        budgets = edge_budgets(self.budgets, self.stages["lead_budget"])
        return edge_walks(self.records(), collect_edge_steps(self.store, budgets), self.grid, budgets,
                          self.config["SEED"], read_edge_file(self.path))

    def _run_edges(self, run_points, measure) -> None:
        """EDGES=True (edges.py): the step beyond each grid edge an envelope point sits on, at the grid's top two
        budgets and the lead budget, on the first seed, from step 0; a step that beats the point is followed
        by the next, round by round, until each walk ends."""
        cannot = read_edge_file(self.path)
        walks = self.edge_walks()
        ended = sum(w["next"] is None for w in walks)
        if ended:
            say(f"frontier {self.name}: the grid's edges: {ended} of {len(walks)} walks ended in the records, kept "
                "as they are on any machine (a walk still open trains its next step here)")
        for round_ in range(1, 1 + len(PRESETS) + 64):  # a rate may halve many times; far more than any walk takes
            jobs, listed = self.edge_jobs(walks, measure, cannot)
            if listed:
                write_edge_file(self.path, cannot)
            if not jobs and not listed:
                break
            if jobs:
                say(f"frontier {self.name}: the grid's edges, round {round_}: {len(jobs)} steps beyond to train")
                self._run_all(jobs, run_points, None)
            walks = self.edge_walks()
        say(f"frontier {self.name}: the grid's edges: {len(walks)} walks, "
            f"{sum(w['moved'] < 0 for w in walks)} moved a point, {sum(w['end'] == 'worse' for w in walks)} ended "
            "on a worse step (REPORT: \"Does the grid contain its optimum?\")")

    def edge_jobs(self, walks: list[dict], measure, cannot: dict) -> tuple[list[StageJob], bool]:
        """The steps beyond the edges to train next, as (folder, arguments), and whether ``cannot`` grew (a next
        step that cannot train at its budget). Only a walk still open (its records hold no end) trains: one that
        ended stays ended wherever it is read. An open walk's next step is set against a score of this machine's
        processor: where the score it reads (its point's record, or its twin beside the steps) names another
        processor or none, the point itself is trained again beside its steps first (``edges/``), and the walk
        goes past that step once the twin's score is known."""
        here, jobs, listed = processor(), [], False
        open_walks = [w for w in walks if w["next"] is not None]
        for w in open_walks:
            cell, budget = parse_cell(w["cell"]), w["budget"]
            folder = edge_folder(self.path, cell, budget)
            if not w["trained_beside"] and processor_of(self.store.config(self.folder(cell, budget))) != here \
                    and all(folder != job.folder for job in jobs):
                jobs.append(StageJob(folder, self.direct_args(cell, budget, folder), cell, budget))
        starting = {job.folder for job in jobs}
        for w in open_walks:
            step, budget = w["next"], w["budget"]
            if w["steps"] and edge_folder(self.path, parse_cell(w["cell"]), budget) in starting:
                continue  # a walk goes past its first step once its point's own score here is known
            why = self.skip_reason(step, budget, measure, tokens_per_param=False)
            if why:
                cannot[f"{step.name}@{budget!r}"], listed = why, True
                continue
            folder = edge_folder(self.path, step, budget)
            if all(folder != job.folder for job in jobs):
                jobs.append(StageJob(folder, self.direct_args(step, budget, folder), step, budget))
        jobs.sort(key=lambda job: job.budget)  # a budget's walks end first
        return jobs, listed

    def held_walks(self) -> list[dict]:
        """Every held setting's walk from an envelope point (held.py), as the records have it now."""
        budgets = held_budgets(self.budgets, self.stages["lead_budget"])
        return held_walks(self.records(), collect_held_rows(self.store, budgets), self.grid, budgets,
                          self.config["SEED"], recorded_config(self.store), walked(self.stages["held"]))

    def _run_held(self, run_points) -> None:
        """HELD=True (held.py): each envelope point at the grid's top budget and the lead budget, one step along
        each setting the study holds; a step that beats it by more than its seeds' sd trains on the other seeds,
        and one that holds on them is walked on, round by round, until each walk ends."""
        walks = self.held_walks()
        for round_ in range(1, 2 * max(map(len, LADDERS.values())) + 2):  # two rounds a step, at most
            jobs = self.held_jobs(walks)
            if not jobs:
                break
            say(f"frontier {self.name}: the held settings, round {round_}: {len(jobs)} points to train")
            self._run_all(jobs, run_points, None)
            walks = self.held_walks()
        moved = held_moves(walks)
        say(f"frontier {self.name}: the held settings: {len(walks)} walks, {len(moved)} envelope points moved "
            "(REPORT: \"The held settings walked\")")

    def held_jobs(self, walks: list[dict]) -> list[StageJob]:
        """The points the held settings' walks train next: each open walk's next step (on the first seed, or on the
        other seeds once it beat the point by more than the seeds' sd), and the point itself beside it where its
        record names another processor than this machine's (its other seeds too, once a step needs them)."""
        here, jobs, seeds = processor(), [], self.extra_seeds()

        def add(folder: Path, cell: Cell, budget: float, other_seeds: bool) -> None:
            if any(folder == job.folder for job in jobs):
                return
            args = self.direct_args(cell, budget, folder)
            if other_seeds and not (folder / "config.json").exists():  # a run continued keeps its seeds
                args.append(f"SEEDS={','.join(map(str, seeds))}")
            jobs.append(StageJob(folder, args, cell, budget, len(seeds) if other_seeds else 1))

        for w in walks:
            if w["next"] is None:
                continue
            start, budget = parse_cell(w["cell"]), w["budget"]
            beside = w["trained_beside"] or processor_of(self.store.config(self.folder(start, budget))) != here
            if beside and not w["trained_beside"]:
                add(held_folder(self.path, start, budget), start, budget, False)
                if w["steps"]:
                    continue  # a walk goes past its first step once its point's own score here is known
            if w["next_seeds"]:
                if beside and w["bpc_mean"] is None:
                    add(held_folder(self.path, start, budget, seeds=True), start, budget, True)
                add(held_folder(self.path, w["next"], budget, seeds=True), w["next"], budget, True)
            else:
                add(held_folder(self.path, w["next"], budget), w["next"], budget, False)
        return sorted(jobs, key=lambda job: job.budget)  # a budget's walks end first

    def leaders(self) -> list[Cell]:
        """The top budget's envelope cells of LEADERS (auto: "the transformer" and the best reservoir family)."""
        report = self.report(views=False)
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
        """``jobs``: (the point's folder, its TinyStories.py arguments), or a stage's ``StageJob``s."""
        if not jobs:
            return
        jobs = [(job[0], job[1]) for job in jobs]  # what the runner takes: a StageJob's pricing stays here
        kind = resolve_kind(self.config["DEVICE"], self.config["USE_TPU"])
        fold = folded_points(kind, self.grid.get("POINTS_PER_DEVICE", 1))
        if fold != 1 and self.shared is None:  # (a shared study's hosts claim points one at a time)
            cells = {c.name: c for c in self.cells()}
            sized = {folder: members(args) for folder, args in jobs}  # a continued point's read from its folder
            most = fold if fold != "probe" else probed_folds(
                sized, cells, self.vocab, (*self.settings, f"FLOP_BUDGET={self.budgets[0]!r}"),
                self.slots()[0], self.path / "logs" / "fold-probes.json",
                lambda line: say(f"frontier {self.name}: {line}"))
            jobs, self._groups = fold_jobs(jobs, cells, most, scans_recurrences(kind), sized)
            if self._groups:
                sizes = [sum(sized[f] for f in group) for group in self._groups.values()]
                say(f"frontier {self.name}: {sum(map(len, self._groups.values()))} points folded, "
                    f"{max(sizes)} members at most to a process (a point's seeds a member each; "
                    f"POINTS_PER_DEVICE={self.grid.get('POINTS_PER_DEVICE', 1)}), "
                    f"in {len(self._groups)} group{'s' * (len(self._groups) > 1)}")
        if self.shared is not None:  # claimed through STUDY_STORAGE, trained here or on another host
            def run_here(more, ended):
                def ended_and_packed(k: int, code: int | None) -> None:
                    ended(k, code)
                    self._point_ended(code)
                return run_points([], self.slots(), self._point_finished, more=more, ended=ended_and_packed)

            try:
                self.shared.run(jobs, self.store, run_here, self._point_finished)
            finally:
                self._pack_records()
            return
        try:
            codes = run_points(jobs, self.slots(), self._point_finished,
                               ended=lambda k, code: self._point_ended(code))  # None: never started
        finally:
            self._pack_records()  # what finished is in points.jsonl, ready to commit, even if the study stops here
        failed = [code for code in codes if code not in (0, None)]
        if failed or None in codes:
            where = f"at {budget:.3g} FLOPs" if budget else "after the grid"
            waiting = f", {codes.count(None)} not started" if None in codes else ""
            code = failed[0] if failed else 143
            raise FrontierExit(code, f"{len(failed)} point(s) {where} stopped (exit code {code}; each point's own "
                                     "message is above)"
                                     f"{waiting}; every finished point is kept")

    def halving(self, plan: dict):
        """Successive halving over the grid budgets: yields each budget, its live cells, those of them brought back
        for it (``_refill``) and {cell: the budget of its latest point} before it; resumed once the budget's
        first-seed points are recorded, it stops the cells that lose there (``_prune``)."""
        pruned: set[str] = set()
        last_run: dict[str, float] = {}
        for budget in self.budgets:
            live = [c for c in self.cells() if c.name not in pruned and plan[c.name][budget] is None]
            revived = self._refill(live, pruned, plan, budget, last_run)
            live += revived
            pruned -= {c.name for c in revived}
            yield budget, live, revived, dict(last_run)
            for c in live:
                last_run[c.name] = budget
            pruned |= self._prune(live, budget)

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
                    record = self.first_seed_record(c, last_run[c.name])
                    score = record.get("val_bpc") if record else None
                    if score is not None:
                        candidates.append((-last_run[c.name], score, c.name, c))
            back += [c for *_, c in sorted(candidates)[:missing]]
        return back

    def _prune(self, live: list[Cell], budget: float) -> set[str]:
        """The cells of ``live`` that stop at ``budget``: neither among their family's KEEP best there nor
        within WITHIN of its best (diverged points stop too)."""
        stop = set()
        for family in self.grid["FAMILIES"]:
            scores = {c.name: (self.first_seed_record(c, budget) or {}).get("val_bpc") for c in live
                      if c.family == family}
            ranked = sorted((score, name) for name, score in scores.items() if score is not None)
            stop |= self.beyond_within(scores) - {name for _, name in ranked[:self.grid["KEEP"]]}
        return stop

    def beyond_within(self, scores: dict[str, float | None]) -> set[str]:
        """The cells of one family ({name: first-seed bits/char, None if diverged}) that halving's WITHIN rule
        stops: diverged, or more than WITHIN above the best of them (halving keeps its KEEP best besides)."""
        best = min((score for score in scores.values() if score is not None), default=math.inf)
        return {name for name, score in scores.items() if score is None or score > best * (1 + self.grid["WITHIN"])}

    # --- points needed here: checkpoints stay on the machine that trained them
    def replay_folder(self, folder: Path) -> Path:
        return self.path / REPLAYS / self.store.key(folder)

    def on_this_machine(self, points: list[tuple[Cell, float, bool]], run_points) -> list[Path]:
        """The folders of ``points`` ((cell, budget, extra seeds?)) with their checkpoints on this machine: a point
        recorded elsewhere (points.jsonl alone) is read from its copy trained here beside its edge steps
        (EDGES=True: the same settings and first seed, from step 0) or from its replay (<study>/replays/<point>),
        which REPLAY=True trains now from step 0 with the point's own settings and seeds; CheckpointError where
        neither is here."""
        folders, jobs = [], []
        for cell, budget, extra in points:
            folder = self.folder(cell, budget, seeds=extra)
            seeds = self.extra_seeds() if extra else [self.config["SEED"]]
            if all(checkpoint_file(folder, cell.model, s, seeds).is_file() for s in seeds):
                folders.append(folder)
                continue
            beside = edge_folder(self.path, cell, budget)  # trained again here by EDGES=True: no replay needed
            if not extra and self.finished_here(beside, seeds) and all(
                    checkpoint_file(beside, cell.model, s, seeds).is_file() for s in seeds):
                folders.append(beside)
                continue
            replay = self.replay_folder(folder)
            folders.append(replay)
            if self.finished_here(replay, seeds):
                continue
            if not self.grid.get("REPLAY"):
                raise CheckpointError(f"{folder} is not on this machine (REPLAY=True trains it again here)")
            jobs.append((replay, [*self.direct_args(cell, budget, replay), f"SEEDS={','.join(map(str, seeds))}"]))
        if jobs:
            say(f"frontier {self.name}: {len(jobs)} points recorded on another machine trained again here for their "
                f"checkpoints (REPLAY=True, under {self.path / REPLAYS})")
            self._run_all(jobs, run_points, None)
        for (cell, budget, extra), folder in zip(points, folders, strict=True):
            self.replayed.update({(r["point"], r["seed"]): r
                                  for r in self._check_copy(folder, self.folder(cell, budget, seeds=extra))})
        return folders

    @staticmethod
    def finished_here(folder: Path, seeds: list[int]) -> bool:
        if not (folder / "summary.json").exists():
            return False
        return set(seeds) <= {r.get("seed") for r in read_json(folder / "summary.json", "a replay's summary")
                              if r.get("status") == "finished"}

    def _check_copy(self, folder: Path, point_folder: Path) -> list[dict]:
        """A point's copy trained here (its replay, or its twin beside its edge steps) against its record, seed by
        seed (the same settings, seed and data; another machine's float kernels may still move the score): a
        difference is said, and kept with what reads the copy."""
        if folder == point_folder:
            return []
        point, copy = self.store.key(point_folder), self.store.key(folder)
        replay = REPLAYS in folder.relative_to(self.path).parts[:1]
        what = "the replay of" if replay else "the copy beside its edge steps of"
        recorded = {r.get("seed"): r.get("val_bpc") for r in self.store.summary(point_folder) or []}
        rows = []
        for new in read_json(folder / "summary.json", "a replay's summary"):
            rows.append({"point": point, "seed": new.get("seed"), "recorded_val_bpc": recorded.get(new.get("seed")),
                         "replayed_val_bpc": new.get("val_bpc"), "copy": copy})
            if rows[-1]["recorded_val_bpc"] != rows[-1]["replayed_val_bpc"]:
                say(f"frontier {self.name}: {what} {point} (seed {new.get('seed')}) scores {new.get('val_bpc')} "
                    f"bits/char, its record {rows[-1]['recorded_val_bpc']}: what follows reads the copy ({copy})")
        return rows

    def compare_at_the_top(self, budgets: list[float] | None = None, run_points=None) -> Path | None:
        """The paired difference (compare.py, with its diagnostics) between the best reservoir family and "the
        transformer" at the largest of ``budgets`` (default: the lead budget's too) both reached on every seed,
        and each write-gated reservoir family's there too, written to comparisons/ once. Returns the best's."""
        report = self.report(views=False)
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
        held = [f for f in reservoirs if self._comparison_file(f, reference, budget).exists()]
        families = compared_families({f: full[f][budget]["bpc_mean"] for f in reservoirs if budget in full[f]}, held)
        written = [self._compare(family, reference, budget, full, seeds, run_points) for family in families]
        return written[0]

    def _comparison_file(self, family: str, reference: str, budget: float) -> Path:
        return self.path / COMPARISONS / f"{point_name(budget)}-{family}-vs-{reference}.json"

    def _compare(self, family: str, reference: str, budget: float, full: dict, seeds: list[int],
                 run_points) -> Path | None:
        from reservoir.studies.comparison import Side, compare, describe

        out = self._comparison_file(family, reference, budget)
        now = ({full[family][budget]["cell"]}, {full[reference][budget]["cell"]})
        if out.exists():
            held = compared_cells(read_json(out, "a paired comparison"))
            if held == now:
                return out
            say(f"frontier {self.name}: the paired comparison at {budget:.3g} FLOPs, {family} against {reference}, "
                f"is of {' and '.join(', '.join(sorted(c)) for c in held)}, no longer the envelope there (the grid "
                f"grew): made again of {' and '.join(c for (c,) in now)}")

        def side(name):
            cell = next(c for c in self.cells() if c.name == full[name][budget]["cell"])
            points = [(cell, budget, extra) for extra in (False, True)][: 2 if seeds[1:] else 1]
            return Side(self.on_this_machine(points, run_points), FAMILIES[name][0])

        say(f"frontier {self.name}: the paired comparison at {budget:.3g} FLOPs, {family} against {reference}")
        try:
            a, b = side(family), side(reference)
            result = compare(a, b, diagnostics=True, relative_to=self.path)
        except CheckpointError as missing:  # records travel in git, checkpoints do not: the stages go on
            say(f"frontier {self.name}: no paired comparison at {budget:.3g} FLOPs: {missing}. It scores the "
                "points' checkpoints, which stay in the point folders on the machine that trained them (never "
                "committed; points.jsonl carries their records alone): run this command there")
            return None
        result.update({"budget": budget, "family_a": family, "family_b": reference})
        replays = [r for _, r in sorted(self.replayed.items())
                   if any(self.path / r["copy"] == Path(f) for f in [*a.run_dirs, *b.run_dirs])]
        if replays:  # checkpoints trained again here (REPLAY=True, or EDGES=True): the interval is of these models
            result["replays"] = replays
        out.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out, result)
        say(describe(result))
        return out

    # --- records and report
    def records(self) -> list[dict]:
        return collect_records(self.store, [c.record() for c in self.cells()], self.all_budgets())

    def report(self, views: bool = True) -> dict:
        """The study's report; ``views`` False: what a stage reads of it (analysis.study_report)."""
        return study_report(self.path, read_study_file(self.path), self.records(), self.store, views)


def own_text(value) -> str:
    """A stage's value as a command line gives it."""
    if isinstance(value, list):
        return ",".join(value)
    return f"{value:g}" if isinstance(value, float) else str(value)


def study_changes(before: dict, now: dict) -> list[str]:
    """What a continued study (another run, another host) may not change: its budgets, its grid (a list may
    grow), its settings (less where its data and folders are), its corpus."""
    changed = ["budgets"] if before.get("budgets") != now["budgets"] else []
    changed += _grid_changes(before.get("grid") or {}, now["grid"])
    if _placeless(before.get("settings", [])) != _placeless(now["settings"]):
        changed.append("settings")
    if before.get("corpus") and now.get("corpus") and before["corpus"] != now["corpus"]:
        changed.append(f"corpus ({before['corpus']} there, {now['corpus']} here)")
    for family, there in (before.get("plugins") or {}).items():
        here = (now.get("plugins") or {}).get(family)
        if here and here["sha256"] != there["sha256"]:
            changed.append(f"code of {family} (plugin {there['plugin']}: SHA-256 {there['sha256'][:12]} there, "
                           f"{here['sha256'][:12]} here; restore the file its points were trained with)")
    return changed


def measure_cells(study: FrontierStudy):
    """``measure(cell)`` for ``FrontierStudy.plan``: each cell's model built on the study's data (prepared
    once, cached for the points) and one training step counted (budgets.step_cost)."""
    from reservoir.data.tokens import corpus_label, prepare_data
    from reservoir.models import build_model

    data = prepare_data(study.config)
    study.corpus = corpus_label(data.describe())
    study.vocab = data.tokenizer.vocab_size
    seen: dict = {}
    counts: dict = {}  # a family and size's FLOP counts: its cells' models differ in their batches alone
    models: dict = {}  # and so its model, built once (a 4,000-unit reservoir's draw takes 25 s)

    def measure(cell: Cell) -> tuple[float, int, int]:
        key = (cell.family, cell.size, cell.batch_size)
        if key not in seen:
            config = parse_overrides([*study.settings, *cell.settings(), f"FLOP_BUDGET={study.budgets[0]!r}"])
            if key[:2] not in models:
                models[key[:2]] = build_model(cell.model, data.tokenizer.vocab_size, model_settings(config, cell.model))
            per_step, params = step_cost(cell.model, config, data, counts.setdefault(key[:2], {}), models[key[:2]])
            if per_step is None:
                raise FrontierError(f"{cell.family} is not gradient-trained: a frontier grid needs learning rates")
            batch = model_settings(config, cell.model)["BATCH_SIZE"]
            seen[key] = (per_step, params, batch * config["GRAD_ACCUM"] * config["SEQ_LEN"])
        return seen[key]

    measure.data = data  # the prepared data, for a plan's probe
    return measure


def _continue_or_start(folder: Path) -> list[str]:
    """Where a stage's run writes: ``folder``, continued if a run already started there."""
    return [f"RESULTS_DIR={folder.parent}",
            f"RESUME={folder}" if (folder / "config.json").exists() else f"RUN_NAME={folder.name}"]
