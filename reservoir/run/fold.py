"""Many same-shape points as one model: K models of one family, size and batch, folded so that every
weight carries a leading member axis and the K batches run as one of K x batch rows (horizontal fusion:
HFTA, Wang et al. 2021, arXiv 2102.02344). On a TPU chip or a GPU the group compiles and launches once
for all its members; each member keeps its own learning rate, weight decay, β2 and gradient clip, as
[K] tensors, so no member's setting is a Python float a compiled step would bake in.

Written here rather than taken from a library: torch.func's vmap has no batching rule for fused
attention's backward or for the LSTM (pytorch #117016, #134606; bench/bench_lockstep.py measures it),
and torch.optim takes one learning rate per parameter group, which cannot split a tensor's member axis.

A folded member is an ordinary point: ``fold`` takes K ordinary models, ``write_back`` returns each
member's weights to its own model, and ``MemberAdamW`` reads and writes each member's state in
torch.optim.AdamW's own form, so a member's checkpoint is a point's checkpoint, resumable alone or folded.
"""

from __future__ import annotations

import copy

import torch
from torch import nn
from torch.nn import functional as F

from reservoir.models.attention_readout import WriteGate
from reservoir.models.baselines import LearnedPositions, lstm_scan
from reservoir.platform.device import sequential_scan


class FoldedLinear(nn.Module):
    """K Linears as one batched product: rows (K x batch, ..., in), weights (K, out, in)."""

    def __init__(self, linears: list[nn.Linear]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in linears]))
        bias = [m.bias for m in linears]
        self.bias = None if bias[0] is None else nn.Parameter(torch.stack([b.detach() for b in bias]).unsqueeze(1))

    def forward(self, x):
        shape, members = x.shape, self.weight.shape[0]
        x = x.reshape(members, -1, shape[-1])
        y = torch.bmm(x, self.weight.mT) if self.bias is None else torch.baddbmm(self.bias, x, self.weight.mT)
        return y.reshape(*shape[:-1], y.shape[-1])


class FoldedEmbedding(nn.Module):
    """K tables as one of K x vocabulary rows, each member's ids offset to its own."""

    def __init__(self, embeddings: list[nn.Embedding]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in embeddings]))

    def forward(self, ids):
        members, vocab, width = self.weight.shape
        offset = (torch.arange(members, device=ids.device) * vocab).unsqueeze(1)
        return F.embedding(ids.reshape(members, -1) + offset, self.weight.reshape(-1, width)).reshape(*ids.shape, width)


class FoldedPositions(nn.Module):
    """K learned position tables: each member's rows (K x batch, T, C) get its own table's rows."""

    def __init__(self, tables: list[LearnedPositions]):
        super().__init__()
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in tables]))

    def forward(self, x, first_position: int = 0):
        rows = self.weight[:, None, first_position:first_position + x.shape[1]]
        return (x.reshape(self.weight.shape[0], -1, *x.shape[1:]) + rows).reshape(x.shape)


class FoldedWriteGate(FoldedEmbedding):
    """K write gates (one number a character each), each member's characters looked up in its own."""

    def forward(self, ids):
        return 2 * torch.sigmoid(super().forward(ids).float())


class FoldedLSTM(nn.Module):
    """K nn.LSTMs (batch first): each weight with a leading member axis, under nn.LSTM's names, run through
    the LSTM's own cell (``lstm_scan``: nn.LSTM's fused kernel has no folded form) as a loop over time; the LSTM
    model scans it with the device's ``time_scan`` where it has one (XLA)."""

    def __init__(self, lstms: list[nn.LSTM]):
        super().__init__()
        first = lstms[0]
        self.num_layers, self.hidden_size, self.dropout = first.num_layers, first.hidden_size, first.dropout
        for name, _ in first.named_parameters():
            self.register_parameter(name, nn.Parameter(torch.stack([getattr(m, name).detach() for m in lstms])))

    def forward(self, x, state=None):
        return lstm_scan(self, x, state, sequential_scan, self.training)


class FoldedNorm(nn.Module):
    """K LayerNorms, RMSNorms or GroupNorms: normalised once, without their affine, then scaled (and shifted)
    per member. Rows are (K x batch, ..., channels), a GroupNorm's (K x batch, channels)."""

    def __init__(self, norms: list[nn.Module]):
        super().__init__()
        first = norms[0]
        if isinstance(first, nn.GroupNorm):
            self.normalise = lambda x: F.group_norm(x, first.num_groups, None, None, first.eps)
        elif isinstance(first, nn.RMSNorm):
            shape = tuple(first.normalized_shape)
            self.normalise = lambda x: F.rms_norm(x, shape, None, first.eps)
        else:
            shape = tuple(first.normalized_shape)
            self.normalise = lambda x: F.layer_norm(x, shape, None, None, first.eps)
        self.weight = nn.Parameter(torch.stack([m.weight.detach() for m in norms]).unsqueeze(1))
        bias = getattr(first, "bias", None)
        self.bias = None if bias is None else nn.Parameter(torch.stack([m.bias.detach() for m in norms]).unsqueeze(1))

    def forward(self, x):
        shape = x.shape
        y = self.normalise(x).reshape(self.weight.shape[0], -1, shape[-1]) * self.weight
        return (y if self.bias is None else y + self.bias).reshape(shape)


FOLDED = {nn.Linear: FoldedLinear, nn.Embedding: FoldedEmbedding, nn.LayerNorm: FoldedNorm, nn.RMSNorm: FoldedNorm,
          nn.GroupNorm: FoldedNorm, LearnedPositions: FoldedPositions, WriteGate: FoldedWriteGate,
          nn.LSTM: FoldedLSTM}


class CannotFold(ValueError):
    """A model a fold would change: it trains as one point at a time, and the message says why."""


def why_not_fold(models: list[nn.Module]) -> str | None:
    """None where ``models`` fold into one that computes each member's own outputs; else why not, in a line."""
    return _try_fold(models)[1]


def why_not_here(models: list[nn.Module], scanned: bool) -> str | None:
    """Why a fold that computes its members' own outputs would still lose on this device, or None. Where points
    run nn.LSTM's fused kernel (not ``scanned``: device.scans_recurrences), it trains a point about 4x as fast as
    a fold of four runs its cell by hand (bench/README.md, "Several points on one core")."""
    if not scanned and any(isinstance(m, nn.RNNBase) for m in models[0].modules()):
        return ("off XLA, nn.LSTM's fused kernel trains a point about 4x as fast as a fold runs its cell by hand; "
                "it folds on a TPU chip")
    return None


def _structure(models: list[nn.Module]) -> str | None:
    """A parameter must sit in a module FOLDED has a folded form of; a buffer (a frozen draw, a rotary table) must
    be the same in every member, since the fold keeps one."""
    first = models[0]
    kind = type(first).__name__
    if any(type(m) is not type(first) for m in models):
        return f"its members are different models ({', '.join(sorted({type(m).__name__ for m in models}))})"
    shapes = [[p.shape for p in m.parameters()] for m in models]
    if any(s != shapes[0] for s in shapes):
        return "its members' weights differ in shape (another vocabulary or size)"
    modules = dict(first.named_modules())
    loose = [name for name, _ in first.named_parameters()
             if type(modules[name.rpartition(".")[0]]) not in FOLDED]
    if loose:
        return (f"{kind} has weights outside the modules a fold holds (Linear, Embedding, norms, LSTM) "
                f"({', '.join(loose[:4])}"
                f"{' ...' if len(loose) > 4 else ''}), and no folded form")
    others = [dict(m.named_buffers()) for m in models[1:]]
    for name, buffer in first.named_buffers():
        if any(o[name].shape != buffer.shape or not torch.equal(o[name], buffer) for o in others):
            owner = type(modules[name.rpartition(".")[0]]).__name__
            return (f"{kind}'s frozen {name} ({owner}) differs between its members' seeds, and {owner} has no "
                    "folded form that keeps a draw per member")
    return None


def _fold(models: list[nn.Module]) -> nn.Module:
    folded, members = copy.deepcopy(models[0]), [dict(m.named_modules()) for m in models]
    made = {name: FOLDED[type(module)]([m[name] for m in members])
            for name, module in members[0].items() if type(module) in FOLDED}
    for name, new in made.items():
        tied = [other for other, module in members[0].items() if isinstance(module, nn.Embedding)
                and isinstance(members[0][name], nn.Linear) and module.weight is members[0][name].weight]
        if tied:
            new.weight = made[tied[0]].weight
        parent, _, leaf = name.rpartition(".")
        setattr(folded.get_submodule(parent), leaf, new)
    return folded


PROBE_TOKENS = 5  # a probe's sequence: long enough for a position table, short enough to cost nothing


@torch.no_grad()
def _probe(models: list[nn.Module], folded: nn.Module) -> str | None:
    """Why the fold does not compute each member's own logits on a short probe, or None. A model may use a
    table in a way no module swap can see (a table looked up once for every row, not through its module)."""
    ids = torch.randint(0, 2, (len(models), 1, PROBE_TOKENS), generator=torch.Generator().manual_seed(0))
    modes = [m.training for m in models]
    try:
        for m in (*models, folded):
            m.eval()
        try:
            logits = folded(ids.flatten(0, 1).to(next(folded.parameters()).device))
        except RuntimeError as error:
            return f"its forward does not run on a fold ({str(error).splitlines()[0]})"
        own = torch.stack([m(ids[k].to(logits.device)) for k, m in enumerate(models)]).flatten(0, 1)
        if logits.shape != own.shape or not torch.allclose(logits, own, atol=1e-4, rtol=1e-4):
            return ("its folded logits are not its members' own (a table or a draw shared across rows that no "
                    "folded module holds)")
    finally:
        for m, mode in zip(models, modes, strict=True):
            m.train(mode)
    return None


def _try_fold(models: list[nn.Module]) -> tuple[nn.Module | None, str | None]:
    reason = _structure(models)
    if reason:
        return None, reason
    folded = _fold(models)
    reason = _probe(models, folded)
    return (None, reason) if reason else (folded, None)


def fold(models: list[nn.Module]) -> nn.Module:
    """One model whose every Linear, Embedding and norm holds the K models' weights (in that order); a
    Linear tied to an Embedding stays tied. Its input is the members' K batches as one, member-major. A
    short probe checks that it computes each member's own logits."""
    folded, reason = _try_fold(models)
    if reason:
        raise CannotFold(f"cannot fold {type(models[0]).__name__}: {reason}")
    folded.train(models[0].training)
    return folded


def member_view(tensor: torch.Tensor, like: torch.Tensor, k: int) -> torch.Tensor:
    """Member ``k``'s slice of a folded tensor (weights, gradients, moments), in its own model's shape."""
    return tensor[k].reshape(like.shape)


def write_back(folded: nn.Module, models: list[nn.Module]) -> None:
    """Each member's weights into its own model (a checkpoint, an evaluation, a record: as a point's)."""
    folded_params = dict(folded.named_parameters(remove_duplicate=False))
    with torch.no_grad():
        for k, model in enumerate(models):
            for name, p in model.named_parameters():
                p.copy_(member_view(folded_params[name], p, k))


def _per_member(values, members: int, device) -> torch.Tensor:
    values = torch.as_tensor(values, dtype=torch.float32, device=device)
    return values.expand(members).clone() if values.dim() == 0 else values


class MemberAdamW:
    """AdamW (Loshchilov & Hutter; torch.optim.AdamW's update, decoupled decay) over a fold's parameters,
    each member with its own learning rate, weight decay, β2 and step count: [K] tensors broadcast along the
    member axis. A parameter decays where it decays in a member alone (``decayed``: its name, from
    train.decayed_names), so the fold decays matrices only, as a point does.

    ``lr`` is a [K] tensor the training loop sets each step (the members' peaks times the schedule's share)."""

    def __init__(self, folded: nn.Module, decayed: set[str], lr, weight_decay, beta2, betas1: float = 0.9,
                 eps: float = 1e-8):
        named = list(folded.named_parameters())  # tied weights once, under their first owner's name
        self.names = [name for name, _ in named]
        self.params = [p for _, p in named]
        members = self.params[0].shape[0]
        device = self.params[0].device
        self.members, self.beta1, self.eps = members, betas1, eps
        self.lr = _per_member(lr, members, device)
        self.weight_decay = _per_member(weight_decay, members, device)
        self.beta2 = _per_member(beta2, members, device)
        self.decays = [name in decayed for name in self.names]
        self.step_count = torch.zeros(members, device=device)
        self.exp_avg = [torch.zeros_like(p) for p in self.params]
        self.exp_avg_sq = [torch.zeros_like(p) for p in self.params]
        self.moments = dict(zip(self.names, zip(self.exp_avg, self.exp_avg_sq, strict=True), strict=True))

    def _along(self, values: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return values.view(-1, *([1] * (p.dim() - 1)))

    @torch.no_grad()
    def clip(self, max_norm: float) -> torch.Tensor:
        """Each member's gradients scaled to at most ``max_norm`` (clip_grad_norm_'s rule, per member);
        the members' norms before clipping, [K]."""
        grads = [p.grad for p in self.params if p.grad is not None]
        norms = torch.stack([g.float().pow(2).flatten(1).sum(1) for g in grads]).sum(0).sqrt()
        scale = (max_norm / (norms + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(self._along(scale, g).to(g.dtype))
        return norms

    @torch.no_grad()
    def step(self, active: torch.Tensor | None = None) -> None:
        """One AdamW step for every member; ``active`` ([K] bool): members that step (a stopped member's
        weights and moments stay as they are)."""
        if active is None:
            self.step_count += 1
            beta1, beta2, lr = torch.full_like(self.lr, self.beta1), self.beta2, self.lr
        else:  # a stopped member's moments decay by 1 and take nothing; its rate is 0
            taking = active.float()
            self.step_count += taking
            beta1 = torch.where(active, self.beta1, 1.0)
            beta2, lr = torch.where(active, self.beta2, 1.0), self.lr * taking
        t = self.step_count.clamp(min=1)  # a member that never stepped: no 0/0 (its rate is 0 anyway)
        step_size = lr / (1 - self.beta1 ** t)
        correction2_sqrt = (1 - self.beta2 ** t).sqrt()
        stepping = [k for k, p in enumerate(self.params) if p.grad is not None]
        params, grads = [self.params[k] for k in stepping], [self.params[k].grad for k in stepping]
        ms, vs = [self.exp_avg[k] for k in stepping], [self.exp_avg_sq[k] for k in stepping]

        def along(values):  # a [K] vector viewed along each parameter's member axis
            return [self._along(values, p) for p in params]

        if active is not None:  # a stopped member's gradient (a NaN, perhaps) reaches nothing
            grads = [torch.where(keep, g, 0.0) for keep, g in zip(along(active), grads, strict=True)]
        # one call per operation over every parameter (torch's foreach kernels), not a Python loop of them
        torch._foreach_mul_(ms, along(beta1))
        torch._foreach_add_(ms, torch._foreach_mul(grads, along(1 - beta1)))
        torch._foreach_mul_(vs, along(beta2))
        torch._foreach_addcmul_(vs, grads, torch._foreach_mul(grads, along(1 - beta2)))
        decayed = [k for k, j in enumerate(stepping) if self.decays[j]]
        if decayed:
            factor = 1 - lr * self.weight_decay
            torch._foreach_mul_([params[k] for k in decayed], [self._along(factor, params[k]) for k in decayed])
        denominators = torch._foreach_sqrt(vs)
        torch._foreach_div_(denominators, along(correction2_sqrt))
        torch._foreach_add_(denominators, self.eps)
        updates = torch._foreach_div(ms, denominators)
        torch._foreach_mul_(updates, along(step_size))
        torch._foreach_sub_(params, updates)

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def member_state(self, k: int, model: nn.Module, optimizer: torch.optim.AdamW) -> dict:
        """Member ``k``'s moments and step in ``optimizer``'s own state_dict form (``optimizer`` built by
        train.adamw over ``model``): what its point's checkpoint holds."""
        by_name = self.moments
        own = dict(model.named_parameters())
        state = optimizer.state_dict()
        steps = self.step_count.detach().cpu()  # one transfer, no graph per member's index
        index = {id(p): i for i, p in enumerate(p for g in optimizer.param_groups for p in g["params"])}
        for name, p in own.items():
            if name not in by_name or id(p) not in index:
                continue
            m, v = by_name[name]
            state["state"][index[id(p)]] = {"step": steps[k].clone(),
                                            "exp_avg": member_view(m, p, k).clone(),
                                            "exp_avg_sq": member_view(v, p, k).clone()}
        return state

    def load_member_state(self, k: int, model: nn.Module, optimizer: torch.optim.AdamW) -> None:
        """The reverse of member_state: member ``k``'s moments and step from its point's ``optimizer``."""
        steps = set()
        with torch.no_grad():
            for name, p in model.named_parameters():
                state = optimizer.state.get(p)
                if name not in self.moments or not state:
                    continue
                m, v = self.moments[name]
                m[k].copy_(state["exp_avg"].reshape(m[k].shape))
                v[k].copy_(state["exp_avg_sq"].reshape(v[k].shape))
                steps.add(float(state["step"]))
            if steps:
                self.step_count[k] = max(steps)


def member_losses(logits: torch.Tensor, targets: torch.Tensor, members: int) -> torch.Tensor:
    """Each member's mean cross-entropy, [K], over its own rows of a folded batch: their sum's gradient is
    each member's own loss's gradient."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none").view(members, -1).mean(1)
