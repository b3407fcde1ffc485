"""K same-shape models trained in lockstep in one process (torch.func: stack_module_state, vmap over
functional_call and grad) against K steps of one model, on the CPU with one thread: whether packing a
study's points into one process's kernels would fill a core better than a point per core does.

    python bench/bench_lockstep.py                      # transformer++ and lstm at xs, K = 4, batch 8
    python bench/bench_lockstep.py --models transformer frozen_retention --packed 2 4 8

Prints the forward-and-backward milliseconds of one model, of K in lockstep, and the speed-up
(K x one / lockstep: above 1, packing wins). Numbers go to bench/README.md and docs/hardware.md.
"""

from __future__ import annotations

import argparse
import copy
import sys
import time
import warnings
from pathlib import Path

import torch
from torch.nn import functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
VOCAB = 77  # TinyStories' characters


def milliseconds(step, repeats: int) -> float:
    for _ in range(5):
        step()
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    return (time.perf_counter() - start) / repeats * 1e3


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


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["transformer", "lstm"])
    parser.add_argument("--packed", nargs="+", type=int, default=[4])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
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
