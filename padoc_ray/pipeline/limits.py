"""Caps that keep one input from exhausting the batch job, and what a rerun retries.

The caps themselves (:class:`~padoc_ray.raster.document.InputLimits`) live with the one page
selection in :mod:`padoc_ray.raster.document`, which the online service shares; their codes and
what a rerun does with each are :mod:`padoc_ray.status`'s.

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

from typing import Sequence

from padoc_ray import listing
from padoc_ray.pdf import PdfError
from padoc_ray.raster.document import InputLimits  # noqa: F401 - the caps, re-exported for the batch job
from padoc_ray.status import (  # noqa: F401 - the codes of this module's caps and refusals, re-exported
    CHANGED_DURING_READ,
    DISALLOWED_URI,
    DUPLICATE_LINK,
    FILE_TOO_LARGE,
    MISSING_FILE,
    NOT_REGULAR_FILE,
    READ_FAILED,
    UNDECODABLE_NAME,
    UNLISTABLE_FOLDER,
    RETRIED_CODES,
    SYMLINK,
    TOO_MANY_FRAMES,
    TOO_MANY_PAGES,
)
from padoc_ray.status import SYMLINK_OUTSIDE_INPUT as SYMLINK_OUTSIDE

#: sizes the listing gives inputs it does not list as files (padoc_ray.storage), with their row
_SENTINELS: dict[int, tuple[str, str]] = {
    listing.DISALLOWED: (DISALLOWED_URI, "the manifest may not name this URI: only URIs under its own folder or a "
                                         "--manifest-allow prefix are read"),
    listing.MISSING: (MISSING_FILE, "listed but not found (a manifest line naming nothing, or a dangling link)"),
    listing.SYMLINK: (SYMLINK, "a symbolic link: not followed (--follow-symlinks follows links whose target is "
                               "inside the input folder)"),
    listing.SYMLINK_OUTSIDE: (SYMLINK_OUTSIDE, "a symbolic link to outside the input folder: never read"),
    listing.DUPLICATE: (DUPLICATE_LINK, "a symbolic link to a file or folder listed already: parsed once, "
                                        "under its own path"),
    listing.NOT_REGULAR: (NOT_REGULAR_FILE, "not a regular file (a FIFO, socket or device): never opened"),
    listing.UNLISTABLE: (UNLISTABLE_FOLDER, "a folder that could not be listed (no permission): the files in it are "
                                            "not known; a rerun lists it again"),
    listing.UNDECODABLE: (UNDECODABLE_NAME, "the file name is not UTF-8, so no row can name it (shown here with its "
                                            "bytes escaped); rename it to parse it"),
}
#: codes decided from the listing alone: the driver writes these rows itself
LISTING_CODES = frozenset({code for code, _ in _SENTINELS.values()} | {FILE_TOO_LARGE})
#: the listing's refusals in the order the ledger numbers them (1 + index; 0: none)
REFUSALS: tuple[tuple[int | None, str], ...] = (*((size, code) for size, (code, _) in _SENTINELS.items()),
                                                 (None, FILE_TOO_LARGE))


def listing_refusal(size: int | None, limits: InputLimits) -> tuple[str, str] | None:
    """(code, message) when an input must not be queued, from its listed size alone."""
    if size is not None and size < 0:
        return _SENTINELS.get(size, _SENTINELS[listing.MISSING])
    if size is not None and limits.max_file_bytes is not None and size > limits.max_file_bytes:
        return FILE_TOO_LARGE, (f"{size} bytes, over the limit of {limits.max_file_bytes} "
                                f"(--file-size-limit-mb {limits.max_file_bytes / 2**20:g})")
    return None


def page_cap_message(n_selected: int, page_count: int, cap: int) -> str:
    """The batch job's ``too_many_pages`` message (see :class:`padoc_ray.raster.document.PageChoice`)."""
    return (f"{n_selected} of its {page_count} pages selected, over the limit of {cap} "
            f"(--doc-page-limit); select fewer with --pages/--max-pages-per-doc or raise it")


def page_cap_error(page_count: int, selected: Sequence[int], limits: InputLimits) -> PdfError | None:
    """The error of a document with more selected pages than the cap (checked before rendering)."""
    cap = limits.max_doc_pages
    if cap is None or len(selected) <= cap:
        return None
    return PdfError(TOO_MANY_PAGES, page_cap_message(len(selected), page_count, cap))


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
