"""The ``padoc`` family's vocabulary: a :class:`~padoc_ray.protocol.spec.ProtocolSpec` with its token strings
resolved to the ids of one tokenizer, and what the scheduler and the codec ask of a checkpoint family.
Pure (no ray, vllm, torch or transformers)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import ClassVar, Mapping, Sequence

from .codec import StreamParser, child_prompt, dequantize, serialize_padoc, serialize_sequential
from .page import Box
from .spec import ProtocolError, ProtocolSpec, TextTokenizer


@dataclass(frozen=True)
class Vocab:
    """A spec with its token strings resolved to ids of one tokenizer: the ``padoc`` family.

    What the scheduler and the codec ask of a checkpoint family (the ``hpd`` family's
    :class:`~padoc_ray.protocol.hpd.HpdVocab` answers the same): the control ids (``region_open``,
    ``region_close`` = the fork trigger, ``branch_start``, ``end_of_stream``, ``control_ids``), a stream
    parser (:meth:`parser`), whether a closed region gets a branch (:meth:`has_branch`,
    :meth:`forkable`), its box and content format, and a page in fork form for replay
    (:meth:`serialize_fork`)."""

    family: ClassVar[str] = "padoc"
    spec: ProtocolSpec
    region_open: int
    region_close: int
    branch_start: int
    end_of_stream: int
    category_ids: Mapping[str, int]  # category name -> id
    coord_ids: tuple[int, ...]  # bin -> id
    id_to_category: Mapping[int, str]
    id_to_bin: Mapping[int, int]

    @classmethod
    def from_spec(cls, spec: ProtocolSpec, tokenizer: TextTokenizer) -> "Vocab":
        missing: list[str] = []

        def tid(tok: str) -> int:
            i = tokenizer.token_to_id(tok)
            if i is None:
                missing.append(tok)
                return -1
            return int(i)

        t = spec.tokens
        ids = dict(
            region_open=tid(t.region_open),
            region_close=tid(t.region_close),
            branch_start=tid(t.branch_start),
            end_of_stream=tid(t.end_of_stream),
        )
        cats = {c.name: tid(c.token) for c in spec.categories}
        coords = tuple(tid(spec.coord_token(b)) for b in range(spec.coordinates.bins))
        if missing:
            shown = ", ".join(missing[:8]) + (f" ... ({len(missing)} in all)" if len(missing) > 8 else "")
            raise ProtocolError(f"tokenizer lacks protocol tokens: {shown}")
        all_ids = list(ids.values()) + list(cats.values()) + list(coords)
        if len(set(all_ids)) != len(all_ids):
            raise ProtocolError("protocol tokens map to overlapping ids in this tokenizer")
        return cls(
            spec=spec,
            category_ids=cats,
            coord_ids=coords,
            id_to_category={v: k for k, v in cats.items()},
            id_to_bin={v: b for b, v in enumerate(coords)},
            **ids,
        )

    @cached_property
    def control_ids(self) -> frozenset[int]:
        """Every protocol id (control, category, coordinate): none of them is content."""
        return frozenset(
            [self.region_open, self.region_close, self.branch_start, self.end_of_stream]
            + list(self.category_ids.values())
            + list(self.coord_ids)
        )

    # ---- what the scheduler and the codec ask of a family --------------------------------------------
    def parser(self, *, sequential: bool = False):
        """A fresh incremental parser of a layout stream (or, ``sequential``, of a sequential stream)."""
        return StreamParser(self, sequential=sequential)

    def has_branch(self, raw) -> bool:
        """Whether a closed region has content to decode: its category's content format says."""
        return self.spec.content_format(raw.category) != "none"

    def forkable(self, raw) -> bool:
        """Whether a branch may start for it at all (padoc: always; ``skip_contentless`` decides)."""
        return True

    def region_format(self, raw) -> str:
        return self.spec.content_format(raw.category)

    def known_category(self, raw) -> bool:
        return raw.category in self.category_ids

    def box(self, raw, width: int | None = None, height: int | None = None):
        """The region's normalized box: each bin's centre, corners sorted."""
        bins = self.spec.coordinates.bins
        x1, y1, x2, y2 = (dequantize(b, bins) for b in raw.bins)
        return Box(min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))

    def branch_prompt(self, prompt_ids: Sequence[int], layout_ids: Sequence[int], raw) -> list[int]:
        """A branch's prompt, ``prefix-fork`` shape (:func:`~padoc_ray.protocol.codec.child_prompt`)."""
        return child_prompt(prompt_ids, layout_ids, raw.fork_point, self)

    def box_errors(self, raw, width: int | None = None, height: int | None = None) -> list[str]:
        """A box's errors that only its page's size shows: none (bins cannot leave the page)."""
        return []

    def layout_tokens(self, raw) -> int:
        """Layout tokens a region takes: R_OPEN, its fields, R_CLOSE."""
        return len(self.spec.coordinates.region_fields) + 2

    def serialize_fork(self, tokenizer: TextTokenizer, page):
        """The page in fork form (layout stream, branches, fork points), as a trained model writes it."""
        return serialize_padoc(self, tokenizer, page)

    def serialize_sequential(self, tokenizer: TextTokenizer, page) -> tuple[int, ...]:
        """The page as one sequential stream (each region's layout, then its content inline)."""
        return serialize_sequential(self, tokenizer, page)
