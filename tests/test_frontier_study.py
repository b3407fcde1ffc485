"""The frontier study: the training split scored as the validation split is (the train/validation
gap of repeated epochs), the leaders carried to a larger budget, and REPORT.md written from records alone."""

import json
import shutil
import statistics
from pathlib import Path

import pytest

from reservoir.config import SHARED_CONFIG
from reservoir.models import MODELS
from reservoir.studies.frontier.generation import chars_per_second, format_generation
from tests.conftest import ROOT, TINY, run_cli, run_in_process, run_script, summary_of


def test_the_final_evaluation_also_scores_the_training_split_by_the_same_protocol(tmp_path):
    run_cli(tmp_path, "MODELS=ngram", "NGRAM.order=6", "MAX_STEPS=1", "RUN_NAME=r", "TRAIN_EVAL_TOKENS=4096")
    record = summary_of(tmp_path / "results" / "r")["ngram"]
    assert record["train_split_tokens"] == 4096
    # an order-6 n-gram has counted every training 6-gram it is scored on: it knows the training text better
    assert 0 < record["train_split_bpc"] < record["val_bpc"]
    assert record["train_split_loss"] < record["val_loss"]
    run_cli(tmp_path, "MODELS=ngram", "MAX_STEPS=1", "RUN_NAME=r2", "TRAIN_EVAL_TOKENS=None")
    assert "train_split_bpc" not in summary_of(tmp_path / "results" / "r2")["ngram"]


def test_the_training_split_is_scored_on_no_more_tokens_than_the_final_validation(tmp_path):
    """A run that scores little validation text (FINAL_EVAL_TOKENS) scores as little training text: samples of
    one size, and the training split never costs more than the final evaluation (on XLA:CPU, 65,536 tokens of it
    took minutes per model)."""
    run_cli(tmp_path, "MODELS=ngram", "MAX_STEPS=1", "RUN_NAME=r", "FINAL_EVAL_TOKENS=1024", "TRAIN_EVAL_TOKENS=65536")
    record = summary_of(tmp_path / "results" / "r")["ngram"]
    assert record["eval_tokens"] == record["train_split_tokens"] == 1024


# --------------------------------------------------------------------- REPORT.md from the committed fixture

FIXTURE = ROOT / "tests" / "fixtures" / "studies"  # made by tests/fixtures/make_studies.sh (a micro study)


@pytest.fixture
def studies(tmp_path):
    """A copy of the committed fixture studies: the records alone, no checkpoints."""
    folder = tmp_path / "results"
    shutil.copytree(FIXTURE, folder)
    assert not list(folder.rglob("*.pt"))
    return folder


def _seed_scores(point: Path) -> list[float]:
    return [r["val_bpc"] for r in json.loads((point / "summary.json").read_text())]


def test_report_md_is_rebuilt_from_the_committed_records_with_every_section(studies):
    proc = run_script("scaling.py", f"REPORT={studies}")
    text = (studies / "REPORT.md").read_text()
    assert (studies / "micro" / "frontier.png").stat().st_size > 10_000 and "![" in text
    # the envelope at the leaders' budget: the mean of the two seeds the point and its -seeds folder recorded
    cell = studies / "micro" / "linear_reservoir-xs-lr0.004-b8"
    seeds = _seed_scores(cell / "flops-1.20e10") + _seed_scores(cell / "flops-1.20e10-seeds")
    assert len(seeds) == 2
    mean = f"{statistics.fmean(seeds):.3f} ± {statistics.stdev(seeds):.3f}"
    assert f"| linear_reservoir | reservoir | {mean} (2) |" in text  # the headline row (the README quotes it)
    assert f"linear_reservoir: {mean} |" in text  # the goal table, in the reservoirs' columns
    assert "| budget | the transformer (transformer++) | best reservoir | gap | best frozen-transition network | " \
           "gap | within 5% |" in text
    # the gap's slope for each class apart: the fixture's one reservoir family, and no frozen-transition network
    assert "Each class apart: the best reservoir's (linear_reservoir) **" in text
    assert "the best frozen-transition network's: too few budgets for a slope." in text
    for section in ("The goal", "Lower envelopes", "Compute multiplier", "N_opt", "Train against validation",
                    "Paired comparison at 1.2e+10 FLOPs: linear_reservoir − transformer++", "Reference lines",
                    "recall k=4", "python scaling.py FRONTIER=True STUDY=micro", "LEAD_BUDGET=1.2e+10"):
        assert section in text, section
    comparison = json.loads(next((studies / "micro" / "comparisons").glob("*.json")).read_text())
    assert f"A − B = {comparison['bpc_difference']:+.4f} bits/char" in text
    ngram = json.loads((studies / "micro" / "references" / "ngram-3" / "summary.json").read_text())[0]
    assert f"| ngram-3 | {ngram['val_bpc']:.3f} | {ngram['train_split_bpc']:.3f} |" in text
    # the control row: the envelope cell at the grid's top budget, unfrozen, against the same cell, budget and seed
    control = _seed_scores(studies / "micro" / "controls" / "linear_reservoir-xs-lr0.004-b8+unfrozen" / "flops-6.00e09")
    point = _seed_scores(studies / "micro" / "linear_reservoir-xs-lr0.004-b8" / "flops-6.00e09")
    assert f"| linear_reservoir | 6e+09 | unfrozen (seed 1337) | train_recurrence=True | {point[0]:.3f} | " \
           f"{control[0]:.3f}" in text and f"| {control[0] - point[0]:+.3f} |" in text
    assert "CONTROLS=True" in text and "Controls: what the frozen part is worth" in text
    assert "micro" in proc.stdout and "Traceback" not in proc.stderr


def test_a_folder_under_controls_that_names_no_control_of_the_study_is_one_line(studies):
    shutil.copytree(studies / "micro" / "controls" / "linear_reservoir-xs-lr0.004-b8+unfrozen",
                    studies / "micro" / "controls" / "linear_reservoir-xs-lr0.004-b8+no-readout")
    before = (studies / "REPORT.md").read_text() if (studies / "REPORT.md").exists() else None
    proc = run_script("scaling.py", f"REPORT={studies}", check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr
    assert "+no-readout is not a control of this study" in proc.stderr and "move it out" in proc.stderr
    assert ((studies / "REPORT.md").read_text() if (studies / "REPORT.md").exists() else None) == before


def test_a_report_of_records_that_mix_corpora_is_one_line(studies, tmp_path):
    other = tmp_path / "other"  # an n-gram of another corpus (150 stories, not 300) among the references
    run_cli(tmp_path, "MODELS=ngram", "MAX_STEPS=1", "SYNTHETIC_STORIES=150", f"RESULTS_DIR={other}",
            "RUN_NAME=ngram-1", settings=[s for s in TINY if not s.startswith("SYNTHETIC_STORIES")])
    target = studies / "micro" / "references" / "ngram-1"
    shutil.rmtree(target)
    shutil.copytree(other / "ngram-1", target)
    proc = run_script("scaling.py", f"REPORT={studies}", check=False)
    assert proc.returncode != 0 and "mix corpora" in proc.stderr and "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and not (studies / "REPORT.md").exists()


def test_a_report_of_an_edited_record_is_one_line_and_leaves_the_report_as_it_was(studies):
    run_script("scaling.py", f"REPORT={studies}")
    before = (studies / "REPORT.md").read_text()
    point = studies / "micro" / "transformer++-xs-lr0.004-b8" / "flops-6.00e09" / "summary.json"
    records = json.loads(point.read_text())
    records[0]["val_bpc"] = 0.5
    point.write_text(json.dumps(records))
    proc = run_script("scaling.py", f"REPORT={studies}", check=False)
    assert proc.returncode != 0 and "edited" in proc.stderr and "Traceback" not in proc.stderr
    assert "delete that point's folder: points.jsonl holds its record as the run wrote it" in proc.stderr
    assert (studies / "REPORT.md").read_text() == before
    shutil.rmtree(point.parent)  # the advice followed: the report is the one before the edit
    run_script("scaling.py", f"REPORT={studies}")
    assert (studies / "REPORT.md").read_text() == before


def test_a_report_of_a_folder_with_no_study_or_no_records_is_one_line(tmp_path, studies):
    (tmp_path / "empty").mkdir()
    proc = run_script("scaling.py", f"REPORT={tmp_path / 'empty'}", check=False)
    assert proc.returncode != 0 and "holds no frontier study" in proc.stderr and "Traceback" not in proc.stderr
    for point in (studies / "micro").glob("*-lr*/flops-*"):
        shutil.rmtree(point)
    shutil.rmtree(studies / "micro" / "references")
    proc = run_script("scaling.py", f"REPORT={studies}", check=False)
    assert proc.returncode != 0 and "has no point records yet" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("args, message", [
    (["LEAD_BUDGET=6e9"], "LEAD_BUDGET must be one budget above the largest of BUDGETS"),
    (["LEAD_BUDGET=1e10,2e10"], "LEAD_BUDGET must be one budget above"),
    (["LEADERS=lstm"], "LEADERS names 'lstm', not one of the study's FAMILIES"),
    (["REFERENCES=maybe"], "REFERENCES must be True or False"),
    (["CONTROLS=some"], "CONTROLS must be True or False"),
])
def test_bad_stage_keys_are_one_line_and_make_no_folder(tmp_path, args, message):
    proc = run_script("scaling.py", "FAMILIES=transformer++,linear_reservoir", "SIZES=xs", "BUDGETS=3e9,6e9",
                      "DATASET=synthetic", f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'c'}",
                      *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists()


# --------------------------------------------------------------------- the stages after the grid, end to end

STAGED = ["STUDY=micro", "FAMILIES=transformer++,linear_reservoir", "SIZES=xs", "LEARNING_RATES=4e-3",
          "BATCH_SIZES=8", "BUDGETS=3e9,6e9", "LEAD_BUDGET=1.2e10", "REFERENCES=True", "CONTROLS=True", "MIN_STEPS=20",
          "MAX_TOKENS_PER_PARAM=1000", "ENVELOPE_SEEDS=2", "DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32",
          "EVAL_TOKENS=2048", "FINAL_EVAL_TOKENS=4096", "TRAIN_EVAL_TOKENS=4096", "SAMPLE_TOKENS=20",
          "WARMUP_STEPS=5"]  # the fixture's command (tests/fixtures/make_studies.sh)


@pytest.mark.slow
def test_the_leaders_references_and_comparison_run_after_the_grid_and_once(tmp_path):
    args = [*STAGED, f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'cache'}"]
    proc = run_script("scaling.py", *args, timeout=900)
    study = tmp_path / "results" / "micro"
    report = json.loads((study / "frontier.json").read_text())
    assert report["budgets"] == [3e9, 6e9, 1.2e10] and report["lead_budget"] == 1.2e10
    for family in ("transformer++", "linear_reservoir"):  # auto: the transformer and the best reservoir family
        lead = [p for p in report["envelope"][family] if p["budget"] == 1.2e10]
        assert len(lead) == 1 and lead[0]["seeds"] == [1337, 1338]
        first = next(r for r in report["grid_points"] if r["family"] == family and r["budget"] == 1.2e10
                     and not r["envelope_seed"])
        assert first["branched"]  # it continued the top budget's stable phase
    references = {r["name"]: r for r in report["references"]}
    assert set(references) == {*(f"ngram-{k}" for k in range(1, 7)), "esn-500", "esn-1000", "esn-2000", "esn-4000"}
    orders = [references[f"ngram-{k}"]["val_bpc"] for k in range(1, 5)]
    assert orders == sorted(orders, reverse=True)  # more context, lower loss on this corpus
    assert all(summary_of(Path(r["folder"]))[r["model"]]["bound_by"] == "data" for r in references.values())
    # the controls at the grid's top budget: the reservoir family's envelope cell with its recurrence trained too
    # (the first seed), and the random transformer on every envelope seed
    controls = {(c["family"], c["control"], c["seed"]): c for c in report["controls"]}
    assert set(controls) == {("linear_reservoir", "unfrozen", 1337), ("transformer++", "random", 1337),
                             ("transformer++", "random", 1338)}
    assert all(c["trained"] == "embeddings" and c["params_trained"] < c["envelope_params_trained"]
               for key, c in controls.items() if key[1] == "random")
    control = controls[("linear_reservoir", "unfrozen", 1337)]
    assert (control["family"], control["control"], control["budget"]) == ("linear_reservoir", "unfrozen", 6e9)
    assert control["trained"] == "everything" and control["params_trained"] > control["envelope_params_trained"]
    assert control["difference"] == control["val_bpc"] - control["envelope_bpc"] and control["seed"] == 1337
    # the grid's top budget as soon as its seeds are in (before the references and the leaders), then the lead's
    grid_top, lead = report["comparisons"]
    assert (grid_top["budget"], lead["budget"]) == (6e9, 1.2e10)
    for comparison in (grid_top, lead):
        assert comparison["family_a"] == "linear_reservoir" and comparison["family_b"] == "transformer++"
        assert comparison["a"]["seeds"] == [1337, 1338] and "diagnostics" in comparison
        # its runs named from the study's folder (RESULTS_DIR here is absolute): no machine's layout committed
        runs = [*comparison["a"]["runs"], *comparison["b"]["runs"]]
        assert all((study / r / "summary.json").is_file() and not r.startswith(("/", "..")) for r in runs), runs
    assert proc.stdout.index("paired comparison at 6e+09") < proc.stdout.index("reference runs finished")
    made = {f.name: f.stat().st_mtime_ns for f in (study / "comparisons").glob("*.json")}
    again = run_script("scaling.py", *args, timeout=900)
    assert "started" not in again.stdout and "0 runs to train" in again.stdout
    assert "10 reference runs finished, 0 to run" in again.stdout
    assert "the controls at 6e+09 FLOPs: 0 runs to train" in again.stdout
    assert {f.name: f.stat().st_mtime_ns for f in (study / "comparisons").glob("*.json")} == made
    # a comparison of cells the envelope no longer holds (the grid grew since) is made again of the envelope's
    file = study / "comparisons" / "flops-6.00e09-linear_reservoir-vs-transformer++.json"
    stale = json.loads(file.read_text())
    stale["a"]["runs"], stale["bpc_difference"] = [r.replace("-b8/", "-b16/") for r in stale["a"]["runs"]], 9.0
    file.write_text(json.dumps(stale))
    remade = run_in_process("scaling.py", args)
    assert remade.returncode == 0, remade.stderr[-2000:]
    assert "no longer the envelope there (the grid grew): made again" in remade.stdout
    assert json.loads(file.read_text())["a"]["runs"] == grid_top["a"]["runs"]
    assert json.loads(file.read_text())["bpc_difference"] == grid_top["bpc_difference"]


def test_a_family_whose_kept_cells_outgrow_the_budget_gets_its_pruned_cells_back(tmp_path):
    # KEEP=1: at 6e9 only the better of xs and s goes on; at 1.2e10 xs takes too many tokens per parameter
    args = ["STUDY=refill", "FAMILIES=transformer++", "SIZES=xs,s", "LEARNING_RATES=4e-3", "BATCH_SIZES=8",
            "BUDGETS=3e9,6e9,1.2e10", "KEEP=1", "WITHIN=0", "MIN_STEPS=20", "MAX_TOKENS_PER_PARAM=0.4",
            "ENVELOPE_SEEDS=1", "DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "EVAL_TOKENS=2048",
            "FINAL_EVAL_TOKENS=4096", "SAMPLE_TOKENS=0", "WARMUP_STEPS=5", f"RESULTS_DIR={tmp_path / 'results'}",
            f"CACHE_DIR={tmp_path / 'cache'}"]
    proc = run_script("scaling.py", *args, timeout=900)
    report = json.loads((tmp_path / "results" / "refill" / "frontier.json").read_text())
    assert "tokens per parameter > 0.4" in json.dumps(report["skipped"])  # xs cannot take 1.2e10
    at = {(r["size"], r["budget"]): r for r in report["grid_points"]}
    assert at[("xs", 6e9)]["val_bpc"] < at[("s", 6e9)]["val_bpc"]  # so s was pruned at 6e9 ...
    assert "transformer++-s-lr0.004-b8 back" in proc.stdout  # ... and came back at 1.2e10,
    assert at[("s", 1.2e10)]["branched"]  # continuing its stable phase of 6e9
    assert [p["budget"] for p in report["envelope"]["transformer++"]] == [3e9, 6e9, 1.2e10]


def test_a_stopped_study_counts_the_points_it_never_started_apart(tmp_path):
    from reservoir.studies.frontier.study import FrontierExit, FrontierStudy

    study = FrontierStudy.from_args({"FAMILIES": "lstm", "SIZES": "xs", "BUDGETS": "3e9,6e9"},
                                    ["DATASET=synthetic", f"RESULTS_DIR={tmp_path}"])
    jobs = [(tmp_path / str(k), []) for k in range(3)]
    with pytest.raises(FrontierExit) as stopped:
        study._run_all(jobs, lambda jobs, workers, finished, **_: [143, None, None], 3e9)
    assert stopped.value.code == 143
    assert ("1 point(s) at 3e+09 FLOPs stopped (exit code 143; each point's own message is above), 2 not started"
            in str(stopped.value))
    study._run_all(jobs, lambda jobs, workers, finished, **_: [0, 0, 0], 3e9)  # all finished: nothing raised


def test_the_readme_quotes_the_committed_study_as_the_report_generates_it():
    """README's "What we found" table is the headline of the committed records, not typed by hand: after new
    records, `python scaling.py REPORT=results` and paste results/REPORT.md's headline into the README."""
    from reservoir.studies.frontier.analysis import report_from_records
    from reservoir.studies.frontier.report import headline

    readme = (ROOT / "README.md").read_text()
    start, end = "<!-- headline: results/frontier-tinystories -->\n", "\n<!-- /headline -->"
    assert start in readme and end in readme
    quoted = readme.split(start, 1)[1].split(end, 1)[0]
    assert quoted == headline(report_from_records(ROOT / "results" / "frontier-tinystories"))


def test_the_readme_s_line_on_other_accountings_is_what_the_committed_reports_say():
    """Element-wise work counted: each family's cost ratio and how far a gap at matched cost moves; by time: at how
    many of the reference's times the best reservoir is within the goal, per processor."""
    import re

    from reservoir.studies.frontier.analysis import report_from_records
    from reservoir.studies.frontier.report import GOAL

    line = " ".join((ROOT / "README.md").read_text().split("**Under other accountings")[1].split("\n- ")[0].split())
    reports = {c: report_from_records(ROOT / "results" / f"frontier-{c}") for c in ("tinystories", "shakespeare")}
    ratios = [(f, r) for report in reports.values() for f, r in report["elementwise"]["ratio"].items()]
    low, high, lstm = map(int, re.search(r"steps (\d+)-(\d+)% dearer, the LSTM's up to (\d+)%", line).groups())
    others = [r for f, r in ratios if f != "lstm"]
    assert round(100 * (min(r[0] for r in others) - 1)) == low and round(100 * (max(r[1] for r in others) - 1)) == high
    assert round(100 * (max(r[1] for f, r in ratios if f == "lstm") - 1)) == lstm
    moved = max(abs(c["gap"] - c["flop_convention"]["gap"]) for report in reports.values()
                for g in report["elementwise"]["gaps"] for c in g["classes"].values() if c and c["flop_convention"])
    assert "no gap at matched cost moves by over 0.11 points" in line and moved <= 0.0011

    def within(report):
        out = []
        for view in report["by_time"]["processors"].values():
            rows = [m["classes"]["reservoir"] for m in view["matched"]]
            rows = [c for c in rows if c is None or "beyond" not in c]
            if rows:
                out.append((sum(1 for c in rows if c is not None and c["gap"] <= GOAL), len(rows)))
        return out

    tiny, shakespeare = within(reports["tinystories"]), within(reports["shakespeare"])
    counts = [f"{k} of {n}" for k, n in tiny]
    listed = counts[0] if len(counts) == 1 else f"{', '.join(counts[:-1])} and {counts[-1]}"
    total = f"{sum(k for k, _ in tiny)} of {sum(n for _, n in tiny)}"
    assert f"at {total} of Transformer++'s times on TinyStories (per processor: {listed})" in line
    assert all(k == n for k, n in shakespeare) and f"all {sum(n for _, n in shakespeare)} on Shakespeare" in line


def test_a_grid_list_may_grow_and_its_new_cells_join_the_study(tmp_path):
    from reservoir.studies.frontier.grid import FAMILIES
    from reservoir.studies.store import PointRecords

    base = ["STUDY=grow", "SIZES=xs", "BATCH_SIZES=8", "BUDGETS=3e9,6e9", "KEEP=1", "WITHIN=0",
            "MIN_STEPS=5", "MAX_TOKENS_PER_PARAM=1000", "ENVELOPE_SEEDS=1", "DATASET=synthetic",
            "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "EVAL_TOKENS=2048", "FINAL_EVAL_TOKENS=4096", "SAMPLE_TOKENS=0",
            "WARMUP_STEPS=5", f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'cache'}"]

    def recorded():  # {point: its summary}, as the study reads its records
        store = PointRecords(tmp_path / "results" / "grow")
        return {key: store.summary(store.path / key) for key in store.packed()["points"]}

    run_script("scaling.py", *base, "FAMILIES=lstm", "LEARNING_RATES=2e-3")
    before = recorded()
    # a rate and a family join (the committed studies grown by the ESN's): only their cells train
    grown = run_script("scaling.py", *base, "FAMILIES=lstm,esn+softmax,esn+mlp", "LEARNING_RATES=2e-3,8e-3",
                       "WORKERS=1")
    assert "3e+09 FLOPs: 6 cells, 1 already finished, 5 to train" in grown.stdout  # only the new cells train
    report = json.loads((tmp_path / "results" / "grow" / "frontier.json").read_text())
    assert {r["learning_rate"] for r in report["grid_points"] if r["budget"] == 3e9} == {2e-3, 8e-3}
    assert {r["family"] for r in report["grid_points"]} == {"lstm", "esn+softmax", "esn+mlp"}
    # the reservoir each ESN family drew, read back from its records for the report: the one its family fixes
    # (its readout's sweep), not SHARED_CONFIG's (the ridge readout's); the degree as SHARED_CONFIG's
    drawn = report["esn_reservoirs"]
    assert set(drawn) == {"esn+softmax", "esn+mlp"}
    for family, knobs in drawn.items():
        fixed = {k: v for k, v in FAMILIES[family][1].items() if k != "readout"}
        assert knobs == {**fixed, "degree": SHARED_CONFIG["ESN"]["degree"]}, family
    assert drawn["esn+softmax"] != drawn["esn+mlp"]
    assert "echo state network at its best" in (tmp_path / "results" / "grow" / "frontier.md").read_text()
    after = recorded()  # every earlier point's record stays as it was
    assert before and {key: after[key] for key in before} == before
    assert {key.split("/")[0] for key in after.keys() - before.keys()} >= {"lstm-xs-lr0.008-b8",
                                                                         "esn+softmax-xs-lr0.002-b8"}
    shrunk = run_script("scaling.py", *base, "FAMILIES=lstm,esn+softmax,esn+mlp", "LEARNING_RATES=8e-3",
                        check=False)
    assert shrunk.returncode != 0 and "LEARNING_RATES ([0.002, 0.008] there, [0.008] here)" in shrunk.stderr
    assert "Traceback" not in shrunk.stderr


def test_train_against_validation_uses_the_seeds_that_scored_the_training_split():
    from reservoir.studies.frontier.analysis import build_frontier

    def row(seed, extra, val, train):
        return {"cell": "lstm-xs-lr0.006-b8", "family": "lstm", "size": "xs", "learning_rate": 6e-3, "batch_size": 8,
                "budget": 1e12, "seed": seed, "envelope_seed": extra, "status": "finished", "val_bpc": val,
                "val_loss": val * 0.69, "train_loss": 1.0, "train_split_bpc": train, "params_trained": 1000,
                "train_flops": 1e12, "train_tokens": 1, "train_steps": 1, "epochs": 3.0, "train_seconds": 1.0,
                "data_source": "files", "corpus": "c", "spent_flops": 1e12, "spent_seconds": 1.0, "branched": False,
                "folder": "x"}

    study = {"study": "t", "budgets": [1e12, 2e12], "grid": {"FAMILIES": ["lstm"], "LEARNING_RATES": [6e-3]},
             "settings": [], "plan": {}}
    # the first seed ran before TRAIN_EVAL_TOKENS existed; the envelope's two extra seeds scored both splits
    rows = [row(1337, False, 1.50, None), row(1338, True, 1.52, 1.30), row(1339, True, 1.56, 1.36)]
    [point] = build_frontier(rows, study)["envelope"]["lstm"]
    assert point["split_seeds"] == [1338, 1339]
    assert point["train_split_bpc"] == pytest.approx(1.33) and point["val_bpc_of_split_seeds"] == pytest.approx(1.54)
    assert point["bpc_mean"] == pytest.approx(1.5266666, rel=1e-5)  # the envelope itself: every seed


def test_a_study_of_tiny_shakespeare_lists_the_published_numbers_of_its_split(studies):
    from reservoir.studies.frontier.analysis import report_from_records
    from reservoir.studies.frontier.report import format_study

    report = report_from_records(studies / "micro")
    assert "Published numbers" not in format_study(report, "frontier.png")
    report["corpus"] = "char tokenizer 0123, 1,003,854 training and 111,540 validation characters"
    text = format_study(report, "frontier.png")
    assert "| nanoGPT baby GPT (6 x 384, 10.7M parameters, block 256, GPU) | 1.47 | 2.120 |" in text
    assert "A corpus without story boundaries (Tiny Shakespeare) is one story" in text  # the diagnostics' note


def test_a_size_preset_at_the_grid_s_edge_is_marked_like_a_rate_at_its_edge(studies):
    """An envelope on the grid's smallest preset (Tiny Shakespeare's transformer at every budget) might still drop
    on a smaller one: N_opt says so."""
    from reservoir.studies.frontier.analysis import report_from_records
    from reservoir.studies.frontier.report import format_study

    report = report_from_records(studies / "micro")
    assert report["grid"]["SIZES"] == ["xs"] and "xs ↓" not in format_study(report, "frontier.png")
    report["grid"]["SIZES"] = ["s", "xs"]  # the order the command gave: the edge is by preset size, not position
    text = format_study(report, "frontier.png")
    params = report["envelope"]["transformer++"][0]["params_trained"]
    assert f"{params:,} (xs ↓, " in text and "(xs ↑" not in text
    assert "the best size preset of linear_reservoir, transformer++ is at the grid's edge" in text


def test_the_readme_quotes_the_committed_default_run_and_the_defaults_are_the_frontiers():
    """The default run's table in docs/runs.md is its committed records' table; the defaults it ran with are today's,
    and each family's block is its envelope configuration at the default budget."""
    from reservoir.config import SHARED_CONFIG
    from reservoir.models import with_added_options
    from reservoir.run.records import read_run_config, read_summary
    from reservoir.run.tables import format_table
    from reservoir.studies.frontier.analysis import report_from_records
    from reservoir.studies.frontier.grid import FAMILIES, SIZES

    run = ROOT / "results" / "default-run"
    readme = (ROOT / "docs" / "runs.md").read_text()
    quoted = readme.split("<!-- table: results/default-run -->\n```\n", 1)[1].split("\n```\n<!-- /table -->", 1)[0]
    assert quoted == format_table(read_summary(run), read_run_config(run)["effective_config"])
    requested = read_run_config(run)["requested_config"]
    for key in ("MODELS", "FLOP_BUDGET", "LEARNING_RATE", "BATCH_SIZE", "LR_SCHEDULE"):
        assert requested[key] == SHARED_CONFIG[key], key
    report = report_from_records(ROOT / "results" / "frontier-tinystories")
    budget = SHARED_CONFIG["FLOP_BUDGET"]
    at = {f: p for f, points in report["envelope"].items() for p in points if p["budget"] == budget}
    transformer = report["reference"]  # the better recipe is "the transformer"
    for family in ("lstm", "frozen_retention", "reservoir_attention", "deep_linear_reservoir", "linear_reservoir",
                   transformer):
        model, options = FAMILIES[family]
        block = SHARED_CONFIG[model.upper()]
        wanted = {**options, **SIZES[model][at[family]["size"]], "learning_rate": at[family]["learning_rate"],
                  "batch_size": at[family]["batch_size"]}
        assert {k: block[k] for k in wanted} == wanted, family
        assert block == with_added_options(requested)[model.upper()], family  # options added since: as built


def test_the_study_file_is_trusted_only_as_the_study_wrote_it(studies, tmp_path):
    run_script("scaling.py", f"REPORT={studies}")
    before = (studies / "REPORT.md").read_text()
    file = studies / "micro" / "frontier-study.json"
    content = json.loads(file.read_text())
    content["grid"]["FAMILIES"] = ["transformer++"]  # a family removed by hand would vanish from the report
    file.write_text(json.dumps(content))
    proc = run_script("scaling.py", f"REPORT={studies}", check=False)
    assert proc.returncode != 0 and "frontier-study.json (the study's grid) was edited or damaged" in proc.stderr
    assert "restore it as the study wrote it" in proc.stderr and "Traceback" not in proc.stderr
    assert (studies / "REPORT.md").read_text() == before
    file.unlink()  # without it, another grid would take the study's records over
    other = run_script("scaling.py", "FAMILIES=lstm", "SIZES=xs", "BUDGETS=3e9,6e9", "MIN_STEPS=20",
                       "DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "STUDY=micro",
                       f"RESULTS_DIR={studies}", f"CACHE_DIR={tmp_path / 'c'}", check=False)
    assert other.returncode != 0 and "frontier-study.json is missing, but" in other.stderr, other.stderr
    assert len(other.stderr.strip().splitlines()) == 1 and not file.exists()


@pytest.mark.slow
def test_the_edges_stages_replay_what_another_machine_trained_and_score_every_context(studies):
    """On a copy of the committed records alone (no checkpoints): CONTROLS trains the random transformer on
    every envelope seed; CONTEXTS with REPLAY=True trains the top budget's envelope points again here for their
    checkpoints, scores them at every context, and trains the leaders at 4 x SEQ_LEN; REPORT shows both."""
    from reservoir.run.records import read_signed_json

    args = [*STAGED, "CONTEXTS=True", "REPLAY=True", f"RESULTS_DIR={studies}", f"CACHE_DIR={studies.parent / 'c'}"]
    run_script("scaling.py", *args, timeout=900)
    study = studies / "micro"
    report = json.loads((study / "frontier.json").read_text())
    random = [c for c in report["controls"] if c["control"] == "random"]
    assert sorted(c["seed"] for c in random) == [1337, 1338] and {c["trained"] for c in random} == {"embeddings"}
    assert random[0]["params_trained"] < random[0]["envelope_params_trained"] / 5  # embeddings alone
    scores = read_signed_json(study / "context-scores.json", "context scores", "")["rows"]
    assert set(scores) == {"transformer++", "linear_reservoir", "transformer++@SEQ_LEN=128",
                           "linear_reservoir@SEQ_LEN=128"}
    for row in scores.values():  # at its own training context, the scorer gives back the point's recorded score
        own = row["scores"]["stream" if row["family"] == "linear_reservoir" else str(row["seq_len"])]
        assert own == pytest.approx(row["recorded_val_bpc"], rel=1e-3)
    assert scores["transformer++"]["scores"]["stream"] is None and scores["transformer++"]["scores"]["512"]
    for family in ("transformer++", "linear_reservoir"):  # replays: the records' point folders hold no checkpoint
        replay = study / "replays" / next(c["name"] for c in json.loads((study / "frontier-study.json").read_text())[
            "cells"] if c["family"] == family) / "flops-6.00e09"
        assert list((replay / "checkpoints").glob("*.pt")) and _seed_scores(replay)[0] == pytest.approx(
            scores[family]["recorded_val_bpc"], rel=1e-3)
    text = (studies / "micro" / "frontier.md").read_text()
    assert "Frozen attention: the random transformer" in text and "What context is worth" in text
    assert "CONTEXTS=True" in text
    again = run_script("scaling.py", *args, timeout=900)  # everything recorded: nothing trains again
    assert "started" not in again.stdout and "runs to train" in again.stdout and "trained again here" not in \
        again.stdout


@pytest.mark.slow
def test_the_grid_edges_stage_walks_beyond_each_edge_once_and_the_report_says_where_it_ended(tmp_path):
    """EDGES=True: at the grid's top two budgets, the step beyond each edge the envelope point sits on (here
    the sizes xs and s: xxs below, m above) is trained on the first seed, and followed while it beats the point;
    the walks are rebuilt from the records alone, and a second run trains nothing."""
    from reservoir.studies.frontier.analysis import report_from_records

    args = ["STUDY=edges", "FAMILIES=linear_reservoir", "SIZES=xs,s", "LEARNING_RATES=4e-3", "BATCH_SIZES=8",
            "BUDGETS=3e9,6e9", "MIN_STEPS=20", "MAX_TOKENS_PER_PARAM=1000", "ENVELOPE_SEEDS=1", "EDGES=True",
            "DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "EVAL_TOKENS=2048", "FINAL_EVAL_TOKENS=4096",
            "SAMPLE_TOKENS=0", "WARMUP_STEPS=5", f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'c'}"]
    proc = run_script("scaling.py", *args, timeout=900)
    study = tmp_path / "results" / "edges"
    report = json.loads((study / "frontier.json").read_text())
    walks = report["edges"]["walks"]
    assert sorted(w["budget"] for w in walks) == [3e9, 6e9] and all(w["axis"] == "size" for w in walks)
    for w in walks:
        envelope = min((r for r in report["grid_points"] if r["budget"] == w["budget"]), key=lambda r: r["val_bpc"])
        assert (w["cell"], w["val_bpc"]) == (envelope["cell"], envelope["val_bpc"])
        assert w["end"] in ("worse", "no preset beyond", "cannot train") and w["steps"]
        expected = w["cell"].replace("-xs-", "-xxs-") if w["direction"] < 0 else w["cell"].replace("-s-", "-m-")
        assert w["steps"][0]["cell"] == expected
        scored = [s["val_bpc"] for s in w["steps"] if s["val_bpc"] is not None]
        best = w["val_bpc"]
        for score in scored[:-1]:  # followed while each step beat the best so far ...
            assert score < best
            best = score
        assert w["end"] != "worse" or scored[-1] >= best  # ... and ended on the first that did not
        assert w["moved"] == pytest.approx(min([w["val_bpc"], *scored]) - w["val_bpc"])
        for step in w["steps"]:  # every step is an ordinary point folder, its record in points.jsonl
            folder = study / "edges" / step["cell"] / ("flops-3.00e09" if w["budget"] == 3e9 else "flops-6.00e09")
            assert step.get("why") or summary_of(folder)["linear_reservoir"]["val_bpc"] == step["val_bpc"]
    assert "the grid's edges, round 1" in proc.stdout
    text = (study / "frontier.md").read_text()
    assert "Does the grid contain its optimum?" in text and "EDGES=True" in text
    shutil.rmtree(study / "edges" / walks[0]["steps"][0]["cell"])  # points.jsonl alone holds the steps now
    assert report_from_records(study)["edges"]["walks"] == walks
    again = run_script("scaling.py", *args, timeout=900)
    assert "started" not in again.stdout and "steps beyond to train" not in again.stdout
    (study / "edges" / "not-a-cell").mkdir()
    refused = run_script("scaling.py", f"REPORT={study}", check=False)
    assert refused.returncode != 0 and "not a step beyond the grid's edge" in refused.stderr


@pytest.mark.slow  # trains a point three times, once in a process held to AVX2
def test_a_recorded_point_trained_again_here_repeats_bit_for_bit_on_one_kernel_path(studies, tmp_path):
    """bench/reproduce_point.py: a point of the committed fixture trained again from its study file's settings,
    twice with this CPU's kernels (the same bits both times) and once held to AVX2, beside its record."""
    out = tmp_path / "out"
    cell, record = "linear_reservoir-xs-lr0.004-b8", _seed_scores(studies / "micro" / "linear_reservoir-xs-lr0.004-b8"
                                                                  / "flops-3.00e09")[0]
    proc = run_script("bench/reproduce_point.py", studies / "micro", cell, "3e9", f"CACHE_DIR={tmp_path / 'c'}",
                      env={"OUT": str(out)}, timeout=600)
    rows = json.loads((out / "reproduce.json").read_text())["rows"]
    assert [r["kernels"] for r in rows] == ["this CPU's (1st run)", "this CPU's (2nd run)", "AVX2"]
    assert rows[0]["val_bpc"] == rows[1]["val_bpc"] and {r["record"] for r in rows} == {record}
    assert f"| AVX2 | {rows[2]['val_bpc']:.6f} | {record:.6f} |" in proc.stdout


def test_a_point_to_train_again_that_the_study_does_not_hold_is_one_line(studies):
    cell = "linear_reservoir-xs-lr0.004-b8"
    for args, said in (((cell, "3e99"), "holds no record of"), (("nosuch-xs", "3e9"), "is not a cell name"),
                       ((cell, "lots"), "must be a number of FLOPs")):
        refused = run_script("bench/reproduce_point.py", studies / "micro", *args, check=False)
        assert refused.returncode != 0 and said in refused.stderr and "Traceback" not in refused.stderr


def test_generation_speed_is_the_fastest_pass_by_the_clock_it_is_given():
    """Greedy characters a second were one pass by the wall's clock: beside a study's two lanes one family's rate
    moved 2x between two measurements of the same model. It is now the fastest of three passes by the process's
    CPU time; here a clock that reads each pass as 2, 0.5 and 1 seconds gives the 0.5 s pass's rate."""
    from reservoir.config import parse_overrides
    from reservoir.models import build_model

    model = build_model("lstm", 20, parse_overrides(["SEQ_LEN=16", "LSTM.hidden=8"])).eval()
    readings = iter([0.0, 2.0, 10.0, 10.5, 20.0, 21.0])
    rate = chars_per_second(model, 20, batch=3, window=16, carried=True, clock=lambda: next(readings))
    assert rate == 3 * 8 / 0.5
    assert next(readings, None) is None  # three passes, each timed once


def test_generation_cost_is_measured_on_each_envelope_configuration_and_reported(studies, monkeypatch):
    """GENERATION=<study>: the reservoir's carried state costs the same at any context; the transformer's cache
    grows by 4 x layers x width FLOPs and 2 x layers x width numbers a character of context, capped at its window.
    The command it records names the study inside the checkout as the checkout does, however it was given."""
    import scaling  # its main, in this process
    from reservoir.platform import files

    micro = studies / "micro"
    monkeypatch.setattr(files, "REPOSITORY", studies.parent)  # the checkout whose results/ these studies are
    assert scaling.main([f"GENERATION={micro}"]) == 0  # an absolute path
    content = json.loads((micro / "generation-cost.json").read_text())
    assert content["command"] == "python scaling.py GENERATION=results/micro"
    rows = {r["family"]: r for r in content["rows"]}
    assert set(rows) == {"linear_reservoir", "transformer++"} and content["contexts"] == [128, 1024, 8192]
    reservoir, transformer = rows["linear_reservoir"], rows["transformer++"]
    assert reservoir["how"] == "carried state" and len(set(reservoir["flops_per_char"].values())) == 1
    assert len(set(reservoir["bytes"].values())) == 1 and reservoir["flops_per_char"]["128"] > 0
    window = transformer["window"]
    preset = MODELS["transformer"].sizes[transformer["cell"].split("-")[1]]  # the envelope cell's size preset
    layers, width = preset["n_layer"], preset["n_embd"]
    full = transformer["full_cache"]
    assert transformer["how"] == "key-value cache" and window < 128
    assert full["flops_per_context"] == 4 * layers * width  # q.k and a.v, 2 FLOPs a multiply-add
    assert full["bytes"]["1024"] - full["bytes"]["128"] == 896 * 2 * layers * width * 4  # keys and values, fp32
    windowed = transformer["flops_per_char"]
    assert windowed["8192"] == windowed["128"] < full["flops_per_char"]["8192"]  # its window caps what it reads
    assert all(rate > 0 for row in rows.values() for rate in row["chars_per_s"].values())
    assert content["machine"]["cores"] >= 1 and content["machine"]["load_average"] >= 0  # what the timings shared
    assert scaling.main([f"REPORT={studies}"]) == 0
    text = (studies / "REPORT.md").read_text()
    assert "What generating costs" in text and "    python scaling.py GENERATION=results/micro\n" in text
    assert (micro / "generation-cost.png").stat().st_size > 10_000
    assert "Measured before the envelope moved" not in text
    report = json.loads((micro / "frontier.json").read_text())
    report["envelope"]["linear_reservoir"] = [p | {"cell": "linear_reservoir-s-lr0.004-b8"}
                                              for p in report["envelope"]["linear_reservoir"]]
    said = "\n".join(format_generation(content, report, "##", "generation-cost.png"))
    assert "Measured before the envelope moved: linear_reservoir (linear_reservoir-xs-lr0.004-b8, now " in said
    assert "Not measured" not in said
    report["envelope"]["esn+mlp"] = [p | {"family": "esn+mlp"} for p in report["envelope"]["linear_reservoir"]]
    said = "\n".join(format_generation(content, report, "##", "generation-cost.png"))
    assert "Not measured: esn+mlp, families the study gained since. Run the command again." in said
    edited = content | {"budget": 1.0}
    (micro / "generation-cost.json").write_text(json.dumps(edited))
    with pytest.raises(SystemExit, match="generation-cost.json.*GENERATION="):  # one line: "error: ..."
        scaling.main([f"REPORT={micro}"])
    with pytest.raises(SystemExit, match="give it alone"):
        scaling.main([f"GENERATION={micro}", "SEED=2"])
    with pytest.raises(SystemExit, match="is not a frontier study's folder"):  # the folder of studies, not a study
        scaling.main([f"GENERATION={studies}"])


def test_a_point_variant_bench_refuses_a_bad_point_before_it_trains_anything(studies):
    good = "linear_reservoir-xs-lr0.004-b8@3e9"
    for point, said in (("nosuch-xs@3e9", "is not a cell name"), (good.replace("3e9", "lots"), "must be a number")):
        refused = run_script("bench/point_variants.py", "beta2", studies / "micro", good, point, check=False)
        assert refused.returncode != 0 and said in refused.stderr and "bits/char" not in refused.stdout
