"""XLA compile time per model at two sequence lengths, through the real training loop.

    PJRT_DEVICE=CPU .venv-xla/bin/python bench/bench_compile.py [--seq-lens 128 512] [--models lstm ...]

Runs tests/xla_probe.py --full-size (default model sizes) in a fresh process per model and
length, and prints XLA's CompileTime for the warm-up fit (every graph: training steps,
evaluation, checkpoint transfer), the graphs compiled, and the growth from the first length
to the last. Numbers go to bench/README.md; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODELS = ["transformer", "lstm", "linear_reservoir", "deep_linear_reservoir", "esn", "deep_esn", "nvar", "ngram"]


def probe(model: str, seq_len: int) -> dict:
    proc = subprocess.run([sys.executable, "tests/xla_probe.py", model, "--seq-len", str(seq_len), "--full-size"],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, "PJRT_DEVICE": "CPU"})
    if proc.returncode:
        raise SystemExit(f"probe {model} at {seq_len} failed:\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seq-lens", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--models", nargs="+", default=MODELS)
    args = parser.parse_args()
    lens = args.seq_lens
    print("| model | " + " | ".join(f"compile s at {n}" for n in lens) + f" | growth {lens[0]}->{lens[-1]} | graphs |")
    print("| --- |" + " --- |" * (len(lens) + 2))
    for model in args.models:
        results = [probe(model, n) for n in lens]
        first, last = results[0]["compile_seconds"], results[-1]["compile_seconds"]
        growth = f"{last / first:.2f}x" if first else "-"
        print(f"| {model} | " + " | ".join(f"{r['compile_seconds']:.1f}" for r in results)
              + f" | {growth} | {results[0]['warmup_compiles']} |", flush=True)


if __name__ == "__main__":
    main()
