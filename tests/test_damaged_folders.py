"""Damaged and edited run folders, and the disks under them: edited or damaged run folders are never trusted, disks
that fail mid-write are one line, interrupted cache writes are cleaned up, CRLF text is read as
text. Sweeps' faults are in test_sweep.py."""

import json
import resource
import shutil
import subprocess
import sys

import pytest
import torch

from reservoir.config import ConfigError, parse_overrides
from reservoir.platform.messages import PlainProgress
from tests.conftest import ROOT, TINY, run_cli, run_in_process, run_script, summary_of


def _unshare_works() -> bool:
    """A private mount namespace (root, or an unprivileged user namespace) lets a test mount a tmpfs."""
    if not shutil.which("unshare"):
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True)
    return probe.returncode == 0


needs_mounts = pytest.mark.skipif(not _unshare_works(), reason="cannot mount a private tmpfs here (unshare -rm)")


def run_in_tmpfs(tmp_path, mount_at, options, *args, before=""):
    """TinyStories.py in a private mount namespace where ``mount_at`` is a fresh tmpfs with ``options``
    (``before``: shell commands run after mounting, e.g. to fill it or make it read-only)."""
    mount_at.mkdir(exist_ok=True)
    command = " ".join(["'" + str(a).replace("'", "'\\''") + "'" for a in
                        [sys.executable, ROOT / "TinyStories.py", *TINY, f"CACHE_DIR={tmp_path / 'cache'}", *args]])
    script = f"mount -t tmpfs -o {options} tmpfs '{mount_at}' && {before} {command}"
    return subprocess.run(["unshare", "-rm", "sh", "-c", script], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


# --------------------------------------------------------------------- 5, 6: disks


@needs_mounts
def test_a_full_disk_during_a_checkpoint_is_one_line(tmp_path):
    results = tmp_path / "small"
    # the token cache lives elsewhere; the 1 MB tmpfs holds the run folder until a checkpoint no longer fits
    proc = run_in_tmpfs(tmp_path, results, "size=1m", "MODELS=['transformer']", "TRANSFORMER.n_embd=128",
                        "MAX_STEPS=40", "CHECKPOINT_EVERY=10", "PLOTS=False", f"RESULTS_DIR={results}",
                        "RUN_NAME=full")
    assert proc.returncode != 0
    assert "no space left on the device" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "unexpected pos" not in proc.stderr


@needs_mounts
def test_a_read_only_results_mount_is_one_line(tmp_path):
    results = tmp_path / "ro"
    proc = run_in_tmpfs(tmp_path, results, "ro,size=64k", "MODELS=['ngram']", "MAX_STEPS=3",
                        f"RESULTS_DIR={results}")
    assert proc.returncode != 0, proc.stdout
    assert "cannot create a run folder" in proc.stderr and "Read-only file system" in proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]


# --------------------------------------------------------------------- 12, 13: cheap errors, empty progress


def _limit_memory():
    resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))


def test_a_batch_the_data_cannot_fill_is_refused_before_the_flop_count(tmp_path):
    """BATCH_SIZE=10**6: counting FLOPs first would run a forward and backward pass at that batch (tens of
    GB); under a 4 GiB address-space limit only the early check can answer in one line."""
    cmd = [sys.executable, str(ROOT / "TinyStories.py"), *TINY, f"RESULTS_DIR={tmp_path / 'results'}",
           f"CACHE_DIR={tmp_path / 'cache'}", "MODELS=['lstm']", "BATCH_SIZE=1000000", "FLOP_BUDGET=1e13"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, preexec_fn=_limit_memory)
    assert proc.returncode != 0 and "fewer than one batch" in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr


def test_a_progress_line_without_a_total_counts_instead_of_dividing(capsys):
    bar = PlainProgress(0, "fetching", every=0.0)
    bar.update(1234)
    bar.close()
    assert "fetching: 1,234 after" in capsys.readouterr().err


# --------------------------------------------------------------------- 10, 11: the cache and the text


def _cfg(tmp_path, *args):

    return parse_overrides([f"CACHE_DIR={tmp_path / 'cache'}", "TIME_BUDGET_S=1", "SEQ_LEN=16", *args])


def test_a_killed_cache_write_is_removed_at_start_but_a_live_one_is_kept(tmp_path, capsys):
    import fcntl
    import os

    from reservoir.data.tokens import prepare_data

    tokens = tmp_path / "cache" / "tokens"
    tokens.mkdir(parents=True)
    killed = tokens / ".train-abc.bin.x1y2z3.tmp"  # what a kill during tokenizing leaves
    killed.write_bytes(b"\0" * 4096)
    live = tokens / ".val-def.bin.q7r8s9.tmp"  # another run writing the cache right now holds its lock
    live.write_bytes(b"\0" * 16)
    holder = os.open(live, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        prepare_data(_cfg(tmp_path, "DATASET=synthetic", "SYNTHETIC_STORIES=60"))
    finally:
        os.close(holder)
    assert not killed.exists() and live.exists()
    assert "removed 1 unfinished temporary file(s) that interrupted cache writes left" in capsys.readouterr().err


def _stories_file(path, stories, separator, newline):
    path.write_bytes(separator.join(stories).replace("\n", newline).encode("utf-8"))
    return path


@pytest.mark.parametrize("separator", ["\n<|endoftext|>\n", "\n\n"], ids=["tinystories-format", "plain"])
def test_crlf_text_reads_exactly_as_lf_text(tmp_path, separator, capsys):
    from reservoir.data.corpus import iter_stories
    from reservoir.data.tokens import prepare_data

    stories = [f"Story {i}.\nThe cat sat on the mat, line two of {i}." for i in range(40)]
    runs = {}
    for newline in ("\n", "\r\n"):
        name = "crlf" if newline == "\r\n" else "lf"
        train = _stories_file(tmp_path / f"train-{name}.txt", stories[:30], separator, newline)
        val = _stories_file(tmp_path / f"val-{name}.txt", stories[30:], separator, newline)
        assert list(iter_stories(train)) == stories[:30]  # not one story, no '\r' in any
        runs[name] = prepare_data(_cfg(tmp_path, f"TRAIN_PATH={train}", f"VAL_PATH={val}"))
    assert runs["crlf"].tokenizer.vocab_size == runs["lf"].tokenizer.vocab_size
    assert (runs["crlf"].val == runs["lf"].val).all() and runs["crlf"].chars_per_token == runs["lf"].chars_per_token
    said = capsys.readouterr().out
    assert said.count("train-crlf.txt has '\\r\\n' line ends") == 1 and "train-lf.txt has" not in said


# --------------------------------------------------------------------- 14: n-gram keys


def test_an_ngram_whose_keys_would_overflow_is_refused_before_any_folder(tmp_path):

    with pytest.raises(ConfigError, match=r"NGRAM.order=6 with a vocabulary of 4096 tokens .* NGRAM.order<=5"):
        parse_overrides(["TOKENIZER=bpe", "VOCAB_SIZE=4096", "MODELS=['ngram']", "NGRAM.order=6", "MAX_STEPS=1"])
    parse_overrides(["TOKENIZER=bpe", "VOCAB_SIZE=4096", "MODELS=['ngram']", "NGRAM.order=5", "MAX_STEPS=1"])
    # a character vocabulary is known once the data is read: 300 distinct characters overflow at order 8
    text = "".join(chr(0x100 + i) for i in range(300))
    train = tmp_path / "wide.txt"
    train.write_text("\n\n".join(text[i:] + text[:i] for i in range(0, 300, 7)), encoding="utf-8")
    proc = run_cli(tmp_path, f"TRAIN_PATH={train}", "MODELS=['ngram']", "NGRAM.order=8", "MAX_STEPS=1",
                   check=False)
    assert proc.returncode != 0 and "NGRAM.order=8 with a vocabulary of" in proc.stderr
    assert "Traceback" not in proc.stderr and not list((tmp_path / "results").glob("*"))


# --------------------------------------------------------------------- 1-4: run folders are trusted as written


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """A small finished run (n-gram and LSTM) and its token cache, made once; tests damage copies."""
    root = tmp_path_factory.mktemp("made")
    run_cli(root, "MODELS=['ngram','lstm']", "MAX_STEPS=6", "CHECKPOINT_EVERY=3", "RUN_NAME=r")
    return root


@pytest.fixture
def run_copy(finished_run, tmp_path):
    shutil.copytree(finished_run / "results", tmp_path / "results")
    shutil.copytree(finished_run / "cache", tmp_path / "cache")
    return tmp_path / "results" / "r"


def _unfinish(run_dir, model="lstm"):
    """As if the run had stopped after ``model``'s checkpoint at step 3: RESUME has work to do."""

    summary = json.loads((run_dir / "summary.json").read_text())
    (run_dir / "summary.json").write_text(json.dumps([r for r in summary if r["model"] != model]))
    ckpt = torch.load(run_dir / "checkpoints" / f"{model}.pt", weights_only=True)
    assert ckpt["progress"]["step"] == 6
    ckpt["finished"] = False
    torch.save(ckpt, run_dir / "checkpoints" / f"{model}.pt")


def test_resume_rewrites_a_damaged_tokenizer_and_sample_then_works(run_copy):
    tokenizer = run_copy / "tokenizer.json"
    good = tokenizer.read_bytes()
    with open(tokenizer, "r+b") as f:
        f.truncate(40)
    assert "not a readable" in run_script("sample.py", run_copy, "MODEL=lstm", check=False).stderr
    proc = run_cli(run_copy.parents[1], f"RESUME={run_copy}")
    assert "tokenizer.json was damaged (not the run's tokenizer); written again" in proc.stderr
    assert tokenizer.read_bytes() == good
    assert run_script("sample.py", run_copy, "MODEL=lstm", "MAX_NEW_TOKENS=5").stdout.strip()


def _pre_hash(config: dict) -> None:
    """As a folder written before config.json carried a hash: no hash, and no package version recorded."""
    config.pop("integrity")
    config["versions"].pop("reservoir_nlp")


def _edit_config(run_dir, edit):
    path = run_dir / "config.json"
    content = json.loads(path.read_text())
    edit(content)
    path.write_text(json.dumps(content))


@pytest.mark.parametrize("edit", [
    lambda c: c["requested_config"].pop("MODELS"),
    lambda c: c["requested_config"].update(MAX_STEPS=9),
    lambda c: c["effective_config"].update(SEQ_LEN=64),
], ids=["models-deleted", "max-steps-edited", "effective-edited"])
def test_resume_refuses_an_edited_config(run_copy, edit):
    _unfinish(run_copy)
    _edit_config(run_copy, edit)
    before = sorted(p.name for p in run_copy.rglob("*"))
    proc = run_cli(run_copy.parents[1], f"RESUME={run_copy}", check=False)
    assert proc.returncode != 0 and "was edited or damaged after the run wrote it" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr and sorted(p.name for p in run_copy.rglob("*")) == before


@pytest.mark.parametrize("script", ["sample.py", "compare.py"])
@pytest.mark.parametrize("damage, message", [
    (lambda c: c["effective_config"].pop("MODELS"), "was edited or damaged"),
    (lambda c: (_pre_hash(c), c["effective_config"].pop("MODELS")), "has no effective_config.MODELS"),
    (lambda c: (_pre_hash(c), c.pop("effective_config")), "has no effective_config"),
    (lambda c: (_pre_hash(c), c["data"].pop("tokenizer_hash")), "has no data.tokenizer_hash"),
    (lambda c: c.pop("integrity"), "has lost its integrity hash"),
], ids=["hashed", "unhashed-key", "unhashed-block", "unhashed-data", "hash-deleted"])
def test_sample_and_compare_read_a_damaged_config_as_one_line(run_copy, script, damage, message):
    _edit_config(run_copy, damage)
    args = [run_copy, "MODEL=lstm"] if script == "sample.py" else [f"{run_copy}:lstm", f"{run_copy}:ngram"]
    proc = run_script(script, *args, check=False)
    assert proc.returncode != 0 and message in proc.stderr, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "KeyError" not in proc.stderr


def test_resume_refuses_every_changed_key_default_or_not(run_copy):
    _unfinish(run_copy)
    results = run_copy.parents[1]
    proc = run_cli(results, f"RESUME={run_copy}", "SEQ_LEN=128", "BATCH_SIZE=32", "LSTM.hidden=256", check=False)
    assert proc.returncode != 0 and "SEQ_LEN" in proc.stderr and "BATCH_SIZE" in proc.stderr
    assert "LSTM.hidden" in proc.stderr and "differ from the saved run" in proc.stderr
    resumed = run_cli(results, f"RESUME={run_copy}", "SEQ_LEN=32", "LSTM.hidden=64")  # the run's own values
    assert "lstm: resuming at step 6" in resumed.stdout
    assert summary_of(run_copy)["lstm"]["train_steps"] == 6


def _rewrite_config(run_dir, change, rehash: bool):
    from reservoir.run.records import INTEGRITY_KEY, _integrity

    path = run_dir / "config.json"
    content = json.loads(path.read_text())
    change(content)
    content.pop(INTEGRITY_KEY, None)
    if rehash:  # as someone who recomputes the hash would: the hash guards against accidents, not that
        content[INTEGRITY_KEY] = _integrity(content)
    path.write_text(json.dumps(content))


def test_deleting_the_integrity_key_does_not_switch_the_check_off_nor_fill_missing_keys(tmp_path):
    run_cli(tmp_path, "MODELS=transformer", "MAX_STEPS=4", "RUN_NAME=r")
    run_dir = tmp_path / "results" / "r"
    (run_dir / "summary.json").write_text("[]")  # as if interrupted after its last checkpoint
    pristine = (run_dir / "config.json").read_text()
    _rewrite_config(run_dir, lambda c: c["requested_config"].pop("MODELS"), rehash=False)
    proc = run_cli(tmp_path, "RESUME=r", check=False)
    assert proc.returncode != 0 and "has lost its integrity hash" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in proc.stderr
    (run_dir / "config.json").write_text(pristine)
    _rewrite_config(run_dir, lambda c: c["requested_config"].pop("MODELS"), rehash=True)
    proc = run_cli(tmp_path, "RESUME=r", check=False)
    assert proc.returncode != 0 and "it has no requested_config.MODELS" in proc.stderr
    assert not list((run_dir / "checkpoints").glob("lstm*"))  # today's default models were not trained into it
    assert json.loads((run_dir / "summary.json").read_text()) == []


def test_a_run_recorded_before_the_new_optimizer_keys_resumes_as_it_trained(tmp_path):
    from reservoir.config import ADDED_KEYS

    run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=4", "RUN_NAME=old")
    run_dir = tmp_path / "results" / "old"
    (run_dir / "summary.json").write_text("[]")
    added = [k for k in ADDED_KEYS if k not in ("FROZEN_RETENTION", "RESERVOIR_ATTENTION")]  # TINY names those
    _rewrite_config(run_dir, lambda c: [c["requested_config"].pop(k) for k in added], rehash=True)
    resumed = run_cli(tmp_path, "RESUME=old")
    assert "lstm: finished in the checkpoint" in resumed.stdout


@pytest.mark.parametrize("name, command", [("generation-cost.json", "GENERATION"),
                                           ("elementwise-cost.json", "ELEMENTWISE")])
def test_a_truncated_measurement_of_a_study_is_one_line_that_says_how_to_make_it_again(tmp_path, name, command):
    """A truncated generation-cost.json was "the run folder is damaged", with no way out; the element-wise counts
    are read the same way."""
    study = tmp_path / "frontier-shakespeare"
    shutil.copytree(ROOT / "results" / "frontier-shakespeare", study)
    file = study / name
    file.write_bytes(file.read_bytes()[:500])
    proc = run_in_process("scaling.py", [f"REPORT={study}"])
    assert proc.returncode == 1 and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert "is not valid JSON" in proc.stderr and "it is damaged (cut short, or edited); restore it (git checkout), " \
        f"or make it again: python scaling.py {command}=" in proc.stderr


# --------------------------------------------------------------------- checkpoints' tensors are checked


def _flip_tensor_bytes(checkpoint, count=32):
    """``count`` bytes flipped inside the checkpoint's largest tensor, where torch's reader looks at nothing."""
    payload = torch.load(checkpoint, weights_only=True)
    largest = max(payload["model_state"].values(), key=lambda t: t.numel())
    data = bytearray(checkpoint.read_bytes())
    start = data.find(largest.contiguous().view(torch.uint8).numpy().tobytes())
    assert start > 0, "the tensor's bytes are stored as they are"
    middle = start + largest.numel() * largest.element_size() // 2
    data[middle:middle + count] = bytes(b ^ 0xFF for b in data[middle:middle + count])
    checkpoint.write_bytes(bytes(data))
    return bytes(data)


def _refused(proc, checkpoint):
    assert proc.returncode != 0, proc.stdout[-2000:]
    assert f"checkpoint {checkpoint} is damaged" in proc.stderr and "restore it from a copy" in proc.stderr, \
        proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and proc.stderr.strip().splitlines()[-1].startswith("error: checkpoint")


@pytest.mark.parametrize("path", ["resume", "sample", "compare", "export", "load_trained"])
def test_a_checkpoint_with_flipped_tensor_bytes_is_refused_on_every_path(run_copy, tmp_path, path):
    from reservoir.run.checkpoint import CheckpointError
    from reservoir.run.trained import load_trained

    checkpoint = run_copy / "checkpoints" / "lstm.pt"
    if path == "resume":
        _unfinish(run_copy)
    damaged = _flip_tensor_bytes(checkpoint)
    before = {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file()}
    if path == "load_trained":
        with pytest.raises(CheckpointError, match=r"is damaged: its tensors do not match the SHA-256"):
            load_trained(run_copy, "lstm")
    else:
        proc = {"resume": lambda: run_cli(run_copy.parents[1], f"RESUME={run_copy}", check=False),
                "sample": lambda: run_script("sample.py", run_copy, "MODEL=lstm", check=False),
                "compare": lambda: run_script("compare.py", f"{run_copy}:lstm", f"{run_copy}:ngram", check=False),
                "export": lambda: run_script("export.py", run_copy, "MODEL=lstm", f"TO={tmp_path / 'x'}",
                                             check=False)}[path]()
        _refused(proc, checkpoint)
    assert checkpoint.read_bytes() == damaged and not (tmp_path / "x").exists()
    assert {p: p.read_bytes() for p in run_copy.rglob("*") if p.is_file()} == before  # nothing rewritten


def test_a_branch_from_a_stable_phase_with_flipped_tensor_bytes_is_refused(tmp_path):
    run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=12", "LR_SCHEDULE=wsd", "RUN_NAME=old", "CHECKPOINT_EVERY=0")
    stable = tmp_path / "results" / "old" / "checkpoints" / "lstm-seed1337-stable.pt"
    _flip_tensor_bytes(stable)
    proc = run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=24", "LR_SCHEDULE=wsd", "RUN_NAME=longer",
                   f"STABLE_FROM={tmp_path / 'results' / 'old'}", check=False)
    _refused(proc, stable)


def test_a_checkpoint_written_before_the_hash_is_used_with_a_warning_and_resumed_into_a_hashed_one(run_copy):
    from reservoir.run.checkpoint import HASH_KEY, tensors_sha256

    _unfinish(run_copy)
    checkpoint = run_copy / "checkpoints" / "lstm.pt"
    payload = torch.load(checkpoint, weights_only=True)
    assert payload[HASH_KEY] == tensors_sha256(payload)
    del payload[HASH_KEY]  # as every checkpoint was written before
    torch.save(payload, checkpoint)
    sampled = run_script("sample.py", run_copy, "MODEL=lstm", "MAX_NEW_TOKENS=5")
    assert f"checkpoint {checkpoint} was written before checkpoints recorded a hash" in sampled.stderr
    assert "cannot be checked: it is used as it is" in sampled.stderr
    resumed = run_cli(run_copy.parents[1], f"RESUME={run_copy}")
    assert "was written before checkpoints recorded a hash" in resumed.stderr
    assert torch.load(checkpoint, weights_only=True)[HASH_KEY] == tensors_sha256(payload)  # same tensors, now sealed
    assert "was written before" not in run_script("sample.py", run_copy, "MODEL=lstm", "MAX_NEW_TOKENS=5").stderr
