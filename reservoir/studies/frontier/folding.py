"""A study's points folded K to a process (POINTS_PER_DEVICE=K on a CPU core or a TPU chip; =probe there or on a
GPU): the points of one stage that share a family, size, batch and budget and differ only in a rate, a seed or a
folder run as one ``TinyStories.py A --and B ...`` (reservoir/run/group.py), each still an ordinary point with its
own folder and record. A family whose frozen draws are its seed's folds the points of one seed (a grid cell's
rates); a family that does not fold keeps a process a point.

    jobs, groups = fold_jobs(jobs, cells, k, scanned)   # groups: {the group's first folder: every member's folder}
    probe = probe_fold("transformer++", "xs", 4, vocab=77)  # POINTS_PER_DEVICE=probe (a CPU core, a GPU): K
"""

from __future__ import annotations

import copy
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import torch

from reservoir.config import key_value, parse_overrides
from reservoir.run.experiment import MEMBER_SETTINGS
from reservoir.run.records import ResultsError, read_json, read_run_config, write_json_atomic
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


def members(args: list[str]) -> int:
    """How many members a point's command trains in a fold: each of its SEEDS (a continued point's, its
    folder's), else its one seed."""
    given = {kv[0]: kv[2] for kv in map(key_value, args) if kv}
    if "SEEDS" in given:
        return len(parse_overrides([f"SEEDS={given['SEEDS']}"])["SEEDS"] or [0])
    if "RESUME" in given:
        try:
            return len(read_run_config(Path(given["RESUME"]))["requested_config"].get("SEEDS") or [0])
        except ResultsError:  # a damaged folder: the point's own run says so, in its own line
            return 1
    return 1


def fold_jobs(jobs: list[tuple[Path, list[str]]], cells: dict[str, Cell], k: int | Callable[[Cell], int],
              scanned: bool, sized: dict[Path, int]) -> tuple[list[tuple[Path, list[str]]], dict[Path, list[Path]]]:
    """``jobs`` (a point's folder, its arguments) with the grid points of a family that folds joined k members
    at a time (``k(cell)`` where each family, size and batch has its own; ``sized``: each point's ``members``, a
    member a seed), in the order they came; the others as they were. A point whose several seeds fold and that nothing
    joins is a group of its own (``A --and``: its seeds fold). A family whose draws are its seed's folds one
    seed's points only, so a point with several seeds stays a process of its own. A point whose folder is not
    a grid cell's (a stage's walk, a control) stays a process of its own."""
    out: list = []
    open_groups: dict[tuple, int] = {}  # a group still taking members: its place in ``out``
    groups: dict[Path, list[Path]] = {}
    size: dict[Path, int] = {}  # a group's members so far
    for folder, args in jobs:
        cell = cells.get(folder.parent.name)
        folds = None if cell is None or k == 1 else _folds(cell.family, cell.size, cell.batch_size, scanned)
        most = 1 if folds is None else k(cell) if callable(k) else k
        count = sized[folder]
        if most < 2 or count > most or (folds == "seed" and count > 1):
            out.append((folder, args))
            continue
        key = _shared(args, ("SEED", "SEEDS") if folds == "seed" else ())
        place = open_groups.get(key)
        if place is not None and size[out[place][0]] + count > most:
            del open_groups[key]
            place = None
        if place is None:
            open_groups[key] = len(out)
            out.append((folder, list(args)))
            groups[folder], size[folder] = [folder], count
        else:
            first, joined = out[place]
            out[place] = (first, [*joined, GROUP, *args])
            groups[first].append(folder)
            size[first] += count
        if size[out[open_groups[key]][0]] == most:
            del open_groups[key]
    for place, (first, args) in enumerate(out):
        if len(groups.get(first, ())) == 1 and size[first] > 1:
            out[place] = (first, [*args, GROUP])  # one point, its seeds the fold's members
    return out, {first: folders for first, folders in groups.items() if size[first] > 1}


# --- POINTS_PER_DEVICE=probe: how many to fold on a CPU core or a GPU, from a short probe there

FOLDS_TRIED = (2, 4, 8)  # the members a probe folds: each doubles the rows a folded kernel runs
# a fold is chosen only where its members train this much faster than one point at a time: the probe's own spread
# on a host that runs other work beside it (a few % from round to round, bench/README.md) is not a gain
FOLD_GAIN = 1.1
PROBE_STEPS = 4  # timed steps of each, after two untimed ones, in each of PROBE_ROUNDS interleaved rounds
PROBE_ROUNDS = 3


def training_step(model: torch.nn.Module, ids: torch.Tensor, members: int, decayed: set[str] | None = None):
    """A step of ``model`` on ``ids`` (members x batch rows), gradients clipped: one model's with torch's
    AdamW; a fold's (``decayed``: its members' decayed names) each member's mean loss, summed, with
    MemberAdamW's per-member rates and clips, as a folded point trains."""
    from reservoir.run.fold import MemberAdamW, member_losses

    x, y = ids[:, :-1], ids[:, 1:]
    if decayed is None:
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=True)
        clip = lambda: torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # noqa: E731
    else:
        optimizer = MemberAdamW(model, decayed, torch.full((members,), 1e-3, device=ids.device), 0.01, 0.95)
        clip = lambda: optimizer.clip(1.0)  # noqa: E731

    def step():
        member_losses(model(x), y, members).sum().backward()
        clip()
        optimizer.step()
        optimizer.zero_grad()
    return step


def milliseconds(step, repeats: int, device: str = "cpu", warm: int = 2, clock=time.perf_counter) -> float:
    """Milliseconds ``step()`` takes, the mean of ``repeats`` after ``warm`` untimed (on a GPU, finished work),
    by ``clock`` (the wall's, or time.process_time: the CPU time this process spent, which a host's other
    work does not add to while it waits for the core)."""
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    for _ in range(warm):
        step()
    sync()
    start = clock()
    for _ in range(repeats):
        step()
    sync()
    return (clock() - start) / repeats * 1e3


@dataclass(frozen=True)
class FoldProbe:
    """What a probe measured: one point's step alone and K folded, in ms (medians over the rounds), and the K
    it chose: the fastest per member of those tried, if it beats one at a time by FOLD_GAIN, else 1."""

    one_ms: float
    folded_ms: dict[int, float]

    def speedup(self, k: int) -> float:
        return k * self.one_ms / self.folded_ms[k] if k > 1 else 1.0

    @property
    def chosen(self) -> int:
        best = max(self.folded_ms, key=self.speedup, default=1)
        return best if self.speedup(best) >= FOLD_GAIN else 1

    def describe(self) -> str:
        tried = ", ".join(f"{k} folded {ms:.1f} ms ({self.speedup(k):.2f}x)" for k, ms in self.folded_ms.items())
        alone = f"a point a process (no fold gains {FOLD_GAIN:g}x)"
        choice = f"{self.chosen} to a process" if self.chosen > 1 else alone
        return f"one point's step {self.one_ms:.1f} ms, {tried}: {choice}"


def _as_points_train(step, info):
    """``step`` in the precision a point on ``info``'s device trains in (device.autocast: a GPU's mixed
    precision, the CPU's fp32)."""
    from reservoir.platform import device as dev

    def step_in_its_precision():
        with dev.autocast(info):
            step()
    return step_in_its_precision


@cache
def probe_fold(family: str, size: str, batch: int, vocab: int, settings: tuple[str, ...] = (),
               threads: int = 1, device: str = "cpu") -> FoldProbe:
    """Times a training step of this family, size and batch (with the study's ``settings``: its context, say) on
    this host's CPU with ``threads`` threads (a point's share), one point at a time and K folded for each K in
    FOLDS_TRIED, by the CPU time they take (the wall's would count the host's other work), over
    PROBE_ROUNDS interleaved rounds so that what the other work does to the caches weighs on each alike. A
    family whose draws are its seed's is probed with one seed's members, as it folds. A few seconds
    at xs, about 25 at l (one thread). On a GPU (``device`` 'cuda'), there, in the precision its points train
    in, by the wall's time of finished work: the study's points do not run while it probes."""
    from reservoir.models import build_model
    from reservoir.platform import device as dev
    from reservoir.run.fold import fold
    from reservoir.run.train import decayed_names
    from reservoir.studies.frontier.grid import FAMILIES

    model = FAMILIES[family][0]
    config = parse_overrides([*settings, *Cell(family, size, 1e-3, batch).settings()])
    info = dev.select_device({**config, "DEVICE": device, "USE_TPU": False})
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    clock = time.process_time if device == "cpu" else time.perf_counter
    try:
        first = build_model(model, vocab, {**config, "SEED": 0}).to(info.device)
        members = [first, *(copy.deepcopy(first) for _ in range(FOLDS_TRIED[-1] - 1))]
        ids = torch.randint(0, vocab, (FOLDS_TRIED[-1], batch, config["SEQ_LEN"] + 1),
                            generator=torch.Generator().manual_seed(0)).to(info.device)
        decayed = decayed_names(first)
        alone = _as_points_train(training_step(first, ids[0], 1), info)
        folds = {k: _as_points_train(training_step(fold(members[:k]), ids[:k].flatten(0, 1), k, decayed), info)
                 for k in FOLDS_TRIED}
        rounds: dict = {0: [], **{k: [] for k in FOLDS_TRIED}}
        for _ in range(PROBE_ROUNDS):  # CPU time: a study's other points share the cores while it probes
            rounds[0].append(milliseconds(alone, PROBE_STEPS, device, clock=clock))
            for k, step in folds.items():
                rounds[k].append(milliseconds(step, PROBE_STEPS, device, clock=clock))
    finally:
        torch.set_num_threads(before)
    median = {k: sorted(times)[len(times) // 2] for k, times in rounds.items()}
    return FoldProbe(median.pop(0), median)


def probed_folds(sized: dict[Path, int], cells: dict[str, Cell], vocab: int, settings: tuple[str, ...], slot,
                 log: Path, say) -> Callable[[Cell], int]:
    """POINTS_PER_DEVICE=probe on a CPU core or a GPU: for ``fold_jobs``, ``k(cell)``, as many members of one
    family, size and batch to a process as ``probe_fold`` chose for them, probed as a point on ``slot``
    (device.Slot: a CPU core or a GPU, and a point's threads) would train. A shape is probed where the stage's
    points (``sized``: each folder's ``members``) hold two or more members of it, once a process; each probe is
    said once a stage and kept in ``log`` (JSON, beside what earlier runs probed; a damaged log is written again,
    as it is only a log)."""
    device = slot.torch_device  # 'cpu' or 'cuda': a study on a TPU chip refuses the probe before
    threads = int(slot.env.get("OMP_NUM_THREADS", "1"))
    counts: Counter = Counter()  # a stage's members of each shape
    for folder, count in sized.items():
        if cell := cells.get(folder.parent.name):
            counts[cell.family, cell.size, cell.batch_size] += count
    said: set = set()

    def most(cell: Cell) -> int:
        key = (cell.family, cell.size, cell.batch_size)
        if counts[key] < 2:
            return 1
        probe = probe_fold(*key, vocab, settings, threads=threads, device=device)
        if key not in said:
            said.add(key)
            name = f"{cell.family} {cell.size} batch {cell.batch_size}"
            say(f"{name} on {'a CPU core' if device == 'cpu' else 'a GPU'}: {probe.describe()}")
            try:
                kept = read_json(log, "the fold probes") if log.exists() else {}
            except ResultsError:
                kept = {}
            kept[name] = {"one_ms": probe.one_ms, "folded_ms": {str(k): v for k, v in probe.folded_ms.items()},
                          "points_per_process": probe.chosen, "vocab": vocab, "threads": threads,
                          "device": device}
            log.parent.mkdir(parents=True, exist_ok=True)
            write_json_atomic(log, kept)
        return probe.chosen
    return most
