"""Per-page request traces for the engine model: what a page asks of the engine, in each mode.

A :class:`PageTrace` holds a page's image tokens and, per mode, the unexpanded page prompt (one image
placeholder) and the forced streams that teacher-forced replay (:mod:`padoc_ray.scheduler.replay`)
would send: fork = the layout stream, each region's branch (content + end-of-stream, without the
branch-start token, which lives in the child prompt) and its fork point; sequential = one stream.

Traces come from a ground-truth :class:`~padoc_ray.protocol.Page` (:func:`trace_from_page`), from an
OmniDocBench JSON file (:func:`traces_from_gt`; image tokens from the page images, or from the
page_info size without them), and from a measured ``bench serve`` run's ``pages.jsonl``
(:func:`image_tokens_from_run`): those rows carry the engine's own prompt token counts, hence the image
tokens, but not the streams (no layout ids, region lengths or fork points), so the streams still come
from the ground truth, matched by page name.

Image tokens (:func:`image_tokens`) come from one of two kinds of image processor. Qwen-VL's
(:class:`ImageProcessor`) resizes an image to multiples of ``patch * merge`` pixels within its pixel
budget (:func:`resized`); each ``patch * merge`` square becomes one language-model token; dots.ocr's
(:class:`DotsImageProcessor`) is the same rule as dots.ocr's own code applies it
(:func:`padoc_ray.protocol.dots.smart_resize`). InternVL's (:class:`TiledImageProcessor`, HPD-Parsing's
``hpd-1b``) cuts the image into a grid of square tiles, plus a thumbnail, a fixed number of tokens each.

A fork trace's branch prompts follow the modeled model's branch shape
(:data:`~padoc_ray.protocol.family.BRANCH_SHAPES`): ``prefix-fork`` (the page prompt, the layout
before the region's close and a branch start: what the scheduler's own fork actions hold) or
``grounding`` (dots.ocr: :class:`GroundingPrompts`, the image, a grounding prompt and the region's box,
no layout token). Pure: imports no ray, vllm or torch.
"""

from __future__ import annotations

import json
import math
import os
import re
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

from padoc_ray.protocol import Page, serialize_padoc, serialize_sequential
from padoc_ray.protocol.dots import DotsSpec, box_text, is_dots_config, pixels_from_preprocessor, smart_resize
from padoc_ray.protocol.family import GROUNDING, PREFIX_FORK
from padoc_ray.protocol.hpd_image import TILE, hpd_image_tokens, hpd_tile_grid

#: the placeholder the page prompt holds once; the processor expands it to the image's tokens
IMAGE_PLACEHOLDER = "<|image_pad|>"


class TraceError(ValueError):
    """Input that cannot become a trace (a missing file, an unknown page, a prompt without its image)."""


@dataclass(frozen=True)
class ImageProcessor:
    """The image processor's resize rule (Qwen2-VL/Qwen3-VL ``smart_resize``)."""

    kind: ClassVar[str] = "resize"
    patch_size: int
    merge_size: int
    min_pixels: int
    max_pixels: int
    source: str = ""

    @classmethod
    def from_model_dir(cls, model_dir: str) -> "ImageProcessor":
        """From a checkpoint's ``preprocessor_config.json``: ``size.shortest_edge`` / ``size.longest_edge``
        (transformers' names for the pixel budget) or top-level ``min_pixels`` / ``max_pixels``."""
        path = os.path.join(model_dir, "preprocessor_config.json")
        try:
            with open(path, encoding="utf-8") as f:
                cfg = json.load(f)
        except (OSError, json.JSONDecodeError) as e:
            raise TraceError(f"cannot read the image processor's settings: {path}: {e}") from None
        size = cfg.get("size") or {}
        lo, hi = cfg.get("min_pixels", size.get("shortest_edge")), cfg.get("max_pixels", size.get("longest_edge"))
        missing = [k for k, v in (("patch_size", cfg.get("patch_size")), ("merge_size", cfg.get("merge_size")),
                                  ("min_pixels", lo), ("max_pixels", hi)) if not isinstance(v, int)]
        if missing:
            raise TraceError(f"{path} lacks {', '.join(missing)} (integers)")
        return cls(cfg["patch_size"], cfg["merge_size"], lo, hi, source=path)

    @property
    def factor(self) -> int:
        return self.patch_size * self.merge_size

    def tokens(self, width: int, height: int) -> int:
        """(H / patch / merge) * (W / patch / merge) after the resize."""
        w, h = resized(width, height, self)
        return (w // self.factor) * (h // self.factor)


@dataclass(frozen=True)
class TiledImageProcessor:
    """InternVL-style dynamic tiling: the image becomes ``grid(width, height)`` = (cols, rows) square tiles
    of ``tile`` pixels (and a thumbnail when there is more than one), which ``grid_tokens(cols, rows)``
    counts as language-model tokens. Both rules are the model's own (HPD: :mod:`padoc_ray.protocol.hpd_image`)."""

    kind: ClassVar[str] = "tiles"
    tile: int
    grid: Callable[[int, int], tuple[int, int]]
    grid_tokens: Callable[[int, int], int]
    source: str = ""

    def tokens(self, width: int, height: int) -> int:
        return self.grid_tokens(*self.grid(width, height))


@dataclass(frozen=True)
class DotsImageProcessor:
    """dots.ocr's image processor: Qwen2-VL's resize rule as dots.ocr applies it
    (:func:`padoc_ray.protocol.dots.smart_resize`: each side a multiple of ``factor``, patch 14 x merge 2,
    the area within [min_pixels, max_pixels]); one language-model token per ``factor`` x ``factor`` square."""

    kind: ClassVar[str] = "resize"
    factor: int
    min_pixels: int
    max_pixels: int
    source: str = ""

    @classmethod
    def from_spec(cls, spec: DotsSpec, source: str = "") -> "DotsImageProcessor":
        return cls(spec.factor, spec.min_pixels, spec.max_pixels, source=source)

    def tokens(self, width: int, height: int) -> int:
        h, w = smart_resize(height, width, self.factor, self.min_pixels, self.max_pixels)
        return (h // self.factor) * (w // self.factor)


#: any kind of processor: what :func:`image_tokens` takes
AnyImageProcessor = ImageProcessor | TiledImageProcessor | DotsImageProcessor

#: processors of models no hub serves here, written from their public preprocessor_config.json (Qwen) or
#: the project's own copy of the model's rule (HPD)
PROCESSORS: dict[str, AnyImageProcessor] = {
    "qwen3-vl-2b": ImageProcessor(16, 2, 65536, 16777216,
                                  source="Qwen/Qwen3-VL-2B-Instruct preprocessor_config.json (size.shortest_edge "
                                         "65536, size.longest_edge 16777216, patch_size 16, merge_size 2)"),
    "hpd-1b": TiledImageProcessor(TILE, hpd_tile_grid, hpd_image_tokens,
                                  source="HPD-Parsing's tiling (padoc_ray.protocol.hpd_image: 448-px tiles, 1-24 "
                                         "of them plus a thumbnail when more than one, 256 tokens a tile)"),
    "dots-ocr": DotsImageProcessor.from_spec(DotsSpec(), source="dots.ocr's smart_resize (padoc_ray.protocol.dots: "
                                                                "factor 28 = patch 14 x merge 2, min_pixels 3136, "
                                                                "max_pixels 11289600, dots_ocr/utils/consts.py)"),
}


def image_processor(name_or_dir: str) -> AnyImageProcessor:
    """A built-in processor (:data:`PROCESSORS`) or a checkpoint directory's (a dots.ocr checkpoint's:
    dots' rule with its preprocessor_config.json's pixel budget)."""
    if name_or_dir in PROCESSORS:
        return PROCESSORS[name_or_dir]
    if os.path.isdir(name_or_dir):
        dots = _dots_processor(name_or_dir)
        return dots if dots is not None else ImageProcessor.from_model_dir(name_or_dir)
    raise TraceError(f"no image processor {name_or_dir!r}: a checkpoint directory or one of {sorted(PROCESSORS)}")


def _dots_processor(model_dir: str) -> DotsImageProcessor | None:
    """A dots.ocr checkpoint's processor (None: its config.json is not dots.ocr's)."""
    def read(name: str) -> dict:
        try:
            with open(os.path.join(model_dir, name), encoding="utf-8") as f:
                data = json.load(f)
        except FileNotFoundError:
            return {}
        except (OSError, json.JSONDecodeError) as e:
            raise TraceError(f"cannot read {os.path.join(model_dir, name)}: {e}") from None
        return data if isinstance(data, dict) else {}

    if not is_dots_config(read("config.json")):
        return None
    pixels = pixels_from_preprocessor(read("preprocessor_config.json"))
    return DotsImageProcessor.from_spec(DotsSpec(**pixels), source=f"{model_dir} (dots.ocr's smart_resize)")


def resized(width: int, height: int, proc: ImageProcessor) -> tuple[int, int]:
    """(width, height) after the processor's resize: each side rounded to a multiple of the factor, then
    scaled (keeping the aspect ratio) into [min_pixels, max_pixels]."""
    if width < 1 or height < 1:
        raise TraceError(f"image size must be positive, got {width}x{height}")
    f = proc.factor
    w, h = max(f, round(width / f) * f), max(f, round(height / f) * f)
    if w * h > proc.max_pixels:
        beta = math.sqrt(width * height / proc.max_pixels)
        w, h = max(f, math.floor(width / beta / f) * f), max(f, math.floor(height / beta / f) * f)
    elif w * h < proc.min_pixels:
        beta = math.sqrt(proc.min_pixels / (width * height))
        w, h = math.ceil(width * beta / f) * f, math.ceil(height * beta / f) * f
    return w, h


def image_tokens(width: int, height: int, proc: AnyImageProcessor) -> int:
    """Language-model tokens of one image, as ``proc`` counts them: Qwen-VL's (H / patch / merge) *
    (W / patch / merge) after the resize, or a tiled processor's tokens of its grid (thumbnail included)."""
    if width < 1 or height < 1:
        raise TraceError(f"image size must be positive, got {width}x{height}")
    return proc.tokens(width, height)


def host_render_size(width: int, height: int, longest_side: int, max_pixels: int) -> tuple[int, int]:
    """The size an image page has when the batch job sends it: its own, shrunk (never enlarged) to
    ``longest_side`` and ``max_pixels`` (:class:`~padoc_ray.pdf.RenderConfig`; pdf.py's image render)."""
    scale = min(1.0, longest_side / max(width, height), (max_pixels / (width * height)) ** 0.5)
    if scale >= 1.0:
        return width, height
    return max(1, round(width * scale)), max(1, round(height * scale))


# ---- traces --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class GroundingPrompts:
    """A page's branch prompts in the ``grounding`` shape (dots.ocr's, :class:`~padoc_ray.protocol.dots.DotsSpec`):
    region k's is the chat's start, the page image, the grounding text, the region's box (in the resized
    image's pixels, as dots.ocr writes it) and the chat's end, whose last token starts the branch; none holds a
    layout token. Counts are unexpanded (the image placeholder once): what precedes the box is the same in
    every prompt of the page, so the prefix cache holds it once."""

    image_end: int  #: tokens through the image's end marker: what each shares with the page prompt (image first)
    text_end: int  #: tokens before the box: what each shares with an earlier branch of the page
    lengths: tuple[int, ...]  #: region k's whole prompt


def _count(tokenizer, text: str, added: Sequence[str]) -> int:
    """Tokens of ``text`` in ``tokenizer``, each of the ``added`` tokens one (dots.ocr's own added tokens,
    which the tokenizer that counts may not have); the rest as the tokenizer encodes it."""
    n = 0
    for i, part in enumerate(re.split("(" + "|".join(map(re.escape, added)) + ")", text)):
        n += 1 if i % 2 else (len(tokenizer.encode(part)) if part else 0)
    return n


def grounding_prompts(tokenizer, page: Page, spec: DotsSpec | None = None) -> GroundingPrompts:
    """The grounding prompts of every region of ``page`` (:class:`GroundingPrompts`), counted in
    ``tokenizer`` like the rest of the trace (dots' added tokens one each)."""
    spec = spec or DotsSpec()
    if not page.width or not page.height:
        raise TraceError("a grounding branch's box is in the page image's pixels: the page needs its size")
    added = spec.all_added_tokens()
    before, after = spec.grounding_parts()
    head = before[:before.index(spec.tokens.image_end) + len(spec.tokens.image_end)]
    text_end, tail = _count(tokenizer, before, added), _count(tokenizer, after, added)
    lengths = []
    for r in page.regions:  # the box as dots.ocr's client writes it: the resized image's pixels
        box = box_text(spec.coords(r.box, page.width, page.height))
        lengths.append(text_end + len(tokenizer.encode(box)) + tail)
    return GroundingPrompts(_count(tokenizer, head, added), text_end, tuple(lengths))


@dataclass(frozen=True)
class ModeTrace:
    """One mode's requests of a page: the page prompt and the forced streams."""

    prompt_ids: tuple[int, ...]  #: unexpanded: the image placeholder once, at ``image_at``
    image_at: int
    main: tuple[int, ...]  #: the layout stream (fork) or the sequential stream, end-of-stream included
    branches: tuple[tuple[int, ...], ...] = ()  #: fork: region k's branch (content + end-of-stream)
    fork_points: tuple[int, ...] = ()  #: fork: layout tokens before region k's close
    #: fork, ``grounding`` shape: each region's branch prompt (None: ``prefix-fork``, the page prompt + layout)
    grounding: GroundingPrompts | None = None

    def branch_prompt_length(self, k: int) -> int:
        """Region k's branch prompt, unexpanded: page prompt + layout before its close + branch start
        (``prefix-fork``), or its grounding prompt."""
        if self.grounding is not None:
            return self.grounding.lengths[k]
        return len(self.prompt_ids) + self.fork_points[k] + 1


@dataclass(frozen=True)
class PageTrace:
    name: str
    image_tokens: int
    fork: ModeTrace
    sequential: ModeTrace

    @property
    def branch_shape(self) -> str:
        """``prefix-fork`` or ``grounding``: how its fork branches are prompted."""
        return GROUNDING if self.fork.grounding is not None else PREFIX_FORK

    def mode(self, mode: str) -> ModeTrace:
        if mode not in ("fork", "sequential"):
            raise ValueError(f"mode must be fork or sequential, got {mode!r}")
        return self.fork if mode == "fork" else self.sequential

    def prompt_tokens(self, mode: str) -> int:
        """The page prompt as the engine counts it: the placeholder expanded to the image's tokens."""
        return len(self.mode(mode).prompt_ids) - 1 + self.image_tokens


def _prompt(model_protocol, mode: str) -> tuple[tuple[int, ...], int]:
    ids = tuple(model_protocol.prompt_ids(mode))
    pad = model_protocol.tokenizer.token_to_id(IMAGE_PLACEHOLDER)
    if pad is None or ids.count(pad) != 1:
        raise TraceError(f"the {mode} prompt must hold the image placeholder {IMAGE_PLACEHOLDER} once")
    return ids, ids.index(pad)


def trace_from_page(model_protocol, name: str, page: Page, image_tokens: int,
                    branch_shape: str = PREFIX_FORK) -> PageTrace:
    """The traces teacher-forced replay makes of ``page`` (the same serializers), in both modes; fork
    branches prompted in ``branch_shape`` (``grounding``: :func:`grounding_prompts`)."""
    if image_tokens < 1:
        raise TraceError(f"page {name}: image_tokens must be >= 1, got {image_tokens}")
    if branch_shape not in (PREFIX_FORK, GROUNDING):
        raise TraceError(f"branch shape must be {PREFIX_FORK} or {GROUNDING}, got {branch_shape!r}")
    vocab, tok = model_protocol.vocab, model_protocol.tokenizer
    s = serialize_padoc(vocab, tok, page)
    fork_ids, fork_at = _prompt(model_protocol, "fork")
    seq_ids, seq_at = _prompt(model_protocol, "sequential")
    try:
        grounding = grounding_prompts(tok, page) if branch_shape == GROUNDING else None
    except TraceError as e:
        raise TraceError(f"page {name}: {e}") from None
    return PageTrace(name, image_tokens,
                     ModeTrace(fork_ids, fork_at, s.layout, tuple(b[1:] for b in s.branches), s.fork_points,
                               grounding),
                     ModeTrace(seq_ids, seq_at, serialize_sequential(vocab, tok, page)))


def _image_size(path: str) -> tuple[int, int]:
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path) as im:  # reads the header only
            return im.size
    except (OSError, UnidentifiedImageError) as e:
        raise TraceError(f"cannot read the page image {path}: {e}") from None


def read_truth(path: str, flag: str) -> list:
    """The entries of an OmniDocBench-format file; what cannot be read is a :class:`TraceError` naming ``flag``."""
    from padoc_ray.groundtruth import GroundTruthError, parse_truth

    try:
        with open(path, "rb") as f:
            return parse_truth(f.read(), f"{flag} {path}")
    except OSError as e:
        raise TraceError(f"{flag} {path}: {e.strerror or e}") from None
    except GroundTruthError as e:
        raise TraceError(str(e)) from None


def traces_from_gt(model_protocol, gt_path: str, proc: AnyImageProcessor, *, images: str | None = None,
                   limit: int | None = None, longest_side: int = 1600, max_render_pixels: int | None = None,
                   branch_shape: str = PREFIX_FORK) -> list[PageTrace]:
    """Traces of the first ``limit`` pages of an OmniDocBench-format file, in its order (as ``bench
    serve`` takes them). Image tokens: of each page image in ``images`` at the host's render size
    (:func:`host_render_size`), else of the page_info size. ``branch_shape``: :func:`trace_from_page`'s."""
    from padoc_ray.pdf import MAX_RENDER_PIXELS

    entries = read_truth(gt_path, "--gt")
    out: list[PageTrace] = []
    for t in entries[:limit]:
        if t.page is None:
            raise TraceError(f"--gt {gt_path}: page {t.index} is not OmniDocBench format ({t.error})")
        if images is not None:
            w, h = _image_size(os.path.join(images, t.name))
        else:
            w, h = t.page.width, t.page.height
        w, h = host_render_size(w, h, longest_side, max_render_pixels or MAX_RENDER_PIXELS)
        out.append(trace_from_page(model_protocol, t.name, t.page, image_tokens(w, h, proc), branch_shape))
    if not out:
        raise TraceError(f"--gt {gt_path}: no pages")
    return out


def image_tokens_from_run(traces: Sequence[PageTrace], pages_jsonl: str) -> list[PageTrace]:
    """``traces`` with the image tokens the engine counted in a ``bench serve`` run (its ``pages.jsonl``):
    a sequential row's prompt is the page prompt alone; a fork row's sums the main prompt and each
    branch prompt (:meth:`ModeTrace.branch_prompt_length`), each holding the image once. A page the run
    lacks is an error (the run's rows carry no streams: the ground truth must name the same pages)."""
    import dataclasses

    found: dict[str, int] = {}
    try:
        with open(pages_jsonl, encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, json.JSONDecodeError) as e:
        raise TraceError(f"cannot read the measured run's pages: {pages_jsonl}: {e}") from None
    by_name = {t.name: t for t in traces}
    for r in rows:
        t = by_name.get(r.get("page"))
        if t is None or r["page"] in found or not r.get("prompt_tokens"):
            continue
        if r.get("mode") == "sequential":
            found[r["page"]] = r["prompt_tokens"] - (len(t.sequential.prompt_ids) - 1)
        elif r.get("mode") == "fork" and r.get("n_branches") == len(t.fork.fork_points):
            n = r["n_branches"]
            text = len(t.fork.prompt_ids) - 1 + sum(t.fork.branch_prompt_length(k) - 1 for k in range(n))
            if (r["prompt_tokens"] - text) % (n + 1) == 0:
                found[r["page"]] = (r["prompt_tokens"] - text) // (n + 1)
    missing = [t.name for t in traces if t.name not in found]
    if missing:
        raise TraceError(f"{pages_jsonl} has no usable prompt count for {len(missing)} page(s), e.g. {missing[0]} "
                         f"(a sequential row, or a fork row with every region forked and no retry, is needed)")
    return [dataclasses.replace(t, image_tokens=found[t.name]) for t in traces]
