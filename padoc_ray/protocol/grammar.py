"""The layout stream's grammar as an incremental automaton: which token ids may come next.

A well-formed layout stream is ``(R_OPEN field... R_CLOSE)* EOS``, the fields in the spec's
``region_fields`` order (a category token, then coordinate tokens), with ``x1 <= x2`` and
``y1 <= y2`` whatever order the fields come in. :class:`LayoutGrammar` holds a vocab's tables;
:meth:`LayoutGrammar.cursor` starts one stream's state, which :meth:`LayoutCursor.advance` moves
one token at a time in O(1) (no re-parsing of the prefix). A cursor optionally caps the stream at
``max_regions`` regions and ``max_tokens`` tokens: it opens a region only when that region, its
close and the end-of-stream token all still fit, so a constrained stream always ends with
end-of-stream inside its budget and every prefix it allows is a prefix of a stream that
:class:`~padoc_ray.protocol.codec.StreamParser` reads without an error.

:meth:`LayoutCursor.allowed` describes the next-token set compactly (a :class:`Allowed`: a kind
plus an inclusive bin range for coordinates), which is what a vectorized logits mask needs;
:meth:`LayoutCursor.allowed_ids` materializes it. A token the grammar does not allow (a teacher-
forced one) moves the cursor to ``FREE``: from then on the stream is unconstrained. The grammar
covers the fork-mode layout stream only, not the sequential stream (whose content is free text).
Pure: no engine, no tensors.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

from .vocab import Vocab


class Kind(IntEnum):
    """What may come next."""

    OPEN_OR_END = 0  #: between regions: R_OPEN or end-of-stream
    END = 1  #: a limit is reached: end-of-stream only
    CATEGORY = 2  #: a category token
    COORD = 3  #: a coordinate token whose bin is in [lo, hi]
    CLOSE = 4  #: R_CLOSE
    FREE = 5  #: anything (the stream ended, or left the grammar through a forced token)


@dataclass(frozen=True)
class Allowed:
    kind: Kind
    lo: int = 0  #: COORD only: the smallest allowed bin
    hi: int = -1  #: COORD only: the largest allowed bin


# phases of a cursor besides "expecting field i" (0 <= i < number of fields)
_BETWEEN, _ENDED, _FREE = -1, -2, -3
_PARTNER = {"x1": "x2", "x2": "x1", "y1": "y2", "y2": "y1"}


class LayoutGrammar:
    """Per-vocab tables of the layout grammar (build once, start one cursor per stream)."""

    def __init__(self, vocab: Vocab):
        self.vocab = vocab
        self.bins = vocab.spec.coordinates.bins
        fields = vocab.spec.coordinates.region_fields
        self.n_fields = len(fields)
        #: tokens of one region: R_OPEN, its fields, R_CLOSE
        self.region_len = self.n_fields + 2
        pos = {f: i for i, f in enumerate(fields)}
        # per field position: (is category, position of the partner coordinate, is the upper corner)
        self._fields: tuple[tuple[bool, int, bool], ...] = tuple(
            (f == "category", -1 if f == "category" else pos[_PARTNER[f]], f in ("x2", "y2")) for f in fields
        )

    def cursor(self, *, max_regions: int | None = None, max_tokens: int | None = None) -> LayoutCursor:
        """A fresh stream's state. ``max_regions``: regions at most (then only end-of-stream);
        ``max_tokens``: the stream's token budget, end-of-stream included."""
        if max_regions is not None and max_regions < 0:
            raise ValueError("max_regions must be >= 0")
        if max_tokens is not None and max_tokens < 1:
            raise ValueError("max_tokens must be >= 1 (room for end-of-stream)")
        return LayoutCursor(self, max_regions, max_tokens)

    def ids_of(self, allowed: Allowed) -> frozenset[int]:
        """The token ids an :class:`Allowed` stands for (FREE: the empty set, meaning 'any')."""
        v, k = self.vocab, allowed.kind
        if k == Kind.OPEN_OR_END:
            return frozenset((v.region_open, v.end_of_stream))
        if k == Kind.END:
            return frozenset((v.end_of_stream,))
        if k == Kind.CATEGORY:
            return frozenset(v.category_ids.values())
        if k == Kind.COORD:
            return frozenset(v.coord_ids[allowed.lo:allowed.hi + 1])
        if k == Kind.CLOSE:
            return frozenset((v.region_close,))
        return frozenset()


class LayoutCursor:
    """One layout stream's position in the grammar."""

    __slots__ = ("_bins", "g", "max_regions", "max_tokens", "n_regions", "n_tokens", "phase")

    def __init__(self, grammar: LayoutGrammar, max_regions: int | None, max_tokens: int | None):
        self.g = grammar
        self.max_regions, self.max_tokens = max_regions, max_tokens
        self.phase = _BETWEEN
        self.n_tokens = 0  #: tokens fed so far
        self.n_regions = 0  #: regions closed so far
        self._bins = [0] * grammar.n_fields  # bins of the current region's coordinates, by field position

    @property
    def ended(self) -> bool:
        return self.phase == _ENDED

    @property
    def free(self) -> bool:
        """True once a token outside the grammar was fed: the stream is no longer constrained."""
        return self.phase == _FREE

    def _may_open(self) -> bool:
        if self.max_regions is not None and self.n_regions >= self.max_regions:
            return False
        return self.max_tokens is None or self.n_tokens + self.g.region_len + 1 <= self.max_tokens

    def allowed(self) -> Allowed:
        ph = self.phase
        if ph == _BETWEEN:
            return Allowed(Kind.OPEN_OR_END if self._may_open() else Kind.END)
        if ph < 0:  # ended or free
            return Allowed(Kind.FREE)
        if ph == self.g.n_fields:
            return Allowed(Kind.CLOSE)
        is_cat, partner, upper = self.g._fields[ph]
        if is_cat:
            return Allowed(Kind.CATEGORY)
        if partner < ph:  # the other corner is known: keep the box's corners ordered
            b = self._bins[partner]
            return Allowed(Kind.COORD, b, self.g.bins - 1) if upper else Allowed(Kind.COORD, 0, b)
        return Allowed(Kind.COORD, 0, self.g.bins - 1)

    def allowed_ids(self) -> frozenset[int] | None:
        """The ids allowed next; None when any token is (ended or free)."""
        a = self.allowed()
        return None if a.kind == Kind.FREE else self.g.ids_of(a)

    def advance(self, tok: int) -> bool:
        """Feed one token; False if the grammar did not allow it (the cursor is then FREE)."""
        ok = self._step(tok)
        self.n_tokens += 1
        if not ok:
            self.phase = _FREE
        return ok

    def _step(self, tok: int) -> bool:
        v, ph = self.g.vocab, self.phase
        if ph == _BETWEEN:
            if tok == v.end_of_stream:
                self.phase = _ENDED
                return True
            if tok == v.region_open and self._may_open():
                self.phase = 0
                return True
            return False
        if ph < 0:  # after end-of-stream, or already free
            return False
        if ph == self.g.n_fields:
            if tok != v.region_close:
                return False
            self.n_regions += 1
            self.phase = _BETWEEN
            return True
        is_cat, partner, upper = self.g._fields[ph]
        if is_cat:
            if tok not in v.id_to_category:
                return False
        else:
            b = v.id_to_bin.get(tok)
            if b is None or (partner < ph and (b < self._bins[partner] if upper else b > self._bins[partner])):
                return False
            self._bins[ph] = b
        self.phase = ph + 1
        return True
