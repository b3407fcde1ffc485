"""The model card (README.md) of an exported model, written from the run's signed records alone, and checked
against them when the model is loaded.

    text = model_card(config)          # config: the export's config.json content
    check_card(folder, config, record) # ExportError (one line) where the card's numbers are not the record's

Its front matter is the Hub's model-card metadata (license, library, tags, model-index) plus ``reservoir_nlp``:
the record's numbers, exact, which ``check_card`` compares with the record.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from reservoir.config import default_config, parse_literal
from reservoir.run.records import INTEGRITY_KEY

# the numbers a card states, each as the record names it
CARD_NUMBERS = ("val_bpc", "val_bpc_ci95", "train_split_bpc", "train_flops", "train_tokens", "train_steps", "epochs",
                "params_trainable", "params_total", "train_seconds", "eval_tokens")
# settings a command repeating the training leaves out: where one machine wrote and read, and how it was shown
NOT_IN_COMMAND = ("RESULTS_DIR", "RUN_NAME", "CACHE_DIR", "XLA_CACHE_DIR", "RESUME", "STABLE_FROM", "PLOTS",
                  "LOGGERS", "WANDB_PROJECT", "MODELS", "SEED", "SEEDS")
CORPORA = {"tinystories": "roneneldan/TinyStories", "shakespeare": "karpathy/tiny_shakespeare"}


def _argument(key: str, value) -> str:
    text = value if isinstance(value, str) and parse_literal(value) == value else repr(value)
    return shlex.quote(f"{key}={text}")


def training_command(requested: dict, model: str, seed: int) -> str:
    """The command that trains this model again: the run's settings where they differ from today's defaults,
    this model alone, on its seed (a study point's branch off its stable phase is bit-identical to it)."""
    defaults, args = default_config(), []
    for key, value in requested.items():
        if key in NOT_IN_COMMAND or key not in defaults:
            continue
        if isinstance(value, dict):
            if key == model.upper():
                args += [_argument(f"{key}.{k}", v) for k, v in value.items() if defaults[key].get(k) != v]
        elif value != defaults[key]:
            args.append(_argument(key, value))
    return " ".join(["python TinyStories.py", _argument("MODELS", model), _argument("SEED", seed), *args])


def card_numbers(record: dict) -> dict:
    return {key: record.get(key) for key in CARD_NUMBERS}


def _corpus(run: dict) -> tuple[str, str | None]:
    """(how the corpus is named, its Hub dataset id where it is one the card can link)."""
    data, dataset = run["data"], str(run["effective_config"].get("DATASET", ""))
    hub = next((hub for name, hub in CORPORA.items() if name in dataset.lower()), None)
    return data.get("data_description") or dataset, hub


def _number(value, digits: int = 4) -> str:
    if value is None:
        return "not recorded"
    return f"{value:,}" if isinstance(value, int) else f"{value:.{digits}g}"


def model_card(config: dict, license_id: str) -> str:
    """README.md for the export whose config.json content is ``config``."""
    import yaml

    run, record = config["run"], config["record"]
    effective, device, versions, data = run["effective_config"], run["device"], run["versions"], run["data"]
    corpus, hub_dataset = _corpus(run)
    family = config["family"]
    name = config.get("name") or family
    metadata = {
        "license": license_id, "library_name": "reservoir-nlp",
        "tags": ["reservoir-computing", "language-model", "character-level" if data["tokenizer"] == "char" else "bpe",
                 family.replace("+", "-plus")],
        **({"datasets": [hub_dataset]} if hub_dataset else {}),
        "model-index": [{"name": name, "results": [{
            "task": {"type": "text-generation", "name": "language modelling"},
            "dataset": {"name": corpus, "type": hub_dataset or "text"},
            "metrics": [{"type": "bits_per_character", "name": "validation bits per character",
                         "value": record["val_bpc"]}]}]}],
        "reservoir_nlp": {**card_numbers(record), "family": family, "record": record.get(INTEGRITY_KEY)},
    }
    frozen = record["params_total"] - record["params_trainable"]
    ci = record.get("val_bpc_ci95")
    protocol = (f"{record.get('eval_mode', effective['EVAL_MODE'])} evaluation of {_number(record.get('eval_tokens'))} "
                f"validation tokens at SEQ_LEN={effective['SEQ_LEN']}" + (
                    f", 95% interval ±{ci:.4f} (a bootstrap over story blocks)" if ci is not None else ""))
    command = training_command(run["requested_config"], config["model"], config["seed"])
    lines = [
        f"# {name}: `{family}`, a language model trained with ReservoirNLP",
        "",
        f"Family `{family}`, class {config['kind']}, trained part: {record.get('trained')}. Trained on {corpus}, "
        "exported from a ReservoirNLP run with its records. Every number below is the run's own record, also in "
        "`config.json`.",
        "",
        "| | |", "| --- | --- |",
        f"| validation bits/char | **{record['val_bpc']:.4f}**" + (f" ± {ci:.4f}" if ci is not None else "") + " |",
        f"| evaluation | {protocol} |",
        f"| training-split bits/char | {_number(record.get('train_split_bpc'))} |",
        f"| training FLOPs | {_number(record.get('train_flops'))} ({record.get('flops_convention', 'products')}) |",
        f"| training tokens | {_number(record.get('train_tokens'))} ({_number(record.get('epochs'), 3)} epochs, "
        f"{_number(record.get('train_steps'))} steps) |",
        f"| parameters | {record['params_trainable']:,} trained, {frozen:,} frozen |",
        f"| frozen tensors | {', '.join(config['frozen']) or 'none'} |",
        f"| corpus | {corpus}; train SHA-256 `{data.get('train_sha256', 'not recorded')}`, validation SHA-256 "
        f"`{data.get('val_sha256', 'not recorded')}` |",
        f"| tokenizer | {data['tokenizer']}, {config['vocab_size']} tokens (hash `{data['tokenizer_hash']}`) |",
        f"| seed | {config['seed']}" + (f", reservoir drawn with DRAW_SEED={effective['DRAW_SEED']}"
                                       if effective.get("DRAW_SEED") is not None else "") + " |",
        f"| trained on | {device.get('processor') or device.get('name')} ({device.get('name')}, "
        f"{device.get('precision')}), {_number(record.get('train_seconds'), 4)} s |",
        f"| software | torch {versions.get('torch')}, ReservoirNLP {versions.get('reservoir_nlp')}, Python "
        f"{versions.get('python')} |",
        f"| license | {license_id} |",
        "",
        "## Train it again",
        "",
        "```bash",
        command,
        "```",
        "",
        "## Load it",
        "",
        "```python",
        "from reservoir.share import Pretrained",
        "",
        "model = Pretrained.from_pretrained(\"<this folder, or user/name on the Hub>\")",
        "ids = model.tokenizer.encode(\"Once upon a time\")",
        "```",
        "",
        "or write stories with `python sample.py <this folder, or hf://user/name>` in a ReservoirNLP checkout.",
        *([f"The family comes from the plugin {', '.join(config['plugins'])}: load it where that file lies, "
           "with the same content (its SHA-256 is in `config.json`)."] if config.get("plugins") else []),
        "",
        "## Check it",
        "",
        "Loading checks every file: `config.json` and the run's records in it are signed "
        f"({_hash_note()}), `model.safetensors` must have the SHA-256 in `config.json` (`weights_sha256`), and this "
        "card's numbers (its front matter's `reservoir_nlp`) must be the record's. No file is unpickled.",
        "",
    ]
    front = yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True)
    return f"---\n{front}---\n\n" + "\n".join(lines)


def _hash_note() -> str:
    return (f"each object's `{INTEGRITY_KEY}` is `sha256:` and the SHA-256 of the object without that key, as JSON "
            "with sorted keys, no spaces and UTF-8 text")


def check_card(folder: Path, config: dict, record: dict) -> None:
    """The card's numbers are the record's: an edited card is one line naming the first number that differs."""
    from huggingface_hub import metadata_load

    from reservoir.share.folder import CARD, ExportError

    path = Path(folder) / CARD
    try:
        metadata = metadata_load(path) or {}
    except Exception as e:  # noqa: BLE001 - a card whose YAML does not parse, whatever the parser raises
        raise ExportError(f"{path}: its front matter is not readable YAML ({str(e).splitlines()[0][:120]}); "
                          "export the model again") from None
    stated = metadata.get("reservoir_nlp")
    if not isinstance(stated, dict):
        raise ExportError(f"{path} has lost its reservoir_nlp numbers (its front matter): export the model again")
    for key, value in card_numbers(record).items():
        if stated.get(key) != value:
            raise ExportError(f"{path} says {key} is {stated.get(key)!r}, the model's record says {value!r}: the card "
                              "was edited; export the model again")
    if stated.get("record") != record.get(INTEGRITY_KEY) or stated.get("family") != config["family"]:
        raise ExportError(f"{path} is the card of another record or family than config.json's: export the model again")
    written = set(path.read_text(encoding="utf-8").splitlines())
    for line in model_card({**config, "record": record}, config.get("license", "other")).splitlines():
        if line.startswith("| ") and line != "| | |" and line not in written:  # a row of numbers, edited or gone
            raise ExportError(f"{path}: its row {line.split('|')[1].strip()!r} is not what the record says "
                              f"({line.strip()}): the card was edited; export the model again")
