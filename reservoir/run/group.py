"""K points of one shape trained as one folded model (reservoir/run/fold.py), each an ordinary point.

    outcomes = fit_group(name, models, datas, configs, info, runs)   # an Outcome, or the Diverged, a member

The members share a model, its size, batch, context and budget, so a step count; their seeds (so their frozen
draws, initial weights and data order) and their learning rates, weight decays and β2 differ. Each keeps its
own folder (``runs[k]``), checkpoint, evaluations, FLOPs and record, written by its own ``Fit`` as a point
alone writes them; its record's fit says ``folded_with``: how many trained together. A member's checkpoint is
a point's (weights, torch.optim.AdamW state), so a group resumes from its members' checkpoints, one fold per
step they stand at (a kill between two members' saves leaves two), and a member resumes alone as well.

A member that diverges is recorded as diverged and stands still (its rate 0, its moments kept); the others go
on. A member its checkpoint says is finished is evaluated again alone while the others fold. Where a fold
cannot hold the points (the family does not fold, a setting the folded step does not have), each trains
alone, as today, after one line that says why.
"""

from __future__ import annotations

import torch

from reservoir.data.tokens import TokenData, TrainWindows
from reservoir.platform import device as dev
from reservoir.platform import stopping
from reservoir.platform.machine import MachineLoad
from reservoir.platform.messages import say
from reservoir.platform.stopping import Diverged, Stopped
from reservoir.run import flops
from reservoir.run.checkpoint import restore_model
from reservoir.run.evaluation import EvalPoints
from reservoir.run.fold import MemberAdamW, fold, member_losses, why_not_fold, why_not_here, write_back
from reservoir.run.harvest import harvests
from reservoir.run.train import (
    WARMUP_STEPS,
    Clock,
    Fit,
    Outcome,
    Progress,
    WarmUp,
    adam_beta2,
    adamw,
    after_fit,
    cooldown_steps,
    decayed_names,
    learning_rate,
    prepare_fit,
    run_fit,
    sgd_advice,
    tokens_per_step,
    training_batches,
)

# settings every member must share: they shape the step, its count or its schedule, which the fold has once
SHARED_KEYS = ("BATCH_SIZE", "SEQ_LEN", "GRAD_ACCUM", "GRAD_CLIP", "WARMUP_STEPS", "MIN_LR_FRACTION", "LR_SCHEDULE",
               "COOLDOWN_FRACTION", "COOLDOWN_SHAPE", "FLOP_BUDGET", "TOKEN_BUDGET", "MAX_STEPS", "TIME_BUDGET_S",
               "EVAL_POINTS", "EVAL_EVERY", "LOG_EVERY", "CHECKPOINT_EVERY", "CHECKPOINT_EVERY_S", "PRECISION")


def why_not_group(jobs: list[Fit]) -> str | None:
    """Why these fits cannot train as one fold, in a line, or None."""
    first = jobs[0]
    if len(jobs) < 2:
        return "one point is a fold of one"
    if first.model.trainer != "sgd" or harvests(first.model):
        return f"{first.name} is not trained by gradient steps over windows"
    differing = [key for key in SHARED_KEYS if any(job.config.get(key) != first.config.get(key) for job in jobs)]
    differing += ["the model's settings"] * any(job.identity["model_config"] != first.identity["model_config"]
                                                 for job in jobs)
    if differing:
        return f"its members differ in {', '.join(differing)}"
    config, info = first.config, first.info
    if info.world_size > 1 or config["GRAD_ACCUM"] > 1 or config["COMPILE"] or config["GRADIENT_CHECKPOINTING"]:
        return "a fold has one process, one micro-batch a step, and no COMPILE or gradient checkpointing"
    if dev.scales_losses(info):
        return "fp16's loss scaling is one scale for every member"
    models = [job.model for job in jobs]
    return why_not_here(models, dev.scans_recurrences(info.kind)) or why_not_fold(models)


def fit_group(name: str, models: list, datas: list[TokenData], configs: list[dict], info: dev.DeviceInfo,
              runs: list) -> list[Outcome | Diverged]:
    """Each of ``models`` (one family and shape; ``datas[k]``, ``configs[k]``, ``runs[k]``: its text, settings
    and folder) trained under its budget, folded where it can be: the members' outcomes, or the Diverged of a
    member that did."""
    jobs = [prepare_fit(name, m, d, c, info, r) for m, d, c, r in zip(models, datas, configs, runs, strict=True)]
    finished = {k for k, job in enumerate(jobs) if job.saved is not None and job.saved["finished"]}
    outcomes: dict[int, Outcome | Diverged] = {k: _alone(jobs[k]) for k in finished}  # evaluated again, alone
    training = [k for k in range(len(jobs)) if k not in finished]
    reason = why_not_group([jobs[k] for k in training]) if len(training) > 1 else None
    if reason:
        say(f"{name}: {len(training)} points trained one at a time, not folded: {reason}", info.is_main_process)
        outcomes.update({k: _alone(jobs[k]) for k in training})
        return [outcomes[k] for k in range(len(jobs))]
    at = {}  # the step each member resumes from: one fold per step
    for k in training:
        job = jobs[k]
        at.setdefault(job.saved["progress"]["step"] if job.saved else 0, []).append(k)
    for members in at.values():
        if len(members) == 1:
            outcomes[members[0]] = _alone(jobs[members[0]])
            continue
        group = [jobs[k] for k in members]
        for job in group:
            job.run.forget_metrics(name, job.saved["progress"]["step"] if job.saved else -1, job.seed)
        with MachineLoad(torch.get_num_threads()) as load:
            results = _train_folded(group)
        for k, result in zip(members, results, strict=True):
            outcomes[k] = result if isinstance(result, Diverged) else after_fit(jobs[k], result, load.report())
    return [outcomes[k] for k in range(len(jobs))]


def _alone(job: Fit) -> Outcome | Diverged:
    try:
        return run_fit(job)
    except Diverged as error:
        return error


def _train_folded(jobs: list[Fit]) -> list[Outcome | Diverged]:
    """The fold's training loop: _train_sgd's, with a member axis (its checkpoints, evaluations, logs and
    stops are each member's own, at the same steps)."""
    first, members = jobs[0], len(jobs)
    config, info, budget = first.config, first.info, first.budget
    cost = flops.sgd_step(first.model, first.data.tokenizer.vocab_size, config["BATCH_SIZE"], config["SEQ_LEN"], 1)
    per_step = tokens_per_step(config, info)
    progresses = [Progress() for _ in jobs]
    scaler = dev.make_grad_scaler(info)
    for k, job in enumerate(jobs):
        if job.saved is not None:
            restore_model(job.model, job.saved, job.checkpoint_path)
            progresses[k] = Progress(**job.saved["progress"])
            how = f"continuing from the stable phase of {job.branched_from}" if job.branched_from else "resuming"
            say(f"{job.name}: {how} at step {progresses[k].step}, folded with {members - 1} more", job.main)
    for job in jobs:
        job.model.train()
    folded = fold([job.model for job in jobs]).to(info.device)  # folded (and probed) on the host: no graphs
    for job in jobs:
        job.model.to(info.device)
    # each member's state in a point's own form, what its checkpoint holds: built over the moved weights, since
    # on XLA a move makes new Parameters, which an optimizer built over the host's would not know
    points = [adamw(job.model, job.config, adam_beta2(job.config, per_step), dev.optimizer_options(info))
              for job in jobs]
    peaks = torch.tensor([job.config["LEARNING_RATE"] for job in jobs])
    optimizer = MemberAdamW(folded, decayed_names(first.model), peaks.to(info.device),
                            [job.config["WEIGHT_DECAY"] for job in jobs],
                            [adam_beta2(job.config, per_step) for job in jobs])
    for k, job in enumerate(jobs):
        if job.saved is not None:
            points[k].load_state_dict(job.saved["optimizer"])
            optimizer.load_member_state(k, job.model, points[k])
    progress = progresses[0]  # the members step together: one count, one share of the budget
    for p in progresses:
        p.flops = cost.flops(p.step)
    schedule = {"lr_schedule": config["LR_SCHEDULE"], "folded_with": members,
                "branched_at_flops": progress.flops if first.branched_from else 0.0,
                "branched_at_seconds": progress.seconds if first.branched_from else 0.0}
    stable_at = None
    if config["LR_SCHEDULE"] == "wsd":
        stable_at, steps = cooldown_steps(config, budget, cost, per_step)
        schedule.update(cooldown_start_step=stable_at, steps=steps)
    windows = [TrainWindows(job.data.train, config["SEQ_LEN"], job.seed) for job in jobs]
    batches = [training_batches(w, info, job.config, p) for w, job, p in zip(windows, jobs, progresses, strict=True)]
    evaluations = EvalPoints(config, budget.share(progress))
    advice = sgd_advice(config)
    outcomes: list[Outcome | Diverged | None] = [None] * members
    active = torch.ones(members, dtype=torch.bool, device=info.device)
    loss_sum = torch.zeros(members, device=info.device)
    saved_seconds, every_s = progress.seconds, config["CHECKPOINT_EVERY_S"]
    dev.mark_step(info)  # the fold, its moments and these: one graph before the first step, not inside it
    clock = Clock(progress.seconds)
    warm = WarmUp(first.name, progress.step, WARMUP_STEPS, budget, first.main)

    def running() -> list[int]:
        return [k for k in range(members) if outcomes[k] is None]

    def unfold(states: bool) -> None:
        """Every member's weights (and, ``states``, its AdamW state) into its own model and optimizer, as one
        graph for all of them: on XLA one compile for the group, not one a member."""
        write_back(folded, [job.model for job in jobs])
        if states:
            for k in running():
                points[k].load_state_dict(optimizer.member_state(k, jobs[k].model, points[k]))
        dev.mark_step(info)

    def save(stable: bool = False) -> None:
        unfold(states=True)
        for k in running():
            jobs[k].save(progresses[k], False, points[k], scaler, path=jobs[k].stable_path if stable else None)

    while running() and budget.share(progress) < 1:
        if progress.step == stable_at and not first.stable_path.exists():
            with clock.paused():
                save(stable=True)
        share = budget.compute_share(progress) if stable_at is not None else budget.share(progress)
        lr = learning_rate({**config, "LEARNING_RATE": 1.0}, progress.step, share)  # the schedule's share of a peak
        optimizer.lr = (peaks * lr).to(info.device, non_blocking=True)  # a tensor, not a float: no graph a rate
        pairs = [next(b) for b in batches]
        inputs = torch.cat([x for x, _ in pairs]).to(info.device, non_blocking=True)
        targets = torch.cat([y for _, y in pairs]).to(info.device, non_blocking=True)
        with dev.autocast(info):
            losses = member_losses(folded(inputs), targets, members)
        active = active & torch.isfinite(losses)  # on the device: a member's NaN harms no other's step
        torch.where(active, losses, 0.0).sum().backward()
        if config["GRAD_CLIP"]:
            optimizer.clip(config["GRAD_CLIP"])
        optimizer.step(active)
        optimizer.zero_grad()
        loss_sum += losses.detach()
        dev.mark_step(info)  # the step's one graph, its losses' sum in it
        for p in progresses:
            p.step += 1
            p.tokens += per_step
            p.flops = cost.flops(p.step)
        if warm.running:
            dev.synchronize(info)
            clock.set(progress.seconds)
            warm.step_done(progress.step, progress.seconds)
        checkpoint = bool(config["CHECKPOINT_EVERY"]) and progress.step % config["CHECKPOINT_EVERY"] == 0
        log = checkpoint or progress.step % config["LOG_EVERY"] == 0
        if log:
            dev.synchronize(info)
        seconds = clock.seconds()
        stop = stopping.requested() is not None
        checkpoint = checkpoint or stop or bool(every_s and seconds - saved_seconds >= every_s)
        for p in progresses:
            p.seconds = seconds
            p.train_loss_steps += 1
        share = budget.share(progress)
        done = share >= 1
        evaluate = evaluations.due(progress.step, share) and not done
        log = log or checkpoint or evaluate or done
        if log:  # the loop's only host sync
            mean = [total / progress.train_loss_steps for total in loss_sum.tolist()]  # on the host: no graph per count
            loss_sum.zero_()
            for k in running():
                progresses[k].last_train_loss = mean[k]
                job = jobs[k]
                job.run.log_train({"model": job.name, "seed": job.seed, "step": progress.step,
                                   "tokens": progress.tokens, "seconds": round(seconds, 3), "train_loss": mean[k],
                                   "lr": float(peaks[k]) * lr, "tokens_per_second": warm.rate(progress, per_step)})
                try:
                    job.check_finite(progresses[k], "the training loss", mean[k], advice)
                except Diverged as error:
                    outcomes[k] = error
            for p in progresses:
                p.train_loss_steps = 0
        if done or not running():
            break
        with clock.paused():
            if evaluate:
                unfold(states=False)
                for k in running():
                    result = jobs[k].evaluator.periodic(jobs[k].model, info, info.device)
                    try:
                        jobs[k].check_finite(progresses[k], "the validation loss", result["val_loss"], advice)
                        jobs[k].log_eval(progresses[k], result)
                    except Diverged as error:
                        outcomes[k] = error
            if checkpoint:
                save()
                saved_seconds = seconds
            if stop:
                raise Stopped(stopping.requested() or "SIGTERM", first.name,
                              f"{members} folded points of {first.name} saved at step {progress.step}")
    unfold(states=True)
    extra = {**warm.report(progress.step, progress.seconds), **schedule, "bound_by": budget.bound(progress)}
    for k in running():
        try:
            outcomes[k] = jobs[k].finish(progresses[k], info.device,
                                         {**extra, "adam_beta2": adam_beta2(jobs[k].config, per_step)},
                                         points[k], scaler, advice=advice)
        except Diverged as error:
            outcomes[k] = error
    return outcomes
