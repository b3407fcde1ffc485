"""COMPILE=True against eager, per family, at a study cell's shape on the CPU (one thread): training tokens/s
after warm-up, the compile's seconds from an empty cache and from a warm one (torch's cache on disk, as a
study's next point of the same shape finds it), recompilations after warm-up, and the bits/char both ways.
From these: the training tokens after which a compile has paid for itself, against the tokens a point of
the committed TinyStories grid trains at its first two budgets.

    python bench/bench_compiled.py                          # every gradient-trained family, xs, batch 8
    python bench/bench_compiled.py --families lstm transformer++ --size s --steps 600 --out bench/compiled.json
    python bench/bench_compiled.py --evaluation             # a fit's final evaluation, eager and compiled

``--evaluation`` times the final evaluation of a point (FINAL_EVAL_TOKENS of validation, stream mode) of each
family's cell, untrained, in this process: eager, then compiled (its first call compiles; the second is timed).

Each run is its own process (TinyStories.py), so a cold compile is cold. Numbers go to bench/README.md and
docs/hardware.md; nothing here is asserted.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

FAMILIES = ["transformer", "transformer++", "lstm", "frozen_retention", "reservoir_attention",
            "deep_linear_reservoir", "linear_reservoir"]
FIRST_BUDGETS = (5e11, 1.25e12)  # the committed TinyStories grid's first two budgets (FLOPs a point)


def train(cell_settings: list[str], steps: int, compiled: bool, where: Path, name: str, cache: Path) -> dict:
    data = ["DATASET=data/tinystories"] if (ROOT / "data" / "tinystories").exists() else ["DATASET=synthetic"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TORCHINDUCTOR_CACHE_DIR": str(cache)}
    subprocess.run([sys.executable, str(ROOT / "TinyStories.py"), *cell_settings, *data, f"MAX_STEPS={steps}",
                    "FLOP_BUDGET=None", "EVAL_POINTS=1", "FINAL_EVAL_TOKENS=16384", "TRAIN_EVAL_TOKENS=None",
                    "CHECKPOINT_EVERY=0", "CHECKPOINT_EVERY_S=0", "PLOTS=False", "SAMPLE_TOKENS=0",
                    f"COMPILE={compiled}", f"RESULTS_DIR={where}", f"CACHE_DIR={where / 'cache'}", f"RUN_NAME={name}"],
                   capture_output=True, text=True, env=env, check=True, cwd=ROOT)
    from reservoir.run.records import steady_rate

    record = json.loads((where / name / "summary.json").read_text())[0]
    fit = record["fit"]
    return {"tokens_per_second": steady_rate(record), "compile_seconds": fit["compile_seconds"],
            "val_bpc": record["val_bpc"], "compiled": fit.get("compiled", False), "recompiles": fit.get("recompiles"),
            "compile_failed": fit.get("compile_failed"), "flops_per_token": record["flops_per_token"]}


def measure(families: list[str], size: str, batch: int, steps: int) -> list[dict]:
    from reservoir.config import default_config
    from reservoir.studies.frontier.grid import FAMILIES as GRID
    from reservoir.studies.frontier.grid import Cell

    defaults, rows = default_config(), []
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(tmp)
        for family in families:
            model = GRID[family][0]
            cell = Cell(family, size, defaults[model.upper()]["learning_rate"], batch)
            cache = where / f"inductor-{family}"  # empty: the first compile is cold, the second finds it
            eager = train(cell.settings(), steps, False, where, f"{family}-eager", cache)
            cold = train(cell.settings(), steps, True, where, f"{family}-cold", cache)
            warm = train(cell.settings(), steps, True, where, f"{family}-warm", cache)
            saved_per_token = 1 / eager["tokens_per_second"] - 1 / warm["tokens_per_second"]
            break_even = warm["compile_seconds"] / saved_per_token if saved_per_token > 0 else None
            row = {"family": family, "cell": cell.name, "steps": steps, "eager": eager, "cold": cold, "warm": warm,
                   "speedup": warm["tokens_per_second"] / eager["tokens_per_second"],
                   "bpc_difference": abs(warm["val_bpc"] - eager["val_bpc"]), "break_even_tokens": break_even,
                   "budget_tokens": {f"{b:g}": b / eager["flops_per_token"] for b in FIRST_BUDGETS}}
            rows.append(row)
            print(markdown([row]).splitlines()[-1], flush=True)
    return rows


def evaluated_cell(family: str, size: str, batch: int, tokens: int, cache: str):
    """(cell, config, data, device info, untrained model) of ``family``'s cell at ``size`` and ``batch``, its final
    evaluation on ``tokens`` of TinyStories' validation slice (the synthetic corpus without data/), on the CPU."""
    from reservoir.config import default_config, parse_overrides
    from reservoir.data.tokens import prepare_data
    from reservoir.models import build_model
    from reservoir.platform import device as dev
    from reservoir.studies.frontier.grid import FAMILIES as GRID
    from reservoir.studies.frontier.grid import Cell

    model_name = GRID[family][0]
    cell = Cell(family, size, default_config()[model_name.upper()]["learning_rate"], batch)
    data_dir = ROOT / "data" / "tinystories"
    config = parse_overrides([*cell.settings(), f"DATASET={data_dir if data_dir.exists() else 'synthetic'}",
                              f"CACHE_DIR={cache}", f"FINAL_EVAL_TOKENS={tokens}"])
    data = prepare_data(config)
    info = dev.select_device({**config, "DEVICE": "cpu", "USE_TPU": False})
    return cell, config, data, info, build_model(model_name, data.tokenizer.vocab_size, config)


def measure_evaluation(families: list[str], size: str, batch: int, tokens: int) -> list[dict]:
    import time

    import torch

    from reservoir.run.evaluation import Evaluator

    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for family in families:
            cell, config, data, info, model = evaluated_cell(family, size, batch, tokens, tmp)
            row = {"family": family, "cell": cell.name, "tokens": tokens}
            for compiled in (False, True):
                evaluate = Evaluator(data, {**config, "COMPILE": compiled}, config["BATCH_SIZE"], tokens)
                started = time.perf_counter()
                first = evaluate(model, info, info.device)
                first_seconds = time.perf_counter() - started
                started = time.perf_counter()
                evaluate(model, info, info.device)
                seconds = time.perf_counter() - started
                row["compiled" if compiled else "eager"] = {"seconds": seconds, "first_seconds": first_seconds,
                                                            "val_bpc": first["val_bpc"]}
                if compiled:
                    row["report"] = evaluate.calls.report()
            row["speedup"] = row["eager"]["seconds"] / row["compiled"]["seconds"]
            rows.append(row)
            print(evaluation_markdown([row]).splitlines()[-1], flush=True)
    return rows


def evaluation_markdown(rows: list[dict]) -> str:
    lines = ["| family (cell) | eager s | compiled s | x | first compiled call s | graphs | Δ bits/char |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        difference = abs(r["compiled"]["val_bpc"] - r["eager"]["val_bpc"])
        lines.append(f"| {r['family']} ({r['cell']}) | {r['eager']['seconds']:.2f} | {r['compiled']['seconds']:.2f} | "
                     f"{r['speedup']:.2f} | {r['compiled']['first_seconds']:.1f} | {r['report'].get('eval_graphs')} | "
                     f"{difference:.1e} |")
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    lines = ["| family (cell) | eager tok/s | compiled tok/s | x | compile s cold / warm | recompiles | "
             "Δ bits/char | pays off after | tokens at 5e11 / 1.25e12 |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        even = "never" if r["break_even_tokens"] is None else f"{r['break_even_tokens']:,.0f} tokens"
        if r["warm"]["compile_failed"]:
            even = f"eager ({r['warm']['compile_failed']})"
        budgets = " / ".join(f"{t:,.0f}" for t in r["budget_tokens"].values())
        lines.append(f"| {r['family']} ({r['cell']}) | {r['eager']['tokens_per_second']:,.0f} | "
                     f"{r['warm']['tokens_per_second']:,.0f} | {r['speedup']:.2f} | "
                     f"{r['cold']['compile_seconds']:.1f} / {r['warm']['compile_seconds']:.1f} | "
                     f"{r['warm']['recompiles']} | {r['bpc_difference']:.1e} | {even} | {budgets} |")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=FAMILIES)
    parser.add_argument("--size", default="xs")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--evaluation", action="store_true", help="time a final evaluation instead (see above)")
    parser.add_argument("--tokens", type=int, default=131072, help="--evaluation: the tokens it scores")
    args = parser.parse_args(argv)
    if args.evaluation:
        rows = measure_evaluation(args.families, args.size, args.batch, args.tokens)
        print(evaluation_markdown(rows))
    else:
        rows = measure(args.families, args.size, args.batch, args.steps)
        print(markdown(rows))
    if args.out:  # every run's numbers, beside the table's
        args.out.write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
