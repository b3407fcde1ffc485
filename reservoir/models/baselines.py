"""Baselines no one can call weak: a GPT-style transformer, an LSTM, and a
count-based n-gram with interpolated absolute discounting."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from reservoir.models.base import LanguageModel


def gpt2_init(module: nn.Module) -> None:
    """GPT-2's initialisation of one module: N(0, 0.02) linear and embedding weights, zero biases."""
    if isinstance(module, (nn.Linear, nn.Embedding)):
        nn.init.normal_(module.weight, 0.0, 0.02)
    if isinstance(module, nn.Linear) and module.bias is not None:
        nn.init.zeros_(module.bias)


RECIPES = {  # what each TRANSFORMER.recipe switches on; rotary, swiglu and rmsnorm may each be set apart
    "gpt2": {"rotary": False, "swiglu": False, "rmsnorm": False, "bias": True},
    # Transformer++: the baseline of RetNet, Mamba and GLA (LLaMA's block: rotary positions, SwiGLU, RMSNorm,
    # no biases)
    "++": {"rotary": True, "swiglu": True, "rmsnorm": True, "bias": False},
}
ROTARY_BASE = 10000.0


def transformer_recipe(cfg: dict) -> dict:
    """The block's parts: the recipe's, each overridden where its own option is True or False (not None)."""
    parts = dict(RECIPES[cfg.get("recipe", "gpt2")])
    parts.update({k: cfg[k] for k in ("rotary", "swiglu", "rmsnorm") if cfg.get(k) is not None})
    parts["qk_norm"] = bool(cfg.get("qk_norm", False))
    return parts


class LearnedPositions(nn.Embedding):
    """GPT-2's learned absolute positions: called on ``x`` (B, T, C) and a first position, it adds the table's
    rows first..first+T to every sequence. A module that adds rather than a lookup the model adds, so a fold
    (reservoir/run/fold.py) can give each member its own table."""

    def forward(self, x: torch.Tensor, first_position: int = 0) -> torch.Tensor:
        return x + self.weight[first_position:first_position + x.shape[1]]


def swiglu_hidden(width: int) -> int:
    """SwiGLU's hidden size: 8/3 x width, so its three matrices hold as many weights as GELU's two of 4 x width."""
    return round(8 * width / 3)


def rotate(x: torch.Tensor, first_position: int = 0, base: float = ROTARY_BASE) -> torch.Tensor:
    """Rotary position embedding (Su et al. 2021) of ``x`` (B, H, T, D) at positions first_position.. :
    each pair of channels (i, i + D/2) turned by position x base^(-2i/D), so a query-key product depends
    on their positions only through their difference."""
    positions = torch.arange(first_position, first_position + x.shape[-2], device=x.device, dtype=torch.float32)
    return rotate_at(x, positions, base)


def rotate_at(x: torch.Tensor, positions: torch.Tensor, base: float = ROTARY_BASE) -> torch.Tensor:
    """``rotate`` at the float32 ``positions`` (T,): a tensor, so a compiled step takes any position."""
    return turned(x, *rotary_table(positions, x.shape[-1] // 2, base))


def rotary_table(positions: torch.Tensor, half: int, base: float = ROTARY_BASE) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin), each (T, half), of the angles ``rotate`` turns the channel pairs at ``positions`` by."""
    frequencies = base ** (-torch.arange(half, device=positions.device, dtype=torch.float32) / half)
    angles = positions[:, None] * frequencies[None, :]
    return angles.cos(), angles.sin()


def turned(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """``x`` (..., T, D) with each pair of channels (i, i + D/2) turned by the angles of ``rotary_table``."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1).to(x.dtype)


class SwiGLU(nn.Module):
    """The gated feed-forward of Shazeer 2020: down(silu(gate(x)) * up(x))."""

    def __init__(self, width: int, hidden: int, bias: bool, dropout: float):
        super().__init__()
        self.gate_up = nn.Linear(width, 2 * hidden, bias=bias)
        self.down = nn.Linear(hidden, width, bias=bias)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x):
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        return self.dropout(self.down(F.silu(gate) * up))


class TransformerBlock(nn.Module):
    """Pre-norm causal self-attention and feed-forward, with an optional key/value cache for generation:
    GPT-2's block (LayerNorm, GELU, learned positions outside it) or, by ``parts``, Transformer++'s."""

    derived_buffers = ("rotary_cos", "rotary_sin")  # computed from the shape alone: no weights (fixed_param_count)

    def __init__(self, width: int, heads: int, dropout: float, parts: dict | None = None, context: int = 0):
        super().__init__()
        parts = parts or RECIPES["gpt2"]
        norm = (lambda n: nn.RMSNorm(n, eps=1e-6)) if parts["rmsnorm"] else \
            (lambda n: nn.LayerNorm(n, bias=parts["bias"]))
        self.ln1, self.ln2 = norm(width), norm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width, bias=parts["bias"]), nn.Linear(width, width,
                                                                                      bias=parts["bias"])
        if parts["swiglu"]:
            self.mlp = SwiGLU(width, swiglu_hidden(width), parts["bias"], dropout)
        else:
            self.mlp = nn.Sequential(nn.Linear(width, 4 * width, bias=parts["bias"]), nn.GELU(),
                                     nn.Linear(4 * width, width, bias=parts["bias"]), nn.Dropout(dropout))
        if parts.get("qk_norm"):  # normalised queries and keys per head (Dehghani et al. 2023): bounded logits
            self.q_norm, self.k_norm = nn.RMSNorm(width // heads, eps=1e-6), nn.RMSNorm(width // heads, eps=1e-6)
        self.heads, self.dropout, self.rotary = heads, dropout, parts["rotary"]
        if self.rotary and context:
            # the angles of the window's positions, once: computed in the step, torch.compile's backward recomputed
            # their cos and sin for every element of every head (half of a compiled Transformer++ step on the
            # CPU); not saved with the weights. The same values as computed in the step, so the same numbers
            cos, sin = rotary_table(torch.arange(context, dtype=torch.float32), width // heads // 2)
            self.register_buffer("rotary_cos", cos, persistent=False)
            self.register_buffer("rotary_sin", sin, persistent=False)

    def forward(self, x, past=None, keep: bool = False):
        """``past``: (keys, values) of the positions before ``x`` (generation's cache); ``keep``: also
        return this block's keys and values so far."""
        t = x.shape[1]
        first = 0 if past is None else past[0].shape[2]  # cached keys are stored rotated: a new position is
        q, k, v = self._queries_keys_values(x, lambda z: self._rotated(z, first))  # rotated by its own index
        if past is not None:  # one new position, which attends to every cached one: no mask
            if t > 1:
                raise ValueError("a cached block takes one new position at a time")
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        att = F.scaled_dot_product_attention(q, k, v, is_causal=past is None,
                                             dropout_p=self.dropout if self.training else 0)
        x = self._after_attention(x, att)
        return (x, (k, v)) if keep else x

    def _rotated(self, z, first: int):
        """``rotate(z, first)``, from the block's table where it holds the positions (a longer context: computed)."""
        table = getattr(self, "rotary_cos", None)
        if table is None or first + z.shape[-2] > len(table):
            return rotate(z, first)
        return turned(z, table[first:first + z.shape[-2]], self.rotary_sin[first:first + z.shape[-2]])

    def _queries_keys_values(self, x, rotated):
        """(q, k, v), each (B, H, T, D), of ``x`` (B, T, C); ``rotated(z)`` turns q and k to their positions."""
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, self.heads, c // self.heads).permute(2, 0, 3, 1, 4)
        if hasattr(self, "q_norm"):
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:
            q, k = rotated(q), rotated(k)
        return q, k, v

    def _after_attention(self, x, att):
        b, t, c = x.shape
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))

    def step(self, x, position: torch.Tensor, past):
        """One new position ``x`` (B, 1, C) at ``position`` (0-d) against a cache of fixed length (keys and values
        (B, H, L, D), filled before ``position``): the cached forward with one shape at every token, for a
        compiled decode step. Returns (x, the cache with this position's keys and values written in)."""
        def turn(z):  # by the table's row where the block has one: the cached forward's very angles
            if getattr(self, "rotary_cos", None) is None:
                return rotate_at(z, position.float().view(1))
            row = position.view(1)
            return turned(z, self.rotary_cos.index_select(0, row), self.rotary_sin.index_select(0, row))

        q, k, v = self._queries_keys_values(x, turn)
        keys, values = (cached.index_copy(2, position.view(1), new) for cached, new in zip(past, (k, v), strict=True))
        seen = torch.arange(keys.shape[2], device=x.device) <= position  # the positions filled so far
        att = F.scaled_dot_product_attention(q, keys, values, attn_mask=seen[None, None, None, :])
        return self._after_attention(x, att), (keys, values)


class Transformer(LanguageModel):
    """Decoder-only transformer with tied input/output embeddings: GPT-2's recipe (learned absolute
    positions, LayerNorm, GELU, biases) or Transformer++ (TRANSFORMER.recipe='++': rotary positions,
    SwiGLU, RMSNorm, no biases), optionally with qk-norm."""

    def __init__(self, vocab_size: int, cfg: dict, seq_len: int):
        super().__init__()
        width = cfg["n_embd"]
        if width % cfg["n_head"]:
            raise ValueError(f"transformer n_embd={width} must be divisible by n_head={cfg['n_head']}")
        self.parts = transformer_recipe(cfg)
        self.context_size = seq_len
        self.tok = nn.Embedding(vocab_size, width)
        self.pos = None if self.parts["rotary"] else LearnedPositions(seq_len, width)
        self.longest_context = None if self.pos is None else seq_len  # rotary positions extrapolate, a table cannot
        self.blocks = nn.ModuleList(TransformerBlock(width, cfg["n_head"], cfg["dropout"], self.parts, seq_len)
                                    for _ in range(cfg["n_layer"]))
        self.ln_f = nn.RMSNorm(width, eps=1e-6) if self.parts["rmsnorm"] else nn.LayerNorm(width,
                                                                                           bias=self.parts["bias"])
        self.head = nn.Linear(width, vocab_size, bias=False)
        # trained='embeddings': the random-transformer control (Zhong & Andreas 2024), the attention analogue of a
        # reservoir: every block and norm stays at its random initialisation, and only the token embedding and
        # the unembedding learn, untied as theirs are (tied, they would be one matrix of V x width)
        self.tied = cfg.get("trained", "everything") == "everything"
        if self.tied:
            self.head.weight = self.tok.weight  # weight tying
        self.apply(gpt2_init)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith(("proj.weight", "mlp.2.weight", "mlp.down.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg["n_layer"]))
        if not self.tied:
            self.trained = "embeddings"
            for name, p in self.named_parameters():
                p.requires_grad_(name.startswith(("tok.", "head.")))

    def _apply(self, fn, *args, **kwargs):
        # .to(xla) makes a new Parameter per module (XLA tensors cannot share the CPU storage),
        # which would silently untie the embedding and the output layer: tie them again.
        module = super()._apply(fn, *args, **kwargs)
        if self.tied:
            self.head.weight = self.tok.weight
        return module

    def _embed(self, ids, first_position: int = 0):
        x = self.tok(ids)
        if self.pos is None:  # rotary: positions enter in every block's attention
            return x
        return self.pos(x, first_position)

    def forward(self, ids):
        x = self._embed(ids)
        for block in self.blocks:
            x = self._checkpointed(block, x)
        return self.head(self.ln_f(x))

    # generation: each block's keys and values are kept while the context fits the window; past
    # it the positions shift with every token, so the window is recomputed, exactly as without a cache
    def begin_generation(self, ids):
        if ids.shape[1] > self.context_size:
            return self._window_logits(ids), None
        x = self._embed(ids)
        cache = []
        for block in self.blocks:
            x, kv = block(x, keep=True)
            cache.append(kv)
        return self.head(self.ln_f(x))[:, -1, :].float(), cache  # all positions, as the recomputing path does

    def continue_generation(self, ids, cache):
        position = ids.shape[1] - 1
        if cache is None or position >= self.context_size:
            return self._window_logits(ids), None
        x = self._embed(ids[:, -1:], position)
        kept = []
        for block, kv in zip(self.blocks, cache, strict=True):
            x, kv = block(x, past=kv, keep=True)
            kept.append(kv)
        return self.head(self.ln_f(x))[:, -1, :].float(), kept

    def static_carry(self, cache, length: int):
        """The kept keys and values in a cache of the window's length (zeros past ``length``)."""
        if cache is None:
            return None
        filled = torch.arange(length, device=cache[0][0].device)
        return [tuple(t.new_zeros(*t.shape[:2], self.context_size, t.shape[3]).index_copy(2, filled, t) for t in kv)
                for kv in cache]

    def static_step(self, token, position, cache):
        x = self.tok(token)
        if self.pos is not None:
            x = x + F.embedding(position.view(1), self.pos.weight)  # a tensor position: one graph for every token
        kept = []
        for block, kv in zip(self.blocks, cache, strict=True):
            x, kv = block.step(x, position, kv)
            kept.append(kv)
        return self.head(self.ln_f(x))[:, -1, :].float(), kept

    def flops_per_token(self) -> int:
        """Training FLOPs per token (6N + attention), as in the PaLM / nanoGPT MFU estimate."""
        n = sum(p.numel() for p in self.parameters()) - (self.pos.weight.numel() if self.pos is not None else 0)
        layers, width, t = len(self.blocks), self.tok.weight.shape[1], self.context_size
        return 6 * n + 12 * layers * width * t


def _lstm_cell(carry, drive_t):
    """One step of nn.LSTM's recurrence for ``time_scan``: the weight travels in the carry, since a scanned
    cell may not close over tensors, and one function for every call, so the scan traces it once. A folded
    weight (K, 4H, H) takes each member's states (K, B, H) by a batched product."""
    h, c, w_hh = carry
    i, f, g, o = (drive_t + h @ w_hh.mT).chunk(4, dim=-1)
    c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
    h = torch.sigmoid(o) * torch.tanh(c)
    return (h, c, w_hh), h


def lstm_scan(lstm: nn.Module, x: torch.Tensor, state, scan, training: bool):
    """nn.LSTM's recurrence (gates i, f, g, o; PyTorch's weight layout) over ``x`` (B, T, features), through
    ``scan(fn, init, xs) -> (carry, ys)`` (``time_scan``'s contract): (outputs, (h_n, c_n)) like nn.LSTM.
    ``lstm`` holds nn.LSTM's weights by their names, or a fold's (reservoir/run/fold.py), each with a leading
    member axis, ``x`` then the members' batches as one, member-major."""
    members = lstm.weight_ih_l0.shape[0] if lstm.weight_ih_l0.dim() == 3 else None
    x = x.transpose(0, 1)  # (T, B, features): scan runs over the leading dimension
    if members:
        x = x.reshape(x.shape[0], members, -1, x.shape[-1])  # (T, K, B, features)
    finals_h, finals_c = [], []
    for layer in range(lstm.num_layers):
        w_ih, w_hh = getattr(lstm, f"weight_ih_l{layer}"), getattr(lstm, f"weight_hh_l{layer}")
        bias = getattr(lstm, f"bias_ih_l{layer}") + getattr(lstm, f"bias_hh_l{layer}")
        drive = x @ w_ih.mT + (bias.unsqueeze(1) if members else bias)  # every gate's input part, all steps
        if state is None:
            h0 = drive.new_zeros(*drive.shape[1:-1], lstm.hidden_size)
            c0 = h0.clone()
        else:
            h0, c0 = (s[layer].to(drive.dtype).reshape(*drive.shape[1:-1], -1) for s in state)
        (h, c, _), x = scan(_lstm_cell, (h0, c0, w_hh), drive)
        finals_h.append(h.reshape(-1, h.shape[-1]))
        finals_c.append(c.reshape(-1, c.shape[-1]))
        if layer < lstm.num_layers - 1 and lstm.dropout and training:
            x = F.dropout(x, lstm.dropout)
    return x.reshape(x.shape[0], -1, x.shape[-1]).transpose(0, 1), (torch.stack(finals_h), torch.stack(finals_c))


class LSTM(LanguageModel):
    """A standard LSTM language model, trained on independent windows from a zero state and
    evaluated as a stream, its state carried from chunk to chunk.

    It runs PyTorch's fused ``nn.LSTM``, or, when given a ``time_scan`` (on XLA), the same cell
    with the same weights through that scan, so the cell compiles once instead of once per
    time step (``_scanned``; results match the fused kernel, tested on CPU vs XLA:CPU).
    """

    stream_kind = "recurrent"

    def __init__(self, vocab_size: int, cfg: dict):
        super().__init__()
        self.embed = nn.Embedding(vocab_size, cfg["embed_dim"])
        self.lstm = nn.LSTM(cfg["embed_dim"], cfg["hidden"], num_layers=cfg["layers"], batch_first=True,
                            dropout=cfg["dropout"] if cfg["layers"] > 1 else 0.0)
        self.head = nn.Linear(cfg["hidden"], vocab_size)
        self.time_scan = None  # set by use_time_scan

    def _scanned(self, x, state=None):
        """nn.LSTM's recurrence through ``time_scan``; (outputs, (h_n, c_n)) like nn.LSTM."""
        return lstm_scan(self.lstm, x, state, self.time_scan, self.training)

    def forward(self, ids):
        if self.time_scan is not None:
            return self.head(self._scanned(self.embed(ids))[0])
        return self.head(self._checkpointed(self.lstm, self.embed(ids))[0])

    def initial_state(self, batch, device):
        zeros = torch.zeros(self.lstm.num_layers, batch, self.lstm.hidden_size, device=device)
        return zeros, zeros.clone()

    def forward_stream(self, ids, state):
        x = self.embed(ids)
        if self.time_scan is not None:
            out, state = self._scanned(x, state)
        else:
            out, state = self.lstm(x, tuple(s.to(x.dtype) for s in state))
        return self.head(out), state


class NGram(LanguageModel):
    """Count-based n-gram with interpolated absolute discounting:

        P_k(w | h) = max(c(h w) - D, 0) / c(h) + D N1+(h .) / c(h) P_{k-1}(w | h')

    down to an add-one unigram. D is tuned on held-out text. Its forward returns
    log-probabilities, so it is evaluated by the same loss code as every model.
    """

    trainer = "counts"
    trained = "counts"
    host_only = True  # numpy on the host: runners keep it (and its inputs) on the CPU

    def __init__(self, vocab_size: int, cfg: dict):
        super().__init__()
        self.order, self.vocab_size = cfg["order"], vocab_size
        if vocab_size ** self.order >= 2 ** 63:  # an n-gram is one int64 key: it would wrap silently
            raise ValueError(f"an order-{self.order} n-gram over {vocab_size} tokens does not fit int64 keys")
        self.context_size = self.order - 1 if self.order > 1 else 1
        self.discount = cfg["discount"]
        self.tables: list[dict] = []
        self.register_buffer("_anchor", torch.zeros(()), persistent=False)  # follows .to(device)

    # --- counting (numpy, on the host: this is bookkeeping, not tensor work)
    def _count(self, ids: np.ndarray) -> None:
        ids = np.asarray(ids, dtype=np.int64)
        v = self.vocab_size
        self.unigram = np.bincount(ids, minlength=v).astype(np.float64)
        self.tables = []
        for k in range(1, self.order):  # contexts of length k
            ctx = np.zeros(len(ids) - k, dtype=np.int64)
            for j in range(k):
                ctx = ctx * v + ids[j: len(ids) - k + j]
            keys = ctx * v + ids[k:]
            uniq, counts = np.unique(keys, return_counts=True)
            contexts, starts = np.unique(uniq // v, return_index=True)
            totals = np.add.reduceat(counts, starts)
            self.tables.append({"keys": uniq, "counts": counts.astype(np.float64), "contexts": contexts,
                                "totals": totals.astype(np.float64), "types": np.diff(np.append(starts, len(uniq)))})

    def fit_counts(self, train_ids: np.ndarray, heldout_ids: np.ndarray | None = None) -> dict:
        """Count, tune the discount on ``heldout_ids`` if given, then count all the text."""
        if heldout_ids is not None and len(heldout_ids) > self.order:
            self._count(train_ids)
            span = min(128, len(heldout_ids) - 1)  # tuned on windows, as it is evaluated
            n = min(len(heldout_ids) - 1, 20000) // span
            held = np.asarray(heldout_ids[: n * span + 1], dtype=np.int64)
            inputs = torch.from_numpy(held[:-1].reshape(n, span))
            targets = torch.from_numpy(held[1:].reshape(n, span))
            best = None
            for d in (0.5, 0.6, 0.7, 0.8, 0.9, 0.95):
                self.discount = d
                nll = float(F.cross_entropy(self(inputs).flatten(0, 1), targets.flatten()))
                if best is None or nll < best[0]:
                    best = (nll, d)
            self.discount = best[1]
            train_ids = np.concatenate([np.asarray(train_ids), np.asarray(heldout_ids)])
        self._count(train_ids)
        return {"discount": self.discount}

    def _log_probs(self, ids: np.ndarray) -> np.ndarray:
        b, t = ids.shape
        v = self.vocab_size
        probs = np.broadcast_to((self.unigram + 1) / (self.unigram.sum() + v), (b, t, v)).copy()
        for k, table in enumerate(self.tables, start=1):
            ctx = np.zeros((b, t), dtype=np.int64)
            valid = np.zeros((b, t), dtype=bool)
            valid[:, k - 1:] = True
            for j in range(k):  # context of the k tokens ending at position t
                shifted = np.zeros((b, t), dtype=np.int64)
                shifted[:, k - 1:] = ids[:, j: t - k + 1 + j]
                ctx = ctx * v + shifted
            row = np.searchsorted(table["contexts"], ctx).clip(0, len(table["contexts"]) - 1)
            seen = valid & (table["contexts"][row] == ctx)
            total = np.where(seen, table["totals"][row], 1.0)
            backoff = np.where(seen, self.discount * table["types"][row] / total, 1.0)
            new = probs * backoff[..., None]
            lo = np.searchsorted(table["keys"], ctx * v)
            hi = np.searchsorted(table["keys"], ctx * v + v)
            # every (position, seen continuation) pair at once: flat ranges [lo, hi) per seen position
            flat_pos = np.flatnonzero(seen)
            lengths = (hi.ravel() - lo.ravel())[flat_pos]
            pos = np.repeat(flat_pos, lengths)
            entry = np.repeat(lo.ravel()[flat_pos] - np.cumsum(lengths) + lengths, lengths) + np.arange(lengths.sum())
            flat = new.reshape(b * t, v)
            flat[pos, table["keys"][entry] % v] += (np.maximum(table["counts"][entry] - self.discount, 0)
                                                    / total.ravel()[pos])
            probs = new
        return np.log(probs)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if not self.tables and self.order > 1:
            raise RuntimeError("the n-gram has no counts yet: call fit_counts first")
        ids_np = ids.cpu().numpy()
        rows = max(1, 4_000_000 // (ids_np.shape[1] * self.vocab_size))  # bounds the float64 work arrays
        out = [torch.from_numpy(self._log_probs(ids_np[i: i + rows])).float() for i in range(0, len(ids_np), rows)]
        return torch.cat(out).to(ids.device)

    def fixed_param_count(self) -> int:
        return int(sum(len(t["keys"]) for t in self.tables) + self.vocab_size)

    # the counts travel in state_dict() as tensors, so checkpoints load with weights_only=True
    def get_extra_state(self) -> dict:
        tables = [{k: torch.from_numpy(np.asarray(v)) for k, v in t.items()} for t in self.tables]
        unigram = torch.from_numpy(self.unigram) if hasattr(self, "unigram") else None
        return {"discount": float(self.discount), "unigram": unigram, "tables": tables}

    def set_extra_state(self, state: dict) -> None:
        self.discount = state["discount"]
        if state["unigram"] is not None:
            self.unigram = state["unigram"].numpy()
        self.tables = [{k: v.numpy() for k, v in t.items()} for t in state["tables"]]
