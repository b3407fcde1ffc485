"""The experiment runner end to end: results contract, budgets, checkpoints, resume, plots."""

import json
import math
import os
from pathlib import Path

import pytest
import torch

from reservoir.config import given_settings, parse_overrides
from reservoir.run.checkpoint import CheckpointError, load_checkpoint
from reservoir.run.folders import find_run_dir, resumed_config
from reservoir.run.records import SUMMARY_FIELDS, ResultsError, read_metrics
from reservoir.run.train import Budget, Progress, WarmUp, learning_rate
from tests.conftest import ALL_MODELS, run_cli, run_script, run_then_sigkill, summary_of


def test_every_model_runs_and_writes_the_results_contract(every_model_run):
    run_dir = every_model_run
    config = json.loads((run_dir / "config.json").read_text())
    assert config["effective_config"]["MAX_STEPS"] == 20
    assert config["versions"]["torch"] == torch.__version__
    assert config["device"]["kind"] == "cpu" and config["device"]["world_size"] == 1
    assert config["device"]["global_batch"] == 8 and config["data"]["data_source"] == "synthetic"
    cpuinfo = Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else ""
    named = os.environ.get("RESERVOIR_PRETEND_PROCESSOR") or cpuinfo  # a suite run as another machine names that one
    assert config["device"]["processor"] and config["device"]["processor"] in (named or config["device"]["processor"])
    summary = summary_of(run_dir)
    assert set(summary) == set(ALL_MODELS)
    vocab = summary["esn"]["vocab_size"]
    for name, record in summary.items():
        assert set(SUMMARY_FIELDS) <= set(record), name
        # better than a uniform guess over the vocabulary, and a real distribution
        assert 0.5 < record["val_bpc"] < math.log2(vocab), (name, record["val_bpc"])
        assert record["val_ppl"] == pytest.approx(math.exp(record["val_loss"]))
        assert record["params_total"] >= record["params_trainable"] > 0 or name == "ngram"
        assert record["train_tokens"] > 0 and record["tokens_per_second"] > 0
        assert record["wall_seconds"] >= record["train_seconds"]  # what the point cost, start to record
    assert {name: record["trained"] for name, record in summary.items()} == {
        "ngram": "counts", "esn": "readout", "deep_esn": "readout", "nvar": "readout",
        "linear_reservoir": "input+readout", "deep_linear_reservoir": "all but recurrence",
        "frozen_retention": "all but recurrence", "reservoir_attention": "readout", "lstm": "everything",
        "transformer": "everything"}
    for name in ("lstm", "transformer", "linear_reservoir", "deep_linear_reservoir", "frozen_retention"):  # step budget
        assert summary[name]["train_steps"] == 20 and summary[name]["train_tokens"] == 20 * 8 * 32
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics if m["model"] == "transformer"] == [10, 20]
    assert all(m["train_loss"] > 0 for m in metrics if m["model"] == "lstm")
    samples = (run_dir / "samples.txt").read_text()
    assert samples.count("--- prompt: 'Once upon a time'") == len(ALL_MODELS)
    for png in ("bpc_vs_tokens.png", "bpc_vs_seconds.png", "final_bpc.png", "throughput.png"):
        assert (run_dir / png).stat().st_size > 10_000
    assert {p.name for p in (run_dir / "checkpoints").iterdir()} == {f"{m}.pt" for m in summary}


def test_results_are_never_overwritten(tmp_path):
    run_cli(tmp_path, "MODELS=['ngram']", "MAX_STEPS=5", "RUN_NAME=same")
    before = (tmp_path / "results" / "same" / "summary.json").read_bytes()
    again = run_cli(tmp_path, "MODELS=['ngram']", "MAX_STEPS=5", "RUN_NAME=same", check=False)
    assert again.returncode != 0
    assert "already exists" in again.stderr and "RESUME=" in again.stderr and "Traceback" not in again.stderr
    assert (tmp_path / "results" / "same" / "summary.json").read_bytes() == before
    run_cli(tmp_path, "MODELS=['ngram']", "MAX_STEPS=5")
    run_cli(tmp_path, "MODELS=['ngram']", "MAX_STEPS=5")
    assert len(list((tmp_path / "results").iterdir())) == 3  # two timestamped runs beside 'same'


def test_killed_run_resumes_to_the_same_metrics_as_an_uninterrupted_one(tmp_path):
    args = ["MODELS=['ngram','transformer','lstm']", "MAX_STEPS=150", "EVAL_EVERY=25", "CHECKPOINT_EVERY=10",
            "LOG_EVERY=5", "SAMPLE_TOKENS=5"]
    run_cli(tmp_path, *args, "RUN_NAME=whole")

    def transformer_past_step_50(run_dir):  # kill once the transformer has evaluated at step 50, mid-training
        rows = read_metrics(run_dir) if (run_dir / "metrics.jsonl").exists() else []
        return any(r["model"] == "transformer" and r["step"] >= 50 for r in rows)

    killed_dir = run_then_sigkill(tmp_path, args, "killed", transformer_past_step_50)
    summary = summary_of(killed_dir)
    assert "ngram" in summary and "transformer" not in summary, "the kill must land inside transformer training"
    ckpt = torch.load(killed_dir / "checkpoints" / "transformer.pt", weights_only=True)
    assert not ckpt["finished"] and 40 <= ckpt["progress"]["step"] < 150  # the eval at 50 precedes its checkpoint
    resumed = run_cli(tmp_path, *args, "RESUME=killed")  # the same settings again are accepted
    assert "ngram: finished" in resumed.stdout and "resuming at step" in resumed.stdout
    whole, again = summary_of(tmp_path / "results" / "whole"), summary_of(killed_dir)
    for name in ("ngram", "transformer", "lstm"):
        assert again[name]["train_steps"] == whole[name]["train_steps"]
        assert again[name]["val_loss"] == pytest.approx(whole[name]["val_loss"], rel=1e-5, abs=1e-6), name
    curve = [(r["model"], r["step"], round(r["val_loss"], 5)) for r in read_metrics(tmp_path / "results" / "whole")]
    assert [(r["model"], r["step"], round(r["val_loss"], 5)) for r in read_metrics(killed_dir)] == curve


def test_corrupt_checkpoint_is_a_one_line_error_and_keeps_the_run(tmp_path):
    run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=10", "CHECKPOINT_EVERY=5", "RUN_NAME=c")
    run_dir = tmp_path / "results" / "c"
    ckpt = run_dir / "checkpoints" / "lstm.pt"
    (run_dir / "summary.json").write_text("[]")  # as if the run died after its last checkpoint
    ckpt.write_bytes(ckpt.read_bytes()[: ckpt.stat().st_size // 2])
    broken = ckpt.read_bytes()
    proc = run_cli(tmp_path, "RESUME=c", check=False)
    assert proc.returncode != 0
    assert proc.stderr.strip().startswith("error: checkpoint") and "corrupt" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert ckpt.read_bytes() == broken  # nothing deleted or rewritten behind the user's back


def test_checkpoint_for_another_model_config_is_refused(tmp_path):
    run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=5", "RUN_NAME=m")
    path = tmp_path / "results" / "m" / "checkpoints" / "lstm.pt"
    expect = {"model": "lstm", "model_config": {"embed_dim": 64, "hidden": 999, "layers": 1, "dropout": 0.0}}
    with pytest.raises(CheckpointError, match="does not match this run: model_config"):
        load_checkpoint(path, expect)
    pwned = tmp_path / "pwned"
    torch.save({"format": 1, "model": _Malicious(str(pwned))}, path)  # a real pickle that would run code
    with pytest.raises(CheckpointError, match="corrupt or not a ReservoirNLP checkpoint"):
        load_checkpoint(path, expect)
    assert not pwned.exists(), "loading a checkpoint must never run code from it"
    torch.load(path, weights_only=False)  # the same file, unpickled without the guard, does run it
    assert pwned.exists()


class _Malicious:
    """Unpickling this calls os.mkdir(path): proof that a loader ran code from the file."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def test_gradient_accumulation_matches_one_big_batch(tmp_path):
    base = ["MODELS=['transformer']", "MAX_STEPS=3", "SAMPLE_TOKENS=1"]
    run_cli(tmp_path, *base, "BATCH_SIZE=8", "GRAD_ACCUM=1", "RUN_NAME=big")
    run_cli(tmp_path, *base, "BATCH_SIZE=4", "GRAD_ACCUM=2", "RUN_NAME=accum")
    big = summary_of(tmp_path / "results" / "big")["transformer"]
    accum = summary_of(tmp_path / "results" / "accum")["transformer"]
    assert big["train_tokens"] == accum["train_tokens"] == 3 * 8 * 32
    assert accum["val_loss"] == pytest.approx(big["val_loss"], rel=1e-4)


def test_token_budget_stops_every_kind_of_fit(tmp_path):
    run_cli(tmp_path, "MODELS=['ngram','esn','lstm']", "MAX_STEPS=None", "TOKEN_BUDGET=4096", "RUN_NAME=tok")
    summary = summary_of(tmp_path / "results" / "tok")
    assert summary["lstm"]["train_tokens"] == 4096  # 16 steps of 8 x 32
    assert summary["ngram"]["train_tokens"] == 4096
    assert 4096 <= summary["esn"]["train_tokens"] < 4096 + 8 * 32  # the chunk that crosses the budget ends it


def test_bad_resume_and_conflicting_overrides_are_one_line_errors(tmp_path):
    proc = run_cli(tmp_path, "RESUME=nowhere", "MAX_STEPS=1", check=False)
    assert proc.returncode != 0 and proc.stderr.startswith("error: RESUME='nowhere'")
    with pytest.raises(ResultsError, match="holds no runs"):
        find_run_dir(str(tmp_path / "empty"), "latest")
    saved = parse_overrides(["SEQ_LEN=64"])
    args = ["RESUME=x", "BATCH_SIZE=3"]
    with pytest.raises(ResultsError, match="BATCH_SIZE differ"):
        resumed_config(saved, parse_overrides(args), given_settings(args))
    assert resumed_config(saved, parse_overrides(["RESUME=x"]), {"RESUME"})["SEQ_LEN"] == 64
    proc = run_cli(tmp_path, "MAX_STEPS=None", check=False)  # TINY has no time budget either
    assert proc.returncode != 0 and "no training budget" in proc.stderr


def test_budget_and_learning_rate_schedule():
    budget = Budget(max_steps=100, max_tokens=None, max_seconds=10.0)
    assert budget.progress(50, 0, 1.0) == 0.5 and budget.progress(10, 0, 8.0) == 0.8
    assert not budget.spent(99, 0, 9.9) and budget.spent(100, 0, 0.0) and budget.spent(1, 0, 10.0)
    config = parse_overrides(["LEARNING_RATE=1e-3", "WARMUP_STEPS=10", "MIN_LR_FRACTION=0.1"])
    assert learning_rate(config, 0, 0.0) == pytest.approx(1e-4)  # never 0: a 0 would waste the first step
    assert learning_rate(config, 9, 0.09) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.09))))
    assert learning_rate(config, 500, 1.0) == pytest.approx(1e-4)
    assert learning_rate(config, 2, 0.1) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 0.1))))
    assert learning_rate(config, 2, 0.05) == pytest.approx(0.5 * learning_rate(config, 2, 0.1), rel=0.02)
    rates = [learning_rate(config, s, s / 100) for s in range(10, 101)]
    assert all(a >= b for a, b in zip(rates, rates[1:], strict=False))


def test_plot_script_compares_runs_and_reports_empty_ones(tmp_path):
    run_cli(tmp_path, "MODELS=['ngram','lstm']", "MAX_STEPS=10", "EVAL_EVERY=5", "RUN_NAME=a")
    run_cli(tmp_path, "MODELS=['ngram']", "MAX_STEPS=10", "RUN_NAME=b", "NGRAM.order=3")
    out = tmp_path / "cmp"
    proc = run_script("plot_results.py", tmp_path / "results" / "a", tmp_path / "results" / "b", f"OUT={out}",
                      check=False)
    assert proc.returncode == 0, proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["bpc_vs_flops.png", "bpc_vs_params.png", "bpc_vs_seconds.png",
                                                      "bpc_vs_tokens.png", "bpc_vs_train_flops.png", "final_bpc.png",
                                                      "throughput.png"]
    proc = run_script("plot_results.py", tmp_path, check=False)
    assert proc.returncode != 0 and "config.json is missing" in proc.stderr


def test_the_training_clock_leaves_out_pauses_and_a_warm_up_holds_it(monkeypatch):
    from reservoir.run import train

    now = [100.0]
    monkeypatch.setattr(train.time, "perf_counter", lambda: now[0])  # the wall clock is the system edge
    clock = train.Clock(seconds=5.0)  # a resumed fit: 5 s trained before
    now[0] += 2
    assert clock.seconds() == 7.0
    with clock.paused():  # an evaluation
        now[0] += 30
    assert clock.seconds() == 7.0
    with pytest.raises(RuntimeError), clock.paused():  # a checkpoint that fails is still not training time
        now[0] += 4
        raise RuntimeError
    now[0] += 1
    assert clock.seconds() == 8.0
    clock.set(8.0)  # the end of a warm-up step: its compile time is not charged
    now[0] += 50
    clock.set(8.0)
    assert clock.seconds() == 8.0


def test_progress_lines_count_tokens_per_second_after_the_warm_up():
    from reservoir.run.train import Budget

    warm = WarmUp("m", 0, 2, Budget(10, None, None), main=False)
    assert warm.rate(Progress(step=1, tokens=256, seconds=0.0), 256) is None  # still warming up: no rate
    warm.step_done(2, 0.001)  # the warm-up's seconds are held off the clock, its tokens are not
    assert warm.rate(Progress(step=2, tokens=512, seconds=0.001), 256) is None
    assert warm.rate(Progress(step=3, tokens=768, seconds=0.011), 256) == pytest.approx(256 / 0.01)
