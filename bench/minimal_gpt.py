"""The reference for the runner's transformer throughput: a minimal nanoGPT-style training loop,
self-contained (nothing from reservoir/), at the same sizes, on the same device.

    python bench/minimal_gpt.py cuda SEQ_LEN=256 BATCH_SIZE=64 TRANSFORMER.n_layer=6 \
        TRANSFORMER.n_embd=384 TRANSFORMER.n_head=6 STEPS=300

Pre-LayerNorm blocks with fused causal attention, tied embeddings, and nanoGPT's training step: AdamW
(fused on CUDA) decaying the matrices only, the gradient norm clipped to GRAD_CLIP (1.0, nanoGPT's
default; 0: no clipping), a batch per step drawn as nanoGPT's get_batch draws it (random windows of a
token array, a stack of slices; DATA=0: one fixed batch, no data cost at all), bf16 autocast where the
GPU has bf16 hardware. The runner trains with the same recipe (clipped at 1.0, matrices decayed, a new
batch a step), so the two compare like for like. Prints one JSON line: tokens/s over the steps after 10
warm-up steps, and the training FLOPs per token (6N + 12 L d T, as the runner counts).
COMPILE=1: its compiled twin (nanoGPT's torch.compile of the model; the warm-up steps hold the compile,
and its seconds are in the line).
"""

import json
import sys
import time

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

VOCAB = 96


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.out = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.ff = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, t, 3, self.heads, c // self.heads).unbind(2)
        y = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
        x = x + self.out(y.transpose(1, 2).reshape(b, t, c))
        return x + self.ff(self.norm2(x))


class GPT(nn.Module):
    def __init__(self, layers: int, width: int, heads: int, context: int):
        super().__init__()
        self.token, self.position = nn.Embedding(VOCAB, width), nn.Embedding(context, width)
        self.blocks = nn.Sequential(*[Block(width, heads) for _ in range(layers)])
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, VOCAB, bias=False)
        self.head.weight = self.token.weight

    def forward(self, ids):
        x = self.token(ids) + self.position(torch.arange(ids.shape[1], device=ids.device))
        return self.head(self.norm(self.blocks(x)))


def settings_of(args: list[str]) -> dict:
    """KEY=VALUE sizes as the GPU check passes them (a later one wins); TRANSFORMER.recipe may only name the
    recipe this loop is, nanoGPT's 'gpt2'."""
    settings = {}
    for arg in args:
        key, _, value = arg.partition("=")
        if key == "TRANSFORMER.recipe":
            if value.strip("'\"") != "gpt2":
                raise ValueError(f"bench/minimal_gpt.py builds the 'gpt2' recipe alone (nanoGPT's); "
                                 f"{arg} has no minimal loop to compare with")
            continue
        try:
            settings[key] = float(value) if key == "GRAD_CLIP" else int(value)
        except ValueError:
            raise ValueError(f"bench/minimal_gpt.py takes whole numbers for its sizes (GRAD_CLIP: a number); "
                             f"got {arg}") from None
    return settings


def measure(device: str, settings: dict) -> None:
    seq, batch = settings.get("SEQ_LEN", 256), settings.get("BATCH_SIZE", 64)
    layers, width = settings.get("TRANSFORMER.n_layer", 6), settings.get("TRANSFORMER.n_embd", 384)
    heads, steps = settings.get("TRANSFORMER.n_head", 6), settings.get("STEPS", 300)
    model = GPT(layers, width, heads, seq).to(device)
    compiled = bool(settings.get("COMPILE", 0))
    forward = torch.compile(model) if compiled else model
    cuda = device == "cuda"
    clip, drawn = settings.get("GRAD_CLIP", 1.0), bool(settings.get("DATA", 1))
    matrices = [p for p in model.parameters() if p.dim() >= 2]  # nanoGPT's configure_optimizers
    groups = [{"params": matrices, "weight_decay": 0.1},
              {"params": [p for p in model.parameters() if p.dim() < 2], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=1e-3, fused=cuda)
    bf16 = cuda and torch.cuda.get_device_capability()[0] >= 8
    tokens = np.random.default_rng(0).integers(0, VOCAB, 1_000_000).astype(np.uint16)
    fixed = torch.randint(0, VOCAB, (batch, seq + 1), device=device)

    def get_batch():
        if not drawn:
            return fixed[:, :-1], fixed[:, 1:]
        starts = torch.randint(len(tokens) - seq, (batch,))
        x = torch.stack([torch.from_numpy(tokens[i:i + seq].astype(np.int64)) for i in starts])
        y = torch.stack([torch.from_numpy(tokens[i + 1:i + 1 + seq].astype(np.int64)) for i in starts])
        if cuda:
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        return x, y

    warmup = min(10, steps // 2)
    began = time.perf_counter()
    for step in range(steps):
        if step == warmup:
            if cuda:
                torch.cuda.synchronize()
            start = time.perf_counter()
            warmup_seconds = start - began
        x, y = get_batch()
        with torch.autocast(device, dtype=torch.bfloat16, enabled=bf16):
            loss = F.cross_entropy(forward(x).float().flatten(0, 1), y.flatten())
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    if cuda:
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    n = sum(p.numel() for p in model.parameters()) - model.position.weight.numel()
    print(json.dumps({"tokens_per_second": (steps - warmup) * batch * seq / seconds,
                      "flops_per_token": 6 * n + 12 * layers * width * seq, "bf16": bf16, "steps": steps,
                      "compiled": compiled, "warmup_seconds": round(warmup_seconds, 2), "grad_clip": clip,
                      "batches_drawn": drawn}))


def main(argv: list[str]) -> int:
    device, sizes = (argv[0], argv[1:]) if argv else ("cuda", [])
    try:
        settings = settings_of(sizes)
    except ValueError as refused:
        print(f"error: {refused}", file=sys.stderr)
        return 2
    measure(device, settings)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
