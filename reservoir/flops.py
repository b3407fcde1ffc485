"""Training compute of every kind of fit, in FLOPs, measured once per model before it trains.

    cost = sgd_step(model, vocab_size, batch_size, seq_len, micro_batches)  # or ridge_fit, count_updates
    cost.flops(steps)                                              # FLOPs after ``steps`` steps

What is counted is what ``torch.utils.flop_counter.FlopCounterMode`` counts: matrix products
(mm, bmm, addmm, attention, convolutions), forward and backward. Element-wise work (activations,
the linear reservoir's diagonal recurrence, optimizer updates) is not counted: it is the same
convention as the 6·N·D rule of thumb, and it is what dominates every model here except the
n-gram. The measurement runs on a CPU copy of the model, so it adds no device work, and the
count does not depend on precision or device.

- Gradient-trained models: one forward and backward pass of one micro-batch of
  (BATCH_SIZE, SEQ_LEN) tokens, times GRAD_ACCUM x replicas per step. Recurrences run through a
  plain loop over time for the count (nn.LSTM's fused kernel hides its products from the counter).
- Ridge fits: the fit itself is run on one chunk and on two chunks of BATCH_SIZE streams x
  SEQ_LEN tokens with the run's calibration tail: the difference is one chunk's cost (state
  harvest and the XᵀX, Xᵀy accumulation), the rest is the fixed cost (the solve and the calibration).
- N-grams do no floating-point products: their cost is counted as one operation per count update,
  ``order`` per training token (each token updates one count of every order), so a FLOP budget
  caps their tokens at FLOP_BUDGET / order.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch.nn import functional as F
from torch.utils.flop_counter import FlopCounterMode

from .device import sequential_scan

METHODS = {"sgd": "FlopCounterMode (matrix products, forward and backward)",
           "ridge": "FlopCounterMode (matrix products of the harvest, accumulation, solve and calibration)",
           "counts": "count updates (order per token)"}


@dataclass(frozen=True)
class FitCost:
    """FLOPs of a fit: ``fixed`` once, plus ``per_step`` for each step (an SGD step, a ridge chunk)."""

    per_step: float
    fixed: float = 0.0

    def flops(self, steps: int) -> float:
        return self.fixed + self.per_step * steps

    def steps_within(self, flop_budget: float | None) -> int | None:
        """The most steps whose cost stays within ``flop_budget`` (None: no FLOP budget)."""
        if not flop_budget:
            return None
        return max(0, int((flop_budget - self.fixed) // self.per_step)) if self.per_step else None


def _counted(fn) -> float:
    with FlopCounterMode(display=False) as counter:
        fn()
    return float(counter.get_total_flops())


def _host_copy(model):
    """A CPU copy whose recurrences loop over time in plain PyTorch (every product visible)."""
    twin = copy.deepcopy(model).to("cpu").float()
    twin.use_time_scan(sequential_scan)
    return twin


def sgd_step(model, vocab_size: int, batch_size: int, seq_len: int, steps_per_batch: int) -> FitCost:
    """One optimizer step: forward + backward of ``steps_per_batch`` micro-batches of (batch_size, seq_len)."""
    twin = _host_copy(model)
    twin.train()
    ids = torch.randint(0, vocab_size, (batch_size, seq_len + 1), generator=torch.Generator().manual_seed(0))

    def step():
        logits = twin(ids[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()).backward()

    return FitCost(per_step=_counted(step) * steps_per_batch)


def ridge_fit(model, chunk: tuple[torch.Tensor, torch.Tensor], calibration: list, washout: int) -> FitCost:
    """A ridge fit's cost from the fit itself, run on one and on two copies of ``chunk`` (on the CPU)."""
    chunk = tuple(t.cpu() for t in chunk)
    calibration = [tuple(t.cpu() for t in pair) for pair in calibration]

    def fit(chunks: int) -> float:
        twin = _host_copy(model)
        return _counted(lambda: twin.fit_ridge([chunk] * chunks, calibration, washout=washout, carry_state=True))

    one, two = fit(1), fit(2)
    return FitCost(per_step=two - one, fixed=one - (two - one))


def count_updates(order: int) -> FitCost:
    """An n-gram: ``order`` count updates per training token (a step here is one token)."""
    return FitCost(per_step=float(order))
