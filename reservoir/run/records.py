"""A run's records as it wrote them, read back and checked.

    results/<run>/config.json      effective config, versions, device, data, world size; an integrity hash
    results/<run>/summary.json     one record per finished model and seed, each with its integrity hash
    results/<run>/metrics.jsonl    one line per evaluation (model, step, tokens, seconds, losses, val_bpc)
    results/<run>/train_log.jsonl  one line per training-loss read (model, step, tokens, seconds, train_loss, lr)

``read_run_config`` and ``read_summary`` refuse an edited or damaged record in one line; ``SUMMARY_FIELDS``
and ``point_scores`` are the one definition of what a point's record holds for the studies and reports.
Every JSON file is replaced atomically.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

from reservoir.platform.files import atomic_write_text, portable_path, portable_paths_in, repository_path
from reservoir.platform.messages import OneLineError, warn

# what every record of summary.json holds (a model's fit adds its own facts beside these)
SUMMARY_FIELDS = ("model", "trained", "params_total", "params_trainable", "train_seconds", "train_tokens",
                  "tokens_per_second", "val_loss", "val_ppl", "val_bpc", "device", "precision", "data_source",
                  "tokenizer", "vocab_size", "seed")
# what a study's report row takes from a record: {row field: record field} (a row says "params_trained")
SCORE_FIELDS = {"seed": "seed", "status": "status", "val_bpc": "val_bpc", "val_bpc_ci95": "val_bpc_ci95",
                "train_split_bpc": "train_split_bpc", "params_trained": "params_trainable",
                "train_flops": "train_flops", "train_tokens": "train_tokens", "epochs": "epochs",
                "train_seconds": "train_seconds", "data_source": "data_source"}


SPENT = 0.95  # a budget this far spent ended its fit (a closed-form fit stops one chunk short of its FLOPs)


def steady_rate(record: dict) -> float | None:
    """A fit's training tokens/s after its warm-up (the fit's step_seconds: compiling and caches left out), None
    where it has none (a closed-form fit, or one that ended inside its warm-up)."""
    seconds = (record.get("fit") or {}).get("step_seconds")
    return record["train_tokens"] / record["train_steps"] / seconds if seconds and record.get("train_steps") else None


def cut_short(record: dict) -> bool:
    """Whether TIME_BUDGET_S ended a fit before the step, token or FLOP budget it was given."""
    share = record.get("budget_spent")
    return record.get("bound_by") == "seconds" and share is not None and share < SPENT


def device_share(record: dict) -> float:
    """The share of its device a fit had: 1, or 1 / K for a point trained folded with others, K in all
    (reservoir/run/group.py: ``fit.folded_with``), whose seconds every member records whole."""
    return 1 / ((record.get("fit") or {}).get("folded_with") or 1)


def device_seconds(record: dict) -> float | None:
    """The seconds of its device a fit used: its training loop's seconds times its ``device_share``."""
    seconds = record.get("train_seconds")
    return seconds if seconds is None else seconds * device_share(record)


def point_scores(record: dict, folder: Path) -> dict:
    """The fields every row of a study's report takes from a run's record (grid points, references,
    controls), and the folder the record belongs to (relative to the checkout where it lies in it); a folded
    point's ``train_seconds`` are its share of its group's (``device_seconds``), so families compare by the
    device time each point took, folded or not."""
    return {**{row: record.get(field) for row, field in SCORE_FIELDS.items()}, "train_seconds": device_seconds(record),
            "folder": repository_path(folder)}


class ResultsError(OneLineError, ValueError):
    """A results folder that cannot be used as asked: reported as one line."""


def run_seeds(config: dict) -> list[int]:
    """The seeds every model is trained with: SEEDS, or just SEED."""
    return list(config.get("SEEDS") or [config["SEED"]])


def finite_or_none(obj):
    """``obj`` with every NaN or infinity replaced by None: result files stay valid JSON."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_none(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_none(v) for v in obj]
    return obj


def write_json_atomic(path: Path, obj, indent: int | None = 2) -> None:
    """``indent=None``: one compact line, for a machine-read file that travels in the repository."""
    separators = None if indent is not None else (",", ":")
    atomic_write_text(path, json.dumps(finite_or_none(obj), indent=indent, separators=separators, ensure_ascii=False,
                                       allow_nan=False) + "\n")


def read_json(path: Path, what: str, remedy: str = "the run folder is damaged"):
    """``path``'s JSON; a missing or damaged file is one line (a damaged one's ends with ``remedy``)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ResultsError(f"{path} is missing: is {Path(path).parent} a ReservoirNLP run folder?") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ResultsError(f"{path} ({what}) is not valid JSON ({e}); {remedy}") from None


INTEGRITY_KEY = "integrity"  # config.json's hash of its own content, written with it


def _integrity(content: dict) -> str:
    body = {k: v for k, v in content.items() if k != INTEGRITY_KEY}
    try:  # content read from a file is finite as written: walking it first cost a report seconds
        text = json.dumps(body, sort_keys=True, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    except ValueError:
        text = json.dumps(finite_or_none(body), sort_keys=True, ensure_ascii=False, allow_nan=False,
                          separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


class RecordedConfig(dict):
    """A run's config.json as read: a key it lacks is a one-line ResultsError naming the file and the
    key (``effective_config.MODELS``), never a KeyError traceback in whatever reads it."""

    def __init__(self, content: dict, where: Path, trail: str = ""):
        super().__init__(content)
        self.where, self.trail = where, trail

    def __getitem__(self, key):
        try:
            value = super().__getitem__(key)
        except KeyError:
            raise ResultsError(f"{self.where} is damaged: it has no {self.trail}{key}; start a new run (or "
                               "restore the run folder from a copy)") from None
        return RecordedConfig(value, self.where, f"{self.trail}{key}.") if isinstance(value, dict) else value


_UNCHECKED_SAID: set[Path] = set()


def divergence(record: dict) -> str:
    """How a diverged model's record says it stopped: "diverged at step N (reason)"."""
    return f"diverged at step {record.get('diverged_at_step')} ({record.get('reason')})"


def read_summary(run_dir: Path, what: str = "the run's summary") -> list[dict]:
    """A run's summary.json for a study or report to build on, checked (``check_summary``)."""
    path = Path(run_dir) / "summary.json"
    return check_summary(read_json(path, what), path)


def check_summary(records, where, remedy: str = "undo the edit, or delete that run folder and run the same command "
                  "again to redo it") -> list[dict]:
    """``records`` (a summary.json's content, read from ``where``) as a study may use them: each record must
    still match the integrity hash the run wrote with it, so an edited score is refused in one line, not
    reported. (The hash guards against accidents and stray edits, not against someone who recomputes it.)
    Records written before summaries carried a hash are used with one warning."""
    if not isinstance(records, list) or not all(isinstance(r, dict) for r in records):
        raise ResultsError(f"{where} is damaged: it is not a list of records; re-run that point (delete the folder)")
    for record in records:
        _verify(record, where, "summaries", f"{where}: the record of {record.get('model')} (seed "
                f"{record.get('seed')}) was edited after its run wrote it (its integrity hash no longer matches); "
                f"{remedy}")
    return records


def _verify(content: dict, path: Path, older: str, edited: str) -> None:
    """Refuse ``content`` whose integrity hash no longer matches it (``edited``: the one-line error); content
    written before ``older`` carried a hash is used, with one warning per file."""
    recorded = content.get(INTEGRITY_KEY)
    if recorded is None:
        if path not in _UNCHECKED_SAID:
            _UNCHECKED_SAID.add(path)
            warn(f"{path} was written before {older} recorded an integrity hash: used without that check")
    elif recorded != _integrity(content):
        raise ResultsError(edited)


def signed(content: dict) -> dict:
    """``content`` with its integrity hash (anew, where it had one)."""
    body = {k: v for k, v in content.items() if k != INTEGRITY_KEY}
    return {**body, INTEGRITY_KEY: _integrity(body)}


def write_signed_json(path: Path, content: dict) -> None:
    """``content`` with its integrity hash, as a run's config.json is written (``read_signed_json`` checks it)."""
    write_json_atomic(path, signed(content))


PATH_KEYS = ("DATASET", "DATA_DIR", "TRAIN_PATH", "VAL_PATH", "RESULTS_DIR", "CACHE_DIR", "XLA_CACHE_DIR",
             "STABLE_FROM", "RESUME")  # settings that name a place on the machine that ran


def portable_config(content: dict) -> dict:
    """A run's config.json (checked) as it is committed: every absolute path in its settings and its data's
    description made relative to the repository (a corpus is known by its hashes, not where it lay), signed
    anew. The run folder's own file keeps the paths it ran with."""
    out = dict(content)
    for block in ("requested_config", "effective_config"):
        if isinstance(out.get(block), dict):
            out[block] = {k: portable_path(v) if k in PATH_KEYS else v for k, v in out[block].items()}
            if isinstance(out[block].get("PLUGINS"), list):  # a plugin by its path from the repository, or module
                out[block]["PLUGINS"] = [portable_path(v) for v in out[block]["PLUGINS"]]
    if isinstance(out.get("plugins"), dict):
        out["plugins"] = {portable_path(k): v for k, v in out["plugins"].items()}
    data = out.get("data")
    if isinstance(data, dict) and isinstance(data.get("data_description"), str):
        out["data"] = {**data, "data_description": portable_paths_in(data["data_description"])}
    return signed(out) if INTEGRITY_KEY in content else out


def read_signed_json(path: Path, what: str, remedy: str, always_signed: bool = False) -> dict:
    """A file ``write_signed_json`` wrote, trusted only as written: an edited or damaged one is refused in one
    line that ends with ``remedy``; one written before such files were signed is used with one warning, unless
    every version wrote its hash (``always_signed``), where one without it has lost it and is refused."""
    content = read_json(path, what, f"it is damaged (cut short, or edited); {remedy}")
    if not isinstance(content, dict):
        raise ResultsError(f"{path} ({what}) is damaged: it is not a JSON object; {remedy}")
    if always_signed and INTEGRITY_KEY not in content:
        raise ResultsError(f"{path} ({what}) has lost its integrity hash, which every version that writes it "
                           f"records: it is trusted only as it was written; {remedy}")
    _verify(content, Path(path), what, f"{path} ({what}) was edited or damaged after it was written (its integrity "
            f"hash no longer matches); {remedy}")
    return {k: v for k, v in content.items() if k != INTEGRITY_KEY}


EXPORTED_WEIGHTS = "model.safetensors"  # what marks an exported model's folder (reservoir/share/)


def refuse_export(folder: Path, setting: str) -> None:
    """One line where ``folder`` is an exported model: its weights alone, without the optimizer's state, the data's
    position or the run's other models, cannot be resumed or branched off."""
    if (Path(folder) / EXPORTED_WEIGHTS).is_file():
        raise ResultsError(f"{folder} is an exported model (its weights alone: no optimizer state, data position or "
                           f"checkpoints), not a run folder: {setting} takes the run folder it was exported from")


def read_run_config(run_dir: Path, setting: str = "this") -> RecordedConfig:
    """A run's config.json, trusted only as the run wrote it (``check_run_config``); an exported model's folder is
    refused in one line that names ``setting``."""
    refuse_export(run_dir, setting)
    path = Path(run_dir) / "config.json"
    return check_run_config(read_json(path, "the run's config"), path)


def check_run_config(content, where, remedy: str = "undo the edit, or start a new run with the settings you "
                     "want") -> RecordedConfig:
    """``content`` (a config.json's, read from ``where``) trusted only as the run wrote it: its integrity hash
    must match (an edited or damaged record is refused in one line), and a key it lacks is a one-line error
    when read."""
    if not isinstance(content, dict):
        raise ResultsError(f"{where} is damaged: it is not a JSON object; start a new run")
    if INTEGRITY_KEY not in content and (content.get("versions") or {}).get("reservoir_nlp"):
        raise ResultsError(f"{where} has lost its integrity hash, though the version that wrote it "
                           f"({content['versions']['reservoir_nlp']}) writes one: a run folder is trusted only as "
                           "the run wrote it; restore the folder from a copy, or start a new run")
    _verify(content, where, "runs", f"{where} was edited or damaged after the run wrote it (its integrity hash no "
            f"longer matches): a run folder is trusted only as the run wrote it; {remedy}")
    return RecordedConfig(content, where)


def read_metrics(run_dir: Path, file: str = "metrics.jsonl", repair: bool = False) -> list[dict]:
    """The evaluations (or, with ``file="train_log.jsonl"``, the training-loss reads) of a run.

    A last line without its newline is a write that was cut off (a full disk, a kill): it is
    left out, and with ``repair`` cut off the file, saying so. Any other bad row is an error.
    """
    path = Path(run_dir) / file
    if not path.exists():
        return []
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ResultsError(f"{path} is not UTF-8 text; the run folder is damaged") from None
    lines = text.split("\n")
    torn = lines.pop()  # '' when the file ends with a newline, else a cut-off last write
    if torn.strip():
        if repair:
            with open(path, "r+b") as f:
                f.truncate(len(text.encode("utf-8")) - len(torn.encode("utf-8")))
            warn(f"{path}: its last line was cut off (an interrupted write) and has been removed")
    rows = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            raise ResultsError(f"{path} line {n} is not valid JSON; the run folder is damaged") from None
        if not (isinstance(row, dict) and isinstance(row.get("model"), str) and isinstance(row.get("step"), int)
                and not isinstance(row.get("step"), bool)):
            raise ResultsError(f"{path} line {n} is not a metrics row (an object with a model name and an "
                               "integer step); the run folder is damaged")
        rows.append(row)
    return rows
