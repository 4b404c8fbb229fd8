"""Check a corpus' ground truth against its PDFs' own text layer (pypdfium2).

For every GT page with a text layer:

* **coverage**: every text-layer rectangle (``textpage.count_rects()`` / ``get_rect(i)``), mapped
  into the GT pixel space (display orientation after /Rotate, scaled to ``page_info`` width and
  height), should lie inside GT boxes; coverage = covered rectangle area / total rectangle area,
  and a page passes at ``>= min_coverage`` (0.95). Rectangles pdfium reports with zero height (text
  in a font it cannot load, e.g. the non-embedded STSong-Light on a machine without CJK fonts)
  are given the height of the characters' loose boxes (from the font descriptor's ascent/descent);
* **text**: for every region whose content is text or an HTML table, the text-layer characters
  whose loose boxes are centred in its box (in text-layer order) equal the annotated text (tags
  stripped for tables) once all whitespace is removed (line breaks become spaces or nothing
  depending on the producer, so whitespace carries no signal);
* **geometry**: the page's rendered size at ``page_info.dpi`` equals the annotated width and
  height (and so does the page image in ``images/``, where there is one), and no two GT boxes
  overlap.

Scanned pages (``page_info.scanned``) have no text layer: they are skipped, counted, and reported
as skipped; a scanned page that *does* have a text layer is a failure. Formulas (drawn as vector
outlines) and figures carry no text layer and are not text-checked. This module does not check that
the pixels of an image look like the GT (that takes a renderer with every font; see the tests' ink
check for rotated pages).
"""

from __future__ import annotations

import html as html_lib
import json
import math
import os
import re
from dataclasses import dataclass, field

TEXT_FORMATS = ("text", "html")


def norm(text: str) -> str:
    return "".join(text.split())


def html_text(s: str) -> str:
    return html_lib.unescape(re.sub(r"<[^>]+>", "", s))


def _bounds(poly) -> tuple[float, float, float, float]:
    xs, ys = poly[0::2], poly[1::2]
    return min(xs), min(ys), max(xs), max(ys)


def _inter(a, b) -> float:
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return w * h if w > 0 and h > 0 else 0.0


class PageMap:
    """PDF user space <-> GT pixel space of one page, following pdfium's display of /Rotate."""

    def __init__(self, page, width_px: float, height_px: float):
        self.rot = page.get_rotation() % 360
        self.cx0, self.cy0, self.cx1, self.cy1 = page.get_cropbox()
        self.w_disp, self.h_disp = page.get_size()  # already swapped for /Rotate 90/270
        self.sx, self.sy = width_px / self.w_disp, height_px / self.h_disp

    def to_display(self, x: float, y: float) -> tuple[float, float]:
        r = self.rot
        if r == 90:
            return y - self.cy0, x - self.cx0
        if r == 180:
            return self.cx1 - x, y - self.cy0
        if r == 270:
            return self.cy1 - y, self.cx1 - x
        return x - self.cx0, self.cy1 - y

    def from_display(self, X: float, Y: float) -> tuple[float, float]:
        r = self.rot
        if r == 90:
            return Y + self.cx0, X + self.cy0
        if r == 180:
            return self.cx1 - X, Y + self.cy0
        if r == 270:
            return self.cx1 - Y, self.cy1 - X
        return X + self.cx0, self.cy1 - Y

    def rect_to_px(self, l: float, b: float, r: float, t: float) -> tuple[float, float, float, float]:
        (X0, Y0), (X1, Y1) = self.to_display(l, b), self.to_display(r, t)
        return (min(X0, X1) * self.sx, min(Y0, Y1) * self.sy, max(X0, X1) * self.sx, max(Y0, Y1) * self.sy)

    def px_to_rect(self, box) -> tuple[float, float, float, float]:
        """Pixel box -> (left, bottom, right, top) in PDF user space."""
        (x0, y0), (x1, y1) = self.from_display(box[0] / self.sx, box[1] / self.sy), \
            self.from_display(box[2] / self.sx, box[3] / self.sy)
        return min(x0, x1), min(y0, y1), max(x0, x1), max(y0, y1)


@dataclass
class PageCheck:
    source: str
    page_no: int
    scanned: bool
    rects: int = 0
    coverage: float | None = None  # None for skipped pages
    text_regions: int = 0
    text_matched: int = 0
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class VerifyReport:
    pages: list[PageCheck]
    min_coverage: float

    @property
    def text_pages(self) -> list[PageCheck]:
        return [p for p in self.pages if not p.scanned]

    @property
    def ok(self) -> bool:
        return bool(self.pages) and all(p.ok for p in self.pages)

    def summary(self) -> dict:
        tp = self.text_pages
        covs = [p.coverage for p in tp if p.coverage is not None]
        return {
            "pages": len(self.pages),
            "text_pages": len(tp),
            "scanned_skipped": len(self.pages) - len(tp),
            "coverage_min": round(min(covs), 4) if covs else None,
            "coverage_mean": round(sum(covs) / len(covs), 4) if covs else None,
            "pages_below_min_coverage": sum(1 for c in covs if c < self.min_coverage),
            "text_rects": sum(p.rects for p in tp),
            "text_regions": sum(p.text_regions for p in tp),
            "text_matched": sum(p.text_matched for p in tp),
            "failed_pages": sum(1 for p in self.pages if not p.ok),
            "ok": self.ok,
        }


def _chars(tp) -> list[tuple[str, tuple, tuple]]:
    """(char, tight box, loose box) in PDF user space for every non-whitespace char of the layer."""
    n = tp.count_chars()
    full = tp.get_text_range(0, n) if n else ""
    out = []
    for i in range(n):
        ch = full[i] if len(full) == n else tp.get_text_range(i, 1)
        if not ch or ch.isspace() or ch in "\x00\ufffe\ufeff":
            continue
        out.append((ch, tp.get_charbox(i), tp.get_charbox(i, loose=True)))
    return out


def _rects_px(tp, pm: PageMap, chars) -> list[tuple[float, float, float, float]]:
    """Text-layer rectangles in GT pixels. A degenerate one (zero height or width: a font pdfium
    could not load) takes the union of its characters' loose boxes."""
    out = []
    for i in range(tp.count_rects()):
        l, b, r, t = tp.get_rect(i)
        if t - b < 0.5 or r - l < 0.5:
            inside = [lo for _, ti, lo in chars
                      if l - 0.6 <= ti[0] and ti[2] <= r + 0.6 and b - 0.6 <= ti[1] and ti[3] <= t + 0.6]
            if inside:
                l, b = min(min(x[0] for x in inside), l), min(min(x[1] for x in inside), b)
                r, t = max(max(x[2] for x in inside), r), max(max(x[3] for x in inside), t)
        out.append(pm.rect_to_px(l, b, r, t))
    return out


def check_page(pdf, gt_page: dict, min_coverage: float = 0.95, image_dir: str | None = None) -> PageCheck:
    info = gt_page["page_info"]
    pc = PageCheck(info.get("source_pdf", "?"), int(info["page_no"]), bool(info.get("scanned", False)))
    if image_dir and info.get("image_path"):
        path = os.path.join(image_dir, os.path.basename(info["image_path"]))
        if os.path.exists(path):
            from PIL import Image

            with Image.open(path) as im:
                if im.size != (round(float(info["width"])), round(float(info["height"]))):
                    pc.problems.append(f"image {info['image_path']} is {im.size}, "
                                       f"GT says {info['width']}x{info['height']}")
    if pc.page_no >= len(pdf):
        pc.problems.append(f"page {pc.page_no} does not exist (the PDF has {len(pdf)})")
        return pc
    page = pdf[pc.page_no]
    try:
        W, H = float(info["width"]), float(info["height"])
        pm = PageMap(page, W, H)
        dpi = info.get("dpi")
        if dpi:
            want = (math.ceil(pm.w_disp * (dpi / 72)), math.ceil(pm.h_disp * (dpi / 72)))  # as pypdfium2 renders
            if want != (round(W), round(H)):
                pc.problems.append(f"rendered size at {dpi} dpi is {want}, GT says {(W, H)}")
        boxes = [_bounds(d["poly"]) for d in gt_page["layout_dets"]]
        for i in range(len(boxes)):
            for j in range(i + 1, len(boxes)):
                a, b = boxes[i], boxes[j]
                small = min((a[2] - a[0]) * (a[3] - a[1]), (b[2] - b[0]) * (b[3] - b[1]))
                if small > 0 and _inter(a, b) > 0.01 * small:
                    pc.problems.append(f"GT boxes {i} and {j} overlap")
        tp = page.get_textpage()
        try:
            n_chars = tp.count_chars()
            if pc.scanned:
                if n_chars:
                    pc.problems.append(f"scanned page has a text layer ({n_chars} chars)")
                return pc
            chars = _chars(tp)
            rects = _rects_px(tp, pm, chars)
            pc.rects = len(rects)
            total = covered = 0.0
            for r in rects:
                rr = (r[0], r[1], max(r[2], r[0] + 1.0), max(r[3], r[1] + 1.0))
                area = (rr[2] - rr[0]) * (rr[3] - rr[1])
                got = min(area, sum(_inter(rr, b) for b in boxes))
                total += area
                covered += got
                if got < 0.5 * area and len(pc.problems) < 8:
                    l, b_, r_, t = pm.px_to_rect(rr)
                    pc.problems.append(f"text {tp.get_text_bounded(l, b_, r_, t)!r:.60} at "
                                       f"{tuple(round(v) for v in r)} is outside every GT box")
            pc.coverage = covered / total if total else 1.0
            if pc.coverage < min_coverage:
                pc.problems.append(f"coverage {pc.coverage:.3f} < {min_coverage}")
            # each char goes to the GT box holding the centre of its loose box, in text-layer order
            owner_text: dict[int, list[str]] = {}
            for ch, _, lo in chars:
                x0, y0, x1, y1 = pm.rect_to_px(*lo)
                cx, cy = (x0 + x1) / 2, (y0 + y1) / 2
                for k, b in enumerate(boxes):
                    if b[0] <= cx <= b[2] and b[1] <= cy <= b[3]:
                        owner_text.setdefault(k, []).append(ch)
                        break
            for k, det in enumerate(gt_page["layout_dets"]):
                fmt = next((f for f in TEXT_FORMATS if f in det), None)
                if fmt is None:
                    continue
                want = norm(html_text(det[fmt]) if fmt == "html" else det[fmt])
                got = "".join(owner_text.get(k, []))
                pc.text_regions += 1
                if got == want:
                    pc.text_matched += 1
                elif len(pc.problems) < 12:
                    pc.problems.append(f"{det['category_type']} text differs: GT {want[:50]!r} vs PDF {got[:50]!r}")
        finally:
            tp.close()
    finally:
        page.close()
    return pc


def verify_corpus(corpus_dir: str, gt_path: str | None = None, pdf_dir: str | None = None,
                  min_coverage: float = 0.95, limit: int | None = None) -> VerifyReport:
    """Verify ``corpus_dir/gt.json`` against ``corpus_dir/pdfs`` (or the given paths), and the sizes of
    the page images in ``corpus_dir/images`` where they exist."""
    import pypdfium2 as pdfium

    gt_path = gt_path or os.path.join(corpus_dir, "gt.json")
    pdf_dir = pdf_dir or os.path.join(corpus_dir, "pdfs")
    with open(gt_path, encoding="utf-8") as f:
        gt = json.load(f)
    if not isinstance(gt, list):
        raise ValueError(f"{gt_path}: expected a JSON list of pages")
    if limit is not None:
        gt = gt[:limit]
    checks: list[PageCheck] = []
    open_name, pdf = None, None
    try:
        for g in gt:
            name = g.get("page_info", {}).get("source_pdf")
            if name is None:
                pc = PageCheck("?", int(g.get("page_info", {}).get("page_no", -1)), False)
                pc.problems.append("page_info.source_pdf missing")
                checks.append(pc)
                continue
            if name != open_name:
                if pdf is not None:
                    pdf.close()
                pdf, open_name = None, name
                try:
                    pdf = pdfium.PdfDocument(os.path.join(pdf_dir, name))
                except (pdfium.PdfiumError, FileNotFoundError, OSError) as e:
                    pdf = None
                    err = f"cannot open {name}: {e}"
            if pdf is None:
                pc = PageCheck(name, int(g["page_info"].get("page_no", -1)), False)
                pc.problems.append(err)
                checks.append(pc)
                continue
            checks.append(check_page(pdf, g, min_coverage, os.path.join(corpus_dir, "images")))
    finally:
        if pdf is not None:
            pdf.close()
    return VerifyReport(checks, min_coverage)
