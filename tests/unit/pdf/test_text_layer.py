"""A page's text layer (padoc_ray.pdf.page_text_layer) and what drafts are made of
(padoc_ray.protocol.text_layer): boxes on the displayed page, the trust verdict, the caps."""

from __future__ import annotations

import io

import numpy as np
import pytest

from padoc_ray.pdf import RenderConfig, open_document, open_pdf, page_text_layer, render_page
from padoc_ray.protocol.page import Box
from padoc_ray.protocol.text_layer import ABSENT, UNTRUSTED, USED, TextLayer, region_text, trust
from tests.helpers.pdf_factory import image_only_pdf, png_page, text_pdf

LINE = "Page 1: some text for the parser."


@pytest.mark.parametrize("rotate", [0, 90])
def test_the_characters_sit_where_the_rendered_page_shows_their_ink(rotate):
    data = text_pdf(1, size=(792, 612) if rotate else (612, 792), rotate=rotate)
    doc = open_pdf(data)
    layer = page_text_layer(doc, 0)
    assert layer.text == LINE and not layer.truncated and trust(layer) == USED
    ink = np.asarray(render_page(doc, 0, RenderConfig(longest_side=800)).image.convert("L")) < 128
    ys, xs = np.nonzero(ink)
    h, w = ink.shape
    boxes = np.array([b for b in layer.boxes if any(b)])
    want = (xs.min() / w, ys.min() / h, xs.max() / w, ys.max() / h)
    got = (boxes[:, 0].min(), boxes[:, 1].min(), boxes[:, 2].max(), boxes[:, 3].max())
    assert np.allclose(got, want, atol=0.01), (got, want)  # a /Rotate page too: the displayed page's frame
    around = Box(*(v + d for v, d in zip(want, (-0.01, -0.01, 0.01, 0.01))))
    assert region_text(layer, around) == LINE
    assert region_text(layer, Box(0.0, 0.8, 1.0, 1.0) if not rotate else Box(0.8, 0.0, 1.0, 1.0)) == ""


def test_a_scan_and_an_image_have_no_text_layer():
    assert trust(page_text_layer(open_pdf(image_only_pdf()), 0)) == ABSENT
    assert page_text_layer(open_document(png_page()), 0) is None and trust(None) == ABSENT


def test_a_page_with_more_characters_than_the_cap_is_read_to_the_cap():
    from reportlab.pdfgen import canvas

    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=(612, 792), invariant=1)
    c.setFont("Helvetica", 4)
    for row in range(60):
        c.drawString(10, 780 - 12 * row, "x" * 200)
    c.showPage()
    c.save()
    layer = page_text_layer(open_pdf(buf.getvalue()), 0, max_chars=500)
    assert len(layer.text) == 500 and layer.truncated
    whole = page_text_layer(open_pdf(buf.getvalue()), 0)
    assert whole.text.count("x") == 12_000 and not whole.truncated


def _layer(text: str) -> TextLayer:
    return TextLayer(text, tuple((0.1, 0.1, 0.2, 0.2) for _ in text))


def test_broken_encodings_are_untrusted_and_whitespace_is_absent():
    assert trust(_layer("An ordinary sentence of a born-digital page.")) == USED
    assert trust(_layer("\ue001\ue002\ue003 abc def ghi")) == UNTRUSTED  # private-use glyph codes
    assert trust(_layer("(cid:12)(cid:7)(cid:40) more text here and there")) == UNTRUSTED
    assert trust(_layer("text \ufffd\ufffd\ufffd with replacement characters")) == UNTRUSTED
    assert trust(_layer("bell\x07\x07\x07 and escapes \x1b\x1b")) == UNTRUSTED
    assert trust(_layer("English and עברית and العربية mixed")) == USED  # mixed directions are text
    assert trust(_layer(" \n\t ")) == ABSENT


def test_lines_are_joined_hyphenated_words_rejoined_and_a_draft_is_bounded():
    brk = (0.0, 0.0, 0.0, 0.0)
    text = "A hyphen-\r\nated word\r\nand a line."
    boxes = []
    for i, ch in enumerate(text):
        boxes.append(brk if ch in "\r\n" else (0.1 + 0.01 * (i % 30), 0.1, 0.11 + 0.01 * (i % 30), 0.12))
    layer = TextLayer(text, tuple(boxes))
    assert region_text(layer, Box(0, 0, 1, 1)) == "A hyphenated word and a line."
    assert region_text(layer, Box(0, 0, 1, 1), max_chars=6) == "A hyph"
    back = TextLayer.from_bytes(layer.to_bytes())  # float32 boxes: a row's compact form
    assert back.text == layer.text and np.allclose(back.boxes, layer.boxes, atol=1e-6) and len(layer.to_bytes()) < 600
    odd = TextLayer("𝔸b\x00", ((0.1, 0.2, 0.3, 0.4),) * 3, truncated=True)
    assert TextLayer.from_bytes(odd.to_bytes()).text == odd.text and TextLayer.from_bytes(odd.to_bytes()).truncated
    with pytest.raises(ValueError, match="2 characters but 1 boxes"):
        TextLayer("ab", ((0, 0, 0, 0),))


@pytest.mark.parametrize("profile", ["academic", "report"])
def test_text_regions_of_generated_pages_read_back_as_their_truth(tmp_path, profile):
    """The draft text (region_text over each region's box) of generated born-digital pages, per category,
    against the generator's exact truth: every text-like region's draft is its content, token for token;
    tables (HTML) and formulas (LaTeX) are not drafted from the text layer (their markup is not in it)."""
    from collections import Counter

    from padoc_ray.cli import main
    from padoc_ray.groundtruth import load_truth

    out = tmp_path / "corpus"
    assert main(["corpus", "generate", "--out", str(out), "--pages", "6", "--profile", profile, "--workers", "1"]) == 0
    truth = load_truth(str(out / "gt.json"))
    checked, per_category = 0, Counter()
    docs = {}
    for (name, page_no), page in sorted(truth.items()):
        if name not in docs:
            docs[name] = open_pdf((out / "pdfs" / name).read_bytes())
        layer = page_text_layer(docs[name], page_no)
        assert trust(layer) == USED, (name, page_no)
        for r in page.regions:
            if r.content_format != "text" or not r.content:
                continue
            assert region_text(layer, r.box) == r.content, (name, page_no, r.category)
            checked += 1
            per_category[r.category] += 1
    assert checked >= 20 and {"title", "text_block"} <= set(per_category), per_category
