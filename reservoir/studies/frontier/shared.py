"""A frontier study that many hosts run together through one database (STUDY_STORAGE=postgresql+psycopg2://...).

    shared = SharedPoints.open(url, study_name, heartbeat_s, identity)   # every host: the same command
    shared.run(jobs, store, run_here, finished)   # a stage's points: claimed, trained here, recorded there
    shared.pull(store)                    # every recorded point into this host's points.jsonl

Optuna's RDB storage is the engine, not a queue of our own: each point is a trial of one Optuna study (its
folder, relative to the study, as a user attribute). A trial is queued once per attempt: the host that creates
the attempt's marker (a study name the database holds unique) queues it, so two hosts never queue a point
twice; a host claims a queued trial atomically (the storage moves it from WAITING to RUNNING under a row
lock), trains the point in its own folders, and stores the point's records (config.json and summary.json with
their integrity hashes) on the trial. Hosts share no filesystem. A stage ends on a host once every point of it
has a record; every host then reads the same records, so successive halving decides the same everywhere,
whoever decides last. A host that dies mid-point stops beating: after four heartbeats its trial fails and the
point is queued again, run by whichever host claims it (from its stable phase where that host has it, else
from step 0: the same score).
"""

from __future__ import annotations

import datetime
import os
import socket
import threading
import time
from pathlib import Path

from reservoir.platform.files import make_folder
from reservoir.platform.messages import say
from reservoir.run.records import check_run_config, check_summary, portable_config, read_json, read_summary
from reservoir.studies.frontier.grid import FrontierError, FrontierExit
from reservoir.studies.storage import open_rdb, shown, storage_errors

TOKENIZER_ATTR = "tokenizer:"  # the study's attribute that holds a corpus's tokenizer, by its hash
POLL_S = 5.0  # at most this long between a waiting host's looks at the others' points (less with HEARTBEAT)


class SharedPoints:
    """The points of study ``name`` in the storage at ``url``, as this host sees and claims them."""

    def __init__(self, url: str, name: str, heartbeat_s: float):
        import optuna

        self.url, self.name, self.heartbeat_s = url, name, heartbeat_s
        self.started = datetime.datetime.now()  # a point's error from before this command is tried again
        optuna.logging.set_verbosity(optuna.logging.WARNING)  # the study says what it does in its own lines
        self.storage = open_rdb(url, heartbeat_s, lambda study, trial: None, FrontierError, "STUDY_STORAGE")
        try:
            self.study = optuna.create_study(study_name=f"frontier:{name}", storage=self.storage, load_if_exists=True)
        except storage_errors() as e:
            reason = " ".join(str(getattr(e, "orig", None) or e).split())[:200]
            raise FrontierError(f"cannot open the storage {shown(url)} ({reason}); check STUDY_STORAGE") from None

    # --- the study's identity: every host must run the same grid on the same corpus
    def check_identity(self, identity: dict, differences) -> None:
        """``identity``: the study file's grid, budgets, settings and corpus; ``differences(before, now)``: what
        a continued study may not change. The first host records it; every other host must match it."""
        recorded = self.study.user_attrs.get("identity")
        if recorded is None:
            self.study.set_user_attr("identity", identity)
            return
        changed = differences(recorded, identity)
        if changed:
            raise FrontierError(f"STUDY_STORAGE holds study {self.name} otherwise than this command (what differs: "
                                f"{'; '.join(changed)}): run the "
                                "command the other hosts run (a grid list may grow), or name a new STUDY")

    # --- what the storage holds
    def _trials(self) -> dict[str, list]:
        out: dict[str, list] = {}
        for trial in self.study.get_trials(deepcopy=False):
            out.setdefault(trial.user_attrs.get("point"), []).append(trial)
        return out

    def records(self) -> dict[str, dict]:
        """{point: {"config": ..., "summary": [...]}} of every recorded point, checked as files are."""
        from optuna.trial import TrialState

        out = {}
        for key, trials in self._trials().items():
            done = [t for t in trials if t.state == TrialState.COMPLETE and "summary" in t.user_attrs]
            if key and done:
                where = f"{self.url} ({self.name}: {key})"
                remedy = "the record was edited in the database; delete that trial's study there and run again"
                config = check_run_config(done[0].user_attrs["config"], where, remedy)
                summary = check_summary(done[0].user_attrs["summary"], where, remedy)
                out[key] = {"config": dict(config), "summary": summary}
        return out

    def tokenizers(self) -> dict[str, dict]:
        """{tokenizer hash: tokenizer.json's content} of the study's points, as the hosts that trained them shared
        them (``_share_tokenizer``): what points.jsonl holds beside the records, the same on every host."""
        return {key.removeprefix(TOKENIZER_ATTR): value for key, value in self.study.user_attrs.items()
                if key.startswith(TOKENIZER_ATTR) and isinstance(value, dict)}

    def _share_tokenizer(self, folder: Path, config: dict) -> None:
        """The tokenizer of a point this host recorded, once per corpus (an attribute of its own per hash: two
        hosts that set it at once set the same content)."""
        digest, file = (config.get("data") or {}).get("tokenizer_hash"), folder / "tokenizer.json"
        if digest and file.is_file() and f"{TOKENIZER_ATTR}{digest}" not in self.study.user_attrs:
            self.study.set_user_attr(f"{TOKENIZER_ATTR}{digest}", read_json(file, "the run's tokenizer"))

    def pull(self, store) -> None:
        """Every point recorded in the storage into this host's points.jsonl (the records of points trained
        elsewhere: what the study's decisions and its report read), with the tokenizers they name."""
        store.absorb(self.records(), self.tokenizers())
        store.pack()

    def push(self, store, finished) -> None:
        """Points this host finished whose records the storage lacks (the database was lost as they ended):
        recorded now, so the hosts waiting on them go on."""
        import optuna
        from optuna.trial import TrialState

        trials = self._trials()
        for folder in store.local_points():
            key = store.key(folder)
            if any(t.state == TrialState.COMPLETE for t in trials.get(key, [])) or not finished(folder):
                continue
            config, summary = self._records_of(folder)
            self._share_tokenizer(folder, config)
            self.study.add_trial(optuna.trial.create_trial(
                state=TrialState.COMPLETE, value=_best(summary),
                user_attrs={"point": key, "host": f"{socket.gethostname()} (pid {os.getpid()})", "config": config,
                            "summary": summary}))

    @staticmethod
    def _records_of(folder: Path) -> tuple[dict, list]:
        config = check_run_config(read_json(folder / "config.json", "the run's config"), folder / "config.json")
        return portable_config(dict(config)), read_summary(folder)

    # --- queueing and claiming
    def _queue(self, key: str, attempt: int) -> None:
        """Queue ``key``'s ``attempt``-th trial, once across every host: the one that creates its marker."""
        import optuna

        try:
            self.storage.create_new_study([optuna.study.StudyDirection.MINIMIZE],
                                          study_name=f"frontier:{self.name}|{key}|{attempt}")
        except optuna.exceptions.DuplicatedStudyError:
            return  # another host queued this attempt
        self.study.enqueue_trial({}, user_attrs={"point": key, "attempt": attempt})

    def _claim(self, trial) -> bool:
        from optuna.exceptions import UpdateFinishedTrialError
        from optuna.trial import TrialState

        try:
            claimed = self.storage.set_trial_state_values(trial._trial_id, TrialState.RUNNING)
        except UpdateFinishedTrialError:
            return False
        if claimed:
            self.storage.set_trial_user_attr(trial._trial_id, "host", f"{socket.gethostname()} (pid {os.getpid()})")
            self.storage.record_heartbeat(trial._trial_id)
        return claimed

    def run(self, jobs: list[tuple[Path, list[str]]], store, run_here, finished) -> None:
        """Until every point of ``jobs`` (this stage's: folder, TinyStories.py arguments) is recorded in the
        storage: queue the ones with no live trial, and train here what this host claims, a point at a time as
        its slots free up (``run_here(more, ended)``: ``runner.run_points`` over this host's slots, asking
        ``more()`` for its next point and telling ``ended(k, code)``), recording each as it ends, what
        ``finished(folder)``; wait for the points other hosts hold. Then every recorded point is in this host's
        points.jsonl."""
        from optuna.storages import fail_stale_trials
        from optuna.trial import TrialState

        self.push(store, finished)
        here = {store.key(folder): (folder, args) for folder, args in jobs}
        waiting_said = False
        while True:
            fail_stale_trials(self.study)  # a host that stopped beating: its trial fails, its point is queued again
            trials = self._trials()
            open_keys = []
            for key in here:
                mine = trials.get(key, [])
                if any(t.state == TrialState.COMPLETE for t in mine):
                    continue
                errors = [t for t in mine if t.state == TrialState.FAIL and t.user_attrs.get("error")
                          and t.datetime_complete and t.datetime_complete >= self.started]
                if errors:
                    raise FrontierError(f"point {key} stopped with an error on {errors[0].user_attrs.get('host')}: "
                                        f"{errors[0].user_attrs['error']}; fix its cause there, then run the same "
                                        "command again (the point is tried again)")
                open_keys.append(key)
                if not any(t.state in (TrialState.WAITING, TrialState.RUNNING) for t in mine):
                    self._queue(key, len(mine))
            if not open_keys:
                self.pull(store)
                return
            if self._train(here, run_here, finished):
                waiting_said = False
                continue
            if not waiting_said:
                say(f"frontier {self.name}: {len(open_keys)} point(s) of this stage are being trained by other "
                    "hosts; waiting for their records")
                waiting_said = True
            time.sleep(min(POLL_S, self.heartbeat_s))

    def _next_claim(self, here: dict):
        """A queued trial of one of ``here``'s points, claimed for this host; None when none is left to claim."""
        from optuna.trial import TrialState

        for trial in self.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            if trial.user_attrs.get("point") in here and self._claim(trial):
                return trial
        return None

    def _train(self, here: dict, run_here, finished) -> bool:
        """Train here the points this host claims, each slot claiming its next as its last ends; each point's
        records (or why it stopped) go to the storage as it ends. False when there was nothing to claim."""
        claimed: list = []  # in the order started: run_points' k
        beating, lock = threading.Event(), threading.Lock()
        live: set = set()  # the trials whose points are training now
        outcome = {"stopped": None, "error": None}

        def beat():
            while not beating.wait(self.heartbeat_s):
                try:
                    with lock:
                        ids = list(live)
                    for trial_id in ids:
                        self.storage.record_heartbeat(trial_id)
                except Exception:  # noqa: BLE001 - a lost database: the points finish here, recording says so
                    return

        def more():
            if outcome["error"] is not None:
                return None
            trial = self._next_claim(here)
            if trial is None:
                return None
            claimed.append(trial)
            with lock:
                live.add(trial._trial_id)
            return here[trial.user_attrs["point"]]

        def ended(k: int, code: int) -> None:
            trial = claimed[k]
            with lock:
                live.discard(trial._trial_id)
            try:
                outcome["stopped"] = outcome["stopped"] or self._record(trial, here[trial.user_attrs["point"]][0],
                                                                        code, finished)
            except Exception as e:  # noqa: BLE001 - raised once the running points have ended
                outcome["error"] = outcome["error"] or e

        thread = threading.Thread(target=beat, daemon=True)
        thread.start()
        try:
            run_here(more, ended)
        finally:
            beating.set()
            thread.join()
        if outcome["error"] is not None:
            raise outcome["error"]
        if outcome["stopped"]:
            raise FrontierExit(outcome["stopped"], f"points stopped on this host (exit code {outcome['stopped']}); "
                                                   "every recorded point is kept in STUDY_STORAGE and the same "
                                                   "command continues")
        return bool(claimed)

    def _record(self, trial, folder: Path, code: int | None, finished) -> int | None:
        """A claimed point's end in the storage: its records, or that it was stopped (run again by the same
        command) or failed (its error, for every host to see); the exit code the study stops with, None when the
        point finished."""
        from optuna.trial import TrialState

        if (folder / "summary.json").exists() and finished(folder):
            config, summary = self._records_of(folder)
            self._share_tokenizer(folder, config)
            self.storage.set_trial_user_attr(trial._trial_id, "config", config)
            self.storage.set_trial_user_attr(trial._trial_id, "summary", summary)
            self.storage.set_trial_state_values(trial._trial_id, TrialState.COMPLETE, [_best(summary)])
            return None
        if code in (None, 130, 143, 137):  # stopped, not wrong: the same command runs it again
            self.storage.set_trial_user_attr(trial._trial_id, "interrupted", True)
            self.storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
            return code or 143
        self.storage.set_trial_user_attr(trial._trial_id, "error", f"exit code {code} (its log on that host)")
        self.storage.set_trial_state_values(trial._trial_id, TrialState.FAIL)
        return code


def _best(summary: list[dict]) -> float:
    """A recorded point's trial value: its best bits/char (NaN where every seed diverged)."""
    scores = [r["val_bpc"] for r in summary if r.get("val_bpc") is not None]
    return min(scores) if scores else float("nan")


def export_records(url: str, folder: Path, heartbeat_s: float = 30) -> Path:
    """The records of study ``folder.name`` in the storage at ``url`` written into ``folder`` as committable
    files: its frontier-study.json (the identity the hosts share, signed) and points.jsonl."""
    from reservoir.run.records import write_signed_json
    from reservoir.studies.frontier.records import STUDY_FILE, note_records
    from reservoir.studies.store import PointRecords

    if folder.is_dir() and any(folder.iterdir()) and not (folder / STUDY_FILE).exists():
        raise FrontierError(f"EXPORT={folder} holds files but no {STUDY_FILE}: not a study's folder, and nothing is "
                            f"written there; export into the study's own folder or a new one (EXPORT=results/<study>)")
    if folder.exists() and not folder.is_dir():
        raise FrontierError(f"EXPORT={folder} is a file: give a folder (EXPORT=results/<study>)")
    shared = SharedPoints(url, folder.name, heartbeat_s)
    identity = shared.study.user_attrs.get("identity")
    records = shared.records()
    if identity is None or not records:
        raise FrontierError(f"STUDY_STORAGE holds no recorded point of study {folder.name}: run it first (python "
                            f"scaling.py FRONTIER=True STUDY={folder.name} STUDY_STORAGE=... on each host)")
    make_folder(folder)
    write_signed_json(folder / STUDY_FILE, identity)
    store = PointRecords(folder)
    store.absorb(records, shared.tokenizers())
    written = store.pack()
    note_records(folder, store)
    return written
