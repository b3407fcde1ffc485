"""Sampling tokens/s of every model at its default size: carried state / kept keys and values
(``generate``'s default) against recomputing the whole context for every token (``cache=False``,
how sample.py worked before), and with COMPILE=True's compiled decode step where the model has a
fixed-shape one (its compile timed apart: the first story's seconds beyond the others'), and on a GPU
that step replayed as CUDA graphs too.

    python bench/bench_sampling.py [NEW_TOKENS] [DEVICE] [MODEL ...]   (default 2000 characters, cpu, all)

Weights are random (ridge readouts fitted on random text, the n-gram counted on it): speed does not
depend on them. Each model writes the same story both ways (asserted here, tested in test_models.py).
"""

import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from configs import parse_overrides  # noqa: E402
from reservoir.models import MODEL_NAMES, build_model  # noqa: E402
from reservoir.run.sampling import decode_steps  # noqa: E402

VOCAB, PROMPT = 80, 16


def fitted(name: str, config: dict, device: str):
    model = build_model(name, VOCAB, config).eval()
    rng = np.random.default_rng(0)
    if model.trainer == "ridge":
        chunk = lambda: torch.from_numpy(rng.integers(0, VOCAB, (8, 129)))  # noqa: E731
        chunks = [chunk() for _ in range(3)]
        model.fit_ridge([(c[:, :-1], c[:, 1:]) for c in chunks[:2]], [(chunks[2][:, :-1], chunks[2][:, 1:])])
    elif model.trainer == "counts":
        model.fit_counts(rng.integers(0, VOCAB, 200_000))
    return model.to(device)


def main(new_tokens: int, device: str, names: list[str]) -> None:
    config = parse_overrides(["SEQ_LEN=128"])
    prompt = torch.arange(PROMPT, device=device) % VOCAB
    print(f"{new_tokens} new tokens after a {PROMPT}-token prompt, on {device}")
    print(f"{'model':22s} {'recompute tok/s':>16s} {'cached tok/s':>13s} {'speed-up':>9s} {'compiled tok/s':>15s} "
          f"{'compile s':>10s}" + (f" {'CUDA graph tok/s':>14s}" if device.startswith("cuda") else ""))
    for name in names:
        model = fitted(name, config, device)
        rates, stories = {}, {}
        steps = decode_steps(model, True)  # COMPILE=True's decode steps, where the model has a fixed-shape one
        started = time.perf_counter()
        model.generate(prompt, new_tokens, temperature=1.0, **steps)  # its compiles, then its first story
        first = time.perf_counter() - started
        for way, options in (("recompute", {"cache": False}), ("cached", {}), ("compiled", steps)):
            start = time.perf_counter()
            stories[way] = model.generate(prompt, new_tokens, temperature=1.0,
                                          generator=torch.Generator().manual_seed(0), **options)
            rates[way] = new_tokens / (time.perf_counter() - start)
        assert torch.equal(stories["recompute"], stories["cached"]), f"{name}: the cached story differs"
        assert torch.equal(stories["cached"], stories["compiled"]), f"{name}: the compiled story differs"
        compile_seconds = first - new_tokens / rates["compiled"]
        compiled = f"{rates['compiled']:15,.0f} {compile_seconds:10.1f}" if steps["step"].compiles else \
            f"{'(no fixed-shape step)':>26s}"
        if steps["step"].compiles and device.startswith("cuda"):
            compiled += f" {graphed(model, prompt, new_tokens, stories['compiled']):>14s}"
        print(f"{name:22s} {rates['recompute']:16,.0f} {rates['cached']:13,.0f} "
              f"{rates['cached'] / rates['recompute']:8.1f}x {compiled}", flush=True)


def graphed(model, prompt, new_tokens: int, compiled_story) -> str:
    """tokens/s of the compiled decode step replayed as CUDA graphs (torch.compile's "reduce-overhead"), or
    why not: its story must be the compiled one."""
    steps = decode_steps(model, True, cuda_graphs=True)
    try:
        for _ in range(2):  # its compiles and its graphs' recording, then a story
            model.generate(prompt, new_tokens, temperature=1.0, **steps)
        start = time.perf_counter()
        story = model.generate(prompt, new_tokens, temperature=1.0, generator=torch.Generator().manual_seed(0),
                               **steps)
        rate = new_tokens / (time.perf_counter() - start)
    except Exception as error:  # noqa: BLE001 - the table says why, the other models go on
        return f"failed: {type(error).__name__}"
    return f"{rate:,.0f}" if torch.equal(story, compiled_story) else "story differs"


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2000, sys.argv[2] if len(sys.argv) > 2 else "cpu",
         sys.argv[3:] or list(MODEL_NAMES))
