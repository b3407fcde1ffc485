"""The runner's transformer training throughput against a minimal nanoGPT-style loop of the same recipe
(bench/minimal_gpt.py: GPT-2 blocks, AdamW decaying matrices, gradients clipped at 1.0, a drawn batch a
step), eager and compiled, on the CPU: one thread each, the variants interleaved within each repeat (a
drifting machine moves them alike), the median of the repeats. "minimal bare" is the loop with nothing
but the model and the optimizer (no clipping, one fixed batch): the floor of what a step costs.

    python bench/bench_runner.py                       # the study's xs shape and the compute-bound one
    python bench/bench_runner.py --shapes xs --repeats 3 --steps 1500 --out bench/runner.json

Shapes: xs (2 x 48, batch 4, context 128: the study's smallest transformer preset, overhead-bound) and wide
(4 x 128, batch 32, context 128: compute-bound). Tokens/s count the steps after warm-up only: the runner's
step_seconds (its record), the minimal loop's steps after its 10 warm-up steps; a compiled variant's first
compile is in its warm-up and reported apart. Numbers go to bench/README.md and docs/hardware.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reservoir.run.records import steady_rate  # noqa: E402

SHAPES = {"xs": {"layers": 2, "width": 48, "heads": 4, "batch": 4, "seq": 128},
          "wide": {"layers": 4, "width": 128, "heads": 4, "batch": 32, "seq": 128}}
VARIANTS = ("minimal", "runner", "minimal compiled", "runner compiled", "minimal bare")
BARE = ["GRAD_CLIP=0", "DATA=0"]


def _one_thread() -> dict:
    return {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def minimal(shape: dict, steps: int, compiled: bool, extra: list[str]) -> dict:
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "minimal_gpt.py"), "cpu", f"SEQ_LEN={shape['seq']}",
                           f"BATCH_SIZE={shape['batch']}", f"TRANSFORMER.n_layer={shape['layers']}",
                           f"TRANSFORMER.n_embd={shape['width']}", f"TRANSFORMER.n_head={shape['heads']}",
                           f"STEPS={steps}", f"COMPILE={int(compiled)}", *extra],
                          capture_output=True, text=True, env=_one_thread(), check=True)
    line = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"tokens_per_second": line["tokens_per_second"], "warmup_seconds": line["warmup_seconds"]}


def runner(shape: dict, steps: int, compiled: bool, where: Path, checkout: Path = ROOT) -> dict:
    name = f"run-{len(list(where.glob('run-*')))}"
    subprocess.run([sys.executable, str(checkout / "TinyStories.py"), "MODELS=['transformer']",
                    "TRANSFORMER.recipe='gpt2'", f"TRANSFORMER.n_layer={shape['layers']}",
                    f"TRANSFORMER.n_embd={shape['width']}", f"TRANSFORMER.n_head={shape['heads']}",
                    f"BATCH_SIZE={shape['batch']}", f"SEQ_LEN={shape['seq']}", f"MAX_STEPS={steps}",
                    "FLOP_BUDGET=None", "EVAL_POINTS=1", "EVAL_TOKENS=4096", "FINAL_EVAL_TOKENS=4096",
                    "TRAIN_EVAL_TOKENS=None", "CHECKPOINT_EVERY=0", "CHECKPOINT_EVERY_S=0", "PLOTS=False",
                    "SAMPLE_TOKENS=0", "DATASET=synthetic", *([f"COMPILE={compiled}"] if compiled else []),
                    f"RESULTS_DIR={where}", f"CACHE_DIR={where / 'cache'}", f"RUN_NAME={name}"],
                   capture_output=True, text=True, env=_one_thread(), check=True, cwd=checkout)
    record = json.loads((where / name / "summary.json").read_text())[0]
    fit = record["fit"]
    return {"tokens_per_second": steady_rate(record),
            "warmup_seconds": fit["warmup_seconds"], "val_bpc": record["val_bpc"],
            "compiled": fit.get("compiled", False), "recompiles": fit.get("recompiles")}


def measure(shapes: list[str], steps: int, repeats: int, variants: list[str], before: Path | None = None) -> dict:
    table = {}
    with tempfile.TemporaryDirectory() as tmp:
        for shape_name in shapes:
            shape, runs = SHAPES[shape_name], {v: [] for v in variants}
            for repeat in range(repeats):
                for variant in variants:
                    compiled = variant.endswith("compiled")
                    if variant == "runner before":
                        result = runner(shape, steps, False, Path(tmp), before)
                    elif variant.startswith("runner"):
                        result = runner(shape, steps, compiled, Path(tmp))
                    else:
                        result = minimal(shape, steps, compiled, BARE if variant.endswith("bare") else [])
                    runs[variant].append(result)
                    print(f"{shape_name} repeat {repeat + 1}: {variant}: {result['tokens_per_second']:,.0f} tok/s",
                          flush=True)
            medians = {v: statistics.median(r["tokens_per_second"] for r in rs) for v, rs in runs.items()}
            ratios = {}  # each repeat's variants ran one after another: their ratio drifts less than each
            if "minimal" in runs:
                ratios = {v: statistics.median(r["tokens_per_second"] / m["tokens_per_second"]
                                               for r, m in zip(rs, runs["minimal"], strict=True))
                          for v, rs in runs.items()}
            table[shape_name] = {"shape": shape, "steps": steps, "repeats": repeats, "runs": runs,
                                 "median_tokens_per_second": medians, "median_ratio_to_minimal": ratios}
    return table


def markdown(table: dict) -> str:
    lines = ["| shape | variant | tok/s (median) | x minimal (median of the repeats' ratios) | range | "
             "warm-up s (first run) |", "| --- | --- | --- | --- | --- | --- |"]
    for shape_name, row in table.items():
        for variant, value in row["median_tokens_per_second"].items():
            ratio = row["median_ratio_to_minimal"].get(variant)
            rates = [r["tokens_per_second"] for r in row["runs"][variant]]
            lines.append(f"| {shape_name} | {variant} | {value:,.0f} | {'' if ratio is None else f'{ratio:.3f}'} | "
                         f"{min(rates):,.0f}-{max(rates):,.0f} | {row['runs'][variant][0]['warmup_seconds']:.1f} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["xs", "wide"], choices=sorted(SHAPES))
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS[:4]), choices=VARIANTS)
    parser.add_argument("--out", type=Path, help="write the runs and medians here as JSON")
    parser.add_argument("--before", type=Path, help="another checkout (git worktree add DIR COMMIT) whose runner "
                        "runs too, eager, as 'runner before'")
    args = parser.parse_args(argv)
    variants = args.variants + (["runner before"] if args.before else [])
    table = measure(args.shapes, args.steps, args.repeats, variants, args.before)
    if args.out:
        args.out.write_text(json.dumps(table, indent=2) + "\n")
    print(markdown(table))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
