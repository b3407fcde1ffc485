"""Evaluation: stream mode carries state / uses overlapping windows, every target scored once;
windows mode is the old fixed-window score; the bootstrap interval."""

import gc
import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from reservoir.config import parse_overrides
from reservoir.data.tokenizers import CharTokenizer
from reservoir.data.tokens import TokenData
from reservoir.models import build_model
from reservoir.platform.device import DeviceInfo
from reservoir.run.evaluation import Evaluator

CPU = DeviceInfo("cpu", torch.device("cpu"), "test", "fp32")
TEXT = ("Once upon a time there was a cat. The cat sat on a mat and sang. " * 40).split(". ")


@pytest.fixture(scope="module")
def data():
    tok = CharTokenizer.train(TEXT)
    ids = tok.encode_stories(TEXT)
    return TokenData(ids, ids, tok, "test", "test text", 1.0)


def config(*args):
    return parse_overrides(["TIME_BUDGET_S=1", "SEQ_LEN=16", "BATCH_SIZE=4", "ESN.units=40", "DEEP_ESN.units=20",
                            "LSTM.hidden=24", "LSTM.embed_dim=8", "LINEAR_RESERVOIR.units=12",
                            "LINEAR_RESERVOIR.readout_hidden=16", "DEEP_LINEAR_RESERVOIR.units=8",
                            "DEEP_LINEAR_RESERVOIR.width=16", "DEEP_LINEAR_RESERVOIR.mix_hidden=16",
                            "TRANSFORMER.n_layer=1", "TRANSFORMER.n_embd=16",
                            "NVAR.input_dim=3", "ESN.readout=softmax", "DEEP_ESN.readout=softmax", *args])
    # (softmax readouts: an untrained ridge readout is all zeros, and its loss would not depend on the state)


def untrained(name, data, cfg):
    model = build_model(name, data.tokenizer.vocab_size, cfg)
    model.eval()
    return model


def whole_stream_loss(model, data, n):
    """The loss of the first n targets read in one forward pass: no state ever dropped."""
    ids = torch.from_numpy(np.asarray(data.val[: n + 1], dtype=np.int64))[None]
    with torch.no_grad():
        return float(F.cross_entropy(model(ids[:, :-1])[0], ids[0, 1:]))


@pytest.mark.parametrize("name", ["esn", "deep_esn", "linear_reservoir", "lstm"])
def test_stream_mode_carries_the_state_of_recurrent_models(data, name):
    cfg = config()
    model = untrained(name, data, cfg)
    stream = Evaluator(data, cfg, 4, 200)(model, CPU, CPU.device)
    assert stream["val_loss"] == pytest.approx(whole_stream_loss(model, data, 200), rel=1e-5)
    windows = Evaluator(data, config("EVAL_MODE=windows"), 4, 200)(model, CPU, CPU.device)
    assert windows["val_loss"] != pytest.approx(stream["val_loss"], rel=1e-4)  # state dropped every 16 tokens


def _live_tensors() -> int:
    return sum(1 for o in gc.get_objects() if issubclass(type(o), torch.Tensor))  # type(): no deprecated proxy asked


def test_a_stream_evaluation_keeps_nothing_from_one_chunk_to_the_next_but_the_state(data):
    """A tensor kept from every chunk lies between two chunks' large allocations and stops glibc reusing their
    space: a 32,768-unit reservoir's stream evaluation grew by 8 MB a chunk. The tensors alive as each chunk
    starts are as many at the last chunk as at the second."""
    cfg = config()
    model = untrained("esn", data, cfg)
    alive, read = [], type(model).forward_stream

    def counted(self, ids, state):
        alive.append(_live_tensors())
        return read(self, ids, state)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(type(model), "forward_stream", counted)
        result = Evaluator(data, cfg, 4, 16 * 12)(model, CPU, CPU.device, keep=True)
    assert len(alive) == 12 and alive[-1] == alive[1], alive
    assert result["val_loss"] == pytest.approx(whole_stream_loss(model, data, 16 * 12), rel=1e-5)


@pytest.mark.parametrize("stride", [8, 5, 16])
def test_overlapping_windows_score_every_target_once_with_enough_context(data, stride):
    evaluator = Evaluator(data, config(f"EVAL_STRIDE={stride}"), 4, 203)
    windows, weights, index = evaluator._windows(stride, 16 - stride)
    scored = index[weights > 0]
    assert sorted(scored.tolist()) == list(range(203))  # each of the first 203 targets exactly once
    context = torch.arange(16)[None, :].expand_as(index)[weights > 0]
    first = index[0][weights[0] > 0]
    assert bool(((context >= 16 - stride) | torch.isin(scored, first)).all())
    stream = torch.from_numpy(np.asarray(data.val[:204], dtype=np.int64))
    assert torch.equal(windows[:, 1:][weights > 0], stream[scored + 1])  # each scored position holds its target


def test_stream_mode_of_a_transformer_equals_its_overlapping_window_losses(data):
    cfg = config("EVAL_STRIDE=8")
    model = untrained("transformer", data, cfg)
    result = Evaluator(data, cfg, 4, 100)(model, CPU, CPU.device)
    ids = torch.from_numpy(np.asarray(data.val[:140], dtype=np.int64))
    total = 0.0
    with torch.no_grad():
        for start in range(0, 100, 8):  # windows of 16 every 8 tokens; each scores its last 8 (the first all)
            window = ids[start:start + 17]
            losses = F.cross_entropy(model(window[None, :-1])[0], window[1:], reduction="none")
            keep = [p for p in range(16) if (start == 0 or p >= 8) and start + p < 100]
            total += float(losses[keep].sum())
            if start + 16 >= 100:
                break
    assert result["val_loss"] == pytest.approx(total / 100, rel=1e-5)


def test_windows_mode_scores_fixed_windows_from_an_empty_context(data):
    cfg = config("EVAL_MODE=windows")
    model = untrained("lstm", data, cfg)
    result = Evaluator(data, cfg, 4, 64)(model, CPU, CPU.device)
    ids = torch.from_numpy(np.asarray(data.val[:65], dtype=np.int64))
    windows = ids.unfold(0, 17, 16)
    with torch.no_grad():
        loss = F.cross_entropy(model(windows[:, :-1]).transpose(1, 2), windows[:, 1:])
    assert result["val_loss"] == pytest.approx(float(loss), rel=1e-5)
    assert result["val_bpc"] == pytest.approx(result["val_loss"] / math.log(2), rel=1e-9)  # char tokens


def test_the_interval_is_zero_for_identical_blocks_and_grows_with_spread(data):
    evaluator = Evaluator(data, config(), 4, 600)
    assert evaluator.interval(np.full(600, 1.3)) == pytest.approx(0.0, abs=1e-12)
    noisy = np.random.default_rng(0).exponential(1.3, size=600)
    assert evaluator.interval(noisy) > 0.01
    assert evaluator.interval(noisy) == evaluator.interval(noisy)  # seeded: the same run, the same interval


def test_final_evaluation_reports_the_interval_and_the_scored_tokens(data):
    cfg = config()
    model = build_model("esn", data.tokenizer.vocab_size, cfg)
    result = Evaluator(data, cfg, 4, None)(model, CPU, CPU.device, keep=True)
    assert result["eval_tokens"] == len(data.val) - 1 and result["eval_mode"] == "stream"
    assert 0 < result["val_bpc_ci95"] < result["val_bpc"]


def test_paired_difference_sees_a_small_steady_gain_that_separate_intervals_hide(data):
    evaluate = Evaluator(data, config(), batch_size=4, tokens=None)
    g = np.random.default_rng(0)
    story_hardness = np.repeat(g.gamma(2.0, 1.0, size=evaluate.n // 8 + 1), 8)[: evaluate.n]
    a = story_hardness + 0.1 * g.random(evaluate.n)
    b = a + 0.02  # B is worse by the same 0.02 nats on every target
    paired = evaluate.paired_difference(a, b)
    expected = -0.02 * evaluate.n / evaluate.chars / math.log(2)
    assert paired["bpc_difference"] == pytest.approx(expected, rel=1e-9)
    assert paired["ci95_low"] <= paired["bpc_difference"] <= paired["ci95_high"] < 0
    assert paired["share_of_resamples_a_worse"] == 0.0
    separate = evaluate.interval(a) + evaluate.interval(b)  # what "do the two intervals overlap" looks at
    assert abs(expected) < separate and paired["ci95_high"] - paired["ci95_low"] < 0.2 * separate
    same = evaluate.paired_difference(a, a)
    assert same["bpc_difference"] == same["ci95_low"] == same["ci95_high"] == 0.0


def test_token_nats_are_what_the_evaluation_sums(data):
    model = untrained("lstm", data, config())
    evaluate = Evaluator(data, config(), batch_size=4, tokens=300)
    nats = evaluate.token_nats(model, CPU, torch.device("cpu"))
    assert nats.shape == (300,) and (nats > 0).all()
    assert evaluate(model, CPU, torch.device("cpu"))["val_loss"] == pytest.approx(nats.mean(), rel=1e-6)


# --------------------------------------------------------------------- what context is worth (CONTEXTS=True)

@pytest.mark.parametrize("name", ["frozen_retention", "deep_linear_reservoir", "linear_reservoir", "lstm"])
def test_the_context_scorer_s_carried_stream_equals_one_long_forward_pass(data, name):
    from reservoir.run.evaluation import context_scores

    cfg = config("FROZEN_RETENTION.layers=1", "FROZEN_RETENTION.width=16", "FROZEN_RETENTION.ffn_hidden=32")
    model = untrained(name, data, cfg)
    scores = context_scores(model, data, cfg, CPU, CPU.device, 200, contexts=(8, 16))
    chars = data.tokenizer.count_chars(np.asarray(data.val[1:201]))
    assert scores["stream"] == pytest.approx(whole_stream_loss(model, data, 200) * 200 / chars / math.log(2),
                                             rel=1e-5)
    assert scores["8"] != pytest.approx(scores["stream"], rel=1e-4)  # 4-8 tokens of context: another score


def test_the_context_scorer_slides_every_model_s_windows_and_knows_a_position_table_s_limit(data):
    from reservoir.run.evaluation import context_scores

    cfg = config("TRANSFORMER.recipe=gpt2", "EVAL_STRIDE=8")
    table = untrained("transformer", data, cfg)  # learned positions: 16 at most
    scores = context_scores(table, data, cfg, CPU, CPU.device, 100, contexts=(16, 32))
    assert scores["32"] is None and scores["stream"] is None  # beyond its table; no state to carry
    assert scores["16"] == pytest.approx(Evaluator(data, cfg, 4, 100)(table, CPU, CPU.device)["val_bpc"], rel=1e-6)
    rotary = untrained("transformer", data, config("EVAL_STRIDE=8"))  # rotary positions: any length
    assert context_scores(rotary, data, cfg, CPU, CPU.device, 100, contexts=(32,))["32"] is not None
    lstm = untrained("lstm", data, cfg)  # a recurrent model scored on windows too, from a zero state each
    windows = context_scores(lstm, data, cfg, CPU, CPU.device, 100, contexts=(16,))["16"]
    assert windows == pytest.approx(Evaluator(data, {**cfg, "EVAL_MODE": "sliding"}, 4, 100)(
        lstm, CPU, CPU.device)["val_bpc"], rel=1e-6)
    stream = Evaluator(data, cfg, 4, 100)(lstm, CPU, CPU.device)["val_bpc"]  # its state carried: another score
    assert abs(windows - stream) > 1e-6


@pytest.mark.parametrize("name, tokens", [("transformer", 200), ("transformer", 199), ("transformer", 207),
                                          ("frozen_retention", 200), ("nvar", 203), ("lstm", 200)])
def test_a_final_evaluation_s_windows_twin_is_read_from_the_stream_s_own_pass(data, name, tokens, monkeypatch):
    """A windowed model's final evaluation read every target twice for its stream score and once more for its
    windows twin, whose windows the stream's overlapping ones already hold: one pass now gives both (the
    stream's last window read on its own where the overlapping ones stop short of it), every number as
    the twin scored on its own gave it."""
    from reservoir.run.evaluation import Evaluations

    cfg = config(f"FINAL_EVAL_TOKENS={tokens}", "EVAL_TOKENS=64", "TRAIN_EVAL_TOKENS=None")
    model = untrained(name, data, cfg)
    evaluations = Evaluations.for_run(data, cfg)
    alone = {"stream": evaluations.final(model, CPU, CPU.device, keep=True),
             "windows": evaluations.final_windows(model, CPU, CPU.device, keep=True)}
    rows = []
    batched = Evaluator._batched
    monkeypatch.setattr(Evaluator, "_batched", lambda self, *a, **k: rows.append(len(a[3][0])) or
                        batched(self, *a, **k))
    final = evaluations.score_final(model, CPU, CPU.device)
    assert final["val_bpc"] == alone["stream"]["val_bpc"] and final["val_bpc_ci95"] == alone["stream"]["val_bpc_ci95"]
    assert final["windows_val_bpc"] == alone["windows"]["val_bpc"]
    assert final["windows_val_bpc_ci95"] == alone["windows"]["val_bpc_ci95"]
    stream_rows = len(evaluations.final._windows(8, 8)[0])
    if name == "lstm":  # recurrent: its stream reads chunks, its twin windows, as before
        assert rows == [math.ceil(tokens / 16)]
    else:
        assert rows[0] == stream_rows and sum(rows) <= stream_rows + 1
