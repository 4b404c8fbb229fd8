"""`padoc-ray show`: draw one parsed page, its predicted regions and optionally the ground truth.

The page image is re-rendered from the row's ``source_uri`` at the row's own image size (the batch
job does not store images), so boxes, normalized to 0-1, land where the model saw them. Boxes are
coloured by category and numbered in reading order; with ground truth the two pages are drawn side
by side (prediction left, truth right) under a legend of the categories present.
"""

from __future__ import annotations

import colorsys
import os
from dataclasses import dataclass

from padoc_ray.protocol.spec import DEFAULT_CATEGORIES


class ShowError(Exception):
    """A page that cannot be shown (not found, ambiguous id, unreadable source)."""


def category_color(category: str) -> tuple[int, int, int]:
    """A stable, distinct colour per category (hue spread over the spec's category order)."""
    names = list(DEFAULT_CATEGORIES)
    i = names.index(category) if category in names else len(names) + (sum(map(ord, category)) % 7)
    r, g, b = colorsys.hsv_to_rgb((i * 0.618034) % 1.0, 0.85, 0.85)
    return int(r * 255), int(g * 255), int(b * 255)


@dataclass(frozen=True)
class Box:
    category: str
    x1: float  # normalized 0-1
    y1: float
    x2: float
    y2: float
    order: int | None = None


def find_row(output: str, doc: str, page: int, storage=None) -> dict:
    """The page row of ``doc`` (a doc_id, a unique doc_id prefix, or a source file name) and ``page``."""
    import pyarrow.compute as pc

    from padoc_ray.output.reader import read_rows
    from padoc_ray.storage import StorageConfig, join

    cols = ["doc_id", "source_uri", "page_index", "status", "error_code", "image_width", "image_height",
            "regions", "run_id", "processed_at"]
    t = read_rows(join(output, "pages"), storage or StorageConfig(), cols)
    if t.num_rows == 0:
        raise ShowError(f"no page rows under {join(output, 'pages')} (is this a padoc-ray batch output?)")
    ids = t.column("doc_id").to_pylist()
    names = [os.path.basename(u or "") for u in t.column("source_uri").to_pylist()]
    hits = {d for d, n in zip(ids, names) if d and (d.startswith(doc) or n == doc)}
    if not hits:
        raise ShowError(f"no document matches {doc!r} (give a doc_id, a unique prefix of one, or a file name)")
    if len(hits) > 1:
        raise ShowError(f"{doc!r} is ambiguous: {len(hits)} documents match ({', '.join(sorted(hits)[:3])}, ...)")
    did = hits.pop()
    sel = t.filter(pc.and_(pc.equal(t.column("doc_id"), did), pc.equal(t.column("page_index"), page)))
    if sel.num_rows == 0:
        have = sorted(set(t.filter(pc.equal(t.column("doc_id"), did)).column("page_index").to_pylist()))
        raise ShowError(f"document {did[:12]} has no row for page {page}; pages present: {have[:20]}")
    rows = sorted(sel.to_pylist(), key=lambda r: r["processed_at"])
    return rows[-1]  # the newest, should a page ever have been written twice


def row_boxes(row: dict) -> list[Box]:
    from padoc_ray.output.rows import page_from_row

    page = page_from_row(row, on_bad_region=lambda *_: None)  # a box that cannot be drawn is left out
    return [Box(r.category, *r.box.as_tuple(), order=r.order) for r in page.regions]


def truth_boxes(gt_path: str, source_uri: str, page_index: int, storage=None) -> list[Box] | None:
    """Ground-truth boxes for a page, matched by :mod:`padoc_ray.groundtruth`'s one rule."""
    from padoc_ray.groundtruth import load_truth

    page = load_truth(gt_path, storage).get((os.path.basename(source_uri), page_index))
    if page is None:
        return None
    return [Box(r.category, *r.box.as_tuple(), order=i) for i, r in enumerate(page.regions)]


def render_source(row: dict, storage=None):
    from padoc_ray.pdf import PdfError, RenderConfig, open_document, render_page
    from padoc_ray.storage import StorageConfig, read_bytes

    try:
        data = read_bytes(row["source_uri"], storage or StorageConfig())
    except OSError as e:
        raise ShowError(f"cannot read {row['source_uri']}: {e}") from None
    w, h = row.get("image_width"), row.get("image_height")
    try:
        doc = open_document(data)
        try:
            img = render_page(doc, row["page_index"], RenderConfig(longest_side=max(w, h)) if w and h
                              else RenderConfig()).image
        finally:
            doc.close()
    except PdfError as e:
        raise ShowError(f"cannot render {row['source_uri']} page {row['page_index']}: {e.code}: {e.message}") from None
    if w and h and img.size != (w, h):
        img = img.resize((w, h))
    return img


def draw(image, boxes: list[Box], title: str):
    """A copy of ``image`` with ``boxes`` drawn and numbered, and a title bar."""
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=max(12, image.height // 70))
    bar = max(20, image.height // 40)
    out = Image.new("RGB", (image.width, image.height + bar), "white")
    out.paste(image.convert("RGB"), (0, bar))
    d = ImageDraw.Draw(out, "RGBA")
    d.text((4, 2), title, fill="black", font=font)
    lw = max(2, image.width // 400)
    for n, b in enumerate(sorted(boxes, key=lambda b: (b.order is None, b.order if b.order is not None else 0))):
        c = category_color(b.category)
        xy = (b.x1 * image.width, bar + b.y1 * image.height, b.x2 * image.width, bar + b.y2 * image.height)
        d.rectangle(xy, outline=c + (255,), fill=c + (40,), width=lw)
        label = str(n + 1)
        tw = d.textlength(label, font=font) + 4
        x = xy[0] - tw if xy[0] >= tw else xy[0]  # left of the box when there is room: keeps the text visible
        tb = d.textbbox((x + 2, xy[1]), label, font=font)
        d.rectangle((x, tb[1] - 1, x + tw, tb[3] + 1), fill=c + (230,))
        d.text((x + 2, xy[1]), label, fill="white", font=font)
    return out


def legend(categories: list[str], width: int):
    from PIL import Image, ImageDraw, ImageFont

    font = ImageFont.load_default(size=14)
    per_row = max(1, width // 220)
    rows = -(-len(categories) // per_row) if categories else 1
    img = Image.new("RGB", (width, 8 + 22 * rows), "white")
    d = ImageDraw.Draw(img)
    for i, c in enumerate(categories):
        x, y = 8 + (i % per_row) * 220, 4 + (i // per_row) * 22
        d.rectangle((x, y + 2, x + 16, y + 18), fill=category_color(c))
        d.text((x + 22, y + 2), c, fill="black", font=font)
    return img


def show_page(output: str, doc: str, page: int, out_path: str, *, gt: str | None = None, storage=None) -> dict:
    """Write the picture; returns what was drawn (for the CLI's one-line report and for tests)."""
    from PIL import Image

    row = find_row(output, doc, page, storage)
    if row["status"] is None or row["page_index"] < 0:
        raise ShowError(f"page {page} of {row['doc_id'][:12]} has no parse (status {row['status']})")
    img = render_source(row, storage)
    pred = row_boxes(row)
    panels = [draw(img, pred, f"prediction: {len(pred)} regions, status {row['status']} "
                              f"({os.path.basename(row['source_uri'])} p{page})")]
    truth = None
    if gt:
        truth = truth_boxes(gt, row["source_uri"], page, storage)
        if truth is None:
            raise ShowError(f"no ground-truth page for {os.path.basename(row['source_uri'])} page {page} in {gt}")
        panels.append(draw(img, truth, f"ground truth: {len(truth)} regions"))
    cats = sorted({b.category for b in pred + (truth or [])}, key=lambda c: list(DEFAULT_CATEGORIES).index(c)
                  if c in DEFAULT_CATEGORIES else 99)
    width = sum(p.width for p in panels) + 10 * (len(panels) - 1)
    leg = legend(cats, width)
    canvas = Image.new("RGB", (width, max(p.height for p in panels) + leg.height), "white")
    x = 0
    for p in panels:
        canvas.paste(p, (x, 0))
        x += p.width + 10
    canvas.paste(leg, (0, canvas.height - leg.height))
    os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
    canvas.save(out_path)
    return {"doc_id": row["doc_id"], "page_index": page, "status": row["status"], "predicted": len(pred),
            "truth": None if truth is None else len(truth), "size": canvas.size, "out": out_path}
