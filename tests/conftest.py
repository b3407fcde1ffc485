"""What the tests share: the repository root, tiny settings, a config builder and one way to run a
root script, plus the hook that skips XLA tests where torch_xla cannot run.

    run_cli(tmp_path, "MODELS=['ngram','lstm']", "MAX_STEPS=10")   # TinyStories.py on TINY settings
    run_script("sample.py", run_dir, "MODEL=esn")                   # any root script
    config = make_config(tmp_path, "DATASET=synthetic")             # a validated config, caches in tmp_path

Heavy end-to-end tests are marked ``slow``: the README's test command leaves them out
(``-m "not slow"`` in pyproject's addopts) and CI runs them apart (``pytest -m slow``).
"""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reservoir.config import parse_overrides  # noqa: E402
from reservoir.models import MODEL_NAMES  # noqa: E402
from reservoir.platform.device import xla_usable  # noqa: E402

TINY_DATA = ["DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "BATCH_SIZE=8", "EVAL_TOKENS=2048",
             "TIME_BUDGET_S=None", "FLOP_BUDGET=None", "SAMPLE_TOKENS=30"]
TINY_MODELS = ["ESN.units=64", "DEEP_ESN.units=32", "NVAR.input_dim=4", "LINEAR_RESERVOIR.units=32",
               "LINEAR_RESERVOIR.readout_hidden=64", "LSTM.hidden=64", "DEEP_LINEAR_RESERVOIR.layers=2",
               "DEEP_LINEAR_RESERVOIR.units=16", "DEEP_LINEAR_RESERVOIR.width=32",
               "DEEP_LINEAR_RESERVOIR.mix_hidden=32", "TRANSFORMER.n_layer=1", "TRANSFORMER.n_embd=32",
               "FROZEN_RETENTION.layers=1", "FROZEN_RETENTION.width=32", "FROZEN_RETENTION.ffn_hidden=64",
               "RESERVOIR_ATTENTION.units=16", "RESERVOIR_ATTENTION.width=32", "RESERVOIR_ATTENTION.layers=1"]
# every model in seconds, on the synthetic corpus; no PNGs (matplotlib's import and five figures cost a tiny run
# about a third of its time): the tests that look at a run's plots ask for them with PLOTS=True
TINY = [*TINY_DATA, *TINY_MODELS, "WARMUP_STEPS=5", "PLOTS=False"]
ALL_MODELS = list(MODEL_NAMES)  # every model the runner builds


def make_config(tmp_path, *args) -> dict:
    """A validated config with ``args`` applied, its caches (and any local data search) inside ``tmp_path``."""
    return parse_overrides([f"CACHE_DIR={tmp_path / 'cache'}", f"DATA_DIR={tmp_path / 'nodata'}", *args])


def run_cli(tmp_path, *args, env=None, check=True, replace_env=False, settings=TINY):
    """TinyStories.py on ``settings`` (TINY) and ``args``, results and caches in ``tmp_path``."""
    cmd = [sys.executable, str(ROOT / "TinyStories.py"), *settings, f"RESULTS_DIR={tmp_path / 'results'}",
           f"CACHE_DIR={tmp_path / 'cache'}", *args]
    environment = dict(env or {}) if replace_env else {**os.environ, **(env or {})}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=environment, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def run_script(script: str, *args, check=True, env=None, timeout=300):
    """A root script (sample.py, compare.py, ...) on ``args``; asserts it succeeded unless not ``check``."""
    proc = subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout, env=None if env is None else {**os.environ, **env})
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def run_then_sigkill(tmp_path, args, run_name, ready) -> Path:
    """Start a run named ``run_name`` and SIGKILL it as soon as ``ready(run_dir)`` holds; its folder."""
    cmd = [sys.executable, str(ROOT / "TinyStories.py"), *TINY, *args, f"RESULTS_DIR={tmp_path / 'results'}",
           f"CACHE_DIR={tmp_path / 'cache'}", f"RUN_NAME={run_name}"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    run_dir = tmp_path / "results" / run_name
    deadline = time.time() + 300
    while time.time() < deadline and not ready(run_dir):
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return run_dir


def write_corpus(folder: Path, seed: int) -> Path:
    """A small TinyStories-format corpus in ``folder`` (train and valid files) from the synthetic generator:
    another ``seed``, another text."""
    from reservoir.data.corpus import EOT
    from reservoir.data.synthetic import synthetic_stories

    folder.mkdir(parents=True)
    stories = synthetic_stories(300, seed)
    (folder / "TinyStories-train.txt").write_text(EOT.join(stories[:270]))
    (folder / "TinyStories-valid.txt").write_text(EOT.join(stories[270:]))
    return folder


def summary_of(run_dir) -> dict:
    """A run's summary.json as {model: record} (one seed)."""
    return {r["model"]: r for r in json.loads((Path(run_dir) / "summary.json").read_text())}


def pytest_collection_modifyitems(config, items):
    """Skip XLA tests where torch_xla cannot run; in CI's XLA environment, refuse to skip them."""
    if xla_usable():
        return
    if os.environ.get("RESERVOIR_REQUIRE_XLA"):
        raise pytest.UsageError("RESERVOIR_REQUIRE_XLA is set but torch_xla is not usable "
                                "(is torch_xla installed and PJRT_DEVICE=CPU set?)")
    skip = pytest.mark.skip(reason="torch_xla not installed or no XLA device (set PJRT_DEVICE=CPU)")
    for item in items:
        if "xla" in item.keywords:
            item.add_marker(skip)
