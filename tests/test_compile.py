"""COMPILE=True: the training step and the evaluations compiled by torch.compile on the CPU (a C++ compiler and
Inductor, for real), its scores beside eager's, nothing compiled again after warm-up, and an eager fallback in
one line on a machine without a compiler."""

import os
import shutil

import pytest

from reservoir.platform.device import compile_cache_dir
from sample import SEPARATOR
from tests.conftest import run_cli, run_script, summary_of

SHORT = ["MODELS=['transformer','lstm']", "MAX_STEPS=40", "EVAL_POINTS=1", "SAMPLE_TOKENS=40"]
# a compiled step adds and multiplies in another order than eager's kernels: after 40 steps on the tiny models
# the scores differ in the fifth decimal (measured: bench/bench_compiled.py, docs/hardware.md)
SCORE_TOLERANCE = 1e-3


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which(os.environ.get("CXX", "g++")),
                    reason="no C++ compiler here: torch.compile's CPU backend needs one (the next test has none)")
def test_a_compiled_step_scores_as_eager_does_within_tolerance_and_compiles_nothing_after_warm_up(tmp_path):
    """Two evaluations during training and the final one (stream mode, with its windows twin): the evaluations
    compile their own graphs, once per way of calling the model, and none of them counts as the training step's."""
    run_cli(tmp_path, *SHORT, "EVAL_POINTS=3", "RUN_NAME=eager")
    said = run_cli(tmp_path, *SHORT, "EVAL_POINTS=3", "COMPILE=True", "RUN_NAME=compiled").stderr
    # each compile is said (seconds cold, less from the cache), with where the graphs are kept
    assert "transformer: training step compiled in " in said and "lstm: training step compiled in " in said
    assert "evaluation: model calls compiled in " in said
    assert f"its graphs are cached in {compile_cache_dir()}" in said, said
    eager, compiled = (summary_of(tmp_path / "results" / name) for name in ("eager", "compiled"))
    for model, ways in (("transformer", 1), ("lstm", 2)):  # windows; and a recurrent model's stream, chunk by chunk
        fit = compiled[model]["fit"]
        assert fit["compiled"] is True and fit["compile_failed"] is None, fit
        assert fit["recompiles"] == 0  # the fit's batches are one shape: warm-up compiled everything
        assert fit["compile_seconds"] > eager[model]["fit"]["compile_seconds"]  # held off the training clock
        assert fit["eval_compiled"] is True and fit["eval_compile_failed"] is None, fit
        assert fit["eval_graphs"] >= ways and fit["eval_recompiles"] == 0 and fit["eval_compile_seconds"] > 0, fit
        assert not {"compiled", "eval_compiled"} & set(eager[model]["fit"])  # an eager record says nothing of it
        assert abs(compiled[model]["val_bpc"] - eager[model]["val_bpc"]) < SCORE_TOLERANCE
        assert compiled[model]["train_steps"] == eager[model]["train_steps"] == 40
    # its stories came from the compiled decode step; sample.py (with the run's COMPILE) writes them again
    for model in ("transformer", "lstm"):
        again = run_script("sample.py", tmp_path / "results" / "compiled", f"MODEL={model}", "STOP_AT_END=True")
        assert again.stdout.rstrip("\n").split(f"\n{SEPARATOR}\n") == [s["text"] for s in compiled[model]["samples"]]


@pytest.mark.slow
def test_a_machine_without_a_compiler_trains_eager_after_one_line(tmp_path):
    """No C++ compiler (CXX names none, and torch's cache is empty, so nothing compiled earlier is found): the
    run says so in one line and trains, evaluates and samples eager, to the bit what COMPILE=False does. Its own
    process: Inductor reads CXX when it is imported."""
    args = ["MODELS=['transformer','lstm']", "MAX_STEPS=12", "EVAL_POINTS=2", "SAMPLE_TOKENS=20"]
    run_cli(tmp_path, *args, "RUN_NAME=eager")
    proc = run_cli(tmp_path, *args, "COMPILE=True", "RUN_NAME=nocompiler", in_process=False,
                   env={"CXX": str(tmp_path / "no-such-compiler"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")})
    said = [line for line in proc.stderr.splitlines() if "COMPILE=True could not compile" in line]
    assert len(said) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "transformer:" in said[0] and "COMPILE=False" in said[0]
    eager = summary_of(tmp_path / "results" / "eager")
    for model, record in summary_of(tmp_path / "results" / "nocompiler").items():  # one line for two models'
        assert record["fit"]["compiled"] is False and record["fit"]["compile_failed"]  # steps, evaluations and
        assert record["fit"]["eval_compiled"] is False  # decode steps, each of which failed alike
        assert record["val_bpc"] == eager[model]["val_bpc"] and record["samples"] == eager[model]["samples"]


@pytest.mark.slow  # three small compiles, 14 s from an empty cache
@pytest.mark.skipif(not shutil.which(os.environ.get("CXX", "g++")), reason="no C++ compiler here")
def test_a_steps_recompiles_are_its_own_calls_not_the_evaluations_beside_it():
    """The training step's count after warm-up leaves out what the evaluations compile in the same fit; a call
    on a shape compiled before that compiles again is what counts as an evaluation's recompilation."""
    import torch

    from reservoir.platform import device as dev

    cpu = dev.select_device({"DEVICE": "cpu", "USE_TPU": False})
    step = dev.CompiledStep(lambda x: (x * 2).sum(), cpu, True, "tiny")
    step(torch.ones(4))
    step.warmed_up()
    evaluation = dev.CompiledStep(lambda x: x.sin() + 1, cpu, True, "tiny", what="evaluation", fresh=False)
    evaluation(torch.ones(3))
    evaluation(torch.ones(5))  # a second shape: a graph of its own, not a recompilation
    evaluation(torch.ones(3))  # compiled already
    step(torch.ones(4))
    assert step.report()["recompiles"] == 0 and step.compiles == 1
    assert evaluation.compiles == 2 and evaluation.recompiled_shapes == 0 and len(evaluation.shapes) == 2
    assert evaluation.compiled is not None and evaluation.compile_seconds > 0


@pytest.mark.slow  # a compile of each model's decode step
@pytest.mark.skipif(not shutil.which(os.environ.get("CXX", "g++")), reason="no C++ compiler here")
@pytest.mark.parametrize("name", ["transformer", "frozen_retention"])
def test_a_compiled_decode_step_writes_the_eager_stories_from_one_graph(name):
    """The transformer's keys and values in a cache of the window's length, frozen retention's state, and past the
    32-token window the full window: compiled once each for every token of every story (a graph break, where
    the process holds one, splits a compile into frames), the stories eager writes."""
    import torch
    import torch._dynamo

    from reservoir.config import parse_overrides
    from reservoir.models import build_model
    from reservoir.run.sampling import decode_steps

    model = build_model(name, 40, parse_overrides(["SEQ_LEN=32", "TRANSFORMER.n_layer=1", "TRANSFORMER.n_embd=32",
                                                   "FROZEN_RETENTION.layers=1", "FROZEN_RETENTION.width=32",
                                                   "FROZEN_RETENTION.ffn_hidden=64"])).eval()
    torch._dynamo.reset()  # graphs another test left in this process (a worker's) count nothing here
    steps, prompt = decode_steps(model, True), torch.arange(6)
    compiled_by_story = []
    for seed in (1, 2):  # the second story compiles nothing
        stories = [model.generate(prompt, 50, generator=torch.Generator().manual_seed(seed), **s) for s in ({}, steps)]
        assert torch.equal(stories[0], stories[1]), (seed, stories)
        compiled_by_story.append({what: part.compiles for what, part in steps.items()})
    for what, part in steps.items():  # the step within the window, the window past it: one shape each
        assert part.compiled is not None and part.failed is None, (what, part.failed)
        assert len(part.shapes) == 1 and part.recompiled_shapes == 0, (what, part.shapes, part.recompiled_shapes)
        assert compiled_by_story[0][what] >= 1 and compiled_by_story[1][what] == compiled_by_story[0][what], what
