"""A run alone and beside other work: how much a busy machine costs it, at each thread count.

    python bench/bench_busy.py --threads 1 2 -- DATASET=data/tinystories        # the default run
    python bench/bench_busy.py --threads 1 2 -- MODELS=transformer DATASET=synthetic MAX_STEPS=6000 \\
        FLOP_BUDGET=None EVAL_POINTS=1 SAMPLE_TOKENS=0 PLOTS=False               # one model, quicker

For each thread count (OMP_NUM_THREADS) it times ``python TinyStories.py ARGS`` twice: alone, then beside one
background job that keeps two threads busy with matrix products (another user's training, a build), and prints
the wall seconds of both, their ratio, each model's training seconds, and whether the table (every model's
bits/char, in its order) is the same both times. Nothing else should run on the machine meanwhile.
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
BUSY = ("import torch\ntorch.set_num_threads(2)\na = torch.randn(512, 512)\n"
        "while True:\n    a = torch.tanh(a @ a * 1e-3)\n")  # two threads that never wait for anything


def timed_run(args: list[str], threads: int, out: Path, name: str) -> tuple[float, list[dict]]:
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    started = time.perf_counter()
    subprocess.run([sys.executable, str(ROOT / "TinyStories.py"), *args, f"RESULTS_DIR={out}", f"RUN_NAME={name}",
                    f"CACHE_DIR={out / 'cache'}"], cwd=ROOT, env=env, check=True, stdout=subprocess.DEVNULL)
    seconds = time.perf_counter() - started
    return seconds, json.loads((out / name / "summary.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("args", nargs="*", help="TinyStories.py's settings (after --)")
    options = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        out = Path(folder)
        for threads in options.threads:
            alone, quiet = timed_run(options.args, threads, out, f"alone-{threads}")
            busy = subprocess.Popen([sys.executable, "-c", BUSY])
            try:
                time.sleep(2)  # its threads are running before the run starts
                beside, loaded = timed_run(options.args, threads, out, f"beside-{threads}")
            finally:
                busy.kill()
                busy.wait()
            table = [(r["model"], r["val_bpc"]) for r in sorted(quiet, key=lambda r: r["val_bpc"] or 9e9)]
            same = table == [(r["model"], r["val_bpc"]) for r in sorted(loaded, key=lambda r: r["val_bpc"] or 9e9)]
            print(f"{threads} thread(s): alone {alone:.0f} s, beside a two-thread job {beside:.0f} s "
                  f"({beside / alone:.2f}x); the same table: {same}")
            for a, b in zip(quiet, loaded, strict=True):
                print(f"    {a['model']:<24} train s {a['train_seconds']:8.1f} alone {b['train_seconds']:8.1f} beside")


if __name__ == "__main__":
    main()
