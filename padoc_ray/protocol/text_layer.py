"""A page's text layer (the characters a born-digital PDF already holds) and the drafts made from it.

Pure. :func:`padoc_ray.pdf.page_text_layer` reads it from a PDF page (pypdfium2); here it is plain
data: the characters in the file's order with their boxes, normalized to the displayed page like
:class:`~padoc_ray.protocol.page.Box` (origin top-left, rotation applied). A layer is judged before
use (:func:`trust`): ``absent`` (no text: a scan), ``untrusted`` (replacement or private-use
characters, ``(cid:N)`` names, control characters: a broken encoding), else ``used``. A region's draft
is the layer's characters whose centres lie in the region's box, in the file's order, joined the way
the content is written (:func:`region_text`); a draft is a guess the model checks, never content.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass

from .page import Box

USED, ABSENT, UNTRUSTED = "used", "absent", "untrusted"  #: a page's ``text_layer`` values
#: the share of suspicious characters above which a layer is ``untrusted``
UNTRUSTED_SHARE = 0.05
MAX_CHARS = 20_000  #: characters kept of one page's layer (a hostile layer costs a bounded read)
_CID = re.compile(r"\(cid:\d+\)")


@dataclass(frozen=True)
class TextLayer:
    """``text[i]`` sits in ``boxes[i]`` = (x1, y1, x2, y2), normalized; line breaks the PDF's text
    extraction inserted have empty boxes (all zeros). ``truncated``: the page held more than the cap."""

    text: str
    boxes: tuple[tuple[float, float, float, float], ...]
    truncated: bool = False

    def __post_init__(self):
        if len(self.text) != len(self.boxes):
            raise ValueError(f"{len(self.text)} characters but {len(self.boxes)} boxes")

    def to_bytes(self) -> bytes:
        """A compact form for a page row: the UTF-8 text's length, the text, then 4 float32 per char."""
        raw = self.text.encode("utf-8", "surrogatepass")
        flat = [v for b in self.boxes for v in b]
        return struct.pack(f"<?I{len(raw)}s{len(flat)}f", self.truncated, len(raw), raw, *flat)

    @classmethod
    def from_bytes(cls, data: bytes) -> "TextLayer":
        truncated, n = struct.unpack_from("<?I", data)
        off = struct.calcsize("<?I")
        text = data[off:off + n].decode("utf-8", "surrogatepass")
        flat = struct.unpack_from(f"<{len(text) * 4}f", data, off + n)
        return cls(text, tuple(tuple(flat[i:i + 4]) for i in range(0, len(flat), 4)), bool(truncated))


def _suspicious(ch: str) -> bool:
    o = ord(ch)
    return (o == 0xFFFD or 0xE000 <= o <= 0xF8FF or 0xF0000 <= o or 0xD800 <= o <= 0xDFFF
            or (o < 0x20 and ch not in "\t\r\n") or 0x7F <= o < 0xA0)


def trust(layer: TextLayer | None) -> str:
    """``absent``, ``untrusted`` or ``used`` (see the module's docstring)."""
    if layer is None:
        return ABSENT
    visible = [c for c in layer.text if not c.isspace()]
    if not visible:
        return ABSENT
    bad = sum(_suspicious(c) for c in visible) + 5 * len(_CID.findall(layer.text))
    return UNTRUSTED if bad > UNTRUSTED_SHARE * len(visible) else USED


def region_text(layer: TextLayer, box: Box, max_chars: int = 4000) -> str:
    """The layer's characters whose box centres lie in ``box``, in the file's order, as one paragraph:
    lines joined by a space, a word hyphenated across a line joined again; at most ``max_chars``."""
    out: list[str] = []
    pending_break = False
    for ch, (x1, y1, x2, y2) in zip(layer.text, layer.boxes):
        if ch in "\r\n" and x1 == y1 == x2 == y2 == 0:
            pending_break = bool(out)
            continue
        cx, cy = (x1 + x2) / 2, (y1 + y2) / 2
        if not (box.x1 <= cx <= box.x2 and box.y1 <= cy <= box.y2):
            continue
        if pending_break:
            pending_break = False
            if out and out[-1] == "-" and len(out) > 1 and out[-2].isalpha() and ch.islower():
                out.pop()  # hyphenated at the line's end: one word again
            elif out and not out[-1].isspace() and not ch.isspace():
                out.append(" ")
        out.append(ch)
        if len(out) >= max_chars:
            break
    return re.sub(r"[ \t]+", " ", "".join(out)).strip()
