"""Every status a page, a document or a job can have, each listed once, with what it means.

A **page code** is a page row's ``status`` (``ok``, or why the page is not): the scheduler's verdicts
(:class:`padoc_ray.scheduler.state.PageStatus`, whose labels are these codes), the renderer's, the
host's and the online service's. A **document code** is the ``status`` / ``error_code`` of a row
with ``page_index = -1``: the whole input failed before any page ran (it could not be read, opened,
or was refused by a cap). Some codes are both (``render_timeout``: opening, or one page).

For each code the table says:

* ``tiers``: page, document, or both;
* ``rerun``: whether the batch job's next run over the same output tries it again (``never``,
  ``always``: the failure may be transient or the listing decides it again, ``if_allowed``: a cap
  that the rerun's configuration may no longer exceed). Page rows are final: a rerun parses only
  pages that have no row;
* ``http``: what the online service answers when this is the outcome (a document code is the
  request's error; a page code is the chat route's answer for its one page; /v1/parse answers 200
  with the page's status inside);
* ``content``: whether the row still carries the page's content (limits cut it short, nothing else
  went wrong).

A **document status** (``documents.parquet``, Serve's responses and jobs) is one vocabulary:
``ok`` (every selected page ok), ``partial`` (some), ``failed`` (none), and for the batch job also
``skipped`` (not a document we parse), ``incomplete`` (pages have no row yet), ``missing`` (listed,
never accounted) or the input's document code. :func:`document_status` rolls page statuses up;
:func:`normalize_document_status` reads the values Serve wrote before this vocabulary
(``success``, ``partial_success``, ``failure``).

Pure: imports nothing of the project. Every producer and consumer of a status imports it from here
(``tests/contracts/test_statuses.py`` scans the package for status literals elsewhere).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

PAGE, DOCUMENT = "page", "document"
NEVER, ALWAYS, IF_ALLOWED = "never", "always", "if_allowed"


@dataclass(frozen=True)
class Code:
    name: str
    tiers: frozenset[str]
    meaning: str
    http: int = 422
    rerun: str = NEVER
    content: bool = False


CODES: dict[str, Code] = {}


def _code(name: str, tiers: str, meaning: str, **kw) -> str:
    CODES[name] = Code(name, frozenset(tiers.split("|")), meaning, **kw)
    return name


# ---- page codes: the scheduler's verdicts (PageStatus, in its order of severity) -------------------------
OK = _code("ok", PAGE, "parsed; every stream ended normally", http=200, content=True)
MALFORMED_LAYOUT = _code("malformed_layout", PAGE, "the layout stream parsed with errors (what was recoverable "
                                                   "is kept)", http=200, content=True)
TOKEN_LIMIT = _code("token_limit", PAGE, "a stream hit its token limit (max_tokens)", http=200, content=True)
BRANCH_UNRECOVERED = _code("branch_unrecovered", PAGE, "a content branch looped or hit its token limit on every "
                                                       "attempt (re-forks included, or the retry budget was spent): "
                                                       "that region's content is not to be trusted, the other "
                                                       "regions are kept", http=200, content=True)
LAYOUT_UNRECOVERED = _code("layout_unrecovered", PAGE, "the layout stream looped again after its retry from the "
                                                       "last region boundary: the page ends with the regions it "
                                                       "has", http=200, content=True)
BRANCH_LIMIT = _code("branch_limit", PAGE, "the layout closed more regions than max_branches", http=200,
                     content=True)
RUNAWAY = _code("runaway", PAGE, "a stream repeated itself or stopped progressing, and was stopped", http=200,
                content=True)
DEADLINE = _code("deadline", PAGE, "the page's deadline passed", http=504)
CANCELLED = _code("cancelled", PAGE, "the caller cancelled the page", http=500)
ENGINE_ERROR = _code("engine_error", PAGE, "the engine refused or failed a request", http=500)
INTERNAL_ERROR = _code("internal_error", PAGE, "an unexpected exception while the page ran (a bug)", http=500)
# ---- page codes: the host and the online service -------------------------------------------------------
IMAGE_UNREADABLE = _code("image_unreadable", PAGE, "the page's image could not be decoded")
OVERLOADED = _code("overloaded", PAGE, "every engine replica was at capacity (retry later)", http=503)
ENGINE_UNAVAILABLE = _code("engine_unavailable", PAGE, "the engine failed while parsing this page", http=500)
UNSUPPORTED_MODE = _code("unsupported_mode", PAGE, "the page asked for a decoding mode the checkpoint's family "
                                                   "does not have (hpd: fork only)")
REQUEST_TIMEOUT = _code("request_timeout", PAGE, "the request's deadline passed before this page finished (a "
                                                 "streamed /v1/parse)", http=504)
# ---- page codes: rendering ---------------------------------------------------------------------------
PAGE_LOAD_FAILED = _code("page_load_failed", PAGE, "pdfium could not load the page")
ABSURD_PAGE_SIZE = _code("absurd_page_size", f"{PAGE}|{DOCUMENT}", "the page is larger or smaller than any real "
                                                                 "page (or an image over the decompression-bomb limit)")
PAGE_TOO_COMPLEX = _code("page_too_complex", PAGE, "the page would draw more XObjects than the draw limit")
RENDER_OUT_OF_MEMORY = _code("render_out_of_memory", PAGE, "rendering the page needed more memory than the "
                                                           "renderer's limit")
RENDER_FAILED = _code("render_failed", f"{PAGE}|{DOCUMENT}", "pdfium failed to render the page (or to open the "
                                                             "document)")
RENDER_TIMEOUT = _code("render_timeout", f"{PAGE}|{DOCUMENT}", "opening the document or rendering the page ran "
                                                               "past its deadline")
RENDER_CRASHED = _code("render_crashed", f"{PAGE}|{DOCUMENT}", "the renderer process died on this page (or "
                                                               "document)")
CORRUPT_IMAGE = _code("corrupt_image", f"{PAGE}|{DOCUMENT}", "an image (or one frame of it) cannot be decoded")
# ---- document codes: opening -------------------------------------------------------------------------
EMPTY_FILE = _code("empty_file", DOCUMENT, "the file has no bytes")
NOT_PDF = _code("not_pdf", DOCUMENT, "neither a PDF nor a supported image (documents.parquet: skipped)")
ENCRYPTED_PDF = _code("encrypted_pdf", DOCUMENT, "the PDF needs a password")
CORRUPT_PDF = _code("corrupt_pdf", DOCUMENT, "the PDF cannot be opened, even after repair")
NO_PAGES = _code("no_pages", DOCUMENT, "the document has no pages")
PAGE_OUT_OF_RANGE = _code("page_out_of_range", DOCUMENT, "a requested page does not exist (online service)")
# ---- document codes: caps ----------------------------------------------------------------------------
TOO_MANY_PAGES = _code("too_many_pages", DOCUMENT, "more selected pages than the cap (nothing rendered)", http=413,
                       rerun=IF_ALLOWED)
TOO_MANY_FRAMES = _code("too_many_frames", DOCUMENT, "an image with more frames than the cap (none decoded)",
                        http=413, rerun=IF_ALLOWED)
FILE_TOO_LARGE = _code("file_too_large", DOCUMENT, "a file over the size cap (never read)", http=413, rerun=ALWAYS)
# ---- document codes: reading and the listing (the listing's are decided again on every run) ------------
READ_FAILED = _code("read_failed", DOCUMENT, "the bytes could not be read, or not in time", rerun=ALWAYS)
CHANGED_DURING_READ = _code("changed_during_read", DOCUMENT, "the file changed while it was read", rerun=ALWAYS)
MISSING_FILE = _code("missing_file", DOCUMENT, "listed but not found (a manifest line naming nothing, a "
                                               "dangling link)", http=400, rerun=ALWAYS)
DISALLOWED_URI = _code("disallowed_uri", DOCUMENT, "a URI outside the allowed prefixes (never read)", http=403,
                       rerun=ALWAYS)
SYMLINK = _code("symlink", DOCUMENT, "a symbolic link in the input folder, not followed (never read)", rerun=ALWAYS)
SYMLINK_OUTSIDE_INPUT = _code("symlink_outside_input", DOCUMENT, "a link to outside the input folder (never read)",
                              rerun=ALWAYS)
DUPLICATE_LINK = _code("duplicate_link", DOCUMENT, "a followed link to a file or folder listed already (parsed "
                                                   "once)", rerun=ALWAYS)
NOT_REGULAR_FILE = _code("not_regular_file", DOCUMENT, "a FIFO, socket or device (never opened)", rerun=ALWAYS)
UNLISTABLE_FOLDER = _code("unlistable_folder", DOCUMENT, "a folder in the input that could not be listed (no "
                                                         "permission): the files in it are not known", rerun=ALWAYS)
UNDECODABLE_NAME = _code("undecodable_name", DOCUMENT, "a file name that is not UTF-8: rows cannot name it (listed "
                                                       "with its bytes escaped, never read)", rerun=ALWAYS)

PAGE_CODES = frozenset(c.name for c in CODES.values() if PAGE in c.tiers)
DOCUMENT_CODES = frozenset(c.name for c in CODES.values() if DOCUMENT in c.tiers)
#: page statuses whose row still carries the page's content
CONTENT_CODES = frozenset(c.name for c in CODES.values() if c.content)
#: document codes a rerun always tries again (the listing's are decided again)
RETRIED_CODES = frozenset(c.name for c in CODES.values() if c.rerun == ALWAYS)
#: document codes a rerun tries again when its configuration no longer exceeds the cap
CAP_CODES = frozenset(c.name for c in CODES.values() if c.rerun == IF_ALLOWED)
#: document codes that mean "not a document we parse" rather than a failure (status ``skipped``)
SKIPPED_CODES = frozenset({NOT_PDF})


def http_status(code: str, default: int = 422) -> int:
    """What the online service answers for ``code`` (``default`` for a code this table does not know)."""
    c = CODES.get(code)
    return c.http if c is not None else default


# ---- the document-status vocabulary --------------------------------------------------------------------
DOC_OK = OK  #: every selected page is ok
DOC_PARTIAL = "partial"  #: some selected pages are ok, some not
DOC_FAILED = "failed"  #: no selected page is ok (documents.parquet: ``error_code`` is their most common code)
DOC_SKIPPED = "skipped"  #: not a document we parse (:data:`SKIPPED_CODES`)
DOC_INCOMPLETE = "incomplete"  #: batch: some selected pages have no row yet (a rerun parses them)
DOC_MISSING = "missing"  #: batch: listed, but never accounted for
#: the statuses a document whose pages ran can have (the rest of documents.parquet's are document codes)
DOCUMENT_STATUSES = (DOC_OK, DOC_PARTIAL, DOC_FAILED, DOC_SKIPPED, DOC_INCOMPLETE, DOC_MISSING)
#: documents.parquet statuses that mean the input is not accounted for yet
UNACCOUNTED = frozenset({DOC_INCOMPLETE, DOC_MISSING})
#: what Serve wrote before the one vocabulary (its responses and job states), read as today's
LEGACY_DOCUMENT_STATUSES = {"success": DOC_OK, "partial_success": DOC_PARTIAL, "failure": DOC_FAILED}


def rollup(ok: int, failed: int, unparsed: int = 0) -> str:
    """A document's status from its selected pages: ``ok`` of them ok, ``failed`` with another status,
    ``unparsed`` without a row yet. No page at all is ``failed``."""
    if unparsed > 0:
        return DOC_INCOMPLETE
    if ok and not failed:
        return DOC_OK
    return DOC_PARTIAL if ok else DOC_FAILED


def document_status(page_statuses: Iterable[str | None]) -> str:
    """:func:`rollup` of the page statuses of a document's selected pages (None: no row yet)."""
    ok = failed = unparsed = 0
    for s in page_statuses:
        if s is None:
            unparsed += 1
        elif s == OK:
            ok += 1
        else:
            failed += 1
    return rollup(ok, failed, unparsed)


def normalize_document_status(value: str | None) -> str | None:
    """A document status as written by any version (Serve's old ``success`` / ``partial_success`` /
    ``failure`` become ``ok`` / ``partial`` / ``failed``)."""
    return LEGACY_DOCUMENT_STATUSES.get(value, value) if value is not None else None


# ---- online jobs (/v1/jobs): the job's own life, apart from its document's status ----------------------
JOB_QUEUED = "queued"
JOB_RUNNING = "running"
JOB_DONE = "done"  #: its ``document_status`` says how the document went
JOB_FAILED = DOC_FAILED  #: the document failed as a whole (its ``error`` holds the document code)
JOB_CANCELLED = CANCELLED
JOB_CANCELLING = "cancelling"  #: shown while a cancelled job's engine work stops
JOB_FINAL = frozenset({JOB_DONE, JOB_CANCELLED, JOB_FAILED})

# ---- a region's finish in a page row (otherwise the engine's finish reason: stop, length, abort) --------
REGION_SKIPPED = "skipped"  #: no branch forked: its category has no content (figures)
# a region's ``finish``: how the last attempt of its branch ended (else an engine finish reason, or stopped)
REGION_STOP = "stop"  #: ended normally (its end-of-stream)
REGION_LOOP = "loop"  #: a loop detector (or the engine's repetition check) stopped it
REGION_LENGTH = "length"  #: it hit max_tokens
