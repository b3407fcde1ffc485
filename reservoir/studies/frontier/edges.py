"""EDGES=True: whether the grid contains each envelope point's optimum.

An envelope point whose size preset, learning rate or batch is its grid list's smallest or largest may owe
its place to the grid, not to the family. At the grid's top two budgets and the lead budget, this stage
trains the step beyond each such edge on the study's first seed, from step 0, one axis at a time: the next
preset (``xxs`` below ``xs``, ``xl`` above ``l``), half or twice the rate, half or twice the batch. A step that
beats the point is followed by the next step the same way, until one is worse, no preset lies beyond, or
the step cannot train at the budget (fewer than MIN_STEPS steps). The study's rule against too many tokens
per parameter does not stop a step: it would keep the question from being asked; the tokens per parameter
are shown beside each step instead.

The steps are ordinary run folders, ``<study>/edges/<cell>/flops-<budget>``, their records in points.jsonl;
the steps that cannot train are listed, with why, in ``<study>/edge-steps.json`` (signed). ``edge_walks``
rebuilds every walk from those records alone; REPORT shows them.

A step and the point it is set against are trained on one kind of processor: across processors one point
scores up to 0.05 bits/char apart (bench/README.md). While a walk is open (its next step not yet recorded),
where the score it reads names another processor than this machine's (or none), the point itself is trained
again beside its steps, in ``edges/`` too, and its walks read that score. A walk its records end is finished
on every machine: nothing of it trains again (each walk and step in frontier.json names the processor its
score was recorded on).
"""

from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

from reservoir.data.tokens import corpus_label
from reservoir.run.records import point_scores, read_signed_json, write_signed_json
from reservoir.studies.budgets import point_name
from reservoir.studies.frontier.grid import (
    FAMILIES,
    HELD_SETTINGS,
    PRESETS,
    SIZES,
    WHOLE_NUMBERS,
    Cell,
    FrontierError,
)
from reservoir.studies.frontier.records import processor_of
from reservoir.studies.store import PointRecords

EDGE_FOLDER = "edges"
EDGE_FILE = "edge-steps.json"
AXES = {"size": "SIZES", "learning_rate": "LEARNING_RATES", "batch_size": "BATCH_SIZES"}  # axis -> its grid list
_CELL_NAME = re.compile(r"^(?P<family>.+)-(?P<size>[a-z]+)-lr(?P<rate>[0-9.e+-]+)-b(?P<batch>[0-9]+)"
                        r"(?P<held>(?:-[a-z]+(?:2_)?[0-9.]+(?:e[+-]?[0-9]+)?)*)$")
_HELD_MARK = re.compile(r"-(?P<mark>[a-z]+(?:2_)?)(?P<value>[0-9.]+(?:e[+-]?[0-9]+)?)")  # one held setting in a name


def edge_budgets(budgets: list[float], lead_budget: float | None) -> list[float]:
    """The budgets whose envelope points are checked: the grid's top two, and the lead budget."""
    return [*budgets[-2:], *([lead_budget] if lead_budget else [])]


def step_beyond(cell: Cell, axis: str, direction: int) -> Cell | None:
    """The cell one step from ``cell`` along ``axis`` (-1: down, +1: up); None where no preset lies beyond."""
    if axis == "size":
        k = PRESETS.index(cell.size) + direction
        if not 0 <= k < len(PRESETS) or PRESETS[k] not in SIZES[cell.model]:
            return None
        return replace(cell, size=PRESETS[k])
    if axis == "learning_rate":
        return replace(cell, learning_rate=cell.learning_rate * 2.0 ** direction)
    batch = cell.batch_size * 2 if direction > 0 else cell.batch_size // 2
    return replace(cell, batch_size=batch) if batch >= 1 and batch * 2 ** -direction == cell.batch_size else None


def edges_of(cell: Cell, grid: dict) -> list[tuple[str, int]]:
    """The (axis, direction) of every grid edge ``cell`` sits on; a list of one value has none (it is a choice,
    not a range)."""
    found = []
    for axis, key in AXES.items():
        values = sorted(grid[key], key=PRESETS.index) if axis == "size" else sorted(grid[key])
        if len(values) < 2:
            continue
        value = getattr(cell, axis)
        if value == values[0]:
            found.append((axis, -1))
        if value == values[-1]:
            found.append((axis, +1))
    return found


def walk(start: Cell, start_bpc: float, axis: str, direction: int, score, cannot: dict, budget: float) -> dict:
    """One edge's walk outward from the envelope point: each step's score (``score(cell)``: None where it has
    not run, inf where it diverged) until one is worse, none lies beyond, or one cannot train (``cannot``:
    '<cell>@<budget>' -> why); ``next``: the step to train now, if any."""
    steps, best, current, end, pending = [], start_bpc, start, None, None
    while True:
        step = step_beyond(current, axis, direction)
        if step is None:
            end = "no preset beyond"
            break
        why = cannot.get(f"{step.name}@{budget!r}")
        if why:
            steps.append({"cell": step.name, "value": getattr(step, axis), "val_bpc": None, "why": why})
            end = "cannot train"
            break
        bpc = score(step)
        if bpc is None:
            end, pending = "not run yet", step
            break
        steps.append({"cell": step.name, "value": getattr(step, axis), "val_bpc": None if math.isinf(bpc) else bpc})
        if bpc >= best:
            end = "worse"
            break
        best, current = bpc, step
    return {"axis": axis, "direction": direction, "from": getattr(start, axis), "steps": steps, "end": end,
            "best_bpc": best, "moved": best - start_bpc, "next": pending}


def edge_walks(rows: list[dict], edge_rows: list[dict], grid: dict, budgets: list[float], seed: int,
               cannot: dict) -> list[dict]:
    """Every edge walk of every family at ``budgets``, from the grid's first-seed rows (``collect_records``),
    the steps' rows (``collect_edge_steps``: the point's own too, where it was trained beside its steps) and the
    steps that cannot train: one dict per family, budget and edge, ``next`` the step still to train (a Cell)
    or None."""
    firsts = {(r["cell"], r["budget"]): r for r in rows if not r["envelope_seed"] and r["seed"] == seed}
    scores = {(r["cell"], r["budget"]): r["val_bpc"] for r in edge_rows if r["seed"] == seed}
    out = []
    for budget in budgets:
        best: dict = {}
        for (_, b), r in firsts.items():
            if b == budget and r["val_bpc"] is not None and (r["family"] not in best
                                                            or r["val_bpc"] < best[r["family"]]["val_bpc"]):
                best[r["family"]] = r
        for family in grid["FAMILIES"]:
            if family not in best:
                continue
            r = best[family]
            start = Cell(family, r["size"], r["learning_rate"], r["batch_size"])

            def score(cell, budget=budget):
                if (cell.name, budget) not in scores:
                    return None
                value = scores[(cell.name, budget)]
                return math.inf if value is None else value

            # the point trained again beside its steps (another processor recorded it): its walks read that score
            here = score(start)
            start_bpc = r["val_bpc"] if here is None else here
            for axis, direction in edges_of(start, grid):
                row = walk(start, start_bpc, axis, direction, score, cannot, budget)
                out.append({"family": family, "budget": budget, "cell": start.name, "val_bpc": start_bpc,
                            "recorded_bpc": r["val_bpc"], "trained_beside": here is not None, **row})
    return out


def parse_cell(name: str) -> Cell | None:
    """The cell a step's folder names, or None where the name is not one."""
    match = _CELL_NAME.match(name)
    if not match or match["family"] not in FAMILIES or match["size"] not in PRESETS:
        return None
    axes = {mark: axis for axis, (_, mark) in HELD_SETTINGS.items()}
    try:
        held = tuple((axes[m["mark"]], int(m["value"]) if axes[m["mark"]] in WHOLE_NUMBERS else float(m["value"]))
                     for m in _HELD_MARK.finditer(match["held"]))
        cell = Cell(match["family"], match["size"], float(match["rate"]), int(match["batch"]), held)
    except (ValueError, KeyError):
        return None
    return cell if cell.name == name and cell.size in SIZES[cell.model] else None


def edge_folder(study_path: Path, cell: Cell, budget: float) -> Path:
    return Path(study_path) / EDGE_FOLDER / cell.name / point_name(budget)


def stage_cells(records: PointRecords, where: Path, what: str) -> list[tuple[str, Cell]]:
    """(name, cell) of each folder of points under a stage's ``where``; one that names no cell is refused as not
    ``what``."""
    cells = []
    for name in records.names_under(where):
        cell = parse_cell(name)
        if cell is None:
            raise FrontierError(f"{where / name} is not {what} (<family>-<size>-lr<rate>-b<batch>, as the study names "
                                "them); move it out")
        cells.append((name, cell))
    return cells


def collect_edge_steps(records: PointRecords, budgets: list[float]) -> list[dict]:
    """One row per finished step beyond an edge and seed. A folder under edges/ that names no cell is refused."""
    where = records.path / EDGE_FOLDER
    rows = []
    for name, cell in stage_cells(records, where, "a step beyond the grid's edge"):
        for budget in budgets:
            point = where / name / point_name(budget)
            summary = records.summary(point, "a grid edge step's summary")
            if summary is None:
                continue
            config = records.config(point)  # read once: its corpus and its processor
            corpus, scored_on = corpus_label(config["data"]), processor_of(config)
            for r in summary:
                rows.append({**point_scores(r, point), "cell": name, **cell.record(), "budget": budget,
                             "train_tokens": r.get("train_tokens"), "corpus": corpus, "processor": scored_on})
    return rows


def read_edge_file(study_path: Path) -> dict:
    """'<cell>@<budget>' -> why that step beyond an edge cannot train ({} before the stage ran)."""
    file = Path(study_path) / EDGE_FILE
    if not file.exists():
        return {}
    content = read_signed_json(file, "the steps beyond the grid's edges that cannot train",
                               "restore it as the study wrote it (git checkout), or delete it and run the study's "
                               "command again, which lists them again")
    return dict(content.get("cannot_train") or {})


def write_edge_file(study_path: Path, cannot: dict) -> None:
    write_signed_json(Path(study_path) / EDGE_FILE, {"cannot_train": dict(sorted(cannot.items()))})


def edges_report(study: dict, rows: list[dict], records: PointRecords) -> dict | None:
    """The EDGES stage as frontier.json holds it (None where the study has not asked for it): each walk, the
    steps' rows (their tokens per parameter beside) and the grid lists the edges are of."""
    stages = study.get("stages") or {}
    if not stages.get("edges"):
        return None
    budgets = edge_budgets(study["budgets"], stages.get("lead_budget"))
    steps = collect_edge_steps(records, budgets)
    walks = edge_walks(rows, steps, study["grid"], budgets, study["seed"], read_edge_file(records.path))
    tokens = {(r["cell"], r["budget"]): r["train_tokens"] / r["params_trained"] for r in steps
              if r["seed"] == study["seed"] and r.get("train_tokens") and r.get("params_trained")}
    for w in walks:
        w["next"] = w["next"].name if w["next"] else None
        point = edge_folder(records.path, parse_cell(w["cell"]), w["budget"]) if w["trained_beside"] \
            else records.path / w["cell"] / point_name(w["budget"])
        w["scored_on"] = processor_of(records.config(point))  # the processor of the score its steps are set against
        for step in w["steps"]:
            step["tokens_per_param"] = tokens.get((step["cell"], w["budget"]))
    return {"budgets": budgets, "walks": walks, "steps": steps,
            "max_tokens_per_param": study["grid"]["MAX_TOKENS_PER_PARAM"]}
