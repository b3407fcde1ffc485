"""Calibration against a published number: nanoGPT's Shakespeare-char run on a CPU.

    python bench/calibrate_nanogpt.py path/to/shakespeare/input.txt [RESULTS_DIR=bench/out] [KEY=VALUE ...]

nanoGPT's README documents a CPU run of its shakespeare_char model (config/train_shakespeare_char.py
with --block_size=64 --batch_size=12 --n_layer=4 --n_head=4 --n_embd=128 --max_iters=2000
--lr_decay_iters=2000 --dropout=0.0) whose validation loss is "about 1.88" nats. This runs the same
model and recipe through TinyStories.py (learning rate 1e-3 warmed up over 100 steps and decayed by
cosine to 1e-4, AdamW with beta2 0.99, weight decay 0.1, gradient clipping 1.0, the 90/10 split of
Tiny Shakespeare) and prints our validation loss beside nanoGPT's, with the verdict (within
+-0.05 nats or not).

Two scores are printed. nanoGPT estimates its loss on random windows of 64 characters, each scored
from an empty context (a target sees 32 characters of context on average); our 'windows' score is
that protocol over the whole validation split, so it is the one compared. Our default 'stream' score
slides overlapping windows (stride 32), so every target sees at least 32 characters: it is lower.
Differences left: nanoGPT's linear layers have no biases and its decay starts after the warm-up (ours
spans the whole run, warm-up included); both change the loss by far less than the tolerance.

The run is RESULTS_DIR/nanogpt-calibration-<key>, the key a hash of the input text and the settings: the
same command again reads its checked record (an edited one is refused), another input or setting trains
anew. Only Tiny Shakespeare's input.txt is accepted: nanoGPT's number is for that text.
"""

from __future__ import annotations

import hashlib
import json
import math
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # run from anywhere: the project's record reader below

from reservoir.platform.messages import OneLineError  # noqa: E402
from reservoir.run.records import read_summary  # noqa: E402

TINY_SHAKESPEARE_CHARS, TINY_SHAKESPEARE_START = 1_115_394, "First Citizen:"  # char-rnn's input.txt
NANOGPT_VAL_LOSS = 1.88  # nats per character, nanoGPT's README (CPU run)
TOLERANCE = 0.05
SETTINGS = ["DATASET=shakespeare", "MODELS=transformer", "TRANSFORMER.recipe='gpt2'", "TRANSFORMER.n_layer=4",
            "TRANSFORMER.n_head=4",
            "TRANSFORMER.n_embd=128", "TRANSFORMER.dropout=0.0", "SEQ_LEN=64", "BATCH_SIZE=12", "MAX_STEPS=2000",
            "LEARNING_RATE=1e-3", "WARMUP_STEPS=100", "MIN_LR_FRACTION=0.1", "ADAM_BETA2=0.99", "WEIGHT_DECAY=0.1",
            "GRAD_CLIP=1.0", "TIME_BUDGET_S=None", "FLOP_BUDGET=None", "FINAL_EVAL_TOKENS=None", "EVAL_POINTS=4",
            "PLOTS=False", "SAMPLE_TOKENS=100", "SAMPLE_PROMPTS=['ROMEO:']"]


def check_tiny_shakespeare(text: Path) -> bytes:
    """The input's bytes, if it is Tiny Shakespeare's input.txt (its length and first line); else one line."""
    if not text.is_file():
        raise SystemExit(f"error: {text} is not a file; give Tiny Shakespeare's input.txt")
    content = text.read_bytes()
    decoded = content.decode("utf-8", errors="replace")
    if len(decoded) != TINY_SHAKESPEARE_CHARS or not decoded.startswith(TINY_SHAKESPEARE_START):
        raise SystemExit(f"error: {text} is not Tiny Shakespeare's input.txt ({len(decoded):,} characters; that file "
                         f"has {TINY_SHAKESPEARE_CHARS:,} and begins {TINY_SHAKESPEARE_START!r}): nanoGPT's number "
                         "is for that text alone")
    return content


def run_key(content: bytes, settings: list[str]) -> str:
    """What the result depends on: the input text and every setting (so a changed one trains anew)."""
    digest = hashlib.sha256(content)
    digest.update(json.dumps(settings).encode())
    return digest.hexdigest()[:12]


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    text = Path(argv[0])
    content = check_tiny_shakespeare(text)
    extra = argv[1:]
    results = next((a.partition("=")[2] for a in extra if a.upper().startswith("RESULTS_DIR=")), "bench/out")
    settings = [*SETTINGS, *[a for a in extra if not a.upper().startswith("RESULTS_DIR=")]]
    run = Path(results) / f"nanogpt-calibration-{run_key(content, settings)}"
    if not (run / "summary.json").exists():
        command = [sys.executable, str(ROOT / "TinyStories.py"), *settings, f"TRAIN_PATH={text}",
                   f"RESULTS_DIR={results}"]
        command.append(f"RESUME={run}" if (run / "config.json").exists() else f"RUN_NAME={run.name}")
        code = subprocess.call(command, cwd=ROOT)
        if code:
            return code
    try:
        record = read_summary(run, "the calibration's record")[0]
    except OneLineError as e:
        raise SystemExit(f"error: {e}") from None
    if record.get("windows_val_bpc") is None or record.get("val_bpc") is None:
        raise SystemExit(f"error: the calibration run diverged ({record.get('reason') or 'no score'}; "
                         f"{run / 'summary.json'}): nanoGPT's recipe trains stably, so a setting given here broke it")
    windows = record["windows_val_bpc"] * math.log(2)
    stream = record["val_bpc"] * math.log(2)
    verdict = "within" if abs(windows - NANOGPT_VAL_LOSS) <= TOLERANCE else "OUTSIDE"
    print(f"nanoGPT (README, CPU run):          val loss {NANOGPT_VAL_LOSS:.3f} nats/char "
          f"({NANOGPT_VAL_LOSS / math.log(2):.3f} bits/char)")
    print(f"ours, windows of 64 from empty:     val loss {windows:.3f} nats/char ({record['windows_val_bpc']:.3f} "
          f"bits/char): {verdict} +-{TOLERANCE} of nanoGPT's")
    print(f"ours, stream (every target >= 32 characters of context): val loss {stream:.3f} nats/char "
          f"({record['val_bpc']:.3f} bits/char)")
    print(f"{record['train_steps']} steps, {record['train_tokens']:,} tokens in {record['train_seconds']:.0f} s; "
          f"record: {run / 'summary.json'}")
    return 0 if verdict == "within" else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
