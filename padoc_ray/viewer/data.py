"""What the viewer reads from a batch output: the ``documents/`` table whole, ``pages/`` by row group.

The documents table (one row per input) is small next to ``pages/`` and answers the table view:
counts, filters, search and paging. A document's pages are found through the Parquet row-group
statistics of ``source_uri``: each file's footer is read once (files a commit record proves
complete are not checked again, see :func:`padoc_ray.output.reader.page_files`), and a view reads
only the row groups whose ``[min, max]`` holds the document, with a filter. ``pages/`` is never
read whole.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from padoc_ray import status
from padoc_ray.output.reader import page_files, pages_uri_of
from padoc_ray.storage import StorageConfig, filesystem, is_s3, join

PAGE_SIZE = 50  #: documents per page of the table


class ViewerInputError(Exception):
    """An OUTPUT the viewer cannot show (no documents table, unreadable)."""


@dataclass(frozen=True)
class DocQuery:
    """A view of the documents table: filters, file-name search, paging."""

    status: str | None = None
    error_code: str | None = None
    q: str | None = None  #: case-insensitive substring of the file name
    page: int = 0  #: 0-based page of the table


class Output:
    """One batch output, opened read-only."""

    def __init__(self, output: str, storage: StorageConfig | None = None):
        self.output = output.rstrip("/") if is_s3(output) else os.path.abspath(output)
        self.storage = storage or StorageConfig()
        self.pages_uri = pages_uri_of(self.output)
        docs_uri = join(self.output, "documents", "documents.parquet")
        fs, path = filesystem(docs_uri, self.storage)
        try:
            self.documents = pq.read_table(path, filesystem=fs)
        except FileNotFoundError:
            raise ViewerInputError(f"no documents table at {docs_uri} (OUTPUT is a padoc-ray batch output; a run "
                                   "writes it when it finishes)") from None
        except (OSError, pa.ArrowInvalid) as e:
            raise ViewerInputError(f"cannot read {docs_uri}: {e}") from None
        need = {"source_uri", "doc_id", "status", "error_code", "page_count", "pages_selected"}
        if missing := need - set(self.documents.column_names):
            raise ViewerInputError(f"{docs_uri} is not a padoc-ray documents table (no {', '.join(sorted(missing))})")
        self.names = pc.replace_substring_regex(self.documents.column("source_uri"), r"^.*/", "")
        self._index: tuple[list[str], np.ndarray, np.ndarray, list, list] | None = None
        self._lock = threading.Lock()

    # ---- the documents table ---------------------------------------------------------------------
    def counts(self, column: str) -> list[tuple[str, int]]:
        """(value, documents) of ``status`` or ``error_code``, most first ("" for null)."""
        vc = pc.value_counts(pc.fill_null(self.documents.column(column), "")).to_pylist()
        return sorted(((v["values"], v["counts"]) for v in vc), key=lambda x: (-x[1], x[0]))

    def select(self, q: DocQuery) -> tuple[list[dict], int]:
        """The rows of the table page ``q`` asks for, and how many documents match."""
        t, mask = self.documents, None
        for col, want in (("status", q.status), ("error_code", q.error_code)):
            if want:
                m = pc.equal(pc.fill_null(t.column(col), ""), "" if want == "-" else want)
                mask = m if mask is None else pc.and_(mask, m)
        if q.q:
            m = pc.match_substring(self.names, q.q, ignore_case=True)
            mask = m if mask is None else pc.and_(mask, m)
        if mask is not None:
            t = t.filter(mask)
        return t.slice(max(0, q.page) * PAGE_SIZE, PAGE_SIZE).to_pylist(), t.num_rows

    def document(self, uri: str) -> dict | None:
        t = self.documents.filter(pc.equal(self.documents.column("source_uri"), uri))
        return t.to_pylist()[0] if t.num_rows else None

    # ---- pages/, by row group --------------------------------------------------------------------
    def _row_groups(self):
        """(files, file number, row group, min, max of source_uri) of every row group, from footers (once)."""
        with self._lock:
            if self._index is None:
                found = page_files(self.pages_uri, self.storage)
                files, fno, rgs, lo, hi = found.good, [], [], [], []
                for k, f in enumerate(files):
                    md = pq.ParquetFile(f, filesystem=found.fs).metadata
                    col = md.schema.to_arrow_schema().get_field_index("source_uri")
                    for g in range(md.num_row_groups):
                        st = md.row_group(g).column(col).statistics
                        ok = st is not None and st.has_min_max
                        fno.append(k)
                        rgs.append(g)
                        lo.append(st.min if ok else "")
                        hi.append(st.max if ok else "\U0010ffff")
                self._fs = found.fs
                self._index = (files, np.array(fno, np.int64), np.array(rgs, np.int64), pa.array(lo, pa.string()),
                               pa.array(hi, pa.string()))
            return self._index

    def warm(self) -> None:
        """Read the footers now (a background thread at start), so the first page view is quick."""
        self._row_groups()

    def page_rows(self, uri: str) -> list[dict]:
        """The current rows of document ``uri``: the newest row per page of its newest version (as
        :func:`padoc_ray.output.reader.pages_by_source` picks them), by page index."""
        files, fno, rgs, lo, hi = self._row_groups()
        if not files:
            return []
        hit = np.flatnonzero(pc.and_(pc.less_equal(lo, uri), pc.greater_equal(hi, uri)).to_numpy(zero_copy_only=False))
        parts = []
        for k in sorted(set(fno[hit].tolist())):
            groups = rgs[hit][fno[hit] == k].tolist()
            t = pq.ParquetFile(files[k], filesystem=self._fs).read_row_groups(groups)
            parts.append(t.filter(pc.equal(t.column("source_uri"), uri)))
        rows = sorted((r for p in parts for r in p.to_pylist()), key=lambda r: r["processed_at"])
        newest = next((r["doc_id"] for r in reversed(rows) if r["doc_id"]), None)
        out: dict[int, dict] = {}
        for r in rows:
            if r["doc_id"] and r["doc_id"] != newest:
                continue  # a row of an older version of the file
            r.setdefault("spans", None)
            out[r["page_index"]] = r
        return [out[i] for i in sorted(out)]


def lost_pages(doc: dict, rows: list[dict]) -> tuple[list[int], int]:
    """(0-based pages of ``doc`` that failed, how many selected pages have no row at all)."""
    failed = sorted(r["page_index"] for r in rows if r["page_index"] >= 0 and r["status"] != status.OK)
    written = sum(1 for r in rows if r["page_index"] >= 0)
    doc_error = any(r["page_index"] < 0 for r in rows)
    return failed, 0 if doc_error else max(0, (doc.get("pages_selected") or 0) - written)
