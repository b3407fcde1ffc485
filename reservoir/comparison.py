"""Paired comparison of two trained models on the same validation targets.

    side = Side.parse("results/push-480:deep_linear_reservoir")   # a run folder and one of its models
    report = compare(side_a, side_b, tokens=None, device="auto")  # A - B in bits/char, 95% paired interval

Two intervals computed one model at a time overlap long before the models are alike: most of
their width is which stories happen to be hard, and that is the same for both models. Scoring
both on the same targets and resampling the same story blocks for both (a paired bootstrap)
measures only how much the *difference* varies. Every seed with a finished model is re-scored
from its checkpoint (the per-token losses are not kept by runs); the per-token losses are averaged
over seeds, so the difference is that of the mean bits/char over seeds. Each run's own evaluation
settings (EVAL_MODE, SEQ_LEN, EVAL_STRIDE) apply to its model, and each re-scored bits/char is
reported next to the one its run recorded.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from . import device as dev
from .data import prepare_data, tokenizer_hash
from .evaluation import BOOTSTRAP_SAMPLES, Evaluator, scored_count
from .results import ResultsError, read_json
from .sampling import load_trained

SAME_DATA_KEYS = ("tokenizer_hash", "val_tokens", "val_chars", "val_stories")
REQUIRED_DATA_KEYS = ("tokenizer_hash", "val_tokens")


@dataclass
class Side:
    run_dir: Path
    model: str | None  # None: the run's best finished model

    @classmethod
    def parse(cls, text: str) -> Side:
        """'RUN_DIR' or 'RUN_DIR:MODEL'."""
        path, colon, model = text.rpartition(":")
        if not colon or "/" in model or not model:
            return cls(Path(text), None)
        return cls(Path(path), model)

    def label(self) -> str:
        return f"{self.run_dir.name}:{self.model}"


def _finished(side: Side) -> tuple[dict, list[dict]]:
    """The run's saved config and the summary rows (one per seed) of the side's scored model."""
    if not side.run_dir.is_dir():
        raise ResultsError(f"{side.run_dir} is not a folder; give a run folder such as results/<run>[:<model>]")
    config_json = read_json(side.run_dir / "config.json", "the run's config")
    summary_path = side.run_dir / "summary.json"
    rows = read_json(summary_path, "the run's summary") if summary_path.exists() else []
    scored = [r for r in rows if r.get("val_bpc") is not None]
    if side.model is None:
        if not scored:
            raise ResultsError(f"{side.run_dir} has no finished model with a score yet")
        side.model = min(scored, key=lambda r: r["val_bpc"])["model"]
    models = config_json["effective_config"]["MODELS"]
    if side.model not in models:
        raise ResultsError(f"{side.model!r} is not a model of {side.run_dir} (its models: {', '.join(models)})")
    mine = [r for r in scored if r["model"] == side.model]
    if not mine:
        raise ResultsError(f"{side.run_dir}: {side.model} has no finished, scored training yet; finish the run "
                           "(python TinyStories.py RESUME=...) before comparing it")
    return config_json, mine


def compare(side_a: Side, side_b: Side, tokens: int | None = None, device: str = "cpu") -> dict:
    (config_a, rows_a), (config_b, rows_b) = _finished(side_a), _finished(side_b)
    for key in SAME_DATA_KEYS:  # runs older than a key do not record it: the others must then agree
        if key not in REQUIRED_DATA_KEYS and None in (config_a["data"].get(key), config_b["data"].get(key)):
            continue
        if config_a["data"].get(key) != config_b["data"].get(key):
            raise ResultsError(f"the two runs were not evaluated on the same text ({key}: "
                               f"{config_a['data'].get(key)} against {config_b['data'].get(key)}); a paired "
                               "comparison needs the same validation data and tokenizer")
    settings_a = config_a["effective_config"]
    data = prepare_data(settings_a)
    if tokenizer_hash(data.tokenizer) != config_a["data"]["tokenizer_hash"] or data.val.size != \
            config_a["data"]["val_tokens"]:
        raise ResultsError(f"the data that DATASET={settings_a['DATASET']!r} gives here is not what "
                           f"{side_a.run_dir} was trained and scored on; run from the folder the run was "
                           "started in, with the same data")
    if tokens is None:  # what both runs' final evaluations scored
        tokens = min(c["effective_config"]["FINAL_EVAL_TOKENS"] or len(data.val) for c in (config_a, config_b))
    info = dev.select_device({"DEVICE": device})
    sides = {}
    for name, side, config_json, rows in (("a", side_a, config_a, rows_a), ("b", side_b, config_b, rows_b)):
        settings = config_json["effective_config"]
        evaluator = Evaluator(data, settings, settings["BATCH_SIZE"], tokens)
        per_seed, rescored = [], []
        for row in rows:
            model, _, _ = load_trained(side.run_dir, side.model, row.get("seed"))
            where = dev.sampling_device(info, getattr(model, "host_only", False))  # on XLA: the CPU
            nats = evaluator.token_nats(model.to(where), info, where)
            per_seed.append(nats)
            rescored.append(float(nats.sum() / evaluator.chars / np.log(2)))
        sides[name] = (evaluator, np.mean(per_seed, axis=0))
        sides[name + "_report"] = {
            "run": str(side.run_dir), "model": side.model, "seeds": [r.get("seed") for r in rows],
            "bpc_per_seed": rescored, "bpc": float(np.mean(rescored)),
            "recorded_bpc_per_seed": [r["val_bpc"] for r in rows],
            "recorded_eval_tokens": [r.get("eval_tokens") for r in rows],
            "eval_mode": settings["EVAL_MODE"]}
    evaluator, nats_a = sides["a"]
    _, nats_b = sides["b"]
    return {"a": sides["a_report"], "b": sides["b_report"], "eval_tokens": scored_count(data, tokens),
            "bootstrap": f"paired: the same {BOOTSTRAP_SAMPLES} resamples of story-aligned blocks for both",
            **evaluator.paired_difference(nats_a, nats_b)}


def describe(report: dict) -> str:
    """The report as lines for a person."""
    lines = []
    for key in ("a", "b"):
        side = report[key]
        seeds = ", ".join(f"{b:.4f}" for b in side["bpc_per_seed"])
        recorded = ", ".join(f"{b:.4f}" for b in side["recorded_bpc_per_seed"])
        lines.append(f"{key.upper()} = {Path(side['run']).name}:{side['model']}: {side['bpc']:.4f} bits/char over "
                     f"{len(side['seeds'])} seed(s) [{seeds}] (its run recorded [{recorded}])")
    lines.append(f"A - B = {report['bpc_difference']:+.4f} bits/char, 95% paired interval "
                 f"[{report['ci95_low']:+.4f}, {report['ci95_high']:+.4f}] on {report['eval_tokens']:,} tokens; "
                 f"A worse in {report['share_of_resamples_a_worse']:.1%} of the resamples")
    return "\n".join(lines)
