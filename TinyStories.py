"""Train and compare reservoir LMs and baseline LMs on TinyStories.

    python TinyStories.py [KEY=VALUE ...]      # keys: python TinyStories.py --help
    python TinyStories.py RESUME=latest        # continue the last interrupted run

Reads top to bottom: config -> device -> data -> for each model: build, train,
evaluate, sample -> results -> plots. The machinery lives in reservoir/.
"""

import sys

from configs import ConfigError, apply_device_adjustments, config_from_argv, default_config
from reservoir import device as dev
from reservoir import train
from reservoir.checkpoint import CheckpointError
from reservoir.data import DataError, prepare_data
from reservoir.messages import TAG, say
from reservoir.models import build_model
from reservoir.results import ResultsError, Run, find_run_dir, format_table, read_json, resumed_config
from reservoir.tracking import TrackingError, check_available


def run_experiment(config: dict, process_index: int = 0) -> Run:
    # --- config and device: a resumed run keeps the settings it started with
    resume_dir = None
    if config["RESUME"]:
        resume_dir = find_run_dir(config["RESULTS_DIR"], config["RESUME"])
        saved = read_json(resume_dir / "config.json", "the run's config")["requested_config"]
        config = resumed_config(saved, config, default_config())
    info = dev.select_device(config, process_index)
    dev.enable_transparent_hugepages(info)
    requested, config = config, apply_device_adjustments(config, info.kind)
    main = info.is_main_process
    if main:
        print(info.banner(), flush=True)
        check_available(config["LOGGERS"])  # a tracker that cannot start fails now, not mid-run

    # --- data and tokenizer
    data = prepare_data(config)
    say(f"data: {data.description}; {data.tokenizer.kind} tokenizer, vocab {data.tokenizer.vocab_size}, "
        f"{data.train.size:,} training / {data.val.size:,} validation tokens", main)

    # --- the results folder
    run = Run.open(config, info, resume_dir)
    if resume_dir is None:
        run.write_config(requested, config, info, data.describe())
    if not (run.path / "tokenizer.json").exists():  # the folder alone is then enough for sample.py
        run.write_tokenizer(data.tokenizer.to_json())
    say(f"results: {run.path}{' (resumed)' if resume_dir else ''}", main)

    try:
        _train_every_model(config, info, data, run)
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
    """Every model: build, train, evaluate, sample, record."""
    main = info.is_main_process
    for name in config["MODELS"]:
        if name in run.finished_models():
            say(f"{name}: finished in {run.path}, skipped", main)
            continue
        model = build_model(name, data.tokenizer.vocab_size, config)
        outcome = train.fit(name, model, data, config, info, run)
        samples = train.sample_stories(model, data, config, info) if main else []
        record = train.summary_record(name, model, outcome, config, info, data)
        run.record_summary(record, samples)
        dev.barrier(info, f"{name}_recorded")  # every process sees the model finished before the next
        say(f"{name}: {record['val_bpc']:.3f} bits/char after {record['train_tokens']:,} tokens "
            f"in {record['train_seconds']:.1f}s", main)
        if samples:
            print(f"    {samples[0][1][:300]!r}", flush=True)


def main(argv: list[str]) -> int:
    config = config_from_argv(argv)
    try:
        if dev.wants_launcher(config):
            dev.launch(run_experiment, config)  # one process per TPU chip
        else:
            run_experiment(config)
    except (ConfigError, dev.DeviceError, DataError, ResultsError, CheckpointError, TrackingError) as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        raise SystemExit(f"{TAG} interrupted; continue from the last checkpoint with RESUME=latest") from None
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
