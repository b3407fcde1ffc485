"""Peak resident memory and speed of preparing a large TinyStories-format file (streaming preparation).

    python bench/bench_prepare.py [--size-mb 50 100 200] [--tokenizers char bpe] [--source FILE] [--distinct]

Builds a file of each size by repeating the real training slice (../shared/data/tinystories), then
prepares it in a fresh child process per (size, tokenizer), with an empty cache: the full pipeline
of a run's data step (read, hash, train the tokenizer, encode into the memory-mapped cache). Prints
one line per case: seconds, MB/s and the child's peak resident memory (ru_maxrss).
"""

import argparse
import json
import random
import string
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT = ROOT.parent / "shared/data/tinystories/TinyStories-train-sample.txt"
CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from configs import parse_overrides
from reservoir.data.tokens import prepare_data
start = time.perf_counter()
data = prepare_data(parse_overrides({args!r}))
seconds = time.perf_counter() - start
print(json.dumps({{"seconds": seconds, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "train_tokens": int(data.train.size)}}))
"""


def _cipher(copy: int) -> dict:
    """Copy ``copy``'s letter substitution (the first copy unchanged): every copy spells its words anew, so the
    file holds as many distinct words as a corpus of that many distinct stories would, roughly, not one slice's."""
    if copy == 0:
        return {}
    rng = random.Random(copy)
    lower = list(string.ascii_lowercase)
    rng.shuffle(lower)
    table = dict(zip(string.ascii_lowercase, lower, strict=True))
    return str.maketrans({**table, **{k.upper(): v.upper() for k, v in table.items()}})


def build(source: Path, folder: Path, size_mb: int, distinct: bool = False) -> Path:
    text = source.read_text(encoding="utf-8")
    if not text.rstrip().endswith("<|endoftext|>"):
        text = text.rstrip() + "\n<|endoftext|>\n"
    stories = text.split("<|endoftext|>")
    path = folder / f"TinyStories-train-{size_mb}MB.txt"
    with open(path, "w", encoding="utf-8") as f:
        written, copy = 0, 0
        while written < size_mb * 1e6:
            # the marker itself is never enciphered: each story is, and joined again
            part = "<|endoftext|>".join(s.translate(_cipher(copy)) for s in stories) if distinct else text
            f.write(part)
            written += len(part.encode("utf-8"))
            copy += 1
    return path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, nargs="+", default=[50, 100, 200])
    parser.add_argument("--tokenizers", nargs="+", default=["char", "bpe"], choices=["char", "bpe"])
    parser.add_argument("--source", type=Path, default=DEFAULT, help="text repeated to the size (TinyStories format)")
    parser.add_argument("--distinct", action="store_true",
                        help="spell each repetition's words anew (a letter substitution per copy): distinct words grow "
                             "with the size, as in a corpus of distinct stories")
    args = parser.parse_args()
    if not args.source.is_file():
        raise SystemExit(f"error: {args.source} not found; give --source a TinyStories-format text file")
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        val = tmp / "TinyStories-valid.txt"
        val.write_text(args.source.read_text(encoding="utf-8")[:200_000], encoding="utf-8")
        for size in args.size_mb:
            path = build(args.source, tmp, size, args.distinct)
            mb = path.stat().st_size / 1e6
            for kind in args.tokenizers:
                cache = tmp / f"cache-{size}-{kind}"
                overrides = [f"TRAIN_PATH={path}", f"VAL_PATH={val}", f"CACHE_DIR={cache}", f"TOKENIZER={kind}",
                             "VOCAB_SIZE=4096", "MAX_TRAIN_CHARS=None"]
                out = subprocess.run([sys.executable, "-c", CHILD.format(root=str(ROOT), args=overrides)],
                                     capture_output=True, text=True, check=True)
                result = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{mb:6.0f} MB  {kind:4s}  {result['seconds']:6.1f} s  {mb / result['seconds']:5.1f} MB/s  "
                      f"peak {result['peak_mb']:6.0f} MB  ({result['train_tokens']:,} tokens)", flush=True)
            path.unlink()


if __name__ == "__main__":
    main()
