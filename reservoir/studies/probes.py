"""The probe set: every frontier family trained on multi-query associative recall and selective copying
(data/recall.py) at three sizes, its accuracy set against the state it carries.

    python probes.py                       # every task, family and size; records in results/probes/
    python probes.py TASKS=mqar FAMILIES=lstm,transformer++

State size is what a model must hold to go on reading: for attention, the key-value cache at the task's
length (2 x width a block a position); for a recurrence, the state carried from one token to the next (its
``initial_state``, counted in numbers). Each (task, family, size) is trained at LEARNING_RATES and the best
test accuracy kept, as Zoology keeps the best of its four rates. The loop is written here rather than taken
from run/train.py: a probe scores a few positions of each sequence (a masked loss), on examples drawn fresh
for each run, which the language-model runner has no notion of.
"""

from __future__ import annotations

import json
import math
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

from reservoir.data.recall import PROBE_TASKS, UNSCORED, ProbeTask
from reservoir.platform import stopping
from reservoir.platform.files import atomic_write_text, make_folder
from reservoir.platform.machine import usable_cores
from reservoir.platform.messages import OneLineError
from reservoir.run.evaluation import carries_state
from reservoir.run.records import ResultsError, signed
from reservoir.studies.budgets import positive_numbers
from reservoir.studies.curves import figure

# family -> (model, the options of every size, the options that set each of the three sizes, smallest first)
PROBE_FAMILIES = {
    "transformer++": ("transformer", {"recipe": "++", "n_layer": 2, "n_head": 2},
                      [{"n_embd": 16}, {"n_embd": 32}, {"n_embd": 64}]),
    "transformer": ("transformer", {"recipe": "gpt2", "n_layer": 2, "n_head": 2},
                    [{"n_embd": 16}, {"n_embd": 32}, {"n_embd": 64}]),
    "random_transformer": ("transformer", {"recipe": "++", "n_layer": 2, "n_head": 2, "trained": "embeddings"},
                           [{"n_embd": 16}, {"n_embd": 32}, {"n_embd": 64}]),
    "lstm": ("lstm", {"layers": 2, "embed_dim": 32}, [{"hidden": 16}, {"hidden": 64}, {"hidden": 128}]),
    "frozen_retention": ("frozen_retention", {"layers": 2, "heads": 2},
                         [{"width": 16, "ffn_hidden": 64}, {"width": 32, "ffn_hidden": 128},
                          {"width": 64, "ffn_hidden": 256}]),
    "reservoir_attention": ("reservoir_attention", {"layers": 2, "heads": 2},
                            [{"units": 32, "width": 16}, {"units": 64, "width": 32}, {"units": 128, "width": 64}]),
    "deep_linear_reservoir": ("deep_linear_reservoir", {"layers": 2, "width": 64, "mix_hidden": 128, "embed_dim": 32,
                                                        "dropout": 0.0},
                              [{"units": 16}, {"units": 64}, {"units": 256}]),
    "linear_reservoir": ("linear_reservoir", {"embed_dim": 32, "readout_hidden": 128},
                         [{"units": 32}, {"units": 128}, {"units": 512}]),
}


def _gated(family: str, gate: str) -> tuple[str, dict, list[dict]]:
    """``family`` with a trained gate, at its sizes: 'write' (what enters the frozen state: still a reservoir) or
    'forget' (decays that depend on the content: the control that is not one). Does choosing what to write buy
    recall?"""
    model, options, sizes = PROBE_FAMILIES[family]
    return model, {**options, f"{gate}_gate": True}, sizes


PROBE_FAMILIES.update({"frozen_retention+write": _gated("frozen_retention", "write"),
                       "frozen_retention+forget": _gated("frozen_retention", "forget"),
                       "reservoir_attention+write": _gated("reservoir_attention", "write")})


def probe_families() -> dict[str, tuple[str, dict, list[dict]]]:
    """PROBE_FAMILIES and every family a loaded plugin declares, at its probe sizes (registry.Family)."""
    from reservoir.models.registry import MODELS

    plugins = {name: (name, {}, family.sizes_to_probe()) for name, family in MODELS.items() if family.source}
    return {**PROBE_FAMILIES, **plugins}


LEARNING_RATES = (4e-3, 1e-3)  # every run at the first rate comes before any at the second
STEPS, BATCH, TEST_EXAMPLES = 2000, 32, 1000  # 64,000 fresh sequences a run (Zoology: 100,000 x 64 epochs)


@dataclass(frozen=True)
class ProbeRun:
    task: str
    family: str
    size: int  # index into the family's sizes
    learning_rate: float
    seed: int = 0
    steps: int = STEPS

    @property
    def key(self) -> str:
        return f"{self.task}/{self.family}/{self.size}/lr{self.learning_rate:g}/seed{self.seed}/steps{self.steps}"


def build_probe_model(family: str, size: int, task: ProbeTask, seed: int):
    from reservoir.config import parse_overrides
    from reservoir.models import build_model

    model, common, sizes = probe_families()[family]
    block = model.upper()
    options = {**common, **sizes[size]}
    config = parse_overrides([f"MODELS={model}", f"SEQ_LEN={task.length}", f"SEED={seed}",
                              *(f"{block}.{k}={v!r}" for k, v in options.items())])
    return build_model(model, task.vocab, config)


def _numbers(tree) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel()
    if isinstance(tree, (list, tuple)):
        return sum(_numbers(t) for t in tree)
    return 0


def state_size(model, length: int, declared=None) -> int:
    """Numbers a model holds to read on: what its family declares (``declared(model, length)``), else its carried
    state, or its attention's key-value cache at ``length``."""
    from reservoir.models.baselines import TransformerBlock

    if declared is not None:
        return int(declared(model, length))
    if carries_state(model):
        return _numbers(model.initial_state(1, torch.device("cpu")))
    return sum(2 * block.qkv.in_features * length for block in model.modules() if isinstance(block, TransformerBlock))


def accuracy(model, inputs: np.ndarray, targets: np.ndarray, batch: int = 250) -> float:
    """Share of the scored positions whose most likely token is the target."""
    right = total = 0
    model.eval()
    with torch.no_grad():
        for start in range(0, len(inputs), batch):
            x = torch.from_numpy(inputs[start:start + batch])
            y = torch.from_numpy(targets[start:start + batch])
            scored = y != UNSCORED
            right += int((model(x).argmax(-1)[scored] == y[scored]).sum())
            total += int(scored.sum())
    model.train()
    return right / total


def _declared_state_size(family: str, model, length: int) -> int:
    """state_size with what the family declares, a plugin's failure said in one line."""
    from reservoir.models.registry import MODELS

    declared = MODELS[family].state_size if family in MODELS and MODELS[family].source else None
    try:
        return state_size(model, length, declared)
    except Exception as e:  # noqa: BLE001 - a plugin's own function, whatever it raised
        raise ProbeError(f"plugin {MODELS[family].source}: the state_size of {family!r} failed at length {length} "
                         f"({type(e).__name__}: {e}); it takes (model, length) and returns a number") from None


def train_probe(run: ProbeRun, batch: int = BATCH) -> dict:
    """One model trained on fresh examples of its task (AdamW, warm-up then cosine), scored on held-out ones."""
    task, steps = PROBE_TASKS[run.task], run.steps
    torch.manual_seed(run.seed)
    model = build_probe_model(run.family, run.size, task, run.seed)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=run.learning_rate, betas=(0.9, 0.98), weight_decay=0.0)
    warmup = max(1, steps // 20)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * 0.5 * (
        1 + math.cos(math.pi * min(1.0, s / steps))))
    inputs, targets = task.examples(steps * batch, seed=1000 + run.seed)  # every example seen once
    started = time.perf_counter()
    for step in range(steps):
        x = torch.from_numpy(inputs[step * batch:(step + 1) * batch])
        y = torch.from_numpy(targets[step * batch:(step + 1) * batch])
        loss = F.cross_entropy(model(x).reshape(-1, task.vocab), y.reshape(-1), ignore_index=UNSCORED)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        schedule.step()
    seconds = time.perf_counter() - started
    test_inputs, test_targets = task.examples(TEST_EXAMPLES, seed=2_000_000 + run.seed)  # never trained on
    family = probe_families()[run.family]
    return {"task": run.task, "family": run.family, "size": run.size, "learning_rate": run.learning_rate,
            "seed": run.seed, "model": family[0], "trained": model.trained,
            "options": {**family[1], **family[2][run.size]},
            "state_size": _declared_state_size(run.family, model, task.length),
            "params_trainable": sum(p.numel() for p in params),
            "train_loss": float(loss.detach()), "accuracy": accuracy(model, test_inputs, test_targets),
            "steps": steps, "batch": batch, "train_seconds": seconds}


# --------------------------------------------------------------------- the probe set: runs, records, report

PROBES_FOLDER = "probes"  # RESULTS_DIR/probes/
RECORDS_FILE = "probes.jsonl"  # one signed line a run, committed
PROBE_KEYS = ("TASKS", "FAMILIES", "LEARNING_RATES", "STEPS", "SEEDS", "WORKERS", "RESULTS_DIR", "PLUGINS")


class ProbeError(OneLineError, ValueError):
    """A probe command that cannot run as asked: one line."""


@dataclass
class ProbeSet:
    tasks: list[str]
    families: list[str]
    learning_rates: list[float]
    steps: int
    seeds: list[int]
    workers: int
    folder: Path
    plugins: list[str] = field(default_factory=list)

    @classmethod
    def from_args(cls, own: dict[str, str]) -> ProbeSet:
        from reservoir.config import ConfigError, load_plugins

        unknown = sorted(set(own) - set(PROBE_KEYS))
        if unknown:
            raise ProbeError(f"unknown probe key {unknown[0]} (the keys: {', '.join(PROBE_KEYS)})")
        try:
            plugins = load_plugins(own.get("PLUGINS"))  # their families join FAMILIES
        except ConfigError as e:
            raise ProbeError(str(e)) from None

        def names(key, allowed):
            items = [v.strip() for v in str(own[key]).strip("[]() ").split(",") if v.strip()] if key in own \
                else list(allowed)
            wrong = [v for v in items if v not in allowed]
            if wrong or not items:
                raise ProbeError(f"{key} names {wrong[0] if wrong else 'nothing'!r}: choose from {', '.join(allowed)}")
            return items

        def numbers(key, default, example, integers=False):
            if key not in own:
                return list(default)
            return positive_numbers(key, own[key], example, ProbeError, integers=integers)

        auto = str(own.get("WORKERS", "auto")).strip().lower() == "auto"
        workers = usable_cores() if auto else numbers("WORKERS", [1], "2", integers=True)[0]
        seeds = [s.strip() for s in str(own.get("SEEDS", "0")).strip("[]() ").split(",")]
        if not all(s.isdigit() for s in seeds):
            raise ProbeError(f"SEEDS must be non-negative integers, got {own.get('SEEDS')!r}; e.g. SEEDS=0,1")
        seeds = [int(s) for s in seeds]
        families = names("FAMILIES", probe_families()) if "FAMILIES" in own else list(PROBE_FAMILIES)
        return cls(names("TASKS", PROBE_TASKS), families,
                   numbers("LEARNING_RATES", LEARNING_RATES, "1e-3,4e-3"),
                   numbers("STEPS", [STEPS], "2000", integers=True)[0], seeds, workers,
                   Path(own.get("RESULTS_DIR", "results")) / PROBES_FOLDER, plugins)

    def runs(self) -> list[ProbeRun]:
        sizes = {family: len(declared[2]) for family, declared in probe_families().items()}
        return [ProbeRun(t, f, s, lr, seed, self.steps) for lr in self.learning_rates for seed in self.seeds
                for t in self.tasks for f in self.families for s in range(sizes[f])]


def read_records(folder: Path) -> dict[str, dict]:
    """{run key: record} from probes.jsonl, each line checked against its integrity hash."""
    file = Path(folder) / RECORDS_FILE
    records = {}
    if not file.exists():
        return records
    for n, line in enumerate(file.read_text(encoding="utf-8").splitlines(), start=1):
        try:
            record = json.loads(line)
            trusted = isinstance(record, dict) and signed(record) == record
        except json.JSONDecodeError:
            trusted = False
        if not trusted:
            raise ResultsError(f"{file} line {n} is not a probe record as probes.py wrote it (edited or damaged): "
                               f"restore the file (git checkout -- {file}), or delete that line to train it again")
        records[ProbeRun(record["task"], record["family"], record["size"], record["learning_rate"],
                         record["seed"], record["steps"]).key] = record
    return records


def append_record(folder: Path, record: dict) -> None:
    """probes.jsonl with ``record`` added, written whole and atomically (a stop never leaves half a line)."""
    file = Path(folder) / RECORDS_FILE
    before = file.read_text(encoding="utf-8") if file.exists() else ""
    atomic_write_text(file, before + json.dumps(signed(record), allow_nan=False) + "\n")


def _train_one(run: ProbeRun) -> dict:
    torch.set_num_threads(1)
    return train_probe(run)


def _start_worker(plugins: list[str]) -> None:
    from reservoir.config import load_plugins

    load_plugins(plugins)  # a worker started anew (not forked) knows their families too
    _leave_stopping_to_the_set()


def _leave_stopping_to_the_set() -> None:
    """A worker ignores Ctrl-C (the terminal sends it to every process: the probe set stops its workers) and
    ends on SIGTERM (a forked worker would otherwise keep the set's handler, which only sets a flag)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


def _stop_workers(pool) -> None:
    """End the pool's worker processes now: a run in progress is lost (a probe run is a minute or two) and trains
    again with the same command. ProcessPoolExecutor says how only from Python 3.14 (terminate_workers); before
    it, its _processes are the workers."""
    if hasattr(pool, "terminate_workers"):
        pool.terminate_workers()
        return
    for process in list(getattr(pool, "_processes", {}).values()):
        process.terminate()
    for process in list(getattr(pool, "_processes", {}).values()):
        process.join(timeout=10)


def run_probe_set(probes: ProbeSet, say) -> dict[str, dict]:
    """Every run of ``probes`` not yet recorded, WORKERS at once (a process each, one thread), each recorded as it
    finishes; the same command continues a stopped set. SIGTERM or Ctrl-C stops every worker (none is left
    running) and raises stopping.Stopped, which says what was kept."""
    make_folder(probes.folder)
    records = read_records(probes.folder)
    todo = [r for r in probes.runs() if r.key not in records]
    say(f"probes: {len(probes.runs()) - len(todo)} runs recorded, {len(todo)} to train, {probes.workers} at once")
    with stopping.installed(announce=False):
        _train_all(probes, todo, records, say)
    return records


def _train_all(probes: ProbeSet, todo: list[ProbeRun], records: dict[str, dict], say) -> None:
    from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait

    pool = ProcessPoolExecutor(max_workers=probes.workers, initializer=_start_worker, initargs=(probes.plugins,))
    futures = {pool.submit(_train_one, run): run for run in todo}
    pending = set(futures)
    try:
        while pending:
            done, pending = wait(pending, timeout=0.2, return_when=FIRST_COMPLETED)
            for future in done:
                record = future.result()
                append_record(probes.folder, record)
                records[futures[future].key] = record
                say(f"probes: {record['task']} {record['family']} size {record['size']} (state "
                    f"{record['state_size']:,}) lr {record['learning_rate']:g}: accuracy {record['accuracy']:.3f} in "
                    f"{record['train_seconds']:.0f} s")
            if stopping.requested() and pending:
                raise stopping.Stopped(stopping.requested(), None,
                                       f"{len(records)} probe runs are recorded in {probes.folder / RECORDS_FILE}; "
                                       f"the {len(pending)} not finished were stopped and train when the same command "
                                       "runs again")
    finally:
        if pending:
            _stop_workers(pool)
        pool.shutdown(wait=True, cancel_futures=True)


def best_per_size(records: dict[str, dict]) -> list[dict]:
    """Per task, family and size: the best accuracy over the learning rates (mean over seeds at each rate)."""
    groups: dict[tuple, dict[float, list[dict]]] = {}
    for r in records.values():
        groups.setdefault((r["task"], r["family"], r["size"]), {}).setdefault(r["learning_rate"], []).append(r)
    rows = []
    for (task, family, size), by_rate in sorted(groups.items()):
        rate, runs = max(by_rate.items(), key=lambda kv: np.mean([r["accuracy"] for r in kv[1]]))
        rows.append({"task": task, "family": family, "size": size, "state_size": runs[0]["state_size"],
                     "params_trainable": runs[0]["params_trainable"], "learning_rate": rate,
                     "accuracy": float(np.mean([r["accuracy"] for r in runs])), "seeds": len(runs),
                     "train_seconds": sum(r["train_seconds"] for rs in by_rate.values() for r in rs)})
    return rows


def _reported(rows: list[dict]) -> list[str]:
    """The built-in probe families, then any other the records hold (a plugin's: reported without loading it)."""
    return [*PROBE_FAMILIES, *dict.fromkeys(r["family"] for r in rows if r["family"] not in PROBE_FAMILIES)]


def format_probes(records: dict[str, dict], level: int = 1, image: str = "probes/probes.png") -> str:
    """The probe section of REPORT.md: accuracy against state size, per task and family."""
    h = "#" * level
    rows = best_per_size(records)
    if not rows:
        return ""
    tasks = [t for t in PROBE_TASKS if any(r["task"] == t for r in rows)]
    hours = sum(r["train_seconds"] for r in records.values()) / 3600
    rates = ", ".join(f"{rate:g}" for rate in sorted({r["learning_rate"] for r in records.values()}))
    steps = ", ".join(f"{n:,}" for n in sorted({r["steps"] for r in records.values()}))
    lines = [f"{h} Probes: recall and copying against state size", "",
             "Made by `python probes.py` (results/probes/probes.jsonl; reservoir/data/recall.py says how each task "
             "relates to Zoology's and MAD's). Test accuracy on 1,000 held-out sequences after "
             f"{steps} steps of 32 fresh ones, "
             + (f"the best of the learning rates {rates} per size" if "," in rates else f"at learning rate {rates}")
             + "; state: "
             "the numbers a model holds to read on (attention: its key-value cache at the task's length; a "
             f"recurrence: its carried state). {len(records)} runs, {hours:.2f} training hours on one thread each.",
             "", f"![accuracy against state size]({image})", ""]
    for task in tasks:
        spec = PROBE_TASKS[task]
        lines += [f"{h}# {task} (length {spec.length}, vocabulary {spec.vocab}, {spec.items} "
                  f"{'key-value pairs' if task == 'mqar' else 'tokens to copy'}; chance about "
                  f"{chance(task):.3f})", "",
                  "| family | " + " | ".join(f"size {k}: accuracy (state, rate)" for k in range(3)) + " |",
                  "| --- | --- | --- | --- |"]
        for family in _reported(rows):
            cells = {r["size"]: r for r in rows if r["task"] == task and r["family"] == family}
            if cells:
                lines.append(f"| {family} | " + " | ".join(
                    f"{cells[k]['accuracy']:.3f} ({cells[k]['state_size']:,}, {cells[k]['learning_rate']:g})"
                    if k in cells else "–" for k in range(3)) + " |")
        lines.append("")
    return "\n".join(lines)


def chance(task: str) -> float:
    """The accuracy of a uniform guess among the answers a task's sequences can hold (MQAR: its values, half the
    vocabulary; copying: every token but the two markers)."""
    spec = PROBE_TASKS[task]
    return 1 / (spec.vocab // 2 if task == "mqar" else spec.vocab - 2)


@figure(dpi=110)
def plot_probes(records: dict[str, dict]):
    """Accuracy against state size, one panel per task, one line per family."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from reservoir.run.plots import family_colour, nested_marker

    rows = best_per_size(records)
    tasks = [t for t in PROBE_TASKS if any(r["task"] == t for r in rows)]
    families = _reported(rows)
    fig, axes = plt.subplots(1, len(tasks) + 1, figsize=(6.5 * len(tasks) + 2.6, 4.8), squeeze=False,
                             gridspec_kw={"width_ratios": [1] * len(tasks) + [0.4]})  # the last: the legend
    for ax, task in zip(axes[0], tasks, strict=False):
        for k, family in enumerate(families):
            points = sorted((r["state_size"], r["accuracy"]) for r in rows
                            if r["task"] == task and r["family"] == family)
            if points:
                ax.plot(*zip(*points, strict=True), label=family, color=family_colour(family),
                        linestyle="--" if family == "random_transformer" else "-", **nested_marker(k, len(families)))
        ax.axhline(chance(task), color="dimgrey", linestyle=":", linewidth=1, zorder=0)
        ax.annotate(f"chance {chance(task):.3f}", (0.01, chance(task)), xycoords=("axes fraction", "data"),
                    xytext=(0, 3), textcoords="offset points", fontsize=7, color="dimgrey")
        ax.set(xscale="log", xlabel="state size (numbers held to read on)", ylabel="test accuracy", title=task,
               ylim=(0, 1.02))
        ax.grid(alpha=0.3)
    shown = {label: handle for ax in axes[0][:-1] for handle, label in zip(*ax.get_legend_handles_labels(),
                                                                              strict=True)}
    axes[0][-1].set_axis_off()
    axes[0][-1].legend(shown.values(), shown.keys(), fontsize=8, loc="center left", frameon=False)
    return fig


def write_probe_report(records: dict[str, dict], folder: Path) -> list[Path]:
    """probes.md and probes.png beside the records."""
    if not records:
        return []
    atomic_write_text(Path(folder) / "probes.md", format_probes(records, image="probes.png") + "\n")
    return [Path(folder) / "probes.md", plot_probes(records, Path(folder) / "probes.png")]
