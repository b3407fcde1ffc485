"""python -m reservoir.data.fetch: the studies' exact text from its sources, checked by its SHA-256, against a real
HTTP server on the loopback (the hub and GitHub are not reachable from the tests)."""

import functools
import hashlib
import http.server
import os
import threading
from pathlib import Path

import pytest

from reservoir.data import fetch as fetch_module
from reservoir.data.fetch import DATASETS, main
from tests.conftest import NO_TEXT, ROOT, SHAKESPEARE_TEXT, TINYSTORIES_TEXT, real_text

SLICES, SHAKESPEARE = TINYSTORIES_TEXT, SHAKESPEARE_TEXT
needs_the_text = pytest.mark.skipif(not (SLICES / "TinyStories-train-sample.txt").is_file()
                                    or not SHAKESPEARE.is_file(), reason=NO_TEXT)


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


def test_a_place_that_cannot_take_the_files_is_one_line_naming_the_setting(tmp_path):
    """TO=<a file>, a file where tinystories/ goes, or a folder where a target file goes ended in a StorageError
    traceback that said "choose a writable RESULTS_DIR / CACHE_DIR" (this command takes TO)."""
    closed = "http://127.0.0.1:9/"
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(SystemExit) as refused:
        main(["shakespeare", f"TO={afile}", f"SOURCE={closed}"])
    assert str(refused.value) == (f"error: TO={afile} is a file where the folder afile/ goes: give TO a folder "
                                  "(TO=data), or move that file away")
    to = tmp_path / "data"
    to.mkdir()
    (to / "tinystories").write_text("x")
    (to / "shakespeare" / "input.txt").mkdir(parents=True)
    with pytest.raises(SystemExit) as refused:
        main(["tinystories-slices", "shakespeare", f"TO={to}", f"SOURCE={closed}"])
    lines = str(refused.value).splitlines()
    assert lines == [f"error: {to / 'tinystories'} is a file where the folder tinystories/ goes: give TO a folder "
                     "(TO=data), or move that file away"] * 2 + [
                     f"error: {to / 'shakespeare' / 'input.txt'} is a folder where the file input.txt goes: move it "
                     "away, then fetch again"]
    assert "RESULTS_DIR" not in str(refused.value) and (to / "tinystories").read_text() == "x"


def test_a_to_below_a_file_is_refused_before_anything_is_downloaded(server, tmp_path):
    served, url = server
    (served / "input.txt").write_bytes(b"x" * 10)
    afile = tmp_path / "afile"
    afile.write_text("x")
    fetched = []
    real = fetch_module.download
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(fetch_module, "download", lambda *a: fetched.append(a) or real(*a))
        with pytest.raises(SystemExit) as refused:
            main(["shakespeare", f"TO={afile}/data", f"SOURCE={url}"])
    assert str(refused.value) == (f"error: TO={afile}/data goes through {afile}, which is a file: give TO a folder "
                                  "(TO=data), or move that file away")
    assert fetched == []


def test_help_is_the_usage_on_stdout_and_exit_0_piped_or_not(capsys):
    assert main(["--help"]) == 0 and main(["shakespeare", "-h"]) == 0
    out, err = capsys.readouterr()
    assert out.count("usage:") == 2 and "python -m reservoir.data.fetch tinystories-slices" in out and not err


def test_offline_one_run_names_every_file_and_says_how_each_is_cut_and_that_one_in_place_is_wrong(tmp_path):
    """Offline, the fetch named one missing file a run (three runs to learn the three files), and stopped at the
    first wrong file without saying the one in place was wrong."""
    to = tmp_path / "data"
    (to / "tinystories").mkdir(parents=True)
    (to / "tinystories" / "TinyStories-valid-sample.txt").write_text("another text")
    with pytest.raises(SystemExit) as refused:
        main(["tinystories-slices", "shakespeare", f"TO={to}", "SOURCE=http://127.0.0.1:9/"])
    lines = str(refused.value).splitlines()
    assert len(lines) == 3 and all(line.startswith("error: ") for line in lines)
    assert "cannot fetch http://127.0.0.1:9/TinyStories-train.txt" in lines[0]
    assert "the first 954,278 bytes of TinyStories-train.txt (roneneldan/TinyStories on the Hugging Face" in lines[0]
    assert "TinyStories-valid-sample.txt is in place but holds other text (SHA-256 " in lines[1]
    assert "kept as it is; move it away, or add REPLACE=True to replace it" in lines[1]
    assert "the whole input.txt (char-rnn's tinyshakespeare)" in lines[2] and "FROM=<its folder>" in lines[2]
    assert (to / "tinystories" / "TinyStories-valid-sample.txt").read_text() == "another text"


@needs_the_text
def test_a_file_in_place_that_holds_other_text_is_replaced_only_when_told_and_then_said(server, tmp_path, capsys):
    served, url = server
    _serve_the_sources(served)
    target = tmp_path / "data" / "shakespeare" / "input.txt"
    target.parent.mkdir(parents=True)
    target.write_text("my own notes")
    with pytest.raises(SystemExit, match="is in place but holds other text"):
        main(["shakespeare", f"TO={tmp_path / 'data'}", f"SOURCE={url}"])
    assert target.read_text() == "my own notes"
    assert main(["shakespeare", f"TO={tmp_path / 'data'}", f"SOURCE={url}", "REPLACE=True"]) == 0
    assert target.read_bytes() == SHAKESPEARE.read_bytes()
    assert "it replaced a file that held other text (SHA-256 " in capsys.readouterr().out


@needs_the_text
def test_whole_files_downloaded_by_hand_are_cut_to_the_same_bytes(server, tmp_path, capsys):
    served, _ = server
    _serve_the_sources(served)  # the whole files, as a browser would save them
    to = tmp_path / "data"
    assert main(["tinystories-slices", "shakespeare", f"TO={to}", f"FROM={served}"]) == 0
    for piece in [p for pieces in DATASETS.values() for p in pieces]:
        assert hashlib.sha256((to / piece.path).read_bytes()).hexdigest() == piece.sha256
    said = capsys.readouterr().out
    assert f"bytes from {served / 'TinyStories-train.txt'}, the first 954,278 bytes of TinyStories-train.txt" in said
    (served / "TinyStories-valid.txt").unlink()
    with pytest.raises(SystemExit, match=f"FROM={served} holds no TinyStories-valid.txt"):
        main(["tinystories-slices", f"TO={tmp_path / 'other'}", f"FROM={served}"])
    with pytest.raises(SystemExit, match="FROM=.* does not exist"):
        main(["shakespeare", f"TO={to}", f"FROM={tmp_path / 'nowhere'}"])


def test_the_tests_that_need_the_real_text_find_it_where_the_fetch_writes_it():
    """The real-slice tests skipped ("set RESERVOIR_TINYSTORIES") although the README's fetch had put the slices in
    data/tinystories/: without the variables, the tests look where the fetch writes (TO's default, data/)."""
    env = {k: v for k, v in os.environ.items() if k not in ("RESERVOIR_TINYSTORIES", "RESERVOIR_SHAKESPEARE")}
    fetched = [ROOT / "data" / p.path for p in (DATASETS["tinystories-slices"][0], DATASETS["shakespeare"][0])]
    assert real_text(env) == (fetched[0].parent, fetched[1])
    assert real_text({**env, "RESERVOIR_TINYSTORIES": "/elsewhere"})[0] == Path("/elsewhere")
