"""Do the tests still catch what they guard? Ten faults planted one at a time in a copy of the checkout, each
against the quick-suite test files that should fail on it.

    python bench/planted_faults.py                 # all ten: a table of fault, tests, caught, seconds
    python bench/planted_faults.py wsd-restart     # one (or several) by name

Each fault is one exact edit of one source file (the edit must still apply: a refactoring that moves the code
makes the script say so, not pass). The copy is the checkout's files as the docs' pages see them (the root
conftest.py's ``copy_of_the_repository``), so nothing here changes; the tests run one at a time there (-n 0)
with this interpreter. A fault no test catches is a hole to fill.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from conftest import copy_of_the_repository  # noqa: E402 - the copy the docs' pages run in

# name: (file, the code as it is, the fault, the test files (or ids) that should fail, what the fault is)
FAULTS = {
    "stream-drops-state": (
        "reservoir/run/evaluation.py", "logits, state = model.forward_stream(chunk[:, :-1], state)",
        "logits, _ = model.forward_stream(chunk[:, :-1], state)", ["tests/test_evaluation.py"],
        "the stream evaluator drops the state it should carry from chunk to chunk"),
    "flops-factor-2": (
        "reservoir/run/flops.py", "return 2 * rows * inner * cols", "return rows * inner * cols",
        ["tests/test_flops.py"], "a dense product counted as multiply-adds, not FLOPs (a factor of 2)"),
    "integrity-unchecked": (
        "reservoir/run/records.py", "elif recorded != _integrity(content):",
        "elif recorded != recorded:", ["tests/test_damaged_folders.py"],
        "a record's integrity hash is not checked on reading"),
    "study-lock-not-taken": (
        "reservoir/studies/runner.py", "return lock_folder(path)", "return os.open(path, os.O_RDONLY)",
        ["tests/test_study_faults.py"], "a study runs without taking its folder's lock"),
    "wsd-restart": (
        "reservoir/run/train.py", "        progress = Progress(**job.saved[\"progress\"])\n        how =",
        "        progress = Progress() if job.branched_from else Progress(**job.saved[\"progress\"])\n        how =",
        ["tests/test_wsd.py"], "a wsd branch restarts its schedule from step 0 instead of the stable phase's step"),
    "frozen-as-parameter": (
        "reservoir/models/reservoirs.py", 'module.register_buffer("lam_re", radius * torch.cos(phase))',
        "module.lam_re = torch.nn.Parameter(radius * torch.cos(phase))", ["tests/test_models.py"],
        "a frozen recurrence weight registered as a trained parameter"),
    "points-last-line-lost": (
        "reservoir/studies/store.py", "for n, row in enumerate(rows[1:], start=2):",
        "for n, row in enumerate(rows[1:-1], start=2):", ["tests/test_study_records.py"],
        "points.jsonl read without its last point"),
    "tpu-batch-rule": (
        "reservoir/platform/device.py", 'lambda b: int(b * config["TPU_BATCH_MULTIPLIER"])', "lambda b: int(b)",
        ["tests/test_configs.py"], "the TPU's 2x batch rule not applied"),
    "checkpoint-in-place": (
        "reservoir/run/checkpoint.py", "atomic_write(path, lambda tmp: _torch_save(cpu_payload, tmp))",
        "_torch_save(cpu_payload, str(path))", ["tests/test_damaged_folders.py", "tests/test_run_faults.py"],
        "a checkpoint written in place, without its temporary file"),
    "diverged-seed-averaged": (
        "reservoir/run/tables.py", "counted = scored or group", "counted = group",
        ["tests/test_rigour.py", "tests/test_run_faults.py"], "a diverged seed's numbers averaged into a model's row"),
}


def plant(repo: Path, name: str) -> tuple[bool, float, str]:
    """(caught, seconds, the failing tests' summary line) for one fault, planted in ``repo`` and taken out again."""
    file, as_is, fault, tests, _ = FAULTS[name]
    path = repo / file
    source = path.read_text()
    if source.count(as_is) != 1:
        raise SystemExit(f"{name}: {file} no longer holds exactly one {as_is!r}: update the fault to today's code")
    path.write_text(source.replace(as_is, fault))
    start = time.time()
    try:
        proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-x", "-n", "0", "-p", "no:cacheprovider",
                               *tests], cwd=repo, capture_output=True, text=True, env=os.environ)
    finally:
        path.write_text(source)
    failed = [line for line in proc.stdout.splitlines() if line.startswith("FAILED")]
    said = failed[0] if failed else (proc.stdout.strip().splitlines() or [""])[-1]  # the first failure, or the tally
    return proc.returncode != 0, time.time() - start, said.strip()


def main(argv: list[str]) -> int:
    names = argv or list(FAULTS)
    unknown = [n for n in names if n not in FAULTS]
    if unknown:
        raise SystemExit(f"not a planted fault: {', '.join(unknown)} (the faults: {', '.join(FAULTS)})")
    repo = copy_of_the_repository()
    rows = []
    try:
        for name in names:
            caught, seconds, said = plant(repo, name)
            rows.append((name, caught))
            print(f"| {name} | {FAULTS[name][4]} | {' '.join(FAULTS[name][3])} | {'caught' if caught else 'MISSED'} "
                  f"| {seconds:.0f} | {said} |", flush=True)
    finally:
        shutil.rmtree(repo.parent, ignore_errors=True)
    missed = [name for name, caught in rows if not caught]
    print(f"{len(rows) - len(missed)} of {len(rows)} faults caught" + (f"; missed: {', '.join(missed)}" if missed
                                                                      else ""))
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
