"""A study's life across machines and time: one runner per study folder, points that die with their study and
say why they stopped, a read-only RESULTS_DIR, a corpus that moved or changed, an edited study file."""

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from reservoir.studies.runner import run_points, start_point
from tests.conftest import ROOT, TINY, run_script, summary_of, write_corpus

# one family, one cell: a point long enough to be caught running (killed long before it ends)
LONG = ["FAMILIES=lstm", "SIZES=xs", "LEARNING_RATES=4e-3", "BATCH_SIZES=8", "BUDGETS=2e12,4e12", "MIN_STEPS=20",
        "MAX_TOKENS_PER_PARAM=1e9", "ENVELOPE_SEEDS=1", "STUDY=busy", "DATASET=synthetic", "SYNTHETIC_STORIES=300",
        "SEQ_LEN=32", "EVAL_TOKENS=2048", "WARMUP_STEPS=5", "WORKERS=2"]


def _points_of(results: Path) -> list[int]:
    """The pids of TinyStories.py processes writing under ``results``."""
    pids = []
    for proc in Path("/proc").iterdir():
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ")  # a forked point's title: one string
        except OSError:
            continue
        if b"TinyStories.py " in cmdline and str(results).encode() in cmdline:
            pids.append(int(proc.name))
    return pids


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="lists processes through /proc (Linux)")
def test_a_second_runner_of_a_study_is_one_line_and_a_killed_study_takes_its_points_with_it(tmp_path):
    results = tmp_path / "results"
    args = [sys.executable, str(ROOT / "scaling.py"), *LONG, f"RESULTS_DIR={results}", f"CACHE_DIR={tmp_path / 'c'}"]
    first = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        for line in first.stdout:  # the study has locked its folder and started its point
            if "started busy/" in line or "lstm-xs" in line and "started" in line:
                break
        second = run_script("scaling.py", *args[2:], check=False)  # the first holds the lock; this one is ours
        assert second.returncode != 0, second.stdout
        assert f"STUDY busy ({results / 'busy'}) is being run by pid {first.pid} on " in second.stderr
        assert "Traceback" not in second.stderr and len(second.stderr.strip().splitlines()) == 1
        deadline = time.time() + 60  # a point forked from the fork server: its process gets its title as it starts
        while not _points_of(results) and time.time() < deadline:
            time.sleep(0.2)
        assert _points_of(results), "the point is running"
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    deadline = time.time() + 120  # each point got a SIGTERM from the kernel: it checkpoints and stops
    while _points_of(results) and time.time() < deadline:
        time.sleep(0.5)
    assert not _points_of(results), "points trained on after their study was killed"


def test_a_slot_takes_its_next_point_as_soon_as_its_last_one_ends(tmp_path, capfd):
    """A shared study claimed its points in batches of its slot count, and a slot idled while the batch's slowest
    point ran: now a slot asks for its next point (``more``) as its last ends (``ended``)."""
    def point(name, *args):
        folder = tmp_path / "study" / name
        return folder / "flops-1", [*TINY, f"RESULTS_DIR={folder}", f"CACHE_DIR={tmp_path / 'cache'}",
                                    "RUN_NAME=flops-1", "SAMPLE_TOKENS=0", *args]

    slow = point("slow", "MODELS=['lstm']", "MAX_STEPS=500")
    offered = [point("quick-1", "MODELS=['ngram']", "MAX_STEPS=1")]
    ends = []
    codes = run_points([slow, point("quick-0", "MODELS=['ngram']", "MAX_STEPS=1")], 2,
                       more=lambda: offered.pop(0) if offered else None, ended=lambda k, code: ends.append((k, code)))
    said = capfd.readouterr().out
    assert codes == [0, 0, 0], said
    # the second quick point was asked for when the first ended, and ran beside the slow one
    assert ends == [(1, 0), (2, 0), (0, 0)], said
    assert said.index("started quick-1/flops-1") < said.index("finished: slow/flops-1")


def test_a_point_forked_from_the_fork_server_trains_as_a_new_python_would(tmp_path):
    """A CPU point is forked from a process that imported torch long ago, beside other tests: the same scores,
    threads and samples as the same point started as a new Python, and the exit code a new Python gives."""
    said, scores = {}, {}
    for forked in (True, False):
        name = "forked" if forked else "new"
        args = [*TINY, "MODELS=['lstm','esn']", "MAX_STEPS=6", f"RESULTS_DIR={tmp_path / name}",
                f"CACHE_DIR={tmp_path / 'cache'}", "RUN_NAME=p", "SAMPLE_TOKENS=20"]
        with (tmp_path / f"{name}.log").open("w") as log:
            proc = start_point(args, {**os.environ, "OMP_NUM_THREADS": "1"}, on_cpu=forked, log=log)
            assert isinstance(proc, subprocess.Popen) != forked
            assert proc.wait() == 0
        said[name] = (tmp_path / f"{name}.log").read_text()
        scores[name] = {model: (r["val_bpc"], r["train_loss"], r["samples"])
                        for model, r in summary_of(tmp_path / name / "p").items()}
    assert scores["forked"] == scores["new"]
    assert "CPU (1 threads)" in said["forked"] and "CPU (1 threads)" in said["new"]
    bad = [*TINY, "SEQ_LEN=0", f"RESULTS_DIR={tmp_path / 'bad'}"]
    with (tmp_path / "bad.log").open("w") as log:
        assert start_point(bad, dict(os.environ), on_cpu=True, log=log).wait() == 1
    assert "error: SEQ_LEN must be" in (tmp_path / "bad.log").read_text()


def test_a_point_that_stops_says_why_in_the_study_s_terminal(tmp_path, capfd):
    study = tmp_path / "study"
    jobs = [(study / "cell" / f"flops-{k}", ["MODELS=['lstm']", "SEQ_LEN=0", f"RESULTS_DIR={tmp_path}"])
            for k in range(2)]
    assert run_points(jobs, 2) == [1, 1]
    said = capfd.readouterr().out
    assert "stopped (exit code 1): cell/flops-0: error: SEQ_LEN must be" in said, said
    # a point whose records are complete when it exits non-zero (it finished as the study was stopped)
    assert run_points(jobs[:1], 2, finished=lambda folder: True) == [1]
    said = capfd.readouterr().out
    assert "finished: cell/flops-0 (its records are complete; it exited 1 as the study stopped)" in said, said


def test_a_study_in_a_read_only_results_dir_is_one_line(tmp_path):
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(readonly)],
                      capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root in a machine that allows mounts)")
    try:
        for study in (["FRONTIER=True", "FAMILIES=lstm", "SIZES=xs", "BUDGETS=3e9,6e9", "MIN_STEPS=20"],
                      ["MODELS=lstm", "BUDGETS=3e9,6e9"]):
            proc = run_script("scaling.py", *study, "DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32",
                              f"RESULTS_DIR={readonly}/results", f"CACHE_DIR={tmp_path / 'c'}", check=False)
            assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
            assert "the file system is read-only; choose a writable RESULTS_DIR" in proc.stderr
            assert len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    finally:
        subprocess.run(["umount", str(readonly)], capture_output=True)


SMALL = ["FAMILIES=lstm", "SIZES=xs", "LEARNING_RATES=4e-3", "BATCH_SIZES=8", "BUDGETS=3e9,6e9", "MIN_STEPS=20",
         "MAX_TOKENS_PER_PARAM=1000", "ENVELOPE_SEEDS=1", "STUDY=small", "SEQ_LEN=32", "EVAL_TOKENS=2048",
         "FINAL_EVAL_TOKENS=4096", "SAMPLE_TOKENS=0", "WARMUP_STEPS=5"]


def test_a_study_follows_its_data_to_another_folder_and_refuses_another_corpus(tmp_path):
    where = [f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'c'}"]
    data = write_corpus(tmp_path / "data", 1)
    run_script("scaling.py", *SMALL, *where, f"DATASET={data}", timeout=900)
    study = tmp_path / "results" / "small"
    before = {p: p.stat().st_mtime_ns for p in study.rglob("*") if p.is_file() and p.name != ".lock"}
    other = write_corpus(tmp_path / "other", 2)
    refused = run_script("scaling.py", *SMALL, *where, f"DATASET={other}", check=False)
    assert refused.returncode != 0 and "STUDY small trained on another corpus (char tokenizer" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1 and "Traceback" not in refused.stderr, refused.stderr
    after = {p: p.stat().st_mtime_ns for p in study.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before  # nothing trained, nothing rewritten
    moved = tmp_path / "elsewhere"
    data.rename(moved)
    again = run_script("scaling.py", *SMALL, *where, f"DATASET={moved}/")
    assert "6e+09 FLOPs: 1 cells, 1 already finished, 0 to train" in again.stdout
    import shutil  # the top budget lost: it branches again off 3e9's stable phase, trained on the old path

    cell = study / "lstm-xs-lr0.004-b8"
    shutil.rmtree(cell / "flops-6.00e09")
    (study / "points.jsonl").unlink()
    trained = run_script("scaling.py", *SMALL, *where, f"DATASET={moved}", timeout=900)
    assert "holds 0 of the 2 points the frontier-study.json beside it records" in trained.stderr  # said, not refused
    point = json.loads((cell / "flops-6.00e09" / "summary.json").read_text())[0]
    assert point["fit"]["branched_at_flops"] > 0
    for committed in ("points.jsonl", "frontier-study.json", "frontier.md"):  # they name no machine's paths
        text = (study / committed).read_text()
        assert not re.search(r"(?<![\w.])" + re.escape(str(tmp_path)), text) and "elsewhere" in text, committed


def test_more_workers_than_cores_is_said_once(capfd):
    from reservoir.platform.machine import usable_cores

    too_many = usable_cores() + 3
    assert run_points([], too_many) == [] and run_points([], too_many) == []
    said = capfd.readouterr().err
    assert said.count(f"WORKERS={too_many} runs more points at once than the {usable_cores()} cores") == 1, said
    run_points([], usable_cores())
    assert "WORKERS=" not in capfd.readouterr().err


TWO_POINTS = [*LONG[:2], "LEARNING_RATES=4e-3,2e-3", *LONG[3:], "CHECKPOINT_EVERY=10", "CHECKPOINT_EVERY_S=0"]


STOPS = {  # how a study is stopped, and the signal it ends with
    "timeout": signal.SIGTERM,  # timeout(1): the TERM to its command, then to the command's whole group
    "ctrl-c": signal.SIGINT,  # a terminal's Ctrl-C: SIGINT to the whole foreground group
    "kill-pid": signal.SIGTERM,  # kill -TERM <pid>
    "kill-group": signal.SIGTERM,  # kill -TERM -<pgid>, as a batch scheduler sends it
    "pid-then-group": signal.SIGTERM,  # what timeout does when a busy host runs the study between its two kills
}


def _stopped_study(tmp_path, stop):
    """A two-point study stopped, once its points have checkpointed, in one of the ways of ``STOPS``."""
    results = tmp_path / "results"
    args = [sys.executable, str(ROOT / "scaling.py"), *TWO_POINTS, f"RESULTS_DIR={results}", f"CACHE_DIR={tmp_path}/c"]
    if stop == "timeout":  # a TERM to timeout itself does what its time running out does (coreutils' cleanup)
        args = ["timeout", "-s", "TERM", "600", *args]
    proc = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)  # its own group, as a terminal gives a command
    try:
        deadline = time.time() + 240
        while len(list(results.glob("busy/*/*/checkpoints/*.pt"))) < 2 and time.time() < deadline:
            time.sleep(0.1)
        assert len(list(results.glob("busy/*/*/checkpoints/*.pt"))) == 2, "both points checkpointed"
        if stop == "pid-then-group":
            os.kill(proc.pid, signal.SIGTERM)
            time.sleep(0.005)  # the study's handler has run, the points' have too, and they are saving
        (os.killpg if stop in ("ctrl-c", "kill-group", "pid-then-group") else os.kill)(proc.pid, STOPS[stop])
        out, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return proc.returncode, out, err, results


@pytest.mark.parametrize("stop, attempt", [pytest.param(stop, k, marks=[pytest.mark.slow] if k else [])
                                           for stop in STOPS for k in range(5)])
def test_a_stopped_study_checkpoints_every_point_at_the_step_it_reached_however_the_signal_is_sent(
        tmp_path, stop, attempt):
    """A process-group SIGTERM reached each point twice (from the kernel, then from the study): the second
    stopped it at once (exit 255, 125 steps after its last checkpoint lost, no RESUME line). Under timeout the
    study itself got the TERM twice (to its pid, then to its group) and passed both on: 2 stops in 3 lost steps.
    Each way once in the quick suite, five times in the slow one."""
    signum = STOPS[stop]
    code, out, err, results = _stopped_study(tmp_path, stop)
    assert code == 128 + signum, out[-3000:] + err[-3000:]
    stopped = [line for line in out.splitlines() if line.startswith("[ReservoirNLP] stopped (exit code")]
    assert len(stopped) == 2 and all(f"exit code {128 + signum})" in line for line in stopped), out[-3000:]
    assert all(re.search(r"saved at step \d+", line) for line in stopped), stopped
    for log in results.glob("busy/logs/*.log"):  # each point saved the step its log reached, and says so once
        said = log.read_text()
        saved = int(re.search(r"saved at step (\d+)", said).group(1))
        steps = [int(s) for s in re.findall(r"step (\d+)", said)]
        assert saved == max(steps), said[-2000:]
        assert said.count("received: finishing the current step") <= 1, said[-2000:]
    assert "the same command continues it: python scaling.py" in err and "Traceback" not in err, err[-2000:]
    assert "leaked semaphore" not in out + err, err[-2000:]


def test_a_family_redefined_under_a_continued_study_is_refused_not_counted_as_trained(tmp_path, monkeypatch):
    """A family whose fixed options change (the reservoir esn+mlp draws, tuned again) must not count its
    points trained with the old ones as its own: the study refuses in one line and trains nothing."""
    from reservoir.models.registry import STUDY_FAMILIES
    from tests.conftest import run_in_process

    args = ["STUDY=redefined", "FAMILIES=esn+mlp", "SIZES=xxs", "LEARNING_RATES=4e-3", "BATCH_SIZES=8",
            "BUDGETS=3e9,6e9", "MIN_STEPS=5", "MAX_TOKENS_PER_PARAM=1e9", "ENVELOPE_SEEDS=1", "DATASET=synthetic",
            "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "EVAL_TOKENS=2048", "FINAL_EVAL_TOKENS=2048", "SAMPLE_TOKENS=0",
            "WARMUP_STEPS=2", f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'cache'}"]
    assert run_in_process("scaling.py", args).returncode == 0
    study = tmp_path / "results" / "redefined"
    model, options = STUDY_FAMILIES["esn+mlp"]
    again = run_in_process("scaling.py", args)
    assert again.returncode == 0 and "1 already finished, 0 to train" in again.stdout  # as defined: nothing to do
    before = {p: p.stat().st_mtime_ns for p in study.rglob("*") if p.is_file() and p.name != ".lock"}
    monkeypatch.setitem(STUDY_FAMILIES, "esn+mlp", (model, {**options, "spectral_radius": 0.123}))
    refused = run_in_process("scaling.py", args)
    assert refused.returncode != 0 and "Traceback" not in refused.stderr, refused.stderr
    said = refused.stderr.strip().splitlines()[-1]
    assert (f"records esn+mlp-xxs-lr0.004-b8/flops-3.00e09 trained with ESN.spectral_radius="
            f"{options['spectral_radius']!r}, but esn+mlp now fixes spectral_radius=0.123") in said
    after = {p: p.stat().st_mtime_ns for p in study.rglob("*") if p.is_file() and p.name != ".lock"}
    assert after == before  # nothing trained, nothing rewritten
