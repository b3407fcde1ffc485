import json

import numpy as np
import pytest
import torch
from torch.nn import functional as F

from reservoir.config import ConfigError, parse_overrides
from reservoir.data.synthetic import synthetic_stories
from reservoir.data.tokenizers import CharTokenizer
from reservoir.models import ADDED_OPTIONS, ESN, MODEL_NAMES, LinearReservoir, build_model
from reservoir.models.reservoirs import Reservoir, eigenvalues
from reservoir.models.ridge import RidgeAccumulator, fit_probability_floor, floor_logits

SMALL = ["SEQ_LEN=32", "ESN.units=120", "DEEP_ESN.units=60", "LINEAR_RESERVOIR.units=32",
         "LINEAR_RESERVOIR.readout_hidden=64", "TRANSFORMER.n_layer=2", "TRANSFORMER.n_embd=32",
         "LSTM.hidden=48", "NVAR.input_dim=4", "NGRAM.order=3",
         "DEEP_LINEAR_RESERVOIR.units=16", "DEEP_LINEAR_RESERVOIR.width=24", "DEEP_LINEAR_RESERVOIR.mix_hidden=32",
         "DEEP_LINEAR_RESERVOIR.layers=2", "DEEP_LINEAR_RESERVOIR.embed_dim=8",
         "FROZEN_RETENTION.layers=2", "FROZEN_RETENTION.width=32", "FROZEN_RETENTION.ffn_hidden=64",
         "RESERVOIR_ATTENTION.units=32", "RESERVOIR_ATTENTION.width=32", "RESERVOIR_ATTENTION.layers=1"]


@pytest.fixture(scope="module")
def corpus_ids():
    stories = synthetic_stories(150, 0)
    tok = CharTokenizer.train(stories)
    return tok.encode_stories(stories), tok.vocab_size


def small_config(*extra):
    return parse_overrides(SMALL + list(extra))


def reservoir(**kw):
    args = dict(n_inputs=20, units=300, spectral_radius=0.9, leak_rate=0.3, input_scaling=1.0,
                input_connectivity=0.2, bias_scaling=0.2, degree=10, rc_connectivity=0.1, seed=0)
    args.update(kw)
    return Reservoir(**args)


@pytest.mark.parametrize("degree, target", [(10, 0.9), (0, 1.25)])
def test_spectral_radius_within_one_percent(degree, target):
    res = reservoir(degree=degree, spectral_radius=target)
    radius = torch.linalg.eigvals(res.w.double()).abs().max().item()
    assert abs(radius - target) / target < 0.01


def test_echo_state_property_forgets_the_initial_state():
    res = reservoir()
    ids = torch.randint(0, 20, (1, 300), generator=torch.Generator().manual_seed(1))
    a, _ = res(ids, torch.randn(1, 300))
    b, _ = res(ids, torch.randn(1, 300) * 3)
    assert (a[0, 0] - b[0, 0]).norm() > 0.1
    assert (a[0, -1] - b[0, -1]).norm() < 1e-4 * a[0, -1].norm()


def test_sparse_and_dense_recurrence_agree():
    res = reservoir()
    ids = torch.randint(0, 20, (3, 50))
    sparse, _ = res(ids)
    res.sparse = False
    dense, _ = res(ids)
    assert res.w.count_nonzero() == 300 * 10
    torch.testing.assert_close(sparse, dense, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("inputs", ["ids", "vectors"])
def test_reservoir_states_follow_the_leaky_tanh_equation(inputs):
    res = reservoir()
    g = torch.Generator().manual_seed(2)
    ids = torch.randint(0, 20, (3, 40), generator=g)
    u = F.one_hot(ids, 20).float() if inputs == "vectors" else ids
    start = torch.randn(3, 300, generator=g)
    states, last = res(u, start)
    x, w_in = start.double(), res.w_in.double()
    for t in range(40):  # the textbook update, one stream per row, in float64
        pre = x @ res.w.double().T + F.one_hot(ids[:, t], 20).double() @ w_in + res.bias.double()
        x = (1 - res.leak_rate) * x + res.leak_rate * torch.tanh(pre)
        torch.testing.assert_close(states[:, t].double(), x, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(last, states[:, -1])


def test_one_hot_tokens_are_summed_exactly_as_explicit_features():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 50, 7, generator=g, dtype=torch.float64)
    tokens = torch.randint(0, 6, (4, 50), generator=g)
    y = torch.randint(0, 5, (4, 50), generator=g)
    explicit = RidgeAccumulator(7 + 6, 5, product_dtype=torch.float64)
    explicit.add(torch.cat([x, F.one_hot(tokens, 6).double()], -1), y)
    by_index = RidgeAccumulator(7, 5, one_hot=6, product_dtype=torch.float64)
    by_index.add(x.transpose(0, 1), y.T, tokens.T)  # time-major, as fit_ridge passes them
    torch.testing.assert_close(torch.triu(by_index.xtx), torch.triu(explicit.xtx))
    torch.testing.assert_close(by_index.xty, explicit.xty)
    torch.testing.assert_close(by_index.solve(0.5), explicit.solve(0.5))
    with pytest.raises(ValueError, match="tokens exactly when"):
        by_index.add(x, y)


def test_streaming_ridge_equals_lstsq_and_chunking_does_not_matter():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(600, 7, generator=g, dtype=torch.float64)
    y = torch.randint(0, 5, (600,), generator=g)
    one_shot, chunked = (RidgeAccumulator(7, 5, product_dtype=torch.float64) for _ in range(2))
    one_shot.add(x, y)
    for i in range(0, 600, 64):
        chunked.add(x[i:i + 64], y[i:i + 64])
    ridge = 0.5
    w = one_shot.solve(ridge)
    torch.testing.assert_close(w, chunked.solve(ridge), atol=1e-10, rtol=1e-10)
    design = torch.cat([x, torch.ones(600, 1, dtype=torch.float64)], 1)
    augmented = torch.cat([design, (ridge ** 0.5) * torch.eye(8, dtype=torch.float64)])
    target = torch.cat([F.one_hot(y, 5).double(), torch.zeros(8, 5, dtype=torch.float64)])
    reference = torch.linalg.lstsq(augmented, target).solution
    torch.testing.assert_close(w, reference, atol=1e-8, rtol=1e-8)
    fast = RidgeAccumulator(7, 5)  # the default: float32 chunk products, float64 sums
    fast.add(x, y)
    torch.testing.assert_close(fast.solve(ridge), w, atol=1e-5, rtol=1e-4)


def test_probability_floor_is_the_held_out_optimum():
    g = torch.Generator().manual_seed(0)
    probs = torch.distributions.Dirichlet(torch.full((20,), 0.3)).sample((5000,))
    targets = torch.multinomial(probs, 1, generator=g).squeeze(1)
    scores = probs + 0.02 * torch.randn(probs.shape, generator=g)  # noisy estimates, some negative
    floor = fit_probability_floor(scores, targets)

    def nll(eps):
        return float(F.cross_entropy(floor_logits(scores, eps), targets))

    assert 0 < floor < 0.2 and nll(floor) <= min(nll(floor * 3), nll(floor / 3), nll(1e-6))


def test_parallel_scan_equals_a_sequential_loop():
    model = LinearReservoir(30, small_config()["LINEAR_RESERVOIR"], seed=0)
    ids = torch.randint(0, 30, (2, 37))
    h_re, h_im = model.scan(ids)
    lam = torch.complex(model.lam_re, model.lam_im)
    h = torch.zeros(2, lam.shape[0], dtype=torch.complex64)
    for t in range(37):
        h = lam * h + torch.complex(model.b_re[ids[:, t]], model.b_im[ids[:, t]])
        torch.testing.assert_close(torch.complex(h_re[:, t], h_im[:, t]), h, atol=1e-5, rtol=1e-4)


def _fit(model, ids, vocab, config, steps=25):
    """Fit a model the way the runner will: ridge pass, counts, or a few SGD steps; return (before, after) loss."""
    seq = config["SEQ_LEN"]
    n = (len(ids) - 1) // seq
    windows = torch.from_numpy(np.lib.stride_tricks.sliding_window_view(ids[: n * seq + 1], seq + 1)[::seq].copy())
    x, y = windows[:, :-1].long(), windows[:, 1:].long()
    held_x, held_y = x[-8:], y[-8:]

    def loss():
        with torch.no_grad():
            return float(F.cross_entropy(model(held_x).flatten(0, 1), held_y.flatten()))

    before = loss() if model.trainer != "counts" else float(np.log(vocab))
    if model.trainer == "ridge":
        model.fit_ridge([(x[i:i + 16], y[i:i + 16]) for i in range(0, len(x) - 8, 16)], [(x[-16:-8], y[-16:-8])])
    elif model.trainer == "counts":
        model.fit_counts(ids[: -8 * seq], ids[-16 * seq: -8 * seq])
    else:
        opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=3e-3)
        for step in range(steps):
            i = (step * 16) % (len(x) - 24)
            out = model(x[i:i + 16])
            F.cross_entropy(out.flatten(0, 1), y[i:i + 16].flatten()).backward()
            opt.step()
            opt.zero_grad()
    return before, loss()


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_learns_on_cpu(name, corpus_ids):
    ids, vocab = corpus_ids
    config = small_config()
    model = build_model(name, vocab, config)
    before, after = _fit(model, ids, vocab, config)
    assert after < before - 0.3, f"{name}: loss {before:.3f} -> {after:.3f}"
    counts = model.param_counts()
    assert counts["params_total"] >= counts["params_trainable"] >= 0 and counts["params_total"] > 0


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_causality_future_tokens_never_change_earlier_logits(name, corpus_ids):
    ids, vocab = corpus_ids
    config = small_config()
    model = build_model(name, vocab, config).eval()
    if model.trainer == "counts":
        model.fit_counts(ids[:5000])
    if model.trainer == "ridge":  # an unfitted ridge readout is all zeros: give it weights
        model.w_out.normal_()
    x = torch.from_numpy(ids[:32].astype(np.int64)).view(1, -1)
    changed = x.clone()
    changed[0, 20:] = (changed[0, 20:] + 1) % vocab
    with torch.no_grad():
        a, b = model(x), model(changed)
    torch.testing.assert_close(a[0, :20], b[0, :20], atol=1e-5, rtol=1e-5)
    assert not torch.allclose(a[0, 20:], b[0, 20:])


@pytest.mark.parametrize("name", ["esn", "deep_esn", "linear_reservoir", "deep_linear_reservoir", "nvar",
                                  "frozen_retention", "reservoir_attention"])
def test_fixed_weights_are_buffers_and_bit_identical_after_training(name, corpus_ids):
    ids, vocab = corpus_ids
    config = small_config(f"{name.upper()}.readout=softmax") if name in ("esn", "deep_esn", "nvar") else small_config()
    model = build_model(name, vocab, config)
    fixed = {k: v.clone() for k, v in model.named_buffers()}
    assert fixed and not set(fixed) & {k for k, _ in model.named_parameters()}
    _fit(model, ids, vocab, config, steps=5)
    for key, value in model.named_buffers():
        assert torch.equal(value, fixed[key]), f"{key} changed during training"


def test_ngram_probabilities_sum_to_one(corpus_ids):
    ids, vocab = corpus_ids
    model = build_model("ngram", vocab, small_config("NGRAM.order=4"))
    model.fit_counts(ids[:20000], ids[20000:24000])
    probs = model(torch.from_numpy(ids[30000:30064].astype(np.int64)).view(2, 32)).exp()
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 32), atol=1e-5, rtol=0)


def test_generate_honours_its_limits(corpus_ids):
    ids, vocab = corpus_ids
    model = build_model("lstm", vocab, small_config())
    prompt = torch.tensor([3, 4, 5])
    out = model.generate(prompt, max_new_tokens=10, temperature=1.0, generator=torch.Generator().manual_seed(0))
    assert len(out) == 13 and torch.equal(out[:3], prompt)
    greedy = model.generate(prompt, 10, temperature=0)
    top1 = model.generate(prompt, 10, temperature=1.0, top_k=1, generator=torch.Generator().manual_seed(1))
    assert torch.equal(greedy, top1)
    nucleus = model.generate(prompt, 10, temperature=1.0, top_p=1e-6, generator=torch.Generator().manual_seed(2))
    assert torch.equal(greedy, nucleus)
    stop = int(greedy[3])
    assert len(model.generate(prompt, 10, temperature=0, stop_id=stop)) == 4


def _multinomial_story(model, prompt, new_tokens, generator, temperature, top_k=None, stop_id=None):
    """A story as sampling took it token by token: the whole context's logits, torch.multinomial on the host."""
    ids = prompt.view(1, -1)
    for _ in range(new_tokens):
        logits = model(ids[:, -model.context_size:] if model.context_size else ids)[:, -1, :].float()
        if temperature <= 0:
            chosen = logits.argmax(-1, keepdim=True)
        else:
            logits = logits / temperature
            if top_k is not None:
                logits = logits.masked_fill(logits < torch.topk(logits, top_k).values[:, -1:], float("-inf"))
            chosen = torch.multinomial(logits.softmax(-1), 1, generator=generator)
        ids = torch.cat([ids, chosen], dim=1)
        if stop_id is not None and int(chosen) == stop_id:
            break
    return ids[0]


@pytest.mark.parametrize("name", ["lstm", "transformer", "frozen_retention"])
def test_sampling_draws_what_multinomial_draws_and_leaves_the_generator_where_it_would(name, corpus_ids):
    """Tokens chosen on the device from draws taken ahead give torch.multinomial's stories, also where a story
    ends before its draws do (at a stop read at once, or found a few tokens late): the next story from the
    same generator is the one it would have been."""
    model = _fitted(name, corpus_ids)
    prompt = torch.from_numpy(corpus_ids[0][100:110].astype(np.int64))
    for settings in ({"temperature": 1.0}, {"temperature": 0.8, "top_k": 5}, {"temperature": 0.0}):
        free = _multinomial_story(model, prompt, 60, torch.Generator().manual_seed(7), **settings)
        stop_id = int(free[10:].mode().values)  # the story's commonest token: it ends there early
        reference = torch.Generator().manual_seed(7)
        expected = [_multinomial_story(model, prompt, 60, reference, stop_id=stop_id, **settings) for _ in range(3)]
        assert len(expected[0]) < 70, settings  # the first story stops early
        for stop_every in (1, 7):
            generator = torch.Generator().manual_seed(7)
            stories = [model.generate(prompt, 60, stop_id=stop_id, generator=generator, stop_every=stop_every,
                                      **settings) for _ in range(3)]
            assert all(torch.equal(a, b) for a, b in zip(stories, expected, strict=True)), (settings, stop_every)
            assert torch.equal(generator.get_state(), reference.get_state()), (settings, stop_every)


def test_sampling_from_a_model_whose_probabilities_are_nan_says_so():
    model = build_model("lstm", 20, small_config())
    with torch.no_grad():
        model.head.weight.fill_(float("nan"))
    with pytest.raises(RuntimeError, match="next-token probabilities are NaN"):
        model.generate(torch.arange(4), 5, generator=torch.Generator().manual_seed(0))


def _fitted(name, corpus_ids, *extra):
    """``name`` built small, its closed-form part fitted where it has one (random weights elsewhere)."""
    ids, vocab = corpus_ids
    model = build_model(name, vocab, small_config(*extra)).eval()
    if model.trainer == "ridge":
        windows = torch.from_numpy(ids[:8 * 33 * 4].astype(np.int64)).view(4, 8, 33)
        model.fit_ridge([(w[:, :-1], w[:, 1:]) for w in windows[:3]], [(windows[3][:, :-1], windows[3][:, 1:])])
    elif model.trainer == "counts":
        model.fit_counts(ids[:20000], ids[20000:24000])
    return model


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cached_generation_writes_the_stories_recomputing_writes(name, corpus_ids):
    """Carried state (recurrent models) and kept keys and values (the transformer, across the moment
    its 32-token window fills) give the stories that recomputing the context for every token gives."""
    model = _fitted(name, corpus_ids)
    prompt = torch.from_numpy(corpus_ids[0][100:110].astype(np.int64))
    for settings in ({"temperature": 0.0}, {"temperature": 0.8, "top_k": 20}, {"temperature": 1.0}):
        stories = [model.generate(prompt, 60, generator=torch.Generator().manual_seed(5), cache=cache, **settings)
                   for cache in (True, False)]
        assert len(stories[0]) == 70 and torch.equal(stories[0], stories[1]), (name, settings)


FIXED_SHAPE_DECODING = {"transformer", "lstm", "esn", "deep_esn", "linear_reservoir", "frozen_retention"}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_the_fixed_shape_decode_step_writes_the_stories_recomputing_writes(name, corpus_ids):
    """generate's ``step`` and ``window`` (what COMPILE=True compiles; eager here): the transformer's keys and values
    in a cache of the window's length, a recurrent state as it is, and past the 32-token window the full window."""
    model = _fitted(name, corpus_ids)
    prompt = torch.from_numpy(corpus_ids[0][100:110].astype(np.int64))
    calls = []

    def step(*args):
        calls.append(args[2])  # the position
        return type(model).static_step(*args)

    windows = []

    def window(model, context):
        windows.append(context.shape)
        return model(context)[:, -1, :].float()

    for settings in ({"temperature": 0.0}, {"temperature": 0.8, "top_k": 20}):
        stories = [model.generate(prompt, 60, generator=torch.Generator().manual_seed(5), cache=cache,
                                  **({"step": step, "window": window} if cache else {}), **settings)
                   for cache in (True, False)]
        assert len(stories[0]) == 70 and torch.equal(stories[0], stories[1]), (name, settings)
    if name in FIXED_SHAPE_DECODING:
        reach = 32 if model.context_size else 69  # the window's last position, or every token's
        assert [int(p) for p in calls[:reach - 10]] == list(range(10, reach)), name
        assert windows == [(1, 32)] * (2 * (69 - reach)), name  # past the window: the full window, one shape
    else:
        assert not calls and not windows, name  # its cache grows, or it recomputes a window: no fixed shape


def test_the_transformer_cache_matches_its_forward_pass(corpus_ids):
    model = _fitted("transformer", corpus_ids)
    ids = torch.from_numpy(corpus_ids[0][:20].astype(np.int64)).view(1, -1)
    logits, cache = model.begin_generation(ids[:, :12])
    for t in range(12, 20):
        torch.testing.assert_close(logits, model(ids[:, :t])[:, -1], rtol=1e-5, atol=1e-5)
        logits, cache = model.continue_generation(ids[:, :t + 1], cache)
    assert len(cache) == 2 and cache[0][0].shape[2] == 20  # keys of every position so far


@pytest.mark.parametrize("options", [(), ("RESERVOIR_ATTENTION.write_gate=True",),
                                     ("RESERVOIR_ATTENTION.reservoir=False",)])
def test_reservoir_attentions_kept_state_and_keys_match_its_forward_pass(options, corpus_ids):
    ids, vocab = corpus_ids
    model = build_model("reservoir_attention", vocab, small_config(*options)).eval()
    if model.write_gate is not None:
        torch.nn.init.normal_(model.write_gate.weight)  # a gate that has learned something
    ids = torch.from_numpy(ids[:20].astype(np.int64)).view(1, -1)
    logits, carry = model.begin_generation(ids[:, :12])
    for t in range(12, 20):
        torch.testing.assert_close(logits, model(ids[:, :t])[:, -1], rtol=1e-5, atol=1e-5)
        logits, carry = model.continue_generation(ids[:, :t + 1], carry)
    assert carry is not None and len(carry[1]) == len(model.blocks) and carry[1][0][0].shape[2] == 20


def test_a_checkpoint_that_held_the_write_gate_bare_still_loads_and_resumes_in_order(corpus_ids):
    """The write gate was a bare weight of the model (state key ``write_gate``), now a module (so a fold can
    hold one per member): an older checkpoint loads, and the gate is still the first weight, where a saved
    optimizer state expects it."""
    _, vocab = corpus_ids
    config = small_config("RESERVOIR_ATTENTION.write_gate=True")
    saved = build_model("reservoir_attention", vocab, config).state_dict()
    saved["write_gate"] = torch.randn_like(saved.pop("write_gate.weight"))
    model = build_model("reservoir_attention", vocab, config)
    model.load_state_dict(saved)
    assert torch.equal(model.write_gate.weight, saved["write_gate"])
    assert next(iter(model.named_parameters()))[0] == "write_gate.weight"


def test_esn_readout_ridge_is_calibrated_to_a_real_cross_entropy(corpus_ids):
    ids, vocab = corpus_ids
    config = small_config()
    model = build_model("esn", vocab, config)
    assert isinstance(model, ESN) and model.trainer == "ridge"
    _, after = _fit(model, ids, vocab, config)
    assert 0 < after < np.log(vocab) and float(model.prob_floor) != 1e-3


@pytest.mark.parametrize("name", ["transformer", "lstm", "linear_reservoir", "deep_linear_reservoir",
                                  "frozen_retention", "reservoir_attention"])
def test_gradient_checkpointing_gives_the_same_gradients(name):
    import copy

    from reservoir.platform import device as dev

    config = parse_overrides(["TRANSFORMER.n_layer=2", "TRANSFORMER.n_embd=32", "SEQ_LEN=16", "LSTM.hidden=32",
                              "LINEAR_RESERVOIR.units=16", "DEEP_LINEAR_RESERVOIR.units=16",
                              "DEEP_LINEAR_RESERVOIR.width=24", "DEEP_LINEAR_RESERVOIR.dropout=0.0",
                              "FROZEN_RETENTION.layers=2", "FROZEN_RETENTION.width=32",
                              "RESERVOIR_ATTENTION.units=16", "RESERVOIR_ATTENTION.width=32"])
    plain = build_model(name, 30, config)
    checked = copy.deepcopy(plain)
    real, calls = dev.checkpoint_function(dev.select_device({"DEVICE": "cpu"})), []
    checked.use_gradient_checkpointing(lambda fn, *inputs: calls.append(fn) or real(fn, *inputs))
    ids = torch.randint(0, 30, (3, 17), generator=torch.Generator().manual_seed(0))
    grads = []
    for model in (plain, checked):
        F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
        grads.append([p.grad for p in model.parameters() if p.grad is not None])
    assert len(grads[0]) == len(grads[1]) > 0 and calls  # the checkpointed path really ran
    for a, b in zip(*grads, strict=True):
        torch.testing.assert_close(a, b, atol=1e-6, rtol=1e-5)


def test_diagonal_scan_from_a_carried_state_equals_a_sequential_loop():
    from reservoir.models.reservoirs import diagonal_scan, multi_timescale_eigenvalues

    radius, phase = multi_timescale_eigenvalues(24, 2.0, 1000.0, 3.14, torch.Generator().manual_seed(0))
    lam = torch.polar(radius, phase)
    x = torch.randn(3, 45, 24, dtype=torch.complex64)
    h = torch.randn(3, 24, dtype=torch.complex64)
    h_re, h_im = diagonal_scan(x.real, x.imag, lam.real, lam.imag, (h.real, h.imag))
    for t in range(45):
        h = lam * h + x[:, t]
        torch.testing.assert_close(torch.complex(h_re[:, t], h_im[:, t]), h, atol=1e-4, rtol=1e-4)


def test_time_constants_are_log_uniform_between_their_bounds():
    from reservoir.models.reservoirs import multi_timescale_eigenvalues

    radius, phase = multi_timescale_eigenvalues(4000, 2.0, 1000.0, 1.0, torch.Generator().manual_seed(0))
    tau = -1 / torch.log(radius)
    assert 2.0 <= float(tau.min()) and float(tau.max()) <= 1000.0 * (1 + 1e-4)
    # log-uniform: each decade between the bounds holds its share of the units
    share = float(((tau > 10) & (tau <= 100)).float().mean())
    assert share == pytest.approx(1 / np.log10(500), abs=0.03)
    assert 0 <= float(phase.min()) and float(phase.max()) <= 1.0


def test_deep_linear_reservoir_taps_see_exactly_the_last_tokens():
    from reservoir.models import DeepLinearReservoir

    cfg = {**small_config()["DEEP_LINEAR_RESERVOIR"], "layers": 0, "taps": 3}  # the taps alone
    model = DeepLinearReservoir(30, cfg, seed=0, seq_len=32).eval()
    ids = torch.randint(0, 30, (1, 20), generator=torch.Generator().manual_seed(0))
    base = model(ids)[0, 10]
    for back, seen in ((0, True), (2, True), (3, False)):
        changed = ids.clone()
        changed[0, 10 - back] = (changed[0, 10 - back] + 1) % 30
        assert (not torch.allclose(model(changed)[0, 10], base)) is seen, back


def test_deep_linear_reservoir_rejects_inverted_time_constants():
    from reservoir.config import ConfigError

    with pytest.raises(ConfigError, match="tau_min <= tau_max"):
        parse_overrides(["DEEP_LINEAR_RESERVOIR.tau_min=50", "DEEP_LINEAR_RESERVOIR.tau_max=10"])


def test_upper_gram_is_the_gram_matrix_for_about_half_the_work():
    from torch.utils.flop_counter import FlopCounterMode

    from reservoir.models.ridge import upper_gram

    x = torch.randn(300, 1079, dtype=torch.float64)
    with FlopCounterMode(display=False) as blocked:
        upper = upper_gram(x.T)
    torch.testing.assert_close(torch.triu(upper), torch.triu(x.T @ x))
    full = 2 * 300 * 1079 * 1079
    assert blocked.get_total_flops() < 0.65 * full
    acc = RidgeAccumulator(1079, 3, product_dtype=torch.float64)  # the solve mirrors it back
    acc.add(x, torch.randint(0, 3, (300,)))
    design = torch.cat([x, torch.ones(300, 1, dtype=torch.float64)], 1)
    assert torch.allclose(torch.triu(acc.xtx), torch.triu(design.T @ design))


@pytest.mark.parametrize("chunk", [16, 2])  # 16, 16, 8; and chunks shorter than the taps reach back
def test_deep_linear_reservoir_carries_its_state_exactly_from_chunk_to_chunk(chunk):
    model = build_model("deep_linear_reservoir", 30, small_config()).eval()
    ids = torch.randint(0, 30, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model(ids)
        state, parts = model.initial_state(2, "cpu"), []
        for start in range(0, 40, chunk):
            logits, state = model.forward_stream(ids[:, start:start + chunk], state)
            parts.append(logits)
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=1e-4)
    assert model.stream_kind == "window" and model.context_size == 32  # evaluated and sampled like the transformer
    (h_re, h_im), _ = state.layers  # a named state: each layer's (Re h, Im h), and the recent embeddings
    assert h_re.shape == h_im.shape == (2, 16) and state.recent.shape == (2, model.taps - 1, 8)


def test_esn_fit_stride_fits_the_readout_on_every_nth_state(corpus_ids):
    ids, vocab = corpus_ids
    seq = 32
    windows = torch.from_numpy(ids[: 40 * seq].astype(np.int64)).view(8, 5 * seq)  # 8 streams, 5 chunks each
    chunks = [(windows[:, k * seq:(k + 1) * seq], windows[:, k * seq + 1:(k + 1) * seq + 1]) for k in range(4)]
    calibration = [chunks[-1]]
    losses, samples = {}, {}
    for stride in (1, 3):
        model = build_model("esn", vocab, small_config(f"ESN.fit_stride={stride}"))
        samples[stride] = model.fit_ridge(chunks[:3], calibration, carry_state=True)["ridge_samples"]
        with torch.no_grad():
            x, y = chunks[3]
            losses[stride] = float(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
    assert samples[1] == 3 * 8 * seq and samples[3] == 3 * 8 * len(range(0, seq, 3))
    assert losses[1] < losses[3] < 0.75 * np.log(vocab)  # a working readout, from a third of the states


def test_deep_linear_reservoir_loads_checkpoints_that_stored_its_input_norm():
    model = build_model("deep_linear_reservoir", 30, small_config()).eval()
    state = model.state_dict()
    for layer, block in enumerate(model.blocks):  # what checkpoints held before it was derived from λ
        state[f"blocks.{layer}.in_norm"] = torch.sqrt(1 - block.lam_re**2 - block.lam_im**2).repeat(2)
    again = build_model("deep_linear_reservoir", 30, small_config("SEED=7")).eval()  # other weights until loaded
    ids = torch.randint(0, 30, (2, 20))
    assert not torch.allclose(again(ids), model(ids))
    again.load_state_dict(state)
    torch.testing.assert_close(again(ids), model(ids))


def test_a_checkpoint_from_another_model_version_is_one_line(tmp_path):
    from reservoir.run.checkpoint import CheckpointError, restore_model

    model = build_model("lstm", 30, small_config())
    state = {**model.state_dict(), "head.extra": torch.zeros(3)}
    with pytest.raises(CheckpointError, match="another version|this version of the code cannot load"):
        restore_model(model, {"model_state": state}, tmp_path / "lstm.pt")


@pytest.mark.parametrize("chunks", [(1, 2, 4, 30, 31, 40), (16, 32, 40)])  # single tokens, and whole windows
@pytest.mark.parametrize("options", [(), ("FROZEN_RETENTION.conv_width=4", "FROZEN_RETENTION.write_gate=True"),
                                     ("FROZEN_RETENTION.forget_gate=True",),
                                     ("FROZEN_RETENTION.write_gate=True", "FROZEN_RETENTION.forget_gate=True")])
def test_frozen_retention_parallel_and_recurrent_forms_agree(chunks, options):
    model = build_model("frozen_retention", 30, small_config("FROZEN_RETENTION.tau_max=50", *options)).eval()
    ids = torch.randint(0, 30, (2, 40), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for block in model.blocks:
            if block.taps:  # past its identity start: every tap counts, across chunk boundaries too
                block.conv.normal_(generator=torch.Generator().manual_seed(1))
            if block.forget_gate is not None:  # past its start at the frozen decay: every step's decay its own
                block.forget_gate.weight.normal_(generator=torch.Generator().manual_seed(2))
        whole = model(ids)  # the parallel form: a masked 40 x 40 product per head
        state, parts, start = model.initial_state(2, "cpu"), [], 0
        for end in chunks:
            logits, state = model.forward_stream(ids[:, start:end], state)
            parts.append(logits)
            start = end
    torch.testing.assert_close(torch.cat(parts, dim=1), whole, atol=1e-5, rtol=1e-4)
    assert [s.shape for s in state.layers] == [(2, 4, 8, 8)] * 2  # per layer: each head's key x value state
    taps = 3 if "FROZEN_RETENTION.conv_width=4" in options else 0
    assert [r.shape[1] for r in state.recent] == [taps] * 2  # what the convolution reaches back to
    assert model.stream_kind == "window" and model.context_size == 32  # evaluated and sampled like the transformer


@pytest.mark.parametrize("gate, trained", [("write_gate", "all but recurrence"), ("forget_gate", "everything")])
def test_a_gate_trains_while_the_frozen_decays_and_rotations_stay_as_they_were(gate, trained):
    """The write gate keeps frozen retention a reservoir (its decays and rotations never move); the forget gate
    makes each step's decay depend on the text, trained: the control, no longer one, and labelled so."""
    model = build_model("frozen_retention", 30, small_config(f"FROZEN_RETENTION.{gate}=True"))
    frozen = {name: b.clone() for name, b in model.named_buffers()}
    gate_before = [getattr(b, gate).weight.clone() for b in model.blocks]
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = torch.randint(0, 30, (2, 33), generator=torch.Generator().manual_seed(0))
    for _ in range(3):
        F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert {"blocks.0.log_decay", "blocks.0.angles"} <= set(frozen)
    assert all(torch.equal(b, frozen[name]) for name, b in model.named_buffers())
    assert all(not torch.equal(getattr(b, gate).weight, w) for b, w in zip(model.blocks, gate_before, strict=True))
    assert model.trained == trained


def test_frozen_retention_freezes_its_decays_and_rotations_unless_trained_on_purpose():
    frozen = build_model("frozen_retention", 30, small_config())
    block = frozen.blocks[0]
    taus = -1 / block.log_decay.double()
    assert taus[0] == pytest.approx(2.0) and taus[-1] == pytest.approx(1000.0)  # log-spaced over [2, 1000]
    assert taus[1] / taus[0] == pytest.approx(taus[2] / taus[1])
    assert block.angles.tolist() == pytest.approx([10000 ** (-2 * j / 8) for j in range(4)])
    trained_names = {name for name, _ in frozen.named_parameters()}
    assert not any("log_decay" in n or "angles" in n for n in trained_names)  # buffers: no optimizer sees them
    unfrozen = build_model("frozen_retention", 30, small_config("FROZEN_RETENTION.train_recurrence=True"))
    ids = torch.randint(0, 30, (2, 17), generator=torch.Generator().manual_seed(0))
    F.cross_entropy(unfrozen(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
    grads = [b.log_decay.grad for b in unfrozen.blocks] + [b.angles.grad for b in unfrozen.blocks]
    assert all(g is not None and g.abs().sum() > 0 for g in grads)  # the control trains what was frozen
    extra = sum(b.log_decay.numel() + b.angles.numel() for b in unfrozen.blocks)
    assert unfrozen.param_counts()["params_trainable"] == frozen.param_counts()["params_trainable"] + extra
    assert frozen.param_counts()["params_total"] == unfrozen.param_counts()["params_total"]


@pytest.mark.parametrize("name, block, frozen_trained, recurrence", [
    ("deep_linear_reservoir", "DEEP_LINEAR_RESERVOIR", "all but recurrence", {"log_rate", "phase"}),
    ("linear_reservoir", "LINEAR_RESERVOIR", "input+readout", {"log_rate", "phase", "b_re", "b_im"}),
    ("reservoir_attention", "RESERVOIR_ATTENTION", "readout", {"log_rate", "phase", "b_re", "b_im"}),
])
def test_the_unfrozen_control_trains_what_the_reservoir_freezes_from_the_same_start(name, block, frozen_trained,
                                                                                    recurrence):
    frozen = build_model(name, 30, small_config())
    unfrozen = build_model(name, 30, small_config(f"{block}.train_recurrence=True"))
    assert (frozen.trained, unfrozen.trained) == (frozen_trained, "everything")
    frozen_names = {n.rsplit(".", 1)[-1] for n, p in frozen.named_parameters()}
    unfrozen_names = {n.rsplit(".", 1)[-1] for n, p in unfrozen.named_parameters()}
    assert not frozen_names & recurrence and recurrence <= unfrozen_names
    ids = torch.randint(0, 30, (2, 17), generator=torch.Generator().manual_seed(0))
    frozen.eval(), unfrozen.eval()
    with torch.no_grad():  # the same seed draws the same λ and B: the control starts where the reservoir does
        torch.testing.assert_close(unfrozen(ids), frozen(ids), atol=1e-5, rtol=1e-4)
    unfrozen.train()
    F.cross_entropy(unfrozen(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
    grads = {n.rsplit(".", 1)[-1]: p.grad for n, p in unfrozen.named_parameters() if n.rsplit(".", 1)[-1] in recurrence}
    assert all(g is not None and g.abs().sum() > 0 for g in grads.values()), grads.keys()
    assert frozen.param_counts()["params_total"] == unfrozen.param_counts()["params_total"]
    assert unfrozen.param_counts()["params_trainable"] == unfrozen.param_counts()["params_total"]
    with torch.no_grad():  # however far the optimiser pushes the rates, |λ| stays below 1: a stable recurrence
        for module in unfrozen.modules():
            if "log_rate" in module._parameters:
                module.log_rate.fill_(-30.0)
                lam_re, lam_im = eigenvalues(module)
                assert bool(((lam_re**2 + lam_im**2) < 1).all()) and torch.isfinite(unfrozen(ids)).all()


@pytest.mark.parametrize("block", sorted(ADDED_OPTIONS))
def test_a_run_recorded_before_an_option_existed_builds_the_model_it_trained(block):
    """compare.py on a run of reservoir_attention recorded before train_recurrence failed with KeyError."""
    from reservoir.config import SHARED_CONFIG

    name = block.lower()
    current = small_config()
    current[block] = {**current[block], **ADDED_OPTIONS[block]}  # as those runs were built (not today's defaults)
    recorded = {**current, block: {k: v for k, v in current[block].items() if k not in ADDED_OPTIONS[block]}}
    assert set(ADDED_OPTIONS[block]) <= set(SHARED_CONFIG[block])
    ids = torch.randint(0, 30, (2, 17), generator=torch.Generator().manual_seed(0))
    old, new = build_model(name, 30, recorded).eval(), build_model(name, 30, current).eval()
    assert old.state_dict().keys() == new.state_dict().keys()
    with torch.no_grad():
        torch.testing.assert_close(old(ids), new(ids))


def test_frozen_retention_refuses_heads_that_do_not_split_its_width():
    with pytest.raises(ConfigError, match="heads of an even size"):
        parse_overrides(["FROZEN_RETENTION.width=36", "FROZEN_RETENTION.heads=4"])  # 9 per head: no pairs


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_model_class_has_its_own_docstring_saying_what_it_is(name):
    """docs/configuration.md's model table points to each class's docstring for what is frozen and what is trained."""
    cls = type(build_model(name, 30, small_config()))
    assert vars(cls).get("__doc__") and len(cls.__doc__.split()) > 8, cls.__name__


@pytest.mark.parametrize("recurrent", [True, False])
def test_reservoir_attention_reads_frozen_states_and_its_control_the_same_input_without_recurrence(recurrent):
    model = build_model("reservoir_attention", 30, small_config(f"RESERVOIR_ATTENTION.reservoir={recurrent}"))
    ids = torch.randint(0, 30, (2, 20), generator=torch.Generator().manual_seed(0))
    features = model.features(ids)
    h_re, h_im = torch.zeros(2, 32), torch.zeros(2, 32)
    for t in range(20):  # the reservoir as a loop: h_t = λ h_{t-1} + B u_t; the control: B u_t alone
        drive_re, drive_im = model.b_re[ids[:, t]], model.b_im[ids[:, t]]
        if recurrent:
            drive_re, drive_im = (model.lam_re * h_re - model.lam_im * h_im + drive_re,
                                  model.lam_re * h_im + model.lam_im * h_re + drive_im)
        h_re, h_im = drive_re, drive_im
        torch.testing.assert_close(features[:, t], torch.cat([h_re, h_im], dim=-1), atol=1e-5, rtol=1e-4)
    assert model.trained == "readout" and not features.requires_grad  # a pure readout: nothing before it trains
    assert {"lam_re", "lam_im", "b_re", "b_im"} <= {name for name, _ in model.named_buffers()}
    F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
    assert all(p.grad is not None for p in model.parameters())  # every parameter is the readout's


@pytest.mark.parametrize("readout", ["ridge", "softmax"])
def test_how_a_model_is_fitted_is_known_before_it_is_built(readout):
    from reservoir.models import trainer_of

    config = small_config(*(f"{block}.readout={readout}" for block in ("ESN", "DEEP_ESN", "NVAR")))
    for name in MODEL_NAMES:
        assert trainer_of(name, config) == build_model(name, 40, config).trainer, name


def test_the_random_transformer_trains_its_embeddings_alone_and_its_blocks_stay_as_initialised(tmp_path):
    """TRANSFORMER.trained='embeddings' (the random-transformer control): a real run, then its checkpoint against
    the model as built: every block and norm bit-identical, the embedding and the unembedding moved."""
    from reservoir.run.trained import load_trained
    from tests.conftest import run_cli

    run_cli(tmp_path, "MODELS=transformer", "TRANSFORMER.trained=embeddings", "MAX_STEPS=12", "EVAL_EVERY=12",
            "RUN_NAME=r", "SAMPLE_TOKENS=0")
    model, tokenizer, run = load_trained(tmp_path / "results" / "r", "transformer")
    start = build_model("transformer", tokenizer.vocab_size, run.config)
    assert run.step == 12 and model.trained == start.trained == "embeddings"
    moved = {name for name, p in model.named_parameters() if not torch.equal(p, dict(start.named_parameters())[name])}
    assert moved == {"tok.weight", "head.weight"}
    assert model.head.weight.data_ptr() != model.tok.weight.data_ptr()  # untied
    summary = {r["model"]: r for r in json.loads((tmp_path / "results" / "r" / "summary.json").read_text())}
    assert summary["transformer"]["trained"] == "embeddings"
    assert summary["transformer"]["params_trainable"] == 2 * tokenizer.vocab_size * run.config["TRANSFORMER"]["n_embd"]


def test_reservoir_attentions_write_gate_starts_as_the_ungated_reservoir_and_leaves_it_frozen():
    """A gate per character on what it writes into the frozen reservoir: at the start the model is the ungated one
    (the same weights, the gate at 1); training moves the gate and the readout, never λ or B; it costs no FLOPs
    by the convention (an element-wise scale)."""
    from reservoir.run import flops

    plain = build_model("reservoir_attention", 30, small_config()).eval()
    gated = build_model("reservoir_attention", 30, small_config("RESERVOIR_ATTENTION.write_gate=True")).eval()
    ids = torch.randint(0, 30, (2, 33), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(plain(ids[:, :-1]), gated(ids[:, :-1]))
    assert gated.trained == "input+readout" and plain.trained == "readout"
    assert gated.param_counts()["params_trainable"] == plain.param_counts()["params_trainable"] + 30
    cost = [flops.sgd_step(m, 30, batch_size=2, seq_len=32, steps_per_batch=1).per_step for m in (plain, gated)]
    assert cost[0] == cost[1]
    frozen = {name: b.clone() for name, b in gated.named_buffers()}
    gated.train()
    optimizer = torch.optim.AdamW([p for p in gated.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(3):
        F.cross_entropy(gated(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten()).backward()
        optimizer.step()
        optimizer.zero_grad()
    assert {"b_re", "b_im"} <= set(frozen) and all(torch.equal(b, frozen[n]) for n, b in gated.named_buffers())
    assert gated.write_gate.weight.abs().sum() > 0


def test_scaling_a_large_reservoir_says_what_it_does_before_it_takes_minutes(monkeypatch, capsys):
    """A 10,000-unit ESN printed nothing for about 6 minutes before it trained: its dense eigendecomposition."""
    from reservoir.models import reservoirs

    weights = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))
    scaled = reservoirs.scale_to_spectral_radius(weights, 0.9)
    assert torch.linalg.eigvals(scaled.double()).abs().max().item() == pytest.approx(0.9)
    assert "reservoir to spectral radius" not in capsys.readouterr().out  # a small one is quick: nothing said
    monkeypatch.setattr(reservoirs, "SAY_DRAWS_FROM_UNITS", 64)
    reservoirs.scale_to_spectral_radius(weights + 1, 0.9)
    said = capsys.readouterr().out
    assert "scaling a 64-unit reservoir to spectral radius 0.9: all its eigenvalues" in said and "units³" in said


def test_a_reservoir_drawn_again_in_a_process_is_scaled_without_a_second_eigendecomposition(monkeypatch, capsys):
    """A study's FLOP count and PLAN's probes build one draw for every rate and batch of a size: a 4,096-unit one
    decomposed again each time, half a minute each (a plan of 144 probes, most of it). The same numbers get the same
    radius, so the draw is the one made the first time; new numbers are decomposed."""
    from reservoir.models import reservoirs

    decompositions, eigvals = [], torch.linalg.eigvals
    monkeypatch.setattr(torch.linalg, "eigvals", lambda w: decompositions.append(w.shape) or eigvals(w))
    monkeypatch.setattr(reservoirs, "SAY_DRAWS_FROM_UNITS", 48)
    first, again = (reservoirs.Reservoir(20, 48, 0.9, 0.3, 1.0, 0.1, 0.0, 10, 0.1, seed=11) for _ in range(2))
    assert torch.equal(first.w, again.w) and len(decompositions) == 1
    assert capsys.readouterr().out.count("scaling a 48-unit reservoir") == 1  # said once: the one that takes time
    other = reservoirs.Reservoir(20, 48, 0.9, 0.3, 1.0, 0.1, 0.0, 10, 0.1, seed=12)
    assert len(decompositions) == 2 and not torch.equal(other.w, first.w)
    assert torch.linalg.eigvals(again.w.double()).abs().max().item() == pytest.approx(0.9, rel=1e-6)
    monkeypatch.setattr(reservoirs, "DENSE_UNITS", 32)  # ARPACK's path remembers too
    sparse = [reservoirs.Reservoir(20, 64, 0.9, 0.3, 1.0, 0.1, 0.0, 10, 0.1, seed=5) for _ in range(2)]
    assert torch.equal(sparse[0].w_value, sparse[1].w_value) and len(reservoirs._RADII) >= 3


@pytest.mark.parametrize("units", [300, 500, 1000])
def test_arpack_s_spectral_radius_is_the_dense_one_at_sizes_both_can_afford(units):
    """Past DENSE_UNITS a reservoir is scaled by ARPACK's largest eigenvalue, not every eigenvalue (a 10,000-unit
    draw took minutes): at sizes the dense decomposition affords the two agree, draw after draw (asked for the one
    largest alone, ARPACK missed it by 2.5% in 1 of 32 such draws)."""
    from reservoir.models.reservoirs import _fixed_degree_matrix, _sparse_matrix, largest_eigenvalue_modulus

    for seed in range(4):
        g = torch.Generator().manual_seed(7 * seed + units)
        for weights in (_fixed_degree_matrix(units, 10, g), _sparse_matrix(units, units, 0.1, g)):
            dense = torch.linalg.eigvals(weights.double()).abs().max().item()
            assert largest_eigenvalue_modulus(weights) == pytest.approx(dense, rel=1e-9), (units, seed)


def test_a_reservoir_past_the_dense_size_is_drawn_at_its_spectral_radius_in_seconds(monkeypatch, capsys):
    from reservoir.models import reservoirs

    monkeypatch.setattr(reservoirs, "DENSE_UNITS", 256)
    reservoir = reservoirs.Reservoir(20, 600, 0.9, 0.3, 1.0, 0.1, 0.0, 10, 0.1, seed=3)
    radius = torch.linalg.eigvals(reservoir.dense_matrix().double()).abs().max().item()
    assert radius == pytest.approx(0.9, rel=1e-6)  # float32
    assert "dense eigendecomposition" not in capsys.readouterr().out


def test_a_reservoir_past_the_dense_size_keeps_its_non_zeros_alone_the_same_draw_and_the_same_states(monkeypatch):
    """Past DENSE_UNITS, W is kept as its non-zeros (what a checkpoint holds: 3.9 MB at 32,768 units, not 4.3 GB):
    the same numbers as the dense draw, and the states it computes, on the CSR path and the dense one (XLA's)."""
    from reservoir.models import reservoirs

    dense = reservoirs.Reservoir(20, 600, 0.9, 1.0, 1.0, 0.1, 0.5, 10, 0.1, seed=3)
    monkeypatch.setattr(reservoirs, "DENSE_UNITS", 256)
    sparse = reservoirs.Reservoir(20, 600, 0.9, 1.0, 1.0, 0.1, 0.5, 10, 0.1, seed=3)
    assert "w" not in sparse.state_dict() and sparse.state_dict()["w_value"].numel() == 600 * 10
    torch.testing.assert_close(sparse.dense_matrix(), dense.w, rtol=1e-6, atol=0)
    for name in ("w_in", "bias"):
        assert torch.equal(getattr(sparse, name), getattr(dense, name))
    ids = torch.randint(0, 20, (3, 50), generator=torch.Generator().manual_seed(0))
    expected = dense(ids)[0]
    torch.testing.assert_close(sparse(ids)[0], expected, rtol=1e-5, atol=1e-6)
    sparse.sparse = False  # the dense product, as on a device without sparse kernels
    torch.testing.assert_close(sparse(ids)[0], expected, rtol=1e-5, atol=1e-6)
