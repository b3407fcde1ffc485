"""`pip install -e .` / `pip install .`: the package, its modules and its dependencies."""

import shutil
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT

SOURCES = ["pyproject.toml", "README.md", "configs.py", "plot_results.py", "reservoir"]


def _requirements(text: str) -> list[str]:
    return [line.split("#")[0].strip() for line in text.splitlines() if line.split("#")[0].strip()]


def test_installed_package_imports_from_anywhere_with_the_runtime_dependencies(tmp_path):
    source = tmp_path / "src"
    source.mkdir()
    for name in SOURCES:
        (shutil.copytree if (ROOT / name).is_dir() else shutil.copy)(ROOT / name, source / name)
    target = tmp_path / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                           "--target", str(target), str(source)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    snippet = ("import reservoir.models, reservoir.run.sampling, configs; "
               "from reservoir.models import build_model; "
               "m = build_model('esn', 20, configs.parse_overrides(['ESN.units=16'])); "
               "print(reservoir.__file__, type(m).__name__)")
    elsewhere = tmp_path / "notebook"
    elsewhere.mkdir()
    run = subprocess.run([sys.executable, "-c", snippet], cwd=elsewhere, capture_output=True, text=True,
                         env={"PYTHONPATH": str(target), "PATH": "/usr/bin:/bin"}, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stdout.startswith(str(target)) and run.stdout.strip().endswith("ESN")  # the installed copy
    metadata = next(target.glob("reservoir_nlp-*.dist-info")) / "METADATA"
    requires = [line.split(":", 1)[1].strip() for line in metadata.read_text().splitlines()
                if line.startswith("Requires-Dist:") and "extra ==" not in line]
    from packaging.requirements import Requirement  # compares "torch>=2.4,<3" with its normal form "torch<3,>=2.4"

    listed = _requirements((ROOT / "requirements.txt").read_text())
    assert [str(Requirement(r)) for r in requires] == [str(Requirement(r)) for r in listed]  # one list, kept equal


def test_every_module_of_the_package_is_listed():
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    on_disk = {str(p.parent.relative_to(ROOT)).replace("/", ".") for p in Path(ROOT / "reservoir").rglob("__init__.py")}
    assert listed == on_disk


def test_every_dependency_is_capped_below_a_major_version_ci_has_not_run():
    """pip resolved datasets 5.2 and optuna 5.0 against bare lower bounds: a next major release would
    reach users before CI had ever run it."""
    for name in ("requirements.txt", "requirements-dev.txt"):
        for requirement in _requirements((ROOT / name).read_text()):
            if requirement.startswith("-r"):
                continue
            assert "<" in requirement or "==" in requirement, f"{name}: {requirement} has no upper bound"


def test_at_most_two_functions_in_the_package_take_eight_or_more_parameters():
    """#25: what trainers share travels in a Fit, a sweep's settings in a Sweep; the two left are the
    reservoir's literature hyper-parameters and generate's sampling options."""
    import ast

    many = []
    for path in sorted((ROOT / "reservoir").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                args = node.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs if a.arg not in ("self", "cls")]
                if len(names) >= 8:
                    many.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert many == ["reservoir/models/base.py:generate", "reservoir/models/reservoirs.py:__init__"], many


def test_the_recorded_package_version_is_the_projects():
    import tomllib

    from reservoir import __version__
    from reservoir.run.writer import versions

    assert tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"] == __version__
    assert versions()["reservoir_nlp"] == __version__
