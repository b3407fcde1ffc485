"""Tokenizer training time, tokenization throughput and cache reuse on real TinyStories text.

    python bench/bench_data.py [path-to-train-text]   (default ../shared/data/tinystories/TinyStories-train-sample.txt)
"""

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from configs import parse_overrides  # noqa: E402
from reservoir.data.corpus import read_stories  # noqa: E402
from reservoir.data.tokenizers import TOKENIZERS  # noqa: E402
from reservoir.data.tokens import prepare_data  # noqa: E402

DEFAULT = Path(__file__).resolve().parents[2] / "shared/data/tinystories/TinyStories-train-sample.txt"


def main(path: Path) -> None:
    stories = read_stories(path)
    chars = sum(len(s) + 1 for s in stories)
    print(f"{path.name}: {len(stories)} stories, {chars:,} chars")
    for kind, vocab in (("char", None), ("bpe", 4096)):
        start = time.perf_counter()
        tok = TOKENIZERS[kind].train(stories, vocab)
        train_s = time.perf_counter() - start
        start = time.perf_counter()
        ids = tok.encode_stories(stories)
        enc_s = time.perf_counter() - start
        print(f"{kind:4s} vocab {tok.vocab_size:5d}: train {train_s:.2f}s, encode {chars / enc_s / 1e6:.2f}M chars/s, "
              f"{chars / ids.size:.2f} chars/token")
    with tempfile.TemporaryDirectory() as cache:
        config = parse_overrides([f"TRAIN_PATH={path}", f"CACHE_DIR={cache}", "TOKENIZER=bpe"])
        timings = []
        for _ in range(2):
            start = time.perf_counter()
            prepare_data(config)
            timings.append(time.perf_counter() - start)
        print(f"prepare_data (bpe 4096): first run {timings[0]:.2f}s, cached run {timings[1]:.2f}s")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else DEFAULT)
