"""A folded group of points (reservoir/run/group.py) trained through the real loop: each member an ordinary
point in its own folder, scoring as it scores alone within TOLERANCE (float32: the fold's batched products sum
in another order), resumed after a stop, and a member that diverges harms no other."""

import os
import shutil
import signal

import pytest
import torch

from reservoir.data.tokens import prepare_data
from reservoir.models import build_model
from reservoir.models.settings import model_settings
from reservoir.platform import device as dev
from reservoir.platform import stopping
from reservoir.platform.stopping import Diverged, Stopped
from reservoir.run.group import fit_group
from reservoir.run.train import fit, summary_record
from reservoir.run.writer import Run
from reservoir.studies.frontier.grid import FAMILIES, Cell
from tests.conftest import TINY_DATA, make_config, run_cli

TOLERANCE = 2e-4  # relative, on a member's final validation loss against its point alone
RATES = [2e-3, 4e-3, 3e-3]


SETTINGS = [*TINY_DATA, "SEQ_LEN=16", "EVAL_TOKENS=512", "FINAL_EVAL_TOKENS=1024", "MAX_STEPS=16",
            "LR_SCHEDULE=cosine", "WARMUP_STEPS=3", "LOG_EVERY=4", "CHECKPOINT_EVERY=4", "EVAL_POINTS=2",
            "GRAD_CLIP=1.0", "CHECKPOINT_EVERY_S=0"]


@pytest.fixture(scope="module")
def setting(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("group")
    return tmp, prepare_data(make_config(tmp, *SETTINGS)), dev.select_device({"DEVICE": "cpu"})


def configs(tmp, family: str, rates=RATES, one_seed: bool = False) -> tuple[str, list[dict]]:
    """The family's xs preset at batch 4, one config a member: its seed (or the first, ``one_seed``), rate and
    weight decay."""
    base = make_config(tmp, *Cell(family, "xs", 1e-3, 4).settings(), *SETTINGS)
    return FAMILIES[family][0], [{**base, "SEED": 0 if one_seed else k, "LEARNING_RATE": rate,
                                  "WEIGHT_DECAY": 0.01 * (1 + k)} for k, rate in enumerate(rates)]


def run_folder(path, info) -> Run:
    path.mkdir(parents=True, exist_ok=True)
    return Run(path, info)


def folders(tmp_path, label: str, count: int, info) -> list[Run]:
    return [run_folder(tmp_path / f"{label}{k}", info) for k in range(count)]


def train_group(name, cfgs, data, info, runs):
    models = [build_model(name, data.tokenizer.vocab_size, model_settings(c, name)) for c in cfgs]
    return models, fit_group(name, models, [data] * len(models), cfgs, info, runs)


def train_alone(name, cfg, data, info, run):
    model = build_model(name, data.tokenizer.vocab_size, model_settings(cfg, name))
    return fit(name, model, data, cfg, info, run)


@pytest.fixture(scope="module")
def alone(setting, tmp_path_factory):
    """The three points trained one at a time: what each folded member must score."""
    tmp, data, info = setting
    name, cfgs = configs(tmp, "transformer++")
    tmp = tmp_path_factory.mktemp("alone")
    return [train_alone(name, c, data, info, run_folder(tmp / f"a{k}", info)) for k, c in enumerate(cfgs)]


def test_a_folded_member_is_its_point_alone(setting, alone, tmp_path):
    """Three Transformer++ points, each its seed, rate and weight decay: folded, each writes its own checkpoint
    and scores within TOLERANCE of its point trained alone; its record counts the same steps, tokens and FLOPs
    and says it was folded, with how many."""
    tmp, data, info = setting
    name, cfgs = configs(tmp, "transformer++")
    runs = folders(tmp_path, "f", 3, info)
    models, outcomes = train_group(name, cfgs, data, info, runs)
    for k, (outcome, own) in enumerate(zip(outcomes, alone, strict=True)):
        assert outcome.final["val_loss"] == pytest.approx(own.final["val_loss"], rel=TOLERANCE)
        assert (outcome.progress.step, outcome.progress.tokens, outcome.progress.flops) == \
            (own.progress.step, own.progress.tokens, own.progress.flops)
        assert runs[k].checkpoint_path(name, cfgs[k]["SEED"]).exists()
        record = summary_record(name, models[k], outcome, cfgs[k], info, data)
        assert record["fit"]["folded_with"] == 3 and record["learning_rate"] == RATES[k]
    assert len({round(o.final["val_loss"], 6) for o in outcomes}) == 3  # three points, not one thrice


@pytest.fixture(params=["same weights", "new weights"])
def moved_weights(request):
    """How moving a model to its device treats its weights: the same Parameters (the CPU, a GPU), or new ones
    (XLA, whose tensors cannot share the host's storage; torch's flag does the same on the CPU)."""
    new = request.param == "new weights"
    torch.__future__.set_overwrite_module_params_on_conversion(new)
    yield new
    torch.__future__.set_overwrite_module_params_on_conversion(False)


def test_a_stopped_group_resumes_every_member_even_those_a_kill_left_behind(setting, alone, tmp_path, moved_weights):
    """SIGTERM at step 8: every member saves at the step after, as a point alone does. A kill between two
    members' saves is that with one member's checkpoint from step 4. Resumed, the two at step 9 fold, the one at
    step 4 trains alone, and every member scores as its point trained without a stop. Where moving a model to
    its device makes new weights (XLA), each member's AdamW moments are still saved and resumed (they were
    lost: the optimizers knew the host's weights, not the device's)."""
    tmp, data, info = setting
    name, cfgs = configs(tmp, "transformer++")
    runs = folders(tmp_path, "s", 3, info)
    earlier = tmp_path / "member1-step4.pt"
    log_train = runs[0].log_train

    def signal_at_step_8(record):  # the real signal through the real handler, from inside the loop
        log_train(record)
        if record["step"] == 8:  # logged before its checkpoint: member 1's holds step 4
            shutil.copy(runs[1].checkpoint_path(name, 1), earlier)
            os.kill(os.getpid(), signal.SIGTERM)

    runs[0].log_train = signal_at_step_8
    with stopping.installed(announce=False), pytest.raises(Stopped):
        train_group(name, cfgs, data, info, runs)
    steps = [torch.load(r.checkpoint_path(name, k), weights_only=True)["progress"]["step"]
             for k, r in enumerate(runs)]
    assert steps == [9, 9, 9]  # the step after the signal, as a point alone stops
    assert torch.load(earlier, weights_only=True)["progress"]["step"] == 4
    saved = torch.load(runs[0].checkpoint_path(name, 0), weights_only=True)["optimizer"]["state"]
    assert saved and all(state["exp_avg"].abs().sum() > 0 for state in saved.values())
    shutil.copy(earlier, runs[1].checkpoint_path(name, 1))  # killed before member 1 saved its steps 8 and 9
    resumed = [Run(r.path, info) for r in runs]
    for r in resumed:
        r.resumed = True
    with stopping.installed(announce=False):  # a new process: no signal pending
        _, outcomes = train_group(name, cfgs, data, info, resumed)
    for outcome, own in zip(outcomes, alone, strict=True):
        assert outcome.final["val_loss"] == pytest.approx(own.final["val_loss"], rel=TOLERANCE)
        assert outcome.progress.step == own.progress.step == 16


def test_a_member_that_diverges_is_recorded_so_and_the_others_go_on(setting, alone, tmp_path):
    """One member's rate is 1e3: it diverges and comes back as Diverged; the others score as alone."""
    tmp, data, info = setting
    name, cfgs = configs(tmp, "transformer++", rates=[RATES[0], 1e3, RATES[2]])
    _, outcomes = train_group(name, cfgs, data, info, folders(tmp_path, "d", 3, info))
    assert isinstance(outcomes[1], Diverged)
    for k in (0, 2):
        assert outcomes[k].final["val_loss"] == pytest.approx(alone[k].final["val_loss"], rel=TOLERANCE)


@pytest.mark.parametrize(("family", "why"), [("esn+softmax", "not trained by gradient steps over windows"),
                                             ("lstm", "nn.LSTM's fused kernel trains a point about 4x as fast")])
def test_a_family_that_does_not_fold_here_trains_one_point_at_a_time_and_says_why(family, why, setting, tmp_path,
                                                                                  capsys):
    """An ESN's readout trains on harvested features, not windows; on a CPU core the LSTM's fused kernel beats
    its fold (which tests/test_fold.py and the XLA suite train): their points train alone, after a line."""
    tmp, data, info = setting
    name, cfgs = configs(tmp, family, rates=RATES[:2])
    _, outcomes = train_group(name, cfgs, data, info, folders(tmp_path, "l", 2, info))
    said = " ".join(capsys.readouterr().out.split())
    assert "2 points trained one at a time, not folded" in said and why in said
    assert all(o.extra.get("folded_with") is None and o.progress.step == 16 for o in outcomes)


@pytest.mark.parametrize("family", ["transformer", "reservoir_attention+write", "linear_reservoir"])
def test_a_family_folds_through_the_real_loop_as_its_points_alone(family, setting, tmp_path, capsys):
    """The classic transformer (its position table a member's own) folds members of any seeds; a reservoir whose
    frozen draw is its seed's folds the members of one seed (a grid cell's rates), and says why not for two.
    Each member scores within TOLERANCE of its point alone, three points, not one thrice."""
    tmp, data, info = setting
    one_seed = family != "transformer"
    name, cfgs = configs(tmp, family, one_seed=one_seed)
    _, outcomes = train_group(name, cfgs, data, info, folders(tmp_path, "f", 3, info))
    own = [train_alone(name, c, data, info, run_folder(tmp_path / f"a{k}", info)) for k, c in enumerate(cfgs)]
    for outcome, alone_ in zip(outcomes, own, strict=True):
        assert outcome.extra.get("folded_with") == 3
        assert outcome.final["val_loss"] == pytest.approx(alone_.final["val_loss"], rel=TOLERANCE)
    assert len({round(o.final["val_loss"], 6) for o in outcomes}) == 3
    if one_seed:
        capsys.readouterr()
        name, cfgs = configs(tmp, family, rates=RATES[:2])
        _, outcomes = train_group(name, cfgs, data, info, folders(tmp_path, "s", 2, info))
        said = capsys.readouterr().out
        assert "2 points trained one at a time, not folded" in said and "differs between its members' seeds" in said
        assert all(o.extra.get("folded_with") is None for o in outcomes)


# ---------------------------------------------------------------------------- TinyStories.py A --and B
POINT = [*TINY_DATA, "SEQ_LEN=16", "MODELS=transformer", "TRANSFORMER.recipe='++'", "TRANSFORMER.n_layer=1",
         "TRANSFORMER.dropout=0.0",  # dropout's masks are drawn for the fold: equal to alone in law, not number
         "TRANSFORMER.n_embd=32", "BATCH_SIZE=4", "MAX_STEPS=24", "LR_SCHEDULE=cosine", "WARMUP_STEPS=3",
         "EVAL_TOKENS=512", "FINAL_EVAL_TOKENS=1024", "PLOTS=False", "SAMPLE_TOKENS=8"]


def group_argv(tmp_path, *members: list[str]) -> list[str]:
    common = [*POINT, f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'cache'}"]
    argv = []
    for member in members:
        argv += [*(["--and"] if argv else []), *common, *member]
    return argv


def record(tmp_path, name: str) -> dict:
    import json

    return json.loads((tmp_path / "results" / name / "summary.json").read_text())[0]


def test_points_joined_by_and_train_as_one_folded_group_each_in_its_own_folder(tmp_path):
    """`TinyStories.py A --and B --and C`: three folders, three records, each saying it was folded with three;
    a member scores as the same command alone."""
    rates = ["LEARNING_RATE=0.002", "LEARNING_RATE=0.004", "LEARNING_RATE=0.003"]
    members = [[rate, f"SEED={k}", f"RUN_NAME=m{k}"] for k, rate in enumerate(rates)]
    out = run_cli(tmp_path, *group_argv(tmp_path, *members), settings=[])
    assert "folded with 2 more" in out.stdout
    records = [record(tmp_path, f"m{k}") for k in range(3)]
    assert [r["fit"]["folded_with"] for r in records] == [3, 3, 3]
    assert [r["learning_rate"] for r in records] == [0.002, 0.004, 0.003]
    run_cli(tmp_path, *POINT, rates[1], "SEED=1", "RUN_NAME=alone", settings=[])
    alone = record(tmp_path, "alone")
    assert records[1]["val_bpc"] == pytest.approx(alone["val_bpc"], rel=TOLERANCE)
    assert (records[1]["train_steps"], records[1]["train_flops"]) == (alone["train_steps"], alone["train_flops"])


def test_a_group_whose_points_differ_in_more_than_a_rate_or_seed_is_refused_in_one_line(tmp_path):
    out = run_cli(tmp_path, *group_argv(tmp_path, ["RUN_NAME=a"], ["RUN_NAME=b", "SEQ_LEN=32"]), settings=[],
                  check=False)
    assert out.returncode != 0 and "differ in SEQ_LEN" in out.stderr
    assert not (tmp_path / "results" / "a").exists()  # nothing half-written


def test_a_killed_group_resumes_every_member_from_its_checkpoints(tmp_path):
    """SIGKILL of a group's process (the process boundary is what this tests): its members' checkpoints are
    there, and `RESUME=<folder> --and RESUME=<folder>` finishes each as the group unkilled scores it. The kill lands
    where both members' checkpoints stand at one step, so they fold again as they folded unkilled: a kill between
    two members' saves leaves them at two steps, and each then trains on alone, whose sums run in another order
    (over 300 steps at rate 4e-3 that moved a member's score 0.5%, as training it alone from the start does)."""
    import subprocess
    import sys
    import time

    from tests.conftest import ROOT

    long = ["MAX_STEPS=300", "CHECKPOINT_EVERY=10", "LOG_EVERY=10"]
    members = [[*long, "LEARNING_RATE=0.002", "SEED=0", "RUN_NAME=k0"], [*long, "LEARNING_RATE=0.004", "SEED=1",
                                                                           "RUN_NAME=k1"]]
    proc = subprocess.Popen([sys.executable, str(ROOT / "TinyStories.py"), *group_argv(tmp_path, *members)],
                            cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    checkpoints = [tmp_path / "results" / f"k{k}" / "checkpoints" / "transformer.pt" for k in range(2)]
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if all(c.exists() for c in checkpoints):
            proc.send_signal(signal.SIGSTOP)  # frozen while its checkpoints are read: each stays as it is
            if len({torch.load(c, weights_only=True)["progress"]["step"] for c in checkpoints}) == 1:
                break
            proc.send_signal(signal.SIGCONT)  # between two members' saves: a moment later
        time.sleep(0.05)
    proc.kill()
    proc.wait()
    assert all(c.exists() for c in checkpoints), proc.stderr.read()[-2000:]
    steps = [torch.load(c, weights_only=True)["progress"]["step"] for c in checkpoints]
    assert all(0 < s < 300 for s in steps), steps
    run_cli(tmp_path, f"RESUME={tmp_path / 'results' / 'k0'}", "--and", f"RESUME={tmp_path / 'results' / 'k1'}",
            settings=[])
    unkilled = [[*m[:-1], f"RUN_NAME=u{k}"] for k, m in enumerate(members)]
    run_cli(tmp_path, *group_argv(tmp_path, *unkilled), settings=[])
    for k in range(2):
        done, whole = record(tmp_path, f"k{k}"), record(tmp_path, f"u{k}")
        assert done["train_steps"] == whole["train_steps"] == 300
        assert done["val_bpc"] == pytest.approx(whole["val_bpc"], rel=TOLERANCE)


def test_each_seed_of_a_point_is_a_member_of_its_group(tmp_path):
    """A point with SEEDS=0,1 joined to another: three members, the first point's two seeds in its own folder."""
    run_cli(tmp_path, *group_argv(tmp_path, ["SEEDS=0,1", "RUN_NAME=two"], ["LEARNING_RATE=0.004", "RUN_NAME=one"]),
            settings=[])
    import json

    two = json.loads((tmp_path / "results" / "two" / "summary.json").read_text())
    assert sorted(r["seed"] for r in two) == [0, 1]
    assert [r["fit"]["folded_with"] for r in [*two, record(tmp_path, "one")]] == [3, 3, 3]


def test_a_lone_points_seeds_fold_when_its_command_ends_in_and(tmp_path):
    """`TinyStories.py A --and` with SEEDS=0,1 (a study's envelope seeds that no other point joins): its two
    seeds are one fold, in its one folder, each scoring as the same seeds trained one after the other."""
    import json

    from reservoir.studies.frontier.folding import members

    run_cli(tmp_path, *group_argv(tmp_path, ["SEEDS=0,1", "RUN_NAME=folded"]), "--and", settings=[])
    run_cli(tmp_path, *group_argv(tmp_path, ["SEEDS=0,1", "RUN_NAME=apart"]), settings=[])
    folded, apart = ({r["seed"]: r for r in json.loads((tmp_path / "results" / name / "summary.json").read_text())}
                     for name in ("folded", "apart"))
    assert sorted(folded) == sorted(apart) == [0, 1]
    assert [folded[s]["fit"]["folded_with"] for s in (0, 1)] == [2, 2]
    assert [apart[s]["fit"].get("folded_with") for s in (0, 1)] == [None, None]
    for seed in (0, 1):
        assert folded[seed]["val_bpc"] == pytest.approx(apart[seed]["val_bpc"], rel=TOLERANCE)
    # a study counts a continued point's members from its folder, so its seeds fold when it is resumed
    assert members([f"RESUME={tmp_path / 'results' / 'folded'}"]) == members(["SEEDS=0,1"]) == 2
    from TinyStories import main  # refused as the parts are split, before any data: no run to start

    with pytest.raises(SystemExit, match="give settings on both sides"):
        main([*POINT, "--and", "--and"])


def test_a_member_finished_in_its_checkpoint_is_evaluated_again_and_the_others_still_fold(setting, alone, tmp_path):
    """Member 1 finished before (its checkpoint says so, its record is not written: a kill in its final
    evaluation): it is scored again from its checkpoint, and members 0 and 2 fold, two of them."""
    tmp, data, info = setting
    name, cfgs = configs(tmp, "transformer++")
    runs = folders(tmp_path, "e", 3, info)
    train_alone(name, cfgs[1], data, info, runs[1])  # its checkpoint: finished
    _, outcomes = train_group(name, cfgs, data, info, runs)
    assert [o.extra.get("folded_with") for o in outcomes] == [2, None, 2]
    for outcome, own in zip(outcomes, alone, strict=True):
        assert outcome.final["val_loss"] == pytest.approx(own.final["val_loss"], rel=TOLERANCE)
