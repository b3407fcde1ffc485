"""The budget ladder (scaling.py, reservoir/studies/ladder.py) and Tiny Shakespeare (DATASET=shakespeare)."""

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from reservoir.config import ConfigError, parse_overrides, split_arguments
from reservoir.data.corpus import DataError, load_corpus
from reservoir.studies.budgets import StudyError, parse_budgets, point_name
from reservoir.studies.curves import crossovers, curve, fit_curve, gap_slope
from reservoir.studies.ladder import STUDY_KEYS, Study, build_report
from tests.conftest import NO_TEXT, ROOT, SHAKESPEARE_TEXT, TINY, run_cli, run_script, tracked

SHAKESPEARE = SHAKESPEARE_TEXT
needs_shakespeare = pytest.mark.skipif(not SHAKESPEARE.is_file(), reason=NO_TEXT)


def play(path: Path, speeches: int = 400) -> Path:
    """A small play-like text in Tiny Shakespeare's layout: speaker lines, verse, blank lines."""
    rng = np.random.default_rng(0)
    names = ["FIRST CITIZEN", "MENENIUS", "ROMEO", "JULIET"]
    words = "the of my lord thou art good and sweet night".split()
    parts = [f"{names[rng.integers(4)]}:\n" + "\n".join(" ".join(rng.choice(words, 6)).capitalize() + ","
                                                      for _ in range(rng.integers(1, 4))) for _ in range(speeches)]
    path.write_text("\n\n".join(parts) + "\n", encoding="utf-8")
    return path


# --------------------------------------------------------------------- the ladder's settings


@pytest.mark.parametrize("value, message", [("1e12", "at least two"), ("2e12,1e12", "increase strictly"),
                                            ("1e12,1e12", "increase strictly"), ("1e12,x", "positive numbers"),
                                            ("-1,1e12", "positive numbers"), ("", "at least two")])
def test_bad_ladders_are_one_line_errors(value, message):
    with pytest.raises(StudyError, match=message):
        parse_budgets(value)


def test_a_ladder_reads_as_typed():
    assert parse_budgets("1e12, 2e12,4e12") == [1e12, 2e12, 4e12] == parse_budgets("[1e12,2e12,4e12]")
    assert point_name(2.5e12) == "flops-2.50e12"


def test_a_study_refuses_what_it_sets_itself_and_checks_settings_before_running(tmp_path):
    for arg in ("FLOP_BUDGET=1e9", "run_name=x", "RESUME=latest"):
        with pytest.raises(StudyError, match="set by the study"):
            Study.from_args(*split_arguments([arg], STUDY_KEYS))
    with pytest.raises(ConfigError, match="unknown model"):
        Study.from_args(*split_arguments(["MODELS=esn,transfromer"], STUDY_KEYS))
    study = Study.from_args(*split_arguments([f"RESULTS_DIR={tmp_path}", "STUDY=s", "BUDGETS=1e9,2e9"], STUDY_KEYS))
    assert study.path == tmp_path / "s" and study.config["SEEDS"] == [1337, 1338]
    assert study.config["TIME_BUDGET_S"] is None and "ngram" in study.config["MODELS"]
    assert f"RUN_NAME={point_name(1e9)}" in study.point_args(1e9)


def test_an_empty_study_name_and_hosts_without_a_plan_are_one_line_each(tmp_path):
    """STUDY= fell back to the default study, HOSTS without PLAN=True was dropped: both silently."""
    from reservoir.studies.frontier.grid import FrontierError
    from reservoir.studies.frontier.study import FrontierStudy

    with pytest.raises(StudyError, match="STUDY= names no folder: give one .* leave STUDY out for 'scaling'"):
        Study.from_args({"STUDY": ""}, [f"RESULTS_DIR={tmp_path}"])
    with pytest.raises(FrontierError, match="STUDY= names no folder: give one .* leave STUDY out for 'frontier'"):
        FrontierStudy.from_args({"STUDY": " ", "FAMILIES": "lstm"}, [f"RESULTS_DIR={tmp_path}"])
    with pytest.raises(StudyError, match="STUDY must be a plain folder name, got '../elsewhere'"):
        Study.from_args({"STUDY": "../elsewhere"}, [f"RESULTS_DIR={tmp_path}"])
    proc = run_script("scaling.py", "FRONTIER=True", "HOSTS=4", f"RESULTS_DIR={tmp_path}", check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("error: HOSTS prices a study") and "PLAN=True" in proc.stderr
    assert "Traceback" not in proc.stderr and list(tmp_path.iterdir()) == []


# --------------------------------------------------------------------- the fit


def test_the_same_points_are_fitted_once_and_each_caller_gets_a_fit_of_its_own(monkeypatch):
    """A study's reports fitted each family's points several times over (a tenth of a second each, 12 of a
    TinyStories plan's 25 s): each set of numbers is fitted once in a process, and a caller that changes its
    fit does not change the next caller's."""
    from reservoir.studies import curves

    solved = []
    best_alpha = curves._best_alpha
    monkeypatch.setattr(curves, "_best_alpha", lambda *a: solved.append(1) or best_alpha(*a))
    compute, bpc = [1.1e12, 2.3e12, 4.7e12, 9.1e12], [2.31, 2.17, 2.08, 2.03]  # numbers no other test fits
    first = fit_curve(compute, bpc, 1.1e12)
    first["E"], first["residuals"][0] = -1.0, -1.0
    again = fit_curve(list(compute), tuple(bpc), 1.1e12)
    assert len(solved) == 1 and again["converged"] and again["E"] > 0 and again["residuals"][0] != -1.0
    assert fit_curve([*compute[:3], 9.2e12], bpc, 1.1e12)["E"] != again["E"] and len(solved) == 2
    points = [(1e12, [2.5, 2.52], [2.4, 2.41]), (2e12, [2.3, 2.33], [2.25, 2.24]), (4e12, [2.2, 2.18], [2.1, 2.12])]
    slope = gap_slope(points)
    slope["slope_per_decade"], slope["gaps"][0] = None, None
    assert gap_slope(points)["slope_per_decade"] is not None and gap_slope(points)["gaps"][0] is not None


def test_the_fit_recovers_a_known_curve_and_its_crossover():
    compute = np.geomspace(1e12, 1.6e13, 5).repeat(2)
    rng = np.random.default_rng(1)
    bpc = curve(compute, 1.2, 0.8, 0.35, 1e12) + rng.normal(0, 0.002, len(compute))
    fit = fit_curve(list(compute), list(bpc), 1e12)
    assert fit["converged"] and fit["points"] == 10
    assert fit["E"] == pytest.approx(1.2, abs=0.05) and fit["alpha"] == pytest.approx(0.35, abs=0.05)
    assert fit["alpha_se"] is not None and fit["rms_residual"] < 0.005 and len(fit["residuals"]) == 10
    flat = {"converged": True, "E": 1.5, "A": 0.0, "alpha": 0.1, "C0": 1e12}
    cross = crossovers({"steep": fit, "flat": flat}, 1e12, 1.6e13)
    expected = 1e12 * (0.8 / (1.5 - 1.2)) ** (1 / 0.35)  # where 1.2 + 0.8 (C/C0)^-0.35 = 1.5
    assert len(cross) == 1 and cross[0]["better_above"] == "steep"
    assert cross[0]["budget"] == pytest.approx(expected, rel=0.1)


REFIT_COMMITTED = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("curves", sys.argv[1])
curves = importlib.util.module_from_spec(spec)
spec.loader.exec_module(curves)
out = {}
for path in sys.argv[2:]:
    report = json.load(open(path))
    fits = {f: curves.fit_curve([p["budget"] for p in points], [p["bpc_mean"] for p in points], report["budgets"][0])
            for f, points in report["envelope"].items() if points}
    out[path] = {"fits": fits, "crossovers": curves.crossovers(fits, report["budgets"][0], report["budgets"][-1])}
    growth, at = report["gap_growth"], {f: {p["budget"]: p for p in points} for f, points in report["envelope"].items()}
    reference = at[growth["reference"]]
    out[path]["gap_growth"] = curves.gap_slope([(b, at[f][b]["bpc_per_seed"], reference[b]["bpc_per_seed"])
                                                for b, f in zip(growth["budgets"], growth["families"])])
print(json.dumps(out, sort_keys=True))
"""


def test_a_fit_is_the_same_on_every_machine_byte_for_byte():
    """A report regenerated anywhere must be byte-identical: the committed studies' fits come out as committed
    under numpy's other SIMD dispatches (AVX-512's targets removed, or every target beyond the baseline) and
    other BLAS kernels, as an AVX2, an AVX-512 or an older host would compute them."""
    try:
        from numpy._core._multiarray_umath import __cpu_dispatch__ as targets
    except ImportError:  # numpy 1.x
        from numpy.core._multiarray_umath import __cpu_dispatch__ as targets
    avx512 = [t for t in targets if "512" in t or t == "X86_V4"]
    variants = [{}, {"NPY_DISABLE_CPU_FEATURES": " ".join(avx512), "OPENBLAS_CORETYPE": "Haswell"},
                {"NPY_DISABLE_CPU_FEATURES": " ".join(targets), "OPENBLAS_CORETYPE": "Prescott",
                 "MKL_CBWR": "COMPATIBLE"}]
    studies = [p for p in tracked("results") if p.name == "frontier.json" and p.parent.name.startswith("frontier-")
               and p.parent.parent == ROOT / "results"]  # the finished studies (a growing one lies under growing/)
    assert len(studies) == 2
    outputs = [subprocess.run([sys.executable, "-c", REFIT_COMMITTED, str(ROOT / "reservoir/studies/curves.py"),
                               *map(str, studies)], env={**os.environ, **variant}, capture_output=True, text=True,
                              check=True).stdout for variant in variants]
    assert outputs[1] == outputs[0] and outputs[2] == outputs[0]
    refitted = json.loads(outputs[0])
    for path in studies:
        committed = json.loads(path.read_text())
        assert refitted[str(path)]["fits"] == committed["fits"], path.parent.name
        assert {**committed["gap_growth"], **refitted[str(path)]["gap_growth"]} == committed["gap_growth"]


def test_a_fit_recovers_the_least_squares_optimum_within_its_bounds():
    """The fit is the least-squares curve: nudging any parameter makes the squared error larger; and a curve
    whose data want α past its bound stops at the bound."""
    compute = list(np.geomspace(1e12, 1.6e13, 6))
    bpc = list(curve(np.asarray(compute), 1.2, 0.8, 0.35, 1e12) + np.array([2e-3, -1e-3, 0, 1e-3, -2e-3, 1e-3]))
    fit = fit_curve(compute, bpc, 1e12)

    def sse(e, a, alpha):
        return float(np.sum((np.asarray(bpc) - curve(compute, e, a, alpha, 1e12)) ** 2))

    best = sse(fit["E"], fit["A"], fit["alpha"])
    assert best == pytest.approx(fit["rms_residual"] ** 2 * 6, rel=1e-4)
    for k, step in ((0, 1e-3), (1, 1e-3), (2, 1e-3)):
        for sign in (1, -1):
            moved = [fit["E"], fit["A"], fit["alpha"]]
            moved[k] += sign * step
            assert sse(*moved) > best
    assert fit["E_se"] > 0 and fit["A_se"] > 0 and fit["alpha_se"] > 0
    steep = fit_curve(compute[:4], [3.0, 1.0, 1.0, 1.0], 1e12)  # a cliff after the first budget
    assert steep["converged"] and steep["alpha"] == 5.0 and steep["A"] > 1.9  # at α's bound, not past it
    exact = fit_curve(compute[:3], bpc[:3], 1e12)  # as many points as parameters: no standard errors
    assert exact["converged"] and exact["E_se"] is None and exact["rms_residual"] < 1e-6


def test_a_fit_that_cannot_be_made_says_why():
    assert fit_curve([1e12, 2e12], [2.0, 1.9], 1e12) == {"converged": False,
                                                         "reason": "fewer than 3 compute-bound budgets"}
    records = [{"model": "esn", "budget": b, "seed": s, "val_bpc": 2.9, "train_flops": 1e9, "train_tokens": 10,
                "epochs": 1.0, "train_seconds": 1.0, "params_trained": 5, "params_total": 9, "bound_by": "data"}
               for b in (1e12, 2e12) for s in (1, 2)]
    report = build_report(records, [1e12, 2e12], ["esn"], {})
    assert report["references"]["esn"]["bpc"] == 2.9 and "esn" not in report["fits"]  # data-bound: a reference


# --------------------------------------------------------------------- Tiny Shakespeare


def test_shakespeare_splits_its_one_file_ninety_ten_by_characters(tmp_path):
    text = play(tmp_path / "input.txt").read_text(encoding="utf-8")
    corpus = load_corpus(parse_overrides(["DATASET=shakespeare", f"DATA_DIR={tmp_path}"]))
    (train,), (val,) = list(corpus.train), list(corpus.val)
    cut = int(len(text) * 0.9)
    assert train == text[:cut] and val == text[cut:] and corpus.source == "shakespeare"
    assert load_corpus(parse_overrides(["DATASET=shakespeare", f"TRAIN_PATH={tmp_path / 'input.txt'}"])).source \
        == "shakespeare"
    with pytest.raises(DataError, match="needs Tiny Shakespeare's input.txt"):
        load_corpus(parse_overrides(["DATASET=shakespeare", f"DATA_DIR={tmp_path / 'nowhere'}"]))
    with pytest.raises(DataError, match="VAL_PATH does not apply"):
        load_corpus(parse_overrides(["DATASET=shakespeare", f"DATA_DIR={tmp_path}", f"VAL_PATH={tmp_path}"]))


@needs_shakespeare
def test_the_real_tiny_shakespeare_has_the_published_split():
    corpus = load_corpus(parse_overrides(["DATASET=shakespeare", f"TRAIN_PATH={SHAKESPEARE}"]))
    (train,), (val,) = list(corpus.train), list(corpus.val)
    assert len(train) + len(val) == 1_115_394 and len(train) == 1_003_854  # nanoGPT's shakespeare_char split
    assert len(set(train + val)) == 65


# --------------------------------------------------------------------- a study end to end


def study_command(tmp_path, *args) -> list[str]:
    """scaling.py on the play in ``tmp_path`` with tiny models; ``args`` override the settings here."""
    return [sys.executable, str(ROOT / "scaling.py"),
            *[a for a in TINY if not a.startswith(("DATASET", "FLOP_BUDGET"))], "DATASET=shakespeare",
            f"DATA_DIR={tmp_path}", "MODELS=ngram,esn,lstm", "SEEDS=1,2", "BUDGETS=3e8,6e8,1.2e9", "EVAL_POINTS=2",
            "FINAL_EVAL_TOKENS=4096", "SAMPLE_TOKENS=5", f"RESULTS_DIR={tmp_path / 'results'}",
            f"CACHE_DIR={tmp_path / 'cache'}", "STUDY=ladder", *args]


def run_study(tmp_path, *args, check=True):
    return run_script(*study_command(tmp_path, *args)[1:], check=check, timeout=600)


def test_a_study_trains_the_ladder_fits_it_and_continues_where_it_stopped(tmp_path):
    play(tmp_path / "input.txt")
    folder = tmp_path / "results" / "ladder"
    first = run_study(tmp_path, "BUDGETS=3e8,6e8")  # two points of the three, as a killed study leaves them
    assert "study ladder" in first.stdout
    stamp = (folder / point_name(3e8) / "summary.json").stat().st_mtime_ns
    proc = run_study(tmp_path)
    assert proc.stdout.count("finished, skipped") == 2 and "point 3/3" in proc.stdout
    assert (folder / point_name(3e8) / "summary.json").stat().st_mtime_ns == stamp
    report = json.loads((folder / "scaling.json").read_text())
    assert report["budgets"] == [3e8, 6e8, 1.2e9] and (folder / "scaling.png").stat().st_size > 10_000
    lstm = report["points"]["lstm"]
    assert [r["budget"] for r in lstm] == [3e8, 6e8, 1.2e9] and all(r["seeds"] == 2 for r in lstm)
    assert all(r["bound_by"] == ["flops"] and r["train_flops"] >= r["budget"] for r in lstm)
    assert lstm[0]["bpc_mean"] > lstm[-1]["bpc_mean"] and lstm[0]["bpc_sd"] is not None
    assert report["references"]["ngram"]["bpc"] > 0  # counts end on the data at every budget
    assert "lstm" in report["fits"] and ("E" in report["fits"]["lstm"] or "reason" in report["fits"]["lstm"])
    config = json.loads((folder / point_name(1.2e9) / "config.json").read_text())
    assert config["effective_config"]["FLOP_BUDGET"] == 1.2e9 and config["data"]["data_source"] == "shakespeare"
    assert "lstm" in proc.stdout and "1.20e+09" in proc.stdout


def test_a_budget_below_one_step_stops_the_study_in_one_line(tmp_path):
    play(tmp_path / "input.txt")
    proc = run_study(tmp_path, "MODELS=lstm", "SEEDS=1", "BUDGETS=1e3,2e3", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "BUDGETS: the smallest, 1e+03 FLOPs, does not cover one training step of lstm" in proc.stderr
    assert "raise BUDGETS" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1  # before any point
    assert not (tmp_path / "results" / "ladder").exists()


@pytest.mark.slow  # CI runs it apart (pytest -m slow); the README's command leaves it out
def test_sigterm_to_a_study_checkpoints_the_point_and_the_same_command_resumes_it(tmp_path):
    play(tmp_path / "input.txt", speeches=1500)
    args = ["MODELS=lstm", "SEEDS=1", "BUDGETS=1e10,2e10", "CHECKPOINT_EVERY=5"]
    proc = subprocess.Popen(study_command(tmp_path, *args), cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    checkpoint = tmp_path / "results" / "ladder" / point_name(1e10) / "checkpoints" / "lstm.pt"
    deadline = time.time() + 300
    while time.time() < deadline and not checkpoint.exists():
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 128 + signal.SIGTERM and "study stopped" in err and "Traceback" not in err, err
    changed = run_study(tmp_path, *args, "SAMPLE_TOKENS=6", check=False)  # not the same study: refused, kept
    assert changed.returncode != 0 and "SAMPLE_TOKENS differ from the saved run" in changed.stderr
    assert checkpoint.exists() and "study stopped" in changed.stderr and "Traceback" not in changed.stderr
    resumed = run_study(tmp_path, *args)
    assert "resuming at step" in resumed.stdout
    report = json.loads((tmp_path / "results" / "ladder" / "scaling.json").read_text())
    assert all(math.isfinite(r["bpc_mean"]) for r in report["points"]["lstm"])


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


def test_a_study_point_with_its_data_moved_keeps_the_same_study(tmp_path):
    """Where a study's data and folders are may change between machines; its grid and settings may not."""
    from reservoir.studies.frontier.grid import _placeless

    assert _placeless(["DATASET=/a/tinystories", "SEQ_LEN=128", "CACHE_DIR=x"]) == \
        _placeless(["DATASET=/b/tinystories", "SEQ_LEN=128", "CACHE_DIR=y"])
    assert _placeless(["SEQ_LEN=128"]) != _placeless(["SEQ_LEN=64"])


def test_a_signal_while_a_finished_point_exits_is_143_and_the_point_counts_as_finished(tmp_path):
    """The point's process, killed by SIGTERM as it exits (Popen's -15), once made the study exit 241 and call
    the finished point stopped."""
    from reservoir.studies.ladder import Study, StudyExit
    from reservoir.studies.runner import exit_status

    assert exit_status(-15) == 143 and exit_status(0) == 0 and exit_status(2) == 2
    study = Study.from_args({"BUDGETS": "1e5,2e5", "STUDY": "s"}, ["MODELS=ngram", "SEEDS=1", "DATASET=synthetic",
                            f"RESULTS_DIR={tmp_path}", f"CACHE_DIR={tmp_path / 'cache'}"])

    def finishes_then_is_killed(args):
        run_cli(tmp_path, *[a for a in args if not a.startswith(("RESULTS_DIR", "RUN_NAME"))],
                f"RESULTS_DIR={study.path}", "RUN_NAME=flops-1.00e05", settings=[])
        return -15

    with pytest.raises(StudyExit) as stopped:
        study.run(finishes_then_is_killed)
    assert stopped.value.code == 143 and "finished as the study was stopped" in str(stopped.value)
    assert study.finished(1e5)


def test_a_gaps_slope_against_compute_has_an_interval_over_seeds_and_one_over_budgets():
    budgets = [1e11 * 10 ** (k / 2) for k in range(5)]  # two decades
    reference = [[1.50, 1.501, 1.499]] * 5
    growing = [(c, [v * math.exp(0.05 * k / 2) for v in reference[k]], reference[k]) for k, c in enumerate(budgets)]
    growth = gap_slope(growing)  # ln ratio 0.05 a decade, exactly, seeds alike on both sides
    assert growth["slope_per_decade"] == pytest.approx(0.05, abs=1e-6)
    assert growth["ci95_residuals"] == pytest.approx([0.05, 0.05], abs=1e-6)  # on the line: no scatter
    assert 0.04 < growth["ci95_seeds"][0] < 0.05 < growth["ci95_seeds"][1] < 0.06
    zigzag = [(c, [v * math.exp(0.04 * (k % 2) + 0.002 * k) for v in reference[k]], reference[k])
              for k, c in enumerate(budgets)]
    growth = gap_slope(zigzag)  # a small rise under a large zigzag: seeds cannot explain it, the scatter can
    assert growth["ci95_seeds"][0] > 0 > growth["ci95_residuals"][0]
    assert gap_slope(growing[:2]) is None  # a line through two budgets has no interval
    assert gap_slope(growing) == gap_slope(list(growing))  # fixed draws: the same numbers every time


def test_a_gap_s_bootstrap_draws_nothing_from_numpy_s_generator(monkeypatch):
    """numpy keeps a Generator's methods the same only within one build (its compatibility policy): another numpy
    may draw other indices, and move a committed interval. The draws come from Python's random(), whose stream
    Python keeps across versions."""
    budgets = [1e11 * 10 ** (k / 2) for k in range(4)]
    points = [(c, [1.6 + 0.01 * k, 1.61, 1.59], [1.5, 1.501, 1.499]) for k, c in enumerate(budgets)]
    expected = gap_slope(points)

    def another_numpy(*args, **kwargs):
        raise AssertionError("the bootstrap drew from numpy's Generator")

    monkeypatch.setattr(np.random, "default_rng", another_numpy)
    monkeypatch.setattr(np.random, "Generator", another_numpy)
    assert gap_slope(points) == expected and expected["ci95_seeds"][0] < expected["ci95_seeds"][1]
