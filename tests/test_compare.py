"""compare.py: a paired comparison of two trained models, re-scored from their run folders."""

import json
import os
from pathlib import Path

import pytest

from tests.conftest import run_cli, run_script, summary_of


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """Two runs on the same data: an LSTM with two seeds, and an n-gram."""
    tmp = tmp_path_factory.mktemp("compare")
    run_cli(tmp, "MODELS=['lstm']", "SEEDS=[1337,1338]", "MAX_STEPS=20", "RUN_NAME=rnn",
            "FINAL_EVAL_TOKENS=4096")
    run_cli(tmp, "MODELS=['ngram','esn']", "MAX_STEPS=20", "RUN_NAME=counts", "FINAL_EVAL_TOKENS=4096")
    return tmp / "results"


def compare(*args, check=True):
    return run_script("compare.py", *args, check=check)


def test_rescored_models_match_their_runs_and_the_difference_is_paired(runs, tmp_path):
    out = tmp_path / "report.json"
    proc = compare(f"{runs / 'rnn'}:lstm", f"{runs / 'counts'}:ngram", f"OUT={out}")
    report = json.loads(out.read_text())
    lstm = [r for r in json.loads((runs / "rnn" / "summary.json").read_text()) if r["model"] == "lstm"]
    assert report["a"]["seeds"] == [1337, 1338] and report["eval_tokens"] == 4096
    assert report["a"]["bpc_per_seed"] == pytest.approx([r["val_bpc"] for r in lstm], abs=1e-5)
    assert report["b"]["bpc_per_seed"] == pytest.approx([summary_of(runs / "counts")["ngram"]["val_bpc"]], abs=1e-6)
    difference = report["a"]["bpc"] - report["b"]["bpc"]
    assert report["bpc_difference"] == pytest.approx(difference, abs=1e-9)
    assert report["ci95_low"] <= report["bpc_difference"] <= report["ci95_high"]
    assert f"A - B = {report['bpc_difference']:+.4f}" in proc.stdout


def test_a_study_s_comparison_names_its_runs_from_the_study_s_folder(runs, monkeypatch, tmp_path):
    """A study run with RESULTS_DIR=/work/ts-results committed comparisons naming /work/ts-results/... (and one
    run from ../study, ../study/...): a comparison a study commits names its runs from the study's folder."""
    from reservoir.studies.comparison import Side
    from reservoir.studies.comparison import compare as paired

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)  # the runs given relative to another working folder, and absolute
    sides = Side([Path(os.path.relpath(runs / "rnn"))], "lstm"), Side([runs / "counts"], "ngram")
    report = paired(*sides, relative_to=runs)
    assert report["a"]["runs"] == ["rnn", "rnn"] and report["b"]["runs"] == ["counts"]
    assert paired(*sides)["b"]["runs"] == [str(runs / "counts")]  # compare.py's own: as given


def test_a_model_against_itself_is_refused_and_the_default_side_is_the_best(runs):
    same = compare(runs / "counts", f"{runs / 'counts'}:ngram", check=False)  # 'counts' alone: its best, the n-gram
    assert same.returncode != 0 and "A and B are the same trained model" in same.stderr
    assert len(same.stderr.strip().splitlines()) == 1 and "Traceback" not in same.stderr
    compare(runs / "counts", f"{runs / 'rnn'}:lstm")
    assert (runs / "counts" / "comparisons" / "ngram-vs-rnn-lstm.json").exists()


def test_a_transformer_plus_plus_point_is_one_folder_and_a_records_only_point_says_so(runs, tmp_path):
    point = tmp_path / "study" / "transformer++-xs-lr0.004-b8" / "flops-3e9"  # a frontier point's folder name
    import shutil

    shutil.copytree(runs / "rnn", point)
    compare(f"{point}:lstm", f"{runs / 'counts'}:ngram", f"OUT={tmp_path / 'r.json'}")
    assert json.loads((tmp_path / "r.json").read_text())["a"]["seeds"] == [1337, 1338]
    for checkpoint in (point / "checkpoints").glob("*.pt"):  # as a clone holds it: records, no checkpoints
        checkpoint.unlink()
    proc = compare(f"{point}:lstm", f"{runs / 'counts'}:ngram", check=False)
    assert proc.returncode != 0 and "is not in this copy" in proc.stderr and "never committed" in proc.stderr
    assert "has not reached a checkpoint" not in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["{runs}/rnn:transformer", "{runs}/counts"], "'transformer' is not a model of"),
    (["{runs}/nowhere", "{runs}/counts"], "is not a folder"),
    (["{runs}/rnn"], "give two sides"),
    (["{runs}/rnn", "{runs}/counts", "TOKENS=-3"], "TOKENS must be a positive integer"),
    (["{runs}/rnn", "{runs}/counts", "SEED=1"], "is not one of TOKENS"),
])
def test_bad_input_is_one_line(runs, args, message):
    proc = compare(*(a.format(runs=runs) for a in args), check=False)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr


def test_runs_on_other_data_are_refused(runs, tmp_path):
    run_cli(tmp_path, "MODELS=['ngram']", "MAX_STEPS=20", "RUN_NAME=other", "SYNTHETIC_STORIES=200")
    proc = compare(f"{runs / 'counts'}:ngram", tmp_path / "results" / "other", check=False)
    assert proc.returncode != 0 and "not evaluated on the same text" in proc.stderr


def test_seeds_of_several_runs_are_pooled_and_a_shared_seed_is_refused(runs, tmp_path):
    out = tmp_path / "pooled.json"
    run_cli(tmp_path, "MODELS=['lstm']", "SEEDS=[7]", "MAX_STEPS=20", "RUN_NAME=more",
            "FINAL_EVAL_TOKENS=4096")
    more = tmp_path / "results" / "more"
    compare(f"{runs / 'rnn'}+{more}:lstm", f"{runs / 'counts'}:ngram", f"OUT={out}")
    report = json.loads(out.read_text())
    assert report["a"]["seeds"] == [1337, 1338, 7] and len(report["a"]["bpc_per_seed"]) == 3
    assert report["a"]["bpc"] == pytest.approx(sum(report["a"]["bpc_per_seed"]) / 3, rel=1e-12)
    single = runs / "rnn" / "comparisons" / "lstm-vs-counts-ngram.json"
    compare(f"{runs / 'rnn'}:lstm", f"{runs / 'counts'}:ngram")
    compare(f"{runs / 'rnn'}+{more}:lstm", f"{runs / 'counts'}:ngram")  # the default report: pooled runs named
    pooled = runs / "rnn" / "comparisons" / "lstm+more-vs-counts-ngram.json"
    assert json.loads(single.read_text())["a"]["seeds"] == [1337, 1338]  # not overwritten by the pooled one
    assert json.loads(pooled.read_text())["a"]["seeds"] == [1337, 1338, 7]
    shared = compare(f"{runs / 'rnn'}+{runs / 'rnn'}:lstm", f"{runs / 'counts'}:ngram", check=False)
    assert shared.returncode != 0 and "share a training seed" in shared.stderr
    missing = compare(f"{runs / 'rnn'}+{runs / 'counts'}:lstm", f"{runs / 'counts'}:ngram", check=False)
    assert missing.returncode != 0 and "'lstm' is not a model of" in missing.stderr


def test_diagnostics_split_the_paired_difference_by_position_and_recall(runs, tmp_path):
    out = tmp_path / "diag.json"
    proc = compare(f"{runs / 'rnn'}:lstm", f"{runs / 'counts'}:ngram", f"OUT={out}", "DIAGNOSTICS=True")
    report = json.loads(out.read_text())
    rows = {r["split"]: r for r in report["diagnostics"]["rows"]}
    positions = [r for name, r in rows.items() if name.startswith("position")]
    assert sum(r["targets"] for r in positions) == report["eval_tokens"]  # the buckets cover every target once
    for k in (4, 6, 8):
        recall, rest = rows[f"recall k={k}"], rows[f"no recall k={k}"]
        assert recall["targets"] + rest["targets"] == report["eval_tokens"] and recall["targets"] > 0
        assert recall["ci95_low"] <= recall["bpc_difference"] <= recall["ci95_high"]
        # the two halves' differences, weighted by their characters, add up to the whole difference
        whole = recall["bpc_difference"] * recall["targets"] + rest["bpc_difference"] * rest["targets"]
        assert whole / report["eval_tokens"] == pytest.approx(report["bpc_difference"], abs=1e-9)
    assert rows["recall k=8"]["targets"] <= rows["recall k=4"]["targets"]  # a longer match is rarer
    assert "recall k=6" in proc.stdout and out.with_suffix(".png").stat().st_size > 5000
    bad = compare(f"{runs / 'rnn'}:lstm", f"{runs / 'counts'}:ngram", "DIAGNOSTICS=maybe", check=False)
    assert bad.returncode != 0 and "DIAGNOSTICS must be True or False" in bad.stderr
