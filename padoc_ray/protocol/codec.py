"""Pages <-> token ids, in the PaDoc form (layout stream + branches) and the sequential form.

Serializers turn a :class:`Page` into ids. :class:`StreamParser` reads ids back incrementally, one
token at a time, reporting every region close as it happens (that is the fork trigger the
scheduler acts on); it never raises on bad input: malformed or truncated streams give what is
recoverable plus explicit error codes. This module knows nothing of engines or images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Iterable, Sequence

from .page import Box, Page, Region
from .spec import BOX_FIELDS, TextTokenizer

if TYPE_CHECKING:  # a Vocab builds this module's parsers: the module names it in annotations only
    from .vocab import Vocab

# ---- error codes (stable strings; they end up in Parquet rows and HTTP answers) -----------------
TRUNCATED = "truncated"  # a stream ended without its end-of-stream token
MALFORMED_REGION = "malformed_region"  # a region whose fields are missing, extra or of the wrong kind
UNEXPECTED_TOKEN = "unexpected_token"  # a token where none of its kind may stand (e.g. text in the layout stream)
TRAILING_TOKENS = "trailing_tokens"  # tokens after end-of-stream
INVALID_BOX = "invalid_box"  # x2 < x1 or y2 < y1 (kept, with corners sorted)
CONTROL_IN_CONTENT = "control_token_in_content"  # a protocol token inside a content branch (dropped)
MISSING_BRANCH = "missing_branch"  # fork mode: a region whose branch result is absent
BOX_OUTSIDE_PAGE = "box_outside_page"  # a box past the page's edges as the family measures them (kept, clipped)

ERROR_CODES = (
    TRUNCATED, MALFORMED_REGION, UNEXPECTED_TOKEN, TRAILING_TOKENS, INVALID_BOX,
    CONTROL_IN_CONTENT, MISSING_BRANCH, BOX_OUTSIDE_PAGE,
)


class SerializeError(ValueError):
    """A page that cannot be written as tokens (e.g. a NaN box)."""


# ---- coordinates ----------------------------------------------------------------------------------
def quantize(v: float, bins: int) -> int:
    """Normalized coordinate -> bin in [0, bins-1]; values outside [0, 1] are clamped."""
    if not math.isfinite(v):
        raise SerializeError(f"coordinate {v!r} is not finite")
    return min(bins - 1, max(0, int(math.floor(v * bins))))


def dequantize(b: int, bins: int) -> float:
    """Bin -> the centre of that bin, normalized."""
    return (b + 0.5) / bins


# a text family's box: integers in a space of ``sx`` x ``sy`` (hpd: 0-1000 or the tiled image's pixels; dots:
# the resized image's pixels)
def box_in_space(bins: Sequence[float], sx: float, sy: float) -> Box:
    """Integer corners in an ``sx`` x ``sy`` space -> the normalized box, corners sorted, clipped to the page."""
    x1, y1, x2, y2 = bins
    c = lambda v: min(1.0, max(0.0, v))  # noqa: E731
    return Box(c(min(x1, x2) / sx), c(min(y1, y2) / sy), c(max(x1, x2) / sx), c(max(y1, y2) / sy))


def coords_in_space(box: Box, sx: float, sy: float) -> list[int]:
    """A normalized box -> its integer corners in an ``sx`` x ``sy`` space (clipped to the page first)."""
    b = box.clipped()
    if not all(math.isfinite(v) for v in b.as_tuple()):
        raise SerializeError(f"box {box} is not finite")
    return [int(round(b.x1 * sx)), int(round(b.y1 * sy)), int(round(b.x2 * sx)), int(round(b.y2 * sy))]


def outside_space(bins: Sequence[float], sx: float, sy: float) -> bool:
    """Whether a corner lies past the ``sx`` x ``sy`` space's edges (``box_outside_page``)."""
    x1, y1, x2, y2 = bins
    return min(bins) < 0 or max(x1, x2) > sx or max(y1, y2) > sy


# ---- serialization --------------------------------------------------------------------------------
@dataclass(frozen=True)
class PaDocSample:
    """A page in PaDoc form. ``fork_points[k]`` is the number of layout tokens before region k's close."""

    layout: tuple[int, ...]
    branches: tuple[tuple[int, ...], ...]
    fork_points: tuple[int, ...]


def region_layout_tokens(vocab: Vocab, region: Region) -> list[int]:
    """R_OPEN fields... R_CLOSE for one region."""
    bins = vocab.spec.coordinates.bins
    b = region.box
    q = {
        "x1": quantize(b.x1, bins), "y1": quantize(b.y1, bins),
        "x2": quantize(b.x2, bins), "y2": quantize(b.y2, bins),
    }
    if region.category not in vocab.category_ids:
        raise SerializeError(f"category {region.category!r} is not in the protocol spec")
    out = [vocab.region_open]
    for f in vocab.spec.coordinates.region_fields:
        out.append(vocab.category_ids[region.category] if f == "category" else vocab.coord_ids[q[f]])
    out.append(vocab.region_close)
    return out


def content_tokens(tokenizer: TextTokenizer, region: Region) -> list[int]:
    if region.content_format == "none" or not region.content:
        return []
    return list(tokenizer.encode(region.content))


def serialize_padoc(vocab: Vocab, tokenizer: TextTokenizer, page: Page) -> PaDocSample:
    layout: list[int] = []
    branches, forks = [], []
    for r in page.regions:
        toks = region_layout_tokens(vocab, r)
        layout.extend(toks[:-1])
        forks.append(len(layout))
        layout.append(toks[-1])
        branches.append(tuple([vocab.branch_start, *content_tokens(tokenizer, r), vocab.end_of_stream]))
    layout.append(vocab.end_of_stream)
    return PaDocSample(tuple(layout), tuple(branches), tuple(forks))


def serialize_sequential(vocab: Vocab, tokenizer: TextTokenizer, page: Page) -> tuple[int, ...]:
    out: list[int] = []
    for r in page.regions:
        out.extend(region_layout_tokens(vocab, r))
        out.extend(content_tokens(tokenizer, r))
    out.append(vocab.end_of_stream)
    return tuple(out)


def child_prompt(prompt_ids: Sequence[int], layout_ids: Sequence[int], fork_point: int, vocab: Vocab) -> list[int]:
    """The prompt of branch k in the ``prefix-fork`` shape (padoc, hpd): page prompt + layout tokens
    before region k's close + BRANCH_START."""
    return [*prompt_ids, *layout_ids[:fork_point], vocab.branch_start]


# ---- parsing --------------------------------------------------------------------------------------
@dataclass
class RawRegion:
    """A region as read from ids: category, bins in x1,y1,x2,y2 order, content ids (sequential)."""

    index: int
    category: str
    bins: tuple[int, int, int, int]
    fork_point: int  # tokens of the stream before this region's close
    content_ids: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: the checkpoint's own name for the category where it differs from ``category`` (hpd: HPD's name)
    label: str | None = None
    #: whether the stream itself says the region has content (hpd: closed by <FORK>); None: the
    #: category's content format says (padoc)
    has_branch: bool | None = None
    #: the region's content as text where the stream wrote it inline as text (dots' sequential JSON)
    content_text: str | None = None
    #: tokens the stream spent on the region (dots: its cell), where the family counts them
    layout_len: int = 0


@dataclass
class Issue:
    code: str
    position: int
    detail: str = ""


class ParserBooks:
    """What every family's stream parser keeps: its regions, its issues and how many tokens it was fed.
    A parser's ``feed(tok)`` returns the region that token closed (else None)."""

    def __init__(self) -> None:
        self.regions: list[RawRegion] = []
        self.issues: list[Issue] = []
        self.ended = False
        self.n_fed = 0

    def feed(self, tok: int) -> RawRegion | None:
        raise NotImplementedError

    def _issue(self, code: str, detail: str = "") -> None:
        self.issues.append(Issue(code, self.n_fed, detail))

    def _add(self, reg: RawRegion) -> RawRegion:
        """Record a closed region (corners out of order: ``invalid_box``, kept)."""
        b = reg.bins
        if b[2] < b[0] or b[3] < b[1]:
            reg.errors.append(INVALID_BOX)
        self.regions.append(reg)
        return reg

    def feed_many(self, toks: Iterable[int]) -> list[RawRegion]:
        return [r for r in map(self.feed, toks) if r is not None]

    def finish(self) -> list[RawRegion]:
        """The regions, once the stream is over; a stream without its end is ``truncated``."""
        if not self.ended and not any(i.code == TRUNCATED for i in self.issues):
            self._issue(TRUNCATED, f"no end-of-stream after {self.n_fed} tokens")
        return self.regions

    @property
    def error_codes(self) -> list[str]:
        return list(dict.fromkeys(i.code for i in self.issues))


class StreamParser(ParserBooks):
    """Incremental, tolerant parser of a layout stream (``sequential=False``) or a sequential stream.

    ``feed(tok)`` returns the :class:`RawRegion` whose close token that was, else None.
    Anything malformed is recorded in ``issues`` and skipped; the parser resynchronizes at the
    next region open. ``finish()`` closes the books (flags truncation) and returns the regions.
    """

    _OUTSIDE, _REGION, _CONTENT, _ENDED = range(4)

    def __init__(self, vocab: Vocab, *, sequential: bool = False):
        super().__init__()
        self.vocab = vocab
        self.sequential = sequential
        self._state = self._OUTSIDE
        self._fields: list[int] = []
        self._field_names = vocab.spec.coordinates.region_fields
        self._control = vocab.control_ids

    # -- helpers --
    def _field_ok(self, name: str, tok: int) -> bool:
        if name == "category":
            return tok in self.vocab.id_to_category
        return tok in self.vocab.id_to_bin

    def _close_region(self) -> RawRegion | None:
        names = self._field_names
        if len(self._fields) != len(names):
            self._issue(MALFORMED_REGION, f"region closed after {len(self._fields)} of {len(names)} fields")
            return None
        vals = dict(zip(names, self._fields))
        b = [self.vocab.id_to_bin[vals[f]] for f in BOX_FIELDS]
        return self._add(RawRegion(index=len(self.regions), category=self.vocab.id_to_category[vals["category"]],
                                   bins=(b[0], b[1], b[2], b[3]), fork_point=self.n_fed))

    # -- the state machine --
    def feed(self, tok: int) -> RawRegion | None:
        v = self.vocab
        closed = None
        st = self._state
        if st == self._ENDED:
            self._issue(TRAILING_TOKENS)
        elif tok == v.end_of_stream:
            if st == self._REGION:
                self._issue(MALFORMED_REGION, "stream ended inside a region")
            self._state, self.ended = self._ENDED, True
        elif tok == v.region_open:
            if st == self._REGION:
                self._issue(MALFORMED_REGION, "region opened inside a region")
            self._state, self._fields = self._REGION, []
        elif st == self._REGION:
            if tok == v.region_close:
                closed = self._close_region()
                self._state = self._CONTENT if (self.sequential and closed is not None) else self._OUTSIDE
            elif len(self._fields) < len(self._field_names) and self._field_ok(self._field_names[len(self._fields)], tok):
                self._fields.append(tok)
            else:
                self._issue(MALFORMED_REGION, f"token {tok} cannot be field {len(self._fields)} of a region")
                self._state = self._OUTSIDE  # drop the region, resync at the next open
        elif st == self._CONTENT:
            if tok in self._control:
                self._issue(CONTROL_IN_CONTENT, f"token {tok}")
                self.regions[-1].errors.append(CONTROL_IN_CONTENT)
            else:
                self.regions[-1].content_ids.append(tok)
        else:  # outside a region
            self._issue(UNEXPECTED_TOKEN, f"token {tok} outside a region")
        self.n_fed += 1
        return closed

    def finish(self) -> list[RawRegion]:
        """As :meth:`ParserBooks.finish`; a sequential stream cut inside a region's content marks that region."""
        cut = not self.ended and not any(i.code == TRUNCATED for i in self.issues)
        super().finish()
        if cut and self.sequential and self._state == self._CONTENT and self.regions:
            self.regions[-1].errors.append(TRUNCATED)
        return self.regions


@dataclass
class ParsedBranch:
    content_ids: list[int]
    ended: bool
    errors: list[str]


def parse_branch(vocab: Vocab, ids: Sequence[int], *, has_start: bool = False) -> ParsedBranch:
    """Read one content branch (the generated part; ``has_start`` when BRANCH_START is included)."""
    ids = list(ids)
    errors: list[str] = []
    if has_start:
        if ids and ids[0] == vocab.branch_start:
            ids = ids[1:]
        else:
            errors.append(UNEXPECTED_TOKEN)
    content, ended = [], False
    control = vocab.control_ids
    for i, t in enumerate(ids):
        if t == vocab.end_of_stream:
            ended = True
            if i != len(ids) - 1:
                errors.append(TRAILING_TOKENS)
            break
        if t in control:
            if CONTROL_IN_CONTENT not in errors:
                errors.append(CONTROL_IN_CONTENT)
            continue
        content.append(t)
    if not ended:
        errors.append(TRUNCATED)
    return ParsedBranch(content, ended, errors)


# ---- back to a page -------------------------------------------------------------------------------
def _region(vocab: Vocab, raw: RawRegion, content: str | None, errors: Iterable[str],
            size: tuple[int, int] | None = None) -> Region:
    box = vocab.box(raw, *(size or (None, None)))
    errors = [*errors, *vocab.box_errors(raw, *(size or (None, None)))]
    fmt = vocab.region_format(raw)
    if fmt == "none":
        content = None
    return Region(category=raw.category, box=box, content=content, content_format=fmt,
                  errors=tuple(dict.fromkeys(errors)))


def assemble_region(vocab: Vocab, tokenizer: TextTokenizer, raw: RawRegion, branch: ParsedBranch | None, *,
                    sequential: bool = False, size: tuple[int, int] | None = None) -> Region:
    """One region of a page: its layout (``raw``) and content, inline (``sequential``) or from its parsed
    ``branch`` (None: no branch ran, MISSING_BRANCH). The rule :func:`assemble_page` applies to every
    region, and the scheduler to each one as its branch finishes (streamed region events)."""
    errs = list(raw.errors)
    if sequential:  # content was inline
        content: str | None = raw.content_text if raw.content_text is not None else tokenizer.decode(raw.content_ids)
    elif branch is None:
        content = None
        errs.append(MISSING_BRANCH)
    else:
        content = tokenizer.decode(branch.content_ids)
        errs.extend(branch.errors)
    return _region(vocab, raw, content, errs, size)


def assemble_page(
    vocab: Vocab,
    tokenizer: TextTokenizer,
    regions: Sequence[RawRegion],
    stream_errors: Iterable[str],
    branches: Sequence[ParsedBranch | None] | None,
    *,
    width: int,
    height: int,
    page_no: int = 0,
    image_path: str | None = None,
) -> Page:
    """Build a page from parsed regions and, in fork mode, one parsed branch per region (by index)."""
    page_errors = list(stream_errors)
    out = []
    for raw in regions:
        br = None if branches is None else (branches[raw.index] if raw.index < len(branches) else None)
        reg = assemble_region(vocab, tokenizer, raw, br, sequential=branches is None, size=(width, height))
        out.append(reg)
        page_errors.extend(e for e in reg.errors if e != INVALID_BOX)
    return Page(width=width, height=height, regions=tuple(out), page_no=page_no, image_path=image_path,
                errors=tuple(dict.fromkeys(page_errors)))


def parse_sequential(vocab: Vocab, tokenizer: TextTokenizer, ids: Sequence[int], **page_kw) -> Page:
    p = vocab.parser(sequential=True)
    p.feed_many(ids)
    regions = p.finish()
    return assemble_page(vocab, tokenizer, regions, p.error_codes, None, **page_kw)


def parse_padoc(
    vocab: Vocab, tokenizer: TextTokenizer, layout: Sequence[int], branches: Sequence[Sequence[int] | None],
    *, branches_have_start: bool = False, **page_kw,
) -> Page:
    """Parse a layout stream and its branches (``branches[k]`` for the k-th closed region)."""
    p = vocab.parser()
    p.feed_many(layout)
    regions = p.finish()
    parsed = [None if b is None else parse_branch(vocab, b, has_start=branches_have_start) for b in branches]
    return assemble_page(vocab, tokenizer, regions, p.error_codes, parsed, **page_kw)


def quantized(page: Page, vocab: Vocab, size: tuple[int, int] | None = None) -> Page:
    """The page as it comes back from tokens: boxes snapped to bin centres (another family: its own
    box space), errors cleared. ``size``: the (width, height) of the image the page was parsed from,
    where it differs from the page's own (a family whose boxes are in pixels of the image, dots, snaps
    them in that image's pixels; teacher-forced replay writes them so, :func:`~padoc_ray.scheduler.replay_input`)."""
    if size is not None and size[0] and size[1] and (page.width, page.height) != tuple(size):
        page = replace(page, width=size[0], height=size[1])
    if vocab.family != "padoc":
        return vocab.quantized(page)
    bins = vocab.spec.coordinates.bins
    regs = []
    for r in page.regions:
        b = r.box.clipped()
        q = [dequantize(quantize(v, bins), bins) for v in (b.x1, b.y1, b.x2, b.y2)]
        content = None if r.content_format == "none" else (r.content or "")
        regs.append(Region(category=r.category, box=Box(*q), content=content, content_format=r.content_format))
    return Page(width=page.width, height=page.height, regions=tuple(regs), page_no=page.page_no,
                image_path=page.image_path)
