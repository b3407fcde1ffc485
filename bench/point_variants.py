"""Recorded frontier points trained again here under variants of one setting, side by side: which step of Adam's
β2 HELD=True walks (``beta2``: a fixed 0.99, or β2 held per token, ADAM_BETA2_REF_TOKENS: 0.95 at the grid's largest
batch and higher at smaller ones, Porian et al. 2024's finding), or which BPE vocabulary a subword study uses
(``vocab``: the study's characters, and BPE at 512, 1,024 and 2,048 tokens). Each point on the study's first seed,
from step 0, one thread, one run after another; bits/char printed and written to <OUT>/variants.json. Run from the
repository root:

    python bench/point_variants.py beta2 results/frontier-tinystories transformer++-xs-lr0.003-b4@1.25e12 ...

KEY=VALUE settings after the points follow the study's (DATASET or DATA_DIR where this machine keeps the data). The
runs go to a temporary folder (or OUT=<folder> in the environment); nothing under the study is touched.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.reproduce_point import train_point  # noqa: E402
from reservoir.platform.machine import processor  # noqa: E402
from reservoir.studies.frontier.edges import parse_cell  # noqa: E402
from reservoir.studies.frontier.records import read_study_file  # noqa: E402


def variants(kind: str, study: dict) -> dict[str, list[str]]:
    """The settings each variant of ``kind`` adds to the study's; the first is the study's own."""
    if kind == "vocab":
        return {"char": [], **{f"bpe {v}": ["TOKENIZER=bpe", f"VOCAB_SIZE={v}"] for v in (512, 1024, 2048)}}
    largest = max(study["grid"]["BATCH_SIZES"])
    seq = next((int(a.partition("=")[2]) for a in study["settings"] if a.startswith("SEQ_LEN=")), 128)
    return {"β2 0.95 (held)": [], "β2 0.99": ["ADAM_BETA2=0.99"],
            f"β2 0.95 per {largest * seq} tokens": [f"ADAM_BETA2_REF_TOKENS={largest * seq}"]}


KINDS = ("beta2", "vocab")


def main(argv: list[str]) -> int:
    points = [a for a in argv[2:] if "@" in a]
    if len(argv) < 3 or argv[0] not in KINDS or not points:
        sys.exit(__doc__)
    kind, settings = argv[0], [a for a in argv[2:] if "@" not in a]
    study = read_study_file(Path(argv[1]))
    where = Path(os.environ.get("OUT") or tempfile.mkdtemp(prefix="variants-"))
    names, rows, cells = list(variants(kind, study)), [], []
    for point in points:  # every point checked before the first run
        name, _, budget = point.partition("@")
        if parse_cell(name) is None:
            sys.exit(f"error: {name} is not a cell name (<family>-<size>-lr<rate>-b<batch>@<FLOPs>)")
        try:
            cells.append((name, parse_cell(name), float(budget)))
        except ValueError:
            sys.exit(f"error: {point}: the budget after @ must be a number of FLOPs, e.g. {name}@1.25e12")
    for name, cell, budget in cells:
        row = {"cell": name, "budget": budget}
        for k, (variant, extra) in enumerate(variants(kind, study).items()):
            row[variant] = train_point(study, cell, budget, [*settings, *extra, f"SEED={study['seed']}"],
                                       where / f"{name}-{budget:g}-{kind}{k}", f"{name} with {variant}")
            print(f"{name} at {budget:g} FLOPs, {variant}: {row[variant]:.4f} bits/char", flush=True)
        rows.append(row)
    print(f"\nOn {processor()}, seed {study['seed']}, from step 0 (runs in {where})\n")
    print(f"| point | budget | {' | '.join(names)} |\n|{' --- |' * (2 + len(names))}")
    for r in rows:
        print(f"| {r['cell']} | {r['budget']:.3g} | " + " | ".join(f"{r[n]:.4f}" for n in names) + " |")
    (where / "variants.json").write_text(json.dumps({"kind": kind, "processor": processor(), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
