"""COMPILE=True: the training step compiled by torch.compile on the CPU (a C++ compiler and Inductor, for real),
its scores beside eager's, nothing compiled again after warm-up, and an eager fallback in one line on a machine
without a compiler."""

import os
import shutil

import pytest

from tests.conftest import run_cli, summary_of

SHORT = ["MODELS=['transformer','lstm']", "MAX_STEPS=40", "EVAL_POINTS=1", "SAMPLE_TOKENS=0"]
# a compiled step adds and multiplies in another order than eager's kernels: after 40 steps on the tiny models
# the scores differ in the fifth decimal (measured: bench/bench_compiled.py, docs/hardware.md)
SCORE_TOLERANCE = 1e-3


@pytest.mark.slow
@pytest.mark.skipif(not shutil.which(os.environ.get("CXX", "g++")),
                    reason="no C++ compiler here: torch.compile's CPU backend needs one (the next test has none)")
def test_a_compiled_step_scores_as_eager_does_within_tolerance_and_compiles_nothing_after_warm_up(tmp_path):
    run_cli(tmp_path, *SHORT, "RUN_NAME=eager")
    run_cli(tmp_path, *SHORT, "COMPILE=True", "RUN_NAME=compiled")
    eager, compiled = (summary_of(tmp_path / "results" / name) for name in ("eager", "compiled"))
    for model in ("transformer", "lstm"):
        fit = compiled[model]["fit"]
        assert fit["compiled"] is True and fit["compile_failed"] is None, fit
        assert fit["recompiles"] == 0  # the fit's batches are one shape: warm-up compiled everything
        assert fit["compile_seconds"] > eager[model]["fit"]["compile_seconds"]  # held off the training clock
        assert "compiled" not in eager[model]["fit"]  # an eager record says nothing of compiling
        assert abs(compiled[model]["val_bpc"] - eager[model]["val_bpc"]) < SCORE_TOLERANCE
        assert compiled[model]["train_steps"] == eager[model]["train_steps"] == 40


@pytest.mark.slow
def test_a_machine_without_a_compiler_trains_eager_after_one_line(tmp_path):
    """No C++ compiler (CXX names none, and torch's cache is empty, so nothing compiled earlier is found): the
    fit says so in one line and trains eager, to the bit what COMPILE=False trains. Its own process: Inductor
    reads CXX when it is imported."""
    args = ["MODELS=['transformer']", "MAX_STEPS=12", "EVAL_POINTS=1", "SAMPLE_TOKENS=0"]
    run_cli(tmp_path, *args, "RUN_NAME=eager")
    proc = run_cli(tmp_path, *args, "COMPILE=True", "RUN_NAME=nocompiler", in_process=False,
                   env={"CXX": str(tmp_path / "no-such-compiler"), "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "ind")})
    said = [line for line in proc.stderr.splitlines() if "COMPILE=True could not compile" in line]
    assert len(said) == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert "transformer:" in said[0] and "COMPILE=False" in said[0]
    record = summary_of(tmp_path / "results" / "nocompiler")["transformer"]
    assert record["fit"]["compiled"] is False and record["fit"]["compile_failed"]
    assert record["val_bpc"] == summary_of(tmp_path / "results" / "eager")["transformer"]["val_bpc"]
