"""Train and compare reservoir LMs and baseline LMs on TinyStories.

    python TinyStories.py [KEY=VALUE ...]      # keys: python TinyStories.py --help
    python TinyStories.py RESUME=latest        # continue the last interrupted run

Reads top to bottom: config -> device -> data -> for each model: build, train,
evaluate, sample -> results -> plots. The machinery lives in reservoir/.
"""

import functools
import sys

from configs import (
    ConfigError,
    check_vocabulary,
    config_from_argv,
    given_settings,
    validate,
)
from reservoir import device as dev
from reservoir import stopping, train
from reservoir.data import prepare_data
from reservoir.messages import TAG, OneLineError, say, warn
from reservoir.models import build_model
from reservoir.results import (
    ResultsError,
    Run,
    claim_run_folder,
    find_run_dir,
    format_table,
    read_run_config,
    resume_outlook,
    resumed_config,
    run_seeds,
)
from reservoir.tracking import check_available


def resolve_resume(config: dict, named=()) -> tuple[dict, object]:
    """With RESUME, the saved run's own settings (checked like the command line, whose settings
    ``named`` must agree with them) and its folder."""
    if not config["RESUME"]:
        return config, None
    resume_dir = find_run_dir(config["RESULTS_DIR"], config["RESUME"])
    saved = read_run_config(resume_dir)
    if not isinstance(saved.get("requested_config"), dict):
        raise ResultsError(f"{resume_dir / 'config.json'} has no requested_config object; the run folder is damaged")
    try:
        return validate(resumed_config(saved["requested_config"], config, named)), resume_dir
    except ConfigError as e:
        raise ResultsError(f"{resume_dir / 'config.json'} holds settings this version refuses ({e}); "
                           "start a new run") from None


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
    check_vocabulary(config, data.tokenizer.vocab_size)
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
              f"{format_table(run.summaries())}", flush=True)
        if config["PLOTS"]:
            import plot_results

            for png in plot_results.plot_runs([run.path]):
                say(f"plot: {png}")
    return run


def _train_every_model(config: dict, info, data, run: Run) -> None:
    """Every seed, every model: build, train, evaluate, sample, record. A model that diverges is
    recorded as such. Seeds come outermost, so a stopped run has whole comparisons to show."""
    main = info.is_main_process
    seeds = run_seeds(config)
    for seed in seeds:
        seeded = {**config, "SEED": seed}  # the reservoir draw, initial weights, data order and samples
        for name in config["MODELS"]:
            label = name if len(seeds) == 1 else f"{name} (seed {seed})"
            if stopping.requested():
                raise stopping.Stopped(stopping.requested(), None, "every model before this point is finished")
            if (name, seed) in run.finished_models():
                say(f"{label}: finished in {run.path}, skipped", main)
                continue
            model = build_model(name, data.tokenizer.vocab_size, seeded)
            try:
                outcome = train.fit(name, model, data, seeded, info, run)
            except stopping.Diverged as e:
                warn(str(e))
                run.record_summary(train.diverged_record(name, model, e, seeded, info, data), [])
                dev.barrier(info, f"{name}_{seed}_recorded")
                continue
            samples = train.sample_stories(model, data, seeded, info) if main else []
            record = train.summary_record(name, model, outcome, seeded, info, data)
            run.record_summary(record, samples)
            dev.barrier(info, f"{name}_{seed}_recorded")  # every process sees the model finished before the next
            windows = (f" ({record['windows_val_bpc']:.3f} scored as windows)"
                       if record.get("windows_val_bpc") is not None else "")
            say(f"{label}: {record['val_bpc']:.3f} bits/char{windows} after {record['train_tokens']:,} tokens "
                f"in {record['train_seconds']:.1f}s ({record['train_flops'] or 0:.3g} FLOPs, "
                f"{record['epochs']:.2f} epochs)", main)
            if samples:
                print(f"    {samples[0][1][:300]!r}", flush=True)


def main(argv: list[str]) -> int:
    config = config_from_argv(argv)
    claim = None
    try:
        config, resume_dir = resolve_resume(config, given_settings(argv))
        if dev.wants_launcher(config):
            # torch_xla's processes cannot share a folder name decided by one of them: decide it here
            stopping.install()
            claim = claim_run_folder(config, resume_dir)
            print(f"{TAG} TPU_PARALLEL='launch': one process per TPU chip (torch_xla.launch), results in {claim.path}",
                  flush=True)
            dev.launch(functools.partial(run_experiment, resume_dir=resume_dir, claimed=claim.path), config)
        else:
            run_experiment(config, resume_dir=resume_dir)
    except OneLineError as e:
        raise SystemExit(f"error: {e}") from None
    except stopping.Stopped as e:
        print(f"{TAG} stopped by {e.signal_name}: {e.saved}. {resume_outlook(getattr(e, 'run_dir', None), config)}",
              file=sys.stderr, flush=True)
        return e.exit_code
    except KeyboardInterrupt as e:
        print(f"{TAG} interrupted. {resume_outlook(getattr(e, 'run_dir', None), config)}", file=sys.stderr,
              flush=True)
        return 130
    finally:
        if claim is not None:
            if sys.exc_info()[0] is not None and claim.discard_if_unused():
                warn(f"removed {claim.path}: no model got as far as a checkpoint")
            claim.release()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
