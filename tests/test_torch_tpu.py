"""test_tpu_support.py reports TorchTPU (PyPI torch-tpu) for information, whatever state it is in.

TorchTPU needs a TPU and libtpu, so here it is stood in for at the system edge: a package named
torch_tpu on the path that does what the real one does on import in each case.
"""

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, run_script

STAND_INS = {
    "registers nothing": "",  # what the real 0.2.0 does with libtpu on a machine without a TPU
    "registers 'tpu'": "import torch\ntorch.utils.rename_privateuse1_backend('tpu')\n",
    "aborts": "import os\nos.abort()\n",  # what the real 0.2.0 does without libtpu
}


def report(tmp_path, body: str) -> subprocess.CompletedProcess:
    """test_tpu_support.py in its own process, with a stand-in torch_tpu package on its path."""
    (tmp_path / "torch_tpu").mkdir()
    (tmp_path / "torch_tpu" / "__init__.py").write_text(body)
    meta = tmp_path / "torch_tpu-0.2.0.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: torch-tpu\nVersion: 0.2.0\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    proc = subprocess.run([sys.executable, str(ROOT / "test_tpu_support.py"), "DEVICE=cpu"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr  # information only: never a FAIL
    return proc


def info_line(proc) -> str:
    return next(line for line in proc.stdout.splitlines() if line.startswith("INFO  torch_tpu:"))


def test_not_installed():
    proc = run_script("test_tpu_support.py", "DEVICE=cpu")  # nothing to stand in for: in this process
    assert "not installed" in info_line(proc) and "0 failed" in proc.stdout


@pytest.mark.slow  # CI runs it apart (pytest -m slow); the README's command leaves it out
@pytest.mark.parametrize("case, expected", [
    ("registers nothing", "0.2.0 installed and imports; no 'tpu' device registered"),
    ("registers 'tpu'", "0.2.0 installed and imports; 'tpu' device registered (0 devices)"),
    ("aborts", "0.2.0 installed, but importing it failed (exit -6)"),
])
def test_installed_torch_tpu_is_one_informational_line(tmp_path, case, expected):
    proc = report(tmp_path, STAND_INS[case])
    assert expected in info_line(proc)
    assert "0 failed" in proc.stdout
