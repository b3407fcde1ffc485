"""What a frontier study's rows say: each family's lower envelope, IsoFLOP profiles, N_opt, the curves
fitted, the compute multipliers against the transformer and the controls against their envelope.
``report_from_records`` builds it all from a study's records alone (no checkpoints needed).
"""

from __future__ import annotations

import statistics
from pathlib import Path

from reservoir.models.registry import STUDY_FAMILIES
from reservoir.run.records import ResultsError
from reservoir.studies.budgets import point_name
from reservoir.studies.curves import compute_on_curve, fit_curve, gap_slope, interpolated_compute
from reservoir.studies.frontier.accounting import elementwise_view, read_counts
from reservoir.studies.frontier.contexts import context_table
from reservoir.studies.frontier.draws import draws_report
from reservoir.studies.frontier.edges import edges_report
from reservoir.studies.frontier.generation import read_generation
from reservoir.studies.frontier.grid import (
    REFERENCE_FAMILIES,
    RESERVOIR_CLASSES,
    RESERVOIR_FAMILIES,
    FrontierError,
    of_class,
)
from reservoir.studies.frontier.held import held_report
from reservoir.studies.frontier.records import (
    STUDY_FILE,
    check_records_file,
    collect_comparisons,
    collect_controls,
    collect_draws,
    collect_records,
    collect_references,
    compared_cells,
    read_study_file,
    study_budgets,
)
from reservoir.studies.frontier.timing import by_time
from reservoir.studies.store import PointRecords

BOUNDS = {"at least": "≥ ", "at most": "≤ "}


def envelope_cells(rows: list[dict], budgets: list[float]) -> dict:
    """{(family, budget): the cell with the lowest bits/char on the study's first seed}."""
    best: dict = {}
    for r in rows:
        if r["envelope_seed"] or r["val_bpc"] is None:
            continue
        key = (r["family"], r["budget"])
        if key not in best or r["val_bpc"] < best[key][0]:
            best[key] = (r["val_bpc"], r["cell"])
    return {key: cell for key, (_, cell) in best.items()}


def _dated(comparison: dict, envelope: dict) -> dict:
    """``comparison``, with ``envelope_cells_now`` (A's and B's) where the envelope at its budget is no longer the
    cells it scored: the grid grew after it was made, and the study's command makes it again."""
    now = [next((p["cell"] for p in envelope.get(comparison.get(side)) or []
                 if p["budget"] == comparison.get("budget")), None) for side in ("family_a", "family_b")]
    if all(cells == {cell} for cells, cell in zip(compared_cells(comparison), now, strict=True)):
        return comparison
    return {**comparison, "envelope_cells_now": now}


def build_frontier(rows: list[dict], study: dict, references: list[dict] | None = None,
                   comparisons: list[dict] | None = None, controls: list[dict] | None = None,
                   stages: dict | None = None) -> dict:
    """frontier.json's content from the point rows, the study's grid, its reference runs, its controls and
    the later stages' results, ``stages``: "contexts" (contexts.py), "edges" (edges.py) and "held" (held.py: where
    a held setting's walk moved a point, the envelope takes its step)."""
    references, controls = references or [], controls or []
    contexts, edges, held = ((stages or {}).get(key) for key in ("contexts", "edges", "held"))
    stepped = [*((edges or {}).get("steps") or []), *((held or {}).get("rows") or [])]
    corpora = sorted({r["corpus"] for r in [*rows, *references, *controls, *stepped] if r.get("corpus")})
    if len(corpora) > 1:
        raise FrontierError(f"the records of study {study['study']} mix corpora ({' | '.join(corpora)}): one "
                            "frontier compares one corpus; keep each study's points in its own STUDY folder")
    sources = sorted({r["data_source"] for r in [*rows, *references] if r.get("data_source")})
    if not rows:
        raise FrontierError(f"study {study['study']} has no point records yet: run it first (python scaling.py "
                            "FAMILIES=... STUDY=...)")
    budgets, families = study_budgets(study), study["grid"]["FAMILIES"]
    winners = envelope_cells(rows, budgets)
    winners.update({(m["family"], m["budget"]): m["cell"] for m in (held or {}).get("moves") or []})
    candidates = [*rows, *((held or {}).get("rows") or [])]
    envelope: dict = {f: [] for f in families}
    for (family, budget), cell in sorted(winners.items(), key=lambda kv: kv[0][1]):
        seeds = [r for r in candidates if r["cell"] == cell and r["budget"] == budget and r["val_bpc"] is not None]
        bpc = [r["val_bpc"] for r in seeds]
        first = next(r for r in seeds if not r["envelope_seed"])
        split = [r for r in seeds if r.get("train_split_bpc") is not None]  # seeds that scored the training split
        envelope[family].append({
            "budget": budget, "cell": cell, "size": first["size"], "learning_rate": first["learning_rate"],
            "batch_size": first["batch_size"], "params_trained": first["params_trained"],
            "bpc": first["val_bpc"], "bpc_mean": statistics.fmean(bpc), "bpc_sd": statistics.stdev(bpc)
            if len(bpc) > 1 else None, "seeds": [r["seed"] for r in seeds], "bpc_per_seed": bpc,
            "train_loss": first["train_loss"], "val_loss": first["val_loss"], "epochs": first["epochs"],
            "val_bpc_ci95": first.get("val_bpc_ci95"),
            "train_split_bpc": statistics.fmean(r["train_split_bpc"] for r in split) if split else None,
            "val_bpc_of_split_seeds": statistics.fmean(r["val_bpc"] for r in split) if split else None,
            "split_seeds": [r["seed"] for r in split],
            "train_flops": first["train_flops"], "steps": first["train_steps"],
            **({"held": first["held"]} if first.get("held") else {})})
    isoflop = {f: {repr(b): sorted(({"size": s, "params_trained": p, "bpc": v} for s, p, v in _best_per(
        rows, f, b, "size")), key=lambda x: x["params_trained"]) for b in budgets} for f in families}
    lr_sensitivity = {f: {repr(b): sorted(({"learning_rate": lr, "bpc": v} for lr, _, v in _best_per(
        rows, f, b, "learning_rate")), key=lambda x: x["learning_rate"]) for b in budgets} for f in families}
    comparisons = [_dated(c, envelope) for c in comparisons or []]
    fits = {}
    for family, points in envelope.items():
        fits[family] = fit_curve([p["budget"] for p in points], [p["bpc_mean"] for p in points], budgets[0]) \
            if points else {"converged": False, "reason": "no points"}
    reference = _reference(envelope)
    multipliers = _multipliers(envelope, fits, reference)
    spent = {"points": sum(1 for r in rows), "flops": sum(r["spent_flops"] for r in rows),
             "train_cpu_hours": sum(r["spent_seconds"] for r in rows) / 3600,
             "flops_if_unbranched": sum(r["train_flops"] or 0 for r in rows)}
    ran = {r["cell"] + "@" + repr(r["budget"]) for r in rows if not r["envelope_seed"]}
    plan = study.get("plan", {})
    skipped = [{"cell": c, "budget": float(b), "reason": why} for c, row in plan.items() for b, why in row.items()
               if why is not None]
    pruned = [{"cell": c, "budget": float(b)} for c, row in plan.items() for b, why in row.items()
              if why is None and f"{c}@{b}" not in ran]
    return {"study": study["study"], "budgets": budgets, "families": families, "grid": study["grid"],
            "settings": study["settings"], "data_source": sources[0] if sources else None,
            "corpus": corpora[0] if corpora else None, "comparisons": comparisons or [],
            "curve": "bits/char = E + A * (C / C0) ** -alpha over the envelope's points",
            "envelope": envelope, "fits": fits, "n_opt": {f: {repr(p["budget"]): p["params_trained"]
                                                             for p in pts} for f, pts in envelope.items()},
            "isoflop": isoflop, "lr_sensitivity": lr_sensitivity, "reference": reference,
            "compute_multiplier": multipliers, "gap_growth": _gap_growth(envelope, reference),
            "by_time": by_time(rows, families, reference),
            "gap_growth_by_class": {kind: _gap_growth(envelope, reference, of_class(kind))
                                    for kind in RESERVOIR_CLASSES},
            "grid_points": rows, "references": references,
            "controls": _against_envelope(controls, rows), **({"contexts": contexts} if contexts else {}),
            **({"edges": edges} if edges else {}), **({"held": held} if held else {}),
            "lead_budget": (study.get("stages") or {}).get("lead_budget"), "stages": study.get("stages"),
            "skipped": skipped,
            "not_run_pruned": pruned, "spent": spent, **({"planned": study["planned"]} if "planned" in study else {})}


def draw_families(report: dict, budget: float) -> list[str]:
    """The families DRAWS=True asks of at ``budget``: the best of each reservoir class there, and the reference."""
    best = [next((family for b, family, _, _ in best_reservoirs(report["envelope"], report["reference"],
                                                                of_class(kind)) if b == budget), None)
            for kind in RESERVOIR_CLASSES]
    return [f for f in (*best, report["reference"]) if f is not None]


def best_reservoirs(envelope: dict, reference: str | None, families: list[str] | None = None
                    ) -> list[tuple[float, str, dict, dict]]:
    """(budget, the best reservoir family there, its envelope point, the reference's) at each budget both reached,
    smallest budget first (a tie goes to the family named first alphabetically); of ``families`` (None: every
    reservoir family, of either class)."""
    by = {f: {p["budget"]: p for p in points} for f, points in envelope.items()}
    rows = []
    for budget, ref in sorted(by.get(reference, {}).items()):
        present = [f for f in (RESERVOIR_FAMILIES if families is None else families) if budget in by.get(f, {})]
        if present:
            best = min(present, key=lambda f: (by[f][budget]["bpc_mean"], f))
            rows.append((budget, best, by[best][budget], ref))
    return rows


def _gap_growth(envelope: dict, reference: str | None, families: list[str] | None = None) -> dict | None:
    """The best reservoir family's gap to the reference at each budget both reached, and its slope against
    compute with a bootstrap interval over seeds (curves.gap_slope): does the gap grow with compute? Of
    ``families`` (None: either class)."""
    rows = best_reservoirs(envelope, reference, families)
    slope = gap_slope([(budget, best["bpc_per_seed"], ref["bpc_per_seed"]) for budget, _, best, ref in rows])
    if slope is None:
        return None
    return {"reference": reference, "budgets": [r[0] for r in rows], "families": [r[1] for r in rows], **slope}


def _against_envelope(controls: list[dict], rows: list[dict]) -> list[dict]:
    """Each control row with the point it controls: the same cell, budget and seed, unchanged."""
    points = {(r["cell"], r["budget"], r["seed"]): r for r in rows}
    out = []
    for c in controls:
        point = points.get((c["cell"], c["budget"], c["seed"]))
        out.append({**c, "envelope_bpc": point["val_bpc"] if point else None,
                    "envelope_params_trained": point["params_trained"] if point else None,
                    "difference": c["val_bpc"] - point["val_bpc"] if point and None not in (
                        c["val_bpc"], point["val_bpc"]) else None})
    return out


def _best_per(rows, family, budget, key):
    """(value of ``key``, params, best bits/char over the other grid axes) for one family and budget."""
    best: dict = {}
    for r in rows:
        if r["family"] == family and r["budget"] == budget and not r["envelope_seed"] and r["val_bpc"] is not None:
            if r[key] not in best or r["val_bpc"] < best[r[key]][1]:
                best[r[key]] = (r["params_trained"], r["val_bpc"])
    return [(k, p, v) for k, (p, v) in best.items()]


def _reference(envelope: dict) -> str | None:
    """The transformer recipe whose envelope is lower (at the most budgets both reached): 'the transformer'."""
    present = [f for f in REFERENCE_FAMILIES if envelope.get(f)]
    if len(present) < 2:
        return present[0] if present else None
    a, b = ({p["budget"]: p["bpc_mean"] for p in envelope[f]} for f in present)
    shared = set(a) & set(b)
    wins = sum(a[x] < b[x] for x in shared)
    return present[0] if wins * 2 >= len(shared) else present[1]


def _multipliers(envelope: dict, fits: dict, reference: str | None) -> dict:
    """Per family and budget: the FLOPs the reference's envelope needs to reach the family's envelope loss,
    over the budget (> 1: the family is worth more compute than the transformer). Interpolated between the
    reference's points; from its fitted curve outside them (marked extrapolated); None where neither reaches."""
    if reference is None:
        return {}
    ref_points = [(p["budget"], p["bpc_mean"]) for p in envelope[reference]]
    fit = fits.get(reference, {})
    out = {}
    for family, points in envelope.items():
        rows = []
        for p in points:
            needed, how = interpolated_compute(ref_points, p["bpc_mean"]), "interpolated"
            if needed is None and compute_on_curve(fit, p["bpc_mean"]) is not None:
                needed, how = compute_on_curve(fit, p["bpc_mean"]), "extrapolated"
            if needed is None and ref_points:  # past the reference's measured range: a bound, not a value
                if p["bpc_mean"] < min(loss for _, loss in ref_points):
                    needed, how = max(c for c, _ in ref_points), "at least"
                else:
                    needed, how = min(c for c, _ in ref_points), "at most"
            rows.append({"budget": p["budget"], "bpc": p["bpc_mean"], "reference_flops": needed,
                         "multiplier": needed / p["budget"] if needed else None, "how": how})
        out[family] = rows
    return out


# the reservoir's settings an ESN point draws with, and their names in a report
ESN_KNOBS = {"spectral_radius": "spectral radius", "leak_rate": "leak rate", "input_scaling": "input scaling",
             "degree": "connections a unit"}


def esn_families(families: list[str]) -> list[str]:
    """The study families that are echo state networks (``esn+softmax``, ``esn+mlp``)."""
    return [f for f in families if STUDY_FAMILIES.get(f, (f,))[0] == "esn"]


def esn_reservoirs(records: PointRecords, rows: list[dict]) -> dict[str, dict]:
    """Each ESN family's reservoir (spectral radius, leak rate, input scaling, degree), as its first point's record
    gives it: the grid walks their units, rate and batch, never these. Empty: no ESN family."""
    drawn = {}
    for row in rows:
        if esn_families([row["family"]]) and not row["envelope_seed"] and row["family"] not in drawn:
            path = records.path / row["cell"] / point_name(row["budget"])
            block = records.config(path)["requested_config"].get("ESN") or {}
            drawn[row["family"]] = {knob: value for knob, value in block.items() if knob in ESN_KNOBS}
    return drawn


def report_from_records(folder: Path) -> dict:
    """A study's report from its committed records alone (no checkpoints needed)."""
    folder = Path(folder)
    if not (folder / STUDY_FILE).exists():
        raise FrontierError(f"{folder} holds no {STUDY_FILE}: not a frontier study folder (REPORT=results/<study>)")
    study = read_study_file(folder)
    records = PointRecords(folder)
    check_records_file(study, records)
    try:
        return study_report(folder, study, collect_records(records, study["cells"], study_budgets(study)), records)
    except ResultsError:
        raise
    except (KeyError, TypeError) as e:
        raise FrontierError(f"{folder / STUDY_FILE} is damaged ({e}); re-run the study's command") from None


def study_report(folder: Path, study: dict, rows: list[dict], records: PointRecords, views: bool = True) -> dict:
    """The report of the study whose file is ``study``, from its point rows and records: what REPORT rebuilds
    and what a study writes when it ends are one report, generation cost (measured apart) and all. ``views``
    False leaves out the draws' split and the element-wise view, which no stage reads (a study builds its report
    for its stages several times a command)."""
    parts = (rows, study, collect_references(records), collect_comparisons(folder),
             collect_controls(records, study["cells"], study["budgets"]))
    stages = {"contexts": context_table(folder, records), "edges": edges_report(study, rows, records)}
    grid = build_frontier(*parts, stages)  # the grid's envelope: what the stages start from (the grid's cells)
    if not views:
        return grid
    held = held_report(study, rows, records)
    report = grid
    if held:  # the envelope takes the held settings' steps that held; the comparisons and draws stay the grid's
        report = {**build_frontier(*parts, {**stages, "held": held}), "comparisons": grid["comparisons"]}
    if (study.get("stages") or {}).get("draws"):
        top = max(study["budgets"])
        report["draws"] = {"budget": top, "families": draws_report(records, grid, collect_draws(
            records, study["cells"], [top]), top, draw_families(grid, top))}
    reservoirs = esn_reservoirs(records, rows)
    if reservoirs:
        report["esn_reservoirs"] = reservoirs
    counts = read_counts(folder)
    if counts:
        report["elementwise"] = elementwise_view(rows, counts, grid)
    generation = read_generation(folder)
    return {**report, "generation": generation} if generation else report
