"""What the tests share: the repository root, tiny settings, a config builder and one way to run a
root script, plus the hook that skips XLA tests where torch_xla cannot run.

    run_cli(tmp_path, "MODELS=['ngram','lstm']", "MAX_STEPS=10")   # TinyStories.py on TINY settings
    run_script("sample.py", run_dir, "MODEL=esn")                   # any root script
    config = make_config(tmp_path, "DATASET=synthetic")             # a validated config, caches in tmp_path

Heavy end-to-end tests are marked ``slow``: the README's test command leaves them out
(``-m "not slow"`` in pyproject's addopts) and CI runs them apart (``pytest -m slow``).
"""

import contextlib
import fcntl
import importlib.util
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reservoir.config import parse_overrides  # noqa: E402
from reservoir.models import MODEL_NAMES  # noqa: E402
from reservoir.platform.device import xla_usable  # noqa: E402

TINY_DATA = ["DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "BATCH_SIZE=8", "EVAL_TOKENS=2048",
             "FINAL_EVAL_TOKENS=4096", "TIME_BUDGET_S=None", "FLOP_BUDGET=None", "SAMPLE_TOKENS=30"]
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


# The studies' real text, where the fetch writes it (python -m reservoir.data.fetch: data/ beside the checkout), or
# where RESERVOIR_TINYSTORIES (a folder of the slices) and RESERVOIR_SHAKESPEARE (input.txt) name it (.ci/run sets
# them where the machine has the text); the tests that need it skip without it
def real_text(environ=os.environ) -> tuple[Path, Path]:
    """(the TinyStories slices' folder, Tiny Shakespeare's input.txt), as ``environ`` names them or as the fetch
    writes them."""
    return (Path(environ.get("RESERVOIR_TINYSTORIES") or ROOT / "data" / "tinystories"),
            Path(environ.get("RESERVOIR_SHAKESPEARE") or ROOT / "data" / "shakespeare" / "input.txt"))


TINYSTORIES_TEXT, SHAKESPEARE_TEXT = real_text()
NO_TEXT = ("the studies' text not found: fetch it (python -m reservoir.data.fetch tinystories-slices shakespeare), or "
           "set RESERVOIR_TINYSTORIES (the slices' folder) and RESERVOIR_SHAKESPEARE (input.txt)")


def tracked(under: str = "results") -> list[Path]:
    """The files git tracks under ``under`` (what a clone holds), never what else a user keeps there (their own
    runs and studies); outside a git checkout (an unpacked archive), every file there."""
    listed = subprocess.run(["git", "ls-files", "-z", "--", under], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        return sorted(p for p in (ROOT / under).rglob("*") if p.is_file())
    return sorted(ROOT / name for name in listed.stdout.split("\0") if name and (ROOT / name).is_file())


def committed_copy(target: Path, under: str = "results") -> Path:
    """The tracked files under ``under`` copied into ``target`` (as ``target/<their path below under>``)."""
    for path in tracked(under):
        destination = target / path.relative_to(ROOT / under)
        destination.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, destination)
    return target


def make_config(tmp_path, *args) -> dict:
    """A validated config with ``args`` applied, its caches (and any local data search) inside ``tmp_path``."""
    return parse_overrides([f"CACHE_DIR={tmp_path / 'cache'}", f"DATA_DIR={tmp_path / 'nodata'}", *args])


def run_cli(tmp_path, *args, env=None, check=True, replace_env=False, settings=TINY, in_process=True):
    """TinyStories.py on ``settings`` (TINY) and ``args``, results and caches in ``tmp_path``: its ``main`` in
    this process (``run_in_process``), or its own process where the process boundary is what a test is about
    (``in_process=False``, an environment replaced whole, or PJRT_DEVICE set: ``_may_reach_xla``)."""
    args = [*settings, f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'cache'}", *args]
    if in_process and not replace_env and not _may_reach_xla(env):
        proc = run_in_process("TinyStories.py", args, env=env)
    else:
        environment = dict(env or {}) if replace_env else {**os.environ, **(env or {})}
        proc = subprocess.run([sys.executable, str(ROOT / "TinyStories.py"), *args], cwd=ROOT, capture_output=True,
                              text=True, env=environment, timeout=600)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def run_script(script: str, *args, check=True, env=None, timeout=300, in_process=True):
    """A root script (sample.py, compare.py, ...) on ``args``; asserts it succeeded unless not ``check``. In this
    process as ``run_cli``; ``in_process=False`` (or a ``timeout`` that matters) for its own process."""
    if in_process and not _may_reach_xla(env):
        proc = run_in_process(script, list(map(str, args)), env=env)
    else:
        proc = subprocess.run([sys.executable, str(ROOT / script), *map(str, args)], cwd=ROOT, capture_output=True,
                              text=True, timeout=timeout, env=None if env is None else {**os.environ, **env})
    if check:
        assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


# ---------------------------------------------------------------------------- a root script in this process
def _may_reach_xla(env: dict | None) -> bool:
    """With PJRT_DEVICE set (the XLA suite) a run may start torch_xla's runtime, which is set up once per
    process (its devices, SPMD): such a run gets a process of its own."""
    return bool({**os.environ, **(env or {})}.get("PJRT_DEVICE"))


_SCRIPTS: dict = {}
_SIGNALS = [signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2]
# Python's own warning filters at start-up (the test runner's are put aside while a script runs)
_STARTUP_FILTERS = [("default", DeprecationWarning, "__main__"), ("ignore", DeprecationWarning, None),
                    ("ignore", PendingDeprecationWarning, None), ("ignore", ImportWarning, None),
                    ("ignore", ResourceWarning, None)]


def _script_module(script: str):
    """A root script imported once, as a module of its own (its ``__main__`` block does not run)."""
    if script not in _SCRIPTS:
        spec = importlib.util.spec_from_file_location(f"root_script_{Path(script).stem}", ROOT / script)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        _SCRIPTS[script] = module
    return _SCRIPTS[script]


def _print_warning(message, category, filename, lineno, file=None, line=None):
    sys.stderr.write(warnings.formatwarning(message, category, filename, lineno, line))


def _plugin_state() -> list[tuple[dict, dict]]:
    """What a script's PLUGINS register in its process (families, their settings blocks), to forget afterwards as
    a new Python would never have known them."""
    from reservoir import config
    from reservoir.models import registry

    held = (registry.MODELS, registry.STUDY_FAMILIES, registry.PLUGINS, config.SHARED_CONFIG, config._PLUGIN_FAMILIES)
    return [(registered, dict(registered)) for registered in held]


def _forget_plugins(state: list[tuple[dict, dict]]) -> None:
    for registered, held in state:
        registered.clear()
        registered.update(held)


@pytest.fixture
def plugins_forgotten():
    """A test that loads a plugin in this process (not through a script's main) forgets it afterwards."""
    before = _plugin_state()
    yield
    _forget_plugins(before)


def run_in_process(script: str, argv: list[str], env: dict | None = None, cwd: Path = ROOT
                   ) -> subprocess.CompletedProcess:
    """``script``'s ``main(argv)`` here, as ``python script argv...`` would run it from ``cwd`` (the repository root
    unless given): its
    stdout and stderr captured at the file descriptors (the processes it starts write there too, in order), its
    exit status returned (an uncaught exception as a traceback and 1, ``SystemExit``
    as Python reports it), and what a run changes in its process put back afterwards: the environment, the
    working folder, signal handlers, torch's threads and random state, numpy's and Python's random state, the
    warning filters, the root logger's handlers, ``sys.argv`` and the families its PLUGINS declared. Starting
    Python and importing torch costs 2-3 s a process on a 2-core host; the suites run a few hundred root scripts."""
    import random

    import numpy as np
    import torch

    module = _script_module(script)
    saved_env, saved_cwd, saved_argv = dict(os.environ), os.getcwd(), sys.argv
    saved_signals = {s: signal.getsignal(s) for s in _SIGNALS}
    saved_threads, saved_torch_rng = torch.get_num_threads(), torch.get_rng_state()
    saved_np_rng, saved_random = np.random.get_state(), random.getstate()
    saved_handlers = list(logging.getLogger().handlers)
    # its output at the file descriptors, as a process's: the points and workers a script starts write there
    files = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    saved_fds = os.dup(1), os.dup(2)
    os.dup2(files[0].fileno(), 1)
    os.dup2(files[1].fileno(), 2)
    out = open(1, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    err = open(2, "w", encoding="utf-8", errors="replace", buffering=1, closefd=False)
    code: object = 0
    plugins_loaded_before = _plugin_state()
    try:
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        os.chdir(cwd)
        sys.argv = [str(ROOT / script), *argv]
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err), warnings.catch_warnings():
            warnings.resetwarnings()
            for action, category, module_name in reversed(_STARTUP_FILTERS):
                warnings.filterwarnings(action, category=category, module=module_name or "")
            warnings.showwarning = _print_warning
            try:
                code = module.main(list(argv))
            except SystemExit as e:
                code = e.code
                if code is not None and not isinstance(code, int):
                    print(code, file=sys.stderr)
                    code = 1
            except Exception:
                traceback.print_exc()
                code = 1
    finally:
        out.flush()
        err.flush()
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        os.environ.clear()
        os.environ.update(saved_env)
        os.chdir(saved_cwd)
        sys.argv = saved_argv
        for s, handler in saved_signals.items():
            signal.signal(s, handler)
        torch.set_num_threads(saved_threads)
        torch.set_rng_state(saved_torch_rng)
        np.random.set_state(saved_np_rng)
        random.setstate(saved_random)
        logging.getLogger().handlers[:] = saved_handlers
        _forget_plugins(plugins_loaded_before)
    said = []
    for file in files:
        file.seek(0)
        said.append(file.read().decode("utf-8", errors="replace"))
        file.close()
    return subprocess.CompletedProcess([sys.executable, script, *argv], 0 if code is None else code, *said)


def trained_and_moved(tmp, models, *args) -> Path:
    """``models`` trained briefly (20 steps, plots, 40-token samples); the run folder is then moved away from its
    data and cache, which are deleted: the folder alone must be enough to read, sample and compare."""
    run_cli(tmp, f"MODELS={models}", "MAX_STEPS=20", "EVAL_EVERY=10", "RUN_NAME=r", "SAMPLE_TOKENS=40",
            "SAMPLE_TEMPERATURE=1.0", *args)
    moved = tmp / "elsewhere" / "r"
    shutil.move(tmp / "results" / "r", moved)
    shutil.rmtree(tmp / "cache")
    return moved


@pytest.fixture(scope="session")
def every_model_run(tmp_path_factory) -> Path:
    """Every model trained once for the whole test run (``trained_and_moved``, with plots): the tests of the
    results contract and of sampling read it; a test that changes it works on a copy. pytest-xdist's workers
    share it (its documented pattern: the first to need it trains it under a lock in the run's common base
    folder, the others wait and read it)."""
    shared = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        shared = shared.parent
    with (shared / "every-model.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        moved = shared / "every-model" / "elsewhere" / "r"
        if not (moved / "summary.json").exists():
            shutil.rmtree(shared / "every-model", ignore_errors=True)  # a worker that died while training it
            trained_and_moved(shared / "every-model", ALL_MODELS, "PLOTS=True")
    return moved


class StartedRun:
    """A run in a process of its own (``start_run``), with the part of subprocess.Popen's interface the tests
    use: ``pid``, ``send_signal``, ``kill``, ``wait``, ``returncode``, ``communicate`` and its text ``stdout``
    and ``stderr``."""

    def __init__(self, process, stdout, stderr):
        self.process, self.pid, self.stdout, self.stderr = process, process.pid, stdout, stderr

    @property
    def returncode(self):
        return self.process.returncode

    def send_signal(self, signum):
        self.process.send_signal(signum)

    def kill(self):
        self.process.send_signal(signal.SIGKILL)

    def wait(self):
        return self.process.wait()

    def communicate(self, timeout=None):
        """The rest of its output and errors, once it has ended (TimeoutExpired if it goes on past ``timeout``)."""
        said = {}
        readers = [threading.Thread(target=lambda name, stream: said.__setitem__(name, stream.read()),
                                    args=(name, stream), daemon=True)
                   for name, stream in (("out", self.stdout), ("err", self.stderr))]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join(timeout)
            if reader.is_alive():
                raise subprocess.TimeoutExpired(f"TinyStories.py (pid {self.pid})", timeout)
        self.wait()
        for stream in (self.stdout, self.stderr):
            stream.close()
        return said["out"], said["err"]


def start_run(tmp_path, *args, settings=TINY) -> StartedRun:
    """TinyStories.py on ``settings`` and ``args`` (results and caches in ``tmp_path``) in a process of its own,
    for the tests whose subject is the process: its signals, a SIGKILL, its lock on the run folder. It is forked
    as a study forks its CPU points (``runner.start_point``: a process that has imported torch already, made up
    as a new Python's, which ``test_study_faults.py`` holds it to), not a new Python (6 s of imports); a Ctrl-C
    reaches it as from a terminal. With PJRT_DEVICE set it is a new Python (torch_xla's runtime, once a process)."""
    from reservoir.studies.runner import start_point

    argv = [*settings, f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'cache'}", *args]
    reads, writes = zip(os.pipe(), os.pipe(), strict=True)
    ctrl_c = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with contextlib.chdir(ROOT), open(writes[0], "w") as out, open(writes[1], "w") as err:
            process = start_point(argv, dict(os.environ), on_cpu=not _may_reach_xla(None), log=out, stderr=err)
    finally:
        signal.signal(signal.SIGINT, ctrl_c)
    return StartedRun(process, *(open(fd, encoding="utf-8", errors="replace") for fd in reads))


def run_then_sigkill(tmp_path, args, run_name, ready) -> Path:
    """Start a run named ``run_name`` (``start_run``) and SIGKILL it as soon as ``ready(run_dir)`` holds; its
    folder."""
    proc = start_run(tmp_path, *args, f"RUN_NAME={run_name}")
    drained = threading.Thread(target=proc.communicate, daemon=True)  # a full pipe would hold the run up
    drained.start()
    run_dir = tmp_path / "results" / run_name
    deadline = time.time() + 300
    while time.time() < deadline and not ready(run_dir):
        time.sleep(0.02)
    proc.kill()
    drained.join()
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


# The most a study point started by a test may spend: the tests' studies train at 1e3-6e10 FLOPs a point (the
# committed studies' smallest budget is 5e11). A study that would train one of its real points (a rule that
# reopens a finished study on this machine, a stage that forgets its records) fails its test at once, in
# seconds, instead of training for an hour.
TEST_POINT_FLOPS = 1e11


def _flop_budget(args: list[str]) -> float | None:
    """The FLOP_BUDGET a point's TinyStories.py arguments give it (the last one given wins, as there)."""
    given = [a.partition("=")[2] for a in args if a.partition("=")[0].strip().upper() == "FLOP_BUDGET"]
    try:
        return float(given[-1]) if given and given[-1] not in ("None", "") else None
    except ValueError:
        return None


@pytest.fixture(autouse=True)
def no_study_point_beyond_the_test_budgets(monkeypatch):
    """Every test: a study point whose FLOP_BUDGET passes TEST_POINT_FLOPS is refused before it starts, and the
    test fails saying which point and why (even where the test expected its study to fail)."""
    from reservoir.studies import runner

    refused, start_point = [], runner.start_point

    def guarded(args, *rest, **options):
        budget = _flop_budget(args)
        if budget is not None and budget > TEST_POINT_FLOPS:
            named = [a for a in args if a.startswith(("RUN_NAME=", "RESUME=", "RESULTS_DIR="))]
            refused.append(f"FLOP_BUDGET={budget:g} ({' '.join(named)})")
            raise RuntimeError(f"a test's study started a point at FLOP_BUDGET={budget:g}, beyond the tests' "
                               f"{TEST_POINT_FLOPS:g}: {' '.join(named)}")
        return start_point(args, *rest, **options)

    monkeypatch.setattr(runner, "start_point", guarded)
    yield refused
    if refused:
        pytest.fail(f"this test's study would have trained {len(refused)} point(s) beyond the tests' budgets "
                    f"(TEST_POINT_FLOPS={TEST_POINT_FLOPS:g}): {refused[:3]}", pytrace=False)


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
