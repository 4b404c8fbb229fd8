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
budget (:func:`resized`); each ``patch * merge`` square becomes one language-model token. InternVL's
(:class:`TiledImageProcessor`, HPD-Parsing's ``hpd-1b``) cuts the image into a grid of square tiles,
plus a thumbnail, a fixed number of tokens each. Pure: imports no ray, vllm or torch.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import dataclass
from typing import Callable, ClassVar, Sequence

from padoc_ray.protocol import Page, serialize_padoc, serialize_sequential
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


#: either kind of processor: what :func:`image_tokens` takes
AnyImageProcessor = ImageProcessor | TiledImageProcessor

#: processors of models no hub serves here, written from their public preprocessor_config.json (Qwen) or
#: the project's own copy of the model's rule (HPD)
PROCESSORS: dict[str, AnyImageProcessor] = {
    "qwen3-vl-2b": ImageProcessor(16, 2, 65536, 16777216,
                                  source="Qwen/Qwen3-VL-2B-Instruct preprocessor_config.json (size.shortest_edge "
                                         "65536, size.longest_edge 16777216, patch_size 16, merge_size 2)"),
    "hpd-1b": TiledImageProcessor(TILE, hpd_tile_grid, hpd_image_tokens,
                                  source="HPD-Parsing's tiling (padoc_ray.protocol.hpd_image: 448-px tiles, 1-24 "
                                         "of them plus a thumbnail when more than one, 256 tokens a tile)"),
}


def image_processor(name_or_dir: str) -> AnyImageProcessor:
    """A built-in processor (:data:`PROCESSORS`) or a checkpoint directory's."""
    if name_or_dir in PROCESSORS:
        return PROCESSORS[name_or_dir]
    if os.path.isdir(name_or_dir):
        return ImageProcessor.from_model_dir(name_or_dir)
    raise TraceError(f"no image processor {name_or_dir!r}: a checkpoint directory or one of {sorted(PROCESSORS)}")


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
class ModeTrace:
    """One mode's requests of a page: the page prompt and the forced streams."""

    prompt_ids: tuple[int, ...]  #: unexpanded: the image placeholder once, at ``image_at``
    image_at: int
    main: tuple[int, ...]  #: the layout stream (fork) or the sequential stream, end-of-stream included
    branches: tuple[tuple[int, ...], ...] = ()  #: fork: region k's branch (content + end-of-stream)
    fork_points: tuple[int, ...] = ()  #: fork: layout tokens before region k's close


@dataclass(frozen=True)
class PageTrace:
    name: str
    image_tokens: int
    fork: ModeTrace
    sequential: ModeTrace

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


def trace_from_page(model_protocol, name: str, page: Page, image_tokens: int) -> PageTrace:
    """The traces teacher-forced replay makes of ``page`` (the same serializers), in both modes."""
    if image_tokens < 1:
        raise TraceError(f"page {name}: image_tokens must be >= 1, got {image_tokens}")
    vocab, tok = model_protocol.vocab, model_protocol.tokenizer
    s = serialize_padoc(vocab, tok, page)
    fork_ids, fork_at = _prompt(model_protocol, "fork")
    seq_ids, seq_at = _prompt(model_protocol, "sequential")
    return PageTrace(name, image_tokens,
                     ModeTrace(fork_ids, fork_at, s.layout, tuple(b[1:] for b in s.branches), s.fork_points),
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
                   limit: int | None = None, longest_side: int = 1600, max_render_pixels: int | None = None
                   ) -> list[PageTrace]:
    """Traces of the first ``limit`` pages of an OmniDocBench-format file, in its order (as ``bench
    serve`` takes them). Image tokens: of each page image in ``images`` at the host's render size
    (:func:`host_render_size`), else of the page_info size."""
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
        out.append(trace_from_page(model_protocol, t.name, t.page, image_tokens(w, h, proc)))
    if not out:
        raise TraceError(f"--gt {gt_path}: no pages")
    return out


def image_tokens_from_run(traces: Sequence[PageTrace], pages_jsonl: str) -> list[PageTrace]:
    """``traces`` with the image tokens the engine counted in a ``bench serve`` run (its ``pages.jsonl``):
    a sequential row's prompt is the page prompt alone; a fork row's sums the main prompt and each
    branch prompt (page prompt + layout up to its fork point + branch start). A page the run lacks is
    an error (the run's rows carry no streams: the ground truth must name the same pages)."""
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
            rest = r["prompt_tokens"] - sum(fp + 1 for fp in t.fork.fork_points)
            if rest % (n + 1) == 0:
                found[r["page"]] = rest // (n + 1) - (len(t.fork.prompt_ids) - 1)
    missing = [t.name for t in traces if t.name not in found]
    if missing:
        raise TraceError(f"{pages_jsonl} has no usable prompt count for {len(missing)} page(s), e.g. {missing[0]} "
                         f"(a sequential row, or a fork row with every region forked and no retry, is needed)")
    return [dataclasses.replace(t, image_tokens=found[t.name]) for t in traces]
