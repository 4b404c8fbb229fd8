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
