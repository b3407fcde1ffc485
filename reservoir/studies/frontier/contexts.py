"""CONTEXTS=True: what context is worth to each family at the grid's top budget.

Each family's envelope point there (its first seed) is scored again at evaluation contexts of 32, 128 and 512
tokens (windows slid by half their length, for every model) and through the whole stream (the state carried,
for every model that has one); and the two leaders ("the transformer" and the best reservoir family) are
trained once more at 4 x SEQ_LEN (512 for the grid's 128) at the same FLOPs and the same tokens per step (a
quarter of the batch), in ``contexts/<cell>+seq512/``, and scored the same way. The scores go to
``<study>/context-scores.json`` (committed, signed); the long-context runs' records to points.jsonl, as every
point's.
"""

from __future__ import annotations

from pathlib import Path

from reservoir.data.tokens import prepare_data
from reservoir.models.settings import model_settings
from reservoir.platform import device as dev
from reservoir.run.evaluation import CONTEXTS, context_scores
from reservoir.run.records import read_signed_json, write_signed_json
from reservoir.run.trained import load_trained
from reservoir.studies.budgets import point_name

CONTEXT_FILE = "context-scores.json"
CONTEXT_FOLDER = "contexts"
LONG_CONTEXT_FACTOR = 4  # the leaders' training context in this stage: 4 x SEQ_LEN (512 for the grid's 128)


def long_context_settings(batch_size: int, seq_len: int) -> list[str]:
    """4 x SEQ_LEN with the batch that keeps the tokens per step (and so the steps at a budget) the grid's."""
    return [f"SEQ_LEN={seq_len * LONG_CONTEXT_FACTOR}", f"BATCH_SIZE={max(1, round(batch_size / LONG_CONTEXT_FACTOR))}"]


def long_context_name(family_or_cell: str, seq_len: int) -> str:
    return f"{family_or_cell}+seq{seq_len * LONG_CONTEXT_FACTOR}"


def long_context_folder(study_path: Path, cell_name: str, budget: float, seq_len: int) -> Path:
    return Path(study_path) / CONTEXT_FOLDER / long_context_name(cell_name, seq_len) / point_name(budget)


def read_context_scores(study_path: Path) -> dict | None:
    """The study's context scores, checked against their integrity hash; None where the stage has not run."""
    file = Path(study_path) / CONTEXT_FILE
    if not file.exists():
        return None
    return read_signed_json(file, "the study's context scores",
                            "restore it as the study wrote it (git checkout), or delete it and run the study's "
                            "command again, which scores the points again")


def context_table(study_path: Path, store) -> dict | None:
    """The context scores as a report shows them: each row with the tokens its point trained on (its record's),
    since at one FLOP budget a longer window buys fewer tokens where attention pays its T x T square."""
    scores = read_context_scores(study_path)
    if not scores:
        return scores
    rows = {}
    for name, row in scores["rows"].items():
        records = store.summary(Path(study_path) / row["point"]) or []
        rows[name] = {**row, "train_tokens": next((r.get("train_tokens") for r in records
                                                   if r.get("seed") == row["seed"]), None)}
    return {**scores, "rows": rows}


def score_point(folder: Path, model_name: str, seed: int, data_cache: dict) -> dict:
    """Bits/char of one trained point at every evaluation context, on its run's final evaluation tokens."""
    model, _, run = load_trained(folder, model_name, seed)
    settings = model_settings(run.config, model_name)
    key = (settings.get("DATASET"), settings.get("DATA_DIR"), settings.get("TOKENIZER"), settings.get("VOCAB_SIZE"))
    if key not in data_cache:
        data_cache[key] = prepare_data(settings)
    info = dev.select_device({"DEVICE": "cpu"})
    scores = context_scores(model, data_cache[key], settings, info, info.device, settings["FINAL_EVAL_TOKENS"])
    return {"seq_len": settings["SEQ_LEN"], "scores": scores, "contexts": [*map(str, CONTEXTS), "stream"]}


def write_context_scores(study_path: Path, content: dict) -> Path:
    file = Path(study_path) / CONTEXT_FILE
    write_signed_json(file, content)
    return file
