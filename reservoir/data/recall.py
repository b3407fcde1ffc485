"""Synthetic probes of what a fixed-size state can hold: multi-query associative recall and selective copying.

    task = PROBE_TASKS["mqar"]
    inputs, targets = task.examples(1000, seed=0)      # int64 (n, length); targets -1 where nothing is scored

Both are built here after their published definitions (not their code), smaller, so that every family fits
on a CPU:

- ``mqar``: Zoology's multi-query associative recall (Arora et al. 2023, arXiv 2312.04927). A sequence opens
  with ``items`` key-value pairs (k1 v1 k2 v2 ..., the keys distinct, keys from the vocabulary's first half
  and values from its second), then a stretch of blanks in which every key is asked once, at a random
  position; the target after a queried key is its value. Zoology's figure 2 uses a vocabulary of 8,192,
  lengths 64-256 with 4-16 pairs and power-law query gaps; here length 32 with 4 pairs (its smallest ratio
  of pairs to length, 1:8), a vocabulary of 32 and uniform gaps.
- ``copying``: MAD's selective copying (Poli et al. 2024, athms/mad-lab). ``items`` tokens scattered in order
  among blanks, then a copy signal; the model must write the tokens back in order (teacher-forced: each
  target's input is the token before it). MAD's baseline is vocabulary 16, length 256, 16 tokens; here
  vocabulary 16, length 64, 8 tokens.

The answer is determined by the prompt alone: ``solve`` writes it from the inputs, as a model with perfect
recall would.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

BLANK, COPY = 0, 1  # the blank (padding) token; the copy signal of selective copying
UNSCORED = -1  # the target of a position that is not scored


@dataclass(frozen=True)
class ProbeTask:
    name: str  # 'mqar' | 'copying'
    length: int  # tokens a sequence
    vocab: int
    items: int  # key-value pairs (mqar), or tokens to copy (copying)

    def __post_init__(self):
        if self.name == "mqar" and (2 * self.items > self.length - self.items or self.items >= self.vocab // 2):
            raise ValueError(f"mqar with {self.items} pairs needs length >= {3 * self.items} and vocab > "
                             f"{2 * self.items}")
        if self.name == "copying" and (2 * self.items > self.length or self.vocab < 3):
            raise ValueError(f"copying {self.items} tokens needs length >= {2 * self.items} and vocab >= 3")

    def examples(self, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
        """``n`` sequences (inputs, targets), the same for the same seed."""
        rng = np.random.default_rng(seed)
        return self._mqar(n, rng) if self.name == "mqar" else self._copying(n, rng)

    def _mqar(self, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
        half, pairs = self.vocab // 2, self.items
        keys = np.stack([rng.choice(np.arange(1, half), pairs, replace=False) for _ in range(n)])
        values = rng.integers(half, self.vocab, size=(n, pairs))
        inputs = np.full((n, self.length), BLANK, dtype=np.int64)
        targets = np.full((n, self.length), UNSCORED, dtype=np.int64)
        inputs[:, 0:2 * pairs:2], inputs[:, 1:2 * pairs:2] = keys, values
        for row in range(n):  # every key asked once, at distinct positions after the pairs
            where = rng.choice(np.arange(2 * pairs, self.length), pairs, replace=False)
            asked = rng.permutation(pairs)
            inputs[row, where], targets[row, where] = keys[row, asked], values[row, asked]
        return inputs, targets

    def _copying(self, n: int, rng) -> tuple[np.ndarray, np.ndarray]:
        count, signal = self.items, self.length - self.items  # the copy signal's position
        tokens = rng.integers(COPY + 1, self.vocab, size=(n, count))
        inputs = np.full((n, self.length), BLANK, dtype=np.int64)
        targets = np.full((n, self.length), UNSCORED, dtype=np.int64)
        for row in range(n):
            inputs[row, np.sort(rng.choice(signal, count, replace=False))] = tokens[row]
        inputs[:, signal] = COPY
        inputs[:, signal + 1:] = tokens[:, :-1]  # teacher forcing: each output's input is the token before
        targets[:, signal:] = tokens
        return inputs, targets

    def solve(self, inputs: np.ndarray) -> np.ndarray:
        """The targets, written from the inputs alone (UNSCORED where none is asked): perfect recall."""
        out = np.full(inputs.shape, UNSCORED, dtype=np.int64)
        for row, seq in enumerate(inputs):
            if self.name == "mqar":
                pairs = 2 * self.items
                table = dict(zip(seq[0:pairs:2].tolist(), seq[1:pairs:2].tolist(), strict=True))
                for p in range(pairs, self.length):
                    if seq[p] in table:
                        out[row, p] = table[seq[p]]
            else:
                signal = self.length - self.items
                out[row, signal:] = [t for t in seq[:signal] if t != BLANK][: self.items]
        return out


PROBE_TASKS = {"mqar": ProbeTask("mqar", 32, 32, 4), "copying": ProbeTask("copying", 32, 16, 6)}
