"""Each model's own learning rate and batch size (reservoir/models/settings.py): where the run leaves LEARNING_RATE
or BATCH_SIZE None, every model trains with its block's learning_rate / batch_size (how the defaults give each
family its frontier configuration); a run-wide value is every model's."""

import pytest

from reservoir.config import ConfigError, parse_overrides
from reservoir.models.settings import model_settings
from reservoir.platform.device import adjust_config
from tests.conftest import run_cli, run_script, summary_of


def test_a_run_wide_value_is_every_models_and_none_takes_each_models_own():
    own = ["LSTM.learning_rate=2e-3", "LSTM.batch_size=4", "TRANSFORMER.learning_rate=5e-4", "TRANSFORMER.batch_size=6"]
    config = parse_overrides(["DATASET=synthetic", "MODELS=lstm,transformer", "LEARNING_RATE=None",
                              "BATCH_SIZE=None", *own])
    assert (model_settings(config, "lstm")["LEARNING_RATE"], model_settings(config, "lstm")["BATCH_SIZE"]) == (2e-3, 4)
    assert model_settings(config, "transformer")["BATCH_SIZE"] == 6
    run_wide = parse_overrides(["DATASET=synthetic", "MODELS=lstm,transformer", "LEARNING_RATE=1e-3",
                                "BATCH_SIZE=16", *own])
    for name in ("lstm", "transformer"):
        assert (model_settings(run_wide, name)["LEARNING_RATE"], model_settings(run_wide, name)["BATCH_SIZE"]) == \
            (1e-3, 16)
    tpu = adjust_config(config, "tpu")  # the TPU multipliers apply to a model's own values too
    assert model_settings(tpu, "lstm")["BATCH_SIZE"] == 8
    assert model_settings(tpu, "lstm")["LEARNING_RATE"] == pytest.approx(2.4e-3)
    assert config["LSTM"]["batch_size"] == 4  # the input is not modified


@pytest.mark.parametrize("args, message", [
    (["MODELS=lstm,transformer", "LEARNING_RATE=None", "LSTM.learning_rate=1e-3", "TRANSFORMER.learning_rate=None"],
     "LEARNING_RATE=None means each model's own TRANSFORMER.learning_rate, and TRANSFORMER.learning_rate is None"),
    (["MODELS=ngram,lstm", "BATCH_SIZE=None", "NGRAM.batch_size=None"],
     "BATCH_SIZE=None means each model's own NGRAM.batch_size"),
    (["LSTM.batch_size=0"], "LSTM.batch_size must be > 0"),
    (["LSTM.batch_size=2.5"], "LSTM.batch_size must be an integer"),
    (["LSTM.learning_rate=fast"], "LSTM.learning_rate must be a finite number"),
])
def test_bad_per_model_settings_are_one_line(args, message):
    with pytest.raises(ConfigError, match=message.replace(".", r"\.").replace("(", r"\(")):
        parse_overrides(["DATASET=synthetic", *args])


def test_each_model_trains_records_and_is_compared_with_its_own_batch_and_rate(tmp_path):
    run_cli(tmp_path, "MODELS=lstm,transformer", "LEARNING_RATE=None", "BATCH_SIZE=None", "LSTM.learning_rate=4e-3",
            "LSTM.batch_size=4", "TRANSFORMER.learning_rate=1e-3", "TRANSFORMER.batch_size=12", "MAX_STEPS=6",
            "RUN_NAME=own", "FINAL_EVAL_TOKENS=4096")
    records = summary_of(tmp_path / "results" / "own")
    for name, batch, rate in (("lstm", 4, 4e-3), ("transformer", 12, 1e-3)):
        assert (records[name]["batch_size"], records[name]["learning_rate"]) == (batch, rate)
        assert records[name]["train_tokens"] == 6 * batch * 32  # six steps of its own batch of SEQ_LEN=32
    run = tmp_path / "results" / "own"
    proc = run_script("compare.py", f"{run}:lstm", f"{run}:transformer", f"OUT={tmp_path / 'c.json'}")
    assert "A - B" in proc.stdout


def test_a_checkpoint_written_before_the_per_model_keys_still_resumes_and_branches(tmp_path):
    """Checkpoints record their model's block; one written before learning_rate and batch_size joined the blocks
    must still match (they are training settings, checked by the run's own, not the architecture)."""
    import torch

    run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=12", "LR_SCHEDULE=wsd", "RUN_NAME=old", "CHECKPOINT_EVERY=0")
    stable = tmp_path / "results" / "old" / "checkpoints" / "lstm-seed1337-stable.pt"
    payload = torch.load(stable, weights_only=False)
    assert set(payload["model_config"]) == {"embed_dim", "hidden", "layers", "dropout"}  # as checkpoints were
    run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=24", "LR_SCHEDULE=wsd", "RUN_NAME=longer",
            f"STABLE_FROM={tmp_path / 'results' / 'old'}")
    assert summary_of(tmp_path / "results" / "longer")["lstm"]["fit"]["branched_at_flops"] > 0


def test_a_checkpoint_that_recorded_its_blocks_rate_and_batch_still_matches(tmp_path):
    import torch

    run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=12", "LR_SCHEDULE=wsd", "RUN_NAME=old", "CHECKPOINT_EVERY=0")
    stable = tmp_path / "results" / "old" / "checkpoints" / "lstm-seed1337-stable.pt"
    payload = torch.load(stable, weights_only=False)
    payload["model_config"].update({"learning_rate": None, "batch_size": None})  # as a few points wrote it
    torch.save(payload, stable)
    run_cli(tmp_path, "MODELS=lstm", "MAX_STEPS=24", "LR_SCHEDULE=wsd", "RUN_NAME=longer",
            f"STABLE_FROM={tmp_path / 'results' / 'old'}")
    assert summary_of(tmp_path / "results" / "longer")["lstm"]["fit"]["branched_at_flops"] > 0


def test_a_sweeps_first_trial_is_the_models_own_rate(tmp_path):
    """LEARNING_RATE is None by default: the sweep's starting settings are the model's own rate (its block's)."""
    import optuna
    from optuna.storages.journal import JournalFileBackend, JournalStorage

    run_script("sweep.py", "MODEL=lstm", "TRIALS=1", "SWEEP_NAME=own", "DATASET=synthetic", "SYNTHETIC_STORIES=300",
               "SEQ_LEN=32", "MAX_STEPS=3", "FLOP_BUDGET=None", "TIME_BUDGET_S=None", "LSTM.hidden=32",
               "LSTM.learning_rate=4e-3", f"RESULTS_DIR={tmp_path / 'results'}", f"CACHE_DIR={tmp_path / 'cache'}")
    journal = JournalStorage(JournalFileBackend(str(tmp_path / "results" / "sweeps" / "own" / "journal.log")))
    [first] = optuna.load_study(study_name="own", storage=journal).trials
    assert first.params["LEARNING_RATE"] == pytest.approx(4e-3) and first.user_attrs["starting_settings"]


def test_resume_builds_an_older_run_as_it_was_not_with_todays_defaults(tmp_path):
    """The transformer's default recipe is '++' now: a run recorded before the recipe existed resumes as GPT-2."""
    import json

    from reservoir.run.records import INTEGRITY_KEY, _integrity
    from TinyStories import resolve_resume

    run_cli(tmp_path, "MODELS=transformer", "TRANSFORMER.recipe=gpt2", "MAX_STEPS=2", "RUN_NAME=old")
    path = tmp_path / "results" / "old" / "config.json"
    content = json.loads(path.read_text())
    for key in ("recipe", "rotary", "swiglu", "rmsnorm", "qk_norm"):  # as config.json was written before them
        content["requested_config"]["TRANSFORMER"].pop(key)
    content.pop(INTEGRITY_KEY)
    path.write_text(json.dumps({**content, INTEGRITY_KEY: _integrity(content)}))
    config, _ = resolve_resume(parse_overrides([f"RESULTS_DIR={tmp_path / 'results'}", "RESUME=old"]))
    assert config["TRANSFORMER"]["recipe"] == "gpt2" and config["TRANSFORMER"]["qk_norm"] is False


def test_every_block_has_both_keys_and_the_ngram_needs_no_rate():
    """Runs recorded since the per-model keys exist name both in every block: each must stay valid to RESUME."""
    from reservoir.config import SHARED_CONFIG, model_blocks

    assert all({"learning_rate", "batch_size"} <= set(SHARED_CONFIG[b]) for b in model_blocks())
    config = parse_overrides(["DATASET=synthetic", "MODELS=ngram", "LEARNING_RATE=None", "NGRAM.learning_rate=None"])
    assert model_settings(config, "ngram")["LEARNING_RATE"] is None
