"""PDFs of every bad-input kind the batch job must account for, made on the fly."""

from __future__ import annotations

import io
import os

from reportlab.lib import pdfencrypt
from reportlab.pdfgen import canvas


def text_pdf(pages: int = 1, size=(612, 792), rotate: int = 0, encrypt: str | None = None, label: str = "Page") -> bytes:
    """``size`` is the displayed size; with ``rotate=90`` reportlab stores the MediaBox swapped plus
    /Rotate 90 (a landscape page kept as a portrait MediaBox, as scanners often write them)."""
    buf = io.BytesIO()
    kw = {"encrypt": pdfencrypt.StandardEncryption(encrypt, canPrint=0)} if encrypt else {}
    c = canvas.Canvas(buf, pagesize=size, invariant=1, **kw)
    for i in range(pages):
        if rotate:
            c.setPageRotation(rotate)
        c.setFont("Helvetica", 14)
        c.drawString(36, size[1] / 2, f"{label} {i + 1}: some text for the parser.")
        c.showPage()
    c.save()
    return buf.getvalue()


def image_only_pdf() -> bytes:
    from PIL import Image, ImageDraw
    from reportlab.lib.utils import ImageReader

    img = Image.new("RGB", (400, 500), "white")
    ImageDraw.Draw(img).rectangle([40, 40, 360, 120], fill="black")
    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=(612, 792), invariant=1)
    c.drawImage(ImageReader(img), 0, 0, width=612, height=792)
    c.showPage()
    c.save()
    return buf.getvalue()


def zero_page_pdf() -> bytes:
    import pypdfium2 as pdfium

    doc = pdfium.PdfDocument.new()
    buf = io.BytesIO()
    doc.save(buf)
    return buf.getvalue()


def png_page(size=(300, 400)) -> bytes:
    """A page photo: a PNG with some dark text-like bars."""
    import io

    from PIL import Image, ImageDraw

    img = Image.new("RGB", size, "white")
    d = ImageDraw.Draw(img)
    for y in range(40, size[1] - 40, 30):
        d.rectangle((30, y, size[0] - 30, y + 10), fill="black")
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def write_bad_input_folder(d: str, big_pages: int = 1000) -> dict[str, dict]:
    """Writes one file per kind into ``d``; returns name -> expectations: ``doc_status`` (exactly one
    per file), ``code`` (a document-level row's code), ``pages``/``image_pages``, ``page_status`` (of
    every page when not ok; pages that reach the engine are ok when teacher-forced)."""
    good = text_pdf(2)
    files = {
        "good.pdf": (good, {"doc_status": "ok", "pages": 2}),
        "notes.txt": (b"just some text, not a PDF", {"doc_status": "skipped", "code": "not_pdf"}),
        "zero.pdf": (b"", {"doc_status": "empty_file", "code": "empty_file"}),
        # a third of a PDF: pdfium cannot open it and qpdf's repair finds no page (diagnosed from the bytes)
        "truncated.pdf": (good[: len(good) // 3], {"doc_status": "corrupt_pdf", "code": "corrupt_pdf"}),
        "corrupt.pdf": (b"%PDF-1.7\n" + bytes(range(256)) * 40, {"doc_status": "corrupt_pdf", "code": "corrupt_pdf"}),
        "encrypted.pdf": (text_pdf(1, encrypt="secret"), {"doc_status": "encrypted_pdf", "code": "encrypted_pdf"}),
        "nopages.pdf": (zero_page_pdf(), {"doc_status": "no_pages", "code": "no_pages"}),
        "huge.pdf": (text_pdf(1, size=(20000, 20000)), {"doc_status": "failed", "page_status": "absurd_page_size",
                                                         "pages": 1}),
        "rotated.pdf": (text_pdf(2, size=(792, 612), rotate=90), {"doc_status": "ok", "pages": 2}),
        "scan.pdf": (image_only_pdf(), {"doc_status": "ok", "pages": 1}),
        "thousand.pdf": (text_pdf(big_pages, size=(200, 200)), {"doc_status": "ok", "pages": big_pages}),
        "photo.png": (png_page(), {"doc_status": "ok", "image_pages": 1}),
        "broken.jpg": (b"\xff\xd8\xff\xe0" + bytes(200), {"doc_status": "corrupt_image", "code": "corrupt_image"}),
    }
    for name, (data, _) in files.items():
        with open(os.path.join(d, name), "wb") as f:
            f.write(data)
    return {name: exp for name, (_, exp) in files.items()}


def xref_broken_pdf(data: bytes) -> bytes:
    """``data`` with its cross-reference table and trailer cut off and every ``endobj`` removed:
    beyond pdfium's own repair, while qpdf's reconstruction still finds every object."""
    return data[: data.rfind(b"xref")].replace(b"endobj", b"")


def form_bomb_pdf(pages: int = 1, depth: int = 6, fanout: int = 10, size: int = 200) -> bytes:
    """Pages that draw a chain of ``depth`` form XObjects, each drawing the next ``fanout`` times:
    ``fanout ** depth`` draws of the innermost form per page from a file of a few KB (shared by
    every page). Written by hand; ``depth=0`` is a page with one rectangle and no XObject."""
    objs: list[bytes] = []  # object i + 1

    def add(body: bytes) -> int:
        objs.append(body)
        return len(objs)

    def stream(dict_body: bytes, content: bytes) -> bytes:
        return b"<< " + dict_body + b" /Length %d >>\nstream\n" % len(content) + content + b"\nendstream"

    catalog, pages_obj = add(b""), add(b"")
    inner = add(stream(b"/Type /XObject /Subtype /Form /BBox [0 0 10 10]", b"0 0 1 1 re f"))
    for _ in range(depth - 1):  # each level draws the one below ``fanout`` times
        draws = b" ".join(b"/X Do" for _ in range(fanout))
        inner = add(stream(b"/Type /XObject /Subtype /Form /BBox [0 0 10 10] /Resources << /XObject << /X %d 0 R >> >>"
                           % inner, draws))
    if depth:
        content = b" ".join(b"/X Do" for _ in range(fanout))
        res = b"/Resources << /XObject << /X %d 0 R >> >>" % inner
    else:
        content, res = b"0 0 10 10 re f", b""
    body = add(stream(b"", content))
    kids = [add(b"<< /Type /Page /Parent %d 0 R /MediaBox [0 0 %d %d] %s /Contents %d 0 R >>"
                % (pages_obj, size, size, res, body)) for _ in range(pages)]
    objs[catalog - 1] = b"<< /Type /Catalog /Pages %d 0 R >>" % pages_obj
    objs[pages_obj - 1] = (b"<< /Type /Pages /Count %d /Kids [" % pages + b" ".join(b"%d 0 R" % k for k in kids)
                           + b"] >>")
    return serialize_pdf(objs, catalog)


def serialize_pdf(objs: list[bytes], root: int) -> bytes:
    """A PDF file of the object bodies ``objs`` (object i + 1 is ``objs[i]``) with its xref table;
    ``root``: the catalog's object number."""
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for i, o in enumerate(objs):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % (i + 1) + o + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root %d 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, root, xref)
    return bytes(out)


# ---- pages that draw far more than their content shows (DrawCounter, issue 46) --------------------------
def _form(pdf, content: bytes, xobjects: dict | None = None):
    import pikepdf

    f = pdf.make_stream(content)
    f.Type, f.Subtype, f.BBox = pikepdf.Name.XObject, pikepdf.Name.Form, [0, 0, 10, 10]
    if xobjects is not None:
        f.Resources = pikepdf.Dictionary(XObject=pikepdf.Dictionary(xobjects))
    return f


def _form_tree(pdf, depth: int, fanout: int):
    """A form drawing a chain of ``depth - 1`` forms below it, each drawing the next ``fanout``
    times: ``fanout + fanout**2 + ... + fanout**(depth - 1)`` draws below the top form's own."""
    inner = _form(pdf, b"0 0 1 1 re f")
    for _ in range(depth - 1):
        inner = _form(pdf, b" ".join([b"/X Do"] * fanout), {"/X": inner})
    return inner


def _saved(pdf) -> bytes:
    out = io.BytesIO()
    pdf.save(out)
    return out.getvalue()


def _page(pdf, content: bytes, resources=None, size=(200, 200)):
    pdf.add_blank_page(page_size=size)
    page = pdf.pages[-1].obj
    page.Contents = pdf.make_stream(content)
    if resources is not None:
        page.Resources = resources
    return page


def annotation_bomb_page(pdf, depth: int = 5, fanout: int = 10, states: str | None = None, flags: int = 0):
    """A page with a line of text whose one annotation's normal appearance (``/AP /N``) draws a form
    tree ``fanout`` times: ``1 + fanout + fanout**2 + ... + fanout**depth`` draws (1: the
    appearance itself), none of them in the page's content.

    ``states``: /N is a dictionary of two states, ``/Bomb`` and a plain ``/Off``, and /AS names
    ``states`` (``""``: no /AS). ``flags``: the annotation's /F (2: Hidden, 32: NoView)."""
    import pikepdf

    page = _page(pdf, b"BT /F1 12 Tf 20 100 Td (an innocent page) Tj ET", pikepdf.Dictionary(
        Font=pikepdf.Dictionary(F1=pikepdf.Dictionary(Type=pikepdf.Name.Font, Subtype=pikepdf.Name.Type1,
                                                      BaseFont=pikepdf.Name.Helvetica))))
    bomb = _form(pdf, b" ".join([b"/X Do"] * fanout), {"/X": _form_tree(pdf, depth, fanout)})
    annot = pikepdf.Dictionary(Type=pikepdf.Name.Annot, Subtype=pikepdf.Name.Square, Rect=[10, 10, 100, 100])
    if flags:
        annot.F = flags
    if states is None:
        annot.AP = pikepdf.Dictionary(N=bomb)
    else:
        annot.AP = pikepdf.Dictionary(N=pikepdf.Dictionary(Bomb=bomb, Off=_form(pdf, b"0 0 5 5 re f")))
        if states:
            annot.AS = pikepdf.Name("/" + states)
    page.Annots = pdf.make_indirect(pikepdf.Array([pdf.make_indirect(annot)]))
    return page


def pattern_bomb_page(pdf, depth: int = 5, fanout: int = 10, fills: int = 10, step: float = 10):
    """A page that selects a tiling pattern whose cell draws a form tree ``fanout`` times, and fills
    ``fills`` rectangles with it (pdfium renders the cell anew for every fill)."""
    import pikepdf

    cell = pdf.make_stream(b" ".join([b"/X Do"] * fanout))
    cell.Type, cell.PatternType, cell.PaintType, cell.TilingType = pikepdf.Name.Pattern, 1, 1, 1
    cell.BBox, cell.XStep, cell.YStep = [0, 0, 10, 10], step, step
    cell.Resources = pikepdf.Dictionary(XObject=pikepdf.Dictionary(X=_form_tree(pdf, depth, fanout)))
    return _page(pdf, b"/Pattern cs /P scn " + b" ".join([b"0 0 100 100 re f"] * fills),
                 pikepdf.Dictionary(Pattern=pikepdf.Dictionary(P=cell)))


def type3_bomb_page(pdf, depth: int = 5, fanout: int = 10, glyphs: int = 10):
    """A page showing ``glyphs`` glyphs of a Type 3 font whose glyph procedure draws a form tree
    ``fanout`` times (pdfium runs the procedure for every glyph shown)."""
    import pikepdf

    proc = pdf.make_stream(b"10 0 d0 " + b" ".join([b"/X Do"] * fanout))
    font = pdf.make_indirect(pikepdf.Dictionary(
        Type=pikepdf.Name.Font, Subtype=pikepdf.Name.Type3, FontBBox=[0, 0, 10, 10],
        FontMatrix=[0.1, 0, 0, 0.1, 0, 0], FirstChar=97, LastChar=97, Widths=[10],
        Encoding=pikepdf.Dictionary(Type=pikepdf.Name.Encoding, Differences=[97, pikepdf.Name.a]),
        CharProcs=pikepdf.Dictionary(a=proc),
        Resources=pikepdf.Dictionary(XObject=pikepdf.Dictionary(X=_form_tree(pdf, depth, fanout)))))
    return _page(pdf, b"BT /T 12 Tf 10 100 Td (" + b"a" * glyphs + b") Tj ET",
                 pikepdf.Dictionary(Font=pikepdf.Dictionary(T=font)))


def form_cycle_page(pdf, fanout: int = 1):
    """A page drawing form A, which draws form B ``fanout`` times, which draws A ``fanout`` times: a
    cycle pdfium cuts at its form nesting limit (40 levels). With ``fanout=1`` it is what a real
    third-party file does (each form also paints a square); with 2, 2**40 draws."""
    import pikepdf

    a = _form(pdf, b"0 0 1 1 re f " + b" ".join([b"/B Do"] * fanout))
    b = _form(pdf, b"1 1 1 1 re f " + b" ".join([b"/A Do"] * fanout), {"/A": a})
    a.Resources = pikepdf.Dictionary(XObject=pikepdf.Dictionary(B=b))
    return _page(pdf, b"/A Do", pikepdf.Dictionary(XObject=pikepdf.Dictionary(A=a)))


def drawn_pdf(*builders) -> bytes:
    """A PDF of one page per builder (a function of a pikepdf.Pdf that adds a page)."""
    import pikepdf

    pdf = pikepdf.new()
    for build in builders:
        build(pdf)
    return _saved(pdf)
