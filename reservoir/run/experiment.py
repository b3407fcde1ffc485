"""One experiment: every model of a validated config trained, evaluated and sampled, side by side.

    run = run_experiment(config)     # config: reservoir.config.parse_overrides(...); returns the run.writer.Run

Reads top to bottom: device -> data -> the run folder -> for each seed and model: build, train,
evaluate, sample, record -> the table -> plots. TinyStories.py (after RESUME has found a run's own
settings) and sweep.py (once per trial) call it.
"""

from __future__ import annotations

from reservoir.config import ConfigError
from reservoir.data.corpus import corpus_seed
from reservoir.data.tokens import prepare_data
from reservoir.models import build_model, check_vocabulary
from reservoir.models.settings import model_settings
from reservoir.platform import device as dev
from reservoir.platform import stopping
from reservoir.platform.messages import TAG, say, warn
from reservoir.run.folders import check_same_corpus
from reservoir.run.group import fit_group
from reservoir.run.records import cut_short, run_seeds
from reservoir.run.tables import format_table
from reservoir.run.tracking import check_available
from reservoir.run.train import (
    check_batches,
    check_stable_phases,
    diverged_record,
    fit,
    sample_stories,
    summary_record,
)
from reservoir.run.writer import Run


def run_experiment(config: dict, process_index: int = 0, resume_dir=None, claimed=None, on_evaluation=None) -> Run:
    # --- config and device (RESUME is resolved before, in main: it may decide how many processes run)
    stopping.install()  # SIGTERM / Ctrl-C: finish the step, checkpoint, exit
    requested = config
    info, config = _device(config, process_index)
    main = info.is_main_process

    # --- data and tokenizer
    data = _data(config, info, resume_dir)

    # --- the results folder (locked for the life of the run)
    run = Run.open(config, info, resume_dir, claimed)
    run.on_evaluation = on_evaluation  # e.g. a sweep's pruner
    try:
        _prepare_folder(run, requested, config, info, data, resume_dir)
        _train_every_model(config, info, data, run)
    except BaseException as e:
        _discard_unused(run, e)
        raise
    finally:
        run.close()

    # --- results and plots
    if main:
        _show(run, config, info, data)
    return run


def _device(config: dict, process_index: int = 0):
    info = dev.select_device(config, process_index)
    dev.enable_transparent_hugepages(info)
    config = dev.adjust_config(config, info.kind)
    if info.is_main_process:
        print(info.banner(), flush=True)
        check_available(config["LOGGERS"])  # a tracker that cannot start fails now, not mid-run
    return info, config


def _data(config: dict, info, resume_dir, data=None):
    """The run's text and tokenizer (``data``: already prepared, for another run of the same text), checked
    against the run's settings and, resumed, against the text it trained on."""
    main = info.is_main_process
    if data is None:
        data = dev.main_process_first(info, lambda: prepare_data(config), "data_prepared")  # one download, one cache
        say(f"data: {data.description}; {data.tokenizer.kind} tokenizer, vocab {data.tokenizer.vocab_size}, "
            f"{data.train.size:,} training / {data.val.size:,} validation tokens", main)
    check_vocabulary(config, data.tokenizer.vocab_size)  # before a run folder exists
    check_batches(config, data, info)
    check_stable_phases(config, resume_dir)
    if resume_dir is not None:
        check_same_corpus(resume_dir, data.describe())
    return data


def _prepare_folder(run: Run, requested: dict, config: dict, info, data, resume_dir) -> None:
    main = info.is_main_process
    if main and not (run.path / "config.json").exists():
        run.write_config(requested, config, info, data.describe())
    run.write_tokenizer(data.tokenizer)  # the folder alone is then enough for sample.py
    say(f"results: {run.path}{' (resumed)' if resume_dir else ''}", main)


def _discard_unused(run: Run, error: BaseException) -> None:
    if run.claim is not None and run.claim.discard_if_unused():
        warn(f"removed {run.path}: no model got as far as a checkpoint, so there is nothing to resume")
    error.run_dir = run.path  # what main tells the user about resuming


def _show(run: Run, config: dict, info, data) -> None:
    print(f"\n{TAG} {run.path}: validation bits/char on {data.description}, {info.name}\n"
          f"{format_table(run.summaries(), config)}", flush=True)
    cut = sorted({r["model"] for r in run.summaries() if cut_short(r)})
    if cut:
        warn(f"TIME_BUDGET_S={config['TIME_BUDGET_S']:g} cut {', '.join(cut)} short of the budget every model "
             "was given (marked 'cut' above): the table does not compare them at equal compute; the same command "
             "with TIME_BUDGET_S=None trains every fit to its budget")
    if config["PLOTS"]:
        from reservoir.run.plots import plot_runs  # matplotlib: only when plots are asked for

        for png in plot_runs([run.path]):
            say(f"plot: {png}")


# what the points of a folded group may set apart: the rest (data, model, budget, schedule) they share
MEMBER_SETTINGS = ("LEARNING_RATE", "SEED", "SEEDS", "WEIGHT_DECAY", "ADAM_BETA2", "ADAM_BETA2_REF_TOKENS",
                   "RESULTS_DIR", "RUN_NAME", "RESUME", "STABLE_FROM", "PLOTS")


def _member_differences(configs: list[dict]) -> list[str]:
    first, differing = configs[0], []
    for key, value in first.items():
        if key in MEMBER_SETTINGS:
            continue
        for other in configs[1:]:
            theirs = other.get(key)
            if isinstance(value, dict) and isinstance(theirs, dict):  # a model's block: its own rate may differ
                if {k: v for k, v in value.items() if k != "learning_rate"} != \
                        {k: v for k, v in theirs.items() if k != "learning_rate"}:
                    differing.append(key)
                    break
            elif theirs != value:
                differing.append(key)
                break
    return differing


def run_group(configs: list[dict], resume_dirs: list) -> list[Run]:
    """Points that differ only in MEMBER_SETTINGS (a rate, a seed, a folder) trained as one folded group
    (reservoir/run/group.py), each seed of each point a member, each point its own run folder and records, as
    ``run_experiment`` would write them one at a time. A model whose points cannot fold trains them one at a
    time, after a line that says why."""
    stopping.install()
    requested = configs
    info, first = _device(configs[0])
    configs = [dev.adjust_config(c, info.kind) for c in configs]
    differing = _member_differences(configs)
    if differing:
        raise ConfigError(f"the points of a folded group differ in {', '.join(differing)}; only "
                          f"{', '.join(MEMBER_SETTINGS)} may differ: train the others as points of their own")
    corpora, datas = {}, []  # one text for every member, unless each draws its own (the synthetic corpus's seed)
    for config, resume_dir in zip(configs, resume_dirs, strict=True):
        key = corpus_seed(config)
        corpora[key] = _data(config, info, resume_dir, corpora.get(key))
        datas.append(corpora[key])
    runs: list[Run] = []
    try:
        for config, asked, resume_dir, data in zip(configs, requested, resume_dirs, datas, strict=True):
            runs.append(Run.open(config, info, resume_dir))
            _prepare_folder(runs[-1], asked, config, info, data, resume_dir)
        points = [(p, seed) for p, config in enumerate(configs) for seed in run_seeds(config)]  # the members
        for name in first["MODELS"]:
            seeded = {(p, seed): model_settings({**configs[p], "SEED": seed}, name) for p, seed in points}
            members = [(p, seed) for p, seed in points if (name, seed) not in runs[p].finished_models()]
            for p, seed in sorted(set(points) - set(members)):
                say(f"{name} (seed {seed}): finished in {runs[p].path}, skipped", info.is_main_process)
            if stopping.requested():
                raise stopping.Stopped(stopping.requested(), None, "every model before this point is finished")
            if not members:
                continue
            models = [build_model(name, datas[p].tokenizer.vocab_size, seeded[p, seed]) for p, seed in members]
            outcomes = fit_group(name, models, [datas[p] for p, _ in members], [seeded[m] for m in members], info,
                                 [runs[p] for p, _ in members])
            for (p, seed), model, outcome in zip(members, models, outcomes, strict=True):
                record_fit(runs[p], name, model, outcome, seeded[p, seed], info, datas[p])
    except BaseException as e:
        for run in runs:
            _discard_unused(run, e)
        raise
    finally:
        for run in runs:
            run.close()
    return runs


def _train_every_model(config: dict, info, data, run: Run) -> None:
    """Every seed, every model: build, train, evaluate, sample, record. A model that diverges is
    recorded as such. Seeds come outermost, so a stopped run has whole comparisons to show."""
    main = info.is_main_process
    seeds = run_seeds(config)
    for seed in seeds:
        for name in config["MODELS"]:
            seeded = model_settings({**config, "SEED": seed}, name)  # the seed: reservoir draw, weights, order
            label = name if len(seeds) == 1 else f"{name} (seed {seed})"
            if stopping.requested():
                raise stopping.Stopped(stopping.requested(), None, "every model before this point is finished")
            if (name, seed) in run.finished_models():
                say(f"{label}: finished in {run.path}, skipped", main)
                continue
            model = build_model(name, data.tokenizer.vocab_size, seeded)
            try:
                outcome = fit(name, model, data, seeded, info, run)
            except stopping.Diverged as e:
                outcome = e
            record_fit(run, name, model, outcome, seeded, info, data)


def record_fit(run: Run, name: str, model, outcome, seeded: dict, info, data) -> None:
    """A fit's record (``outcome``: its Outcome, or the Diverged that stopped it), its samples, and its line."""
    main, seed = info.is_main_process, seeded["SEED"]
    label = name if len(run_seeds(seeded)) == 1 else f"{name} (seed {seed})"
    if isinstance(outcome, stopping.Diverged):
        warn(str(outcome))
        run.record_summary(diverged_record(name, model, outcome, seeded, info, data), [])
        dev.barrier(info, f"{name}_{seed}_recorded")
        return
    samples = sample_stories(model, data, seeded, info) if main else []
    record = summary_record(name, model, outcome, seeded, info, data)
    run.record_summary(record, samples)
    dev.barrier(info, f"{name}_{seed}_recorded")  # every process sees the model finished before the next
    windows = (f" ({record['windows_val_bpc']:.3f} scored as windows)"
               if record.get("windows_val_bpc") is not None else "")
    folded = f", folded with {outcome.extra['folded_with'] - 1} more" if outcome.extra.get("folded_with") else ""
    label += f" in {run.path.name}" if folded else ""
    say(f"{label}: {record['val_bpc']:.3f} bits/char{windows} after {record['train_tokens']:,} tokens "
        f"in {record['train_seconds']:.1f}s ({record['train_flops'] or 0:.3g} FLOPs, "
        f"{record['epochs']:.2f} epochs{folded})", main)
    if samples:
        print(f"    {samples[0][1][:300]!r}", flush=True)
