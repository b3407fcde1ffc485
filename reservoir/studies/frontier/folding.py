"""A study's points folded K to a process (POINTS_PER_DEVICE=K on a CPU core or a TPU chip): the points of one
stage that share a family, size, batch and budget and differ only in a rate, a seed or a folder run as one
``TinyStories.py A --and B ...`` (reservoir/run/group.py), each still an ordinary point with its own folder and
record. A family whose frozen draws are its seed's folds the points of one seed (a grid cell's rates); a family
that does not fold keeps a process a point.

    jobs, groups = fold_jobs(jobs, cells, k, scanned)   # groups: {the group's first folder: every member's folder}
"""

from __future__ import annotations

import copy
from functools import cache
from pathlib import Path

from reservoir.config import key_value, parse_overrides
from reservoir.run.experiment import MEMBER_SETTINGS
from reservoir.studies.frontier.grid import Cell

GROUP = "--and"  # TinyStories.py's separator of a group's points


@cache
def _folds(family: str, size: str, batch: int, scanned: bool) -> str | None:
    """How points of this family and size fold (on a device whose points scan their recurrences, ``scanned``:
    device.scans_recurrences): "any" whatever their seeds, "seed" only points of one seed (its frozen draws are
    the seed's, and a fold keeps one draw), None never (a family trained in closed form or on harvested
    features, which is not built to learn it, one fold refuses, or one that would lose on this device). Built
    once a study, with a stand-in vocabulary: a fold depends on the model's structure, not its vocabulary."""
    from reservoir.models import build_model, trainer_of
    from reservoir.run.fold import why_not_fold, why_not_here
    from reservoir.run.harvest import harvests
    from reservoir.studies.frontier.grid import FAMILIES

    model = FAMILIES[family][0]
    config = parse_overrides(Cell(family, size, 1e-3, batch).settings())
    if trainer_of(model, config) != "sgd":
        return None
    first = build_model(model, 64, {**config, "SEED": 0})
    if harvests(first) or why_not_here([first], scanned):
        return None
    if why_not_fold([first, build_model(model, 64, {**config, "SEED": 1})]) is None:
        return "any"
    return "seed" if why_not_fold([first, copy.deepcopy(first)]) is None else None


def _shared(args: list[str], keep: tuple[str, ...] = ()) -> tuple[str, ...]:
    """What a point's arguments hold besides its member settings (those in ``keep`` held too): points alike in
    it fold together."""
    return tuple(a for a in args if (key := (key_value(a) or (a,))[0]) not in MEMBER_SETTINGS or key in keep)


def fold_jobs(jobs: list[tuple[Path, list[str]]], cells: dict[str, Cell], k: int,
              scanned: bool) -> tuple[list[tuple[Path, list[str]]], dict[Path, list[Path]]]:
    """``jobs`` (a point's folder, its arguments) with the grid points of a family that folds joined k at a time,
    in the order they came; the others as they were. A point whose folder is not a grid cell's (a stage's walk,
    a control) stays a process of its own."""
    out: list = []
    open_groups: dict[tuple, int] = {}  # a group still taking members: its place in ``out``
    groups: dict[Path, list[Path]] = {}
    for folder, args in jobs:
        cell = cells.get(folder.parent.name)
        folds = None if k < 2 or cell is None else _folds(cell.family, cell.size, cell.batch_size, scanned)
        if folds is None:
            out.append((folder, args))
            continue
        key = _shared(args, ("SEED", "SEEDS") if folds == "seed" else ())
        place = open_groups.get(key)
        if place is None:
            open_groups[key] = len(out)
            out.append((folder, list(args)))
            groups[folder] = [folder]
            continue
        first, joined = out[place]
        out[place] = (first, [*joined, GROUP, *args])
        groups[first].append(folder)
        if len(groups[first]) == k:
            del open_groups[key]
    return out, {first: members for first, members in groups.items() if len(members) > 1}
