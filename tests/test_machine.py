"""What depends on the machine, tried as another machine: the facts the machine layer reports (and their
pretended values, RESERVOIR_PRETEND_*), and a finished study that stays finished on a processor no record names."""

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from reservoir.platform.machine import MachineError, instruction_set, processor, usable_cores
from tests.conftest import ROOT, TINY, run_cli, run_script
from tests.test_study_records import _documented_study_command, _study_from

ELSEWHERE = "AMD EPYC 7B13 (a processor no record names)"
COMMITTED = [("README.md", "frontier-tinystories"), ("docs/configuration.md", "frontier-shakespeare")]


PRETENDED = ("RESERVOIR_PRETEND_PROCESSOR", "RESERVOIR_PRETEND_ISA", "RESERVOIR_PRETEND_CORES")


def test_what_the_machine_reports_may_be_pretended(monkeypatch):
    for name in PRETENDED:  # a suite run as another machine: this test starts from this one
        monkeypatch.delenv(name, raising=False)
    real = processor(), instruction_set(), usable_cores()
    monkeypatch.setenv("RESERVOIR_PRETEND_PROCESSOR", ELSEWHERE)
    monkeypatch.setenv("RESERVOIR_PRETEND_ISA", "AVX2")
    monkeypatch.setenv("RESERVOIR_PRETEND_CORES", "7")
    assert (processor(), instruction_set(), usable_cores()) == (ELSEWHERE, "AVX2", 7)
    for cores in ("0", "two", "-1"):
        monkeypatch.setenv("RESERVOIR_PRETEND_CORES", cores)
        with pytest.raises(MachineError, match="give a whole number of cores"):
            usable_cores()
    monkeypatch.setenv("RESERVOIR_PRETEND_PROCESSOR", " ")
    with pytest.raises(MachineError, match="RESERVOIR_PRETEND_PROCESSOR is set but empty"):
        processor()
    for name in PRETENDED:
        monkeypatch.delenv(name)
    assert (processor(), instruction_set(), usable_cores()) == real


def test_a_run_records_the_processor_and_instruction_set_it_reports(tmp_path):
    run_cli(tmp_path, "MODELS=['ngram']", "MAX_STEPS=1", "RUN_NAME=r",
            env={"RESERVOIR_PRETEND_PROCESSOR": ELSEWHERE, "RESERVOIR_PRETEND_ISA": "AVX2"})
    device = json.loads((tmp_path / "results" / "r" / "config.json").read_text())["device"]
    assert (device["processor"], device["isa"]) == (ELSEWHERE, "AVX2")


def _committed_study(tmp_path, page, name):
    shutil.copytree(ROOT / "results" / name, tmp_path / name)
    return _study_from(_documented_study_command(page, name), tmp_path)[2]()


def _nothing_may_train(jobs, *args, **kwargs):
    raise AssertionError(f"a finished study trained {len(jobs)} points: {[str(f) for f, _ in jobs][:3]}")


def _no_measure(cell):
    raise AssertionError(f"a finished walk measured {cell.name}: it had a step to train")


@pytest.mark.parametrize("page, name", COMMITTED)
def test_a_walk_its_records_end_is_finished_on_a_processor_no_record_names(tmp_path, monkeypatch, capsys, page, name):
    """On a host whose processor no record named (an AMD EPYC), the committed studies' own commands trained 9 and 6
    points beside their ended walks again ("a point recorded on another processor is trained again"), each one
    minutes to hours on one thread, and CI's quick suite with them."""
    monkeypatch.setenv("RESERVOIR_PRETEND_PROCESSOR", ELSEWHERE)
    study = _committed_study(tmp_path, page, name)
    walks = study.edge_walks()
    assert walks and all(w["next"] is None for w in walks)
    study._run_edges(_nothing_may_train, _no_measure)
    said = capsys.readouterr().out
    assert f"{len(walks)} of {len(walks)} walks ended in the records, kept as they are on any machine" in said
    assert "steps beyond to train" not in said


def test_an_open_walk_sets_its_next_step_against_a_score_of_this_processor(tmp_path, monkeypatch):
    """While a walk is open, a step and the point it is set against share a processor: where the point's record
    names another, the point is trained again beside its steps; where it names this one, the step alone trains."""
    from reservoir.studies.frontier.edges import edge_folder, parse_cell
    from reservoir.studies.frontier.records import processor_of

    study = _committed_study(tmp_path, *COMMITTED[0])
    walk = next(w for w in study.edge_walks() if not w["trained_beside"] and w["steps"])
    point, step = parse_cell(walk["cell"]), parse_cell(walk["steps"][0]["cell"])
    step_key = study.store.key(edge_folder(study.path, step, walk["budget"]))
    del study.store.packed()["points"][step_key]  # the step not recorded yet: the walk is open
    walks = study.edge_walks()
    opened = next(w for w in walks if (w["cell"], w["budget"], w["axis"], w["direction"]) ==
                  (walk["cell"], walk["budget"], walk["axis"], walk["direction"]))
    assert opened["next"] == step and sum(w["next"] is not None for w in walks) == 1
    recorded_on = processor_of(study.store.config(study.folder(point, walk["budget"])))

    def measure(cell):  # a step cost that leaves every step trainable at the study's budgets
        return 1e8, 1_000_000, 512

    for here, expected in ((recorded_on, [step]), (ELSEWHERE, [point, step])):
        monkeypatch.setenv("RESERVOIR_PRETEND_PROCESSOR", here)
        jobs, listed = study.edge_jobs(walks, measure, {})
        assert [job.folder for job in jobs] == [edge_folder(study.path, c, walk["budget"]) for c in expected]
        assert not listed and all(f"FLOP_BUDGET={walk['budget']!r}" in job.args for job in jobs)


def test_everything_a_study_writes_is_its_committed_records_or_ignored_by_git(tmp_path):
    """A study's edge steps (results/<study>/edges/...: config.json, metrics.jsonl, tokenizer.json, train_log.jsonl)
    were neither committed records nor ignored, so the documented `git add results/<study>` would commit them. Every
    stage's folder, named as the study names it, holding what a point writes, under a clone's .gitignore."""
    from reservoir.studies.frontier.contexts import long_context_folder
    from reservoir.studies.frontier.edges import edge_folder
    from reservoir.studies.frontier.grid import Cell
    from reservoir.studies.frontier.held import held_folder, step_held

    repo = tmp_path / "clone"
    repo.mkdir()
    shutil.copy(ROOT / ".gitignore", repo / ".gitignore")
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    committed = {"points.jsonl", "points.jsonl.gz", "frontier-study.json", "frontier.json", "frontier.md",
                 "frontier.png", "frontier-isoflop.png", "frontier-lr.png", "context-scores.json", "edge-steps.json",
                 "generation-cost.json", "elementwise-cost.json", "frontier-time.png",
                 "generation-cost.png", "comparisons/flops-1.95e13-a-vs-b.json"}
    cell = Cell("frozen_retention+write", "xs", 3e-3, 4)
    for results in (repo / "results", repo / "results" / "growing"):
        shutil.copytree(ROOT / "results" / "frontier-tinystories", results / "frontier-tinystories")
        study = _study_from(_documented_study_command(), results)[2]()
        points = [study.folder(cell, 7.81e12), study.folder(cell, 7.81e12, seeds=True),
                  study.path / "references" / "ngram-3", study.control_folder(cell, "unfrozen", 1.95e13),
                  long_context_folder(study.path, cell.name, 1.95e13, 128), edge_folder(study.path, cell, 4e13),
                  held_folder(study.path, step_held(cell, "weight_decay", 0.1), 4e13, seeds=True),
                  study.replay_folder(study.folder(cell, 7.81e12)), study.path / "logs"]
        for point in points:
            for name in ("config.json", "summary.json", "metrics.jsonl", "tokenizer.json", "train_log.jsonl",
                         "samples.txt", "checkpoints/frozen_retention-seed1337.pt", "tb/events.out", ".lock"):
                (point / name).parent.mkdir(parents=True, exist_ok=True)
                (point / name).write_text("x")
        for name in committed:
            (study.path / name).parent.mkdir(parents=True, exist_ok=True)
            (study.path / name).write_text("x")
        (study.path / ".lock").write_text("pid 1")
    listed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=repo, check=True,
                            capture_output=True, text=True).stdout.splitlines()
    untracked = sorted(line[3:] for line in listed if line.startswith("??") and line[3:] != ".gitignore")
    for results in ("results/", "results/growing/"):
        mine = {Path(name).relative_to(f"{results}frontier-tinystories").as_posix() for name in untracked
                if name.startswith(f"{results}frontier-tinystories/")}
        records = {name for name in mine if name.startswith("comparisons/") and name.endswith(".json")}
        assert mine - records <= committed, sorted(mine - records - committed)
        assert {"points.jsonl.gz", "frontier-study.json"} <= mine


def test_a_continued_study_says_which_recorded_stages_it_keeps(tmp_path, capsys):
    """A command without CONTEXTS=True EDGES=True ran the study's recorded stages (rightly) with no line saying so."""
    shutil.copytree(ROOT / "results" / "frontier-tinystories", tmp_path / "frontier-tinystories")
    fewer = [a for a in _documented_study_command() if not a.startswith(("EDGES=", "CONTEXTS="))]
    _study_from(fewer, tmp_path)[2]()
    said = capsys.readouterr().out
    assert "kept as recorded: CONTEXTS=True EDGES=True" in said
    _study_from(_documented_study_command(), tmp_path)[2]()
    assert "kept as recorded" not in capsys.readouterr().out


def test_a_study_point_beyond_the_tests_budgets_is_refused_before_it_starts(
        tmp_path, no_study_point_beyond_the_test_budgets):
    """The quick suite's guard (tests/conftest.py): a test whose study would train one of the committed studies'
    points fails at once, naming it, instead of training for an hour."""
    from reservoir.studies.runner import run_points

    folder = tmp_path / "study" / "frozen_retention-xs-lr0.003-b4" / "flops-7.81e12"
    with pytest.raises(RuntimeError, match="beyond the tests' 1e\\+11"):
        run_points([(folder, ["FLOP_BUDGET=5e9", "FLOP_BUDGET=7.81e12", f"RUN_NAME={folder.name}"])], 1)
    assert no_study_point_beyond_the_test_budgets == [f"FLOP_BUDGET=7.81e+12 (RUN_NAME={folder.name})"]
    no_study_point_beyond_the_test_budgets.clear()  # refused as it should be: this test passes
    assert not folder.exists()


def test_the_worked_plugin_study_writes_where_git_ignores_it():
    """docs/extending.md's study (STUDY=frontier-mine) was un-ignored by the results/frontier-*/ rule: following the
    page left the clone dirty."""
    import re

    page = (ROOT / "docs" / "extending.md").read_text(encoding="utf-8")
    studies = set(re.findall(r"scaling\.py FRONTIER=True STUDY=(\S+)", page))
    assert studies
    paths = [f"results/{study}/points.jsonl" for study in sorted(studies)]
    ignored = subprocess.run(["git", "check-ignore", *paths], cwd=ROOT, capture_output=True, text=True)
    assert ignored.stdout.split() == paths, "a study of the page would show in git status"


ENTRY_POINTS = ["TinyStories.py", "compare.py", "export.py", "plot_results.py", "probes.py", "sample.py", "scaling.py",
                "sweep.py", "test_tpu_support.py"]


@pytest.mark.parametrize("variable, value, said", [
    ("RESERVOIR_PRETEND_CORES", "0", "give a whole number of cores, at least 1"),
    ("RESERVOIR_PRETEND_ISA", "banana", "RESERVOIR_PRETEND_ISA=banana: give one of the instruction sets"),
    ("RESERVOIR_PRETEND_PROCESSOR", " ", "RESERVOIR_PRETEND_PROCESSOR is set but empty")])
def test_a_bad_pretend_variable_is_refused_by_every_entry_point_before_anything_runs(tmp_path, variable, value, said):
    """RESERVOIR_PRETEND_CORES=0 let TinyStories.py train a model before refusing (a run folder with a checkpoint
    and no summary was left), and RESERVOIR_PRETEND_ISA=banana was recorded as the run's instruction set."""
    for script in ENTRY_POINTS:
        args = [*TINY, "MODELS=['lstm']", "MAX_STEPS=3", f"RESULTS_DIR={tmp_path / 'results'}",
                f"CACHE_DIR={tmp_path / 'cache'}"] if script == "TinyStories.py" else ["--help"]
        proc = run_script(script, *args, env={variable: value}, check=False)
        assert proc.returncode == 1 and proc.stderr.strip() == f"error: {proc.stderr.strip()[7:]}", (script, proc)
        assert said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, (script, proc.stderr)
        assert not proc.stdout, (script, proc.stdout)
    assert not (tmp_path / "results").exists() and not (tmp_path / "cache").exists()
    from reservoir.data.fetch import main as fetch

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(variable, value)
        with pytest.raises(SystemExit, match=said):
            fetch(["--help"])


def test_a_known_instruction_set_is_recorded_in_torch_s_spelling(tmp_path):
    run_cli(tmp_path, "MODELS=['ngram']", "MAX_STEPS=1", "RUN_NAME=r", env={"RESERVOIR_PRETEND_ISA": "avx512"})
    assert json.loads((tmp_path / "results" / "r" / "config.json").read_text())["device"]["isa"] == "AVX512"
