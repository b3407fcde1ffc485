"""Stories from a trained model: what the runner writes to samples.txt and what sample.py prints.

    stories = write_stories(model, tokenizer, prompts, settings, device)

A trained model comes from its run folder alone (run.trained.load_trained), so a folder copied
to another machine samples there without the original data or token cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from reservoir.data.corpus import EOT
from reservoir.models.base import LanguageModel
from reservoir.platform import device as dev
from reservoir.platform.messages import warn


@dataclass(frozen=True)
class SampleSettings:
    max_new_tokens: int
    temperature: float
    top_k: int | None
    seed: int
    num_samples: int = 1
    stop_at_end: bool = True  # one story per sample; False: write on through story ends (shown as blank lines)
    compiled: bool = False  # COMPILE=True: the decode step compiled (a fixed-shape carry: every token one graph)


def decode_story(tokenizer, ids) -> str:
    """Text of ``ids`` with every end of story shown as a blank line, not a literal marker."""
    return tokenizer.decode(np.asarray(ids)).replace(EOT, "\n\n").rstrip()


def warn_unknown_characters(tokenizer, prompt: str) -> None:
    """One warning naming the prompt's characters that the run's tokenizer does not have: the model reads
    each as <unk> (and the story shows it as '?'). Byte-level BPE has every character."""
    unk_id = getattr(tokenizer, "unk_id", None)
    if unk_id is None:
        return
    unknown = sorted({c for c in prompt if unk_id in tokenizer.encode(c)})
    if unknown:
        warn(f"prompt {prompt!r}: {', '.join(map(repr, unknown))} not in this run's vocabulary (its training text "
             "never has them): read as <unk>, shown as '?'")


def decode_steps(model, compiled: bool, cuda_graphs: bool = False) -> dict:
    """``generate``'s ``step`` and ``window`` where the model has a fixed-shape carry: its ``static_step``, and
    past its reach its full window, each compiled (COMPILE=True; one graph for every token and story, an eager
    fallback in one line); nothing without COMPILE (the model's own steps, eager). ``cuda_graphs``: on a GPU
    each compiled call is also replayed as one CUDA graph (torch.compile's "reduce-overhead"; measured by
    ``bench/bench_sampling.py``, not the default)."""
    if not compiled:
        return {}
    name, mode = type(model).__name__, "reduce-overhead" if cuda_graphs else None
    return {"step": dev.CompiledStep(type(model).static_step, None, True, name, what="decode step", fresh=False,
                                     mode=mode),
            "window": dev.CompiledStep(LanguageModel._window_logits, None, True, name, what="decode window",
                                       fresh=False, mode=mode)}


@torch.no_grad()
def write_stories(model, tokenizer, prompts: list[str], settings: SampleSettings,
                  device: torch.device) -> list[tuple[str, str]]:
    """(prompt, story) for every prompt, ``num_samples`` each, from one generator seeded once:
    the same settings give the same stories on every run."""
    model = model.to(device)
    model.eval()
    generator = torch.Generator().manual_seed(settings.seed)
    stop_id = tokenizer.eot_id if settings.stop_at_end else None
    steps = decode_steps(model, settings.compiled)
    out = []
    for prompt in prompts:
        warn_unknown_characters(tokenizer, prompt)
        ids = torch.from_numpy(np.asarray(tokenizer.encode(prompt), dtype=np.int64)).to(device)
        for _ in range(settings.num_samples):
            story = model.generate(ids, settings.max_new_tokens, temperature=settings.temperature,
                                   top_k=settings.top_k, stop_id=stop_id, generator=generator,
                                   stop_every=dev.story_end_reads(device), **steps)
            out.append((prompt, decode_story(tokenizer, story.numpy())))
    return out
