"""How every model is scored on validation text, the same tokens and characters for all.

    evaluate = Evaluator(data, config, batch_size, tokens=config["EVAL_TOKENS"])
    result = evaluate(model, info, device)          # val_loss, val_ppl, val_bpc (+ val_bpc_ci95 with keep=True)
    evaluate.paired_difference(evaluate.token_nats(a, ...), evaluate.token_nats(b, ...))  # A - B, paired

The scored tokens are the first ``tokens`` targets of the validation split, one contiguous
stream (stories joined by the end-of-story token). Two modes:

- ``stream`` (default): models with state (ESN, deep ESN, linear reservoir, LSTM) read the
  stream chunk by chunk, ``SEQ_LEN`` tokens at a time, carrying their state, as a recurrent
  model is used and as reservoirpy reports it. Models with a finite context (transformer,
  NVAR, n-gram) score overlapping windows of ``SEQ_LEN`` tokens with stride ``EVAL_STRIDE``
  (default ``SEQ_LEN // 2``), each token scored once, with at least ``SEQ_LEN - stride`` tokens
  of context (the first window's tokens with what precedes them): the standard way
  character-level numbers are reported.
- ``windows``: every model scores non-overlapping ``SEQ_LEN`` windows from an empty context
  (recurrent models lose their state at each window's start).

``context_scores`` asks what context is worth: every model on overlapping windows of 32, 128 and
512 tokens (mode ``sliding``: the window protocol for recurrent models too), and every model that
can carry its state (``forward_stream``) through the whole stream (mode ``carried``).

Every batch and chunk has one shape (zero-weight padding), so on XLA one graph serves every
evaluation, and with ``COMPILE=True`` on CPU and CUDA one ``torch.compile`` graph each way of calling the model
(windows, a chunk with its state); losses stay on the device and are read once. Bits per character divide the summed
loss by the exact characters the scored tokens stand for. A 95% interval comes from a bootstrap
over story-aligned blocks of the scored tokens (fixed-size blocks when stories are too long).
"""

from __future__ import annotations

import contextlib
import math
from dataclasses import dataclass, field

import numpy as np
import torch
from torch.nn import functional as F

from reservoir.data.tokens import TokenData
from reservoir.platform import device as dev

BOOTSTRAP_SAMPLES = 1000
MIN_BLOCKS = 20  # fewer stories than this in the scored text: fixed-size blocks instead
FIXED_BLOCK_TOKENS = 1024


def scored_count(data: TokenData, tokens: int | None, split: str = "val") -> int:
    """How many targets an evaluation scores: ``tokens``, or the whole split (None), at most the split."""
    available = len(getattr(data, split)) - 1
    return available if tokens is None else max(1, min(tokens, available))


def _window_logits(model, ids):
    return model(ids)


def _stream_logits(model, ids, state):
    return model.forward_stream(ids, state)


@contextlib.contextmanager
def _evaluating(model):
    """``model`` in eval mode, put back in the mode it was in."""
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)


def _reading(info: dev.DeviceInfo, device: torch.device):
    """(whether the model is read on the run's device, the context its forward passes run in there): a host
    model (the n-gram) is read on the CPU as it is, a device's under its autocast."""
    on_device = device == info.device
    return on_device, (contextlib.nullcontext if not on_device else (lambda: dev.autocast(info)))


class ModelCalls:
    """The two ways an evaluation calls a model, ``windows(model, ids)`` and ``stream(model, ids, state)``: eager,
    or with ``compile`` (COMPILE=True) compiled on CPU and CUDA, graphs kept beside the fit's training step.
    Shared by a fit's evaluators, so each shape compiles once in a fit and a failure is said once."""

    def __init__(self, compile: bool = False):
        self.compile, self._calls = bool(compile), None
        self.training_step: dev.CompiledStep | None = None  # the fit's, once it trains: its failure is theirs

    def follow(self, training_step: dev.CompiledStep) -> None:
        """Run eager, without a second line, where the fit's training step could not compile: whatever stopped
        it (no C++ compiler, most often) stops these too."""
        self.training_step = training_step

    def _step_failed(self) -> str | None:
        return None if self.training_step is None else self.training_step.failed

    def of(self, info: dev.DeviceInfo, on_device: bool, name: str = "evaluation"):
        """(windows, stream): compiled where asked for and the model runs on the device (not the host's n-gram)."""
        if not (self.compile and on_device) or self._step_failed():
            return _window_logits, _stream_logits
        if self._calls is None:
            self._calls = tuple(dev.CompiledStep(fn, info, True, name, what="model calls", fresh=False)
                                for fn in (_window_logits, _stream_logits))
        return self._calls

    def report(self) -> dict:
        """For the fit's record: whether the evaluations ran compiled, the graphs they compiled and their
        seconds, and the calls that compiled again for a shape compiled before; nothing where not asked."""
        if self.compile and self._step_failed():
            return {"eval_compiled": False, "eval_compile_failed": f"the training step's: {self._step_failed()}"}
        if not self.compile or self._calls is None or not any(c.wanted for c in self._calls):
            return {}
        failed = next((c.failed for c in self._calls if c.failed), None)
        return {"eval_compiled": failed is None, "eval_compile_failed": failed,
                "eval_graphs": sum(c.compiles for c in self._calls),
                "eval_compile_seconds": round(sum(c.compile_seconds for c in self._calls), 3),
                "eval_recompiles": sum(c.recompiled_shapes for c in self._calls)}


@dataclass
class Evaluations:
    """What a fit scores itself with: ``periodic`` on EVAL_TOKENS, ``final`` on FINAL_EVAL_TOKENS."""

    periodic: Evaluator
    final: Evaluator
    final_windows: Evaluator | None = None  # stream mode: the final tokens also scored as 'windows'
    final_train: Evaluator | None = None  # TRAIN_EVAL_TOKENS of the training split, scored the same way
    calls: ModelCalls = field(default_factory=ModelCalls)  # how the four call the model, shared

    @classmethod
    def for_run(cls, data: TokenData, config: dict) -> Evaluations:
        calls = ModelCalls(config.get("COMPILE", False))
        windows = None
        if config["EVAL_MODE"] == "stream":  # the old number too, so runs of either mode compare
            windows = Evaluator(data, {**config, "EVAL_MODE": "windows"}, config["BATCH_SIZE"],
                                config["FINAL_EVAL_TOKENS"], calls=calls)
        final, train = Evaluator(data, config, config["BATCH_SIZE"], config["FINAL_EVAL_TOKENS"], calls=calls), None
        if config.get("TRAIN_EVAL_TOKENS"):
            # no more training tokens than the final evaluation scores of validation: the two scores are then
            # samples of one size, and a run with a small FINAL_EVAL_TOKENS is not slowed by the training split
            train = Evaluator(data, config, config["BATCH_SIZE"], min(config["TRAIN_EVAL_TOKENS"], final.n),
                              split="train", calls=calls)
        return cls(Evaluator(data, config, config["BATCH_SIZE"], config["EVAL_TOKENS"], calls=calls), final, windows,
                   train, calls)

    def compile_report(self) -> dict:
        return self.calls.report()

    def score_final(self, model, info: dev.DeviceInfo, device: torch.device) -> dict:
        """The final evaluation with its interval; in stream mode also ``windows_val_bpc`` (± ``_ci95``); with
        TRAIN_EVAL_TOKENS also ``train_split_loss`` and ``train_split_bpc``: the same protocol on text the model
        trained on, so a gap to ``val_bpc`` measures memorisation (repeated epochs), not the running batch loss."""
        if self.final_windows is not None and self.final.covers_windows_of(self.final_windows, model):
            stream, windows = self.final.score_with_windows(model, info, device, self.final_windows)
            result = self.final.result(*stream, keep=True)
            windows = self.final_windows.result(*windows, keep=True)
        else:
            result = self.final(model, info, device, keep=True)
            windows = self.final_windows and self.final_windows(model, info, device, keep=True)
        if windows:
            result["windows_val_bpc"] = windows["val_bpc"]
            result["windows_val_bpc_ci95"] = windows.get("val_bpc_ci95")
        if self.final_train is not None:
            train = self.final_train(model, info, device)
            result["train_split_loss"], result["train_split_bpc"] = train["val_loss"], train["val_bpc"]
            result["train_split_tokens"] = train["eval_tokens"]
        return result


class Evaluator:
    """The fixed validation stream of one size, scored in ``mode`` ('stream' or 'windows'); ``split='train'``
    scores the start of the training stream instead (its results keep the ``val_`` names); ``calls``: how it
    calls the model (its own, from the config's COMPILE, unless shared)."""

    def __init__(self, data: TokenData, config: dict, batch_size: int, tokens: int | None, split: str = "val",
                 calls: ModelCalls | None = None):
        self.calls = calls or ModelCalls(config.get("COMPILE", False))
        self.mode, self.seq = config["EVAL_MODE"], config["SEQ_LEN"]
        self.stride = config["EVAL_STRIDE"] or max(1, self.seq // 2)
        self.batch_size, self.tokenizer = batch_size, data.tokenizer
        self.n = scored_count(data, tokens, split)
        stream = np.asarray(getattr(data, split)[: self.n + 1], dtype=np.int64)
        self.targets = stream[1:]
        self.chars = data.tokenizer.count_chars(self.targets)
        self.stream = torch.from_numpy(stream)
        self._target_chars = None  # per-target characters, for scores of a subset of the targets

    # --- the two ways of cutting the stream
    def _windows(self, stride: int, context: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(windows (W, seq+1), weights (W, seq), target index (W, seq)): windows starting every ``stride``
        tokens; a window scores its targets from position ``context`` on (the first window all of them)."""
        starts = list(range(0, self.n, stride))
        if stride < self.seq:  # overlapping: the last window must reach the end, not restart past it
            starts = [s for s in starts if s == 0 or s + context < self.n]
        length = self.seq + 1
        padded = torch.cat([self.stream, self.stream.new_zeros(max(0, starts[-1] + length - len(self.stream)))])
        windows = torch.stack([padded[s:s + length] for s in starts])
        position = torch.arange(self.seq)
        index = torch.tensor(starts)[:, None] + position[None, :]  # target index of every position
        weights = (index < self.n) & ((position[None, :] >= context) | (torch.tensor(starts)[:, None] == 0))
        return windows, weights.float(), index

    @torch.no_grad()
    def __call__(self, model, info: dev.DeviceInfo, device: torch.device, keep: bool = False) -> dict:
        """Score ``model``; ``keep`` also returns the per-token losses' bootstrap interval (final evaluation)."""
        return self.result(*self._score(model, info, device), keep=keep)

    def result(self, nll: torch.Tensor, index: torch.Tensor, keep: bool = False) -> dict:
        """What ``__call__`` returns, from the losses ``_score`` gives."""
        total = float(nll.sum())  # the evaluation's one read from the device
        nats = total / self.n
        result = {"val_loss": nats, "val_ppl": math.exp(min(nats, 50.0)),
                  "val_bpc": total / self.chars / math.log(2), "eval_tokens": self.n, "eval_mode": self.mode}
        if keep and math.isfinite(total):
            result["val_bpc_ci95"] = self.interval(self._per_token(nll, index))
        return result

    @torch.no_grad()
    def token_nats(self, model, info: dev.DeviceInfo, device: torch.device) -> np.ndarray:
        """The loss (nats) of every scored target, in stream order: what paired comparisons resample."""
        return self._per_token(*self._score(model, info, device))

    def _score(self, model, info, device):
        recurrent = getattr(model, "stream_kind", "window") == "recurrent"
        windows, stream = self.calls.of(info, _reading(info, device)[0])
        with _evaluating(model):
            if self.mode == "carried" or (self.mode == "stream" and recurrent):
                return self._recurrent(model, info, device, stream)
            if self.mode in ("stream", "sliding"):
                return self._batched(model, info, device, self._windows(self.stride, self.seq - self.stride), windows)
            return self._batched(model, info, device, self._windows(self.seq, 0), windows)

    def covers_windows_of(self, other: Evaluator, model) -> bool:
        """Whether this stream evaluation of a windowed ``model`` reads every window that ``other`` (the same
        tokens in mode 'windows') scores, but perhaps the last: windows starting at multiples of SEQ_LEN."""
        return (self.mode == "stream" and other.mode == "windows" and getattr(model, "stream_kind", "window") !=
                "recurrent" and (self.n, self.seq, self.batch_size) == (other.n, other.seq, other.batch_size)
                and self.seq % self.stride == 0 and torch.equal(self.stream, other.stream))

    @torch.no_grad()
    def score_with_windows(self, model, info, device, other: Evaluator) -> tuple[tuple, tuple]:
        """(this evaluation's losses, ``other``'s), as ``_score`` gives each, from one pass over the overlapping
        windows: ``other``'s windows are among them (``covers_windows_of``), each the same tokens read from an
        empty context, so only their weights differ; one it lacks (the stream's end) is read on its own. A
        final evaluation in stream mode reads 2 tokens a target and its windows twin 1 more: now 2."""
        call = self.calls.of(info, _reading(info, device)[0])[0]
        overlapping = self._windows(self.stride, self.seq - self.stride)
        windows, weights, index = other._windows(other.seq, 0)
        starts = overlapping[2][:, 0].tolist()
        read_already = set(starts)
        missing = [k for k, start in enumerate(index[:, 0].tolist()) if start not in read_already]
        with _evaluating(model):
            raw: list = []
            stream = self._batched(model, info, device, overlapping, call, raw=raw)
            read = [torch.cat(raw)[:len(starts)]]  # the padding rows dropped
            if missing:
                raw.clear()
                other._batched(model, info, device, (windows[missing], weights[missing], index[missing]), call, raw=raw)
                read.append(torch.cat(raw)[:len(missing)])
        row = {start: k for k, start in enumerate([*starts, *index[missing, 0].tolist()])}
        rows = torch.tensor([row[start] for start in index[:, 0].tolist()])
        read = torch.cat(read)
        nll = read[rows.to(read.device)] * weights.to(read.device)
        return stream, (nll, torch.where(weights > 0, index, torch.full_like(index, -1)))

    def _per_token(self, nll: torch.Tensor, index: torch.Tensor) -> np.ndarray:
        per_token = np.zeros(self.n)
        values, where = nll.double().cpu().numpy().ravel(), index.cpu().numpy().ravel()
        scored = where >= 0
        per_token[where[scored]] = values[scored]
        return per_token

    def _batched(self, model, info, device, scored_windows, call=_window_logits, raw: list | None = None):
        """Independent windows, ``batch_size`` at a time (the last batch padded with zero-weight rows);
        ``scored_windows``: (windows, weights, index) as ``_windows`` makes them; ``call(model, ids)``; ``raw``
        gets each batch's losses before weighting, padding rows too."""
        windows, weights, index = scored_windows
        on_device, context = _reading(info, device)
        pad = -len(windows) % self.batch_size
        if pad:
            windows = torch.cat([windows, windows[:1].expand(pad, -1)])
            weights = torch.cat([weights, torch.zeros(pad, weights.shape[1])])
            index = torch.cat([index, index[:1].expand(pad, -1)])
        losses = []
        for start in range(0, len(windows), self.batch_size):
            batch = windows[start:start + self.batch_size].to(device)
            with context():
                logits = call(model, batch[:, :-1])
            nll = F.cross_entropy(logits.float().transpose(1, 2), batch[:, 1:], reduction="none")
            losses.append(nll * weights[start:start + self.batch_size].to(device))
            if raw is not None:
                raw.append(nll)
            if on_device:
                dev.mark_step(info)
        index = torch.where(weights > 0, index, torch.full_like(index, -1))
        return torch.cat(losses), index

    def _recurrent(self, model, info, device, call=_stream_logits):
        """One stream, ``SEQ_LEN`` tokens at a time, the model's state carried from chunk to chunk
        (``call(model, ids, state)``)."""
        windows, weights, index = self._windows(self.seq, 0)
        on_device, context = _reading(info, device)
        state = model.initial_state(1, device)
        if on_device:
            dev.mark_step(info)  # the zero state as device data: every chunk then runs one graph
        # every chunk's losses go into one buffer made before the first: a small tensor kept from each chunk would
        # lie between two chunks' large ones, glibc could not reuse their space, and a 32,768-unit reservoir's
        # evaluation grew by 8 MB a chunk (bench/README.md); the row index is data, so XLA runs one graph a chunk
        losses = torch.zeros(len(windows), self.seq, device=device)
        for k in range(len(windows)):
            chunk = windows[k:k + 1].to(device)
            with context():
                logits, state = call(model, chunk[:, :-1], state)
            nll = F.cross_entropy(logits.float().transpose(1, 2), chunk[:, 1:], reduction="none")
            losses.index_copy_(0, torch.tensor([k]).to(device), nll * weights[k:k + 1].to(device))
            if on_device:
                dev.mark_step(info)
        index = torch.where(weights > 0, index, torch.full_like(index, -1))
        return losses, index

    def _blocks(self) -> tuple[np.ndarray, np.ndarray]:
        """(block starts, characters per block): story-aligned blocks of the scored targets."""
        ends = np.flatnonzero(self.targets == self.tokenizer.eot_id) + 1
        if len(ends) + 1 < MIN_BLOCKS:
            ends = np.arange(FIXED_BLOCK_TOKENS, self.n, FIXED_BLOCK_TOKENS)
        bounds = np.concatenate([[0], ends[ends < self.n], [self.n]])
        spans = zip(bounds[:-1], bounds[1:], strict=True)
        chars = np.array([self.tokenizer.count_chars(self.targets[a:b]) for a, b in spans], dtype=np.float64)
        return bounds[:-1], chars

    def target_chars(self) -> np.ndarray:
        """Characters each scored target stands for (an end-of-story counting as one); computed once."""
        if self._target_chars is None:
            lengths = np.array([self.tokenizer.count_chars([i]) for i in range(self.tokenizer.vocab_size)],
                               np.float64)
            self._target_chars = lengths[self.targets]
        return self._target_chars

    def subset_bpc(self, per_token: np.ndarray, mask: np.ndarray) -> float | None:
        """Bits/char of the targets where ``mask`` holds (None: no such target)."""
        chars = float(self.target_chars()[mask].sum())
        return float(per_token[mask].sum() / chars / math.log(2)) if chars else None

    def _bootstrap_bpc(self, per_token: np.ndarray, seed: int, mask: np.ndarray | None = None) -> np.ndarray:
        """Bits/char of BOOTSTRAP_SAMPLES resamples of the blocks (the same resamples for the same seed);
        with ``mask``, of the masked targets of the resampled blocks."""
        starts, chars = self._blocks()
        if mask is not None:
            per_token = np.where(mask, per_token, 0.0)
            chars = np.add.reduceat(np.where(mask, self.target_chars(), 0.0), starts)
        nats = np.add.reduceat(per_token, starts)
        picks = np.random.default_rng(seed).integers(0, len(nats), size=(BOOTSTRAP_SAMPLES, len(nats)))
        with np.errstate(invalid="ignore", divide="ignore"):  # a resample may hold no masked target
            return nats[picks].sum(1) / chars[picks].sum(1) / math.log(2)

    def interval(self, per_token: np.ndarray, seed: int = 0) -> float:
        """Half-width of the 95% bootstrap interval of bits/char, resampling story-aligned blocks."""
        low, high = np.percentile(self._bootstrap_bpc(per_token, seed), [2.5, 97.5])
        return float((high - low) / 2)

    def paired_difference(self, per_token_a: np.ndarray, per_token_b: np.ndarray, seed: int = 0,
                          mask: np.ndarray | None = None) -> dict:
        """Bits/char of A minus B on the same targets (those where ``mask`` holds), with its 95% interval
        from resampling the same blocks for both: what the stories make hard or easy cancels, so the
        interval is much narrower than the two separate intervals suggest."""
        difference = self._bootstrap_bpc(per_token_a - per_token_b, seed, mask)
        difference = difference[np.isfinite(difference)]
        low, high = np.percentile(difference, [2.5, 97.5])
        chars = self.chars if mask is None else float(self.target_chars()[mask].sum())
        delta = per_token_a - per_token_b if mask is None else np.where(mask, per_token_a - per_token_b, 0.0)
        return {"bpc_difference": float(delta.sum() / chars / math.log(2)),
                "ci95_low": float(low), "ci95_high": float(high),
                "share_of_resamples_a_worse": float(np.mean(difference > 0))}


CONTEXTS = (32, 128, 512)  # evaluation contexts (tokens) of context_scores, besides the whole stream


def carries_state(model) -> bool:
    """Whether ``model`` can read a stream with its state carried (it has ``forward_stream``)."""
    from reservoir.models.base import LanguageModel

    return type(model).forward_stream is not LanguageModel.forward_stream


def context_scores(model, data: TokenData, config: dict, info: dev.DeviceInfo, device: torch.device,
                   tokens: int | None, contexts: tuple[int, ...] = CONTEXTS) -> dict[str, float | None]:
    """Validation bits/char of ``model`` at each evaluation context: windows of ``c`` tokens slid by c / 2 (each
    target seen with c / 2 to c tokens before it), and 'stream', the state carried through the whole text.
    None where the model cannot: a learned position table shorter than ``c``, no state to carry."""
    scores: dict[str, float | None] = {}
    calls = ModelCalls(config.get("COMPILE", False))
    for c in contexts:
        longest = getattr(model, "longest_context", None)
        if longest is not None and c > longest:
            scores[str(c)] = None
            continue
        settings = {**config, "EVAL_MODE": "sliding", "SEQ_LEN": c, "EVAL_STRIDE": max(1, c // 2)}
        scores[str(c)] = Evaluator(data, settings, max(1, 4096 // c), tokens, calls=calls)(model, info,
                                                                                          device)["val_bpc"]
    scores["stream"] = Evaluator(data, {**config, "EVAL_MODE": "carried"}, 1, tokens, calls=calls)(
        model, info, device)["val_bpc"] if carries_state(model) else None
    return scores


class EvalPoints:
    """When a gradient-trained model is evaluated during training: every EVAL_EVERY steps when that is
    set, else at EVAL_POINTS - 1 points log-spaced in budget share from FIRST_SHARE (the last point is
    the final evaluation), so learning curves show the early, fast part as well as the end."""

    FIRST_SHARE = 0.01

    def __init__(self, config: dict, share_now: float = 0.0):
        self.every = config["EVAL_EVERY"]
        count = config["EVAL_POINTS"]
        self.shares = [float(x) for x in np.geomspace(self.FIRST_SHARE, 1.0, count)[:-1]] if count > 1 else []
        self.next = sum(1 for x in self.shares if x <= share_now)  # a resumed fit: points already passed

    def due(self, step: int, share: float) -> bool:
        if self.every:
            return step % self.every == 0
        passed = self.next
        while self.next < len(self.shares) and share >= self.shares[self.next]:
            self.next += 1
        return self.next > passed
