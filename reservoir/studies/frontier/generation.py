"""GENERATION=<study folder>: what each family's envelope configuration costs to generate with.

A reservoir's state does not grow with the context; a transformer's key-value cache does. For each family's
envelope point at the study's top grid budget this measures, on the model built from the point's recorded
settings (weights do not change the cost, so none are loaded; the quality is the point's record):

- FLOPs per generated character at contexts 128, 1,024 and 8,192, by the training FLOPs' convention (products
  only), counted on one generation step. A model that can carry its state generates from it, at the same cost at
  any context (a window-trained one read that way scores the context table's stream column). The rest generate as
  the project does: from a key-value cache within the SEQ_LEN window they were trained on (past it the cost stops
  growing), and the cache's step, a line in the keys it reads, is also extended to the full context (a context it
  never trained on) to show what the window saves;
- the state or cache one sequence holds, in bytes (fp32), at the same contexts;
- greedy characters per second at batch 1 and batch 64 on one CPU thread, from a half-window prompt, the fastest of
  three passes by the process's CPU time (a timing of this machine, recorded with its processor);
- the crossover: the context from which a carried state generates a character with fewer FLOPs than the
  reference transformer's full cache.

Written to ``<study>/generation-cost.json`` (committed, signed); the study's report shows it, and says where the
envelope has moved since it was measured.
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import torch

from reservoir.models import build_model, with_added_options
from reservoir.platform.machine import processor, usable_cores
from reservoir.run.evaluation import carries_state
from reservoir.run.flops import step_flops
from reservoir.run.records import ResultsError, write_signed_json
from reservoir.run.trained import load_run_plugins
from reservoir.studies.budgets import point_name
from reservoir.studies.curves import figure
from reservoir.studies.frontier.folding import milliseconds
from reservoir.studies.frontier.records import read_measured, read_study_file, study_budgets
from reservoir.studies.probes import state_size
from reservoir.studies.store import PointRecords

GENERATION_FILE = "generation-cost.json"
GENERATION_PLOT = "generation-cost.png"
CONTEXTS = (128, 1024, 8192)  # characters of context a generated character is read on
BATCHES = (1, 64)
BYTES_PER_NUMBER = 4  # fp32, as the studies train and generate on the CPU


def read_generation(study_path: Path) -> dict | None:
    """The study's generation costs, checked; None where they have not been measured."""
    return read_measured(study_path, GENERATION_FILE, "the study's generation costs", "GENERATION")


def top_grid_budget(study: dict) -> float:
    """The grid's largest budget (a lead budget above it holds the leaders alone)."""
    lead = (study.get("stages") or {}).get("lead_budget")
    return max(b for b in study_budgets(study) if b != lead)


def envelope_points(folder: Path, report: dict) -> list[dict]:
    """Each family's envelope point at the top grid budget: its family, cell, bits/char and recorded config."""
    budget = top_grid_budget(read_study_file(folder))
    records = PointRecords(folder)
    points = []
    for family, envelope in report["envelope"].items():
        at = next((p for p in envelope if p["budget"] == budget), None)
        if at is None:
            continue
        point = folder / at["cell"] / point_name(budget)
        recorded = records.config(point)
        load_run_plugins(point, recorded)  # a plugin family is built from its plugin, as the run named it
        points.append({"family": family, "cell": at["cell"], "budget": budget,
                       "bpc": at.get("bpc_mean", at["bpc"]), "params_trained": at["params_trained"],
                       "config": with_added_options(dict(recorded["effective_config"])),
                       "vocab_size": recorded["data"]["vocab_size"]})
    return points


# ------------------------------------------------------------------ measuring


def _tree_bytes(tree) -> int:
    if isinstance(tree, torch.Tensor):
        return tree.numel() * tree.element_size()
    if isinstance(tree, (list, tuple)):
        return sum(_tree_bytes(t) for t in tree)
    return 0


def _prompt(vocab_size: int, batch: int, length: int) -> torch.Tensor:
    return torch.arange(batch * length).view(batch, length) % vocab_size


def _greedy_steps(model, prompt: torch.Tensor, steps: int, carried: bool) -> None:
    if carried:  # the state carried from character to character, at any context
        logits, state = model.forward_stream(prompt, model.initial_state(prompt.shape[0], prompt.device))
        for _ in range(steps):
            logits, state = model.forward_stream(logits[:, -1:].argmax(-1), state)
        return
    ids = prompt  # the model's own generation: a key-value cache within its window, or the window recomputed
    logits, carry = model.begin_generation(ids)
    for _ in range(steps):
        ids = torch.cat([ids, logits.argmax(-1, keepdim=True)], dim=1)
        logits, carry = model.continue_generation(ids, carry)


def _held(model, vocab_size: int, length: int) -> int | None:
    """Bytes a sequence's generation carries after ``length`` characters; None where it carries nothing."""
    with torch.no_grad():
        carry = model.begin_generation(_prompt(vocab_size, 1, length))[1]
    return None if carry is None else _tree_bytes(carry)


def _step_flops(model, vocab_size: int, length: int, carried: bool) -> float:
    """FLOPs of generating one character read on ``length`` characters of context."""
    ids = _prompt(vocab_size, 1, length + 1)
    with torch.no_grad():
        if carried:
            _, state = model.forward_stream(ids[:, :-1], model.initial_state(1, ids.device))
            return step_flops(model, lambda m: m.forward_stream(ids[:, -1:], state))
        _, carry = model.begin_generation(ids[:, :-1])
        return step_flops(model, lambda m: m.continue_generation(ids, carry))


def chars_per_second(model, vocab_size: int, batch: int, window: int, carried: bool, repeats: int = 3,
                     clock=time.process_time) -> float:
    """Greedy characters a second at ``batch`` sequences on one thread, after a half-window prompt: the fastest of
    ``repeats`` passes by the CPU time this process spent (beside a study's lanes the wall's clock moved 2x from
    pass to pass; the CPU time, under 10%)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        half = max(1, window // 2)
        prompt = _prompt(vocab_size, batch, half)
        with torch.no_grad():
            _greedy_steps(model, prompt, 4, carried)  # warm-up
            fastest = min(milliseconds(lambda: _greedy_steps(model, prompt, half, carried), 1, warm=0, clock=clock)
                          for _ in range(repeats))
        return batch * half / fastest * 1e3
    finally:
        torch.set_num_threads(threads)


def measure(point: dict, contexts=CONTEXTS, batches=BATCHES) -> dict:
    """One family's generation costs, on its envelope configuration built with untrained weights. A model that
    can carry its state generates that way (constant cost; a window-trained one read so scores the contexts
    table's stream column); the rest as the project generates: the transformer from its key-value cache within
    its window, a model with neither recomputing its window."""
    config, vocab = point["config"], point["vocab_size"]
    model = build_model(config["MODELS"][0], vocab, config).eval()
    window, carried = int(config["SEQ_LEN"]), carries_state(model)
    flops_at, held_at = {}, {}  # by context length: each counted once (a count copies the model)

    def flops(length: int) -> float:
        if length not in flops_at:
            flops_at[length] = _step_flops(model, vocab, length, carried)
        return flops_at[length]

    def held(length: int) -> int | None:
        if length not in held_at:
            held_at[length] = _held(model, vocab, length)
        return held_at[length]

    if carried:
        how, state = "carried state", _tree_bytes(model.initial_state(1, torch.device("cpu")))
        per_char = {c: flops(window // 2) for c in contexts}
        nbytes = {c: state for c in contexts}
    else:
        how = "key-value cache" if held(2) is not None else "recomputed window"
        per_char = {c: flops(min(c, window) - 1) for c in contexts}
        nbytes = {c: held(min(c, window)) or BYTES_PER_NUMBER * state_size(model, min(c, window))
                  for c in contexts}  # what the cache holds; a recomputing model, the keys and values it would
    row = {key: point[key] for key in ("family", "cell", "bpc", "params_trained")}
    row.update({"how": how, "window": None if carried else window,
                "flops_per_char": {str(c): per_char[c] for c in contexts},
                "bytes": {str(c): nbytes[c] for c in contexts},
                "chars_per_s": {str(n): chars_per_second(model, vocab, n, window, carried) for n in batches}})
    if how == "key-value cache":  # the cost of a step is a line in the keys it reads: extended past the window
        low, high = window // 4, window // 2
        slope = (flops(high) - flops(low)) / (high - low)
        per_position = (held(high) - held(low)) / (high - low)
        first, kept = flops(low) - slope * low, held(low) - per_position * low
        row["full_cache"] = {"step_flops": first, "flops_per_context": slope,
                             "flops_per_char": {str(c): first + slope * c for c in contexts},
                             "bytes": {str(c): kept + per_position * c for c in contexts}}
    return row


def measure_study(folder: Path, report: dict, command: str) -> dict:
    points = envelope_points(folder, report)
    if not points:
        raise ResultsError(f"{folder} has no envelope point at its top grid budget yet: run the study first")
    load = os.getloadavg()[0]  # what else ran beside the timings: they are this machine's, at this load
    rows = [measure(p) for p in points]
    return {"command": command, "budget": points[0]["budget"], "contexts": list(CONTEXTS), "batches": list(BATCHES),
            "machine": {"processor": processor(), "torch": torch.__version__, "threads": 1, "clock": "process",
                        "cores": usable_cores(), "load_average": round(max(load, os.getloadavg()[0]), 1)},
            "reference": report["reference"], "rows": rows}


def measure_export(source) -> dict:
    """An exported model's generation costs (an export's folder or Hub id): its row, as a study's, with its record's
    bits/char; built from its settings, as a study point's is."""
    from reservoir.share import read_export
    from reservoir.share.pretrained import load_export_plugins

    exported = read_export(source)
    load_export_plugins(exported)
    config = with_added_options({**exported.run_config["effective_config"], "MODELS": [exported.model],
                                 "SEED": exported.seed})
    return measure({"family": exported.config["family"], "cell": str(source), "bpc": exported.record["val_bpc"],
                    "params_trained": exported.record["params_trainable"], "config": config,
                    "vocab_size": exported.config["vocab_size"]})


def format_measured(row: dict, contexts=CONTEXTS, batches=BATCHES) -> str:
    """One measured row as lines for a person (a study's rows go into its report instead)."""
    at = [str(c) for c in contexts]
    lines = [f"{row['family']} ({row['cell']}, {row['bpc']:.3f} bits/char): generates from {row['how']}"
             + (f" within its {row['window']}-character window" if row["window"] else ""),
             "FLOPs per character at contexts " + ", ".join(f"{int(c):,}: {_si(row['flops_per_char'][c])}" for c in at),
             "bytes one sequence holds at " + ", ".join(f"{int(c):,}: {_si(row['bytes'][c])}" for c in at),
             "greedy characters/s on one CPU thread at batch " + ", ".join(
                 f"{b}: {row['chars_per_s'][str(b)]:,.0f}" for b in batches)]
    return "\n".join(lines)


def write_generation(folder: Path, content: dict) -> Path:
    write_signed_json(Path(folder) / GENERATION_FILE, content)
    return Path(folder) / GENERATION_FILE


# ------------------------------------------------------------------ reading


def crossover(row: dict, reference: dict) -> int | None:
    """The shortest context from which ``row`` (a carried state: the same cost at any context) generates a
    character with no more FLOPs than ``reference``'s full key-value cache; None for a row whose cost grows too."""
    line = reference.get("full_cache")
    if row["how"] != "carried state" or not line:
        return None
    own = next(iter(row["flops_per_char"].values()))
    if own <= line["step_flops"]:
        return 1
    return math.ceil((own - line["step_flops"]) / line["flops_per_context"])


def _si(value: float) -> str:
    for unit, scale in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{unit}"
    return f"{value:.3g}"


def format_generation(content: dict, report: dict, h: str, image: str) -> list[str]:
    """The generation-cost section of a study's report: ``content`` is its generation-cost.json."""
    rows, contexts = content["rows"], [str(c) for c in content["contexts"]]
    reference = next((r for r in rows if r["family"] == content["reference"]), None)
    window = reference["window"] if reference and reference["window"] else 128
    scored = ((report.get("contexts") or {}).get("rows") or {}).values()
    stream = {r["family"]: r["scores"].get("stream") for r in scored
              if r.get("seq_len") == window}  # the points themselves, not the leaders trained on longer windows
    machine = content["machine"]
    timed = ", the fastest of three passes by its CPU time" if machine.get("clock") == "process" else ""
    lines = ["", f"{h}# What generating costs", "",
             f"Each family's envelope configuration at {content['budget']:.3g} FLOPs, built from its recorded settings "
             "(the cost does not depend on the weights; bits/char are the envelope's, on windows, and the stream "
             "column's the same point read with its state carried, from the context table). FLOPs per generated "
             "character by the training FLOPs' convention (products only), counted on one step; bytes: what one "
             "sequence holds to go on (fp32). A model that can carry its state generates from it, at the same cost "
             "at any context; the transformer keeps its keys and values within its window of "
             f"{window} characters, the context it was trained on (past it the "
             "cost stops growing), and its full cache, a context it never trained on, is the row below it. "
             f"Characters per second: greedy, one CPU thread{timed} ({machine['processor']}, torch {machine['torch']}"
             + (f"; {machine['cores']} cores at a load of {machine['load_average']}" if "cores" in machine else "")
             + "), a "
             "half-window prompt then half a window of steps. Made by", "", f"    {content['command']}", "",
             "| family | generates from | bits/char | stream | " + " | ".join(f"FLOPs/char at {int(c):,}"
                                                                        for c in contexts)
             + " | " + " | ".join(f"bytes at {int(c):,}" for c in contexts)
             + " | chars/s, batch " + " | chars/s, batch ".join(str(b) for b in content["batches"])
             + f" | fewer FLOPs than {content['reference']}'s full cache from |",
             "| --- | --- | --- | --- | " + "--- | " * (2 * len(contexts) + len(content["batches"])) + "--- |"]
    now = {f: p["cell"] for f, points in report["envelope"].items() for p in points if p["budget"] == content["budget"]}
    moved = [f"{r['family']} ({r['cell']}, now {now.get(r['family'])})" for r in rows
             if now.get(r["family"]) != r["cell"]]
    measured = {r["family"] for r in rows}
    unmeasured = sorted(set(now) - measured)  # families the study gained since
    if moved or unmeasured:
        said = ([f"Measured before the envelope moved: {'; '.join(moved)}."] if moved else []) + (
            [f"Not measured: {', '.join(unmeasured)}, families the study gained since."] if unmeasured else [])
        lines[-2:-2] = [" ".join(said) + " Run the command again.", ""]
    for row in sorted(rows, key=lambda r: r["bpc"]):
        rate = " | ".join(f"{row['chars_per_s'][str(b)]:,.0f}" for b in content["batches"])
        where = row["how"] + (f" ({row['window']})" if row["how"] != "carried state" else "")
        cross = crossover(row, reference) if reference else None
        lines.append(f"| {row['family']} | {where} | {row['bpc']:.3f} | "
                     f"{'–' if stream.get(row['family']) is None else format(stream[row['family']], '.3f')} | "
                     + " | ".join(_si(row["flops_per_char"][c]) for c in contexts) + " | "
                     + " | ".join(_si(row["bytes"][c]) for c in contexts) + f" | {rate} | "
                     + ("–" if cross is None else "every context" if cross == 1 else f"{cross:,} characters") + " |")
        if row.get("full_cache"):
            full = row["full_cache"]
            lines.append(f"| {row['family']} | full key-value cache | | | "
                         + " | ".join(_si(full["flops_per_char"][c]) for c in contexts) + " | "
                         + " | ".join(_si(full["bytes"][c]) for c in contexts) + " | " + " | " * len(content["batches"])
                         + " |")
    lines += ["", f"![bits/char against FLOPs per generated character]({image})"]
    return lines


@figure(dpi=110)
def plot_generation(content: dict):
    """Bits/char against FLOPs per generated character, at every context (a carried state: one point)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from reservoir.run.plots import family_colour, nested_marker
    from reservoir.studies.curves import log_axes

    fig, ax = plt.subplots(figsize=(8, 5.5))
    contexts = [str(c) for c in content["contexts"]]
    rows = sorted(content["rows"], key=lambda r: r["family"])
    for k, row in enumerate(rows):
        colour = family_colour(row["family"])
        line = row.get("full_cache") or row
        xs = [line["flops_per_char"][c] for c in contexts]
        ax.plot(xs, [row["bpc"]] * len(xs), "-" if len(set(xs)) > 1 else "", color=colour, label=row["family"],
                **nested_marker(k, len(rows)))
        if len(set(xs)) > 1:
            for x, c in zip(xs, contexts, strict=True):
                ax.annotate(f"{int(c):,}", (x, row["bpc"]), fontsize=6, color=colour, va="bottom")
    log_axes(ax, "FLOPs per generated character (full cache, at contexts 128, 1,024, 8,192)", "validation bits/char",
             legend_size=7)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1))  # beside the points, not over them
    ax.set_title(f"generation cost at {content['budget']:.3g} training FLOPs", fontsize=10)
    return fig
