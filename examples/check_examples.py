#!/usr/bin/env python3
"""Check the sample PDFs against ground_truth.json using pypdfium2's text layer.

For every page listed in the ground truth:

* the PDF page exists and its size matches the annotated pixel size at 2x;
* every text rectangle of pdfium's text layer, mapped to the 2x top-down pixel
  space, lies inside at least one ground-truth box (with a small tolerance);
* every ground-truth box contains at least one text rectangle (no empty box);
* the text of every text region is found in the page text, both sides
  whitespace-normalized.

Also checks that each PDF has exactly as many pages as the ground truth lists.
Optionally draws the boxes of one page on a rendering (``--draw``).
Exits 1 on any failure.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import defaultdict
from pathlib import Path

import pypdfium2 as pdfium

SCALE = 2.0
TEXT_KEYS = ("text",)
COLORS = {
    "title": "red",
    "text_block": "blue",
    "table": "green",
    "table_caption": "darkgreen",
    "equation_isolated": "magenta",
    "equation_caption": "purple",
    "header": "orange",
    "footer": "orange",
    "page_number": "brown",
}


def norm(text: str) -> str:
    return " ".join(text.split())


def bounds(poly: list[float]) -> tuple[float, float, float, float]:
    xs, ys = poly[0::2], poly[1::2]
    return min(xs), min(ys), max(xs), max(ys)


def inside(rect, box, tol: float) -> bool:
    return (rect[0] >= box[0] - tol and rect[1] >= box[1] - tol
            and rect[2] <= box[2] + tol and rect[3] <= box[3] + tol)


def overlaps(rect, box) -> bool:
    return rect[0] < box[2] and rect[2] > box[0] and rect[1] < box[3] and rect[3] > box[1]


def check_page(page, gt_page: dict, tol: float) -> tuple[list[str], dict]:
    errors: list[str] = []
    info = gt_page["page_info"]
    label = f"{info['source_pdf']} page {info['page_no']}"
    width, height = page.get_size()
    if (round(width * SCALE), round(height * SCALE)) != (info["width"], info["height"]):
        errors.append(f"{label}: size {width}x{height} pt does not match {info['width']}x{info['height']} px")
    boxes = [bounds(det["poly"]) for det in gt_page["layout_dets"]]

    textpage = page.get_textpage()
    page_text = norm(textpage.get_text_range())
    n_rects = textpage.count_rects()
    covered = 0
    rects = []
    for i in range(n_rects):
        left, bottom, right, top = textpage.get_rect(i)
        rect = (left * SCALE, (height - top) * SCALE, right * SCALE, (height - bottom) * SCALE)
        rects.append(rect)
        if any(inside(rect, box, tol) for box in boxes):
            covered += 1
        else:
            text = textpage.get_text_bounded(left, bottom, right, top)
            errors.append(f"{label}: text rect {tuple(round(v, 1) for v in rect)} {text!r} is in no GT box")

    found = 0
    n_text = 0
    non_empty = 0
    for det, box in zip(gt_page["layout_dets"], boxes):
        if any(overlaps(rect, box) for rect in rects):
            non_empty += 1
        else:
            errors.append(f"{label}: GT {det['category_type']} box {box} holds no text")
        if "text" in det:
            n_text += 1
            if norm(det["text"]) in page_text:
                found += 1
            else:
                errors.append(f"{label}: GT text not found in page text: {det['text']!r}")
    textpage.close()
    stats = {"rects": n_rects, "covered": covered, "regions": len(boxes), "non_empty": non_empty,
             "texts": n_text, "found": found}
    return errors, stats


def draw(pdf_dir: Path, gt: list[dict], target: str, out: Path) -> None:
    from PIL import ImageDraw

    name, _, page_no = target.partition(":")
    page_no = int(page_no or 0)
    gt_page = next(p for p in gt if p["page_info"]["source_pdf"] == name
                   and p["page_info"]["page_no"] == page_no)
    pdf = pdfium.PdfDocument(str(pdf_dir / name))
    image = pdf[page_no].render(scale=SCALE).to_pil().convert("RGB")
    canvas = ImageDraw.Draw(image)
    for det in gt_page["layout_dets"]:
        box = bounds(det["poly"])
        color = COLORS.get(det["category_type"], "black")
        canvas.rectangle(box, outline=color, width=2)
        canvas.text((box[0] + 2, box[1] - 11), f"{det['category_type']} {det['order']}", fill=color)
    image.save(out)
    pdf.close()
    print(f"drew {len(gt_page['layout_dets'])} boxes of {name} page {page_no} on {out}")


def main(argv: list[str] | None = None) -> int:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser(description="Check the sample PDFs against their ground truth.")
    parser.add_argument("--dir", type=Path, default=here,
                        help="folder holding the PDFs and ground_truth.json (default: this script's folder)")
    parser.add_argument("--gt", type=Path, default=None,
                        help="ground truth file (default: DIR/ground_truth.json)")
    parser.add_argument("--tol", type=float, default=4.0, help="tolerance in pixels (default: 4)")
    parser.add_argument("--draw", metavar="PDF[:PAGE]", default=None,
                        help="also render this page (e.g. report.pdf:0) with its GT boxes")
    parser.add_argument("--draw-out", type=Path, default=Path("/tmp/example_check.png"),
                        help="where --draw writes its PNG (default: /tmp/example_check.png)")
    args = parser.parse_args(argv)

    gt_path = args.gt or args.dir / "ground_truth.json"
    gt = json.loads(gt_path.read_text(encoding="utf-8"))
    by_pdf: dict[str, list[dict]] = defaultdict(list)
    for gt_page in gt:
        by_pdf[gt_page["page_info"]["source_pdf"]].append(gt_page)

    errors: list[str] = []
    totals = defaultdict(int)
    for name, gt_pages in by_pdf.items():
        pdf = pdfium.PdfDocument(str(args.dir / name))
        n_pages = len(pdf)
        page_nos = sorted(p["page_info"]["page_no"] for p in gt_pages)
        if page_nos != list(range(n_pages)):
            errors.append(f"{name}: PDF has {n_pages} pages, ground truth lists {page_nos}")
        for gt_page in gt_pages:
            page_no = gt_page["page_info"]["page_no"]
            if page_no >= n_pages:
                continue
            page = pdf[page_no]
            page_errors, stats = check_page(page, gt_page, args.tol)
            page.close()
            errors.extend(page_errors)
            for key, value in stats.items():
                totals[key] += value
            print(f"{name} page {page_no}: text rects in a GT box {stats['covered']}/{stats['rects']}, "
                  f"GT boxes holding text {stats['non_empty']}/{stats['regions']}, "
                  f"GT texts found {stats['found']}/{stats['texts']}")
        pdf.close()
    print(f"total: {sum(len(v) for v in by_pdf.values())} pages in {len(by_pdf)} PDFs, "
          f"text rects in a GT box {totals['covered']}/{totals['rects']}, "
          f"GT boxes holding text {totals['non_empty']}/{totals['regions']}, "
          f"GT texts found {totals['found']}/{totals['texts']}")

    if args.draw:
        draw(args.dir, gt, args.draw, args.draw_out)

    if errors:
        for error in errors:
            print("FAIL:", error, file=sys.stderr)
        return 1
    print("OK")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
