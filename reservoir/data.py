"""Data: TinyStories (hub, local files) or the built-in synthetic corpus,
tokenizers (char, byte-level BPE), an on-disk token cache and fixed-shape windows.

    data = prepare_data(config)      # -> TokenData: token arrays, tokenizer, where the text came from
    TrainWindows(data.train, seq_len, seed)   # (x, y) windows of SEQ_LEN + 1 tokens
    eval_windows(data.val, seq_len, eval_tokens)

Every file this module writes is written to a temporary name and renamed, so
an interrupted run never leaves a half-written cache behind.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import socket
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from .files import atomic_write, atomic_write_text
from .messages import say, warn
from .synthetic import synthetic_stories

EOT = "<|endoftext|>"
HUB_DATASET = "roneneldan/TinyStories"
UNKNOWN_WARNING_SHARE = 0.001  # warn when more validation tokens than this share are <unk>
_EOT_MARK = "\ue000"  # a private-use character standing for EOT inside joined text


class DataError(ValueError):
    """Bad data input: reported as one line that says what to fix."""


# ------------------------------------------------------------------ sources


@dataclass
class Corpus:
    train: list[str]
    val: list[str]
    source: str  # 'tinystories' | 'files' | 'synthetic': recorded with results and shown in plots
    description: str  # where exactly the text came from


def read_stories(path: str | Path) -> list[str]:
    """Stories from one file: TinyStories' raw format (stories separated by a line
    ``<|endoftext|>``), plain text (blank lines separate stories), or ``.jsonl``
    with a ``text`` field."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist (check DATASET / TRAIN_PATH / VAL_PATH)")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DataError(f"{path} is not UTF-8 text (byte {e.start}); convert it, e.g. with iconv") from None
    if path.suffix == ".jsonl":
        stories = []
        for n, line in enumerate(text.splitlines(), 1):
            if not line.strip():
                continue
            try:
                stories.append(json.loads(line)["text"])
            except (json.JSONDecodeError, KeyError, TypeError):
                raise DataError(f"{path}:{n} is not a JSON object with a 'text' field") from None
    elif EOT in text:
        stories = text.split(EOT)
    else:
        stories = text.split("\n\n")
    stories = [s.strip() for s in stories if s.strip()]
    if not stories:
        raise DataError(f"{path} has no stories (it is empty or only separators)")
    return stories


def _expand(spec: str) -> list[Path]:
    """A file, a glob or a folder -> the text files it names."""
    path = Path(spec).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix in (".txt", ".jsonl") and p.is_file())
    else:
        files = sorted(Path(p) for p in glob.glob(str(path)))
    if not files:
        raise DataError(f"no .txt or .jsonl data found at {spec!r}")
    return files


def _split_train_val(files: list[Path]) -> tuple[list[Path], list[Path]]:
    val = [f for f in files if "valid" in f.name.lower() or f.stem.lower().endswith("val")]
    train = [f for f in files if f not in val]
    return train, val


def _held_out_tail(stories: list[str], fraction: float, where: str) -> tuple[list[str], list[str]]:
    if len(stories) < 2:
        raise DataError(f"{where} has only {len(stories)} story; give a validation file (VAL_PATH) "
                        "or more stories so a tail can be held out")
    n_val = max(1, int(len(stories) * fraction))
    return stories[:-n_val], stories[-n_val:]


def _load_files(train_spec: str, val_spec: str | None, config: dict) -> Corpus:
    files = _expand(train_spec)
    train_files, val_files = (files, []) if val_spec else _split_train_val(files)
    if val_spec:
        val_files = _expand(val_spec)
    if not train_files:
        raise DataError(f"{train_spec!r} holds only validation files; point TRAIN_PATH at training data")
    train = [s for f in train_files for s in read_stories(f)]
    if val_files:
        val = [s for f in val_files for s in read_stories(f)]
    else:
        train, val = _held_out_tail(train, config["VAL_FRACTION"], train_spec)
    names = ", ".join(str(f) for f in train_files + val_files)
    return Corpus(train, val, "files", f"local files: {names}")


def _hub_reachable(timeout: float = 3.0) -> bool:
    try:
        socket.create_connection(("huggingface.co", 443), timeout=timeout).close()
        return True
    except OSError:
        return False


def _load_hub(config: dict) -> Corpus:
    """TinyStories through Hugging Face ``datasets`` (downloaded once into CACHE_DIR)."""
    cache = str(Path(config["CACHE_DIR"]) / "hf")
    online = _hub_reachable()
    if not online:
        os.environ["HF_HUB_OFFLINE"] = "1"  # use the local cache only, without waiting on the network
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    try:
        import datasets

        if not online:
            datasets.config.HF_HUB_OFFLINE = True
        splits = datasets.load_dataset(HUB_DATASET, cache_dir=cache)
    except Exception as e:  # noqa: BLE001 - any hub/cache failure gets the same advice
        raise DataError(
            f"cannot load {HUB_DATASET} from the hub{'' if online else ' (offline)'} or the cache {cache} "
            f"({type(e).__name__}); use DATASET=synthetic, or DATASET=<path to TinyStories-train.txt or a folder>"
        ) from None
    train = splits["train"]
    if config["MAX_TRAIN_STORIES"]:
        train = train.select(range(min(len(train), config["MAX_TRAIN_STORIES"])))
    return Corpus(list(train["text"]), list(splits["validation"]["text"]), "tinystories",
                  f"Hugging Face {HUB_DATASET}" + (" (cached)" if not online else ""))


def _local_tinystories(data_dir: str) -> list[Path] | None:
    folder = Path(data_dir)
    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.glob("*.txt") if "tinystories" in p.name.lower())
    return files or None


def _synthetic(config: dict) -> Corpus:
    stories = synthetic_stories(config["SYNTHETIC_STORIES"], config["SEED"])
    train, val = _held_out_tail(stories, config["VAL_FRACTION"], "the synthetic corpus")
    return Corpus(train, val, "synthetic",
                  f"built-in synthetic TinyStories-like corpus ({len(stories)} stories, seed {config['SEED']})")


def _cap(corpus: Corpus, config: dict) -> Corpus:
    train = corpus.train
    if config["MAX_TRAIN_STORIES"]:
        train = train[: config["MAX_TRAIN_STORIES"]]
    if config["MAX_TRAIN_CHARS"]:
        kept, total = [], 0
        for story in train:
            if total >= config["MAX_TRAIN_CHARS"]:
                break
            kept.append(story[: config["MAX_TRAIN_CHARS"] - total])
            total += len(kept[-1])
        train = kept
    if not train or not corpus.val:
        raise DataError(f"no {'training' if not train else 'validation'} stories in {corpus.description}")
    return Corpus(train, corpus.val, corpus.source, corpus.description)


def load_corpus(config: dict) -> Corpus:
    """The text a run trains and validates on, chosen by DATASET / TRAIN_PATH / VAL_PATH."""
    dataset = config["DATASET"]
    if config["TRAIN_PATH"]:
        corpus = _load_files(config["TRAIN_PATH"], config["VAL_PATH"], config)
    elif dataset == "synthetic":
        corpus = _synthetic(config)
    elif dataset == "tinystories":
        corpus = _load_hub(config)
    elif dataset == "auto":
        try:
            corpus = _load_hub(config)
        except DataError as hub_error:
            local = _local_tinystories(config["DATA_DIR"])
            if local:
                corpus = _load_files(config["DATA_DIR"], config["VAL_PATH"], config)
            else:
                warn(f"TinyStories is not available ({hub_error}); no TinyStories files in "
                      f"DATA_DIR={config['DATA_DIR']!r}. USING THE BUILT-IN SYNTHETIC CORPUS: its numbers are "
                      "not TinyStories numbers.")
                corpus = _synthetic(config)
    else:
        corpus = _load_files(dataset, config["VAL_PATH"], config)
    return _cap(corpus, config)


# ------------------------------------------------------------------ tokenizers


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
        self.chars = "".join(sorted(set(chars) - {_EOT_MARK}))
        self.eot_id, self.unk_id = 0, 1
        self._codepoints = np.frombuffer(self.chars.encode("utf-32-le"), dtype=np.uint32)
        self._ids = np.arange(len(self.specials), len(self.specials) + len(self.chars), dtype=np.int64)

    @classmethod
    def train(cls, stories: list[str], vocab_size: int | None = None) -> CharTokenizer:
        return cls("".join(set("".join(stories))))

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
        pos = np.searchsorted(self._codepoints, codepoints).clip(0, max(len(self._codepoints) - 1, 0))
        known = self._codepoints[pos] == codepoints if len(self._codepoints) else np.zeros(len(codepoints), bool)
        ids = np.where(known, self._ids[pos] if len(self._ids) else 0, self.unk_id)
        ids[codepoints == ord(_EOT_MARK)] = self.eot_id
        return ids

    def encode(self, text: str) -> np.ndarray:
        return self._encode_joined(text.replace(EOT, _EOT_MARK))

    def encode_stories(self, stories: list[str]) -> np.ndarray:
        return self._encode_joined(_EOT_MARK.join(stories) + _EOT_MARK)

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
    def train(cls, stories: list[str], vocab_size: int) -> BPETokenizer:
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
        tok.train_from_iterator(stories, trainer=trainer, length=len(stories))
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


def load_or_train_tokenizer(kind: str, vocab_size: int, corpus: Corpus, cache_dir: str | Path, train_hash: str):
    """A tokenizer trained on the training split, saved once and reused by later runs."""
    cls = TOKENIZERS[kind]
    path = Path(cache_dir) / "tokenizers" / f"{kind}-{vocab_size if kind == 'bpe' else 'all'}-{train_hash[:16]}.json"
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
    tokenizer = cls.train(corpus.train, vocab_size)
    text = tokenizer.to_json()
    atomic_write_text(path, text)
    atomic_write_text(digest_path, content_hash(text.encode("utf-8")))
    say(f"trained {kind} tokenizer (vocab {tokenizer.vocab_size}) in {time.perf_counter() - start:.1f}s")
    return tokenizer


# ------------------------------------------------------------------ token cache


def _save_array(path: str, ids: np.ndarray) -> None:
    with open(path, "wb") as f:  # a file object: np.save would append '.npy' to a bare path
        np.save(f, ids)


def cached_tokens(tokenizer, stories: list[str], text_hash: str, cache_dir: str | Path, split: str) -> np.ndarray:
    """The split's token ids, memory-mapped from the cache (encoded and written on first use).

    uint16 where the vocabulary fits. A cache file that is corrupt or does not
    match its metadata is rebuilt with a warning, never silently used.
    """
    tok_hash = tokenizer_hash(tokenizer)
    stem = Path(cache_dir) / "tokens" / f"{split}-{tok_hash}-{text_hash[:16]}"
    array_path, meta_path = stem.with_suffix(".npy"), stem.with_suffix(".json")
    dtype = np.uint16 if tokenizer.vocab_size <= 2**16 else np.uint32
    if array_path.exists() or meta_path.exists():
        try:
            meta = json.loads(meta_path.read_text())
            ids = np.load(array_path, mmap_mode="r")
            ok = (ids.dtype == dtype and ids.shape == (meta["n_tokens"],) and meta["tokenizer"] == tok_hash
                  and content_hash(ids) == meta["blake2b"])
            if ok:
                return ids
            warn(f"token cache {array_path} does not match its metadata; rebuilding it")
        except Exception as e:  # noqa: BLE001 - any unreadable cache is rebuilt
            warn(f"token cache {array_path} is unreadable ({type(e).__name__}); rebuilding it")
    ids = tokenizer.encode_stories(stories)
    if ids.size and int(ids.max()) >= tokenizer.vocab_size:
        raise DataError(f"tokenizer produced id {int(ids.max())} >= vocab {tokenizer.vocab_size}")
    ids = ids.astype(dtype)
    meta = {"n_tokens": int(ids.size), "dtype": np.dtype(dtype).name, "tokenizer": tok_hash,
            "text": text_hash, "blake2b": content_hash(ids), "split": split}
    atomic_write(array_path, lambda tmp: _save_array(tmp, ids))
    atomic_write_text(meta_path, json.dumps(meta))
    return np.load(array_path, mmap_mode="r")


@dataclass
class TokenData:
    train: np.ndarray
    val: np.ndarray
    tokenizer: object
    source: str
    description: str
    chars_per_token: float  # validation characters per token (reported; bits/char count exact characters)
    val_unknown_share: float = 0.0  # validation tokens the tokenizer could not map (<unk>)

    def describe(self) -> dict:
        return {"data_source": self.source, "data_description": self.description,
                "tokenizer": self.tokenizer.kind, "vocab_size": self.tokenizer.vocab_size,
                "tokenizer_hash": tokenizer_hash(self.tokenizer), "train_tokens": int(self.train.size),
                "val_tokens": int(self.val.size), "chars_per_token": self.chars_per_token,
                "val_unknown_share": self.val_unknown_share}


def prepare_data(config: dict) -> TokenData:
    """Corpus -> tokenizer -> cached token arrays, checked against SEQ_LEN."""
    corpus = load_corpus(config)
    train_hash = _sha256(EOT.join(corpus.train))
    val_hash = _sha256(EOT.join(corpus.val))
    tokenizer = load_or_train_tokenizer(config["TOKENIZER"], config["VOCAB_SIZE"], corpus,
                                        config["CACHE_DIR"], train_hash)
    train = cached_tokens(tokenizer, corpus.train, train_hash, config["CACHE_DIR"], "train")
    val = cached_tokens(tokenizer, corpus.val, val_hash, config["CACHE_DIR"], "val")
    window = config["SEQ_LEN"] + 1
    for name, ids in (("training", train), ("validation", val)):
        if ids.size < window:
            raise DataError(f"SEQ_LEN={config['SEQ_LEN']} is longer than the {name} data ({ids.size} tokens); "
                            "lower SEQ_LEN or use more data")
    chars = sum(len(s) + 1 for s in corpus.val)  # + 1: each story's end-of-story token counts as one char
    unk_id = getattr(tokenizer, "unk_id", None)  # byte-level BPE maps every character
    unknown = int(np.count_nonzero(val == unk_id)) / val.size if unk_id is not None else 0.0
    if unknown > UNKNOWN_WARNING_SHARE:
        warn(f"{unknown:.1%} of the validation tokens are characters the training text never has (<unk>): "
             "the two splits do not share an alphabet, so bits/char there measure little; check VAL_PATH")
    return TokenData(train, val, tokenizer, corpus.source, corpus.description, chars / val.size, unknown)


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


def eval_windows(ids: np.ndarray, seq_len: int, eval_tokens: int) -> torch.Tensor:
    """The fixed validation set: consecutive windows from the start of the split,
    about ``eval_tokens`` predicted tokens in all (fewer if the split is shorter)."""
    n = max(1, min(eval_tokens // seq_len, (len(ids) - 1) // seq_len))
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(ids[: n * seq_len + 1]), seq_len + 1)[::seq_len]
    return torch.from_numpy(windows.astype(np.int64))
