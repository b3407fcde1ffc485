"""A second FLOP convention: every floating-point operation a training step executes, element-wise work included.

    count = training_step(model, vocab_size, seq_len, weight_decay=0.1, grad_clip=1.0)
    count.flops(batch_size)          # one optimizer step of batch_size sequences, every float op counted

``flops.py``'s convention (the 6·N·D rule's, PaLM's) counts products only: a diagonal recurrence, a scan, a gate,
an activation, a norm and the optimizer cost nothing there. Frozen recurrences are almost all element-wise, so
under it a reservoir's recurrence is free and a transformer's attention is not. This convention counts both: a
counter over the ops a step dispatches (forward, backward, the gradient clip and AdamW's update), products by
``flops.py``'s formulas (torch's ``FlopCounterMode`` and this project's additions), every other float op by a
rule per op (``RULES``: FLOPs per element of its output, or of its input for a reduction; each is stated in
docs/configuration.md), data movement (views, copies, indexing, concatenation, selection) as 0. An elementary
function (exp, tanh, sigmoid, sqrt, ...) counts 1 per element, as an add does. An op on integers or booleans
(indices, masks, comparisons) is not a float op. A float op no rule names counts 1 per output element and is
listed (``uncounted``), so the count says what it guessed.

The step is counted on a CPU copy of the model at two sequences: the forward and backward work is linear in the
batch (``per_sequence``), the clip and the optimizer's work is per parameter (``per_step``); products and
element-wise work are kept apart, so the products reproduce ``flops.sgd_step``'s count.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.nn import functional as F
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import flop_registry

from reservoir.run.flops import FORMULAS, counter, host_copy
from reservoir.run.train import adamw

CONVENTION = ("every float op: products as the FLOP convention counts them, plus element-wise work by a rule per op "
              "(1 per element for arithmetic and elementary functions, reductions per input element, fused kernels "
              "by their operations), forward, backward, gradient clip and AdamW's update")

# FLOPs per element of an op's output (reductions: of its first input), by the op's name without a trailing "_"
# (in-place) and without "_foreach_" (a list of tensors: the rule for each). docs/configuration.md states each.
ONE = ("add", "sub", "rsub", "mul", "div", "neg", "reciprocal", "abs", "maximum", "minimum", "clamp", "clamp_min",
       "clamp_max", "pow", "sqrt", "rsqrt", "exp", "exp2", "log", "log2", "log1p", "expm1", "sin", "cos", "tanh",
       "sigmoid", "atan2", "erf", "relu", "threshold_backward", "floor", "ceil", "round", "sign", "square",
       "native_dropout_backward", "hardtanh_backward")
RULES_BY_OUTPUT = {
    **{name: 1 for name in ONE},
    "addcmul": 3, "addcdiv": 3, "lerp": 3,  # a + v·b·c, a + v·b/c, a + w·(b − a)
    "addmm": 1, "baddbmm": 1, "addbmm": 1,  # the add of C beside the product (the product: flops.py)
    "silu": 2, "silu_backward": 4, "gelu": 5, "gelu_backward": 8,  # x·σ(x); x/2·(1 + erf(x/√2))
    "tanh_backward": 3, "sigmoid_backward": 3,  # g·(1 − y²), g·y·(1 − y)
    "_softmax": 5, "_log_softmax": 5,  # max, subtract, exp, sum, divide (or log and subtract)
    "_softmax_backward_data": 4, "_log_softmax_backward_data": 4,  # g·y − y·Σ(g·y); g − e^y·Σg
    "native_layer_norm": 7, "native_layer_norm_backward": 14,  # mean, centre, square, variance, scale, affine (2)
    "native_group_norm": 7, "native_group_norm_backward": 14,  # the same, over each group
    "_fused_rms_norm": 5, "_fused_rms_norm_backward": 10,  # square, mean, rsqrt'd scale, weight
    "native_dropout": 2, "cumsum": 1, "cumprod": 1, "logcumsumexp": 3,
}
RULES_BY_INPUT = {"sum": 1, "mean": 1, "amax": 1, "amin": 1, "prod": 1, "linalg_vector_norm": 2, "norm": 2,
                  "var": 3, "std": 3, "logsumexp": 3,
                  "nll_loss_forward": None, "nll_loss_backward": None,  # per target: 1 (below)
                  "embedding_dense_backward": None, "index_add": None, "scatter_add": None,  # per source element
                  "index_put": None}  # with accumulate: per value
ATTENTION_FORWARD, ATTENTION_BACKWARD = 6, 5  # per score (the full T x T square): scale, mask, softmax; its backward
MOVES = ("view", "_unsafe_view", "reshape", "_reshape_alias", "t", "transpose", "permute", "expand", "slice",
         "select", "unsqueeze", "squeeze", "as_strided", "alias", "detach", "clone", "copy", "_to_copy",
         "contiguous", "cat", "stack", "split", "split_with_sizes", "unbind", "chunk", "narrow", "index",
         "index_select", "gather", "embedding", "where", "masked_fill", "triu", "tril", "flip", "roll",
         "repeat", "constant_pad_nd", "fill", "zero", "zeros_like", "ones_like", "empty_like", "new_zeros",
         "new_empty", "new_ones", "new_full", "full", "full_like", "zeros", "ones", "empty", "empty_strided",
         "scalar_tensor", "lift_fresh", "lift_fresh_copy", "arange", "linspace", "_local_scalar_dense",
         "view_as_real", "view_as_complex", "unfold", "scatter", "masked_select", "select_backward",
         "slice_backward", "expand_copy", "set_", "resize_", "_foreach_copy", "diagonal", "diag_embed",
         "rand", "randn", "bernoulli", "normal", "uniform", "randint", "randperm", "_pin_memory", "item",
         "clone_", "_conj", "real", "imag", "squeeze_copy", "unsqueeze_copy", "t_copy", "embedding_backward",
         "new_empty_strided", "unsafe_split", "unsafe_chunk", "unsafe_split_with_sizes")


def _float(t) -> bool:
    return isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())


def _elements(tree) -> int:
    """Float elements in a tensor or a list of them."""
    if isinstance(tree, torch.Tensor):
        return tree.numel() if _float(tree) else 0
    if isinstance(tree, (list, tuple)):
        return sum(_elements(t) for t in tree)
    return 0


def _tensors(tree) -> bool:
    """Whether ``tree`` is a tensor or a list holding one (an in-place list op returns none)."""
    if isinstance(tree, torch.Tensor):
        return True
    return isinstance(tree, (list, tuple)) and any(_tensors(t) for t in tree)


def _base(name: str) -> str:
    return name.removeprefix("_foreach_").removesuffix("_") if name not in RULES_BY_OUTPUT else name


def elementwise_flops(name: str, args: tuple, out) -> int | None:
    """The element-wise FLOPs of one call by RULES (None: no rule names it); products are not counted here."""
    base = _base(name)
    if base.startswith("_scaled_dot_product") and "attention" in base:
        backward = base.endswith("backward")  # its arguments start with the output's gradient
        query, key = args[1:3] if backward else args[:2]
        batch, heads, t_query, _ = query.shape
        per = ATTENTION_BACKWARD if backward else ATTENTION_FORWARD
        return per * batch * heads * t_query * key.shape[-2]
    if base in ("nll_loss_forward", "nll_loss_backward"):
        return args[2 if base == "nll_loss_backward" else 1].numel()  # the targets
    if base == "index_put":  # a write; with accumulate (the backward of an index), an add per value
        return _elements(args[2]) if len(args) > 3 and args[3] else 0
    if base in ("embedding_dense_backward", "index_add", "scatter_add"):
        return _elements(args[0] if base == "embedding_dense_backward" else args[-1])
    if base in RULES_BY_INPUT:
        return RULES_BY_INPUT[base] * _elements(args[0])
    if base in RULES_BY_OUTPUT:
        # an in-place list op returns nothing: its first argument is what it wrote
        written = out if _elements(out) else args[0]
        return RULES_BY_OUTPUT[base] * _elements(written)
    return None


class ElementwiseCounter(TorchDispatchMode):
    """Every float op dispatched under it: element-wise FLOPs by RULES, the ops no rule names by their output
    elements (``uncounted``: {op: calls}); products are left to ``flops.counter``, which runs beside it."""

    def __init__(self):
        super().__init__()
        self.flops = 0
        self.uncounted: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        packet = func._overloadpacket
        name = packet.__name__
        if name in MOVES or _base(name) in MOVES:
            return out
        if not _elements(out) and (_tensors(out) or not _elements(args[:1])):
            return out  # integers or booleans out (indices, masks, comparisons), or no tensor at all: not float work
        work = elementwise_flops(name, args, out)
        if work is None:
            if packet in flop_registry or packet in FORMULAS:  # a product, counted by flops.counter
                return out
            self.uncounted[str(packet)] += 1
            work = _elements(out)
        self.flops += work
        return out


@dataclass(frozen=True)
class StepCount:
    """One optimizer step's FLOPs under both conventions: per sequence of the batch (forward and backward) and per
    step (the clip and the optimizer), products and element-wise work apart."""

    products_per_sequence: float
    elementwise_per_sequence: float
    elementwise_per_step: float
    uncounted: dict = field(default_factory=dict)

    def flops(self, batch_size: int, micro_batches: int = 1) -> float:
        """Every float op of one step of ``micro_batches`` x ``batch_size`` sequences."""
        sequences = batch_size * micro_batches
        return (self.products_per_sequence + self.elementwise_per_sequence) * sequences + self.elementwise_per_step

    def products(self, batch_size: int, micro_batches: int = 1) -> float:
        """The FLOP convention's count of the same step (flops.sgd_step)."""
        return self.products_per_sequence * batch_size * micro_batches


COUNT_SEQUENCES = (2, 4)  # the step counted at two batches: what grows with the batch, and what does not


def _counted_step(model, vocab_size: int, seq_len: int, weight_decay: float, grad_clip: float, sequences: int
                  ) -> tuple[float, float, float, Counter]:
    """(products, element-wise work of the forward and backward, of the clip and update, uncounted ops) of one
    step on ``sequences`` sequences, on a fresh CPU copy of ``model``."""
    twin = host_copy(model)
    twin.train()
    ids = torch.randint(0, vocab_size, (sequences, seq_len + 1), generator=torch.Generator().manual_seed(0))
    optimizer = adamw(twin, {"WEIGHT_DECAY": weight_decay, "LEARNING_RATE": 1e-3}, 0.95, {"foreach": False})
    params = [p for group in optimizer.param_groups for p in group["params"]]
    with counter(FORMULAS) as products, ElementwiseCounter() as elementwise:
        logits = twin(ids[:, :-1])
        F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten()).backward()
    with ElementwiseCounter() as update:
        if grad_clip:  # torch's clip multiplies by its coefficient whether or not it clips: its norm and multiply
            torch.nn.utils.clip_grad_norm_(params, grad_clip, foreach=False)
        optimizer.step()
    return products.get_total_flops(), elementwise.flops, update.flops, elementwise.uncounted + update.uncounted


def training_step(model, vocab_size: int, seq_len: int, weight_decay: float, grad_clip: float,
                  sequences: tuple[int, int] = COUNT_SEQUENCES) -> StepCount:
    """Count one training step of ``model`` on ``seq_len``-token sequences (CPU copies): the forward, the
    cross-entropy and the backward, at two batches, give the work per sequence and the work a step does once (a
    decay mask, a rotation table, the eigenvalues' powers); the gradient clip and AdamW's update (the single-tensor
    kernel: the same arithmetic as the list kernels) are per step."""
    small, large = (_counted_step(model, vocab_size, seq_len, weight_decay, grad_clip, n) for n in sequences)
    extra = sequences[1] - sequences[0]
    per_sequence = (large[1] - small[1]) / extra
    return StepCount(products_per_sequence=(large[0] - small[0]) / extra, elementwise_per_sequence=per_sequence,
                     elementwise_per_step=small[1] - per_sequence * sequences[0] + small[2],
                     uncounted=dict(sorted((small[3] + large[3]).items())))
