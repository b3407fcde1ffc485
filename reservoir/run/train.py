"""Training, evaluation and sampling for every model, on every device.

    outcome = fit(name, model, data, config, info, run)    # trains under the budget, evaluates, checkpoints

Each fit is a ``Fit`` (what the trainers share: model, data, config, device, run folder, budget,
the checkpoint it resumes from) handed to its trainer; a ``Clock`` keeps its training time.

Gradient-trained models share one loop (``_train_sgd``); ridge readouts and
n-grams use their one-pass fits. All of them stop at the same budget
(``Budget``): MAX_STEPS, TOKEN_BUDGET, TIME_BUDGET_S, FLOP_BUDGET, whichever comes
first, where one step is one global batch of BATCH_SIZE x GRAD_ACCUM x devices windows.
Every fit reports its training FLOPs (reservoir/run/flops.py), the machine's load while it
trained (reservoir/platform/machine.py) and its epochs over the training data.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from reservoir.config import ConfigError
from reservoir.data.corpus import DataError
from reservoir.data.tokens import TokenData, TrainWindows, eval_windows
from reservoir.models import trainer_of
from reservoir.models.base import LanguageModel
from reservoir.models.settings import model_settings
from reservoir.platform import device as dev
from reservoir.platform import stopping
from reservoir.platform.machine import MachineLoad, process_seconds
from reservoir.platform.messages import OneLineError, progress, say, warn
from reservoir.platform.stopping import Diverged, Stopped
from reservoir.run import flops
from reservoir.run.checkpoint import (
    CheckpointError,
    checkpoint_file,
    checkpoint_identity,
    load_checkpoint,
    restore_model,
    save_checkpoint,
)
from reservoir.run.evaluation import EvalPoints, Evaluations
from reservoir.run.harvest import harvested_batches, harvests
from reservoir.run.records import SPENT, refuse_export, run_seeds
from reservoir.run.sampling import SampleSettings, write_stories
from reservoir.run.writer import Run

CALIBRATION_TOKENS = 16384  # training tail held out from the ridge fit to calibrate its probabilities
WARMUP_STEPS = 2  # steps timed as warm-up (compilation on XLA) and not charged to a time budget
DIVERGED_OVER_UNIFORM = 3  # a loss over this many times uniform guessing's ln V is divergence, not a score


# --------------------------------------------------------------------- budget and schedule


class BudgetError(OneLineError, ValueError):
    """A budget no fit can be trained within: reported as one line."""


@dataclass(frozen=True)
class Budget:
    max_steps: int | None
    max_tokens: int | None
    max_seconds: float | None
    max_flops: float | None = None

    @classmethod
    def from_config(cls, config: dict) -> Budget:
        return cls(config["MAX_STEPS"], config["TOKEN_BUDGET"], config["TIME_BUDGET_S"], config["FLOP_BUDGET"])

    def progress(self, steps: int, tokens: int, seconds: float, flops: float = 0.0) -> float:
        """How much of the budget is spent (0..1+): the largest share of any limit."""
        shares = [done / limit for done, limit in ((steps, self.max_steps), (tokens, self.max_tokens),
                                                   (seconds, self.max_seconds), (flops, self.max_flops)) if limit]
        return max(shares)

    def spent(self, steps: int, tokens: int, seconds: float, flops: float = 0.0) -> bool:
        return self.progress(steps, tokens, seconds, flops) >= 1.0

    def bound(self, progress: Progress) -> str:
        """Which limit ended a fit at ``progress``: the most spent of 'steps', 'tokens', 'seconds' and
        'flops' (a closed-form fit stops one chunk short of its FLOP budget); 'data' when none was
        reached (a closed-form fit's one pass over its training data)."""
        shares = {name: done / limit for name, done, limit in (
            ("steps", progress.step, self.max_steps), ("tokens", progress.tokens, self.max_tokens),
            ("seconds", progress.seconds, self.max_seconds), ("flops", progress.flops, self.max_flops)) if limit}
        name = max(shares, key=shares.get) if shares else None
        return name if name and shares[name] >= SPENT else "data"

    def compute_share(self, progress: Progress) -> float:
        """``progress`` as a share of the step, token and FLOP limits alone: what a wsd schedule follows,
        so its cooldown falls on the same step whatever the machine's speed."""
        return self.progress(progress.step, progress.tokens, 0.0, progress.flops)

    def share(self, progress: Progress, seconds: float | None = None) -> float:
        """``progress`` of a fit as a share of the budget (``seconds``: a clock newer than its own)."""
        return self.progress(progress.step, progress.tokens, progress.seconds if seconds is None else seconds,
                             progress.flops)


WARMUP_SHARE = 0.1  # cosine: the warm-up ends after WARMUP_STEPS or this share of the budget, whichever comes first


def learning_rate(config: dict, step: int, progress: float) -> float:
    """The learning rate of ``step``, ``progress`` (0..1) into the budget, by LR_SCHEDULE.

    'cosine': linear warm-up over WARMUP_STEPS (or the first WARMUP_SHARE of the budget, if that is
    shorter), then cosine decay to MIN_LR_FRACTION over the budget. The decay follows the budget's
    progress, so a model trained for 60 seconds and one trained for 10k steps both end their schedule
    as their budget ends; the warm-up's cap does the same for small budgets.

    'wsd' (warm-up, stable, decay; Hägele et al. 2024, arXiv 2405.18392): linear warm-up over exactly
    WARMUP_STEPS, the peak until the last COOLDOWN_FRACTION of the budget, then a cooldown of
    COOLDOWN_SHAPE to MIN_LR_FRACTION. Until its cooldown a run does not depend on its budget, so one
    stable phase serves every budget: a smaller budget's point branches off it (STABLE_FROM).
    """
    peak, floor = config["LEARNING_RATE"], config["MIN_LR_FRACTION"]
    if config["LR_SCHEDULE"] == "wsd":
        warm = min(1.0, (step + 1) / config["WARMUP_STEPS"]) if config["WARMUP_STEPS"] else 1.0
        cooled = min(1.0, max(0.0, progress - (1 - config["COOLDOWN_FRACTION"])) / config["COOLDOWN_FRACTION"])
        remaining = 1 - math.sqrt(cooled) if config["COOLDOWN_SHAPE"] == "1-sqrt" else 1 - cooled
        return peak * warm * (floor + (1 - floor) * remaining)
    warm = min(1.0, max((step + 1) / config["WARMUP_STEPS"], progress / WARMUP_SHARE)) if config["WARMUP_STEPS"] \
        else 1.0
    cosine = 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))
    return peak * warm * (floor + (1 - floor) * cosine)


def adam_beta2(config: dict, tokens_per_step: int) -> float:
    """ADAM_BETA2, or, with ADAM_BETA2_REF_TOKENS, ADAM_BETA2 ** (tokens per step / reference): the second
    moment then averages over the same number of tokens whatever the batch (a fixed half-life in tokens;
    Marek et al. 2025, arXiv 2507.07101)."""
    reference = config["ADAM_BETA2_REF_TOKENS"]
    return config["ADAM_BETA2"] ** (tokens_per_step / reference) if reference else config["ADAM_BETA2"]


# Settings that shape a gradient fit's trajectory besides the model's own (checkpoint identity): a
# stable phase continued by another run (STABLE_FROM) must have been trained with the same ones, and on
# the same training text (its hash: the data may have moved to another folder or machine since).
TRAJECTORY_KEYS = ("BATCH_SIZE", "LEARNING_RATE", "SEQ_LEN", "GRAD_ACCUM", "GRAD_CLIP", "WEIGHT_DECAY",
                   "WARMUP_STEPS", "MIN_LR_FRACTION", "LR_SCHEDULE", "COOLDOWN_FRACTION", "COOLDOWN_SHAPE",
                   "ADAM_BETA2", "ADAM_BETA2_REF_TOKENS", "PRECISION", "MAX_TRAIN_STORIES", "MAX_TRAIN_CHARS",
                   "SYNTHETIC_STORIES", "VAL_FRACTION")
DATA_PLACES = ("DATASET", "TRAIN_PATH")  # recorded by older stable phases: where, which says nothing of what


def trajectory(config: dict, data: TokenData) -> dict:
    return {**{key: config[key] for key in TRAJECTORY_KEYS}, "train_sha256": (data.text or {}).get("train_sha256")}


def cooldown_steps(config: dict, budget: Budget, cost: flops.FitCost, tokens_per_step: int) -> tuple[int, int]:
    """(the step where a wsd fit's cooldown starts, its last step + 1) under ``budget``: found by the
    same share the training loop computes, so the two agree to the step."""
    def share(step: int) -> float:
        return budget.compute_share(Progress(step=step, tokens=step * tokens_per_step, flops=cost.flops(step)))

    def first(reaching: float) -> int:
        low, high = 0, 1
        while share(high) < reaching:
            high *= 2
        while low < high:
            middle = (low + high) // 2
            low, high = (middle + 1, high) if share(middle) < reaching else (low, middle)
        return low

    return first(1 - config["COOLDOWN_FRACTION"]), first(1.0)


@dataclass
class Progress:
    """Where training of one model stands: what a checkpoint restores besides tensors."""

    step: int = 0
    tokens: int = 0
    seconds: float = 0.0  # training wall-clock, evaluation and checkpoints excluded
    epoch: int = 0
    offset: int = 0  # windows of this epoch already consumed, all processes together
    train_loss_steps: int = 0  # steps since the loss was last fetched (checkpoints fetch it: 0 there)
    last_train_loss: float | None = None
    flops: float = 0.0  # training FLOPs so far (reservoir/run/flops.py says what is counted)


class WarmUp:
    """The first steps of a fit: compilation on XLA (the first step's graph, then the second's with
    optimizer state; a ridge fit's first chunk), caches and autotuning elsewhere. Their wall time is
    timed apart and not charged to a time budget, so a TPU comparison ranks models, not compilers;
    their tokens still count as training."""

    def __init__(self, name: str, step: int, steps: int, budget: Budget, main: bool):
        self.name, self.until, self.budget, self.main = name, step + steps, budget, main
        self.steps = steps
        self.began = time.perf_counter()
        self.wall: float | None = None  # warm-up wall time, once it is over
        self.after: tuple[int, float] | None = None  # (step, training seconds) when it ended

    @property
    def running(self) -> bool:
        return self.wall is None

    def step_done(self, step: int, seconds: float) -> None:
        if self.running and step >= self.until:
            self.wall, self.after = time.perf_counter() - self.began, (step, seconds)
            if self.main and self.budget.max_seconds and self.wall > self.budget.max_seconds:
                warn(f"{self.name}: its warm-up (compilation) took {self.wall:.0f}s, longer than its "
                     f"{self.budget.max_seconds:g}s budget; not charged: the budget counts training after warm-up")

    def rate(self, progress: Progress, tokens_per_step: int) -> float | None:
        """Training tokens/s since the warm-up ended (None while it runs): the warm-up's tokens count as
        training, but its time is held off the clock, so tokens/seconds over the whole fit would inflate."""
        if self.after is None or progress.step <= self.after[0]:
            return None
        return (progress.step - self.after[0]) * tokens_per_step / max(progress.seconds - self.after[1], 1e-9)

    def report(self, step: int, seconds: float) -> dict:
        """compile_seconds (warm-up beyond what its steps would take once settled) and step_seconds."""
        wall = self.wall if self.wall is not None else time.perf_counter() - self.began
        step_seconds = None
        if self.after is not None and step > self.after[0]:
            step_seconds = (seconds - self.after[1]) / (step - self.after[0])
        compile_seconds = max(0.0, wall - self.steps * (step_seconds or 0.0))
        over = bool(self.budget.max_seconds and wall > self.budget.max_seconds)
        return {"compile_seconds": round(compile_seconds, 3), "warmup_seconds": round(wall, 3),
                "step_seconds": None if step_seconds is None else round(step_seconds, 6),
                "compile_over_budget": over}


@dataclass
class Outcome:
    progress: Progress
    final: dict  # val_loss, val_ppl, val_bpc
    extra: dict  # model-specific facts of the fit (ridge samples, n-gram discount)
    load: dict | None = None  # the machine's load while it trained (machine.MachineLoad.report)


# --------------------------------------------------------------------- the entry point


def fit(name: str, model, data: TokenData, config: dict, info: dev.DeviceInfo, run: Run) -> Outcome:
    """Train ``model`` under the budget, evaluating and checkpointing as configured; resumes
    from ``run``'s checkpoint for ``name`` if there is one."""
    return run_fit(prepare_fit(name, model, data, config, info, run))


def run_fit(job: Fit) -> Outcome:
    """A prepared fit (prepare_fit) trained, or, finished in its checkpoint, evaluated again."""
    name, run = job.name, job.run
    trainer = {"sgd": _train_sgd, "ridge": _fit_ridge, "counts": _fit_counts}[job.model.trainer]
    if job.saved is not None and job.saved["finished"]:
        return evaluate_finished(job)
    run.forget_metrics(name, job.saved["progress"]["step"] if job.saved else -1, job.seed)  # past it: redone
    with MachineLoad(torch.get_num_threads()) as load:
        outcome = trainer(job)
    return after_fit(job, outcome, load.report())


def prepare_fit(name: str, model, data: TokenData, config: dict, info: dev.DeviceInfo, run: Run) -> Fit:
    """``model``'s fit, with the checkpoint or stable phase it continues from, if any."""
    config = model_settings(config, name)  # its own rate and batch where the run leaves them to each model
    model.use_time_scan(dev.time_scan(info))  # on XLA: recurrences compile one cell, not SEQ_LEN of them
    job = Fit(name, model, data, config, info, run, Evaluations.for_run(data, config),
              checkpoint_identity(name, config, data.tokenizer, info.replicas), Budget.from_config(config))
    if job.checkpoint_path.exists():
        job.saved = load_checkpoint(job.checkpoint_path, job.identity)
    elif config["STABLE_FROM"] and model.trainer == "sgd":
        job.branched_from = Path(config["STABLE_FROM"])
        job.saved = load_stable_phase(job)
    elif run.resumed:
        say(f"{name}: no checkpoint in {run.path} for seed {job.seed}; training it from step 0", job.main)
    return job


def evaluate_finished(job: Fit) -> Outcome:
    """A fit its checkpoint says is finished: evaluated again (a kill may have come before its record)."""
    name, model, info, run = job.name, job.model, job.info, job.run
    restore_model(model, job.saved, job.checkpoint_path)
    device = dev.compute_device(info, model.host_only)
    model.to(device)
    run.forget_metrics(name, job.saved["progress"]["step"], job.seed)
    say(f"{name}: finished in the checkpoint (seed {job.seed}); evaluating it again", job.main)
    progress = Progress(**job.saved["progress"])
    final = job.evaluator.score_final(model, info, device)
    job.check_finite(progress, "the validation loss", final["val_loss"], "")
    if not run.has_final(name, job.seed):  # killed inside the final evaluation (the checkpoint came first)
        job.log_eval(progress, final, final=True)
    return Outcome(progress, final, {**job.saved.get("extra", {}), **job.evaluator.compile_report()})


def after_fit(job: Fit, outcome: Outcome, load: dict) -> Outcome:
    """A trained fit's outcome with the machine's load and what a reader should know of it."""
    name, data = job.name, job.data
    outcome.load = load
    outcome.extra.update(job.evaluator.compile_report())  # COMPILE=True: how its evaluations ran
    epochs = outcome.progress.tokens / max(1, data.train.size)
    if epochs > 1:
        say(f"{name}: passed over its training data {epochs:.1f} times ({outcome.progress.tokens:,} tokens of "
            f"{data.train.size:,}); more data, not more epochs, is what a longer budget needs", job.main)
    if outcome.load["oversubscribed"]:
        ended = outcome.extra.get("bound_by")
        score = ("and its score, which TIME_BUDGET_S ended: TIME_BUDGET_S=None with FLOP_BUDGET or TOKEN_BUDGET "
                 "compares models whatever the load" if ended == "seconds" else
                 f"not its score, which its {ended or 'compute'} budget ended")
        warn(f"{name}: the machine was oversubscribed while it trained ({outcome.load['runnable_mean']:.1f} "
             f"threads wanted its {outcome.load['cores']} cores on average): that slows its tok/s, {score}")
    return outcome


def stable_checkpoint(run_dir: Path, name: str, seed: int) -> Path:
    """Where a wsd fit keeps its state at the start of its cooldown: what longer budgets branch from."""
    return Path(run_dir) / "checkpoints" / f"{name}-seed{seed}-stable.pt"


def load_stable_phase(job: Fit) -> dict:
    """The stable-phase checkpoint of STABLE_FROM for this fit, checked to be this model, data, seed and
    training settings (only the budget may differ)."""
    path = stable_checkpoint(job.branched_from, job.name, job.seed)
    if not path.exists():
        raise CheckpointError(f"STABLE_FROM={job.branched_from} has no stable phase of {job.name} for seed "
                              f"{job.seed} ({path}; a wsd run writes it when its cooldown starts): name a wsd run "
                              "that reached its cooldown, or drop STABLE_FROM to train from step 0")
    payload = load_checkpoint(path, job.identity)
    here = trajectory(job.config, job.data)
    differ = {k: (v, here[k]) for k, v in payload.get("trajectory", {}).items()
              if k not in DATA_PLACES and here.get(k) != v}
    if "trajectory" not in payload or differ:
        detail = ", ".join(f"{k} {old!r} there, {new!r} here" for k, (old, new) in differ.items()) or \
            "it records no training settings"
        raise CheckpointError(f"STABLE_FROM={job.branched_from} trained {job.name} otherwise ({detail}); "
                              "branch only from a run with the same settings but its budget")
    return payload


def tokens_per_step(config: dict, info: dev.DeviceInfo) -> int:
    return config["BATCH_SIZE"] * config["GRAD_ACCUM"] * info.replicas * config["SEQ_LEN"]


def sgd_advice(config: dict) -> str:
    return f"lower LEARNING_RATE (now {config['LEARNING_RATE']:g}), or keep GRAD_CLIP on"


def _ridge_advice(name: str) -> str:
    block = name.upper()
    return f"lower {block}.input_scaling or {block}.spectral_radius, or raise {block}.ridge"


class Clock:
    """The training wall-clock of one fit. Evaluation and checkpoints run ``paused()``; a warm-up
    (compilation) holds it still by setting it back to where it stood."""

    def __init__(self, seconds: float = 0.0):
        self._zero = time.perf_counter() - seconds

    def seconds(self) -> float:
        return time.perf_counter() - self._zero

    def set(self, seconds: float) -> None:
        self._zero = time.perf_counter() - seconds

    @contextmanager
    def paused(self):
        began = time.perf_counter()
        try:
            yield
        finally:
            self._zero += time.perf_counter() - began


@dataclass
class Fit:
    """One model's fit: what every trainer is given, and what they all do at its end."""

    name: str
    model: LanguageModel
    data: TokenData
    config: dict
    info: dev.DeviceInfo
    run: Run
    evaluator: Evaluations  # periodic, and final (with an interval)
    identity: dict  # what a checkpoint must match (checkpoint.checkpoint_identity)
    budget: Budget
    saved: dict | None = None  # the checkpoint this fit resumes from
    branched_from: Path | None = None  # the run whose stable phase ``saved`` is (STABLE_FROM)

    @property
    def seed(self) -> int:
        return self.config["SEED"]

    @property
    def main(self) -> bool:
        return self.info.is_main_process

    @property
    def checkpoint_path(self) -> Path:
        return self.run.checkpoint_path(self.name, self.seed)

    def check_finite(self, progress: Progress, what: str, value: float | None, advice: str) -> None:
        """The divergence guard: a loss that is not finite, or far above guessing uniformly over the
        vocabulary (DIVERGED_OVER_UNIFORM x ln V nats: no model that learned anything scores that), stops
        this model (before anything is saved from it)."""
        if value is None:
            return
        uniform = math.log(max(2, self.data.tokenizer.vocab_size))
        if not math.isfinite(value):
            reason = f"{what} is {value}"
        elif value > DIVERGED_OVER_UNIFORM * uniform:
            reason = (f"{what} is {value:.4g} nats, over {DIVERGED_OVER_UNIFORM}x the {uniform:.2f} of guessing "
                      "uniformly")
        else:
            return
        raise Diverged(self.name, progress.step, reason, advice, progress.tokens, progress.seconds)

    def log_eval(self, progress: Progress, result: dict, final: bool = False) -> None:
        self.run.log_metrics({"model": self.name, "seed": self.seed, "step": progress.step, "tokens": progress.tokens,
                              "seconds": round(progress.seconds, 3), "flops": progress.flops,
                              "train_loss": progress.last_train_loss, **result, "final": final})

    @property
    def stable_path(self) -> Path:
        return stable_checkpoint(self.run.path, self.name, self.seed)

    def save(self, progress: Progress, finished: bool, optimizer=None, scaler=None, extra: dict | None = None,
             path: Path | None = None) -> None:
        payload = {**self.identity, "finished": finished, "progress": asdict(progress),
                   "model_state": self.model.state_dict(), "rng": dev.rng_state(self.info), "extra": extra or {},
                   "trajectory": trajectory(self.config, self.data)}
        if optimizer is not None:
            payload["optimizer"] = optimizer.state_dict()
            payload["scaler"] = scaler.state_dict()
        save_checkpoint(path or self.checkpoint_path, payload, self.info)

    def finish(self, progress: Progress, device, extra: dict, optimizer=None, scaler=None,
               advice: str = "") -> Outcome:
        """The 'finished' checkpoint, then the final evaluation, shared by every kind of fit: a kill during a
        long final evaluation evaluates the finished model again on RESUME instead of training it again."""
        self.save(progress, True, optimizer, scaler, extra)
        final = self.evaluator.score_final(self.model, self.info, device)
        self.check_finite(progress, "the validation loss", final["val_loss"], advice)
        self.log_eval(progress, final, final=True)
        return Outcome(progress, final, extra)

    def progress_bar(self):
        budget = self.budget
        limits = [f"{v} {u}" for v, u in ((budget.max_flops and f"{budget.max_flops:.3g}", "FLOPs"),
                                          (budget.max_steps, "steps"), (budget.max_tokens, "tokens"),
                                          (budget.max_seconds, "s")) if v]
        return progress(100, f"{self.name} (budget: {', '.join(limits)})", disable=not self.main, unit="%",
                        bar_format="{desc}: {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}{postfix}]", leave=True)


# --------------------------------------------------------------------- gradient training


def decayed_names(model) -> set[str]:
    """The parameters AdamW decays: matrices, not biases, norms or embeddings (nanoGPT's choice); a tied
    weight as its first owner."""
    modules = dict(model.named_modules())
    return {name for name, p in model.named_parameters()
            if p.dim() >= 2 and not isinstance(modules[name.rpartition(".")[0]], torch.nn.Embedding)}


def adamw(model, config: dict, beta2: float, options: dict):
    """AdamW, decaying decayed_names only."""
    decayed = decayed_names(model)
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    groups = [{"params": [p for name, p in named if name in decayed], "weight_decay": config["WEIGHT_DECAY"]},
              {"params": [p for name, p in named if name not in decayed], "weight_decay": 0.0}]
    return torch.optim.AdamW([g for g in groups if g["params"]], lr=config["LEARNING_RATE"], betas=(0.9, beta2),
                             **options)


def _check_one_batch(windows: int, info: dev.DeviceInfo, config: dict) -> None:
    """Refuse a BATCH_SIZE the data cannot fill before anything costly (the FLOP count runs a step)."""
    per_step = config["BATCH_SIZE"] * info.replicas
    if windows < per_step:
        raise DataError(f"the training data holds {windows} windows of SEQ_LEN={config['SEQ_LEN']}, fewer than "
                        f"one batch ({per_step}); lower BATCH_SIZE or SEQ_LEN, or use more data")


def check_batches(config: dict, data: TokenData, info: dev.DeviceInfo) -> None:
    """The same refusal for a whole run, before its folder exists: a model that counts (the n-gram) would
    otherwise train first and leave a folder behind."""
    for name in config["MODELS"]:
        if name != "ngram":
            settings = model_settings(config, name)
            _check_one_batch(max(0, (data.train.size - 1) // config["SEQ_LEN"]), info, settings)
            _check_beta2(name, settings, info)


def check_stable_phases(config: dict, resume_dir: Path | None = None) -> None:
    """With STABLE_FROM, the stable phase of every gradient-trained model and seed that still has to train
    (none of its own checkpoints in ``resume_dir``), before the run's folder exists: one missing would stop
    the run after the models before it, in a folder neither RESUME nor a new run could continue."""
    source = config["STABLE_FROM"]
    if not source:
        return
    refuse_export(source, "STABLE_FROM")
    seeds = run_seeds(config)
    missing = [stable_checkpoint(source, name, seed) for seed in seeds for name in config["MODELS"]
               if trainer_of(name, config) == "sgd"
               and not (resume_dir and checkpoint_file(resume_dir, name, seed, seeds).exists())
               and not stable_checkpoint(source, name, seed).exists()]
    if missing:
        names = ", ".join(p.name for p in missing)
        raise CheckpointError(f"STABLE_FROM={source} has no stable phase for {names} (a wsd run writes one for each "
                              "model and seed when its cooldown starts): name a wsd run of the same MODELS and SEEDS "
                              "that reached its cooldown, or drop STABLE_FROM to train from step 0")


def _check_beta2(name: str, config: dict, info: dev.DeviceInfo) -> None:
    """β2 derived from ADAM_BETA2_REF_TOKENS must be one AdamW takes: a reference far above a step's tokens
    rounds it to 1.0, which torch refuses mid-run, after the folder exists."""
    per_step, reference = tokens_per_step(config, info), config["ADAM_BETA2_REF_TOKENS"]
    beta2 = adam_beta2(config, per_step)
    if reference and not 0.0 <= beta2 < 1.0:
        raise ConfigError(f"ADAM_BETA2_REF_TOKENS={reference:g} gives {name} a β2 of {config['ADAM_BETA2']} ** "
                          f"({per_step} / {reference:g}) = {beta2!r}, which AdamW refuses (it must be below 1): give "
                          f"a reference near the {per_step:,} tokens of one step, or None")


GATHERED_BATCHES = 32  # one CPU process's batches are gathered this many at a time


def training_batches(windows: TrainWindows, info: dev.DeviceInfo, config: dict, progress: Progress):
    """Training batches forever, epoch after epoch, from the data position in ``progress``: through the
    device's DataLoader, or where a loader adds nothing (one CPU process, no workers) gathered directly,
    the same batches without the loader's per-window calls (at the smallest presets 2% of a step)."""
    per_step = config["BATCH_SIZE"] * info.replicas
    direct = not dev.loader_needed(info, config["NUM_WORKERS"])
    while True:
        windows.set_epoch(progress.epoch)
        if direct:  # GATHERED_BATCHES at a time: one gather, then views of it
            for first in range(progress.offset, len(windows) - per_step + 1, per_step * GATHERED_BATCHES):
                count = min(GATHERED_BATCHES, (len(windows) - first) // per_step)
                inputs, targets = windows.batch(first, per_step * count)
                for k in range(count):
                    progress.offset += per_step
                    yield inputs[k * per_step:(k + 1) * per_step], targets[k * per_step:(k + 1) * per_step]
        elif len(windows) - progress.offset >= per_step:
            remaining = torch.utils.data.Subset(windows, range(progress.offset, len(windows)))
            loader = dev.build_loader(remaining, info, config["BATCH_SIZE"] * info.spmd_devices, shuffle=False,
                                      num_workers=config["NUM_WORKERS"], seed=config["SEED"])
            for inputs, targets in loader:
                progress.offset += per_step
                yield inputs, targets
        progress.epoch, progress.offset = progress.epoch + 1, 0


def _train_sgd(job: Fit) -> Outcome:
    model, config, info, budget = job.model, job.config, job.info, job.budget
    windows = TrainWindows(job.data.train, config["SEQ_LEN"], job.seed)
    _check_one_batch(len(windows), info, config)
    cost = flops.sgd_step(model, job.data.tokenizer.vocab_size, config["BATCH_SIZE"], config["SEQ_LEN"],
                          config["GRAD_ACCUM"] * info.replicas)
    model.to(info.device)
    model.train()
    if config["GRADIENT_CHECKPOINTING"]:
        model.use_gradient_checkpointing(dev.checkpoint_function(info))
    trained = dev.wrap_for_training(info, model)

    def loss_of(inputs, targets):  # inputs: ids, or (ids, their harvested features)
        logits = trained(*inputs) if isinstance(inputs, tuple) else trained(inputs)
        return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

    step_loss = dev.CompiledStep(loss_of, info, config["COMPILE"], job.name)  # loss_of itself unless COMPILE
    job.evaluator.calls.follow(step_loss)
    accum, per_step = config["GRAD_ACCUM"], tokens_per_step(config, info)
    beta2 = adam_beta2(config, per_step)
    optimizer = adamw(model, config, beta2, dev.optimizer_options(info))
    scaler = dev.make_grad_scaler(info)
    progress = Progress()
    if job.saved is not None:
        restore_model(model, job.saved, job.checkpoint_path)
        optimizer.load_state_dict(job.saved["optimizer"])
        scaler.load_state_dict(job.saved["scaler"])
        dev.set_rng_state(info, job.saved["rng"])
        progress = Progress(**job.saved["progress"])
        how = f"continuing from the stable phase of {job.branched_from}" if job.branched_from else "resuming"
        say(f"{job.name}: {how} at step {progress.step} ({progress.tokens:,} tokens, {progress.seconds:.0f}s)",
            job.main)
    progress.flops = cost.flops(progress.step)
    if budget.max_flops and cost.per_step > budget.max_flops:
        raise BudgetError(f"FLOP_BUDGET={budget.max_flops:.3g} does not cover one training step of {job.name} "
                          f"({cost.per_step:.3g} FLOPs); raise FLOP_BUDGET")
    schedule = {"lr_schedule": config["LR_SCHEDULE"], "adam_beta2": beta2,  # what a branch inherited, not spent:
                "branched_at_flops": progress.flops if job.branched_from else 0.0,
                "branched_at_seconds": progress.seconds if job.branched_from else 0.0}
    stable_at = None  # wsd: the step where the cooldown starts, and the stable phase is saved for branches
    if config["LR_SCHEDULE"] == "wsd":
        stable_at, steps = cooldown_steps(config, budget, cost, per_step)
        _check_wsd(job, stable_at, steps, progress)
        schedule.update(cooldown_start_step=stable_at, steps=steps)
    points = EvalPoints(config, budget.share(progress))
    saved_step = progress.step if job.saved is not None else None  # the last checkpoint: kept if training diverges
    saved_seconds, every_s = progress.seconds, config["CHECKPOINT_EVERY_S"]
    advice = sgd_advice(config)
    if harvests(model):  # a readout over a stateful reservoir: features computed once a pass, in streams
        batches = harvested_batches(model, job.data.train, (config["BATCH_SIZE"] * info.spmd_devices,
                                                            config["SEQ_LEN"]), job.seed, progress,
                                    (info.rank, info.world_size), materialize=lambda: dev.mark_step(info))
    else:
        batches = training_batches(windows, info, config, progress)
    loss_sum = torch.zeros((), device=info.device)  # stays on the device until the next log
    bar = job.progress_bar()
    bar.update(100 * min(1.0, budget.share(progress)))
    clock = Clock(progress.seconds)
    warm = WarmUp(job.name, progress.step, WARMUP_STEPS, budget, job.main)
    try:
        while budget.share(progress) < 1:
            if progress.step == stable_at and not job.stable_path.exists():  # before the first cooldown step
                with clock.paused():
                    job.save(progress, False, optimizer, scaler, path=job.stable_path)
            share = budget.compute_share(progress) if stable_at is not None else budget.share(progress)
            lr = learning_rate(config, progress.step, share)
            for group in optimizer.param_groups:
                group["lr"] = lr
            for micro in range(accum):
                inputs, targets = next(batches)
                inputs = (tuple(t.to(info.device, non_blocking=True) for t in inputs) if isinstance(inputs, tuple)
                          else inputs.to(info.device, non_blocking=True))  # already there on XLA (MpDeviceLoader)
                targets = targets.to(info.device, non_blocking=True)
                with dev.no_gradient_sync(trained, skip=micro < accum - 1), dev.autocast(info):
                    loss = step_loss(inputs, targets)
                if accum > 1:  # (a division by 1 was two more operations a step, at the smallest presets 1%)
                    loss = loss / accum
                scaler.scale(loss).backward()
                loss_sum += loss.detach()
            dev.optimizer_step(info, optimizer, scaler, config["GRAD_CLIP"])
            dev.zero_grad(info, optimizer)  # here, not before the next batch: on XLA it joins this step's graph
            dev.mark_step(info)
            progress.step += 1
            progress.tokens += per_step
            progress.flops = cost.flops(progress.step)
            if warm.running:  # compiling: the training clock stands still
                dev.synchronize(info)
                clock.set(progress.seconds)
                warm.step_done(progress.step, progress.seconds)
                if not warm.running:
                    step_loss.warmed_up()
            checkpoint = bool(config["CHECKPOINT_EVERY"]) and progress.step % config["CHECKPOINT_EVERY"] == 0
            log = checkpoint or progress.step % config["LOG_EVERY"] == 0
            stop = False
            if log or info.world_size == 1:  # several processes agree on the clock and on stopping at log steps
                if log:  # a logged time and rate count finished work, not work still queued on a GPU
                    dev.synchronize(info)
                progress.seconds = dev.max_across(info, clock.seconds())
                stop = dev.max_across(info, float(stopping.requested() is not None)) > 0
                overdue = every_s and progress.seconds - saved_seconds >= every_s  # a kill loses at most every_s
                checkpoint = checkpoint or stop or bool(overdue)
                log = log or checkpoint
            share = budget.share(progress)  # from values every process holds alike: they agree to evaluate
            done = share >= 1
            if done and not log:  # the fit's final time, after the last queued step has run
                dev.synchronize(info)
                progress.seconds = dev.max_across(info, clock.seconds())
            evaluate = points.due(progress.step, share) and not done  # the end has its own, final evaluation
            log = log or evaluate
            progress.train_loss_steps += 1
            if done or log:  # the loop's only host sync
                progress.last_train_loss = float(loss_sum) / progress.train_loss_steps
                loss_sum.zero_()
                progress.train_loss_steps = 0
                bar.update(100 * min(1.0, share) - bar.n)
                speed = warm.rate(progress, per_step)
                rate = "warming up" if speed is None else f"{speed:,.0f} tok/s"
                bar.set_postfix_str(f"step {progress.step}, loss {progress.last_train_loss:.3f}, {rate}")
                job.run.log_train({"model": job.name, "seed": job.seed, "step": progress.step,
                                   "tokens": progress.tokens, "seconds": round(progress.seconds, 3),
                                   "train_loss": progress.last_train_loss, "lr": lr,
                                   "tokens_per_second": None if speed is None else round(speed, 1)})
                kept = f"checkpoint at step {saved_step} kept" if saved_step is not None else "no checkpoint yet"
                job.check_finite(progress, "the training loss", progress.last_train_loss, f"{kept}; {advice}")
            if done:
                break
            if evaluate or checkpoint:  # the step's queued work is training time, not the pause's
                dev.synchronize(info)
            with clock.paused():  # evaluation and checkpoints are not training time
                if evaluate:
                    result = job.evaluator.periodic(model, info, info.device)
                    job.check_finite(progress, "the validation loss", result["val_loss"], advice)
                    job.log_eval(progress, result)
                if checkpoint:
                    job.save(progress, False, optimizer, scaler)
                    saved_step, saved_seconds = progress.step, progress.seconds
                if stop:
                    raise Stopped(stopping.requested() or "SIGTERM", job.name,
                                  f"{job.name} saved at step {progress.step} ({job.checkpoint_path})")
    finally:
        bar.close()  # also when the model diverges or a signal stops it
    return job.finish(progress, info.device, {**warm.report(progress.step, progress.seconds), **schedule,
                                              **step_loss.report(), "bound_by": budget.bound(progress)},
                      optimizer, scaler, advice=advice)


def _check_wsd(job: Fit, stable_at: int, steps: int, progress: Progress) -> None:
    """A wsd budget must hold its warm-up, a stable phase and one cooldown step; a stable phase taken from
    another run (STABLE_FROM) must end before this budget's cooldown starts."""
    config = job.config
    if steps - stable_at < 1 or stable_at < config["WARMUP_STEPS"]:
        raise BudgetError(f"LR_SCHEDULE='wsd': {job.name}'s budget holds {steps} steps, too few for "
                          f"WARMUP_STEPS={config['WARMUP_STEPS']} and a cooldown of COOLDOWN_FRACTION="
                          f"{config['COOLDOWN_FRACTION']:g} (it would start at step {stable_at}); raise the budget "
                          "or lower WARMUP_STEPS")
    if job.branched_from and progress.step > stable_at:
        raise BudgetError(f"STABLE_FROM={job.branched_from}: its stable phase of {job.name} reached step "
                          f"{progress.step}, past this budget's cooldown start (step {stable_at}); branch from a "
                          "smaller budget's run")


# --------------------------------------------------------------------- closed-form fits


def _token_cap(budget: Budget, config: dict, info: dev.DeviceInfo) -> int | None:
    """The most tokens the step and token budgets allow (None: only time limits the fit)."""
    caps = [c for c in (budget.max_tokens, budget.max_steps and budget.max_steps * tokens_per_step(config, info))
            if c]
    return min(caps) if caps else None


def _training_tokens(data: TokenData, config: dict, cap: int | None) -> tuple[np.ndarray, np.ndarray]:
    """(fit tokens, held-out tail) of the training split; the tail, used to calibrate
    ridge readouts and tune n-gram discounts, is a tenth of the budget at most."""
    n_cal = min(CALIBRATION_TOKENS, data.train.size // 20, cap // 10 if cap else CALIBRATION_TOKENS)
    n_cal = max(n_cal, config["SEQ_LEN"] + 1)  # at least one window to calibrate on
    if data.train.size - n_cal < config["SEQ_LEN"] + 1 or n_cal < 2:
        raise DataError(f"the training data ({data.train.size} tokens) or the budget is too small for a closed-form "
                        f"fit with SEQ_LEN={config['SEQ_LEN']}; use more data or a larger budget")
    return data.train[:-n_cal], data.train[-n_cal:]


def _fit_ridge(job: Fit) -> Outcome:
    """One streaming pass: the training tokens as parallel streams cut into SEQ_LEN chunks,
    the reservoir state carried from chunk to chunk (one step = one chunk of every stream)."""
    name, model, config, info, budget = job.name, job.model, job.config, job.info, job.budget
    fit_ids, cal_ids = _training_tokens(job.data, config, _token_cap(budget, config, info))
    seq, per_process = config["SEQ_LEN"], config["BATCH_SIZE"] * info.spmd_devices
    streams = per_process * info.world_size
    stream_len = (len(fit_ids) - 1) // streams
    chunks = stream_len // seq
    if chunks < 1:
        raise DataError(f"{len(fit_ids)} training tokens cannot fill {streams} streams of SEQ_LEN={seq}; "
                        "lower BATCH_SIZE or SEQ_LEN")
    mine = slice(info.rank * per_process, (info.rank + 1) * per_process)  # each process: its own streams
    layout = np.asarray(fit_ids[: streams * stream_len + 1], dtype=np.int64)
    inputs_all = layout[:-1].reshape(streams, stream_len)[mine]
    targets_all = layout[1:].reshape(streams, stream_len)[mine]
    cal = eval_windows(cal_ids, seq, len(cal_ids))
    calibration = [(cal[i:i + per_process, :-1], cal[i:i + per_process, 1:]) for i in range(0, len(cal), per_process)]
    washout = config[name.upper()].get("washout", 0)
    first_chunk = (torch.from_numpy(inputs_all[:, :seq]), torch.from_numpy(targets_all[:, :seq]))
    try:
        measured = flops.ridge_fit(model, first_chunk, calibration, washout)  # one process's streams
    except FloatingPointError as e:  # the fit itself would fail the same way: say it as the fit would
        raise Diverged(name, 0, str(e), _ridge_advice(name), 0, 0.0) from None
    cost = flops.FitCost(per_step=measured.per_step * info.world_size, fixed=measured.fixed)
    if budget.max_flops and cost.flops(1) > budget.max_flops:
        raise BudgetError(f"FLOP_BUDGET={budget.max_flops:.3g} does not cover one chunk of {name}'s ridge fit "
                          f"({cost.flops(1):.3g} FLOPs with its solve and calibration); raise FLOP_BUDGET")
    affordable = cost.steps_within(budget.max_flops)
    if affordable is not None and affordable < chunks and job.main:  # a closed-form fit sees part of its data
        warn(f"{name}: FLOP_BUDGET={budget.max_flops:.3g} affords {affordable / chunks:.0%} of one pass over its "
             f"training data ({affordable:,} of {chunks:,} chunks; its ridge fit costs "
             f"{cost.per_step / (per_process * seq * info.world_size):,.0f} FLOPs a token); raise FLOP_BUDGET to "
             f"{cost.flops(chunks):.3g} for a whole pass, or make {name} smaller (fewer units)")
    model.to(info.device)
    calibration = [(x.to(info.device), y.to(info.device)) for x, y in calibration]
    progress = Progress(tokens=cal[:, 1:].numel(), flops=cost.flops(0))  # the calibration tail is training too
    bar = job.progress_bar()
    clock = Clock()
    warm = WarmUp(name, 0, 1, budget, job.main)  # the first chunk compiles both graphs on XLA

    bound = {"by": None}  # set when the FLOP budget, not a spent limit or the data's end, stops the pass

    def chunks_in_budget():
        for k in range(chunks):
            if warm.running and k == 1:  # the first chunk is done: its time is warm-up, not training
                clock.set(0.0)
                warm.step_done(1, 0.0)
            if budget.share(progress, clock.seconds()) >= 1:
                break
            if budget.max_flops and cost.flops(progress.step + 1) > budget.max_flops:
                bound["by"] = "flops"
                break  # the next chunk would pass the FLOP budget (the solve is counted in already)
            if dev.max_across(info, float(stopping.requested() is not None)) > 0:
                bar.close()
                raise Stopped(stopping.requested() or "SIGTERM", name,
                              f"no checkpoint of {name} (a ridge pass is not checkpointed half-way; it starts again)")
            cut = slice(k * seq, (k + 1) * seq)
            yield (torch.from_numpy(inputs_all[:, cut]).to(info.device),
                   torch.from_numpy(targets_all[:, cut]).to(info.device))
            progress.step += 1
            progress.tokens += streams * seq
            progress.flops = cost.flops(progress.step)
            share = min(1.0, max(budget.share(progress, clock.seconds()), progress.step / chunks))
            bar.update(100 * share - bar.n)

    reduce = (lambda t: dev.all_reduce_sum(info, t)) if info.world_size > 1 else None
    try:
        extra = model.fit_ridge(chunks_in_budget(), calibration, all_reduce_sum=reduce, washout=washout,
                                carry_state=True, materialize=lambda: dev.mark_step(info))
    except FloatingPointError as e:  # states or readout not finite
        bar.close()
        raise Diverged(name, progress.step, str(e), _ridge_advice(name), progress.tokens, clock.seconds()) from None
    progress.seconds = clock.seconds()
    bar.set_postfix_str(f"{progress.tokens:,} tokens, {progress.tokens / progress.seconds:,.0f} tok/s")
    bar.close()
    timing = {**warm.report(progress.step, progress.seconds), "bound_by": bound["by"] or budget.bound(progress)}
    return job.finish(progress, info.device, {**extra, **timing}, advice=_ridge_advice(name))


def _fit_counts(job: Fit) -> Outcome:
    """N-gram counts on the host over the budget's tokens (the time budget is not needed:
    counting takes seconds)."""
    config, info, budget, data = job.config, job.info, job.budget, job.data
    cost = flops.count_updates(job.model.order)
    caps = [c for c in (_token_cap(budget, config, info), cost.steps_within(budget.max_flops)) if c is not None]
    cap = max(1, min(caps)) if caps else None
    fit_ids, held_ids = _training_tokens(data, config, cap)
    total = min(cap or data.train.size, len(fit_ids) + len(held_ids))
    fit_ids = fit_ids[: total - len(held_ids)]
    clock = Clock()
    extra = job.model.fit_counts(np.asarray(fit_ids), np.asarray(held_ids))
    tokens = len(fit_ids) + len(held_ids)
    progress = Progress(step=math.ceil(total / tokens_per_step(config, info)), tokens=tokens,
                        seconds=clock.seconds(), flops=cost.flops(tokens))
    say(f"{job.name}: counted {progress.tokens:,} tokens in {progress.seconds:.1f}s (discount {extra['discount']})",
        job.main)
    extra["bound_by"] = "data" if cap is None or tokens < cap else budget.bound(progress)
    return job.finish(progress, torch.device("cpu"), extra)


# --------------------------------------------------------------------- samples


def sample_stories(model, data: TokenData, config: dict, info: dev.DeviceInfo) -> list[tuple[str, str]]:
    """One story per prompt, same seed for every model (sample.py reproduces them from the run folder)."""
    settings = SampleSettings(config["SAMPLE_TOKENS"], config["SAMPLE_TEMPERATURE"], config["SAMPLE_TOP_K"],
                              config["SEED"], compiled=bool(config.get("COMPILE")))
    where = dev.sampling_device(info, model.host_only)  # sampling comes last: already saved
    return write_stories(model, data.tokenizer, config["SAMPLE_PROMPTS"], settings, where)


def diverged_record(name: str, model, error: Diverged, config: dict, info: dev.DeviceInfo, data: TokenData) -> dict:
    """The summary line of a model whose training diverged: no score, the step and the reason."""
    progress = Progress(step=error.step, tokens=error.tokens, seconds=error.seconds)
    record = summary_record(name, model, Outcome(progress, {}, {}), config, info, data)
    return {**record, "status": "diverged", "diverged_at_step": error.step, "reason": error.reason,
            "advice": error.advice, "val_loss": None, "val_ppl": None, "val_bpc": None, "tokens_per_second": None}


def _compute_share(config: dict, progress: Progress) -> float | None:
    """The share of its step, token and FLOP budget a fit spent (None where it has none of them): under SPENT with
    ``bound_by`` 'seconds', TIME_BUDGET_S cut it short of the compute its comparison assumes."""
    budget = Budget.from_config(config)
    if not (budget.max_steps or budget.max_tokens or budget.max_flops):
        return None
    return round(budget.compute_share(progress), 4)


def summary_record(name: str, model, outcome: Outcome, config: dict, info: dev.DeviceInfo, data: TokenData) -> dict:
    """One line of the comparison (run.records.SUMMARY_FIELDS and the fit's own facts)."""
    progress = outcome.progress
    return {"model": name, "status": "finished", "trained": model.trained, **model.param_counts(),
            "train_seconds": round(progress.seconds, 3), "train_loss": progress.last_train_loss,
            "train_tokens": progress.tokens, "train_steps": progress.step,
            "tokens_per_second": progress.tokens / max(progress.seconds, 1e-9), **outcome.final,
            "device": info.name, "device_kind": info.kind, "precision": info.precision,
            "world_size": info.world_size, "point_device": info.placed_on, "data_source": data.source,
            "val_unknown_share": data.val_unknown_share, "tokenizer": data.tokenizer.kind,
            "vocab_size": data.tokenizer.vocab_size, "seed": config["SEED"],
            "learning_rate": config["LEARNING_RATE"], "batch_size": config["BATCH_SIZE"],  # this model's (per device)
            **{key: outcome.extra.get(key) for key in ("compile_seconds", "step_seconds", "compile_over_budget",
                                                       "bound_by")},
            "train_flops": progress.flops or None, "flops_per_token": progress.flops / max(1, progress.tokens) or None,
            "budget_spent": _compute_share(config, progress),
            "flops_counted_as": flops.METHODS[model.trainer], "flops_convention": flops.CONVENTION,
            "epochs": round(progress.tokens / max(1, data.train.size), 4), "machine_load": outcome.load,
            "wall_seconds": round(process_seconds(), 1),  # from the process's start to this record: what it cost
            "fit": outcome.extra}
