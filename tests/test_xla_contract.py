"""The XLA contract on real torch_xla (XLA:CPU): the runner end to end, zero recompiles
after warm-up per model, SPMD = one device, bf16, gradient checkpointing, the
launcher and the persistent compile cache. Every scenario runs in a fresh process."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from tests.conftest import ROOT

pytestmark = pytest.mark.xla

TINY = ["DATASET=synthetic", "SYNTHETIC_STORIES=200", "SEQ_LEN=16", "BATCH_SIZE=4", "EVAL_TOKENS=256",
        "FINAL_EVAL_TOKENS=512", "TRAIN_EVAL_TOKENS=256", "TIME_BUDGET_S=None", "SAMPLE_TOKENS=8", "ESN.units=32",
        "LSTM.hidden=32", "TRANSFORMER.n_layer=1", "TRANSFORMER.n_embd=32", "WARMUP_STEPS=2"]

# Device executions per training step after warm-up (tests/xla_probe.py): 1 for gradient-trained
# models (the step marker), 2 for ridge fits (the chunk's features and state, then XᵀX/XᵀY off the
# device), 0 for the host-side n-gram. README_TPU.md has the table with the warm-up graph counts.
EXPECTED = {"transformer": 1, "lstm": 1, "linear_reservoir": 1, "deep_linear_reservoir": 1, "frozen_retention": 1,
            "reservoir_attention": 1,
            "esn": 2, "deep_esn": 2, "nvar": 2, "ngram": 0}


def python(args, env=None, timeout=1800):
    # a timeout catches a hang, not a slow host: tests/xla_probe.py deep_esn ran 16 min (13 s of it compiling)
    # on a 2-core host where the quick suite took 42 min, and 600 s failed it there
    env = {**os.environ, "PJRT_DEVICE": "CPU", **(env or {})}
    proc = subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True, env=env,
                          timeout=timeout)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def runner(tmp_path, *args, env=None):
    return python(["TinyStories.py", *TINY, f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'c'}",
                   "PLOTS=False", *args], env=env)


def summary(tmp_path, run):
    return {r["model"]: r for r in json.loads((tmp_path / "results" / run / "summary.json").read_text())}


def test_tiny_run_with_use_tpu_completes_on_xla(tmp_path):
    proc = runner(tmp_path, "USE_TPU=True", "MODELS=['ngram','esn','lstm','transformer']", "MAX_STEPS=4",
                  "EVAL_EVERY=2", "CHECKPOINT_EVERY=2", "RUN_NAME=x")
    assert "TPU code path" in proc.stdout
    config = json.loads((tmp_path / "results" / "x" / "config.json").read_text())
    assert config["device"]["kind"] == "tpu" and config["device"]["precision"] == "bf16"
    assert config["effective_config"]["BATCH_SIZE"] == 8  # the TPU batch multiplier
    assert config["versions"]["torch_xla"]
    records = summary(tmp_path, "x")
    assert set(records) == {"ngram", "esn", "lstm", "transformer"}
    assert all(0 < r["val_bpc"] < 8 and r["device_kind"] == "tpu" for r in records.values())
    ckpt = torch.load(tmp_path / "results" / "x" / "checkpoints" / "transformer.pt", weights_only=True)
    assert all(t.device.type == "cpu" for t in ckpt["model_state"].values())


def test_scanned_recurrences_match_the_cpu_forms():
    """On XLA the LSTM and the reservoirs loop over time with torch_xla's scan (one compiled cell, traced
    once per mode); on the CPU, nn.LSTM's fused kernel and a Python loop. Same weights, fp32: logits within
    1e-5, gradients within 1e-6 (after an evaluation without gradients), reservoir states within 1e-5."""
    script = textwrap.dedent("""
        import sys, json, torch
        sys.path.insert(0, ".")
        from reservoir.config import parse_overrides
        from reservoir.platform import device as dev
        from reservoir.models import build_model
        config = parse_overrides(["TIME_BUDGET_S=1", "LSTM.layers=2", "LSTM.hidden=48", "LSTM.embed_dim=16",
                                  "ESN.units=64", "DEEP_ESN.units=32"])
        info = dev.select_device({"DEVICE": "tpu", "PRECISION": "fp32"})
        ids = torch.randint(0, 40, (3, 64), generator=torch.Generator().manual_seed(0))
        out = {}
        cpu, xla = build_model("lstm", 40, config), build_model("lstm", 40, config)
        xla.to(info.device).use_time_scan(dev.time_scan(info))
        with torch.no_grad():  # the cell traced without gradients first: training must not reuse that trace
            xla(ids.to(info.device))
        logits_cpu, logits_xla = cpu(ids), xla(ids.to(info.device))
        logits_cpu.logsumexp(-1).mean().backward()
        logits_xla.logsumexp(-1).mean().backward()
        dev.mark_step(info)
        out["logits"] = float((logits_xla.cpu() - logits_cpu).abs().max())
        out["grads"] = max(float((a.grad.cpu() - b.grad).abs().max()) for a, b in
                           zip(xla.parameters(), cpu.parameters()))
        for name in ("esn", "deep_esn"):
            cpu, xla = build_model(name, 40, config), build_model(name, 40, config)
            xla.to(info.device).use_time_scan(dev.time_scan(info))
            states_cpu = cpu.features(ids)
            states_xla = xla.features(ids.to(info.device)).cpu()
            out[name] = float((states_xla - states_cpu).abs().max())
        print(json.dumps(out))
    """)
    result = json.loads(python(["-c", script]).stdout.strip().splitlines()[-1])
    assert result["logits"] < 1e-5 and result["grads"] < 1e-6, result
    assert result["esn"] < 1e-5 and result["deep_esn"] < 1e-5, result


FOLDED_GROUP = textwrap.dedent("""
    import sys, json, tempfile
    sys.path.insert(0, ".")
    from pathlib import Path
    from reservoir.config import parse_overrides
    from reservoir.data.tokens import prepare_data
    from reservoir.models import build_model
    from reservoir.platform import device as dev
    from reservoir.run.group import fit_group
    from reservoir.run.writer import Run
    from reservoir.studies.frontier.folding import _folds
    from reservoir.studies.frontier.grid import FAMILIES, Cell

    members, family = int(sys.argv[1]), sys.argv[2]
    one_seed = _folds(family, "xs", 2, True) == "seed"  # a frozen draw that is its seed's: members of one seed fold
    base = [*Cell(family, "xs", 1e-3, 2).settings(), "USE_TPU=True", "DATASET=synthetic",
            "SYNTHETIC_STORIES=200", "SEQ_LEN=16", "EVAL_TOKENS=128", "FINAL_EVAL_TOKENS=256", "TIME_BUDGET_S=None",
            "CHECKPOINT_EVERY_S=0", "WARMUP_STEPS=2", "LR_SCHEDULE=cosine", "EVAL_EVERY=2", "CHECKPOINT_EVERY=2",
            f"CACHE_DIR={tempfile.mkdtemp()}"]
    info = dev.select_device(parse_overrides(base))
    data = prepare_data(parse_overrides(base))

    def group(steps, log_every, members):
        configs = [parse_overrides([*base, f"MAX_STEPS={steps}", f"LOG_EVERY={log_every}",
                                    f"SEED={0 if one_seed else s}", f"LEARNING_RATE={1e-3 * (s + 1)}"])
                   for s in range(members)]
        runs = [Run(Path(tempfile.mkdtemp()), info) for _ in configs]
        models = [build_model(FAMILIES[family][0], data.tokenizer.vocab_size, c) for c in configs]
        return fit_group(FAMILIES[family][0], models, [data] * members, configs, info, runs)

    start = dev.xla_compile_count()
    group(3, 1, members)  # the warm-up: xla_probe.py's first fit
    warm = dev.xla_compile_count()
    outcomes = group(8, 3, members)  # the second, longer fit, with evaluations and checkpoints between
    print(json.dumps({"warmup_compiles": warm - start, "compiles_after_warmup": dev.xla_compile_count() - warm,
                      "folded_with": [o.extra.get("folded_with") for o in outcomes]}))
""")


@pytest.mark.parametrize("family", ["transformer++", "lstm", "reservoir_attention+write"])
def test_a_folded_group_compiles_once_for_its_members_and_never_after_warm_up(family):
    """Four points folded (reservoir/run/group.py) through the real loop on XLA, with evaluations and
    checkpoints: after the warm-up nothing compiles again, and the group compiles at least 3x fewer graphs than
    its four points would one at a time (each point its own process, as a study runs them). Transformer++'s
    and the LSTM's (its cell through the device's scan) members differ in seed; the reservoir's (a learned
    position table, a write gate, a frozen draw) share one."""
    group = json.loads(python(["-c", FOLDED_GROUP, "4", family]).stdout.strip().splitlines()[-1])
    alone = json.loads(python(["-c", FOLDED_GROUP, "1", family]).stdout.strip().splitlines()[-1])
    assert group["folded_with"] == [4] * 4 and alone["folded_with"] == [None], (group, alone)
    assert group["compiles_after_warmup"] == 0 and alone["compiles_after_warmup"] == 0, (group, alone)
    assert 3 * group["warmup_compiles"] <= 4 * alone["warmup_compiles"], (group, alone)


def test_warm_up_is_not_charged_to_the_time_budget(tmp_path):
    """A budget shorter than compilation still trains: warm-up is timed apart and reported."""
    proc = runner(tmp_path, "USE_TPU=True", "MODELS=['lstm']", "TIME_BUDGET_S=0.2", "RUN_NAME=warm")
    record = summary(tmp_path, "warm")["lstm"]
    assert record["train_steps"] > 2 and record["train_seconds"] < 5  # trained after warm-up, for its budget
    assert record["compile_over_budget"] and record["fit"]["warmup_seconds"] > 0.2 and record["compile_seconds"] > 0
    assert "not charged: the budget counts training after warm-up" in proc.stderr
    assert "compile s" in proc.stdout and "* warm-up (compilation) took longer" in proc.stdout


# the models in two processes, one after another in each: a process spends 8 s importing torch_xla before it probes
PROBED_TOGETHER = [sorted(EXPECTED)[0::2], sorted(EXPECTED)[1::2]]


@pytest.mark.parametrize("models", PROBED_TOGETHER, ids=["+".join(m) for m in PROBED_TOGETHER])
def test_no_recompilation_after_warmup_and_one_execution_per_step(models):
    said = python(["tests/xla_probe.py", ",".join(models)]).stdout.splitlines()
    results = {r["model"]: r for r in map(json.loads, (line for line in said if line.startswith('{"model"')))}
    assert list(results) == models
    for model, result in results.items():
        assert result["compiles_after_warmup"] == 0, result
        assert result["traces_after_warmup"] == 0, result  # scanned cells traced in warm-up only
        assert result["executions_per_step"] == EXPECTED[model], result
        assert result["warmup_compiles"] > 0 or model == "ngram", result  # each model's own graphs, counted


@pytest.mark.parametrize("model, options", [
    ("frozen_retention", ["FROZEN_RETENTION.train_recurrence=True", "FROZEN_RETENTION.conv_width=4",
                          "FROZEN_RETENTION.write_gate=True"]),
    ("deep_linear_reservoir", ["DEEP_LINEAR_RESERVOIR.train_recurrence=True"]),
    ("reservoir_attention", ["RESERVOIR_ATTENTION.train_recurrence=True"]),
    ("transformer", ["TRANSFORMER.recipe=++", "TRANSFORMER.qk_norm=True"]),
    ("esn", ["ESN.readout=softmax"]),
])
def test_the_reservoir_push_options_compile_once_too(model, options):
    """The unfrozen control, the short convolution, the write gate, Transformer++ (rotary positions, SwiGLU,
    RMSNorm, qk-norm) and an ESN readout trained on harvested features (each chunk of streams one graph, its
    batches drawn by index): their graphs settle in warm-up."""
    result = json.loads(python(["tests/xla_probe.py", model, *options]).stdout.strip().splitlines()[-1])
    assert result["options"] == options and result["compiles_after_warmup"] == 0, result
    gradient = "ESN.readout=softmax" in options  # a step marker a step; a chunk's features once per many steps
    assert result["executions_per_step"] == (1 if gradient else EXPECTED[model]), result


def test_tracking_adds_no_device_execution_to_the_step():
    """Loss read every step: with TensorBoard tracking the step executes exactly as often as without."""
    runs = {track: json.loads(python(["tests/xla_probe.py", "transformer", "--track", track]).stdout.splitlines()[-1])
            for track in ("none", "tensorboard")}
    assert runs["tensorboard"]["executions_per_step"] == runs["none"]["executions_per_step"], runs
    assert runs["tensorboard"]["compiles_after_warmup"] == 0, runs


@pytest.mark.parametrize("breakage", ["item", "dynamic"])
def test_the_probe_catches_a_host_sync_or_a_dynamic_shape(breakage):
    # a shape that changes every step compiles every step: the fits that count executions would only repeat that,
    # and two steps after warm-up show it
    only = ["--compiles-only", "--after-steps", "2"] if breakage == "dynamic" else []
    proc = python(["tests/xla_probe.py", "transformer", "--inject", breakage, *only])
    result = json.loads(proc.stdout.splitlines()[-1])
    if breakage == "item":
        assert result["executions_per_step"] > EXPECTED["transformer"], result
    else:
        assert result["compiles_after_warmup"] > 0, result


def test_one_spmd_step_equals_one_device_on_the_full_batch(tmp_path):
    common = ["MODELS=['transformer']", "MAX_STEPS=1", "PRECISION=fp32", "TPU_BATCH_MULTIPLIER=1",
              "TPU_LR_MULTIPLIER=1", "SAMPLE_TOKENS=1", "WARMUP_STEPS=0"]
    proc = runner(tmp_path, *common, "USE_TPU=True", "TPU_PARALLEL=spmd", "BATCH_SIZE=4", "RUN_NAME=spmd",
                  env={"CPU_NUM_DEVICES": "2"})
    assert "SPMD over 2 devices" in proc.stdout
    runner(tmp_path, *common, "DEVICE=cpu", "BATCH_SIZE=8", "RUN_NAME=one")
    config = json.loads((tmp_path / "results" / "spmd" / "config.json").read_text())
    assert config["device"]["spmd_devices"] == 2 and config["device"]["global_batch"] == 8
    spmd = torch.load(tmp_path / "results" / "spmd" / "checkpoints" / "transformer.pt", weights_only=True)
    one = torch.load(tmp_path / "results" / "one" / "checkpoints" / "transformer.pt", weights_only=True)
    moved = 0
    for name, weight in one["model_state"].items():
        torch.testing.assert_close(spmd["model_state"][name], weight, atol=2e-5, rtol=1e-4)
        moved += 1
    # every tensor compared (a 1-layer Transformer++, the default recipe, has 9: no biases, no position table)
    assert moved == len(spmd["model_state"]) > 5
    assert summary(tmp_path, "spmd")["transformer"]["val_loss"] == pytest.approx(
        summary(tmp_path, "one")["transformer"]["val_loss"], rel=1e-4)


def test_launcher_runs_the_experiment_in_a_launched_process(tmp_path):
    proc = runner(tmp_path, "USE_TPU=True", "TPU_PARALLEL=launch", "MODELS=['lstm']", "MAX_STEPS=2", "RUN_NAME=l")
    assert "Core 0/1" in proc.stdout and "one process per TPU chip" in proc.stdout
    assert summary(tmp_path, "l")["lstm"]["train_steps"] == 2
    # RESUME is resolved before deciding to launch: a resumed 'launch' run launches again, in the same folder
    resumed = python(["TinyStories.py", f"RESULTS_DIR={tmp_path / 'results'}", "RESUME=l"])
    assert "one process per TPU chip (torch_xla.launch), results in" in resumed.stdout
    assert "lstm: finished" in resumed.stdout


def test_persistent_compile_cache_is_written_and_looked_up_by_a_second_process(tmp_path):
    """XLA_CACHE_DIR reaches torch_xla: the first process writes every graph, the second
    looks every one up. torch_xla 2.9 then fails to deserialize them (pytorch/xla#9094,
    also on TPU; fix pending upstream), so the second run still compiles: this asserts
    the wiring, and fails loudly the day hits start (update README_TPU.md then)."""
    script = (
        "import sys; sys.path.insert(0, '.');"
        "import torch, torch_xla.debug.metrics as met;"
        "from reservoir.platform import device as dev;"
        f"info = dev.select_device({{'USE_TPU': True, 'XLA_CACHE_DIR': r'{tmp_path / 'xla'}'}});"
        "m = torch.nn.Linear(8, 8).to(info.device); y = (m(torch.ones(4, 8, device=info.device)) ** 2).sum();"
        "y.backward(); dev.mark_step(info);"
        "print(*(int(met.counter_value(n) or 0) for n in "
        "('PersistentCacheMiss', 'PersistentCacheHit', 'PersistentCacheDeserializeFailure')))")
    miss, hit, failed = map(int, python(["-c", script]).stdout.split()[-3:])
    assert miss > 0 and hit == failed == 0
    assert len(list((tmp_path / "xla" / "process0").iterdir())) == miss  # one file per graph, per process
    miss2, hit2, failed2 = map(int, python(["-c", script]).stdout.split()[-3:])
    assert miss2 == 0 and hit2 + failed2 == miss  # every graph found on disk
    assert failed2 == miss, "torch_xla now reads its cache back: say so in README_TPU.md and assert hits"


CHECKPOINTED = ("transformer", "lstm", "linear_reservoir", "deep_linear_reservoir", "frozen_retention",
                "reservoir_attention")  # every model whose heavy parts use_gradient_checkpointing reaches


def test_bf16_and_gradient_checkpointing_on_xla():
    script = r"""
import sys; sys.path.insert(0, '.')
import copy, json, torch
from torch.nn import functional as F
from reservoir.config import parse_overrides
from reservoir.platform import device as dev
from reservoir.models import build_model
config = parse_overrides(['USE_TPU=True', 'TRANSFORMER.n_layer=2', 'TRANSFORMER.n_embd=32', 'SEQ_LEN=16',
                          'LINEAR_RESERVOIR.units=16', 'LSTM.hidden=32',
                          'DEEP_LINEAR_RESERVOIR.units=16', 'DEEP_LINEAR_RESERVOIR.width=24',
                          'DEEP_LINEAR_RESERVOIR.dropout=0.0', 'FROZEN_RETENTION.layers=2',
                          'FROZEN_RETENTION.width=32', 'RESERVOIR_ATTENTION.units=16',
                          'RESERVOIR_ATTENTION.width=32'])
info = dev.select_device(config)
assert info.is_xla and info.precision == 'bf16'
ids = torch.randint(0, 40, (4, 16)).to(info.device)
out = {}
for name in json.loads(sys.argv[1]):
    plain = build_model(name, 40, config).to(info.device)
    ckpt = copy.deepcopy(plain)
    ckpt.use_gradient_checkpointing(dev.checkpoint_function(info))
    grads = []
    for model in (plain, ckpt):
        loss = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
        loss.backward()
        dev.mark_step(info)
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]).cpu())
    out[name + '_ckpt_max_diff'] = float((grads[0] - grads[1]).abs().max())
    out[name + '_grad_norm'] = float(grads[0].norm())
model = build_model('transformer', 40, config).to(info.device)
with torch.no_grad():
    full = F.cross_entropy(model(ids[:, :-1]).flatten(0, 1), ids[:, 1:].flatten())
    with dev.autocast(info):
        logits = model(ids[:, :-1])
    half = F.cross_entropy(logits.float().flatten(0, 1), ids[:, 1:].flatten())
out['bf16_dtype'] = str(logits.dtype)
out['fp32_loss'], out['bf16_loss'] = float(full), float(half)
print(json.dumps(out))
"""
    out = json.loads(python(["-c", script, json.dumps(CHECKPOINTED)]).stdout.strip().splitlines()[-1])
    for name in CHECKPOINTED:
        assert out[name + "_grad_norm"] > 0
        assert out[name + "_ckpt_max_diff"] <= 1e-5 * max(1.0, out[name + "_grad_norm"]), out
    assert out["bf16_dtype"] == "torch.bfloat16"
    assert out["bf16_loss"] == pytest.approx(out["fp32_loss"], rel=2e-2)
    assert out["bf16_loss"] != out["fp32_loss"]  # bf16 really ran


def test_transformer_weights_stay_tied_on_xla():
    script = ("import sys; sys.path.insert(0, '.');"
              "from reservoir.config import parse_overrides; from reservoir.platform import device as dev;"
              "from reservoir.models import build_model;"
              "info = dev.select_device({'USE_TPU': True});"
              "m = build_model('transformer', 40, parse_overrides(['TRANSFORMER.n_embd=32'])).to(info.device);"
              "print(m.head.weight is m.tok.weight, sum(p.numel() for p in m.parameters()))")
    tied, count = python(["-c", script]).stdout.split()
    sys.path.insert(0, str(ROOT))
    from reservoir.config import parse_overrides
    from reservoir.models import build_model

    on_cpu = build_model("transformer", 40, parse_overrides(["TRANSFORMER.n_embd=32"]))
    assert tied == "True" and int(count) == sum(p.numel() for p in on_cpu.parameters())
    # the random transformer stays untied on XLA, its blocks frozen and its embeddings trained
    random = script.replace("'TRANSFORMER.n_embd=32'", "'TRANSFORMER.n_embd=32', 'TRANSFORMER.trained=embeddings'")
    random = random.replace("sum(p.numel() for p in m.parameters())",
                            "sorted(n for n, p in m.named_parameters() if p.requires_grad)")
    tied, trained = python(["-c", random]).stdout.split(" ", 1)
    assert tied == "False" and trained.strip() == "['head.weight', 'tok.weight']"


def test_a_two_worker_frontier_on_xla_runs_each_group_in_its_own_process_folded_by_default(tmp_path):
    """WORKERS='auto' and POINTS_PER_DEVICE='auto' (the defaults) on XLA:CPU: a process per usable core, each on
    the XLA path, and a stage's points of one shape folded into one of them (one compile for the group);
    POINTS_PER_DEVICE=probe, which times folds on a CPU core, is one line there before anything is written."""
    from reservoir.platform.machine import usable_cores
    from reservoir.studies.budgets import point_name
    from tests.conftest import run_in_process

    if usable_cores() < 2:
        pytest.skip("needs two usable cores")
    study = ["FRONTIER=True", "STUDY=xla", "USE_TPU=True", "FAMILIES=lstm,transformer++", "SIZES=xs",
             "LEARNING_RATES=2e-3,4e-3", "BATCH_SIZES=4", "BUDGETS=3e9,6e9", "MIN_STEPS=20",
             "MAX_TOKENS_PER_PARAM=1e9", "ENVELOPE_SEEDS=1", "KEEP=1", "WITHIN=0",
             *[s for s in TINY if not s.startswith("BATCH_SIZE")],
             f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'c'}"]
    refused = run_in_process("scaling.py", [*study, "POINTS_PER_DEVICE=probe"], env={"PJRT_DEVICE": "CPU"})
    assert refused.returncode != 0 and "a TPU chip is held by its points' processes" in refused.stderr
    assert "Traceback" not in refused.stderr and not (tmp_path / "results" / "xla").exists()
    proc = python(["scaling.py", *study])
    # each family's two rates as one process at the first budget, side by side; the better one carried on (KEEP=1)
    assert "points folded, 2 members at most to a process" in proc.stdout and "=auto), in 2 groups" in proc.stdout
    assert proc.stdout.count("started ") == 4 and "on xla:cpu" in proc.stdout, proc.stdout[-3000:]
    points = sorted((tmp_path / "results" / "xla").glob("*-xs-*/flops-*/summary.json"))
    assert len(points) == 6
    for point in points:
        (record,) = json.loads(point.read_text())
        assert record["device_kind"] == "tpu" and record["point_device"] == "xla:cpu" and record["val_bpc"] > 0
        assert record["fit"].get("folded_with") == (2 if point.parent.name == point_name(3e9) else None)
    assert (tmp_path / "results" / "xla" / "frontier.json").exists()
