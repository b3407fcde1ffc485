"""The run's settings as one model trains with them.

    config = model_settings(run_config, "transformer")   # LEARNING_RATE, BATCH_SIZE: the run's, or the model's own

A run-wide LEARNING_RATE or BATCH_SIZE is every model's; where the run leaves it None, each model takes
its block's own (``TRANSFORMER.learning_rate``, ``LSTM.batch_size``): how the defaults give every family
its best configuration from the frontier study (reservoir/config.py validates that each model then has one).
"""

from __future__ import annotations

PER_MODEL = {"LEARNING_RATE": "learning_rate", "BATCH_SIZE": "batch_size"}  # run key -> the block's own


def model_settings(config: dict, name: str) -> dict:
    """``config`` with LEARNING_RATE and BATCH_SIZE as model ``name`` trains with them."""
    block = config.get(name.upper()) or {}
    own = {key: block.get(name_in_block) for key, name_in_block in PER_MODEL.items() if config.get(key) is None}
    return {**config, **own} if own else config
