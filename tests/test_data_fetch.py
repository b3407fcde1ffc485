"""python -m reservoir.data.fetch: the studies' exact text from its sources, checked by its SHA-256, against a real
HTTP server on the loopback (the hub and GitHub are not reachable from the tests)."""

import functools
import hashlib
import http.server
import os
import threading
from pathlib import Path

import pytest

from reservoir.data.fetch import DATASETS, main
from tests.conftest import ROOT

SLICES = Path(os.environ.get("RESERVOIR_TINYSTORIES", "/nonexistent"))
SHAKESPEARE = Path(os.environ.get("RESERVOIR_SHAKESPEARE", "/nonexistent"))
needs_the_text = pytest.mark.skipif(not (SLICES / "TinyStories-train-sample.txt").is_file()
                                    or not SHAKESPEARE.is_file(),
                                    reason="the studies' text not given (RESERVOIR_TINYSTORIES, RESERVOIR_SHAKESPEARE)")


@pytest.fixture
def server(tmp_path):
    """A plain HTTP server (no ranges: it sends whole files) over a folder, on a free loopback port."""
    served = tmp_path / "served"
    served.mkdir()
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(served))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield served, f"http://127.0.0.1:{httpd.server_address[1]}/"
    httpd.shutdown()


def _serve_the_sources(served: Path) -> None:
    """The sources as the hub and char-rnn hold them: the slices are the beginnings of longer files."""
    (served / "TinyStories-train.txt").write_bytes((SLICES / "TinyStories-train-sample.txt").read_bytes()
                                                   + b"Once upon a time, the rest of the training file...\n" * 50)
    (served / "TinyStories-valid.txt").write_bytes((SLICES / "TinyStories-valid-sample.txt").read_bytes() + b"more\n")
    (served / "input.txt").write_bytes(SHAKESPEARE.read_bytes())


@needs_the_text
def test_the_slices_and_shakespeare_are_fetched_checked_and_land_where_the_readme_says(server, tmp_path, capsys):
    served, url = server
    _serve_the_sources(served)
    to = tmp_path / "data"
    assert main(["tinystories-slices", "shakespeare", f"TO={to}", f"SOURCE={url}"]) == 0
    for piece in [p for pieces in DATASETS.values() for p in pieces]:
        assert hashlib.sha256((to / piece.path).read_bytes()).hexdigest() == piece.sha256
    assert (to / "tinystories" / "TinyStories-train-sample.txt").read_bytes() == \
        (SLICES / "TinyStories-train-sample.txt").read_bytes()
    assert main(["shakespeare", f"TO={to}", f"SOURCE={url}"]) == 0
    assert "already there (SHA-256 checked)" in capsys.readouterr().out
    # the README's data commands name data/tinystories and data/shakespeare: what the fetch writes under TO
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert "python -m reservoir.data.fetch tinystories-slices shakespeare" in readme
    assert "DATASET=data/tinystories" in readme


@needs_the_text
def test_a_truncated_or_other_file_is_one_line_and_writes_nothing(server, tmp_path):
    served, url = server
    _serve_the_sources(served)
    to = tmp_path / "data"
    (served / "input.txt").write_bytes(SHAKESPEARE.read_bytes()[:5000])  # the connection ended early
    with pytest.raises(SystemExit, match=r"ended after 5,000 of the 1,115,394 bytes .* nothing written"):
        main(["shakespeare", f"TO={to}", f"SOURCE={url}"])
    other = SHAKESPEARE.read_bytes().replace(b"ROMEO", b"ROMEA")  # same size, other text
    (served / "input.txt").write_bytes(other)
    wanted = DATASETS["shakespeare"][0].sha256
    with pytest.raises(SystemExit, match=f"SHA-256 {hashlib.sha256(other).hexdigest()}, not the studies' {wanted}"):
        main(["shakespeare", f"TO={to}", f"SOURCE={url}"])
    assert not (to / "shakespeare").exists()


def test_offline_is_one_line_that_says_where_to_put_the_files(tmp_path):
    closed = "http://127.0.0.1:9/"  # the discard port: nothing listens there
    with pytest.raises(SystemExit, match=r"cannot fetch http://127.0.0.1:9/input.txt .*offline\? put the file there "
                                         r"yourself: .*shakespeare/input.txt, 1,115,394 bytes, SHA-256 86c4e6aa"):
        main(["shakespeare", f"TO={tmp_path / 'data'}", f"SOURCE={closed}"])
    assert main(["nonsense"]) == 2
