"""The house: reservoir/ is grouped by the stage of a result's life, and imports only go down a floor."""

import ast
import os
import signal
import subprocess
import sys

import pytest

from tests.conftest import ROOT

PACKAGE = ROOT / "reservoir"
# lowest first: a module may import its own floor or one below it, never one above
FLOORS = ["reservoir", "reservoir.platform", "reservoir.data", "reservoir.models", "reservoir.config",
          "reservoir.run", "reservoir.share", "reservoir.studies", "reservoir.studies.frontier"]


def module_name(path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def floor(module: str) -> int:
    return max(i for i, f in enumerate(FLOORS) if module == f or module.startswith(f + "."))


def imports_of(path, module: str) -> set[str]:
    """Every reservoir module ``path`` imports, at the top or inside a function, resolved to a module."""
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names if a.name.startswith("reservoir")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            if not base.startswith("reservoir"):
                continue
            for alias in node.names:  # `from reservoir.run import flops` imports the module reservoir.run.flops
                candidate = f"{base}.{alias.name}"
                found.add(candidate if (ROOT / (candidate.replace(".", "/") + ".py")).exists()
                          or (ROOT / candidate.replace(".", "/")).is_dir() else base)
    return found


def graph() -> dict[str, set[str]]:
    return {module_name(p): imports_of(p, module_name(p)) for p in sorted(PACKAGE.rglob("*.py"))}


def test_no_module_imports_one_on_a_higher_floor():
    upward = [f"{m} (floor {floor(m)}) imports {i} (floor {floor(i)})"
              for m, imported in graph().items() for i in sorted(imported) if floor(i) > floor(m)]
    assert upward == []


def test_the_package_has_no_import_cycle():
    edges = {m: {i for i in imported if i != m} for m, imported in graph().items()}
    # a package's __init__ re-exports its modules: an edge into the package itself is not a cycle of code
    edges = {m: {i for i in out if not m.startswith(i + ".")} for m, out in edges.items()}
    state: dict[str, int] = {}
    cycles = []

    def visit(m, trail):
        state[m] = 1
        for i in sorted(edges.get(m, ())):
            if state.get(i) == 1:
                cycles.append(" -> ".join([*trail[trail.index(i):], i]))
            elif i in edges and not state.get(i):
                visit(i, [*trail, i])
        state[m] = 2

    for m in sorted(edges):
        if not state.get(m):
            visit(m, [m])
    assert cycles == []


def test_every_folder_is_a_package_that_names_its_public_parts():
    for folder in [p for p in PACKAGE.rglob("*") if p.is_dir() and p.name != "__pycache__"]:
        init = folder / "__init__.py"
        assert init.exists(), f"{folder} has no __init__.py"
        assert "__all__" in init.read_text(encoding="utf-8"), f"{init} names no public names (__all__)"


def test_the_stages_import_from_any_folder(tmp_path):
    code = ("import reservoir.run, reservoir.studies.frontier, reservoir.data, reservoir.platform; "
            "from reservoir.studies.frontier import FrontierStudy, report_from_records; "
            "from reservoir.run import run_experiment, load_trained; print('ok')")
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr[-2000:]


def test_run_outputs_stay_out_of_git_but_the_committed_records_do_not():
    """A run, a demo, scratch/ or a comparison written under results/ showed up as untracked files to commit."""
    ignored = ["results/demo/summary.json", "results/demo/comparisons/lstm-vs-demo-ngram.json", "scratch/probes/x",
               "results/scaling/flops-1.00e12/summary.json", "results/frontier-new/lstm-xs-lr0.004-b8/flops-3/x",
               "results/sweeps/s/trials/trial-0001/summary.json", "results/sweeps/s/slice.png"]
    kept = ["results/REPORT.md", "results/README.md", "results/default-run/summary.json", "results/probes/probes.md",
            "results/frontier-tinystories/points.jsonl", "results/frontier-new/frontier-study.json",
            "results/frontier-new/comparisons/a.json", "results/sweeps/s/best.json", "results/sweeps/s/journal.log"]
    listed = subprocess.run(["git", "check-ignore", "--no-index", *ignored, *kept], cwd=ROOT, capture_output=True,
                            text=True).stdout.split()
    assert listed == ignored


def test_every_entry_point_starts_and_ends_through_entry_point():
    """Each root script's main and the fetch's are wrapped by ``entry_point`` (the pretend check, a closed pipe):
    the next test shows what that does across a real process boundary, for a root script and the fetch."""
    from reservoir.data import fetch
    from reservoir.platform.entry import entry_point
    from tests.conftest import _script_module
    from tests.test_machine import ENTRY_POINTS

    wrapper = entry_point(lambda argv: 0).__code__
    mains = {script: _script_module(script).main for script in ENTRY_POINTS} | {"fetch": fetch.main}
    assert {name: main.__code__ is wrapper for name, main in mains.items()} == dict.fromkeys(mains, True)


@pytest.mark.parametrize("script", ["scaling.py", "-m reservoir.data.fetch"])
def test_help_into_a_pipe_closed_early_ends_quietly(script):
    """``--help | head -1`` printed a BrokenPipeError traceback (scaling.py, sample.py, sometimes TinyStories.py):
    here the reader has gone before the script writes a byte, every time."""
    read, write = os.pipe()
    os.close(read)
    proc = subprocess.run([sys.executable, *script.split(), "--help"], cwd=ROOT, stdout=write,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write)
    assert "Traceback" not in proc.stderr and "BrokenPipeError" not in proc.stderr, proc.stderr
    assert proc.returncode == 128 + signal.SIGPIPE, proc.stderr
