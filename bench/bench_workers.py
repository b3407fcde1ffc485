"""One two-thread point or two one-thread points at once: training tokens/s on this machine.

    python bench/bench_workers.py [--steps 150] [--out bench/out/workers]

For each model and grid size (reservoir/studies/frontier/grid.py's presets) it trains the same point (batch 8 x 128
tokens, the synthetic corpus, wsd, a fixed number of steps) twice: once alone with two threads, then as
two copies at once with one thread each, and prints the training tokens/s each way (evaluation and
start-up excluded: the runs' own tokens_per_second). Two at once wins when the sum of the two copies
beats the lone two-thread run: that is what a frontier study's WORKERS=2 buys.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reservoir.studies.frontier.grid import Cell  # noqa: E402

CASES = [("transformer", "xs"), ("transformer", "l"), ("transformer++", "m"), ("frozen_retention", "m"),
         ("linear_reservoir", "m"), ("lstm", "m")]


def start(cell: Cell, steps: int, out: Path, name: str, threads: int) -> subprocess.Popen:
    args = [*cell.settings(), "DATASET=synthetic", "SEQ_LEN=128", f"MAX_STEPS={steps}", "TIME_BUDGET_S=None",
            "FLOP_BUDGET=None", "EVAL_POINTS=1", "FINAL_EVAL_TOKENS=2048", "EVAL_TOKENS=2048", "SAMPLE_TOKENS=1",
            "PLOTS=False", "CHECKPOINT_EVERY=0", "CHECKPOINT_EVERY_S=0", "LR_SCHEDULE=wsd", "WARMUP_STEPS=10",
            f"RESULTS_DIR={out}", f"RUN_NAME={name}", f"CACHE_DIR={out / 'cache'}"]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    return subprocess.Popen([sys.executable, str(ROOT / "TinyStories.py"), *args], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def speed(proc: subprocess.Popen, out: Path, name: str) -> float:
    _, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"error: the run {name} failed: {err.strip().splitlines()[-1] if err.strip() else ''}")
    return json.loads((out / name / "summary.json").read_text())[0]["tokens_per_second"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--out", type=Path, default=ROOT / "bench" / "out" / "workers")
    opts = parser.parse_args()
    opts.out.mkdir(parents=True, exist_ok=True)
    print(f"{'model':<18}{'size':<6}{'1 x 2 threads':>16}{'2 x 1 thread (sum)':>22}{'each':>10}{'gain':>8}")
    for k, (family, size) in enumerate(CASES):
        cell = Cell(family, size, 3e-3, 8)
        alone = speed(start(cell, opts.steps, opts.out, f"{k}-alone", 2), opts.out, f"{k}-alone")
        pair = [start(cell, opts.steps, opts.out, f"{k}-pair{j}", 1) for j in range(2)]
        speeds = [speed(p, opts.out, f"{k}-pair{j}") for j, p in enumerate(pair)]
        total = sum(speeds)
        print(f"{family:<18}{size:<6}{alone:>16,.0f}{total:>22,.0f}{total / 2:>10,.0f}{total / alone:>7.2f}x",
              flush=True)


if __name__ == "__main__":
    main()
