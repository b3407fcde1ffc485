"""Where the text comes from: TinyStories (the Hugging Face hub, or local files), Tiny Shakespeare,
or the built-in synthetic corpus, read as stories without holding a file in memory.

    corpus = load_corpus(config)     # -> Corpus: train and validation Stories, and where they came from
    for story in iter_stories(path): ...

Every file this module writes (a hub download's text) is written to a temporary name and renamed.
"""

from __future__ import annotations

import glob
import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

from reservoir.data.synthetic import synthetic_stories
from reservoir.platform.files import atomic_write
from reservoir.platform.messages import OneLineError, progress, say, warn

EOT = "<|endoftext|>"  # the end of a story, in TinyStories' raw files and in every tokenizer
EOT_MARK = "\ue000"  # a private-use character standing for EOT inside joined text


class DataError(OneLineError, ValueError):
    """Bad data input: reported as one line that says what to fix."""


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


def corpus_seed(config: dict) -> int | None:
    """The seed the corpus itself is drawn with (SEED, for the synthetic one), or None for text read from files:
    runs that differ in SEED share their text only where this is None."""
    return config["SEED"] if config["DATASET"] == "synthetic" else None


def _synthetic(config: dict) -> Corpus:
    stories = Stories.of(synthetic_stories(config["SYNTHETIC_STORIES"], corpus_seed(config)))
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
