"""A micro frontier of xs points of one family on XLA:CPU (USE_TPU=True with PJRT_DEVICE=CPU: the TPU path for
real), folded K to a process (POINTS_PER_DEVICE=K) against one point a process: wall time, the graphs XLA
compiled in all (its own compilation analyses, counted), and the envelope both ways.

    PJRT_DEVICE=CPU .venv-xla/bin/python bench/bench_fold_frontier.py            # K = 4, four rates, two budgets
    PJRT_DEVICE=CPU .venv-xla/bin/python bench/bench_fold_frontier.py --family reservoir_attention+write

Prints one table (numbers go to bench/README.md). One worker, one thread: the two studies differ only in
POINTS_PER_DEVICE.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STUDY = ["FRONTIER=True", "STUDY=fold", "USE_TPU=True", "SIZES=xs",
         "LEARNING_RATES=1e-3,2e-3,4e-3,8e-3", "BATCH_SIZES=4", "BUDGETS=3e9,6e9", "MIN_STEPS=20",
         "MAX_TOKENS_PER_PARAM=1e9", "ENVELOPE_SEEDS=1", "KEEP=4", "WITHIN=0", "WORKERS=1", "DATASET=synthetic",
         "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "EVAL_TOKENS=1024", "FINAL_EVAL_TOKENS=2048", "SAMPLE_TOKENS=8",
         "WARMUP_STEPS=5"]


def study(folder: Path, k: int, family: str) -> dict:
    env = {**os.environ, "PJRT_DEVICE": "CPU", "PT_XLA_DEBUG_LEVEL": "1", "OMP_NUM_THREADS": "1"}
    began = time.perf_counter()
    proc = subprocess.run([sys.executable, str(ROOT / "scaling.py"), *STUDY, f"FAMILIES={family}",
                           f"POINTS_PER_DEVICE={k}", f"RESULTS_DIR={folder / 'results'}",
                           f"CACHE_DIR={folder / 'cache'}"], cwd=ROOT,
                          capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - began
    if proc.returncode != 0:
        raise SystemExit(f"the study with POINTS_PER_DEVICE={k} failed:\n{proc.stderr[-3000:]}")
    report = json.loads((folder / "results" / "fold" / "frontier.json").read_text())
    output = proc.stdout + proc.stderr
    return {"seconds": seconds, "compiles": output.count("Compilation Cause"),
            "points": len(report["grid_points"]), "envelope": report["envelope"][family]}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--k", type=int, default=4, help="points folded to a process")
    parser.add_argument("--family", default="transformer++", help="a family that folds (docs/hardware.md)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        one = study(Path(tmp) / "one", 1, args.family)
        folded = study(Path(tmp) / "folded", args.k, args.family)
    print("| points a process | grid points | wall s | graphs compiled | envelope bits/char (3e9, 6e9) |\n"
          "| --- | --- | --- | --- | --- |")
    for k, r in ((1, one), (args.k, folded)):
        bpc = ", ".join(f"{p['bpc']:.4f}" for p in r["envelope"])
        print(f"| {k} | {r['points']} | {r['seconds']:.0f} | {r['compiles']} | {bpc} |")
    worst = max(abs(a["bpc"] - b["bpc"]) / b["bpc"] for a, b in zip(folded["envelope"], one["envelope"], strict=True))
    print(f"\ncompiled {one['compiles'] / max(1, folded['compiles']):.1f}x fewer graphs, "
          f"{one['seconds'] / folded['seconds']:.2f}x the speed; the envelopes differ by {worst:.1e} at most "
          "(relative)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
