"""Write stories with a trained model, from its run folder alone (or an exported model: export.py).

    python sample.py results/<run> [KEY=VALUE ...]
    python sample.py exports/<name>            # an exported model's folder, or its Hub id: hf://user/name
    python sample.py results/<run> MODEL=transformer PROMPT="Once upon a time" NUM_SAMPLES=3 \
        MAX_NEW_TOKENS=300 TEMPERATURE=0.8 TOP_K=40 SEED=1 DEVICE=cpu
    python sample.py results/<run> PROMPT=FILE:prompts.txt        # one prompt per non-empty line

Stories go to stdout, separated by a line of dashes; what was loaded goes to stderr.
The run folder's config.json, tokenizer.json and checkpoints/<model>.pt (with SEEDS,
<model>-seed<N>.pt for TRAIN_SEED=N past the first) are all it needs, so a folder
copied to another machine samples there. Every key defaults to what the run itself
used (SAMPLE_PROMPTS, SAMPLE_TOKENS, ...), and STOP_AT_END=True gives exactly the
stories the run wrote to samples.txt.
"""

from __future__ import annotations

import sys
from pathlib import Path

from configs import ConfigError, parse_options
from reservoir.config import is_integer, is_number
from reservoir.platform import device as dev
from reservoir.platform.entry import entry_point
from reservoir.platform.messages import TAG, OneLineError
from reservoir.run.sampling import SampleSettings, write_stories
from reservoir.share import load_trained

KEYS = {  # key: what it does (defaults come from the run)
    "MODEL": "which model of the run (default: its best finished model)",
    "TRAIN_SEED": "which of the run's SEEDS the model was trained with (default: the first, or the best model's)",
    "PROMPT": "a prompt, a list of prompts, or FILE:<path> with one prompt per line (default: SAMPLE_PROMPTS)",
    "NUM_SAMPLES": "stories per prompt (default 1)",
    "MAX_NEW_TOKENS": "tokens generated per story (default: SAMPLE_TOKENS)",
    "TEMPERATURE": "sampling temperature, 0 greedy (default: SAMPLE_TEMPERATURE)",
    "TOP_K": "sample among the k likeliest tokens, None all (default: SAMPLE_TOP_K)",
    "SEED": "seed of the sampling generator (default: the model's training seed, as the run sampled)",
    "DEVICE": "'auto' | 'tpu' | 'cuda' | 'cpu' (default 'auto'; on XLA, sampling itself runs on the CPU)",
    "STOP_AT_END": "stop each story at its end (default False: write on, a story end shows as a blank line)",
    "COMPILE": "torch.compile the decode step where the model has a fixed-shape one (default: as the run did)",
}
SEPARATOR = "-" * 40


def parse_args(argv: list[str]) -> tuple[Path, dict]:
    if not argv or argv[0].startswith("-") or "=" in argv[0]:
        lines = [f"  {k:<15} {v}" for k, v in KEYS.items()]
        usage = __doc__.split("\n\n")[0] + "\n\nKeys (case-insensitive):\n" + "\n".join(lines)
        if argv and argv[0] in ("-h", "--help"):
            print(usage)
            raise SystemExit(0)
        raise SystemExit(f"error: the first argument is the run folder, e.g. results/<run>\n\n{usage}")
    try:
        return Path(argv[0]), parse_options(argv[1:], KEYS, text_keys=("PROMPT", "MODEL", "DEVICE"))
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None


def _prompts(value) -> list[str]:
    if isinstance(value, str) and value.startswith("FILE:"):
        path = Path(value[5:])
        try:
            prompts = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"PROMPT=FILE:{path}: cannot read it ({type(e).__name__}: {e})") from None
        if not prompts:
            raise ConfigError(f"PROMPT=FILE:{path} holds no prompt (one per non-empty line)")
        return prompts
    prompts = [value] if isinstance(value, str) else list(value)
    if not prompts or not all(isinstance(p, str) and p for p in prompts):
        raise ConfigError("PROMPT must be non-empty text, a list of texts, or FILE:<path>")
    return prompts


def _number(options: dict, key: str, default, kind, minimum, allow_none: bool = False):
    value = options.get(key, default)
    if value is None and allow_none:
        return None
    if not (is_integer(value) if kind is int else is_number(value)):
        raise ConfigError(f"{key} must be {'an integer' if kind is int else 'a number'}, got {value!r}")
    if value < minimum:
        raise ConfigError(f"{key} must be >= {minimum}, got {value!r}")
    return kind(value)


@entry_point
def main(argv: list[str]) -> int:
    run_dir, options = parse_args(argv)
    try:
        train_seed = _number(options, "TRAIN_SEED", None, int, 0, allow_none=True)
        model, tokenizer, run = load_trained(run_dir, options.get("MODEL"), train_seed)
        config = run.config
        settings = SampleSettings(
            max_new_tokens=_number(options, "MAX_NEW_TOKENS", config["SAMPLE_TOKENS"], int, 1),
            temperature=_number(options, "TEMPERATURE", config["SAMPLE_TEMPERATURE"], float, 0),
            top_k=_number(options, "TOP_K", config["SAMPLE_TOP_K"], int, 1, allow_none=True),
            seed=_number(options, "SEED", run.seed, int, 0),
            num_samples=_number(options, "NUM_SAMPLES", 1, int, 1),
            stop_at_end=bool(options.get("STOP_AT_END", False)),
            compiled=bool(options.get("COMPILE", config.get("COMPILE", False))))  # as the run sampled
        prompts = _prompts(options.get("PROMPT", config["SAMPLE_PROMPTS"]))
        info = dev.select_device({"DEVICE": options.get("DEVICE", "auto")})
        where = dev.sampling_device(info, model.host_only)
        state = "finished" if run.finished else "unfinished, last checkpoint"
        sys.stdout.flush()
        print(f"{TAG} {run_dir}: {run.model} at step {run.step} ({state}, training seed {run.seed}), on {where}",
              file=sys.stderr, flush=True)  # before the stories, where both streams go to one terminal or file
        stories = write_stories(model, tokenizer, prompts, settings, where)
    except OneLineError as e:
        raise SystemExit(f"error: {e}") from None
    print(f"\n{SEPARATOR}\n".join(story for _, story in stories))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
