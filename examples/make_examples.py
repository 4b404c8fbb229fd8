#!/usr/bin/env python3
"""Generate small sample PDFs with exact layout ground truth.

Writes these files into the output folder (default: the folder holding this
script):

* ``report.pdf`` - 2 pages: title, section headings, wrapped paragraphs, a
  table drawn as a real grid, a running header and page numbers.
* ``paper.pdf`` - 2 pages: title, authors, paragraphs, two display formulas
  (``E = mc^2`` and ``a^2 + b^2 = c^2`` with superscripts drawn in a smaller
  font with a raised baseline), equation numbers, a table with a caption and
  page numbers.
* ``memo.pdf`` - 1 page: title, header fields, bullet paragraphs and a footer.
* ``ground_truth.json`` - one entry per page in the OmniDocBench ground-truth
  format.  Coordinates are pixels of the page rendered at 2x (144 DPI, so a
  612 x 792 pt letter page is 1224 x 1584 px) with y measured from the top.
  Every box is the union of the font ascent/descent boxes of what was drawn
  for that region (grid lines for tables), padded by 2 pt on every side.

Everything is drawn with the reportlab canvas API and the standard 14 fonts
only, and the canvas is created with ``invariant=1``, so running the script
twice gives byte-identical files.
"""
from __future__ import annotations

import argparse
import html
import json
import math
from dataclasses import dataclass
from pathlib import Path

from reportlab.lib.pagesizes import letter
from reportlab.pdfbase.pdfmetrics import getAscentDescent, stringWidth
from reportlab.pdfgen import canvas

PAGE_W, PAGE_H = letter  # 612 x 792 pt
SCALE = 2.0  # ground truth pixel space: the page rendered at 144 DPI
PAD = 2.0  # pt of padding around every region box
LEFT = 72.0
RIGHT = PAGE_W - 72.0
TOP = PAGE_H - 72.0
BOTTOM = 72.0
TEXT_WIDTH = RIGHT - LEFT

# Categories whose content is stored under "text" (the rest: equation_isolated
# uses "latex", table uses "html").
TEXT_CATEGORIES = (
    "title",
    "text_block",
    "table_caption",
    "equation_caption",
    "header",
    "footer",
    "page_number",
)
# Page furniture: no reading order.
UNORDERED = ("header", "footer", "page_number")

Box = tuple[float, float, float, float]  # x0, y0, x1, y1 in PDF points, y up


@dataclass
class Region:
    category: str
    box: Box  # unpadded, PDF points, y from the bottom
    key: str  # "text", "latex" or "html"
    value: str


def union(boxes: list[Box]) -> Box:
    return (
        min(b[0] for b in boxes),
        min(b[1] for b in boxes),
        max(b[2] for b in boxes),
        max(b[3] for b in boxes),
    )


def wrap(text: str, font: str, size: float, width: float, first_width: float | None = None) -> list[str]:
    """Greedy word wrap measured with the font's real advance widths."""
    lines: list[str] = []
    current = ""
    limit = width if first_width is None else first_width
    for word in text.split():
        trial = word if not current else current + " " + word
        if current and stringWidth(trial, font, size) > limit:
            lines.append(current)
            current = word
            limit = width
        else:
            current = trial
    if current:
        lines.append(current)
    return lines


class DocBuilder:
    """Draws flowing content on a reportlab canvas and records its regions."""

    def __init__(
        self,
        path: Path,
        header: str | None = None,
        page_numbers: bool = False,
        footer: str | None = None,
    ) -> None:
        self.path = path
        self.canvas = canvas.Canvas(str(path), pagesize=letter, invariant=1)
        self.header = header
        self.page_numbers = page_numbers
        self.footer = footer
        self.pages: list[list[Region]] = []
        self.y = TOP  # top edge of the free space on the current page
        self._start_page()

    # -- low level -----------------------------------------------------
    def _draw(self, x: float, baseline: float, text: str, font: str, size: float) -> Box:
        """Draw one string; return its box from the font ascent/descent."""
        self.canvas.setFont(font, size)
        self.canvas.drawString(x, baseline, text)
        ascent, descent = getAscentDescent(font, size)
        return (x, baseline + descent, x + stringWidth(text, font, size), baseline + ascent)

    def _add(self, category: str, box: Box, key: str, value: str) -> None:
        self.pages[-1].append(Region(category, box, key, value))

    def _furniture(self, category: str, text: str, baseline: float, font: str, size: float, align: str) -> None:
        width = stringWidth(text, font, size)
        x = LEFT if align == "left" else (PAGE_W - width) / 2
        self._add(category, self._draw(x, baseline, text, font, size), "text", text)

    def _start_page(self) -> None:
        self.pages.append([])
        self.y = TOP
        if self.header:
            self._furniture("header", self.header, PAGE_H - 42, "Helvetica", 9, "left")

    def _finish_page(self) -> None:
        if self.page_numbers:
            self._furniture("page_number", f"Page {len(self.pages)}", 40, "Helvetica", 9, "center")
        if self.footer:
            self._furniture("footer", self.footer, 40, "Times-Italic", 9, "center")

    def new_page(self) -> None:
        self._finish_page()
        self.canvas.showPage()
        self._start_page()

    def ensure(self, height: float) -> None:
        if self.y - height < BOTTOM:
            self.new_page()

    def save(self) -> list[list[Region]]:
        self._finish_page()
        self.canvas.showPage()
        self.canvas.save()
        return self.pages

    # -- content -------------------------------------------------------
    def paragraph(
        self,
        text: str,
        font: str = "Times-Roman",
        size: float = 11,
        leading: float = 14,
        category: str = "text_block",
        align: str = "left",
        prefix: str = "",
        space_before: float = 0,
        space_after: float = 8,
    ) -> None:
        """Wrap and draw a paragraph as one region.

        ``prefix`` (e.g. a bullet) is drawn at the start of the first line and
        the following lines get a hanging indent of the prefix's width.
        """
        indent = stringWidth(prefix, font, size)
        lines = wrap(text, font, size, TEXT_WIDTH - indent)
        lines[0] = prefix + lines[0]
        ascent, descent = getAscentDescent(font, size)
        self.y -= space_before
        self.ensure(ascent - descent + (len(lines) - 1) * leading)
        baseline = self.y - ascent
        boxes = []
        for i, line in enumerate(lines):
            width = stringWidth(line, font, size)
            if align == "center":
                x = (PAGE_W - width) / 2
            else:
                x = LEFT + (indent if i else 0)
            boxes.append(self._draw(x, baseline, line, font, size))
            if i < len(lines) - 1:
                baseline -= leading
        self._add(category, union(boxes), "text", " ".join(lines))
        self.y = baseline + descent - space_after

    def heading(self, text: str, size: float = 13) -> None:
        self.paragraph(text, font="Helvetica-Bold", size=size, leading=size * 1.2,
                       category="title", space_before=6, space_after=6)

    def equation(self, segments: list[tuple[str, str, float, float]], latex: str, label: str) -> None:
        """Draw a centred display formula and its right-aligned number.

        ``segments`` are ``(text, font, size, rise)``; a superscript is a
        segment in a smaller font with a positive rise.
        """
        top = max(rise + getAscentDescent(font, size)[0] for _, font, size, rise in segments)
        bottom = min(rise + getAscentDescent(font, size)[1] for _, font, size, rise in segments)
        space = 8
        self.ensure(space + top - bottom + space)
        baseline = self.y - space - top
        total = sum(stringWidth(t, font, size) for t, font, size, _ in segments)
        x = (PAGE_W - total) / 2
        boxes = []
        for text, font, size, rise in segments:
            boxes.append(self._draw(x, baseline + rise, text, font, size))
            x += stringWidth(text, font, size)
        self._add("equation_isolated", union(boxes), "latex", latex)
        label_font, label_size = "Times-Roman", 11
        label_x = RIGHT - stringWidth(label, label_font, label_size)
        self._add("equation_caption", self._draw(label_x, baseline, label, label_font, label_size), "text", label)
        self.y = baseline + bottom - space - 6

    def table(
        self,
        rows: list[list[str]],
        col_widths: list[float],
        size: float = 10,
        row_height: float = 18,
        caption: str | None = None,
    ) -> None:
        """Draw a full grid with cell text; optional caption above it."""
        height = len(rows) * row_height
        caption_lines = 0
        if caption:
            caption_lines = len(wrap(caption, "Helvetica-Bold", 10, TEXT_WIDTH))
        self.ensure(height + 6 + caption_lines * 13 + 6)
        if caption:
            self.paragraph(caption, font="Helvetica-Bold", size=10, leading=13,
                           category="table_caption", space_after=6)
        total = sum(col_widths)
        x0 = (PAGE_W - total) / 2
        xs = [x0]
        for w in col_widths:
            xs.append(xs[-1] + w)
        top = self.y - 4
        ys = [top - i * row_height for i in range(len(rows) + 1)]
        self.canvas.setLineWidth(0.6)
        self.canvas.grid(xs, ys)
        cell_pad = 5
        for r, row in enumerate(rows):
            font = "Helvetica-Bold" if r == 0 else "Helvetica"
            ascent, descent = getAscentDescent(font, size)
            baseline = ys[r] - row_height / 2 - (ascent + descent) / 2
            for c, cell in enumerate(row):
                width = stringWidth(cell, font, size)
                if width > col_widths[c] - 2 * cell_pad:
                    raise ValueError(f"cell {cell!r} does not fit its column")
                self._draw(xs[c] + cell_pad, baseline, cell, font, size)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(cell, quote=False)}</td>" for cell in row) + "</tr>"
            for row in rows
        )
        self._add("table", (xs[0], ys[-1], xs[-1], ys[0]), "html", f"<table>{body}</table>")
        self.y = ys[-1] - 12


# --- the three documents ----------------------------------------------------

def make_report(path: Path) -> list[list[Region]]:
    doc = DocBuilder(path, header="Document Processing Team - Quarterly Operations Report", page_numbers=True)
    doc.paragraph("Quarterly Operations Report", font="Helvetica-Bold", size=20, leading=24,
                  category="title", align="center", space_after=6)
    doc.paragraph("Third quarter, prepared by the document processing team", font="Helvetica",
                  size=11, align="center", space_after=14)
    doc.heading("1. Summary")
    doc.paragraph(
        "This report summarizes how the document processing service performed during the third "
        "quarter. The service accepts scanned and born-digital files from internal teams, extracts "
        "their text, tables and formulas, and returns structured output that downstream tools can "
        "search and index. Volume grew steadily through the quarter while the error rate stayed "
        "within the agreed limits."
    )
    doc.paragraph(
        "Most of the growth came from two new customers in the finance group, who send long "
        "statements with many small tables. These files stress the table detector more than the "
        "narrative reports that made up most of the traffic last year, and they exposed a handful "
        "of problems that are described in the sections below."
    )
    doc.heading("2. Throughput")
    doc.paragraph(
        "The table below lists the number of pages processed each month, the median time spent on "
        "a single page, and the share of pages that needed a manual review. Review rates fell in "
        "September after the new table model was deployed."
    )
    doc.table(
        [
            ["Month", "Pages", "Median time (s)", "Reviewed"],
            ["July", "48,210", "1.8", "4.1%"],
            ["August", "52,775", "1.7", "3.8%"],
            ["September", "61,430", "1.6", "2.9%"],
            ["Total", "162,415", "1.7", "3.5%"],
        ],
        [110, 90, 110, 90],
    )
    doc.paragraph(
        "Processing time per page improved slightly each month even though volume rose, mostly "
        "because more files were rendered in parallel on the new servers."
    )
    doc.new_page()
    doc.heading("3. Quality")
    doc.paragraph(
        "Quality is measured on a fixed sample of two hundred pages that were checked by hand. For "
        "each page the reviewers compare the extracted reading order, the recognized text and the "
        "reconstructed tables with the original document. The edit distance on plain text improved "
        "from 0.061 to 0.048 over the quarter."
    )
    doc.paragraph(
        "Tables remain the weakest area. Cells that span several rows are often split into separate "
        "cells, and headers printed in a light gray are sometimes dropped. Both problems are known "
        "and fixes are scheduled for the next release."
    )
    doc.heading("4. Outlook")
    doc.paragraph(
        "Next quarter the team will focus on formulas and multi-column layouts, which together "
        "account for most of the open complaints. We also plan to publish the evaluation sample so "
        "that other groups can reproduce the figures in this report."
    )
    doc.paragraph(
        "Questions about this report can be sent to the document processing team through the usual "
        "support channel."
    )
    return doc.save()


def make_paper(path: Path) -> list[list[Region]]:
    doc = DocBuilder(path, page_numbers=True)
    doc.paragraph("A Short Note on Measuring Layout Accuracy", font="Helvetica-Bold", size=17,
                  leading=21, category="title", align="center", space_after=6)
    doc.paragraph("J. Rivera and M. Okafor", font="Times-Italic", size=12, align="center",
                  space_after=16)
    doc.heading("Abstract", size=12)
    doc.paragraph(
        "We describe a small set of test documents whose layout is known exactly because the "
        "documents were generated by a program. Such files make it easy to check a parser for "
        "regressions: every title, paragraph, formula and table has a known position and content."
    )
    doc.heading("1. Introduction")
    doc.paragraph(
        "Layout analysis splits a page into regions and assigns each region a type. A well known "
        "example of a formula that a parser must keep intact is the relation between mass and "
        "energy, where the exponent is printed as a raised superscript in a smaller font:"
    )
    ti, tr, big, small, rise = "Times-Italic", "Times-Roman", 14, 9, 6
    doc.equation(
        [("E", ti, big, 0), (" = ", tr, big, 0), ("mc", ti, big, 0), ("2", tr, small, rise)],
        "E = m c^{2}",
        "(1)",
    )
    doc.paragraph(
        "A second example is the theorem of Pythagoras. It contains three superscripts on one "
        "line, so a parser that drops or lowers small raised digits will produce a visibly wrong "
        "result:"
    )
    doc.equation(
        [
            ("a", ti, big, 0), ("2", tr, small, rise), (" + ", tr, big, 0),
            ("b", ti, big, 0), ("2", tr, small, rise), (" = ", tr, big, 0),
            ("c", ti, big, 0), ("2", tr, small, rise),
        ],
        "a^{2} + b^{2} = c^{2}",
        "(2)",
    )
    doc.paragraph(
        "Both formulas are numbered at the right margin. The numbers are separate regions, because "
        "a reader expects to find them next to the formula rather than inside it."
    )
    doc.new_page()
    doc.heading("2. Results")
    doc.paragraph(
        "We ran a baseline parser over the test documents and measured how well its regions "
        "overlap the known regions. Table 1 reports the mean overlap for each region type."
    )
    doc.table(
        [
            ["Region type", "Count", "Mean overlap"],
            ["Title", "12", "0.94"],
            ["Paragraph", "31", "0.91"],
            ["Formula", "4", "0.78"],
            ["Table", "3", "0.85"],
        ],
        [140, 80, 110],
        caption="Table 1: Mean box overlap by region type.",
    )
    doc.paragraph(
        "Formulas score lowest because the raised superscripts are often left outside the "
        "predicted box, which cuts off the top of the region."
    )
    doc.heading("3. Conclusion")
    doc.paragraph(
        "Generated documents are no replacement for real scans, but they are cheap, exact and "
        "easy to extend, which makes them a good first check for any change to a parser."
    )
    return doc.save()


def make_memo(path: Path) -> list[list[Region]]:
    doc = DocBuilder(path, footer="Internal use only. Please do not forward outside the company.")
    doc.paragraph("MEMORANDUM", font="Helvetica-Bold", size=18, leading=22, category="title",
                  space_after=14)
    for line in (
        "To: All project staff",
        "From: Operations office",
        "Date: 14 March 2024",
        "Subject: Changes to the build schedule",
    ):
        doc.paragraph(line, font="Helvetica", size=11, space_after=5)
    doc.y -= 10
    doc.paragraph(
        "Starting next month the nightly builds will move to a new schedule. Please read the "
        "points below and tell your team lead if any of them affect your work."
    )
    for item in (
        "Nightly builds will start at 01:00 instead of 23:00, so that they no longer compete with "
        "late test runs for the shared machines.",
        "Build results will be posted to the team channel by 06:00 each morning.",
        "Failed builds will be retried once automatically before anyone is notified.",
        "The weekend full rebuild stays on Saturday and is not affected by this change.",
    ):
        doc.paragraph(item, prefix="\u2022 ", space_after=6)
    doc.paragraph("Thank you for your patience while the new schedule settles in.", space_before=4)
    return doc.save()


DOCUMENTS = (
    # file name, builder, expected page count
    ("report.pdf", make_report, 2),
    ("paper.pdf", make_paper, 2),
    ("memo.pdf", make_memo, 1),
)


# --- ground truth -------------------------------------------------------------

def to_poly(box: Box) -> list[int]:
    """Pad a PDF-point box and map it to the top-down 2x pixel space."""
    x0, y0, x1, y1 = box
    width_px, height_px = PAGE_W * SCALE, PAGE_H * SCALE
    left = max(0, math.floor((x0 - PAD) * SCALE))
    right = min(width_px, math.ceil((x1 + PAD) * SCALE))
    top = max(0, math.floor((PAGE_H - y1 - PAD) * SCALE))
    bottom = min(height_px, math.ceil((PAGE_H - y0 + PAD) * SCALE))
    left, right, top, bottom = int(left), int(right), int(top), int(bottom)
    return [left, top, right, top, right, bottom, left, bottom]


def page_entries(pdf_name: str, pages: list[list[Region]]) -> list[dict]:
    stem = Path(pdf_name).stem
    entries = []
    for page_no, regions in enumerate(pages):
        dets = []
        order = 0
        for anno_id, region in enumerate(regions):
            det = {
                "category_type": region.category,
                "poly": to_poly(region.box),
                "ignore": False,
                "order": None,
                "anno_id": anno_id,
                region.key: region.value,
            }
            if region.category not in UNORDERED:
                order += 1
                det["order"] = order
            dets.append(det)
        entries.append({
            "page_info": {
                "page_no": page_no,
                "width": int(PAGE_W * SCALE),
                "height": int(PAGE_H * SCALE),
                "image_path": f"{stem}_page{page_no}.png",
                "source_pdf": pdf_name,
            },
            "layout_dets": dets,
        })
    return entries


def generate(out_dir: Path) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    ground_truth: list[dict] = []
    written = []
    for name, build, expected_pages in DOCUMENTS:
        path = out_dir / name
        pages = build(path)
        if len(pages) != expected_pages:
            raise RuntimeError(f"{name}: laid out {len(pages)} pages, expected {expected_pages}")
        ground_truth.extend(page_entries(name, pages))
        written.append(path)
    gt_path = out_dir / "ground_truth.json"
    with open(gt_path, "w", encoding="utf-8") as fh:
        json.dump(ground_truth, fh, indent=1, ensure_ascii=False, sort_keys=True)
        fh.write("\n")
    written.append(gt_path)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Write report.pdf, paper.pdf, memo.pdf and ground_truth.json "
                    "(OmniDocBench layout format, 2x pixel space) deterministically.",
    )
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent,
                        help="output folder (default: the folder holding this script)")
    args = parser.parse_args(argv)
    for path in generate(args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
