"""Data: TinyStories (hub, local files), Tiny Shakespeare or the built-in synthetic corpus,
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

from .files import atomic_write, atomic_write_text, remove_stale_temporaries
from .messages import OneLineError, progress, say, warn
from .synthetic import synthetic_stories

EOT = "<|endoftext|>"
UNKNOWN_WARNING_SHARE = 0.001  # warn when more validation tokens than this share are <unk>
_EOT_MARK = "\ue000"  # a private-use character standing for EOT inside joined text


class DataError(OneLineError, ValueError):
    """Bad data input: reported as one line that says what to fix."""


# ------------------------------------------------------------------ sources

READ_BYTES = 1 << 22  # a text file is read, decoded and split 4 MiB at a time
FORMAT_PROBE_BYTES = 1 << 20  # a .txt file is TinyStories' raw format when EOT occurs in its first MiB


class Stories:
    """Stories that can be read again and again, one at a time: every pass over a corpus (its hash,
    the tokenizer, the encoding) holds one story or one read chunk, never the corpus.

    ``open()`` returns a fresh iterator; ``first`` and ``count`` select a range of it (a held-out
    tail, a cap), and ``max_chars`` cuts the text after that many characters (the last story short).
    """

    def __init__(self, open_stories, first: int = 0, count: int | None = None, max_chars: int | None = None):
        self._open = open_stories
        self.first, self.count, self.max_chars = first, count, max_chars

    @classmethod
    def of(cls, stories: list[str]) -> Stories:
        return cls(lambda: iter(stories))

    def select(self, first: int = 0, count: int | None = None, max_chars: int | None = None) -> Stories:
        """A sub-range of these stories (relative to this range), optionally capped in characters."""
        remaining = None if self.count is None else self.count - first
        if count is not None:
            remaining = count if remaining is None else min(remaining, count)
        caps = [c for c in (self.max_chars, max_chars) if c]
        return Stories(self._open, self.first + first, remaining, min(caps) if caps else None)

    def __iter__(self):
        chars = 0
        stop = None if self.count is None else self.first + self.count
        for index, story in enumerate(self._open()):
            if stop is not None and index >= stop:
                return
            if index < self.first:
                continue
            if self.max_chars:
                if chars >= self.max_chars:
                    return
                story = story[: self.max_chars - chars]
            chars += len(story)
            yield story


_SAID_NEWLINES: set[Path] = set()  # files already reported as having Windows or old-Mac line ends


def _read_text(path: Path):
    """The decoded text of a UTF-8 file, ``READ_BYTES`` at a time; '' once at the end. Line ends
    are read as ``\n`` whatever wrote them (``\r\n``, ``\r``), so a '\r' is never a character of a
    story and blank lines still separate stories; a file that has them is said once."""
    import codecs
    import io

    decoder = io.IncrementalNewlineDecoder(codecs.getincrementaldecoder("utf-8")(), translate=True)
    offset = 0
    try:
        with open(path, "rb") as f:
            while True:
                raw = f.read(READ_BYTES)
                try:
                    text = decoder.decode(raw, final=not raw)
                except UnicodeDecodeError as e:
                    raise DataError(f"{path} is not UTF-8 text (byte {offset + e.start}); convert it, e.g. with "
                                    "iconv") from None
                yield text
                offset += len(raw)
                if not raw:
                    _say_newlines(path, decoder.newlines)
                    return
    except OSError as e:
        raise DataError(f"cannot read {path}: {e.strerror}") from None


def _say_newlines(path: Path, seen) -> None:
    kinds = {seen} if isinstance(seen, str) else set(seen or ())
    if kinds - {"\n"} and path not in _SAID_NEWLINES:
        _SAID_NEWLINES.add(path)
        names = ", ".join(sorted(repr(k) for k in kinds - {"\n"}))
        say(f"{path} has {names} line ends: read as '\\n'")


def _is_raw_tinystories(path: Path) -> bool:
    with open(path, "rb") as f:
        return EOT.encode() in f.read(FORMAT_PROBE_BYTES)


def iter_stories(path: str | Path):
    """Stories from one file, read as a stream: TinyStories' raw format (stories separated by a line
    ``<|endoftext|>``, recognised in the first MiB), plain text (blank lines separate stories), or
    ``.jsonl`` with a ``text`` field. A bad byte or line is an error naming the file and where."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"data file {path} does not exist (check DATASET / TRAIN_PATH / VAL_PATH)")
    found = 0
    if path.suffix == ".jsonl":
        buffer, line_number = "", 0
        for text in _read_text(path):
            buffer += text
            lines = buffer.split("\n")
            buffer = lines.pop() if text else ""  # a line cut by the read: completed by the next piece
            for line in lines:
                line_number += 1
                if not line.strip():
                    continue
                try:
                    story = json.loads(line)["text"]
                    if not isinstance(story, str):
                        raise TypeError
                except (json.JSONDecodeError, KeyError, TypeError):
                    raise DataError(f"{path}:{line_number} is not a JSON object with a 'text' field") from None
                if story.strip():
                    found += 1
                    yield story.strip()
    else:
        separator = EOT if _is_raw_tinystories(path) else "\n\n"
        buffer = ""
        for text in _read_text(path):
            buffer += text
            parts = buffer.split(separator)
            buffer = parts.pop() if text else ""  # a story cut by the read: completed by the next piece
            for story in parts:
                if story.strip():
                    found += 1
                    yield story.strip()
    if not found:
        raise DataError(f"{path} has no stories (it is empty or only separators)")


def read_stories(path: str | Path) -> list[str]:
    """Every story of one file (small files; large ones are read with ``iter_stories``)."""
    return list(iter_stories(path))


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


def _file_stories(files: list[Path]) -> Stories:
    return Stories(lambda: (story for f in files for story in iter_stories(f)))


def _held_out_tail(stories: Stories, fraction: float, where: str) -> tuple[Stories, Stories]:
    total = sum(1 for _ in stories)  # one streaming pass: how many stories there are
    if total < 2:
        raise DataError(f"{where} has only {total} story; give a validation file (VAL_PATH) "
                        "or more stories so a tail can be held out")
    n_val = max(1, int(total * fraction))
    return stories.select(0, total - n_val), stories.select(total - n_val, n_val)


@dataclass
class Corpus:
    train: Stories
    val: Stories
    source: str  # 'tinystories' | 'shakespeare' | 'files' | 'synthetic': recorded with results, shown in plots
    description: str  # where exactly the text came from


def _load_files(train_spec: str, val_spec: str | None, config: dict) -> Corpus:
    files = _expand(train_spec)
    train_files, val_files = (files, []) if val_spec else _split_train_val(files)
    if val_spec:
        val_files = _expand(val_spec)
    if not train_files:
        raise DataError(f"{train_spec!r} holds only validation files; point TRAIN_PATH at training data")
    train = _file_stories(train_files)
    if val_files:
        val = _file_stories(val_files)
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


def _hub_folder(config: dict) -> Path:
    slug = "".join(c if c.isalnum() or c in "-_." else "_" for c in config["HF_DATASET"])
    return Path(config["CACHE_DIR"]) / "hub" / slug


def _materialize(config: dict, split: str, max_stories: int | None, max_chars: int | None, online: bool) -> Path:
    """The split's stories, up to the caps, as a local TinyStories-format file under CACHE_DIR/hub/.

    With a cap (and always for validation) the split is *streamed* and reading stops at the cap, so
    only the shards the run needs are fetched; an uncapped training split is loaded whole (and kept
    in ``datasets``' cache, with the other splits ``datasets`` prepares beside it). The
    file is written to a temporary name and renamed when complete, so a cut-off download is never used.
    """
    cap = f"{max_stories or 'all'}-stories-{max_chars or 'all'}-chars"
    path = _hub_folder(config) / f"{split}-{cap}.txt"
    if path.exists():
        return path
    if not online:
        raise DataError(f"{config['HF_DATASET']} {split} split is not in the local cache ({path}) and the hub "
                        "is unreachable")
    import datasets

    streaming = split != "train" or bool(max_stories or max_chars)  # only a whole training split is downloaded
    rows = datasets.load_dataset(config["HF_DATASET"], split=split, streaming=streaming,
                                 cache_dir=str(Path(config["CACHE_DIR"]) / "hf"))
    chosen = Stories(lambda: (row["text"] for row in rows)).select(0, max_stories, max_chars)
    bar = progress(max_chars or None, f"fetching {config['HF_DATASET']} {split}", delay=5.0, unit="char",
                   unit_scale=True)

    def write(tmp):
        with open(tmp, "w", encoding="utf-8") as f:
            for story in chosen:
                if story.strip():
                    f.write(f"{story.strip()}\n{EOT}\n")
                    bar.update(len(story))

    atomic_write(path, write)
    bar.close()
    return path


def _load_hub(config: dict) -> Corpus:
    """TinyStories through Hugging Face ``datasets``: the validation split and as much of the training
    split as the caps allow, each kept as a local file under CACHE_DIR/hub/ (read from there offline)."""
    online = _hub_reachable()
    if not online:
        os.environ["HF_HUB_OFFLINE"] = "1"  # use the local cache only, without waiting on the network
        os.environ["HF_DATASETS_OFFLINE"] = "1"
    name = config["HF_DATASET"]
    try:
        train_path = _materialize(config, "train", config["MAX_TRAIN_STORIES"], config["MAX_TRAIN_CHARS"], online)
        val_path = _materialize(config, "validation", None, None, online)
    except Exception as e:  # noqa: BLE001 - any hub/cache failure gets the same advice
        reason = str(e) if isinstance(e, DataError) else type(e).__name__
        raise DataError(
            f"cannot load {name} from the hub{'' if online else ' (offline)'} or the cache {_hub_folder(config)} "
            f"({reason}); use DATASET=synthetic, or DATASET=<path to TinyStories-train.txt or a folder>"
        ) from None
    caps = [f"{k}={config[k]:,}" for k in ("MAX_TRAIN_STORIES", "MAX_TRAIN_CHARS") if config[k]]
    used = f"training stories up to {' and '.join(caps)}" if caps else "the whole training split"
    return Corpus(_file_stories([train_path]), _file_stories([val_path]), "tinystories",
                  f"Hugging Face {name}{'' if online else ' (cached)'}: {used}, the whole validation split")


def _local_tinystories(data_dir: str) -> list[Path] | None:
    folder = Path(data_dir)
    if not folder.is_dir():
        return None
    files = sorted(p for p in folder.glob("*.txt") if "tinystories" in p.name.lower())
    return files or None


def _synthetic(config: dict) -> Corpus:
    stories = Stories.of(synthetic_stories(config["SYNTHETIC_STORIES"], config["SEED"]))
    train, val = _held_out_tail(stories, config["VAL_FRACTION"], "the synthetic corpus")
    return Corpus(train, val, "synthetic", f"built-in synthetic TinyStories-like corpus "
                  f"({config['SYNTHETIC_STORIES']} stories, seed {config['SEED']})")


SHAKESPEARE_TRAIN_FRACTION = 0.9  # the standard protocol (char-rnn, nanoGPT's shakespeare_char)
SHAKESPEARE_SOURCE = "karpathy/char-rnn data/tinyshakespeare/input.txt"


def _shakespeare_file(config: dict) -> Path:
    """TRAIN_PATH, else input.txt in DATA_DIR or DATA_DIR/shakespeare."""
    if config["TRAIN_PATH"]:
        candidates = [Path(config["TRAIN_PATH"]).expanduser()]
    else:
        folder = Path(config["DATA_DIR"]).expanduser()
        candidates = [folder / "input.txt", folder / "shakespeare" / "input.txt"]
    found = next((p for p in candidates if p.is_file()), None)
    if found is None:
        raise DataError(f"DATASET='shakespeare' needs Tiny Shakespeare's input.txt ({SHAKESPEARE_SOURCE}); not "
                        f"found at {' or '.join(map(str, candidates))}: put it there, or set TRAIN_PATH to it")
    return found


def _shakespeare(config: dict) -> Corpus:
    """Tiny Shakespeare by the standard protocol: the first 90% of the characters train, the last 10%
    validate, each one stream with no story boundaries (VAL_PATH and VAL_FRACTION do not apply)."""
    path = _shakespeare_file(config)
    text = "".join(_read_text(path))  # ~1 MB: the split needs its length, so it is read whole
    if config["VAL_PATH"]:
        raise DataError("DATASET='shakespeare' splits its one file 90/10 by characters; VAL_PATH does not apply "
                        "(use DATASET=<path> TRAIN_PATH=... VAL_PATH=... for other text)")
    if len(text.strip()) < 100:
        raise DataError(f"{path} holds {len(text)} characters: too little to split into training and validation")
    cut = int(len(text) * SHAKESPEARE_TRAIN_FRACTION)
    train, val = text[:cut], text[cut:]
    return Corpus(Stories.of([train]), Stories.of([val]), "shakespeare",
                  f"Tiny Shakespeare {path}: characters 0-{cut:,} train, {cut:,}-{len(text):,} validate "
                  "(one stream each, no story boundaries)")


def _cap(corpus: Corpus, config: dict) -> Corpus:
    train = corpus.train.select(0, config["MAX_TRAIN_STORIES"], config["MAX_TRAIN_CHARS"])
    return Corpus(train, corpus.val, corpus.source, corpus.description)


def load_corpus(config: dict) -> Corpus:
    """The text a run trains and validates on, chosen by DATASET / TRAIN_PATH / VAL_PATH (read lazily:
    nothing is read until a pass over the stories)."""
    dataset = config["DATASET"]
    if dataset == "shakespeare":
        corpus = _shakespeare(config)
    elif config["TRAIN_PATH"]:
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
        codepoints = np.frombuffer(self.chars.encode("utf-32-le"), dtype=np.uint32)
        # a dense table indexed by code point: one gather per character (the last entry catches any above)
        self._table = np.full(max(ord(_EOT_MARK), int(codepoints.max(initial=0))) + 2, self.unk_id, dtype=np.int64)
        self._table[codepoints] = np.arange(len(self.specials), len(self.specials) + len(self.chars))
        self._table[ord(_EOT_MARK)] = self.eot_id

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


# ------------------------------------------------------------------ token cache

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
            "val_chars": val_text.chars, "tokenizer_trained_on_chars": sample or train_text.chars}
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


def eval_windows(ids: np.ndarray, seq_len: int, eval_tokens: int) -> torch.Tensor:
    """The fixed validation set: consecutive windows from the start of the split,
    about ``eval_tokens`` predicted tokens in all (fewer if the split is shorter)."""
    n = max(1, min(eval_tokens // seq_len, (len(ids) - 1) // seq_len))
    windows = np.lib.stride_tricks.sliding_window_view(np.asarray(ids[: n * seq_len + 1]), seq_len + 1)[::seq_len]
    return torch.from_numpy(windows.astype(np.int64))
