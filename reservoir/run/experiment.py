"""One experiment: every model of a validated config trained, evaluated and sampled, side by side.

    run = run_experiment(config)     # config: reservoir.config.parse_overrides(...); returns the run.writer.Run

Reads top to bottom: device -> data -> the run folder -> for each seed and model: build, train,
evaluate, sample, record -> the table -> plots. TinyStories.py (after RESUME has found a run's own
settings) and sweep.py (once per trial) call it.
"""

from __future__ import annotations

from reservoir.data.tokens import prepare_data
from reservoir.models import build_model, check_vocabulary
from reservoir.models.settings import model_settings
from reservoir.platform import device as dev
from reservoir.platform import stopping
from reservoir.platform.messages import TAG, say, warn
from reservoir.run.folders import check_same_corpus
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
    info = dev.select_device(config, process_index)
    dev.enable_transparent_hugepages(info)
    requested, config = config, dev.adjust_config(config, info.kind)
    main = info.is_main_process
    if main:
        print(info.banner(), flush=True)
        check_available(config["LOGGERS"])  # a tracker that cannot start fails now, not mid-run

    # --- data and tokenizer
    data = dev.main_process_first(info, lambda: prepare_data(config), "data_prepared")  # one download, one cache
    check_vocabulary(config, data.tokenizer.vocab_size)  # before a run folder exists
    check_batches(config, data, info)
    check_stable_phases(config, resume_dir)
    if resume_dir is not None:
        check_same_corpus(resume_dir, data.describe())
    say(f"data: {data.description}; {data.tokenizer.kind} tokenizer, vocab {data.tokenizer.vocab_size}, "
        f"{data.train.size:,} training / {data.val.size:,} validation tokens", main)

    # --- the results folder (locked for the life of the run)
    run = Run.open(config, info, resume_dir, claimed)
    run.on_evaluation = on_evaluation  # e.g. a sweep's pruner
    try:
        if main and not (run.path / "config.json").exists():
            run.write_config(requested, config, info, data.describe())
        run.write_tokenizer(data.tokenizer)  # the folder alone is then enough for sample.py
        say(f"results: {run.path}{' (resumed)' if resume_dir else ''}", main)
        _train_every_model(config, info, data, run)
    except BaseException as e:
        if run.claim is not None and run.claim.discard_if_unused():
            warn(f"removed {run.path}: no model got as far as a checkpoint, so there is nothing to resume")
        e.run_dir = run.path  # what main tells the user about resuming
        raise
    finally:
        run.close()

    # --- results and plots
    if main:
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
    return run


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
                warn(str(e))
                run.record_summary(diverged_record(name, model, e, seeded, info, data), [])
                dev.barrier(info, f"{name}_{seed}_recorded")
                continue
            samples = sample_stories(model, data, seeded, info) if main else []
            record = summary_record(name, model, outcome, seeded, info, data)
            run.record_summary(record, samples)
            dev.barrier(info, f"{name}_{seed}_recorded")  # every process sees the model finished before the next
            windows = (f" ({record['windows_val_bpc']:.3f} scored as windows)"
                       if record.get("windows_val_bpc") is not None else "")
            say(f"{label}: {record['val_bpc']:.3f} bits/char{windows} after {record['train_tokens']:,} tokens "
                f"in {record['train_seconds']:.1f}s ({record['train_flops'] or 0:.3g} FLOPs, "
                f"{record['epochs']:.2f} epochs)", main)
            if samples:
                print(f"    {samples[0][1][:300]!r}", flush=True)
