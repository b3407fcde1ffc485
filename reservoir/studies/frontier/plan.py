"""What a frontier study costs before it runs (PLAN=True): each stage's points and FLOPs, and the device-hours
and wall time they take on this host's devices, from a short measured probe of each family, size and batch,
run as the points will run (on the CPU, as many copies at once as the study runs points, each in its own
process: one-thread points side by side each run slower than one alone where they share caches and memory).

    probe = probe_cells(study, data)      # seconds per training step of each cell's model, measured here
    plan = estimate(study, measure, probe, hosts, recorded_cells(study))  # per stage: points, FLOPs, seconds
    print(format_plan(plan, study))

Stages after the first budget are estimated with successive halving keeping KEEP cells of each family (the
bound is every runnable cell: both are shown), or, for a study with records, the cells its halving keeps
where its records decide them and, after a budget still training, the share its recorded points' ranking
keeps; a point that branches off the budget before pays its extension and its
cooldown; the envelope's extra seeds train from step 0, and so do the lead budget's (its first seed branches
off the top grid budget). A study with records is also told what is left to train. Each point also pays what is not
training: its evaluations and samples, probed with the cell's own model (``scoring_seconds``), and
POINT_OVERHEAD_S for the rest (its start, its data, its FLOP count).
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from types import SimpleNamespace

from reservoir.platform.machine import MachineLoad
from reservoir.platform.messages import progress
from reservoir.run.records import device_seconds
from reservoir.studies.frontier.contexts import CONTEXT_FOLDER
from reservoir.studies.frontier.edges import EDGE_FOLDER
from reservoir.studies.frontier.grid import REFERENCE_FAMILIES, RESERVOIR_FAMILIES
from reservoir.studies.frontier.held import HELD_FOLDER
from reservoir.studies.frontier.records import CONTROL_FOLDER, DRAW_FOLDER

# seconds a point spends besides training, evaluating and sampling (its start, data, FLOP count): about 1 s forked
# on the CPU (measured: a point's time besides training was its probed scoring, within 1-3 s); a new Python (a GPU's
# or a TPU's point) spends about 6 s more importing torch
POINT_OVERHEAD_S = 1.0
PROBE_STEPS = 5  # timed training steps per cell, after two warm-up steps
PROBE_EVAL_TOKENS = 4096  # validation tokens each kind of evaluation is timed on, then scaled to a point's
PROBE_SAMPLE_TOKENS = 16  # tokens each prompt's sample is timed on, then scaled to SAMPLE_TOKENS


@contextmanager
def _probed(name: str, config: dict, data, threads: int):
    """(config, device info, model) of a probe of model ``name``: its settings, on this host's first GPU or on
    the CPU (a TPU study is probed on the CPU), with ``threads`` threads (a point's share) while it runs."""
    import torch

    from reservoir.models import build_model
    from reservoir.models.settings import model_settings
    from reservoir.platform import device as dev

    config = model_settings(config, name)
    kind = dev.resolve_kind(config["DEVICE"], config["USE_TPU"])
    info = dev.select_device({**config, "DEVICE": "cuda" if kind == "cuda" else "cpu", "USE_TPU": False})
    model = build_model(name, data.tokenizer.vocab_size, config).to(info.device)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield config, info, model
    finally:
        torch.set_num_threads(before)


def step_seconds(name: str, config: dict, data, threads: int, steps: int = PROBE_STEPS, together=None) -> float:
    """Seconds one training step of model ``name`` takes on this host's CPU with ``threads`` threads (a point's
    share) or its first GPU: a few AdamW steps on the study's own data, timed after two warm-up steps (from
    when every copy is ready, where ``together`` is the barrier of copies probing at once)."""
    import torch

    with _probed(name, config, data, threads) as (config, info, model):
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
        batch, length = config["BATCH_SIZE"], config["SEQ_LEN"]
        ids = torch.as_tensor(data.train[: batch * (length + 1)].astype("int64")).view(batch, length + 1)
        ids = ids.to(info.device)
        for k in range(2 + steps):
            if k == 2:
                if info.kind == "cuda":
                    torch.cuda.synchronize()
                if together is not None:
                    together.wait(timeout=600)
                started = time.perf_counter()
            logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if info.kind == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - started) / steps * config["GRAD_ACCUM"]


def scoring_seconds(name: str, config: dict, data, threads: int) -> float:
    """Seconds a point of model ``name`` spends scoring itself besides training, timed as ``step_seconds`` is:
    each evaluation its fit runs (Evaluations.for_run: EVAL_POINTS - 1 periodic ones, the final one with its
    interval, its windows twin where it streams (read in the final's own pass where it can be), the training
    split's), each timed on PROBE_EVAL_TOKENS and scaled to its own tokens; and its samples, timed on
    PROBE_SAMPLE_TOKENS and scaled to SAMPLE_TOKENS. A recurrent model reads a stream one chunk at a time and a
    windowed one scores overlapping windows, so this part differs by family more than training does."""
    from reservoir.run.evaluation import Evaluations
    from reservoir.run.train import sample_stories

    with _probed(name, config, data, threads) as (config, info, model):
        config = {**config, "COMPILE": False}  # eager, as the training steps are probed: a compile in a probe of
        whole = Evaluations.for_run(data, config)  # a few hundred tokens, scaled to a point's, would be most of it
        probe = Evaluations.for_run(data, {**config, "EVAL_TOKENS": PROBE_EVAL_TOKENS,
                                           "FINAL_EVAL_TOKENS": PROBE_EVAL_TOKENS,
                                           "TRAIN_EVAL_TOKENS": config["TRAIN_EVAL_TOKENS"] and PROBE_EVAL_TOKENS})
        seconds = 0.0
        shared = probe.final_windows is not None and probe.final.covers_windows_of(probe.final_windows, model)
        for field, times, keep in (("periodic", config["EVAL_POINTS"] - 1, False), ("final", 1, True),
                                   ("final_windows", 1, True), ("final_train", 1, False)):
            full, small = getattr(whole, field), getattr(probe, field)
            if full is None or times <= 0 or (field == "final_windows" and shared):  # read in the final's pass
                continue
            started = time.perf_counter()
            if field == "final" and shared:
                small.score_with_windows(model, info, info.device, probe.final_windows)
            else:
                small(model, info, info.device, keep=keep)
            seconds += (time.perf_counter() - started) * full.n / small.n * times
        if config["SAMPLE_TOKENS"]:
            tokens = min(PROBE_SAMPLE_TOKENS, config["SAMPLE_TOKENS"])
            started = time.perf_counter()
            sample_stories(model, data, {**config, "SAMPLE_TOKENS": tokens}, info)
            seconds += (time.perf_counter() - started) * config["SAMPLE_TOKENS"] / tokens
        return seconds


_TOGETHER: list = []  # in a probe process: the barrier its copies meet at before timing


def _meet_at(barrier) -> None:
    from reservoir.studies.runner import as_a_new_process

    as_a_new_process()
    _TOGETHER[:] = [barrier]


def _probe_copy(name: str, config: dict, data, threads: int) -> tuple[float, int, float, float]:
    """In a probe process: step_seconds, with this process's id and when the copy began and ended."""
    import os

    started = time.time()
    seconds = step_seconds(name, config, data, threads, together=_TOGETHER[0])
    return seconds, os.getpid(), started, time.time()


def probe_cells(study, data, check=lambda: None):
    """``seconds_per_step(cell)``: ``step_seconds`` of each family, size and batch of the grid, probed once, the
    way the study's points run: on the CPU with several slots, a copy in each of that many processes at once
    (they share the cores' caches and memory bandwidth, as the points will), their mean. What each copy ran is
    kept in ``seconds_per_step.copies[(family, size, batch)]``: (seconds, pid, start, end). Its
    ``besides_training(cell)``: POINT_OVERHEAD_S and ``scoring_seconds``, probed once, here. ``check()`` is called
    before each probe (a stopped plan's ends it there: platform.stopping.ended_by_a_signal)."""
    from reservoir.config import parse_overrides

    slots = study.slots()
    threads = int(slots[0].env.get("OMP_NUM_THREADS", "1"))
    together = len(slots) if slots[0].label == "cpu" and len(slots) > 1 else 1
    pool = _probe_pool(together) if together > 1 else None  # its processes start with the first probe
    seen: dict = {}
    scored: dict = {}
    kinds = {(c.family, c.size, c.batch_size) for c in study.cells()}
    bar = progress(2 * len(kinds), f"plan for frontier {study.name}: probing {len(kinds)} families x sizes x "
                   "batches (training steps, then evaluations and samples)")

    def settings(cell) -> dict:
        return parse_overrides([*study.settings, *cell.settings(), f"FLOP_BUDGET={study.budgets[0]!r}"])

    def seconds_per_step(cell) -> float:
        key = (cell.family, cell.size, cell.batch_size)
        if key in seen:
            return seen[key]
        check()
        if pool is None:
            seen[key] = step_seconds(cell.model, settings(cell), data, threads)
        else:
            config = settings(cell)
            tokens = config["BATCH_SIZE"] * (config["SEQ_LEN"] + 1)  # the probe's one batch, and the vocabulary
            copy = SimpleNamespace(train=data.train[:tokens].copy(),
                                   tokenizer=SimpleNamespace(vocab_size=data.tokenizer.vocab_size))
            runs = [pool.submit(_probe_copy, cell.model, config, copy, threads) for _ in range(together)]
            seconds_per_step.copies[key] = [run.result() for run in runs]
            seen[key] = sum(c[0] for c in seconds_per_step.copies[key]) / together
        bar.update(1)
        return seen[key]

    def besides_training(cell) -> float:
        key = (cell.family, cell.size, cell.batch_size)
        if key not in scored:
            check()
            scored[key] = POINT_OVERHEAD_S + scoring_seconds(cell.model, settings(cell), data, threads)
            bar.update(1)
        return scored[key]

    def close():
        bar.close()
        if pool is not None:
            pool.shutdown(cancel_futures=True)

    seconds_per_step.copies = {}
    seconds_per_step.besides_training = besides_training
    seconds_per_step.close = close
    return seconds_per_step


def _probe_pool(copies: int):
    """``copies`` processes forked as the study's CPU points are (runner.fork_context), meeting at one barrier
    before each timed stretch; None where the platform cannot fork them."""
    from concurrent.futures import ProcessPoolExecutor

    from reservoir.studies.runner import fork_context

    context = fork_context()
    if context is None:
        return None
    return ProcessPoolExecutor(copies, mp_context=context, initializer=_meet_at,
                               initargs=(context.Barrier(copies),))


def recorded_cells(study) -> dict:
    """{(family, budget): how many of its cells the study holds a first-seed record of at that grid budget}: what
    its own successive halving kept, for ``estimate`` to plan a continued or grown study by."""
    counts = {}
    for cell in study.cells():
        for budget in study.budgets:
            if study.first_seed_record(cell, budget) is not None:
                counts[cell.family, budget] = counts.get((cell.family, budget), 0) + 1
    return counts


def decided_cells(study, plan: dict) -> dict:
    """{budget: the cells successive halving trains there}, for each budget the study's records decide: the first,
    and each after one whose live cells all hold first-seed records (replayed as the study runs it)."""
    decided = {}
    for budget, live, _, _ in study.halving(plan):
        decided[budget] = live
        if any(study.first_seed_record(cell, budget) is None for cell in live):
            break
    return decided


def next_cells(study, plan: dict, decided: dict) -> dict:
    """{the budget after the last that ``decided_cells`` holds: the cells halving is expected to train there} while
    that last budget's points are still being trained: its recorded cells ranked as halving ranks them (the
    share of a family's recorded cells that halving would keep, applied to all its cells there), and the cells
    that join at the next budget (too large for the budgets before). Empty where no budget is part-recorded."""
    budgets = study.budgets
    last = max(decided, default=None)
    if last is None or last == budgets[-1]:
        return {}
    live = decided[last]
    recorded = [c for c in live if study.first_seed_record(c, last) is not None]
    if not recorded or len(recorded) == len(live):  # nothing to rank by yet, or decided
        return {}
    after = budgets[budgets.index(last) + 1]
    scores = {c.name: study.first_seed_record(c, last).get("val_bpc") for c in recorded}
    families = list(dict.fromkeys(c.family for c in live))
    stopped, share = set(), {}
    for family in families:  # the WITHIN rule on what is recorded: the KEEP best of a few cells would be all
        ran = [c for c in recorded if c.family == family]
        out = study.beyond_within({c.name: scores[c.name] for c in ran})
        stopped |= out
        if ran:
            share[family] = 1 - len(out) / len(ran)
    pooled = sum(share.values()) / len(share) if share else 1.0  # a family none of whose points is recorded yet
    kept = []
    for family in families:
        mine = [c for c in live if c.family == family and plan[c.name][after] is None]
        ordered = [c for c in mine if c in recorded and c.name not in stopped] + [c for c in mine
                                                                                 if c not in recorded]
        kept += ordered[:max(min(study.grid["KEEP"], len(mine)), round(share.get(family, pooled) * len(mine)))]
    seen = {c.name for cells in decided.values() for c in cells}
    joining = [c for c in study.cells() if plan[c.name][after] is None and c.name not in seen]
    return {after: kept + joining}


def _kept(by_family: dict, budget: float, keep: int, recorded: dict) -> list:
    """The cells halving is expected to keep at a budget after the first: KEEP a family, or as many as the study's
    records hold there, or the share of its cells that the recorded families kept, whichever is more (WITHIN keeps
    every cell close to the best, often several times KEEP; a grown grid's new cells have no records yet)."""
    held = {f: recorded[f, budget] for f in by_family if recorded.get((f, budget))}
    share = sum(held.values()) / sum(len(by_family[f]) for f in held) if held else 0.0
    kept = []
    for family, cells in by_family.items():
        expected = max(held.get(family, 0), round(share * len(cells)))  # a grown family has cells not run yet
        kept += cells[:max(keep, expected)]
    return kept


def estimate(study, measure, seconds_per_step, hosts: int = 1, recorded: dict | None = None) -> dict:
    """Per stage (each grid budget, then the envelope's extra seeds): points, FLOPs and device-seconds, both as
    successive halving is expected to keep them and at most (every runnable cell); ``measure(cell)`` as
    ``FrontierStudy.plan`` takes it, ``seconds_per_step(cell)`` from ``probe_cells`` (its
    ``besides_training(cell)``: what a point spends besides training; POINT_OVERHEAD_S without it).
    ``recorded`` (``recorded_cells``): what the study's own halving kept, where it holds records, and the cells
    it trains at each budget its records decide (``decided_cells``); without it (the plan before a study runs,
    which its report sets the spent FLOPs against) KEEP cells a family."""
    besides = getattr(seconds_per_step, "besides_training", lambda cell: POINT_OVERHEAD_S)
    plan = study.plan(measure)
    cooldown, keep = study.config["COOLDOWN_FRACTION"], study.grid["KEEP"]
    decided = {} if recorded is None else decided_cells(study, plan)
    expected = {} if recorded is None else next_cells(study, plan, decided)

    def trained(cell, budget) -> bool:
        return recorded is not None and study.first_seed_record(cell, budget) is not None

    def cost(cells, budget, previous, seeds=1):
        """Training FLOPs and device-seconds of ``cells``' points at ``budget`` on ``seeds`` seeds: a point that
        branches off the ``previous`` budget pays its extension and its cooldown, one without trains from step 0
        (as does a cell that joins at ``budget``: too large for the one before, it has no stable phase there)."""
        flops = seconds = 0.0
        for cell in cells:
            per_step = measure(cell)[0]
            steps = math.ceil(budget / per_step)
            branches = previous and plan[cell.name].get(previous, "not a grid budget") is None
            paid = steps - (math.floor((1 - cooldown) * math.ceil(previous / per_step)) if branches else 0)
            flops += seeds * paid * per_step
            seconds += seeds * (paid * seconds_per_step(cell) + besides(cell))
        return flops, seconds

    def stage(name, kept, most, left, budget, previous, seeds=1) -> dict:
        (flops, seconds), (most_flops, most_seconds) = (cost(cells, budget, previous, seeds) for cells in (kept, most))
        return {"stage": name, "points": len(kept), "flops": flops, "seconds": seconds, "points_at_most": len(most),
                "seconds_at_most": most_seconds, "flops_at_most": most_flops, "points_left": len(left),
                "seconds_left": cost(left, budget, previous, seeds)[1]}

    def costliest(family, budget, carried_to=None):
        """An envelope or lead cell that is not known yet: the family's costliest (of those that may be carried
        on to ``carried_to`` within MAX_TOKENS_PER_PARAM, as the leaders are)."""
        cells = [c for c in study.cells() if c.family == family and plan[c.name][budget] is None and (
            carried_to is None or study.skip_reason(c, carried_to, measure) is None)]
        return max(cells, key=lambda c: math.ceil(budget / measure(c)[0]) * seconds_per_step(c)) if cells else None

    stages, previous = [], None
    for k, budget in enumerate(study.budgets):
        runnable = [c for c in study.cells() if plan[c.name][budget] is None]
        by_family: dict = {}
        for cell in sorted(runnable, key=lambda c: not trained(c, budget)):  # the recorded first: kept, most likely
            by_family.setdefault(cell.family, []).append(cell)
        kept = runnable if k == 0 else decided.get(budget) or expected.get(budget) or _kept(
            by_family, budget, keep, recorded or {})
        stages.append(stage(f"{budget:.3g} FLOPs", kept, runnable, [c for c in kept if not trained(c, budget)],
                            budget, previous))
        previous = budget
    extra = study.grid["ENVELOPE_SEEDS"] - 1
    if extra > 0:
        done = _envelope_seeded(study, decided) if recorded is not None else set()
        flops = seconds = seconds_left = 0.0
        points = left = 0
        for budget in study.budgets:
            for family in study.grid["FAMILIES"]:
                cell = costliest(family, budget)
                if cell is None:
                    continue
                flops_here, seconds_here = cost([cell], budget, None, seeds=extra)
                flops, seconds, points = flops + flops_here, seconds + seconds_here, points + 1
                if (family, budget) not in done:
                    seconds_left, left = seconds_left + seconds_here, left + 1
        stages.append({"stage": f"envelope seeds (+{extra})", "points": points, "flops": flops, "seconds": seconds,
                       "points_at_most": points, "seconds_at_most": seconds, "flops_at_most": flops,
                       "points_left": left, "seconds_left": seconds_left})
    lead, top = study.stages.get("lead_budget"), study.budgets[-1]
    if lead:  # the leaders carried on from the top grid budget, every seed; a grid's top is known only after it
        families = study.stages["leaders"]
        if families == "auto":  # the transformer and the best reservoir family: priced as the costliest of each
            families = []
            for kind in (REFERENCE_FAMILIES, RESERVOIR_FAMILIES):
                present = [f for f in study.grid["FAMILIES"] if f in kind and costliest(f, top, lead) is not None]
                families += [max(present, key=lambda f: cost([costliest(f, top, lead)], lead, top)[1])
                             ] if present else []
        cells = [c for c in (costliest(f, top, lead) for f in families) if c is not None]
        seeds = [study.config["SEED"], *study.extra_seeds()]
        if recorded is not None and study.stages["leaders"] != "auto":  # each its own family's envelope at the top
            leaders = [c for f, c in _best_recorded(study, top).items() if f in families]
        elif recorded is not None and top in decided and all(trained(c, top) for c in decided[top]):
            leaders = study.leaders()  # "auto" picks among families: known once every family is
        else:
            leaders = []
        finished = {c.family for c in leaders if study.finished(study.folder(c, lead), seeds[:1])
                    and study.finished(study.folder(c, lead, seeds=True), seeds[1:])}
        to_train = [c for c in cells if c.family not in finished]
        first, more = stage("", cells, cells, to_train, lead, top), stage("", cells, cells, to_train, lead, None, extra)
        stages.append({**{key: first[key] + more[key] for key in first if key != "stage"},
                       "stage": f"lead budget {lead:.3g} FLOPs ({len(cells)} leaders x {extra + 1} seeds)",
                       "points": len(cells), "points_at_most": len(cells),
                       "points_left": first["points_left"], "after_grid": True})
    if recorded:  # a study with records: what its command would start after the grid
        known = all(s["points_left"] == 0 for s in stages)  # the grid, its seeds, the lead budget: all recorded
        stages += after_grid_stages(study, measure, seconds_per_step, besides, known)
    slots = len(study.slots())
    total = sum(s["seconds"] for s in stages)
    most = sum(s["seconds_at_most"] for s in stages)
    left = sum(s["seconds_left"] for s in stages)
    return {"stages": stages, "device_seconds": total, "device_seconds_at_most": most, "slots": slots,
            "hosts": hosts, "wall_seconds": total / (slots * hosts), "wall_seconds_at_most": most / (slots * hosts),
            "device_seconds_left": left, "wall_seconds_left": left / (slots * hosts), "recorded": recorded is not None}


def after_grid_stages(study, measure, seconds_per_step, besides, known: bool) -> list[dict]:
    """The stages a study adds after its grid, as its command would start them now (the study's own lists of
    them: ``reference_jobs``, ``control_jobs``, ``context_jobs``, ``edge_jobs``, ``held_jobs``): each point not
    recorded yet, priced as the cell it trains (a reference: POINT_OVERHEAD_S, one pass). The references are known
    from the start; the rest only once ``known`` (the grid, its seeds and the lead budget recorded: until then the
    envelope they start from may change), else a row says they are not planned yet. The edge walks' next
    steps are the ones known now: a step that beats its point is followed by one more, known only then."""
    packed = study.store.packed()["points"]

    def priced(name, jobs, note="", folder=None):
        """The stage's points: those its records hold (under ``folder``), at what they spent, and those left to
        train (``jobs``), priced."""
        flops = seconds = 0.0
        for job in jobs:
            if job.cell is None:
                seconds += POINT_OVERHEAD_S
                continue
            per_step = measure(job.cell)[0]
            steps = math.ceil(job.budget / per_step)
            flops += job.seeds * steps * per_step
            seconds += job.seeds * (steps * seconds_per_step(job.cell) + besides(job.cell))
        left, left_seconds, pending = len(jobs), seconds, {study.store.key(job.folder) for job in jobs}
        done = [point for key, point in packed.items()
                if folder and key.startswith(f"{folder}/") and key not in pending]
        for point in done:
            records = point.get("summary") or []
            flops += sum(r.get("train_flops") or 0 for r in records)
            seconds += sum(device_seconds(r) or 0 for r in records) + POINT_OVERHEAD_S
        return {"stage": name + note, "points": left + len(done), "flops": flops, "seconds": seconds,
                "points_at_most": left + len(done), "seconds_at_most": seconds, "flops_at_most": flops,
                "points_left": left, "seconds_left": left_seconds, "after_grid": True}

    stages = study.stages
    rows = [priced("references", study.reference_jobs(), folder="references")] if stages.get("references") else []
    later = [name for key, name in (("controls", "controls"), ("contexts", "contexts"), ("edges", "edge walks"),
                                    ("held", "held settings walked"), ("draws", "draws")) if stages.get(key)]
    if not known:
        if later:
            rows.append({**priced(f"{', '.join(later)}: planned once the grid is recorded", []),
                         "points_left": None})
        return rows
    if stages.get("controls"):
        rows.append(priced("controls", study.control_jobs(), folder=CONTROL_FOLDER))
    if stages.get("contexts"):
        rows.append(priced("contexts (the leaders at 4 x SEQ_LEN)",
                           study.context_jobs(study.report(views=False)), folder=CONTEXT_FOLDER))
    if stages.get("edges"):
        walks = study.edge_walks()
        jobs, _ = study.edge_jobs(walks, measure, {})
        open_walks = sum(w["next"] is not None for w in walks)
        rows.append(priced(f"edge walks ({len(walks) - open_walks} of {len(walks)} ended", jobs,
                           f"; {open_walks} open: their next steps)" if open_walks else ")", folder=EDGE_FOLDER))
    if stages.get("held"):
        walks = study.held_walks()
        open_walks = sum(w["next"] is not None for w in walks)
        rows.append(priced(f"held settings walked ({len(walks) - open_walks} of {len(walks)} ended",
                           study.held_jobs(walks), f"; {open_walks} open: their next points)" if open_walks else ")",
                           folder=HELD_FOLDER))
    if stages.get("draws"):
        rows.append(priced("draws (each draw on the other seeds)", study.draw_jobs(study.report(views=False)),
                           folder=DRAW_FOLDER))
    return rows


def left_to_train(plan: dict) -> int | None:
    """How many points the study's command would train now, by the plan; None where a stage is not known yet."""
    counts = [s["points_left"] for s in plan["stages"]]
    return None if None in counts else sum(counts)


def _best_recorded(study, budget: float) -> dict:
    """{family: its cell with the lowest first-seed bits/char recorded at ``budget``}."""
    best: dict = {}
    for c in study.cells():
        score = (study.first_seed_record(c, budget) or {}).get("val_bpc")
        if score is not None and (c.family not in best or score < best[c.family][0]):
            best[c.family] = (score, c)
    return {family: c for family, (_, c) in best.items()}


def _envelope_seeded(study, decided: dict) -> set:
    """{(family, budget)} whose envelope cell (its best first-seed record there) has its extra seeds recorded. A
    family's envelope is its own: where halving's cells are known (``decided``), once that family's cells there all
    hold their first-seed records, whatever other families still train (a study grown by a family keeps the seeds
    its other families recorded); past them, its best recorded cell."""
    done = set()
    for budget in study.budgets:
        live = decided.get(budget)
        done |= {(family, budget) for family, c in _best_recorded(study, budget).items()
                 if not (live and any(x.family == family and study.first_seed_record(x, budget) is None for x in live))
                 and study.finished(study.folder(c, budget, seeds=True), study.extra_seeds())}
    return done


def planned_flops(study, measure) -> dict:
    """The training FLOPs the study's grid and seeds are planned to take (no probe: what its report sets the
    FLOPs it spent against; the stages after the grid come on top)."""
    stages = [s for s in estimate(study, measure, lambda cell: 0.0)["stages"] if not s.get("after_grid")]
    return {"flops": sum(s["flops"] for s in stages), "flops_at_most": sum(s["flops_at_most"] for s in stages)}


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds:.0f} s"


def unprobed(cell) -> float:
    """A plan's seconds a step where nothing is probed (a study with nothing left to train): none."""
    return 0.0


unprobed.besides_training = unprobed


def plan_study(study, measure, hosts: int = 1, check=lambda: None) -> str:
    """PLAN=True's answer for ``study`` on ``hosts`` hosts, its cells measured by ``measure`` (``measure_cells``):
    for a study with records that holds every point its command would train, the points and FLOPs without a probe
    (seconds, not minutes); else each family, size and batch probed here and priced. ``check()`` between the
    pieces of work (a stopped plan ends there: platform.stopping.ended_by_a_signal)."""
    check()
    recorded = recorded_cells(study) or None  # None: a new study
    if recorded:  # nothing left to train (its records say so on any machine): no probe
        counted = estimate(study, measure, unprobed, hosts, recorded)
        if left_to_train(counted) == 0:
            return format_plan(counted, study, probed=False)
    probe = probe_cells(study, measure.data, check)
    try:
        with MachineLoad() as load:  # the probe's times are this host's at this load
            plan = estimate(study, measure, probe, hosts, recorded)
    finally:
        probe.close()
    return format_plan(plan, study, load.report())


def format_plan(plan: dict, study, load: dict | None = None, probed: bool = True) -> str:
    """The plan as a table and its sentences; ``load`` (``MachineLoad.report()`` over the probe): a probe that
    ran beside other work times every step slow, and the plan says so. Not ``probed`` (a study whose records
    hold every point its command would train): points and FLOPs, no device time."""
    left = plan.get("recorded")  # a study with records: what its command still has to train

    def hours(seconds):
        return _hours(seconds) if probed else "–"

    lines = [f"plan for frontier {study.name}: nothing trained, nothing written", "",
             "| stage | points | FLOPs | device time | at most: points | device time |"
             + (" left: points | device time |" if left else ""),
             "| --- | --- | --- | --- | --- | --- |" + (" --- | --- |" if left else "")]
    for s in plan["stages"]:
        cells = [s["points"], f"{s['flops']:.3g}", hours(s["seconds"]), s["points_at_most"],
                 hours(s["seconds_at_most"]), *([s["points_left"], hours(s["seconds_left"])] if left else [])]
        if s["points_left"] is None:  # a stage the records cannot tell yet
            cells = ["?"] * len(cells)
        lines.append(f"| {s['stage']} | " + " | ".join(map(str, cells)) + " |")
    lines += ["", "Columns: points, the stage's runs (a grid budget's cells that halving keeps, or a later stage's "
              "runs), recorded or not; FLOPs, the training FLOPs they spend; device time, their seconds on one "
              "device (one CPU thread, a GPU or a TPU chip), training, evaluating and sampling; at most, the "
              "same if halving keeps every cell within WITHIN of its family's best"
              + ("; left, what the study's records do not hold yet, which is what its command still trains."
                 if left else ".") + " A ? is a stage that its records cannot price yet."]
    if not probed:
        lines += ["", f"Nothing left to train: the study's records hold every point its command would train now "
                  f"({len(study.store.packed()['points'])} points recorded), every stage after the "
                  f"grid included, on any machine. Device time not probed (a probe times every family, size and "
                  f"batch here: minutes); each point's records hold what it took (train_seconds)."]
        return "\n".join(lines)
    lines += ["", f"device time {_hours(plan['device_seconds'])} (at most {_hours(plan['device_seconds_at_most'])}); "
              f"on {plan['slots']} point(s) at once x {plan['hosts']} host(s): about "
              f"{_hours(plan['wall_seconds'])} of wall time (at most {_hours(plan['wall_seconds_at_most'])})"
              + (f"; left to train: {_hours(plan['device_seconds_left'])} of device time, about "
                 f"{_hours(plan['wall_seconds_left'])} of wall time (the points its records do not hold yet)"
                 if left else "") + ". "
              f"Per point {POINT_OVERHEAD_S:g} s besides training, evaluating and sampling; seconds per step "
              f"probed here ({PROBE_STEPS} steps per family, size and batch, on the CPU as many copies at once as "
              f"points run), and each evaluation and sample with the family's model. After the first budget the "
              f"points are the cells halving keeps where the study's records decide them (every cell of the "
              f"budget before holds a first-seed record), at the budget after one still training the share of "
              f"each family's cells that its recorded cells' ranking keeps, else KEEP={study.grid['KEEP']} cells a "
              f"family, or as many "
              f"as the study's records hold there, or the share of its cells the recorded families kept, whichever "
              f"is more; halving also keeps every "
              f"cell within WITHIN={study.grid['WITHIN']:g} of its family's best, which a study without records "
              f"cannot foresee: it may cost more, up to the 'at most' columns. An envelope or lead point not known "
              f"yet is priced as its family's costliest cell. "
              + ("The stages after the grid are the points the study's command would start now, from its records "
                 "(the controls, contexts and edge walks once the grid, its seeds and lead budget are recorded; an "
                 "edge walk's later steps only as it goes)." if left else
                 "Not planned: the references, controls, contexts and edge walks a study's stages add (the "
                 "committed studies' records spent 33-44% of their one-thread training hours on them).")]
    if load and load.get("oversubscribed"):
        lines += ["", f"The probe ran beside other work ({load['runnable_mean']:g} threads wanted the host's "
                  f"{load['cores']} cores on average): its times, and the device time above, are too high; plan "
                  "again with the host otherwise idle."]
    return "\n".join(lines)
