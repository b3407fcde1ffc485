"""A readout-only reservoir's training batches, its fixed features harvested as the ridge fit harvests them.

    batches = harvested_batches(model, train_ids, batch, seed, progress, process=(0, 1))
    (ids, blocks), targets = next(batches)    # ids (S, k), their features (k, F, S), next tokens (S, k)

An echo state network trains its readout alone, and the readout reads each position by itself. So its
features need not be computed again for every step's windows, each from a zero state. The training text
is cut into parallel streams (HARVEST_STREAMS), which run through the reservoir together in chunks, the
state carried from chunk to chunk, as the ridge fit and the evaluation run it. Each step then reads out
a batch of the chunk's positions, in an order shuffled per chunk.

Every position's features are computed once a pass, as a step over its window computed them once: the
FLOPs a token are the same and are counted the same (reservoir/run/flops.py). Features are not kept from
one pass to the next. A pass of a 32,768-unit reservoir's features is 123 GB in fp32 and 61 GB in bf16;
computing them again costs a few percent of a cross-entropy readout's FLOPs (bench/README.md).

A resumed fit computes the chunks its epoch had already read again, for their state, and trains on none
of them twice.
"""

from __future__ import annotations

import numpy as np
import torch

# Chosen by measurement (bench/README.md): at 2,000 units, one thread, 64 streams in chunks of one batch train at
# 43-46k tokens/s, 256 streams in 512 MB chunks at 31k: a small chunk's features are still in the caches when the
# readout reads them, and memory the allocator keeps is not mapped and faulted in again for every chunk
HARVEST_STREAMS = 64  # streams a process runs through the reservoir at once: one time step is a (units x 64) product
CHUNK_BYTES = 32 * 2**20  # a chunk's features in fp32, at most (a chunk is one batch at least)
MIN_STREAM_STEPS = 64  # a stream shorter than this is mostly its start-up transient: fewer streams then


def harvests(model) -> bool:
    """Whether ``model`` trains on harvested features: a readout alone over a reservoir that carries a state."""
    return getattr(model, "trained", None) == "readout" and model.stream_kind == "recurrent" \
        and hasattr(model, "dense_features")


def stream_layout(n_tokens: int, world: int, n_features: int, per_batch: int) -> tuple[int, int, int]:
    """(streams per process, steps per chunk, chunks) for ``n_tokens`` training tokens and batches of
    ``per_batch`` positions. As many streams as HARVEST_STREAMS allows that divide a batch: a batch is every
    stream at a few time steps. Each stream's steps are cut into equal chunks of whole batches, at most
    CHUNK_BYTES of features, of the length that leaves the fewest steps out of the pass (at the streams'
    ends): no batch spans two chunks, so every batch is one shape (XLA compiles one step)."""
    streams = max(1, min(HARVEST_STREAMS, (n_tokens - 1) // (world * MIN_STREAM_STEPS)))
    while per_batch % streams:
        streams -= 1
    steps, per = (n_tokens - 1) // (world * streams), per_batch // streams
    if steps < per:
        raise ValueError(f"the training data gives each process {streams * steps} positions, fewer than one batch "
                         f"({per_batch}); lower BATCH_SIZE or SEQ_LEN, or use more data")
    most = max(1, min(steps, CHUNK_BYTES // (4 * streams * n_features)) // per)  # batches a chunk may hold
    batches = max(range(max(1, most // 2), most + 1), key=lambda b: (b * per * (steps // (b * per)), b))
    return streams, batches * per, steps // (batches * per)


def harvested_batches(model, train_ids: np.ndarray, batch: tuple[int, int], seed: int, progress,
                      process: tuple[int, int] = (0, 1), materialize=None):
    """Training batches forever, epoch after epoch, from the position ``progress`` (epoch, offset: windows of
    the epoch already read, all processes together, as ``train.training_batches`` counts them), for the process of
    ``process`` = (rank, world size): its own streams. ``batch`` = (B, T):
    each batch holds B x T positions of this process's streams, shaped (streams, B x T / streams): the readout
    reads each position alone, so only how many a batch holds matters. ``materialize()``, if given, is called once
    a chunk's features exist (on XLA they are computed there, once, not inside every step's graph)."""
    (rows, cols), (rank, world) = batch, process
    per_batch = rows * cols
    windows_per_batch = rows * world  # a step's windows, every process's together
    device = next(model.buffers()).device
    n_features = model.n_features - (model.vocab_size if model.include_input else 0)
    streams, chunk, chunks = stream_layout(len(train_ids), world, n_features, per_batch)
    total, steps, per = streams * world, chunk * chunks, per_batch // streams
    ids = np.asarray(train_ids[: total * steps + 1], dtype=np.int64)
    mine = slice(rank * streams, (rank + 1) * streams)
    inputs = torch.from_numpy(ids[:-1].reshape(total, steps)[mine].copy())  # a stream: a stretch of the text
    targets = torch.from_numpy(ids[1:].reshape(total, steps)[mine].copy())
    while True:
        skip = progress.offset // windows_per_batch * per  # time steps this epoch has read already
        state = model.initial_state(streams, device)  # not None: on XLA every chunk is then one graph
        for k in range(chunks):
            cut = slice(k * chunk, (k + 1) * chunk)
            chunk_ids = inputs[:, cut].to(device)
            with torch.no_grad():
                dense, state = model.dense_features(chunk_ids, state)  # (streams, chunk, F)
            if materialize is not None:
                materialize()
            if skip >= chunk:
                skip -= chunk
                continue
            generator = torch.Generator().manual_seed((seed * 1_000_003 + progress.epoch) * 1_000_003 + k)
            order = torch.randperm(chunk, generator=generator)  # on the host: a slice of it is data, not a graph
            # (steps, F, streams), as a reservoir stores its states: a batch copies whole (F x streams) blocks, and
            # the readout multiplies them as they lie (3x faster at 2,000 units than a feature at a time)
            blocks, chunk_targets = dense.permute(1, 2, 0), targets[:, cut].to(device)
            for start in range(skip, chunk, per):
                take = order[start:start + per].to(device)
                progress.offset += windows_per_batch
                yield (chunk_ids[:, take], blocks[take]), chunk_targets[:, take]
            skip = 0
        progress.epoch, progress.offset = progress.epoch + 1, 0

