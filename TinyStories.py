"""Train and compare reservoir LMs and baseline LMs on TinyStories.

    python TinyStories.py [KEY=VALUE ...]      # keys: python TinyStories.py --help
    python TinyStories.py RESUME=latest        # continue the last interrupted run
    python TinyStories.py A --and B            # points that differ in a rate or seed, as one folded model;
                                               # A --and: one point's SEEDS as one (docs/runs.md)

The command line becomes a config (configs.py), RESUME finds the saved run's settings, and
reservoir/run/experiment.py runs it: device -> data -> for each model: build, train, evaluate,
sample -> results -> plots. The machinery lives in reservoir/.
"""

import functools
import sys

from configs import ConfigError, config_from_argv, given_settings, recorded_keys_missing, validate
from reservoir.models import with_added_options
from reservoir.platform import device as dev
from reservoir.platform import stopping
from reservoir.platform.entry import entry_point
from reservoir.platform.messages import TAG, OneLineError, warn
from reservoir.run.experiment import run_experiment, run_group
from reservoir.run.folders import claim_run_folder, find_run_dir, resume_outlook, resumed_config
from reservoir.run.records import ResultsError, read_run_config


def resolve_resume(config: dict, named=()) -> tuple[dict, object]:
    """With RESUME, the saved run's own settings (checked like the command line, whose settings
    ``named`` must agree with them) and its folder."""
    if not config["RESUME"]:
        return config, None
    resume_dir = find_run_dir(config["RESULTS_DIR"], config["RESUME"])
    saved = read_run_config(resume_dir, "RESUME")
    if not isinstance(saved.get("requested_config"), dict):
        raise ResultsError(f"{resume_dir / 'config.json'} has no requested_config object; the run folder is damaged")
    missing = recorded_keys_missing(saved["requested_config"])
    if missing:  # refused as sample.py and compare.py refuse it: never filled in from today's defaults
        raise ResultsError(f"{resume_dir / 'config.json'} is damaged: it has no requested_config.{missing[0]}; start "
                           "a new run (or restore the run folder from a copy)")
    try:
        return validate(resumed_config(with_added_options(saved["requested_config"]), config, named)), resume_dir
    except ConfigError as e:
        raise ResultsError(f"{resume_dir / 'config.json'} holds settings this version refuses ({e}); "
                           "start a new run") from None


GROUP = "--and"  # A --and B --and C: the points A, B and C trained as one folded group (reservoir/run/group.py)


@entry_point
def main(argv: list[str]) -> int:
    if GROUP in argv:
        return _folded_group(argv)
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
    except (OneLineError, stopping.Stopped, KeyboardInterrupt) as e:
        return _ended(e, config)
    finally:
        if claim is not None:
            if sys.exc_info()[0] is not None and claim.discard_if_unused():
                warn(f"removed {claim.path}: no model got as far as a checkpoint")
            claim.release()
    return 0


def _folded_group(argv: list[str]) -> int:
    """``A --and B ...``: each part a point's own command line; they train as one folded group. ``A --and``,
    one point and nothing after: its seeds (SEEDS=...) train as one folded group."""
    lone = argv[-1] == GROUP and argv.count(GROUP) == 1  # A --and: argv ends the one part itself
    parts, part = [], []
    for arg in argv if lone else [*argv, GROUP]:
        if arg == GROUP:
            if not part:
                raise SystemExit(f"error: '{GROUP}' joins two points' settings: give settings on both sides of it")
            parts.append(part)
            part = []
        else:
            part.append(arg)
    configs = [config_from_argv(p) for p in parts]
    try:
        resolved = [resolve_resume(c, given_settings(p)) for c, p in zip(configs, parts, strict=True)]
        if any(dev.wants_launcher(c) for c, _ in resolved):
            raise ConfigError("a folded group trains in one process: TPU_PARALLEL='launch' is for one point")
        run_group([c for c, _ in resolved], [d for _, d in resolved])
    except (OneLineError, stopping.Stopped, KeyboardInterrupt) as e:
        return _ended(e, configs[0])
    return 0


def _ended(error: BaseException, config: dict) -> int:
    """How a stopped run ends: a one-line error, or the signal's exit code with how to resume."""
    if isinstance(error, OneLineError):
        raise SystemExit(f"error: {error}") from None
    if isinstance(error, stopping.Stopped):
        print(f"{TAG} stopped by {error.signal_name}: {error.saved}. "
              f"{resume_outlook(getattr(error, 'run_dir', None), config)}", file=sys.stderr, flush=True)
        return error.exit_code
    print(f"{TAG} interrupted. {resume_outlook(getattr(error, 'run_dir', None), config)}", file=sys.stderr,
          flush=True)
    return 130


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
