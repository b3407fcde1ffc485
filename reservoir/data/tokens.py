"""The data a run trains on: a corpus (reservoir/data/corpus.py) tokenized (reservoir/data/tokenizers.py) into
an on-disk token cache, and fixed-shape windows over it.

    data = prepare_data(config)      # -> TokenData: token arrays, tokenizer, where the text came from
    TrainWindows(data.train, seq_len, seed)   # (x, y) windows of SEQ_LEN + 1 tokens
    eval_windows(data.val, seq_len, eval_tokens)

Every file this module writes is written to a temporary name and renamed, so
an interrupted run never leaves a half-written cache behind.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from reservoir.data.corpus import EOT, DataError, Stories, load_corpus
from reservoir.data.tokenizers import content_hash, load_or_train_tokenizer, tokenizer_hash
from reservoir.platform.files import atomic_write, atomic_write_text, remove_stale_temporaries
from reservoir.platform.messages import progress, warn

UNKNOWN_WARNING_SHARE = 0.001  # warn when more validation tokens than this share are <unk>


ENCODE_CHARS = 1 << 23  # stories are encoded about 8M characters at a time


@dataclass
class TextStats:
    """One streaming pass over a split: its hash (the cache key), its stories and characters."""

    sha256: str
    stories: int
    chars: int

    @classmethod
    def scan(cls, stories: Stories) -> TextStats:
        digest, count, chars = hashlib.sha256(), 0, 0
        for story in stories:
            if count:
                digest.update(EOT.encode())
            digest.update(story.encode("utf-8"))
            count += 1
            chars += len(story)
        return cls(digest.hexdigest(), count, chars)


def _story_batches(stories, chars: int):
    batch, size = [], 0
    for story in stories:
        batch.append(story)
        size += len(story)
        if size >= chars:
            yield batch
            batch, size = [], 0
    if batch:
        yield batch


def _open_tokens(bin_path: Path, meta: dict) -> np.ndarray:
    if meta["n_tokens"] == 0:
        return np.zeros(0, dtype=meta["dtype"])
    return np.memmap(bin_path, dtype=meta["dtype"], mode="r", shape=(meta["n_tokens"],))


def cached_tokens(tokenizer, stories, text_hash: str, cache_dir: str | Path, split: str,
                  total_chars: int | None = None) -> np.ndarray:
    """The split's token ids, memory-mapped from the cache (encoded and written on first use).

    Encoding streams: ``ENCODE_CHARS`` of text at a time are encoded and appended to a temporary
    file, renamed when complete, so memory does not grow with the corpus and a cut-off write is never
    used. uint16 where the vocabulary fits. A cache file that is corrupt or does not match its
    metadata is rebuilt with a warning, never silently used.
    """
    tok_hash = tokenizer_hash(tokenizer)
    stem = Path(cache_dir) / "tokens" / f"{split}-{tok_hash}-{text_hash[:16]}"
    bin_path, meta_path = stem.with_suffix(".bin"), stem.with_suffix(".json")
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    if bin_path.exists() or meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
            ids = _open_tokens(bin_path, meta)
            ok = (ids.dtype == dtype and meta["tokenizer"] == tok_hash
                  and bin_path.stat().st_size == ids.size * ids.itemsize and content_hash(ids) == meta["blake2b"])
            if ok:
                return ids
            warn(f"token cache {bin_path} does not match its metadata; rebuilding it")
        except Exception as e:  # noqa: BLE001 - any unreadable cache is rebuilt
            warn(f"token cache {bin_path} is unreadable ({type(e).__name__}); rebuilding it")
    digest, count = hashlib.blake2b(digest_size=16), 0
    bar = progress(total_chars or None, f"tokenizing {split}", delay=3.0, unit="char", unit_scale=True)

    def write(tmp):
        nonlocal count
        with open(tmp, "wb") as f:
            for batch in _story_batches(stories, ENCODE_CHARS):
                ids = tokenizer.encode_stories(batch)
                if ids.size and int(ids.max()) >= tokenizer.vocab_size:
                    raise DataError(f"tokenizer produced id {int(ids.max())} >= vocab {tokenizer.vocab_size}")
                ids = ids.astype(dtype)
                f.write(ids.tobytes())
                digest.update(memoryview(ids).cast("B"))
                count += ids.size
                bar.update(sum(map(len, batch)))

    atomic_write(bin_path, write)
    bar.close()
    meta = {"n_tokens": count, "dtype": np.dtype(dtype).name, "tokenizer": tok_hash, "text": text_hash,
            "blake2b": digest.hexdigest(), "split": split}
    atomic_write_text(meta_path, json.dumps(meta))
    return _open_tokens(bin_path, meta)


@dataclass
class TokenData:
    train: np.ndarray
    val: np.ndarray
    tokenizer: object
    source: str
    description: str
    chars_per_token: float  # validation characters per token (reported; bits/char count exact characters)
    val_unknown_share: float = 0.0  # validation tokens the tokenizer could not map (<unk>)
    text: dict | None = None  # stories and characters of each split, and how the tokenizer was trained

    def describe(self) -> dict:
        return {"data_source": self.source, "data_description": self.description,
                "tokenizer": self.tokenizer.kind, "vocab_size": self.tokenizer.vocab_size,
                "tokenizer_hash": tokenizer_hash(self.tokenizer), "train_tokens": int(self.train.size),
                "val_tokens": int(self.val.size), "chars_per_token": self.chars_per_token,
                "val_unknown_share": self.val_unknown_share, **(self.text or {})}


# A corpus is known by its content, never its path (data moves between machines and folders): the hashes of
# its splits' text where a record has them, and what older records hold besides (tokenizer, stories, characters).
CORPUS_KEYS = ("train_sha256", "val_sha256", "tokenizer", "tokenizer_hash", "train_stories", "train_chars",
               "val_stories", "val_chars")


def corpus_differences(recorded: dict, here: dict) -> list[str]:
    """How the corpus ``here`` differs from the one ``recorded`` (both ``TokenData.describe()``): one phrase
    per key that both hold and that differs; empty for the same text, wherever it lies."""
    return [f"{key} {recorded[key]!r} there, {here[key]!r} here" for key in CORPUS_KEYS
            if key in recorded and key in here and recorded[key] != here[key]]


def corpus_label(data: dict) -> str:
    """A corpus in words, from its content alone: equal for one corpus on any machine, unequal for two."""
    return (f"{data['tokenizer']} tokenizer {data['tokenizer_hash']}, {data['train_chars']:,} training and "
            f"{data['val_chars']:,} validation characters")


def _tidy_cache(cache_dir: str | Path) -> None:
    """Remove what killed cache writes left (token arrays, tokenizers, hub downloads): a temporary no
    live process is writing is never finished by anyone."""
    root = Path(cache_dir)
    folders = [root / "tokens", root / "tokenizers", *(root / "hub").glob("*")]
    removed = [tmp for folder in folders if folder.is_dir() for tmp in remove_stale_temporaries(folder)]
    if removed:
        warn(f"removed {len(removed)} unfinished temporary file(s) that interrupted cache writes left in {root}")


def prepare_data(config: dict) -> TokenData:
    """Corpus -> tokenizer -> cached token arrays, checked against SEQ_LEN. Every step streams the
    stories, so resident memory stays flat however large the corpus (bench/bench_data.py)."""
    _tidy_cache(config["CACHE_DIR"])
    corpus = load_corpus(config)
    train_text, val_text = TextStats.scan(corpus.train), TextStats.scan(corpus.val)
    for name, stats in (("training", train_text), ("validation", val_text)):
        if not stats.stories:
            raise DataError(f"no {name} stories in {corpus.description}")
    sample = config["TOKENIZER_TRAIN_CHARS"] if config["TOKENIZER"] == "bpe" else None
    sample = sample if sample and sample < train_text.chars else None
    tokenizer = load_or_train_tokenizer(config["TOKENIZER"], config["VOCAB_SIZE"], corpus, config["CACHE_DIR"],
                                        train_text.sha256, sample)
    train = cached_tokens(tokenizer, corpus.train, train_text.sha256, config["CACHE_DIR"], "train", train_text.chars)
    val = cached_tokens(tokenizer, corpus.val, val_text.sha256, config["CACHE_DIR"], "val", val_text.chars)
    window = config["SEQ_LEN"] + 1
    for name, ids in (("training", train), ("validation", val)):
        if ids.size < window:
            raise DataError(f"SEQ_LEN={config['SEQ_LEN']} is longer than the {name} data ({ids.size} tokens); "
                            "lower SEQ_LEN or use more data")
    chars = val_text.chars + val_text.stories  # each story's end-of-story token counts as one char
    unk_id = getattr(tokenizer, "unk_id", None)  # byte-level BPE maps every character
    unknown = int(np.count_nonzero(val == unk_id)) / val.size if unk_id is not None else 0.0
    if unknown > UNKNOWN_WARNING_SHARE:
        warn(f"{unknown:.1%} of the validation tokens are characters the training text never has (<unk>): "
             "the two splits do not share an alphabet, so bits/char there measure little; check VAL_PATH")
    text = {"train_stories": train_text.stories, "train_chars": train_text.chars, "val_stories": val_text.stories,
            "val_chars": val_text.chars, "tokenizer_trained_on_chars": sample or train_text.chars,
            "train_sha256": train_text.sha256, "val_sha256": val_text.sha256}  # the corpus's identity, not its path
    return TokenData(train, val, tokenizer, corpus.source, corpus.description, chars / val.size, unknown, text)


# ------------------------------------------------------------------ windows


class TrainWindows(torch.utils.data.Dataset):
    """Non-overlapping windows of ``seq_len + 1`` tokens as (inputs, targets).

    The order is a permutation fixed by ``seed`` and the epoch, so loaders never
    shuffle (XLA wants that) and a run resumed at step k sees the same batches.
    """

    def __init__(self, ids: np.ndarray, seq_len: int, seed: int = 0):
        self.ids, self.seq_len, self.seed = ids, seq_len, seed
        self.n_windows = (len(ids) - 1) // seq_len
        if self.n_windows < 1:
            raise DataError(f"SEQ_LEN={seq_len} is longer than the data ({len(ids)} tokens)")
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        self.order = np.random.default_rng([self.seed, epoch]).permutation(self.n_windows)

    def __len__(self) -> int:
        return self.n_windows

    def __getitem__(self, index: int):
        start = int(self.order[index]) * self.seq_len
        window = torch.from_numpy(np.asarray(self.ids[start:start + self.seq_len + 1], dtype=np.int64))
        return window[:-1], window[1:]

    def batch(self, first: int, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Windows ``first`` .. ``first + count - 1`` as one batch (inputs, targets): what a DataLoader collates
        from them (contiguous tensors, as its stack makes them), in one gather instead of a Python call per
        window."""
        starts = self.order[first:first + count] * self.seq_len
        windows = torch.from_numpy(np.asarray(self.ids)[starts[:, None] + np.arange(self.seq_len + 1)]
                                   .astype(np.int64))
        return windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def eval_windows(ids: np.ndarray, seq_len: int, eval_tokens: int) -> torch.Tensor:
    """The fixed validation set: consecutive windows from the start of the split,
    about ``eval_tokens`` predicted tokens in all (fewer if the split is shorter)."""
    n = max(1, min(eval_tokens // seq_len, (len(ids) - 1) // seq_len))
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(ids[: n * seq_len + 1]), seq_len + 1)[::seq_len]
    return torch.from_numpy(windows.astype(np.int64))
