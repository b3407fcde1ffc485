"""Hardening 3 (issue #33): records a study trusts, seeds that say what they hold, a GPU check that looks
before it downloads, prompts with unknown characters, and the rough edges. Each test failed on the code
before its fix."""

import json
import shutil

import pytest
import torch

from reservoir.config import ConfigError, parse_overrides
from reservoir.run.tables import format_table
from reservoir.run.train import Progress, WarmUp
from tests.conftest import ROOT, run_cli, run_script, run_then_sigkill, summary_of


def test_a_ladder_refuses_a_point_record_edited_after_its_run_wrote_it(tmp_path):
    args = ["BUDGETS=1e5,2e5", "MODELS=ngram", "SEEDS=1", "STUDY=ladder", "DATASET=synthetic",
            "SYNTHETIC_STORIES=300", "SEQ_LEN=32", f"RESULTS_DIR={tmp_path / 'results'}",
            f"CACHE_DIR={tmp_path / 'cache'}"]
    run_script("scaling.py", *args)
    point = tmp_path / "results" / "ladder" / "flops-1.00e05" / "summary.json"
    records = json.loads(point.read_text())
    records[0]["val_bpc"] = 1.0
    point.write_text(json.dumps(records))
    before = (tmp_path / "results" / "ladder" / "scaling.json").read_text()
    proc = run_script("scaling.py", *args, check=False)
    assert proc.returncode != 0 and "was edited after its run wrote it" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in proc.stderr
    assert (tmp_path / "results" / "ladder" / "scaling.json").read_text() == before  # 1.000 never reported


def _record(seed, status, bpc):
    return {"model": "lstm", "trained": "everything", "params_total": 5, "params_trainable": 5, "train_seconds": 1.0,
            "train_tokens": 100, "tokens_per_second": 100.0, "bound_by": "steps", "train_flops": 1e9, "epochs": 0.1,
            "seed": seed, "status": status, "val_bpc": bpc, "val_ppl": None if bpc is None else 2.0 ** (bpc * 20),
            "val_bpc_ci95": None if bpc is None else 0.065, "diverged_at_step": 7 if bpc is None else None,
            "reason": "the training loss is nan" if bpc is None else None}


def test_the_table_says_how_many_seeds_scored_what_its_spread_is_and_names_a_diverged_seed():
    table = format_table([_record(1, "finished", 4.585), _record(2, "diverged", None)])
    row = next(line for line in table.splitlines() if line.startswith("lstm "))
    assert " 1/2 " in row and "4.585 ± 0.065 ci" in row  # one seed's interval, said to be one
    assert "lstm: seed 2 diverged at step 7 (the training loss is nan)" in table
    assert "e+27" in row and "0000000" not in row  # 2^91.7: a power of ten, not 28 digits
    both = format_table([_record(1, "finished", 4.5), _record(2, "finished", 4.6)])
    assert " 2/2 " in both and "± 0.071 sd" in both and "diverged" not in both


def test_a_loss_far_above_guessing_uniformly_is_divergence_not_a_score(tmp_path):
    proc = run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=30", "LEARNING_RATE=50", "GRAD_CLIP=0", "RUN_NAME=d")
    record = summary_of(tmp_path / "results" / "d")["lstm"]
    assert record["status"] == "diverged" and record["val_bpc"] is None
    assert "of guessing uniformly" in record["reason"] and "DIVERGED" in proc.stdout


def test_gpu_check_looks_for_a_gpu_before_it_downloads(tmp_path):
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if shutil.which("nvidia-smi", path=bare["PATH"]):
        pytest.skip("this machine has nvidia-smi: the GPU check runs for real here")
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "bench", copy / "bench")
    import subprocess

    proc = subprocess.run(["bash", str(copy / "bench" / "gpu_check.sh"), str(tmp_path / "out")], env=bare,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: no CUDA GPU here (nvidia-smi finds none); bash bench/gpu_check.sh OUT_DIR --dry-run runs the "
        "CPU-safe parts"]
    assert not (copy / ".venv-gpu").exists()  # nothing installed, nothing downloaded


def test_a_prompt_with_characters_outside_the_vocabulary_is_warned_about(tmp_path):
    run_cli(tmp_path, "MODELS=ngram", "MAX_STEPS=2", "RUN_NAME=s")
    proc = run_script("sample.py", tmp_path / "results" / "s", "PROMPT=Once upon a tîme€", "MAX_NEW_TOKENS=5")
    warnings = [line for line in proc.stderr.splitlines() if "not in this run's vocabulary" in line]
    assert len(warnings) == 1 and "'î', '€'" in warnings[0] and "shown as '?'" in warnings[0]
    plain = run_script("sample.py", tmp_path / "results" / "s", "PROMPT=Once upon a time", "MAX_NEW_TOKENS=5")
    assert "vocabulary" not in plain.stderr


def test_a_batch_the_data_cannot_fill_is_refused_before_any_folder(tmp_path):
    proc = run_cli(tmp_path, "MODELS=ngram,lstm", "BATCH_SIZE=100000", "MAX_STEPS=2", check=False)
    assert proc.returncode != 0 and "fewer than one batch (100000)" in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip().splitlines()[-1]]  # one line, no note
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_a_block_value_that_may_be_zero_says_so():
    with pytest.raises(ConfigError, match=r"FROZEN_RETENTION.conv_width must be >= 0, got -1"):
        parse_overrides(["FROZEN_RETENTION.conv_width=-1"])
    with pytest.raises(ConfigError, match=r"FROZEN_RETENTION.width must be > 0"):
        parse_overrides(["FROZEN_RETENTION.width=0"])


def test_a_kill_during_the_final_evaluation_does_not_train_again(tmp_path):
    args = ["MODELS=transformer", "MAX_STEPS=20", "FINAL_EVAL_TOKENS=None", "EVAL_MODE=windows",
            "SYNTHETIC_STORIES=3000", "CHECKPOINT_EVERY=0", "CHECKPOINT_EVERY_S=0", "EVAL_POINTS=1"]

    def finished_checkpoint_but_no_final_evaluation(run_dir):
        path, metrics = run_dir / "checkpoints" / "transformer.pt", run_dir / "metrics.jsonl"
        try:
            done = path.exists() and torch.load(path, weights_only=True)["finished"]
            return done and not (metrics.exists() and '"final": true' in metrics.read_text())
        except Exception:  # caught mid-write: look again
            return False

    killed = run_then_sigkill(tmp_path, args, "k", finished_checkpoint_but_no_final_evaluation)
    assert not (killed / "summary.json").exists(), "the kill must land inside the final evaluation"
    resumed = run_cli(tmp_path, "RESUME=k", "SYNTHETIC_STORIES=3000")
    assert "finished in the checkpoint (seed 1337); evaluating it again" in resumed.stdout
    assert "resuming at step" not in resumed.stdout
    record = summary_of(killed)["transformer"]
    assert record["train_steps"] == 20 and record["val_bpc"] > 0
    finals = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["final"] for r in finals) == 1  # the final evaluation is logged once


def test_progress_lines_count_tokens_per_second_after_the_warm_up():
    from reservoir.run.train import Budget

    warm = WarmUp("m", 0, 2, Budget(10, None, None), main=False)
    assert warm.rate(Progress(step=1, tokens=256, seconds=0.0), 256) is None  # still warming up: no rate
    warm.step_done(2, 0.001)  # the warm-up's seconds are held off the clock, its tokens are not
    assert warm.rate(Progress(step=2, tokens=512, seconds=0.001), 256) is None
    assert warm.rate(Progress(step=3, tokens=768, seconds=0.011), 256) == pytest.approx(256 / 0.01)


def test_a_study_point_with_its_data_moved_keeps_the_same_study(tmp_path):
    """Where a study's data and folders are may change between machines; its grid and settings may not."""
    from reservoir.studies.frontier.grid import _placeless

    assert _placeless(["DATASET=/a/tinystories", "SEQ_LEN=128", "CACHE_DIR=x"]) == \
        _placeless(["DATASET=/b/tinystories", "SEQ_LEN=128", "CACHE_DIR=y"])
    assert _placeless(["SEQ_LEN=128"]) != _placeless(["SEQ_LEN=64"])


def _rewrite_config(run_dir, change, rehash: bool):
    from reservoir.run.records import INTEGRITY_KEY, _integrity

    path = run_dir / "config.json"
    content = json.loads(path.read_text())
    change(content)
    content.pop(INTEGRITY_KEY, None)
    if rehash:  # as someone who recomputes the hash would: the hash guards against accidents, not that
        content[INTEGRITY_KEY] = _integrity(content)
    path.write_text(json.dumps(content))


def test_deleting_the_integrity_key_does_not_switch_the_check_off_nor_fill_missing_keys(tmp_path):
    run_cli(tmp_path, "MODELS=transformer", "MAX_STEPS=4", "RUN_NAME=r")
    run_dir = tmp_path / "results" / "r"
    (run_dir / "summary.json").write_text("[]")  # as if interrupted after its last checkpoint
    pristine = (run_dir / "config.json").read_text()
    _rewrite_config(run_dir, lambda c: c["requested_config"].pop("MODELS"), rehash=False)
    proc = run_cli(tmp_path, "RESUME=r", check=False)
    assert proc.returncode != 0 and "has lost its integrity hash" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in proc.stderr
    (run_dir / "config.json").write_text(pristine)
    _rewrite_config(run_dir, lambda c: c["requested_config"].pop("MODELS"), rehash=True)
    proc = run_cli(tmp_path, "RESUME=r", check=False)
    assert proc.returncode != 0 and "it has no requested_config.MODELS" in proc.stderr
    assert not list((run_dir / "checkpoints").glob("lstm*"))  # today's default models were not trained into it
    assert json.loads((run_dir / "summary.json").read_text()) == []


def test_a_run_recorded_before_the_new_optimizer_keys_resumes_as_it_trained(tmp_path):
    from reservoir.config import ADDED_KEYS

    run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=4", "RUN_NAME=old")
    run_dir = tmp_path / "results" / "old"
    (run_dir / "summary.json").write_text("[]")
    added = [k for k in ADDED_KEYS if k not in ("FROZEN_RETENTION", "RESERVOIR_ATTENTION")]  # TINY names those
    _rewrite_config(run_dir, lambda c: [c["requested_config"].pop(k) for k in added], rehash=True)
    resumed = run_cli(tmp_path, "RESUME=old")
    assert "lstm: finished in the checkpoint" in resumed.stdout


def test_the_recorded_package_version_is_the_projects():
    import tomllib

    from reservoir import __version__
    from reservoir.run.writer import versions

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == __version__
    assert versions()["reservoir_nlp"] == __version__


def test_a_signal_while_a_finished_point_exits_is_143_and_the_point_counts_as_finished(tmp_path):
    """The point's process, killed by SIGTERM as it exits (Popen's -15), once made the study exit 241 and call
    the finished point stopped."""
    from reservoir.config import parse_overrides as parse
    from reservoir.studies.ladder import Study, StudyExit
    from reservoir.studies.runner import exit_status

    assert exit_status(-15) == 143 and exit_status(0) == 0 and exit_status(2) == 2
    study = Study.from_args({"BUDGETS": "1e5,2e5", "STUDY": "s"}, ["MODELS=ngram", "SEEDS=1", "DATASET=synthetic",
                            f"RESULTS_DIR={tmp_path}", f"CACHE_DIR={tmp_path / 'cache'}"], parse)

    def finishes_then_is_killed(args):
        run_cli(tmp_path, *[a for a in args if not a.startswith(("RESULTS_DIR", "RUN_NAME"))],
                f"RESULTS_DIR={study.path}", "RUN_NAME=flops-1.00e05", settings=[])
        return -15

    with pytest.raises(StudyExit) as stopped:
        study.run(finishes_then_is_killed)
    assert stopped.value.code == 143 and "finished as the study was stopped" in str(stopped.value)
    assert study.finished(1e5)


def test_a_finished_model_evaluated_again_on_resume_logs_its_final_evaluation_once(tmp_path):
    """Killed after the final evaluation was logged (while sampling): RESUME evaluates again, logs nothing twice."""
    run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=4", "RUN_NAME=f")
    run_dir = tmp_path / "results" / "f"
    (run_dir / "summary.json").write_text("[]")
    resumed = run_cli(tmp_path, "RESUME=f")
    assert "finished in the checkpoint" in resumed.stdout
    finals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum(bool(r["final"]) for r in finals) == 1
