import json

import numpy as np
import pytest
import torch

from reservoir.data import corpus as sources
from reservoir.data.corpus import EOT, DataError, load_corpus, read_stories
from reservoir.data.synthetic import synthetic_stories
from reservoir.data.tokenizers import BPETokenizer, CharTokenizer
from reservoir.data.tokens import TrainWindows, cached_tokens, eval_windows, prepare_data
from reservoir.platform.device import DeviceInfo, build_loader, loader_needed
from tests.conftest import NO_TEXT, TINYSTORIES_TEXT, make_config

SHARED = TINYSTORIES_TEXT  # real TinyStories text (tests/conftest.py: where the fetch writes it, or named)
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason=NO_TEXT)




def test_synthetic_corpus_is_deterministic_and_varied():
    a, b, c = synthetic_stories(300, 1), synthetic_stories(300, 1), synthetic_stories(300, 2)
    assert a == b and a != c
    assert len(set(a)) > 0.95 * len(a)
    text = "\n".join(a)
    assert '"' in text and "learned" in text and "Once upon a time" in text


@pytest.mark.parametrize("content, suffix, expected", [
    (f"one story\n{EOT}\ntwo story\n{EOT}\n", ".txt", ["one story", "two story"]),
    ("first para\n\nsecond para", ".txt", ["first para", "second para"]),
    ('{"text": "a"}\n\n{"text": "b"}\n', ".jsonl", ["a", "b"]),
])
def test_read_stories_formats(tmp_path, content, suffix, expected):
    path = tmp_path / f"f{suffix}"
    path.write_text(content)
    assert read_stories(path) == expected


@pytest.mark.parametrize("content, message", [
    (b"", "has no stories"),
    (f"\n{EOT}\n{EOT}\n".encode(), "has no stories"),
    (b"caf\xe9 story", "not UTF-8"),
])
def test_bad_files_give_one_line_errors(tmp_path, content, message):
    path = tmp_path / "bad.txt"
    path.write_bytes(content)
    with pytest.raises(DataError, match=message):
        read_stories(path)


def test_bad_jsonl_and_missing_path(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "ok"}\n{"story": "no text field"}\n')
    with pytest.raises(DataError, match=r"bad.jsonl:2 .* 'text' field"):
        read_stories(bad)
    with pytest.raises(DataError, match="does not exist"):
        read_stories(tmp_path / "missing.txt")
    with pytest.raises(DataError, match="no .txt or .jsonl data"):
        load_corpus(make_config(tmp_path, f"DATASET={tmp_path / 'nothing-here'}"))


def test_folder_splits_train_and_valid_files_else_holds_out_a_tail(tmp_path):
    folder = tmp_path / "ts"
    folder.mkdir()
    (folder / "TinyStories-train.txt").write_text(EOT.join(f"train story {i}" for i in range(10)))
    (folder / "TinyStories-valid.txt").write_text(EOT.join(f"valid story {i}" for i in range(3)))
    corpus = load_corpus(make_config(tmp_path, f"DATASET={folder}"))
    assert len(list(corpus.train)) == 10 and len(list(corpus.val)) == 3 and corpus.source == "files"
    only = load_corpus(make_config(tmp_path, f"TRAIN_PATH={folder / 'TinyStories-train.txt'}", "VAL_FRACTION=0.2"))
    assert list(only.train) == [f"train story {i}" for i in range(8)]
    assert list(only.val) == ["train story 8", "train story 9"]


def test_caps_limit_training_text(tmp_path):
    corpus = load_corpus(make_config(tmp_path, "DATASET=synthetic", "SYNTHETIC_STORIES=200",
                             "MAX_TRAIN_STORIES=50", "MAX_TRAIN_CHARS=2000"))
    assert len(list(corpus.train)) <= 50 and sum(map(len, corpus.train)) == 2000


def test_hub_unreachable_names_the_alternatives(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: False)  # the network is the system edge
    with pytest.raises(DataError, match="DATASET=synthetic"):
        load_corpus(make_config(tmp_path, "DATASET=tinystories"))


def test_auto_prefers_local_files_then_warns_loudly_for_synthetic(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: False)
    corpus = load_corpus(make_config(tmp_path, "SYNTHETIC_STORIES=50"))
    assert corpus.source == "synthetic" and "SYNTHETIC CORPUS" in capsys.readouterr().err
    local = tmp_path / "nodata"
    local.mkdir()
    (local / "TinyStories-train.txt").write_text(EOT.join(f"story {i}" for i in range(20)))
    assert load_corpus(make_config(tmp_path)).source == "files"


def test_char_tokenizer_round_trip_and_unknowns():
    tok = CharTokenizer.train(["hello world", "abc"])
    ids = tok.encode_stories(["hello", "cab"])
    assert tok.decode(ids) == f"hello{EOT}cab{EOT}"
    assert ids.tolist().count(tok.eot_id) == 2
    assert tok.encode("hi!").tolist()[1:] == [tok.unk_id, tok.unk_id]
    assert CharTokenizer.from_json(tok.to_json()).encode("world").tolist() == tok.encode("world").tolist()


def test_bpe_tokenizer_round_trip_special_token_and_min_vocab():
    stories = synthetic_stories(200, 3)
    tok = BPETokenizer.train(stories, 400)
    assert tok.vocab_size <= 400
    ids = tok.encode_stories(stories[:2])
    assert tok.decode(ids) == stories[0] + EOT + stories[1] + EOT
    assert tok.count_chars(ids) == len(stories[0]) + len(stories[1]) + 2
    assert len(ids) < 0.6 * (len(stories[0]) + len(stories[1]))  # merges compress
    with pytest.raises(DataError, match="too small"):
        BPETokenizer.train(stories, 100)


def test_token_cache_is_reused_and_rebuilt_when_corrupt(tmp_path, capsys, monkeypatch):
    tok = CharTokenizer.train(["abcdef"])
    stories = ["abc", "fed"] * 100
    first = cached_tokens(tok, stories, "h1", tmp_path, "train")
    assert first.dtype == np.uint16 and isinstance(first, np.memmap)
    calls = []
    monkeypatch.setattr(tok, "encode_stories", lambda s: calls.append(1) or CharTokenizer.encode_stories(tok, s))
    again = cached_tokens(tok, stories, "h1", tmp_path, "train")
    assert calls == [] and np.array_equal(first, again)
    first = np.array(first)  # a copy: the memmap would show the corruption below
    (npy,) = (tmp_path / "tokens").glob("*.bin")
    raw = bytearray(npy.read_bytes())
    raw[-1] ^= 0xFF  # flip bits in the data: the checksum must catch it
    npy.write_bytes(bytes(raw))
    rebuilt = cached_tokens(tok, stories, "h1", tmp_path, "train")
    assert calls == [1] and np.array_equal(rebuilt, first) and "rebuilding" in capsys.readouterr().err
    npy.write_bytes(npy.read_bytes()[:40])  # truncated
    assert np.array_equal(cached_tokens(tok, stories, "h1", tmp_path, "train"), first)
    assert not list((tmp_path / "tokens").glob("*.tmp")), "no temporary files may be left behind"
    meta = json.loads(next((tmp_path / "tokens").glob("*.json")).read_text())
    assert meta["n_tokens"] == first.size


def test_prepare_data_and_seq_len_too_long(tmp_path):
    d = prepare_data(make_config(tmp_path, "DATASET=synthetic", "SYNTHETIC_STORIES=60", "SEQ_LEN=32"))
    assert d.train.size > 1000 and d.chars_per_token == pytest.approx(1.0)
    assert d.describe()["data_source"] == "synthetic"
    with pytest.raises(DataError, match="SEQ_LEN=100000 is longer than the training data"):
        prepare_data(make_config(tmp_path, "DATASET=synthetic", "SYNTHETIC_STORIES=60", "SEQ_LEN=100000"))


def test_train_windows_are_fixed_shape_shifted_and_seeded():
    ids = np.arange(1000, dtype=np.uint16)
    ds = TrainWindows(ids, 16, seed=5)
    x, y = ds[0]
    assert x.shape == y.shape == (16,) and torch.equal(x[1:], y[:-1]) and x.dtype == torch.int64
    assert [int(ds[i][0][0]) for i in range(5)] == [int(TrainWindows(ids, 16, seed=5)[i][0][0]) for i in range(5)]
    assert sorted(int(ds[i][0][0]) for i in range(len(ds))) == list(range(0, 62 * 16, 16))
    evals = eval_windows(ids, 16, 64)
    assert evals.shape == (4, 17) and torch.equal(evals[1, 0], evals[0, -1])


@pytest.mark.parametrize("gathered", [3, 32])
def test_one_cpu_process_gathers_the_batches_the_loader_would_give_across_epochs_and_from_a_resumed_offset(
        monkeypatch, gathered):
    """One CPU process gathers its batches itself, several at a time (no DataLoader: a call per window cost the
    smallest presets 2% of a step): the same tensors, in the same order, over an epoch's end, and from a
    checkpoint's offset, as the device's DataLoader (here, in this process) gives them."""
    from reservoir.run import train
    from reservoir.run.train import Progress, training_batches

    monkeypatch.setattr(train, "GATHERED_BATCHES", gathered)  # a gather that ends inside an epoch, or with it
    ids = np.random.default_rng(0).integers(0, 300, 1000).astype(np.uint16)
    config = {"BATCH_SIZE": 5, "NUM_WORKERS": 0, "SEED": 3}
    cpu = DeviceInfo("cpu", torch.device("cpu"), "test", "fp32")
    assert not loader_needed(cpu, 0) and loader_needed(cpu, 2)  # workers: the loader's

    def loaded(offset):
        windows = TrainWindows(ids, 16, seed=3)
        for epoch in range(2):
            windows.set_epoch(epoch)
            remaining = torch.utils.data.Subset(windows, range(offset if epoch == 0 else 0, len(windows)))
            yield from build_loader(remaining, cpu, 5, shuffle=False, seed=3)

    for offset in (0, 35):
        batches = training_batches(TrainWindows(ids, 16, seed=3), cpu, config, Progress(offset=offset))
        expected = list(loaded(offset))  # two epochs, each ending on a part batch that is skipped
        assert len(expected) == (62 - offset) // 5 + 62 // 5
        for x_loaded, y_loaded in expected:
            x, y = next(batches)
            assert x.dtype == x_loaded.dtype == torch.int64 and x.shape == (5, 16) and x.is_contiguous()
            assert torch.equal(x, x_loaded) and torch.equal(y, y_loaded)


def test_sharded_loaders_read_disjoint_windows():
    ds = TrainWindows(np.arange(2000, dtype=np.uint16), 10, seed=0)
    seen = []
    for rank in range(2):
        info = DeviceInfo("cpu", torch.device("cpu"), "test", "fp32", world_size=2, rank=rank)
        seen.append({int(x[0]) for xb, _ in build_loader(ds, info, 8, shuffle=False) for x in xb})
    assert seen[0] and seen[1] and not seen[0] & seen[1]


@needs_shared
def test_real_tinystories_slices_tokenize(tmp_path):
    d = prepare_data(make_config(tmp_path, f"DATASET={SHARED}", "TOKENIZER=bpe", "VOCAB_SIZE=4096"))
    assert d.source == "files" and 3.0 < d.chars_per_token < 5.0
