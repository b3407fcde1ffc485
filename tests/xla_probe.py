"""Measure a model's XLA graphs through the real training loop, in a fresh process.

    PJRT_DEVICE=CPU python tests/xla_probe.py transformer [--inject item|dynamic] [--seq-len 512] [--full-size]
                                              [--compiles-only] [--after-steps 8]
    PJRT_DEVICE=CPU python tests/xla_probe.py frozen_retention FROZEN_RETENTION.conv_width=4   # a model's options
    PJRT_DEVICE=CPU python tests/xla_probe.py esn,lstm,nvar    # several models, one after another

Prints one JSON line per model (each count is the model's own, measured from where the one before left off):
- warmup_compiles: graphs compiled by a first short fit (training, evaluation, checkpoint);
- compiles_after_warmup: graphs compiled by a second, longer fit of a fresh model
  with evaluations in between (must be 0: every shape was seen in warm-up);
- executions_per_step: device executions per training step, from the difference
  between a K-step and a 2K-step fit (1 for gradient-trained models: the step marker);
- compile_seconds: XLA's own CompileTime over the warm-up fit (every graph the model needs);
- traces_after_warmup: times the second fit traced a scanned cell in Python (torch_xla's ``scan``
  traces with AOTAutograd; a cell traced on every call costs the host each step and evaluation chunk).

``--full-size`` keeps the default model sizes (SHARED_CONFIG) instead of tiny ones, for the
compile times README_TPU.md reports; ``--seq-len`` sets SEQ_LEN (compile time must not grow with it).

``--track tensorboard`` reads the loss every step and sends it to the trackers, so a test can
check that tracking adds no device execution to the step.

``--inject`` breaks the hot loop on purpose (an ``.item()`` in forward, or a
shape that changes every step) so tests can check that the probe notices.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from reservoir.config import parse_overrides  # noqa: E402
from reservoir.data.tokens import prepare_data  # noqa: E402
from reservoir.models import build_model  # noqa: E402
from reservoir.platform import device as dev  # noqa: E402
from reservoir.run import train  # noqa: E402
from reservoir.run.tracking import Trackers  # noqa: E402
from reservoir.run.writer import Run  # noqa: E402

BASE = ["USE_TPU=True", "MAX_STEPS=1", "DATASET=synthetic", "SYNTHETIC_STORIES=200", "SEQ_LEN=16", "BATCH_SIZE=2",
        "EVAL_TOKENS=128", "FINAL_EVAL_TOKENS=256", "TRAIN_EVAL_TOKENS=128",  # the contract, not a score
        "TIME_BUDGET_S=None", "CHECKPOINT_EVERY=0", "CHECKPOINT_EVERY_S=0", "WARMUP_STEPS=2"]
TINY = ["ESN.units=32", "DEEP_ESN.units=16", "NVAR.input_dim=4", "LINEAR_RESERVOIR.units=16",
        "LINEAR_RESERVOIR.readout_hidden=32", "LSTM.hidden=32",
        "DEEP_LINEAR_RESERVOIR.units=16", "DEEP_LINEAR_RESERVOIR.width=24", "DEEP_LINEAR_RESERVOIR.mix_hidden=32",
        "DEEP_LINEAR_RESERVOIR.layers=2", "DEEP_LINEAR_RESERVOIR.embed_dim=8",
        "TRANSFORMER.n_layer=1", "TRANSFORMER.n_embd=32", "FROZEN_RETENTION.layers=1", "FROZEN_RETENTION.width=32",
        "FROZEN_RETENTION.ffn_hidden=64", "RESERVOIR_ATTENTION.units=16", "RESERVOIR_ATTENTION.width=32",
        "RESERVOIR_ATTENTION.layers=1"]


_CALLS = [0]  # across fits, so an injected dynamic shape keeps producing new lengths


def inject(model, kind: str):
    forward = model.forward

    def with_item(ids):
        out = forward(ids)
        return out * (1 + 0 * out.sum().item())  # a host sync inside the step

    def with_dynamic_shape(ids):
        _CALLS[0] += 1
        cut = 1 + _CALLS[0] % (ids.shape[1] - 1)  # a new length on most calls
        out = forward(ids[:, : ids.shape[1] - cut])
        return torch.nn.functional.pad(out, (0, 0, 0, cut))  # same output shape, dynamic inside

    model.forward = {"item": with_item, "dynamic": with_dynamic_shape}[kind]
    return model


_TRACES = [0]


def count_scan_traces() -> None:
    """Count the cell traces of torch_xla's ``scan`` (each goes through ``aot_function``), once a process."""
    scan = __import__("torch_xla.experimental.scan", fromlist=["aot_function"])
    trace = scan.aot_function
    if getattr(trace, "counted", False):
        return

    def counted(*args, **kwargs):
        _TRACES[0] += 1
        return trace(*args, **kwargs)

    counted.counted = True
    scan.aot_function = counted


def counters() -> tuple[int, int]:
    metrics = __import__("torch_xla.debug.metrics", fromlist=["counter_value"])
    return dev.xla_compile_count(), int(metrics.counter_value("ExecuteComputation") or 0)


SIZES = []  # model-size overrides for this process: TINY's, or none with --full-size


def fit_once(name: str, overrides: list[str], data, info, injected: str | None, track: list[str] = ()) -> None:
    config = parse_overrides(BASE + SIZES + overrides)
    model = build_model(name, data.tokenizer.vocab_size, config)
    if injected:
        inject(model, injected)
    with tempfile.TemporaryDirectory() as folder:
        trackers = Trackers(list(track), Path(folder), config, "probe")
        train.fit(name, model, data, config, info, Run(Path(folder), info, trackers))
        trackers.close()


def compile_seconds() -> float:
    metrics = __import__("torch_xla.debug.metrics", fromlist=["metric_data"])
    data = metrics.metric_data("CompileTime")
    return data[1] / 1e9 if data else 0.0


def probe(name: str, injected: str | None = None, k: int = 4, track: list[str] | None = None,
          seq_len: int = 16, full_size: bool = False, options: list[str] = (), compiles_only: bool = False,
          after_steps: int = 8) -> dict:
    """``options``: KEY=VALUE overrides of the model's block (e.g. its train_recurrence switch);
    ``compiles_only`` stops after the warm-up and the second fit (no executions per step), which trains
    ``after_steps`` steps."""
    os.environ.setdefault("PJRT_DEVICE", "CPU")
    BASE[BASE.index("SEQ_LEN=16")] = f"SEQ_LEN={seq_len}"
    SIZES[:] = ([] if full_size else TINY) + list(options)
    config = parse_overrides(BASE + SIZES + [f"CACHE_DIR={tempfile.mkdtemp()}"])
    info = dev.select_device(config)
    data = prepare_data(config)
    count_scan_traces()
    (before, _), compiled_before = counters(), compile_seconds()  # what models probed before this one left
    fit_once(name, ["MAX_STEPS=3", "EVAL_EVERY=2", "LOG_EVERY=1"], data, info, injected)
    warm, _ = counters()
    compiling, traced = compile_seconds() - compiled_before, _TRACES[0]
    fit_once(name, [f"MAX_STEPS={after_steps}", "EVAL_EVERY=2", "LOG_EVERY=3"], data, info, injected)
    after, _ = counters()
    traces = _TRACES[0]
    result = {"model": name, "options": list(options), "seq_len": seq_len, "warmup_compiles": warm - before,
              "compiles_after_warmup": after - warm, "traces_after_warmup": traces - traced,
              "executions_per_step": None, "compile_seconds": round(compiling, 2)}
    if compiles_only:
        return result
    quiet = ["EVAL_EVERY=100000", "LOG_EVERY=100000"]  # only the final evaluation: runs differ by steps alone
    if track is not None:
        quiet = ["EVAL_EVERY=100000", "LOG_EVERY=1"]  # a loss read, sent to the trackers, every step
    _, e0 = counters()
    fit_once(name, [f"MAX_STEPS={k}", *quiet], data, info, injected, track or ())
    _, e1 = counters()
    fit_once(name, [f"MAX_STEPS={2 * k}", *quiet], data, info, injected, track or ())
    _, e2 = counters()
    return {**result, "executions_per_step": ((e2 - e1) - (e1 - e0)) / k}


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser()
    parser.add_argument("model", help="a model, or several separated by commas (probed one after another)")
    parser.add_argument("options", nargs="*", help="KEY=VALUE overrides of the model's settings")
    parser.add_argument("--inject", choices=("item", "dynamic"))
    parser.add_argument("--track", choices=("none", "tensorboard"), help="read the loss every step, for trackers")
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--full-size", action="store_true", help="the default model sizes, not tiny ones")
    parser.add_argument("--compiles-only", action="store_true",
                        help="graphs compiled after warm-up alone: skip the two fits that count executions per step")
    parser.add_argument("--after-steps", type=int, default=8,
                        help="steps of the fit after warm-up whose compilations are counted")
    args = parser.parse_args()
    track = None if args.track is None else ([] if args.track == "none" else [args.track])
    for model in args.model.split(","):
        print(json.dumps(probe(model, args.inject, track=track, seq_len=args.seq_len, full_size=args.full_size,
                               options=args.options, compiles_only=args.compiles_only,
                               after_steps=args.after_steps)), flush=True)
