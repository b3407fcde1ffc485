"""What a reader sees of the studies: tables and plots written from the committed records alone.

    python scaling.py REPORT=results/frontier-tinystories   # one study: frontier.json, frontier.md, frontier.png
    python scaling.py REPORT=results                        # every study under results/: REPORT.md (and each's)

    paths = write_from_records(Path("results"))   # one study folder, or a folder of studies

A study's section says what made it (the command, rebuilt from its study file), whether the goal is met
(the best reservoir family within GOAL of "the transformer" at every budget), the envelope table with
its seeds, the plot, the compute multipliers, N_opt, train against validation at repeated epochs, the
paired comparison at the top budget with its diagnostics, and the reference lines (n-grams, the ESN).
``headline`` is the short table the README quotes (tests/test_frontier_study.py checks the quote).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import numpy as np

from reservoir.models.registry import FROZEN_TRANSITION, MODELS, RESERVOIR, class_of
from reservoir.platform.files import atomic_write_text, repository_path
from reservoir.run.records import write_json_atomic
from reservoir.studies.curves import curve, figure
from reservoir.studies.frontier.analysis import (
    BOUNDS,
    ESN_KNOBS,
    best_reservoirs,
    esn_families,
    report_from_records,
)
from reservoir.studies.frontier.generation import GENERATION_PLOT, format_generation, plot_generation
from reservoir.studies.frontier.grid import (
    PRESETS,
    RESERVOIR_FAMILIES,
    FrontierError,
    of_class,
    study_command,
)
from reservoir.studies.frontier.records import STUDY_FILE, note_records
from reservoir.studies.frontier.timing import NOT_RECORDED
from reservoir.studies.probes import PROBES_FOLDER, format_probes, read_records, write_probe_report
from reservoir.studies.store import PointRecords

GOAL = 0.05  # the goal the study measures: the best reservoir envelope within 5% of the transformer's
REPEATED = 2.0  # epochs from which train against validation is a claim's caveat (Muennighoff et al. 2023)
REPORT_FILE = "REPORT.md"
TIME_PLOT = "frontier-time.png"
# published numbers on a corpus's standard split, by its split sizes in characters (the corpora's own READMEs):
# (what, validation nats per character)
PUBLISHED = {
    (1_003_854, 111_540): [  # Tiny Shakespeare, nanoGPT's shakespeare_char split (first 90% trains)
        ("nanoGPT baby GPT (6 x 384, 10.7M parameters, block 256, GPU)", 1.4697),
        ("nanoGPT's CPU settings (4 x 128, block 64, 2,000 iterations)", 1.88),
        ("Köster & Uchida 2025, transformer (arXiv 2507.15779)", 1.67),
        ("Köster & Uchida 2025, reservoir LM", 2.01),
    ],
}


def study_folders(folder: Path) -> list[Path]:
    """``folder`` itself if it is a study, else the studies directly under it (sorted)."""
    folder = Path(folder)
    if (folder / STUDY_FILE).exists():
        return [folder]
    if not folder.is_dir():
        raise FrontierError(f"{folder} {'is a file, not a folder' if folder.exists() else 'does not exist'}: "
                            "REPORT=<a study folder, or a folder of studies such as results>")
    found = sorted(p.parent for p in folder.glob(f"*/{STUDY_FILE}"))
    if not found:
        raise FrontierError(f"{folder} holds no frontier study (no {STUDY_FILE} in it or in its sub-folders): "
                            "REPORT=results/<study>, or run a study first (python scaling.py FRONTIER=True ...)")
    return found


def write_from_records(folder: Path) -> list[Path]:
    """A study's frontier.json/.md/.png; for a folder of studies also ``REPORT.md`` over all of them. Every
    study is read (and refused in one line if damaged) before anything is written."""
    folder = Path(folder)
    paths = study_folders(folder)
    for path in paths:  # the point folders here into each study's points.jsonl, the records it commits
        records = PointRecords(path)
        if records.pack() is not None:
            note_records(path, records)  # the study file names the records file (an older one is refused)
    studies = [(path, report_from_records(path)) for path in paths]
    probes = read_records(folder / PROBES_FOLDER) if studies[0][0] != folder else {}
    written = []
    for path, report in studies:
        written += write_study(report, path)
    if studies[0][0] != folder:
        written += write_probe_report(probes, folder / PROBES_FOLDER)
        atomic_write_text(folder / REPORT_FILE, format_report(studies, folder, probes))
        written.append(folder / REPORT_FILE)
    return written


def write_study(report: dict, folder: Path) -> list[Path]:
    folder = Path(folder)
    write_json_atomic(folder / "frontier.json", report, indent=None)  # indented, a grown study passed 2 MB
    atomic_write_text(folder / "frontier.md", format_study(report, "frontier.png", level=1))
    written = [folder / "frontier.json", folder / "frontier.md", plot_frontier(report, folder / "frontier.png"),
               plot_isoflop(report, folder / "frontier-isoflop.png"),
               plot_lr_sensitivity(report, folder / "frontier-lr.png")]
    if report.get("generation"):
        written.append(plot_generation(report["generation"], folder / GENERATION_PLOT))
    if report.get("by_time"):
        written.append(plot_time({"study": report["study"], "corpus": report["corpus"], **report["by_time"]},
                                 folder / TIME_PLOT))
    return written


# --------------------------------------------------------------------- tables


def _fmt(value, spec=".3f") -> str:
    return "–" if value is None else format(value, spec)


def _bpc(point: dict) -> str:
    sd = f" ± {point['bpc_sd']:.3f}" if point.get("bpc_sd") else ""
    return f"{point['bpc_mean']:.3f}{sd}"


def _by_budget(report: dict) -> dict:
    return {f: {p["budget"]: p for p in points} for f, points in report["envelope"].items()}


GOAL_CLASSES = {RESERVOIR: "best reservoir", FROZEN_TRANSITION: "best frozen-transition network"}


def goal_rows(report: dict) -> list[dict]:
    """Per budget: "the transformer", the best reservoir family of either class, the gap (reservoir /
    transformer - 1), and ``classes``: each class's best family there, its point, gap and whether it met the
    goal (None where none of the class ran)."""
    envelope, reference = report["envelope"], report["reference"]
    by_class = {kind: {budget: {"family": family, "best": best, "gap": best["bpc_mean"] / ref["bpc_mean"] - 1}
                       for budget, family, best, ref in best_reservoirs(envelope, reference, of_class(kind))}
                for kind in GOAL_CLASSES}
    for rows in by_class.values():
        for row in rows.values():
            row["met"] = row["gap"] <= GOAL
    goal = []
    for budget, family, best, ref in best_reservoirs(envelope, reference):
        gap = best["bpc_mean"] / ref["bpc_mean"] - 1
        goal.append({"budget": budget, "reference": ref, "family": family, "best": best, "gap": gap,
                     "met": gap <= GOAL, "classes": {kind: by_class[kind].get(budget) for kind in GOAL_CLASSES}})
    return goal


def _goal_table(goal: list[dict], reference: str, h: str, lead_budget) -> list[str]:
    head = " | ".join(f"{name} | gap" for name in GOAL_CLASSES.values())
    lines = [f"{h}# The goal: the best reservoir family within {GOAL:.0%} of the transformer", "",
             "Each class at its best: a reservoir trains a readout over fixed, randomly drawn features; a "
             "frozen-transition network trains every projection and layer around a recurrence whose transition is "
             "left as drawn (the class each family declares: README, \"The families\").", "",
             f"| budget | the transformer ({reference}) | {head} | within {GOAL:.0%} |",
             "| --- | --- |" + " --- | --- |" * len(GOAL_CLASSES) + " --- |"]
    for g in goal:
        cells = []
        for kind in GOAL_CLASSES:
            c = g["classes"][kind]
            cells += ["–", "–"] if c is None else [f"{c['family']}: {_bpc(c['best'])}", f"{c['gap']:+.1%}"]
        within = [kind for kind, c in g["classes"].items() if c is not None and c["met"]]
        lines.append(f"| {g['budget']:.3g} | {_bpc(g['reference'])} | " + " | ".join(cells) +
                     f" | {' and '.join(within) if within else 'no'} |")
    met = sum(g["met"] for g in goal)
    counts = (f"by a reservoir at {_met_by(goal, RESERVOIR)}, by a frozen-transition network at "
              f"{_met_by(goal, FROZEN_TRANSITION)}")
    return lines + ["", f"Met at {met} of {len(goal)} budgets by the best of either class ({counts}; bits/char, "
                    "mean ± sd over seeds)." + (" A budget above the grid's carries only the leaders' top-budget "
                                                "configurations." if lead_budget else ""), ""]


def _met_by(goal: list[dict], kind: str) -> int:
    return sum(1 for g in goal if g["classes"][kind] is not None and g["classes"][kind]["met"])


def table_budget(report: dict) -> float | None:
    """The budget the headline table and figure read every family at: the largest every family reached."""
    by = _by_budget(report)
    families = [f for f in report["families"] if by.get(f)]
    shared = [b for b in report["budgets"] if families and all(b in by[f] for f in families)]
    return shared[-1] if shared else None


def best_references(report: dict) -> list[dict]:
    """The best-scoring run of each reference model (the n-gram orders, the ESN sizes), best first."""
    best: dict[str, dict] = {}
    for r in report.get("references") or []:
        if r["val_bpc"] is not None and (r["model"] not in best or r["val_bpc"] < best[r["model"]]["val_bpc"]):
            best[r["model"]] = r
    return sorted(best.values(), key=lambda r: r["val_bpc"])


RECIPES = {"transformer": "GPT-2 recipe", "transformer++": "Transformer++ recipe"}


def headline(report: dict) -> str:
    """The README's table: each family (the reference transformer as "the transformer") at the top budget every
    family reached, with seeds, the gap to the transformer, the compute multiplier and N_opt; then each reference
    model's best run (trained once, at its own FLOPs), as the headline figure draws them."""
    by, reference, top = _by_budget(report), report["reference"], table_budget(report)
    if top is None or reference is None:
        return "(no budget that every family reached yet)"
    families = [f for f in report["families"] if by.get(f)]
    multipliers = {f: {r["budget"]: r for r in rows} for f, rows in report["compute_multiplier"].items()}
    lines = [f"| family (at {top:.3g} FLOPs) | class | bits/char (seeds) | vs {reference} | compute multiplier | "
             "N_opt |", "| --- | --- | --- | --- | --- | --- |"]
    for f in sorted(families, key=lambda f: by[f][top]["bpc_mean"]):
        p, m = by[f][top], multipliers.get(f, {}).get(top)
        mult = _multiplier(m)
        name = f"{f} (the transformer)" if f == reference else f"{f} ({RECIPES[f]})" if f in RECIPES else f
        gap = p["bpc_mean"] / by[reference][top]["bpc_mean"] - 1
        lines.append(f"| {name} | {_class(f)} | {_bpc(p)} ({len(p['seeds'])}) | {gap:+.1%} | {mult} | "
                     f"{p['params_trained']:,} ({p['size']}) |")
    for r in best_references(report):
        gap = r["val_bpc"] / by[reference][top]["bpc_mean"] - 1
        lines.append(f"| {r['model']} ({r['name']}: a reference, one pass of {r['train_flops']:.2g} FLOPs) | "
                     f"{_class(r['model'])} | "
                     f"{r['val_bpc']:.3f} (1) | {gap:+.1%} | – | {r['params_trained']:,} |")
    return "\n".join(lines)


def headline_gaps(report: dict, reports: list[dict]) -> list[str]:
    """REPORT's lines under a study's headline table: at each budget the held settings were walked (HELD=True: the
    grid's top budget and the lead budget), the best reservoir's gap to the transformer after the walks, with what
    each setting's walks alone did to it and the settings the envelope took; and the gap where the same text was
    read with another tokenizer (a study of it among ``reports``). None for a study with neither."""
    budgets = sorted({w["budget"] for w in (report.get("held") or {}).get("walks") or []})
    return [line for line in (*(_walked_gap(report, b) for b in budgets), _tokenizer_gap(report, reports)) if line]


def _best_gap(means: dict, reference: str) -> tuple[str, float] | None:
    """(the best reservoir family, its gap to ``reference``) among ``means`` ({family: bits/char} at one budget),
    chosen as ``best_reservoirs`` chooses it."""
    rows = best_reservoirs({f: [{"budget": 0, "bpc_mean": m}] for f, m in means.items()}, reference)
    return (rows[0][1], rows[0][2]["bpc_mean"] / rows[0][3]["bpc_mean"] - 1) if rows else None


def _walked_gap(report: dict, top: float) -> str | None:
    held, reference = report["held"], report["reference"]
    walks = [w for w in held["walks"] if w["budget"] == top]
    after = {f: p["bpc_mean"] for f, points in report["envelope"].items() for p in points if p["budget"] == top}
    moves = [m for m in held["moves"] if m["budget"] == top]
    grid = {**after, **{w["family"]: w["bpc_mean"] for w in walks if w["family"] in {m["family"] for m in moves}}}
    now, was = _best_gap(after, reference), _best_gap(grid, reference)
    if now is None or was is None:
        return None
    alone = []
    for axis in held["ladders"]:
        means = dict(grid)
        for w in walks:
            if w["axis"] == axis and w["moved"] < 0:
                means[w["family"]] = min(means[w["family"]], w["best_mean"])
        alone.append(f"{_HELD_NAMES[axis]} {100 * (_best_gap(means, reference)[1] - was[1]):+.1f}")
    taken = []
    for m in moves:
        walk = next(w for w in walks if w["family"] == m["family"] and w["best_cell"] == m["cell"])
        step = next(s for s in walk["steps"] if s["cell"] == m["cell"])
        taken.append(f"{m['family']} {_HELD_NAMES[walk['axis']]} {step['value']:g}"
                     + (f" per {step['per_tokens']} tokens" if step.get("per_tokens") else ""))
    pending = sum(w["next"] is not None for w in walks)
    return (f"After the held settings' walks, the best reservoir at {top:.3g} FLOPs ({now[0]}) is {now[1]:+.1%} from "
            f"{reference}, against {was[1]:+.1%} ({was[0]}) on the grid's settings; each setting's walks alone move "
            f"that gap by {', '.join(alone[:-1])} and {alone[-1]} percentage points. The envelope there takes "
            f"{'; '.join(taken) if taken else 'no step'}, every other point the grid's settings."
            + (f" {pending} of its {len(walks)} walks there are not finished." if pending else ""))


def _tokenizer_gap(report: dict, reports: list[dict]) -> str | None:
    mine = {g["budget"]: g for g in goal_rows(report)}
    said = []
    for other in _subword_twins(report, reports):
        theirs = {g["budget"]: g for g in goal_rows(other)}
        shared = [b for b in theirs if b in mine]
        if shared:
            a, b = mine[shared[-1]], theirs[shared[-1]]
            said.append(f"read as {_text(other)[1]} tokens (`{other['study']}`), the best reservoir's gap at "
                        f"{shared[-1]:.3g} FLOPs is {b['gap']:+.1%} ({b['family']}), against {a['gap']:+.1%} "
                        f"({a['family']}) in characters")
    return ("The same text " + "; ".join(said) + ".") if said else None


def _multiplier(m: dict | None) -> str:
    """A compute multiplier as the tables give it: ≥ / ≤ beyond the reference's range, * where extrapolated."""
    if not m or m["multiplier"] is None:
        return "–"
    return f"{BOUNDS.get(m['how'], '')}{m['multiplier']:.2f}{'*' if m['how'] == 'extrapolated' else ''}"


def _class(family: str) -> str:
    """The class a family declares; '–' for one whose plugin this process has not loaded."""
    try:
        return class_of(family)
    except KeyError:
        return "–"


def _edge_marks(ordered: list) -> dict:
    """The marks of a grid's edges: ' ↓' on its smallest value, ' ↑' on its largest; none on a grid of one value."""
    return {ordered[0]: " ↓", ordered[-1]: " ↑"} if len(ordered) > 1 else {}


def format_study(report: dict, plot: str, level: int = 2) -> str:
    """A study's section: ``plot`` is the plot's path as the document links it."""
    h = "#" * level
    budgets, by = report["budgets"], _by_budget(report)
    head = "| family | " + " | ".join(f"{b:.3g}" for b in budgets) + " |"
    rule = "| --- |" + " --- |" * len(budgets)
    lines = [f"{h} Frontier study `{report['study']}`", "",
             f"Corpus: {report['corpus']}. Made, and continued after any stop, by", "",
             f"    {study_command(report)}", "",
             "and this text by `python scaling.py REPORT=<the study folder, or the folder of studies>`, from the "
             "committed records alone.", ""]
    goal = goal_rows(report)
    if goal:
        lines += _goal_table(goal, report["reference"], h, report.get("lead_budget"))
        lines += _gap_growth(report, h)
    lines += [f"{h}# Lower envelopes", "",
              "Validation bits/char of each family's best configuration at each training budget, mean ± sd over "
              "its seeds (the size preset, and the number of seeds, in brackets).", "", head, rule]
    for family in report["families"]:
        cells = []
        for b in budgets:
            p = by.get(family, {}).get(b)
            cells.append("–" if p is None else f"{_bpc(p)} ({p['size']}, {len(p['seeds'])})")
        lines.append(f"| {family} | " + " | ".join(cells) + " |")
    lines += ["", f"![each family's lower envelope against training FLOPs]({plot})", "",
              f"Per family: the [IsoFLOP profiles]({detail_plot(plot, 'frontier-isoflop.png')}) (bits/char against "
              f"trained parameters at each budget) and the [learning-rate sensitivity]"
              f"({detail_plot(plot, 'frontier-lr.png')}).", "",
              f"{h}# Compute multiplier", "",
              f"The FLOPs the reference (**{report['reference']}**) needs to reach each family's envelope loss, over "
              "the family's budget (> 1: the family needs less compute than the transformer).", "", head, rule]
    for family, rows in report["compute_multiplier"].items():
        at = {r["budget"]: r for r in rows}
        lines.append(f"| {family} | " + " | ".join(_multiplier(at.get(b)) for b in budgets) + " |")
    rate_edge = _edge_marks(sorted(report["grid"]["LEARNING_RATES"]))
    size_edge = _edge_marks(sorted(report["grid"]["SIZES"], key=PRESETS.index))  # presets, smallest first
    batch_edge = _edge_marks(sorted(report["grid"]["BATCH_SIZES"]))

    def configuration(p: dict) -> str:
        return (f"{p['params_trained']:,} ({p['size']}{size_edge.get(p['size'], '')}, {p['learning_rate']:g}"
                f"{rate_edge.get(p['learning_rate'], '')}, {p['batch_size']}{batch_edge.get(p['batch_size'], '')})")

    lines += ["", "(* extrapolated along the reference's fitted curve; ≥ / ≤: beyond the reference's measured "
              "envelope.)", "", *_elementwise(report, h), *_by_time(report, h, detail_plot(plot, TIME_PLOT)),
              f"{h}# N_opt: the configuration each family chose", "",
              "Trained parameters of the envelope's configuration (size preset, peak learning rate, batch). ↑ / ↓: "
              "the preset, the rate or the batch is the grid's largest / smallest, so a wider grid might still lower "
              "that point.", "", head, rule]
    for family in report["families"]:
        lines.append(f"| {family} | " + " | ".join(
            "–" if by.get(family, {}).get(b) is None else configuration(by[family][b]) for b in budgets) + " |")
    top = {f: points[max(points)] for f, points in by.items() if points}
    for what, at_edge in (("best rate", sorted(f for f, p in top.items() if p["learning_rate"] in rate_edge)),
                          ("best size preset", sorted(f for f, p in top.items() if p["size"] in size_edge)),
                          ("best batch", sorted(f for f, p in top.items() if p["batch_size"] in batch_edge))):
        if at_edge:
            lines += ["", f"At its largest budget the {what} of {', '.join(at_edge)} is at the grid's edge."]
    lines += ["", f"{h}# Train against validation", "",
              "The envelope points: bits/char on the first tokens of the training split and on the validation split, "
              "scored the same way (TRAIN_EVAL_TOKENS), mean over the seeds that scored both (in brackets), and "
              f"the epochs trained. At ≥ {REPEATED:g} epochs (**bold**) repeated data is worth less than fresh "
              "(Muennighoff et al. 2023): a lead there may be regularisation, not architecture. Below one epoch the "
              "gap says only how the two texts differ in difficulty; its growth with epochs is the memorisation. "
              "– : every seed was recorded before the training split was scored.", "",
              "| family | budget | epochs | train bits/char | validation bits/char | gap | validation, per seed |",
              "| --- | --- | --- | --- | --- | --- | --- |"]
    for family in report["families"]:
        for b in budgets:
            p = by.get(family, {}).get(b)
            if p is None:
                continue
            train, val = p.get("train_split_bpc"), p.get("val_bpc_of_split_seeds")
            gap = None if train is None else val - train
            epochs = _fmt(p["epochs"], ".2f")
            scored = f" ({', '.join(map(str, p['split_seeds']))})" if train is not None else ""
            lines.append(f"| {family} | {b:.3g} | {f'**{epochs}**' if (p['epochs'] or 0) >= REPEATED else epochs} "
                         f"| {_fmt(train)}{scored} | {_fmt(val if train is not None else p['bpc'])} | "
                         f"{_fmt(gap, '+.3f')} | "
                         + ", ".join(f"{s}: {v:.3f}" for s, v in zip(p["seeds"], p["bpc_per_seed"], strict=True))
                         + " |")
    for c in report.get("comparisons") or []:
        lines += ["", f"{h}# Paired comparison at {c.get('budget', 0):.3g} FLOPs: {c.get('family_a')} − "
                  f"{c.get('family_b')}", "",
                  f"A = {c.get('family_a')} ({c['a']['model']}, seeds {c['a']['seeds']}): {c['a']['bpc']:.4f} "
                  f"bits/char; B = {c.get('family_b')} ({c['b']['model']}, seeds {c['b']['seeds']}): "
                  f"{c['b']['bpc']:.4f}. **A − B = {c['bpc_difference']:+.4f} bits/char, 95% paired interval "
                  f"[{c['ci95_low']:+.4f}, {c['ci95_high']:+.4f}]** on {c['eval_tokens']:,} validation tokens "
                  f"(per-token losses averaged over seeds; `comparisons/{c['file']}`, made by the study as "
                  "`python compare.py A+A-seeds:<model> B+B-seeds:<model> DIAGNOSTICS=True` would).", ""]
        if c.get("envelope_cells_now"):
            a_now, b_now = c["envelope_cells_now"]
            lines[-1:] = ["", f"**Of earlier envelope points** ({', '.join(c['a']['runs'][:1])} against "
                          f"{', '.join(c['b']['runs'][:1])}): the grid grew since, and the envelope there is now "
                          f"{a_now} against {b_now}. The study's command makes the comparison again where their "
                          "checkpoints are (with REPLAY=True, on any machine: it trains them again there).", ""]
        if c.get("replays"):
            how = "REPLAY=True, or EDGES=True beside their edge steps" if any(
                str(r.get("copy", "")).startswith("edges/") for r in c["replays"]) else "REPLAY=True"
            lines[-1:] = ["", f"Its checkpoints were trained again on the machine that scored them ({how}; "
                          "the records came from another): " + "; ".join(
                              f"{r['point']} seed {r['seed']}: {_fmt(r['replayed_val_bpc'], '.4f')} (record "
                              f"{_fmt(r['recorded_val_bpc'], '.4f')})" for r in c["replays"])
                          + "; the interval is of the replays.", ""]
        diagnostics = c.get("diagnostics")
        if diagnostics:
            lines += ["| split | targets | share | A | B | A − B [95% paired] |",
                      "| --- | --- | --- | --- | --- | --- |"]
            for r in diagnostics["rows"]:
                interval = (f"{r['bpc_difference']:+.3f} [{r['ci95_low']:+.3f}, {r['ci95_high']:+.3f}]"
                            if "bpc_difference" in r else "–")
                lines.append(f"| {r['split']} | {r['targets']:,} | {r['share']:.1%} | {_fmt(r['bpc_a'])} | "
                             f"{_fmt(r.get('bpc_b'))} | {interval} |")
            lines += ["", "Positions count characters from the start of the story; a recall target is a character "
                      f"that continues a {diagnostics['recall_k']}-gram seen earlier in the same story. A corpus "
                      "without story boundaries (Tiny Shakespeare) is one story: nearly every target is past "
                      "position 512, and recall reaches back through the whole validation text, beyond a "
                      "transformer's block."]
    if report.get("controls"):
        lines += ["", f"{h}# Controls: what the frozen part is worth", "",
                  "Each reservoir family's envelope configuration at the grid's top budget trained again, same budget "
                  "and seed, with its frozen part trained too (unfrozen) or with no reservoir under its readout "
                  "(attention-only) (CONTROLS=True; `controls/`). A control below the envelope point (negative "
                  "difference) means freezing cost that family loss at this budget. ± : the 95% interval of each "
                  "run's validation bits/char over its scored tokens; seed to seed, the envelope points vary by the sd "
                  "the envelope table gives.", "",
                  "| family | budget | control | what changes | envelope point | control | control − envelope | "
                  "trained parameters (control, envelope) |", "| --- | --- | --- | --- | --- | --- | --- | --- |"]
        for c in report["controls"]:
            ci = f" ± {c['val_bpc_ci95']:.3f}" if c.get("val_bpc_ci95") else ""
            lines.append(f"| {c['family']} | {c['budget']:.3g} | {c['control']} (seed {c['seed']}) | "
                         + ", ".join(f"{k}={v!r}" for k, v in c["options"].items())
                         + f" | {_fmt(c['envelope_bpc'])} | {_fmt(c['val_bpc'])}{ci} | {_fmt(c['difference'], '+.3f')} "
                         f"| {_fmt(c['params_trained'], ',')}, {_fmt(c['envelope_params_trained'], ',')} |")
    lines += _random_transformer(report, h)
    lines += _draws(report, h)
    lines += _gap_split(report, h)
    lines += _contexts(report, h)
    if report.get("generation"):
        lines += format_generation(report["generation"], report, h, str(Path(plot).with_name(GENERATION_PLOT)))
    lines += _edges(report, h)
    lines += _held(report, h)
    lines += _esn(report, h)
    published = next((rows for (train, val), rows in PUBLISHED.items()
                      if f"{train:,} training and {val:,} validation characters" in (report.get("corpus") or "")), [])
    if published:
        lines += ["", f"{h}# Published numbers on this split", "",
                  "Their models and compute, not ours (nats per character converted: bits/char = nats / ln 2).", "",
                  "| model | validation nats/char | bits/char |", "| --- | --- | --- |"]
        lines += [f"| {what} | {nats:.4g} | {nats / math.log(2):.3f} |" for what, nats in published]
    if report.get("references"):
        lines += ["", f"{h}# Reference lines", "",
                  "One pass over the training data each, no FLOP cap (REFERENCES=True): n-grams (order 1 is the "
                  "unigram level, order 2 the bigram level) and the echo state network across reservoir sizes.", "",
                  "| run | validation bits/char | train bits/char | training FLOPs | trained parameters |",
                  "| --- | --- | --- | --- | --- |"]
        for r in report["references"]:
            lines.append(f"| {r['name']} | {_fmt(r['val_bpc'])} | {_fmt(r['train_split_bpc'])} | "
                         f"{_fmt(r['train_flops'], '.3g')} | {_fmt(r['params_trained'], ',')} |")
    lines += ["", f"{h}# Fits and cost", "", "Fitted envelopes L*(C) = E + A·(C/C0)^−α:", ""]
    for family, fit in report["fits"].items():
        lines.append(f"- {family}: " + (f"E={fit['E']:.3f}±{_fmt(fit['E_se'])}, A={fit['A']:.3f}, "
                                        f"α={fit['alpha']:.3f}±{_fmt(fit['alpha_se'])}" if fit.get("converged")
                                        else f"no fit ({fit['reason']})"))
    spent = report["spent"]
    lines += ["", f"Spent: {spent['points']} point records, {spent['flops']:.3g} training FLOPs "
              f"({spent['flops_if_unbranched']:.3g} had every point trained from step 0), "
              f"{spent['train_cpu_hours']:.2f} training hours on one thread each; {len(report['skipped'])} "
              f"cell-budgets skipped by the step and tokens-per-parameter rules, {len(report['not_run_pruned'])} "
              "not run (pruned by successive halving, or not reached yet by an unfinished study)."]
    if report.get("planned"):
        planned = report["planned"]
        lines.append(f"Planned before the run (PLAN=True's FLOPs): {planned['flops']:.3g} training FLOPs for the grid "
                     f"and seeds as successive halving was expected to keep them, {planned['flops_at_most']:.3g} at "
                     "most; the stages after the grid come on top.")
    lines.append("")
    return "\n".join(lines)


def format_report(studies: list[tuple[Path, dict]], root: Path, probes: dict | None = None) -> str:
    """REPORT.md: the headline of every study, then each study's section, then the probes (probes.py)."""
    named = repository_path(root)  # the same first line wherever REPORT was run from
    lines = ["# ReservoirNLP: what the studies found", "",
             f"Generated by `python scaling.py REPORT={named}` from the committed records under `{named}/`: do not "
             "edit by hand. Every number is a record's; each study says the command that made it.", ""]
    for _, report in studies:
        lines += [f"## `{report['study']}`: the headline", "", headline(report), ""]
        lines += [part for line in headline_gaps(report, [r for _, r in studies]) for part in (line, "")]
    for path, report in studies:
        lines.append(format_study(report, f"{path.relative_to(root).as_posix()}/frontier.png", level=2))
    lines += tokenizer_sections([report for _, report in studies])
    if probes:
        lines += ["", format_probes(probes, level=2, image=f"{PROBES_FOLDER}/probes.png")]
    return "\n".join(lines)


# --------------------------------------------------------------------- plot


DETAIL_PLOTS = {"frontier-isoflop.png": ("isoflop", "params_trained", "trained parameters",
                                          "IsoFLOP profiles: the best over rates and batches at each size"),
                "frontier-lr.png": ("lr_sensitivity", "learning_rate", "peak learning rate",
                                    "learning-rate sensitivity: the best over sizes and batches at each rate")}


def variant_style(family: str) -> str:
    """A gated twin's line style, so it stays apart from its base where their envelopes overlap."""
    return "--" if family.endswith("+write") else "-." if family.endswith("+forget") else "-"


def detail_plot(plot: str, name: str) -> str:
    """Where a detail figure lies beside the headline figure ``plot`` (frontier.png, or a path that ends in it)."""
    return plot[: -len("frontier.png")] + name


def _envelope_range(report: dict) -> tuple[float, float]:
    """The bits/char the families' envelopes occupy, with a margin: the headline panel's y range."""
    scores = [p["bpc_mean"] for points in report["envelope"].values() for p in points if p["bpc_mean"] is not None]
    if not scores:
        return 0.0, 1.0
    low, high = min(scores), max(scores)
    margin = 0.06 * max(high - low, 0.05)
    return low - margin, high + margin


def _spread_labels(values: list[float], gap: float) -> list[float]:
    """``values`` (sorted ascending) moved apart to at least ``gap``: label heights that do not overprint."""
    placed: list[float] = []
    for v in values:
        placed.append(max(v, placed[-1] + gap) if placed else v)
    return placed


@figure(dpi=110)
def plot_frontier(report: dict):
    """The headline: each family's lower envelope of bits/char against training FLOPs (its fit dotted, every grid
    point faint behind it), zoomed to the range the envelopes occupy, each line labelled at its right end in the
    order of its top-budget score; the references (n-gram orders, the ESN) as lines where they fall in range."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from reservoir.run.plots import family_colour

    families = [f for f in report["families"] if report["envelope"].get(f)]
    low, high = _envelope_range(report)
    fig, ax = plt.subplots(figsize=(11, 6.5))
    for family in families:  # one collection per family: a point each was thousands of artists to draw
        faint = [(r["train_flops"] or r["budget"], r["val_bpc"]) for r in report["grid_points"]
                 if r["family"] == family and r["val_bpc"] is not None and not r["envelope_seed"]]
        if faint:
            ax.scatter(*zip(*faint, strict=True), color=family_colour(family), alpha=0.15, s=8, zorder=1)
    budgets = report["budgets"]
    grid = np.geomspace(budgets[0] / 1.3, budgets[-1] * 1.3, 100)
    at = table_budget(report)  # the lines are labelled where the README's table reads them
    reference = report.get("reference")
    if reference and report["envelope"].get(reference):  # the goal: within 5% of the reference
        points = report["envelope"][reference]
        xs, ys = [p["budget"] for p in points], [p["bpc_mean"] for p in points]
        ax.fill_between(xs, ys, [y * (1 + GOAL) for y in ys], color=family_colour(reference), alpha=0.12, lw=0,
                        zorder=0, label=f"the goal: within {GOAL:.0%} of {reference}")
    ends = []
    for family in families:
        points = report["envelope"][family]
        colour = family_colour(family)
        ax.errorbar([p["budget"] for p in points], [p["bpc_mean"] for p in points],
                    yerr=[p["bpc_sd"] or 0 for p in points], fmt="o", linestyle=variant_style(family), color=colour,
                    capsize=3, markersize=4, lw=1.5, zorder=3, label=family)
        fit = report["fits"].get(family, {})
        if fit.get("converged"):
            ax.plot(grid, curve(grid, fit["E"], fit["A"], fit["alpha"], fit["C0"]), color=colour, linestyle=":",
                    alpha=0.8, zorder=2)
        end = next((p for p in points if p["budget"] == at), points[-1])
        ends.append((end["bpc_mean"], end["budget"], family))
    ax.set_xscale("log")
    ax.set_ylim(low, high)
    right = budgets[-1] * 1.6
    ax.set_xlim(budgets[0] / 1.4, right)
    gap = 0.028 * (high - low)
    for y, (score, budget, family) in zip(_spread_labels([e[0] for e in sorted(ends)], gap), sorted(ends),
                                          strict=True):
        ax.annotate(f"{family} {score:.3f}", xy=(budget, score), xytext=(right * 1.05, y), fontsize=8,
                    color=family_colour(family), va="center", annotation_clip=False,
                    arrowprops={"arrowstyle": "-", "color": family_colour(family), "lw": 0.5, "alpha": 0.6})
    references = [r for r in report.get("references") or [] if r["val_bpc"] is not None]
    shown, above = [], []
    for r in sorted(references, key=lambda r: r["val_bpc"]):
        if r["model"] == "ngram" and low <= r["val_bpc"] <= high:
            ax.axhline(r["val_bpc"], color=family_colour("ngram"), linestyle="--", linewidth=0.8, alpha=0.7, zorder=0)
            shown.append(r)
        elif r["model"] == "ngram":
            above.append(f"{r['name']} {r['val_bpc']:.2f}")
    for y, r in zip(_spread_labels([r["val_bpc"] for r in shown], gap), shown, strict=True):
        ax.text(budgets[0] / 1.35, y, f"{r['name']} {r['val_bpc']:.3f}", fontsize=7, color=family_colour("ngram"),
                va="bottom")
    esn = [r for r in references if r["model"] == "esn" and r["train_flops"]]
    notes = []
    inside = [r for r in esn if low <= r["val_bpc"] <= high]  # a line to points off the panel would leave it
    if inside:
        ax.plot([r["train_flops"] for r in inside], [r["val_bpc"] for r in inside], "x--",
                color=family_colour("esn"), alpha=0.7)
        best = min(inside, key=lambda r: r["val_bpc"])
        ax.annotate(f"{best['name']} (one pass) {best['val_bpc']:.2f}", (best["train_flops"], best["val_bpc"]),
                    xytext=(4, 4), textcoords="offset points", fontsize=7, color=family_colour("esn"),
                    annotation_clip=True)
    outside = [r for r in esn if r not in inside]
    if outside:
        notes.append(", ".join(f"{r['name']} {r['val_bpc']:.2f}" for r in outside) + " (one pass)")
    notes += above
    if notes:
        ax.text(0.01, 0.99, "above this range: " + "; ".join(notes), transform=ax.transAxes, fontsize=7,
                color="dimgrey", va="top", bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.85})
    goal = [h for h, label in zip(*ax.get_legend_handles_labels(), strict=True) if label.startswith("the goal")]
    if goal:
        ax.legend(handles=goal, loc="lower left", fontsize=8, framealpha=0.85)
    ax.set_xlabel("training FLOPs")
    ax.set_ylabel("validation bits/char (lower is better)")
    ax.grid(True, which="both", alpha=0.3)
    ax.set_title("lower envelope per family (± sd over seeds; dotted: the fitted L(C); faint: every grid point; "
                 f"labels at {at:.3g} FLOPs, as the README's table)" if at else "lower envelope per family", fontsize=9)
    fig.suptitle(f"frontier study {report['study']} ({report['corpus']})", fontsize=10)
    fig.subplots_adjust(right=0.78)
    return fig


def _plot_per_family(report: dict, key: str, x: str, xlabel: str, title: str):
    """One small panel per family: bits/char against ``x`` at every grid budget (darker: larger budget), one
    legend of budgets for all of them; each panel's y range its own family's."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.ticker import NullFormatter

    from reservoir.run.plots import family_colour

    families = [f for f in report["families"] if any(report[key].get(f, {}).values())]
    budgets = report["budgets"]
    shades = plt.get_cmap("viridis_r")(np.linspace(0.15, 0.95, len(budgets)))
    columns = min(4, max(1, len(families)))
    rows = max(1, -(-len(families) // columns))
    fig, axes = plt.subplots(rows, columns, figsize=(3.6 * columns, 2.9 * rows + 0.8), squeeze=False)
    for ax in axes.flat[len(families):]:
        ax.set_visible(False)
    for ax, family in zip(axes.flat, families, strict=False):
        for k, budget in enumerate(budgets):
            points = report[key][family].get(repr(budget)) or []
            if points:
                ax.plot([p[x] for p in points], [p["bpc"] for p in points], marker="o", markersize=3,
                        color=shades[k], lw=1.2)
        ax.set_xscale("log")
        ticks = sorted({p[x] for points in report[key][family].values() for p in points or []})
        ax.set_xticks(ticks, [f"{t:g}" if x == "learning_rate" else f"{t / 1e3:,.0f}k" for t in ticks], rotation=30)
        ax.xaxis.set_minor_formatter(NullFormatter())  # the grid's own values, not the log axis' crowded minors
        ax.set_title(family, fontsize=9, color=family_colour(family))
        ax.set_xlabel(xlabel, fontsize=7)
        ax.grid(True, which="both", alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in axes[:, 0]:
        ax.set_ylabel("validation bits/char", fontsize=8)
    handles = [Line2D([], [], color=shades[k], marker="o", markersize=3, label=f"{b:.3g} FLOPs")
               for k, b in enumerate(budgets)]
    legend = {"handles": handles, "fontsize": 8, "frameon": False, "title": "grid budget (darker: larger)",
              "title_fontsize": 8}
    if len(families) < axes.size:  # a spare panel holds it, clear of every axis label
        spare = axes.flat[-1]
        spare.set_visible(True)
        spare.set_axis_off()
        spare.legend(loc="center", **legend)
        bottom = 0.0
    else:
        fig.legend(loc="lower center", ncol=len(budgets), **legend)
        bottom = 0.12
    fig.suptitle(f"{title} · frontier study {report['study']}", fontsize=10)
    fig.tight_layout(rect=(0, bottom, 1, 1))
    return fig


@figure(dpi=100)
def plot_isoflop(report: dict):
    """Per family: bits/char against trained parameters at each grid budget."""
    return _plot_per_family(report, *DETAIL_PLOTS["frontier-isoflop.png"])


@figure(dpi=100)
def plot_lr_sensitivity(report: dict):
    """Per family: bits/char against the peak learning rate at each grid budget."""
    return _plot_per_family(report, *DETAIL_PLOTS["frontier-lr.png"])


__all__ = ["write_from_records", "write_study", "format_study", "format_report", "headline", "goal_rows",
           "study_folders", "plot_frontier", "plot_isoflop", "plot_lr_sensitivity", "study_command", "GOAL"]


def _interval(bounds: list[float]) -> str:
    return f"[{bounds[0]:+.3f}, {bounds[1]:+.3f}]"


def _gap_growth(report: dict, h: str) -> list[str]:
    """Does the best reservoir's gap to the reference grow with compute? Its slope, with both intervals."""
    growth = report.get("gap_growth")
    if not growth:
        return []
    slope, seeds, spread = growth["slope_per_decade"], growth["ci95_seeds"], growth["ci95_residuals"]
    if spread[0] > 0:
        verdict = "the gap grows with compute, beyond both seed noise and the budgets' scatter"
    elif spread[1] < 0:
        verdict = "the gap shrinks with compute, beyond both seed noise and the budgets' scatter"
    elif seeds[0] > 0 or seeds[1] < 0:
        verdict = (f"the slope is {'above' if seeds[0] > 0 else 'below'} zero beyond what seed noise explains, but "
                   "the budgets scatter about the line by more than the seeds do, and with that scatter the slope "
                   "is not shown to differ from zero: the gap is not shown to " +
                   ("grow" if slope > 0 else "shrink"))
    else:
        verdict = "the slope is within seed noise of zero: the gap is not shown to change with compute"
    gaps = ", ".join(f"{b:.3g}: {g:+.3f} ({f})" for b, g, f in zip(growth["budgets"], growth["gaps"],
                                                                   growth["families"], strict=True))
    return [f"{h}# Does the gap grow with compute?", "",
            f"The gap as ln(best reservoir family's bits/char / {growth['reference']}'s), mean over seeds, at each "
            f"budget: {gaps}. Its least-squares slope against log10 compute is **{slope:+.3f} per decade**; 95% "
            f"intervals: {_interval(seeds)} over seeds (a bootstrap, {growth['resamples']:,} resamples of each "
            f"budget's seeds, seed {growth['seed']}) and {_interval(spread)} from the budgets' scatter about the "
            f"line (Student's t, {len(growth['gaps']) - 2} degrees of freedom). So {verdict}.", "",
            *_gap_growth_by_class(report), ""]


def _draws(report: dict, h: str) -> list[str]:
    """DRAWS=True (draws.py): each family's spread at the top budget split into its draw's and its training's."""
    content = report.get("draws")
    if not content:
        return []
    lines = [f"{h}# The draw against the seed", "",
             f"At {content['budget']:.3g} FLOPs, the best family of each reservoir class and the reference, on their "
             "envelope configuration: each drawn with each envelope seed (`DRAW_SEED`: its frozen matrices and "
             "eigenvalues) and trained on each (`SEED`: its trained weights' start and its data order), from step 0 "
             "(DRAWS=True; `draws/`), all on one machine: the square's diagonal is the envelope's own runs trained "
             "again, set against their records below. A "
             "two-way analysis of variance without replication: the sd each source adds, with its 95% interval from "
             "the χ² distribution of its mean square (the residual's taken at its estimate). The envelope's ± is "
             "over seeds that vary both.", "",
             "| family | runs | mean bits/char | the draw's sd [95%] | the training's sd [95%] | residual sd [95%] | "
             "the envelope's sd (seeds) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    squares, verdicts = [], []
    for row in content["families"]:
        envelope = f"{_fmt(row['bpc_sd'], '.4f')} ({len(row['seeds'])})"
        split = row["split"]
        if split is None:
            why = row.get("why") or f"an incomplete square ({row['runs']} runs)"
            cells = ("0 (draws nothing: " + why + ")", "all of it", "–") if not row["drawn"] else (why, "–", "–")
            lines.append(f"| {row['family']} | {row['runs']} | – | " + " | ".join(cells) + f" | {envelope} |")
            continue
        cells = [f"{split[s]['sd']:.4f}" + ("" if split[s]["ci95"] is None else
                                            f" [{split[s]['ci95'][0]:.4f}, {split[s]['ci95'][1]:.4f}]")
                 for s in ("draw", "training", "residual")]
        lines.append(f"| {row['family']} | {split['runs']} | {split['mean']:.4f} | " + " | ".join(cells)
                     + f" | {envelope} |")
        first, second = sorted(("draw", "training", "residual"), key=lambda source: -split[source]["sd"])[:2]
        part = (f"the largest part of its envelope's ± is the {first}'s" if split[first]["sd"] > 1.2 * split[second][
            "sd"] else f"the {first}'s and the {second}'s parts of its envelope's ± are about level")
        verdicts.append(f"{row['family']}'s draw adds an sd of {split['draw']['sd']:.4f}, its training "
                        f"{split['training']['sd']:.4f} and the rest {split['residual']['sd']:.4f}: {part}")
        squares += ["", f"{row['family']} ({row['cell']}), bits/char by draw (rows) and training seed (columns):", "",
                    "| draw \\ seed | " + " | ".join(map(str, split["seeds"])) + " |",
                    "| --- |" + " --- |" * len(split["seeds"])]
        squares += [f"| {d} | " + " | ".join(f"{split['square'][f'{d}/{s}']:.4f}" for s in split["seeds"]) + " |"
                    for d in split["draws"]]
        again = row.get("diagonal_minus_record") or {}
        if again:
            squares += ["", "The diagonal (each seed drawn as its own seed draws) against the envelope's records: "
                        + ", ".join(f"seed {s}: {v:+.4f}" for s, v in again.items()) + "."]
    return [*lines, *(["", "So " + "; ".join(verdicts) + "."] if verdicts else []), *squares, ""]


def _sentence(text: str) -> str:
    return text[:1].upper() + text[1:]


def elementwise_verdict(view: dict) -> str:
    """At how many budgets each class's best was within GOAL at matched cost under the element-wise convention, and
    on the FLOP convention's fits at the same budgets."""
    parts = []
    for kind, name in GOAL_CLASSES.items():
        rows = [g["classes"][kind] for g in view["gaps"] if g["classes"][kind] is not None]
        within = sum(1 for c in rows if c["gap"] <= GOAL)
        flop = sum(1 for c in rows if c["flop_convention"] and c["flop_convention"]["gap"] <= GOAL)
        parts.append(f"the {name} at {within} of {len(rows)} budgets (on the FLOP convention's fits: {flop})")
    return f"within {GOAL:.0%} at matched cost: " + "; ".join(parts)


def _elementwise(report: dict, h: str) -> list[str]:
    """The study under the element-wise convention (accounting.py): costs, gaps on the fits, multipliers."""
    view = report.get("elementwise")
    if not view:
        return []
    reference, budgets = report["reference"], report["budgets"]
    lines = [f"{h}# Under the element-wise convention", "",
             "Every float op a training step executes counted, element-wise work (recurrences, scans, gates, "
             "activations, norms, the clip and AdamW's update) as well as products, by the rules in "
             "docs/configuration.md (\"Counting compute\"), from one step of every configuration the grid "
             f"trained (`elementwise-cost.json`, torch {view['torch']}), made by", "", f"    {view['command']}", "",
             "No point trained again: each point's cost is its step's cost times its steps. The envelope's "
             "configurations at that cost (bits/char: mean over seeds) and the curve fitted through them; the gap "
             "at matched cost is read on both fitted envelopes at the cost of the reference's envelope point, with "
             "±1.96 x the two fits' residual RMS combined, beside the same gap on the FLOP convention's fits at "
             "that budget. A cell the FLOP convention passed over at a budget could cost less under this one by at "
             "most the spread of its family's ratio (the first column).", "",
             f"{_sentence(elementwise_verdict(view))}.", ""]
    head = " | ".join(f"{name} | gap [95%] | FLOP convention" for name in GOAL_CLASSES.values())
    lines += [f"| budget | {reference}'s cost | {head} |",
              "| --- | --- |" + " --- | --- | --- |" * len(GOAL_CLASSES)]
    for g in view["gaps"]:
        cells = []
        for kind in GOAL_CLASSES:
            c = g["classes"][kind]
            if c is None:
                cells += ["–", "–", "–"]
                continue
            flop = c["flop_convention"]
            cells += [c["family"], f"{c['gap']:+.1%} [{c['ci95'][0]:+.1%}, {c['ci95'][1]:+.1%}]",
                      "–" if flop is None else f"{flop['gap']:+.1%}"]
        lines.append(f"| {g['budget']:.3g} | {g['cost']:.3g} | " + " | ".join(cells) + " |")
    lines += ["", "Compute multiplier under it (the element-wise cost the reference needs to reach the family's "
              "envelope loss, over the family's): ", "",
              "| family | cost / FLOP convention's | " + " | ".join(f"{b:.3g}" for b in budgets) + " |",
              "| --- | --- |" + " --- |" * len(budgets)]
    for family, rows in view["compute_multiplier"].items():
        at = {r["budget"]: r for r in rows}
        low, high = view["ratio"].get(family, [None, None])
        ratio = "–" if low is None else f"{low:.3f}–{high:.3f}"
        lines.append(f"| {family} | {ratio} | " + " | ".join(_multiplier(at.get(b)) for b in budgets) + " |")
    changes = view["ranking_changes"]
    swaps = "; ".join(f"at {c['budget']:.3g}, " + ", ".join(f"{b} now above {a}" for a, b in c["swapped"])
                      for c in changes)
    lines += ["", "(* extrapolated along the reference's fitted curve.) The families' order by compute multiplier "
              + (f"changes: {swaps}." if changes else "is the FLOP convention's at every budget.")
              + (f" Not counted (no recorded configuration): {', '.join(view['missing'])}." if view["missing"] else ""),
              ""]
    return lines


def time_verdict(view: dict, reference: str) -> str:
    """One processor's view at matched time in a sentence: at how many of the reference's times each class's best
    was within GOAL, and its gap at the longest."""
    matched = view["matched"]
    if not matched:
        return f"no {reference} point trained on this processor: no gap at matched time"
    parts = []
    for kind, name in GOAL_CLASSES.items():
        rows = [(m["seconds"], m["classes"][kind]) for m in matched if m["classes"][kind] is None
                or "beyond" not in m["classes"][kind]]
        if not rows:
            parts.append(f"the {name} trained no point here as long as any of {reference}'s")
            continue
        within = sum(1 for _, c in rows if c is not None and c["gap"] <= GOAL)
        seconds, last = rows[-1]
        parts.append(f"the {name} at {within} of {len(rows)} (at the longest it reached, {seconds:.0f} s: "
                     + ("none trained" if last is None else f"{last['gap']:+.1%}, {last['family']}") + ")")
    return f"within {GOAL:.0%} at matched time: " + "; ".join(parts)


def _by_time(report: dict, h: str, plot: str) -> list[str]:
    """The frontier against training seconds, a view per processor (timing.py), with the gap at matched time."""
    timed = report.get("by_time")
    if not timed or not timed["processors"]:
        return []
    reference = timed["reference"]
    lines = [f"{h}# By training time", "",
             "The same grid points against the seconds each trained (`train_seconds`: the training loop on one CPU "
             "thread; evaluation and compilation not counted). Time measures this implementation on one processor, "
             "not the models, so points are never pooled across processors: each processor the records name is a "
             f"view of its own (\"{NOT_RECORDED}\": records written before records named their processor), with how "
             "many of its points trained while the machine was oversubscribed (their steps ran about 1.5x slower). "
             + (f"At each of {reference}'s envelope points, each class's best point trained within as many seconds, "
                "and its gap (– : none of the class trained that fast; \"beyond\": none of its points on this "
                "processor trained as long, so the two are not compared there). " if reference else
                "The study has no reference family to set the classes against, so no gap is given. ")
             + "No curve is fitted through times that scatter with the load.", "",
             f"![each family's lower envelope against training seconds]({plot})", ""]
    for processor, view in timed["processors"].items():
        families = ", ".join(f"{f} {n}" for f, n in view["families"].items())
        lines += [f"**{processor}**: {view['points']} points, {view['hours']:.1f} training hours "
                  f"({view['oversubscribed']} oversubscribed): {families}."
                  + (f" {_sentence(time_verdict(view, reference))}." if reference else ""), ""]
        if not view["matched"]:
            continue
        head = " | ".join(f"{name} | gap" for name in GOAL_CLASSES.values())
        lines += [f"| seconds | {reference} | {head} |", "| --- | --- |" + " --- | --- |" * len(GOAL_CLASSES)]
        for m in view["matched"]:
            cells = []
            for kind in GOAL_CLASSES:
                c = m["classes"][kind]
                if c is None or "beyond" in c:
                    cells += ["–" if c is None else f"beyond its longest ({c['beyond']:.0f} s)", "–"]
                else:
                    cells += [f"{c['family']}: {c['bpc']:.3f} ({c['seconds']:.0f} s)", f"{c['gap']:+.1%}"]
            lines.append(f"| {m['seconds']:.0f} | {m['reference_bpc']:.3f} | " + " | ".join(cells) + " |")
        lines.append("")
    return lines


@figure(dpi=100)
def plot_time(timed: dict):
    """A panel per processor: each family's lower envelope of bits/char against training seconds, as steps (the
    best reached within each time)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import NullFormatter

    from reservoir.run.plots import family_colour

    views = list(timed["processors"].items())
    fig, axes = plt.subplots(1, len(views), figsize=(5.2 * len(views) + 1.5, 4.6), squeeze=False)
    for ax, (processor, view) in zip(axes.flat, views, strict=True):
        for family, front in view["envelopes"].items():
            ax.step([p["seconds"] for p in front], [p["bpc"] for p in front], where="post", marker="o",
                    markersize=3, lw=1.3, color=family_colour(family), label=family)
        ax.set_xscale("log")
        ax.xaxis.set_minor_formatter(NullFormatter())  # a short axis labels its minor ticks, crowded
        ax.set_title(f"{processor} ({view['points']} points)", fontsize=9)
        ax.set_xlabel("training seconds (one CPU thread)", fontsize=8)
        ax.grid(True, which="both", alpha=0.3)
        ax.tick_params(labelsize=7)
    axes[0, 0].set_ylabel("validation bits/char (lower is better)", fontsize=8)
    handles = {label: handle for ax in axes.flat for handle, label in zip(*ax.get_legend_handles_labels(),
                                                                            strict=True)}
    axes[0, -1].legend(handles.values(), handles.keys(), loc="upper left", bbox_to_anchor=(1.02, 1), fontsize=8,
                       frameon=False)
    fig.suptitle(f"lower envelope by training time, per processor · frontier study {timed['study']}", fontsize=10)
    return fig


def _gap_growth_by_class(report: dict) -> list[str]:
    """The same slope for the best of each class apart (a readout-only reservoir, a frozen-transition network)."""
    parts = []
    for kind, name in GOAL_CLASSES.items():
        growth = (report.get("gap_growth_by_class") or {}).get(kind)
        if growth is None:
            parts.append(f"the {name}'s: too few budgets for a slope")
            continue
        families = ", ".join(sorted(set(growth["families"])))
        parts.append(f"the {name}'s ({families}) **{growth['slope_per_decade']:+.3f} per decade**, "
                     f"{_interval(growth['ci95_seeds'])} over seeds and {_interval(growth['ci95_residuals'])} from "
                     "the scatter")
    return ["Each class apart: " + "; ".join(parts) + "."]


GATES = {"write": "+ write gate (a reservoir)", "forget": "+ forget gate (trained: not a reservoir)"}


def _gap_split(report: dict, h: str) -> list[str]:
    """Where the gap comes from: a frozen family, its gated variants, its unfrozen control and the LSTM at each
    budget, with the share of the family's gap to the reference each closes."""
    by, reference = _by_budget(report), report["reference"]
    unfrozen = {}  # the unfrozen control runs on the first seed alone
    for c in report.get("controls") or []:
        if c["control"] == "unfrozen" and c["val_bpc"] is not None:
            unfrozen.setdefault((c["family"], c["budget"]), c)
    lines = []
    for base in ("frozen_retention", "reservoir_attention"):
        gated = [(f"{base}+{gate}", label) for gate, label in GATES.items() if by.get(f"{base}+{gate}")]
        if not gated or not by.get(base) or not by.get(reference):
            continue
        columns = [*gated, ("unfrozen", "unfrozen (first seed)"), ("lstm", "lstm")]
        if not lines:
            lines = ["", f"{h}# Where the gap comes from", "",
                     "Each frozen family beside its gated variants, its unfrozen control (CONTROLS=True, the grid's "
                     "top budget) and the LSTM, as bits/char (mean over seeds), and in brackets the share of the "
                     f"family's gap to {reference} each closes ((family − it) / (family − {reference}); 100%: level "
                     f"with {reference}). The unfrozen control ran on one seed: its share is of the gap on that "
                     f"seed, against the family's and {reference}'s runs with the same seed (a mean over seeds "
                     "beside one seed's run would count the seeds' spread as gap closed). A write gate learns what "
                     "enters the frozen state, whose transition stays frozen; a forget gate makes the decays "
                     "depend on the content, which trains the transition."]
        lines += ["", f"| budget | {reference} | {base} | " + " | ".join(label for _, label in columns) + " |",
                  "| --- |" + " --- |" * (2 + len(columns))]
        for budget in report["budgets"]:
            ref, own = by[reference].get(budget), by[base].get(budget)
            if ref is None or own is None:
                continue
            cells = []
            for name, _ in columns:
                if name == "unfrozen":
                    value, before, after = _one_seed_gap(unfrozen.get((base, budget)), ref)
                else:
                    value = (by.get(name, {}).get(budget) or {}).get("bpc_mean")
                    before, after = own["bpc_mean"], ref["bpc_mean"]
                gap = None if before is None or after is None else before - after
                closes = None if value is None or gap is None or gap <= 0 else (before - value) / gap
                share = "" if closes is None else f" ({closes:+.0%})"
                cells.append("–" if value is None else f"{value:.3f}{share}")
            lines.append(f"| {budget:.3g} | {ref['bpc_mean']:.3f} | {own['bpc_mean']:.3f} | " + " | ".join(cells)
                         + " |")
    return lines


def _one_seed_gap(control: dict | None, reference: dict) -> tuple[float | None, float | None, float | None]:
    """(the control's bits/char, its own point's on the same seed, the reference envelope's on that seed): the
    share a one-seed control closes is of the gap on its seed; None where a run of that seed is missing."""
    if control is None:
        return None, None, None
    seeds = dict(zip(reference.get("seeds") or [], reference.get("bpc_per_seed") or [], strict=True))
    return control["val_bpc"], control.get("envelope_bpc"), seeds.get(control["seed"])


def _random_transformer(report: dict, h: str) -> list[str]:
    """The random-transformer control beside the top budget's envelope: does frozen attention carry as much as
    a frozen recurrence?"""
    runs = [c for c in report.get("controls") or [] if c["control"] == "random" and c["val_bpc"] is not None]
    if not runs:
        return []
    budget = runs[0]["budget"]
    bpc = [c["val_bpc"] for c in runs]
    sd = f" ± {statistics.stdev(bpc):.3f}" if len(bpc) > 1 else ""
    at_top = {f: p for f, points in report["envelope"].items() for p in points if p["budget"] == budget}
    lines = ["", f"{h}# Frozen attention: the random transformer", "",
             f"Transformer++'s envelope configuration at {budget:.3g} FLOPs trained again with every block and norm "
             "frozen at its random initialisation and only the token embedding and the unembedding trained (untied; "
             "Zhong & Andreas 2024, arXiv 2410.04368), beside the envelopes at that budget (CONTROLS=True; "
             "`controls/<cell>+random`). Its FLOPs are counted as a reservoir's: the frozen blocks pay their "
             "forward and the backward through their activations, not their weight gradients.", "",
             "| model | bits/char (seeds) | trained parameters | frozen |", "| --- | --- | --- | --- |",
             f"| random transformer (transformer++, trained='embeddings') | {statistics.fmean(bpc):.3f}{sd} "
             f"({len(bpc)}) | {_fmt(runs[0]['params_trained'], ',')} | blocks, norms |"]
    frozen = {"transformer++": "–", **{f: "recurrence" for f in RESERVOIR_FAMILIES}}
    for family in sorted(at_top, key=lambda f: at_top[f]["bpc_mean"]):
        if family in frozen:
            p = at_top[family]
            lines.append(f"| {family} | {_bpc(p)} ({len(p['seeds'])}) | {_fmt(p['params_trained'], ',')} | "
                         f"{frozen[family]} |")
    return lines


def _contexts(report: dict, h: str) -> list[str]:
    """CONTEXTS=True: bits/char of each family's top-budget envelope point at every evaluation context."""
    contexts = report.get("contexts")
    if not contexts or not contexts.get("rows"):
        return []
    rows = contexts["rows"]
    columns = next(iter(rows.values()))["contexts"]
    order = {f: k for k, f in enumerate(report["families"])}
    lines = ["", f"{h}# What context is worth", "",
             f"Each family's envelope point at {contexts['budget']:.3g} FLOPs (its first seed) scored again on the "
             "same validation tokens with a context of 32, 128 and 512 tokens (windows slid by half their length, the "
             "window protocol for every model, recurrent ones included) and through the whole stream (the state "
             "carried, for every model that has one; – where a model cannot: no state, or a position table "
             "shorter than the context). Below them the leaders trained again at 4 x SEQ_LEN, at the same FLOPs "
             "and tokens per step (CONTEXTS=True; `context-scores.json`). tokens: what the point trained on (fewer "
             "at the longer window where attention's T x T square costs more a token). recorded: the point's own "
             "final score.", "",
             "| model | trained at SEQ_LEN | tokens | " + " | ".join(c if c == "stream" else f"context {c}"
                                                          for c in columns) + " | recorded |",
             "| --- | --- | --- | " + " | ".join("---" for _ in columns) + " | --- |"]
    for row in sorted(rows.values(), key=lambda r: (r["seq_len"], order.get(r["family"], 99))):
        scores = " | ".join(_fmt(row["scores"].get(c)) for c in columns)
        lines.append(f"| {row['family']} | {row['seq_len']} | {_fmt(row.get('train_tokens'), ',')} | {scores} | "
                     f"{_fmt(row.get('recorded_val_bpc'))} |")
    return lines


_AXIS_NAMES = {"size": ("size preset", "SIZES"), "learning_rate": ("rate", "LEARNING_RATES"),
               "batch_size": ("batch", "BATCH_SIZES")}


def _edge_value(axis: str, value) -> str:
    return f"{value:g}" if axis == "learning_rate" else str(value)


def _edges(report: dict, h: str) -> list[str]:
    """EDGES=True: each envelope point on a grid edge, and the steps beyond it."""
    edges = report.get("edges")
    if not edges:
        return []
    limit = edges["max_tokens_per_param"]
    lines = ["", f"{h}# Does the grid contain its optimum?", "",
             "Each family's envelope point at the grid's top two budgets and the lead budget whose size preset, rate "
             "or batch is its grid list's smallest (↓) or largest (↑), and the step beyond that edge, trained on the "
             "first seed from step 0 (EDGES=True; `edges/`): the next preset, half or twice the rate, half or twice "
             "the batch, one axis at a time. A step that beats the point is followed by the next, until one is worse. "
             "Bits/char of the first seed, as the grid chose its envelope; the envelope's mean over seeds above is "
             "the grid's. While a walk is open, a point recorded on another processor is trained again beside its "
             "steps (trained here): across processors one point scores up to 0.05 bits/char apart (bench/README.md); "
             "a walk its records end is finished on every machine. †: more tokens per "
             f"trained parameter than the grid's rule allows ({limit:g}); the grid would have skipped that step, and "
             "it was trained to ask the question all the same.", ""]
    walks = edges["walks"]
    if not walks:
        return [*lines, "No envelope point at these budgets sits on a grid edge."]
    lines += ["| family | budget | envelope point (first seed) | edge | steps beyond (bits/char) | the point moved |",
              "| --- | --- | --- | --- | --- | --- |"]
    order = {f: k for k, f in enumerate(report["families"])}
    # one seed's step against one seed's point: a gain within the seeds' spread of the point says little
    seed_sd = {(f, p["budget"]): p.get("bpc_sd") for f, points in (report.get("envelope") or {}).items()
               for p in points}

    def spread(w: dict) -> float | None:
        return seed_sd.get((w["family"], w["budget"]))
    for w in sorted(walks, key=lambda w: (w["budget"], order.get(w["family"], 99), w["axis"], w["direction"])):
        name, key = _AXIS_NAMES[w["axis"]]
        steps = []
        for step in w["steps"]:
            over = "†" if (step.get("tokens_per_param") or 0) > limit else ""
            score = _fmt(step["val_bpc"]) if not step.get("why") else f"cannot train: {step['why']}"
            steps.append(f"{_edge_value(w['axis'], step['value'])}: {score}{over}")
        if w["moved"] < 0:
            ended = {"worse": "then a worse step", "not run yet": f"next: {w['next']}"}.get(w["end"], w["end"])
            sd = f"seeds' sd {spread(w):.3f}; " if spread(w) else ""
            verdict = f"**{w['moved']:+.3f}** ({sd}grow {key}; {ended})"
        elif w["end"] == "worse" and w["steps"] and w["steps"][0]["val_bpc"] is not None:
            verdict = f"no: the step is worse ({w['steps'][0]['val_bpc'] - w['val_bpc']:+.3f})"
        elif w["end"] == "worse":
            verdict = "no: the step diverged"
        else:
            verdict = {"no preset beyond": "no preset beyond", "cannot train": "–",
                       "not run yet": f"not run yet ({w['next']})"}[w["end"]]
        arrow = "↓" if w["direction"] < 0 else "↑"
        point = f"{w['cell']}: {_fmt(w['val_bpc'])}" + (f" (trained here; record {_fmt(w['recorded_bpc'])})"
                                                         if w.get("trained_beside") else "")
        lines.append(f"| {w['family']} | {w['budget']:.3g} | {point} | {name} "
                     f"{_edge_value(w['axis'], w['from'])} {arrow} | {'; '.join(steps) or '–'} | {verdict} |")
    moved = [w for w in walks if w["moved"] < 0]
    pending = [w for w in walks if w["end"] == "not run yet"]
    if moved:
        most = min(moved, key=lambda w: w["moved"])
        beyond = [w for w in moved if (spread(w) or 0) < -w["moved"]]
        if beyond:
            where = ", ".join(f"{w['family']} at {w['budget']:.3g}" for w in beyond)
            grow = (f"{len(beyond)} of them by more than the envelope point's seeds' sd ({where}): the grid should "
                    "grow there (a grid list may grow).")
        else:
            grow = ("None by more than the envelope point's seeds' sd: within it one seed cannot tell the step from "
                    "the point, and growing the grid there may move no envelope.")
        lines += ["", f"{len(moved)} of {len(walks)} edges held the point back on its first seed; the most, "
                  f"{most['family']} at {most['budget']:.3g} FLOPs, by {most['moved']:+.3f} bits/char. {grow}"]
    elif len(pending) < len(walks):
        lines += ["", f"At none of the {len(walks) - len(pending)} edges walked did the step beyond beat the point."]
    if pending:
        lines.append(f"{len(pending)} walks are not finished: the study's command with EDGES=True continues them.")
    return lines


_HELD_NAMES = {"adam_beta2": "Adam's β2", "weight_decay": "weight decay", "dropout": "dropout"}
_HELD_ENDS = {"worse": "no: the step is worse", "within the seeds' sd": "no: within the point's seeds' sd",
              "not on its seeds": "no: not on its other seeds", "no value beyond": "walked to its last value",
              "not run yet": "not run yet", "seeds not run yet": "its other seeds not run yet"}


def _held(report: dict, h: str) -> list[str]:
    """HELD=True: each envelope point's held settings, a step at a time, and which steps moved the envelope."""
    held = report.get("held")
    if not held:
        return []
    ladders = "; ".join(f"{_HELD_NAMES[a]} {' → '.join(f'{v:g}' for v in values)}"
                        + (" per the tokens of a step at the grid's largest batch" if a == "adam_beta2" else "")
                        for a, values in held["ladders"].items())
    lines = ["", f"{h}# The held settings walked", "",
             "Each family's envelope point at the grid's top budget and the lead budget, one step at a time along "
             f"each setting the grid holds for every point ({ladders}), trained from step 0 (HELD=True; `held/`). "
             "A step counts only if its first seed beats the point's by more than the point's seeds' sd; it is then "
             "trained on the other seeds, and where its mean beats the point's it is walked on, and the envelope "
             "takes it. Bits/char: first seed, then the mean over seeds where the step was trained on them. While a "
             "walk is open, a point recorded on another processor is trained again here beside its steps. The paired "
             "comparisons, controls, draws and contexts stay of the grid's envelope points.", ""]
    walks = held["walks"]
    if not walks:
        return [*lines, "No envelope point at these budgets yet."]
    lines += ["| family | budget | envelope point: first seed, mean ± sd | setting | steps (bits/char) | moved |",
              "| --- | --- | --- | --- | --- | --- |"]
    order = {f: k for k, f in enumerate(report["families"])}
    for w in sorted(walks, key=lambda w: (w["budget"], order.get(w["family"], 99), w["axis"])):
        steps = [f"{s['value']:g}" + (f" per {s['per_tokens']} tokens" if s.get("per_tokens") else "")
                 + f": {_fmt(s['val_bpc'])}" + (f", mean {_fmt(s['bpc_mean'])}" if s["bpc_mean"] else "")
                 + (f" ± {s['bpc_sd']:.3f}" if s.get("bpc_sd") else "")
                 for s in w["steps"]]
        verdict = f"**{w['moved']:+.3f}** ({w['best_cell']})" if w["moved"] < 0 else _HELD_ENDS[w["end"]]
        spread = f" ± {w['bpc_sd']:.3f}" if w["bpc_sd"] else ""
        point = (f"{w['cell']}: {_fmt(w['val_bpc'])}, {_fmt(w['bpc_mean'])}{spread}"
                 + (" (trained here)" if w["trained_beside"] else ""))
        holds = f"{w['from']:g}" + ("" if w["axis"] != "adam_beta2" else f" per {w['per_tokens']} tokens"
                                    if w.get("per_tokens") else " a step")
        lines.append(f"| {w['family']} | {w['budget']:.3g} | {point} | {_HELD_NAMES[w['axis']]} {holds} | "
                     f"{'; '.join(steps) or '–'} | {verdict} |")
    moves = held["moves"]
    pending = sum(w["next"] is not None for w in walks)
    if moves:
        lines += ["", "The envelope takes: " + "; ".join(f"{m['family']} at {m['budget']:.3g} FLOPs, {m['cell']}"
                                                       for m in moves) + "."]
    elif pending < len(walks):
        lines += ["", f"None of the {len(walks) - pending} walks that ended moved an envelope point."]
    if pending:
        lines.append(f"{pending} walks are not finished: the study's command with HELD=True continues them.")
    return lines


def _esn(report: dict, h: str) -> list[str]:
    """The echo state network at its best: each ESN family's envelope point per budget (its units, rate, batch),
    the ridge ESN's best one-pass run within that budget, the best other reservoir and the transformer."""
    families, reference, by = esn_families(report["families"]), report["reference"], _by_budget(report)
    budgets = [b for b in report["budgets"] if any(b in by.get(f, {}) for f in families)]
    if not budgets:
        return []
    reference = reference or "the transformer"
    others = [f for f in report["families"] if f not in families and _class(f) == RESERVOIR]
    ridge = [r for r in report.get("references") or [] if r["model"] == "esn" and r["val_bpc"] is not None]
    reservoirs, recorded = {}, report.get("esn_reservoirs") or {}  # {knobs as named: the families that drew them}
    for family in families:
        knobs = recorded.get(family)
        if knobs:  # a family with no point recorded yet drew none
            named = ", ".join(f"{name} {knobs[k]:g}" for k, name in ESN_KNOBS.items() if k in knobs)
            reservoirs.setdefault(named, []).append(family)
    drawn = "; ".join(f"{' and '.join(fs)}: {named}" for named, fs in reservoirs.items()) or "as its records give it"

    def point(p: dict | None) -> str:
        if p is None:
            return "–"
        units = MODELS["esn"].sizes.get(p["size"], {}).get("units")
        return f"{_bpc(p)} ({units:,} units, {p['learning_rate']:g}, {p['batch_size']})" if units else _bpc(p)

    lines = ["", f"{h}# The echo state network at its best", "",
             f"Each ESN family draws one reservoir, tuned by a sweep (docs/runs.md): {drawn}. The grid walks its "
             "units (the size preset), the readout's rate and the batch, as for every family, and its readout "
             "trains on cross-entropy over features harvested in streams. A ridge "
             "readout is solved in one pass whose XᵀX costs units² multiply-adds a token: it is a reference line "
             "(its best one-pass run within the budget), not a grid family. Bits/char (units, rate, batch); the "
             "gaps are the best ESN's.", "",
             "| budget | " + " | ".join(families) + f" | ridge ESN, one pass | best other reservoir | {reference} | "
             "best ESN vs " + reference + " | vs best other reservoir |",
             "| --- |" + " --- |" * (len(families) + 5)]
    gaps = []  # (budget, the best ESN's gap to the reference) where both ran
    for b in budgets:
        best = min((by[f][b] for f in families if b in by.get(f, {})), key=lambda p: p["bpc_mean"])
        within = min((r for r in ridge if r["train_flops"] <= b), key=lambda r: r["val_bpc"], default=None)
        other = min((f for f in others if b in by.get(f, {})), key=lambda f: by[f][b]["bpc_mean"], default=None)
        ref = by.get(reference, {}).get(b)
        if ref is not None:
            gaps.append((b, best["bpc_mean"] / ref["bpc_mean"] - 1))
        cells = [f"{b:.3g}", *(point(by.get(f, {}).get(b)) for f in families),
                 "–" if within is None else f"{within['val_bpc']:.3f} ({within['name']})",
                 "–" if other is None else f"{other}: {_bpc(by[other][b])}", "–" if ref is None else _bpc(ref),
                 "–" if ref is None else f"{gaps[-1][1]:+.1%}",
                 "–" if other is None else f"{best['bpc_mean'] / by[other][b]['bpc_mean'] - 1:+.1%}"]
        lines.append("| " + " | ".join(cells) + " |")
    if len(gaps) > 1:
        (first, early), (last, late) = gaps[0], gaps[-1]
        lines += ["", f"The best ESN's gap to {reference} goes from {early:+.1%} at {first:.3g} FLOPs to "
                  f"{late:+.1%} at {last:.3g}: it {'grows' if late > early else 'shrinks'} with compute."]
    return lines + ["", "Köster & Uchida 2025 (arXiv 2507.15779) set a classical reservoir and an attention-enhanced "
                    "one against transformers on character-level Shakespeare at equal trainable parameters, and found "
                    "the transformers ahead; here the budget is training FLOPs, every family is tuned on it, and the "
                    "other reservoirs are this project's."]


def _text(report: dict) -> tuple[str, str]:
    """(the text a study read, in characters; its tokenizer), from its corpus label (data/tokens.py corpus_label)."""
    tokenizer, _, text = (report.get("corpus") or "").partition(", ")
    return text, tokenizer.partition(" tokenizer")[0]


def tokenizer_sections(reports: list[dict]) -> list[str]:
    """"Characters or subwords": for each study of characters and each study of the same text under another
    tokenizer, every family both ran at every budget both reached, in bits per character, and whether the ranking
    and the best reservoir's gap to the transformer survive the tokenizer."""
    return [line for chars in reports for other in _subword_twins(chars, reports)
            for line in _tokenizer_section(chars, other, _text(chars)[0])]


def _subword_twins(chars: dict, reports: list[dict]) -> list[dict]:
    """The studies among ``reports`` of the text that the character study ``chars`` read, under another tokenizer
    (none where ``chars`` is not a character study)."""
    text, kind = _text(chars)
    if kind != "char" or not text:
        return []
    return [other for other in reports if _text(other)[0] == text and _text(other)[1] != "char"]


def _tokenizer_section(chars: dict, other: dict, text: str) -> list[str]:
    a, b = _by_budget(chars), _by_budget(other)
    families = [f for f in chars["families"] if f in other["families"] and a.get(f) and b.get(f)]
    budgets = sorted({budget for f in families for budget in a[f] if budget in b[f]})
    lines = ["", f"## Characters or subwords: `{chars['study']}` and `{other['study']}`", "",
             f"One text ({text}) read as characters and as {_text(other)[1]} tokens; both scored in bits per "
             "character, each on the start of the same validation text (as many tokens as its FINAL_EVAL_TOKENS), "
             "so one table (mean ± sd over seeds; the difference of the means).", "",
             f"| budget | family | characters | {_text(other)[1]} tokens | difference |",
             "| --- | --- | --- | --- | --- |"]
    for budget in budgets:
        for f in families:
            if budget in a[f] and budget in b[f]:
                lines.append(f"| {budget:.3g} | {f} | {_bpc(a[f][budget])} | {_bpc(b[f][budget])} | "
                             f"{b[f][budget]['bpc_mean'] - a[f][budget]['bpc_mean']:+.3f} |")
    lines.append("")
    for budget in budgets:
        present = [f for f in families if budget in a[f] and budget in b[f]]
        order = [sorted(present, key=lambda f, by=by: by[f][budget]["bpc_mean"]) for by in (a, b)]
        ranking = ("the same ranking" if order[0] == order[1] else
                   f"the ranking changes ({' < '.join(order[0])} in characters; {' < '.join(order[1])} in tokens)")
        gaps = [next((f"{g['family']} {g['gap']:+.1%}" for g in goal_rows(r) if g["budget"] == budget), "–")
                for r in (chars, other)]
        lines.append(f"- {budget:.3g} FLOPs: {ranking}; the best reservoir's gap to the transformer {gaps[0]} in "
                     f"characters, {gaps[1]} in tokens.")
    return lines if budgets else []
