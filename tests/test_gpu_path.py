"""The CUDA path's decisions, exercised on the CPU where the logic allows .
What only a GPU can show (NCCL, speed, MFU) is measured by bench/gpu_check.sh on one."""

import os
import shutil

import numpy as np
import pytest
import torch

from reservoir.config import parse_overrides
from reservoir.models import build_model
from reservoir.platform import device as dev
from tests.conftest import ROOT, run_script


@pytest.mark.parametrize("capability, auto", [((7, 0), "fp16"), ((7, 5), "fp16"), ((8, 0), "bf16"), ((9, 0), "bf16")])
def test_auto_precision_follows_the_gpus_bf16_hardware(monkeypatch, capability, auto):
    """A T4 (7.5) or V100 (7.0) gets fp16 with a grad scaler: torch.cuda.is_bf16_supported() says yes
    there too, but its bf16 is emulated. The device query is the system edge simulated here."""
    asked = []
    monkeypatch.setattr(torch.version, "hip", None)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: asked.append(device) or capability)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    gpu = torch.device("cuda", 1)
    assert dev.resolve_precision("cuda", "auto", gpu) == auto
    assert asked == [gpu]  # this process's GPU, not GPU 0
    if auto == "fp16":
        with pytest.raises(dev.DeviceError, match="needs a GPU with bf16 hardware"):
            dev.resolve_precision("cuda", "bf16", gpu)
    else:
        assert dev.resolve_precision("cuda", "bf16", gpu) == "bf16"
    assert dev.resolve_precision("cuda", "fp32", gpu) == "fp32"


def test_gpus_sum_host_tensors_with_gloo_and_device_tensors_with_nccl():
    backends = dict(part.split(":") for part in dev.process_group_backend("cuda").split(","))
    assert backends == {"cpu": "gloo", "cuda": "nccl"}
    assert dev.process_group_backend("cpu") == "gloo"


def test_cuda_gets_the_fused_optimizer_and_ddp_leaves_frozen_buffers_alone(monkeypatch):
    from reservoir.models.settings import model_settings
    from reservoir.run.train import adamw

    cuda = dev.DeviceInfo("cuda", torch.device("cpu"), "fake GPU", "bf16")
    cpu = dev.DeviceInfo("cpu", torch.device("cpu"), "CPU", "fp32")
    assert dev.optimizer_options(cuda) == {"fused": True} and dev.optimizer_options(cpu) == {"foreach": True}
    model = build_model("linear_reservoir", 20, parse_overrides(["LINEAR_RESERVOIR.units=8"]))
    settings = model_settings(parse_overrides([]), "linear_reservoir")  # what a fit of it is given
    assert adamw(model, settings, 0.95, dev.optimizer_options(cuda)).defaults["fused"] is True

    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(29500 + os.getpid() % 1000))
    torch.distributed.init_process_group("gloo", rank=0, world_size=1)
    try:
        two = dev.DeviceInfo("cpu", torch.device("cpu"), "CPU", "fp32", world_size=2, rank=0)
        wrapped = dev.wrap_for_training(two, model)
        assert isinstance(wrapped, torch.nn.parallel.DistributedDataParallel)
        resends = getattr(wrapped, "forward_sync_buffers", getattr(wrapped, "broadcast_buffers", None))
        assert resends is False  # the reservoir's λ and input weights: identical everywhere
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.parametrize("name", ["transformer", "lstm", "frozen_retention", "reservoir_attention"])
def test_the_cpus_optimizer_step_trains_the_weights_torchs_defaults_train_bit_for_bit(name):
    """The runner's step on the CPU (multi-tensor AdamW, a clip that skips its multiply by 1: for speed)
    against torch's defaults there (clip_grad_norm_, AdamW's loop over the parameters), on steps that clip and
    steps that do not: a recorded point trained again must repeat its scores."""
    from reservoir.models.settings import model_settings
    from reservoir.run.train import adamw

    cpu = dev.DeviceInfo("cpu", torch.device("cpu"), "CPU", "fp32")
    config = parse_overrides(["SEQ_LEN=32", "WEIGHT_DECAY=0.1"])
    weights = []
    for runners in (True, False):
        model = build_model(name, 40, config)
        optimizer = adamw(model, model_settings(config, name), 0.95,
                               dev.optimizer_options(cpu) if runners else {"foreach": False})
        batches = torch.Generator().manual_seed(0)
        for step in range(12):
            ids = torch.randint(0, 40, (3, 33), generator=batches)
            loss = torch.nn.functional.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
            loss.backward()
            limit = 1e-3 if step % 2 else 1e3  # clipped, then within the limit
            if runners:
                dev.optimizer_step(cpu, optimizer, dev.make_grad_scaler(cpu), max_grad_norm=limit)
            else:
                in_order = [p for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
                torch.nn.utils.clip_grad_norm_(in_order, limit)  # the order the runner's norm sums them in
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
        weights.append(torch.cat([p.detach().flatten() for p in model.parameters()]))
    assert optimizer.defaults["foreach"] is False and weights[0].abs().sum() > 0
    torch.testing.assert_close(weights[0], weights[1], rtol=0, atol=0)


def test_a_ridge_readout_is_evaluated_in_the_dtype_it_was_solved_in():
    """Under bf16 autocast the fixed features are fp32 already; the readout must be too (a 300-unit ESN
    went 2.7076 -> 2.7123 bits/char when its readout ran in bf16)."""
    vocab = 30
    model = build_model("esn", vocab, parse_overrides(["ESN.units=64"])).eval()
    rng = np.random.default_rng(0)
    chunks = [torch.from_numpy(rng.integers(0, vocab, (4, 65))) for _ in range(3)]
    model.fit_ridge([(c[:, :-1], c[:, 1:]) for c in chunks[:2]], [(chunks[2][:, :-1], chunks[2][:, 1:])])
    ids = chunks[0][:, :-1]
    with torch.no_grad():
        exact = model(ids)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under_autocast = model(ids)
    assert under_autocast.dtype == torch.float32
    torch.testing.assert_close(under_autocast, exact, rtol=0, atol=0)


def test_gpu_check_looks_for_a_gpu_before_it_downloads(tmp_path):
    bare = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    if shutil.which("nvidia-smi", path=bare["PATH"]):
        pytest.skip("this machine has nvidia-smi: the GPU check runs for real here")
    copy = tmp_path / "repo"
    shutil.copytree(ROOT / "bench", copy / "bench")
    import subprocess

    proc = subprocess.run(["bash", str(copy / "bench" / "gpu_check.sh"), str(tmp_path / "out")], env=bare,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stderr.strip().splitlines() == [
        "error: no CUDA GPU here (nvidia-smi finds none); bash bench/gpu_check.sh OUT_DIR --dry-run runs the "
        "CPU-safe parts"]
    assert not (copy / ".venv-gpu").exists()  # nothing installed, nothing downloaded


def test_the_gpu_checks_report_shows_why_a_part_failed():
    """CI and a lent GPU machine see the check's printed report alone: a failed part must carry its own last
    lines there, not just False in the table."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    said = "\n".join(f"PASS  check_{i}" for i in range(30)) + "\nFAIL  loader: AssertionError: not pinned\n"
    report = {"device": {"torch": "2.x"}, "parts": {
        "test_tpu_support": {"ok": False, "returncode": 1, "command": "python test_tpu_support.py DEVICE=cpu",
                             "seconds": 13.8, "tail": said + "1 failed"},
        "sampling": {"ok": True, "returncode": 0, "command": "python bench/bench_sampling.py", "tail": "fine"}}}
    text = gpu_check.markdown(report)
    assert "| test_tpu_support | False | 13.8 |" in text
    assert "test_tpu_support failed (exit code 1): python test_tpu_support.py DEVICE=cpu" in text
    assert "FAIL  loader: AssertionError: not pinned" in text and "1 failed" in text
    assert "PASS  check_0" not in text and "fine" not in text  # the last lines of the failed part alone


def test_the_folded_lockstep_bench_runs_and_its_table_reaches_the_gpu_checks_report(capsys):
    """bench_lockstep.py --folded (the GPU check's part): K models folded into one compute each member's own
    logits (the bench refuses a fold that does not) and time a step; its table is in the check's report, as
    the sampling bench's are."""
    import importlib.util

    loaded = {}
    for name in ("gpu_check", "bench_lockstep"):
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        loaded[name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(loaded[name])
    import torch

    threads, rng = torch.get_num_threads(), torch.get_rng_state()  # the bench sets one thread and seeds models
    try:
        assert loaded["bench_lockstep"].main(["--folded", "--models", "transformer++", "--batch", "2", "--packed",
                                              "2", "--repeats", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
        torch.set_rng_state(rng)
    printed = capsys.readouterr().out
    row = next(line for line in printed.splitlines() if line.startswith("| transformer++ | xs | 2 | 2 |"))
    sampled = "100 new tokens after a 16-token prompt, on cuda\nmodel  recompute tok/s\ntransformer  876"
    report = {"device": {"torch": "2.x"}, "parts": {"lockstep_folded": {"ok": True, "seconds": 3.0, "tail": printed},
                                                     "sampling_in_window": {"ok": True, "tail": "pip\n" + sampled}}}
    text = loaded["gpu_check"].markdown(report)
    assert row in text and sampled in text and "pip" not in text  # the sampling bench's table, from its header


def test_the_gpu_check_writes_each_part_as_it_ends(tmp_path, capsys):
    """A lent GPU machine's time runs out mid-check: what ended before must already be on disk and printed."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    report = {"device": {"torch": "2.x", "name": "NVIDIA H100"}}
    parts = gpu_check.PartsWrittenAsTheyEnd(tmp_path, report)
    parts["cuda_tests"] = {"ok": True, "returncode": 0, "command": "pytest -m cuda", "seconds": 46.0, "tail": "ok"}
    written = json.loads((tmp_path / "gpu_check.json").read_text())
    assert written["parts"]["cuda_tests"]["seconds"] == 46.0
    assert "| cuda_tests | True | 46.0 |" in (tmp_path / "gpu_check.md").read_text()
    assert "cuda_tests: ok=True in 46.0s" in capsys.readouterr().out


def test_a_failed_set_up_check_names_the_line_it_failed_on(monkeypatch, capsys):
    """Most of test_tpu_support.py's asserts carry no message: its FAIL line must say which one failed."""
    import test_tpu_support as setup_check

    def check_that_breaks():
        loader_pinned = False
        assert loader_pinned and 2 > 1

    monkeypatch.setattr(setup_check, "CHECKS", [check_that_breaks])
    assert setup_check.main(["DEVICE=cpu"]) == 1
    said = capsys.readouterr().out
    failed = [line for line in said.splitlines() if line.startswith("FAIL")]
    assert failed and failed[0].startswith("FAIL  that_breaks: AssertionError:")
    assert "line" in failed[0] and failed[0].endswith("assert loader_pinned and 2 > 1)")


def test_the_minimal_loop_takes_the_gpu_checks_own_sizes():
    """The GPU check hands bench/minimal_gpt.py its GPU sizes word for word, the recipe among them: the loop
    must take them (here at tiny widths, later settings winning) and refuse a recipe it does not build."""
    import importlib.util
    import json

    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "bench" / "gpu_check.py")
    gpu_check = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gpu_check)
    tiny = ["SEQ_LEN=16", "BATCH_SIZE=2", "TRANSFORMER.n_layer=1", "TRANSFORMER.n_embd=32", "TRANSFORMER.n_head=2",
            "STEPS=3"]
    proc = run_script("bench/minimal_gpt.py", "cpu", *gpu_check.GPU_SIZES, *tiny)
    measured = json.loads(proc.stdout.strip().splitlines()[-1])
    assert measured["steps"] == 3 and measured["tokens_per_second"] > 0
    refused = run_script("bench/minimal_gpt.py", "cpu", *tiny, "TRANSFORMER.recipe='++'", check=False)
    assert refused.returncode == 2
    assert "builds the 'gpt2' recipe alone" in refused.stderr
