"""A reservoir read by attention: frozen recurrent states, and a trained causal attention readout
over the states of the last SEQ_LEN characters (Köster & Uchida 2025, arXiv 2507.15779, read
reservoir states with attention on Shakespeare; Zoology, Arora et al. 2023, finds that a little
attention closes most of what fixed recurrences lack: recall).

    features_t = (Re h_t, Im h_t),   h_t = λ ⊙ h_{t-1} + B u_t      (frozen: λ, B; u_t one-hot)
    logits_t   = head(attention layers(project(features_≤t) + positions))

Frozen: λ (time constants log-uniform over [tau_min, tau_max] characters, random phases) and the
input weights B, so only a readout is trained: the projection of the states, the attention
layers and the output layer. ``reservoir=False`` is the control: the same readout over the same
frozen input B u_t with no recurrence (a transformer whose token embedding is frozen and random),
so what the recurrence adds is measured on its own. ``train_recurrence=True`` trains λ and B too
(the unfrozen control): what freezing them costs. ``write_gate=True`` trains what each character writes
into the reservoir (a gate per character, on the frozen B u_t): still a reservoir.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from reservoir.models.base import LanguageModel
from reservoir.models.baselines import LearnedPositions, TransformerBlock, gpt2_init
from reservoir.models.reservoirs import (
    diagonal_scan,
    eigenvalues,
    hold_eigenvalues,
    hold_input_weights,
    multi_timescale_eigenvalues,
)


class WriteGate(nn.Module):
    """A trained gate 2σ(g[u_t]) on what each character writes into a frozen reservoir (the input is one-hot,
    so one number per character), zero at first, so a model starts as the ungated one. A table by use, a matrix
    to AdamW: it decays (train.decayed_names), as it did when the model held it bare."""

    def __init__(self, vocab_size: int):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(vocab_size, 1))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return 2 * torch.sigmoid(self.weight[ids].float())


class ReservoirAttention(LanguageModel):
    """Frozen multi-timescale linear reservoir states, read by causal attention; see the module
    docstring. Trained and evaluated on SEQ_LEN windows from a zero state, like the transformer."""

    def __init__(self, vocab_size: int, cfg: dict, seed: int, seq_len: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        units, width = cfg["units"], cfg["width"]
        if width % cfg["heads"]:
            raise ValueError(f"reservoir_attention width={width} must be divisible by heads={cfg['heads']}")
        self.context_size, self.recurrent = seq_len, cfg["reservoir"]
        train_recurrence = cfg["train_recurrence"]
        self.trained = "everything" if train_recurrence else "readout"
        radius, phase = multi_timescale_eigenvalues(units, cfg["tau_min"], cfg["tau_max"], cfg["max_phase"], g)
        hold_eigenvalues(self, radius, phase, train_recurrence and self.recurrent)
        # sqrt(1 - r²): every unit's stationary variance the same whatever its memory (without the
        # recurrence, the control, each unit sees its input once: no such scaling)
        norm = cfg["input_scaling"] / math.sqrt(2) * (torch.sqrt(1 - radius**2) if self.recurrent else 1.0)
        hold_input_weights(self, torch.randn(vocab_size, units, generator=g) * norm,
                           torch.randn(vocab_size, units, generator=g) * norm, train_recurrence)
        # first of the modules, so its weight comes where it came when the model held it bare (a checkpoint's
        # optimizer state is in that order); gpt2_init leaves it at zero
        self.write_gate = WriteGate(vocab_size) if cfg.get("write_gate") else None
        self.project = nn.Sequential(nn.LayerNorm(2 * units), nn.Linear(2 * units, width))
        self.pos = LearnedPositions(seq_len, width)
        self.longest_context = seq_len
        self.drop = nn.Dropout(cfg["dropout"])
        self.blocks = nn.ModuleList(TransformerBlock(width, cfg["heads"], cfg["dropout"])
                                    for _ in range(cfg["layers"]))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, vocab_size))
        for module in self.modules():  # the transformer's (GPT-2's) initialisation, for an equal readout
            gpt2_init(module)
        if self.write_gate is not None and not train_recurrence:
            self.trained = "input+readout"

    def _load_from_state_dict(self, state_dict, prefix, *args):
        bare = prefix + "write_gate"  # a checkpoint from before the gate was a module holds it under this name
        if bare in state_dict:
            state_dict[bare + ".weight"] = state_dict.pop(bare)
        super()._load_from_state_dict(state_dict, prefix, *args)

    def _drive(self, ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """What each character writes into the reservoir, B u_t (gated where the write gate is on)."""
        drive_re, drive_im = self.b_re[ids], self.b_im[ids]
        if self.write_gate is not None:
            gate = self.write_gate(ids)
            drive_re, drive_im = drive_re * gate, drive_im * gate
        return drive_re, drive_im

    def features(self, ids: torch.Tensor) -> torch.Tensor:
        """The reservoir (frozen unless ``train_recurrence``): (Re h, Im h) for every position of the
        window (B, T, 2 units), from a zero state."""
        with torch.autocast(ids.device.type, enabled=False):  # frozen λ and B are buffers: no graph
            drive_re, drive_im = self._drive(ids)
            if self.recurrent:
                drive_re, drive_im = diagonal_scan(drive_re, drive_im, *eigenvalues(self))
            return torch.cat([drive_re, drive_im], dim=-1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.pos(self.project(self.features(ids)))
        x = self.drop(x)
        for block in self.blocks:
            x = self._checkpointed(block, x)
        return self.head(x)

    # generation: the reservoir's state and each block's keys and values are kept while the context fits the
    # window; past it the learned positions shift with every token, so the window is recomputed, as without a cache
    def begin_generation(self, ids):
        if ids.shape[1] > self.context_size:
            return self._window_logits(ids), None
        features = self.features(ids)
        units = features.shape[-1] // 2
        state = (features[:, -1, :units], features[:, -1, units:])
        x = self.drop(self.pos(self.project(features)))
        cache = []
        for block in self.blocks:
            x, kv = block(x, keep=True)
            cache.append(kv)
        return self.head(x)[:, -1, :].float(), (state, cache)

    def continue_generation(self, ids, carry):
        position = ids.shape[1] - 1
        if carry is None or position >= self.context_size:
            return self._window_logits(ids), None
        (h_re, h_im), cache = carry
        with torch.autocast(ids.device.type, enabled=False):
            drive_re, drive_im = (d[:, 0] for d in self._drive(ids[:, -1:]))
            if self.recurrent:  # h_t = λ h_{t-1} + B u_t, one step of the window's scan
                lam_re, lam_im = eigenvalues(self)
                h_re, h_im = lam_re * h_re - lam_im * h_im + drive_re, lam_re * h_im + lam_im * h_re + drive_im
            else:
                h_re, h_im = drive_re, drive_im
        x = self.drop(self.project(torch.cat([h_re, h_im], dim=-1)[:, None]) + self.pos.weight[position])
        kept = []
        for block, kv in zip(self.blocks, cache, strict=True):
            x, kv = block(x, past=kv, keep=True)
            kept.append(kv)
        return self.head(x)[:, -1, :].float(), ((h_re, h_im), kept)
