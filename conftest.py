"""Every code block of README.md, README_TPU.md and docs/*.md runs as a test, with Sybil.

Sybil parses Markdown's fenced blocks and hands each to pytest: Python blocks run in one namespace per page
(in order, so a page's later block may use what an earlier one made), ``bash`` blocks with bash. Both run in
a copy of the repository's tracked files, so a page's commands write nothing into this checkout and find the
committed records as a fresh clone has them. A block that trains for minutes, installs from the network or
runs the test suites is marked above it, with the reason: ``<!-- skip: next "why, and what runs instead" -->``.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import uuid
import warnings
from pathlib import Path

import pytest
from sybil import Sybil
from sybil.evaluators.python import PythonEvaluator
from sybil.parsers.markdown import CodeBlockParser, SkipParser

ROOT = Path(__file__).resolve().parent


def copy_of_the_repository() -> Path:
    """The tracked files of this checkout (and what is staged or new and not ignored), copied to a new folder."""
    target = Path(tempfile.mkdtemp(prefix="reservoir-docs-")) / "repo"
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for name in filter(None, listed):
        source = ROOT / name
        if source.is_file():
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target / name)
    return target


def _setup(namespace: dict) -> None:
    namespace["_workdir"], namespace["_cwd"] = copy_of_the_repository(), os.getcwd()
    os.chdir(namespace["_workdir"])


def _teardown(namespace: dict) -> None:
    os.chdir(namespace["_cwd"])
    shutil.rmtree(namespace["_workdir"].parent, ignore_errors=True)


def _root_script_commands(block: str) -> list[list[str]] | None:
    """The commands of a block made only of ``python <root script>.py KEY=VALUE ...`` lines (comments and
    continued lines allowed), each as the script's arguments; None for a block that uses the shell for more."""
    commands = []
    for line in block.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            words = list(lexer)
        except ValueError:
            return None
        if not words:
            continue
        shell = "$" in line or "`" in line or any(set(word) <= set("();<>|&") for word in words)  # pipes, redirects
        if len(words) < 2 or words[0] != "python" or "/" in words[1] or not (ROOT / words[1]).is_file() or shell:
            return None
        commands.append(words[1:])
    return commands or None


def _run_shell(example) -> str | None:
    """A ``bash`` block, as a reader would paste it: ``python`` is this test run's interpreter. A block of root
    scripts alone runs each script's ``main`` in this process, with the same arguments and folder (a Python that
    imports torch costs 2-3 s to start, and the pages run about twenty)."""
    workdir = example.namespace["_workdir"]
    commands = _root_script_commands(example.parsed)
    if commands is not None:
        from tests.conftest import run_in_process

        for script, *argv in commands:
            proc = run_in_process(script, argv, cwd=workdir)
            if proc.returncode != 0:
                return (f"{example.path}, line {example.line}: python {script} exit code {proc.returncode}\n"
                        f"{example.parsed}\n{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
        return None
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", example.parsed], cwd=workdir,
                          env=env, capture_output=True, text=True, timeout=900)
    if proc.returncode != 0:
        return (f"{example.path}, line {example.line}: exit code {proc.returncode}\n{example.parsed}\n"
                f"{proc.stdout[-3000:]}{proc.stderr[-3000:]}")
    return None


def _run_python(example) -> None:
    """A Python block, in its page's namespace; a warning it raises fails it (a reader pastes it as it is, and a
    snippet that warns teaches the warning: a tensor built from a list of arrays did). Libraries' deprecation
    notices are theirs to fix, not the page's."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.simplefilter("default", DeprecationWarning)
        warnings.simplefilter("default", PendingDeprecationWarning)
        PythonEvaluator()(example)


pytest_collect_file = Sybil(
    parsers=[CodeBlockParser(language="python", evaluator=_run_python),
             CodeBlockParser(language="bash", evaluator=_run_shell), SkipParser()],
    patterns=["README.md", "README_TPU.md", "docs/*.md"],
    setup=_setup,
    teardown=_teardown,
).pytest()


# ------------------------------------------------------------------ where the suites' time goes
# RESERVOIR_TEST_TIMES=FILE: per test file, the seconds its tests took and the Python processes they started
# (counted by an audit hook on subprocess.Popen), written to FILE as JSON at the end (bench/test_times.py
# turns it into docs/testing.md's table)
_TIMES: dict = {}
_RUNNING: list = [None]


def _count_python_processes(event: str, args: tuple) -> None:
    if event == "subprocess.Popen" and _RUNNING[0] is not None:
        command = args[1] if isinstance(args[1], (list, tuple)) else [args[0] or args[1]]
        if "python" in Path(str(command[0])).name:
            _TIMES.setdefault(_RUNNING[0], {"seconds": 0.0, "processes": 0, "tests": 0})["processes"] += 1


if os.environ.get("RESERVOIR_TEST_TIMES"):
    sys.addaudithook(_count_python_processes)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    _RUNNING[0] = item.location[0]
    yield
    _RUNNING[0] = None


def pytest_runtest_logreport(report):
    if os.environ.get("RESERVOIR_TEST_TIMES"):
        entry = _TIMES.setdefault(report.location[0], {"seconds": 0.0, "processes": 0, "tests": 0})
        entry["seconds"] += report.duration
        entry["tests"] += report.when == "call" or (report.when == "setup" and report.skipped)


def pytest_configure(config):
    if os.environ.get("RESERVOIR_TEST_TIMES") and not hasattr(config, "workerinput"):
        os.environ["RESERVOIR_TEST_TIMES_RUN"] = uuid.uuid4().hex  # the workers it starts inherit it
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the cores are shared with the other workers
        share = max(1, (os.cpu_count() or 1) // int(config.workerinput["workercount"]))
        os.environ.setdefault("OMP_NUM_THREADS", str(share))  # for the processes its tests start
        import torch

        torch.set_num_threads(min(torch.get_num_threads(), share))


def pytest_runtest_setup(item):
    if item.get_closest_marker("alone") and hasattr(item.config, "workerinput"):
        pytest.skip("measures this machine's load, so no other test may run beside it: python -m pytest -n 0 "
                    "-m alone (CI runs it so)")


def pytest_sessionfinish(session, exitstatus):
    """With pytest-xdist each worker writes its own part (only the workers see their processes start), and the
    run that started them adds the parts up into FILE."""
    if not os.environ.get("RESERVOIR_TEST_TIMES"):
        return
    target = Path(os.environ["RESERVOIR_TEST_TIMES"])
    parts = target.with_name(target.name + ".parts")
    worker = getattr(session.config, "workerinput", None)
    if worker is not None:
        parts.mkdir(exist_ok=True)
        (parts / f"{worker['workerid']}-{os.environ['RESERVOIR_TEST_TIMES_RUN']}.json").write_text(json.dumps(_TIMES))
        return
    found = sorted(parts.glob(f"*-{os.environ['RESERVOIR_TEST_TIMES_RUN']}.json"))
    times = _TIMES
    if found:
        times = {}
        for part in found:
            for name, entry in json.loads(part.read_text()).items():
                total = times.setdefault(name, {"seconds": 0.0, "processes": 0, "tests": 0})
                for key in total:
                    total[key] += entry[key]
        shutil.rmtree(parts, ignore_errors=True)
    target.write_text(json.dumps(times, indent=1, sort_keys=True) + "\n")
