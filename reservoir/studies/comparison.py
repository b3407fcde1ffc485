"""Paired comparison of two trained models on the same validation targets.

    side = Side.parse("results/push-480:deep_linear_reservoir")   # a run folder and one of its models
    side = Side.parse("results/r1+results/r2:lstm")               # the seeds of several runs, pooled
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

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from reservoir.data.tokenizers import tokenizer_hash
from reservoir.data.tokens import prepare_data
from reservoir.models.settings import model_settings
from reservoir.platform import device as dev
from reservoir.run.evaluation import BOOTSTRAP_SAMPLES, Evaluator
from reservoir.run.records import ResultsError, divergence
from reservoir.share import load_trained, run_records
from reservoir.share.folder import hub_id, is_export
from reservoir.studies.diagnostics import diagnose

SAME_DATA_KEYS = ("tokenizer_hash", "val_tokens", "val_chars", "val_stories")
REQUIRED_DATA_KEYS = ("tokenizer_hash", "val_tokens")


@dataclass
class Side:
    run_dirs: list[Path]  # one run, or several runs of the same model with different seeds
    model: str | None  # None: the best finished model of the run(s)

    @classmethod
    def parse(cls, text: str) -> Side:
        """'RUN_DIR', 'RUN_DIR:MODEL' or 'RUN_DIR+RUN_DIR...:MODEL' (seeds pooled across the runs)."""
        path, colon, model = text.rpartition(":")
        if not colon or "/" in model or not model:
            path, model = text, None
        return cls(_run_folders(path), model)

    def label(self) -> str:
        return f"{'+'.join(d.name for d in self.run_dirs)}:{self.model}"


def _run_folders(text: str) -> list[Path]:
    """'A+B+...' as the run folders it names: '+' joins runs, and may also be part of a folder's name (a
    Transformer++ point: transformer++-xs-lr0.004-b8), so the pieces are the split into folders that exist;
    where none does, the plain split (whose missing folder the caller then names)."""
    pieces = text.split("+")

    def folders_from(start: int) -> list[Path] | None:
        if start == len(pieces):
            return []
        for end in range(len(pieces), start, -1):  # the longest name first
            candidate = "+".join(pieces[start:end])
            if candidate and Path(candidate).is_dir():
                rest = folders_from(end)
                if rest is not None:
                    return [Path(candidate), *rest]
        return None

    return folders_from(0) or [Path(p) for p in pieces if p]


@dataclass
class Trained:
    """One finished seed of a side's model: its run's saved config and its summary row."""

    run_dir: Path
    config_json: dict
    row: dict


def _identity(trained: list[Trained]) -> list[tuple]:
    return sorted((str(t.run_dir.resolve()), t.row["model"], t.row.get("seed")) for t in trained)


def _finished(side: Side) -> list[Trained]:
    runs = []
    for source in side.run_dirs:
        if hub_id(source) is None and not source.is_dir():
            raise ResultsError(f"{source} is not a folder; give a run folder such as results/<run>[:<model>], an "
                               "exported model's folder or its Hub id (hf://user/name)")
        runs.append(run_records(source))
    if side.model is None:
        scored = [r for _, _, rows in runs for r in rows if r.get("val_bpc") is not None]
        if not scored:
            raise ResultsError(f"{side.label()} has no finished model with a score yet")
        side.model = min(scored, key=lambda r: r["val_bpc"])["model"]
    trained = []
    for run_dir, config_json, rows in runs:
        models = config_json["effective_config"]["MODELS"]
        if is_export(run_dir) and side.model not in [r["model"] for r in rows]:  # it holds one of its run's models
            raise ResultsError(f"{run_dir} is an exported model of {rows[0]['model'] if rows else 'one model'} alone, "
                               f"not {side.model}: compare {side.model} from the run folder it was exported from "
                               f"(<run>:{side.model}), or export that model too")
        if side.model not in models:
            raise ResultsError(f"{side.model!r} is not a model of {run_dir} (its models: {', '.join(models)})")
        trained += [Trained(run_dir, config_json, r) for r in rows if r["model"] == side.model
                    and r.get("val_bpc") is not None]
        diverged = [r for r in rows if r["model"] == side.model and r.get("status") == "diverged"]
        if diverged and not trained:
            raise ResultsError(f"{side.label()}: {side.model} {divergence(diverged[-1])} in {run_dir}, so it has no "
                               "score to compare (a resume does not retry it); train it again with the change its "
                               "record suggests, in a new run")
    if not trained:
        raise ResultsError(f"{side.label()}: {side.model} has no finished, scored training yet; finish the run "
                           f"(python TinyStories.py RESUME={runs[0][0]}) before comparing it")
    seeds = [t.row.get("seed") for t in trained]
    if len(set(seeds)) != len(seeds):
        raise ResultsError(f"{side.label()}: the runs share a training seed of {side.model} ({seeds}); "
                           "pool only runs with different seeds")
    return trained


def _same_text(trained: list[Trained]) -> None:
    first = trained[0]
    for other in trained[1:]:
        for key in SAME_DATA_KEYS:  # runs older than a key do not record it: the others must then agree
            mine, theirs = first.config_json["data"].get(key), other.config_json["data"].get(key)
            if key not in REQUIRED_DATA_KEYS and None in (mine, theirs):
                continue
            if mine != theirs:
                raise ResultsError(f"{first.run_dir} and {other.run_dir} were not evaluated on the same text "
                                   f"({key}: {mine} against {theirs}); a paired comparison needs the same "
                                   "validation data and tokenizer")


def compare(side_a: Side, side_b: Side, tokens: int | None = None, device: str = "cpu",
            diagnostics: bool = False, relative_to: Path | None = None) -> dict:
    """A - B with its paired interval; ``diagnostics`` also splits it by position and recall
    (reservoir/studies/diagnostics.py). ``relative_to``: the folder the report's runs are named from (a study's:
    its committed comparison then names no machine's layout), else as given."""
    trained = {"a": _finished(side_a), "b": _finished(side_b)}
    if _identity(trained["a"]) == _identity(trained["b"]):
        raise ResultsError(f"A and B are the same trained model ({side_a.label()}, the same seeds): their paired "
                           "difference is 0 by construction; name another model or run for one side")
    everything = trained["a"] + trained["b"]
    _same_text(everything)
    first = everything[0]
    settings = first.config_json["effective_config"]
    data = prepare_data(settings)
    if tokenizer_hash(data.tokenizer) != first.config_json["data"]["tokenizer_hash"] or data.val.size != \
            first.config_json["data"]["val_tokens"]:
        raise ResultsError(f"the data that DATASET={settings['DATASET']!r} gives here is not what "
                           f"{first.run_dir} was trained and scored on; run from the folder the run was "
                           "started in, with the same data")
    if tokens is None:  # what every run's final evaluation scored
        tokens = min(t.config_json["effective_config"]["FINAL_EVAL_TOKENS"] or len(data.val) for t in everything)
    info = dev.select_device({"DEVICE": device})
    settings = model_settings(settings, first.row["model"])
    pairing = Evaluator(data, settings, settings["BATCH_SIZE"], tokens)  # the targets and story blocks: same for all
    nats, reports = {}, {}
    for name, side in (("a", side_a), ("b", side_b)):
        per_seed, rescored = [], []
        for one in trained[name]:
            run_settings = model_settings(one.config_json["effective_config"], one.row["model"])
            evaluator = Evaluator(data, run_settings, run_settings["BATCH_SIZE"], tokens)
            model, _, _ = load_trained(one.run_dir, side.model, one.row.get("seed"))
            where = dev.sampling_device(info, model.host_only)  # on XLA: the CPU
            per_token = evaluator.token_nats(model.to(where), info, where)
            per_seed.append(per_token)
            rescored.append(float(per_token.sum() / evaluator.chars / np.log(2)))
        nats[name] = np.mean(per_seed, axis=0)
        reports[name] = {
            "runs": [_named(t.run_dir, relative_to) for t in trained[name]], "model": side.model,
            "seeds": [t.row.get("seed") for t in trained[name]], "bpc_per_seed": rescored,
            "bpc": float(np.mean(rescored)), "recorded_bpc_per_seed": [t.row["val_bpc"] for t in trained[name]],
            "eval_modes": [t.config_json["effective_config"]["EVAL_MODE"] for t in trained[name]]}
    report = {"a": reports["a"], "b": reports["b"], "eval_tokens": pairing.n,
              "bootstrap": f"paired: the same {BOOTSTRAP_SAMPLES} resamples of story-aligned blocks for both",
              **pairing.paired_difference(nats["a"], nats["b"])}
    if diagnostics:
        report["diagnostics"] = diagnose(pairing, nats["a"], nats["b"])
    return report


def _named(run_dir: Path, relative_to: Path | None) -> str:
    if relative_to is None:
        return str(run_dir)
    return Path(os.path.relpath(Path(run_dir).resolve(), Path(relative_to).resolve())).as_posix()


def describe(report: dict) -> str:
    """The report as lines for a person."""
    lines = []
    for key in ("a", "b"):
        side = report[key]
        seeds = ", ".join(f"{b:.4f}" for b in side["bpc_per_seed"])
        recorded = ", ".join(f"{b:.4f}" for b in side["recorded_bpc_per_seed"])
        runs = "+".join(dict.fromkeys(Path(r).name for r in side["runs"]))
        lines.append(f"{key.upper()} = {runs}:{side['model']}: {side['bpc']:.4f} bits/char over "
                     f"{len(side['seeds'])} seed(s) [{seeds}] (its run recorded [{recorded}])")
    lines.append(f"A - B = {report['bpc_difference']:+.4f} bits/char, 95% paired interval "
                 f"[{report['ci95_low']:+.4f}, {report['ci95_high']:+.4f}] on {report['eval_tokens']:,} tokens; "
                 f"A worse in {report['share_of_resamples_a_worse']:.1%} of the resamples")
    return "\n".join(lines)
