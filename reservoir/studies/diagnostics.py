"""Where two models' losses differ: by position in the story, and on recall against the rest.

    table = diagnose(evaluator, nats_a, nats_b)      # per-token losses of the same scored targets
    print(format_diagnostics(table, "A", "B"))

Both splits are of the scored targets, so every model is split the same way and A - B is paired
(the same bootstrap resamples of story blocks as ``Evaluator.paired_difference``):

- **position**: characters (tokens) since the story began, in buckets 1-8, 9-32, 33-128, 129-512,
  513+. A text with no story boundaries (Tiny Shakespeare) is one story: every target is then
  counted from the start of the scored stream, and the report says so.
- **recall** (in the spirit of Zoology, Arora et al. 2023): a target is a recall target for k when
  the k tokens before it *and* the target itself already occurred together earlier in the same
  story, so copying from the context predicts it; the rest are not. Reported for k = 4, 6 and 8
  (longer k: rarer, and more surely copies).
"""

from __future__ import annotations

import numpy as np

POSITION_BUCKETS = ((1, 8), (9, 32), (33, 128), (129, 512), (513, None))
RECALL_K = (4, 6, 8)


def story_positions(stream: np.ndarray, eot_id: int) -> np.ndarray:
    """For every token of ``stream``: its position in its story, 1 for the first token after an
    end-of-story (or the stream's start)."""
    index = np.arange(len(stream))
    after_eot = np.where(stream == eot_id, index, -1)
    last_eot_before = np.concatenate([[-1], np.maximum.accumulate(after_eot)[:-1]])
    return index - last_eot_before


def recall_mask(stream: np.ndarray, eot_id: int, k: int) -> np.ndarray:
    """For every token of ``stream``: do it and the ``k`` tokens before it (all in its story) occur
    together earlier in the same story?"""
    positions = story_positions(stream, eot_id)
    story = np.cumsum(np.concatenate([[0], (stream == eot_id)[:-1]]))
    key = story.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    with np.errstate(over="ignore"):  # a 64-bit rolling hash of the (k+1)-gram: wrapping is intended
        for lag in range(k + 1):
            shifted = np.concatenate([np.zeros(lag, np.int64), stream[:len(stream) - lag]]).astype(np.uint64)
            key = key * np.uint64(1_000_003) + shifted + np.uint64(1)
    valid = positions > k  # the whole (k+1)-gram lies in the story
    _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    return valid & (first[inverse] < np.arange(len(stream)))


def _subsets(evaluator) -> tuple[list[tuple[str, np.ndarray]], bool]:
    """(name, mask over the scored targets) for every split, and whether the text has story boundaries."""
    stream = evaluator.stream.numpy()
    eot = evaluator.tokenizer.eot_id
    positions = story_positions(stream, eot)[1:]  # the targets are the stream after its first token
    subsets = []
    for low, high in POSITION_BUCKETS:
        mask = (positions >= low) & (positions <= high if high else True)
        subsets.append((f"position {low}-{high}" if high else f"position {low}+", mask))
    for k in RECALL_K:
        recall = recall_mask(stream, eot, k)[1:]
        subsets.append((f"recall k={k}", recall))
        subsets.append((f"no recall k={k}", ~recall))
    return subsets, bool((stream == eot).any())


def diagnose(evaluator, nats_a: np.ndarray, nats_b: np.ndarray | None = None, seed: int = 0) -> dict:
    """Bits/char of A (and B, and A - B with its paired 95% interval) on every split of the targets."""
    subsets, has_stories = _subsets(evaluator)
    rows = []
    for name, mask in subsets:
        row = {"split": name, "targets": int(mask.sum()), "share": float(mask.mean()),
               "bpc_a": evaluator.subset_bpc(nats_a, mask)}
        if nats_b is not None:
            row["bpc_b"] = evaluator.subset_bpc(nats_b, mask)
            row.update(evaluator.paired_difference(nats_a, nats_b, seed, mask=mask) if mask.any() else {})
        rows.append(row)
    note = None if has_stories else ("no story boundaries in the scored text: positions count from the start of "
                                     "the stream, recall looks back over all of it")
    return {"rows": rows, "story_boundaries": has_stories, "note": note, "recall_k": list(RECALL_K),
            "position_buckets": [list(b) for b in POSITION_BUCKETS]}


def format_diagnostics(table: dict, label_a: str, label_b: str | None = None) -> str:
    head = f"{'split':<16}{'targets':>10}{'share':>8}{label_a[:22]:>24}"
    if label_b:
        head += f"{label_b[:22]:>24}{'A - B [95% paired]':>30}"
    lines = [head, "-" * len(head)]
    for row in table["rows"]:
        cell = lambda v: f"{v:.3f}" if v is not None else "-"  # noqa: E731
        line = f"{row['split']:<16}{row['targets']:>10,}{row['share']:>8.1%}{cell(row['bpc_a']):>24}"
        if label_b:
            interval = (f"{row['bpc_difference']:+.3f} [{row['ci95_low']:+.3f}, {row['ci95_high']:+.3f}]"
                        if "bpc_difference" in row else "-")
            line += f"{cell(row['bpc_b']):>24}{interval:>30}"
        lines.append(line)
    if table["note"]:
        lines.append(f"note: {table['note']}")
    return "\n".join(lines)


def plot_diagnostics(table: dict, label_a: str, label_b: str | None, path) -> None:
    """Bits/char of both models per split, bars side by side; A - B's interval in the title of each."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in table["rows"] if r["targets"]]
    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(8, 0.9 * len(rows)), 4.5))
    width = 0.4 if label_b else 0.8
    ax.bar(x - (width / 2 if label_b else 0), [r["bpc_a"] for r in rows], width, label=label_a)
    if label_b:
        ax.bar(x + width / 2, [r["bpc_b"] for r in rows], width, label=label_b)
        for i, r in enumerate(rows):
            if "bpc_difference" in r:
                ax.annotate(f"{r['bpc_difference']:+.2f}", (x[i], max(r["bpc_a"], r["bpc_b"])), ha="center",
                            va="bottom", fontsize=7)
    ax.set_xticks(x, [f"{r['split']}\n({r['share']:.0%})" for r in rows], fontsize=7, rotation=30)
    ax.set_ylabel("validation bits/char")
    ax.set_title("bits/char by position in the story and on recall targets (numbers: A - B)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
