"""A point's final evaluation with its windows twin (stream mode: what every frontier point records as
``val_bpc`` and ``windows_val_bpc``), read as two passes, the overlapping windows and then the twin's own,
against one pass that gives both (``Evaluator.score_with_windows``), per family, one thread, untrained
models (the time does not depend on the weights), the two ways interleaved and the median of the repeats.

    python bench/bench_final_evaluation.py                              # the grid's windowed families, xs
    python bench/bench_final_evaluation.py --families transformer++ --size l --repeats 5

Both ways must give the same numbers: the table says whether they did. Numbers go to bench/README.md;
nothing here is asserted.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.bench_compiled import evaluated_cell  # noqa: E402

FAMILIES = ["transformer++", "frozen_retention", "reservoir_attention", "frozen_retention+write"]


def measure(family: str, size: str, batch: int, tokens: int, repeats: int) -> dict:
    import torch

    from reservoir.run.evaluation import Evaluations

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        cell, config, data, info, model = evaluated_cell(family, size, batch, tokens, tmp)
        evaluations = Evaluations.for_run(data, {**config, "TRAIN_EVAL_TOKENS": None})
        if not evaluations.final.covers_windows_of(evaluations.final_windows, model):
            raise SystemExit(f"{family}: its final evaluation is not read as windows (a recurrent model)")
        two, one, same = [], [], True
        for _ in range(repeats):
            started = time.perf_counter()
            stream = evaluations.final(model, info, info.device, keep=True)
            windows = evaluations.final_windows(model, info, info.device, keep=True)
            two.append(time.perf_counter() - started)
            started = time.perf_counter()
            both = evaluations.score_final(model, info, info.device)
            one.append(time.perf_counter() - started)
            same &= (both["val_bpc"], both["windows_val_bpc"], both["windows_val_bpc_ci95"]) == \
                (stream["val_bpc"], windows["val_bpc"], windows["val_bpc_ci95"])
    return {"family": family, "cell": cell.name, "tokens": tokens, "two_passes_s": statistics.median(two),
            "one_pass_s": statistics.median(one), "same_numbers": same}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", nargs="+", default=FAMILIES)
    parser.add_argument("--size", default="xs")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=131072, help="the final evaluation's tokens")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    print("| family (cell) | two passes s | one pass s | x | same numbers |\n| --- | --- | --- | --- | --- |")
    for family in args.families:
        r = measure(family, args.size, args.batch, args.tokens, args.repeats)
        print(f"| {r['family']} ({r['cell']}) | {r['two_passes_s']:.2f} | {r['one_pass_s']:.2f} | "
              f"{r['two_passes_s'] / r['one_pass_s']:.2f} | {'yes' if r['same_numbers'] else 'no'} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
