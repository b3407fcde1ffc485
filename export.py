"""Share a trained model: one model of a run folder written as a folder any huggingface_hub user knows.

    python export.py results/<run> TO=exports/<name> [MODEL=<name>] [TRAIN_SEED=N] [LICENSE=mit]
    python export.py results/frontier-tinystories/<cell>/flops-1.95e13 TO=exports/best   # a study's point
    python export.py results/<run> TO=exports/<name> PUSH=<user>/<name>                  # and upload it

The folder holds config.json (the family, its settings, the vocabulary, what is frozen, and the run's signed
records), model.safetensors (every tensor the model reads), the tokenizer and README.md, a model card written from
the run's records. sample.py, compare.py and Pretrained.from_pretrained take it, or its Hub id (hf://user/name).
PUSH uploads it with huggingface_hub, whose own login (`hf auth login` or HF_TOKEN) it uses; no token is written.
"""

from __future__ import annotations

import sys
from pathlib import Path

from configs import ConfigError, parse_options
from reservoir.config import is_integer
from reservoir.platform.entry import entry_point
from reservoir.platform.messages import TAG, OneLineError
from reservoir.share import export_model
from reservoir.share.export import check_repository_id, push_export

KEYS = {
    "TO": "the folder to write (new, or empty)",
    "MODEL": "which model of the run (default: its best finished model)",
    "TRAIN_SEED": "which of the run's SEEDS (default: the first, or the best model's)",
    "LICENSE": "the model card's license field, a Hub license id (default 'other')",
    "PUSH": "a Hub repository id (user/name) to upload the folder to, with huggingface_hub's login",
    "PRIVATE": "True: a new Hub repository is private (default False)",
}


def parse_args(argv: list[str]) -> tuple[Path, dict]:
    if not argv or argv[0].startswith("-") or "=" in argv[0]:
        usage = __doc__.split("\n\n")[0] + "\n\nKeys (case-insensitive):\n" + "\n".join(
            f"  {k:<11} {v}" for k, v in KEYS.items())
        if argv and argv[0] in ("-h", "--help"):
            print(usage)
            raise SystemExit(0)
        raise SystemExit(f"error: the first argument is the run folder, e.g. results/<run>\n\n{usage}")
    try:
        options = parse_options(argv[1:], KEYS, text_keys=("TO", "MODEL", "LICENSE", "PUSH"))
    except ConfigError as e:
        raise SystemExit(f"error: {e}") from None
    if not options.get("TO"):
        raise SystemExit("error: TO=<folder> says where the export goes, e.g. TO=exports/my-model")
    seed = options.get("TRAIN_SEED")
    if seed is not None and not (is_integer(seed) and seed >= 0):
        raise SystemExit(f"error: TRAIN_SEED must be a non-negative integer, got {seed!r}")
    if not isinstance(options.get("PRIVATE", False), bool):
        raise SystemExit(f"error: PRIVATE must be True or False, got {options['PRIVATE']!r}")
    return Path(argv[0]), options


@entry_point
def main(argv: list[str]) -> int:
    run_dir, options = parse_args(argv)
    try:
        if options.get("PUSH"):  # before anything is written, as TO and LICENSE are
            check_repository_id(options["PUSH"])
        folder = export_model(run_dir, options.get("MODEL"), options.get("TRAIN_SEED"), Path(options["TO"]),
                              options.get("LICENSE") or "other")
        print(f"{TAG} exported {run_dir} to {folder}: config.json, model.safetensors, tokenizer.json, README.md",
              flush=True)
        if options.get("PUSH"):
            url = push_export(folder, options["PUSH"], options.get("PRIVATE", False))
            print(f"{TAG} pushed to {url}", flush=True)
    except OneLineError as e:
        raise SystemExit(f"error: {e}") from None
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
