"""Generate a synthetic corpus: PDFs, one OmniDocBench ground-truth JSON, optional page images.

Documents are built in parallel (one process per core, ``multiprocessing`` over documents). Each
document is seeded from ``(seed, document index)`` alone and the split of ``--pages`` into
documents is computed up front from the same seeds, so the output does not depend on the worker
count or on scheduling; results are gathered in document order. PDFs are written with reportlab's
``invariant=1`` (fixed dates and ids), so the same seed gives byte-identical PDFs and JSON on the
same software stack.

Pixel space: every GT box is in pixels of the page image pypdfium2 renders by default (it applies
/Rotate) at ``dpi`` (default 144, i.e. scale 2): ``width = ceil(display_width_pt * (dpi / 72))``,
and likewise the height. Boxes are the drawn extents (font ascent/descent, formula ink, image and
table rules) padded by 1-1.5 pt and rounded outwards to whole pixels.

Scanned pages are drawn as vectors on a scratch canvas, rendered by pdfium at 110-200 dpi, made
gray with mild blur, noise and paper tint (no skew), and placed as one JPEG filling the page: they
have no text layer. Rotated pages are landscape pages stored as a portrait MediaBox with /Rotate 90
(see ``draw``); their GT is in the landscape pixel space of the rendered image.

A partial run never leaves a ``gt.json`` that claims unwritten pages: PDFs are written to a
temporary name and renamed, and ``gt.json`` is written once, at the end, atomically, listing only
the pages of documents that were written completely.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import multiprocessing as mp
import os
import random
import sys
import time
from contextlib import contextmanager
from dataclasses import dataclass, field

from padoc_ray.protocol import Box, Page, Region, page_from_omnidocbench, page_to_omnidocbench

from .profiles import get_profile

GT_NAME = "gt.json"
MANIFEST_NAME = "manifest.json"
OWNED = ("pdfs", "images", GT_NAME, MANIFEST_NAME)  # what --force may replace
DEFAULT_DPI = 144.0
LANGUAGE_NAMES = {"en": "english", "zh": "simplified_chinese", "el": "greek", "ru": "russian"}


class CorpusError(Exception):
    """A problem with the request or the output folder; the message is one line for the user."""


@dataclass(frozen=True)
class GenerateConfig:
    out: str
    pages: int
    seed: int = 0
    profile: str = "mixed"
    images: bool = False
    image_format: str = "jpg"
    dpi: float = DEFAULT_DPI
    workers: int | None = None
    force: bool = False


@dataclass
class GenerateResult:
    pages: int
    documents: int
    seconds: float
    workers: int
    gt_path: str
    errors: list[str] = field(default_factory=list)

    @property
    def pages_per_s(self) -> float:
        return self.pages / self.seconds if self.seconds > 0 else float("inf")


def derive_seed(seed: int, *parts) -> int:
    h = hashlib.sha256(":".join(["padoc-corpus", str(seed), *map(str, parts)]).encode()).digest()
    return int.from_bytes(h[:8], "big")


def plan_documents(seed: int, pages: int, profile: str) -> list[tuple[int, int]]:
    """(document index, page count) for every document; the last one is cut to reach ``pages``."""
    lo, hi = get_profile(profile).doc_pages
    out, left, i = [], pages, 0
    while left > 0:
        n = min(left, random.Random(derive_seed(seed, "pages", i)).randint(lo, hi))
        out.append((i, n))
        left -= n
        i += 1
    return out


def pdf_name(doc_index: int) -> str:
    return f"doc{doc_index:05d}.pdf"


# ---- one document (runs in a worker) ---------------------------------------------------------------
def _scan(pdf_bytes: bytes, rng: random.Random) -> bytes:
    """Rasterize a one-page PDF like a clean office scan; JPEG bytes."""
    import numpy as np
    import pypdfium2 as pdfium
    from PIL import Image, ImageFilter

    dpi = rng.uniform(110, 200)
    doc = pdfium.PdfDocument(pdf_bytes)
    try:
        img = doc[0].render(scale=dpi / 72).to_pil().convert("L")
    finally:
        doc.close()
    img = img.filter(ImageFilter.GaussianBlur(rng.uniform(0.3, 0.9)))
    nrng = np.random.default_rng(rng.getrandbits(32))
    a = np.asarray(img, dtype=np.float32)
    paper = rng.uniform(228, 248)
    a = a * (paper / 255.0) * rng.uniform(0.95, 1.0) + nrng.normal(0, rng.uniform(3, 9), a.shape)
    out = io.BytesIO()
    Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), "L").save(out, "JPEG", quality=int(rng.uniform(70, 88)))
    return out.getvalue()


def render_size(width_pt: float, height_pt: float, dpi: float) -> tuple[int, int]:
    """The bitmap size pypdfium2's ``page.render(scale=dpi / 72)`` makes (its own float expression)."""
    scale = dpi / 72
    return math.ceil(width_pt * scale), math.ceil(height_pt * scale)


def _page_gt(specs, W: float, H: float, dpi: float, page_no: int, image_path: str, extra: dict) -> dict:
    wpx, hpx = render_size(W, H, dpi)
    sx, sy = wpx / W, hpx / H
    regions = []
    for r in specs:
        x0, y0, x1, y1 = r.box
        px0 = max(0, math.floor((x0 - r.pad) * sx))
        py0 = max(0, math.floor((y0 - r.pad) * sy))
        px1 = min(wpx, math.ceil((x1 + r.pad) * sx))
        py1 = min(hpx, math.ceil((y1 + r.pad) * sy))
        regions.append(Region(category=r.category, box=Box.from_pixels(px0, py0, px1, py1, wpx, hpx),
                              content=r.content, content_format=r.fmt, order=r.order))
    page = Page(width=wpx, height=hpx, regions=tuple(regions), page_no=page_no, image_path=image_path, extra=extra)
    # the canonical serialization order (what page_from_omnidocbench reads back), then OmniDocBench JSON
    return to_omnidocbench(page_from_omnidocbench(to_omnidocbench(page)))


def to_omnidocbench(page: Page) -> dict:
    """``page_to_omnidocbench`` plus the region's own ``order`` (None for page furniture) and polys
    rounded to 0.01 px."""
    obj = page_to_omnidocbench(page)
    for det, r in zip(obj["layout_dets"], page.regions):
        det["order"] = r.order
        det["poly"] = [round(v, 2) for v in det["poly"]]
    return obj


@contextmanager
def _binary_streams():
    """reportlab ASCII85-encodes streams by default, in pure Python (slow for images): off while we
    build, restored after."""
    from reportlab import rl_config

    old = rl_config.useA85
    rl_config.useA85 = 0
    try:
        yield
    finally:
        rl_config.useA85 = old


def build_document(out_dir: str, seed: int, profile: str, doc_index: int, n_pages: int, dpi: float,
                   images: bool, image_format: str = "jpg") -> list[dict]:
    """Build, write and (optionally) render one document; return its GT pages."""
    with _binary_streams():
        return _build_document(out_dir, seed, profile, doc_index, n_pages, dpi, images, image_format)


def _build_document(out_dir: str, seed: int, profile: str, doc_index: int, n_pages: int, dpi: float,
                    images: bool, image_format: str) -> list[dict]:
    from reportlab.pdfgen import canvas

    from .draw import Painter, ensure_fonts
    from .layout import compose_page, page_columns, plan_document

    ensure_fonts()
    prof = get_profile(profile)
    rng = random.Random(derive_seed(seed, "doc", doc_index))
    doc = plan_document(rng, prof, n_pages)
    name = pdf_name(doc_index)
    stem = name[:-4]
    buf = io.BytesIO()
    c = canvas.Canvas(buf, invariant=1)
    c.setTitle(f"padoc-ray synthetic document {doc_index} ({profile}, seed {seed})")
    gt = []
    for i in range(n_pages):
        rotated = i in doc.rotated
        W, H = doc.page_size
        if rotated:
            W, H = max(W, H), min(W, H)
        if doc.scanned:
            sbuf = io.BytesIO()
            sc = canvas.Canvas(sbuf, invariant=1)
            sp = Painter(sc, W, H, rotated=rotated).start()
            specs = compose_page(sp, rng, doc, i)
            sp.finish()
            sc.save()
            p = Painter(c, W, H, rotated=rotated).start()
            p.image(_scan(sbuf.getvalue(), rng), 0, 0, W, H)
            p.finish()
        else:
            p = Painter(c, W, H, rotated=rotated).start()
            specs = compose_page(p, rng, doc, i)
            p.finish()
        issues = (["fuzzy_scan"] if doc.scanned else []) + (["rotated"] if rotated else [])
        layout_name = {1: "single_column", 2: "double_column", 3: "three_column"}[page_columns(doc, W, H)]
        extra = {
            "source_pdf": name,
            "dpi": dpi,
            "rotation": 90 if rotated else 0,
            "scanned": doc.scanned,
            "page_attribute": {"data_source": f"synthetic_{profile}" + ("_slides" if doc.style.slides else ""),
                               "language": LANGUAGE_NAMES[doc.lang],
                               "layout": layout_name, "special_issue": issues},
        }
        gt.append(_page_gt(specs, W, H, dpi, i, f"{stem}_p{i}.{image_format}", extra))
    c.save()
    data = buf.getvalue()
    path = os.path.join(out_dir, "pdfs", name)
    _write_atomic(path, data)
    if images:
        _render_images(data, os.path.join(out_dir, "images"), [g["page_info"]["image_path"] for g in gt], dpi)
    return gt


def _render_images(pdf_bytes: bytes, img_dir: str, names: list[str], dpi: float) -> None:
    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument(pdf_bytes)
    try:
        for i, name in enumerate(names):
            page = doc[i]
            img = page.render(scale=dpi / 72).to_pil().convert("RGB")
            page.close()
            tmp = os.path.join(img_dir, f".{name}.tmp")
            if name.endswith(".png"):
                img.save(tmp, "PNG", compress_level=1)
            else:
                img.save(tmp, "JPEG", quality=90)
            os.replace(tmp, os.path.join(img_dir, name))
    finally:
        doc.close()


def _write_atomic(path: str, data: bytes) -> None:
    tmp = os.path.join(os.path.dirname(path), "." + os.path.basename(path) + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
    os.replace(tmp, path)


def _task(args) -> tuple[int, list[dict] | None, str | None]:
    doc_index = args[3]
    try:
        return doc_index, build_document(*args), None
    except Exception as e:  # noqa: BLE001 - reported per document; the run goes on
        return doc_index, None, f"{pdf_name(doc_index)}: {type(e).__name__}: {e}"


def _warm() -> None:
    """Import and register everything once in the parent so forked workers start warm."""
    from . import draw, figures, layout  # noqa: F401

    draw.ensure_fonts()
    import matplotlib.backends.backend_agg  # noqa: F401
    import matplotlib.textpath  # noqa: F401


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


# ---- the whole corpus ----------------------------------------------------------------------------
def prepare_out(out: str, force: bool) -> None:
    if os.path.exists(out) and not os.path.isdir(out):
        raise CorpusError(f"--out {out} exists and is not a directory")
    if os.path.isdir(out) and os.listdir(out):
        if not force:
            raise CorpusError(f"--out {out} is not empty (use --force to replace its corpus)")
        import shutil

        for name in OWNED:
            path = os.path.join(out, name)
            if os.path.isdir(path):
                shutil.rmtree(path)
            elif os.path.exists(path):
                os.remove(path)
    try:
        os.makedirs(os.path.join(out, "pdfs"), exist_ok=True)
        probe = os.path.join(out, "pdfs", ".write-probe")
        with open(probe, "wb"):
            pass
        os.remove(probe)
    except OSError as e:
        raise CorpusError(f"cannot write to --out {out}: {e.strerror or e}") from None


def generate_corpus(cfg: GenerateConfig, progress=None) -> GenerateResult:
    """Write ``cfg.pages`` pages; raise :class:`CorpusError` for bad options or an unusable --out."""
    if cfg.pages < 1:
        raise CorpusError(f"--pages must be a positive integer, got {cfg.pages}")
    try:
        get_profile(cfg.profile)
    except ValueError as e:
        raise CorpusError(str(e)) from None
    if not 18 <= cfg.dpi <= 600:
        raise CorpusError(f"--dpi must be in [18, 600], got {cfg.dpi:g}")
    if cfg.image_format not in ("jpg", "png"):
        raise CorpusError(f"--image-format must be jpg or png, got {cfg.image_format!r}")
    workers = cfg.workers or default_workers()
    if workers < 1:
        raise CorpusError(f"--workers must be positive, got {workers}")
    prepare_out(cfg.out, cfg.force)
    if cfg.images:
        os.makedirs(os.path.join(cfg.out, "images"), exist_ok=True)
    plan = plan_documents(cfg.seed, cfg.pages, cfg.profile)
    tasks = [(cfg.out, cfg.seed, cfg.profile, i, n, float(cfg.dpi), cfg.images, cfg.image_format) for i, n in plan]
    workers = min(workers, len(tasks))
    t0 = time.perf_counter()
    results: dict[int, list[dict]] = {}
    errors: list[str] = []

    def take(res) -> None:
        i, gt, err = res
        if err:
            errors.append(err)
        else:
            results[i] = gt
        if progress:
            progress(len(results) + len(errors), len(tasks))

    _warm()
    if workers == 1:
        for t in tasks:
            take(_task(t))
    else:
        ctx = mp.get_context("fork") if "fork" in mp.get_all_start_methods() else mp.get_context()
        with ctx.Pool(workers) as pool:
            for res in pool.imap_unordered(_task, tasks, chunksize=1):
                take(res)
    pages = [p for i, _ in plan if i in results for p in results[i]]
    gt_path = os.path.join(cfg.out, GT_NAME)
    _write_atomic(gt_path, (json.dumps(pages, ensure_ascii=False, indent=1) + "\n").encode("utf-8"))
    seconds = time.perf_counter() - t0
    _write_manifest(cfg, pages, len(results))
    return GenerateResult(len(pages), len(results), seconds, workers, gt_path, sorted(errors))


def _write_manifest(cfg: GenerateConfig, pages: list[dict], n_docs: int) -> None:
    cats: dict[str, int] = {}
    for p in pages:
        for d in p["layout_dets"]:
            cats[d["category_type"]] = cats.get(d["category_type"], 0) + 1
    man = {
        "generator": "padoc-ray corpus generate",
        "profile": cfg.profile, "seed": cfg.seed, "pages": len(pages), "documents": n_docs, "dpi": cfg.dpi,
        "images": cfg.images, "image_format": cfg.image_format if cfg.images else None,
        "scanned_pages": sum(1 for p in pages if p["page_info"]["scanned"]),
        "rotated_pages": sum(1 for p in pages if p["page_info"]["rotation"]),
        "categories": dict(sorted(cats.items())),
        "pixel_space": "pixels of the page as pypdfium2 renders it by default (with /Rotate) at dpi; "
                       "width = ceil(width_pt * (dpi / 72))",
    }
    if cfg.images and any(p["page_info"]["page_attribute"]["language"] == "simplified_chinese" for p in pages):
        from .draw import cjk_renders

        man["cjk_glyphs_in_images"] = cjk_renders()
    _write_atomic(os.path.join(cfg.out, MANIFEST_NAME), (json.dumps(man, indent=1) + "\n").encode())


def print_progress(done: int, total: int) -> None:  # pragma: no cover - cosmetic
    if sys.stderr.isatty():
        print(f"\r{done}/{total} documents", end="" if done < total else "\n", file=sys.stderr, flush=True)
