"""Frontier studies (reservoir/studies/frontier/, scaling.py FRONTIER=/REPORT=): a micro frontier on the synthetic
corpus end to end, its records alone rebuilding the report, successive halving, the compute multiplier,
and every bad input as one line."""

import json
import shutil

import pytest
import torch

from reservoir.run import flops
from reservoir.studies.budgets import point_name
from reservoir.studies.frontier.analysis import build_frontier
from reservoir.studies.frontier.grid import FrontierError, parse_grid
from reservoir.studies.frontier.report import format_study
from tests.conftest import ROOT, run_in_process, run_script

# 2 families x 2 sizes x 2 rates x 2 budgets on the synthetic corpus: seconds per point
MICRO = ["FAMILIES=transformer++,lstm", "SIZES=xs,s", "LEARNING_RATES=2e-3,4e-3", "BATCH_SIZES=8", "BUDGETS=3e9,6e9",
         "MIN_STEPS=20", "MAX_TOKENS_PER_PARAM=1000", "ENVELOPE_SEEDS=2", "KEEP=1", "WITHIN=0", "STUDY=micro",
         "DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "EVAL_TOKENS=2048", "FINAL_EVAL_TOKENS=4096",
         "SAMPLE_TOKENS=20", "WARMUP_STEPS=5"]


def frontier(tmp_path, *args, check=True):
    return run_script("scaling.py", *MICRO, f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'cache'}",
                      *args, check=check, timeout=900)


@pytest.fixture(scope="module")
def micro(tmp_path_factory):
    tmp_path = tmp_path_factory.mktemp("frontier")
    proc = frontier(tmp_path, "WORKERS=2")
    return tmp_path, tmp_path / "results" / "micro", proc


def test_a_micro_frontier_writes_its_envelopes_plot_and_tables(micro):
    _, study, proc = micro
    report = json.loads((study / "frontier.json").read_text())
    assert (study / "frontier.png").stat().st_size > 10_000 and (study / "frontier.md").exists()
    assert set(report["envelope"]) == {"transformer++", "lstm"} and report["reference"] == "transformer++"
    for family, points in report["envelope"].items():
        assert [p["budget"] for p in points] == [3e9, 6e9], family
        for p in points:
            assert p["seeds"] == [1337, 1338] and p["bpc_sd"] is not None  # ENVELOPE_SEEDS=2
            assert p["bpc"] == min(r["val_bpc"] for r in report["grid_points"] if r["family"] == family
                                   and r["budget"] == p["budget"] and not r["envelope_seed"])
            assert p["train_loss"] is not None and p["epochs"] > 0
        assert report["n_opt"][family]["3000000000.0"] == points[0]["params_trained"]
    # the s presets take < 20 steps at 3e9: skipped there (listed with the reason), run at 6e9
    assert any(s["budget"] == 3e9 and "-s-" in s["cell"] and "steps < 20" in s["reason"] for s in report["skipped"])
    assert any(r["budget"] == 6e9 and r["size"] == "s" for r in report["grid_points"])
    # KEEP=1, WITHIN=0: of each family's two xs cells at 3e9 only the better goes on, and it branches there
    for family in ("transformer++", "lstm"):
        at_small = [r for r in report["grid_points"] if r["family"] == family and r["budget"] == 3e9
                    and not r["envelope_seed"]]
        best = min(at_small, key=lambda r: r["val_bpc"])
        at_large = {r["cell"]: r for r in report["grid_points"] if r["family"] == family and r["budget"] == 6e9
                    and r["size"] == "xs" and not r["envelope_seed"]}
        assert set(at_large) == {best["cell"]} and at_large[best["cell"]]["branched"]
        assert {"cell": next(r["cell"] for r in at_small if r is not best), "budget": 6e9} in report["not_run_pruned"]
    seeded = [line for line in proc.stdout.splitlines() if line.endswith("-seeds.log)") and "started" in line]
    assert "flops-6.00e09-seeds" in seeded[0] and "flops-3.00e09-seeds" in seeded[-1]  # the top budget's first
    spent = report["spent"]
    assert 0 < spent["flops"] < spent["flops_if_unbranched"]  # the branch did not pay for its stable phase again
    planned = report["planned"]  # what the study planned before it ran, beside what it spent
    assert 0 < planned["flops"] <= planned["flops_at_most"]
    assert "Planned before the run (PLAN=True's FLOPs)" in (study / "frontier.md").read_text()
    assert "lower envelope" in (study / "frontier.md").read_text() or "envelope" in proc.stdout


def test_the_same_command_again_trains_nothing(micro):
    tmp_path, study, _ = micro
    before = (study / "frontier.json").read_text()
    again = frontier(tmp_path, "WORKERS=2")
    assert "started" not in again.stdout and again.stdout.count("0 to train") == 2
    assert json.loads((study / "frontier.json").read_text())["envelope"] == json.loads(before)["envelope"]


def test_the_records_alone_rebuild_the_report_and_an_edited_record_is_refused(micro, tmp_path):
    _, study, _ = micro
    records = tmp_path / "committed"
    shutil.copytree(study, records, ignore=shutil.ignore_patterns("checkpoints", "logs", "frontier.*", "*.lock"))
    assert not list(records.rglob("*.pt"))
    proc = run_script("scaling.py", f"REPORT={records}")
    assert "| transformer++ (the transformer) |" in proc.stdout  # the headline table
    rebuilt, original = (json.loads((d / "frontier.json").read_text()) for d in (records, study))
    for key in ("envelope", "fits", "compute_multiplier", "isoflop", "lr_sensitivity", "skipped", "n_opt"):
        assert rebuilt[key] == original[key], key
    assert (records / "frontier.png").exists()
    point = next(records.glob("lstm-xs-*/flops-3.00e09"))
    summary = json.loads((point / "summary.json").read_text())
    summary[0]["val_bpc"] = 1.0
    (point / "summary.json").write_text(json.dumps(summary))
    edited = run_script("scaling.py", f"REPORT={records}", check=False)
    assert edited.returncode != 0 and "was edited after its run wrote it" in edited.stderr
    assert len(edited.stderr.strip().splitlines()) == 1 and "Traceback" not in edited.stderr
    assert json.loads((records / "frontier.json").read_text()) == rebuilt  # the last good report is kept


def test_a_report_of_a_folder_without_a_study_is_one_line(tmp_path):
    for folder in (tmp_path, tmp_path / "missing"):
        proc = run_script("scaling.py", f"REPORT={folder}", check=False)
        assert proc.returncode != 0 and ("holds no frontier study" in proc.stderr or "does not exist" in proc.stderr)
        assert len(proc.stderr.strip().splitlines()) == 1
    proc = run_script("scaling.py", f"REPORT={tmp_path}", "SEEDS=1", check=False)
    assert proc.returncode != 0 and "give it alone" in proc.stderr


def _row(family, budget, bpc, corpus="char tokenizer 1, 100 training and 10 validation characters"):
    return {"cell": f"{family}-xs", "family": family, "size": "xs", "learning_rate": 1e-3, "batch_size": 8,
            "budget": budget, "seed": 1337, "envelope_seed": False, "status": "finished", "val_bpc": bpc,
            "val_loss": bpc * 0.69, "train_loss": bpc * 0.69, "params_trained": 1000, "train_flops": budget,
            "train_tokens": 1, "train_steps": 1, "epochs": 1.0, "train_seconds": 1.0, "data_source": "files",
            "corpus": corpus, "spent_flops": budget, "spent_seconds": 1.0, "branched": False, "folder": "x"}


def test_the_compute_multiplier_is_the_reference_compute_for_the_same_loss():
    budgets = [1e12, 2e12, 4e12, 8e12]
    study = {"study": "t", "budgets": budgets, "grid": {"FAMILIES": ["transformer", "lstm"]}, "settings": [],
             "plan": {}}

    def loss(compute):  # the transformer's envelope: a power law in compute
        return 2.0 + 10.0 * (compute / 1e12) ** -0.5

    rows = [_row("transformer", b, loss(b)) for b in budgets] + [_row("lstm", b, loss(2 * b)) for b in budgets[:3]]
    report = build_frontier(rows, study)
    assert report["fits"]["transformer"]["converged"]
    assert report["fits"]["transformer"]["alpha"] == pytest.approx(0.5, rel=1e-3)
    multipliers = {r["budget"]: r for r in report["compute_multiplier"]["lstm"]}
    for b in budgets[:3]:  # the LSTM reaches at b what the transformer reaches at 2b: worth 2x its compute
        assert multipliers[b]["multiplier"] == pytest.approx(2.0, rel=0.1), b
    assert multipliers[4e12]["how"] == "interpolated"
    assert [r["multiplier"] for r in report["compute_multiplier"]["transformer"]] == pytest.approx([1.0] * 4)
    with pytest.raises(FrontierError, match="mix corpora"):
        build_frontier([*rows, _row("lstm", 8e12, 3.0, corpus="char tokenizer 2, 50 training and 5 validation "
                                    "characters")], study)
    with pytest.raises(FrontierError, match="no point records yet"):
        build_frontier([], study)


@pytest.mark.parametrize("args, message", [
    (["FAMILIES=gru"], "unknown family 'gru' in FAMILIES"),
    (["SIZES=xxl"], "size preset 'xxl' does not exist for transformer"),
    (["LEARNING_RATES=0,1e-3"], "LEARNING_RATES must be positive numbers, got '0'"),
    (["BATCH_SIZES=8.5"], "BATCH_SIZES must be positive integers"),
    (["POINTS_PER_DEVICE=0"], "POINTS_PER_DEVICE must be positive integers"),
    (["POINTS_PER_DEVICE=many"], "POINTS_PER_DEVICE must be a positive integer, auto or probe, got 'many'"),
    (["LEARNING_RATES="], "LEARNING_RATES is empty"),
    (["BATCH_SIZES=8,8"], "BATCH_SIZES names 8 twice (8,8): give each value once"),
    (["LEARNING_RATES=4e-3,0.004"], "LEARNING_RATES names 0.004 twice (0.004,0.004)"),
    (["FAMILIES=lstm,lstm"], "FAMILIES names 'lstm' twice"),
    (["WITHIN=2"], "WITHIN must be a fraction"),
    (["FRONTIER=True", "FLOP_BUDGET=1e12"], "FLOP_BUDGET is set by the frontier study for each point"),
    (["FRONTIER=True", "LR_SCHEDULE=cosine"], "needs LR_SCHEDULE='wsd'"),
    (["FRONTIER=True", "COOLDOWN_FRACTION=1.5"], "COOLDOWN_FRACTION must be between 0 and 1"),
])
def test_bad_frontier_input_is_one_line_and_makes_no_folder(tmp_path, args, message):
    proc = run_script("scaling.py", *args, f"RESULTS_DIR={tmp_path / 'results'}", "DATASET=synthetic", check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists()


def test_points_per_device_on_the_cpu_folds_a_familys_points_and_keeps_the_envelope(micro, tmp_path):
    """POINTS_PER_DEVICE=2 on the CPU: Transformer++'s points of one shape train folded, two to a process, the
    LSTM's one to a process (on a CPU core its fused kernel beats a fold); every point keeps its folder and
    record, and the envelope is the unfolded study's within 2e-4 (float32: the fold sums its products in
    another order)."""
    proc = frontier(tmp_path, "WORKERS=2", "POINTS_PER_DEVICE=2")
    assert "points folded, 2 members at most to a process" in proc.stdout and "POINTS_PER_DEVICE=2)" in proc.stdout
    study = tmp_path / "results" / "micro"
    folded = {p.parent.parent.name: json.loads(p.read_text())[0]["fit"].get("folded_with")
              for p in study.glob(f"*/{point_name(3e9)}/summary.json")}
    assert folded and all(k == (2 if cell.startswith("transformer++") else None) for cell, k in folded.items())
    # a member records its group's seconds; the report counts its share of the core, so families compare fairly
    seconds = {p.parent.parent.name: json.loads(p.read_text())[0]["train_seconds"]
               for p in study.glob(f"*/{point_name(3e9)}/summary.json")}
    rows = {r["cell"]: r for r in json.loads((study / "frontier.json").read_text())["grid_points"]
            if r["budget"] == 3e9 and not r["envelope_seed"]}
    assert rows.keys() == seconds.keys(), (sorted(rows), sorted(seconds))
    assert all(
        rows[cell]["train_seconds"] == pytest.approx(seconds[cell] / (folded[cell] or 1)) for cell in rows)
    ours, theirs = (json.loads((path / "frontier.json").read_text())["envelope"] for path in (study, micro[1]))
    assert ours.keys() == theirs.keys()
    for family in ours:
        assert [p["cell"] for p in ours[family]] == [p["cell"] for p in theirs[family]]
        assert [p["bpc"] for p in ours[family]] == pytest.approx([p["bpc"] for p in theirs[family]], rel=2e-4)


@pytest.mark.parametrize("xla", [False, True], ids=["a-cpu-core", "a-tpu-chip"])
def test_a_family_whose_draw_is_its_seeds_folds_the_points_of_one_seed_only(tmp_path, xla):
    """A linear reservoir's frozen draw is its seed's: a grid cell's rates, on the study's seed, fold together;
    a point with its other seeds stays a process of its own. Transformer++'s fold whatever their seeds, K
    members a process counting each seed of a point, and a point whose seeds nothing joins folds them alone
    (``A --and``); the LSTM's on XLA only (on a CPU core its fused kernel trains a point faster than a fold runs
    its cell)."""
    from reservoir.studies.frontier.folding import GROUP, fold_jobs, members
    from reservoir.studies.frontier.grid import Cell

    cells = {c.name: c for c in (Cell(family, "xs", rate, 4) for family in ("linear_reservoir", "transformer++",
                                                                              "lstm") for rate in (1e-3, 2e-3))}
    jobs = [(tmp_path / name / f"flops-1e12{suffix}", [*cell.settings(), "FLOP_BUDGET=1e12", *extra])
            for name, cell in cells.items() for suffix, extra in (("", []), ("-seeds", ["SEEDS=1338,1339"]))]
    out, groups = fold_jobs(jobs, cells, 4, xla, {folder: members(args) for folder, args in jobs})
    processes = sorted(sorted(f"{f.parent.name.split('-xs-')[0]}:{f.name}" for f in groups.get(first, [first]))
                       for first, _ in out)
    folded = [["lstm:flops-1e12"] * 2 + ["lstm:flops-1e12-seeds"], ["lstm:flops-1e12-seeds"]]
    lstm = folded if xla else [["lstm:flops-1e12"], ["lstm:flops-1e12"], ["lstm:flops-1e12-seeds"],
                               ["lstm:flops-1e12-seeds"]]
    assert processes == sorted([["linear_reservoir:flops-1e12"] * 2, ["linear_reservoir:flops-1e12-seeds"],
                                ["linear_reservoir:flops-1e12-seeds"], *lstm,
                                ["transformer++:flops-1e12"] * 2 + ["transformer++:flops-1e12-seeds"],
                                ["transformer++:flops-1e12-seeds"]])
    commands = [[[]] for _ in out]  # each process's points' arguments, split at GROUP
    for (_, args), parts in zip(out, commands, strict=True):
        for arg in args:
            parts.append([]) if arg == GROUP else parts[-1].append(arg)
    assert max(sum(members(p) for p in parts) for parts in commands) == 4
    lone = [parts for parts in commands if parts[-1] == []]  # ``A --and``: one point's seeds, folded alone
    assert [members(parts[0]) for parts in lone] == [2] * (2 if xla else 1)


def test_a_fold_probe_chooses_the_fastest_fold_that_gains_enough():
    from reservoir.studies.frontier.folding import FOLD_GAIN, FoldProbe

    assert FoldProbe(10.0, {2: 15.0, 4: 35.0, 8: 90.0}).chosen == 2  # 1.33x, 1.14x, 0.89x
    assert FoldProbe(10.0, {2: 16.0, 4: 28.0, 8: 70.0}).chosen == 4  # 1.25x, 1.43x, 1.14x
    assert FoldProbe(10.0, {2: 2 * 10 / FOLD_GAIN * 1.01, 4: 39.0}).chosen == 1  # gains below FOLD_GAIN: noise
    assert FoldProbe(10.0, {}).chosen == 1
    assert "a point a process" in FoldProbe(10.0, {2: 19.0}).describe()


def test_points_per_device_probe_folds_each_shape_as_its_probe_chose(tmp_path, capsys):
    """POINTS_PER_DEVICE=probe on a CPU core: each family, size and batch with two or more points in a stage is
    probed once (one point's step against 2, 4 and 8 folded), said in a line and kept in the study's
    logs/fold-probes.json; its points fold as many to a process as the probe chose; a family that does not fold
    here (the LSTM on a CPU core) and a shape with one point are not probed."""
    from reservoir.studies.frontier.folding import FOLDS_TRIED

    study, _ = micro_study(tmp_path, "POINTS_PER_DEVICE=probe", "LEARNING_RATES=1e-3,2e-3,4e-3", "SIZES=xs")
    (study.path / "logs").mkdir(parents=True)
    (study.path / "logs" / "fold-probes.json").write_text('{"lstm xs batch 8": {"one_')  # a log cut short
    cells = {c.name: c for c in study.cells()}
    one = next(c for c in cells.values() if c.family == "transformer++")
    budget = point_name(3e9)
    jobs = [(study.path / name / budget, [*cell.settings(), "FLOP_BUDGET=3e9"]) for name, cell in cells.items()]
    jobs.append((study.path / f"{one.name}-lone" / budget, []))  # not a grid cell's folder: never folded
    started = []  # what the study hands its runner (which would start a process a job): the jobs, folded

    def run_points(out, slots, finished, ended):
        started.extend(out)
        return [0] * len(out)
    study._run_all(jobs, run_points, 3e9)
    out, groups = started, study._groups
    probes = json.loads((study.path / "logs" / "fold-probes.json").read_text())
    assert set(probes) == {"transformer++ xs batch 8"}
    said = [line for line in capsys.readouterr().out.splitlines() if "on a CPU core: one point's step" in line]
    assert len(said) == 1 and said[0].startswith("[ReservoirNLP] frontier micro: transformer++ xs batch 8 on")
    probe = probes["transformer++ xs batch 8"]
    assert set(probe["folded_ms"]) == {str(k) for k in FOLDS_TRIED} and probe["one_ms"] > 0 and probe["device"] == "cpu"
    chosen = probe["points_per_process"]
    speedups = {int(k): int(k) * probe["one_ms"] / ms for k, ms in probe["folded_ms"].items()}
    assert chosen == 1 or speedups[chosen] == max(speedups.values())
    sizes = sorted(len(members) for members in groups.values())
    assert sizes == ([] if chosen == 1 else [min(chosen, 3)])  # three rates of one shape
    assert all(cells[m.parent.name].family == "transformer++" for members in groups.values() for m in members)
    assert len(out) == len(jobs) - sum(len(m) - 1 for m in groups.values())


def test_a_grid_whose_every_cell_is_skipped_is_one_line(tmp_path):
    proc = frontier(tmp_path, "MIN_STEPS=100000", check=False)
    assert proc.returncode != 0 and "every cell of the grid is skipped" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_the_grid_defaults_span_eight_times_in_parameters_per_family():
    from reservoir.config import parse_overrides
    from reservoir.models import build_model
    from reservoir.studies.frontier.grid import FAMILIES, SIZES, Cell

    grid = parse_grid({})
    for family in grid["FAMILIES"]:
        params = []
        for size in grid["SIZES"]:
            cell = Cell(family, size, 1e-3, 8)
            model = build_model(cell.model, 77, parse_overrides(cell.settings()))
            params.append(model.param_counts()["params_trainable"])
        assert params == sorted(params) and params[-1] >= 8 * params[0], (family, params)
    assert set(SIZES) == {model for model, _ in FAMILIES.values()}
    rates = grid["LEARNING_RATES"]
    assert 3 <= len(rates) <= 4 and all(b / a == pytest.approx(2) for a, b in zip(rates, rates[1:], strict=False))


@pytest.mark.slow
def test_one_worker_or_two_give_the_same_records(tmp_path):
    # one family's two cells, each branching at 6e9 from its own stable phase of 3e9: two points at a time
    smaller = ["FAMILIES=lstm", "SIZES=xs", "KEEP=2", "ENVELOPE_SEEDS=1"]
    records = []
    for workers in (1, 2):
        frontier(tmp_path / str(workers), *smaller, f"WORKERS={workers}")
        report = json.loads((tmp_path / str(workers) / "results" / "micro" / "frontier.json").read_text())
        records.append([(r["cell"], r["budget"], r["seed"], r["val_bpc"]) for r in report["grid_points"]])
    assert len(records[0]) == 4 and records[0] == records[1]


def test_root_scripts_stay_thin():
    assert len((ROOT / "scaling.py").read_text().splitlines()) < 220


def test_a_plan_says_what_a_study_costs_and_writes_nothing(tmp_path):
    proc = frontier(tmp_path, "PLAN=True", "HOSTS=2")
    assert "plan for frontier micro: nothing trained, nothing written" in proc.stdout
    rows = [line for line in proc.stdout.splitlines() if line.startswith("| 3e+09 FLOPs") or
            line.startswith("| 6e+09 FLOPs") or line.startswith("| envelope seeds (+1)")]
    assert len(rows) == 3, proc.stdout
    first = rows[0].split("|")
    assert int(first[2]) >= 1 and float(first[3]) > 0  # points, FLOPs
    assert "x 2 host(s): about" in proc.stdout and " s besides training" in proc.stdout
    # the estimate keeps KEEP cells a family; halving keeps those within WITHIN too, which it cannot foresee
    assert "left to train" not in proc.stdout  # a new study: all of it is left
    assert "else KEEP=" in proc.stdout and "within WITHIN=" in proc.stdout and "'at most' columns" in proc.stdout
    assert not (tmp_path / "results").exists()
    # it talks while it probes (16 min with no line on a loaded host): a bar, or a line every few seconds
    assert "plan for frontier micro: probing 4 families x sizes x batches" in proc.stderr
    assert "100% after" in proc.stderr


@pytest.mark.slow  # a plan in its own process, stopped by a signal while it probes
def test_a_plan_stopped_while_it_probes_says_so_in_one_line_and_leaves_nothing(tmp_path):
    """Stopped by SIGTERM after 7 minutes of probing, a plan printed only multiprocessing's "leaked semaphore
    objects" warning."""
    import signal
    import subprocess
    import sys
    import time

    args = [a for a in MICRO if not a.startswith(("SIZES=", "BATCH_SIZES="))]
    proc = subprocess.Popen([sys.executable, str(ROOT / "scaling.py"), *args, "SIZES=xs,s,m,l", "BATCH_SIZES=4,8,16",
                             "WORKERS=2", "PLAN=True", f"RESULTS_DIR={tmp_path / 'results'}",
                             f"CACHE_DIR={tmp_path / 'cache'}"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for line in proc.stdout:  # its data are ready: the probe comes next
        if "tokenizer" in line:
            break
    time.sleep(3)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    assert err.strip().splitlines()[-1] == ("[ReservoirNLP] plan for frontier micro stopped by SIGTERM: nothing "
                                            "trained, nothing written (the same command plans again)")
    assert "leaked" not in err and "Traceback" not in err and "| stage |" not in out
    assert not (tmp_path / "results").exists()


def micro_study(tmp_path, *args):
    """The micro frontier's FrontierStudy (nothing run) and its cells' measures, as scaling.py makes them."""
    from reservoir.config import split_arguments
    from reservoir.studies.frontier import FRONTIER_KEYS, FrontierStudy, measure_cells
    from reservoir.studies.ladder import STUDY_KEYS

    own, settings = split_arguments([*MICRO, *args, f"RESULTS_DIR={tmp_path / 'results'}",
                                     f"CACHE_DIR={tmp_path / 'cache'}"], (*STUDY_KEYS, *FRONTIER_KEYS))
    study = FrontierStudy.from_args(own, settings)
    return study, measure_cells(study)


def test_a_study_counts_each_family_and_size_s_step_once_and_each_cell_its_own_cost(tmp_path, monkeypatch):
    """A plan counted every cell's step afresh (40 counts for the TinyStories grid's 120 family x size x batch
    cells, 8 of its 25 s): the cells of a family and size share one count, each scaled to its own batch."""
    from reservoir.config import parse_overrides
    from reservoir.studies.budgets import step_cost

    study, measure = micro_study(tmp_path, "BATCH_SIZES=4,8,16")
    calls = []
    counted = flops._counted
    monkeypatch.setattr(flops, "_counted", lambda fn, model=None: calls.append(type(model).__name__) or
                        counted(fn, model))
    measured = {c.name: measure(c) for c in study.cells()}
    assert len(calls) == len({(c.family, c.size) for c in study.cells()}) == 4
    monkeypatch.setattr(flops, "_counted", counted)
    for cell in study.cells():  # each against a count of its own, made with nothing remembered
        config = parse_overrides([*study.settings, *cell.settings(), f"FLOP_BUDGET={study.budgets[0]!r}"])
        assert measured[cell.name][0] == step_cost(cell.model, config, measure.data)[0], cell.name


def test_a_plan_charges_each_point_what_its_probe_says_it_spends_besides_training(tmp_path):
    """Evaluating and sampling took a short point 8-34 s besides training, by family and size, where the plan
    charged 8 s to every point: each point now pays what its cell's probe measured (``besides_training``)."""
    from reservoir.studies.frontier.plan import estimate

    study, measure = micro_study(tmp_path)

    def no_training(cell):
        return 0.0

    no_training.besides_training = lambda cell: 100.0 if cell.family == "lstm" else 10.0
    plan = estimate(study, measure, no_training)
    extra = study.grid["ENVELOPE_SEEDS"] - 1
    first = plan["stages"][0]
    runnable = [c for c in study.cells() if study.plan(measure)[c.name][study.budgets[0]] is None]
    assert first["seconds"] == sum(100.0 if c.family == "lstm" else 10.0 for c in runnable) and runnable
    seeds = plan["stages"][-1]
    assert seeds["stage"] == f"envelope seeds (+{extra})" and seeds["seconds"] == extra * 110.0 * len(study.budgets)


def test_a_plan_keeps_as_many_cells_after_the_first_budget_as_the_study_s_own_halving_kept(tmp_path):
    """The plan kept KEEP cells a family after the first budget, where WITHIN kept far more (the grown TinyStories
    grid's 1.25e12 stage: 30 planned, 132 to train; the committed studies spent 2.0x and 3.8x the planned FLOPs):
    a study with records plans by what its halving kept, and a family without records by the share kept."""
    from reservoir.studies.frontier.plan import _kept, estimate

    assert [len(_kept({"a": list(range(10)), "b": list(range(10))}, 1e12, 3, r)) for r in
            ({}, {("a", 1e12): 6})] == [6, 12]  # KEEP each; a's 6 recorded, b's 60% share of 10
    assert len(_kept({"a": list(range(20)), "b": list(range(10)), "c": [0, 1]}, 1e12, 3, {("a", 1e12): 6})) == \
        6 + 3 + 2  # a's records; b: 30% of 10 is 3; c has only 2 cells
    assert len(_kept({"a": list(range(20))}, 1e12, 3, {("a", 1e12): 6, ("a", 2e12): 9})) == 6

    study, measure = micro_study(tmp_path)  # KEEP=1: one cell a family after the first budget

    def no_training(cell):
        return 0.0

    before = estimate(study, measure, no_training)["stages"][1]["points"]
    recorded = {(family, study.budgets[1]): 2 for family in study.grid["FAMILIES"]}
    after = estimate(study, measure, no_training, recorded=recorded)["stages"][1]
    assert before == len(study.grid["FAMILIES"]) and after["points"] == 2 * before <= after["points_at_most"]


def micro_study_with_its_first_budget_recorded(tmp_path, *args):
    """``micro_study``, its grid's plan and the cells runnable at its first budget, each holding a first-seed record
    there (the cells' scores ascending in grid order)."""
    study, measure = micro_study(tmp_path, *args)
    plan = study.plan(measure)
    first = study.budgets[0]
    runnable = [c for c in study.cells() if plan[c.name][first] is None]
    study.store.absorb({study.store.key(study.folder(c, first)): {
        "config": {}, "summary": [{"seed": study.config["SEED"], "val_bpc": 2.0 + 0.01 * k}]}
        for k, c in enumerate(runnable)})
    return study, measure, plan, runnable


def test_a_plan_counts_the_cells_halving_keeps_at_each_budget_the_study_s_records_decide(tmp_path):
    """Where every cell of a budget holds its first-seed record, halving's choice at the next budget is decided:
    the plan counted KEEP cells a family there (or the share recorded at that budget, none yet), where WITHIN kept
    them all (the grown TinyStories grid's 1.25e12 stage: 141 planned, 206 live). It now replays the study's own
    halving over its records (``FrontierStudy.halving``, which the study runs by)."""
    from reservoir.studies.frontier.plan import decided_cells, estimate, recorded_cells

    def no_training(cell):
        return 0.0

    for within, kept_per_family in (("0.5", None), ("0", 1)):
        study, measure, plan, runnable = micro_study_with_its_first_budget_recorded(tmp_path, f"WITHIN={within}")
        first, second = study.budgets
        live = decided_cells(study, plan)[second]
        both = [c for c in runnable if plan[c.name][second] is None]
        joining = [c for c in study.cells() if plan[c.name][second] is None and c not in runnable]  # too big before
        families = {c.family for c in both}
        survivors = len(both) if kept_per_family is None else kept_per_family * len(families)
        assert len(families) == 2 and len(both) > len(families) and joining
        assert len(live) == survivors + len(joining)
        stage = estimate(study, measure, no_training, recorded=recorded_cells(study))["stages"][1]
        assert stage["points"] == survivors + len(joining)


def test_a_plan_prices_a_cell_that_joins_at_a_later_budget_from_step_0(tmp_path):
    """A cell too large for the budget before has no stable phase to branch off, so its point trains from step 0
    (the study's point_args); the plan priced it as a branch, paying only the extension: on the growing Tiny
    Shakespeare study's 3.12e12 stage the write-gated family's joining cells spent 1.9x what the plan said."""
    import math

    from reservoir.studies.frontier.plan import estimate, recorded_cells

    study, measure, plan, _ = micro_study_with_its_first_budget_recorded(tmp_path, "WITHIN=0.5")
    first, second = study.budgets

    def one_second(cell):
        return 1.0

    one_second.besides_training = lambda cell: 0.0
    stage = estimate(study, measure, one_second, recorded=recorded_cells(study))["stages"][1]
    cooldown = study.config["COOLDOWN_FRACTION"]
    paid = {}
    for c in study.cells():
        if plan[c.name][second] is not None:
            continue
        steps = math.ceil(second / measure(c)[0])
        branched = plan[c.name][first] is None
        paid[c.name] = steps - (math.floor((1 - cooldown) * math.ceil(first / measure(c)[0])) if branched else 0)
    joining = [name for name in paid if plan[name][first] is not None]
    assert joining and len(joining) < len(paid)
    assert stage["points"] == len(paid) and stage["seconds"] == sum(paid.values())


def test_a_plan_expects_the_budget_after_one_in_progress_to_keep_the_share_of_cells_halving_keeps_of_those_recorded(
        tmp_path):
    """While a budget's points are still training, the plan priced the next one at KEEP cells a family (a fresh
    study) or the records' share there (none yet): on the committed studies, with half a budget recorded, that
    said 21 cells where halving kept 85 and 41. It now ranks the recorded cells as halving does (WITHIN of the
    best recorded) and keeps that share of each family's cells, with the cells that join at the next budget."""
    from reservoir.studies.frontier.plan import decided_cells, estimate, next_cells, recorded_cells

    study, measure = micro_study(tmp_path, "WITHIN=0.5")
    plan = study.plan(measure)
    first, second = study.budgets
    runnable = [c for c in study.cells() if plan[c.name][first] is None]
    both = [c for c in runnable if plan[c.name][second] is None]
    joining = [c for c in study.cells() if plan[c.name][second] is None and c not in runnable]
    assert {c.family for c in both} == {"transformer++", "lstm"} and len(both) == 4 and joining

    def record(scores):  # the first of each family's cells recorded at the first budget
        firsts = {}
        for c in both:
            firsts.setdefault(c.family, c)
        study.store.absorb({study.store.key(study.folder(c, first)): {
            "config": {}, "summary": [{"seed": study.config["SEED"], "val_bpc": scores[c.family]}]}
            for c in firsts.values()})

    record({"transformer++": 2.0, "lstm": 2.1})
    decided = decided_cells(study, plan)
    assert list(decided) == [first]  # in progress: its other cells have no record yet
    ((after, cells),) = next_cells(study, plan, decided).items()
    assert after == second and sorted(c.name for c in cells) == sorted(c.name for c in both + joining)
    stage = estimate(study, measure, lambda cell: 0.0, recorded=recorded_cells(study))["stages"][1]
    assert stage["points"] == len(both) + len(joining)

    study, measure = micro_study(tmp_path, "WITHIN=0.5")
    record({"transformer++": 2.0, "lstm": None})  # lstm's recorded cell diverged: it stops, the other goes on
    ((after, cells),) = next_cells(study, plan, decided_cells(study, plan)).items()
    kept_lstm = [c for c in cells if c.family == "lstm" and c not in joining]
    assert len(cells) == len(both) - 1 + len(joining) and len(kept_lstm) == 1
    assert study.first_seed_record(kept_lstm[0], first) is None


def test_a_plan_of_a_study_with_records_says_what_is_left_to_train_and_prices_the_lead_budget(tmp_path):
    """A continued or grown study's plan priced the whole study, the points its records hold too, and left out
    the lead budget (the committed TinyStories study: 9 points at 4e13, each costlier than any grid point): it
    now says what is left to train, stage by stage, and prices the leaders on every seed; the FLOPs a study
    records as planned before it runs stay the grid's and seeds' alone."""
    from reservoir.studies.frontier.plan import estimate, format_plan, planned_flops, recorded_cells

    def one_second(cell):
        return 1.0

    one_second.besides_training = lambda cell: 0.0
    study, measure = micro_study(tmp_path, "LEAD_BUDGET=1.2e10", "LEADERS=transformer++,lstm")
    before = estimate(study, measure, one_second, recorded={})
    lead = before["stages"][-1]
    assert lead["stage"].startswith("lead budget 1.2e+10 FLOPs (2 leaders x 2 seeds)") and lead["after_grid"]
    assert lead["points"] == 2 and lead["seconds"] > max(s["seconds"] for s in before["stages"][:-2]) / 2
    assert planned_flops(study, measure)["flops"] == sum(s["flops"] for s in before["stages"][:-1])
    assert before["device_seconds_left"] == before["device_seconds"]  # nothing recorded: all of it is left

    plan = study.plan(measure)
    first = study.budgets[0]
    runnable = [c for c in study.cells() if plan[c.name][first] is None]
    seed = study.config["SEED"]
    records = {study.store.key(study.folder(c, first)): {"config": {}, "summary": [{"seed": seed, "val_bpc": 2.0 + k}]}
               for k, c in enumerate(runnable)}
    winners = {c.family: c for c in reversed(runnable)}  # each family's lowest bits/char: its first cell
    best = winners["lstm"]
    records[study.store.key(study.folder(best, first, seeds=True))] = {
        "config": {}, "summary": [{"seed": s, "val_bpc": 2.0} for s in study.extra_seeds()]}
    study.store.absorb(records)
    after = estimate(study, measure, one_second, recorded=recorded_cells(study))
    grid, seeds = after["stages"][0], after["stages"][-2]
    assert grid["points"] == len(runnable) and grid["points_left"] == grid["seconds_left"] == 0
    assert seeds["points_left"] == seeds["points"] - 1  # lstm's envelope at the first budget has its seeds
    assert after["stages"][1]["points_left"] == after["stages"][1]["points"] > 0
    assert after["device_seconds_left"] == sum(s["seconds_left"] for s in after["stages"]) < after["device_seconds"]
    text = format_plan(after, study)
    assert "left: points | device time |" in text and "left to train:" in text
    assert "The stages after the grid are the points the study's command would start now" in text
    assert "left to train" not in format_plan(estimate(study, measure, one_second), study)  # before a study runs


def test_a_grown_study_s_plan_counts_the_seeds_and_leaders_its_other_families_recorded(tmp_path):
    """A study grown by a family (the committed studies with the ESN's) priced every envelope's seeds and every
    leader as left: a budget counted as seeded, and the leaders as carried, only once every family's cells there
    were recorded, the new family's too. A family's envelope is its own, so what its records hold is not counted
    as left (nor trained again)."""
    from reservoir.studies.frontier.plan import estimate, recorded_cells

    def one_second(cell):
        return 1.0

    one_second.besides_training = lambda cell: 0.0
    study, measure = micro_study(tmp_path, "LEAD_BUDGET=1.2e10", "LEADERS=transformer++,lstm")
    plan = study.plan(measure)
    seed, top, lead = study.config["SEED"], study.budgets[-1], study.stages["lead_budget"]
    new_family = study.cells()[0].family  # nothing recorded: the family the study was grown by
    old = {b: [c for c in study.cells() if c.family != new_family and plan[c.name][b] is None] for b in study.budgets}
    records = {study.store.key(study.folder(c, b)): {"config": {}, "summary": [{"seed": seed, "val_bpc": 2.0 + k}]}
               for b, cells in old.items() for k, c in enumerate(cells)}
    extra = [{"seed": s, "val_bpc": 2.0} for s in study.extra_seeds()]
    for b, cells in old.items():  # each budget's envelope (its first cell, the lowest) has its other seeds
        records[study.store.key(study.folder(cells[0], b, seeds=True))] = {"config": {}, "summary": extra}
    records[study.store.key(study.folder(old[top][0], lead))] = {"config": {}, "summary": [
        {"seed": seed, "val_bpc": 1.9}]}
    records[study.store.key(study.folder(old[top][0], lead, seeds=True))] = {"config": {}, "summary": extra}
    study.store.absorb(records)
    stages = estimate(study, measure, one_second, recorded=recorded_cells(study))["stages"]
    seeds = next(s for s in stages if s["stage"].startswith("envelope seeds"))
    leaders = next(s for s in stages if s["stage"].startswith("lead budget"))
    assert seeds["points_left"] == seeds["points"] - len(study.budgets)
    assert leaders["points"] == 2 and leaders["points_left"] == 1


def test_a_plan_whose_probe_ran_beside_other_work_says_its_times_are_too_high(tmp_path):
    """The same study's plan, probed beside two one-thread studies and then beside a test suite too, said 5.78 h
    and 7.59 h for one unchanged stage, and nothing told the reader which to trust: a probe that ran on an
    oversubscribed host (MachineLoad, as a run's records judge it) says so."""
    from reservoir.platform.machine import MachineLoad, is_oversubscribed
    from reservoir.studies.frontier.plan import estimate, format_plan

    study, measure = micro_study(tmp_path)
    plan = estimate(study, measure, lambda cell: 1.0)
    with MachineLoad() as load:
        pass
    measured = load.report()
    busy = {**measured, "runnable_mean": measured["cores"] + 2.0, "cpu_share": 0.5,
            "oversubscribed": is_oversubscribed(measured["cores"] + 2.0, measured["cores"], 0.5)}
    assert "The probe ran beside other work" in format_plan(plan, study, busy)
    assert f"{measured['cores'] + 2.0:g} threads wanted the host's {measured['cores']} cores" in \
        format_plan(plan, study, busy)
    idle = {**measured, "oversubscribed": False}
    assert "beside other work" not in format_plan(plan, study, idle) + format_plan(plan, study)


def test_a_plan_probes_each_cell_in_as_many_processes_at_once_as_the_study_runs_points(tmp_path):
    """Two one-thread points at once run slower than one alone (they share the cores' caches and memory): the
    plan's probe of a cell runs a copy in each of the study's two slots at once, forked as the points are."""
    import os

    from reservoir.studies.frontier.plan import probe_cells

    study, measure = micro_study(tmp_path, "FAMILIES=lstm", "WORKERS=2")
    probe = probe_cells(study, measure.data)
    try:
        cell = next(c for c in study.cells() if c.size == "xs")
        seconds = probe(cell)
        assert probe(cell) == seconds  # probed once a cell
        (copies,) = probe.copies.values()
    finally:
        probe.close()
    assert len(copies) == 2 and seconds == sum(c[0] for c in copies) / 2 > 0
    (_, first, start, end), (_, second, start2, end2) = copies
    assert len({first, second, os.getpid()}) == 3  # two processes of their own
    assert start < end2 and start2 < end  # at the same time
    solo, _ = micro_study(tmp_path, "FAMILIES=lstm", "WORKERS=1")
    alone = probe_cells(solo, measure.data)
    assert alone(cell) > 0 and alone.copies == {}  # one slot: probed here, alone
    assert alone.besides_training(cell) > 0  # its evaluations and samples, timed with its model


def test_a_studys_command_leaves_out_where_the_machine_that_ran_it_wrote():
    """The command a report prints is for a reader to repeat: the data it read (DATASET, DATA_DIR) belongs in it,
    the folders one machine wrote its results and caches to (RESULTS_DIR, CACHE_DIR) do not."""
    from reservoir.studies.frontier.grid import DEFAULT_BUDGETS, DEFAULTS, study_command

    report = {"study": "frontier-x", "budgets": list(DEFAULT_BUDGETS), "grid": dict(DEFAULTS), "stages": {},
              "settings": ["DATASET=shakespeare", "DATA_DIR=data/shakespeare", "RESULTS_DIR=../study",
                           "CACHE_DIR=/scratch/cache", "EVAL_POINTS=2"]}
    assert study_command(report) == ("python scaling.py FRONTIER=True STUDY=frontier-x DATASET=shakespeare "
                                     "DATA_DIR=data/shakespeare EVAL_POINTS=2")


def test_where_the_gap_comes_from_gives_each_gates_share_of_the_frozen_familys_gap():
    """The unfrozen control runs on the first seed alone; set against the means over seeds, Tiny Shakespeare's
    read +162% of frozen retention's gap closed where, on its own seed, it closed 67%: its share is of its seed's
    gap."""
    report = json.loads((ROOT / "results" / "frontier-tinystories" / "frontier.json").read_text())
    for gated in [f for f in report["envelope"] if "+" in f.removeprefix("transformer++")]:
        del report["envelope"][gated]  # the study's own gated families, if it has them: this test's are made up
    assert "Where the gap comes from" not in format_study(report, "frontier.png")  # no gated family
    frozen, reference = report["envelope"]["frozen_retention"], report["envelope"]["transformer++"]
    gaps = {p["budget"]: p["bpc_mean"] - next(r["bpc_mean"] for r in reference if r["budget"] == p["budget"])
            for p in frozen}
    report["envelope"]["frozen_retention+write"] = [p | {"bpc_mean": p["bpc_mean"] - gaps[p["budget"]] / 4}
                                                    for p in frozen]  # a quarter of each gap closed
    report["envelope"]["frozen_retention+forget"] = [p | {"bpc_mean": p["bpc_mean"] - gaps[p["budget"]]}
                                                     for p in frozen[-2:]]  # all of it, at the top two budgets
    text = format_study(report, "frontier.png")
    assert "Where the gap comes from" in text and "| budget | transformer++ | reservoir_attention |" not in text
    top = 19531250000000.0
    row = next(line for line in text.splitlines() if line.startswith(f"| {top:.3g} | ") and "(+25%)" in line)
    control = next(c for c in report["controls"] if c["family"] == "frozen_retention" and c["control"] == "unfrozen")
    assert "(+100%)" in row
    # the reference's run on the control's seed set where the control closes half its seed's gap
    at_top = next(p for p in reference if p["budget"] == top)
    at_top["bpc_per_seed"][at_top["seeds"].index(control["seed"])] = (
        control["envelope_bpc"] - 2 * (control["envelope_bpc"] - control["val_bpc"]))
    row = next(line for line in format_study(report, "frontier.png").splitlines()
               if line.startswith(f"| {top:.3g} | ") and "(+25%)" in line)
    assert f"{control['val_bpc']:.3f} (+50%)" in row
    own = next(p["bpc_mean"] for p in frozen if p["budget"] == top)
    assert f"({(own - control['val_bpc']) / gaps[top]:+.0%})" != "(+50%)"  # the means would say otherwise
    low = next(line for line in text.splitlines() if line.startswith("| 1.25e+12 | ") and "(+25%)" in line)
    assert low.count("–") == 2  # no forget gate and no control at that budget


def test_the_study_compares_the_best_reservoir_and_every_write_gated_one_with_the_transformer():
    from reservoir.studies.frontier.study import compared_families

    at = {"frozen_retention": 1.415, "frozen_retention+write": 1.43, "reservoir_attention+write": 1.40,
          "linear_reservoir": 1.49}
    assert compared_families(at) == ["reservoir_attention+write", "frozen_retention+write"]
    assert compared_families({"frozen_retention": 1.415, "linear_reservoir": 1.49}) == ["frozen_retention"]


def test_a_family_whose_comparison_is_written_stays_compared_when_another_becomes_the_best():
    """Tiny Shakespeare's grid grew to batch 4 and frozen_retention+write became its best reservoir at the top
    budget: reservoir_attention, the best of the smaller grid, kept its comparison of the earlier envelope, which
    the study no longer made (and its report said the study's command would make it again)."""
    from reservoir.studies.frontier.study import compared_families

    at = {"reservoir_attention": 2.355, "frozen_retention+write": 2.344, "reservoir_attention+write": 2.345,
          "linear_reservoir": 2.5}
    held = {"reservoir_attention", "deep_linear_reservoir"}  # the second has no envelope point at this budget
    assert compared_families(at, held) == ["frozen_retention+write", "reservoir_attention+write",
                                           "reservoir_attention"]
    assert compared_families(at, {"frozen_retention+write"}) == compared_families(at)


def _timed(family, seconds, bpc, processor="Intel(R) Xeon(R) Processor", cell=None, oversubscribed=False):
    return {**_row(family, 1e12, bpc), "cell": cell or f"{family}-{seconds}", "train_seconds": seconds,
            "processor": processor, "oversubscribed": oversubscribed}


def test_by_time_each_processor_is_a_view_of_its_own_and_a_class_is_read_within_the_reference_s_seconds():
    from reservoir.studies.frontier.timing import NOT_RECORDED, by_time, time_envelope

    slow = [_timed("linear_reservoir", 10, 2.0), _timed("linear_reservoir", 30, 2.1),  # slower and worse: off
            _timed("linear_reservoir", 50, 1.8), _timed("linear_reservoir", 80, 1.75, oversubscribed=True)]
    assert [p["seconds"] for p in time_envelope(slow)] == [10, 50, 80]
    rows = [*slow, _timed("transformer++", 20, 2.2), _timed("transformer++", 60, 1.7),
            _timed("frozen_retention", 40, 1.9), _timed("frozen_retention", 70, 2.5),  # slow, worse: reach alone
            _timed("transformer++", 100, 1.6),  # longer than any reservoir point here trained: not compared
            {**_timed("transformer++", 60, 1.0), "envelope_seed": True},  # an extra seed: not a grid point
            _timed("frozen_retention", 5, 1.0, processor="AMD EPYC"),  # as fast as can be, but on another processor
            _timed("transformer++", 7, 3.0, processor=None)]
    timed = by_time(rows, ["transformer++", "frozen_retention", "linear_reservoir"], "transformer++")
    views = timed["processors"]
    assert list(views) == ["AMD EPYC", "Intel(R) Xeon(R) Processor", NOT_RECORDED]
    intel = views["Intel(R) Xeon(R) Processor"]
    assert intel["points"] == 9 and intel["oversubscribed"] == 1
    at_20, at_60, at_100 = intel["matched"]
    assert at_100["classes"] == {"reservoir": {"beyond": 80}, "frozen transition": {"beyond": 70}}
    assert at_20["classes"]["reservoir"]["bpc"] == 2.0 and at_20["classes"]["frozen transition"] is None
    assert at_60["classes"]["reservoir"] == pytest.approx(
        {"family": "linear_reservoir", "bpc": 1.8, "cell": "linear_reservoir-50", "seconds": 50, "gap": 1.8 / 1.7 - 1})
    assert at_60["classes"]["frozen transition"]["bpc"] == 1.9  # the AMD machine's 1.0 in 5 s is not this one's
    assert views["AMD EPYC"]["matched"] == [] and views[NOT_RECORDED]["matched"][0]["classes"]["reservoir"] is None
    text = format_study(build_frontier(rows, {"study": "t", "budgets": [1e12], "grid": {
        "FAMILIES": ["transformer++", "frozen_retention", "linear_reservoir"], "LEARNING_RATES": [1e-3],
        "SIZES": ["xs"], "BATCH_SIZES": [8]}, "settings": [], "plan": {}}), "frontier.png")
    section = text.split("# By training time")[1].split("# N_opt")[0]
    assert "**AMD EPYC**: 1 points" in section and "No transformer++ point trained on this processor" in section
    assert "the best reservoir at 1 of 2 (at the longest it reached, 60 s: +5.9%, linear_reservoir)" in section
    assert "| 100 | 1.600 | beyond its longest (80 s) | – | beyond its longest (70 s) | – |" in section
    assert "| 60 | 1.700 | linear_reservoir: 1.800 (50 s) | +5.9% | frozen_retention: 1.900 (40 s) | +11.8% |" \
        in section
    assert "![each family's lower envelope against training seconds](frontier-time.png)" in section


def test_the_esn_section_sets_the_best_esn_beside_the_ridge_line_the_other_reservoirs_and_the_transformer():
    families = ["transformer++", "linear_reservoir", "esn+softmax", "esn+mlp"]
    scores = {"transformer++": (1.6, 1.4), "linear_reservoir": (1.7, 1.5), "esn+softmax": (2.0, 2.1),
              "esn+mlp": (2.1, 1.96)}
    rows = [_row(f, b, bpc) for f, pair in scores.items() for b, bpc in zip((1e12, 2e12), pair, strict=True)]
    ridge = [{**_row("esn", 0, bpc), "model": "esn", "name": name, "train_flops": flops, "train_split_bpc": None}
             for name, flops, bpc in (("esn-500", 4e11, 2.9), ("esn-4000", 1.6e12, 2.5))]
    study = {"study": "t", "budgets": [1e12, 2e12], "grid": {"FAMILIES": families, "LEARNING_RATES": [1e-3],
             "SIZES": ["xs"], "BATCH_SIZES": [8]}, "settings": [], "plan": {}}
    drawn = {"esn+softmax": {"spectral_radius": 0.7, "leak_rate": 1.0}, "esn+mlp": {"spectral_radius": 1.0,
                                                                                    "leak_rate": 0.9}}
    section = format_study({**build_frontier(rows, study, ridge), "esn_reservoirs": drawn},
                           "frontier.png").split("# The echo state network at its best")[1]
    assert ("one reservoir, tuned by a sweep (docs/runs.md): esn+softmax: spectral radius 0.7, leak rate 1; "
            "esn+mlp: spectral radius 1, leak rate 0.9.") in section
    # the best ESN is the best of its families at each budget: the softmax at 1e12, the MLP at 2e12
    assert ("| 1e+12 | 2.000 (1,000 units, 0.001, 8) | 2.100 (1,000 units, 0.001, 8) | 2.900 (esn-500) | "
            "linear_reservoir: 1.700 | 1.600 | +25.0% | +17.6% |") in section  # esn-4000 spent more than 1e12
    assert "| 2e+12 | 2.100 (1,000 units, 0.001, 8) | 1.960 (1,000 units, 0.001, 8) | 2.500 (esn-4000) |" in section
    assert "goes from +25.0% at 1e+12 FLOPs to +40.0% at 2e+12: it grows with compute" in section
    shared = format_study({**build_frontier(rows, study, ridge), "esn_reservoirs": dict.fromkeys(drawn, {
        "spectral_radius": 0.3})}, "frontier.png")  # families that drew one reservoir are named together
    assert "(docs/runs.md): esn+softmax and esn+mlp: spectral radius 0.3." in shared
    one = format_study({**build_frontier(rows, study, ridge), "esn_reservoirs": {"esn+mlp": drawn["esn+mlp"]}},
                       "frontier.png")  # a family with no point recorded yet is not named
    assert "(docs/runs.md): esn+mlp: spectral radius 1, leak rate 0.9. The grid" in one
    without = build_frontier([r for r in rows if not r["family"].startswith("esn")],
                             {**study, "grid": {**study["grid"], "FAMILIES": families[:2]}}, ridge)
    assert "echo state network at its best" not in format_study(without, "frontier.png")


def test_a_report_of_a_file_says_it_is_a_file(tmp_path):
    afile = tmp_path / "passwd"
    afile.write_text("root:x:0:0")
    proc = run_script("scaling.py", f"REPORT={afile}", check=False)
    assert proc.returncode == 1 and f"error: {afile} is a file, not a folder: REPORT=" in proc.stderr, proc.stderr
    assert "does not exist" in run_script("scaling.py", f"REPORT={tmp_path / 'none'}", check=False).stderr


def test_a_study_without_a_reference_family_names_none_in_its_report():
    """frontier.md said "At each of None's envelope points" for a study without a transformer."""
    rows = [_timed("linear_reservoir", 10, 2.0), _timed("frozen_retention", 40, 1.9)]
    text = format_study(build_frontier(rows, {"study": "t", "budgets": [1e12], "grid": {
        "FAMILIES": ["frozen_retention", "linear_reservoir"], "LEARNING_RATES": [1e-3], "SIZES": ["xs"],
        "BATCH_SIZES": [8]}, "settings": [], "plan": {}}), "frontier.png")
    assert "None" not in text.split("# By training time")[1], text.split("# By training time")[1][:1500]
    assert "no reference family to set the classes against" in text


def _costed(family, budget, bpc):
    """A grid point whose step does 1e9 FLOPs by the FLOP convention (batch 8): budget / 1e9 steps."""
    return {**_row(family, budget, bpc), "cell": f"{family}-xs", "train_steps": int(budget / 1e9)}


def _counts(**ratios):
    """Element-wise counts in which each family's step costs ``ratio`` x its products (all of it per sequence)."""
    return {"command": "python scaling.py ELEMENTWISE=t", "convention": "every float op", "torch": "x",
            "configurations": {f"{f.replace('_pp', '++')}/xs": {
                "products_per_sequence": 1e9 / 8, "elementwise_per_sequence": (r - 1) * 1e9 / 8,
                "elementwise_per_step": 0.0, "uncounted": {}, "micro_batches": 1} for f, r in ratios.items()}}


def test_under_the_element_wise_convention_each_point_costs_its_step_s_ratio_and_the_ranking_may_change():
    from reservoir.studies.frontier.accounting import elementwise_view

    budgets = [1e12, 2e12, 4e12, 8e12]

    def loss(compute):
        return 2.0 + 10.0 * (compute / 1e12) ** -0.5

    rows = [*(_costed("transformer++", b, loss(b)) for b in budgets),
            *(_costed("linear_reservoir", b, loss(b)) for b in budgets),  # level with it by FLOPs
            *(_costed("frozen_retention", b, loss(0.9 * b)) for b in budgets)]  # worth 0.9 of its FLOPs
    families = ["transformer++", "linear_reservoir", "frozen_retention"]
    study = {"study": "t", "budgets": budgets, "settings": [], "plan": {},
             "grid": {"FAMILIES": families, "LEARNING_RATES": [1e-3], "SIZES": ["xs"], "BATCH_SIZES": [8]}}
    report = build_frontier(rows, study)
    view = elementwise_view(rows, _counts(transformer_pp=1.1, linear_reservoir=1.5, frozen_retention=1.0), report)
    assert [p["cost"] for p in view["envelopes"]["linear_reservoir"]] == pytest.approx([1.5 * b for b in budgets])
    multipliers = {f: [r["multiplier"] for r in rows] for f, rows in view["compute_multiplier"].items()}
    assert multipliers["linear_reservoir"][1:] == pytest.approx([1.1 / 1.5] * 3, rel=1e-3)  # the first extrapolated
    assert multipliers["frozen_retention"][1:] == pytest.approx([0.9 * 1.1] * 3, rel=1e-2)
    at_4e12 = next(c for c in view["ranking_changes"] if c["budget"] == 4e12)
    assert ["linear_reservoir", "frozen_retention"] in at_4e12["swapped"]  # 1.0 against 0.9 by FLOPs; 0.73 to 0.99
    gap = view["gaps"][2]["classes"]["reservoir"]  # at the reference's cost, 1.1 x 4e12: the reservoir's fit there
    assert gap["family"] == "linear_reservoir" and gap["gap"] == pytest.approx(loss(4e12 * 1.1 / 1.5) / loss(4e12) - 1,
                                                                              rel=1e-3)
    assert gap["flop_convention"]["gap"] == pytest.approx(0, abs=1e-6) and gap["ci95"][0] < gap["gap"] < gap["ci95"][1]
    stale = _counts(transformer_pp=1.1, linear_reservoir=1.5, frozen_retention=1.0)
    stale["configurations"]["frozen_retention/xs"]["products_per_sequence"] *= 2  # the model's code changed since
    with pytest.raises(FrontierError, match="the counts are stale; count again"):
        elementwise_view(rows, stale, report)
    text = format_study({**report, "elementwise": view}, "frontier.png")
    section = text.split("# Under the element-wise convention")[1].split("# By training time")[0]
    assert "| linear_reservoir | 1.500–1.500 | 0.73 | 0.73 | 0.73 | 0.73 |" in section
    assert "at 4e+12, transformer++ now above linear_reservoir, frozen_retention now above linear_reservoir" in section


def test_the_committed_element_wise_counts_are_what_the_counter_says_today():
    """elementwise-cost.json is counted, not typed: one configuration counted again gives its numbers (under the torch
    that counted them: another release may dispatch other ops)."""
    import torch

    from reservoir.models import build_model, with_added_options
    from reservoir.run.elementwise import training_step
    from reservoir.studies.frontier.accounting import read_counts
    from reservoir.studies.store import PointRecords

    study = ROOT / "results" / "frontier-shakespeare"
    counts = read_counts(study)
    if counts["torch"] != torch.__version__:
        pytest.skip(f"counted under torch {counts['torch']}, this is {torch.__version__}")
    name, entry = min(counts["configurations"].items(), key=lambda kv: kv[1]["products_per_sequence"])
    recorded = PointRecords(study).config(ROOT / entry["point"])
    config = with_added_options(dict(recorded["effective_config"]))
    model = build_model(config["MODELS"][0], recorded["data"]["vocab_size"], config)
    again = training_step(model, recorded["data"]["vocab_size"], config["SEQ_LEN"], config["WEIGHT_DECAY"],
                          config["GRAD_CLIP"])
    assert {**again.__dict__, "point": entry["point"], "micro_batches": 1} == entry, name


@pytest.mark.parametrize("args, message", [
    (["ELEMENTWISE=results/frontier-shakespeare", "SEEDS=1"], "give it alone"),
    (["ELEMENTWISE=docs"], "is not a frontier study's folder"),
])
def test_bad_element_wise_input_is_one_line(args, message):
    proc = run_in_process("scaling.py", args)
    assert proc.returncode != 0 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_chi2_quantiles_are_the_tables_and_an_odd_df_has_none():
    from reservoir.studies.frontier.draws import chi2_quantile

    assert chi2_quantile(0.975, 2) == pytest.approx(7.3778, abs=1e-4)  # -2 ln 0.025
    assert chi2_quantile(0.025, 2) == pytest.approx(0.050636, abs=1e-6)
    assert chi2_quantile(0.975, 4) == pytest.approx(11.1433, abs=1e-4)
    assert chi2_quantile(0.025, 4) == pytest.approx(0.484419, abs=1e-6)
    assert chi2_quantile(0.5, 1) is None


def test_a_square_of_draws_and_seeds_splits_into_each_source_s_sd():
    """Additive effects alone leave no residual, and each source's sd is the sd of its effects; noise lands in the
    residual; a missing run leaves no split."""
    from reservoir.studies.frontier.draws import variance_split

    draw, seed = {1: -0.02, 2: 0.0, 3: 0.02}, {1: 0.001, 2: -0.001, 3: 0.0}
    square = {(d, s): 1.4 + draw[d] + seed[s] for d in draw for s in seed}
    split = variance_split(square)
    assert split["draw"]["sd"] == pytest.approx(0.02, rel=1e-9) and split["training"]["sd"] == pytest.approx(
        0.001, rel=1e-9) and split["residual"]["sd"] == pytest.approx(0, abs=1e-12)
    assert split["draw"]["df"] == 2 and split["residual"]["df"] == 4 and split["runs"] == 9
    low, high = split["draw"]["ci95"]
    assert low < 0.02 < high
    square[2, 2] += 0.01  # one run off: the interaction's, not the draw's or the seed's alone
    noisy = variance_split(square)
    assert noisy["residual"]["sd"] > 0 and noisy["draw"]["sd"] < split["draw"]["sd"] + 0.005
    del square[3, 3]
    assert variance_split(square) is None


def test_a_draw_seed_fixes_the_reservoir_across_seeds_and_the_seed_alone_the_training():
    from reservoir.config import ConfigError, parse_overrides
    from reservoir.models import build_model, draws_at_random

    one, two, own = (build_model("linear_reservoir", 30, parse_overrides(args)) for args in
                     (["SEED=1", "DRAW_SEED=7"], ["SEED=2", "DRAW_SEED=7"], ["SEED=1"]))
    assert torch.equal(one.lam_re, two.lam_re) and not torch.equal(one.lam_re, own.lam_re)
    assert not torch.equal(one.embed.weight, two.embed.weight) and torch.equal(one.embed.weight, own.embed.weight)
    assert draws_at_random("linear_reservoir", 30, parse_overrides([]))
    assert not draws_at_random("frozen_retention", 30, parse_overrides([]))  # decays set, not drawn
    with pytest.raises(ConfigError, match="DRAW_SEED must be >= 0"):
        parse_overrides(["DRAW_SEED=-1"])


@pytest.mark.slow
def test_draws_train_each_draw_on_each_seed_split_the_spread_and_train_nothing_again(tmp_path):
    """DRAWS=True on a micro study: the best readout-only reservoir's configuration drawn twice and trained twice
    (a 2 x 2 square, from step 0), the frozen-transition family and the transformer drawing nothing; the report
    splits the spread; the same command again trains nothing."""
    args = [a for a in MICRO if not a.startswith(("FAMILIES=", "SIZES=", "LEARNING_RATES="))]
    study = [*args, "FAMILIES=transformer++,linear_reservoir,frozen_retention", "SIZES=xs", "LEARNING_RATES=4e-3",
             "DRAWS=True", f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'cache'}"]
    first = run_in_process("scaling.py", study)
    assert first.returncode == 0, first.stderr[-2000:]
    assert "the draw against the seed at 6e+09 FLOPs: 2 runs to train" in first.stdout
    report = json.loads((tmp_path / "results" / "micro" / "frontier.json").read_text())
    rows = {r["family"]: r for r in report["draws"]["families"]}
    assert set(rows) == {"linear_reservoir", "frozen_retention", "transformer++"}
    split = rows["linear_reservoir"]["split"]
    assert split["runs"] == 4 and split["draws"] == split["seeds"] == [1337, 1338] and split["draw"]["ci95"] is None
    assert rows["frozen_retention"]["why"] == "its frozen part is set, not drawn"
    assert rows["transformer++"]["why"] == "nothing frozen" and set(rows["linear_reservoir"]["diagonal_minus_record"])
    text = (tmp_path / "results" / "micro" / "frontier.md").read_text()
    assert "# The draw against the seed" in text and "| draw \\ seed | 1337 | 1338 |" in text
    again = run_in_process("scaling.py", study)
    assert "the draw against the seed at 6e+09 FLOPs: 0 runs to train" in again.stdout


def test_a_subword_study_scores_bits_per_character_and_the_report_sets_it_beside_the_character_study(tmp_path):
    """TOKENIZER=bpe: a study's points train on subword tokens (several characters each) and every score it ranks is
    the validation's nats over its characters: the same unit as a character study's, so REPORT sets the two studies
    of one text in one table (here the committed micro study and its subword twin, one family: two points)."""
    import math

    from reservoir.data.tokens import prepare_data
    from tests.conftest import make_config, summary_of

    results = tmp_path / "results"
    shutil.copytree(ROOT / "tests" / "fixtures" / "studies" / "micro", results / "micro")
    settings = ["DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "EVAL_TOKENS=2048",
                "FINAL_EVAL_TOKENS=4096", "SAMPLE_TOKENS=0", "WARMUP_STEPS=5", "TOKENIZER=bpe", "VOCAB_SIZE=512"]
    run_script("scaling.py", "FRONTIER=True", "STUDY=micro-bpe", "FAMILIES=linear_reservoir", "SIZES=xs",
               "LEARNING_RATES=4e-3", "BATCH_SIZES=8", "BUDGETS=3e9,6e9", "MIN_STEPS=20", "MAX_TOKENS_PER_PARAM=1000",
               "ENVELOPE_SEEDS=1", "WORKERS=1", *settings, f"RESULTS_DIR={results}", f"CACHE_DIR={tmp_path / 'c'}",
               timeout=600)
    study = results / "micro-bpe"
    record = summary_of(study / "linear_reservoir-xs-lr0.004-b8" / "flops-6.00e09")["linear_reservoir"]
    data = prepare_data(make_config(tmp_path, *settings))
    scored = data.tokenizer.count_chars(data.val[1:record["eval_tokens"] + 1])
    assert scored / record["eval_tokens"] > 2  # subword tokens: characters a token
    assert record["val_bpc"] == pytest.approx(record["val_loss"] * record["eval_tokens"] / scored / math.log(2))
    report = json.loads((study / "frontier.json").read_text())
    point = report["envelope"]["linear_reservoir"][-1]
    assert point["bpc"] == record["val_bpc"] and report["corpus"].startswith("bpe tokenizer")
    run_script("scaling.py", f"REPORT={results}")
    text = (results / "REPORT.md").read_text()
    assert "## Characters or subwords: `micro` and `micro-bpe`" in text
    chars = json.loads((results / "micro" / "frontier.json").read_text())["envelope"]["linear_reservoir"]
    at = next(p for p in chars if p["budget"] == 6e9)
    assert (f"| 6e+09 | linear_reservoir | {at['bpc_mean']:.3f} ± {at['bpc_sd']:.3f} | {point['bpc']:.3f} | "
            f"{point['bpc'] - at['bpc_mean']:+.3f} |") in text
    assert "- 6e+09 FLOPs: the same ranking" in text  # one family in both: a ranking of one


def test_the_headline_gives_the_gap_where_the_same_text_was_read_with_another_tokenizer():
    """Under a character study's headline, REPORT says the best reservoir's gap at the largest budget both studies
    of its text reached, as characters and as subword tokens (here the committed micro study and a twin of it whose
    reservoir scores 10% lower); a study with no such twin gets no line."""
    import copy

    from reservoir.studies.frontier.analysis import report_from_records
    from reservoir.studies.frontier.report import goal_rows, headline_gaps

    chars = report_from_records(ROOT / "tests" / "fixtures" / "studies" / "micro")
    assert headline_gaps(chars, [chars]) == []
    twin = {**copy.deepcopy(chars), "study": "micro-bpe", "corpus": chars["corpus"].replace("char ", "bpe ", 1)}
    for point in twin["envelope"]["linear_reservoir"]:
        point["bpc_mean"] *= 0.9
    (line,) = headline_gaps(chars, [chars, twin])
    a, b = goal_rows(chars)[-1], goal_rows(twin)[-1]
    assert b["gap"] < a["gap"] and a["budget"] == b["budget"]
    assert line == (f"The same text read as bpe tokens (`micro-bpe`), the best reservoir's gap at {a['budget']:.3g} "
                    f"FLOPs is {b['gap']:+.1%} (linear_reservoir), against {a['gap']:+.1%} (linear_reservoir) in "
                    "characters.")
    assert headline_gaps(twin, [chars, twin]) == []  # the line is the character study's
