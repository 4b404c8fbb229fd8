"""Reading padoc-ray batch output (``pages/*.parquet``) as predictions for ground-truth pages.

Shared by the layout and end-to-end evaluations. A page row is matched to a ground-truth page by
image basename (the row's source is the page image itself), or, for a PDF row, by
``<pdf basename>_<page_index>.<image ext>`` (OmniDocBench's naming) or by ``page_info.source_pdf``
+ ``page_no``. When several rows match one page, the latest ``processed_at`` wins.
"""

from __future__ import annotations

import glob
import os
from dataclasses import dataclass, field
from typing import Any, Iterable

IMAGE_EXTS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".tif", ".tiff")


class RowsInputError(Exception):
    """A path that holds no readable padoc-ray page rows."""


def parquet_files(path: str) -> list[str]:
    if os.path.isfile(path):
        return [path]
    if not os.path.isdir(path):
        raise RowsInputError(f"prediction path not found: {path}")
    for pattern in ("pages/*.parquet", "*.parquet", "**/*.parquet"):
        files = sorted(glob.glob(os.path.join(path, pattern), recursive=True))
        if files:
            return files
    raise RowsInputError(f"no Parquet files under {path} (expected pages/*.parquet of a padoc-ray batch output)")


def read_page_rows(path: str, columns: Iterable[str], required: Iterable[str]) -> list[dict]:
    """The ``columns`` (those present) of every row under ``path``; ``required`` ones must exist."""
    import pyarrow.parquet as pq

    want, need = list(columns), list(required)
    rows: list[dict] = []
    for f in parquet_files(path):
        try:
            pf = pq.ParquetFile(f)
            cols = [c for c in want if c in pf.schema_arrow.names]
            missing = [c for c in need if c not in cols]
            if missing:
                raise RowsInputError(f"{f} is not padoc-ray page output (needs {', '.join(need)} columns)")
            rows.extend(pf.read(columns=cols).to_pylist())
        except RowsInputError:
            raise
        except Exception as e:  # pyarrow raises several types for a corrupt or non-Parquet file
            raise RowsInputError(f"cannot read Parquet file {f}: {e}") from None
    return rows


def pdf_source(page_info: dict) -> tuple[str, int] | None:
    """(source_pdf basename, page_no) of a ground-truth page_info, when it names both."""
    pdf, page_no = page_info.get("source_pdf"), page_info.get("page_no")
    if not isinstance(pdf, str) or not pdf or isinstance(page_no, bool):
        return None
    try:
        return os.path.basename(pdf), int(page_no)
    except (TypeError, ValueError):
        return None


def row_label(row: dict) -> str:
    base = os.path.basename(str(row.get("source_uri") or "?"))
    return f"{base}_{row.get('page_index')}" if base.lower().endswith(".pdf") else base


class PageIndex:
    """Lookup of ground-truth page names by everything a batch row can be matched with."""

    def __init__(self, pages: Iterable[tuple[str, tuple[str, int] | None]]):
        """``pages``: (page name = image basename, (source_pdf basename, page_no) or None)."""
        self._idx: dict[Any, str] = {}
        for name, source in pages:
            self._idx.setdefault(name, name)
            stem, ext = os.path.splitext(name)
            if ext.lower() in IMAGE_EXTS:
                self._idx.setdefault(("stem", stem), name)
            if source is not None:
                self._idx.setdefault(("pdf", *source), name)

    def page_of(self, row: dict) -> str | None:
        base = os.path.basename(str(row.get("source_uri") or "").rstrip("/"))
        if base.lower().endswith(".pdf"):
            i = row.get("page_index")
            for key in (("stem", f"{base}_{i}"), ("pdf", base, i)):
                if key in self._idx:
                    return self._idx[key]
            return None
        return self._idx.get(base) or self._idx.get(("stem", os.path.splitext(base)[0]))


@dataclass
class Matched:
    rows: dict[str, dict] = field(default_factory=dict)  #: page name -> its row
    document_errors: list[dict] = field(default_factory=list)  #: rows with page_index < 0 (or no source)
    unmatched: list[dict] = field(default_factory=list)  #: rows matching no ground-truth page
    duplicated: list[str] = field(default_factory=list)  #: pages several rows matched


def match_rows(rows: Iterable[dict], index: PageIndex) -> Matched:
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
