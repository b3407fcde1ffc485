"""Frozen retention: RetNet's multi-scale retention (Sun et al. 2023, arXiv 2307.08621) with its
recurrence frozen, as RetNet itself keeps it.

Per head h, with a fixed decay γ_h and fixed rotation angles θ (xPos/RoPE frequencies), a
matrix-valued state carries the past:

    S_t = γ_h R_θ S_{t-1} + k_t v_tᵀ,        o_t = q_tᵀ S_t
        = Σ_{s<=t} γ_h^(t-s) (q_tᵀ R_θ^(t-s) k_s) v_s

where R_θ rotates each pair of key dimensions by its angle. That is a linear recurrence whose
transition (γ R_θ) is never trained: a reservoir's recurrence with trained read-in (q, k, v) and
read-out. Frozen: the decays (time constants log-spaced over [tau_min, tau_max] characters, one
per head) and the angles. Trained: the token embedding (tied to the output layer), the q/k/v,
gate and output projections, the feed-forward layers and the norms. ``train_recurrence=True``
trains the decays and angles too: the unfrozen control, at the same size and compute.

The parallel form (training, evaluation windows) computes the sum above as a masked T x T
product, like attention with a decay mask; the chunkwise recurrent form (``forward_stream``)
carries S between chunks and agrees with it exactly (tested). Positions enter only as offsets
inside a chunk, so no absolute position grows without bound in a long stream.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn
from torch.nn import functional as F

from reservoir.models.base import LanguageModel
from reservoir.models.baselines import gpt2_init


def head_decays(heads: int, tau_min: float, tau_max: float) -> torch.Tensor:
    """ln γ_h for ``heads`` time constants τ = -1/ln γ log-spaced over [tau_min, tau_max] steps
    (RetNet's γ = 1 - 2^(-5-h) spans 32 to 4096 tokens the same way)."""
    taus = torch.logspace(math.log10(tau_min), math.log10(tau_max), heads, dtype=torch.float64)
    return (-1.0 / taus).float()


def rotation_angles(head_dim: int, base: float) -> torch.Tensor:
    """θ_j = base^(-2j/d) for the head_dim/2 pairs of key dimensions (RoPE's, as xPos uses them)."""
    return base ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim).float()


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the pairs (x_j, x_{j+d/2}) of the last dimension by the angles whose cos and sin are given."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat([first * cos - second * sin, first * sin + second * cos], dim=-1)


class RetentionState(NamedTuple):
    """A frozen retention model's stream state: each layer's S, (B, heads, head_dim, head_dim), and each
    layer's last conv_width - 1 normalised inputs, (B, conv_width - 1, width), that its short
    convolution reaches back to (none without one)."""

    layers: tuple[torch.Tensor, ...]
    recent: tuple[torch.Tensor, ...]


class RetentionBlock(nn.Module):
    """x + W_o(swish(W_g x') ⊙ GroupNorm(MSR(x'))), x' = LN(x); then x + FFN(LN(x)).

    Two options act before the frozen recurrence, each off by default (H3, Fu et al. 2023, and Mamba,
    Gu & Dao 2023, find both help fixed or structured recurrences): ``conv_width`` > 0, a trained
    causal depthwise convolution over the last conv_width inputs feeding q, k and v (a shift, as
    H3's); ``write_gate``, a trained per-head gate σ(W x') on what each token writes (k_t)."""

    def __init__(self, width: int, cfg: dict, log_decay: torch.Tensor, angles: torch.Tensor):
        super().__init__()
        heads = cfg["heads"]
        self.heads, self.head_dim = heads, width // heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.gate = nn.Linear(width, width, bias=False)
        self.out = nn.Linear(width, width, bias=False)
        self.norm = nn.GroupNorm(heads, width)  # per head: the state's scale grows with its time constant
        self.ffn = nn.Sequential(nn.Linear(width, cfg["ffn_hidden"]), nn.GELU(), nn.Linear(cfg["ffn_hidden"], width),
                                 nn.Dropout(cfg["dropout"]))
        self.taps = cfg["conv_width"]
        if self.taps:  # starts as the identity: the current input alone
            identity = torch.zeros(width, 1, self.taps)
            identity[:, :, -1] = 1.0
            self.conv = nn.Parameter(identity)
        self.write_gate = nn.Linear(width, heads) if cfg["write_gate"] else None
        # the control that is no longer a reservoir: a trained, content-dependent decay γ_h^(2σ(W x_t)) (GLA's
        # data-dependent forgetting over the frozen γ_h as its base; zero weights start it at the frozen decay)
        self.forget_gate = nn.Linear(width, heads) if cfg.get("forget_gate") else None
        if self.forget_gate is not None:
            nn.init.zeros_(self.forget_gate.weight)
            nn.init.zeros_(self.forget_gate.bias)
        if cfg["train_recurrence"]:  # the unfrozen control: the same recurrence, trained
            self.log_decay, self.angles = nn.Parameter(log_decay.clone()), nn.Parameter(angles.clone())
        else:
            self.register_buffer("log_decay", log_decay.clone())
            self.register_buffer("angles", angles.clone())

    def _retention(self, q, k, v, state, forget=None):
        """(o, state after) for q, k, v (B, H, T, d) from ``state`` (B, H, d, d): a stream; or (o, None) from
        None, a window from a zero state (training, evaluation windows), whose state after nobody reads.
        ``forget`` (B, H, T): each step's share of ln γ_h (the forget gate's 2σ(W x_t)); None: all of it."""
        t = q.shape[2]
        with torch.autocast(q.device.type, enabled=False):  # decays over ~1000 steps: fp32
            q, k, v = q.float(), k.float(), v.float()
            log_decay = self.log_decay.float()[:, None]  # (H, 1)
            n = torch.arange(t, device=q.device, dtype=torch.float32)
            phase = -n[:, None] * self.angles.float()  # (T, d/2): R^(-n), so scores depend on t - s only
            cos, sin = phase.cos(), phase.sin()
            q_rot, k_rot = _rotate(q, cos, sin), _rotate(k, cos, sin)
            offsets = n[:, None] - n[None, :]  # t - s
            causal = offsets >= 0
            if forget is None:  # Σ of ln γ over steps s+1..t is (t - s) ln γ
                decayed = log_decay[:, :, None] * offsets.clamp(min=0)  # (H, T, T)
                through = log_decay * (n + 1)  # ln γ summed over steps 0..t: what the incoming state has decayed
            else:  # L_t = Σ_{r<=t} ln γ_r; the steps s+1..t decay by L_t - L_s
                through = torch.cumsum(log_decay * forget.float(), dim=-1)  # (B, H, T)
                decayed = through[..., :, None] - through[..., None, :]
            decay = torch.where(causal, torch.exp(torch.where(causal, decayed, 0.0)), 0.0)  # ([B,] H, T, T)
            o = ((q_rot @ k_rot.transpose(-1, -2)) * decay) @ v
            if state is None:
                return o, None
            if forget is None:
                to_end = torch.exp(log_decay * (t - 1 - n))  # γ^(T-1-s), (H, T)
            else:
                to_end = torch.exp(through[..., -1:] - through)  # the decays of steps s+1..T-1, (B, H, T)
            summed = (k_rot * to_end[..., None]).transpose(-1, -2) @ v  # Σ_s γ^(T-1-s) k~_s v_sᵀ
            state = state.float()
            ahead = -(n + 1)[:, None] * self.angles.float()  # R^(-(t+1)) q_t reads the state
            o = o + (_rotate(q, ahead.cos(), ahead.sin()) @ state) * torch.exp(through)[..., None]
            # S after: R^(T-1) Σ (rows rotated by +(T-1)θ) + γ^T R^T S (by +Tθ); keys are the rows of S
            last, whole = (t - 1) * self.angles.float(), t * self.angles.float()
            new_state = (_rotate(summed.transpose(-1, -2), last.cos(), last.sin())
                         + _rotate(state.transpose(-1, -2), whole.cos(), whole.sin())
                         * torch.exp(through[..., -1:])[..., None]).transpose(-1, -2)
        return o, new_state

    def forward(self, x: torch.Tensor, state: tuple[torch.Tensor, torch.Tensor] | None = None):
        """(x after the block, (S, recent inputs) after it); ``state`` None: a window from a zero state,
        and no state after (training, evaluation windows)."""
        b, t, width = x.shape
        h = self.ln1(x)
        written, recent = h, None if state is None else state[1]  # without a convolution: nothing to carry
        if self.taps:
            before = h.new_zeros(b, self.taps - 1, width) if state is None else state[1].to(h.dtype)
            padded = torch.cat([before, h], dim=1)
            written = F.conv1d(padded.transpose(1, 2), self.conv.to(h.dtype), groups=width).transpose(1, 2)
            recent = padded[:, padded.shape[1] - (self.taps - 1):]
        q, k, v = self.qkv(written).view(b, t, 3, self.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.write_gate is not None:
            k = k * torch.sigmoid(self.write_gate(written)).transpose(1, 2)[..., None]
        forget = None if self.forget_gate is None else 2 * torch.sigmoid(self.forget_gate(written)).transpose(1, 2)
        o, new_state = self._retention(q, k / math.sqrt(self.head_dim), v, None if state is None else state[0],
                                       forget)
        o = self.norm(o.transpose(1, 2).reshape(b * t, width)).view(b, t, width).to(x.dtype)
        x = x + self.out(F.silu(self.gate(h)) * o)
        return x + self.ffn(self.ln2(x)), None if state is None else (new_state, recent)


class FrozenRetention(LanguageModel):
    """A RetNet-style decoder whose retention recurrence (decays and rotations) is frozen; see the
    module docstring. Trained and evaluated on SEQ_LEN windows from a zero state, like the
    transformer; ``forward_stream`` carries each layer's state exactly (generation does, until
    the window is full)."""

    def __init__(self, vocab_size: int, cfg: dict, seq_len: int):
        super().__init__()
        width, heads = cfg["width"], cfg["heads"]
        if width % heads or (width // heads) % 2:
            raise ValueError(f"frozen_retention width={width} must split into {heads} heads of an even size")
        self.context_size = seq_len
        # a forget gate trains how the state decays: the recurrence is no longer fixed
        self.trained = "everything" if cfg["train_recurrence"] or cfg.get("forget_gate") else "all but recurrence"
        log_decay = head_decays(heads, cfg["tau_min"], cfg["tau_max"])
        angles = rotation_angles(width // heads, cfg["rotation_base"])
        self.embed = nn.Embedding(vocab_size, width)
        self.drop = nn.Dropout(cfg["dropout"])
        self.blocks = nn.ModuleList(RetentionBlock(width, cfg, log_decay, angles) for _ in range(cfg["layers"]))
        self.ln_f = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab_size, bias=False)
        self.head.weight = self.embed.weight  # tied, as the transformer's
        for module in self.modules():  # the transformer's (GPT-2's) initialisation
            gpt2_init(module)
        for name, p in self.named_parameters():  # GPT-2's scaled init of residual projections
            if name.endswith("out.weight") or name.endswith("ffn.2.weight"):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * max(1, cfg["layers"])))

    def _apply(self, fn, *args, **kwargs):
        module = super()._apply(fn, *args, **kwargs)  # .to(xla) would untie them: tie again
        self.head.weight = self.embed.weight
        return module

    def _run(self, ids: torch.Tensor, state: RetentionState | None):
        """(logits, state after ``ids``); ``state`` None: a window from a zero state (training), no state kept."""
        x = self.drop(self.embed(ids))
        finals = []
        for layer, block in enumerate(self.blocks):
            if state is None:
                x, _ = self._checkpointed(block, x)
            else:
                x, final = block(x, (state.layers[layer], state.recent[layer]))
                finals.append(final)
        if state is None:
            return self.head(self.ln_f(x)), None
        return self.head(self.ln_f(x)), RetentionState(tuple(f[0] for f in finals), tuple(f[1] for f in finals))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self._run(ids, None)[0]

    def initial_state(self, batch, device) -> RetentionState:
        block, width = self.blocks[0], self.embed.embedding_dim
        shape = (batch, block.heads, block.head_dim, block.head_dim)
        return RetentionState(tuple(torch.zeros(shape, device=device) for _ in self.blocks),
                              tuple(torch.zeros(batch, max(0, b.taps - 1), width, device=device) for b in self.blocks))

    def forward_stream(self, ids, state):
        return self._run(ids, state)

    # generation: the state is carried while the context fits the window; past it the window slides,
    # and is recomputed, exactly as without a cache (a window model sees SEQ_LEN tokens, no more)
    def begin_generation(self, ids):
        if ids.shape[1] > self.context_size:
            return self._window_logits(ids), None
        logits, state = self.forward_stream(ids, self.initial_state(1, ids.device))
        return logits[:, -1, :].float(), state

    def continue_generation(self, ids, carry):
        if carry is None or ids.shape[1] > self.context_size:
            return self._window_logits(ids), None
        logits, state = self.forward_stream(ids[:, -1:], carry)
        return logits[:, -1, :].float(), state

    def static_carry(self, carry, length: int):
        return carry  # its state has one shape at every token (None past the window: it recomputes there)
