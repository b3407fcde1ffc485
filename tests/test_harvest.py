"""A readout-only reservoir trains on features harvested in streams (reservoir/run/harvest.py): the features a
batch holds are the ones a stream carried from its start computes, every position is read once a pass, a
resumed fit reads the batches an unbroken one reads, and the record counts FLOPs as a windowed step does."""

import json

import numpy as np
import pytest
import torch

from reservoir.models import build_model
from reservoir.run import harvest
from reservoir.run.harvest import harvested_batches, harvests, stream_layout
from reservoir.run.train import Progress
from tests.conftest import run_cli
from tests.test_models import small_config


@pytest.fixture
def small_chunks(monkeypatch):
    """Chunks of a few time steps of a few streams: a pass of many chunks."""
    monkeypatch.setattr(harvest, "CHUNK_BYTES", 4 * 8 * 70 * 7)  # 7 time steps of 8 streams of 70 features
    monkeypatch.setattr(harvest, "HARVEST_STREAMS", 8)
    monkeypatch.setattr(harvest, "MIN_STREAM_STEPS", 8)


def _esn(units=70, *args):
    return build_model("esn", 23, small_config(f"ESN.units={units}", "ESN.readout=softmax",
                                               "ESN.include_input=False", *args))


def test_a_batch_holds_the_features_its_stream_carries_from_its_start(small_chunks):
    model = _esn()
    ids = np.random.default_rng(0).integers(0, 23, 8 * 40 + 1)
    streams, chunk, chunks = stream_layout(len(ids), 1, 70, per_batch=32)
    assert (streams, chunk, chunks) == (8, 4, 10)  # 40 steps a stream, in chunks of whole batches (4 steps)
    with torch.no_grad():
        whole, _ = model.dense_features(torch.from_numpy(ids[:320].reshape(8, 40)))  # each stream in one go
    progress = Progress()
    seen = torch.zeros(8, 40, dtype=torch.int64)
    for (batch_ids, blocks), targets in harvested_batches(model, ids, (4, 8), seed=0, progress=progress):
        if progress.epoch:
            break
        assert batch_ids.shape == targets.shape == (8, 4) and blocks.shape == (4, 70, 8)  # time-major
        dense = blocks.permute(2, 0, 1)
        for s in range(8):
            for k in range(4):  # find the position by its features: each is one stream's state at one step
                t = int((whole[s] - dense[s, k]).abs().amax(-1).argmin())
                torch.testing.assert_close(dense[s, k], whole[s, t], atol=1e-5, rtol=1e-5)
                assert batch_ids[s, k] == ids[s * 40 + t] and targets[s, k] == ids[s * 40 + t + 1]
                seen[s, t] += 1
    assert seen.min() == seen.max() == 1  # one pass: every kept position once


def test_a_resumed_fit_reads_the_batches_an_unbroken_one_reads(small_chunks):
    model = _esn()
    ids = np.random.default_rng(1).integers(0, 23, 8 * 40 + 1)

    def batches(progress, count):
        out = []
        for (batch_ids, dense), targets in harvested_batches(model, ids, (4, 8), seed=3, progress=progress):
            out.append((batch_ids.clone(), dense.clone(), targets.clone()))
            if len(out) == count:
                return out

    unbroken = batches(Progress(), 25)  # 10 batches a pass: two passes and then some
    for stop in (1, 2, 5, 10, 11, 14):  # in the first pass, at its end, in the second
        progress = Progress()
        first = batches(progress, stop)
        resumed = batches(Progress(epoch=progress.epoch, offset=progress.offset), 25 - stop)
        for a, b in zip(unbroken, first + resumed, strict=True):
            for x, y in zip(a, b, strict=True):
                torch.testing.assert_close(x, y)
    assert not torch.equal(unbroken[0][0], unbroken[10][0])  # each pass in its own order


@pytest.mark.parametrize("readout, include_input", [("softmax", True), ("softmax", False), ("mlp", True)])
def test_the_readout_of_harvested_blocks_is_the_readout_of_the_same_features(readout, include_input):
    """A softmax readout multiplies the time-major blocks as they lie (no copy of the features); the logits and
    the readout's gradients are those of the features read the ordinary way."""
    model = build_model("esn", 23, small_config("ESN.units=70", f"ESN.readout={readout}",
                                                f"ESN.include_input={include_input}"))
    ids = torch.randint(0, 23, (6, 9), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        dense, _ = model.dense_features(ids)
    blocks = dense.permute(1, 2, 0).contiguous()  # (T, F, B), as a reservoir stores its states
    expected = model.readout(model.features(ids, dense=dense))
    expected.square().sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    got = model(ids, blocks)
    got.square().sum().backward()
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    for a, b in zip(grads, (p.grad for p in model.parameters()), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_only_a_readout_over_a_carried_state_is_harvested():
    assert harvests(_esn())
    assert harvests(build_model("deep_esn", 23, small_config("DEEP_ESN.readout=softmax")))
    assert not harvests(build_model("nvar", 23, small_config("NVAR.readout=softmax")))  # windows, no state
    assert not harvests(build_model("linear_reservoir", 23, small_config()))  # trains its input embedding too
    assert not harvests(build_model("lstm", 23, small_config()))


def test_an_esn_readout_trained_on_harvested_features_learns_and_counts_its_flops_as_a_windowed_step(tmp_path):
    """A real fit: the loss falls, and the record's FLOPs are the windowed step's count times the steps (each
    position's features computed once a pass, as a step over its window computes them once)."""
    from reservoir.run import flops

    run_cli(tmp_path, "MODELS=esn", "ESN.readout=softmax", "MAX_STEPS=40", "EVAL_EVERY=40", "RUN_NAME=r",
            "SAMPLE_TOKENS=0", "LEARNING_RATE=3e-2")
    record = json.loads((tmp_path / "results" / "r" / "summary.json").read_text())[0]
    config = json.loads((tmp_path / "results" / "r" / "config.json").read_text())["effective_config"]
    model = build_model("esn", record["vocab_size"], config)
    per_step = flops.sgd_step(model, record["vocab_size"], config["BATCH_SIZE"], config["SEQ_LEN"], 1).per_step
    assert record["train_steps"] == 40 and record["train_flops"] == pytest.approx(40 * per_step)
    log = [json.loads(line) for line in (tmp_path / "results" / "r" / "train_log.jsonl").read_text().splitlines()]
    assert log[-1]["train_loss"] < log[0]["train_loss"] - 0.3
