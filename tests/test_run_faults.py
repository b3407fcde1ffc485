"""Faults and bad input: divergence, signals, concurrent runs, torn and half-written files,
full or read-only disks, hostile names and settings, damaged resumes."""

import errno
import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch

from reservoir.config import ConfigError, parse_overrides
from reservoir.platform import files
from reservoir.run.checkpoint import tensors_sha256
from reservoir.run.folders import claim_run_folder
from reservoir.run.records import ResultsError, read_metrics
from reservoir.run.writer import Run
from tests.conftest import ROOT, TINY, run_cli, run_script, run_then_sigkill, start_run, summary_of

# --------------------------------------------------------------------- 1. the NaN guard


def _no_nan(constant):
    pytest.fail(f"a result file holds {constant}: not valid JSON")


def test_a_diverging_model_stops_alone_and_the_run_goes_on(tmp_path):
    args = ["MODELS=['transformer','esn','ngram']", "MAX_STEPS=20", "LOG_EVERY=5", "CHECKPOINT_EVERY=0",
            "EVAL_POINTS=1",
            "LEARNING_RATE=1e9", "ESN.input_scaling=1e300"]
    proc = run_cli(tmp_path, *args, "RUN_NAME=nan")
    run_dir = tmp_path / "results" / "nan"
    summary = summary_of(run_dir)
    assert summary["transformer"]["status"] == "diverged" and summary["transformer"]["val_bpc"] is None
    assert summary["transformer"]["diverged_at_step"] == 5  # the first loss read
    assert summary["esn"]["status"] == "diverged" and "not finite" in summary["esn"]["reason"]
    assert summary["ngram"]["status"] == "finished" and summary["ngram"]["val_bpc"] > 0  # the run went on
    assert "transformer diverged at step 5" in proc.stderr and "lower LEARNING_RATE" in proc.stderr
    assert "Traceback" not in proc.stderr
    for file in ("metrics.jsonl", "train_log.jsonl"):  # valid JSON everywhere: null, never NaN
        for line in (run_dir / file).read_text().splitlines():
            json.loads(line, parse_constant=_no_nan)
    json.loads((run_dir / "summary.json").read_text(), parse_constant=_no_nan)
    assert not (run_dir / "checkpoints" / "transformer.pt").exists()  # nothing saved from a diverged model
    again = run_cli(tmp_path, *args, "RESUME=nan")  # the diverged model is not retried forever
    assert "transformer: finished" in again.stdout and "Traceback" not in again.stderr


def test_diverging_after_a_checkpoint_keeps_that_checkpoint(tmp_path):
    run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=10", "CHECKPOINT_EVERY=5", "LOG_EVERY=1", "RUN_NAME=c",
            "EVAL_POINTS=1")  # no evaluation finds the NaN before the loss read
    run_dir = tmp_path / "results" / "c"
    (run_dir / "summary.json").unlink()  # as if it had stopped after the checkpoint at step 5 ...
    ckpt = torch.load(run_dir / "checkpoints" / "lstm.pt", weights_only=True)
    ckpt["finished"], ckpt["progress"]["step"] = False, 5
    for state in ckpt["optimizer"]["state"].values():  # ... with moments that poison the next step
        state["exp_avg"].fill_(float("nan"))
    ckpt["tensors_sha256"] = tensors_sha256(ckpt)  # sealed again, as the run would have written them
    torch.save(ckpt, run_dir / "checkpoints" / "lstm.pt")
    before = (run_dir / "checkpoints" / "lstm.pt").read_bytes()
    proc = run_cli(tmp_path, "RESUME=c")
    assert "lstm diverged at step 7" in proc.stderr and "checkpoint at step 5 kept" in proc.stderr
    assert (run_dir / "checkpoints" / "lstm.pt").read_bytes() == before


def test_ridge_zero_is_solved_not_a_traceback(tmp_path):
    run_cli(tmp_path, "MODELS=['esn']", "MAX_STEPS=5", "ESN.units=32", "ESN.ridge=0", "RUN_NAME=r0")
    assert summary_of(tmp_path / "results" / "r0")["esn"]["status"] == "finished"


# --------------------------------------------------------------------- 2. SIGTERM, Ctrl-C, timed checkpoints


def _start(tmp_path, *args, new_python=False):
    """A run in its own process: forked as a study's CPU point is (``start_run``), or a new Python."""
    if not new_python:
        return start_run(tmp_path, *args)
    cmd = [sys.executable, str(ROOT / "TinyStories.py"), *TINY, f"RESULTS_DIR={tmp_path / 'results'}",
           f"CACHE_DIR={tmp_path / 'cache'}", *args]
    return subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for_training(run_dir, model="transformer", timeout=300):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if any(r["model"] == model for r in read_metrics(run_dir, "train_log.jsonl")):
            return
        time.sleep(0.05)
    pytest.fail("training never started")


# a Ctrl-C to a new Python, as a researcher's terminal sends it; a SIGTERM to a forked one, as a study's points get
@pytest.mark.parametrize("signum, code, new_python", [(signal.SIGTERM, 143, False), (signal.SIGINT, 130, True)])
def test_a_signal_finishes_the_step_checkpoints_and_says_how_to_resume(tmp_path, signum, code, new_python):
    args = ["MODELS=['ngram','transformer']", "MAX_STEPS=100000", "LOG_EVERY=1", "CHECKPOINT_EVERY=0",
            "CHECKPOINT_EVERY_S=0", "EVAL_EVERY=100000"]
    proc = _start(tmp_path, *args, "RUN_NAME=sig", new_python=new_python)
    run_dir = tmp_path / "results" / "sig"
    _wait_for_training(run_dir)
    proc.send_signal(signum)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == code, err
    ckpt = torch.load(run_dir / "checkpoints" / "transformer.pt", weights_only=True)
    step = ckpt["progress"]["step"]
    assert not ckpt["finished"] and step >= 1
    assert f"transformer saved at step {step}" in err
    assert f"RESUME={run_dir} continues transformer from its checkpoint at step {step}" in err
    assert "Traceback" not in err


def test_sigterm_then_resume_finishes_the_run(tmp_path):
    args = ["MODELS=['transformer']", "MAX_STEPS=400", "LOG_EVERY=1", "CHECKPOINT_EVERY=0", "EVAL_EVERY=100000"]
    proc = _start(tmp_path, *args, "RUN_NAME=t")
    run_dir = tmp_path / "results" / "t"
    _wait_for_training(run_dir)
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    step = torch.load(run_dir / "checkpoints" / "transformer.pt", weights_only=True)["progress"]["step"]
    assert step < 400
    resumed = run_cli(tmp_path, *args, "RESUME=t")
    assert f"resuming at step {step}" in resumed.stdout
    assert summary_of(run_dir)["transformer"]["train_steps"] == 400


def test_a_person_s_second_signal_stops_at_once_and_the_same_one_delivered_twice_does_not(monkeypatch):
    """The handler itself, on Ctrl-C (SIGINT: a KeyboardInterrupt, where a second SIGTERM would end this process):
    a second signal within SAME_REQUEST_S of the first is the same request; one after it is a person's second."""
    from reservoir.platform import stopping

    now = [1000.0]
    monkeypatch.setattr(stopping.time, "monotonic", lambda: now[0])
    with stopping.installed(announce=False):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(0.01)  # Python runs the handler between two bytecodes of this thread
        assert stopping.requested() == "SIGINT"
        now[0] += stopping.SAME_REQUEST_S / 2
        os.kill(os.getpid(), signal.SIGINT)  # as timeout's copy to the group: ignored
        time.sleep(0.01)
        now[0] += stopping.SAME_REQUEST_S
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.01)


def test_the_same_signal_delivered_twice_at_once_is_one_request_and_saves(tmp_path):
    """timeout(1) sends its TERM to the command, then to the command's whole group, and a study passes a group's
    TERM on to its points: one request arrived twice, and the second stopped the run at once, losing every step
    since its last checkpoint."""
    proc = _start(tmp_path, "MODELS=['transformer']", "MAX_STEPS=100000", "LOG_EVERY=1", "RUN_NAME=twice",
                  "CHECKPOINT_EVERY=0", "CHECKPOINT_EVERY_S=0")
    _wait_for_training(tmp_path / "results" / "twice")
    proc.send_signal(signal.SIGTERM)
    said = []
    for line in proc.stderr:  # the first one is handled: its checkpoint is being written
        said.append(line)
        if "SIGTERM received" in line:
            break
    proc.send_signal(signal.SIGTERM)
    _, rest = proc.communicate(timeout=120)
    assert proc.returncode == 143, "".join(said) + rest
    step = torch.load(tmp_path / "results" / "twice" / "checkpoints" / "transformer.pt",
                      weights_only=True)["progress"]["step"]
    assert f"transformer saved at step {step}" in rest and step >= 1


def test_timed_checkpoints_bound_what_a_kill_loses(tmp_path):
    proc = _start(tmp_path, "MODELS=['transformer']", "MAX_STEPS=100000", "LOG_EVERY=1000", "CHECKPOINT_EVERY=0",
                  "CHECKPOINT_EVERY_S=0.5", "EVAL_EVERY=100000", "RUN_NAME=timed")
    ckpt = tmp_path / "results" / "timed" / "checkpoints" / "transformer.pt"
    deadline = time.time() + 120
    while not ckpt.exists() and time.time() < deadline:
        time.sleep(0.05)
    time.sleep(1.5)
    proc.kill()
    proc.communicate()
    progress = torch.load(ckpt, weights_only=True)["progress"]
    assert progress["step"] > 0 and 0.5 <= progress["seconds"]  # saved by the clock, not by a step count


# --------------------------------------------------------------------- 3. one lock per run


def test_a_second_run_on_the_same_folder_is_refused(tmp_path):
    proc = _start(tmp_path, "MODELS=['transformer']", "MAX_STEPS=100000", "LOG_EVERY=1", "RUN_NAME=busy")
    run_dir = tmp_path / "results" / "busy"
    try:
        _wait_for_training(run_dir)
        second = run_cli(tmp_path, "RESUME=busy", check=False)
        assert second.returncode != 0 and "in use by another run" in second.stderr
        assert f"pid {proc.pid}" in second.stderr and "Traceback" not in second.stderr
    finally:
        proc.kill()
        proc.communicate()
    rows = read_metrics(run_dir, "train_log.jsonl")
    assert len(rows) == len({r["step"] for r in rows})  # no duplicated rows from a second trainer
    claim = claim_run_folder({"RESULTS_DIR": str(tmp_path / "results"), "RUN_NAME": None}, run_dir)
    claim.release()  # the dead process's lock went with it


# --------------------------------------------------------------------- 4. torn metrics rows


def test_resume_repairs_a_cut_off_last_metrics_line(tmp_path):
    run_cli(tmp_path, "MODELS=['lstm','transformer']", "MAX_STEPS=10", "EVAL_EVERY=5", "RUN_NAME=torn")
    run_dir = tmp_path / "results" / "torn"
    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps([r for r in summary if r["model"] == "lstm"]))
    (run_dir / "checkpoints" / "transformer.pt").unlink()
    with open(run_dir / "metrics.jsonl", "a") as f:
        f.write('{"model": "transformer", "step": 5, "val_lo')  # what a full disk left
    proc = run_cli(tmp_path, "RESUME=torn")
    assert "last line was cut off" in proc.stderr
    assert "transformer: no checkpoint in" in proc.stdout and "training it from step 0" in proc.stdout
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows if r["model"] == "transformer"] == [5, 10]


def test_a_failed_append_leaves_whole_lines(tmp_path, monkeypatch):
    path = tmp_path / "metrics.jsonl"
    files.append_line(path, '{"model": "a", "step": 1}')
    real_write = os.write

    def full_disk(fd, data):
        real_write(fd, data[:7])  # part of the line reaches the disk, then it is full
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full_disk)
    with pytest.raises(files.StorageError, match="no space left"):
        files.append_line(path, '{"model": "a", "step": 2}')
    monkeypatch.undo()
    assert path.read_text() == '{"model": "a", "step": 1}\n'


def test_bad_metrics_rows_are_one_line_errors(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"model": "a", "step": 1}\n[1, 2]\n')
    with pytest.raises(ResultsError, match="line 2 is not a metrics row"):
        read_metrics(tmp_path)


# --------------------------------------------------------------------- 5, 6, 12: temporaries, full disks, modes


def test_stale_temporaries_are_removed_on_resume(tmp_path):
    run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=5", "RUN_NAME=stale")
    run_dir = tmp_path / "results" / "stale"
    stale = [run_dir / ".summary.json.abc123.tmp", run_dir / "checkpoints" / ".lstm.pt.xyz789.tmp"]
    for path in stale:
        path.write_bytes(b"\0" * 1000)
    proc = run_cli(tmp_path, "RESUME=stale")
    assert not any(p.exists() for p in stale) and "unfinished temporary file" in proc.stderr


def test_a_full_disk_during_a_write_is_one_line_and_leaves_nothing(tmp_path, monkeypatch):
    def no_space(tmp):
        with open(tmp, "wb") as f:
            f.write(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")

    with pytest.raises(files.StorageError, match=r"cannot write .*ckpt.pt: no space left on the device"):
        files.atomic_write(tmp_path / "ckpt.pt", no_space)
    assert list(tmp_path.iterdir()) == []  # neither the file nor its temporary


def test_a_read_only_place_is_one_line(tmp_path, monkeypatch):
    real_mkstemp = files.tempfile.mkstemp

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system")

    monkeypatch.setattr(files.tempfile, "mkstemp", read_only)
    with pytest.raises(files.StorageError, match="the file system is read-only"):
        files.atomic_write_text(tmp_path / "summary.json", "[]")
    monkeypatch.setattr(files.tempfile, "mkstemp", real_mkstemp)


def _mount_tmpfs(where, options):
    where.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True).returncode:
        pytest.skip("cannot mount a tmpfs here (needs root in a machine that allows mounts)")


def test_real_full_and_read_only_disks_are_one_line_errors(tmp_path):
    full, readonly = tmp_path / "full", tmp_path / "readonly"
    _mount_tmpfs(full, "size=64k")  # too small for the token cache
    try:
        proc = run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=3", f"CACHE_DIR={full}", check=False)
        assert proc.returncode != 0 and "no space left on the device" in proc.stderr, proc.stderr
        assert "Traceback" not in proc.stderr and not list(full.rglob("*.tmp"))
    finally:
        subprocess.run(["umount", str(full)], capture_output=True)
    _mount_tmpfs(readonly, "ro,size=64k")
    try:
        proc = run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=3", f"RESULTS_DIR={readonly}/results", check=False)
        assert proc.returncode != 0 and "Read-only file system" in proc.stderr and "Traceback" not in proc.stderr
    finally:
        subprocess.run(["umount", str(readonly)], capture_output=True)


def test_result_files_respect_the_umask(tmp_path):
    run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=3", "RUN_NAME=modes")
    run_dir = tmp_path / "results" / "modes"
    mask = os.umask(0)
    os.umask(mask)
    cache = sorted((tmp_path / "cache").rglob("*.bin")) + sorted((tmp_path / "cache").rglob("*.json"))
    assert len(cache) >= 4  # token arrays, their metadata and the tokenizer: the cache half checks something
    for path in (run_dir / "summary.json", run_dir / "checkpoints" / "lstm.pt", run_dir / "config.json", *cache):
        assert path.stat().st_mode & 0o777 == 0o666 & ~mask, path


# --------------------------------------------------------------------- 7, 8: names and settings


@pytest.mark.parametrize("name", ["../escape", "/tmp/abs", "a/b", "..", "."])
def test_run_names_that_are_not_one_plain_folder_are_refused(name):
    with pytest.raises(ConfigError, match="plain folder name"):
        parse_overrides([f"RUN_NAME={name}", "TIME_BUDGET_S=1"])


def test_settings_that_cannot_build_are_refused_before_any_folder(tmp_path):
    proc = run_cli(tmp_path, "MODELS=['transformer']", "MAX_STEPS=3", "TRANSFORMER.n_head=3",
                   "TRANSFORMER.n_embd=64", check=False)
    assert proc.returncode != 0 and "divisible by TRANSFORMER.n_head=3" in proc.stderr
    assert not (tmp_path / "results").exists()


def test_an_error_before_the_first_model_leaves_no_run_folder(tmp_path):
    proc = run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=3", "BATCH_SIZE=100000", check=False)
    assert proc.returncode != 0 and "fewer than one batch" in proc.stderr
    results = tmp_path / "results"  # refused before the folder: RESUME=latest finds nothing
    assert not results.exists() or list(results.iterdir()) == []


# --------------------------------------------------------------------- 9: damaged resumes


@pytest.mark.parametrize("damage, message", [
    (lambda c: c["requested_config"].update(MODELS=["gpt5"]), "unknown model 'gpt5'"),
    (lambda c: c["requested_config"].update(GRAD_ACCUM="lots"), "GRAD_ACCUM must be an integer"),
    (lambda c: c.pop("requested_config"), "no requested_config"),
    (lambda c: c["requested_config"].update(MAX_STEPS=4), "keep"),  # its hash says it was edited
])
def test_a_damaged_saved_config_is_a_one_line_error(tmp_path, damage, message):
    """A config.json whose integrity hash is gone (as written before runs recorded one) is checked like a
    command line; one with its hash is refused at the first edit (test_faults.py)."""
    run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=3", "RUN_NAME=d")
    path = tmp_path / "results" / "d" / "config.json"
    config = json.loads(path.read_text())
    damage(config)
    if message == "keep":
        message = "was edited or damaged after the run wrote it"
    else:  # as written before runs recorded a hash (and the package version that writes one)
        config.pop("integrity")
        config["versions"].pop("reservoir_nlp")
    path.write_text(json.dumps(config))
    proc = run_cli(tmp_path, "RESUME=d", check=False)
    assert proc.returncode != 0 and message in proc.stderr and "Traceback" not in proc.stderr


# --------------------------------------------------------------------- 13, 14: the launcher's folder and resumes


def test_a_non_main_process_uses_the_folder_its_launcher_claimed(tmp_path):
    """torch_xla.launch's processes cannot agree on a folder by broadcast (broadcast_object is the identity on
    XLA): the parent claims it and every process opens that one. World size faked at the DeviceInfo."""
    from reservoir.platform.device import DeviceInfo

    config = parse_overrides(["TIME_BUDGET_S=1", f"RESULTS_DIR={tmp_path / 'results'}"])
    claim = claim_run_folder(config, None)
    second = DeviceInfo("tpu", torch.device("cpu"), "XLA:fake", "bf16", world_size=2, rank=1)
    run = Run.open(config, second, None, claimed=claim.path)
    assert run.path == claim.path and not run.writes
    with pytest.raises(ResultsError, match="decided before the launch"):
        Run.open(config, second)  # the old path: Path(None) on every process but the first
    claim.release()


def test_a_checkpoint_from_another_world_size_is_refused(tmp_path):
    run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=10", "CHECKPOINT_EVERY=5", "RUN_NAME=w")
    run_dir = tmp_path / "results" / "w"
    path = run_dir / "checkpoints" / "lstm.pt"
    ckpt = torch.load(path, weights_only=True)
    assert ckpt["replicas"] == 1  # recorded with every checkpoint
    ckpt["replicas"], ckpt["finished"] = 2, False  # as if written by 2 processes
    torch.save(ckpt, path)
    (run_dir / "summary.json").unlink()
    proc = run_cli(tmp_path, "RESUME=w", check=False)
    assert proc.returncode != 0 and "replicas is 2, the run has 1" in proc.stderr and "Traceback" not in proc.stderr


# --------------------------------------------------------------------- 10, 11: unknown characters, cache hashes


def test_validation_text_the_tokenizer_never_saw_is_counted_and_warned(tmp_path):
    train, val = tmp_path / "train.txt", tmp_path / "val.txt"
    train.write_text("<|endoftext|>\n".join(["the cat sat on the mat. " * 20] * 30), encoding="utf-8")
    val.write_text("<|endoftext|>\n".join(["ΩΨΦ ЖЖЖ 日本語 " * 20] * 5), encoding="utf-8")
    proc = run_cli(tmp_path, f"TRAIN_PATH={train}", f"VAL_PATH={val}", "MODELS=['ngram']", "MAX_STEPS=3",
                   "RUN_NAME=unk", "EVAL_TOKENS=256")
    assert "validation tokens are characters the training text never has" in proc.stderr
    share = summary_of(tmp_path / "results" / "unk")["ngram"]["val_unknown_share"]
    assert 0.5 < share <= 1.0
    quiet = run_cli(tmp_path, "MODELS=['ngram']", "MAX_STEPS=3", "RUN_NAME=known")
    assert "never has" not in quiet.stderr
    assert summary_of(tmp_path / "results" / "known")["ngram"]["val_unknown_share"] == 0.0


def test_reordered_tokens_and_an_edited_tokenizer_are_caught(tmp_path, capsys):
    import numpy as np

    from reservoir.data.corpus import Corpus, Stories
    from reservoir.data.tokenizers import CharTokenizer, load_or_train_tokenizer
    from reservoir.data.tokens import cached_tokens

    tok = CharTokenizer.train(["abcdef"])
    stories = ["abc", "fed"] * 50
    first = np.array(cached_tokens(tok, stories, "h1", tmp_path, "train"))
    (npy,) = (tmp_path / "tokens").glob("*.bin")
    raw = bytearray(npy.read_bytes())
    raw[-2:], raw[-4:-2] = raw[-4:-2], raw[-2:]  # swap the last two tokens: the same sum, another order
    assert raw != npy.read_bytes()
    npy.write_bytes(bytes(raw))
    assert np.array_equal(cached_tokens(tok, stories, "h1", tmp_path, "train"), first)
    assert "does not match its metadata" in capsys.readouterr().err

    corpus = Corpus(Stories.of(["abc def"]), Stories.of(["abc"]), "test", "test corpus")
    trained = load_or_train_tokenizer("char", 0, corpus, tmp_path, "h2")
    (path,) = (tmp_path / "tokenizers").glob("*.json")
    path.write_text(path.read_text().replace("abc", "abx"))  # still parses, but it is not the trained one
    again = load_or_train_tokenizer("char", 0, corpus, tmp_path, "h2")
    assert again.chars == trained.chars and "training it again" in capsys.readouterr().err


# --------------------------------------------------------------------- log hygiene


def test_logs_that_are_not_a_terminal_get_plain_lines(tmp_path):
    proc = run_cli(tmp_path, "MODELS=['lstm','esn']", "TIME_BUDGET_S=1", "ESN.units=32")
    assert "\r" not in proc.stderr and "\r" not in proc.stdout  # no carriage-return bar updates in a log
    assert "lstm (budget: 1.0 s): 100% after" in proc.stderr  # the closing progress line


def test_help_shows_shell_safe_list_forms():
    out = run_script("TinyStories.py", "--help", check=False)
    assert "MODELS=esn,lstm" in out.stdout and "\"MODELS=['esn', 'lstm']\"" in out.stdout


def test_a_loss_far_above_guessing_uniformly_is_divergence_not_a_score(tmp_path):
    proc = run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=30", "LEARNING_RATE=50", "GRAD_CLIP=0", "RUN_NAME=d")
    record = summary_of(tmp_path / "results" / "d")["lstm"]
    assert record["status"] == "diverged" and record["val_bpc"] is None
    assert "of guessing uniformly" in record["reason"] and "DIVERGED" in proc.stdout


def test_a_batch_the_data_cannot_fill_is_refused_before_any_folder(tmp_path):
    proc = run_cli(tmp_path, "MODELS=ngram,lstm", "BATCH_SIZE=100000", "MAX_STEPS=2", check=False)
    assert proc.returncode != 0 and "fewer than one batch (100000)" in proc.stderr
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip().splitlines()[-1]]  # one line, no note
    assert not (tmp_path / "results").exists() or not any((tmp_path / "results").iterdir())


def test_a_kill_during_the_final_evaluation_does_not_train_again(tmp_path):
    args = ["MODELS=transformer", "MAX_STEPS=20", "FINAL_EVAL_TOKENS=None", "EVAL_MODE=windows",
            "SYNTHETIC_STORIES=3000", "CHECKPOINT_EVERY=0", "CHECKPOINT_EVERY_S=0", "EVAL_POINTS=1"]

    def finished_checkpoint_but_no_final_evaluation(run_dir):
        path, metrics = run_dir / "checkpoints" / "transformer.pt", run_dir / "metrics.jsonl"
        try:
            done = path.exists() and torch.load(path, weights_only=True)["finished"]
            return done and not (metrics.exists() and '"final": true' in metrics.read_text())
        except Exception:  # caught mid-write: look again
            return False

    killed = run_then_sigkill(tmp_path, args, "k", finished_checkpoint_but_no_final_evaluation)
    assert not (killed / "summary.json").exists(), "the kill must land inside the final evaluation"
    resumed = run_cli(tmp_path, "RESUME=k", "SYNTHETIC_STORIES=3000", "FINAL_EVAL_TOKENS=None")
    assert "finished in the checkpoint (seed 1337); evaluating it again" in resumed.stdout
    assert "resuming at step" not in resumed.stdout
    record = summary_of(killed)["transformer"]
    assert record["train_steps"] == 20 and record["val_bpc"] > 0
    finals = [json.loads(line) for line in (killed / "metrics.jsonl").read_text().splitlines()]
    assert sum(r["final"] for r in finals) == 1  # the final evaluation is logged once


def test_a_finished_model_evaluated_again_on_resume_logs_its_final_evaluation_once(tmp_path):
    """Killed after the final evaluation was logged (while sampling): RESUME evaluates again, logs nothing twice."""
    run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=4", "RUN_NAME=f")
    run_dir = tmp_path / "results" / "f"
    (run_dir / "summary.json").write_text("[]")
    resumed = run_cli(tmp_path, "RESUME=f")
    assert "finished in the checkpoint" in resumed.stdout
    finals = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert sum(bool(r["final"]) for r in finals) == 1


def test_a_ridge_fit_whose_budget_affords_part_of_one_pass_says_so_and_what_to_change(tmp_path):
    """A 10,000-unit ESN at the default run's budget fitted on 0.04 epochs and said nothing: its XᵀX costs units²
    a token, so the budget ran out a few chunks into its one pass."""
    whole = run_cli(tmp_path, "MODELS=['esn']", "FLOP_BUDGET=1e15", "RUN_NAME=whole")
    flops = summary_of(tmp_path / "results" / "whole")["esn"]["train_flops"]
    assert "of one pass over its training data" not in whole.stderr
    part = run_cli(tmp_path, "MODELS=['esn']", f"FLOP_BUDGET={flops / 2:.6g}", "RUN_NAME=part")
    line = next(line for line in part.stderr.splitlines() if "of one pass over its training data" in line)
    assert "WARNING: esn: FLOP_BUDGET=" in line and "raise FLOP_BUDGET to " in line and "fewer units" in line
    share = int(line.split("affords ")[1].split("%")[0])
    assert 40 <= share <= 55, line
    record = summary_of(tmp_path / "results" / "part")["esn"]
    assert record["fit"]["bound_by"] == "flops" and record["epochs"] < 0.6
