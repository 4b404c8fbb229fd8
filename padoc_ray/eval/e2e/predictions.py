"""Predicted Markdown per ground-truth page: from a folder of ``.md`` files or from padoc-ray batch
output (Parquet ``pages/*.parquet`` rows with ``markdown``, ``source_uri``, ``page_index``).

Page matching. Markdown files: as the upstream evaluator, ``<image stem>.md`` (also ``.mmd``, the
stem without ``.pdf``, or ``<image name>.md``). Parquet rows: an image source matches the ground-truth
page with that image basename (or stem); a PDF row matches ``<pdf basename>_<page_index>`` (the
OmniDocBench image naming) or a page whose ``page_info`` has ``source_pdf`` and ``page_no`` equal to
the PDF's basename and the row's 0-based page index. Several rows for one page: the latest
``processed_at`` wins.

A page without a prediction, or whose prediction cannot be read, is evaluated as an empty page
(as upstream does for a missing file) and reported; predictions that match no ground-truth page
are reported and ignored. Only an unusable *input path* raises :class:`E2EInputError`.
"""

from __future__ import annotations

import glob
import os

from padoc_ray import status
from padoc_ray.eval.e2e.gt import E2EInputError, GtPage, Problem
from padoc_ray.groundtruth import TruthIndex, match_rows, row_label


def _md_candidates(folder: str, name: str) -> list[str]:
    stem = os.path.splitext(name)[0]
    return [os.path.join(folder, stem + ".md"), os.path.join(folder, stem.replace(".pdf", "") + ".mmd"),
            os.path.join(folder, stem.replace(".pdf", "") + ".md"), os.path.join(folder, name + ".md")]


def load_markdown_dir(folder: str, pages: list[GtPage]) -> tuple[dict[str, str | None], list[Problem]]:
    """``{page name: markdown, or None when missing/unreadable}`` and the problems found."""
    if not os.path.isdir(folder):
        raise E2EInputError(f"prediction folder not found: {folder}")
    out: dict[str, str | None] = {}
    problems: list[Problem] = []
    used: set[str] = set()
    for page in pages:
        path = next((p for p in _md_candidates(folder, page.name) if os.path.exists(p)), None)
        if path is None:
            out[page.name] = None
            problems.append(Problem(page.name, "missing_prediction", "no Markdown file for this page "
                                                                     "(evaluated as an empty page)"))
            continue
        used.add(os.path.abspath(path))
        try:
            with open(path, encoding="utf-8") as f:
                out[page.name] = f.read()
        except (OSError, UnicodeDecodeError) as e:
            out[page.name] = None
            problems.append(Problem(page.name, "prediction", f"cannot read {os.path.basename(path)}: "
                                                             f"{type(e).__name__}: {e} (evaluated as an empty page)"))
    for path in sorted(glob.glob(os.path.join(folder, "*.md")) + glob.glob(os.path.join(folder, "*.mmd"))):
        if os.path.abspath(path) not in used:
            problems.append(Problem(os.path.basename(path), "extra_prediction",
                                    "Markdown file matches no ground-truth page (ignored)"))
    return out, problems


# --------------------------------------------------------------------------------------------------
# Parquet

def read_parquet_rows(path: str) -> list[dict]:
    from padoc_ray.output.reader import RowsInputError, read_rows

    try:
        return read_rows(path, None, ["source_uri", "page_index", "markdown", "status", "error_code", "processed_at"],
                         required=["source_uri", "markdown"], must_exist=True).to_pylist()
    except RowsInputError as e:
        raise E2EInputError(str(e)) from None


def rows_to_markdown(rows: list[dict], pages: list[GtPage]) -> tuple[dict[str, str | None], list[Problem]]:
    m = match_rows(rows, TruthIndex((p.name, p.source) for p in pages))
    problems: list[Problem] = []
    for row in m.document_errors:
        problems.append(Problem(row_label(row), "extra_prediction",
                                f"document error row ({row.get('error_code') or row.get('status')}) ignored"))
    for row in m.unmatched:
        problems.append(Problem(row_label(row), "extra_prediction", "row matches no ground-truth page (ignored)"))
    for name in m.duplicated:
        problems.append(Problem(name, "prediction", "several rows for this page; the latest processed_at is used"))
    chosen = m.rows
    out: dict[str, str | None] = {}
    for page in pages:
        row = chosen.get(page.name)
        if row is None:
            out[page.name] = None
            problems.append(Problem(page.name, "missing_prediction",
                                    "no row for this page (evaluated as an empty page)"))
            continue
        md = row.get("markdown")
        if row.get("status") not in (None, status.OK):
            code = f" ({row['error_code']})" if row.get("error_code") else ""
            problems.append(Problem(page.name, "prediction", f"prediction status {row.get('status')!r}{code}"))
        if not isinstance(md, str):
            out[page.name] = None
            problems.append(Problem(page.name, "prediction", "markdown is null (evaluated as an empty page)"))
            continue
        out[page.name] = md
    return out, problems


def load_parquet(path: str, pages: list[GtPage]) -> tuple[dict[str, str | None], list[Problem]]:
    return rows_to_markdown(read_parquet_rows(path), pages)
