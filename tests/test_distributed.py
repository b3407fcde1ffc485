"""torchrun / DistributedDataParallel with 2 gloo processes on the CPU: the same training
and the same ridge fit as one process on the concatenated batch; only rank 0 writes."""

import json
import os
import subprocess
import sys

import pytest
import torch

from reservoir.platform.device import DeviceInfo, build_loader
from tests.conftest import ROOT, run_script

COMMON = ["DATASET=synthetic", "SYNTHETIC_STORIES=300", "SEQ_LEN=32", "EVAL_TOKENS=2048", "TIME_BUDGET_S=None",
          "MAX_STEPS=3", "SAMPLE_TOKENS=5", "ESN.units=64", "ESN.ridge=1.0",  # well conditioned: the sums' order
          "TRANSFORMER.n_layer=1", "TRANSFORMER.n_embd=32",  # moves its solution by less than the tolerance
          "MODELS=['esn','transformer']", "WARMUP_STEPS=0", "PLOTS=False", "CHECKPOINT_EVERY=2"]


def launch(tmp_path, prefix, *args):
    cmd = [*prefix, str(ROOT / "TinyStories.py"), *COMMON, f"RESULTS_DIR={tmp_path / 'results'}",
           f"CACHE_DIR={tmp_path / 'cache'}", *args]
    env = {k: v for k, v in os.environ.items() if k not in ("PJRT_DEVICE", "WORLD_SIZE", "RANK")}
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc


def test_ddp_with_two_gloo_processes_equals_one_process_on_the_whole_batch(tmp_path):
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    proc = launch(tmp_path, torchrun, "BATCH_SIZE=4", "RUN_NAME=ddp")
    run_script("TinyStories.py", *COMMON, f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'cache'}",
               "BATCH_SIZE=8", "RUN_NAME=one")  # the same in this process: torchrun's processes are the subject
    assert "Rank 0/2" in proc.stdout and "Rank 1/2" not in proc.stdout  # only rank 0 speaks
    assert proc.stdout.count("results:") == 1
    assert proc.stdout.count("trained char tokenizer") == 1  # rank 0 prepares the data, rank 1 reads it
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == ["ddp", "one"]  # rank 1 made no folder
    config = json.loads((tmp_path / "results" / "ddp" / "config.json").read_text())
    assert config["device"]["world_size"] == 2 and config["device"]["per_device_batch"] == 4
    assert config["device"]["global_batch"] == 8
    ddp, one = ({r["model"]: r for r in json.loads((tmp_path / "results" / run / "summary.json").read_text())}
                for run in ("ddp", "one"))
    for name in ("esn", "transformer"):  # the ridge statistics are summed across ranks before the solve
        assert ddp[name]["train_tokens"] == one[name]["train_tokens"]
        assert ddp[name]["val_loss"] == pytest.approx(one[name]["val_loss"], rel=1e-4), name
    weights = [torch.load(tmp_path / "results" / run / "checkpoints" / "transformer.pt", weights_only=True)
               for run in ("ddp", "one")]
    for key, value in weights[1]["model_state"].items():
        torch.testing.assert_close(weights[0]["model_state"][key], value, atol=1e-5, rtol=1e-4)
    ridge = [torch.load(tmp_path / "results" / run / "checkpoints" / "esn.pt", weights_only=True)["model_state"]
             for run in ("ddp", "one")]
    torch.testing.assert_close(ridge[0]["w_out"], ridge[1]["w_out"], atol=1e-4, rtol=1e-3)


def test_each_rank_reads_a_disjoint_shard():
    data = torch.arange(40)
    seen = []
    for rank in range(2):
        info = DeviceInfo("cpu", torch.device("cpu"), "cpu", "fp32", world_size=2, rank=rank)
        seen.append(torch.cat(list(build_loader(data, info, batch_size=4, shuffle=False))).tolist())
    assert not set(seen[0]) & set(seen[1])
    assert sorted(seen[0] + seen[1]) == list(range(40))
