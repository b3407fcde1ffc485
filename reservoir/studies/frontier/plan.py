"""What a frontier study costs before it runs (PLAN=True): each stage's points and FLOPs, and the device-hours
and wall time they take on this host's devices, from a short measured probe of each family, size and batch,
run as the points will run (on the CPU, as many copies at once as the study runs points, each in its own
process: one-thread points side by side each run slower than one alone where they share caches and memory).

    probe = probe_cells(study)            # seconds per training step of each cell's model, measured here
    plan = estimate(study, measure, probe, hosts)     # per stage: points, FLOPs, device-seconds
    print(format_plan(plan, study, hosts))

Stages after the first budget are estimated with successive halving keeping KEEP cells of each family (the
bound is every runnable cell: both are shown); a point that branches off the budget before pays its
extension and its cooldown; the envelope's extra seeds train from step 0. Each point also pays what is not
training (process start, data, the FLOP count, evaluations, samples): POINT_OVERHEAD_S, from the committed
studies' records (wall time against training time).
"""

from __future__ import annotations

import math
import time
from types import SimpleNamespace

POINT_OVERHEAD_S = 8.0  # seconds a point spends besides training (a 5e11 Transformer++ point: 26 s run, 19 s trained)
PROBE_STEPS = 5  # timed training steps per cell, after two warm-up steps


def step_seconds(name: str, config: dict, data, threads: int, steps: int = PROBE_STEPS, together=None) -> float:
    """Seconds one training step of model ``name`` takes on this host's CPU with ``threads`` threads (a point's
    share) or its first GPU: a few AdamW steps on the study's own data, timed after two warm-up steps (from
    when every copy is ready, where ``together`` is the barrier of copies probing at once)."""
    import torch

    from reservoir.models import build_model
    from reservoir.models.settings import model_settings
    from reservoir.platform import device as dev

    config = model_settings(config, name)
    kind = dev.resolve_kind(config["DEVICE"], config["USE_TPU"])
    where = torch.device("cuda", 0) if kind == "cuda" else torch.device("cpu")
    model = build_model(name, data.tokenizer.vocab_size, config).to(where)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    batch, length = config["BATCH_SIZE"], config["SEQ_LEN"]
    ids = torch.as_tensor(data.train[: batch * (length + 1)].astype("int64")).view(batch, length + 1).to(where)
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        for k in range(2 + steps):
            if k == 2:
                if kind == "cuda":
                    torch.cuda.synchronize()
                if together is not None:
                    together.wait(timeout=600)
                started = time.perf_counter()
            logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), ids[:, 1:].reshape(-1))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
        if kind == "cuda":
            torch.cuda.synchronize()
        return (time.perf_counter() - started) / steps * config["GRAD_ACCUM"]
    finally:
        torch.set_num_threads(before)


_TOGETHER: list = []  # in a probe process: the barrier its copies meet at before timing


def _meet_at(barrier) -> None:
    _TOGETHER[:] = [barrier]


def _probe_copy(name: str, config: dict, data, threads: int) -> tuple[float, int, float, float]:
    """In a probe process: step_seconds, with this process's id and when the copy began and ended."""
    import os

    started = time.time()
    seconds = step_seconds(name, config, data, threads, together=_TOGETHER[0])
    return seconds, os.getpid(), started, time.time()


def probe_cells(study, data):
    """``seconds_per_step(cell)``: ``step_seconds`` of each family, size and batch of the grid, probed once, the
    way the study's points run: on the CPU with several slots, a copy in each of that many processes at once
    (they share the cores' caches and memory bandwidth, as the points will), their mean. What each copy ran is
    kept in ``seconds_per_step.copies[(family, size, batch)]``: (seconds, pid, start, end)."""
    from reservoir.config import parse_overrides

    slots = study.slots()
    threads = int(slots[0].env.get("OMP_NUM_THREADS", "1"))
    together = len(slots) if slots[0].label == "cpu" and len(slots) > 1 else 1
    seen: dict = {}
    pool: list = []

    def seconds_per_step(cell) -> float:
        key = (cell.family, cell.size, cell.batch_size)
        if key not in seen:
            config = parse_overrides([*study.settings, *cell.settings(), f"FLOP_BUDGET={study.budgets[0]!r}"])
            if not pool:
                pool.append(_probe_pool(together) if together > 1 else None)
            if pool[0] is None:
                seen[key] = step_seconds(cell.model, config, data, threads)
                return seen[key]
            tokens = config["BATCH_SIZE"] * (config["SEQ_LEN"] + 1)  # the probe's one batch, and the vocabulary
            copy = SimpleNamespace(train=data.train[:tokens].copy(),
                                   tokenizer=SimpleNamespace(vocab_size=data.tokenizer.vocab_size))
            runs = [pool[0].submit(_probe_copy, cell.model, config, copy, threads) for _ in range(together)]
            seconds_per_step.copies[key] = [run.result() for run in runs]
            seen[key] = sum(c[0] for c in seconds_per_step.copies[key]) / together
        return seen[key]

    seconds_per_step.copies = {}
    seconds_per_step.close = lambda: pool and pool[0] and pool.pop().shutdown()
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


def estimate(study, measure, seconds_per_step, hosts: int = 1) -> dict:
    """Per stage (each grid budget, then the envelope's extra seeds): points, FLOPs and device-seconds, both as
    successive halving is expected to keep them and at most (every runnable cell); ``measure(cell)`` as
    ``FrontierStudy.plan`` takes it, ``seconds_per_step(cell)`` from ``step_seconds``."""
    plan = study.plan(measure)
    cooldown, keep = study.config["COOLDOWN_FRACTION"], study.grid["KEEP"]
    stages, previous = [], None
    for k, budget in enumerate(study.budgets):
        runnable = [c for c in study.cells() if plan[c.name][budget] is None]
        by_family: dict = {}
        for cell in runnable:
            by_family.setdefault(cell.family, []).append(cell)
        kept = [c for cells in by_family.values() for c in (cells if k == 0 else cells[:keep])]

        def cost(cells, budget=budget, previous=previous):
            flops = seconds = 0.0
            for cell in cells:
                per_step = measure(cell)[0]
                steps = math.ceil(budget / per_step)
                paid = steps - (math.floor((1 - cooldown) * math.ceil(previous / per_step)) if previous else 0)
                flops += paid * per_step
                seconds += paid * seconds_per_step(cell) + POINT_OVERHEAD_S
            return flops, seconds

        (flops, seconds), (most_flops, most_seconds) = cost(kept), cost(runnable)
        stages.append({"stage": f"{budget:.3g} FLOPs", "points": len(kept), "flops": flops, "seconds": seconds,
                       "points_at_most": len(runnable), "seconds_at_most": most_seconds, "flops_at_most": most_flops})
        previous = budget
    extra = study.grid["ENVELOPE_SEEDS"] - 1
    if extra > 0:
        flops = seconds = 0.0
        points = 0
        for budget in study.budgets:
            for family in study.grid["FAMILIES"]:  # the envelope cell is not known yet: the family's costliest
                cells = [c for c in study.cells() if c.family == family and plan[c.name][budget] is None]
                if not cells:
                    continue
                cell = max(cells, key=lambda c: math.ceil(budget / measure(c)[0]) * seconds_per_step(c))
                steps = math.ceil(budget / measure(cell)[0])
                flops += extra * steps * measure(cell)[0]
                seconds += steps * extra * seconds_per_step(cell) + POINT_OVERHEAD_S
                points += 1
        stages.append({"stage": f"envelope seeds (+{extra})", "points": points, "flops": flops, "seconds": seconds,
                       "points_at_most": points, "seconds_at_most": seconds, "flops_at_most": flops})
    slots = len(study.slots())
    total = sum(s["seconds"] for s in stages)
    most = sum(s["seconds_at_most"] for s in stages)
    return {"stages": stages, "device_seconds": total, "device_seconds_at_most": most, "slots": slots,
            "hosts": hosts, "wall_seconds": total / (slots * hosts), "wall_seconds_at_most": most / (slots * hosts)}


def planned_flops(study, measure) -> dict:
    """The training FLOPs the study's grid and seeds are planned to take (no probe: what its report sets the
    FLOPs it spent against)."""
    plan = estimate(study, measure, lambda cell: 0.0)
    return {"flops": sum(s["flops"] for s in plan["stages"]),
            "flops_at_most": sum(s["flops_at_most"] for s in plan["stages"])}


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:.2f} h" if seconds >= 360 else f"{seconds:.0f} s"


def format_plan(plan: dict, study) -> str:
    lines = [f"plan for frontier {study.name}: nothing trained, nothing written", "",
             "| stage | points | FLOPs | device time | at most: points | device time |",
             "| --- | --- | --- | --- | --- | --- |"]
    for s in plan["stages"]:
        lines.append(f"| {s['stage']} | {s['points']} | {s['flops']:.3g} | {_hours(s['seconds'])} | "
                     f"{s['points_at_most']} | {_hours(s['seconds_at_most'])} |")
    lines += ["", f"device time {_hours(plan['device_seconds'])} (at most {_hours(plan['device_seconds_at_most'])}); "
              f"on {plan['slots']} point(s) at once x {plan['hosts']} host(s): about "
              f"{_hours(plan['wall_seconds'])} of wall time (at most {_hours(plan['wall_seconds_at_most'])}). "
              f"Per point {POINT_OVERHEAD_S:g} s besides training; seconds per step probed here "
              f"({PROBE_STEPS} steps per family, size and batch, on the CPU as many copies at once as points run)."]
    return "\n".join(lines)
