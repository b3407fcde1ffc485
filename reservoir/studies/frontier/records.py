"""A frontier study's records gathered into rows: one per point and seed (the grid, the stages'
references and controls), with the corpus each was scored on, and the paired comparisons written.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from reservoir.data.tokens import corpus_label
from reservoir.platform.files import repository_path
from reservoir.platform.messages import warn
from reservoir.run.records import (
    ResultsError,
    device_share,
    point_scores,
    read_json,
    read_signed_json,
    write_signed_json,
)
from reservoir.studies.budgets import point_name
from reservoir.studies.frontier.grid import CONTROLS, FAMILIES, REFERENCE_RUNS, FrontierError
from reservoir.studies.store import POINTS_FILE, PointRecords

CONTROL_FOLDER = "controls"  # CONTROLS=True: <study>/controls/<cell>+<control>/flops-<top budget>
DRAW_FOLDER = "draws"  # DRAWS=True: <study>/draws/<cell>+draw<seed>/flops-<top budget>, one draw on other seeds
REPLAYS = "replays"  # REPLAY=True: <study>/replays/<point>, a point recorded elsewhere trained again for its checkpoint
COMPARISONS = "comparisons"  # the paired comparison at the top budget: <study>/comparisons/<budget>-<A>-vs-<B>.json
STUDY_FILE = "frontier-study.json"  # the study's grid and settings: what REPORT rebuilds from, and re-runs check


STUDY_FILE_REMEDY = ("restore it as the study wrote it (git checkout, or a copy); to run another grid, name a new "
                     "STUDY")


def read_study_file(folder: Path) -> dict:
    """A study's frontier-study.json, trusted only as the study wrote it: it says which families, cells and
    budgets the report shows, so an edit (a family removed, another KEEP) would change the study silently."""
    return read_signed_json(Path(folder) / STUDY_FILE, "the study's grid", STUDY_FILE_REMEDY)


def read_measured(study_path: Path, name: str, what: str, again: str) -> dict | None:
    """A study's file measured apart from its points (``name``: generation-cost.json, elementwise-cost.json),
    checked; None where it has not been made. ``again``: the command that makes it, as the remedy says it."""
    file = Path(study_path) / name
    if not file.exists():
        return None
    return read_signed_json(file, what, f"restore it (git checkout), or make it again: python scaling.py "
                                        f"{again}={repository_path(study_path)}")


def check_family_definitions(records: PointRecords, cells: list) -> None:
    """Every recorded point of a grid cell was trained with the options its family fixes now (the reservoir
    esn+mlp draws, Transformer++'s recipe): a family redefined under a continued study would otherwise count
    its old points as its new ones, and the study would train none of them again."""
    fixed = {cell.name: (cell.family, cell.model.upper()) for cell in cells}
    for key, point in records.packed()["points"].items():
        cell = key.split("/")[0]
        if cell not in fixed:  # a later stage's point: its cell's grid points are checked
            continue
        family, block = fixed[cell]
        recorded = point["config"].get("requested_config", {}).get(block) or {}
        for option, value in FAMILIES[family][1].items():
            if option in recorded and recorded[option] != value:
                raise FrontierError(
                    f"{records.file} records {key} trained with {block}.{option}={recorded[option]!r}, but "
                    f"{family} now fixes {option}={value!r}: the family was redefined since its points trained. "
                    f"Restore its definition, or name a new STUDY (or delete the family's lines from {records.file} "
                    "and its point folders, and its points train again)")


def records_note(records: PointRecords) -> dict | None:
    """What a study file says of the points.jsonl beside it: its points, their seeds and the SHA-256 of its lines
    (gunzipped: the same records however gzip compressed them), so the two files name each other, and the file's
    name where it is gzipped; None where there is no points.jsonl."""
    if not records.file.exists():
        return None
    points = records.packed()["points"]
    note = {"points": len(points), "seeds": sum(len(p["summary"]) for p in points.values()),
            "sha256": hashlib.sha256(records.text().encode("utf-8")).hexdigest()}
    return note if records.file.name == POINTS_FILE else {**note, "file": records.file.name}


def check_records_file(study: dict, records: PointRecords, training: bool = False) -> None:
    """The points.jsonl beside a study file is the one it was written with, or a newer one (a study goes on).
    For a report, a missing or older one (fewer points or seeds than the study file records: an earlier commit's,
    or lines deleted to train points again) is one line saying how to restore it. For the study's command
    (``training``) fewer points are what it trains again, said in a warning; only a records file missing where
    no point folder is either (a clone: every point would train again) is refused. Study files written before
    they named their records are not checked."""
    noted = study.get("records")
    if not isinstance(noted, dict):
        return
    here = records_note(records)
    written = records.path / noted.get("file", POINTS_FILE)  # the name the study wrote them under
    restore = f"git checkout -- {written}"
    if here is None and not (training and records.local_points()):
        raise ResultsError(f"{written} is missing, but {STUDY_FILE} records {noted['points']} points in it: "
                           f"restore it ({restore}); the study's command would train every point again")
    count = here or {"points": len(records.packed()["points"]), "seeds": 0, "sha256": None}
    if count["sha256"] == noted["sha256"] or (count["points"] >= noted["points"] and count["seeds"] >= noted["seeds"]):
        return
    said = (f"{records.file} holds {count['points']} of the {noted['points']} points the {STUDY_FILE} beside it "
            f"records (an older file, or points deleted to train them again)")
    if training:
        warn(f"{said}: the missing ones train again; to restore them instead, stop and {restore}")
        return
    raise ResultsError(f"{said}: restore the one written with it ({restore}), or run the study's command, which "
                       "trains the missing points again")


def note_records(folder: Path, records: PointRecords, check: bool = True) -> None:
    """After points.jsonl changed: the study file names it anew, signed again; written only when the note
    changes. ``check``: an older file is refused, not noted (a report); a study that trains passes False."""
    study = read_study_file(folder)
    if check:
        check_records_file(study, records)
    note = records_note(records)
    if note is not None and study.get("records") != note:
        write_signed_json(Path(folder) / STUDY_FILE, {**study, "records": note})


def _first(records: list[dict], seed: int) -> dict | None:
    return next((r for r in records if r.get("seed") == seed), None)


def corpus_of(records: PointRecords, folder: Path) -> str:
    """What a run trained and was scored on, from its config.json (checked): the tokenizer and the splits'
    sizes, so that two studies of one corpus on two machines agree and two corpora never do."""
    return corpus_label(records.config(folder)["data"])


def processor_of(config: dict) -> str | None:
    """The processor a point's recorded config names (None: recorded before records named one)."""
    return (config.get("device") or {}).get("processor")


def collect_records(records: PointRecords, cells: list[dict], budgets: list[float]) -> list[dict]:
    """One row per point and seed that has a record: the cell, the budget, the scores, what it cost, and where it
    trained (the processor its record names, and whether the machine was oversubscribed while it did)."""
    return [row for cell in cells for budget in budgets for extra in (False, True)
            for row in point_rows(records, records.path / cell["name"], cell, budget, extra)]


def point_rows(records: PointRecords, cell_folder: Path, cell: dict, budget: float, extra: bool) -> list[dict]:
    """``collect_records``' rows of one point: the cell's (its record) at ``budget`` under ``cell_folder``, on the
    first seed or (``extra``) the others."""
    folder = cell_folder / (point_name(budget) + ("-seeds" if extra else ""))
    summary = records.summary(folder)
    if summary is None:
        return []
    config = records.config(folder)
    corpus, trained_on = corpus_label(config["data"]), processor_of(config)
    rows = []
    for r in summary:
        fit = r.get("fit") or {}
        rows.append({**point_scores(r, folder), "cell": cell["name"], "family": cell["family"],
                     "size": cell["size"], "learning_rate": cell["learning_rate"],
                     "batch_size": cell["batch_size"], "budget": budget, "envelope_seed": extra,
                     "val_loss": r.get("val_loss"), "train_loss": r.get("train_loss"),
                     "train_steps": r.get("train_steps"), "corpus": corpus,
                     "spent_flops": (r.get("train_flops") or 0) - (fit.get("branched_at_flops") or 0),
                     "spent_seconds": device_share(r) * ((r.get("train_seconds") or 0)
                                                         - (fit.get("branched_at_seconds") or 0)),
                     "branched": bool(fit.get("branched_at_flops")), "processor": trained_on,
                     "oversubscribed": (r.get("machine_load") or {}).get("oversubscribed"),
                     **({"held": cell["held"]} if cell.get("held") else {})})
    return rows


def study_budgets(study: dict) -> list[float]:
    """A study file's grid budgets, then its lead budget if it has one."""
    lead = (study.get("stages") or {}).get("lead_budget")
    return [*study["budgets"], *([lead] if lead else [])]


def collect_references(records: PointRecords) -> list[dict]:
    """One row per finished reference run (REFERENCES=True): its model, size and scores."""
    rows = []
    for name in REFERENCE_RUNS:
        folder = records.path / "references" / name
        summary = records.summary(folder, "a reference run's summary")
        if summary is None:
            continue
        corpus = corpus_of(records, folder)
        for r in summary:
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


def compared_cells(comparison: dict) -> tuple[set[str], set[str]]:
    """The cells a paired comparison scored, side A's and side B's: each run is '<cell>/<point>', or a copy
    trained again here ('replays/<cell>/<point>', 'edges/<cell>/<point>')."""
    return tuple({Path(run).parent.name for run in (comparison.get(side) or {}).get("runs") or []}
                 for side in ("a", "b"))


def draw_folder(study_path: Path, cell: str, draw: int, budget: float) -> Path:
    return Path(study_path) / DRAW_FOLDER / f"{cell}+draw{draw}" / point_name(budget)


def collect_draws(records: PointRecords, cells: list[dict], budgets: list[float]) -> list[dict]:
    """One row per finished run of DRAWS=True and seed: the cell, its draw (DRAW_SEED) and training seed, the scores.
    A folder under draws/ that names no cell of the study, or whose runs drew with another seed, is one line."""
    where = records.path / DRAW_FOLDER
    by_name = {c["name"]: c for c in cells}
    rows = []
    for folder in (where / name for name in records.names_under(where)):
        name, _, draw = folder.name.rpartition("+draw")
        cell = by_name.get(name)
        if cell is None or not draw.isdigit():
            raise FrontierError(f"{folder} is not a draw of this study (<cell>+draw<seed>, as DRAWS=True names them); "
                                "move it out")
        for budget in budgets:
            point = folder / point_name(budget)
            summary = records.summary(point, "a draw's summary")
            if summary is None:
                continue
            config = records.config(point)
            if config["effective_config"].get("DRAW_SEED") != int(draw):
                raise FrontierError(f"{point} drew with DRAW_SEED={config['effective_config'].get('DRAW_SEED')}, "
                                    f"its folder says {draw}: move it out, and the study's command trains it again")
            for r in summary:
                rows.append({**point_scores(r, point), "cell": name, "family": cell["family"], "budget": budget,
                             "draw": int(draw), "corpus": corpus_label(config["data"])})
    return rows


def collect_controls(records: PointRecords, cells: list[dict], budgets: list[float]) -> list[dict]:
    """One row per finished control run (CONTROLS=True) and seed: the cell it controls, the control, the scores.
    A folder under controls/ that names no cell and control of the study is refused in one line."""
    where = records.path / CONTROL_FOLDER
    by_name = {c["name"]: c for c in cells}
    rows = []
    for folder in (where / name for name in records.names_under(where)):  # the controls' logs/ are not records
        name, _, control = folder.name.rpartition("+")
        cell = by_name.get(name)
        if cell is None or control not in CONTROLS.get(cell["family"], {}):
            raise FrontierError(f"{folder} is not a control of this study (<cell>+<control>, the controls: "
                                f"{', '.join(sorted({c for f in CONTROLS.values() for c in f}))}); move it out")
        for budget in budgets:
            point = folder / point_name(budget)
            summary = records.summary(point, "a control's summary")
            if summary is None:
                continue
            corpus = corpus_of(records, point)
            for r in summary:
                rows.append({**point_scores(r, point), "cell": name, "family": cell["family"], "control": control,
                             "budget": budget, "options": CONTROLS[cell["family"]][control],
                             "trained": r.get("trained"), "corpus": corpus})
    return rows
