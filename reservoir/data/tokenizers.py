"""Tokenizers: characters (a lookup table) or byte-level BPE (Hugging Face ``tokenizers``), trained
on the training split once and cached by its hash.

    tokenizer = load_or_train_tokenizer("char", vocab_size, corpus, cache_dir, train_hash)
    ids = tokenizer.encode(text); text = tokenizer.decode(ids)
"""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import numpy as np

from reservoir.data.corpus import EOT, EOT_MARK, Corpus, DataError
from reservoir.platform.files import atomic_write_text
from reservoir.platform.messages import say, warn


def _sha256(*parts: bytes | str) -> str:
    digest = hashlib.sha256()
    for part in parts:
        digest.update(part.encode("utf-8") if isinstance(part, str) else part)
    return digest.hexdigest()


class CharTokenizer:
    """One token per character seen in training (+ ``<|endoftext|>`` and ``<unk>``).

    Written by hand rather than with ``tokenizers``: a character vocabulary is a
    lookup table, and a vectorised numpy lookup is fast (bench/README.md has the figure).
    """

    kind = "char"
    specials = (EOT, "<unk>")

    def __init__(self, chars: str):
        self.chars = "".join(sorted(set(chars) - {EOT_MARK}))
        self.eot_id, self.unk_id = 0, 1
        codepoints = np.frombuffer(self.chars.encode("utf-32-le"), dtype=np.uint32)
        # a dense table indexed by code point: one gather per character (the last entry catches any above)
        self._table = np.full(max(ord(EOT_MARK), int(codepoints.max(initial=0))) + 2, self.unk_id, dtype=np.int64)
        self._table[codepoints] = np.arange(len(self.specials), len(self.specials) + len(self.chars))
        self._table[ord(EOT_MARK)] = self.eot_id

    @classmethod
    def train(cls, stories, vocab_size: int | None = None) -> CharTokenizer:
        """The alphabet of ``stories`` (any iterable: read one story at a time)."""
        chars: set[str] = set()
        for story in stories:
            chars.update(story)
        return cls("".join(chars))

    @property
    def vocab_size(self) -> int:
        return len(self.specials) + len(self.chars)

    def to_json(self) -> str:
        return json.dumps({"kind": "char", "chars": self.chars}, ensure_ascii=False)

    @classmethod
    def from_json(cls, text: str) -> CharTokenizer:
        return cls(json.loads(text)["chars"])

    def _encode_joined(self, text: str) -> np.ndarray:
        codepoints = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32)
        return self._table[np.minimum(codepoints, len(self._table) - 1)]

    def encode(self, text: str) -> np.ndarray:
        return self._encode_joined(text.replace(EOT, EOT_MARK))

    def encode_stories(self, stories: list[str]) -> np.ndarray:
        return self._encode_joined(EOT_MARK.join(stories) + EOT_MARK)

    def decode(self, ids) -> str:
        table = list(self.specials) + list(self.chars)
        return "".join(table[i] if i != self.unk_id else "?" for i in np.asarray(ids).tolist())

    def count_chars(self, ids) -> int:
        """Characters the ids stand for: one per token, an end-of-story counting as one."""
        return int(np.asarray(ids).size)


class BPETokenizer:
    """Byte-level BPE trained with the ``tokenizers`` library on the training split."""

    kind = "bpe"

    def __init__(self, tokenizer):
        self._tok = tokenizer
        self.eot_id = tokenizer.token_to_id(EOT)

    @classmethod
    def train(cls, stories, vocab_size: int) -> BPETokenizer:
        """Trained from ``stories``, any iterable (``tokenizers`` reads it as a stream)."""
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

        minimum = 256 + 1
        if vocab_size < minimum + 1:
            raise DataError(f"VOCAB_SIZE={vocab_size} is too small for byte-level BPE: it needs 256 byte "
                            f"tokens + {EOT} + at least one merge; use VOCAB_SIZE >= {minimum + 1}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOT], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train_from_iterator(stories, trainer=trainer, length=len(stories) if isinstance(stories, list) else None)
        return cls(tok)

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size()

    def to_json(self) -> str:
        return self._tok.to_str()

    @classmethod
    def from_json(cls, text: str) -> BPETokenizer:
        from tokenizers import Tokenizer

        return cls(Tokenizer.from_str(text))

    def encode(self, text: str) -> np.ndarray:
        return np.asarray(self._tok.encode(text).ids, dtype=np.int64)

    def encode_stories(self, stories: list[str], chunk: int = 20000) -> np.ndarray:
        parts = []
        for start in range(0, len(stories), chunk):
            for enc in self._tok.encode_batch(stories[start:start + chunk]):
                parts.append(np.asarray(enc.ids, dtype=np.int64))
                parts.append(np.array([self.eot_id], dtype=np.int64))
        return np.concatenate(parts) if parts else np.zeros(0, np.int64)

    def decode(self, ids) -> str:
        return self._tok.decode(np.asarray(ids).tolist(), skip_special_tokens=False)

    def count_chars(self, ids) -> int:
        """Characters the ids stand for, an end-of-story counting as one (as for char tokens)."""
        ids = np.asarray(ids)
        n_eot = int((ids == self.eot_id).sum())
        return len(self._tok.decode(ids[ids != self.eot_id].tolist())) + n_eot


TOKENIZERS = {"char": CharTokenizer, "bpe": BPETokenizer}


def content_hash(data) -> str:
    """blake2b of bytes or an array's buffer: sees any changed, added, removed or reordered byte."""
    buffer = memoryview(np.ascontiguousarray(data)).cast("B") if isinstance(data, np.ndarray) else data
    return hashlib.blake2b(buffer, digest_size=16).hexdigest()


def tokenizer_hash(tokenizer) -> str:
    return _sha256(tokenizer.to_json())[:16]


def load_or_train_tokenizer(kind: str, vocab_size: int, corpus: Corpus, cache_dir: str | Path, train_hash: str,
                            train_chars: int | None = None):
    """A tokenizer trained on the training split (BPE: on its first ``train_chars`` characters, None:
    all), saved once and reused by later runs."""
    cls = TOKENIZERS[kind]
    sample = f"-{train_chars}" if kind == "bpe" and train_chars else ""
    name = f"{kind}-{vocab_size if kind == 'bpe' else 'all'}-{train_hash[:16]}{sample}.json"
    path = Path(cache_dir) / "tokenizers" / name
    digest_path = path.with_suffix(".blake2b")  # the file's content hash: an edited file that still parses is caught
    if path.exists():
        try:
            raw = path.read_bytes()
            if not digest_path.exists() or digest_path.read_text().strip() != content_hash(raw):
                raise ValueError("its content does not match its recorded hash")
            return cls.from_json(raw.decode("utf-8"))
        except Exception as e:  # noqa: BLE001 - a broken cache file is rebuilt, whatever broke it
            warn(f"tokenizer cache {path} is unusable ({type(e).__name__}: {e}); training it again")
    start = time.perf_counter()
    stories = corpus.train.select(max_chars=train_chars) if kind == "bpe" and train_chars else corpus.train
    tokenizer = cls.train(stories, vocab_size)
    text = tokenizer.to_json()
    atomic_write_text(path, text)
    atomic_write_text(digest_path, content_hash(text.encode("utf-8")))
    say(f"trained {kind} tokenizer (vocab {tokenizer.vocab_size}) in {time.perf_counter() - start:.1f}s")
    return tokenizer
