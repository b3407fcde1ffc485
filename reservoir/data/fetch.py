"""The exact text the committed studies trained on, fetched from its public sources into ``data/``.

    python -m reservoir.data.fetch tinystories-slices shakespeare     # data/tinystories/, data/shakespeare/
    python -m reservoir.data.fetch shakespeare TO=elsewhere            # into another folder
    python -m reservoir.data.fetch tinystories-slices SOURCE=http://mirror/tinystories/   # another server
    python -m reservoir.data.fetch tinystories-slices FROM=~/Downloads   # the whole files, downloaded by hand

The TinyStories slices are the first stories of the train and validation files on the Hugging Face hub
(roneneldan/TinyStories), cut at the byte counts the studies trained on: the first 954,278 bytes of
TinyStories-train.txt and the first 799,137 of TinyStories-valid.txt (only those bytes are asked for: an HTTP
range, so the 1.9 GB training file is not downloaded; FROM= cuts the same bytes from a whole file downloaded by
hand); Tiny Shakespeare is char-rnn's ``input.txt``, whole. Each file is written only if its SHA-256 is that
of the text the committed studies trained on (whose records name it by the same text's tokenizer hash and
character counts): a source that serves other bytes is named with both digests, and nothing is written. One
run names every file it could not write and why; a file already in place that holds other text is never
replaced unless REPLACE=True says so. Offline, it says where to put each file instead.
"""

from __future__ import annotations

import hashlib
import sys
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from reservoir.platform.entry import entry_point
from reservoir.platform.files import StorageError, atomic_write
from reservoir.platform.messages import OneLineError, say

HUB = "https://huggingface.co/datasets/roneneldan/TinyStories/resolve/main/"
CHAR_RNN = "https://raw.githubusercontent.com/karpathy/char-rnn/master/data/tinyshakespeare/"
TIMEOUT_S = 60


class FetchError(OneLineError):
    """A file that could not be fetched as the studies trained on it."""


@dataclass(frozen=True)
class Piece:
    """One file of a data set: where it goes under TO, where it comes from, how many bytes of it, its digest, and
    whose file that is."""

    path: str
    url: str
    size: int
    sha256: str
    origin: str
    whole: bool = False  # the source's whole file, not its first ``size`` bytes

    @property
    def source_name(self) -> str:
        return self.url.rsplit("/", 1)[1]

    def cut(self) -> str:
        """How the file is cut from its source, in words."""
        what = f"the whole {self.source_name}" if self.whole else f"the first {self.size:,} bytes of {self.source_name}"
        return f"{what} ({self.origin})"


DATASETS = {
    "tinystories-slices": [
        Piece("tinystories/TinyStories-train-sample.txt", HUB + "TinyStories-train.txt", 954_278,
              "86f4b7c0ed9508576408a380a190f13fb33c852dde8066a90d1b16a84dda1807", "roneneldan/TinyStories on the "
              "Hugging Face hub, 1.9 GB"),
        Piece("tinystories/TinyStories-valid-sample.txt", HUB + "TinyStories-valid.txt", 799_137,
              "fdda677adb18b609ccb9b7a8feaf998362bc460a61fdce9062bca700f6a7d651", "roneneldan/TinyStories on the "
              "Hugging Face hub, 19 MB"),
    ],
    "shakespeare": [
        Piece("shakespeare/input.txt", CHAR_RNN + "input.txt", 1_115_394,
              "86c4e6aa9db7c042ec79f339dcb96d42b0075e16b8fc2e86bf0ca57e2dc565ed", "char-rnn's tinyshakespeare",
              whole=True),
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


def _place_for(target: Path, to: Path) -> None:
    """``target`` can be written: no file where one of its folders goes (TO itself included), no folder where it
    goes."""
    for place in [to, *(to / folder for folder in reversed(target.relative_to(to).parents[:-1]))]:
        if place.exists() and not place.is_dir():
            named = f"TO={to}" if place == to else str(place)
            raise FetchError(f"{named} is a file where the folder {place.name}/ goes: give TO a folder (TO=data), "
                             "or move that file away")
    if target.is_dir():
        raise FetchError(f"{target} is a folder where the file {target.name} goes: move it away, then fetch again")


def _from_hand(piece: Piece, given: Path) -> Path | None:
    """The whole source file a user downloaded by hand, for ``piece``: FROM=<its folder> or FROM=<the file>."""
    if given.is_dir():
        return given / piece.source_name
    return given if given.name == piece.source_name else None


def fetch(piece: Piece, to: Path, source: str | None = None, given: Path | None = None, replace: bool = False) -> str:
    """``piece`` into ``to``, checked; what was done, in words. ``source``: another server's folder that holds the
    same file names; ``given``: the whole source files downloaded by hand (FROM); ``replace``: a file in place
    that holds other text may be replaced (REPLACE=True), else it is named and kept."""
    target = to / piece.path
    _place_for(target, to)
    held = None
    if target.is_file():
        held = _digest(target.read_bytes())
        if held == piece.sha256:
            return f"{target}: already there (SHA-256 checked)"
        if not replace:
            raise FetchError(f"{target} is in place but holds other text (SHA-256 {held}, not the studies' "
                             f"{piece.sha256}): kept as it is; move it away, or add REPLACE=True to replace it")
    hand = _from_hand(piece, given) if given is not None else None
    if hand is not None:
        url = str(hand)
        if not hand.is_file():
            raise FetchError(f"FROM={given} holds no {piece.source_name} ({piece.origin}): download it there, or "
                             f"leave FROM out to fetch {piece.cut()}")
        with hand.open("rb") as whole:
            data = whole.read(piece.size)
    else:
        url = source.rstrip("/") + "/" + piece.source_name if source else piece.url
        try:
            data = download(url, piece.size)
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", None) or e
            raise FetchError(f"cannot fetch {url} ({reason}); offline? put the file there yourself: {target}, "
                             f"{piece.size:,} bytes, SHA-256 {piece.sha256}: {piece.cut()}, or give the whole file "
                             f"downloaded by hand with FROM=<its folder>") from None
    if len(data) < piece.size:
        raise FetchError(f"{url} ended after {len(data):,} of the {piece.size:,} bytes the studies trained on "
                         f"(a truncated file): nothing written to {target}; try again, or put the file there yourself")
    if _digest(data) != piece.sha256:
        raise FetchError(f"{url}: its first {piece.size:,} bytes have SHA-256 {_digest(data)}, not the studies' "
                         f"{piece.sha256}: the source serves other text (changed, or another file); nothing written "
                         f"to {target}")
    try:
        atomic_write(target, lambda tmp: Path(tmp).write_bytes(data), place="give TO a folder this user may write")
    except StorageError as e:
        raise FetchError(str(e)) from None
    done = f"{target}: {piece.size:,} bytes from {url}, {piece.cut()} (SHA-256 checked: the studies' text)"
    return done + (f"; it replaced a file that held other text (SHA-256 {held})" if held else "")


KEYS = ("TO", "SOURCE", "FROM", "REPLACE")


@entry_point
def main(argv: list[str]) -> int:
    asked_for_help = any(a in ("-h", "--help") for a in argv)
    names = [a for a in argv if "=" not in a and a not in ("-h", "--help")]
    options = dict(a.split("=", 1) for a in argv if "=" in a)
    unknown = [n for n in names if n not in DATASETS] + [k for k in options if k not in KEYS]
    if asked_for_help or not names or unknown:
        usage = __doc__.split("\n\n")[1]
        print(f"{'error: unknown ' + repr(unknown[0]) + chr(10) if unknown and not asked_for_help else ''}usage:\n"
              f"{usage}\ndata sets: {', '.join(DATASETS)}; keys: TO (default data), SOURCE (another server), FROM "
              "(the whole files downloaded by hand: their folder), REPLACE (True: replace a file that holds other "
              "text)", file=sys.stdout if asked_for_help else sys.stderr)
        return 0 if asked_for_help else 2
    replace = options.get("REPLACE", "False").strip().lower()
    if replace not in ("true", "false"):
        raise SystemExit(f"error: REPLACE={options['REPLACE']}: give True or False")
    if "SOURCE" in options and "FROM" in options:
        raise SystemExit("error: SOURCE (a server) and FROM (files downloaded by hand) name two sources: give one")
    given = Path(options["FROM"]).expanduser() if "FROM" in options else None
    if given is not None and not given.exists():
        raise SystemExit(f"error: FROM={options['FROM']} does not exist: give the folder the whole files were "
                         "downloaded to")
    to = Path(options.get("TO", "data")).expanduser()
    above = next(p for p in to.absolute().parents if p.exists())
    if not above.is_dir():  # found before anything is downloaded
        raise SystemExit(f"error: TO={options.get('TO', 'data')} goes through {above}, which is a file: give TO a "
                         "folder (TO=data), or move that file away")
    failed = []
    for name in names:
        for piece in DATASETS[name]:
            try:
                say(fetch(piece, to, options.get("SOURCE"), given, replace == "true"))
            except FetchError as e:
                failed.append(f"error: {e}")
    if failed:  # every file that could not be written, in one run
        raise SystemExit("\n".join(failed))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
