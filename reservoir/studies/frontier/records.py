"""A frontier study's records gathered into rows: one per point and seed (the grid, the stages'
references and controls), with the corpus each was scored on, and the paired comparisons written.
"""

from __future__ import annotations

from pathlib import Path

from reservoir.run.records import point_scores, read_json, read_run_config, read_summary
from reservoir.studies.budgets import point_name
from reservoir.studies.frontier.grid import CONTROLS, REFERENCE_RUNS, FrontierError

CONTROL_FOLDER = "controls"  # CONTROLS=True: <study>/controls/<cell>+<control>/flops-<top budget>


COMPARISONS = "comparisons"  # the paired comparison at the top budget: <study>/comparisons/<budget>-<A>-vs-<B>.json


STUDY_FILE = "frontier-study.json"  # the study's grid and settings: what REPORT rebuilds from, and re-runs check


def _first(records: list[dict], seed: int) -> dict | None:
    return next((r for r in records if r.get("seed") == seed), None)


def corpus_of(folder: Path) -> str:
    """What a run trained and was scored on, from its config.json (checked): the tokenizer and the splits'
    sizes, so that two studies of one corpus on two machines agree and two corpora never do."""
    data = read_run_config(folder)["data"]
    return (f"{data['tokenizer']} tokenizer {data['tokenizer_hash']}, {data['train_chars']:,} training and "
            f"{data['val_chars']:,} validation characters")


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
                    rows.append({**point_scores(r, folder), "cell": cell["name"], "family": cell["family"],
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
            rows.append({**point_scores(r, folder), "name": name, "model": r.get("model"), "corpus": corpus})
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
        if not folder.is_dir() or folder.name == "logs":  # the controls' logs (runner.run_points), not records
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
                rows.append({**point_scores(r, point), "cell": name, "family": cell["family"], "control": control,
                             "budget": budget, "options": CONTROLS[cell["family"]][control],
                             "trained": r.get("trained"), "corpus": corpus})
    return rows
