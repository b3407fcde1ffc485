"""Training compute of every kind of fit, in FLOPs, measured once per model before it trains.

    cost = sgd_step(model, vocab_size, batch_size, seq_len, micro_batches)  # or ridge_fit, count_updates
    cost.flops(steps)                                              # FLOPs after ``steps`` steps

The convention (``CONVENTION``, recorded in every summary) is the one behind the 6·N·D rule and
PaLM's MFU formula, applied to every model alike: **products are counted, element-wise work is
not**. 2 FLOPs per multiply-add of

- every dense matrix product (mm, bmm, addmm, convolutions), forward and backward;
- every sparse matrix product by its non-zeros: the ESN's CSR recurrence W x is 2·nnz(W) per
  state column, not 2·units² (a dense count would charge ~90% of products that never happen);
- attention: QKᵀ and the attention-weighted sum of V, over the whole T x T square as PaLM
  counts it (causal masking not subtracted), backward twice forward (the products of the
  algorithm; a flash kernel's recomputation is not charged);
- the ridge solve: Cholesky n³/3 multiply-adds, its triangular solves n² per right-hand side.

Not counted, for any model: activations, norms, the diagonal linear recurrences (an
element-wise multiply-add per unit and step, like an LSTM's gates), sums by index (the ridge fit's
one-hot rows), embedding look-ups and optimizer updates. ``torch.utils.flop_counter`` does the
counting; this module adds the formulas its registry lacks (the CPU attention kernels, where it
counts 0, and sparse operands, which it counts as dense). The measurement runs on a CPU copy of
the model, so it adds no device work, and the count does not depend on precision or device. An op
that may do products but that no formula counts (an FFT, a custom kernel) is named in a warning the
first time a model is counted, and its family declares its cost (``Family.flops``, through ``declared``
as this module's own formulas are).

- Gradient-trained models: one forward and backward pass of one micro-batch of
  (BATCH_SIZE, SEQ_LEN) tokens, times GRAD_ACCUM x replicas per step. Fused recurrent kernels
  (nn.LSTM) run through a plain loop over time for the count: the fused kernel hides its products.
- Ridge fits: the fit itself is run on one chunk and on two chunks of BATCH_SIZE streams x
  SEQ_LEN tokens with the run's calibration tail: the difference is one chunk's cost (state
  harvest and the XᵀX, Xᵀy accumulation), the rest is the fixed cost (the solve and the calibration).
- N-grams do no floating-point products: their cost is counted as one operation per count update,
  ``order`` per training token (each token updates one count of every order), so a FLOP budget
  caps their tokens at FLOP_BUDGET / order.
"""

from __future__ import annotations

import copy
import re
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from reservoir.platform.device import sequential_scan
from reservoir.platform.messages import warn

CONVENTION = ("products only, 2 FLOPs per multiply-add: dense matrix products by shape, sparse ones by "
              "non-zeros, attention over the full T x T square (backward 2x forward), the ridge solve; "
              "element-wise work (activations, norms, diagonal recurrences, optimizer) not counted")
METHODS = {"sgd": "FlopCounterMode (matrix products, forward and backward)",
           "ridge": "FlopCounterMode (matrix products of the harvest, accumulation, solve and calibration)",
           "counts": "count updates (order per token)"}

aten = torch.ops.aten


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


# --------------------------------------------------------------------- formulas the counter lacks
# Each takes the operator's own arguments (raw tensors: ``_get_raw``) and returns FLOPs.


def _raw(formula):
    formula._get_raw = True  # FlopCounterMode passes tensors, not shapes: sparsity is visible
    return formula


def _shape(x) -> tuple:
    return tuple(x.shape) if isinstance(x, torch.Tensor) else tuple(x)  # a tensor, or a shape already


def _sparse(x) -> bool:
    return isinstance(x, torch.Tensor) and x.layout != torch.strided


def _product(a, b) -> int:
    """2 x the multiply-adds of a @ b: a dense operand by its shape, a sparse one by its non-zeros."""
    if _sparse(a):
        return 2 * int(a._nnz()) * _shape(b)[-1]
    if _sparse(b):
        return 2 * int(b._nnz()) * _shape(a)[0]
    (rows, inner), cols = _shape(a), _shape(b)[-1]
    return 2 * rows * inner * cols


@_raw
def _mm(a, b, *args, out_val=None, **kwargs) -> int:
    return _product(a, b)


@_raw
def _addmm(bias, a, b, *args, out_val=None, **kwargs) -> int:
    return _product(a, b)


def _attention_products(query: torch.Tensor, key: torch.Tensor) -> int:
    """2 x the multiply-adds of QKᵀ plus those of (scores)V: 4·B·H·Tq·Tk·D, the full square."""
    batch, heads, t_query, dim = _shape(query)
    return 4 * batch * heads * t_query * _shape(key)[-2] * dim


@_raw
def _attention(query, key, value, *args, out_val=None, **kwargs) -> int:
    return _attention_products(query, key)


@_raw
def _attention_backward(grad_out, query, key, value, *args, out_val=None, **kwargs) -> int:
    return 2 * _attention_products(query, key)  # gradients of Q, K (via the scores) and V, scores: 4 products


@_raw
def _cholesky(a, *args, out_val=None, **kwargs) -> int:
    return 2 * _shape(a)[-1] ** 3 // 3


@_raw
def _cholesky_solve(rhs, factor, *args, out_val=None, **kwargs) -> int:
    return 2 * _shape(factor)[-1] ** 2 * _shape(rhs)[-1]  # two triangular solves, n²/2 multiply-adds each


_ATTENTION = ("_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
              "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention")


def _conversion(*args, out_val=None, **kwargs) -> int:
    """A change of storage format (dense to a sparse layout): it moves numbers, it multiplies none."""
    return 0


# the ESNs' CSR, from a dense W or (past DENSE_UNITS) from its non-zeros through a COO tensor
_CONVERSIONS = ("_to_sparse_csr", "_to_sparse", "_to_sparse_csc", "_to_sparse_bsr", "to_sparse",
                "_sparse_coo_tensor_with_dims_and_tensors")


_FORMULAS_BY_NAME = {**{name: _conversion for name in _CONVERSIONS},
                     "mm": _mm, "addmm": _addmm, "linalg_cholesky_ex": _cholesky, "cholesky_solve": _cholesky_solve,
                     **{name: _attention for name in _ATTENTION},
                     **{f"{name}_backward": _attention_backward for name in _ATTENTION}}


def declared(by_name: dict) -> dict:
    """{aten op: formula} from {op name: formula}: how this module declares what torch's counter lacks, and how a
    family declares the cost of an op it calls that the counter counts as 0 (``Family.flops``). By name, so a torch
    release without one of these kernels (the XLA environment's 2.9) still imports this module; a formula takes the
    op's own arguments (raw tensors, as ``_raw`` marks) and returns FLOPs."""
    return {getattr(aten, name): _raw(formula) for name, formula in by_name.items() if hasattr(aten, name)}


FORMULAS = declared(_FORMULAS_BY_NAME)


def counter(formulas: dict = FORMULAS) -> FlopCounterMode:
    """torch's FLOP counter with this module's formulas (see the module docstring), or those and a family's."""
    return FlopCounterMode(display=False, custom_mapping=formulas)


# Ops whose names say they multiply and add (products by the convention) though torch's counter has no formula for
# them: a family that calls one is told, once, that its FLOPs miss them. Any op outside aten and prims is a kernel
# of its own (torch.library, Triton), whose cost nothing can know: told too.
_PRODUCT_NAMES = re.compile(r"(^|_)(mv|addmv|dot|vdot|mm|bmm|matmul|einsum|tensordot|fft|ifft|rfft|irfft|hfft|stft|"
                            r"conv|solve|cholesky|lu|qr|svd|eig|eigh|inv|inverse|lstsq|attention|sparse|linear)"
                            r"($|_)")
_SAID: set[tuple[str, str]] = set()


class _OpsSeen(TorchDispatchMode):
    """Every op the counted code calls, by how many times."""

    def __init__(self):
        super().__init__()
        self.calls: dict = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        packet = func._overloadpacket
        self.calls[packet] = self.calls.get(packet, 0) + 1
        return func(*args, **(kwargs or {}))


def uncounted_products(calls: dict, mapping: dict) -> dict[str, int]:
    """The ops in ``calls`` that look like products and that neither torch's counter nor ``mapping`` counts."""
    from torch.utils.flop_counter import flop_registry

    out = {}
    for packet, times in calls.items():
        if packet in flop_registry or packet in mapping:
            continue
        namespace, _, name = str(packet).partition(".")
        if namespace not in ("aten", "prims") or _PRODUCT_NAMES.search(name.lower()):
            out[str(packet)] = times
    return out


def _counted(fn, model=None) -> float:
    """FLOPs of ``fn()``; an op in it that may do products and that no formula counts is said once per model class,
    with how to declare its cost (its FLOPs would otherwise be silently low)."""
    formulas = {**FORMULAS, **declared(getattr(model, "declared_flops", None) or {})}
    with counter(formulas) as count, _OpsSeen() as seen:
        fn()
    missed = uncounted_products(seen.calls, formulas)
    kind = type(model).__name__ if model is not None else "this model"
    new = {op: times for op, times in missed.items() if (kind, op) not in _SAID}
    if new:
        _SAID.update((kind, op) for op in new)
        listed = ", ".join(f"{op} ({times} calls)" for op, times in sorted(new.items()))
        warn(f"FLOPs of {kind} leave out {listed}: torch's counter counts these as 0. Declare each one's cost in its "
             "family, Family(flops={'<op name>': formula}) (docs/extending.md), or its FLOP budgets and "
             "compute multipliers are low by their work")
    return float(count.get_total_flops())


def host_copy(model):
    """A CPU copy in which every product is visible to the counter: parts built on a fused recurrent
    kernel (nn.LSTM) loop over time in plain PyTorch; the rest keep their own loops (a reservoir's
    sparse recurrence stays sparse)."""
    twin = copy.deepcopy(model).to("cpu").float()
    for module in twin.modules():
        if hasattr(module, "time_scan"):
            fused = any(isinstance(child, nn.RNNBase) for child in module.children())
            module.time_scan = sequential_scan if fused else None
    return twin


def step_flops(model, step) -> float:
    """FLOPs of ``step(model)`` (one generation step, say) by the convention, counted on a CPU copy in which every
    product is visible (``host_copy``)."""
    twin = host_copy(model).eval()
    with torch.no_grad():
        return _counted(lambda: step(twin), twin)


COUNT_BATCH = 2  # sequences the count runs: every counted product is linear in the batch, so it scales


def sgd_step(model, vocab_size: int, batch_size: int, seq_len: int, steps_per_batch: int,
             count_batch: int | None = COUNT_BATCH, counts: dict | None = None) -> FitCost:
    """One optimizer step: forward + backward of ``steps_per_batch`` micro-batches of (batch_size, seq_len),
    counted on ``count_batch`` sequences (None: the whole batch) and scaled: a GPU-sized batch is not
    run on the host just to be counted (equal either way, tested). ``counts``: the counts made already of
    models of this one's shape, kept by the caller (a study's cells of one family and size differ only in
    batch size and learning rate, and a count takes a fifth of a second): each is made once."""
    counted = batch_size if count_batch is None else min(batch_size, count_batch)
    counts = {} if counts is None else counts
    if (counted, seq_len) not in counts:
        twin = host_copy(model)
        twin.train()
        ids = torch.randint(0, vocab_size, (counted, seq_len + 1), generator=torch.Generator().manual_seed(0))

        def step():
            logits = twin(ids[:, :-1])
            F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()).backward()

        counts[counted, seq_len] = _counted(step, twin)
    return FitCost(per_step=counts[counted, seq_len] * batch_size / counted * steps_per_batch)


def ridge_fit(model, chunk: tuple[torch.Tensor, torch.Tensor], calibration: list, washout: int) -> FitCost:
    """A ridge fit's cost from the fit itself, run on one and on two copies of ``chunk`` (on the CPU)."""
    chunk = tuple(t.cpu() for t in chunk)
    calibration = [tuple(t.cpu() for t in pair) for pair in calibration]

    def fit(chunks: int) -> float:
        twin = host_copy(model)
        return _counted(lambda: twin.fit_ridge([chunk] * chunks, calibration, washout=washout, carry_state=True),
                        twin)

    one, two = fit(1), fit(2)
    return FitCost(per_step=two - one, fixed=one - (two - one))


def count_updates(order: int) -> FitCost:
    """An n-gram: ``order`` count updates per training token (a step here is one token)."""
    return FitCost(per_step=float(order))
