"""`padoc-ray show`: the page re-rendered at the row's size, boxes where the row says, errors clear."""

from __future__ import annotations

import datetime as dt
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from padoc_ray.pdf import doc_id_of
from padoc_ray.output.rows import PAGE_SCHEMA
from padoc_ray.output.show import ShowError, category_color, show_page

from tests.helpers.pdf_factory import text_pdf
from tests.helpers.cli import run_cli

W, H = 306, 396  # the row's image size: a 612x792 pt page rendered at longest side 396


def _row(doc_id, uri, page, regions, status="ok"):
    base = {f.name: None for f in PAGE_SCHEMA}
    base.update(run_id="r1", processed_at=dt.datetime.now(dt.timezone.utc), doc_id=doc_id, source_uri=uri,
                page_index=page, page_count=2, status=status, image_width=W, image_height=H, regions=regions)
    return base


def _region(order, cat, box):
    return {"order": order, "category": cat, "bbox": box, "content": "x", "content_format": "text",
            "finish_reason": "stop", "tokens": 3, "errors": []}


@pytest.fixture()
def output(tmp_path):
    pdf = tmp_path / "two.pdf"
    data = text_pdf(pages=2)
    pdf.write_bytes(data)
    did = doc_id_of(data)
    regions = [_region(0, "title", [0.1, 0.1, 0.5, 0.2]), _region(1, "table", [0.2, 0.5, 0.9, 0.9])]
    rows = [_row(did, str(pdf), 0, regions), _row(did, str(pdf), 1, [], status="runaway")]
    os.makedirs(tmp_path / "out" / "pages")
    pq.write_table(pa.Table.from_pylist(rows, schema=PAGE_SCHEMA), tmp_path / "out" / "pages" / "a.parquet")
    gt = [{"page_info": {"page_no": 0, "width": 612, "height": 792, "image_path": "two.pdf_0.jpg"},
           "layout_dets": [{"category_type": "title", "poly": [61, 79, 306, 79, 306, 158, 61, 158], "order": 1,
                            "text": "x"}]}]
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    return tmp_path, did


def test_boxes_are_drawn_where_the_row_puts_them(output):
    tmp, did = output
    info = show_page(str(tmp / "out"), did[:10], 0, str(tmp / "p.png"))
    img = Image.open(tmp / "p.png").convert("RGB")
    assert info["predicted"] == 2 and info["truth"] is None
    assert img.width == W
    bar = max(20, H // 40)
    # the table's outline: right edge at x = 0.9 W, halfway down the box
    x, y = int(0.9 * W) - 1, bar + int(0.7 * H)
    assert img.getpixel((x, y)) == category_color("table")
    # a point inside no box stays page-white
    assert img.getpixel((int(0.05 * W), bar + int(0.4 * H))) == (255, 255, 255)


def test_truth_beside_prediction(output):
    tmp, did = output
    info = show_page(str(tmp / "out"), "two.pdf", 0, str(tmp / "p.png"), gt=str(tmp / "gt.json"))
    img = Image.open(tmp / "p.png").convert("RGB")
    assert info["truth"] == 1 and img.width == 2 * W + 10
    bar = max(20, H // 40)
    # the truth's title box (left edge at 61/612 of the width) in the right-hand panel
    x = W + 10 + round(61 / 612 * W)
    assert img.getpixel((x, bar + int(0.15 * H))) == category_color("title")


def test_errors_are_specific(output):
    tmp, did = output
    with pytest.raises(ShowError, match="no document matches"):
        show_page(str(tmp / "out"), "nope", 0, str(tmp / "p.png"))
    with pytest.raises(ShowError, match="pages present: \\[0, 1\\]"):
        show_page(str(tmp / "out"), did, 5, str(tmp / "p.png"))
    with pytest.raises(ShowError, match="no ground-truth page"):
        show_page(str(tmp / "out"), did, 1, str(tmp / "p.png"), gt=str(tmp / "gt.json"))
    with pytest.raises(ShowError, match="no page rows"):
        show_page(str(tmp / "empty"), did, 0, str(tmp / "p.png"))


def test_cli_exit_codes(output, capsys):
    tmp, did = output
    ok = run_cli(capsys, "show", str(tmp / "out"), "--doc", did, "--page", "0", "--out", str(tmp / "c.png"))
    assert ok.returncode == 0 and "2 predicted regions" in ok.stdout and (tmp / "c.png").exists()
    bad = run_cli(capsys, "show", str(tmp / "out"), "--doc", did, "--page", "3", "--out", str(tmp / "d.png"))
    assert bad.returncode == 2 and "no row for page 3" in bad.stderr and not (tmp / "d.png").exists()
