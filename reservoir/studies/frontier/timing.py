"""The frontier by training time: each family's lower envelope against the seconds its points trained (one CPU thread
each, as every grid point records ``train_seconds``), and the best of each reservoir class against the reference at
matched time.

Time measures this implementation on one processor, not the models: a kernel that is slow on this machine, or a
machine busy beside a run, moves it. So points are never pooled across processors: each processor a record names is
a view of its own (records written before they named one form one more, "not recorded"), and each view says how
many of its points trained while the machine was oversubscribed (their step times run about 1.5x slower).

At matched time the envelope is read as a step: the best bits/char any of the family's points reached within the
reference point's seconds, so no curve is fitted through times that scatter with the load. A class none of whose
points on that processor trained as long as the reference point is not compared there (``beyond``): its longer
points trained elsewhere, and what it reaches in that time is not measured on this processor.
"""

from __future__ import annotations

from reservoir.studies.curves import lower_front
from reservoir.studies.frontier.grid import RESERVOIR_CLASSES, of_class

NOT_RECORDED = "not recorded"  # the processor of records written before records named theirs


def time_envelope(rows: list[dict]) -> list[dict]:
    """The points of ``rows`` (one family's, first seeds) that no faster point beats, fastest first."""
    return [{"seconds": r["train_seconds"], "bpc": r["val_bpc"], "cell": r["cell"], "budget": r["budget"],
             "oversubscribed": r.get("oversubscribed")}
            for r in lower_front(rows, lambda r: r["train_seconds"], lambda r: r["val_bpc"])]


def best_within(front: list[dict], seconds: float) -> dict | None:
    """The envelope's best point trained within ``seconds`` (None: none was that fast)."""
    within = [p for p in front if p["seconds"] <= seconds]
    return within[-1] if within else None


def _timed(rows: list[dict]) -> list[dict]:
    return [r for r in rows if not r["envelope_seed"] and r["val_bpc"] is not None and r.get("train_seconds")]


def by_time(rows: list[dict], families: list[str], reference: str | None) -> dict:
    """frontier.json's ``by_time``: per processor its points (how many oversubscribed), each family's time envelope
    and, at each of the reference's envelope points, the best of each reservoir class trained within its seconds
    (None: none of the class trained that fast; ``{"beyond": s}``: its longest point here trained s seconds, fewer)."""
    timed, classes = _timed(rows), {kind: of_class(kind) for kind in RESERVOIR_CLASSES}
    views = {}
    for processor in sorted({r.get("processor") or NOT_RECORDED for r in timed}):
        here = [r for r in timed if (r.get("processor") or NOT_RECORDED) == processor]
        envelopes = {f: time_envelope([r for r in here if r["family"] == f]) for f in families}
        envelopes = {f: front for f, front in envelopes.items() if front}
        longest = {kind: max((r["train_seconds"] for r in here if r["family"] in members), default=0.0)
                   for kind, members in classes.items()}
        matched = []
        for ref in envelopes.get(reference, []):
            row = {"seconds": ref["seconds"], "reference_bpc": ref["bpc"], "reference_cell": ref["cell"],
                   "classes": {}}
            for kind in RESERVOIR_CLASSES:
                if longest[kind] and longest[kind] < ref["seconds"]:
                    row["classes"][kind] = {"beyond": longest[kind]}
                    continue
                best = min(((p, f) for f in classes[kind] if f in envelopes
                            for p in [best_within(envelopes[f], ref["seconds"])] if p is not None),
                           key=lambda pf: (pf[0]["bpc"], pf[1]), default=None)
                row["classes"][kind] = None if best is None else {
                    "family": best[1], "bpc": best[0]["bpc"], "cell": best[0]["cell"], "seconds": best[0]["seconds"],
                    "gap": best[0]["bpc"] / ref["bpc"] - 1}
            matched.append(row)
        views[processor] = {"points": len(here), "oversubscribed": sum(1 for r in here if r.get("oversubscribed")),
                            "hours": sum(r["train_seconds"] for r in here) / 3600,
                            "families": {f: sum(1 for r in here if r["family"] == f) for f in families
                                         if any(r["family"] == f for r in here)},
                            "envelopes": envelopes, "matched": matched}
    return {"reference": reference, "clock": "train_seconds: the training loop's seconds on one CPU thread "
            "(evaluation and compilation not counted)", "processors": views}
