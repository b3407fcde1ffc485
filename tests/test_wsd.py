"""The warm-up-stable-decay schedule and its branches (STABLE_FROM), and AdamW's β2 settings."""

import json
import math
import shutil

import pytest
import torch

from reservoir.config import ConfigError, parse_overrides
from reservoir.run.train import adam_beta2, learning_rate
from tests.conftest import run_cli, run_then_sigkill, summary_of, write_corpus

# the transformer with dropout (the RNG must be carried exactly too), 40 and 80 steps on the wsd schedule
WSD = ["MODELS=transformer", "TRANSFORMER.dropout=0.1", "LR_SCHEDULE=wsd", "WARMUP_STEPS=5",
       "FINAL_EVAL_TOKENS=4096", "EVAL_POINTS=3"]


def test_wsd_warms_up_in_steps_holds_the_peak_and_cools_down_as_one_minus_sqrt():
    config = parse_overrides(["LR_SCHEDULE=wsd", "LEARNING_RATE=1e-3", "WARMUP_STEPS=10", "MIN_LR_FRACTION=0.1",
                              "COOLDOWN_FRACTION=0.2"])
    assert learning_rate(config, 0, 0.0) == pytest.approx(1e-4)
    assert learning_rate(config, 4, 0.0001) == pytest.approx(5e-4)  # warm-up by steps, whatever the share
    assert learning_rate(config, 9, 0.5) == pytest.approx(1e-3)
    assert learning_rate(config, 500, 0.79) == pytest.approx(1e-3)  # stable until the cooldown
    assert learning_rate(config, 500, 0.85) == pytest.approx(1e-3 * (0.1 + 0.9 * (1 - math.sqrt(0.25))))
    assert learning_rate(config, 500, 1.0) == pytest.approx(1e-4)
    linear = {**config, "COOLDOWN_SHAPE": "linear"}
    assert learning_rate(linear, 500, 0.9) == pytest.approx(1e-3 * (0.1 + 0.9 * 0.5))
    short, long = [learning_rate(config, s, s / 100) for s in range(80)], [learning_rate(config, s, s / 400)
                                                                         for s in range(80)]
    assert short == long  # before a cooldown the schedule does not depend on the budget: one stable phase


def test_wsd_needs_a_budget_counted_in_steps_tokens_or_flops():
    with pytest.raises(ConfigError, match="LR_SCHEDULE='wsd' places its cooldown by steps, tokens or FLOPs"):
        parse_overrides(["LR_SCHEDULE=wsd", "FLOP_BUDGET=None", "TIME_BUDGET_S=60"])
    with pytest.raises(ConfigError, match="STABLE_FROM continues a wsd run"):
        parse_overrides(["STABLE_FROM=results/x"])


def test_beta2_keeps_a_fixed_half_life_in_tokens_when_asked():
    config = parse_overrides(["ADAM_BETA2=0.95"])
    assert adam_beta2(config, 8192) == 0.95  # as given by default, whatever the batch
    config = parse_overrides(["ADAM_BETA2=0.95", "ADAM_BETA2_REF_TOKENS=4096"])
    assert adam_beta2(config, 4096) == pytest.approx(0.95)
    assert adam_beta2(config, 8192) == pytest.approx(0.95 ** 2)  # twice the tokens per step: twice the decay
    assert adam_beta2(config, 1024) == pytest.approx(0.95 ** 0.25)
    half_life = [math.log(0.5) / math.log(adam_beta2(config, t)) * t for t in (1024, 4096, 8192)]
    assert half_life == pytest.approx([half_life[0]] * 3)  # the same half-life, counted in tokens


def test_the_run_trains_with_the_beta2_it_records(tmp_path):
    run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=3", "ADAM_BETA2=0.99", "ADAM_BETA2_REF_TOKENS=128", "RUN_NAME=b")
    run_dir = tmp_path / "results" / "b"
    assert summary_of(run_dir)["lstm"]["fit"]["adam_beta2"] == pytest.approx(0.99 ** 2)  # 8 x 32 tokens per step
    saved = torch.load(run_dir / "checkpoints" / "lstm.pt", weights_only=True)
    assert saved["optimizer"]["param_groups"][0]["betas"][1] == pytest.approx(0.99 ** 2)


def test_a_branched_point_scores_bit_identically_to_a_direct_wsd_run_and_a_killed_branch_resumes(tmp_path):
    run_cli(tmp_path, *WSD, "MAX_STEPS=40", "RUN_NAME=short")
    run_cli(tmp_path, *WSD, "MAX_STEPS=80", "RUN_NAME=direct")
    short = tmp_path / "results" / "short"
    stable = torch.load(short / "checkpoints" / "transformer-seed1337-stable.pt", weights_only=True)
    assert stable["progress"]["step"] == 32 and not stable["finished"]  # where the last 20% of 40 steps begins
    branch = run_cli(tmp_path, *WSD, "MAX_STEPS=80", f"STABLE_FROM={short}", "RUN_NAME=branch")
    assert "continuing from the stable phase of" in branch.stdout
    direct, branched = summary_of(tmp_path / "results" / "direct"), summary_of(tmp_path / "results" / "branch")
    for key in ("val_loss", "val_bpc", "windows_val_bpc", "train_steps", "train_tokens", "train_flops"):
        assert branched["transformer"][key] == direct["transformer"][key], key  # bit-identical, not approximately
    assert branched["transformer"]["fit"]["branched_at_flops"] == pytest.approx(stable["progress"]["flops"])
    assert direct["transformer"]["fit"]["branched_at_flops"] == 0

    def past_step_50(run_dir):  # its checkpoint every 10 steps; the kill lands mid-branch
        path = run_dir / "checkpoints" / "transformer.pt"
        try:
            return path.exists() and torch.load(path, weights_only=True)["progress"]["step"] >= 50
        except Exception:  # caught mid-write: look again
            return False

    killed = run_then_sigkill(tmp_path, [*WSD, "MAX_STEPS=80", f"STABLE_FROM={short}", "CHECKPOINT_EVERY=10"],
                              "killed", past_step_50)
    assert not (killed / "summary.json").exists()
    resumed = run_cli(tmp_path, "RESUME=killed")
    assert "transformer: resuming at step" in resumed.stdout
    assert summary_of(killed)["transformer"]["val_loss"] == direct["transformer"]["val_loss"]


def test_a_branch_is_refused_from_other_settings_a_longer_budget_or_no_stable_phase(tmp_path):
    run_cli(tmp_path, *WSD, "MAX_STEPS=40", "RUN_NAME=short")
    short = tmp_path / "results" / "short"
    before = sorted(p.name for p in (tmp_path / "results").iterdir())
    other = run_cli(tmp_path, *WSD, "MAX_STEPS=80", "LEARNING_RATE=1e-3", f"STABLE_FROM={short}", "RUN_NAME=o",
                    check=False)
    assert other.returncode != 0 and "LEARNING_RATE 0.003 there, 0.001 here" in other.stderr
    shorter = run_cli(tmp_path, *WSD, "MAX_STEPS=20", f"STABLE_FROM={short}", "RUN_NAME=s", check=False)
    assert shorter.returncode != 0 and "past this budget's cooldown start (step 16)" in shorter.stderr
    (short / "checkpoints" / "transformer-seed1337-stable.pt").unlink()
    missing = run_cli(tmp_path, *WSD, "MAX_STEPS=80", f"STABLE_FROM={short}", "RUN_NAME=m", check=False)
    assert missing.returncode != 0 and "has no stable phase for transformer-seed1337-stable.pt" in missing.stderr
    for proc in (other, shorter, missing):  # one error line (after the note that the empty folder went)
        assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in proc.stderr
    assert sorted(p.name for p in (tmp_path / "results").iterdir()) == before  # no half-made folders left
    assert (short / "summary.json").exists()
    shutil.rmtree(short / "checkpoints")


def test_several_models_branch_only_if_every_one_has_its_stable_phase(tmp_path):
    run_cli(tmp_path, *WSD, "MAX_STEPS=40", "RUN_NAME=short")  # the transformer's stable phase, no LSTM's
    short = tmp_path / "results" / "short"
    both = run_cli(tmp_path, *WSD, "MODELS=transformer,lstm", "MAX_STEPS=80", f"STABLE_FROM={short}",
                   "RUN_NAME=both", check=False)
    assert both.returncode != 0 and "has no stable phase for lstm-seed1337-stable.pt" in both.stderr, both.stderr
    assert "transformer: " not in both.stdout  # refused before the first model trained
    assert not (tmp_path / "results" / "both").exists()


def test_a_branch_and_a_resume_follow_their_data_to_another_folder_and_refuse_another_text(tmp_path):
    first = write_corpus(tmp_path / "data", 1)
    run_cli(tmp_path, *WSD, "MAX_STEPS=40", f"DATASET={first}", "RUN_NAME=short")
    short = tmp_path / "results" / "short"
    moved = tmp_path / "another" / "place"
    moved.parent.mkdir()
    shutil.move(first, moved)  # another machine, another folder: the same text
    branch = run_cli(tmp_path, *WSD, "MAX_STEPS=80", f"DATASET={moved}/", f"STABLE_FROM={short}", "RUN_NAME=b")
    assert summary_of(tmp_path / "results" / "b")["transformer"]["fit"]["branched_at_flops"] > 0, branch.stdout
    resumed = run_cli(tmp_path, "RESUME=short", f"DATASET={moved}", settings=[])
    assert "transformer: finished" in resumed.stdout
    other = write_corpus(tmp_path / "other", 2)  # another text
    refused = run_cli(tmp_path, *WSD, "MAX_STEPS=80", f"DATASET={other}", f"STABLE_FROM={short}", "RUN_NAME=o",
                      check=False)
    assert refused.returncode != 0 and "train_sha256" in refused.stderr and "there" in refused.stderr
    again = run_cli(tmp_path, "RESUME=short", f"DATASET={other}", settings=[], check=False)
    assert again.returncode != 0 and f"the data here is not the corpus {short} trained on" in again.stderr
    for proc in (refused, again):
        assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in proc.stderr
    assert not (tmp_path / "results" / "o").exists()


def test_a_wsd_budget_too_small_for_its_warm_up_and_cooldown_is_one_line(tmp_path):
    proc = run_cli(tmp_path, *WSD, "MAX_STEPS=5", "WARMUP_STEPS=5", check=False)  # cooldown from step 4
    assert proc.returncode != 0 and "too few for WARMUP_STEPS=5" in proc.stderr
    assert proc.stderr.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in proc.stderr


def test_a_study_refuses_a_point_record_edited_after_its_run_wrote_it(tmp_path):
    from reservoir.run.records import ResultsError, read_summary

    run_cli(tmp_path, "MODELS=ngram,lstm", "MAX_STEPS=3", "RUN_NAME=point")
    point = tmp_path / "results" / "point"
    assert [r["model"] for r in read_summary(point)] == ["ngram", "lstm"]
    text = (point / "summary.json").read_text()
    record = json.loads(text)[1]
    (point / "summary.json").write_text(text.replace(json.dumps(record["val_bpc"]), "1.0", 1))
    with pytest.raises(ResultsError, match="the record of lstm .seed 1337. was edited after its run wrote it"):
        read_summary(point)


def test_a_beta2_reference_that_rounds_beta2_to_one_is_refused_before_any_folder(tmp_path):
    proc = run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=3", f"ADAM_BETA2_REF_TOKENS={10**30}", "RUN_NAME=b",
                   check=False)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert "ADAM_BETA2_REF_TOKENS=" in proc.stderr and "which AdamW refuses" in proc.stderr
    assert not (tmp_path / "results" / "b").exists()
