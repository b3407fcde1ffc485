"""K same-shape models trained in lockstep in one process against K steps of one model, on the CPU with one
thread: whether packing a study's points into one process's kernels would fill a core better than a point per
core does. Two ways to pack:

- torch.func: stack_module_state, vmap over functional_call and grad (any model; vmap batches what it can);
- folded: reservoir/run/fold.py, weights with a leading K axis and the K batches as one of K x batch rows,
  each Linear a batched matrix product, each Embedding and norm indexed by member, each member its own AdamW
  rate and gradient clip (``--folded``; a family that folds, such as Transformer++).

    python bench/bench_lockstep.py                      # transformer++ and lstm at xs, K = 4, batch 8
    python bench/bench_lockstep.py --models transformer frozen_retention --packed 2 4 8
    python bench/bench_lockstep.py --folded --models transformer++ --batch 4 --packed 2 4 8
    python bench/bench_lockstep.py --folded --batch 8 --packed 1 8 32 128 --sizes xs l --device cuda
    python bench/bench_lockstep.py --probe --models transformer++ frozen_retention --sizes xs l --batch 4

Prints the milliseconds of one model's step and of K packed, and the speed-up (K x one / packed: above 1,
packing wins); the folded rows time a whole training step (forward, backward, AdamW) and add one model at K
times the batch, the ceiling a fold approaches. Numbers go to bench/README.md and docs/hardware.md.
"""

from __future__ import annotations

import argparse
import copy
import sys
import warnings
from pathlib import Path

import torch
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
VOCAB = 77  # TinyStories' characters


def milliseconds(step, repeats: int, device: str = "cpu") -> float:
    from reservoir.studies.frontier.folding import milliseconds as timed  # what POINTS_PER_DEVICE=probe times

    return timed(step, repeats, device, warm=5)


def measure(model_name: str, packed: int, batch: int, seq_len: int, repeats: int) -> dict:
    from torch.func import functional_call, grad_and_value, stack_module_state, vmap

    from reservoir.config import parse_overrides
    from reservoir.models import build_model

    config = parse_overrides([f"SEQ_LEN={seq_len}"])
    models = [build_model(model_name, VOCAB, {**config, "SEED": seed}) for seed in range(packed)]
    ids = torch.randint(0, VOCAB, (packed, batch, seq_len + 1), generator=torch.Generator().manual_seed(0))
    one = models[0]

    def one_step():
        F.cross_entropy(one(ids[0, :, :-1]).flatten(0, 1), ids[0, :, 1:].flatten()).backward()

    params, buffers = stack_module_state(models)
    skeleton = copy.deepcopy(one).to("meta")

    def loss(p, b, x, y):
        return F.cross_entropy(functional_call(skeleton, (p, b), (x,)).flatten(0, 1), y.flatten())

    lockstep = vmap(grad_and_value(loss))
    try:
        with warnings.catch_warnings():  # vmap's "no batching rule, falling back to a loop" per operation
            warnings.simplefilter("ignore")
            packed_ms = milliseconds(lambda: lockstep(params, buffers, ids[:, :, :-1], ids[:, :, 1:]), repeats)
    except Exception as error:  # noqa: BLE001 - an operation vmap cannot batch at all
        return {"model": model_name, "packed": packed, "one_ms": milliseconds(one_step, repeats),
                "lockstep_ms": None, "error": f"{type(error).__name__}: {str(error).splitlines()[0][:120]}"}
    one_ms = milliseconds(one_step, repeats)
    return {"model": model_name, "packed": packed, "one_ms": one_ms, "lockstep_ms": packed_ms,
            "speedup": packed * one_ms / packed_ms}


def measure_folded(model_name: str, packed: int, batch: int, repeats: int, device: str = "cpu",
                   size: str = "xs") -> dict:
    """One model's training step K times, K folded into one, and one model at K x batch, interleaved, three
    times; the medians (on ``device``: a GPU, where a small model's step is bound by its kernel launches)."""
    from reservoir.config import default_config, parse_overrides
    from reservoir.models import build_model
    from reservoir.run.fold import fold
    from reservoir.run.train import decayed_names
    from reservoir.studies.frontier.folding import training_step
    from reservoir.studies.frontier.grid import FAMILIES as GRID
    from reservoir.studies.frontier.grid import Cell

    model = GRID[model_name][0]
    config = parse_overrides(Cell(model_name, size, default_config()[model.upper()]["learning_rate"], batch).settings())
    models = [build_model(model, VOCAB, {**config, "SEED": seed}).to(device) for seed in range(packed)]
    ids = torch.randint(0, VOCAB, (packed, batch, config["SEQ_LEN"] + 1),
                        generator=torch.Generator().manual_seed(0)).to(device)
    folded = fold(models)  # refuses a fold that would not compute each member's own logits
    singles = [training_step(m, ids[k], 1) for k, m in enumerate(models)]
    together = training_step(folded, ids.flatten(0, 1), packed, decayed_names(models[0]))
    wide = training_step(build_model(model, VOCAB, config).to(device), ids.flatten(0, 1), 1)
    runs = {"one": [], "folded": [], "wide": []}
    for _ in range(3):
        runs["one"].append(milliseconds(lambda: [s() for s in singles], repeats, device) / packed)
        runs["folded"].append(milliseconds(together, repeats, device))
        runs["wide"].append(milliseconds(wide, repeats, device))
    one, packed_ms, wide_ms = (sorted(runs[k])[1] for k in ("one", "folded", "wide"))
    tokens = packed * batch * config["SEQ_LEN"]  # a folded step's, all members together
    return {"model": model_name, "size": size, "packed": packed, "batch": batch, "one_ms": one,
            "folded_ms": packed_ms, "tokens_per_s": tokens / packed_ms * 1e3,
            "speedup": packed * one / packed_ms, "wide_ms": wide_ms, "wide_speedup": packed * one / wide_ms}


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", help="default: transformer lstm; --folded: transformer++")
    parser.add_argument("--packed", nargs="+", type=int, default=[4])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--folded", action="store_true", help="fold the K models into one (see above)")
    parser.add_argument("--device", default="cpu", help="--folded: where (cpu, cuda)")
    parser.add_argument("--sizes", nargs="+", default=["xs"], help="--folded: the study's size presets")
    parser.add_argument("--probe", action="store_true", help="what a study's POINTS_PER_DEVICE=probe times and "
                        "chooses for each --models x --sizes at --batch (its own short probe, three times)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.models = args.models or (["transformer++"] if args.folded or args.probe else ["transformer", "lstm"])
    if args.probe:
        from reservoir.studies.frontier.folding import FOLDS_TRIED, probe_fold

        print("| model | size | batch | try | one point's step ms | " +
              " | ".join(f"{k} folded ms (speed-up)" for k in FOLDS_TRIED) + " | chosen |\n" +
              "| --- " * (6 + len(FOLDS_TRIED)) + "|")
        for model_name in args.models:
            for size in args.sizes:
                for attempt in range(3):  # each a fresh probe: how much its choice moves from one to the next
                    probe_fold.cache_clear()
                    p = probe_fold(model_name, size, args.batch, VOCAB)
                    print(f"| {model_name} | {size} | {args.batch} | {attempt + 1} | {p.one_ms:.2f} | " +
                          " | ".join(f"{ms:.1f} ({p.speedup(k):.2f}x)" for k, ms in p.folded_ms.items()) +
                          f" | {p.chosen} |", flush=True)
        return 0
    if args.folded:
        print("| model | size | batch | K | one model's step ms | K folded ms | speed-up | tokens/s, all | "
              "tokens/s a member | one model at K x batch ms | speed-up |\n"
              "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
        for model_name in args.models:
            for size in args.sizes:
                for packed in args.packed:
                    r = measure_folded(model_name, packed, args.batch, args.repeats, args.device, size)
                    print(f"| {model_name} | {size} | {r['batch']} | {packed} | {r['one_ms']:.2f} | "
                          f"{r['folded_ms']:.1f} | {r['speedup']:.2f}x | {r['tokens_per_s']:,.0f} | "
                          f"{r['tokens_per_s'] / packed:,.0f} | {r['wide_ms']:.1f} | {r['wide_speedup']:.2f}x |",
                          flush=True)
        return 0
    print("| model | K | one model fwd+bwd ms | K in lockstep ms | speed-up |\n| --- | --- | --- | --- | --- |")
    for model_name in args.models:
        for packed in args.packed:
            r = measure(model_name, packed, args.batch, args.seq_len, args.repeats)
            lockstep = f"{r['lockstep_ms']:.1f}" if r["lockstep_ms"] else r["error"]
            speedup = f"{r['speedup']:.2f}x" if r.get("speedup") else ""
            print(f"| {model_name} | {packed} | {r['one_ms']:.2f} | {lockstep} | {speedup} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
