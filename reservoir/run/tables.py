"""The comparison table a run prints and writes: one line per model, the mean over its seeds.
"""

from __future__ import annotations

import statistics

from reservoir.config import SHARED_CONFIG
from reservoir.models.registry import family_of
from reservoir.run.records import cut_short


def seed_groups(records: list[dict]) -> list[tuple[str, list[dict]]]:
    """Records grouped by model, in the order models first appear (one record per seed)."""
    groups: dict[str, list[dict]] = {}
    for r in records:
        groups.setdefault(r["model"], []).append(r)
    return list(groups.items())


def aggregate(group: list[dict]) -> dict:
    """One model's records over its seeds: mean of every number, ``val_bpc_sd`` across seeds (two or
    more scored seeds), the interval of a single seed, and whether any seed ran oversubscribed. One rule for
    every column: the mean over the seeds that scored, or over every seed where none did (all diverged)."""
    scored = [r for r in group if r.get("val_bpc") is not None]
    counted = scored or group
    first = group[0]
    out = {"model": first["model"], "trained": first.get("trained"), "seeds": len(group), "scored_seeds": len(scored),
           "params_total": first["params_total"], "params_trainable": first["params_trainable"],
           "oversubscribed": any((r.get("machine_load") or {}).get("oversubscribed") for r in group),
           "compile_over_budget": any(r.get("compile_over_budget") for r in group),
           "bound_by": "/".join(sorted({r["bound_by"] for r in group if r.get("bound_by")})) or None,
           "cut_at": min((r["budget_spent"] for r in group if cut_short(r)), default=None)}
    for key in ("train_seconds", "train_tokens", "train_flops", "epochs", "compile_seconds"):
        values = [r[key] for r in counted if r.get(key) is not None]
        out[key] = statistics.fmean(values) if values else None
    for key in ("val_bpc", "val_ppl", "tokens_per_second"):
        values = [r[key] for r in scored]
        out[key] = statistics.fmean(values) if values else None
    loads = [r["machine_load"] for r in counted if r.get("machine_load")]
    out["runnable_mean"] = statistics.fmean([x["runnable_mean"] for x in loads]) if loads else None
    out["cores"] = loads[0]["cores"] if loads else None
    if len(scored) > 1:
        out["val_bpc_sd"] = statistics.stdev(r["val_bpc"] for r in scored)
    out["val_bpc_ci95"] = scored[0].get("val_bpc_ci95") if len(scored) == 1 else None
    if not scored:
        out["diverged_at_step"], out["reason"] = first.get("diverged_at_step"), first.get("reason")
    out["diverged"] = [(r.get("seed"), r.get("diverged_at_step"), r.get("reason")) for r in group
                       if r.get("status") == "diverged"]
    return out


def _bound(row: dict) -> str:
    """The 'bound by' cell: the limit that ended the fits, or 'cut N%' where TIME_BUDGET_S ended one short."""
    if row.get("cut_at") is not None:
        return f"cut {100 * row['cut_at']:.0f}%"
    return row["bound_by"] or ""


def _ppl(value: float) -> str:
    """Perplexity for a table: two decimals, or a power of ten where it would run to many digits."""
    return f"{value:.2f}" if value < 1e5 else f"{value:.1e}"


def format_table(records: list[dict], config: dict | None = None) -> str:
    """The final comparison, best bits/char first, one line per model (the mean over its seeds), each named by its
    family where the run's ``config`` says which (``transformer++``: the transformer in the '++' recipe).

    ± is the standard deviation across seeds ('sd') where two or more seeds scored, or the 95% bootstrap
    interval of a single seed's final evaluation ('ci'); the seeds column says how many seeds scored of
    how many ran, and a line names every diverged seed. On XLA a column shows
    each model's warm-up compilation (not charged to the budget). '*' marks a warm-up longer than
    the whole budget, '!' a model trained while the machine was oversubscribed. 'bound by' names the
    limit that ended each fit; 'trained' what training changes (LanguageModel.trained)."""
    rows = [aggregate(group) for _, group in seed_groups(records)]
    if config:
        for r in rows:
            block = r["model"].upper()
            r["model"] = family_of(r["model"], config.get(block) or {}, SHARED_CONFIG.get(block))
    compile_column = any(r.get("device_kind") == "tpu" or r.get("compile_over_budget") for r in records)
    seeds_column = any(r["seeds"] > 1 for r in rows)
    width = max([18, *(len(r["model"]) + 2 for r in rows)])  # names line up whatever their length
    head = (f"{'model':<{width}}" + (f"{'seeds':>6}" if seeds_column else "") + f"{'val bits/char ± 95%':>21}"
            f"{'val ppl':>9}{'params (trained)':>22}{'trained':>20}{'train s':>9}{'tokens':>12}{'tok/s':>10}"
            f"{'FLOPs':>10}"
            f"{'epochs':>8}{'load':>9}{'bound by':>10}" + (f"{'compile s':>11}" if compile_column else ""))
    if seeds_column:
        head = head.replace("val bits/char ± 95%", "bits/char ± sd|ci")
    lines = [head, "-" * len(head)]
    for r in sorted(rows, key=lambda r: (r["val_bpc"] is None, r["val_bpc"] or 0.0)):
        params = f"{r['params_total']:,} ({r['params_trainable']:,})"
        seeds = f"{r['scored_seeds']}/{r['seeds']}".rjust(6) if seeds_column else ""
        if r["val_bpc"] is None:  # diverged: no number to rank
            lines.append(f"{r['model']:<{width}}{seeds}{'DIVERGED':>21}{'':>9}{params:>22}{r['trained'] or '':>20}"
                         f"{r['train_seconds']:>9.1f}"
                         f"{r['train_tokens']:>12,.0f}{'':>10}  at step {r.get('diverged_at_step')}: {r.get('reason')}")
            continue
        spread = r.get("val_bpc_sd") if r.get("val_bpc_sd") is not None else r.get("val_bpc_ci95")
        kind = (" sd" if r.get("val_bpc_sd") is not None else " ci") if seeds_column else ""
        score = f"{r['val_bpc']:.3f}" + (f" ± {spread:.3f}{kind}" if spread is not None else "")
        flops = "" if r["train_flops"] is None else f"{r['train_flops']:.2e}"
        epochs = "" if r["epochs"] is None else f"{r['epochs']:.2f}"
        load = "" if r["runnable_mean"] is None else f"{r['runnable_mean']:.1f}/{r['cores']}"
        load += "!" if r["oversubscribed"] else ""
        line = (f"{r['model']:<{width}}{seeds}{score:>21}{_ppl(r['val_ppl']):>9}{params:>22}{r['trained'] or '':>20}"
                f"{r['train_seconds']:>9.1f}"
                f"{r['train_tokens']:>12,.0f}{r['tokens_per_second']:>10,.0f}{flops:>10}{epochs:>8}{load:>9}"
                f"{_bound(r):>10}")
        if compile_column:
            seconds = r.get("compile_seconds")
            mark = "*" if r.get("compile_over_budget") else ""
            line += f"{'' if seconds is None else f'{seconds:.1f}{mark}':>11}"
        lines.append(line)
    for r in rows:
        if r["scored_seeds"] and r["diverged"]:
            lines.append(f"{r['model']}: " + "; ".join(f"seed {seed} diverged at step {step} ({reason})"
                                                      for seed, step, reason in r["diverged"])
                         + f"; its score is the mean of the {r['scored_seeds']} that finished")
    if seeds_column:
        lines.append("seeds: scored / trained; ± sd: standard deviation across the scored seeds; ± ci: the 95% "
                     "bootstrap interval of the one scored seed's final evaluation")
    if any(r["oversubscribed"] for r in rows):
        lines.append("! the machine was oversubscribed while this model trained (load: threads wanting a core / "
                     "cores): its tok/s understate it, and its score too where TIME_BUDGET_S ended its fit")
    if any(r["cut_at"] is not None for r in rows):
        lines.append("cut N%: TIME_BUDGET_S ended this fit after N% of its FLOP (token, step) budget, so it is not "
                     "compared at that budget (a busy or slower machine cuts it sooner); TIME_BUDGET_S=None trains "
                     "every fit to its budget")
    if any(r["bound_by"] for r in rows):
        lines.append("bound by: the budget that ended each fit (flops, seconds, steps, tokens), or data: a "
                     "closed-form fit's one pass over all its training data")
    if any(r.get("compile_over_budget") for r in rows):
        lines.append("* warm-up (compilation) took longer than the whole time budget; not charged to it")
    return "\n".join(lines)
