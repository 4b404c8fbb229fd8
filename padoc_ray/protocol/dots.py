"""The ``dots`` checkpoint family: dots.ocr's layout pass and grounding branches, as pure code.

dots.ocr (rednote-hilab; vLLM's in-tree ``DotsOCRForCausalLM``, config ``dots_ocr``) has the two
prompts a fork needs:

* **layout-only** (``fork`` mode's main stream): the model answers with a JSON list of cells,
  ``[{"bbox": [x1, y1, x2, y2], "category": "Text"}, ...]``, boxes in pixels of the image as the model
  saw it (the page resized by :func:`smart_resize`);
* **grounding OCR** (each branch): the same image and "Extract text from the given bounding box ...
  Bounding Box:\\n[x1, y1, x2, y2]"; the model reads that box.

A cell is complete as soon as its ``}`` arrives, so its grounding request starts while the layout is
still being written. Every grounding prompt shares the image and the prompt text up to the box with
every other one of the page (the image comes first), so the prefix cache holds them once. That is a
**grounding branch** (:data:`BRANCH_SHAPE`): PaDoc's concurrency, without the layout prefix in the
child. ``sequential`` mode is dots.ocr's own single request, ``prompt_layout_all_en``: one JSON list
whose cells carry their ``text`` too.

:class:`DotsVocab` answers what the scheduler asks of a family (:class:`~padoc_ray.protocol.vocab.Vocab`
names): ``branch_start`` is the grounding prompt's last token (``<|assistant|>``), so a forced
branch and a draft look as they do for the other families. What the sources do not settle is a field
of :class:`DotsSpec` with a documented default (the chat wrapping, the category map); a
``padoc_protocol.json`` with ``"family": "dots"`` overrides any field, and the checkpoint's
``preprocessor_config.json`` gives the pixel budget (:func:`pixels_from_preprocessor`).

Imports nothing heavy (no ray, vllm, torch or transformers).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Mapping, Sequence

from .codec import (
    BOX_OUTSIDE_PAGE, MALFORMED_REGION, TRAILING_TOKENS, UNEXPECTED_TOKEN, PaDocSample, ParserBooks,
    RawRegion, SerializeError, box_in_space, coords_in_space, outside_space,
)
from .json_cells import CellScanner, cell_text
from .page import Box, Page, Region
from .spec import DEFAULT_CATEGORIES, ProtocolError, TextTokenizer, text_spec_from_dict, text_spec_to_dict

FAMILY = "dots"
#: how a branch's prompt is made: the page's grounding prompt with the region's box (no layout prefix)
BRANCH_SHAPE = "grounding"

#: dots.ocr's prompts (its ``dict_promptmode_to_prompt``): layout only (fork's main stream), layout with
#: text (sequential), grounding OCR (each branch; the box follows it)
LAYOUT_ONLY_TEXT = (
    "Please output the layout information from this PDF image, including each layout's bbox and its category. "
    "The bbox should be in the format [x1, y1, x2, y2]. The layout categories for the PDF document include "
    "['Caption', 'Footnote', 'Formula', 'List-item', 'Page-footer', 'Page-header', 'Picture', 'Section-header', "
    "'Table', 'Text', 'Title']. Do not output the corresponding text. The layout result should be in JSON format.")
LAYOUT_ALL_TEXT = (
    "Please output the layout information from the PDF image, including each layout element's bbox, its "
    "category, and the corresponding text content within the bbox.\n\n"
    "1. Bbox format: [x1, y1, x2, y2]\n\n"
    "2. Layout Categories: The possible categories are ['Caption', 'Footnote', 'Formula', 'List-item', "
    "'Page-footer', 'Page-header', 'Picture', 'Section-header', 'Table', 'Text', 'Title'].\n\n"
    "3. Text Extraction & Formatting Rules:\n"
    "    - Picture: For the 'Picture' category, the text field should be omitted.\n"
    "    - Formula: Format its text as LaTeX.\n"
    "    - Table: Format its text as HTML.\n"
    "    - All Others (Text, Title, etc.): Format their text as Markdown.\n\n"
    "4. Constraints:\n"
    "    - The output text must be the original text from the image, with no translation.\n"
    "    - All layout elements must be sorted according to human reading order.\n\n"
    "5. Final Output: The entire output must be a single JSON object.\n")
GROUNDING_TEXT = "Extract text from the given bounding box on the image (format: [x1, y1, x2, y2]).\nBounding Box:\n"

#: the image as dots.ocr's client writes it in the user turn (vLLM expands ``<|imgpad|>``)
IMAGE_TEXT = "<|img|><|imgpad|><|endofimg|>"
IMAGE_PAD = "<|imgpad|>"
#: dots.ocr's chat wrapping (its own, not Qwen's): ``{image}`` and ``{text}`` are filled in
PROMPT_TEMPLATE = "<|user|>{image}{text}<|endofuser|><|assistant|>"

#: Qwen2-VL's resize rule as dots.ocr's client and vLLM's processor apply it (dots_ocr/utils/consts.py)
IMAGE_FACTOR, MIN_PIXELS, MAX_PIXELS = 28, 3136, 11289600

#: dots.ocr's 11 layout categories onto the rows' (OmniDocBench's). ``Caption`` is a figure's or a
#: table's: dots.ocr does not say which, so it is ``figure_caption``; ``Section-header`` and ``Title``
#: are both ``title``. A name outside the map is kept as written, rendered as text, and counted.
DEFAULT_CATEGORY_MAP: dict[str, str] = {
    "Caption": "figure_caption", "Footnote": "page_footnote", "Formula": "equation_isolated",
    "List-item": "text_block", "Page-footer": "footer", "Page-header": "header", "Picture": "figure",
    "Section-header": "title", "Table": "table", "Text": "text_block", "Title": "title",
}
CATEGORIES = tuple(DEFAULT_CATEGORY_MAP)

#: the dots name each row category is written as (teacher-forced replay, training data)
DEFAULT_DOTS_NAMES: dict[str, str] = {
    "title": "Title", "text_block": "Text", "figure": "Picture", "figure_caption": "Caption",
    "figure_footnote": "Footnote", "table": "Table", "table_caption": "Caption", "table_footnote": "Footnote",
    "equation_isolated": "Formula", "equation_caption": "Caption", "header": "Page-header",
    "footer": "Page-footer", "page_number": "Page-footer", "page_footnote": "Footnote", "abandon": "Text",
    "code_txt": "Text", "code_txt_caption": "Caption", "reference": "Text", "code_algorithm": "Text",
    "code_algorithm_caption": "Caption",
}


def smart_resize(height: int, width: int, factor: int = IMAGE_FACTOR, min_pixels: int = MIN_PIXELS,
                 max_pixels: int = MAX_PIXELS) -> tuple[int, int]:
    """(height, width) of the image as the model sees it: each side a multiple of ``factor`` (the
    patch times the merge), the area within [min_pixels, max_pixels], the aspect ratio kept as
    nearly as that allows (Qwen2-VL's rule)."""
    if height <= 0 or width <= 0:
        raise ValueError(f"an image of {width}x{height} has no pixels")
    h = max(factor, round(height / factor) * factor)
    w = max(factor, round(width / factor) * factor)
    if h * w > max_pixels:
        scale = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / scale / factor) * factor)
        w = max(factor, math.floor(width / scale / factor) * factor)
    elif h * w < min_pixels:
        scale = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * scale / factor) * factor
        w = math.ceil(width * scale / factor) * factor
        if h * w > max_pixels:
            shrink = math.sqrt(h * w / max_pixels)
            h = max(factor, math.floor(h / shrink / factor) * factor)
            w = max(factor, math.floor(w / shrink / factor) * factor)
    return h, w


@dataclass(frozen=True, kw_only=True)
class DotsTokens:
    """Token strings of dots.ocr's chat format."""

    user: str = "<|user|>"
    end_of_user: str = "<|endofuser|>"
    assistant: str = "<|assistant|>"  #: ends every prompt: a branch's start
    end_of_stream: str = "<|endofassistant|>"  #: ends the layout stream and each branch
    image_start: str = "<|img|>"
    image_pad: str = IMAGE_PAD
    image_end: str = "<|endofimg|>"


@dataclass(frozen=True, kw_only=True)
class DotsSpec:
    """The ``dots`` family's protocol: prompts, chat wrapping, image rule and category map."""

    family: ClassVar[str] = FAMILY
    tokens: DotsTokens = field(default_factory=DotsTokens)
    prompt_template: str = PROMPT_TEMPLATE
    image_text: str = IMAGE_TEXT
    #: the main stream's task text per mode: ``fork``: layout only; ``sequential``: layout with text
    prompt_text: Mapping[str, str] = field(default_factory=lambda: {"fork": LAYOUT_ONLY_TEXT,
                                                                    "sequential": LAYOUT_ALL_TEXT})
    grounding_text: str = GROUNDING_TEXT
    categories: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_CATEGORY_MAP))
    names: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_DOTS_NAMES))
    #: the resize rule's factor and pixel budget (the checkpoint's preprocessor_config.json wins)
    factor: int = IMAGE_FACTOR
    min_pixels: int = MIN_PIXELS
    max_pixels: int = MAX_PIXELS

    def __post_init__(self) -> None:
        for key in ("{image}", "{text}"):
            if key not in self.prompt_template:
                raise ProtocolError(f"prompt_template needs {key}")
        if not self.prompt_template.endswith(self.tokens.assistant):
            raise ProtocolError(f"prompt_template must end with {self.tokens.assistant} (a branch's start)")
        if self.image_text.count(self.tokens.image_pad) != 1:
            raise ProtocolError(f"image_text must hold {self.tokens.image_pad} once")
        if "fork" not in self.prompt_text:
            raise ProtocolError("prompt_text needs a 'fork' entry (the layout-only prompt)")
        if not 0 < self.min_pixels <= self.max_pixels or self.factor <= 0:
            raise ProtocolError(f"bad pixel budget: factor {self.factor}, min {self.min_pixels}, max {self.max_pixels}")
        bad = {k: v for k, v in self.categories.items() if v not in DEFAULT_CATEGORIES}
        if bad:
            raise ProtocolError(f"categories map dots names onto unknown row categories: {bad}")

    def prompt(self, mode: str = "fork") -> str:
        """The page prompt of a mode's main stream, as text, holding the image once."""
        if mode not in self.prompt_text:
            raise ProtocolError(f"the dots family has no {mode!r} prompt")
        return self.prompt_template.format(image=self.image_text, text=self.prompt_text[mode])

    def grounding_parts(self) -> tuple[str, str]:
        """A grounding prompt around its box: (text before the box, text after it)."""
        before, after = self.prompt_template.split("{text}", 1)
        return before.format(image=self.image_text) + self.grounding_text, after

    def input_size(self, width: int, height: int) -> tuple[int, int]:
        """(width, height) of the image as the model sees it: the space of its boxes."""
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return w, h

    def coords(self, box: Box, width: int, height: int) -> list[int]:
        """A normalized box as the model writes it: integer pixels of the image as it sees it."""
        return coords_in_space(box, *self.input_size(width, height))

    def all_added_tokens(self) -> list[str]:
        t = self.tokens
        return [t.user, t.end_of_user, t.assistant, t.end_of_stream, t.image_start, t.image_pad, t.image_end]

    def category(self, name: str) -> str:
        return self.categories.get(name, name)

    def known(self, name: str) -> bool:
        return name in self.categories

    def dots_name(self, category: str) -> str:
        return self.names.get(category, category)

    def content_format(self, name: str) -> str:
        """A dots name's content format: Picture none, Formula LaTeX, Table HTML, the rest Markdown (text)."""
        cat = self.category(name)
        return DEFAULT_CATEGORIES.get(cat, "text")

    def to_dict(self) -> dict:
        return text_spec_to_dict(self, FAMILY)

    @classmethod
    def from_dict(cls, d: Mapping) -> "DotsSpec":
        return text_spec_from_dict(cls, d, tokens_cls=DotsTokens, categories=DEFAULT_CATEGORY_MAP, names=DEFAULT_DOTS_NAMES)


def pixels_from_preprocessor(pre: Mapping) -> dict[str, int]:
    """The resize rule's fields a checkpoint's ``preprocessor_config.json`` sets (Qwen2-VL's keys:
    ``min_pixels`` / ``max_pixels``, or ``size.shortest_edge`` / ``size.longest_edge``; the factor is
    ``patch_size * merge_size``)."""
    out: dict[str, int] = {}
    size = pre.get("size") if isinstance(pre.get("size"), Mapping) else {}
    lo = pre.get("min_pixels", size.get("shortest_edge"))
    hi = pre.get("max_pixels", size.get("longest_edge"))
    if isinstance(lo, int):
        out["min_pixels"] = lo
    if isinstance(hi, int):
        out["max_pixels"] = hi
    if isinstance(pre.get("patch_size"), int) and isinstance(pre.get("merge_size"), int):
        out["factor"] = pre["patch_size"] * pre["merge_size"]
    return out


def is_dots_config(config: Mapping) -> bool:
    """Whether a ``config.json`` is dots.ocr's (``DotsOCRForCausalLM``, or model type ``dots_ocr``)."""
    return "DotsOCRForCausalLM" in (config.get("architectures") or ()) or config.get("model_type") == "dots_ocr"


def _box_of(value) -> tuple[int, int, int, int] | str:
    if not isinstance(value, list) or len(value) != 4:
        return "its bbox is not a list of four numbers"
    if not all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in value):
        return "its bbox is not a list of four numbers"
    return tuple(int(round(v)) for v in value)  # type: ignore[return-value]


class DotsStreamParser(ParserBooks):
    """Incremental, tolerant parser of dots.ocr's JSON layout answer, fed one token id at a time.

    ``feed(tok)`` returns the :class:`~padoc_ray.protocol.codec.RawRegion` of the cell that token
    closed. A cell that is not ``{"bbox": [4 numbers], "category": name}`` (or, sequential, whose
    ``text`` is not a string) is dropped with ``malformed_region``; text outside the list's cells is
    ``unexpected_token``; a cell still open at the end is ``malformed_region``; ``finish()`` flags a
    stream without its end (``truncated``). ``RawRegion.bins``: the box as written (pixels of the image
    as the model saw it); ``label``: dots' own name; ``content_text``: the cell's text (sequential)."""

    def __init__(self, vocab: "DotsVocab", *, sequential: bool = False):
        super().__init__()
        self.vocab, self.sequential = vocab, sequential
        self.scan = CellScanner()
        self._ids: list[int] = []  # the open cell's tokens (from the one holding its "{")
        self._chunks: list[str] = []
        self._start = 0  # offset of the "{" in _chunks[0]
        self._cell_begin = 0  # tokens fed before the open cell's first token
        #: a layout-only cell longer than this is no region (a cell that never closes); a sequential cell
        #: holds its region's text, which only the stream's own token limit bounds
        self._cap = None if sequential else vocab.max_cell_tokens
        self._skipping = False  # inside a cell dropped at the cap

    def _cell(self, text: str) -> RawRegion | None:
        try:
            cell = json.loads(text)
        except json.JSONDecodeError as e:
            self._issue(MALFORMED_REGION, f"a cell is not valid JSON ({e.msg}): {text[:80]!r}")
            return None
        if not isinstance(cell, dict):
            self._issue(MALFORMED_REGION, f"a cell is not an object: {text[:80]!r}")
            return None
        box = _box_of(cell.get("bbox"))
        name = cell.get("category")
        if isinstance(box, str) or not isinstance(name, str) or not name:
            why = box if isinstance(box, str) else "its category is not a name"
            self._issue(MALFORMED_REGION, f"cell {text[:80]!r}: {why}")
            return None
        content = cell.get("text")
        if self.sequential and content is not None and not isinstance(content, str):
            self._issue(MALFORMED_REGION, f"cell {text[:80]!r}: its text is not a string")
            return None
        return self._add(RawRegion(
            index=len(self.regions), category=self.vocab.spec.category(name), bins=box, fork_point=self.n_fed + 1,
            label=name, has_branch=self.vocab.spec.content_format(name) != "none",
            content_text=(content or "") if self.sequential else None, layout_len=self.n_fed + 1 - self._cell_begin,
            content_ids=self.vocab.tokenizer.encode(content) if self.sequential and content else []))

    def _feed_text(self, tok: int) -> RawRegion | None:
        chunk = self.vocab.tokenizer.decode([tok])
        ev = self.scan.feed(chunk)
        if ev.stray is not None:
            self._issue(UNEXPECTED_TOKEN, f"text outside the layout's cells: {ev.stray!r}")
        closed, held = None, False  # held: this token is in the open cell's buffer
        # a token may close one cell and open the next (`}, {`): events in the order of the chunk
        for at, is_open in sorted([(o, True) for o in ev.opened] + [(e, False) for e in ev.closed]):
            if is_open:
                self._ids, self._chunks, self._start, self._cell_begin, held = [tok], [chunk], at, self.n_fed, True
                self._skipping = False
                continue
            if self._skipping:  # the end of a cell already dropped at its cap
                self._skipping, held = False, True
                continue
            if not held:
                self._ids.append(tok)
                self._chunks.append(chunk)
            joined = self.vocab.tokenizer.decode(self._ids) if len(self._ids) > 1 else chunk
            got = self._cell(cell_text(self._chunks, 0, self._start, len(self._chunks) - 1, at, joined))
            closed = closed or got
            self._ids, self._chunks, held = [], [], True
        if self.scan.in_cell and not held and not self._skipping:
            if self._cap is not None and len(self._ids) >= self._cap:  # dropped; its end is still followed
                self._issue(MALFORMED_REGION, f"a cell ran past {self._cap} tokens")
                self._ids, self._chunks, self._skipping = [], [], True
            else:
                self._ids.append(tok)
                self._chunks.append(chunk)
        return closed

    def feed(self, tok: int) -> RawRegion | None:
        v = self.vocab
        closed = None
        if self.ended:
            self._issue(TRAILING_TOKENS)
        elif tok == v.end_of_stream:
            if self.scan.in_cell and not self._skipping:
                self._issue(MALFORMED_REGION, "the stream ended inside a cell")
                self._ids, self._chunks = [], []
            self.ended = True
        elif tok in v.control_ids:
            self._issue(UNEXPECTED_TOKEN, f"protocol token {tok} in the layout's JSON")
        else:
            closed = self._feed_text(tok)
        self.n_fed += 1
        return closed


@dataclass(frozen=True)
class DotsVocab:
    """:class:`DotsSpec` bound to a tokenizer: what the scheduler and the codec ask of a family.
    ``region_open`` / ``region_close`` are None (the layout is JSON text); ``branch_start`` is
    ``<|assistant|>``, the last token of every prompt."""

    family: ClassVar[str] = FAMILY
    branch_shape: ClassVar[str] = BRANCH_SHAPE
    #: a layout-only cell longer than this is not a region (a stream that never closes its cell)
    max_cell_tokens: ClassVar[int] = 256
    spec: DotsSpec
    tokenizer: TextTokenizer
    branch_start: int
    end_of_stream: int
    image_pad: int
    region_open: None = None
    region_close: None = None

    @classmethod
    def from_spec(cls, spec: DotsSpec, tokenizer: TextTokenizer) -> "DotsVocab":
        t = spec.tokens
        names = (("branch_start", t.assistant), ("end_of_stream", t.end_of_stream), ("image_pad", t.image_pad))
        ids = {name: tokenizer.token_to_id(tok) for name, tok in names}
        missing = [tok for tok in spec.all_added_tokens() if tokenizer.token_to_id(tok) is None]
        if missing:
            raise ProtocolError(f"tokenizer lacks dots.ocr's tokens: {', '.join(missing)}")
        if len(set(ids.values())) != 3:
            raise ProtocolError("dots.ocr's tokens map to overlapping ids in this tokenizer")
        return cls(spec=spec, tokenizer=tokenizer, **{k: int(v) for k, v in ids.items()})

    @cached_property
    def control_ids(self) -> frozenset[int]:
        ids = [self.tokenizer.token_to_id(t) for t in self.spec.all_added_tokens()]
        return frozenset(int(i) for i in ids if i is not None)

    @cached_property
    def _grounding_ids(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        before, after = self.spec.grounding_parts()
        return tuple(_encode_with_specials(self, before)), tuple(_encode_with_specials(self, after))

    # ---- what the scheduler and the codec ask of a family ----------------------------------------
    def parser(self, *, sequential: bool = False) -> DotsStreamParser:
        return DotsStreamParser(self, sequential=sequential)

    def has_branch(self, raw: RawRegion) -> bool:
        return bool(raw.has_branch)

    def forkable(self, raw: RawRegion) -> bool:
        """A grounding branch needs nothing but the box: any cell could be read (a Picture is not)."""
        return bool(raw.has_branch)

    def branch_prompt(self, prompt_ids: Sequence[int], layout_ids: Sequence[int], raw: RawRegion) -> list[int]:
        """A grounding branch's prompt: the page's grounding prompt with the region's box as written
        (``str`` of a list, as dots.ocr's client writes it); neither the layout prompt nor its tokens."""
        before, after = self._grounding_ids
        return [*before, *self.tokenizer.encode(box_text(raw.bins)), *after]

    def region_format(self, raw: RawRegion) -> str:
        return self.spec.content_format(raw.label or raw.category)

    def known_category(self, raw: RawRegion) -> bool:
        return self.spec.known(raw.label or raw.category)

    def layout_tokens(self, raw: RawRegion) -> int:
        """Tokens the stream spent on the region's cell, less its text's (sequential: ``content_ids``,
        the text as the tokenizer writes it outside JSON's escapes)."""
        return max(1, raw.layout_len - len(raw.content_ids))

    def box(self, raw: RawRegion, width: int | None = None, height: int | None = None) -> Box:
        """The region's box, normalized 0-1 of the page, clipped to it."""
        if not width or not height:
            raise ProtocolError("a dots box needs the page's size (its pixels are the resized image's)")
        return box_in_space(raw.bins, *self.spec.input_size(width, height))

    def box_errors(self, raw: RawRegion, width: int | None, height: int | None) -> list[str]:
        """``box_outside_page``: a corner past the resized image's edge (kept, clipped to the page)."""
        if not width or not height:
            return []
        return [BOX_OUTSIDE_PAGE] if outside_space(raw.bins, *self.spec.input_size(width, height)) else []

    def coords(self, box: Box, width: int, height: int) -> list[int]:
        return self.spec.coords(box, width, height)

    def cells(self, page: Page, *, with_text: bool) -> list[dict]:
        out = []
        for r in page.regions:
            name = self.spec.dots_name(r.category)
            cell: dict = {"bbox": self.coords(r.box, page.width, page.height), "category": name}
            if with_text and self.spec.content_format(name) != "none":
                cell["text"] = r.content or ""
            out.append(cell)
        return out

    def serialize_fork(self, tokenizer: TextTokenizer, page: Page) -> PaDocSample:
        """A page as dots.ocr writes it: the layout-only JSON (+ end), one branch per region
        (``<|assistant|>`` content end; a Picture's is never run) and each region's close, as the
        parser finds it in those very tokens."""
        layout = [*tokenizer.encode(json.dumps(self.cells(page, with_text=False), ensure_ascii=False)),
                  self.end_of_stream]
        p = self.parser()
        closes = [p.n_fed for t in layout if p.feed(t) is not None]
        if len(closes) != len(page.regions) or p.issues:
            raise SerializeError(f"the page's layout JSON does not read back ({len(closes)} of "
                                 f"{len(page.regions)} cells; {p.error_codes})")
        branches = tuple((self.branch_start, *(tokenizer.encode(r.content) if r.content else ()), self.end_of_stream)
                         for r in page.regions)
        return PaDocSample(tuple(layout), branches, tuple(closes))

    def serialize_sequential(self, tokenizer: TextTokenizer, page: Page) -> tuple[int, ...]:
        """A page as dots.ocr's ``prompt_layout_all_en`` answers: one JSON list, cells with their text."""
        return (*tokenizer.encode(json.dumps(self.cells(page, with_text=True), ensure_ascii=False)),
                self.end_of_stream)

    def quantized(self, page: Page) -> Page:
        """The page as it comes back from dots' JSON: boxes snapped to the resized image's pixels,
        categories through dots' names (a table caption comes back a figure caption)."""
        regs = []
        for r in page.regions:
            name = self.spec.dots_name(r.category)
            cat = self.spec.category(name)
            bins = tuple(self.coords(r.box, page.width, page.height))
            raw = RawRegion(index=0, category=cat, fork_point=0, bins=bins)  # type: ignore[arg-type]
            fmt = self.spec.content_format(name)
            content = None if fmt == "none" else (r.content or "")
            regs.append(Region(category=cat, box=self.box(raw, page.width, page.height), content=content,
                               content_format=fmt))
        return Page(width=page.width, height=page.height, regions=tuple(regs), page_no=page.page_no,
                    image_path=page.image_path)


def box_text(bins: Sequence[int]) -> str:
    """A box as dots.ocr's client writes it after the grounding prompt: ``str`` of a list of ints."""
    return "[" + ", ".join(str(int(v)) for v in bins) + "]"


def _encode_with_specials(vocab: DotsVocab, text: str) -> list[int]:
    """``text`` as ids, each of dots' chat tokens (``<|user|>``, ``<|imgpad|>``, ...) as its own id,
    whatever the tokenizer would make of it in context."""
    specials = sorted(vocab.spec.all_added_tokens(), key=len, reverse=True)
    out: list[int] = []
    for part in re.split("(" + "|".join(map(re.escape, specials)) + ")", text):
        if part in specials:
            out.append(int(vocab.tokenizer.token_to_id(part)))
        elif part:
            out.extend(vocab.tokenizer.encode(part))
    return out


def prompt_ids(vocab: DotsVocab, mode: str) -> tuple[int, ...]:
    """A mode's page-prompt ids, holding one unexpanded ``<|imgpad|>``; the chat tokens as their ids."""
    return tuple(_encode_with_specials(vocab, vocab.spec.prompt(mode)))


def layout_cells(vocab: DotsVocab, ids: Sequence[int], *, sequential: bool = False) -> list[RawRegion]:
    """Every region of a whole layout answer (tests, tools)."""
    p = vocab.parser(sequential=sequential)
    p.feed_many(ids)
    return p.finish()


__all__ = ["FAMILY", "BRANCH_SHAPE", "DotsSpec", "DotsTokens", "DotsVocab", "DotsStreamParser",
           "smart_resize", "is_dots_config", "pixels_from_preprocessor", "box_text", "prompt_ids", "layout_cells"]
