"""sweep.py: Optuna studies over ordinary runs, on a journal file or a real PostgreSQL server."""

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY, run_script, summary_of

optuna = pytest.importorskip("optuna")
FIXED = [*TINY, "TIME_BUDGET_S=None", "TOKEN_BUDGET=20000", "SAMPLE_TOKENS=5"]


def sweep(tmp_path, *args, check=True, env=None, background=False):
    """sweep.py on the tiny settings: in this process, or in a process of its own in the ``background`` (a worker
    beside another, or one a test kills)."""
    args = [*FIXED, f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'cache'}", *args]
    if background:
        return subprocess.Popen([sys.executable, str(ROOT / "sweep.py"), *args], cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env={**os.environ, **(env or {})})
    proc = run_script("sweep.py", *args, env=env, check=False)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def load(tmp_path, name, storage=None):
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    storage = storage or JournalStorage(JournalFileBackend(str(tmp_path / "results" / "sweeps" / name / "journal.log")))
    return optuna.load_study(study_name=name, storage=storage)


def test_a_sweep_writes_best_json_plots_and_continues(tmp_path):
    proc = sweep(tmp_path, "MODEL=esn", "TRIALS=3", "SWEEP_NAME=esn-tiny")
    folder = tmp_path / "results" / "sweeps" / "esn-tiny"
    best = json.loads((folder / "best.json").read_text())
    assert best["model"] == "esn" and best["trials"]["complete"] == 3
    assert set(best["best_params"]) == {"ESN.spectral_radius", "ESN.leak_rate", "ESN.input_scaling", "ESN.ridge"}
    assert best["override"].startswith("ESN.") and f"{best['best_value_bpc']:.4f}" in proc.stdout
    assert (ROOT / best["run_dir"]).is_dir() and len(list((folder / "trials").iterdir())) == 3  # ordinary runs
    assert not any(os.path.isabs(path) for path in (best["run_dir"], *(a.partition("=")[2] for a in
                                                                      best["fixed_settings"])))  # no machine's paths
    for png in ("optimization_history.png", "param_importances.png", "slice.png"):
        assert (folder / png).stat().st_size > 5000
    sweep(tmp_path, "MODEL=esn", "TRIALS=4", "SWEEP_NAME=esn-tiny")  # the same study, one more trial
    trials = load(tmp_path, "esn-tiny").trials
    assert sorted(t.number for t in trials) == list(range(4))
    assert all(trials[3].params != t.params for t in trials[:3])  # a new candidate, not the first command's replayed
    assert all(t.state.name == "COMPLETE" for t in trials)  # a finished model is never pruned on its final score
    first = min(trials, key=lambda t: t.number)  # a new study first measures the settings it would replace
    assert first.params == {"ESN.spectral_radius": 0.3, "ESN.leak_rate": 1.0, "ESN.input_scaling": 3.0,
                            "ESN.ridge": 0.01} and first.user_attrs["starting_settings"]  # SHARED_CONFIG's
    assert best["best_value_bpc"] <= first.value
    assert best["best_is_starting_settings"] == (best["best_trial"] == first.number)
    again = sweep(tmp_path, "MODEL=esn", "TRIALS=4", "SWEEP_NAME=esn-tiny")
    assert "nothing to run" in again.stdout and len(load(tmp_path, "esn-tiny").trials) == 4

    # the pasted override line reproduces the best trial's bits/char
    run_script("TinyStories.py", *FIXED, f"RESULTS_DIR={tmp_path / 'again'}", f"CACHE_DIR={tmp_path / 'cache'}",
               "MODELS=['esn']", "RUN_NAME=best", "PLOTS=False", *best["override"].split())
    assert summary_of(tmp_path / "again" / "best")["esn"]["val_bpc"] == pytest.approx(best["best_value_bpc"],
                                                                                       rel=1e-9)


def test_periodic_evaluations_feed_the_pruner(tmp_path):
    sweep(tmp_path, "MODEL=lstm", "TRIALS=2", "SWEEP_NAME=lstm-tiny", "TOKEN_BUDGET=None", "MAX_STEPS=12",
          "EVAL_EVERY=4")
    for trial in load(tmp_path, "lstm-tiny").trials:
        assert sorted(trial.intermediate_values) == [4, 8]  # periodic evaluations; the final one is the objective


@pytest.mark.slow  # CI runs it apart (pytest -m slow); the README's command leaves it out
def test_two_workers_at_once_share_one_study(tmp_path):
    workers = [sweep(tmp_path, "MODEL=esn", "TRIALS=6", "SWEEP_NAME=pair", f"SWEEP_WORKER={i}", background=True)
               for i in (0, 1)]
    for worker in workers:
        out, err = worker.communicate(timeout=900)
        assert worker.returncode == 0, err[-3000:]
    trials = load(tmp_path, "pair").trials
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)) >= 6  # no trial number handed out twice
    assert all(t.state.name == "COMPLETE" for t in trials)
    assert len({t.user_attrs["worker"] for t in trials}) == 2  # both workers ran trials


@pytest.mark.slow  # CI runs it apart (pytest -m slow); the README's command leaves it out
def test_a_worker_killed_mid_trial_leaves_the_others_going(tmp_path):
    args = ["MODEL=lstm", "SWEEP_NAME=killed", "TOKEN_BUDGET=None", "TIME_BUDGET_S=3", "EVAL_EVERY=100000"]
    doomed = sweep(tmp_path, *args, "TRIALS=3", background=True)
    trials = tmp_path / "results" / "sweeps" / "killed" / "trials"
    deadline = time.time() + 300
    while not list(trials.glob("trial-0000/train_log.jsonl")) and time.time() < deadline:
        time.sleep(0.05)
    doomed.kill()  # SIGKILL: no chance to tidy up
    doomed.communicate()
    assert load(tmp_path, "killed").trials[0].state.name == "RUNNING"  # left so by its dead worker
    proc = sweep(tmp_path, *args, "TRIALS=2", "SWEEP_WORKER=1")
    assert "trial 0's worker (0 (pid" in proc.stdout and "is gone; its settings are run again" in proc.stdout
    trials = load(tmp_path, "killed").trials
    assert trials[0].state.name == "FAIL" and trials[0].user_attrs["interrupted"]
    rerun = next(t for t in trials if t.user_attrs.get("rerun_of") == 0)  # the starting settings, run again
    assert rerun.state.name == "COMPLETE" and rerun.user_attrs.get("starting_settings")
    assert rerun.params == trials[0].params
    assert sum(t.state.name == "COMPLETE" for t in trials) == 2
    best = json.loads((tmp_path / "results" / "sweeps" / "killed" / "best.json").read_text())
    assert best["best_value_bpc"] <= rerun.value  # never a best worse than where the sweep started
    again = sweep(tmp_path, *args, "TRIALS=2", "SWEEP_WORKER=1")
    assert "nothing to run" in again.stdout


@pytest.fixture(scope="module")
def kept_study(tmp_path_factory):
    """One finished study that bad commands must leave as it is (one sweep, shared by the cases below)."""
    where = tmp_path_factory.mktemp("kept")
    sweep(where, "MODEL=esn", "TRIALS=1", "SWEEP_NAME=kept")
    return where


@pytest.mark.parametrize("args, message", [
    (["MODEL=gpt"], "not a model to sweep"),
    (["MODEL=esn", "TRIALS=0"], "TRIALS must be a whole number >= 1"),
    (["MODEL=esn", "SEARCH=ESN.spectral_radios=log(0.1,3)"], "is not a setting of this project"),
    (["MODEL=esn", "SEARCH=ESN.spectral_radius=log(3,0.1)"], "need low < high"),
    (["MODEL=esn", "SWEEP_STORAGE=postgresql+psycopg2://nobody@127.0.0.1:1/none"], "cannot open the storage"),
    (["MODEL=esn", "BATCH_SZE=3"], "did you mean BATCH_SIZE"),
    (["MODEL=esn", "DATASET=nowhere"], "no .txt or .jsonl data found at 'nowhere'"),  # docs' example, no data/
])
def test_bad_input_is_one_line_and_leaves_the_study_alone(kept_study, args, message):
    """In this process (sweep.main), as the command line would call it; the subprocess below shows the same
    ends reach a user as one line without a traceback."""
    import importlib

    script = importlib.import_module("sweep")
    journal = kept_study / "results" / "sweeps" / "kept" / "journal.log"
    before = journal.read_bytes()
    with pytest.raises(SystemExit) as stopped:
        script.main([*FIXED, f"RESULTS_DIR={kept_study / 'results'}", f"CACHE_DIR={kept_study / 'cache'}", *args,
                     "SWEEP_NAME=kept"])
    text = str(stopped.value.code)
    assert text.startswith("error: ") and message in text and "\n" not in text
    assert journal.read_bytes() == before


def test_a_bad_sweep_command_is_one_line_on_stderr(kept_study):
    proc = sweep(kept_study, "MODEL=esn", "TRIALS=0", "SWEEP_NAME=kept", check=False)
    assert proc.returncode == 1 and proc.stderr.strip() == "error: TRIALS must be a whole number >= 1, got '0'"


def test_a_search_override_replaces_the_declared_space(tmp_path):
    sweep(tmp_path, "MODEL=esn", "TRIALS=2", "SWEEP_NAME=narrow", "SEARCH=esn.leak_rate=float(0.2,0.3)")
    for trial in load(tmp_path, "narrow").trials:
        assert set(trial.params) == {"ESN.leak_rate"} and 0.2 <= trial.params["ESN.leak_rate"] <= 0.3


def test_every_declared_search_key_is_a_real_setting():
    from reservoir.studies.sweeps import SEARCH_SPACES, normalise_key
    from sweep import known_keys

    keys = known_keys()
    for model, space in SEARCH_SPACES.items():
        for key in space:
            assert normalise_key(key, keys) == key, (model, key)


# --------------------------------------------------------------------- a real PostgreSQL server


def _postgres_bin(name):
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(Path("/usr/lib/postgresql").glob(f"*/bin/{name}"))
    return str(candidates[-1]) if candidates else None


class Postgres(str):
    """The server's SQLAlchemy URL, with ``stop()`` (as an administrator would: connections cut) and
    ``start()`` again on the same data."""

    def control(self, *args):
        return subprocess.run([*self.as_user, self.pg_ctl, "-D", str(self.data / "db"), *args],
                              capture_output=True, text=True)

    def stop(self):
        assert self.control("-m", "fast", "-w", "stop").returncode == 0

    def start(self):
        started = self.control("-l", str(self.data / "log"), "-w", "-o",
                               f"-p {self.port} -k {self.data} -c listen_addresses=127.0.0.1", "start")
        assert started.returncode == 0, started.stderr


@pytest.fixture
def postgres():
    """A PostgreSQL server of its own (Debian's package), on a free local port, removed afterwards."""
    initdb, pg_ctl = _postgres_bin("initdb"), _postgres_bin("pg_ctl")
    if not initdb or not pg_ctl:
        pytest.skip("PostgreSQL is not installed (Debian: apt-get install postgresql)")
    pytest.importorskip("psycopg2")
    as_user = []
    data = Path(tempfile.mkdtemp(prefix="pg-"))
    if os.geteuid() == 0:  # PostgreSQL refuses to run as root: run it as its own system user
        if not shutil.which("runuser"):
            pytest.skip("running as root without runuser: cannot start PostgreSQL as another user")
        shutil.chown(data, "postgres")
        as_user = ["runuser", "-u", "postgres", "--"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    init = subprocess.run([*as_user, initdb, "-D", str(data / "db"), "-U", "sweeper", "--auth=trust"],
                          capture_output=True, text=True)
    if init.returncode:
        pytest.skip(f"initdb failed here: {init.stderr.strip()[-300:]}")
    start = subprocess.run([*as_user, pg_ctl, "-D", str(data / "db"), "-l", str(data / "log"), "-w", "-o",
                            f"-p {port} -k {data} -c listen_addresses=127.0.0.1", "start"],
                           capture_output=True, text=True)
    if start.returncode:
        pytest.skip(f"PostgreSQL did not start here: {start.stderr.strip()[-300:]}")
    try:
        import psycopg2

        deadline = time.time() + 30
        while True:
            try:
                connection = psycopg2.connect(host="127.0.0.1", port=port, user="sweeper", dbname="postgres")
                break
            except psycopg2.OperationalError:
                if time.time() > deadline:
                    raise
                time.sleep(0.2)
        connection.autocommit = True
        connection.cursor().execute("CREATE DATABASE sweeps")
        connection.close()
        server = Postgres(f"postgresql+psycopg2://sweeper@127.0.0.1:{port}/sweeps")
        server.as_user, server.pg_ctl, server.data, server.port = as_user, pg_ctl, data, port
        yield server
    finally:
        subprocess.run([*as_user, pg_ctl, "-D", str(data / "db"), "-m", "immediate", "stop"], capture_output=True)
        shutil.rmtree(data, ignore_errors=True)


@pytest.mark.slow  # CI runs it apart (pytest -m slow); the README's command leaves it out
def test_two_workers_on_a_real_postgresql_server(tmp_path, postgres):
    workers = [sweep(tmp_path, "MODEL=esn", "TRIALS=6", "SWEEP_NAME=pg", f"SWEEP_STORAGE={postgres}",
                     f"SWEEP_WORKER={i}", background=True) for i in (0, 1)]
    for worker in workers:
        out, err = worker.communicate(timeout=900)
        assert worker.returncode == 0, err[-3000:]
        assert "sweep pg: best" in out
    trials = optuna.load_study(study_name="pg", storage=postgres).trials
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers)) >= 6 and all(t.state.name == "COMPLETE" for t in trials)
    assert len({t.user_attrs["worker"] for t in trials}) == 2
    best = json.loads((tmp_path / "results" / "sweeps" / "pg" / "best.json").read_text())
    assert best["trials"]["complete"] == len(trials)


def _wait_for(path, timeout=300):
    deadline = time.time() + timeout
    while not path.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert path.exists(), f"{path} never appeared"


def _counted_trials(study):
    reruns = {t.user_attrs.get("rerun_of") for t in study.trials}
    return [t for t in study.trials if t.state.name in ("COMPLETE", "PRUNED")
            or (t.state.name == "FAIL" and not t.user_attrs.get("interrupted") and t.number not in reruns)]


@pytest.mark.slow  # CI runs it apart (pytest -m slow); the README's command leaves it out
def test_sigterm_mid_trial_is_one_line_and_the_interrupted_starting_settings_are_run_again(tmp_path):
    import signal

    args = ["MODEL=lstm", "SWEEP_NAME=term", "TOKEN_BUDGET=None", "TIME_BUDGET_S=4", "EVAL_EVERY=100000",
            "TRIALS=2"]
    first = sweep(tmp_path, *args, background=True)
    _wait_for(tmp_path / "results" / "sweeps" / "term" / "trials" / "trial-0000" / "train_log.jsonl")
    first.send_signal(signal.SIGTERM)
    _, err = first.communicate(timeout=300)
    assert first.returncode == 143, err[-3000:]
    assert "Traceback" not in err and "Trial 0 failed" not in err, err[-3000:]
    assert "the same command continues the study and runs its settings again" in err
    (interrupted,) = load(tmp_path, "term").trials
    assert interrupted.state.name == "FAIL" and interrupted.user_attrs["interrupted"]

    again = sweep(tmp_path, *args)
    assert "trial 0 was interrupted; its settings are run again" in again.stdout
    study = load(tmp_path, "term")
    counted = _counted_trials(study)
    assert len(counted) == 2 and all(t.state.name == "COMPLETE" for t in counted)
    rerun = next(t for t in study.trials if t.user_attrs.get("rerun_of") == 0)
    assert rerun.params == interrupted.params and rerun.user_attrs["starting_settings"]
    best = json.loads((tmp_path / "results" / "sweeps" / "term" / "best.json").read_text())
    assert best["best_value_bpc"] <= rerun.value  # never worse than where it started
    assert best["trials"]["interrupted"] == 1 and best["trials"]["fail"] == 0
    assert sweep(tmp_path, *args).stdout.count("nothing to run") == 1  # the interrupted one does not count


def test_a_trial_whose_settings_this_data_refuses_fails_alone(tmp_path):
    """NGRAM.order=8 over a 300-character vocabulary needs more than int64 keys: that trial fails in one
    warning and the sweep goes on to the next."""
    text = "".join(chr(0x100 + i) for i in range(300))
    train = tmp_path / "wide.txt"
    train.write_text("\n\n".join(text[i:] + text[:i] for i in range(0, 300, 7)), encoding="utf-8")
    proc = sweep(tmp_path, "MODEL=ngram", "SWEEP_NAME=wide", "TRIALS=2", f"TRAIN_PATH={train}",
                 "SEARCH=NGRAM.order=int(7,8)", "NGRAM.order=8")
    assert "NGRAM.order=8 with a vocabulary of" in proc.stderr and "recorded as failed" in proc.stderr
    states = sorted(t.state.name for t in load(tmp_path, "wide").trials)
    assert "FAIL" in states and "Traceback" not in proc.stderr


@pytest.mark.slow  # CI runs it apart (pytest -m slow); the README's command leaves it out
def test_postgresql_lost_mid_sweep_is_one_line_and_the_study_continues_after_a_restart(tmp_path, postgres):
    args = ["MODEL=lstm", "SWEEP_NAME=lost", f"SWEEP_STORAGE={postgres}", "TOKEN_BUDGET=None", "TIME_BUDGET_S=6",
            "EVAL_EVERY=5", "TRIALS=2"]
    doomed = sweep(tmp_path, *args, background=True)
    _wait_for(tmp_path / "results" / "sweeps" / "lost" / "trials" / "trial-0000" / "train_log.jsonl")
    postgres.stop()
    _, err = doomed.communicate(timeout=300)
    assert doomed.returncode != 0 and "was lost mid-sweep" in err, err[-3000:]
    assert "restart the database, then run the same command" in err
    assert "Traceback" not in err and len([line for line in err.splitlines() if "% after" not in line]) <= 3, err
    postgres.start()
    sweep(tmp_path, *args)
    study = optuna.load_study(study_name="lost", storage=str(postgres))
    assert len(_counted_trials(study)) == 2


def test_a_trial_that_meets_a_one_line_error_measured_nothing_and_is_run_again(tmp_path, capfd):
    """A trial stopped by what is not its settings (a disk, the data) is said in one line, does not count
    toward TRIALS, and the same command runs its settings again."""
    from reservoir.platform.files import StorageError
    from reservoir.studies.sweeps import SEARCH_SPACES, Sweep, open_study, run_trials

    folder = tmp_path / "results" / "sweeps" / "disk"
    sweep_ = Sweep("esn", 1, "disk", None, SEARCH_SPACES["esn"], 0, list(FIXED), folder, 1337)

    def full_disk(config, hook):
        raise StorageError("cannot write x: no space left on the device")

    with pytest.raises(StorageError):
        run_trials(open_study("disk", None, folder, 1337, 0), sweep_, full_disk)
    assert "Traceback" not in capfd.readouterr().err

    class Finished:
        def summaries(self):
            return [{"model": "esn", "seed": 1337, "val_bpc": 2.5}]

    ran = []
    run_trials(open_study("disk", None, folder, 1337, 0), sweep_, lambda config, hook: ran.append(config) or Finished())
    trials = load(tmp_path, "disk").trials
    assert len(ran) == 1 and [t.state.name for t in trials] == ["FAIL", "COMPLETE"]
    assert trials[1].params == trials[0].params  # the same (starting) settings, measured this time


def test_a_trial_whose_host_stopped_beating_is_run_again_and_a_finished_sweep_leaves_none_running(tmp_path,
                                                                                                  capfd):
    """Another host began a trial and died (or lost the database) for good: its trial stays RUNNING in the
    storage with its heartbeat stopped. Optuna fails such a trial only when a worker starts a new one, so a
    sweep that already holds its TRIALS would say "nothing to run" and keep it RUNNING for good."""
    import sqlite3

    from reservoir.studies.sweeps import SEARCH_SPACES, Sweep, open_study, run_trials, suggest

    folder, url = tmp_path / "results" / "sweeps" / "beat", f"sqlite:///{tmp_path / 'sweeps.db'}"
    sweep_ = Sweep("esn", 1, "beat", url, SEARCH_SPACES["esn"], 0, list(FIXED), folder, 1337)

    class Finished:
        def summaries(self):
            return [{"model": "esn", "seed": 1337, "val_bpc": 2.5}]

    ran = []
    run_trials(open_study("beat", url, folder, 1337, 0), sweep_, lambda config, hook: ran.append(config) or Finished())
    study = open_study("beat", url, folder, 1337, 1)
    elsewhere = study.ask()  # begun on another host, which then stopped beating
    suggest(elsewhere, SEARCH_SPACES["esn"])
    elsewhere.set_user_attr("host", "another-host")
    elsewhere.set_user_attr("worker", "1 (pid 4242)")
    study._storage.record_heartbeat(elsewhere._trial_id)
    with sqlite3.connect(tmp_path / "sweeps.db") as db:
        db.execute("UPDATE trial_heartbeats SET heartbeat = datetime('now', '-1 hour')")
    capfd.readouterr()
    run_trials(open_study("beat", url, folder, 1337, 0), sweep_, lambda config, hook: ran.append(config) or Finished())
    said = capfd.readouterr().out
    trials = optuna.load_study(study_name="beat", storage=url).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "COMPLETE"], said
    assert trials[2].params == trials[1].params and trials[2].user_attrs["rerun_of"] == 1 and len(ran) == 2
    assert "trial 1's worker (1 (pid 4242) on another-host) stopped beating; its settings are run again" in said
