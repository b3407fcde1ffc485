"""Train one recorded frontier point again here, directly, and set its score beside the record's: twice with
this CPU's own kernels (is a run here deterministic?) and once with PyTorch's and oneDNN's kernels held to AVX2
(what a CPU without AVX-512 runs). Run from the repository root:

    python bench/reproduce_point.py results/frontier-shakespeare frozen_retention-xs-lr0.012-b8 5e11 [KEY=VALUE ...]

KEY=VALUE settings follow the study's (DATA_DIR where this machine keeps the data, CACHE_DIR). The runs go to a
temporary folder (or OUT=<folder> in the environment), one thread each, one after another; nothing under the
study is touched. The point's settings are the study file's and the cell's, as the study ran it (a direct
run: bit-identical to the study's branched one on one machine, tests/test_frontier.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from reservoir.platform.machine import processor  # noqa: E402
from reservoir.platform.messages import OneLineError  # noqa: E402
from reservoir.studies.budgets import point_name  # noqa: E402
from reservoir.studies.frontier.edges import parse_cell  # noqa: E402
from reservoir.studies.frontier.records import _first, read_study_file  # noqa: E402
from reservoir.studies.store import PointRecords  # noqa: E402

KERNELS = {"this CPU's (1st run)": {}, "this CPU's (2nd run)": {},
           "AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "DNNL_MAX_CPU_ISA": "AVX2"}}


def main(argv: list[str]) -> int:
    if len(argv) < 3:
        sys.exit(__doc__)
    reproduce(*argv, out=os.environ.get("OUT"))
    return 0


def reproduce(study_dir: str, cell_name: str, budget_text: str, *settings: str, out: str | None = None) -> None:
    try:
        study = read_study_file(Path(study_dir))
    except OneLineError as e:
        sys.exit(f"error: {e}")
    cell = parse_cell(cell_name)
    if cell is None:
        sys.exit(f"error: {cell_name} is not a cell name (<family>-<size>-lr<rate>-b<batch>, as the study's folders)")
    try:
        budget = float(budget_text)
    except ValueError:
        sys.exit(f"error: the budget must be a number of FLOPs, e.g. 5e11; got {budget_text!r}")
    record = _first(PointRecords(Path(study_dir)).summary(Path(study_dir) / cell_name / point_name(budget)) or [],
                    study["seed"])
    if record is None:
        sys.exit(f"error: {study_dir} holds no record of {cell_name} at {budget:g} FLOPs on seed {study['seed']}")
    where = Path(out or tempfile.mkdtemp(prefix="reproduce-"))
    here = processor()
    rows = []
    for k, (kernels, env) in enumerate(KERNELS.items()):
        score = train_point(study, cell, budget, settings, where / f"run{k}", f"the run with {kernels} kernels", env)
        rows.append({"kernels": kernels, "val_bpc": score, "record": record["val_bpc"],
                     "difference": score - record["val_bpc"]})
    print(f"{cell_name} at {budget:g} FLOPs, seed {study['seed']}, here on {here} (runs in {where})\n")
    print("| kernels | bits/char here | the record | here − record |\n| --- | --- | --- | --- |")
    for r in rows:
        print(f"| {r['kernels']} | {r['val_bpc']:.6f} | {r['record']:.6f} | {r['difference']:+.4f} |")
    (where / "reproduce.json").write_text(json.dumps({"cell": cell_name, "budget": budget, "processor": here,
                                                      "rows": rows}, indent=1))


def train_point(study: dict, cell, budget: float, settings: list[str], folder: Path, what: str,
                env: dict | None = None) -> float:
    """``cell`` at ``budget`` trained here into ``folder`` from the study file's settings and ``settings`` (later
    ones win), one thread, in a process of its own: its bits/char; a run that stops exits with ``what`` stopped."""
    args = [*study["settings"], *cell.settings(), *settings, f"FLOP_BUDGET={budget!r}", f"RESULTS_DIR={folder.parent}",
            f"RUN_NAME={folder.name}"]
    run = subprocess.run([sys.executable, str(ROOT / "TinyStories.py"), *args], cwd=ROOT, capture_output=True,
                         text=True, env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})
    if run.returncode != 0:
        said = (run.stderr.strip().splitlines() or ["no message"])[-1]
        sys.exit(f"error: {what} stopped (exit code {run.returncode}): {said}")
    return json.loads((folder / "summary.json").read_text())[0]["val_bpc"]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
