"""The ``hpd`` checkpoint family: HPD-Parsing's token protocol, as pure code.

HPD-Parsing (PaddlePaddle/HPD-Parsing, an InternVL-format checkpoint) writes PaDoc's tree with other
tokens. Its layout stream is text between special tokens::

    <BLOCK>text [x1,y1,x2,y2]<FORK><BLOCK>image [x1,y1,x2,y2]<BLOCK>title [...]<FORK>...<|im_end|>

* a region is the *text* after ``<BLOCK>``: a name and a box, read once the block is detokenized;
* ``<FORK>`` closes a region that has content: its branch's prompt is the page prompt + the layout
  tokens before ``<FORK>`` + ``<CHILD>``, and the branch decodes the region's content to ``<|im_end|>``;
* a block without ``<FORK>`` (a picture) has no content: it closes at the next ``<BLOCK>`` or at the
  stream's end, and gets no branch.

That is padoc-ray's fork rule (page prompt + layout tokens before the region's close + branch start)
with ``<FORK>`` as the close and ``<CHILD>`` as the branch start, so the scheduler runs it unchanged:
:class:`HpdVocab` offers what :class:`~padoc_ray.protocol.vocab.Vocab` offers (ids, a stream parser,
boxes, content formats, serialization for teacher-forced replay).

What the sources do not settle is a field of :class:`HpdSpec` with a documented default: the box
space (``box_space``, default ``norm1000``: integers 0-1000 of the page, the InternVL grounding
convention) and the category map (``categories``: HPD's open set of names onto the rows' categories).
A ``padoc_protocol.json`` with ``"family": "hpd"`` beside a checkpoint overrides any field.

Imports nothing heavy (no ray, vllm, torch or transformers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar, Mapping, Sequence

from .codec import (
    BOX_OUTSIDE_PAGE, MALFORMED_REGION, TRAILING_TOKENS, UNEXPECTED_TOKEN, PaDocSample, ParserBooks, RawRegion,
    box_in_space, coords_in_space, outside_space,
)
from .hpd_image import hpd_tile_grid, TILE
from .page import Box, Page, Region
from .spec import DEFAULT_CATEGORIES, ProtocolError, TextTokenizer, text_spec_from_dict, text_spec_to_dict

FAMILY = "hpd"

#: HPD's InternVL system line (InternVL's default chat template, as HPD's prompt uses it)
SYSTEM_LINE = ("你是书生·万象，英文名是InternVL，是由上海人工智能实验室、清华大学及多家合作单位联合开发的"
               "多模态大语言模型。")
#: the task text of HPD's fork-enabled parsing prompt
TASK_TEXT = "document parsing with fork."
#: vLLM's InternVL processor replaces this placeholder with ``<img>`` + image tokens + ``</img>``
IMAGE_PLACEHOLDER = "<image>"
#: the chat wrapping (InternVL's): ``{system}``, ``{image}`` and ``{text}`` are filled in
PROMPT_TEMPLATE = ("<|im_start|>system\n{system}<|im_end|>\n<|im_start|>user\n{image}\n{text}<|im_end|>\n"
                   "<|im_start|>assistant\n")

#: box spaces a checkpoint may emit its coordinates in (HpdSpec.box_space)
BOX_SPACES = ("norm1000", "pixels")

#: HPD's names onto the rows' categories (OmniDocBench's). HPD documents "text, title, image,
#: image_caption, header, page_number, ..." as examples of an unpublished set; the rest are the names
#: of PaddleOCR's layout models (the same authors) and of OmniDocBench. A name outside the map is kept
#: as it is and rendered as text (and counted: padoc_unknown_categories_total).
DEFAULT_CATEGORY_MAP: dict[str, str] = {
    "text": "text_block", "content": "text_block", "abstract": "text_block", "list": "text_block",
    "paragraph": "text_block",
    "title": "title", "doc_title": "title", "paragraph_title": "title", "section_title": "title",
    "image": "figure", "figure": "figure", "chart": "figure", "picture": "figure", "seal": "figure",
    "image_caption": "figure_caption", "figure_caption": "figure_caption", "figure_title": "figure_caption",
    "chart_caption": "figure_caption",
    "image_footnote": "figure_footnote", "figure_footnote": "figure_footnote", "vision_footnote": "figure_footnote",
    "table": "table", "table_caption": "table_caption", "table_title": "table_caption",
    "table_footnote": "table_footnote",
    "formula": "equation_isolated", "equation": "equation_isolated", "display_formula": "equation_isolated",
    "interline_equation": "equation_isolated",
    "formula_caption": "equation_caption", "formula_number": "equation_caption", "equation_caption": "equation_caption",
    "header": "header", "page_header": "header", "header_image": "header",
    "footer": "footer", "page_footer": "footer", "footer_image": "footer",
    "page_number": "page_number", "number": "page_number",
    "footnote": "page_footnote", "page_footnote": "page_footnote",
    "abandon": "abandon", "aside_text": "abandon",
    "code": "code_txt", "code_txt": "code_txt", "code_caption": "code_txt_caption",
    "reference": "reference", "reference_content": "reference", "references": "reference",
    "algorithm": "code_algorithm", "algorithm_caption": "code_algorithm_caption",
}

#: the name HPD gets for each row category when a page is written in HPD's form (replay, training data)
DEFAULT_HPD_NAMES: dict[str, str] = {
    "text_block": "text", "title": "title", "figure": "image", "figure_caption": "image_caption",
    "figure_footnote": "image_footnote", "table": "table", "table_caption": "table_caption",
    "table_footnote": "table_footnote", "equation_isolated": "formula", "equation_caption": "formula_caption",
    "header": "header", "footer": "footer", "page_number": "page_number", "page_footnote": "footnote",
    "abandon": "abandon", "code_txt": "code", "code_txt_caption": "code_caption", "reference": "reference",
    "code_algorithm": "algorithm", "code_algorithm_caption": "algorithm_caption",
}

#: a block's text: a name (word characters) and a box of four numbers
_BLOCK = re.compile(r"\s*(\w+)\s*\[\s*([^\]]*?)\s*\]\s*")
_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


@dataclass(frozen=True, kw_only=True)
class HpdTokens:
    """Token strings of HPD's protocol."""

    block: str = "<BLOCK>"  #: opens a region of the layout stream (its text follows)
    fork: str = "<FORK>"  #: closes a region that has content; the fork trigger
    child: str = "<CHILD>"  #: first input of every content branch
    end_of_stream: str = "<|im_end|>"  #: ends the layout stream and each branch


@dataclass(frozen=True, kw_only=True)
class HpdSpec:
    """The ``hpd`` family's protocol: tokens, prompt, image rule, box space and category map."""

    family: ClassVar[str] = FAMILY
    tokens: HpdTokens = field(default_factory=HpdTokens)
    system: str = SYSTEM_LINE
    prompt_text: Mapping[str, str] = field(default_factory=lambda: {"fork": TASK_TEXT})
    prompt_template: str = PROMPT_TEMPLATE
    image_placeholder: str = IMAGE_PLACEHOLDER
    #: the space of the coordinates in ``[x1,y1,x2,y2]``: ``norm1000`` (integers 0-1000 of the page's
    #: width and height; the default, InternVL's grounding convention) or ``pixels`` (pixels of the image
    #: as the model saw it, ``cols*448 x rows*448``). HPD's documentation does not say; see docs/protocol-and-models.md
    box_space: str = "norm1000"
    categories: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_CATEGORY_MAP))
    names: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_HPD_NAMES))
    tile: int = TILE

    def __post_init__(self) -> None:
        if self.box_space not in BOX_SPACES:
            raise ProtocolError(f"box_space must be one of {', '.join(BOX_SPACES)}, got {self.box_space!r}")
        if "fork" not in self.prompt_text:
            raise ProtocolError("prompt_text needs a 'fork' entry (the hpd family has no sequential prompt)")
        for key in ("{system}", "{image}", "{text}"):
            if key not in self.prompt_template:
                raise ProtocolError(f"prompt_template needs {key}")
        t = self.tokens
        if len({t.block, t.fork, t.child, t.end_of_stream}) != 4:
            raise ProtocolError("block, fork, child and end-of-stream must be four distinct tokens")
        bad = {k: v for k, v in self.categories.items() if v not in DEFAULT_CATEGORIES}
        if bad:
            raise ProtocolError(f"categories map HPD names onto unknown row categories: {bad}")

    def prompt(self, mode: str = "fork") -> str:
        """The page prompt as text, holding one unexpanded image placeholder."""
        if mode not in self.prompt_text:
            raise ProtocolError(f"the hpd family has no {mode!r} prompt: HPD-Parsing decodes only through its "
                                f"fork (its branches share positions with the layout stream)")
        return self.prompt_template.format(system=self.system, image=self.image_placeholder,
                                           text=self.prompt_text[mode])

    def all_added_tokens(self) -> list[str]:
        """Every token string a tokenizer must hold as one token."""
        t = self.tokens
        return [t.block, t.fork, t.child, t.end_of_stream, self.image_placeholder]

    def category(self, name: str) -> str:
        """The row category of an HPD name (the name itself when the map lacks it)."""
        return self.categories.get(name, self.categories.get(name.lower(), name))

    def known(self, name: str) -> bool:
        return name in self.categories or name.lower() in self.categories

    def hpd_name(self, category: str) -> str:
        return self.names.get(category, category)

    def content_format(self, category: str) -> str:
        """A row category's content format (a name outside the map: text)."""
        return DEFAULT_CATEGORIES.get(category, "text")

    def to_dict(self) -> dict:
        return text_spec_to_dict(self, FAMILY)

    @classmethod
    def from_dict(cls, d: Mapping) -> "HpdSpec":
        return text_spec_from_dict(cls, d, tokens_cls=HpdTokens, categories=DEFAULT_CATEGORY_MAP, names=DEFAULT_HPD_NAMES)


def _parse_block(text: str) -> tuple[str, tuple[float, float, float, float]] | str:
    """``name [x1,y1,x2,y2]`` -> (name, box); or why it does not parse."""
    m = _BLOCK.fullmatch(text)
    if m is None:
        return f"block {text[:80]!r} is not 'name [x1,y1,x2,y2]'"
    nums = [p.strip() for p in m.group(2).split(",")]
    if len(nums) != 4 or not all(_NUMBER.fullmatch(p) for p in nums):
        return f"block {text[:80]!r}: its box is not four numbers"
    x1, y1, x2, y2 = (float(p) for p in nums)
    return m.group(1), (x1, y1, x2, y2)


class HpdStreamParser(ParserBooks):
    """Incremental, tolerant parser of an HPD layout stream, fed one token id at a time.

    ``feed(tok)`` returns the :class:`~padoc_ray.protocol.codec.RawRegion` that token closed: a block
    closed by ``<FORK>`` (``has_branch``; ``fork_point`` = tokens before the ``<FORK>``), or a block
    without one, closed by the next ``<BLOCK>`` or by the end of the stream (no branch). The same
    contract as the padoc :class:`~padoc_ray.protocol.codec.StreamParser`: a block that does not parse
    is dropped with ``malformed_region``, any other token outside a block is ``unexpected_token``, and
    ``finish()`` flags a stream without its end. ``RawRegion.bins`` holds the coordinates as written
    (rounded), ``category`` the row category and ``label`` HPD's own name."""

    def __init__(self, vocab: "HpdVocab", *, sequential: bool = False):
        if sequential:
            raise ProtocolError("the hpd family has no sequential stream")
        super().__init__()
        self.vocab = vocab
        self.sequential = False
        self._block: list[int] | None = None  # the open block's tokens after <BLOCK>

    def _close(self, has_branch: bool) -> RawRegion | None:
        ids, self._block = self._block, None
        if any(t in self.vocab.control_ids for t in ids):
            self._issue(MALFORMED_REGION, "a protocol token inside a block's text")
            return None
        got = _parse_block(self.vocab.tokenizer.decode(ids))
        if isinstance(got, str):
            self._issue(MALFORMED_REGION, got)
            return None
        name, box = got
        spec = self.vocab.spec
        return self._add(RawRegion(index=len(self.regions), category=spec.category(name),
                                   bins=tuple(int(round(v)) for v in box), fork_point=self.n_fed, label=name,
                                   has_branch=has_branch))

    def feed(self, tok: int) -> RawRegion | None:
        v = self.vocab
        closed = None
        if self.ended:
            self._issue(TRAILING_TOKENS)
        elif tok == v.end_of_stream:
            if self._block is not None:
                closed = self._close(has_branch=False)
            self.ended = True
        elif tok == v.region_open:
            if self._block is not None:
                closed = self._close(has_branch=False)
            self._block = []
        elif tok == v.region_close:
            if self._block is None:
                self._issue(UNEXPECTED_TOKEN, f"{v.spec.tokens.fork} outside a block")
            else:
                closed = self._close(has_branch=True)
        elif self._block is not None:
            if len(self._block) >= v.max_block_tokens:
                self._issue(MALFORMED_REGION, f"a block's text ran past {v.max_block_tokens} tokens")
                self._block = None
            else:
                self._block.append(tok)
        else:
            self._issue(UNEXPECTED_TOKEN, f"token {tok} outside a block")
        self.n_fed += 1
        return closed


@dataclass(frozen=True)
class HpdVocab:
    """:class:`HpdSpec` bound to a tokenizer: the ids and rules the scheduler needs, under the names
    the padoc :class:`~padoc_ray.protocol.vocab.Vocab` uses (``region_open`` is ``<BLOCK>``,
    ``region_close`` ``<FORK>``, ``branch_start`` ``<CHILD>``)."""

    family: ClassVar[str] = FAMILY
    #: a block's text longer than this is not a region (a stream that never closes its block)
    max_block_tokens: ClassVar[int] = 64
    spec: HpdSpec
    tokenizer: TextTokenizer
    region_open: int
    region_close: int
    branch_start: int
    end_of_stream: int

    @classmethod
    def from_spec(cls, spec: HpdSpec, tokenizer: TextTokenizer) -> "HpdVocab":
        t = spec.tokens
        names = (("region_open", t.block), ("region_close", t.fork), ("branch_start", t.child),
                 ("end_of_stream", t.end_of_stream))
        ids = {name: tokenizer.token_to_id(tok) for name, tok in names}
        missing = [tok for name, tok in names if ids[name] is None]
        if missing:
            raise ProtocolError(f"tokenizer lacks HPD protocol tokens: {', '.join(missing)}")
        if len(set(ids.values())) != 4:
            raise ProtocolError("HPD protocol tokens map to overlapping ids in this tokenizer")
        return cls(spec=spec, tokenizer=tokenizer, **{k: int(v) for k, v in ids.items()})

    @cached_property
    def control_ids(self) -> frozenset[int]:
        """The protocol's ids: none of them is content."""
        return frozenset((self.region_open, self.region_close, self.branch_start, self.end_of_stream))

    # ---- what the scheduler and the codec ask of a family ----------------------------------------------
    def parser(self, *, sequential: bool = False) -> HpdStreamParser:
        return HpdStreamParser(self, sequential=sequential)

    def has_branch(self, raw: RawRegion) -> bool:
        """Whether a closed region gets a content branch: it was closed by ``<FORK>``."""
        return bool(raw.has_branch)

    def forkable(self, raw: RawRegion) -> bool:
        """Only a block the model closed with ``<FORK>`` can be forked: the child prompt ends at it."""
        return bool(raw.has_branch)

    def region_format(self, raw: RawRegion) -> str:
        """A region's content format; a block that forked keeps its content even where its category has
        none (a picture with a branch is read as text)."""
        fmt = self.spec.content_format(raw.category)
        return "text" if fmt == "none" and self.has_branch(raw) else fmt

    def known_category(self, raw: RawRegion) -> bool:
        return self.spec.known(raw.label or raw.category)

    def _space(self, width: int | None, height: int | None) -> tuple[float, float] | None:
        """The box space's size: 1000 x 1000 (``norm1000``), or the tiled image's pixels (``pixels``;
        None without the page's size)."""
        if self.spec.box_space == "norm1000":
            return 1000.0, 1000.0
        if not width or not height:
            return None
        cols, rows = hpd_tile_grid(width, height, tile=self.spec.tile)
        return float(cols * self.spec.tile), float(rows * self.spec.tile)

    def box(self, raw: RawRegion, width: int | None = None, height: int | None = None) -> Box:
        """The region's box, normalized 0-1 (origin top-left), clipped to the page."""
        space = self._space(width, height)
        if space is None:
            raise ProtocolError("box_space 'pixels' needs the page's size")
        return box_in_space(raw.bins, *space)

    def branch_prompt(self, prompt_ids: Sequence[int], layout_ids: Sequence[int], raw: RawRegion) -> list[int]:
        """``prefix-fork``: page prompt + the layout before the block's ``<FORK>`` + ``<CHILD>``."""
        return [*prompt_ids, *layout_ids[:raw.fork_point], self.branch_start]

    def box_errors(self, raw: RawRegion, width: int | None = None, height: int | None = None) -> list[str]:
        """``box_outside_page``: a coordinate past the box space's edge (kept, clipped to the page)."""
        space = self._space(width, height)
        return [BOX_OUTSIDE_PAGE] if space is not None and outside_space(raw.bins, *space) else []

    def _coords(self, box: Box, width: int, height: int) -> list[int]:
        return coords_in_space(box, *self._space(width, height))

    def block_text(self, region: Region, width: int, height: int) -> str:
        x1, y1, x2, y2 = self._coords(region.box, width, height)
        return f"{self.spec.hpd_name(region.category)} [{x1},{y1},{x2},{y2}]"

    def serialize_fork(self, tokenizer: TextTokenizer, page: Page) -> PaDocSample:
        """A page in HPD's form, in the shape the padoc form has (one branch and one fork point per
        region, by region index): the layout stream; each region's branch (``<CHILD>`` content
        ``<|im_end|>``); its fork point, the tokens before the token that closes it. A region whose
        category has no content gets no ``<FORK>``: it closes at the next ``<BLOCK>`` (or the stream's
        end) and its branch is never run."""
        layout: list[int] = []
        branches, forks = [], []
        for r in page.regions:
            if len(forks) < len(branches):  # the previous block had no <FORK>: this <BLOCK> closes it
                forks.append(len(layout))
            layout.append(self.region_open)
            layout.extend(tokenizer.encode(self.block_text(r, page.width, page.height)))
            content = [] if not r.content else list(tokenizer.encode(r.content))
            branches.append(tuple([self.branch_start, *content, self.end_of_stream]))
            if self.spec.content_format(r.category) != "none":
                forks.append(len(layout))
                layout.append(self.region_close)
        if len(forks) < len(branches):
            forks.append(len(layout))
        layout.append(self.end_of_stream)
        return PaDocSample(tuple(layout), tuple(branches), tuple(forks))

    def quantized(self, page: Page) -> Page:
        """The page as it comes back from HPD's tokens: boxes snapped to the box space's integers."""
        regs = []
        for r in page.regions:
            raw = RawRegion(index=0, category=r.category, fork_point=0,
                            bins=tuple(self._coords(r.box, page.width, page.height)))
            fmt = self.spec.content_format(r.category)
            content = None if fmt == "none" else (r.content or "")
            regs.append(Region(category=r.category, box=self.box(raw, page.width, page.height), content=content,
                               content_format=fmt))
        return Page(width=page.width, height=page.height, regions=tuple(regs), page_no=page.page_no,
                    image_path=page.image_path)


def hpd_config_tokens(config: Mapping) -> dict[str, int] | None:
    """The fork and child token ids an HPD checkpoint's ``config.json`` declares, or None when it is not
    one (an ``InternVLChatModel`` with ``fork_token_id`` and ``child_token_id``)."""
    archs = config.get("architectures") or ()
    if "InternVLChatModel" not in archs:
        return None
    if not isinstance(config.get("fork_token_id"), int) or not isinstance(config.get("child_token_id"), int):
        return None
    return {"fork_token_id": config["fork_token_id"], "child_token_id": config["child_token_id"]}


def check_config_ids(vocab: HpdVocab, config: Mapping) -> list[str]:
    """Disagreements between the tokenizer's ``<FORK>`` / ``<CHILD>`` and the ids ``config.json`` declares."""
    out = []
    for key, have, tok in (("fork_token_id", vocab.region_close, vocab.spec.tokens.fork),
                           ("child_token_id", vocab.branch_start, vocab.spec.tokens.child)):
        if key in config and config[key] != have:
            out.append(f"config.json {key}={config[key]} but the tokenizer's {tok} is id {have}")
    return out


def block_regions(vocab: HpdVocab, ids: Sequence[int]) -> list[RawRegion]:
    """Every region of a whole layout stream (tests, tools)."""
    p = vocab.parser()
    p.feed_many(ids)
    return p.finish()
