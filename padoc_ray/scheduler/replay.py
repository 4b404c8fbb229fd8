"""Teacher-forced replay: turn a ground-truth page into forced token traces for the scheduler, so
the real engine does the work a trained model would, with the page's real lengths."""

from __future__ import annotations

from dataclasses import replace

from padoc_ray.protocol import Page, serialize_padoc, serialize_sequential

from .runner import PageInput


def replay_input(model_protocol, truth: Page, base: PageInput, mode: str) -> PageInput:
    """``base`` with forced traces for ``truth`` in ``mode`` (branch-start tokens live in the
    child prompts, so forced branches start at the content)."""
    if mode == "fork":
        s = serialize_padoc(model_protocol.vocab, model_protocol.tokenizer, truth)
        return replace(base, forced_main=s.layout, forced_branches=[b[1:] for b in s.branches])
    return replace(base, forced_main=serialize_sequential(model_protocol.vocab, model_protocol.tokenizer, truth), forced_branches=None)
