"""Forward and training tokens/s of every model at its default size (CPU here), with MFU
where FLOPs are known (the transformer: 6N + attention per trained token).

    python bench/bench_models.py [PEAK_GFLOPS]    (default: measured here, the best fp32 rate of a
                                                  2048x2048 matmul, so MFU is relative to this machine)
"""

import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from configs import parse_overrides  # noqa: E402
from reservoir.models import MODEL_NAMES, build_model  # noqa: E402

VOCAB, BATCH, SEQ = 80, 32, 128


def rate(fn, tokens, repeats=3):
    fn()  # warm-up
    start = time.perf_counter()
    for _ in range(repeats):
        fn()
    return tokens * repeats / (time.perf_counter() - start)


def measured_peak_gflops() -> float:
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    best = min(_timed(lambda: a @ b) for _ in range(5))
    return 2 * 2048**3 / best / 1e9


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main(peak_gflops: float) -> None:
    print(f"peak for MFU: {peak_gflops:.0f} GFLOP/s fp32")
    config = parse_overrides([f"SEQ_LEN={SEQ}"])
    ids = torch.randint(0, VOCAB, (BATCH, SEQ + 1))
    x, y = ids[:, :-1], ids[:, 1:]
    print(f"{'model':17s} {'params':>10s} {'trainable':>10s} {'forward tok/s':>14s} {'train tok/s':>12s} {'MFU':>6s}")
    for name in MODEL_NAMES:
        model = build_model(name, VOCAB, config)
        if model.trainer == "counts":
            model.fit_counts(np.random.randint(0, VOCAB, 200_000))
        with torch.no_grad():
            fwd = rate(lambda m=model: m(x), x.numel())
        train, mfu = float("nan"), ""
        params = [p for p in model.parameters() if p.requires_grad]
        if model.trainer == "sgd":
            opt = torch.optim.AdamW(params, lr=1e-3)

            def step(m=model, opt=opt):
                F.cross_entropy(m(x).flatten(0, 1), y.flatten()).backward()
                opt.step()
                opt.zero_grad()

            train = rate(step, x.numel())
            if hasattr(model, "flops_per_token"):
                mfu = f"{100 * train * model.flops_per_token() / (peak_gflops * 1e9):.1f}%"
        counts = model.param_counts()
        print(f"{name:17s} {counts['params_total']:10,d} {counts['params_trainable']:10,d} {fwd:14,.0f} "
              f"{train:12,.0f} {mfu:>6s}")


if __name__ == "__main__":
    main(float(sys.argv[1]) if len(sys.argv) > 1 else measured_peak_gflops())
