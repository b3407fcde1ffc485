"""Full-size TinyStories: stories read as streams, tokenized in chunks into the cache, the hub's layout
loaded through ``datasets`` (streaming up to the caps, whole without them), and bad input found deep
inside a large file. Memory and speed are measured by bench/bench_data.py, not here."""

import json

import numpy as np
import pytest

from reservoir.data import corpus as sources
from reservoir.data import tokens as data
from reservoir.data.corpus import EOT, DataError, Stories, iter_stories
from reservoir.data.tokenizers import CharTokenizer
from reservoir.data.tokens import cached_tokens, prepare_data
from tests.conftest import make_config

STORIES = [f"Story {i}: Lily saw a bird \u00e9\u00e8 \U0001f426 and said \"hi\" {'x' * (i % 7)}." for i in range(60)]




@pytest.fixture
def tiny_reads(monkeypatch):
    """Reads of a few bytes: every story, line and multi-byte character gets cut between two reads."""
    monkeypatch.setattr(sources, "READ_BYTES", 7)


@pytest.mark.parametrize("layout", ["raw", "plain", "jsonl"])
def test_streamed_reading_gives_the_same_stories_whatever_the_read_size(tmp_path, layout, monkeypatch):
    suffix = ".jsonl" if layout == "jsonl" else ".txt"
    text = {"raw": "".join(f"{s}\n{EOT}\n" for s in STORIES), "plain": "\n\n".join(STORIES),
            "jsonl": "".join(json.dumps({"text": s}) + "\n" for s in STORIES)}[layout]
    path = tmp_path / f"stories{suffix}"
    path.write_text(text, encoding="utf-8")
    whole = list(iter_stories(path))
    assert whole == STORIES
    monkeypatch.setattr(sources, "READ_BYTES", 7)
    assert list(iter_stories(path)) == STORIES


def test_a_bad_byte_deep_in_a_file_is_named_by_its_offset(tmp_path, tiny_reads):
    good = "".join(f"{s}\n{EOT}\n" for s in STORIES).encode()
    path = tmp_path / "big.txt"
    path.write_bytes(good + b"caf\xe9 story\n" + good)
    with pytest.raises(DataError, match=rf"big.txt is not UTF-8 text \(byte {len(good) + 3}\)"):
        list(iter_stories(path))


def test_a_bad_json_line_deep_in_a_file_is_named_by_its_line(tmp_path, tiny_reads):
    lines = [json.dumps({"text": s}) for s in STORIES]
    lines[41] = '{"story": "no text"}'
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join(lines) + "\n")
    with pytest.raises(DataError, match=r"big.jsonl:42 is not a JSON object with a 'text' field"):
        list(iter_stories(path))


def test_a_bad_file_later_in_a_folder_fails_preparation_and_leaves_no_cache(tmp_path):
    folder = tmp_path / "ts"
    folder.mkdir()
    (folder / "a-train.txt").write_text(EOT.join(STORIES))
    (folder / "b-train.txt").write_bytes(b"ok story\n" + EOT.encode() + b"\nbad \xff")
    (folder / "valid.txt").write_text(EOT.join(STORIES[:5]))
    with pytest.raises(DataError, match="b-train.txt is not UTF-8 text"):
        prepare_data(make_config(tmp_path, f"DATASET={folder}"))
    assert not list((tmp_path / "cache").rglob("*.bin"))


def test_an_interrupted_encoding_leaves_nothing_and_the_next_run_encodes_it_whole(tmp_path, monkeypatch):
    tokenizer = CharTokenizer.train(STORIES)
    stories = Stories.of(STORIES * 50)
    monkeypatch.setattr(data, "ENCODE_CHARS", 1000)  # many batches
    real, calls = CharTokenizer.encode_stories, []

    def dies_on_the_third_batch(self, batch):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt  # a Ctrl-C or a kill mid-write
        return real(self, batch)

    monkeypatch.setattr(CharTokenizer, "encode_stories", dies_on_the_third_batch)
    with pytest.raises(KeyboardInterrupt):
        cached_tokens(tokenizer, stories, "h", tmp_path, "train")
    assert not [p for p in (tmp_path / "tokens").iterdir() if p.is_file()], "no partial cache, no temporary"
    monkeypatch.setattr(CharTokenizer, "encode_stories", real)
    ids = cached_tokens(tokenizer, stories, "h", tmp_path, "train")
    assert np.array_equal(ids, real(tokenizer, STORIES * 50))
    (tmp_path / "tokens" / next(p.name for p in (tmp_path / "tokens").glob("*.json"))).unlink()
    again = cached_tokens(tokenizer, stories, "h", tmp_path, "train")  # tokens without their metadata: rebuilt
    assert np.array_equal(again, ids)


def test_streamed_preparation_matches_encoding_everything_at_once(tmp_path, monkeypatch):
    path = tmp_path / "TinyStories-train.txt"
    path.write_text("".join(f"{s}\n{EOT}\n" for s in STORIES * 20))
    (tmp_path / "TinyStories-valid.txt").write_text("".join(f"{s}\n{EOT}\n" for s in STORIES[:10]))
    monkeypatch.setattr(sources, "READ_BYTES", 333)
    monkeypatch.setattr(data, "ENCODE_CHARS", 2000)
    for kind in ("char", "bpe"):
        prepared = prepare_data(make_config(tmp_path, f"DATASET={tmp_path}", f"TOKENIZER={kind}", "VOCAB_SIZE=300",
                                    "SEQ_LEN=16", f"CACHE_DIR={tmp_path / kind}"))
        expected = prepared.tokenizer.encode_stories(STORIES * 20)
        assert np.array_equal(prepared.train, expected), kind
        assert prepared.describe()["train_stories"] == 1200 and prepared.describe()["val_stories"] == 10


def test_bpe_trains_on_a_bounded_sample_and_says_so(tmp_path):
    (tmp_path / "TinyStories-train.txt").write_text("".join(f"{s}\n{EOT}\n" for s in STORIES * 20))
    (tmp_path / "TinyStories-valid.txt").write_text("".join(f"{s}\n{EOT}\n" for s in STORIES[:10]))
    prepared = prepare_data(make_config(tmp_path, f"DATASET={tmp_path}", "TOKENIZER=bpe", "VOCAB_SIZE=300",
                                "TOKENIZER_TRAIN_CHARS=3000", "SEQ_LEN=16"))
    assert prepared.describe()["tokenizer_trained_on_chars"] == 3000
    assert prepared.describe()["train_chars"] > 3000 * 10


# --------------------------------------------------------------------- the hub's layout, on local files


def _hub_layout(root, shards: int = 3, per_shard: int = 40):
    """A dataset folder laid out as the hub's TinyStories: data/<split>-0000k-of-0000n.parquet."""
    import datasets

    (root / "data").mkdir(parents=True)
    for k in range(shards):
        rows = [f"train {k}-{i}: {STORIES[i % len(STORIES)]}" for i in range(per_shard)]
        shard = root / "data" / f"train-{k:05d}-of-{shards:05d}.parquet"
        datasets.Dataset.from_dict({"text": rows}).to_parquet(str(shard))
    datasets.Dataset.from_dict({"text": [f"valid {i}: {s}" for i, s in enumerate(STORIES[:20])]}).to_parquet(
        str(root / "data" / "validation-00000-of-00001.parquet"))
    return root


@pytest.fixture
def online(monkeypatch):
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: True)  # the network is the system edge


def test_the_hub_layout_loads_whole_without_a_cap(tmp_path, online):
    hub = _hub_layout(tmp_path / "hub")
    config = make_config(tmp_path, "DATASET=tinystories", f"HF_DATASET={hub}", "MAX_TRAIN_CHARS=None")
    corpus = sources.load_corpus(config)
    train = list(corpus.train)
    assert len(train) == 120 and train[0].startswith("train 0-0") and train[-1].startswith("train 2-39")
    assert len(list(corpus.val)) == 20 and corpus.source == "tinystories"
    assert "the whole training split" in corpus.description


def test_a_capped_hub_load_streams_only_the_shards_it_needs(tmp_path, online):
    hub = _hub_layout(tmp_path / "hub")
    for k in (1, 2):  # shards past the cap are unreadable: reading them would fail the load
        (hub / "data" / f"train-{k:05d}-of-00003.parquet").write_bytes(b"not parquet at all")
    config = make_config(tmp_path, "DATASET=tinystories", f"HF_DATASET={hub}", "MAX_TRAIN_STORIES=25", "SEQ_LEN=16")
    prepared = prepare_data(config)
    assert prepared.describe()["train_stories"] == 25
    assert "MAX_TRAIN_STORIES=25" in prepared.description
    kept = sorted(p.name for p in (tmp_path / "cache" / "hub").rglob("*.txt"))
    assert kept == ["train-25-stories-50000000-chars.txt", "validation-all-stories-all-chars.txt"]


def test_the_hub_cache_is_used_offline_and_a_cut_off_fetch_is_not(tmp_path, monkeypatch, online):
    hub = _hub_layout(tmp_path / "hub")
    config = make_config(tmp_path, "DATASET=tinystories", f"HF_DATASET={hub}", "MAX_TRAIN_STORIES=10")
    real_write = sources.atomic_write

    def cut_off(path, write):
        def partial(tmp):
            write(tmp)
            raise OSError(28, "No space left on device")
        return real_write(path, partial)

    monkeypatch.setattr(sources, "atomic_write", cut_off)
    with pytest.raises(DataError, match="cannot load"):
        sources.load_corpus(config)
    assert not list((tmp_path / "cache" / "hub").rglob("*.txt")), "a cut-off fetch must leave nothing"
    monkeypatch.setattr(sources, "atomic_write", real_write)
    fetched = list(sources.load_corpus(config).train)
    monkeypatch.setattr(sources, "_hub_reachable", lambda timeout=3.0: False)
    offline = sources.load_corpus(config)
    assert list(offline.train) == fetched and "(cached)" in offline.description
