"""Caps that keep one input from exhausting the batch job, and what a rerun retries.

Each cap has its own code in the rows. ``file_too_large`` and ``disallowed_uri`` (like
``missing_file``, and the link and special-file codes) are decided by the driver from the listing, before any work is queued; the
page cap is decided when a document is opened, before any of its pages is rendered; the frame cap
when an image is opened, before any frame is decoded (:class:`padoc_ray.pdf.ImageDocument`).

A document-level row is final unless it says something a rerun can change: a read that failed, a
file that was missing or refused by the listing (decided again on every run), or a cap that the
current configuration no longer exceeds. No ray, vllm or torch (the listing's sentinel sizes come from
:mod:`padoc_ray.storage`, which produces them).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from padoc_ray import storage
from padoc_ray.pdf import TOO_MANY_FRAMES, PdfError

MISSING_FILE = "missing_file"  #: a manifest line naming nothing
READ_FAILED = "read_failed"  #: the bytes could not be read, or not in time (retried by a rerun)
DISALLOWED_URI = "disallowed_uri"  #: a manifest line outside the allowed prefixes (never read)
FILE_TOO_LARGE = "file_too_large"  #: over ``max_file_bytes`` (never read)
TOO_MANY_PAGES = "too_many_pages"  #: more selected pages than ``max_doc_pages`` (no page rendered)
SYMLINK = "symlink"  #: a symbolic link in the input folder, not followed (never read)
SYMLINK_OUTSIDE = "symlink_outside_input"  #: a link to outside the input folder (never read)
DUPLICATE_LINK = "duplicate_link"  #: a followed link to a file or folder listed already (listed once)
NOT_REGULAR_FILE = "not_regular_file"  #: a FIFO, socket or device (never opened), at listing or read time
CHANGED_DURING_READ = "changed_during_read"  #: the file changed while it was read (retried by a rerun)

#: sizes the listing gives inputs it does not list as files (padoc_ray.storage), with their row
_SENTINELS: dict[int, tuple[str, str]] = {
    storage.DISALLOWED: (DISALLOWED_URI, "the manifest may not name this URI: only URIs under its own folder or a "
                                         "--manifest-allow prefix are read"),
    storage.MISSING: (MISSING_FILE, "listed but not found (a manifest line naming nothing, or a dangling link)"),
    storage.SYMLINK: (SYMLINK, "a symbolic link: not followed (--follow-symlinks follows links whose target is "
                               "inside the input folder)"),
    storage.SYMLINK_OUTSIDE: (SYMLINK_OUTSIDE, "a symbolic link to outside the input folder: never read"),
    storage.DUPLICATE: (DUPLICATE_LINK, "a symbolic link to a file or folder listed already: parsed once, "
                                        "under its own path"),
    storage.NOT_REGULAR: (NOT_REGULAR_FILE, "not a regular file (a FIFO, socket or device): never opened"),
}
#: codes decided from the listing alone: the driver writes these rows itself
LISTING_CODES = frozenset({code for code, _ in _SENTINELS.values()} | {FILE_TOO_LARGE})
#: document-level codes a rerun always tries again (the listing's are decided again)
RETRIED_CODES = LISTING_CODES | {READ_FAILED, CHANGED_DURING_READ}
#: the listing's refusals in the order the ledger numbers them (1 + index; 0: none)
REFUSALS: tuple[tuple[int | None, str], ...] = (*((size, code) for size, (code, _) in _SENTINELS.items()),
                                                 (None, FILE_TOO_LARGE))


@dataclass(frozen=True, kw_only=True)
class InputLimits:
    """Per-input caps; None: no cap (the frame cap is always on).

    * ``max_doc_pages`` 5,000: pages selected in one document. Long books and filings have a few
      thousand pages; 5,000 pages are hours of one engine, and a tiny PDF can claim 100,000.
    * ``max_image_frames`` 1,000: frames of one image (a multi-page TIFF scan has tens to
      hundreds); every frame's size is also checked against PIL's pixel limit before decoding.
    * ``max_file_bytes`` 512 MiB: a raster task holds the whole file (and pdfium a copy), so this
      bounds a task's memory; large scanned PDFs stay well below it.
    """

    max_doc_pages: int | None = 5000  #: selected pages of one document; more: too_many_pages (None: no cap)
    max_image_frames: int = 1000  #: frames of one image; more: too_many_frames
    max_file_bytes: int | None = 512 << 20  #: bytes of one input file; more: file_too_large (None: no cap)

    def __post_init__(self) -> None:
        for name in ("max_doc_pages", "max_image_frames", "max_file_bytes"):
            v = getattr(self, name)
            if (v is not None or name == "max_image_frames") and not (isinstance(v, int) and v >= 1):
                raise ValueError(f"{name} must be an integer >= 1, got {v!r}")


def listing_refusal(size: int | None, limits: InputLimits) -> tuple[str, str] | None:
    """(code, message) when an input must not be queued, from its listed size alone."""
    if size is not None and size < 0:
        return _SENTINELS.get(size, _SENTINELS[storage.MISSING])
    if size is not None and limits.max_file_bytes is not None and size > limits.max_file_bytes:
        return FILE_TOO_LARGE, (f"{size} bytes, over the limit of {limits.max_file_bytes} "
                                f"(--file-size-limit-mb {limits.max_file_bytes / 2**20:g})")
    return None


def page_cap_error(page_count: int, selected: Sequence[int], limits: InputLimits) -> PdfError | None:
    """The error of a document with more selected pages than the cap (checked before rendering)."""
    cap = limits.max_doc_pages
    if cap is None or len(selected) <= cap:
        return None
    return PdfError(TOO_MANY_PAGES, f"{len(selected)} of its {page_count} pages selected, over the limit of {cap} "
                                    f"(--doc-page-limit); select fewer with --pages/--max-pages-per-doc or raise it")


def retried(code: str | None, page_count: int | None, n_selected: int | None, limits: InputLimits) -> bool:
    """Whether a rerun tries again a document whose current row is document-level with ``code``.
    ``page_count`` is the row's (pages, or frames of an image), ``n_selected`` the pages the current
    configuration selects of it."""
    if code in RETRIED_CODES:
        return True
    if code == TOO_MANY_PAGES:
        return n_selected is not None and (limits.max_doc_pages is None or n_selected <= limits.max_doc_pages)
    if code == TOO_MANY_FRAMES:
        return page_count is not None and page_count <= limits.max_image_frames
    return False
