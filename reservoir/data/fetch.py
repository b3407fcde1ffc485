"""The exact text the committed studies trained on, fetched from its public sources into ``data/``.

    python -m reservoir.data.fetch tinystories-slices shakespeare     # data/tinystories/, data/shakespeare/
    python -m reservoir.data.fetch shakespeare TO=elsewhere            # into another folder
    python -m reservoir.data.fetch tinystories-slices SOURCE=http://mirror/tinystories/   # another server

The TinyStories slices are the first stories of the train and validation files on the Hugging Face hub
(roneneldan/TinyStories), cut at the byte counts the studies trained on (only those bytes are asked for: an HTTP
range, so the 1.9 GB training file is not downloaded); Tiny Shakespeare is char-rnn's ``input.txt``. Each file is
written only if its SHA-256 is that of the text the committed studies trained on (whose records name it by the
same text's tokenizer hash and character counts): a source that serves other bytes is one line naming both
digests, and nothing is written. Offline, one line says where to put the files instead.
"""

from __future__ import annotations

import hashlib
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from reservoir.platform.files import atomic_write
from reservoir.platform.messages import OneLineError, say

HUB = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/"
CHAR_RNN = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
TIMEOUT_S = 60


class FetchError(OneLineError):
    """A file that could not be fetched as the studies trained on it."""


@dataclass(frozen=True)
class Piece:
    """One file of a data set: where it goes under TO, where it comes from, how many bytes of it, its digest."""

    path: str
    url: str
    size: int
    sha256: str


DATASETS = {
    "tinystories-slices": [
        Piece("tinystories/TinyStories-train-sample.txt", HUB + "TinyStories-train.txt", 954_278,
              "86f4b7c0ed9508576408a380a190f13fb33c852dde8066a90d1b16a84dda1807"),
        Piece("tinystories/TinyStories-valid-sample.txt", HUB + "TinyStories-valid.txt", 799_137,
              "fdda677adb18b609ccb9b7a8feaf998362bc460a61fdce9062bca700f6a7d651"),
    ],
    "shakespeare": [
        Piece("shakespeare/input.txt", CHAR_RNN + "input.txt", 1_115_394,
              "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed"),
    ],
}


def _digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def download(url: str, size: int) -> bytes:
    """The first ``size`` bytes at ``url``: asked for as an HTTP range, and read no further where a server sends
    the whole file."""
    request = urllib.request.Request(url, headers={"Range": f"bytes=0-{size - 1}", "User-Agent": "reservoir-nlp"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as response:
        chunks, got = [], 0
        while got < size:
            chunk = response.read(min(1 << 16, size - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
    return b"".join(chunks)


def fetch(piece: Piece, to: Path, source: str | None = None) -> str:
    """``piece`` into ``to``, checked; what was done, in words. ``source``: another server's folder that holds the
    same file names."""
    target = to / piece.path
    if target.is_file() and _digest(target.read_bytes()) == piece.sha256:
        return f"{target}: already there (SHA-256 checked)"
    url = source.rstrip("/") + "/" + piece.url.rsplit("/", 1)[1] if source else piece.url
    try:
        data = download(url, piece.size)
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise FetchError(f"cannot fetch {url} ({reason}); offline? put the file there yourself: {target}, "
                         f"{piece.size:,} bytes, SHA-256 {piece.sha256}") from None
    if len(data) < piece.size:
        raise FetchError(f"{url} ended after {len(data):,} of the {piece.size:,} bytes the studies trained on "
                         f"(a truncated file): nothing written to {target}; try again, or put the file there yourself")
    if _digest(data) != piece.sha256:
        raise FetchError(f"{url}: its first {piece.size:,} bytes have SHA-256 {_digest(data)}, not the studies' "
                         f"{piece.sha256}: the source serves other text (changed, or another file); nothing written "
                         f"to {target}")
    atomic_write(target, lambda tmp: Path(tmp).write_bytes(data))
    return f"{target}: {piece.size:,} bytes from {url} (SHA-256 checked: the text the studies trained on)"


def main(argv: list[str]) -> int:
    names = [a for a in argv if "=" not in a]
    options = dict(a.split("=", 1) for a in argv if "=" in a)
    unknown = [n for n in names if n not in DATASETS] + [k for k in options if k not in ("TO", "SOURCE")]
    if not names or unknown or any(a in ("-h", "--help") for a in argv):
        usage = __doc__.split("\n\n")[1]
        print(f"{'error: unknown ' + repr(unknown[0]) + chr(10) if unknown else ''}usage:\n{usage}\n"
              f"data sets: {', '.join(DATASETS)}; keys: TO (default data), SOURCE", file=sys.stderr)
        return 0 if not unknown and names else 2
    to = Path(options.get("TO", "data"))
    try:
        for name in names:
            for piece in DATASETS[name]:
                say(fetch(piece, to, options.get("SOURCE")))
    except FetchError as e:
        raise SystemExit(f"error: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
