"""One frontier study, several hosts, through a real PostgreSQL server the test starts (STUDY_STORAGE): every point
runs once, somewhere; a killed host's point is run again elsewhere; the exported records score as one host's do.
"Hosts" are separate processes with separate RESULTS_DIR and CACHE_DIR and no shared folder."""

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import ROOT, run_script, write_corpus
from tests.test_sweep import postgres  # noqa: F401 - the PostgreSQL fixture

MICRO = ["FRONTIER=True", "STUDY=shared", "FAMILIES=lstm", "SIZES=xs", "LEARNING_RATES=2e-3,4e-3,8e-3",
         "BATCH_SIZES=8", "BUDGETS=3e9,6e9", "KEEP=3", "MIN_STEPS=20", "MAX_TOKENS_PER_PARAM=1e9", "ENVELOPE_SEEDS=1",
         "WORKERS=1", "HEARTBEAT=1", "DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "EVAL_TOKENS=2048",
         "FINAL_EVAL_TOKENS=4096", "SAMPLE_TOKENS=0", "WARMUP_STEPS=5"]


def host(tmp_path, name, url, *extra):
    where = tmp_path / name
    return subprocess.Popen([sys.executable, str(ROOT / "scaling.py"), *MICRO, f"STUDY_STORAGE={url}",
                             f"RESULTS_DIR={where / 'results'}", f"CACHE_DIR={where / 'cache'}", *extra],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def trials(url):
    import optuna

    study = optuna.load_study(study_name="frontier:shared", storage=url)
    return study.get_trials(deepcopy=False)


def started_trials(url):
    """The shared study's trials, none before a host has created it."""
    try:
        return trials(url)
    except KeyError:
        return []


def scores(points_jsonl):
    from reservoir.studies.store import PointRecords

    points = PointRecords(points_jsonl.parent).packed()["points"]  # the records as written, checked
    return {key: [r["val_bpc"] for r in point["summary"]] for key, point in points.items()}


def recorded(url) -> int:
    """Points the shared study has recorded as finished (0 before a host has created it)."""
    return sum(t.state.name == "COMPLETE" for t in started_trials(url))


@pytest.mark.slow
def test_two_hosts_share_a_study_each_point_once_and_score_as_one_host(tmp_path, postgres):  # noqa: F811
    first, second = host(tmp_path, "a", postgres), host(tmp_path, "b", postgres)
    deadline = time.time() + 600
    while recorded(postgres) == 0 and time.time() < deadline:
        time.sleep(0.2)
    late = host(tmp_path, "c", postgres)  # a third host joins once a point is recorded, its RESULTS_DIR empty
    outputs = [proc.communicate(timeout=900)[0] for proc in (first, second, late)]
    assert first.returncode == 0 and second.returncode == 0 and late.returncode == 0, outputs
    claimed = {}
    for trial in trials(postgres):
        if trial.state.name == "COMPLETE":
            claimed.setdefault(trial.user_attrs["point"], []).append(trial.user_attrs["host"])
    assert len(claimed) == 6 and all(len(hosts) == 1 for hosts in claimed.values()), claimed  # 3 cells x 2 budgets
    assert len({h for hosts in claimed.values() for h in hosts}) >= 2  # at least two of the three hosts trained points
    exported = tmp_path / "exported" / "shared"
    run_script("scaling.py", f"EXPORT={exported}", f"STUDY_STORAGE={postgres}")
    assert (exported / "frontier.json").exists() and (exported / "frontier-study.json").exists()
    joined = tmp_path / "c" / "results" / "shared"  # the late host was given the study's file and every record
    assert (joined / "frontier-study.json").is_file()
    assert scores(joined / "points.jsonl") == scores(exported / "points.jsonl")
    # one shared study's records are the same bytes on every host and in the export (the late host trained
    # nothing of the first budget, and the export none at all: their tokenizers come with the records)
    files = {where: (tmp_path / where / "results" / "shared" / "points.jsonl").read_bytes() for where in "abc"}
    files["exported"] = (exported / "points.jsonl").read_bytes()
    assert len(set(files.values())) == 1, {where: len(text) for where, text in files.items()}
    assert json.loads(files["exported"].splitlines()[0])["tokenizers"]
    alone = tmp_path / "alone"  # the same study on one host, no database
    run_script("scaling.py", *[a for a in MICRO if a != "HEARTBEAT=1"], f"RESULTS_DIR={alone / 'results'}",
               f"CACHE_DIR={alone / 'cache'}", timeout=900)
    assert scores(exported / "points.jsonl") == scores(alone / "results" / "shared" / "points.jsonl")


@pytest.mark.slow
def test_a_host_killed_mid_point_loses_it_to_the_other_and_a_stopped_database_is_continued(tmp_path,
                                                                                        postgres):  # noqa: F811
    budgets = "BUDGETS=1e11,2e11"  # points of several seconds each: the host is caught while it holds one
    slow = host(tmp_path, "a", postgres, budgets)
    deadline = time.time() + 600
    while not any(t.state.name == "RUNNING" for t in started_trials(postgres)):
        assert slow.poll() is None, f"the host ended before it claimed a point: {slow.stdout.read()[-3000:]}"
        assert time.time() < deadline, "the host claimed no point in 10 minutes"
        time.sleep(0.1)
    time.sleep(0.5)  # its point is forked and training
    os.kill(slow.pid, signal.SIGKILL)  # the host is gone; its point keeps no heartbeat
    slow.wait()
    running = [t for t in trials(postgres) if t.state.name == "RUNNING"]
    assert running, "the killed host held a point"
    other = host(tmp_path, "b", postgres, budgets)
    for line in other.stdout:  # the other host has claimed a point and trains it ...
        if "(budget" in line:
            break
    postgres.stop()  # ... when the database goes away: one line, and the same command continues
    stopped = other.communicate(timeout=900)[0]
    assert other.returncode != 0 and "Traceback" not in stopped, stopped[-3000:]
    assert "error: the study storage postgresql" in stopped and "was lost mid-study" in stopped, stopped[-3000:]
    postgres.start()
    again = host(tmp_path, "b", postgres, budgets)
    out = again.communicate(timeout=1800)[0]
    assert again.returncode == 0, out[-3000:]
    done = {}
    for trial in trials(postgres):
        done.setdefault(trial.user_attrs.get("point"), []).append(trial.state.name)
    assert all(states.count("COMPLETE") == 1 for states in done.values()), done
    lost = running[0].user_attrs["point"]
    assert "FAIL" in done[lost]  # the killed host's attempt failed on its heartbeat, and ran again once


def test_another_grid_an_edited_record_and_an_unreachable_storage_are_one_line(tmp_path):
    """On SQLite, the same storage code as PostgreSQL's: what a host may not do to a shared study."""
    url = f"sqlite:///{tmp_path / 'study.db'}"
    small = [a for a in MICRO if not a.startswith("LEARNING_RATES")] + ["LEARNING_RATES=4e-3"]
    where = [f"RESULTS_DIR={tmp_path / 'a' / 'results'}", f"CACHE_DIR={tmp_path / 'a' / 'cache'}"]
    run_script("scaling.py", *small, f"STUDY_STORAGE={url}", *where, timeout=900)
    other = [f"RESULTS_DIR={tmp_path / 'b' / 'results'}", f"CACHE_DIR={tmp_path / 'b' / 'cache'}"]
    grid = run_script("scaling.py", *small, "BUDGETS=3e9,1.2e10", f"STUDY_STORAGE={url}", *other, check=False)
    differs = "STUDY_STORAGE holds study shared otherwise than this command (what differs: "
    assert grid.returncode != 0 and differs + "budgets" in grid.stderr
    assert len(grid.stderr.strip().splitlines()) == 1, grid.stderr
    text = write_corpus(tmp_path / "other-text", 2)  # a host whose data is another text
    corpus = run_script("scaling.py", *small, f"DATASET={text}", f"STUDY_STORAGE={url}", *other, check=False)
    assert corpus.returncode != 0 and differs + "corpus (" in corpus.stderr
    import sqlite3

    with sqlite3.connect(tmp_path / "study.db") as db:  # a score edited in the database
        (value,) = db.execute("SELECT value_json FROM trial_user_attributes WHERE key='summary' LIMIT 1").fetchone()
        summary = json.loads(value)
        summary[0]["val_bpc"] = 0.1
        db.execute("UPDATE trial_user_attributes SET value_json=? WHERE value_json=?", (json.dumps(summary), value))
    edited = run_script("scaling.py", f"EXPORT={tmp_path / 'out' / 'shared'}", f"STUDY_STORAGE={url}", check=False)
    assert edited.returncode != 0 and "was edited after its run wrote it" in edited.stderr, edited.stderr
    assert "Traceback" not in edited.stderr
    unreachable = run_script("scaling.py", *small, "STUDY_STORAGE=postgresql+psycopg2://nobody@127.0.0.1:1/none",
                             *other, check=False)
    assert unreachable.returncode != 0 and "cannot open the storage" in unreachable.stderr
    assert "check STUDY_STORAGE" in unreachable.stderr and "Traceback" not in unreachable.stderr


def test_a_storage_url_s_password_is_never_printed():
    """The URL that failed used to be printed whole, password and all, in a terminal line (and its logs)."""
    from reservoir.studies.budgets import StudyError
    from reservoir.studies.storage import open_rdb, shown
    from reservoir.studies.sweeps import storage_lost

    url = "postgresql+psycopg2://me:s3cret-word@127.0.0.1:1/studies"
    assert shown(url) == "postgresql+psycopg2://me:***@127.0.0.1:1/studies"
    assert shown("sqlite:///studies.db") == "sqlite:///studies.db" and shown(None) == "journal"
    with pytest.raises(StudyError) as refused:
        open_rdb(url, 1, lambda study, trial: None, StudyError, "STUDY_STORAGE")
    assert "s3cret-word" not in str(refused.value) and "me:***@127.0.0.1:1" in str(refused.value)
    assert "s3cret-word" not in str(storage_lost(url, ConnectionError("gone")))


def test_an_export_into_a_folder_that_is_not_a_study_s_is_one_line_and_writes_nothing(tmp_path):
    """EXPORT=/etc/base wrote a study's files into a system folder whose name matched the study's."""
    foreign = tmp_path / "base"
    foreign.mkdir()
    (foreign / "passwd").write_text("root:x:0:0\n")
    url = f"sqlite:///{tmp_path / 'never-opened.db'}"
    proc = run_script("scaling.py", f"EXPORT={foreign}", f"STUDY_STORAGE={url}", check=False)
    assert proc.returncode == 1 and "holds files but no frontier-study.json: not a study's folder" in proc.stderr
    assert "Traceback" not in proc.stderr and sorted(p.name for p in foreign.iterdir()) == ["passwd"]
    assert not (tmp_path / "never-opened.db").exists()  # refused before the storage is opened


def test_a_lost_database_is_said_by_the_driver_s_error_not_optuna_s_commit_text():
    """Optuna wraps a database that stopped mid-commit in a text that blames "invalid data in the commit"."""
    import optuna
    from sqlalchemy.exc import OperationalError

    from reservoir.studies.storage import lost_storage_in
    from reservoir.studies.sweeps import storage_lost

    try:
        try:
            raise OperationalError("COMMIT", {}, ConnectionError("server closed the connection unexpectedly"))
        except OperationalError as e:
            raise optuna.exceptions.StorageInternalError("An exception is raised during the commit. This typically "
                                                         "happens due to invalid data in the commit") from e
    except optuna.exceptions.StorageInternalError as raised:
        lost = lost_storage_in(raised)
    assert isinstance(lost, OperationalError) and "server closed the connection" in str(lost)
    said = str(storage_lost("postgresql+psycopg2://me:pw@db/s", lost))
    assert "server closed the connection unexpectedly" in said and "invalid data" not in said and ":pw@" not in said


def test_a_host_claims_its_next_point_as_a_slot_frees_and_records_each_as_it_ends(tmp_path):
    """A host claimed as many points as it had slots and recorded them when the slowest ended, its other slots
    idle meanwhile: now each ``more()`` claims one point, and each point's end is in the storage at once."""
    from optuna.trial import TrialState

    from reservoir.studies.frontier.grid import FrontierExit
    from reservoir.studies.frontier.shared import SharedPoints
    from reservoir.studies.store import PointRecords

    study = tmp_path / "results" / "micro"
    store = PointRecords(study)
    jobs = [(study / f"cell-{k}" / "flops-3.00e09", [f"ARGS={k}"]) for k in range(3)]
    shared = SharedPoints(f"sqlite:///{tmp_path / 'study.db'}", "micro", heartbeat_s=1.0)

    def states():
        return {t.user_attrs["point"]: t.state for t in shared.study.get_trials(deepcopy=False)}

    seen = []

    def run_here(more, ended):
        first, second = more(), more()  # two slots: one point each
        seen.append(states())
        ended(0, 143)  # the first point stops; the second trains on
        seen.append(states())
        third = more()  # the freed slot takes the last point at once
        seen.append(states())
        ended(1, 143)
        ended(2, 143)
        assert more() is None and [first, second, third] == [job for job in jobs]

    with pytest.raises(FrontierExit) as stopped:
        shared.run(jobs, store, run_here, finished=lambda folder: False)
    assert stopped.value.code == 143
    keys = [store.key(folder) for folder, _ in jobs]
    assert [seen[0][k] for k in keys] == [TrialState.RUNNING, TrialState.RUNNING, TrialState.WAITING]
    assert [seen[1][k] for k in keys] == [TrialState.FAIL, TrialState.RUNNING, TrialState.WAITING]
    assert [seen[2][k] for k in keys] == [TrialState.FAIL, TrialState.RUNNING, TrialState.RUNNING]
