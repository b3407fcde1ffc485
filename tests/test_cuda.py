"""On a CUDA GPU: every model trains and evaluates there, stories match the CPU's recomputing path,
the precision matches the hardware. Skipped without a GPU; ``bench/gpu_check.sh`` runs them."""

import json

import numpy as np
import pytest
import torch

from reservoir.models import MODEL_NAMES
from reservoir.platform import device as dev
from tests.conftest import run_cli

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def test_every_model_trains_on_the_gpu_with_the_precision_its_hardware_has(tmp_path):
    run_cli(tmp_path, "DEVICE=cuda", f"MODELS={list(MODEL_NAMES)}", "MAX_STEPS=20", "RUN_NAME=gpu")
    run_dir = tmp_path / "results" / "gpu"
    config = json.loads((run_dir / "config.json").read_text())
    expected = "bf16" if dev.cuda_has_native_bf16(0) else "fp16"
    assert config["device"]["kind"] == "cuda" and config["device"]["precision"] == expected
    summary = json.loads((run_dir / "summary.json").read_text())
    assert {r["model"] for r in summary if r.get("val_bpc") is not None} == set(MODEL_NAMES)


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_cached_generation_on_the_gpu_writes_the_recomputed_story(name):
    from reservoir.data.synthetic import synthetic_stories
    from reservoir.data.tokenizers import CharTokenizer
    from tests.test_models import _fitted

    stories = synthetic_stories(150, 0)
    tok = CharTokenizer.train(stories)
    corpus = (tok.encode_stories(stories), tok.vocab_size)
    model = _fitted(name, corpus).cuda()
    prompt = torch.from_numpy(corpus[0][100:110].astype(np.int64)).cuda()
    greedy = [model.generate(prompt, 60, temperature=0.0, cache=cache) for cache in (True, False)]
    assert torch.equal(greedy[0], greedy[1])


def test_a_story_on_the_gpu_is_read_by_the_host_once():
    """No host sync while a story of known length is written (torch's sync debug mode counts them): its
    tokens are chosen on the GPU, and the draws go there in one copy."""
    import warnings

    from reservoir.config import parse_overrides
    from reservoir.models import build_model

    model = build_model("lstm", 40, parse_overrides(["LSTM.hidden=32"])).eval().cuda()
    prompt = torch.arange(6, device="cuda")
    model.generate(prompt, 5)  # the first call's own set-up (the kernels' first launches)
    torch.cuda.synchronize()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.cuda.set_sync_debug_mode("warn")
        try:
            model.generate(prompt, 50, generator=torch.Generator().manual_seed(0))
        finally:
            torch.cuda.set_sync_debug_mode("default")
    syncs = [w for w in caught if "synchroniz" in str(w.message)]
    assert len(syncs) == 1, [str(w.message) for w in syncs]


@pytest.mark.parametrize("name", ["transformer", "frozen_retention", "lstm"])
def test_the_decode_step_replayed_as_cuda_graphs_writes_the_eager_story(name):
    """COMPILE's decode step as CUDA graphs (bench_sampling's last column): every token and story one graph,
    each replay's carry copied out before the next writes over it, the stories eager writes."""
    from reservoir.config import parse_overrides
    from reservoir.models import build_model
    from reservoir.run.sampling import decode_steps

    model = build_model(name, 40, parse_overrides(["SEQ_LEN=32", "TRANSFORMER.n_layer=1", "TRANSFORMER.n_embd=32",
                                                   "FROZEN_RETENTION.layers=1", "FROZEN_RETENTION.width=32",
                                                   "FROZEN_RETENTION.ffn_hidden=64", "LSTM.hidden=32"])).eval().cuda()
    steps, prompt = decode_steps(model, True, cuda_graphs=True), torch.arange(6, device="cuda")
    for seed in (1, 2):
        stories = [model.generate(prompt, 50, generator=torch.Generator().manual_seed(seed), **s) for s in ({}, steps)]
        assert torch.equal(stories[0], stories[1]), (seed, stories)
    assert steps["step"].compiled is not None and steps["step"].failed is None, steps["step"].failed
    assert steps["step"].recompiled_shapes == 0
