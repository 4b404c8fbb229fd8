"""Other parsers' outputs as prediction sets for re-annotation (``reannotate --compare NAME=PATH``).

Every importer turns one output into a :class:`PredictionSet`: pages keyed by
``(document name, page index)`` with normalized boxes and OmniDocBench categories, plus counts of
what it had to leave out. Nothing in a foreign file stops a run: a region without a usable box or
with an unknown category is skipped and counted, a page file that cannot be read becomes a page
with status ``malformed``.

Formats (``--compare NAME=FORMAT:PATH``, or ``NAME=PATH`` to detect it):

``padoc``
    a padoc-ray batch output (a folder holding ``pages/``); document name = the source file's name.
``omnidocbench``
    an OmniDocBench-format JSON list of pages (what ``eval`` and ``train --gt`` read);
    document name = ``page_info.source_pdf`` with ``page_no``, else ``page_info.image_path`` (page 0).
``mineru``
    MinerU's ``<name>_content_list.json`` (a file, or a folder searched for them); ``bbox`` is
    MinerU 2.x's page-relative 0-1000 box, ``page_idx`` the page; document name = ``<name>``.
``dots``
    dots.ocr's layout JSON: ``<name>_page_<n>.json`` (PDF pages) or ``<name>.json`` (an image), a
    list of cells ``{"bbox": [x1, y1, x2, y2], "category": ..., "text": ...}`` in pixels of the
    page image dots.ocr saw (a PDF page rendered at ``dpi``, 200 by default, or the image itself).
    The image size comes from the ``<save name>.jpg`` dots.ocr writes next to the JSON, else from
    the source file (``page_size``). A page whose model output failed to parse (dots.ocr then saves
    the raw response string) is ``malformed``.

Category tables (to OmniDocBench's ``category_type``; anything else is counted as
``unknown_category:<name>`` and skipped):

MinerU ``type``: text (``text_level`` >= 1: title), title, image/chart -> figure, table (content
``table_body`` HTML), equation/interline_equation -> equation_isolated (LaTeX, ``$$`` stripped),
list -> text_block (``list_items`` joined), code -> code_txt (``code_body``), header, footer,
page_number, page_footnote, aside_text/discarded -> abandon, ref_text -> reference. Captions and
footnotes inside image/table blocks have no box of their own and are counted as
``caption_without_box``.

dots.ocr ``category``: Title and Section-header -> title, Text and List-item -> text_block, Picture
-> figure, Caption -> figure_caption, Table -> table (HTML), Formula -> equation_isolated (LaTeX),
Footnote -> page_footnote, Page-header -> header, Page-footer -> footer.
"""

from __future__ import annotations

import io
import json
import os
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from padoc_ray.protocol.page import Box, Page, PageFormatError, Region, page_from_omnidocbench
from padoc_ray.protocol.spec import DEFAULT_CATEGORIES

FORMATS = ("padoc", "omnidocbench", "mineru", "dots")

MINERU_CATEGORIES = {
    "title": "title", "text": "text_block", "image": "figure", "chart": "figure", "table": "table",
    "equation": "equation_isolated", "interline_equation": "equation_isolated", "list": "text_block",
    "code": "code_txt", "header": "header", "footer": "footer", "page_number": "page_number",
    "page_footnote": "page_footnote", "aside_text": "abandon", "discarded": "abandon", "ref_text": "reference",
}
DOTS_CATEGORIES = {
    "Title": "title", "Section-header": "title", "Text": "text_block", "List-item": "text_block",
    "Picture": "figure", "Caption": "figure_caption", "Table": "table", "Formula": "equation_isolated",
    "Footnote": "page_footnote", "Page-header": "header", "Page-footer": "footer",
}

PageKey = tuple[str, int]
#: (document name, page index) -> (width, height) in pixels of the page image at ``dpi``, or None
PageSize = Callable[[str, int, int], "tuple[float, float] | None"]


class PredictionSetError(ValueError):
    """A prediction set that cannot be read at all (missing path, undetectable format)."""


@dataclass
class PredictionSet:
    name: str
    format: str
    path: str
    pages: dict[PageKey, tuple[str, Page | None]] = field(default_factory=dict)  #: key -> (status, page)
    documents: dict[str, int | None] = field(default_factory=dict)  #: document name -> page count (None: unknown)
    counts: Counter = field(default_factory=Counter)  #: what was skipped, by reason
    notes: list[str] = field(default_factory=list)  #: the first few problems, spelled out

    def note(self, text: str) -> None:
        if len(self.notes) < 20:
            self.notes.append(text)

    def add(self, key: PageKey, status: str, page: Page | None) -> None:
        self.pages[key] = (status, page)
        self.documents.setdefault(key[0], None)


def parse_compare(text: str) -> tuple[str, str | None, str]:
    """``NAME=PATH`` or ``NAME=FORMAT:PATH`` -> (name, format or None, path)."""
    name, sep, rest = text.partition("=")
    if not sep or not name or not rest:
        raise ValueError(f"expected NAME=PATH or NAME=FORMAT:PATH, got {text!r}")
    fmt, sep, path = rest.partition(":")
    if sep and fmt in FORMATS and not path.startswith("//"):
        return name, fmt, path
    return name, None, rest


# ---- files, local or s3:// -------------------------------------------------------------------------
def _fs(path: str, storage):
    from padoc_ray.storage import filesystem

    return filesystem(path, storage)


def _is_dir(path: str, storage) -> bool:
    import pyarrow.fs as pafs

    fs, p = _fs(path, storage)
    return fs.get_file_info(p).type == pafs.FileType.Directory


def _files(path: str, storage) -> list[str]:
    """Every file at or below ``path`` (URIs, sorted)."""
    import pyarrow.fs as pafs

    from padoc_ray.storage import to_uri

    fs, p = _fs(path, storage)
    info = fs.get_file_info(p)
    if info.type == pafs.FileType.File:
        return [path]
    if info.type != pafs.FileType.Directory:
        raise PredictionSetError(f"{path}: no such file or folder")
    sel = fs.get_file_info(pafs.FileSelector(p, recursive=True))
    return sorted(to_uri(path, f.path) for f in sel if f.type == pafs.FileType.File)


def _read(uri: str, storage) -> bytes:
    from padoc_ray.storage import read_bytes

    return read_bytes(uri, storage)


def _json(uri: str, storage) -> Any:
    return json.loads(_read(uri, storage).decode("utf-8"))


def detect_format(path: str, storage) -> str:
    """Which importer reads ``path`` (see the module docstring); raises :class:`PredictionSetError`."""
    import pyarrow.fs as pafs

    from padoc_ray.storage import join

    fs, p = _fs(path, storage)
    if fs.get_file_info(p).type == pafs.FileType.NotFound:
        raise PredictionSetError(f"{path}: no such file or folder")
    if _is_dir(path, storage):
        if _is_dir(join(path, "pages"), storage):
            return "padoc"
        files = _files(path, storage)
        if any(f.endswith("_content_list.json") for f in files):
            return "mineru"
        if any(f.endswith(".json") for f in files):
            return "dots"
        raise PredictionSetError(f"{path}: found neither pages/, *_content_list.json nor dots.ocr *.json files")
    if path.endswith("_content_list.json"):
        return "mineru"
    if path.endswith(".json"):
        try:
            obj = _json(path, storage)
        except (OSError, ValueError) as e:
            raise PredictionSetError(f"{path}: cannot read it as JSON ({e})") from None
        if isinstance(obj, list) and obj and isinstance(obj[0], Mapping) and "page_info" in obj[0]:
            return "omnidocbench"
        if isinstance(obj, list) and (not obj or isinstance(obj[0], Mapping) and "category" in obj[0]):
            return "dots"
        raise PredictionSetError(f"{path}: a JSON file that is neither OmniDocBench pages nor dots.ocr cells")
    raise PredictionSetError(f"{path}: cannot tell its format; write NAME=FORMAT:PATH with FORMAT one of {FORMATS}")


# ---- importers -------------------------------------------------------------------------------------
def _box(vals: Any, scale_x: float, scale_y: float) -> Box | None:
    if not isinstance(vals, (list, tuple)) or len(vals) != 4:
        return None
    try:
        x1, y1, x2, y2 = (float(v) for v in vals)
    except (TypeError, ValueError):
        return None
    b = Box(x1 / scale_x, y1 / scale_y, x2 / scale_x, y2 / scale_y)
    if not (b.is_valid and b.x2 > b.x1 and b.y2 > b.y1) or b.x1 < -0.01 or b.y1 < -0.01 or b.x2 > 1.01 or b.y2 > 1.01:
        return None
    return b.clipped()


def _strip_math(s: str) -> str:
    s = s.strip()
    for a, b in (("$$", "$$"), ("\\[", "\\]"), ("$", "$")):
        if s.startswith(a) and s.endswith(b) and len(s) >= len(a) + len(b):
            return s[len(a):len(s) - len(b)].strip()
    return s


def _region(category: str, box: Box, content: str | None) -> Region:
    fmt = DEFAULT_CATEGORIES[category]
    if fmt == "latex" and content:
        content = _strip_math(content)
    return Region(category=category, box=box, content=None if fmt == "none" else (content or ""), content_format=fmt)


def load_omnidocbench(ps: PredictionSet, storage) -> None:
    try:
        objs = _json(ps.path, storage)
    except (OSError, ValueError) as e:
        raise PredictionSetError(f"{ps.path}: cannot read it as JSON ({e})") from None
    if not isinstance(objs, list):
        raise PredictionSetError(f"{ps.path}: expected a JSON list of OmniDocBench pages")
    for n, o in enumerate(objs):
        info = o.get("page_info") if isinstance(o, Mapping) else None
        if not isinstance(info, Mapping):
            ps.counts["page_without_page_info"] += 1
            continue
        pdf = os.path.basename(str(info.get("source_pdf") or ""))
        key = (pdf, int(info.get("page_no") or 0)) if pdf else (os.path.basename(str(info.get("image_path") or "")), 0)
        if not key[0]:
            ps.counts["page_without_name"] += 1
            continue
        dets = o.get("layout_dets")
        keep = []
        for det in dets if isinstance(dets, list) else []:
            if not isinstance(det, Mapping) or det.get("category_type") not in DEFAULT_CATEGORIES:
                ps.counts[f"unknown_category:{det.get('category_type') if isinstance(det, Mapping) else '?'}"] += 1
                continue
            poly = det.get("poly")
            if not (isinstance(poly, list) and len(poly) >= 4 and len(poly) % 2 == 0
                    and all(isinstance(v, (int, float)) for v in poly)):
                ps.counts["missing_box"] += 1
                continue
            keep.append(det)
        try:
            page = page_from_omnidocbench({**o, "layout_dets": keep})
        except PageFormatError as e:
            ps.counts["malformed_page"] += 1
            ps.add(key, "malformed", None)
            ps.note(f"{key[0]} page {key[1]}: {e}")
            continue
        ps.add(key, "ok", page)


def load_mineru(ps: PredictionSet, storage) -> None:
    files = [f for f in _files(ps.path, storage) if f.endswith("_content_list.json")]
    if not files:
        raise PredictionSetError(f"{ps.path}: no *_content_list.json files")
    for f in files:
        doc = os.path.basename(f)[: -len("_content_list.json")]
        try:
            blocks = _json(f, storage)
            if not isinstance(blocks, list):
                raise ValueError("not a JSON list")
        except (OSError, ValueError) as e:
            ps.counts["unreadable_file"] += 1
            ps.documents[doc] = None
            ps.note(f"{f}: {e}")
            continue
        ps.documents.setdefault(doc, None)
        per_page: dict[int, list[Region]] = {}
        for b in blocks:
            if not isinstance(b, Mapping):
                ps.counts["malformed_block"] += 1
                continue
            try:
                page_idx = int(b.get("page_idx", 0))
            except (TypeError, ValueError):
                ps.counts["malformed_block"] += 1
                continue
            per_page.setdefault(page_idx, [])
            kind = str(b.get("type") or "")
            cat = MINERU_CATEGORIES.get(kind)
            if kind == "text" and int(b.get("text_level") or 0) >= 1:
                cat = "title"
            if cat is None:
                ps.counts[f"unknown_category:{kind}"] += 1
                continue
            box = _box(b.get("bbox"), 1000.0, 1000.0)
            if box is None:
                ps.counts["missing_box"] += 1
                continue
            if kind in ("image", "chart", "table"):
                caps = [c for k in ("img_caption", "image_caption", "table_caption", "img_footnote", "image_footnote",
                                    "table_footnote") for c in (b.get(k) or [])]
                ps.counts["caption_without_box"] += len(caps)
            if kind == "table":
                content = b.get("table_body")
            elif kind == "list":
                content = "\n".join(str(x) for x in (b.get("list_items") or [])) or b.get("text")
            elif kind == "code":
                content = b.get("code_body") or b.get("text")
            else:
                content = b.get("text")
            per_page[page_idx].append(_region(cat, box, None if content is None else str(content)))
        for page_idx, regions in sorted(per_page.items()):
            ps.add((doc, page_idx), "ok", Page(width=0, height=0, regions=tuple(regions), page_no=page_idx))


_DOTS_PAGE = re.compile(r"^(?P<doc>.+)_page_(?P<n>\d+)\.json$")


def _image_size(data: bytes) -> tuple[int, int] | None:
    try:
        from PIL import Image

        with Image.open(io.BytesIO(data)) as im:
            return im.size
    except Exception:  # noqa: BLE001 - any unreadable image: fall back to the source's size
        return None


def load_dots(ps: PredictionSet, storage, page_size: PageSize | None = None, dpi: int = 200) -> None:
    files = _files(ps.path, storage)
    jsons = [f for f in files if f.endswith(".json")]
    if not jsons:
        raise PredictionSetError(f"{ps.path}: no dots.ocr *.json files")
    by_name = {f: f for f in files}
    for f in jsons:
        base = os.path.basename(f)
        m = _DOTS_PAGE.match(base)
        doc, n = (m["doc"], int(m["n"])) if m else (base[: -len(".json")], 0)
        try:
            cells = _json(f, storage)
        except (OSError, ValueError):
            ps.counts["unreadable_file"] += 1
            ps.add((doc, n), "malformed", None)
            continue
        if isinstance(cells, str):  # dots.ocr saved the raw model output: it was not valid JSON
            ps.counts["unparsed_model_output"] += 1
            ps.add((doc, n), "malformed", None)
            continue
        if not isinstance(cells, list):
            ps.counts["unreadable_file"] += 1
            ps.add((doc, n), "malformed", None)
            continue
        jpg = f[: -len(".json")] + ".jpg"
        size = _image_size(_read(jpg, storage)) if jpg in by_name else None
        if size is None and page_size is not None:
            size = page_size(doc, n, dpi)
        if size is None:
            ps.counts["page_size_unknown"] += 1
            ps.add((doc, n), "malformed", None)
            continue
        w, h = size
        regions = []
        for c in cells:
            if not isinstance(c, Mapping):
                ps.counts["malformed_block"] += 1
                continue
            cat = DOTS_CATEGORIES.get(str(c.get("category")))
            if cat is None:
                ps.counts[f"unknown_category:{c.get('category')}"] += 1
                continue
            box = _box(c.get("bbox"), w, h)
            if box is None:
                ps.counts["missing_box"] += 1
                continue
            text = c.get("text")
            regions.append(_region(cat, box, None if text is None else str(text)))
        ps.add((doc, n), "ok", Page(width=int(w), height=int(h), regions=tuple(regions), page_no=n))


def load_set(name: str, path: str, fmt: str | None, storage, *, page_size: PageSize | None = None) -> PredictionSet:
    """Read one prediction set (``fmt`` None: detected). Raises :class:`PredictionSetError` when it cannot."""
    try:
        return _load_set(name, path, fmt, storage, page_size)
    except PredictionSetError as e:
        raise PredictionSetError(f"--compare {name}: {e}") from None
    except OSError as e:
        raise PredictionSetError(f"--compare {name}: cannot read {path}: {e}") from None


def _load_set(name: str, path: str, fmt: str | None, storage, page_size: PageSize | None) -> PredictionSet:
    fmt = fmt or detect_format(path, storage)
    if fmt not in FORMATS:
        raise PredictionSetError(f"unknown format {fmt!r}; one of {FORMATS}")
    ps = PredictionSet(name, fmt, path)
    if fmt == "padoc":
        from padoc_ray.output.reader import pages_by_source

        for key, (status, page, count) in pages_by_source(path, storage).items():
            ps.add(key, status, page)
            if count is not None:
                ps.documents[key[0]] = count
    elif fmt == "omnidocbench":
        load_omnidocbench(ps, storage)
    elif fmt == "mineru":
        load_mineru(ps, storage)
    else:
        load_dots(ps, storage, page_size)
    return ps
