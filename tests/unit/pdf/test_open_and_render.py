"""PDF opening and rasterization: every bad kind of file gets its specific code."""

from __future__ import annotations

import pytest

from padoc_ray.pdf import PdfError, RenderConfig, is_repaired, iter_pages, open_pdf, render_page

from tests.helpers.pdf_factory import image_only_pdf, text_pdf, zero_page_pdf


@pytest.mark.parametrize("data, code", [
    (b"", "empty_file"),
    (b"hello world", "not_pdf"),
    (b"%PDF-1.7\n" + bytes(range(256)) * 20, "corrupt_pdf"),
    (None, "encrypted_pdf"),
    ("zero", "no_pages"),
])
def test_document_errors_have_codes(data, code):
    if data is None:
        data = text_pdf(1, encrypt="secret")
    elif data == "zero":
        data = zero_page_pdf()
    with pytest.raises(PdfError) as ei:
        open_pdf(data)
    assert ei.value.code == code


_DIAGNOSE = """
import sys
from padoc_ray.pdf import PdfError, open_pdf
try:
    open_pdf(sys.stdin.buffer.read())
except PdfError as e:
    print(e.code + "|" + e.message)
"""


def _fresh_process_diagnosis(data: bytes) -> str:
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _DIAGNOSE], input=data, capture_output=True, timeout=60)
    assert out.returncode == 0, out.stderr.decode()[-2000:]
    return out.stdout.decode().strip()


@pytest.mark.parametrize("broken", [
    b"%PDF-1.4\n%%EOF garbage",
    b"%PDF-1.7\n" + bytes(range(256)) * 20,
    text_pdf(2)[:400],
    text_pdf(2).replace(b"/Pages", b"/Pagex"),  # pdfium's stale error said "Incorrect password" here
])
def test_diagnosis_depends_on_the_bytes_alone(broken):
    """pdfium's last error is per thread and sticky: after an encrypted file, a broken one must get
    the same code and message as in a fresh process."""
    with pytest.raises(PdfError, match="encrypted_pdf"):
        open_pdf(text_pdf(1, encrypt="secret"))
    with pytest.raises(PdfError) as ei:
        open_pdf(broken)
    assert f"{ei.value.code}|{ei.value.message}" == _fresh_process_diagnosis(broken)
    assert ei.value.code == "corrupt_pdf" and "password" not in ei.value.message.lower()


def test_a_file_beyond_pdfiums_repair_is_repaired_by_qpdf():
    import pypdfium2 as pdfium

    from tests.helpers.pdf_factory import xref_broken_pdf

    good = text_pdf(3)
    broken = xref_broken_pdf(good)
    with pytest.raises(pdfium.PdfiumError):
        pdfium.PdfDocument(broken)  # pdfium alone gives up
    doc = open_pdf(broken)
    assert is_repaired(doc) and len(doc) == 3 and not is_repaired(open_pdf(good))
    cfg = RenderConfig(longest_side=300)
    for i in range(3):  # the repaired pages are the original pages
        assert render_page(doc, i, cfg).image.tobytes() == render_page(open_pdf(good), i, cfg).image.tobytes()
    with pytest.raises(PdfError, match="corrupt_pdf"):
        open_pdf(broken, repair=False)


def test_codes_do_not_leak_between_documents():
    # pdfium's last-error code is sticky per thread: an encrypted file first must not make the next
    # failure look encrypted too
    for _ in range(2):
        with pytest.raises(PdfError, match="encrypted_pdf"):
            open_pdf(text_pdf(1, encrypt="secret"))
        with pytest.raises(PdfError, match="no_pages"):
            open_pdf(zero_page_pdf())
        with pytest.raises(PdfError, match="corrupt_pdf"):
            open_pdf(b"%PDF-1.4\n%%EOF garbage")


def test_rendering_respects_size_rotation_and_guards():
    doc = open_pdf(text_pdf(1))
    p = render_page(doc, 0, RenderConfig(longest_side=800))
    assert max(p.image.size) == 800 and p.image.mode == "RGB"
    assert render_page(doc, 0, RenderConfig(dpi=72)).image.size == (612, 792)
    rot = render_page(open_pdf(text_pdf(1, size=(792, 612), rotate=90)), 0, RenderConfig(longest_side=400))
    assert rot.rotation == 90 and rot.image.size == (400, 310)  # displayed landscape (ceil of 309.1)
    import pypdfium2 as pdfium

    raw = pdfium.PdfDocument(text_pdf(1, size=(792, 612), rotate=90))[0]
    assert raw.get_rotation() == 90 and [round(v) for v in raw.get_mediabox()[2:]] == [612, 792]  # stored portrait
    with pytest.raises(PdfError, match="absurd_page_size"):
        render_page(open_pdf(text_pdf(1, size=(20000, 20000))), 0)
    with pytest.raises(PdfError, match="absurd_page_size"):
        render_page(open_pdf(text_pdf(1, size=(3, 3))), 0)
    scan = render_page(open_pdf(image_only_pdf()), 0, RenderConfig(longest_side=500))
    assert scan.image.getextrema()[0][0] == 0  # the drawn black bar is there


def test_pixel_cap_bounds_huge_renders():
    cfg = RenderConfig(dpi=1200, max_pixels=2_000_000)
    p = render_page(open_pdf(text_pdf(1)), 0, cfg)
    assert p.image.width * p.image.height <= 2_000_000 * 1.01


def test_iter_pages_yields_errors_in_place():
    doc = open_pdf(text_pdf(3))
    out = list(iter_pages(doc, [0, 7, 2], RenderConfig(longest_side=200)))
    assert [type(o).__name__ for o in out] == ["PageImage", "PdfError", "PageImage"]
    assert out[1].code == "page_load_failed"


# ---- page images are one-page documents ------------------------------------------------------------
def _image_bytes(fmt: str, size=(300, 400), frames: int = 1) -> bytes:
    import io

    from PIL import Image

    imgs = [Image.new("RGB", size, (40 * i, 255, 255)) for i in range(frames)]
    buf = io.BytesIO()
    imgs[0].save(buf, format=fmt, save_all=frames > 1, append_images=imgs[1:])
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "BMP"])
def test_an_image_is_a_one_page_document(fmt):
    from padoc_ray.pdf import open_document

    doc = open_document(_image_bytes(fmt))
    assert len(doc) == 1
    r = render_page(doc, 0, RenderConfig(longest_side=1600))
    assert r.image.size == (300, 400) and r.image.mode == "RGB"  # never enlarged
    assert render_page(doc, 0, RenderConfig(longest_side=200)).image.size == (150, 200)  # shrunk to fit
    with pytest.raises(PdfError) as ei:
        render_page(doc, 1)
    assert ei.value.code == "page_load_failed"


def test_multi_frame_tiff_has_a_page_per_frame():
    from padoc_ray.pdf import open_document

    doc = open_document(_image_bytes("TIFF", frames=3))
    assert len(doc) == 3
    assert render_page(doc, 2).image.getpixel((0, 0)) == (80, 255, 255)


def test_broken_and_huge_images_get_codes(monkeypatch):
    from PIL import Image

    from padoc_ray.pdf import open_document

    with pytest.raises(PdfError) as ei:
        open_document(b"\x89PNG\r\n\x1a\n" + bytes(100))
    assert ei.value.code == "corrupt_image"
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000)
    with pytest.raises(PdfError) as ei:
        open_document(_image_bytes("PNG"))
    assert ei.value.code == "absurd_page_size"
    # not an image and not a PDF: still not_pdf
    with pytest.raises(PdfError) as ei:
        open_document(b"plain text")
    assert ei.value.code == "not_pdf"


# ---- issue 27: the cost of a page before it is rendered, and messages without addresses ----------------
@pytest.fixture
def pdfium_refuses_pages(monkeypatch):
    """From when it is called, pdfium (in this process) refuses to load any page: AssertionError, as a
    page the draw counter must refuse would otherwise cost pdfium minutes before the test could fail."""
    import pypdfium2 as pdfium

    def refused(doc, index):
        raise AssertionError(f"pdfium was asked to load page {index}: the draw counter let it through")

    return lambda: monkeypatch.setattr(pdfium.PdfDocument, "get_page", refused)


@pytest.fixture
def content_reads(monkeypatch) -> list:
    """The content streams (a page's, a form's, ...) the draw counter reads, recorded as they are read:
    the object number of each (the reading is its work that grows with the file)."""
    import padoc_ray.pdf_draws as draws

    reads = []
    content = draws.Content

    def read(data, node):
        reads.append(node.objgen)
        return content(data, node)

    monkeypatch.setattr(draws, "Content", read)
    return reads


def _cyclic_form_pdf() -> bytes:
    """A page drawing a form that draws itself twice (a cycle), beside a 10x10 rectangle."""
    import io

    import pikepdf

    pdf = pikepdf.new()
    pdf.add_blank_page(page_size=(200, 200))
    form = pdf.make_stream(b"0 0 10 10 re f /X Do /X Do")
    form.Type, form.Subtype, form.BBox = pikepdf.Name.XObject, pikepdf.Name.Form, [0, 0, 10, 10]
    form.Resources = pikepdf.Dictionary(XObject=pikepdf.Dictionary(X=form))
    page = pdf.pages[0]
    page.obj.Resources = pikepdf.Dictionary(XObject=pikepdf.Dictionary(X=form))
    page.obj.Contents = pdf.make_stream(b"/X Do")
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()


def test_draw_counts_follow_the_nesting_and_stop_past_the_limit(content_reads):
    from padoc_ray.pdf import DrawCounter

    from tests.helpers.pdf_factory import form_bomb_pdf

    assert DrawCounter(form_bomb_pdf(1, depth=0)).page_draws(0, 10**9) == 0
    assert DrawCounter(form_bomb_pdf(1, depth=1)).page_draws(0, 10**9) == 10
    assert DrawCounter(form_bomb_pdf(1, depth=3)).page_draws(0, 10**9) == 10 + 100 + 1000
    assert DrawCounter(form_bomb_pdf(1, depth=3, fanout=2)).page_draws(0, 10**9) == 2 + 4 + 8
    # shared forms are walked once: 40 levels of 10 (10^40 draws) and 50 pages are counted at once, each
    # page's content and each of the 40 forms read once in all (not once a page, nor once a draw)
    c = DrawCounter(form_bomb_pdf(50, depth=40))
    del content_reads[:]
    assert all(c.page_draws(i, 10**60) == sum(10**k for k in range(1, 41)) for i in range(50))
    assert len(content_reads) == len(set(content_reads)) == 50 + 40, len(content_reads)
    assert 1000 < DrawCounter(form_bomb_pdf(1, depth=40)).page_draws(0, 1000) < 10**6  # the walk stops there
    assert DrawCounter(form_bomb_pdf(1, depth=3)).page_draws(5, 10) == 0  # no such page: pdfium says so
    assert DrawCounter(b"%PDF-1.4 garbage").page_draws(0, 10) == 0  # qpdf cannot read it: pdfium decides


def test_a_form_that_draws_itself_is_refused(pdfium_refuses_pages):
    """pdfium nests such a form down to its depth limit: loading this page hangs it for minutes. It
    is refused before pdfium loads it (here pdfium refuses to load any page)."""
    from padoc_ray.pdf import DrawCounter, open_pdf, render_page

    data = _cyclic_form_pdf()
    c = DrawCounter(data)
    assert c.page_draws(0, 10**9) > 10**9 and c.cyclic(0)
    doc = open_pdf(data)
    pdfium_refuses_pages()
    with pytest.raises(PdfError) as ei:
        render_page(doc, 0, RenderConfig(longest_side=200))
    assert ei.value.code == "page_too_complex" and "draws itself" in ei.value.message


def test_a_page_that_draws_too_much_is_refused_before_pdfium_loads_it(pdfium_refuses_pages):
    from padoc_ray.pdf import PAGE_TOO_COMPLEX, open_pdf, render_page

    from tests.helpers.pdf_factory import form_bomb_pdf

    doc = open_pdf(form_bomb_pdf(2, depth=7))  # pdfium loading such a page takes a minute, then aborts
    pdfium_refuses_pages()  # from here, a page pdfium is asked to load fails the test at once
    with pytest.raises(PdfError) as ei:
        render_page(doc, 1, RenderConfig(longest_side=200))
    assert ei.value.code == PAGE_TOO_COMPLEX
    assert "more than 1,000,000 XObjects" in ei.value.message and "max_page_draws" in ei.value.message
    with pytest.raises(ValueError):
        RenderConfig(max_page_draws=-1)


# ---- issue 46: what pdfium draws beside the page's content, and cycles priced by pdfium's depth limit --
def test_annotation_appearances_are_counted_as_pdfium_draws_them():
    """pdfium draws annotation appearances when it renders (pypdfium2's draw_annots is on): a form
    tree in /AP /N costs what it would cost in the page's content."""
    from functools import partial

    from padoc_ray.pdf import DrawCounter

    from tests.helpers.pdf_factory import annotation_bomb_page, drawn_pdf

    tree = 1 + 10 + 100 + 1000  # the appearance itself, then 10 draws of a 3-level tree of 10s
    c = DrawCounter(drawn_pdf(
        partial(annotation_bomb_page, depth=3),
        partial(annotation_bomb_page, depth=3, states="Bomb"),  # /AS names the state pdfium draws
        partial(annotation_bomb_page, depth=3, states="Off"),
        partial(annotation_bomb_page, depth=3, states=""),  # no /AS: the costliest state bounds it
        partial(annotation_bomb_page, depth=3, flags=2),  # Hidden: pdfium skips it
        partial(annotation_bomb_page, depth=3, flags=32),  # NoView: likewise
        partial(annotation_bomb_page, depth=6),
    ))
    assert [c.page_draws(i, 10**9) for i in range(6)] == [tree, tree, 1, tree, 0, 0]
    assert c.page_draws(6, 10**9) == 1_111_111
    assert c.page_draws(6, 10**6) > 10**6
    assert "1,111,111 in its annotations' appearance streams" in c.describe(6, 10**6)


def test_tiling_patterns_soft_masks_and_type3_glyphs_are_counted():
    """pdfium renders a tiling pattern's cell for every object painted with it (once per tile when
    the cell is larger than the area), a soft mask's group for every object painted under it,
    and a Type 3 glyph's procedure for every glyph shown: each with its own resources."""
    from functools import partial

    import pikepdf

    from padoc_ray.pdf import DrawCounter

    from tests.helpers.pdf_factory import _form, _form_tree, _page, drawn_pdf, pattern_bomb_page, type3_bomb_page

    cell = 1 + 10 + 100 + 1000  # one rendering of a cell (glyph) that draws a 3-level tree 10 times

    def soft_mask_page(pdf):
        group = _form(pdf, b" ".join([b"/X Do"] * 10), {"/X": _form_tree(pdf, 3, 10)})
        gs = pikepdf.Dictionary(Type=pikepdf.Name.ExtGState, SMask=pikepdf.Dictionary(
            Type=pikepdf.Name.Mask, S=pikepdf.Name.Alpha, G=group))
        _page(pdf, b"0 0 5 5 re f /M gs 0 0 10 10 re f 0 0 20 20 re f",
              pikepdf.Dictionary(ExtGState=pikepdf.Dictionary(M=gs)))

    c = DrawCounter(drawn_pdf(
        partial(pattern_bomb_page, depth=3, fills=2),
        partial(pattern_bomb_page, depth=3, fills=2, step=5),  # cells twice their step: 4 tiles each
        partial(type3_bomb_page, depth=3, glyphs=3),
        soft_mask_page,  # the fill before the gs is not under the mask
        partial(pattern_bomb_page, depth=6, fills=1),
        partial(type3_bomb_page, depth=6, glyphs=1),
    ))
    assert [c.page_draws(i, 10**9) for i in range(4)] == [2 * cell, 2 * 4 * cell, 3 * cell, 2 * cell]
    assert c.page_draws(4, 10**6) > 10**6 and c.page_draws(5, 10**6) > 10**6


def test_fonts_and_patterns_reach_the_forms_drawn_after_them_and_page_resources_are_found():
    """A form inherits the font and fill of the content that draws it (it may show text without
    Tf); and a content without a kind of resource finds it in the page's, as pdfium does, so a
    form with /Resources but no /XObject still draws the page's forms."""
    import pikepdf

    from padoc_ray.pdf import DrawCounter

    from tests.helpers.pdf_factory import _form, _form_tree, _page, drawn_pdf

    def inherited_font(pdf):
        proc = pdf.make_stream(b"10 0 d0 /X Do /X Do")
        font = pdf.make_indirect(pikepdf.Dictionary(
            Type=pikepdf.Name.Font, Subtype=pikepdf.Name.Type3, FontBBox=[0, 0, 10, 10],
            FontMatrix=[0.1, 0, 0, 0.1, 0, 0], FirstChar=97, LastChar=97, Widths=[10],
            Encoding=pikepdf.Dictionary(Differences=[97, pikepdf.Name.a]), CharProcs=pikepdf.Dictionary(a=proc),
            Resources=pikepdf.Dictionary(XObject=pikepdf.Dictionary(X=_form_tree(pdf, 3, 10)))))
        text = _form(pdf, b"BT (aaaa) Tj ET")  # no Tf: the font in force where it is drawn
        _page(pdf, b"/S Do BT /T 12 Tf ET /S Do", pikepdf.Dictionary(
            Font=pikepdf.Dictionary(T=font), XObject=pikepdf.Dictionary(S=text)))

    def page_fallback(pdf):
        loop = _form(pdf, b" ".join([b"/X Do"] * 10))
        loop.Resources = pikepdf.Dictionary(Font=pikepdf.Dictionary())  # no /XObject: pdfium looks in the page's
        _page(pdf, b"/L Do", pikepdf.Dictionary(XObject=pikepdf.Dictionary(L=loop, X=_form_tree(pdf, 3, 10))))

    c = DrawCounter(drawn_pdf(inherited_font, page_fallback))
    glyph = 1 + 2 * (1 + 10 + 100)
    assert c.page_draws(0, 10**9) == 1 + 1 + 4 * glyph  # the first /S Do shows its glyphs in no Type 3 font
    assert c.page_draws(1, 10**9) == 1 + 10 * (1 + 10 + 100)


def test_pdfiums_form_nesting_limit_is_the_one_the_counter_prices_cycles_with():
    """A form that draws itself once, shifted 2 pt, painting a 1 pt bar each time: pdfium paints
    exactly _FORM_LEVELS bars (kMaxFormLevel in cpdf_streamcontentparser.cpp). If a pypdfium2
    upgrade changes that, the cycle pricing must follow."""
    import numpy as np
    import pikepdf

    from padoc_ray.pdf import DrawCounter
    from padoc_ray.pdf_draws import _FORM_LEVELS

    from tests.helpers.pdf_factory import _page, drawn_pdf

    def self_drawing(pdf):
        f = pdf.make_stream(b"1 0 0 1 2 0 cm 0 0 1 10 re f /X Do")
        f.Type, f.Subtype, f.BBox = pikepdf.Name.XObject, pikepdf.Name.Form, [-1000, -1000, 1000, 1000]
        f.Resources = pikepdf.Dictionary(XObject=pikepdf.Dictionary(X=f))
        _page(pdf, b"/X Do", pikepdf.Dictionary(XObject=pikepdf.Dictionary(X=f)), size=(300, 20))

    data = drawn_pdf(self_drawing)
    img = np.asarray(render_page(open_pdf(data), 0, RenderConfig(dpi=72)).image.convert("L"))
    assert _FORM_LEVELS == 40 and np.count_nonzero(img[img.shape[0] - 5] < 128) == _FORM_LEVELS
    c = DrawCounter(data)
    assert c.page_draws(0, 10**9) == 1 + _FORM_LEVELS and c.cyclic(0)  # the last level's Do parses nothing


def test_a_cycle_is_priced_by_what_pdfium_does_with_it(pdfium_refuses_pages, content_reads):
    """Two forms drawing each other once (a real third-party file does this) cost pdfium 40 levels
    of nesting: the page renders (in 0.07 s, measured by hand: docs/batch.md). Drawing each other
    twice is 1 + 2 + ... + 2**40 draws: refused at once, its count reading the page and each form
    once (not once a nesting level), and pdfium never loads the page."""
    from functools import partial

    from padoc_ray.pdf import DrawCounter

    from tests.helpers.pdf_factory import drawn_pdf, form_cycle_page

    once = drawn_pdf(form_cycle_page)
    c = DrawCounter(once)
    assert c.page_draws(0, 10**6) == 1 + 40 and c.cyclic(0)
    page = render_page(open_pdf(once), 0, RenderConfig(longest_side=200))
    assert page.image.size == (200, 200)

    twice = drawn_pdf(partial(form_cycle_page, fanout=2))
    c = DrawCounter(twice)
    del content_reads[:]
    assert c.page_draws(0, 10**60) == sum(2**k for k in range(41)) and c.cyclic(0)  # 1 + 2 + ... + 2**40
    assert len(content_reads) == 3, content_reads  # the page's content and the 2 forms, each read once
    doc = open_pdf(twice)
    pdfium_refuses_pages()
    with pytest.raises(PdfError) as ei:
        render_page(doc, 0, RenderConfig(longest_side=200))
    assert ei.value.code == "page_too_complex" and "draws itself" in ei.value.message
    assert "depth limit of 40 form levels" in ei.value.message


def test_the_work_of_counting_is_bounded(monkeypatch):
    """A page whose walk would visit more distinct nestings than _MAX_WALKS is taken as over the
    limit, whatever its count so far: the counter's own work stays bounded."""
    import padoc_ray.pdf_draws as pdf_module

    from tests.helpers.pdf_factory import form_bomb_pdf

    data = form_bomb_pdf(1, depth=12, fanout=1)  # 12 distinct forms, 12 draws
    assert pdf_module.DrawCounter(data).page_draws(0, 100) == 12
    monkeypatch.setattr(pdf_module, "_MAX_WALKS", 5)
    c = pdf_module.DrawCounter(data)
    assert c.page_draws(0, 100) == 101 and "too many to count" in c.describe(0, 100)


def test_corrupt_image_messages_say_what_is_wrong_without_object_addresses():
    from padoc_ray.pdf import open_document

    messages = set()
    for data in (b"\xff\xd8\xff\xe0" + bytes(200), b"\x89PNG\r\n\x1a\n" + bytes(100), b"GIF89a" + bytes(50)):
        for _ in range(2):
            with pytest.raises(PdfError) as ei:
                open_document(data)
            assert ei.value.code == "corrupt_image"
            assert " at 0x" not in ei.value.message and "object" not in ei.value.message, ei.value.message
            messages.add(ei.value.message)
    assert len(messages) <= 3  # the same bytes, the same message
    assert any("cannot identify" in m or "damaged" in m for m in messages)
