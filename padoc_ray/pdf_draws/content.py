"""What the draw counter (:mod:`padoc_ray.pdf_draws`) reads of one PDF content stream: where it
draws each XObject, where it first selects each font, pattern and graphics state, and how many glyphs
it shows and objects it paints from a given byte on (:class:`Content`), plus the decoded bytes of a
stream or of a page's /Contents (:func:`content_bytes`). A content is read with regular
expressions, not parsed (see ``_NAMED_OP``); pikepdf is imported where a stream is read.
"""

from __future__ import annotations

import re

_NAME_CHARS = rb"[^\x00\t\n\f\r /\[\]()<>{}%]"
#: white space, comments included (pdfium's tokenizer skips a comment as it skips a space)
_WS = rb"(?:[\x00\t\n\f\r ]|%[^\r\n]*)*"
#: ``/Name Do``, ``/Name 12 Tf``, ``/Name scn``, ``/Name SCN``, ``/Name gs``: a content naming a
#: resource it draws or puts in force (a regular expression, not a parse: qpdf's tokenizer takes
#: seconds on a 100,000-marker plot; bytes inside strings or inline images that happen to read
#: ``/A Do`` only count one draw more each)
_NAMED_OP = re.compile(rb"/(" + _NAME_CHARS + rb"+)" + _WS + rb"(?:[-+]?(?:\d+\.?\d*|\.\d+)" + _WS
                       + rb")?(Do|Tf|scn|SCN|gs)(?!" + _NAME_CHARS + rb")")
_NAME_ESCAPE = re.compile(rb"#([0-9A-Fa-f]{2})")
_OP_START = rb"(?<![^\x00\t\n\f\r ()<>\[\]{}])"
_OP_END = rb"(?![^\x00\t\n\f\r ()<>\[\]{}/%])"
#: operators that paint an object (paths, text, images, forms, shadings): each renders the pattern
#: or soft mask in force once
_PAINT = re.compile(_OP_START + rb"(?:f\*?|F|B\*?|b\*?|S|s|sh|Do|EI|Tj|TJ|'|\")" + _OP_END)
_STRING_ESCAPE = re.compile(rb"\\.", re.S)
_HEX_STRING = re.compile(rb"<([0-9A-Fa-f\x00\t\n\f\r ]*)>")


def _unescape(m) -> bytes:
    return bytes([int(m.group(1), 16)])


class Content:
    """What the counter needs of one content stream: where it draws each XObject (name -> byte
    offsets), where it first selects each font, pattern and graphics state (name -> byte offset),
    and, on demand, how many glyphs it shows and objects it paints from a given offset on."""

    __slots__ = ("draws", "fonts", "patterns", "states", "_node", "_glyphs", "_paints")

    def __init__(self, data: bytes, node):
        draws: dict[str, list[int]] = {}
        fonts: dict[str, int] = {}
        patterns: dict[str, int] = {}
        states: dict[str, int] = {}
        names: dict[bytes, str] = {}
        for m in _NAMED_OP.finditer(data):
            raw, op = m.groups()
            name = names.get(raw)
            if name is None:
                name = names[raw] = "/" + _NAME_ESCAPE.sub(_unescape, raw).decode("latin-1")
            if op == b"Do":
                at = draws.get(name)
                if at is None:
                    draws[name] = [m.start()]
                else:
                    at.append(m.start())
            else:
                (fonts if op == b"Tf" else states if op == b"gs" else patterns).setdefault(name, m.start())
        self.draws, self.fonts, self.patterns, self.states = draws, fonts, patterns, states
        # glyphs and paints matter only under a Type 3 font, a pattern or a soft mask (rare): the
        # stream is read again then, rather than kept
        self._node = node
        self._glyphs: dict[int, int] = {}
        self._paints: dict[int, int] = {}

    def _data(self, start: int) -> bytes:
        return (content_bytes(self._node) or b"")[start:]

    def glyphs(self, start: int = 0) -> int:
        """Glyphs this content may show from byte ``start`` on: the bytes inside its string operands
        (0 without a text operator). A simple font (Type 3 is one) shows one glyph per byte."""
        if start not in self._glyphs:
            if "where" not in self._glyphs:
                self._glyphs["where"] = _glyph_offsets(self._data(0))
            import numpy as np

            where = self._glyphs["where"]
            self._glyphs[start] = len(where) - int(np.searchsorted(where, start))
        return self._glyphs[start]

    def paints(self, start: int = 0) -> int:
        """Objects this content paints from byte ``start`` on: its painting operators, plus one per
        glyph (text stroked with a pattern paints each glyph with it)."""
        if start not in self._paints:
            self._paints[start] = len(_PAINT.findall(self._data(start))) + self.glyphs(start)
        return self._paints[start]


def _glyph_offsets(data: bytes):
    """The offsets of the bytes inside a content's string operands (a sorted numpy array): the glyphs
    it may show, one a byte (a hex string: one per two digits, at the string's start). Empty when
    the content has no text operator."""
    import numpy as np

    if not (b"Tj" in data or b"TJ" in data or b"'" in data or b'"' in data):
        return np.zeros(0, np.int64)
    flat = _STRING_ESCAPE.sub(b"__", data)  # same length, so offsets stay those of data (an escape counts 2)
    a = np.frombuffer(flat, np.uint8)
    nesting = np.cumsum((a == 0x28).astype(np.int32) - (a == 0x29))  # ( and ): literal strings nest
    nesting -= np.minimum(np.minimum.accumulate(nesting), 0)  # a stray ) outside strings is ignored
    inside = (nesting > 0) & ~((nesting == 1) & (a == 0x28))  # not the ( opening each
    hexes = [np.full((len(m.group(1).translate(None, b"\x00\t\n\f\r ")) + 1) // 2, m.start(), np.int64)
             for m in _HEX_STRING.finditer(flat)]
    return np.sort(np.concatenate([np.flatnonzero(inside)] + hexes))


def content_bytes(node) -> bytes | None:
    """A form (pattern, glyph, appearance) stream's decoded bytes, or a page's /Contents joined; None
    when unreadable."""
    import pikepdf

    try:
        if isinstance(node, pikepdf.Stream):
            return node.read_bytes()
        streams = node.get("/Contents")
        if isinstance(streams, pikepdf.Stream):
            streams = [streams]
        return b"\n".join(c.read_bytes() for c in streams or () if isinstance(c, pikepdf.Stream))
    except Exception:  # noqa: BLE001 - unreadable content draws nothing pdfium can draw
        return None
