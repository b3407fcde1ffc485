"""Experiment trackers: TensorBoard and W&B get exactly the numbers the run's own files hold."""

import importlib.abc
import json
import os
import struct
import sys

import pytest

from reservoir.config import ConfigError, parse_overrides
from reservoir.run.records import read_metrics
from tests.conftest import run_cli

TRACKED = ["MODELS=['ngram','transformer']", "MAX_STEPS=20", "EVAL_EVERY=10", "LOG_EVERY=5",
           "RUN_NAME=tracked"]


def _expected(run_dir, model):
    """{tag: {step: value}} from metrics.jsonl and train_log.jsonl for one model."""
    out = {}
    for file, tags in (("metrics.jsonl", {"val/bpc": "val_bpc", "val/loss": "val_loss"}),
                       ("train_log.jsonl", {"train/loss": "train_loss", "train/lr": "lr"})):
        for row in read_metrics(run_dir, file):
            if row["model"] == model:
                for tag, field in tags.items():
                    out.setdefault(tag, {})[row["step"]] = row[field]
    return out


def test_tensorboard_scalars_match_the_run_files(tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_cli(tmp_path, *TRACKED, "LOGGERS=['tensorboard']")
    run_dir = tmp_path / "results" / "tracked"
    for model in ("ngram", "transformer"):
        expected = _expected(run_dir, model)
        events = EventAccumulator(str(run_dir / "tb" / model / "seed1337"))
        events.Reload()
        for tag, by_step in expected.items():
            got = {e.step: e.value for e in events.Scalars(tag)}
            assert got == pytest.approx(by_step, rel=1e-6), (model, tag)
        assert events.Scalars("final/val_bpc")[0].value == pytest.approx(expected["val/bpc"][max(expected["val/bpc"])],
                                                                          rel=1e-6)
    assert sorted(_expected(run_dir, "transformer")["train/loss"]) == [5, 10, 15, 20]  # every LOG_EVERY read
    assert sorted(_expected(run_dir, "transformer")["val/bpc"]) == [10, 20]


def _wandb_records(path):
    """The protobuf records of a W&B .wandb file (LevelDB log format: 32 KiB blocks of framed chunks)."""
    from wandb.proto import wandb_internal_pb2

    raw, block, pos, pending, records = path.read_bytes(), 32768, 7, b"", []  # 7: W&B's file header
    assert raw[:4] == b":W&B"
    while pos + 7 <= len(raw):
        if block - pos % block < 7:  # a block's tail too short for a chunk header is padding
            pos += block - pos % block
            continue
        _crc, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        if kind == 0:
            break
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        pending = data if kind in (1, 2) else pending + data  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(pending)
            records.append(record)
    return records


def test_wandb_offline_run_holds_the_same_values(tmp_path):
    wandb = pytest.importorskip("wandb")
    run_cli(tmp_path, *TRACKED, "LOGGERS=['wandb']", "WANDB_PROJECT=tracking-test",
            env={"WANDB_MODE": "offline", "WANDB_SILENT": "true"})
    # the run went on in this process, and W&B's service process writes the files behind it: stopped, it has
    # written them whole, as when a run's own process ends (read at once, a file was once its header alone)
    wandb.teardown()
    run_dir = tmp_path / "results" / "tracked"
    files = sorted((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 2  # one W&B run per model (and seed)
    for path in files:
        records = _wandb_records(path)
        kinds = [r.WhichOneof("record_type") for r in records]
        assert "run" in kinds, (path, path.stat().st_size, kinds)  # what the file held, should a run lack it
        run = next(r.run for r in records if r.WhichOneof("record_type") == "run")
        assert run.project == "tracking-test" and run.run_group == "tracked"
        config = {item.key: json.loads(item.value_json) for item in run.config.update}
        model = config["model"]["value"] if isinstance(config["model"], dict) else config["model"]
        got = {}
        for record in records:
            if record.WhichOneof("record_type") == "history":
                row = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                       for item in record.history.item}
                for tag, value in row.items():
                    if "/" in tag and not tag.startswith("_"):
                        got.setdefault(tag, {})[row["step"]] = value
        expected = _expected(run_dir, model)
        for tag, by_step in expected.items():
            assert got[tag] == pytest.approx(by_step, rel=1e-9), (model, tag)


class _Hide(importlib.abc.MetaPathFinder):
    """Makes ``import wandb`` fail, as on a machine without the package."""

    def find_spec(self, name, path=None, target=None):
        if name == "wandb" or name.startswith("wandb."):
            raise ModuleNotFoundError("No module named 'wandb'", name=name)
        return None


def test_missing_wandb_package_is_a_one_line_error_at_start(monkeypatch):
    from reservoir.run.tracking import TrackingError, check_available

    for name in [m for m in sys.modules if m == "wandb" or m.startswith("wandb.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [_Hide(), *sys.meta_path])
    with pytest.raises(TrackingError, match="pip install wandb"):
        check_available(["wandb"])
    check_available(["csv"])  # the run's own files need nothing


def test_wandb_without_login_fails_before_any_work(tmp_path):
    pytest.importorskip("wandb")
    env = {k: v for k, v in os.environ.items() if not k.startswith("WANDB_")}
    env.update(HOME=str(tmp_path / "home"), WANDB_CONFIG_DIR=str(tmp_path / "wandb-config"))  # no netrc, no key
    proc = run_cli(tmp_path, *TRACKED, "LOGGERS=wandb", env=env, check=False, replace_env=True)
    assert proc.returncode != 0
    assert "wandb login" in proc.stderr and "WANDB_MODE=offline" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "results").exists() and not (tmp_path / "cache").exists()  # stopped before data and run


def test_unknown_logger_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown logger 'tensorbord'"):
        parse_overrides(["LOGGERS=tensorbord"])
    assert parse_overrides(["LOGGERS=tensorboard,wandb"])["LOGGERS"] == ["tensorboard", "wandb"]
