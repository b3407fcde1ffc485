"""The frontier study (issue #32): the training split scored as the validation split is (the train/validation
gap of repeated epochs), the leaders carried to a larger budget, and REPORT.md written from records alone."""

from tests.conftest import run_cli, summary_of


def test_the_final_evaluation_also_scores_the_training_split_by_the_same_protocol(tmp_path):
    run_cli(tmp_path, "MODELS=ngram", "NGRAM.order=6", "MAX_STEPS=1", "RUN_NAME=r", "TRAIN_EVAL_TOKENS=4096")
    record = summary_of(tmp_path / "results" / "r")["ngram"]
    assert record["train_split_tokens"] == 4096
    # an order-6 n-gram has counted every training 6-gram it is scored on: it knows the training text better
    assert 0 < record["train_split_bpc"] < record["val_bpc"]
    assert record["train_split_loss"] < record["val_loss"]
    run_cli(tmp_path, "MODELS=ngram", "MAX_STEPS=1", "RUN_NAME=r2", "TRAIN_EVAL_TOKENS=None")
    assert "train_split_bpc" not in summary_of(tmp_path / "results" / "r2")["ngram"]
