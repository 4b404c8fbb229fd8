"""The one rule that matches ground-truth pages with source files, rows and teacher forcing."""

from __future__ import annotations

import json

import pytest

from padoc_ray.groundtruth import GroundTruthError, Truth, TruthIndex, match_rows, parse_truth, source_for


def gt_page(image_path: str, source_pdf: str | None = None, page_no: int | None = None, regions: int = 1) -> dict:
    info = {"image_path": image_path, "width": 100, "height": 200, "page_no": page_no or 0}
    if source_pdf is not None:
        info["source_pdf"] = source_pdf
    dets = [{"category_type": "text_block", "poly": [10, 10 + 20 * k, 90, 10 + 20 * k, 90, 25 + 20 * k,
                                                      10, 25 + 20 * k], "order": k, "text": f"r{k}"}
            for k in range(regions)]
    return {"layout_dets": dets, "page_info": info}


PAGES = [
    gt_page("a.png", "doc.pdf", 1),  # a PDF page named by source_pdf + page_no
    gt_page("doc.pdf_2.jpg"),  # a PDF page named the OmniDocBench way
    gt_page("scan.jpg"),  # a page image
    gt_page("photo.png_0.png", "photo.png", 0),  # an image named as its own source
    gt_page("tiff_1.png", "pages.tif", 1),  # the second frame of a multi-page image
    gt_page("dup.png", "doc.pdf", 1),  # same key as the first: the first wins
]


@pytest.fixture
def entries():
    return parse_truth(json.dumps(PAGES).encode())


def test_one_rule_for_rows_and_teacher_forcing(entries):
    idx = TruthIndex((t.name, t.source) for t in entries)
    assert idx.name_for("doc.pdf", 1) == "a.png"  # source_pdf + page_no; the duplicate loses
    assert idx.name_for("s3://b/x/doc.pdf", 2) == "doc.pdf_2.jpg"
    assert idx.name_for("scan.png", 0) == "scan.jpg"  # same stem, another format
    assert idx.name_for("photo.png", 0) == "photo.png_0.png"
    assert idx.name_for("pages.tif", 1) == "tiff_1.png" and idx.name_for("pages.tif", 2) is None
    assert idx.name_for("doc.pdf", 0) is None and idx.name_for("scan.png", 1) is None and idx.name_for(None, 0) is None
    truth = Truth(entries)
    assert truth.get(("doc.pdf", 2)) is not None and truth.get(("other.pdf", 0)) is None
    assert truth[("scan.png", 0)] is truth.pages["scan.jpg"] and len(truth) == 6
    m = match_rows([{"source_uri": "/in/doc.pdf", "page_index": 1, "processed_at": 1},
                    {"source_uri": "/in/doc.pdf", "page_index": 1, "processed_at": 2},
                    {"source_uri": "/in/doc.pdf", "page_index": -1},
                    {"source_uri": "/in/zzz.pdf", "page_index": 0}], idx)
    assert m.rows["a.png"]["processed_at"] == 2 and m.duplicated == ["a.png"]
    assert len(m.document_errors) == 1 and len(m.unmatched) == 1


def test_the_same_rule_places_ground_truth_among_source_files(entries):
    files = {"doc.pdf": "s3://b/doc.pdf", "scan.png": "/in/scan.png", "photo.png": "/in/photo.png"}
    got = {t.name: source_for(t.name, t.source, files) for t in entries}
    assert got["a.png"] == ("s3://b/doc.pdf", 1) and got["doc.pdf_2.jpg"] == ("s3://b/doc.pdf", 2)
    assert got["scan.jpg"] == ("/in/scan.png", 0) and got["photo.png_0.png"] == ("/in/photo.png", 0)
    assert got["tiff_1.png"] is None


def test_bad_ground_truth_is_reported_not_raised_per_page():
    bad = parse_truth(json.dumps([{"page_info": {"image_path": "x.png"}, "layout_dets": "nope"},
                                  gt_page("ok.png")]))
    assert bad[0].page is None and bad[0].error and bad[1].page is not None
    for data, msg in ((b"{", "not valid JSON"), (b'{"a": 1}', "must be a JSON list")):
        with pytest.raises(GroundTruthError, match=msg):
            parse_truth(data)
