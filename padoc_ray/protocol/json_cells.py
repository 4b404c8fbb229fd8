"""An incremental scanner for a streamed JSON list of objects (a "cell" each), as pure code.

dots.ocr answers its layout prompt with ``[{"bbox": [...], "category": "Text"}, {...}]``. Read one
token at a time, a cell is complete the moment its closing ``}`` arrives, and that is when its
grounding branch can start. :class:`CellScanner` follows the JSON structure of text chunks (one
chunk per token) and reports, for each chunk, the cells it opened and closed, with character
offsets inside the chunk; strings (braces, brackets and escaped quotes inside them) are skipped.

It checks only the structure it needs: depth and strings. What a closed cell holds is then read with
:func:`json.loads` on its own text (:func:`cell_text`), so one broken cell never spoils the next.
Anything outside the list's cells other than ``[``, ``]``, ``,`` and whitespace is reported as stray
text, once per chunk. Nothing here knows tokens or tokenizers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: characters that may stand between cells at the list's level
_BETWEEN = frozenset(" \t\r\n,")


@dataclass
class ChunkEvents:
    """What one chunk did: ``opened`` / ``closed``: offsets (in the chunk) of a cell's ``{`` / ``}``;
    ``stray``: text outside any cell that is not the list's punctuation (the first of it)."""

    opened: list[int] = field(default_factory=list)
    closed: list[int] = field(default_factory=list)
    stray: str | None = None


class CellScanner:
    """Follows ``[ {cell}, {cell} ... ]`` across chunks. Depth 0: before the list; 1: inside it,
    between cells; 2 and more: inside a cell (its nested lists and objects)."""

    def __init__(self) -> None:
        self.depth = 0
        self.in_string = False
        self.escaped = False
        self.list_closed = False
        self.list_opened = False

    @property
    def in_cell(self) -> bool:
        return self.depth >= 2

    def feed(self, chunk: str) -> ChunkEvents:
        ev = ChunkEvents()
        for i, ch in enumerate(chunk):
            if self.in_string:
                if self.escaped:
                    self.escaped = False
                elif ch == "\\":
                    self.escaped = True
                elif ch == '"':
                    self.in_string = False
                continue
            if self.depth >= 2:  # inside a cell
                if ch == '"':
                    self.in_string = True
                elif ch in "{[":
                    self.depth += 1
                elif ch in "}]":
                    self.depth -= 1
                    if self.depth == 1:
                        ev.closed.append(i)
                continue
            if self.depth == 1 and ch == "{":
                self.depth = 2
                ev.opened.append(i)
            elif self.depth == 0 and ch == "[" and not self.list_opened:
                self.depth, self.list_opened = 1, True
            elif self.depth == 1 and ch == "]":
                self.depth, self.list_closed = 0, True
            elif self.depth == 0 and ch == "{" and not self.list_opened:  # a lone object: one cell, no list
                self.depth, self.list_opened = 2, True
                ev.opened.append(i)
            elif ch in _BETWEEN or (ch == "]" and self.list_closed):
                continue
            elif ev.stray is None:
                ev.stray = chunk[i:i + 40]
        return ev


def cell_text(chunks: list[str], first: int, start: int, last: int, end: int, joined: str | None = None) -> str:
    """The text of a cell that opened at ``chunks[first][start]`` and closed at ``chunks[last][end]``.
    ``joined``: the same chunks decoded together (multi-byte characters split across tokens come out
    whole there); the cell is cut from it by the lengths of what precedes and follows it in the end
    chunks, which are ASCII punctuation or whole characters either way."""
    if joined is None:
        joined = "".join(chunks[first:last + 1])
    head = start
    tail = len(chunks[last]) - end - 1
    return joined[head:len(joined) - tail if tail else len(joined)]
