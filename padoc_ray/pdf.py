"""Open PDFs and rasterize their pages with pypdfium2, turning every kind of bad input into a
specific error code instead of an exception that escapes. Page images (PNG, JPEG, TIFF, WebP, BMP,
GIF; a multi-frame TIFF is one page per frame) are documents too, opened by :func:`open_document`.

Pages are rendered one at a time (a thousand-page PDF is never held as images), at a longest
side in pixels or at a DPI, with a guard against absurd page sizes. Knows nothing of models,
engines or Ray.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, replace
from typing import Iterator

# error codes: padoc_ray.status lists them all (stable strings; they end up in Parquet rows)
from padoc_ray.pdf_draws import DrawCounter  # noqa: F401 - re-exported: open_pdf attaches one to each document
from padoc_ray.knobs import knob
from padoc_ray.status import (  # noqa: F401 - re-exported for the callers of pdf.py
    ABSURD_PAGE_SIZE,
    CORRUPT_IMAGE,
    CORRUPT_PDF,
    EMPTY_FILE,
    ENCRYPTED_PDF,
    NO_PAGES,
    NOT_PDF,
    PAGE_LOAD_FAILED,
    PAGE_TOO_COMPLEX,
    RENDER_FAILED,
    RENDER_OUT_OF_MEMORY,
    TOO_MANY_FRAMES,
)

_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"II*\x00", b"MM\x00*", b"BM", b"GIF87a", b"GIF89a")

#: a page larger than this (in points, either side) is refused: 200 inches
MAX_PAGE_POINTS = 14400.0
#: and a page smaller than this (points) is refused: a tenth of an inch
MIN_PAGE_POINTS = 7.2
#: never render more pixels than this per page, whatever the settings say
MAX_RENDER_PIXELS = 40_000_000
#: a page that would draw more XObjects than this (in its content, its annotations' appearances,
#: tiling patterns and Type 3 glyphs: :class:`DrawCounter`) is refused (page_too_complex) before
#: pdfium renders it. pdfium spends ~5 us per draw here (a 10^5-draw page: 0.5 s, 10^6: 5 s; at 10^7
#: it aborts). The most a page of the measured legitimate corpus draws is far below (docs/batch.md, issue 27)
MAX_PAGE_DRAWS = 1_000_000


_PAGES_COUNT_ZERO = re.compile(rb"/Count\s*0(?![0-9])")
_PAGES_COUNT_NONZERO = re.compile(rb"/Count\s*[1-9]")


class PdfError(Exception):
    """A document- or page-level failure with a stable ``code``."""

    def __init__(self, code: str, message: str):
        super().__init__(f"{code}: {message}")
        self.code, self.message = code, message


@dataclass(frozen=True, kw_only=True)
class RenderConfig:
    """How pages become images. ``dpi`` wins when set; else the longest side is ``longest_side``."""

    #: render pages to this many pixels on their longest side (the model's processor resizes further to its
    #: pixel budget)
    longest_side: int = 1600
    dpi: float | None = knob(None, default_text="none")  #: render PDF pages at this DPI instead (None: by longest_side)
    max_pixels: int = MAX_RENDER_PIXELS
    #: XObject draws a page may make (see :func:`page_draws`); more: page_too_complex (0: no limit)
    max_page_draws: int = knob(MAX_PAGE_DRAWS, flags=("--page-draw-limit",), metavar="N")
    #: read each PDF page's text layer with its pixels, for text-layer drafts; set from the scheduler's
    #: ``--text-layer`` (:meth:`with_text_layer`), not a flag of its own
    text_layer: bool = True

    def with_text_layer(self, mode: str) -> "RenderConfig":
        """This config reading text layers only where ``mode`` (``SchedulerConfig.text_layer``) drafts with
        them: under ``off`` no page pays for a layer nothing will read."""
        want = mode != "off"
        return self if self.text_layer == want else replace(self, text_layer=want)

    def __post_init__(self) -> None:
        if self.dpi is not None and not 10 <= self.dpi <= 1200:
            raise ValueError("dpi must be in [10, 1200]")
        if not 32 <= self.longest_side <= 20000:
            raise ValueError("longest_side must be in [32, 20000]")
        if self.max_page_draws < 0:
            raise ValueError("max_page_draws cannot be negative")

    def scale_for(self, width_pt: float, height_pt: float) -> float:
        scale = self.dpi / 72.0 if self.dpi else self.longest_side / max(width_pt, height_pt)
        px = width_pt * height_pt * scale * scale
        if px > self.max_pixels:
            scale *= (self.max_pixels / px) ** 0.5
        return scale


def doc_id_of(data: bytes) -> str:
    """The document id: sha256 of the file bytes."""
    return hashlib.sha256(data).hexdigest()


def open_pdf(data: bytes, *, repair: bool = True):
    """Open PDF bytes; raises :class:`PdfError` with a specific code.

    When pdfium cannot open the file, qpdf (through pikepdf) gets one repair pass and pdfium opens
    the repaired bytes; such a document has ``padoc_repaired = True`` (see :func:`is_repaired`).
    The diagnosis of a file that cannot be opened depends on its bytes alone: pdfium's last-error
    value is per thread and not reset by every failure, so it is never used.
    """
    import pypdfium2 as pdfium

    if not data:
        raise PdfError(EMPTY_FILE, "the file is empty")
    if b"%PDF-" not in data[:1024]:
        raise PdfError(NOT_PDF, "no %PDF- header in the first 1024 bytes")
    repaired = False
    try:
        doc = pdfium.PdfDocument(data)
    except pdfium.PdfiumError:
        fixed = _repair_or_diagnose(data, repair)  # raises PdfError when there is nothing to open
        try:
            doc = pdfium.PdfDocument(fixed)
        except pdfium.PdfiumError as e:
            raise PdfError(CORRUPT_PDF, "pdfium could not open it, nor the copy qpdf repaired") from e
        repaired = True
    if len(doc) == 0:
        doc.close()
        raise PdfError(NO_PAGES, "the PDF has no pages")
    doc.padoc_repaired = repaired
    doc.padoc_draws = DrawCounter(fixed if repaired else data)
    return doc


def is_repaired(doc) -> bool:
    """Whether :func:`open_pdf` had to repair the file to open it."""
    return bool(getattr(doc, "padoc_repaired", False))


def _repair_or_diagnose(data: bytes, repair: bool) -> bytes:
    """The bytes of a repaired copy of a PDF pdfium rejected, or a PdfError saying why there is none.

    qpdf reconstructs broken cross-reference data on open; saving writes a clean file. Its error
    text names the stream object (an address): that is replaced so the message is the same for
    the same bytes."""
    try:
        import pikepdf
    except ImportError:  # pikepdf is a dependency; without it, diagnose from the bytes alone
        pikepdf = None
    if pikepdf is None or not repair:
        if b"/Encrypt" in data:
            raise PdfError(ENCRYPTED_PDF, "the PDF is encrypted and needs a password")
        if _PAGES_COUNT_ZERO.search(data) and not _PAGES_COUNT_NONZERO.search(data):
            raise PdfError(NO_PAGES, "the PDF has no pages")
        raise PdfError(CORRUPT_PDF, "pdfium could not open it" + ("" if repair else " (repair disabled)"))
    import io

    try:
        with pikepdf.open(io.BytesIO(data)) as pdf:
            if len(pdf.pages) == 0:
                raise PdfError(NO_PAGES, "the PDF has no pages")
            out = io.BytesIO()
            pdf.save(out, encryption=False)
            return out.getvalue()
    except pikepdf.PasswordError as e:
        raise PdfError(ENCRYPTED_PDF, "the PDF is encrypted and needs a password") from e
    except PdfError:
        raise
    except Exception as e:  # noqa: BLE001 - qpdf raises several kinds for damaged files
        if _PAGES_COUNT_ZERO.search(data) and not _PAGES_COUNT_NONZERO.search(data):
            raise PdfError(NO_PAGES, "the PDF has no pages") from e
        detail = re.sub(r"(stream )?<_io\.BytesIO object at 0x[0-9a-fA-F]+>:?\s*", "", str(e)).strip()
        raise PdfError(CORRUPT_PDF, f"neither pdfium nor qpdf could open it (qpdf: {detail[:300]})") from e


def is_image(data: bytes) -> bool:
    return data.startswith(_IMAGE_MAGIC) or (data[:4] == b"RIFF" and data[8:12] == b"WEBP")


class ImageDocument:
    """A page image (or a multi-frame TIFF) seen as a document: one page per frame."""

    def __init__(self, data: bytes, max_frames: int | None = None):
        """``max_frames``: refuse images with more frames (None: :data:`MAX_IMAGE_FRAMES`). Every
        frame's size is checked against PIL's pixel limit before any frame is decoded."""
        import io
        import warnings

        from PIL import Image

        try:
            with warnings.catch_warnings():
                warnings.simplefilter("error", Image.DecompressionBombWarning)
                self._img = Image.open(io.BytesIO(data))  # PIL checks frame 0's size here
                self._n = max(1, int(getattr(self._img, "n_frames", 1)))
                check_frames(self._img, self._n, MAX_IMAGE_FRAMES if max_frames is None else max_frames)
                self._img.load()
        except PdfError:
            raise
        except (Image.DecompressionBombError, Image.DecompressionBombWarning) as e:
            raise PdfError(ABSURD_PAGE_SIZE, f"image too large: {e}") from e
        except Exception as e:  # noqa: BLE001 - PIL raises many kinds for broken files
            raise PdfError(CORRUPT_IMAGE, f"cannot decode the image ({_image_error(e)})") from e

    def __len__(self) -> int:
        return self._n

    @property
    def size(self) -> tuple[int, int]:
        """(width, height) of the first frame, in pixels."""
        return self._img.size

    def render(self, index: int, cfg: "RenderConfig"):
        from PIL import ImageOps

        if not 0 <= index < self._n:
            raise PdfError(PAGE_LOAD_FAILED, f"page {index}: the image has {self._n} frame(s)")
        try:
            self._img.seek(index)
            img = ImageOps.exif_transpose(self._img.convert("RGB"))
        except Exception as e:  # noqa: BLE001
            raise PdfError(CORRUPT_IMAGE, f"frame {index}: cannot decode it ({_image_error(e)})") from e
        w, h = img.size
        # an image is used at its own resolution, shrunk to longest_side (never enlarged; dpi does not apply)
        scale = min(1.0, cfg.longest_side / max(w, h), (cfg.max_pixels / (w * h)) ** 0.5)
        if scale < 1.0:
            img = img.resize((max(1, round(w * scale)), max(1, round(h * scale))))
        return img

    def close(self) -> None:
        self._img.close()


_OBJECT_REPR = re.compile(r"\s*<[^<>]*\bobject at 0x[0-9a-fA-F]+>")


def _image_error(e: Exception) -> str:
    """What PIL said about an image, without object reprs (PIL names the file object, an address:
    the message must be the same for the same bytes)."""
    from PIL import UnidentifiedImageError

    if isinstance(e, UnidentifiedImageError):
        return "not a PNG, JPEG, TIFF, WebP, BMP or GIF that PIL can identify: the header is damaged or unknown"
    text = _OBJECT_REPR.sub("", str(e)).strip()
    return f"{type(e).__name__}: {text[:300]}" if text else type(e).__name__


def open_document(data: bytes, *, max_frames: int | None = None):
    """A PDF (pypdfium2 document) or a page image (:class:`ImageDocument`, at most ``max_frames``
    frames); raises PdfError."""
    if data and b"%PDF-" not in data[:1024]:
        if is_image(data):
            return ImageDocument(data, max_frames)
        raise PdfError(NOT_PDF, "neither a PDF (no %PDF- header in the first 1024 bytes) nor a page image "
                                "(PNG, JPEG, TIFF, WebP, BMP, GIF)")
    return open_pdf(data)


@dataclass
class RgbPixels:
    """A rendered page as packed RGB bytes (``width * height * 3``, rows top to bottom): what the
    raster stage encodes, without the copies a PIL image costs."""

    width: int
    height: int
    data: object  #: a contiguous bytes-like object
    _keep: object = None  #: whatever owns ``data``'s memory (a pdfium bitmap)

    def to_pil(self):
        from PIL import Image

        return Image.frombuffer("RGB", (self.width, self.height), self.data, "raw", "RGB", 0, 1).copy()


@dataclass
class PageImage:
    """One rendered page in this process (the renderer process's events are
    :class:`padoc_ray.raster.renderer.PageRendered`; a surface sees :class:`padoc_ray.raster.document.PageRow`)."""

    index: int
    image: object  # PIL.Image (RGB), or RgbPixels with render_page(..., pixels=True)
    width_pt: float
    height_pt: float
    rotation: int
    #: the page's text layer (:class:`~padoc_ray.protocol.text_layer.TextLayer`), with
    #: ``render_page(..., text_layer=True)``; None otherwise, for an image, or where it could not be read
    text_layer: object = None


class ReusedBitmapBuffer:
    """A pdfium bitmap maker for :func:`render_page` that renders every page into one buffer, grown
    as needed: no fresh allocation (and page faults) per page. The pixels of a page are valid until
    the next render with the same maker."""

    def __init__(self):
        self._buf = None

    def __call__(self, width, height, format, rev_byteorder=False):
        import ctypes

        from pypdfium2 import PdfBitmap

        n = width * height * 4  # room for any pixel format pdfium picks
        if self._buf is None or len(self._buf) < n:
            self._buf = (ctypes.c_ubyte * n)()
        return PdfBitmap.new_native(width, height, format, rev_byteorder=rev_byteorder, buffer=self._buf)


def _packed_rgb(bitmap) -> RgbPixels:
    """The RGB bytes of a 3-channel pdfium bitmap, without row padding (copied only if padded)."""
    w, h, stride = bitmap.width, bitmap.height, bitmap.stride
    data = memoryview(bitmap.buffer).cast("B")[: stride * h]
    if stride != w * 3:
        import numpy as np

        data = np.ascontiguousarray(np.frombuffer(data, np.uint8).reshape(h, stride)[:, : w * 3]).data
    return RgbPixels(w, h, data, bitmap)


def render_page(doc, index: int, cfg: RenderConfig = RenderConfig(), *, pixels: bool = False,
                bitmap_maker=None, text_layer: bool = False) -> PageImage:
    """Render page ``index`` (0-based) as a viewer shows it: pdfium applies the page's /Rotate
    (a portrait MediaBox with /Rotate 90 comes out landscape). The image is a PIL RGB image, or
    :class:`RgbPixels` with ``pixels=True`` (same pixels, fewer copies; with a
    :class:`ReusedBitmapBuffer` as ``bitmap_maker`` they live in its buffer). ``text_layer``: read the
    page's text layer too, from the same loaded page (a layer that cannot be read is None, never an
    error). Raises PdfError."""
    if isinstance(doc, ImageDocument):
        img = doc.render(index, cfg)
        if pixels:
            img = RgbPixels(img.width, img.height, img.tobytes())
        return PageImage(index=index, image=img, width_pt=None, height_pt=None, rotation=0)
    # before pdfium loads the page: loading parses the content, forms included (minutes for a bomb)
    counter = getattr(doc, "padoc_draws", None)
    if cfg.max_page_draws and counter is not None:
        n = counter.page_draws(index, cfg.max_page_draws)
        if n > cfg.max_page_draws:
            raise PdfError(PAGE_TOO_COMPLEX, f"page {index}: {counter.describe(index, cfg.max_page_draws)}; "
                                             f"not rendered")
    page = _load_page(doc, index)
    try:
        w, h = page.get_size()
        if not (MIN_PAGE_POINTS <= w <= MAX_PAGE_POINTS and MIN_PAGE_POINTS <= h <= MAX_PAGE_POINTS):
            raise PdfError(ABSURD_PAGE_SIZE, f"page {index} is {w:.0f}x{h:.0f} pt")
        rot = page.get_rotation()
        try:
            # pdfium applies /Rotate itself (get_size is the displayed size); no extra rotation here.
            # rev_byteorder: RGB byte order straight from pdfium (no channel swap afterwards)
            kw = {"bitmap_maker": bitmap_maker} if bitmap_maker is not None else {}
            bitmap = page.render(scale=cfg.scale_for(w, h), rotation=0, may_draw_forms=True, rev_byteorder=True, **kw)
        except MemoryError as e:  # the bitmap does not fit the process's memory (the renderer's limit)
            px_w, px_h = round(w * cfg.scale_for(w, h)), round(h * cfg.scale_for(w, h))
            raise PdfError(RENDER_OUT_OF_MEMORY, f"page {index}: its {px_w}x{px_h} pixel bitmap does not fit the "
                                                 f"memory the renderer may use (RendererConfig.memory_limit_mb, "
                                                 f"--render-memory-limit-mb)") from e
        except Exception as e:  # noqa: BLE001 - pdfium raises several kinds
            raise PdfError(RENDER_FAILED, f"page {index}: {e}") from e
        if bitmap.n_channels != 3:
            raise PdfError(RENDER_FAILED, f"page {index}: unexpected {bitmap.n_channels}-channel bitmap")
        img = _packed_rgb(bitmap) if pixels else bitmap.to_pil()  # a 3-channel bitmap's to_pil is an RGB copy
        layer = None
        if text_layer:
            try:
                layer = _text_layer_of(page)
            except Exception:  # noqa: BLE001 - a page whose text cannot be read still parses, without drafts
                layer = None
        return PageImage(index=index, image=img, width_pt=w, height_pt=h, rotation=rot, text_layer=layer)
    finally:
        page.close()


def iter_pages(doc, indices: list[int] | None = None, cfg: RenderConfig = RenderConfig()) -> Iterator[PageImage | PdfError]:
    """Yield pages one by one; a page that fails yields its PdfError instead (the rest go on)."""
    for i in indices if indices is not None else range(len(doc)):
        try:
            yield render_page(doc, i, cfg)
        except PdfError as e:
            yield e


# ---- caps on images with many frames (hostile inputs) ---------------------------------------------------
#: an image with more frames than this is refused (a multi-page TIFF scan has tens to hundreds)
MAX_IMAGE_FRAMES = 1000
#: formats whose frames each have their own size (other formats' frames share the canvas of frame 0,
#: which PIL checks when it opens the file; seeking them would decode the frames before)
_FRAMES_WITH_OWN_SIZE = frozenset({"TIFF", "MPO"})


class CapError(PdfError):
    """A document over a cap; ``count`` is what was counted (frames, pages)."""

    def __init__(self, code: str, message: str, count: int):
        super().__init__(code, message)
        self.count = count


def check_frames(img, n_frames: int, max_frames: int) -> None:
    """Refuse an image with more than ``max_frames`` frames, or with any frame over PIL's pixel
    limit (``Image.MAX_IMAGE_PIXELS``), reading frame headers only (nothing is decoded)."""
    from PIL import Image

    if n_frames > max_frames:
        raise CapError(TOO_MANY_FRAMES, f"the image has {n_frames} frames, over the limit of {max_frames} "
                                        f"(--image-frame-limit)", n_frames)
    limit = Image.MAX_IMAGE_PIXELS
    if n_frames < 2 or not limit or img.format not in _FRAMES_WITH_OWN_SIZE:
        return
    for i in range(n_frames):
        img.seek(i)
        w, h = img.size
        if w * h > limit:
            raise PdfError(ABSURD_PAGE_SIZE, f"frame {i} is {w}x{h} pixels, over the limit of {limit}")
    img.seek(0)


def _load_page(doc, index: int):
    """pdfium's page ``index`` of ``doc`` (the caller closes it); PdfError(page_load_failed) if it will not load."""
    import pypdfium2 as pdfium

    try:
        return doc[index]
    except (pdfium.PdfiumError, IndexError) as e:
        raise PdfError(PAGE_LOAD_FAILED, f"page {index}: {e}") from e


def page_text_layer(doc, index: int, max_chars: int | None = None):
    """Page ``index``'s text layer (:class:`~padoc_ray.protocol.text_layer.TextLayer`): its characters in
    the file's order, each box mapped to the displayed page (its /Rotate applied) and normalized; at
    most ``max_chars`` (default :data:`~padoc_ray.protocol.text_layer.MAX_CHARS`) of them. Line breaks
    pdfium inserts get empty boxes; a space it inserts between words takes the box of the character
    before it. None for an image document (no text layer). Raises PdfError where the page cannot load."""
    if isinstance(doc, ImageDocument):
        return None
    page = _load_page(doc, index)
    try:
        return _text_layer_of(page, max_chars)
    finally:
        page.close()


def _text_layer_of(page, max_chars: int | None = None):
    """:func:`page_text_layer` of a loaded pypdfium2 page (left open)."""
    import ctypes

    import pypdfium2.raw as raw

    from padoc_ray.protocol.text_layer import MAX_CHARS, TextLayer

    cap = MAX_CHARS if max_chars is None else max_chars
    textpage = None
    try:
        w, h = page.get_size()  # displayed size, in points
        dev_w, dev_h = max(1, round(w * 16)), max(1, round(h * 16))  # 1/16 point precision
        textpage = page.get_textpage()
        n = textpage.count_chars()
        chars, boxes = [], []
        l, r, b, t = (ctypes.c_double() for _ in range(4))
        dx, dy = ctypes.c_int(), ctypes.c_int()

        def to_device(x: float, y: float) -> tuple[float, float]:
            raw.FPDF_PageToDevice(page, 0, 0, dev_w, dev_h, 0, x, y, dx, dy)
            return dx.value / dev_w, dy.value / dev_h

        for i in range(min(n, cap)):
            code = raw.FPDFText_GetUnicode(textpage, i)
            ch = chr(code) if 0 < code < 0x110000 else "\ufffd"
            generated = raw.FPDFText_IsGenerated(textpage, i) == 1
            if ch in "\r\n" and generated:
                box = (0.0, 0.0, 0.0, 0.0)
            elif generated or not raw.FPDFText_GetCharBox(textpage, i, l, r, b, t):
                box = boxes[-1] if boxes else (0.0, 0.0, 0.0, 0.0)
            else:
                (x1, y1), (x2, y2) = to_device(l.value, t.value), to_device(r.value, b.value)
                box = (min(x1, x2), min(y1, y2), max(x1, x2), max(y1, y2))
            chars.append(ch)
            boxes.append(box)
        return TextLayer("".join(chars), tuple(boxes), truncated=n > cap)
    finally:
        if textpage is not None:
            textpage.close()
