"""Ground truth in OmniDocBench's format, and the one rule that matches it with source files.

A ground-truth page names where it comes from in ``page_info``: ``image_path`` (the page image) and,
for a page of a PDF, ``source_pdf`` + ``page_no`` (0-based). A source is a file name (a PDF or an
image) and a page index. They match by one rule, :func:`truth_keys` on one side and
:func:`source_keys` on the other:

* page ``i`` of a file ``doc.pdf`` (or of a multi-page image) matches ``source_pdf = doc.pdf`` with
  ``page_no = i``, or an ``image_path`` named ``doc.pdf_<i>.<image ext>`` (OmniDocBench's naming of
  PDF pages);
* an image file (its first page) also matches the ``image_path`` of the same stem (``scan.png``
  matches ``scan.jpg``: a page image converted to another format is the same page).

When several ground-truth pages share a key the first one wins. Used by teacher forcing
(:class:`Truth`), the evaluators and the batch-output matcher (:func:`match_rows`), ``show``,
``reannotate``, the serving benchmark and the trainer's page loader. Pure: no ray, vllm or torch.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Iterator, Mapping

from padoc_ray.protocol import Page, PageFormatError, page_from_omnidocbench

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")  #: page images (also what inputs.py takes)
_PDF_PAGE_IMAGE = re.compile(r"^(?P<pdf>.+\.pdf)_(?P<page>\d+)$", re.IGNORECASE)

Key = tuple  #: ("src", file name, page index) or ("img", image stem)


class GroundTruthError(ValueError):
    """A ground-truth file that is not a JSON list of OmniDocBench pages."""


def pdf_source(page_info: Mapping | None) -> tuple[str, int] | None:
    """(source_pdf basename, page_no) of a page_info, when it names both."""
    if not isinstance(page_info, Mapping):
        return None
    pdf, page_no = page_info.get("source_pdf"), page_info.get("page_no")
    if not isinstance(pdf, str) or not pdf or isinstance(page_no, bool):
        return None
    try:
        return os.path.basename(pdf), int(page_no)
    except (TypeError, ValueError):
        return None


def truth_keys(name: str, source: tuple[str, int] | None = None) -> list[Key]:
    """The keys a ground-truth page is found by: ``name`` is its ``image_path`` (basename),
    ``source`` its (source_pdf, page_no)."""
    keys: list[Key] = []
    if source is not None:
        keys.append(("src", source[0], source[1]))
    stem, ext = os.path.splitext(os.path.basename(name))
    if ext.lower() in IMAGE_EXTS:
        m = _PDF_PAGE_IMAGE.match(stem)
        if m is not None:
            keys.append(("src", m["pdf"], int(m["page"])))
        keys.append(("img", stem))
    elif name:
        keys.append(("img", os.path.basename(name)))
    return keys


def source_keys(file_name: str, page_index: int | None) -> list[Key]:
    """The keys page ``page_index`` of a source file is found by, in order."""
    base = os.path.basename(str(file_name or "").rstrip("/"))
    i = int(page_index or 0)
    keys: list[Key] = [("src", base, i)]
    if i == 0 and not base.lower().endswith(".pdf"):
        stem, ext = os.path.splitext(base)
        keys.append(("img", stem if ext.lower() in IMAGE_EXTS else base))
    return keys


class TruthIndex:
    """Ground-truth page names by every key they are found by (first page wins a shared key)."""

    def __init__(self, pages: Iterable[tuple[str, tuple[str, int] | None]]):
        """``pages``: (page name = image basename, (source_pdf basename, page_no) or None)."""
        self._idx: dict[Key, str] = {}
        for name, source in pages:
            for k in truth_keys(name, source):
                self._idx.setdefault(k, name)

    def name_for(self, file_name: str | None, page_index: int | None) -> str | None:
        """The ground-truth page of a source file's page, or None."""
        if not file_name:
            return None
        return next((self._idx[k] for k in source_keys(file_name, page_index) if k in self._idx), None)

    def page_of(self, row: Mapping) -> str | None:
        """The ground-truth page of a page row (its ``source_uri`` and ``page_index``)."""
        return self.name_for(row.get("source_uri"), row.get("page_index"))


def source_for(name: str, source: tuple[str, int] | None, files: Mapping[str, Any]) -> tuple[Any, int] | None:
    """Where a ground-truth page is among source ``files`` (file name -> anything, e.g. its URI):
    (that value, page index), by the same rule as :class:`TruthIndex`."""
    by_key: dict[Key, str] = {}
    for f in files:
        for k in source_keys(f, 0)[1:]:
            by_key.setdefault(k, f)
    for k in truth_keys(name, source):
        if k[0] == "src" and k[1] in files:
            return files[k[1]], k[2]
        if k[0] == "img" and k in by_key:
            return files[by_key[k]], 0
    return None


# ---- reading a ground-truth file ---------------------------------------------------------------------

@dataclass
class TruthPage:
    """One entry of a ground-truth file: ``page`` is None when it does not parse (``error`` says why)."""

    index: int  #: position in the file
    name: str  #: page_info.image_path's basename, or ``<page N>``
    source: tuple[str, int] | None  #: (source_pdf, page_no) when page_info names both
    obj: Any
    page: Page | None = None
    error: str | None = None


def parse_truth(data: bytes | str | list, what: str = "ground truth") -> list[TruthPage]:
    """Every entry of an OmniDocBench-format JSON list (bytes, text or the parsed list); an entry
    that does not parse is kept with its error. Raises :class:`GroundTruthError` for a file that
    is not a JSON list."""
    objs = data
    if isinstance(data, (bytes, str)):
        try:
            objs = json.loads(data.decode("utf-8") if isinstance(data, bytes) else data)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise GroundTruthError(f"{what} is not valid JSON: {e}") from None
    if not isinstance(objs, list):
        raise GroundTruthError(f"{what} must be a JSON list of OmniDocBench pages, got {type(objs).__name__}")
    out = []
    for n, o in enumerate(objs):
        info = o.get("page_info") if isinstance(o, dict) else None
        raw = (info or {}).get("image_path") if isinstance(info, dict) else None
        name = os.path.basename(str(raw)) if raw else f"<page {n}>"
        tp = TruthPage(n, name, pdf_source(info), o)
        try:
            tp.page = page_from_omnidocbench(o)
        except PageFormatError as e:
            tp.error = str(e)
        out.append(tp)
    return out


class Truth(Mapping):
    """Ground-truth pages for teacher forcing, looked up by (source file name, page index) with the
    one matching rule. A mapping: ``truth.get((name, page_index))`` -> :class:`Page` or None."""

    def __init__(self, pages: Iterable[TruthPage] = ()):
        self.pages = {p.name: p.page for p in pages if p.page is not None}
        self._index = TruthIndex((p.name, p.source) for p in pages if p.page is not None)
        self._keys = [(p.source or (p.name, 0)) for p in pages if p.page is not None]

    @classmethod
    def of_pages(cls, pages: Mapping[str, Page]) -> "Truth":
        """From {image file name: Page} (each name is a one-page source)."""
        return cls([TruthPage(i, name, None, None, page) for i, (name, page) in enumerate(pages.items())])

    def __getitem__(self, key: tuple[str, int]) -> Page:
        name = self._index.name_for(key[0], key[1])
        if name is None:
            raise KeyError(key)
        return self.pages[name]

    def __iter__(self) -> Iterator[tuple[str, int]]:
        return iter(self._keys)

    def __len__(self) -> int:
        return len(self._keys)


def truth_from_json(data: bytes) -> Truth:
    return Truth(parse_truth(data))


def load_truth(gt_path: str | None, storage=None) -> Truth:
    """Ground truth for teacher forcing from a local path or URI (empty for None)."""
    if not gt_path:
        return Truth()
    from padoc_ray.storage import StorageConfig, read_bytes

    return truth_from_json(read_bytes(gt_path, storage or StorageConfig()))


# ---- matching batch rows with ground-truth pages ------------------------------------------------------

def row_label(row: Mapping) -> str:
    base = os.path.basename(str(row.get("source_uri") or "?"))
    return f"{base}_{row.get('page_index')}" if base.lower().endswith(".pdf") else base


@dataclass
class Matched:
    rows: dict[str, dict] = field(default_factory=dict)  #: page name -> its row
    document_errors: list[dict] = field(default_factory=list)  #: rows with page_index < 0 (or no source)
    unmatched: list[dict] = field(default_factory=list)  #: rows matching no ground-truth page
    duplicated: list[str] = field(default_factory=list)  #: pages several rows matched


def match_rows(rows: Iterable[dict], index: TruthIndex) -> Matched:
    """Page rows to ground-truth pages; when several rows match a page the latest ``processed_at`` wins."""
    out = Matched()
    for row in rows:
        if not row.get("source_uri") or (row.get("page_index") is not None and row["page_index"] < 0):
            out.document_errors.append(row)
            continue
        name = index.page_of(row)
        if name is None:
            out.unmatched.append(row)
            continue
        if name in out.rows:
            out.duplicated.append(name)
            old, new = out.rows[name].get("processed_at"), row.get("processed_at")
            if new is None or (old is not None and new <= old):
                continue
        out.rows[name] = row
    return out
