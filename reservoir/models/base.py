"""What every language model here shares: the (B, T) -> (B, T, V) interface,
parameter counts and one ``generate``."""

from __future__ import annotations

import torch
from torch import nn


class LanguageModel(nn.Module):
    """Token ids (B, T) in, next-token logits (B, T, V) out, causal.

    ``trainer`` says how the runner fits it: 'sgd' (gradient steps), 'ridge'
    (closed-form readout, one pass) or 'counts' (n-gram statistics).
    """

    trainer = "sgd"
    host_only = False  # True: numpy on the host (the n-gram); runners keep it and its inputs on the CPU
    context_size: int | None = None  # longest context generate() feeds back (None: unlimited)
    longest_context: int | None = None  # the most positions forward() can take (a learned position table); None: any
    # 'recurrent': state carried through a stream (forward_stream); 'window': a finite context,
    # scored on overlapping windows (see reservoir/run/evaluation.py)
    stream_kind = "window"
    # what training changes, in the results' "trained" column: 'readout' (recurrence and input frozen:
    # a pure reservoir), 'input+readout', 'all but recurrence', 'everything', or 'counts' (an n-gram)
    trained = "everything"

    def initial_state(self, batch: int, device) -> object:
        """The state a stream starts from (recurrent models)."""
        raise NotImplementedError(f"{type(self).__name__} has no recurrent state")

    def forward_stream(self, ids: torch.Tensor, state) -> tuple[torch.Tensor, object]:
        """(logits, state after ``ids``), starting from ``state`` (recurrent models)."""
        raise NotImplementedError(f"{type(self).__name__} has no recurrent state")
    _checkpoint = None  # activation checkpointing, set by use_gradient_checkpointing

    def use_time_scan(self, scan_fn) -> None:
        """Loop over time with ``scan_fn(fn, init, xs) -> (carry, ys)`` (from the device layer; None:
        each part's own loop or fused kernel). Given to every part that loops over time."""
        for module in self.modules():
            if hasattr(module, "time_scan"):
                module.time_scan = scan_fn

    def use_gradient_checkpointing(self, checkpoint_fn) -> None:
        """Recompute the heavy parts' activations in backward instead of storing them.
        ``checkpoint_fn(fn, *inputs)`` comes from the device layer (XLA needs its own)."""
        self._checkpoint = checkpoint_fn

    def _checkpointed(self, fn, *inputs):
        if self._checkpoint is not None and self.training and torch.is_grad_enabled():
            return self._checkpoint(fn, *inputs)
        return fn(*inputs)

    def fixed_param_count(self) -> int:
        """Weights that are set once and never trained (reservoir matrices, counts, frozen parameters); a module's
        ``derived_buffers`` (tables computed from its shape alone, as rotary angles are) are none."""
        frozen = sum(p.numel() for p in self.parameters() if not p.requires_grad)
        return frozen + sum(int(torch.count_nonzero(b)) for m in self.modules() for name, b in
                            m.named_buffers(recurse=False) if b.is_floating_point()
                            and name not in getattr(m, "derived_buffers", ()))

    def param_counts(self) -> dict[str, int]:
        trainable = sum(p.numel() for p in self.parameters() if p.requires_grad)
        return {"params_total": trainable + self.fixed_param_count(), "params_trainable": trainable}

    # --- generation: the logits for the next token, and what to carry to the step after
    def _recomputes(self) -> bool:
        """Whether generating recomputes the context at every token: finite-context models (the
        window slides) do; recurrent ones carry their state instead."""
        return self.stream_kind != "recurrent" or bool(self.context_size)

    def begin_generation(self, ids: torch.Tensor):
        """(next-token logits (1, V), carry) after the prompt ``ids`` (1, T)."""
        if self._recomputes():
            return self._window_logits(ids), None
        logits, state = self.forward_stream(ids, self.initial_state(1, ids.device))
        return logits[:, -1, :].float(), state

    def continue_generation(self, ids: torch.Tensor, carry):
        """(next-token logits, carry) after ``ids``, whose last token is new since the last call."""
        if self._recomputes():
            return self._window_logits(ids), None
        logits, state = self.forward_stream(ids[:, -1:], carry)
        return logits[:, -1, :].float(), state

    def _window_logits(self, ids: torch.Tensor) -> torch.Tensor:
        context = ids[:, -self.context_size:] if self.context_size else ids
        return self(context)[:, -1, :].float()

    # fixed-shape generation, for a compiled decode step (generate's ``step``): a carry of one shape at every
    # token, and a step that reads one new token at its position. A model without one generates as above.
    def static_carry(self, carry, length: int):
        """``carry`` after ``length`` tokens as tensors of the shape every later token keeps, or None: this
        model has no fixed-shape step (it recomputes a window, or its cache grows)."""
        return None if self._recomputes() or carry is None else carry

    def static_step(self, token: torch.Tensor, position: torch.Tensor, carry):
        """(next-token logits (1, V), carry) after the new ``token`` (1, 1) at ``position`` (a 0-d tensor)."""
        logits, state = self.forward_stream(token, carry)
        return logits[:, -1, :].float(), state

    def static_fits(self, position: int) -> bool:
        """Whether the fixed-shape step reaches ``position`` (past it: continue_generation's window)."""
        return not self.context_size or position < self.context_size

    @torch.no_grad()
    def generate(self, prompt: torch.Tensor, max_new_tokens: int, temperature: float = 1.0,
                 top_k: int | None = None, top_p: float | None = None, stop_id: int | None = None,
                 generator: torch.Generator | None = None, cache: bool = True, step=None,
                 window=None, stop_every: int = 1) -> torch.Tensor:
        """Continue ``prompt`` (1-D or (1, T) ids) by at most ``max_new_tokens`` tokens.

        temperature 0 is greedy; top_k keeps the k likeliest tokens, top_p the
        smallest set whose probability reaches p. Stops early at ``stop_id``. Recurrent
        models carry their state from token to token, the transformer its keys and values
        (until its window is full), so a story costs O(length); ``cache=False`` recomputes
        the whole context for every token instead (the same stories, slower: kept to test
        and measure against). ``step(model, token, position, carry)``: ``static_step`` as the
        caller runs it (compiled: one graph for every token), where the model has a fixed-shape
        carry (``static_carry``); past its reach (a full window, recomputed for every token), the
        next-token logits of the window as ``window(model, ids)`` gives them, of one shape too;
        without a fixed-shape carry, the model's own steps.

        Tokens are chosen where the model runs and read by the host once a story, and while it looks
        for ``stop_id`` once every ``stop_every`` tokens (the tokens made past the end are dropped):
        on a GPU each read waits for the device to finish. The draws come from ``generator`` on the
        CPU as ``torch.multinomial`` takes them, so a seed writes the same story on every device.
        Returns the prompt and the story, on the host.
        """
        ids = prompt.view(1, -1)
        start, static, position = ids.shape[1], None, None
        host: list[int] = []  # the ids read by the host so far (the prompt's, then the story's)
        checked = 0  # the story's tokens looked at for stop_id
        choice = _TokenChoice(temperature, top_k, top_p, generator)
        if cache:
            logits, carry = self.begin_generation(ids)
            if step is not None:  # a fixed-shape carry for the compiled step, where the model has one
                static = self.static_carry(carry, ids.shape[1])
        for made in range(max_new_tokens):
            if not cache:
                logits = LanguageModel._window_logits(self, ids)
            elif made and static is not None and self.static_fits(ids.shape[1] - 1):
                # the position stays on the device: made there at the first step, one further at each after it
                position = (torch.full((), ids.shape[1] - 1, dtype=torch.long, device=ids.device)
                            if position is None else position + 1)
                logits, static = step(self, ids[0, -1:].view(1, 1), position, static)  # one stride every token
            elif made and static is not None and window is not None:  # the window's context, one shape
                logits = window(self, ids[0, -self.context_size:].view(1, -1))
            elif made:
                logits, carry = self.continue_generation(ids, None if static is not None else carry)
            ids = torch.cat([ids, choice.next_token(logits, max_new_tokens - made)], dim=1)
            if stop_id is not None and ((made + 1) % stop_every == 0 or made + 1 == max_new_tokens):
                host += choice.read(ids[0, len(host):])
                if stop_id in host[start + checked:]:
                    end = host.index(stop_id, start + checked)
                    choice.keep(end + 1 - start)
                    return torch.tensor(host[:end + 1])
                checked = made + 1
        if len(host) < ids.shape[1]:
            host += choice.read(ids[0, len(host):])
        return torch.tensor(host)


DRAWS_AT_ONCE = 1 << 20  # floats of sampling draws sent to the device in one copy (a few MiB)


class _TokenChoice:
    """The next token from a step's logits, on the logits' device, with nothing read by the host.

    ``torch.multinomial(p, 1)`` draws q ~ Exp(1) for each token and takes argmax(p / q); the draws are taken
    here on the CPU from the same generator, several tokens' at a time and sent to the device in one copy, so
    sampling gives the tokens multinomial gives. Where a story stops early, the generator is put back where
    the tokens it kept leave it."""

    def __init__(self, temperature: float, top_k: int | None, top_p: float | None,
                 generator: torch.Generator | None):
        self.temperature, self.top_k, self.top_p = temperature, top_k, top_p
        self.generator = generator if generator is not None else torch.default_generator
        self.draws, self.used = None, 0  # the batch of draws on the device, and how many of it are taken
        self.drawn = 0  # the story's tokens drawn for
        self.batches: list[tuple[int, torch.Tensor]] = []  # (the token a batch began at, the generator's state)
        self.invalid = None  # a device flag: some token's probabilities were NaN

    def next_token(self, logits: torch.Tensor, left: int) -> torch.Tensor:
        """(1, 1) token ids; ``left``: the tokens the story may still make (this one included)."""
        if self.temperature <= 0:
            return logits.argmax(-1, keepdim=True)
        logits = logits / self.temperature
        if self.top_k is not None:
            kth = torch.topk(logits, min(self.top_k, logits.size(-1))).values[:, -1:]
            logits = logits.masked_fill(logits < kth, float("-inf"))
        if self.top_p is not None:
            sorted_logits, order = torch.sort(logits, descending=True)
            cumulative = sorted_logits.softmax(-1).cumsum(-1)
            drop = cumulative - sorted_logits.softmax(-1) >= self.top_p  # keep the first token reaching p
            logits = logits.scatter(1, order, sorted_logits.masked_fill(drop, float("-inf")))
        probs = logits.softmax(-1)
        nan = probs[:, 0].isnan()  # one NaN logit makes the whole row NaN
        self.invalid = nan if self.invalid is None else self.invalid | nan
        return (probs / self._draw(probs, left)).argmax(-1, keepdim=True)

    def _draw(self, probs: torch.Tensor, left: int) -> torch.Tensor:
        if self.draws is None or self.used == len(self.draws):
            self.batches.append((self.drawn, self.generator.get_state()))
            batch = torch.empty((max(1, min(left, DRAWS_AT_ONCE // probs.numel())), *probs.shape), dtype=probs.dtype)
            for row in batch:  # one call a token, as multinomial makes it
                row.exponential_(1, generator=self.generator)
            self.draws, self.used = batch.to(probs.device, non_blocking=True), 0
        self.used, self.drawn = self.used + 1, self.drawn + 1
        return self.draws[self.used - 1]

    def read(self, ids: torch.Tensor) -> list[int]:
        """``ids`` on the host, with whether any token's probabilities were NaN: one read."""
        flag = self.invalid.long() if self.invalid is not None else torch.zeros(1, dtype=torch.long,
                                                                                 device=ids.device)
        values = torch.cat([ids, flag.view(1)]).tolist()
        if values[-1]:
            raise RuntimeError("the model's next-token probabilities are NaN: its weights or its state have "
                               "overflowed, so it has no story to write (retrain it, e.g. at a lower LR)")
        return values[:-1]

    def keep(self, tokens: int) -> None:
        """The story ends after ``tokens`` tokens: the generator goes back to where their draws leave it, so
        the next story draws what it would have drawn."""
        if not self.batches:
            return
        began, state = next((b, s) for b, s in reversed(self.batches) if b < tokens)
        self.generator.set_state(state)
        for _ in range(tokens - began):
            torch.empty(self.draws.shape[1:], dtype=self.draws.dtype).exponential_(1, generator=self.generator)

