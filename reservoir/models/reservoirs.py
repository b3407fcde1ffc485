"""The reservoir family: fixed random dynamics, trained readouts.

Reservoir weights are buffers, never parameters: no optimizer ever sees them.
Hyper-parameters carry the names the literature uses (Jaeger 2001; Lukoševičius
2012; Gallicchio 2017 for deep ESNs; Gauthier et al. 2021 for NVAR; Orvieto et
al. 2023 for diagonal linear recurrences).
"""

from __future__ import annotations

import functools
import hashlib
import math
import warnings
from typing import NamedTuple

import torch
from torch import nn

from reservoir.models.base import LanguageModel
from reservoir.models.ridge import RidgeAccumulator, fit_probability_floor, floor_logits
from reservoir.platform.messages import say


def _sparse_matrix(rows: int, cols: int, connectivity: float, generator: torch.Generator) -> torch.Tensor:
    """Gaussian weights, each kept with probability ``connectivity`` (at least one per row)."""
    weights = torch.randn(rows, cols, generator=generator)
    mask = torch.rand(rows, cols, generator=generator) < connectivity
    mask[torch.arange(rows), torch.randint(0, cols, (rows,), generator=generator)] = True
    return weights * mask


def _fixed_degree_draw(units: int, degree: int, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Each neuron's ``degree`` recurrent connections (Jaeger's sparse reservoirs): their columns and weights,
    (units, degree) each."""
    cols = torch.empty(units, degree, dtype=torch.int64)
    for row in range(units):  # copied out row by row: a kept slice would hold its whole permutation (8.6 GB at 32k)
        cols[row] = torch.randperm(units, generator=generator)[:degree]
    return cols, torch.randn(units, degree, generator=generator)


def _fixed_degree_matrix(units: int, degree: int, generator: torch.Generator) -> torch.Tensor:
    """``_fixed_degree_draw`` as a dense matrix."""
    cols, values = _fixed_degree_draw(units, degree, generator)
    return torch.zeros(units, units).scatter_(1, cols, values)


SAY_DRAWS_FROM_UNITS = 2048  # a dense eigendecomposition of this many units or more takes seconds
DENSE_UNITS = 4096  # up to here every eigenvalue, exactly, as the committed records were drawn; past it, ARPACK's


def scale_to_spectral_radius(weights: torch.Tensor, spectral_radius: float) -> torch.Tensor:
    """``weights`` scaled so their largest |eigenvalue| is ``spectral_radius``. Up to DENSE_UNITS units, every
    eigenvalue (a dense eigendecomposition, cubic in units: a 4,096-unit one takes about half a minute on one
    thread, and says so); past it, the largest alone, by ARPACK on the sparse matrix (scipy's ``eigs``, as
    reservoirpy scales its reservoirs): seconds at tens of thousands of units, within 1e-9 of the dense value."""
    units = weights.shape[0]
    if units > DENSE_UNITS:
        return weights * (spectral_radius / largest_eigenvalue_modulus(weights))

    def every_eigenvalue() -> float:
        if units >= SAY_DRAWS_FROM_UNITS:
            say(f"scaling a {units:,}-unit reservoir to spectral radius {spectral_radius:g}: all its eigenvalues, a "
                f"dense eigendecomposition whose time grows with units³ (about {_draw_seconds(units):,.0f} s on one "
                "CPU thread)")
        return torch.linalg.eigvals(weights.double()).abs().max().item()

    return weights * (spectral_radius / _remembered_radius([weights.numpy()], every_eigenvalue))


# spectral radii this process has computed, by the hash of the matrix's numbers: a study's FLOP count and PLAN's
# probes build the same draw for every rate and batch of a size, and a 4,096-unit decomposition takes half a minute
_RADII: dict[str, float] = {}


def _remembered_radius(arrays, compute) -> float:
    """``compute()``, the spectral radius of the matrix whose numbers are ``arrays``, or what it gave before for
    the same numbers: the same matrix always gets the same radius, so a draw scales as it did the first time."""
    import numpy as np

    digest = hashlib.sha256()
    for array in arrays:
        array = np.ascontiguousarray(array)
        digest.update(f"{array.dtype}{array.shape}".encode())
        digest.update(array.data)
    key = digest.hexdigest()
    if key not in _RADII:
        _RADII[key] = compute()
    return _RADII[key]


def largest_eigenvalue_modulus(weights) -> float:
    """The spectral radius of a sparse square matrix (a tensor, or scipy's sparse matrix), by ARPACK
    (implicitly restarted Arnoldi) from a fixed start, so a seed draws the same reservoir on every run. A random
    reservoir's eigenvalues fill a disc, many of them nearly as large as the largest, so it asks for the 16
    largest (in a 64-vector space) and keeps the top one: asked for one, ARPACK returned one 2.5% short in 1 of
    32 draws; asked for 16, every draw matched the dense value to 1e-13 (500-2,000 units; 0.8 s at 10,000
    units and 4.7 s at 32,768, one thread)."""
    import numpy as np
    from scipy.sparse import csr_matrix
    from scipy.sparse.linalg import eigs

    matrix = weights
    if isinstance(weights, torch.Tensor):
        rows, cols = weights.nonzero(as_tuple=True)
        matrix = csr_matrix((weights[rows, cols].double().numpy(), (rows.numpy(), cols.numpy())),
                            shape=weights.shape)
    matrix = matrix.tocsr()

    def largest() -> float:
        values = eigs(matrix, k=16, ncv=64, which="LM", tol=1e-10, v0=np.ones(matrix.shape[0]),
                      return_eigenvectors=False)
        return float(np.abs(values).max())

    return _remembered_radius([matrix.data, matrix.indices, matrix.indptr], largest)


def fixed_degree_entries(units: int, degree: int, generator: torch.Generator, spectral_radius: float):
    """``_fixed_degree_draw`` kept as its non-zeros, the numbers of ``_fixed_degree_matrix``: (2, nnz) row and
    column indices and (nnz,) values, scaled to ``spectral_radius`` by ARPACK. A 32,768-unit reservoir's W is then
    3.9 MB of values, not 4.3 GB dense: what a checkpoint holds and what its hash reads."""
    from scipy.sparse import csr_matrix

    cols, values = _fixed_degree_draw(units, degree, generator)
    rows = torch.arange(units).repeat_interleave(degree)
    index = torch.stack([rows, cols.flatten()])
    order = torch.argsort(index[0] * units + index[1])  # row-major: a CSR matrix's order
    index, values = index[:, order], values.flatten()[order]
    matrix = csr_matrix((values.double().numpy(), (index[0].numpy(), index[1].numpy())), shape=(units, units))
    return index, values * (spectral_radius / largest_eigenvalue_modulus(matrix))


def _draw_seconds(units: int) -> float:
    """A rough one-thread time for ``eigvals`` of a dense units x units double matrix: 2,048 units took 4 s on a
    2-core Xeon (units³ scaling)."""
    return 4 * (units / 2048) ** 3


def diagonal_scan(x_re: torch.Tensor, x_im: torch.Tensor, lam_re: torch.Tensor, lam_im: torch.Tensor,
                  state=None) -> tuple[torch.Tensor, torch.Tensor]:
    """h_t = λ ⊙ h_{t-1} + x_t over a window (B, T, units), complex numbers as real pairs, by a
    parallel (Hillis-Steele) scan: log2(T) elementwise steps, no loop over time, so it maps onto
    TPUs and differentiates with respect to x and λ. ``state`` = (Re h, Im h) before the
    window (B, units), else zero."""
    h_re, h_im = x_re, x_im
    p_re, p_im = lam_re, lam_im  # λ^d for the current stride d
    d, steps = 1, x_re.shape[1]
    while d < steps:
        add_re = p_re * h_re[:, :-d] - p_im * h_im[:, :-d]
        add_im = p_re * h_im[:, :-d] + p_im * h_re[:, :-d]
        h_re = torch.cat([h_re[:, :d], h_re[:, d:] + add_re], dim=1)
        h_im = torch.cat([h_im[:, :d], h_im[:, d:] + add_im], dim=1)
        p_re, p_im = p_re * p_re - p_im * p_im, 2 * p_re * p_im
        d *= 2
    if state is not None:  # + λ^(t+1) h_0: the carried state, decayed and rotated to each position
        radius = torch.sqrt(lam_re**2 + lam_im**2)
        phase = torch.atan2(lam_im, lam_re)
        k = torch.arange(1, steps + 1, device=x_re.device, dtype=radius.dtype)[:, None]
        q_re, q_im = radius**k * torch.cos(k * phase), radius**k * torch.sin(k * phase)  # (T, units)
        s_re, s_im = state[0][:, None, :], state[1][:, None, :]
        h_re = h_re + q_re * s_re - q_im * s_im
        h_im = h_im + q_re * s_im + q_im * s_re
    return h_re, h_im


def delayed_inputs(emb: torch.Tensor, delays: int, before: torch.Tensor | None = None) -> torch.Tensor:
    """Each position's vector and the ``delays - 1`` before it, concatenated newest first (B, T, delays * D).
    ``before``: the ``delays - 1`` vectors preceding the window (B, delays - 1, D); zeros if None."""
    if before is None:
        before = emb.new_zeros(emb.shape[0], delays - 1, emb.shape[2])
    history, steps = torch.cat([before, emb], dim=1), emb.shape[1]
    return torch.cat([history[:, delays - 1 - k: delays - 1 - k + steps] for k in range(delays)], dim=-1)


def multi_timescale_eigenvalues(units: int, tau_min: float, tau_max: float, max_phase: float,
                                generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """(radius, phase) of ``units`` eigenvalues whose time constants τ = -1/ln|λ| are spread
    log-uniformly over [tau_min, tau_max] steps (many memories at once, Manneschi et al. 2021),
    with phases uniform in [0, max_phase]."""
    log_tau = math.log(tau_min) + (math.log(tau_max) - math.log(tau_min)) * torch.rand(units, generator=generator)
    return torch.exp(-1 / torch.exp(log_tau)), max_phase * torch.rand(units, generator=generator)


def hold_eigenvalues(module: nn.Module, radius: torch.Tensor, phase: torch.Tensor, trained: bool) -> None:
    """Give ``module`` its recurrence's eigenvalues λ = radius·e^(i·phase): frozen buffers ``lam_re``,
    ``lam_im`` (what every reservoir keeps), or, for the unfrozen control (``train_recurrence``),
    trained parameters ``log_rate`` = log(-ln|λ|) = -log τ and ``phase``, which keep |λ| < 1 whatever
    the optimiser does (the LRU's exponential parametrisation, Orvieto et al. 2023; τ capped at a
    million steps so fp32 cannot round |λ| to 1). Read them with ``eigenvalues(module)``."""
    if trained:
        module.log_rate = nn.Parameter(torch.log(-torch.log(radius)))
        module.phase = nn.Parameter(phase.clone())
    else:
        module.register_buffer("lam_re", radius * torch.cos(phase))
        module.register_buffer("lam_im", radius * torch.sin(phase))


def hold_input_weights(module: nn.Module, b_re: torch.Tensor, b_im: torch.Tensor, trained: bool) -> None:
    """Give ``module`` the input weights ``b_re``, ``b_im`` (vocab, units) of a one-hot input: frozen
    buffers, or trained parameters for the unfrozen control."""
    for name, weights in (("b_re", b_re), ("b_im", b_im)):
        if trained:
            setattr(module, name, nn.Parameter(weights))
        else:
            module.register_buffer(name, weights)


def eigenvalues(module: nn.Module) -> tuple[torch.Tensor, torch.Tensor]:
    """(Re λ, Im λ) that ``hold_eigenvalues`` gave ``module``."""
    if not hasattr(module, "log_rate"):
        return module.lam_re, module.lam_im
    # τ at most 1e6 steps: a longer one rounds |λ| to 1 in fp32, and the recurrence stops decaying
    radius = torch.exp(-torch.exp(module.log_rate).clamp(min=1e-6))
    return radius * torch.cos(module.phase), radius * torch.sin(module.phase)


def _leaky_tanh_step(leak_rate: float, carry, drive_t):
    x, w = carry
    x = (1 - leak_rate) * x + leak_rate * torch.tanh(drive_t + w @ x)
    return (x, w), x.clone()


@functools.cache
def leaky_tanh_cell(leak_rate: float):
    """One step of the leaky-tanh recurrence for ``time_scan``: the matrix travels in the carry, since a
    scanned cell may not close over tensors; one object per leak rate, so the scan traces it once for every
    reservoir and model that shares the rate."""
    return functools.partial(_leaky_tanh_step, leak_rate)


class Reservoir(nn.Module):
    """Leaky-integrator tanh reservoir:

        x_t = (1 - leak_rate) x_{t-1} + leak_rate tanh(W x_{t-1} + W_in u_t + b)

    W is sparse with ``degree`` connections per neuron (or ``rc_connectivity``),
    rescaled so its largest |eigenvalue| is ``spectral_radius``. Inputs are
    token ids (one-hot u_t, so W_in u_t is a row lookup) or dense vectors.
    """

    def __init__(self, n_inputs: int, units: int, spectral_radius: float, leak_rate: float,
                 input_scaling: float, input_connectivity: float, bias_scaling: float,
                 degree: int | None, rc_connectivity: float, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.stored_sparse = bool(degree) and units > DENSE_UNITS
        if self.stored_sparse:  # W as its non-zeros: the dense matrix would be units² numbers
            index, values = fixed_degree_entries(units, degree, g, spectral_radius)
            self.register_buffer("w_index", index)
            self.register_buffer("w_value", values)
        else:
            w = (_fixed_degree_matrix(units, degree, g) if degree
                 else _sparse_matrix(units, units, rc_connectivity, g))
            self.register_buffer("w", scale_to_spectral_radius(w, spectral_radius))
        self.register_buffer("w_in", input_scaling * _sparse_matrix(n_inputs, units, input_connectivity, g))
        self.register_buffer("bias", bias_scaling * (2 * torch.rand(units, generator=g) - 1))
        self.units, self.leak_rate = units, leak_rate
        self.sparse = self.stored_sparse or bool(self.w.count_nonzero() < 0.05 * self.w.numel())
        self._w_csr = None  # a sparse copy for the recurrence where sparse kernels exist (CPU, CUDA)
        self.time_scan = None  # set by LanguageModel.use_time_scan: a compiled loop over time (XLA)

    def __getstate__(self):
        # The CSR layout is a cache of W (a copy or a pickle could not hold it: a CSR tensor has no storage).
        return {**super().__getstate__(), "_w_csr": None}

    def dense_matrix(self) -> torch.Tensor:
        """W as a dense (units, units) matrix, however it is stored (XLA's scan multiplies dense matrices)."""
        if not self.stored_sparse:
            return self.w
        return torch.zeros(self.units, self.units, device=self.w_value.device).index_put_(
            tuple(self.w_index), self.w_value)

    def _recurrent(self, x_cols: torch.Tensor, drive: torch.Tensor) -> torch.Tensor:
        """drive + W @ x for states stored as columns (units, B), in one kernel."""
        if self.sparse and x_cols.device.type in ("cpu", "cuda"):
            if self._w_csr is None or self._w_csr.device != x_cols.device:
                with warnings.catch_warnings():  # "sparse CSR support is in beta": CSR @ dense is solid
                    warnings.simplefilter("ignore", UserWarning)
                    self._w_csr = (torch.sparse_coo_tensor(self.w_index, self.w_value, (self.units, self.units))
                                   .coalesce().to_sparse_csr() if self.stored_sparse else self.w.to_sparse_csr())
            return torch.addmm(drive, self._w_csr, x_cols)
        return torch.addmm(drive, self.dense_matrix(), x_cols)

    def _drive(self, inputs: torch.Tensor, by_id: bool) -> torch.Tensor:
        """W_in u_t + b for every step, (T, units, B): one column per stream."""
        drive = self.w_in[inputs] if by_id else inputs.float() @ self.w_in
        return (drive + self.bias).permute(1, 2, 0).contiguous()

    @torch.no_grad()
    def forward(self, inputs: torch.Tensor, state: torch.Tensor | None = None):
        """inputs: ids (B, T) or vectors (B, T, n_inputs) -> states (B, T, units), last state (B, units).

        The states are stored (T, units, B), one column per stream, and returned as a view."""
        x = None if state is None else state.T.contiguous().float()
        a = self.leak_rate
        by_id = inputs.dtype in (torch.int64, torch.int32)
        if self.time_scan is not None:  # one compiled cell, however long the window
            drive = self._drive(inputs, by_id)
            x = torch.zeros_like(drive[0]) if x is None else x
            (x, _), states = self.time_scan(leaky_tanh_cell(a), (x, self.dense_matrix()), drive)
            return states.permute(2, 0, 1), x.T
        if by_id:  # W_in u_t + b is a column of this table, picked per step (no (T, units, B) drive array)
            table, ids = (self.w_in + self.bias).T.contiguous(), inputs.T.contiguous()
            steps = ids.shape[0]

            def drive_at(t):
                return table.index_select(1, ids[t])
        else:
            drive = self._drive(inputs, by_id)
            steps, drive_at = drive.shape[0], drive.__getitem__
        batch = inputs.shape[0]
        x = torch.zeros(self.units, batch, device=inputs.device) if x is None else x
        states = torch.empty(steps, self.units, batch, device=inputs.device)
        for t in range(steps):  # only the recurrence is sequential; three kernels a step, in place
            pre = self._recurrent(x, drive_at(t)).tanh_()
            x = torch.lerp(x, pre, a, out=states[t])
        return states.permute(2, 0, 1), x.T


class ReservoirLM(LanguageModel):
    """Fixed features (from ``features``) + a readout: 'ridge' (closed form),
    'softmax' (linear, cross-entropy) or 'mlp' (small nonlinear, cross-entropy).

    ``fit_stride``: the ridge readout is fitted on every fit_stride-th time step's state only
    (all states are still computed): a leaky reservoir's neighbouring states are nearly
    collinear, and XᵀX, the fit's main cost, shrinks by that factor."""

    trained = "readout"  # reservoir and input weights frozen: ridge, softmax or MLP readout alone
    fit_stride = 1

    def __init__(self, n_features: int, vocab_size: int, readout: str, ridge: float,
                 readout_hidden: int, include_input: bool):
        super().__init__()
        self.vocab_size, self.readout_kind, self.ridge = vocab_size, readout, ridge
        self.include_input = include_input
        n_features += vocab_size if include_input else 0
        self.n_features = n_features
        if readout == "ridge":
            self.trainer = "ridge"
            self.register_buffer("w_out", torch.zeros(n_features + 1, vocab_size))
            self.register_buffer("prob_floor", torch.tensor(1e-3))
        elif readout == "softmax":
            self.head = nn.Linear(n_features, vocab_size)
        elif readout == "mlp":
            self.head = nn.Sequential(nn.LayerNorm(n_features), nn.Linear(n_features, readout_hidden),
                                      nn.GELU(), nn.Linear(readout_hidden, vocab_size))
        else:
            raise ValueError(f"readout must be 'ridge', 'softmax' or 'mlp', got {readout!r}")

    def reservoir_features(self, ids: torch.Tensor, state=None):
        """(B, T, F) features, and the state to continue from (None if the model has none)."""
        raise NotImplementedError

    def dense_features(self, ids: torch.Tensor, state=None):
        """``reservoir_features`` in fp32, without the one-hot input features."""
        with torch.autocast(ids.device.type, enabled=False):  # fixed dynamics stay in fp32
            return self.reservoir_features(ids, state)

    def features(self, ids: torch.Tensor, state=None, return_state: bool = False, dense=None):
        """The readout's input: the dense features (``dense``, if computed already) and the one-hot input."""
        feats, state = self.dense_features(ids, state) if dense is None else (dense, None)
        if self.include_input:
            feats = torch.cat([feats, nn.functional.one_hot(ids, self.vocab_size).float()], dim=-1)
        return (feats, state) if return_state else feats

    def readout(self, feats: torch.Tensor) -> torch.Tensor:
        if self.readout_kind == "ridge":  # solved and calibrated in fp32: evaluated in fp32, autocast or not
            with torch.autocast(feats.device.type, enabled=False):
                return floor_logits(feats.float() @ self.w_out[:-1] + self.w_out[-1], self.prob_floor)
        return self.head(feats)

    def forward(self, ids: torch.Tensor, blocks: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, V) for ids (B, T) from a zero state; or, given ``blocks``, their dense features harvested
        in streams (reservoir/run/harvest.py) and stored time-major, (T, F, B), as a reservoir writes its states:
        the readout of those alone. A softmax readout multiplies the blocks as they lie, one (V x F) @ (F x B)
        product a time step: the (B, T, F + V) features are never copied together (at 2,000 units that copy was
        a sixth of a step)."""
        if blocks is None:
            return self.readout(self.features(ids))
        if self.readout_kind != "softmax":
            return self.readout(self.features(ids, dense=blocks.permute(2, 0, 1)))
        dense = blocks.shape[1]
        logits = torch.matmul(self.head.weight[:, :dense], blocks)  # (T, V, B)
        if self.include_input:  # the one-hot input's product: a column of the weights per position
            logits = logits + self.head.weight[:, dense:][:, ids.T].transpose(0, 1)
        return (logits + self.head.bias[:, None]).permute(2, 0, 1)

    def forward_stream(self, ids, state):
        feats, state = self.features(ids, state, return_state=True)
        return self.readout(feats), state

    def fixed_param_count(self) -> int:
        fixed = super().fixed_param_count()
        if self.readout_kind == "ridge":  # the ridge readout is trained, in closed form
            fixed -= int(torch.count_nonzero(self.w_out)) + 1
        return fixed

    def param_counts(self) -> dict[str, int]:
        counts = super().param_counts()
        if self.readout_kind == "ridge":
            counts["params_trainable"] += self.w_out.numel()
            counts["params_total"] += self.w_out.numel()
        return counts

    @torch.no_grad()
    def fit_ridge(self, batches, calibration_batches, all_reduce_sum=None, washout: int = 0,
                  carry_state: bool = False, materialize=None) -> dict:
        """One streaming pass over ``batches`` of (ids, targets): accumulate, solve, calibrate.

        ``carry_state``: the batches are consecutive time chunks of the same streams,
        so each chunk starts from the state the previous one ended in (washout once).
        ``materialize()``, if given, is called once each chunk's features and state
        exist (a lazy backend computes them there, once, instead of chaining chunks).
        """
        one_hot = self.vocab_size if self.include_input else 0
        acc = RidgeAccumulator(self.n_features - one_hot, self.vocab_size, one_hot=one_hot)
        state = None
        for ids, targets in batches:
            feats, new_state = self.dense_features(ids, state)
            if materialize is not None:
                materialize()
            # time-major (T, B, ...): a reservoir stores its states (T, units, B), so this flattens cheaply
            kept = slice(washout if state is None else 0, None, self.fit_stride)
            feats, targets, ids = feats.transpose(0, 1)[kept], targets.T[kept], ids.T[kept]
            acc.add(feats, targets, ids if one_hot else None)
            state = new_state if carry_state else None
        if all_reduce_sum is not None:
            acc.reduce(all_reduce_sum)
        weights = acc.solve(self.ridge)
        self.w_out.copy_(weights.to(self.w_out))
        w, b = self.w_out[:-1], self.w_out[-1]
        scores = torch.cat([(self.features(ids) @ w + b).cpu() for ids, _ in calibration_batches])
        targets = torch.cat([t.cpu() for _, t in calibration_batches])
        floor = fit_probability_floor(scores, targets)
        self.prob_floor.fill_(floor)
        return {"ridge_samples": acc.count, "prob_floor": floor}


def _esn_kwargs(cfg: dict, seed: int) -> dict:
    return dict(spectral_radius=cfg["spectral_radius"], leak_rate=cfg["leak_rate"],
                input_scaling=cfg["input_scaling"], input_connectivity=cfg["input_connectivity"],
                bias_scaling=cfg["bias_scaling"], degree=cfg["degree"] or None,
                rc_connectivity=cfg["rc_connectivity"], seed=seed)


class ESN(ReservoirLM):
    """Echo state network LM: one leaky tanh reservoir driven by one-hot tokens.

    Frozen: the reservoir (W, W_in, bias). Trained: the readout. Evaluated as a stream, its
    state carried through the text; the ridge fit carries state across training chunks too.
    """

    stream_kind = "recurrent"

    def __init__(self, vocab_size: int, cfg: dict, seed: int):
        super().__init__(cfg["units"], vocab_size, cfg["readout"], cfg["ridge"], cfg["readout_hidden"],
                         cfg["include_input"])
        self.reservoir = Reservoir(vocab_size, cfg["units"], **_esn_kwargs(cfg, seed))
        self.fit_stride = cfg["fit_stride"]

    def reservoir_features(self, ids, state=None):
        return self.reservoir(ids, state)

    def initial_state(self, batch, device):
        return torch.zeros(batch, self.reservoir.units, device=device)


class DeepESN(ReservoirLM):
    """Stacked reservoirs (Gallicchio et al.): layer l is driven by layer l-1's states;
    the readout sees every layer's states. Frozen: every reservoir; trained: the readout.
    Evaluated as a stream, every layer's state carried."""

    stream_kind = "recurrent"

    def __init__(self, vocab_size: int, cfg: dict, seed: int):
        units, layers = cfg["units"], cfg["layers"]
        super().__init__(units * layers, vocab_size, cfg["readout"], cfg["ridge"], cfg["readout_hidden"],
                         cfg["include_input"])
        kwargs = _esn_kwargs(cfg, seed)
        stack = []
        for layer in range(layers):
            kwargs["seed"] = seed + 1000 * layer
            stack.append(Reservoir(vocab_size if layer == 0 else units, units, **kwargs))
            kwargs["input_scaling"] = cfg["inter_scaling"]
            kwargs["input_connectivity"] = cfg["inter_connectivity"]
        self.layers = nn.ModuleList(stack)

    def reservoir_features(self, ids, state=None):
        states, last, inputs = [], [], ids
        for layer, reservoir in enumerate(self.layers):
            inputs, final = reservoir(inputs, None if state is None else state[layer])
            states.append(inputs)
            last.append(final)
        return torch.cat(states, dim=-1), last

    def initial_state(self, batch, device):
        return [torch.zeros(batch, reservoir.units, device=device) for reservoir in self.layers]


class LinearReservoir(LanguageModel):
    """A fixed diagonal complex linear recurrence h_t = λ ⊙ h_{t-1} + B u_t with
    |λ| on a ring [r_min, r_max] and random phases, computed for the whole window
    by a parallel (Hillis-Steele) scan: log2(T) elementwise steps, no loop over
    time, so it maps well onto TPUs. A trained nonlinear readout (an MLP over
    Re h, Im h and a trained token embedding) makes the model universal.
    Complex numbers are kept as real pairs so every backend runs it.

    Frozen: λ and B. Trained: the embedding and the readout, on independent windows from a zero
    state. Evaluated as a stream, the state h carried from chunk to chunk. ``train_recurrence=True``
    trains λ and B too (the unfrozen control).
    """

    stream_kind = "recurrent"

    def __init__(self, vocab_size: int, cfg: dict, seed: int):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        units = cfg["units"]
        train_recurrence = cfg["train_recurrence"]
        self.trained = "everything" if train_recurrence else "input+readout"
        radius = cfg["r_min"] + (cfg["r_max"] - cfg["r_min"]) * torch.rand(units, generator=g)
        phase = cfg["max_phase"] * torch.rand(units, generator=g)
        hold_eigenvalues(self, radius, phase, train_recurrence)
        # sqrt(1 - r²) keeps every unit's stationary variance the same whatever its memory
        norm = torch.sqrt(1 - radius**2) * cfg["input_scaling"] / math.sqrt(2)
        hold_input_weights(self, torch.randn(vocab_size, units, generator=g) * norm,
                           torch.randn(vocab_size, units, generator=g) * norm, train_recurrence)
        self.embed = nn.Embedding(vocab_size, cfg["embed_dim"])
        width = 2 * units + cfg["embed_dim"]
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, cfg["readout_hidden"]), nn.GELU(),
                                  nn.Linear(cfg["readout_hidden"], vocab_size))

    def scan(self, ids: torch.Tensor, state=None) -> tuple[torch.Tensor, torch.Tensor]:
        """h for every position; from ``state`` = (Re h, Im h) before the window, else from zero."""
        return diagonal_scan(self.b_re[ids], self.b_im[ids], *eigenvalues(self), state)

    def initial_state(self, batch, device):
        zeros = torch.zeros(batch, self.b_re.shape[1], device=device)
        return zeros, zeros.clone()

    def forward_stream(self, ids, state):
        with torch.autocast(ids.device.type, enabled=False):
            h_re, h_im = self.scan(ids, (state[0].float(), state[1].float()))
        logits = self.head(torch.cat([h_re, h_im, self.embed(ids)], dim=-1))
        return logits, (h_re[:, -1], h_im[:, -1])

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        with torch.autocast(ids.device.type, enabled=False):  # frozen λ and B are buffers: no graph
            h_re, h_im = self.scan(ids)
        # the readout is the only checkpointed part; its input carries the embedding's grad (and the
        # recurrence's, when it is trained)
        return self._checkpointed(self.head, torch.cat([h_re, h_im, self.embed(ids)], dim=-1))


class NVAR(ReservoirLM):
    """Next-generation reservoir computing: the last ``delays`` inputs (through a
    fixed random token embedding) and all their quadratic monomials. Frozen: the embedding;
    trained: the readout. No state: evaluated on overlapping windows like the transformer."""

    def __init__(self, vocab_size: int, cfg: dict, seed: int):
        delays, dim = cfg["delays"], cfg["input_dim"]
        linear = delays * dim
        super().__init__(linear + linear * (linear + 1) // 2, vocab_size, cfg["readout"], cfg["ridge"],
                         cfg["readout_hidden"], cfg["include_input"])
        g = torch.Generator().manual_seed(seed)
        self.register_buffer("embedding", torch.randn(vocab_size, dim, generator=g) / math.sqrt(dim))
        i, j = torch.triu_indices(linear, linear)
        self.register_buffer("pair_i", i, persistent=False)
        self.register_buffer("pair_j", j, persistent=False)
        self.delays = delays

    def fixed_param_count(self) -> int:
        return self.embedding.numel()

    def reservoir_features(self, ids, state=None):  # stateless: a window of delayed inputs
        linear = delayed_inputs(self.embedding[ids], self.delays)
        return torch.cat([linear, linear[..., self.pair_i] * linear[..., self.pair_j]], dim=-1), None


class FrozenRecurrenceBlock(nn.Module):
    """One layer of a frozen-recurrence deep SSM: x + mix(h), where h_t = λ ⊙ h_{t-1} + B LN(x_t).

    Frozen: λ (multi-timescale radii, random phases). Trained: the input projection B and the
    mixing MLP over (Re h, Im h). B's rows are scaled by sqrt(1 - |λ|²) so a unit's stationary
    variance does not depend on its memory.
    """

    def __init__(self, width: int, hidden: int, dropout: float, drawn: tuple[torch.Tensor, torch.Tensor],
                 train_recurrence: bool = False):
        """``drawn``: λ's (radius, phase) per unit, as ``multi_timescale_eigenvalues`` draws them;
        ``train_recurrence``: train them too (the unfrozen control)."""
        super().__init__()
        radius, phase = drawn
        self.units = units = len(radius)
        hold_eigenvalues(self, radius, phase, train_recurrence)
        self.norm = nn.LayerNorm(width)
        self.project_in = nn.Linear(width, 2 * units, bias=False)
        self.mix = nn.Sequential(nn.Linear(2 * units, hidden), nn.GELU(), nn.Linear(hidden, width),
                                 nn.Dropout(dropout))  # one dropout per block: CPU draws its masks slowly

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        state_dict.pop(prefix + "in_norm", None)  # checkpoints before it was derived from λ stored it
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor, state=None):
        lam_re, lam_im = eigenvalues(self)
        in_norm = torch.sqrt(1 - lam_re**2 - lam_im**2).repeat(2)  # from λ: no second frozen tensor
        drive = self.project_in(self.norm(x)) * in_norm
        with torch.autocast(x.device.type, enabled=False):  # the recurrence sums ~1000 steps: fp32
            drive_re, drive_im = drive.float().chunk(2, dim=-1)
            h_re, h_im = diagonal_scan(drive_re, drive_im, lam_re, lam_im, state)
        y = self.mix(torch.cat([h_re, h_im], dim=-1).to(x.dtype))
        return x + y, (h_re[:, -1], h_im[:, -1])


class DeepLinearState(NamedTuple):
    """A deep linear reservoir's stream state: each layer's (Re h, Im h), each (B, units), and the
    embeddings of the last ``taps - 1`` tokens (B, taps - 1, embed_dim) that the next chunk's taps
    reach back to."""

    layers: tuple[tuple[torch.Tensor, torch.Tensor], ...]
    recent: torch.Tensor


class DeepLinearReservoir(LanguageModel):
    """A stack of frozen diagonal linear recurrences with trained nonlinear mixing between them
    (a frozen-recurrence deep state-space model: LRU, Orvieto et al. 2023, with its eigenvalues
    drawn and never trained, as Guan et al. 2025 test; the LMU, Voelker et al. 2019, keeps its
    memory fixed the same way). The input sees the last ``taps`` tokens explicitly (NVAR-style
    delays, Gauthier et al. 2021), so the recurrences need not carry the last few characters.

    Frozen: every layer's eigenvalues λ (time constants log-uniform over [tau_min, tau_max]
    characters). Trained: the token embedding, the taps' projection, each layer's input
    projection and mixing MLP, the readout. ``train_recurrence=True`` trains λ too (the unfrozen
    control).

    Trained on independent ``SEQ_LEN`` windows from a zero state, it is evaluated like the
    transformer, on overlapping windows (and generates from the last ``SEQ_LEN`` tokens): its slow
    units reach in a window only part of the variance a whole stream builds up in them, and the
    mixing layers have never seen the rest (measured on the real slices at 480 s, dropout 0.1:
    1.775 bits/char with the state carried through the stream, 1.572 on windows from a zero state).
    ``forward_stream`` still carries every layer's state (and the last taps - 1 embeddings),
    exactly: a model trained on carried state could be evaluated that way.
    """

    def __init__(self, vocab_size: int, cfg: dict, seed: int, seq_len: int):
        super().__init__()
        self.context_size = seq_len
        self.trained = "everything" if cfg["train_recurrence"] else "all but recurrence"
        g = torch.Generator().manual_seed(seed)
        width, taps = cfg["width"], cfg["taps"]
        self.taps = taps
        self.embed = nn.Embedding(vocab_size, cfg["embed_dim"])
        self.project_taps = nn.Linear(taps * cfg["embed_dim"], width)
        self.drop = nn.Dropout(cfg["dropout"])
        self.blocks = nn.ModuleList(
            FrozenRecurrenceBlock(width, cfg["mix_hidden"], cfg["dropout"], multi_timescale_eigenvalues(
                cfg["units"], cfg["tau_min"], cfg["tau_max"], cfg["max_phase"], g), cfg["train_recurrence"])
            for _ in range(cfg["layers"]))
        self.head = nn.Sequential(nn.LayerNorm(width), nn.Linear(width, vocab_size))

    def _run(self, ids: torch.Tensor, state: DeepLinearState | None):
        """(logits, state after ``ids``); ``state`` None: a window from a zero state (training)."""
        emb = self.embed(ids)
        before = None if state is None else state.recent.to(emb.dtype)
        x = self.drop(self.project_taps(delayed_inputs(emb, self.taps, before)))
        finals = []
        for layer, block in enumerate(self.blocks):
            if state is None:
                x, final = self._checkpointed(block, x)
            else:
                h_re, h_im = state.layers[layer]
                x, final = block(x, (h_re.float(), h_im.float()))
            finals.append(final)
        history = emb if before is None else torch.cat([before, emb], dim=1)
        recent = history[:, history.shape[1] - (self.taps - 1):]  # what the next chunk's taps reach back to
        return self.head(x), DeepLinearState(tuple(finals), recent)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self._run(ids, None)[0]

    def initial_state(self, batch, device) -> DeepLinearState:
        units = self.blocks[0].units
        layers = tuple((torch.zeros(batch, units, device=device), torch.zeros(batch, units, device=device))
                       for _ in self.blocks)
        return DeepLinearState(layers, torch.zeros(batch, self.taps - 1, self.embed.embedding_dim, device=device))

    def forward_stream(self, ids, state):
        return self._run(ids, state)
