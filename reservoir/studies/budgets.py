"""What every study shares about budgets: FLOP budgets parsed from a command line, the run folder
of a budget (``point_name``), and what one training step of a model costs (``step_cost``).
"""

from __future__ import annotations

from reservoir.config import is_integer, is_number
from reservoir.platform.messages import OneLineError


class StudyError(OneLineError, ValueError):
    """A study that cannot run as asked: reported as one line."""


def positive_numbers(key: str, value, example: str, error=None, integers: bool = False) -> list:
    """``KEY=1e12,2e12`` (or a Python list) as numbers, each finite and > 0 (whole with ``integers``); a
    one-line ``error`` (StudyError) naming ``key`` and an ``example`` otherwise."""
    items = value if isinstance(value, (list, tuple)) else [v for v in str(value).strip("[]() ").split(",")
                                                            if v.strip()]
    numbers = []
    for item in items:
        try:
            number = float(item) if isinstance(item, str) else item
        except ValueError:
            number = None
        if not is_number(number) or number <= 0 or (integers and not is_integer(number)):
            raise (error or StudyError)(f"{key} must be positive {'integers' if integers else 'numbers'}, got "
                                        f"{item!r}; e.g. {key}={example}")
        numbers.append(int(number) if integers else float(number))
    return numbers


def parse_budgets(value) -> list[float]:
    """BUDGETS=1e12,2e12,... (or a Python list) in FLOPs: at least two, each > 0, strictly increasing."""
    budgets = positive_numbers("BUDGETS", value, "1e12,4e12,1.6e13")
    if len(budgets) < 2:
        raise StudyError(f"BUDGETS needs at least two budgets for a ladder, got {len(budgets)}; "
                         "e.g. BUDGETS=1e12,4e12,1.6e13")
    if any(b <= a for a, b in zip(budgets, budgets[1:], strict=False)):
        raise StudyError(f"BUDGETS must increase strictly, got {', '.join(f'{b:g}' for b in budgets)}")
    return budgets


def study_name(own: dict, default: str, error=None) -> str:
    """The study's folder under RESULTS_DIR: STUDY's value, or ``default`` where STUDY is not given. ``STUDY=``
    with nothing after it is refused (it used to fall back to the default study silently)."""
    name = own.get("STUDY", default)
    if not name.strip():
        raise (error or StudyError)(f"STUDY= names no folder: give one (STUDY=my-study), or leave STUDY out for "
                                    f"{default!r}")
    if "/" in name or "\\" in name or name in (".", ".."):
        raise (error or StudyError)(f"STUDY must be a plain folder name, got {name!r}")
    return name


def point_name(budget: float) -> str:
    """The run folder of one budget: flops-2.50e12."""
    return "flops-" + f"{budget:.2e}".replace("+", "")


def step_cost(name: str, config: dict, data=None, counts: dict | None = None, model=None) -> tuple[float | None, int]:
    """(FLOPs of one training step of model ``name`` under ``config``, reservoir/run/flops.py; None for a model not
    trained by gradient steps) and its trained parameters, on ``data`` (prepared from ``config`` when not
    given: cached for the points); ``counts``: flops.sgd_step's, for models of this one's shape; ``model``: the
    model, built already (a batch size changes no model: a large reservoir is drawn once, not once a batch)."""
    from reservoir.data.tokens import prepare_data
    from reservoir.models import build_model
    from reservoir.models.settings import model_settings
    from reservoir.run import flops

    data = data or prepare_data(config)
    config = model_settings(config, name)
    model = model if model is not None else build_model(name, data.tokenizer.vocab_size, config)
    params = model.param_counts()["params_trainable"]
    if model.trainer != "sgd":
        return None, params
    return flops.sgd_step(model, data.tokenizer.vocab_size, config["BATCH_SIZE"], config["SEQ_LEN"],
                          config["GRAD_ACCUM"], counts=counts).per_step, params
