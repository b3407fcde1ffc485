"""A study's points folded K to a process (POINTS_PER_DEVICE=K on a CPU core or a TPU chip): the points of one
stage that share a family, size, batch and budget and differ only in a rate, a seed or a folder run as one
``TinyStories.py A --and B ...`` (reservoir/run/group.py), each still an ordinary point with its own folder and
record. A family that does not fold keeps a process a point.

    jobs, groups = fold_jobs(jobs, cells, k)   # groups: {the group's first folder: every member's folder}
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from reservoir.config import key_value, parse_overrides
from reservoir.run.experiment import MEMBER_SETTINGS
from reservoir.studies.frontier.grid import Cell

GROUP = "--and"  # TinyStories.py's separator of a group's points


@cache
def _folds(family: str, size: str, batch: int) -> bool:
    """Whether two points of this family and size fold (built once a study, with a stand-in vocabulary: a fold
    depends on the model's structure, not its vocabulary); a family trained in closed form or on harvested
    features never does, and is not built to learn it."""
    from reservoir.models import build_model, trainer_of
    from reservoir.run.fold import why_not_fold
    from reservoir.run.harvest import harvests
    from reservoir.studies.frontier.grid import FAMILIES

    model = FAMILIES[family][0]
    config = parse_overrides(Cell(family, size, 1e-3, batch).settings())
    if trainer_of(model, config) != "sgd":
        return False
    pair = [build_model(model, 64, {**config, "SEED": seed}) for seed in (0, 1)]
    return not harvests(pair[0]) and why_not_fold(pair) is None


def _shared(args: list[str]) -> tuple[str, ...]:
    """What a point's arguments hold besides its member settings: points alike in it fold together."""
    return tuple(a for a in args if (key_value(a) or (a,))[0] not in MEMBER_SETTINGS)


def fold_jobs(jobs: list[tuple[Path, list[str]]], cells: dict[str, Cell],
              k: int) -> tuple[list[tuple[Path, list[str]]], dict[Path, list[Path]]]:
    """``jobs`` (a point's folder, its arguments) with the grid points of a family that folds joined k at a time,
    in the order they came; the others as they were. A point whose folder is not a grid cell's (a stage's walk,
    a control) stays a process of its own."""
    out: list = []
    open_groups: dict[tuple, int] = {}  # a group still taking members: its place in ``out``
    groups: dict[Path, list[Path]] = {}
    for folder, args in jobs:
        cell = cells.get(folder.parent.name)
        if k < 2 or cell is None or not _folds(cell.family, cell.size, cell.batch_size):
            out.append((folder, args))
            continue
        key = _shared(args)
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
