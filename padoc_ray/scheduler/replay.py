"""Teacher-forced replay: turn a ground-truth page into forced token traces for the scheduler, so
the real engine does the work a trained model would, with the page's real lengths."""

from __future__ import annotations

import hashlib
from dataclasses import replace

from padoc_ray.protocol import Page

from .runner import PageInput


def replay_input(model_protocol, truth: Page, base: PageInput, mode: str) -> PageInput:
    """``base`` with forced traces for ``truth`` in ``mode`` (branch-start tokens live in the
    child prompts, so forced branches start at the content). The truth is written at the input image's
    size where it says another: a family whose boxes are pixels of the image (dots) writes them in the
    pixels the engine gets."""
    if base.width and base.height and (truth.width, truth.height) != (base.width, base.height):
        truth = replace(truth, width=base.width, height=base.height)
    if mode == "fork":
        s = model_protocol.vocab.serialize_fork(model_protocol.tokenizer, truth)
        return replace(base, forced_main=s.layout, forced_branches=[b[1:] for b in s.branches])
    return replace(base, forced_main=model_protocol.vocab.serialize_sequential(model_protocol.tokenizer, truth),
                   forced_branches=None)


#: what an injected loop repeats (benchmarks: see :func:`inject_loops`)
LOOP_PHRASE = " and the same words once again,"


def injected_branches(n_branches: int, fraction: float, seed: int, key: str) -> list[int]:
    """The branches of a page (by index) that ``fraction`` of all branches, chosen by ``seed``, picks:
    each branch on its own, from a hash of (seed, the page's ``key``, its index), so the same seed
    and page always pick the same branches, whatever else runs."""
    if fraction <= 0:
        return []
    out = []
    for k in range(n_branches):
        h = hashlib.sha256(f"{seed}\0{key}\0{k}".encode()).digest()
        if int.from_bytes(h[:8], "big") / 2**64 < fraction:
            out.append(k)
    return out


def inject_loops(model_protocol, inp: PageInput, *, fraction: float, seed: int, key: str,
                 max_tokens: int) -> PageInput:
    """A teacher-forced fork-mode ``inp`` whose chosen branches (:func:`injected_branches`, among those
    with content) repeat :data:`LOOP_PHRASE` up to ``max_tokens`` on their first attempt; every later
    attempt replays the truth (``forced_branches``). How a benchmark shows recovery on the real engine."""
    traces = inp.forced_branches
    if not traces or fraction <= 0:
        return inp
    with_content = [k for k, t in enumerate(traces) if len(t) > 1]  # a contentless region's trace is its end
    phrase = list(model_protocol.tokenizer.encode(LOOP_PHRASE))
    loop = (phrase * (max_tokens // max(1, len(phrase)) + 1))[:max_tokens]
    chosen = injected_branches(len(with_content), fraction, seed, key)
    return replace(inp, forced_first_attempt={with_content[i]: loop for i in chosen})
