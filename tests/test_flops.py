"""Compute accounting: the counted FLOPs per token of every model family against a hand count
written here from the model's sizes (reservoir/run/flops.py states the convention: products only)."""

import copy

import pytest
import torch

from reservoir.config import parse_overrides
from reservoir.models import build_model
from reservoir.models.ridge import GRAM_BLOCK
from reservoir.run import flops

VOCAB, BATCH, SEQ = 40, 4, 32


def per_token_sgd(name: str, *overrides: str) -> tuple[float, object, dict]:
    config = parse_overrides([f"SEQ_LEN={SEQ}", *overrides])
    model = build_model(name, VOCAB, config)
    cost = flops.sgd_step(model, VOCAB, batch_size=BATCH, seq_len=SEQ, steps_per_batch=1)
    return cost.per_step / (BATCH * SEQ), model, config[name.upper()]


def per_token_ridge(name: str, *overrides: str) -> tuple[float, object, dict]:
    config = parse_overrides([f"SEQ_LEN={SEQ}", *overrides])
    model = build_model(name, VOCAB, config)
    gen = torch.Generator().manual_seed(0)
    chunk = (torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen), torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen))
    calibration = [(torch.randint(0, VOCAB, (BATCH, SEQ), generator=gen),) * 2]
    cost = flops.ridge_fit(model, chunk, calibration, washout=0)
    return cost.per_step / (BATCH * SEQ), model, config[name.upper()]


def gram_per_sample(features: int) -> int:
    """XᵀX's upper triangle as upper_gram forms it: block rows of GRAM_BLOCK features times the rest."""
    return sum(2 * min(GRAM_BLOCK, features - start) * (features - start) for start in range(0, features, GRAM_BLOCK))


def test_transformer_counts_its_attention_six_n_plus_the_square():
    counted, _, cfg = per_token_sgd("transformer", "TRANSFORMER.n_layer=2", "TRANSFORMER.n_embd=64",
                                    "TRANSFORMER.n_head=4")
    layers, width = cfg["n_layer"], cfg["n_embd"]
    weights = layers * (3 * width * width + width * width + 8 * width * width) + width * VOCAB  # blocks + head
    attention = layers * 4 * SEQ * width  # QKᵀ and AV per token, the full T x T square, forward
    assert counted == pytest.approx(6 * weights + 3 * attention, rel=0.05)
    assert counted > 6 * weights * 1.02  # attention is in: torch's own registry counts 0 for it on the CPU


def test_transformer_attention_is_counted_with_dropout_too():
    with_dropout, _, _ = per_token_sgd("transformer", "TRANSFORMER.n_layer=1", "TRANSFORMER.n_embd=32",
                                       "TRANSFORMER.dropout=0.1")
    without, _, _ = per_token_sgd("transformer", "TRANSFORMER.n_layer=1", "TRANSFORMER.n_embd=32")
    assert with_dropout == pytest.approx(without, rel=0.01)


def test_frozen_retention_counts_its_projections_and_the_decayed_square():
    counted, _, cfg = per_token_sgd("frozen_retention", "FROZEN_RETENTION.layers=2", "FROZEN_RETENTION.width=64",
                                    "FROZEN_RETENTION.heads=4", "FROZEN_RETENTION.ffn_hidden=96")
    layers, width, hidden = cfg["layers"], cfg["width"], cfg["ffn_hidden"]
    weights = layers * (3 * width * width + 2 * width * width + 2 * width * hidden) + width * VOCAB  # qkv, gate, out
    retention = layers * 4 * SEQ * width  # q·k over the full T x T square and the decayed sum of v, as attention
    assert counted == pytest.approx(6 * weights + 3 * retention, rel=0.05)
    assert counted > 6 * weights * 1.02  # the square is in


def test_reservoir_attention_counts_its_readout_not_its_frozen_scan():
    counted, _, cfg = per_token_sgd("reservoir_attention", "RESERVOIR_ATTENTION.units=32",
                                    "RESERVOIR_ATTENTION.width=64", "RESERVOIR_ATTENTION.layers=2")
    layers, width = cfg["layers"], cfg["width"]
    weights = 2 * cfg["units"] * width + layers * 12 * width * width + width * VOCAB  # projection, blocks, head
    attention = layers * 4 * SEQ * width
    assert counted == pytest.approx(6 * weights + 3 * attention, rel=0.05)


def test_lstm_counts_its_gates_and_head():
    counted, _, cfg = per_token_sgd("lstm", "LSTM.hidden=48", "LSTM.embed_dim=16", "LSTM.layers=2")
    hidden, embed = cfg["hidden"], cfg["embed_dim"]
    products = 4 * hidden * (embed + hidden) + 4 * hidden * (hidden + hidden) + hidden * VOCAB
    assert counted == pytest.approx(6 * products, rel=0.05)


def test_linear_reservoir_counts_its_readout_not_its_diagonal_recurrence():
    counted, _, cfg = per_token_sgd("linear_reservoir", "LINEAR_RESERVOIR.units=32",
                                    "LINEAR_RESERVOIR.embed_dim=16", "LINEAR_RESERVOIR.readout_hidden=64")
    features = 2 * cfg["units"] + cfg["embed_dim"]
    assert counted == pytest.approx(6 * (features * cfg["readout_hidden"] + cfg["readout_hidden"] * VOCAB), rel=0.05)


def test_deep_linear_reservoir_counts_its_projections_and_mixing():
    counted, _, cfg = per_token_sgd("deep_linear_reservoir", "DEEP_LINEAR_RESERVOIR.layers=2",
                                    "DEEP_LINEAR_RESERVOIR.units=16", "DEEP_LINEAR_RESERVOIR.width=32",
                                    "DEEP_LINEAR_RESERVOIR.mix_hidden=48", "DEEP_LINEAR_RESERVOIR.embed_dim=8")
    width, units, hidden = cfg["width"], cfg["units"], cfg["mix_hidden"]
    per_layer = width * 2 * units + 2 * units * hidden + hidden * width
    products = cfg["taps"] * cfg["embed_dim"] * width + cfg["layers"] * per_layer + width * VOCAB
    assert counted == pytest.approx(6 * products, rel=0.05)


def test_esn_counts_its_sparse_recurrence_by_non_zeros():
    counted, model, cfg = per_token_ridge("esn", "ESN.units=300", "ESN.degree=10")
    units = cfg["units"]
    assert int(model.reservoir.w.count_nonzero()) == units * cfg["degree"]
    hand = 2 * units * cfg["degree"] + gram_per_sample(units)  # W x by its non-zeros, then XᵀX's upper triangle
    assert counted == pytest.approx(hand, rel=0.05)
    dense = 2 * units * units + gram_per_sample(units)
    assert counted < 0.7 * dense  # a dense count of W x would charge units² per step


def test_deep_esn_counts_each_layer():
    counted, model, cfg = per_token_ridge("deep_esn", "DEEP_ESN.units=300", "DEEP_ESN.layers=2")
    units, layers = cfg["units"], cfg["layers"]
    assert all(r.sparse for r in model.layers)  # at 300 units and degree 10 the recurrence runs as CSR
    recurrences = sum(2 * int(r.w.count_nonzero()) for r in model.layers)
    between = (layers - 1) * 2 * units * units  # layer l+1 reads layer l's states through a dense W_in
    assert counted == pytest.approx(recurrences + between + gram_per_sample(units * layers), rel=0.05)


def test_nvar_counts_its_gram_only():
    counted, _, cfg = per_token_ridge("nvar", "NVAR.delays=2", "NVAR.input_dim=6")
    linear = cfg["delays"] * cfg["input_dim"]
    features = linear + linear * (linear + 1) // 2  # the monomials are element-wise: not counted
    assert counted == pytest.approx(gram_per_sample(features), rel=0.05)


def test_ngram_counts_one_update_per_order_and_token():
    assert flops.count_updates(5).flops(1000) == 5000


def test_ridge_solve_is_counted_in_the_fixed_cost():
    config = parse_overrides(["SEQ_LEN=16", "ESN.units=64"])
    model = build_model("esn", VOCAB, config)
    gen = torch.Generator().manual_seed(0)
    chunk = (torch.randint(0, VOCAB, (2, 16), generator=gen),) * 2
    cost = flops.ridge_fit(model, chunk, [chunk], washout=0)
    n = 64 + VOCAB + 1  # dense features, one-hot inputs, bias
    assert cost.fixed >= 2 * n**3 // 3


def test_sparse_products_are_counted_by_non_zeros():
    dense = torch.zeros(20, 20)
    dense[torch.arange(20), torch.arange(20)] = 1.0
    x = torch.randn(20, 3)
    with flops.counter() as count:
        torch.addmm(torch.zeros(20, 3), dense.to_sparse_csr(), x)
        torch.mm(dense, x)
    assert count.get_total_flops() == 2 * 20 * 3 + 2 * 20 * 20 * 3


@pytest.mark.parametrize("name", ["transformer", "lstm", "linear_reservoir", "deep_linear_reservoir",
                                  "frozen_retention"])
def test_a_step_counted_on_two_sequences_and_scaled_equals_the_whole_batch(name):
    """The count runs on COUNT_BATCH sequences, not on a GPU-sized batch: the same number either way."""
    config = parse_overrides([f"SEQ_LEN={SEQ}"])
    model = build_model(name, VOCAB, config)
    whole = flops.sgd_step(model, VOCAB, batch_size=16, seq_len=SEQ, steps_per_batch=3, count_batch=None)
    scaled = flops.sgd_step(model, VOCAB, batch_size=16, seq_len=SEQ, steps_per_batch=3)
    assert flops.COUNT_BATCH < 16 and scaled.per_step == pytest.approx(whole.per_step, rel=1e-12)


def test_the_random_transformer_pays_the_forward_and_the_activation_backward_of_its_frozen_blocks():
    shape = ("TRANSFORMER.n_layer=2", "TRANSFORMER.n_embd=64", "TRANSFORMER.n_head=4")
    trained, _, cfg = per_token_sgd("transformer", *shape)
    random, model, _ = per_token_sgd("transformer", *shape, "TRANSFORMER.trained=embeddings")
    frozen = cfg["n_layer"] * 12 * cfg["n_embd"] ** 2  # every block's matrices: qkv, proj, SwiGLU's three
    assert model.param_counts()["params_trainable"] == 2 * VOCAB * cfg["n_embd"]  # embedding, untied unembedding
    # the frozen matrices skip their weight gradients (2 FLOPs a weight a token) and nothing else
    assert trained - random == pytest.approx(2 * frozen, rel=0.01)


@pytest.mark.parametrize("gate", ["write_gate", "forget_gate"])
def test_a_retention_gate_costs_its_projection_alone(gate):
    """Each gate is one trained projection, width -> heads, per layer: 6 FLOPs a weight a token (forward and
    backward); the sigmoid and the content-dependent decays are element-wise, by the convention not counted."""
    shape = ("FROZEN_RETENTION.layers=2", "FROZEN_RETENTION.width=64", "FROZEN_RETENTION.heads=4",
             "FROZEN_RETENTION.ffn_hidden=96")
    plain, _, cfg = per_token_sgd("frozen_retention", *shape)
    gated, _, _ = per_token_sgd("frozen_retention", *shape, f"FROZEN_RETENTION.{gate}=True")
    assert gated - plain == pytest.approx(cfg["layers"] * 6 * cfg["width"] * cfg["heads"])


@pytest.mark.parametrize("name", ["esn", "deep_esn"])
def test_a_built_in_family_s_count_asks_no_one_to_declare_a_cost(name, capsys):
    """The default run told its user to fix a built-in family ("FLOPs of ESN leave out aten._to_sparse_csr ...
    Declare each one's cost in its family"): the ESNs' sparse recurrence is laid out as CSR, a conversion that
    multiplies nothing, so it is counted as 0 and said nowhere; the sparse products themselves are counted."""
    flops._SAID.clear()
    per_token, _, block = per_token_ridge(name, "ESN.units=64", "DEEP_ESN.units=32")
    assert "leave out" not in capsys.readouterr().err
    assert per_token > 0
    assert flops._conversion(torch.ones(3, 3)) == 0


def test_a_reservoir_kept_as_its_non_zeros_counts_the_same_and_asks_no_one_to_declare_a_cost(monkeypatch, capsys):
    """Past DENSE_UNITS, W is kept as its non-zeros and laid out as CSR through a COO tensor: a study's 8,000-unit
    ESN told its user "FLOPs of ESN leave out aten._sparse_coo_tensor_with_dims_and_tensors" (a constructor that
    multiplies nothing). The same draw stored either way counts the same FLOPs, and nothing is said."""
    from reservoir.models import reservoirs

    flops._SAID.clear()
    dense, _, _ = per_token_ridge("esn", "ESN.units=400")  # sparse enough to run as CSR either way
    monkeypatch.setattr(reservoirs, "DENSE_UNITS", 256)
    sparse, model, _ = per_token_ridge("esn", "ESN.units=400")
    assert model.reservoir.stored_sparse
    assert "leave out" not in capsys.readouterr().err
    assert sparse == dense


@pytest.mark.parametrize("readout", ["ridge", "softmax"])
def test_a_reservoir_that_has_run_is_copied_and_counted_as_one_that_has_not(readout):
    """`scaling.py GENERATION=` on a study with ESN families stopped with "Cannot access storage of
    SparseCsrTensorImpl": a reservoir that has run keeps its CSR layout of W, and counting a generation step
    deep-copies the model. The layout is rebuilt where it is needed, not copied, and the count is the same."""
    config = parse_overrides([f"SEQ_LEN={SEQ}", "ESN.units=400", f"ESN.readout={readout}"])
    ids = torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(0))
    fresh = flops.step_flops(build_model("esn", VOCAB, config), lambda m: m(ids))
    model = build_model("esn", VOCAB, config)
    assert model.reservoir.sparse
    model(ids)  # lays W out as CSR
    assert flops.step_flops(model, lambda m: m(ids)) == fresh > 0
    copied = copy.deepcopy(model)
    assert torch.equal(copied(ids), model(ids))
