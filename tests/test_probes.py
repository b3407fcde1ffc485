"""The probe set (probes.py): tasks whose answer the prompt determines, a perfect-recall model at 100%, the
state each family carries, and the records a continued set trusts."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from reservoir.data.recall import PROBE_TASKS, UNSCORED, ProbeTask
from reservoir.studies.probes import (
    PROBE_FAMILIES,
    accuracy,
    build_probe_model,
    read_records,
    state_size,
)
from tests.conftest import ROOT, run_script


@pytest.mark.parametrize("name", list(PROBE_TASKS))
def test_a_probe_s_answer_is_determined_by_its_prompt(name):
    task = PROBE_TASKS[name]
    inputs, targets = task.examples(200, seed=3)
    assert np.array_equal(task.solve(inputs), targets)  # written back from the inputs alone
    again = task.examples(200, seed=3)
    assert all(np.array_equal(a, b) for a, b in zip(again, (inputs, targets), strict=True))  # seeded
    assert not np.array_equal(task.examples(200, seed=4)[0], inputs)
    scored = targets != UNSCORED
    assert (scored.sum(1) == task.items).all()  # every key asked once / every token copied once
    assert inputs.min() >= 0 and inputs.max() < task.vocab and targets[scored].max() < task.vocab
    if name == "mqar":
        for row in range(20):  # each key's one value: the key appears once among the pairs
            keys = inputs[row, 0:2 * task.items:2]
            assert len(set(keys.tolist())) == task.items


class PerfectRecall(torch.nn.Module):
    """Logits that put all their mass on the answer the prompt determines (task.solve)."""

    def __init__(self, task: ProbeTask):
        super().__init__()
        self.task = task

    def forward(self, ids):
        answer = torch.from_numpy(self.task.solve(ids.numpy())).clamp(min=0)
        return torch.nn.functional.one_hot(answer, self.task.vocab).float()


@pytest.mark.parametrize("name", list(PROBE_TASKS))
def test_a_model_with_perfect_recall_scores_everything_and_an_untrained_one_about_chance(name):
    task = PROBE_TASKS[name]
    inputs, targets = task.examples(300, seed=5)
    assert accuracy(PerfectRecall(task), inputs, targets, batch=64) == 1.0
    untrained = build_probe_model("lstm", 0, task, seed=0)
    assert accuracy(untrained, inputs, targets) < 0.2


def test_each_family_s_state_is_what_it_carries_or_its_key_value_cache():
    task = PROBE_TASKS["mqar"]
    sizes = {f: [state_size(build_probe_model(f, k, task, 0), task.length) for k in range(3)] for f in PROBE_FAMILIES}
    for family, counted in sizes.items():
        assert counted == sorted(counted) and counted[0] < counted[2], family  # the axis grows with the size
    width = PROBE_FAMILIES["transformer++"][2][1]["n_embd"]
    assert sizes["transformer++"][1] == 2 * 2 * width * task.length  # 2 blocks x keys and values x positions
    hidden = PROBE_FAMILIES["lstm"][2][1]["hidden"]
    assert sizes["lstm"][1] == 2 * 2 * hidden  # 2 layers x (h, c)
    units = PROBE_FAMILIES["linear_reservoir"][2][1]["units"]
    assert sizes["linear_reservoir"][1] == 2 * units  # complex units as real pairs
    random = build_probe_model("random_transformer", 1, task, 0)
    assert random.trained == "embeddings" and sizes["random_transformer"] == sizes["transformer++"]


def test_the_probe_set_records_each_run_once_and_refuses_an_edited_record(tmp_path):
    args = ["TASKS=copying", "FAMILIES=lstm", "LEARNING_RATES=3e-3", "STEPS=3", "WORKERS=1",
            f"RESULTS_DIR={tmp_path}"]
    first = run_script("probes.py", *args)
    records = read_records(tmp_path / "probes")
    assert len(records) == 3 and "3 to train" in first.stderr + first.stdout  # three sizes
    assert (tmp_path / "probes" / "probes.png").stat().st_size > 5_000
    assert "| lstm |" in (tmp_path / "probes" / "probes.md").read_text()
    again = run_script("probes.py", *args)
    assert "3 runs recorded, 0 to train" in again.stderr + again.stdout
    file = tmp_path / "probes" / "probes.jsonl"
    lines = file.read_text().splitlines()
    edited = json.loads(lines[0])
    edited["accuracy"] = 1.0
    file.write_text("\n".join([json.dumps(edited), *lines[1:]]) + "\n")
    refused = run_script("probes.py", *args, check=False)
    assert refused.returncode == 1 and "line 1 is not a probe record as probes.py wrote it" in refused.stderr
    assert "Traceback" not in refused.stderr
    bad = run_script("probes.py", "FAMILIES=gru", f"RESULTS_DIR={tmp_path}", check=False)
    assert bad.returncode == 1 and "FAMILIES names 'gru'" in bad.stderr


def test_the_probe_command_in_the_readme_is_the_entry_point():
    assert "python probes.py" in (ROOT / "README.md").read_text()


def _children(pid: int) -> set[int]:
    """The processes ``pid`` started that are alive now (Linux's /proc)."""
    try:
        text = (Path("/proc") / str(pid) / "task" / str(pid) / "children").read_text()
    except OSError:
        return set()
    return {int(p) for p in text.split()}


def _alive(pid: int) -> bool:
    try:
        state = (Path("/proc") / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads the process tree from Linux's /proc")
def test_a_sigterm_stops_the_probe_set_and_every_worker_and_says_how_to_go_on(tmp_path):
    """The set's parent used to die alone on SIGTERM (exit 143, no line), its workers training on as orphans."""
    command = [sys.executable, str(ROOT / "probes.py"), "TASKS=copying", "FAMILIES=lstm", "STEPS=100000",
               "LEARNING_RATES=4e-3", "WORKERS=2", f"RESULTS_DIR={tmp_path}"]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    deadline, workers = time.time() + 120, set()
    while time.time() < deadline and len(workers) < 2 and proc.poll() is None:
        workers |= _children(proc.pid)
        time.sleep(0.1)
    assert len(workers) == 2, proc.communicate()[1][-2000:]
    time.sleep(1.0)  # the workers are training
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, err[-2000:]
    said = [line for line in err.splitlines() if line.strip()]
    assert said[-1].startswith("[ReservoirNLP] probes stopped by SIGTERM: 0 probe runs are recorded"), err[-2000:]
    assert "the 3 not finished were stopped and train when the same command runs again" in said[-1]
    assert "Traceback" not in err
    deadline = time.time() + 10
    while time.time() < deadline and any(_alive(w) for w in workers):
        time.sleep(0.1)
    assert not any(_alive(w) for w in workers)  # no orphan trains on
