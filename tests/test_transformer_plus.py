"""The literature's transformer (Transformer++: rotary positions, SwiGLU, RMSNorm, no biases) beside
GPT-2's: relative positions, parameter counts by formula, FLOPs by the project's convention, the
cache, and the options' validation."""

import pytest
import torch

from reservoir.config import ConfigError, parse_overrides
from reservoir.models import build_model
from reservoir.models.baselines import rotate, swiglu_hidden, transformer_recipe
from reservoir.run import flops

VOCAB, SEQ = 40, 32


def transformer(*overrides: str):
    config = parse_overrides([f"SEQ_LEN={SEQ}", "TRANSFORMER.n_layer=2", "TRANSFORMER.n_embd=48", *overrides])
    return build_model("transformer", VOCAB, config), config["TRANSFORMER"]


def test_rotary_scores_depend_only_on_the_distance_between_query_and_key():
    gen = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 16, generator=gen), torch.randn(1, 1, 1, 16, generator=gen)

    def score(query_at: int, key_at: int) -> float:
        return float((rotate(q, query_at) * rotate(k, key_at)).sum())

    for distance in (0, 1, 5, 17):
        scores = [score(start + distance, start) for start in (0, 3, 40, 1000)]
        assert scores == pytest.approx([scores[0]] * 4, rel=1e-4, abs=1e-5), distance
    assert score(5, 0) != pytest.approx(score(9, 0), rel=1e-3)  # but it does depend on the distance
    positions = rotate(torch.randn(1, 2, 6, 16, generator=gen))
    assert positions.shape == (1, 2, 6, 16)
    whole = torch.randn(1, 1, 6, 16, generator=gen)  # rotating a slice from its first position = rotating it whole
    torch.testing.assert_close(rotate(whole)[..., 4:, :], rotate(whole[..., 4:, :], 4))


@pytest.mark.parametrize("recipe", ["gpt2", "++"])
def test_parameter_counts_match_the_formula(recipe):
    model, cfg = transformer(f"TRANSFORMER.recipe={recipe}")
    layers, d = cfg["n_layer"], cfg["n_embd"]
    if recipe == "gpt2":  # qkv, proj, 4x MLP with biases, two LayerNorms; learned positions; final LayerNorm
        per_layer = 3 * d * d + 3 * d + d * d + d + 4 * d * d + 4 * d + 4 * d * d + d + 2 * 2 * d
        expected = layers * per_layer + VOCAB * d + SEQ * d + 2 * d
    else:  # no biases, SwiGLU's three matrices of 8/3 d, two RMSNorm gains; rotary: no position table
        per_layer = 4 * d * d + 3 * d * swiglu_hidden(d) + 2 * d
        expected = layers * per_layer + VOCAB * d + d
    assert sum(p.numel() for p in model.parameters()) == expected
    assert model.param_counts()["params_trainable"] == expected


def test_swiglu_keeps_the_feed_forward_weights_matched():
    for d in (48, 64, 96, 128):
        assert abs(3 * d * swiglu_hidden(d) - 8 * d * d) <= 3 * d  # within one hidden unit of GELU's 2 x 4d x d


def test_transformer_plus_plus_flops_follow_the_convention():
    """Products only: 6 x the matrices' weights per token plus the attention square; rotary and norms free."""
    model, cfg = transformer("TRANSFORMER.recipe=++")
    cost = flops.sgd_step(model, VOCAB, batch_size=4, seq_len=SEQ, steps_per_batch=1)
    layers, d = cfg["n_layer"], cfg["n_embd"]
    weights = layers * (4 * d * d + 3 * d * swiglu_hidden(d)) + d * VOCAB  # blocks + the tied head
    attention = layers * 4 * SEQ * d  # QKᵀ and AV per token over the full square, forward; backward 2x
    assert cost.per_step / (4 * SEQ) == pytest.approx(6 * weights + 3 * attention, rel=1e-6)


@pytest.mark.parametrize("options", [("TRANSFORMER.recipe=++",), ("TRANSFORMER.recipe=++", "TRANSFORMER.qk_norm=True"),
                                     ("TRANSFORMER.rotary=True",)])
def test_cached_generation_and_causality_hold_for_every_recipe(options):
    model, _ = transformer(*options)
    model.eval()
    ids = torch.randint(0, VOCAB, (1, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        logits, cache = model.begin_generation(ids[:, :12])
        for t in range(12, 20):
            torch.testing.assert_close(logits, model(ids[:, :t])[:, -1], rtol=1e-5, atol=1e-5)
            logits, cache = model.continue_generation(ids[:, :t + 1], cache)
        changed = ids.clone()
        changed[0, 10:] = (changed[0, 10:] + 1) % VOCAB
        torch.testing.assert_close(model(ids)[0, :10], model(changed)[0, :10])


def test_one_switch_selects_the_recipe_and_each_part_can_be_set_apart():
    assert transformer_recipe({"recipe": "++", "rotary": None, "swiglu": None, "rmsnorm": None}) == \
        {"rotary": True, "swiglu": True, "rmsnorm": True, "bias": False, "qk_norm": False}
    mixed = transformer_recipe({"recipe": "++", "rotary": False, "swiglu": None, "rmsnorm": None, "qk_norm": True})
    assert mixed["rotary"] is False and mixed["swiglu"] and mixed["qk_norm"]
    model, _ = transformer("TRANSFORMER.recipe=++", "TRANSFORMER.rotary=False")
    assert model.pos is not None  # learned positions where rotary is switched off
    gpt2, _ = transformer("TRANSFORMER.recipe=gpt2")
    assert transformer_recipe(parse_overrides(["TRANSFORMER.recipe=gpt2"])["TRANSFORMER"])["rotary"] is False
    assert isinstance(gpt2.blocks[0].ln1, torch.nn.LayerNorm)
    # the default is the frontier's better recipe at the default budget (tests/test_frontier_study.py)
    assert transformer_recipe(parse_overrides([])["TRANSFORMER"])["rotary"] is True


def test_rotary_needs_heads_of_an_even_size():
    with pytest.raises(ConfigError, match="heads of an even size"):
        parse_overrides(["TRANSFORMER.recipe=++", "TRANSFORMER.n_embd=36", "TRANSFORMER.n_head=4"])
    parse_overrides(["TRANSFORMER.recipe=gpt2", "TRANSFORMER.n_embd=36", "TRANSFORMER.n_head=4"])  # any head size


def test_a_runs_table_names_the_transformer_by_its_recipe_as_the_studies_do(tmp_path):
    """The default run's table and the studies' headline name one transformer alike: the '++' recipe's row is
    transformer++, GPT-2's is transformer, and sample.py takes the name the table shows."""
    from tests.conftest import run_cli, run_script

    plus = run_cli(tmp_path, "MODELS=transformer", "TRANSFORMER.n_layer=1", "TRANSFORMER.n_embd=16", "MAX_STEPS=3",
                   "RUN_NAME=plus")
    rows = [line.split()[0] for line in plus.stdout.splitlines() if line.startswith("transformer")]
    assert rows == ["transformer++"]
    gpt2 = run_cli(tmp_path, "MODELS=transformer", "TRANSFORMER.recipe=gpt2", "TRANSFORMER.n_layer=1",
                   "TRANSFORMER.n_embd=16", "MAX_STEPS=3", "RUN_NAME=gpt2")
    assert [line.split()[0] for line in gpt2.stdout.splitlines() if line.startswith("transformer")] == ["transformer"]
    sampled = run_script("sample.py", tmp_path / "results" / "plus", "MODEL=transformer++", "MAX_NEW_TOKENS=5")
    assert "transformer at step 3" in sampled.stderr + sampled.stdout


def test_a_step_reads_its_rotary_angles_from_a_table_and_scores_as_angles_computed_in_the_step():
    """Computed in the step, the angles' cos and sin were recomputed by torch.compile's backward for every element
    of every head (half of a compiled Transformer++ step on the CPU: 0.77x eager): each block keeps the window's
    table, not a weight (not saved, not counted), and every logit is the one the angles computed in the step
    give, beyond the window too (a longer context computes its own)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    model, _ = transformer("TRANSFORMER.recipe='++'")
    ids = torch.randint(0, VOCAB, (2, 3 * SEQ), generator=torch.Generator().manual_seed(0))

    seen = set()

    class Ops(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            seen.add(func.overloadpacket.__name__)
            return func(*args, **(kwargs or {}))

    with Ops():
        model(ids[:, :SEQ]).sum().backward()
    assert "mm" in seen and not {"cos", "sin"} & seen, seen
    assert not any("rotary" in name for name in model.state_dict())
    assert model.param_counts()["params_total"] == model.param_counts()["params_trainable"]

    def computed(block, z, first):  # the angles as the step computed them before
        return rotate(z, first)

    with torch.no_grad():
        tabled = [model(ids[:, :SEQ]), model(ids[:, :SEQ // 2]), model(ids)]
        for block in model.blocks:
            block._rotated = computed.__get__(block)
        assert all(torch.equal(a, b) for a, b in zip(tabled, [model(ids[:, :SEQ]), model(ids[:, :SEQ // 2]),
                                                               model(ids)], strict=True))
