"""Research rigour: several seeds, FLOP counts and FLOP budgets, the machine's load, epochs, evaluation
points spread over the budget, the windows-mode score beside the stream score, and the plots."""

import json
import math
import os
import subprocess
import sys
import time

import numpy as np
import pytest
import torch

from reservoir.config import ConfigError, parse_overrides
from reservoir.models import build_model
from reservoir.run import flops
from reservoir.run.evaluation import EvalPoints
from reservoir.run.records import read_metrics
from reservoir.run.tables import format_table
from tests.conftest import run_cli, run_script, run_then_sigkill


def records_of(run_dir) -> dict:
    return {(r["model"], r["seed"]): r for r in json.loads((run_dir / "summary.json").read_text())}


# --------------------------------------------------------------------- seeds


def test_seeds_train_every_model_once_per_seed_and_report_mean_and_sd(tmp_path):
    proc = run_cli(tmp_path, "MODELS=['esn','lstm']", "MAX_STEPS=8", "SEEDS=3,4,5", "RUN_NAME=s")
    run_dir = tmp_path / "results" / "s"
    records = records_of(run_dir)
    assert set(records) == {(m, s) for m in ("esn", "lstm") for s in (3, 4, 5)}
    esn = [records[("esn", s)]["val_bpc"] for s in (3, 4, 5)]
    assert len(set(esn)) == 3  # the seed changes the reservoir draw
    assert sorted(p.name for p in (run_dir / "checkpoints").iterdir()) == [
        "esn-seed4.pt", "esn-seed5.pt", "esn.pt", "lstm-seed4.pt", "lstm-seed5.pt", "lstm.pt"]
    assert {(r["model"], r["seed"]) for r in read_metrics(run_dir)} == set(records)
    line = next(row for row in proc.stdout.splitlines() if row.startswith("esn "))
    mean, sd = np.mean(esn), np.std(esn, ddof=1)
    assert f"{mean:.3f} ± {sd:.3f} sd" in line and line.split()[1] == "3/3"  # the seeds column: scored/trained
    assert "bits/char ± sd|ci" in proc.stdout
    samples = (run_dir / "samples.txt").read_text()
    assert "=== esn (seed 4)" in samples and "=== lstm (seed 5)" in samples

    # sample.py reads any seed's model; its default sampling seed is the training seed, as the run sampled
    for seed in (3, 5):
        out = run_script("sample.py", run_dir, "MODEL=esn", f"TRAIN_SEED={seed}", "STOP_AT_END=True",
                         "PROMPT=Once upon a time", check=False)
        assert out.returncode == 0, out.stderr
        written = next(s["text"] for s in records[("esn", seed)]["samples"] if s["prompt"] == "Once upon a time")
        assert out.stdout.strip() == written.strip() and f"training seed {seed})" in out.stderr
    bad = run_script("sample.py", run_dir, "TRAIN_SEED=9", check=False)
    assert bad.returncode != 0 and "TRAIN_SEED=9 is not a seed of this run (its seeds: 3, 4, 5)" in bad.stderr


def test_bad_seeds_are_refused():
    for value, message in (("a,b", "non-negative integers"), ("1,1", "each once"), ("[]", "at least one seed")):
        with pytest.raises(ConfigError, match=message):
            parse_overrides([f"SEEDS={value}"])
    assert parse_overrides(["SEEDS=7,8"])["SEEDS"] == [7, 8]
    assert parse_overrides(["SEEDS=1337"])["SEEDS"] == [1337]  # one seed, as one would type it


@pytest.mark.slow  # CI runs it apart (pytest -m slow); the README's command leaves it out
def test_a_killed_multi_seed_run_resumes_to_the_same_results(tmp_path):
    args = ["MODELS=['ngram','lstm']", "MAX_STEPS=60", "SEEDS=1,2", "CHECKPOINT_EVERY=10", "LOG_EVERY=5",
            "SAMPLE_TOKENS=5"]
    run_cli(tmp_path, *args, "RUN_NAME=whole")
    killed = run_then_sigkill(tmp_path, args, "killed",  # inside the second seed's lstm, after its first checkpoint
                              lambda run_dir: (run_dir / "checkpoints" / "lstm-seed2.pt").exists())
    assert ("lstm", 2) not in records_of(killed) and ("lstm", 1) in records_of(killed)
    resumed = run_cli(tmp_path, *args, "RESUME=killed")  # the same settings again are accepted
    assert "lstm (seed 1): finished" in resumed.stdout and "resuming at step" in resumed.stdout
    whole, again = records_of(tmp_path / "results" / "whole"), records_of(killed)
    assert set(again) == set(whole) == {(m, s) for m in ("ngram", "lstm") for s in (1, 2)}
    for key in whole:
        assert again[key]["val_loss"] == pytest.approx(whole[key]["val_loss"], rel=1e-5, abs=1e-6), key
    curve = [(r["model"], r["seed"], r["step"], round(r["val_loss"], 5)) for r in read_metrics(tmp_path / "results"
                                                                                                / "whole")]
    assert [(r["model"], r["seed"], r["step"], round(r["val_loss"], 5)) for r in read_metrics(killed)] == curve


# --------------------------------------------------------------------- FLOPs


def test_flop_count_of_an_lstm_step_is_six_times_its_products():
    config = parse_overrides(["LSTM.hidden=32", "LSTM.embed_dim=16"])
    model = build_model("lstm", 50, config)
    cost = flops.sgd_step(model, 50, batch_size=4, seq_len=10, steps_per_batch=3)
    products = 4 * 32 * (16 + 32) + 32 * 50  # the four gates and the head, per token
    assert cost.per_step == pytest.approx(6 * products * 4 * 10 * 3, rel=0.02)  # forward 2x, backward 4x
    assert cost.fixed == 0 and cost.flops(5) == 5 * cost.per_step


def test_ridge_fit_cost_is_linear_in_its_chunks():
    config = parse_overrides(["ESN.units=48"])
    model = build_model("esn", 30, config)
    gen = torch.Generator().manual_seed(0)
    chunk = (torch.randint(0, 30, (4, 16), generator=gen), torch.randint(0, 30, (4, 16), generator=gen))
    calibration = [(torch.randint(0, 30, (4, 16), generator=gen), torch.randint(0, 30, (4, 16), generator=gen))]
    cost = flops.ridge_fit(model, chunk, calibration, washout=0)
    assert cost.per_step >= 2 * 4 * 16 * 48 * 48  # at least the reservoir's W @ state, per token
    with flops.counter() as counter:  # torch's counter with the project's formulas (reservoir/run/flops.py)
        model.fit_ridge([chunk] * 5, calibration, washout=0, carry_state=True)
    assert counter.get_total_flops() == pytest.approx(cost.flops(5), rel=1e-9)
    assert cost.steps_within(cost.flops(3)) == 3 and cost.steps_within(None) is None


def test_flop_budget_stops_every_kind_of_fit_at_the_same_compute(tmp_path):
    budget = 2e9
    run_cli(tmp_path, "MODELS=['ngram','esn','lstm','transformer']", "MAX_STEPS=None", f"FLOP_BUDGET={budget}",
            "RUN_NAME=f")
    summary = {model: r for (model, _), r in records_of(tmp_path / "results" / "f").items()}
    for model in ("esn", "lstm", "transformer"):
        r = summary[model]
        if model == "esn":  # a ridge pass stops before the chunk that would pass the budget
            assert 0.5 * budget < r["train_flops"] <= budget
        else:  # an SGD fit stops at the first step that reaches the budget
            per_step = r["train_flops"] / r["train_steps"]
            assert r["train_flops"] >= budget and r["train_flops"] - per_step < budget, model
        assert r["flops_counted_as"].startswith("FlopCounterMode") and r["flops_per_token"] > 0
    order = parse_overrides([])["NGRAM"]["order"]
    assert summary["ngram"]["epochs"] == pytest.approx(1.0)  # 2e9 / order count updates: more than the data
    run_cli(tmp_path, "MODELS=['ngram']", "MAX_STEPS=None", "FLOP_BUDGET=250000", "RUN_NAME=n")
    ngram = records_of(tmp_path / "results" / "n")[("ngram", 1337)]
    assert ngram["train_tokens"] == 250000 // order and ngram["train_flops"] == ngram["train_tokens"] * order
    assert ngram["flops_counted_as"].startswith("count updates")
    proc = run_cli(tmp_path, "MODELS=['esn']", "MAX_STEPS=None", "FLOP_BUDGET=1000", "RUN_NAME=g", check=False)
    assert proc.returncode != 0 and "does not cover one chunk" in proc.stderr and "Traceback" not in proc.stderr


# --------------------------------------------------------------------- load, epochs


@pytest.mark.slow  # CI runs it apart (pytest -m slow); the README's command leaves it out
@pytest.mark.alone  # its busy loops would slow the tests beside it several-fold
def test_an_oversubscribed_machine_is_recorded_and_flagged(tmp_path):
    # twice as many busy loops as cores: the run gets about a third of them; the little it does besides its
    # 4 s of training (evaluation, samples) is kept small, since all of it runs that slowly
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(2 * os.cpu_count())]
    try:
        proc = run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=None", "TIME_BUDGET_S=4", "RUN_NAME=busy",
                       "FINAL_EVAL_TOKENS=1024", "TRAIN_EVAL_TOKENS=None", "SAMPLE_TOKENS=0")
    finally:
        for p in busy:
            p.kill()
            p.wait()
    load = records_of(tmp_path / "results" / "busy")[("lstm", 1337)]["machine_load"]
    assert load["oversubscribed"] and load["runnable_mean"] > load["cores"] + 0.5, load
    assert 0 < load["cpu_share"] < 0.9  # the busy processes took their share of the cores
    assert "oversubscribed" in proc.stderr and "FLOP_BUDGET" in proc.stderr
    lines = proc.stdout.splitlines()
    head = next(line for line in lines if line.startswith("model "))
    row = next(line for line in lines if line.startswith("lstm "))
    assert table_cell(head, row, "load").endswith("!") and "! the machine was oversubscribed" in proc.stdout
    assert table_cell(head, row, "bound by") == "seconds"  # the 4 s budget, not the default FLOP budget, ended it


def test_a_cpu_run_computes_with_one_thread_unless_omp_num_threads_says_more(monkeypatch):
    """A run took torch's default, a thread per core: beside one two-thread job on 2 cores its threads waited on
    each other and the default run took 1 h 40 min instead of 7 min (the transformer 6x slower than one thread)."""
    from reservoir.platform import device as dev

    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        info = dev.select_device({"DEVICE": "cpu"})
        assert torch.get_num_threads() == 1 and info.name == "CPU (1 threads)"
        monkeypatch.setenv("OMP_NUM_THREADS", "2")
        assert dev.select_device({"DEVICE": "cpu"}).name == "CPU (2 threads)" and torch.get_num_threads() == 2
        monkeypatch.setenv("OMP_NUM_THREADS", "two")
        with pytest.raises(dev.DeviceError, match="OMP_NUM_THREADS='two': the threads a CPU run computes with"):
            dev.select_device({"DEVICE": "cpu"})
    finally:
        torch.set_num_threads(before)


@pytest.mark.alone  # it measures the share of a core this process gets: work beside it takes some
def test_a_one_thread_run_that_kept_its_core_is_not_oversubscribed():
    """The CPU share counted every core: a one-thread run beside other work had a share of 0.5 at best, so any
    second job flagged it, though it got all the CPU its one thread could use."""
    from reservoir.platform.machine import MachineLoad

    with MachineLoad(threads=1, interval=0.05) as load:
        deadline = time.process_time() + 0.5
        while time.process_time() < deadline:
            pass
    report = load.report()
    if report["runnable_mean"] > report["cores"] + 0.5:  # others wanted our core too: it could not keep it
        pytest.skip(f"the machine is busy beside this test: {report}")
    assert report["cpu_share"] > 0.9, report
    with MachineLoad(threads=None, interval=0.05) as everything:
        time.sleep(0.3)
    assert everything.report()["cpu_share"] < 0.2


def test_a_fit_the_time_cap_cuts_short_of_its_flop_budget_says_so_in_its_row_plot_and_last_line(tmp_path,
                                                                                                   monkeypatch):
    """With TIME_BUDGET_S=600 as a default, a busy machine cut 4 of the default run's 8 fits (transformer++ at
    6.6% of its FLOP budget) and the table, final_bpc.png and the run's end said nothing of it."""
    import matplotlib.pyplot as plt

    figures = []
    close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig) or close(fig))
    proc = run_cli(tmp_path, "MODELS=['lstm','ngram']", "MAX_STEPS=None", "FLOP_BUDGET=1e12", "TIME_BUDGET_S=1",
                   "RUN_NAME=cut", "SAMPLE_TOKENS=0", "PLOTS=True")
    record = records_of(tmp_path / "results" / "cut")[("lstm", 1337)]
    assert record["bound_by"] == "seconds" and 0 < record["budget_spent"] < 0.95
    lines = proc.stdout.splitlines()
    head = next(line for line in lines if line.startswith("model "))
    row = next(line for line in lines if line.startswith("lstm "))
    ngram = next(line for line in lines if line.startswith("ngram "))
    assert table_cell(head, row, "bound by") == f"{100 * record['budget_spent']:.0f}%" and " cut " in row
    assert table_cell(head, ngram, "bound by") == "data"  # a one-pass fit the cap did not end
    assert "cut N%: TIME_BUDGET_S ended this fit" in proc.stdout
    assert "TIME_BUDGET_S=1 cut lstm short of the budget" in proc.stderr and "TIME_BUDGET_S=None" in proc.stderr
    bars = next(fig for fig in figures if fig is not None and "Final validation" in fig._suptitle.get_text())
    assert any("cut by TIME_BUDGET_S at" in t.get_text() for ax in bars.axes for t in ax.texts)
    assert sorted(bar.get_hatch() or "" for ax in bars.axes for bar in ax.patches) == ["", "//"]


def table_cell(head: str, row: str, column: str) -> str:
    """The value under a right-aligned column of format_table, wherever the column sits (a warm-up
    column appears after 'bound by' when a loaded machine's warm-up outlasts the budget)."""
    end = head.index(column) + len(column)
    return row[:end].split()[-1]


@pytest.mark.parametrize("runnable, share, flagged", [
    (7.8, 0.97, False),  # niced work: runnable, but it took little from the run
    (7.8, 0.55, True),  # busy peers at the same priority took half the cores
    (2.2, 0.50, False),  # the run itself used one core of two: nobody else wanted them
    (2.6, 0.89, True),  # just over both thresholds
])
def test_oversubscribed_needs_waiting_threads_and_a_lost_share(runnable, share, flagged):
    from reservoir.platform.machine import is_oversubscribed

    assert is_oversubscribed(runnable, 2, share) is flagged


def _load_while_busy(peers: int, idle_priority: bool) -> dict:
    """The MachineLoad report of this process using every core for 3 s while ``peers`` busy loops run,
    at the lowest scheduling class (SCHED_IDLE: they get a core only when nothing else wants it) or at
    normal priority."""
    from reservoir.platform.machine import MachineLoad

    def lowest():
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))

    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"], preexec_fn=lowest if idle_priority
                             else None) for _ in range(peers)]
    try:
        with MachineLoad(interval=0.2) as load:
            torch.set_num_threads(os.cpu_count())
            deadline = time.time() + 3
            while time.time() < deadline:  # this process wants every core, at normal priority
                torch.mm(torch.rand(800, 800), torch.rand(800, 800))
    finally:
        for p in busy:
            p.kill()
            p.wait()
    return load.report()


@pytest.mark.alone
@pytest.mark.skipif(not hasattr(os, "SCHED_IDLE"), reason="needs Linux's SCHED_IDLE scheduling class")
def test_low_priority_background_work_does_not_raise_the_flag_but_peers_do():
    alone = _load_while_busy(0, idle_priority=True)
    if alone["cpu_share"] < 0.9:  # other work on this machine already takes our cores: nothing to tell apart
        pytest.skip(f"the machine is busy before this test adds any work: {alone}")
    peers = 2 * os.cpu_count() + 2
    idle = _load_while_busy(peers, idle_priority=True)
    assert idle["runnable_mean"] > idle["cores"] + 0.5, idle  # the low-priority threads are counted runnable ...
    assert not idle["oversubscribed"], idle  # ... but took (almost) nothing from us: no flag
    normal = _load_while_busy(peers, idle_priority=False)
    assert normal["oversubscribed"] and normal["cpu_share"] < 0.9, normal  # peers that took our cores do


def test_epochs_are_reported_and_repeated_passes_said(tmp_path):
    proc = run_cli(tmp_path, "MODELS=['ngram','lstm']", "MAX_STEPS=None", "TOKEN_BUDGET=300000", "RUN_NAME=e")
    records = records_of(tmp_path / "results" / "e")
    lstm, ngram = records[("lstm", 1337)], records[("ngram", 1337)]
    train_tokens = ngram["train_tokens"]  # the n-gram counts the whole split once
    assert ngram["epochs"] == pytest.approx(1.0)
    assert lstm["epochs"] == pytest.approx(lstm["train_tokens"] / train_tokens, rel=1e-3) and lstm["epochs"] > 2
    assert "lstm: passed over its training data" in proc.stdout


# --------------------------------------------------------------------- evaluation points, both modes


def test_evaluations_are_spread_log_spaced_over_the_budget(tmp_path):
    points = EvalPoints(parse_overrides(["EVAL_POINTS=6"]))
    assert points.shares == pytest.approx(list(np.geomspace(0.01, 1, 6)[:-1]))
    due = [step for step in range(1, 101) if points.due(step, step / 100)]
    assert due == [1, 3, 7, 16, 40]  # the first step past each point; the end is the final evaluation
    resumed = EvalPoints(parse_overrides(["EVAL_POINTS=6"]), share_now=0.1)
    assert [step for step in range(11, 101) if resumed.due(step, step / 100)] == [16, 40]
    assert [s for s in range(1, 101) if EvalPoints(parse_overrides(["EVAL_EVERY=30"])).due(s, s / 100)] == [30, 60, 90]
    run_cli(tmp_path, "MODELS=['transformer']", "MAX_STEPS=100", "EVAL_POINTS=6", "RUN_NAME=p")
    steps = [r["step"] for r in read_metrics(tmp_path / "results" / "p")]
    assert steps == [1, 3, 7, 16, 40, 100]
    assert all(r.get("flops", 0) > 0 for r in read_metrics(tmp_path / "results" / "p"))


def test_stream_runs_also_report_the_windows_score(tmp_path):
    run_cli(tmp_path, "MODELS=['ngram','esn']", "MAX_STEPS=10", "RUN_NAME=stream")
    run_cli(tmp_path, "MODELS=['ngram','esn']", "MAX_STEPS=10", "RUN_NAME=windows", "EVAL_MODE=windows")
    stream, windows = records_of(tmp_path / "results" / "stream"), records_of(tmp_path / "results" / "windows")
    for key in stream:
        assert stream[key]["windows_val_bpc"] == pytest.approx(windows[key]["val_bpc"], rel=1e-6)
        assert stream[key]["windows_val_bpc_ci95"] > 0 and "windows_val_bpc" not in windows[key]
    assert stream[("esn", 1337)]["val_bpc"] < stream[("esn", 1337)]["windows_val_bpc"]  # its state helps it


# --------------------------------------------------------------------- tables and plots


def _record(model, seed, bpc, **extra):
    return {"model": model, "seed": seed, "val_bpc": bpc, "val_ppl": 2 ** bpc, "params_total": 10,
            "params_trainable": 5, "train_seconds": 1.0, "train_tokens": 100, "tokens_per_second": 100.0,
            "train_flops": 1e9, "epochs": 0.5, **extra}


def test_table_shows_the_interval_of_one_seed_and_the_sd_of_several():
    one = format_table([_record("esn", 1, 2.0, val_bpc_ci95=0.05, trained="readout")])
    assert "2.000 ± 0.050" in one and "seeds" not in one.splitlines()[0]
    assert "trained" in one.splitlines()[0] and " readout " in one.splitlines()[2]  # what training changes
    several = format_table([_record("esn", s, b) for s, b in ((1, 2.0), (2, 2.2), (3, 2.4))]
                           + [_record("lstm", 1, 1.5, val_bpc_ci95=0.01)])
    assert "2.200 ± 0.200" in several and "1.500 ± 0.010" in several
    rows = several.splitlines()
    assert rows[2].startswith("lstm") and rows[3].startswith("esn")  # best first
    assert "1.00e+09" in several and "0.50" in several  # FLOPs and epochs columns


def test_load_and_bound_by_are_read_by_column_when_a_warm_up_column_follows_them():
    # what CI's loaded machine printed: an oversubscribed fit whose warm-up outlasted its 4 s budget
    load = {"runnable_mean": 6.2, "cores": 2, "oversubscribed": True}
    table = format_table([_record("lstm", 1337, 3.0, machine_load=load,
                                  bound_by="seconds", compile_seconds=5.5, compile_over_budget=True)])
    head, _, row = table.splitlines()[:3]
    assert row.split()[-1] == "5.5*"  # the warm-up column comes last
    assert table_cell(head, row, "load") == "6.2/2!" and table_cell(head, row, "bound by") == "seconds"


def test_plot_help_lists_every_plot_and_each_model_keeps_its_colour(tmp_path):
    from reservoir.run import plots as plot_results

    help_text = run_script("plot_results.py", "--help", check=False).stdout
    assert all(name in help_text for name in plot_results.PLOTS) and "OUT=DIR" in help_text
    assert plot_results.family_colour("my_plugin") == plot_results.family_colour("my_plugin")
    rows = [{"model": "esn", "seed": s, "step": k, "tokens": 100 * (k + 1), "val_bpc": 3.0 - k + 0.1 * s}
            for s in (1, 2) for k in range(3)]
    xs, mean, low, high = plot_results.learning_curve(rows, "tokens")
    assert xs == [100, 200, 300] and mean == pytest.approx([3.15, 2.15, 1.15])
    assert low == pytest.approx([3.1, 2.1, 1.1]) and high == pytest.approx([3.2, 2.2, 1.2])


def test_comparison_plots_give_each_data_source_its_panel_and_label_runs_by_name(tmp_path):
    from reservoir.run import plots as plot_results

    run_cli(tmp_path, "MODELS=['ngram','lstm']", "MAX_STEPS=10", "RUN_NAME=small")
    run_cli(tmp_path, "MODELS=['ngram','lstm']", "MAX_STEPS=10", "RUN_NAME=large", "SYNTHETIC_STORIES=400",
            "SEEDS=1,2")
    runs = [plot_results.load_run(tmp_path / "results" / name) for name in ("small", "large")]
    groups = plot_results.by_data(runs)
    assert len(groups) == 2 and [run_label for run_label in map(plot_results.run_label, runs)] == ["small", "large"]
    out = tmp_path / "cmp"
    proc = run_script("plot_results.py", *(tmp_path / "results" / n for n in ("small", "large")), f"OUT={out}",
                      check=False)
    assert proc.returncode == 0, proc.stderr
    assert {p.name for p in out.iterdir()} == set(plot_results.PLOTS)
    import matplotlib.image

    wide = matplotlib.image.imread(out / "final_bpc.png").shape[1]
    run_cli(tmp_path, "MODELS=['ngram','lstm']", "MAX_STEPS=10", "RUN_NAME=same")
    plot_results.plot_runs([tmp_path / "results" / "small", tmp_path / "results" / "same"], tmp_path / "one")
    assert matplotlib.image.imread(tmp_path / "one" / "final_bpc.png").shape[1] < wide  # one panel, not two
    assert not math.isnan(runs[1]["summary"][0]["val_bpc"])


def _seed_record(seed, status, bpc):
    return {"model": "lstm", "trained": "everything", "params_total": 5, "params_trainable": 5, "train_seconds": 1.0,
            "train_tokens": 100, "tokens_per_second": 100.0, "bound_by": "steps", "train_flops": 1e9, "epochs": 0.1,
            "seed": seed, "status": status, "val_bpc": bpc, "val_ppl": None if bpc is None else 2.0 ** (bpc * 20),
            "val_bpc_ci95": None if bpc is None else 0.065, "diverged_at_step": 7 if bpc is None else None,
            "reason": "the training loss is nan" if bpc is None else None}


def test_the_table_says_how_many_seeds_scored_what_its_spread_is_and_names_a_diverged_seed():
    table = format_table([_seed_record(1, "finished", 4.585), _seed_record(2, "diverged", None)])
    row = next(line for line in table.splitlines() if line.startswith("lstm "))
    assert " 1/2 " in row and "4.585 ± 0.065 ci" in row  # one seed's interval, said to be one
    assert "lstm: seed 2 diverged at step 7 (the training loss is nan)" in table
    assert "e+27" in row and "0000000" not in row  # 2^91.7: a power of ten, not 28 digits
    both = format_table([_seed_record(1, "finished", 4.5), _seed_record(2, "finished", 4.6)])
    assert " 2/2 " in both and "± 0.071 sd" in both and "diverged" not in both


def test_every_column_of_a_row_with_a_diverged_seed_counts_the_scored_seeds_alone():
    from reservoir.run.tables import aggregate

    finished = _seed_record(1, "finished", 4.5)
    diverged = {**_seed_record(2, "diverged", None), "train_seconds": 0.2, "train_tokens": 20, "epochs": 0.02,
                "train_flops": 2e8}
    row = aggregate([finished, diverged])
    for key in ("val_bpc", "train_seconds", "train_tokens", "epochs", "train_flops", "tokens_per_second"):
        assert row[key] == finished[key], key
    table = format_table([finished, diverged])
    line = next(line for line in table.splitlines() if line.startswith("lstm "))
    assert "     100 " in line and " 0.10 " in line  # tokens and epochs of the seed that scored
    alone = aggregate([diverged])  # nothing scored: the diverged seed's own numbers, for its DIVERGED line
    assert alone["train_tokens"] == 20 and alone["val_bpc"] is None


def test_the_nanogpt_calibration_refuses_any_text_but_tiny_shakespeare(tmp_path):
    other = tmp_path / "input.txt"
    other.write_text("Once upon a time there was a cat.\n" * 1000)  # TinyStories-like, not Tiny Shakespeare
    refused = run_script("bench/calibrate_nanogpt.py", other, check=False)
    assert refused.returncode != 0 and "is not Tiny Shakespeare's input.txt" in refused.stderr


@pytest.mark.slow  # trains nanoGPT's 10.7M-parameter model four times; CI also runs the calibration itself
def test_the_nanogpt_calibration_checks_its_result_and_trusts_only_its_record(tmp_path):
    from tests.conftest import NO_TEXT, SHAKESPEARE_TEXT

    shakespeare = str(SHAKESPEARE_TEXT)
    if not SHAKESPEARE_TEXT.is_file():
        pytest.skip(NO_TEXT)
    quick = [f"RESULTS_DIR={tmp_path / 'out'}", f"CACHE_DIR={tmp_path / 'c'}", "MAX_STEPS=6", "EVAL_POINTS=1",
             "FINAL_EVAL_TOKENS=4096", "SAMPLE_TOKENS=0"]
    first = run_script("bench/calibrate_nanogpt.py", shakespeare, *quick, check=False)
    assert first.returncode == 1 and "OUTSIDE" in first.stdout and "6 steps" in first.stdout  # 6 steps: far off
    longer = run_script("bench/calibrate_nanogpt.py", shakespeare, *quick, "MAX_STEPS=8", check=False)
    assert "8 steps" in longer.stdout  # another setting: trained anew, not the 6-step verdict again
    summaries = sorted((tmp_path / "out").glob("nanogpt-calibration-*/summary.json"))
    assert len(summaries) == 2
    for summary in summaries:
        rows = json.loads(summary.read_text())
        rows[0]["windows_val_bpc"] = 1.88 / math.log(2)  # an edit that would read "within"
        summary.write_text(json.dumps(rows))
    edited = run_script("bench/calibrate_nanogpt.py", shakespeare, *quick, check=False)
    assert edited.returncode != 0 and "was edited after its run wrote it" in edited.stderr
    assert "within" not in edited.stdout and "Traceback" not in edited.stderr
    diverged = run_script("bench/calibrate_nanogpt.py", shakespeare, *quick, "LEARNING_RATE=1e4", check=False)
    assert diverged.returncode != 0 and "the calibration run diverged" in diverged.stderr
    assert "Traceback" not in diverged.stderr


# --------------------------------------------------------------------- pictures


def _colours_in(fig, families) -> list[tuple[str, str]]:
    """(family, colour) for every family a figure names: in a legend, as a line's direct label, a bar's tick label
    or a panel's title."""
    from matplotlib.colors import to_hex

    def colour_of(handle):
        line = handle.lines[0] if hasattr(handle, "lines") and isinstance(handle.lines, tuple) else handle
        return line.get_color() if hasattr(line, "get_color") else line.get_facecolor()

    found = []
    for ax in fig.axes:
        for handle, label in zip(*ax.get_legend_handles_labels(), strict=True):
            if label in families:
                found.append((label, to_hex(colour_of(handle))))
        for text in [*ax.texts, ax.title]:
            name = text.get_text().rsplit(" ", 1)[0] if text is not ax.title else text.get_text()
            if name in families and text.get_text():
                found.append((name, to_hex(text.get_color())))
        ticks = [t.get_text() for t in ax.get_yticklabels()]
        if ax.patches and len(ticks) == len(ax.patches):
            found += [(t, to_hex(p.get_facecolor())) for t, p in zip(ticks, ax.patches, strict=True) if t in families]
    return found


def test_every_plot_gives_a_family_its_own_colour_and_the_same_one_everywhere(tmp_path, monkeypatch):
    """generation-cost.png gave transformer++ and the LSTM other colours than frontier.png, and probes.png drew
    11 families with 10 colours (transformer++ and reservoir_attention+write the same blue)."""
    import matplotlib.pyplot as plt

    from reservoir.run.plots import FAMILY_COLOURS, plot_runs
    from reservoir.studies.frontier.generation import plot_generation, read_generation
    from reservoir.studies.frontier.report import plot_frontier, plot_isoflop
    from reservoir.studies.probes import plot_probes, read_records
    from tests.conftest import committed_copy

    committed = committed_copy(tmp_path / "committed")  # the project's records, not a user's own in results/
    study, probes = committed / "frontier-tinystories", committed / "probes"
    report = json.loads((study / "frontier.json").read_text())
    families = set(FAMILY_COLOURS)
    figures = [plot_frontier.__wrapped__(report), plot_isoflop.__wrapped__(report),
               plot_generation.__wrapped__(read_generation(study)), plot_probes.__wrapped__(read_records(probes))]
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig))
    plot_runs([committed / "default-run"], tmp_path / "plots")
    seen: dict[str, set[str]] = {}
    for fig in [*figures, *(f for f in drawn if f is not None)]:
        for family, colour in _colours_in(fig, families):
            seen.setdefault(family, set()).add(colour)
    assert {"transformer++", "lstm", "frozen_retention+write", "reservoir_attention+write", "ngram"} <= set(seen)
    assert all(len(colours) == 1 for colours in seen.values()), {f: c for f, c in seen.items() if len(c) > 1}
    assert len(set(FAMILY_COLOURS.values())) == len(FAMILY_COLOURS)  # no two families share one


def test_a_lone_point_says_what_it_is_and_a_control_is_labelled_by_what_it_switches(tmp_path, monkeypatch):
    """With EVAL_POINTS=1 the LSTM's lone square was "a one-pass fit (ridge readout, n-gram counts)"; the write gate
    over no reservoir (RESERVOIR_ATTENTION.reservoir=False write_gate=True) was labelled reservoir_attention+write."""
    import matplotlib.pyplot as plt

    from reservoir.run.plots import ONE_PASS_NOTE, SCORED_ONCE_NOTE

    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig))
    proc = run_cli(tmp_path, "MODELS=['lstm','reservoir_attention']", "MAX_STEPS=3", "EVAL_POINTS=1",
                   "PLOTS=True", "RESERVOIR_ATTENTION.reservoir=False", "RESERVOIR_ATTENTION.write_gate=True",
                   "RUN_NAME=once")
    curves = next(f for f in drawn if f is not None and "vs training tokens" in f._suptitle.get_text())
    said = " ".join(t.get_text().replace("\n", " ") for t in curves.axes[-1].get_legend().get_texts())
    assert SCORED_ONCE_NOTE in said and ONE_PASS_NOTE not in said, said
    assert "reservoir_attention+write reservoir=False" in said
    assert any(line.startswith("reservoir_attention+write reservoir=False ") for line in proc.stdout.splitlines())


def test_the_figures_a_newcomer_reads_say_what_the_tables_say(tmp_path, monkeypatch):
    """frontier.png labelled each line at its last point (Transformer++ 1.239 at 4e13) beside a table at 1.95e13
    (1.332) and drew no goal; a run's bpc_vs_flops.png spanned six decades for the n-gram's 4.7e6 FLOPs, and
    bpc_vs_train_flops.png put seven models on one vertical line, both legends showing the dashed n-gram as a dot;
    probes.png marked no chance level."""
    import matplotlib.pyplot as plt

    from reservoir.run.plots import plot_runs
    from reservoir.studies.frontier.report import headline, plot_frontier, table_budget
    from reservoir.studies.probes import PROBE_TASKS, chance, plot_probes, read_records
    from tests.conftest import committed_copy

    plt.close("all")  # what the tests before it drew and kept open
    committed = committed_copy(tmp_path / "committed")
    report = json.loads((committed / "frontier-tinystories" / "frontier.json").read_text())
    at = table_budget(report)
    assert f"| family (at {at:.3g} FLOPs)" in headline(report)
    fig = plot_frontier.__wrapped__(report)
    labels = {t.get_text() for t in fig.axes[0].texts}
    for family, points in report["envelope"].items():
        score = next(p["bpc_mean"] for p in points if p["budget"] == at)
        assert f"{family} {score:.3f}" in labels, (family, sorted(labels))
    assert any(label.startswith("the goal: within 5% of transformer++")
               for label in fig.axes[0].get_legend_handles_labels()[1])
    probes = plot_probes.__wrapped__(read_records(committed / "probes"))
    for ax in probes.axes[:-1]:
        task = ax.get_title()
        assert task in PROBE_TASKS and any(set(line.get_ydata()) == {chance(task)} for line in ax.lines), task
    drawn = []
    monkeypatch.setattr(plt, "close", lambda fig=None: drawn.append(fig))
    plot_runs([committed / "default-run"], tmp_path / "plots")
    by_name = {f.texts[0].get_text() if f.texts else f._suptitle.get_text(): f for f in drawn if f is not None}
    flops = next(f for title, f in by_name.items() if title.startswith("Validation bits/char vs training FLOPs"))
    assert flops.axes[0].get_xlim()[0] > 1e9  # the n-gram is a line across, not a point at 4.7e6
    compute = next(f for title, f in by_name.items() if title.startswith("Final bits/char vs training compute"))
    xs = [line.get_xdata()[0] for line in compute.axes[0].lines if len(line.get_xdata()) == 1]
    assert len(set(xs)) >= 7  # side by side, not on one vertical line
    for fig in (flops, compute):
        legend = fig.axes[0].get_legend() or fig.legends[0]
        handle = next(h for h, t in zip(legend.legend_handles, legend.get_texts(), strict=True)
                      if t.get_text() == "ngram")
        assert handle.get_linestyle() == "--" and handle.get_marker() in ("None", "", None)
    monkeypatch.undo()
    plt.close("all")
