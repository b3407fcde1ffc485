"""export.py and the exported folder: every family and a plugin's loaded back bit for bit, in a fresh process and by
every script that takes a run folder; the card is the record; every damaged or foreign file is one line; the Hub
only through huggingface_hub (its offline cache here, and the upload at HfApi's boundary); nothing unpickled."""

import hashlib
import json
import pickle
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from reservoir.config import parse_overrides
from reservoir.platform.files import current_umask
from reservoir.platform.messages import OneLineError
from reservoir.run.records import signed
from reservoir.run.trained import load_trained as load_run
from reservoir.share import ExportError, Pretrained, load_trained
from reservoir.share.card import training_command
from reservoir.share.folder import WEIGHTS, read_tensors
from tests.conftest import ALL_MODELS, ROOT, _forget_plugins, _plugin_state, run_cli, run_script
from tests.test_plugins import worked_family

SEPARATOR = "\n" + "-" * 40 + "\n"
INPUT = torch.arange(48).remainder(20).view(2, 24)


def export(run, model, to, *more, check=True):
    return run_script("export.py", run, f"MODEL={model}", f"TO={to}", *more, check=check)


@pytest.fixture(scope="module")
def exports(every_model_run, tmp_path_factory) -> dict[str, Path]:
    """Every built-in family of the shared run, exported once."""
    folder = tmp_path_factory.mktemp("exports")
    for model in ALL_MODELS:
        export(every_model_run, model, folder / model, "LICENSE=mit")
    return {model: folder / model for model in ALL_MODELS}


def logits_of(model) -> torch.Tensor:
    with torch.no_grad():
        return model.eval()(INPUT)


LOAD_IN_A_FRESH_PROCESS = """
import sys
from pathlib import Path
import torch
from safetensors.torch import save_file
sys.path.insert(0, sys.argv[1])
from reservoir.share import Pretrained
out = {}
with torch.no_grad():
    for folder in sys.argv[3:]:
        out[Path(folder).name] = Pretrained.from_pretrained(folder)(torch.arange(48).remainder(20).view(2, 24))
save_file({name: logits.contiguous() for name, logits in out.items()}, sys.argv[2])
"""


def fresh_process_logits(tmp_path, folders) -> dict:
    out = tmp_path / "logits.safetensors"
    subprocess.run([sys.executable, "-c", LOAD_IN_A_FRESH_PROCESS, str(ROOT), str(out), *map(str, folders)],
                   cwd=ROOT, check=True, capture_output=True, text=True, timeout=300)
    return read_tensors(out)[0]


def test_every_family_loads_from_its_export_in_a_fresh_process_with_the_runs_logits(every_model_run, exports,
                                                                                    tmp_path):
    loaded = fresh_process_logits(tmp_path, exports.values())
    for model in ALL_MODELS:
        assert torch.equal(loaded[model], logits_of(load_run(every_model_run, model)[0])), model
        assert sorted(p.name for p in exports[model].iterdir()) == ["README.md", "config.json", "model.safetensors",
                                                                    "tokenizer.json"]


def test_an_export_holds_every_tensor_the_model_reads_and_says_which_are_frozen(every_model_run, exports):
    for model in ALL_MODELS:
        trained = load_run(every_model_run, model)[0]
        config = json.loads((exports[model] / "config.json").read_text())
        tensors = read_tensors(exports[model] / WEIGHTS)[0]
        names = {name.partition("/")[0] for name in tensors}
        assert names == set(trained.state_dict()), model
        learned = {p.data_ptr() for p in trained.parameters() if p.requires_grad}
        frozen = {n for n, t in trained.state_dict().items() if isinstance(t, torch.Tensor)
                  and t.data_ptr() not in learned and n not in ("w_out",)}  # a ridge readout is fitted, not frozen
        assert set(config["frozen"]) <= frozen, model
        assert config["parameters"]["frozen"] == trained.param_counts()["params_total"] - \
            trained.param_counts()["params_trainable"]
    esn = json.loads((exports["esn"] / "config.json").read_text())
    assert {"reservoir.w", "reservoir.w_in"} <= set(esn["frozen"])  # the drawn matrices travel, not their seed
    assert json.loads((exports["transformer"] / "config.json").read_text())["frozen"] == []  # a tied head is trained


def test_sample_on_an_export_writes_the_stories_of_its_run_folder(every_model_run, exports):
    for model in ALL_MODELS:
        from_run = run_script("sample.py", every_model_run, f"MODEL={model}", "NUM_SAMPLES=2", "SEED=7")
        from_export = run_script("sample.py", exports[model], "NUM_SAMPLES=2", "SEED=7")
        assert from_export.stdout == from_run.stdout and from_run.stdout.count(SEPARATOR) >= 1, model
    summary = {r["model"]: r for r in json.loads((every_model_run / "summary.json").read_text())}
    written = run_script("sample.py", exports["lstm"], "STOP_AT_END=True").stdout.rstrip("\n").split(SEPARATOR)
    assert written == [s["text"] for s in summary["lstm"]["samples"]]  # the run's own samples, from the export


def test_the_card_states_the_record_and_the_command_that_trains_it_again(every_model_run, exports):
    from huggingface_hub import metadata_load

    summary = {r["model"]: r for r in json.loads((every_model_run / "summary.json").read_text())}
    for model in ("lstm", "esn", "transformer"):
        record, card = summary[model], (exports[model] / "README.md").read_text()
        stated = metadata_load(exports[model] / "README.md")
        for key in ("val_bpc", "val_bpc_ci95", "train_flops", "train_tokens", "epochs", "params_trainable",
                    "params_total"):
            assert stated["reservoir_nlp"][key] == record[key], (model, key)
        assert stated["model-index"][0]["results"][0]["metrics"][0]["value"] == record["val_bpc"]
        assert stated["license"] == "mit" and stated["library_name"] == "reservoir-nlp"
        assert f"**{record['val_bpc']:.4f}** ± {record['val_bpc_ci95']:.4f}" in card
        assert f", trained part: {record['trained']}." in card  # was "trained: trained everything", "a lstm"
        assert " a lstm " not in card and " a esn " not in card and "trained trained" not in card
        run = json.loads((every_model_run / "config.json").read_text())
        assert run["data"]["train_sha256"] in card and run["versions"]["torch"] in card
        assert run["device"]["processor"] in card
        command = next(line for line in card.splitlines() if line.startswith("python TinyStories.py"))
        again = parse_overrides(shlex.split(command)[2:])
        effective = run["effective_config"]
        assert again["MODELS"] == [model] and again["SEED"] == record["seed"]
        for key in ("SEQ_LEN", "MAX_STEPS", "BATCH_SIZE", "LEARNING_RATE", "DATASET", "WARMUP_STEPS", model.upper()):
            assert again[key] == effective[key], (model, key)
    assert command == training_command(run["requested_config"], "transformer", 1337)


@pytest.mark.slow  # a run of its own: the slow suite, keeping the quick one within 5 minutes
def test_compare_on_an_export_gives_its_run_folders_paired_result(tmp_path):
    run_cli(tmp_path, "MODELS=['lstm','ngram']", "MAX_STEPS=20", "RUN_NAME=r")
    run = tmp_path / "results" / "r"
    export(run, "lstm", tmp_path / "lstm")
    reports = []
    for side in (f"{run}:lstm", str(tmp_path / "lstm")):
        out = tmp_path / f"{len(reports)}.json"
        run_script("compare.py", side, f"{run}:ngram", f"OUT={out}")
        reports.append(json.loads(out.read_text()))
    for key in ("bpc_difference", "ci95_low", "ci95_high", "eval_tokens"):
        assert reports[0][key] == reports[1][key], key
    assert reports[0]["a"]["bpc_per_seed"] == reports[1]["a"]["bpc_per_seed"]


@pytest.mark.slow  # a run of its own: the slow suite, keeping the quick one within 5 minutes
def test_a_plugin_familys_export_names_its_plugin_and_loads_only_with_that_code(tmp_path, plugins_forgotten):
    plugin = tmp_path / "elsewhere" / "my_models.py"
    plugin.parent.mkdir()
    plugin.write_text(worked_family())
    run_cli(tmp_path, f"PLUGINS={plugin}", "MODELS=leaky_tanh", "LEAKY_TANH.units=16", "MAX_STEPS=5", "RUN_NAME=p")
    run = tmp_path / "results" / "p"
    export(run, "leaky_tanh", tmp_path / "mine")
    config = json.loads((tmp_path / "mine" / "config.json").read_text())
    assert list(config["plugins"].values()) == [hashlib.sha256(plugin.read_bytes()).hexdigest()]
    loaded = fresh_process_logits(tmp_path, [tmp_path / "mine"])["mine"]
    before = _plugin_state()
    assert torch.equal(loaded, logits_of(load_run(run, "leaky_tanh")[0]))
    _forget_plugins(before)  # the scripts below load the plugin as a fresh process would
    ran = tmp_path / "the changed plugin ran"  # another version, whose import would leave a file behind
    plugin.write_text(plugin.read_text() + f"\nfrom pathlib import Path\nPath({str(ran)!r}).touch()\n")
    changed = run_script("sample.py", tmp_path / "mine", check=False)
    assert changed.returncode == 1 and "comes from a plugin that was not imported" in changed.stderr
    assert f"{plugin} has changed since (SHA-256" in changed.stderr
    assert len(changed.stderr.strip().splitlines()) == 1 and not ran.exists(), changed.stderr
    with pytest.raises(ExportError, match="comes from a plugin that was not imported"):
        Pretrained.from_pretrained(str(tmp_path / "mine"))
    assert not ran.exists()
    plugin.unlink()
    gone = run_script("sample.py", tmp_path / "mine", check=False)
    assert gone.returncode == 1 and f"{plugin} is missing here" in gone.stderr


# ---------------------------------------------------------------- trust: one line for each damaged or foreign file
def _resign(folder: Path, change) -> None:
    """An export edited by hand and signed again, as a careless tool would: its weights or config then disagree
    with the family, which is what the shape and name checks are for."""
    config = json.loads((folder / "config.json").read_text())
    change(config)
    config["weights_sha256"] = hashlib.sha256((folder / WEIGHTS).read_bytes()).hexdigest()
    (folder / "config.json").write_text(json.dumps(signed(config)))


def _rewrite_weights(folder: Path, change) -> None:
    from safetensors.torch import save_file

    from reservoir.share.folder import SHAPES_KEY

    tensors, shapes = read_tensors(folder / WEIGHTS)
    change(tensors)
    save_file(tensors, str(folder / WEIGHTS), metadata={"format": "pt", SHAPES_KEY: json.dumps(shapes)})
    _resign(folder, lambda c: None)


def _edit_card_number(folder: Path) -> None:
    card = (folder / "README.md").read_text()
    value = json.loads((folder / "config.json").read_text())["record"]["val_bpc"]
    (folder / "README.md").write_text(card.replace(f"val_bpc: {value!r}", "val_bpc: 1.0", 1))


def _edit_card_row(folder: Path) -> None:
    card = (folder / "README.md").read_text()
    (folder / "README.md").write_text(card.replace("| training tokens | ", "| training tokens | 9", 1))


DAMAGED = {
    "config edited": (lambda f: (f / "config.json").write_text((f / "config.json").read_text().replace(
        '"seq_len": 32', '"seq_len": 64')), "was edited or damaged after it was written"),
    "config cut short": (lambda f: (f / "config.json").write_text((f / "config.json").read_text()[:200]),
                         "is not valid JSON"),
    "weights cut short": (lambda f: (f / WEIGHTS).write_bytes((f / WEIGHTS).read_bytes()[:-100]),
                          "is not the file this export wrote"),
    "weights not safetensors": (lambda f: (_write_then_resign(f, b"not a safetensors file at all")),
                                "is not a readable safetensors file"),
    "a tensor of another shape": (lambda f: _rewrite_weights(f, lambda t: t.update(
        {"head.weight": torch.zeros(3, 3)})), "head.weight is (3, 3)"),
    "a tensor missing": (lambda f: _rewrite_weights(f, lambda t: t.pop("head.bias")), "missing head.bias"),
    "a tensor too many": (lambda f: _rewrite_weights(f, lambda t: t.update({"extra": torch.zeros(1)})),
                          "not the model's extra"),
    "settings edited and signed": (lambda f: _resign(f, lambda c: c["settings"].update(hidden=32)),
                                   "its settings block and the run's own settings disagree"),
    "card number edited": (_edit_card_number, "says val_bpc is 1.0, the model's record says"),
    "card row edited": (_edit_card_row, "its row 'training tokens' is not what the record says"),
    "tokenizer missing": (lambda f: (f / "tokenizer.json").unlink(), "tokenizer.json is missing"),
    "record edited and config signed": (lambda f: _resign(f, lambda c: c["record"].update(val_bpc=0.5)),
                                        "was edited after its run wrote it"),
    "integrity key deleted": (lambda f: (f / "config.json").write_text(json.dumps(
        {k: v for k, v in json.loads((f / "config.json").read_text()).items() if k != "integrity"})),
        "has lost its integrity hash"),
    "folder missing": (lambda f: shutil.rmtree(f), "is not a folder"),
}


def _write_then_resign(folder: Path, data: bytes) -> None:
    (folder / WEIGHTS).write_bytes(data)
    _resign(folder, lambda c: None)


@pytest.mark.parametrize("case", DAMAGED)
def test_a_damaged_export_is_refused_in_one_line(exports, tmp_path, case):
    damage, said = DAMAGED[case]
    folder = tmp_path / "damaged"
    shutil.copytree(exports["lstm"], folder)
    damage(folder)
    proc = run_script("sample.py", folder, check=False)
    assert proc.returncode == 1 and said in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "Traceback" not in proc.stderr
    with pytest.raises(OneLineError, match=re.escape(said)) as refused:  # the Python API: the project's error
        Pretrained.from_pretrained(folder)
    if case != "folder missing":  # sample.py also takes a run folder, and says so there
        assert proc.stderr.strip() == f"error: {refused.value}"


def test_export_asks_for_a_finished_model_and_a_new_folder_and_never_writes_over_one(every_model_run, exports,
                                                                                    tmp_path):
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "mine.txt").write_text("keep me")
    over = export(every_model_run, "lstm", taken, check=False)
    assert over.returncode == 1 and "exists and is not empty" in over.stderr
    assert [p.name for p in taken.iterdir()] == ["mine.txt"]
    again = export(exports["lstm"], "lstm", tmp_path / "again", check=False)
    assert again.returncode == 1 and "is an exported model" in again.stderr and not (tmp_path / "again").exists()
    wrong = run_script("sample.py", exports["lstm"], "MODEL=esn", check=False)
    assert wrong.returncode == 1 and "holds lstm alone, not MODEL=esn" in wrong.stderr
    missing = export(every_model_run, "lstm", tmp_path / "x", "TRAIN_SEED=4", check=False)
    assert missing.returncode == 1 and "TRAIN_SEED=4 is not a seed of this run" in missing.stderr
    assert not (tmp_path / "x").exists() and not list(tmp_path.glob(".x-*"))
    no_to = run_script("export.py", every_model_run, check=False)
    assert no_to.returncode == 1 and "TO=<folder>" in no_to.stderr


def _can_mount() -> bool:
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt"],
                           capture_output=True) if shutil.which("unshare") else None
    return probe is not None and probe.returncode == 0


@pytest.mark.parametrize("target, said", [("a-file", "is a file: give a new folder"),
                                          ("a-file/sub", "which is a file, not a folder")])
def test_export_to_a_file_or_below_one_is_one_line_and_changes_nothing(every_model_run, tmp_path, target, said):
    """A file on the way ended in a FileExistsError traceback."""
    (tmp_path / "a-file").write_text("mine")
    proc = export(every_model_run, "lstm", tmp_path / target, check=False)
    assert proc.stderr.strip() == proc.stderr.strip().splitlines()[0] and said in proc.stderr, proc.stderr
    assert proc.stderr.startswith(f"error: TO={tmp_path / target}") and proc.returncode == 1
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"] and (tmp_path / "a-file").read_text() == "mine"


@pytest.mark.skipif(not _can_mount(), reason="cannot mount a private tmpfs here (unshare -rm)")
@pytest.mark.parametrize("target", ["{ro}", "{ro}/sub"])
def test_export_to_a_read_only_mount_is_one_line_and_changes_nothing(every_model_run, tmp_path, target):
    """TO=<empty read-only mount> deleted the user's empty folder (os.rmdir) and then ended in EBUSY; below it, an
    OSError traceback. A mount needs a namespace of its own: the export runs in a process there."""
    said = "cannot be written ("
    mount, file = tmp_path / "ro", tmp_path / "a-file"
    mount.mkdir()
    file.write_text("mine")
    to = target.format(ro=mount, file=file)
    command = shlex.join([sys.executable, str(ROOT / "export.py"), str(every_model_run), "MODEL=lstm", f"TO={to}"])
    proc = subprocess.run(["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o ro,size=64k tmpfs '{mount}' && "
                           f"{command}; echo \"left: $(ls -A '{mount}')\""], cwd=ROOT, capture_output=True, text=True,
                          timeout=300)
    assert proc.stderr.strip().startswith(f"error: TO={to}") and said in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and "left: \n" in proc.stdout + "\n"
    assert mount.is_dir() and file.read_text() == "mine" and sorted(p.name for p in tmp_path.iterdir()) == \
        ["a-file", "ro"]


def test_export_into_an_empty_folder_keeps_it_and_every_file_follows_the_umask(every_model_run, tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    inode = empty.stat().st_ino
    export(every_model_run, "lstm", empty)
    assert empty.stat().st_ino == inode and sorted(p.name for p in empty.iterdir()) == sorted(
        ["config.json", "model.safetensors", "tokenizer.json", "README.md"])
    modes = {p.name: p.stat().st_mode & 0o777 for p in empty.iterdir()}
    assert set(modes.values()) == {0o666 & ~current_umask()}, modes  # model.safetensors was 0600
    assert Pretrained.from_pretrained(empty).record["model"] == "lstm"


@pytest.mark.parametrize("option, said", [("LICENSE=mit\n| injected | row |", "is not a Hub license id"),
                                          ("LICENSE=MIT License", "is not a Hub license id"),
                                          ("PUSH=not a/valid id", "is not a Hub repository id"),
                                          ("PUSH=just-a-name", "is not a Hub repository id")])
def test_a_license_or_hub_id_that_cannot_be_used_is_refused_before_anything_is_written(every_model_run, tmp_path,
                                                                                       option, said):
    proc = export(every_model_run, "lstm", tmp_path / "out", option, check=False)
    assert proc.returncode == 1 and said in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not list(tmp_path.iterdir())


@pytest.mark.parametrize("hub", ["offline mode", "no network"])
def test_a_push_that_cannot_reach_the_hub_is_one_line_after_the_export_it_keeps(every_model_run, tmp_path,
                                                                               monkeypatch, hub):
    import huggingface_hub.constants as constants

    if hub == "offline mode":
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    else:  # a port on this machine that nothing listens on: the connection is refused at once
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setenv("HF_TOKEN", "hf_NotARealToken")
    proc = export(every_model_run, "lstm", tmp_path / "out", "PUSH=someone/tiny-lstm", check=False)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    line = proc.stderr.strip()
    assert len(line.splitlines()) == 1 and f"the export is written to {tmp_path / 'out'}, but pushing it" in line
    assert "push_to_hub('someone/tiny-lstm')" in line
    assert Pretrained.from_pretrained(tmp_path / "out").record["model"] == "lstm"


def test_advice_on_the_export_paths_works_when_followed(every_model_run, exports, tmp_path):
    """compare.py <lstm export>:esn advised RESUME (which refuses exports); a stopped run's export advised MODEL=,
    then refused the name; a diverged model's export said checkpoints stay on the machine that trained it."""
    other = run_script("compare.py", f"{exports['lstm']}:esn", f"{every_model_run}:ngram", check=False)
    assert other.returncode == 1 and f"{exports['lstm']} is an exported model of lstm alone, not esn" in other.stderr
    assert "<run>:esn" in other.stderr and "RESUME" not in other.stderr
    run_cli(tmp_path, "MODELS=['transformer','ngram']", "MAX_STEPS=20", "LOG_EVERY=5", "CHECKPOINT_EVERY=0",
            "EVAL_POINTS=1", "LEARNING_RATE=1e9", "RUN_NAME=nan")
    diverged = tmp_path / "results" / "nan"
    for said in (export(diverged, "transformer", tmp_path / "x", check=False),
                 run_script("sample.py", diverged, "MODEL=transformer", check=False),
                 run_script("compare.py", f"{diverged}:transformer", f"{diverged}:ngram", check=False)):
        assert said.returncode == 1 and "diverged at step 5" in said.stderr, said.stderr
        assert "stay on the machine" not in said.stderr and "RESUME" not in said.stderr, said.stderr
    run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=20", "RUN_NAME=stopped")
    stopped = tmp_path / "results" / "stopped"
    (stopped / "summary.json").write_text("[]")  # as if stopped before its record
    for proc in (export(stopped, "lstm", tmp_path / "y", check=False),
                 run_script("export.py", stopped, f"TO={tmp_path / 'y'}", check=False)):
        assert proc.returncode == 1 and f"python TinyStories.py RESUME={stopped})" in proc.stderr, proc.stderr
        assert "MODEL=<name>" not in proc.stderr
    resumed = run_cli(tmp_path, f"RESUME={stopped}")  # the advice, followed
    assert "lstm: finished in the checkpoint" in resumed.stdout
    export(stopped, "lstm", tmp_path / "y")


def test_an_offline_hub_id_is_shown_as_it_was_given(tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    proc = run_script("sample.py", "hf://me/x", check=False)
    assert proc.returncode == 1 and proc.stderr.startswith("error: hf://me/x (no such folder here"), proc.stderr
    with pytest.raises(ExportError, match=r"^hf://me/x \(no such folder here"):
        Pretrained.from_pretrained(Path("hf://me/x"))


def test_generating_from_an_export_keeps_the_prompt_s_shape_and_is_the_run_s_story(every_model_run, exports):
    model = Pretrained.from_pretrained(exports["lstm"])
    ids = torch.from_numpy(model.tokenizer.encode("Once upon")).unsqueeze(0)
    out = model.generate(ids, 20, temperature=0.8, generator=torch.Generator().manual_seed(3))
    assert out.shape[0] == 1 and out.dim() == 2 and torch.equal(out[0, :ids.shape[1]], ids[0])
    run_model = load_run(every_model_run, "lstm")[0]
    with torch.no_grad():
        same = run_model.generate(ids[0], 20, temperature=0.8, generator=torch.Generator().manual_seed(3))
    assert torch.equal(out[0], same) and model.generate(ids[0], 5).dim() == 1
    assert model.tokenizer.decode(out[0].tolist()).startswith("Once upon")


def test_an_unfinished_model_is_not_exported(tmp_path):
    run_cli(tmp_path, "MODELS=['lstm']", "MAX_STEPS=20", "RUN_NAME=u")
    run = tmp_path / "results" / "u"
    (run / "summary.json").write_text("[]")  # its record not yet written: the model has not finished
    proc = export(run, "lstm", tmp_path / "out", check=False)
    assert proc.returncode == 1 and "has not finished" in proc.stderr and not (tmp_path / "out").exists()


def test_an_export_is_refused_as_a_run_to_resume_or_branch_off(exports, tmp_path):
    resumed = run_cli(tmp_path, f"RESUME={exports['lstm']}", check=False)
    assert resumed.returncode == 1 and "is an exported model" in resumed.stderr and "RESUME takes" in resumed.stderr
    branched = run_cli(tmp_path, "MODELS=['lstm']", "LR_SCHEDULE='wsd'", "MAX_STEPS=5",
                       f"STABLE_FROM={exports['lstm']}", check=False)
    assert branched.returncode == 1 and "STABLE_FROM takes the run folder" in branched.stderr


def test_nothing_on_the_export_path_unpickles(every_model_run, exports, tmp_path, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("an unpickler was called")

    for name in ("load", "loads", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)
    monkeypatch.setattr(torch, "load", refuse)
    model = Pretrained.from_pretrained(str(exports["transformer"]))
    assert torch.equal(logits_of(model), logits_of(load_trained(exports["transformer"])[0]))
    bin_only = tmp_path / "bin-only"
    shutil.copytree(exports["lstm"], bin_only)
    (bin_only / WEIGHTS).rename(bin_only / "pytorch_model.bin")  # what the mixin would fall back to unpickling
    with pytest.raises(ExportError, match="model.safetensors is missing"):
        Pretrained.from_pretrained(str(bin_only))


# ---------------------------------------------------------------- the Hub, through huggingface_hub only
def _hub_cache(cache: Path, repo: str, export_folder: Path, extra: dict | None = None) -> None:
    """A Hub repository in huggingface_hub's cache as its download leaves it (models--user--name, refs/main naming
    the snapshot), so an offline load finds it there."""
    commit = "0" * 40
    home = cache / f"models--{repo.replace('/', '--')}"
    shutil.copytree(export_folder, home / "snapshots" / commit)
    for name, data in (extra or {}).items():
        (home / "snapshots" / commit / name).write_bytes(data)
    (home / "refs").mkdir(parents=True)
    (home / "refs" / "main").write_text(commit)


def test_a_hub_id_loads_through_huggingface_hubs_cache_offline(every_model_run, exports, tmp_path, monkeypatch):
    import huggingface_hub.constants as hub

    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "hub"))
    _hub_cache(tmp_path / "hub", "someone/tiny-lstm", exports["lstm"])
    from_hub = run_script("sample.py", "hf://someone/tiny-lstm", "SEED=3")
    assert from_hub.stdout == run_script("sample.py", every_model_run, "MODEL=lstm", "SEED=3").stdout
    model = Pretrained.from_pretrained("someone/tiny-lstm")
    assert torch.equal(logits_of(model), logits_of(load_run(every_model_run, "lstm")[0]))
    absent = run_script("sample.py", "hf://someone/elsewhere", check=False)
    assert absent.returncode == 1 and "not in this machine's Hugging Face cache" in absent.stderr


def test_push_uploads_the_export_through_hfapi_and_writes_no_token(every_model_run, tmp_path, monkeypatch):
    import huggingface_hub

    calls = {}

    def create_repo(self, repo_id, **kwargs):
        calls["create"] = (repo_id, kwargs.get("private"), self.token)
        return huggingface_hub.RepoUrl(f"https://huggingface.co/{repo_id}")

    def upload_folder(self, *, repo_id, folder_path, repo_type=None, **kwargs):
        calls["upload"] = (repo_id, repo_type, {p.name: p.read_bytes() for p in Path(folder_path).iterdir()})
        return f"https://huggingface.co/{repo_id}/commit/1"

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", create_repo)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload_folder)
    monkeypatch.setenv("HF_TOKEN", "hf_NotARealTokenButSecret")
    proc = export(every_model_run, "lstm", tmp_path / "pushed", "PUSH=someone/tiny-lstm", "PRIVATE=True")
    assert calls["create"][:2] == ("someone/tiny-lstm", True)
    repo, kind, files = calls["upload"]
    assert (repo, kind) == ("someone/tiny-lstm", "model")
    assert files == {p.name: p.read_bytes() for p in (tmp_path / "pushed").iterdir()}
    assert "pushed to https://huggingface.co/someone/tiny-lstm" in proc.stdout
    for data in files.values():
        assert b"hf_NotARealTokenButSecret" not in data
    assert "hf_NotARealTokenButSecret" not in proc.stdout + proc.stderr


def test_the_generation_cost_of_an_export_is_its_configurations(every_model_run, exports):
    """scaling.py GENERATION= takes an export (weights do not change the cost): the FLOPs and bytes a step of its
    settings costs, as a study point of the same settings measures them."""
    from reservoir.models import with_added_options
    from reservoir.studies.frontier.generation import _si, measure

    proc = run_script("scaling.py", f"GENERATION={exports['lstm']}")
    run = json.loads((every_model_run / "config.json").read_text())
    point = {"family": "lstm", "cell": "r", "bpc": 0.0, "params_trained": 0, "vocab_size": run["data"]["vocab_size"],
             "config": with_added_options({**run["effective_config"], "MODELS": ["lstm"]})}
    row = measure(point, batches=(1,))
    assert "generates from carried state" in proc.stdout
    said = next(line for line in proc.stdout.splitlines() if line.startswith("FLOPs per character"))
    assert said.endswith(f"8,192: {_si(row['flops_per_char']['8192'])}")
    assert f"128: {_si(row['bytes']['128'])}" in proc.stdout
