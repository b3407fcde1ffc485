"""HELD=True: the settings every point holds, walked like a grid's edges.

A study searches size, learning rate and batch; Adam's β2, the weight decay and dropout it holds at one value for
every family (HELD_SETTINGS). At the grid's top budget and the lead budget, this stage walks each family's envelope
point one step along each held setting that applies to it (LADDERS: β2 0.95, 0.99, 0.999 per the tokens of a step
at the grid's largest batch; weight decay 0.01 → 0.1; dropout 0 → 0.1, for a family whose model has dropout), from
step 0, on the study's first seed. A step counts only
if it beats the point by more than the point's seeds' sd: one seed cannot tell a smaller difference from the draw.
Such a step is trained on the other seeds; where its mean over the seeds beats the point's, it is walked on to the
next value the same way, and the envelope takes the walk's last step that held (``held_moves``).

The steps are ordinary run folders, ``<study>/held/<cell>-<setting><value>/flops-<budget>[-seeds]``, their records
in points.jsonl; ``held_walks`` rebuilds every walk from those records alone. As on the grid's edges, a step and
the point it is set against are trained on one kind of processor: while a walk is open and the point's record
names another processor, the point is trained again beside its steps (``held/<cell>/...``), its seeds too once a
step needs them, and the walk reads those scores.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import replace
from pathlib import Path

from reservoir.run.train import adam_beta2
from reservoir.studies.budgets import point_name
from reservoir.studies.frontier.edges import stage_cells
from reservoir.studies.frontier.grid import HELD_SETTINGS, Cell
from reservoir.studies.frontier.records import point_rows
from reservoir.studies.store import PointRecords

HELD_FOLDER = "held"
# each held setting's values, walked upward from the one a study holds (nanoGPT's Shakespeare run: β2 0.99, dropout
# 0.2). Adam's β2 is stepped in its per-token form (ADAM_BETA2_REF_TOKENS at the grid's largest batch: the same β2
# there, a higher one at smaller batches, the fix Porian et al. 2024 found essential at small batch): on six
# TinyStories envelope points (bench/README.md, "Adam's β2 at small batch") a fixed 0.99 lost at three and gained
# 0.003 at most, the per-token form gained at four
LADDERS = {"adam_beta2": (0.95, 0.99, 0.999), "weight_decay": (0.01, 0.1, 0.3, 1.0), "dropout": (0.0, 0.1, 0.2, 0.3)}
DROPOUT_BETWEEN_LAYERS = ("lstm",)  # models whose dropout sits between layers: none at one layer


def held_budgets(budgets: list[float], lead_budget: float | None) -> list[float]:
    """The budgets whose envelope points are walked: the grid's top, and the lead budget."""
    return [budgets[-1], *([lead_budget] if lead_budget else [])]


def held_value(cell: Cell, axis: str, config: dict) -> float | None:
    """The value ``cell``'s point held ``axis`` at (``config``: the settings its record requested); None where the
    setting does nothing for its model (dropout in a model without it, or between the layers of a one-layer LSTM)."""
    key = HELD_SETTINGS[axis][0]
    if not key.startswith("."):
        return float(config[key])
    block = config[cell.model.upper()]
    if key[1:] not in block or (cell.model in DROPOUT_BETWEEN_LAYERS and block.get("layers", 1) <= 1):
        return None
    return float(block[key[1:]])


def held_axes(cell: Cell, config: dict) -> list[str]:
    return [axis for axis in LADDERS if held_value(cell, axis, config) is not None]


def held_steps(start: Cell, axis: str, config: dict, largest_batch: int) -> list[Cell]:
    """The steps of ``axis``'s walk from ``start`` (``config``: the settings its record requested), in order: each
    ladder value above the one held; for Adam's β2, each from the one held, per the tokens of a step at the grid's
    ``largest_batch`` (or per the study's own ADAM_BETA2_REF_TOKENS, where it has one)."""
    value = held_value(start, axis, config)
    if axis != "adam_beta2":
        return [step_held(start, axis, v) for v in LADDERS[axis] if v > value * (1 + 1e-9) + 1e-12]
    tokens = config.get("ADAM_BETA2_REF_TOKENS") or largest_batch * config["SEQ_LEN"]
    per_step = start.batch_size * config["SEQ_LEN"]  # a step's tokens at this batch
    held = adam_beta2(config, per_step)
    # a step that leaves this batch's β2 as it was (0.95 per the largest batch's tokens, at the largest batch) is none
    return [step_held(step_held(start, axis, v), "adam_beta2_tokens", tokens) for v in LADDERS[axis]
            if adam_beta2({"ADAM_BETA2": v, "ADAM_BETA2_REF_TOKENS": tokens}, per_step) > held + 1e-9]


def step_held(cell: Cell, axis: str, value: float) -> Cell:
    """``cell`` with ``axis`` set to ``value``."""
    return replace(cell, held=(*((a, v) for a, v in cell.held if a != axis), (axis, value)))


def held_walk(start: Cell, ladder: list[Cell], point: dict, axis: str, first, mean) -> dict:
    """One held setting's walk from the envelope point ``start`` along its ``ladder`` of steps (``held_steps``);
    ``point``: its first seed's score "bpc", its seeds' "mean" (None while not known here) and their "sd";
    ``first(cell)``, a step's first-seed score (None: not run; inf: diverged); ``mean(cell)``, its mean over every
    seed (None: its other seeds not run). ``next``: the step to train now, and ``next_seeds`` whether on its other
    seeds."""
    start_bpc, start_mean, sd = point["bpc"], point["mean"], point["sd"]
    steps, best_bpc, best_mean, best, end, pending, seeds = [], start_bpc, start_mean, start, None, None, False
    for step in [*ladder, None]:
        if step is None:
            end = "no value beyond"
            break
        value = dict(step.held)[axis]
        bpc = first(step)
        if bpc is None:
            end, pending = "not run yet", step
            break
        row = {"cell": step.name, "value": value, "per_tokens": dict(step.held).get("adam_beta2_tokens"),
               "val_bpc": None if math.isinf(bpc) else bpc, "bpc_mean": None}
        steps.append(row)
        if bpc >= best_bpc - (sd or 0.0):
            end = "worse" if bpc >= best_bpc else "within the seeds' sd"
            break
        row["bpc_mean"] = mean(step)
        if row["bpc_mean"] is None or best_mean is None:
            end, pending, seeds = "seeds not run yet", step, True
            break
        if row["bpc_mean"] >= best_mean:
            end = "not on its seeds"
            break
        best_bpc, best_mean, best = bpc, row["bpc_mean"], step
    moved = best_mean - start_mean if best is not start else 0.0
    return {"axis": axis, "steps": steps, "end": end, "best_cell": best.name, "best_bpc": best_bpc,
            "best_mean": best_mean, "moved": moved, "next": pending, "next_seeds": seeds}


def walked(stage) -> list[str] | None:
    """The families HELD names (None: every family, HELD=True)."""
    return stage if isinstance(stage, list) else None


def held_walks(rows: list[dict], held_rows: list[dict], grid: dict, budgets: list[float], seed: int, config_of,
               families: list[str] | None = None) -> list[dict]:
    """Every held setting's walk of each family of ``families`` (None: every one) at ``budgets``, from the grid's
    rows (``collect_records``) and the stage's (``collect_held_rows``: the point's own too, where it was trained
    beside its steps); ``grid``: the study's (its ENVELOPE_SEEDS and BATCH_SIZES); ``config_of(cell, budget)``: the
    settings a grid point's record requested."""
    seeds, largest_batch = grid["ENVELOPE_SEEDS"], max(grid["BATCH_SIZES"])
    firsts = {(r["cell"], r["budget"]): r["val_bpc"] for r in held_rows if r["seed"] == seed}
    others: dict = {}
    for r in held_rows:
        if r["seed"] != seed:
            others.setdefault((r["cell"], r["budget"]), {})[r["seed"]] = r["val_bpc"]
    out = []
    for budget in budgets:
        best: dict = {}
        for r in rows:
            if r["budget"] == budget and not r["envelope_seed"] and r["seed"] == seed and r["val_bpc"] is not None \
                    and (families is None or r["family"] in families) \
                    and (r["family"] not in best or r["val_bpc"] < best[r["family"]]["val_bpc"]):
                best[r["family"]] = r
        for family, r in best.items():
            start = Cell(family, r["size"], r["learning_rate"], r["batch_size"])
            recorded = [s["val_bpc"] for s in rows if s["cell"] == r["cell"] and s["budget"] == budget
                        and s["val_bpc"] is not None]

            def first(cell, budget=budget):
                if (cell.name, budget) not in firsts:
                    return None
                value = firsts[(cell.name, budget)]
                return math.inf if value is None else value

            def mean(cell, budget=budget):
                scores = others.get((cell.name, budget), {})
                if len(scores) < seeds - 1 or first(cell) is None:
                    return None
                every = [first(cell), *scores.values()]
                return math.inf if any(v is None or math.isinf(v) for v in every) else statistics.fmean(every)

            here = first(start)  # the point trained again beside its steps: its walks read those scores
            start_bpc = r["val_bpc"] if here is None else here
            start_mean = statistics.fmean(recorded) if here is None else mean(start)
            sd = statistics.stdev(recorded) if len(recorded) > 1 else None
            config = config_of(start, budget)
            for axis in held_axes(start, config):
                ladder = held_steps(start, axis, config, largest_batch)
                walk = held_walk(start, ladder, {"bpc": start_bpc, "mean": start_mean, "sd": sd}, axis, first, mean)
                for step in walk["steps"]:  # a step trained on every seed: their spread beside their mean
                    every = [firsts.get((step["cell"], budget)), *others.get((step["cell"], budget), {}).values()]
                    step["bpc_sd"] = statistics.stdev(every) if step["bpc_mean"] is not None and len(every) > 1 \
                        and not any(v is None for v in every) and not math.isinf(step["bpc_mean"]) else None
                out.append({"family": family, "budget": budget, "cell": start.name, "val_bpc": start_bpc,
                            "bpc_mean": start_mean, "bpc_sd": sd, "recorded_bpc": r["val_bpc"],
                            "trained_beside": here is not None, "from": held_value(start, axis, config),
                            "per_tokens": config.get("ADAM_BETA2_REF_TOKENS") if axis == "adam_beta2" else None,
                            **walk})
    return out


def held_moves(walks: list[dict]) -> dict:
    """{(family, budget): the cell that the envelope takes there}: of the walks that moved a point (their last step
    that held beat it on the mean over seeds), the one whose step scored best."""
    moves: dict = {}
    for w in walks:
        key = (w["family"], w["budget"])
        if w["moved"] < 0 and (key not in moves or w["best_mean"] < moves[key][0]):
            moves[key] = (w["best_mean"], w["best_cell"])
    return {key: cell for key, (_, cell) in moves.items()}


def held_folder(study_path: Path, cell: Cell, budget: float, seeds: bool = False) -> Path:
    return Path(study_path) / HELD_FOLDER / cell.name / (point_name(budget) + ("-seeds" if seeds else ""))


def collect_held_rows(records: PointRecords, budgets: list[float]) -> list[dict]:
    """One row per finished point of the stage and seed, as ``collect_records`` gives the grid's. A folder under
    held/ that names no cell is refused."""
    where = records.path / HELD_FOLDER
    rows = []
    for name, cell in stage_cells(records, where, "a point of the held settings' walks"):
        for budget in budgets:
            for extra in (False, True):
                rows += point_rows(records, where / name, cell.record(), budget, extra)
    return rows


def recorded_config(records: PointRecords):
    """``config_of`` for ``held_walks``: a grid point's requested settings, from its record."""
    def config_of(cell: Cell, budget: float) -> dict:
        return records.config(records.path / cell.name / point_name(budget))["requested_config"]
    return config_of


def held_report(study: dict, rows: list[dict], records: PointRecords) -> dict | None:
    """The HELD stage as frontier.json holds it (None where the study has not asked for it): each walk, the
    stage's rows, and the cells the envelope takes from it."""
    stages = study.get("stages") or {}
    if not stages.get("held"):
        return None
    budgets = held_budgets(study["budgets"], stages.get("lead_budget"))
    held_rows = collect_held_rows(records, budgets)
    walks = held_walks(rows, held_rows, study["grid"], budgets, study["seed"], recorded_config(records),
                       walked(stages["held"]))
    for w in walks:
        w["next"] = w["next"].name if w["next"] else None
    moves = held_moves(walks)
    return {"budgets": budgets, "walks": walks, "ladders": {axis: list(v) for axis, v in LADDERS.items()},
            "moves": [{"family": f, "budget": b, "cell": c} for (f, b), c in sorted(moves.items())],
            "rows": [r for r in held_rows if (r["family"], r["budget"]) in moves
                     and moves[(r["family"], r["budget"])] == r["cell"]]}
