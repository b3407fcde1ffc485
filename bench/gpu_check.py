"""Everything a machine with a CUDA GPU should measure, in one go (bench/gpu_check.sh installs, then runs this).

    python bench/gpu_check.py OUT_DIR             # on a CUDA machine
    python bench/gpu_check.py OUT_DIR --dry-run   # CPU-safe parts on tiny sizes (CI runs this)

Writes OUT_DIR/gpu_check.json and OUT_DIR/gpu_check.md:
  - the device, its precision and torch's version;
  - test_tpu_support.py, and the CUDA-marked tests (pytest -m cuda);
  - a short `python TinyStories.py DEVICE=cuda` run of every model: bits/char, tokens/s, precision;
  - with 2 or more GPUs, the same run under torchrun (NCCL for the model, gloo for host sums);
  - the transformer's training tokens/s and MFU in the runner, against a minimal nanoGPT-style
    loop (bench/minimal_gpt.py) at the same sizes on the same GPU; at the study's xs preset, the
    runner eager and compiled (COMPILE=True) against the minimal loop;
  - a micro frontier, one point per GPU, again with POINTS_PER_DEVICE=8 (eight points sharing it) and with
    POINTS_PER_DEVICE=probe (a probe on the GPU folds what gains);
  - eight xs Transformer++ points as one folded group (TinyStories.py A --and B ...) against one point alone;
  - K Transformer++ points folded into one model against K steps of one, K = 1, 8, 32, 128 at the xs and l
    presets, tokens/s in all and a member (bench_lockstep.py --folded);
  - sampling tokens/s with and without the carried state / key-value cache, with the compiled decode
    step and with it replayed as CUDA graphs, at 300 tokens and within the window at 100 (bench_sampling.py);
  - the ESN fit against reservoirpy, where reservoirpy is installed (bench_esn.py).
A part that fails is recorded with its error and the rest still runs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable
# dense bf16 tensor-core peaks (TFLOP/s) from the vendors' data sheets, for MFU; others: measured
PEAK_BF16_TFLOPS = {"H100": 989.0, "H200": 989.0, "A100": 312.0, "L4": 121.0, "A10": 125.0, "L40": 181.0}
GPU_SIZES = ["SEQ_LEN=256", "BATCH_SIZE=64", "TRANSFORMER.n_layer=6", "TRANSFORMER.n_embd=384",
             "TRANSFORMER.n_head=6", "TRANSFORMER.recipe='gpt2'"]  # nanoGPT's shape, as minimal_gpt.py builds it
TINY_SIZES = ["SEQ_LEN=32", "BATCH_SIZE=8", "TRANSFORMER.n_layer=1", "TRANSFORMER.n_embd=32",
              "TRANSFORMER.n_head=2", "ESN.units=64", "DEEP_ESN.units=32", "LSTM.hidden=64",
              "LINEAR_RESERVOIR.units=32", "DEEP_LINEAR_RESERVOIR.layers=2", "DEEP_LINEAR_RESERVOIR.units=16",
              "DEEP_LINEAR_RESERVOIR.width=32", "DEEP_LINEAR_RESERVOIR.mix_hidden=32", "NVAR.input_dim=4"]


FAILED_TAIL_LINES = 20


def run(cmd: list[str], timeout: int = 1800, env: dict | None = None) -> dict:
    start = time.perf_counter()
    try:
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, **(env or {})})
        code, tail = proc.returncode, (proc.stdout + proc.stderr)[-2000:]
    except subprocess.TimeoutExpired:
        code, tail = 124, f"timed out after {timeout}s"
    return {"command": " ".join(cmd), "ok": code == 0, "returncode": code,
            "seconds": round(time.perf_counter() - start, 1), "tail": tail}


def device_facts(dry_run: bool) -> dict:
    import torch

    facts = {"torch": torch.__version__, "cuda_available": torch.cuda.is_available(), "dry_run": dry_run}
    if torch.cuda.is_available():
        from reservoir.platform import device as dev

        facts.update(gpus=torch.cuda.device_count(), name=torch.cuda.get_device_name(0),
                     capability=".".join(map(str, torch.cuda.get_device_capability(0))),
                     precision=dev.resolve_precision("cuda", "auto", 0), cuda=torch.version.cuda)
    return facts


def runner_table(run_dir: Path) -> list[dict]:
    path = run_dir / "summary.json"
    if not path.exists():
        return []
    keep = ("model", "val_bpc", "tokens_per_second", "train_seconds", "precision", "device")
    return [{k: r.get(k) for k in keep} for r in json.loads(path.read_text())]


def last_json(part: dict) -> dict:
    """The JSON line a part printed last ({} if it printed none)."""
    try:
        return json.loads(part["tail"].strip().splitlines()[-1])
    except (json.JSONDecodeError, IndexError):
        return {}


def step_rate(run_dir: Path) -> float | None:
    """A run's training tokens/s after warm-up, None if it wrote no record."""
    from reservoir.run.records import steady_rate

    path = run_dir / "summary.json"
    return steady_rate(json.loads(path.read_text())[0]) if path.exists() else None


def peak_tflops(name: str | None) -> float | None:
    for key, value in PEAK_BF16_TFLOPS.items():
        if name and key in name:
            return value
    return None


class PartsWrittenAsTheyEnd(dict):
    """A report's parts: each one, as it ends, is printed in a line and the report written to OUT_DIR, so a check
    cut short (a lease's time limit) still leaves what it measured."""

    def __init__(self, out: Path, report: dict):
        super().__init__()
        self.out, self.report = out, report
        report["parts"] = self

    def __setitem__(self, name: str, part: dict) -> None:
        super().__setitem__(name, part)
        print(f"{name}: ok={part.get('ok')} in {part.get('seconds', '')}s", flush=True)
        write_report(self.out, self.report)


def write_report(out: Path, report: dict) -> None:
    (out / "gpu_check.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "gpu_check.md").write_text(markdown(report) + "\n")


def main(out: Path, dry_run: bool) -> int:
    sys.path.insert(0, str(ROOT))
    out.mkdir(parents=True, exist_ok=True)
    facts = device_facts(dry_run)
    device = "cpu" if dry_run or not facts["cuda_available"] else "cuda"
    if device == "cpu" and not dry_run:
        print("no CUDA GPU here: run with --dry-run for the CPU-safe parts", file=sys.stderr)
        return 2
    sizes = TINY_SIZES if dry_run else GPU_SIZES
    steps = "MAX_STEPS=5" if dry_run else f"TIME_BUDGET_S={os.environ.get('GPU_CHECK_SECONDS', '10')}"
    data = ["DATASET=synthetic", "SYNTHETIC_STORIES=400"] if dry_run else []
    report: dict = {"device": facts}
    parts = PartsWrittenAsTheyEnd(out, report)
    parts["test_tpu_support"] = run([PY, "test_tpu_support.py", f"DEVICE={device}"])
    if not dry_run:
        # one GPU: one test at a time
        parts["cuda_tests"] = run([PY, "-m", "pytest", "-q", "-n", "0", "-m", "cuda", "tests/"])
    common = [*data, *sizes, "FLOP_BUDGET=None", "PLOTS=False", f"RESULTS_DIR={out / 'results'}",
              f"CACHE_DIR={out / 'cache'}", f"DEVICE={device}", steps,
              "MODELS=['ngram','esn','deep_esn','nvar','linear_reservoir','deep_linear_reservoir','lstm','transformer']"]
    every_model = run([PY, "TinyStories.py", *common, "RUN_NAME=every-model"])
    parts["every_model"] = {**every_model, "models": runner_table(out / "results" / "every-model")}
    if facts.get("gpus", 0) >= 2:
        torchrun = [PY, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={facts['gpus']}"]
        on_all = run([*torchrun, "TinyStories.py", *common, "RUN_NAME=torchrun"])
        parts["torchrun"] = {**on_all, "models": runner_table(out / "results" / "torchrun")}

    # the transformer: the runner's training tokens/s against a minimal loop at the same sizes
    budget = "MAX_STEPS=10" if dry_run else "MAX_STEPS=300"
    parts["transformer_runner"] = run([PY, "TinyStories.py", *common[:-2], budget, "MODELS=['transformer']",
                                       "EVAL_POINTS=1", "CHECKPOINT_EVERY=0", "CHECKPOINT_EVERY_S=0",
                                       "RUN_NAME=transformer"])
    ours = runner_table(out / "results" / "transformer")
    minimal = run([PY, "bench/minimal_gpt.py", device, *sizes, budget.replace("MAX_STEPS=", "STEPS=")])
    parts["transformer_minimal"] = minimal
    reference = last_json(minimal) or None
    if ours and reference:
        tps = ours[0]["tokens_per_second"]
        peak = peak_tflops(facts.get("name"))
        report["transformer"] = {
            "runner_tokens_per_second": tps, "minimal_tokens_per_second": reference["tokens_per_second"],
            "ratio_runner_to_minimal": round(tps / reference["tokens_per_second"], 3),
            "flops_per_token": reference["flops_per_token"], "peak_tflops": peak,
            "runner_mfu": None if peak is None else round(tps * reference["flops_per_token"] / (peak * 1e12), 4),
            "minimal_mfu": None if peak is None else round(
                reference["tokens_per_second"] * reference["flops_per_token"] / (peak * 1e12), 4)}
    # the transformer at the study's xs preset (2 x 48, batch 8, context 128): launch-bound; eager, compiled, and
    # the minimal loop of the same recipe
    xs = ["SEQ_LEN=128", "BATCH_SIZE=8", "TRANSFORMER.n_layer=2", "TRANSFORMER.n_embd=48", "TRANSFORMER.n_head=4",
          "TRANSFORMER.recipe='gpt2'"]
    xs_steps = "MAX_STEPS=10" if dry_run else "MAX_STEPS=1000"
    for name, extra in (("xs_runner", []), ("xs_runner_compiled", ["COMPILE=True"])):
        parts[name] = run([PY, "TinyStories.py", *data, *xs, xs_steps, *extra, "FLOP_BUDGET=None", "PLOTS=False",
                           "MODELS=['transformer']", "EVAL_POINTS=1", "CHECKPOINT_EVERY=0", "CHECKPOINT_EVERY_S=0",
                           "SAMPLE_TOKENS=0", f"DEVICE={device}", f"RESULTS_DIR={out / 'results'}",
                           f"CACHE_DIR={out / 'cache'}", f"RUN_NAME={name}"])
    xs_minimal = run([PY, "bench/minimal_gpt.py", device, *xs, xs_steps.replace("MAX_STEPS=", "STEPS=")])
    parts["xs_minimal"] = xs_minimal
    report["transformer_xs"] = {name: step_rate(out / "results" / name) for name in ("xs_runner", "xs_runner_compiled")}
    report["transformer_xs"]["minimal"] = last_json(xs_minimal).get("tokens_per_second")
    # a micro frontier with WORKERS=auto: one point per visible GPU (per core on the CPU), each on its own device;
    # on a GPU again with POINTS_PER_DEVICE=8 (eight points share each GPU, a process each) and =probe (a probe on
    # the GPU chooses how many of a shape to fold into one process, a process a GPU)
    micro = [PY, "scaling.py", "FRONTIER=True", "FAMILIES=lstm,transformer++", "SIZES=xs", "LEARNING_RATES=2e-3,4e-3",
             "BATCH_SIZES=8", "BUDGETS=3e9,6e9", "KEEP=2", "MIN_STEPS=20", "MAX_TOKENS_PER_PARAM=1e9",
             "ENVELOPE_SEEDS=1", "WORKERS=auto", "DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32",
             "EVAL_TOKENS=2048", "FINAL_EVAL_TOKENS=4096", "SAMPLE_TOKENS=0", "WARMUP_STEPS=5", f"DEVICE={device}",
             f"RESULTS_DIR={out / 'results'}", f"CACHE_DIR={out / 'cache'}"]
    report["frontier"] = {}
    variants = (("frontier", []), ("frontier_packed", ["POINTS_PER_DEVICE=8"]),
                ("frontier_probed", ["POINTS_PER_DEVICE=probe"]))
    for name, extra in variants[:1 if dry_run else 3]:
        parts[name] = run([*micro, f"STUDY={name}", *extra])
        records = [r for p in sorted((out / "results" / name).glob("*/flops-*/summary.json"))
                   for r in json.loads(p.read_text())]
        report["frontier"][name] = {"points": len(records),
                                    "devices": sorted({str(r.get("point_device")) for r in records}),
                                    "folded": sum(bool((r.get("fit") or {}).get("folded_with")) for r in records),
                                    "seconds": parts[name]["seconds"]}
    # K xs Transformer++ points as one folded group (TinyStories.py A --and B ...) against one point alone: whether a
    # GPU gains from folding what POINTS_PER_DEVICE now runs there as K processes (device.folded_points)
    members = 2 if dry_run else 8
    point = [*data, *xs[:-1], "TRANSFORMER.recipe='++'", xs_steps, "FLOP_BUDGET=None", "PLOTS=False",
             "MODELS=['transformer']", "EVAL_POINTS=1", "CHECKPOINT_EVERY=0", "CHECKPOINT_EVERY_S=0", "SAMPLE_TOKENS=0",
             f"DEVICE={device}", f"RESULTS_DIR={out / 'results'}", f"CACHE_DIR={out / 'cache'}"]
    group = []
    for k in range(members):
        group += [*(["--and"] if group else []), *point, f"LEARNING_RATE={1e-3 * (k + 1):g}", f"RUN_NAME=group-{k}"]
    parts["group_folded"] = run([PY, "TinyStories.py", *group])
    parts["group_alone"] = run([PY, "TinyStories.py", *point, "LEARNING_RATE=0.001", "RUN_NAME=group-alone"])
    member, alone = step_rate(out / "results" / "group-0"), step_rate(out / "results" / "group-alone")
    if member and alone:  # a member's seconds are its group's: the group's tokens/s is members x a member's
        report["folded_group"] = {"members": members, "tokens_per_second_all": round(members * member),
                                  "tokens_per_second_alone": round(alone),
                                  "speedup": round(members * member / alone, 2)}
    write_report(out, report)
    # K of the study's xs Transformer++ points folded into one model (bench_lockstep.py --folded): on a GPU a
    # point this small is bound by its kernel launches, which a fold shares among K
    parts["lockstep_folded"] = run([PY, "bench/bench_lockstep.py", "--folded", "--models", "transformer++",
                                    "--batch", "8", "--device", device, "--packed",
                                    *(["2", "--repeats", "3"] if dry_run else
                                      ["1", "8", "32", "128", "--sizes", "xs", "l", "--repeats", "10"])],
                                   timeout=600)
    # 300 new tokens: about 40 s on an H200 for every model both ways, where 2,000 ran past the check's time
    parts["sampling"] = run([PY, "bench/bench_sampling.py", "100" if dry_run else "300", device])
    # within the 128-token window, where the cache and the compiled decode step (COMPILE=True) make every token
    if not dry_run:
        parts["sampling_in_window"] = run([PY, "bench/bench_sampling.py", "100", device])
    try:
        import reservoirpy  # noqa: F401

        parts["esn_vs_reservoirpy"] = run([PY, "bench/bench_esn.py"])
    except ImportError:
        parts["esn_vs_reservoirpy"] = {"ok": None, "tail": "skipped: reservoirpy is not installed here"}

    write_report(out, report)
    print(markdown(report))
    return 0 if all(p.get("ok") is not False for p in parts.values()) else 1


def _number(value, spec: str) -> str:
    return "" if value is None else format(value, spec)


def markdown(report: dict) -> str:
    facts = report["device"]
    lines = [f"### GPU check: {facts.get('name', 'CPU (dry run)')}, torch {facts['torch']}, "
             f"precision {facts.get('precision', 'fp32')}", "", "| part | ok | seconds |", "| --- | --- | --- |"]
    for name, part in report["parts"].items():
        lines.append(f"| {name} | {part.get('ok')} | {part.get('seconds', '')} |")
    models = report["parts"].get("every_model", {}).get("models") or []
    if models:
        lines += ["", "| model | bits/char | tokens/s | precision |", "| --- | --- | --- | --- |"]
        lines += [f"| {m['model']} | {_number(m['val_bpc'], '.3f')} | {_number(m['tokens_per_second'], ',.0f')} | "
                  f"{m['precision']} |" for m in models]
    packed = {"frontier_packed": " (POINTS_PER_DEVICE=8)", "frontier_probed": " (POINTS_PER_DEVICE=probe)"}
    for name, f in report.get("frontier", {}).items():
        lines += ["", f"micro frontier (WORKERS=auto){packed.get(name, '')}: {f['points']} points "
                  f"({f.get('folded', 0)} of them folded) on {', '.join(f['devices']) or 'none'} in {f['seconds']} s"]
    if "transformer_xs" in report:
        t = report["transformer_xs"]
        lines += ["", "transformer at xs (2 x 48, batch 8, context 128), tok/s after warm-up: " + ", ".join(
            f"{name} {_number(value, ',.0f') or 'failed'}" for name, value in t.items())]
    if "transformer" in report:
        t = report["transformer"]
        lines += ["", f"transformer: runner {t['runner_tokens_per_second']:,.0f} tok/s, minimal loop "
                  f"{t['minimal_tokens_per_second']:,.0f} tok/s (ratio {t['ratio_runner_to_minimal']}); "
                  f"MFU runner {t['runner_mfu']}, minimal {t['minimal_mfu']} (peak {t['peak_tflops']} TFLOP/s)"]
    for name in ("sampling", "sampling_in_window"):  # the bench's own table, as it prints it
        said = report["parts"].get(name, {})
        table = said.get("tail", "").splitlines()
        start = next((k for k, line in enumerate(table) if "new tokens after" in line), None)
        if said.get("ok") and start is not None:
            lines += ["", f"{name}:", "```", *table[start:], "```"]
    if "folded_group" in report:
        g = report["folded_group"]
        lines += ["", f"{g['members']} xs Transformer++ points folded (TinyStories.py A --and B ...): "
                  f"{g['tokens_per_second_all']:,} tok/s in all against {g['tokens_per_second_alone']:,} for one "
                  f"point alone ({g['speedup']}x)"]
    folded = report["parts"].get("lockstep_folded", {})
    if folded.get("ok"):  # its table, as the bench prints it
        lines += ["", "K Transformer++ points folded into one (bench_lockstep.py --folded):", "",
                  *[line for line in folded.get("tail", "").splitlines() if line.startswith("|")]]
    # a failed part's own last lines, so a log of the check alone says why (its JSON keeps 2,000 characters)
    for name, part in report["parts"].items():
        if part.get("ok") is False:
            tail = part.get("tail", "").rstrip().splitlines()[-FAILED_TAIL_LINES:]
            lines += ["", f"{name} failed (exit code {part.get('returncode')}): {part.get('command', '')}", "```",
                      *tail, "```"]
    return "\n".join(lines)


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--dry-run"]
    sys.exit(main(Path(args[0]) if args else ROOT / "gpu_check", "--dry-run" in sys.argv))
