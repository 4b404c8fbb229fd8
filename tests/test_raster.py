"""The raster stage's machinery without Ray: lossless page encodings, and the isolated renderer
that turns a crashing or hanging document into rows while every other document renders normally.
Faults are injected in the renderer process through its test-only environment variable."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest

from padoc_ray.pdf import RenderConfig
from padoc_ray.raster import (ENCODINGS, DocFailed, InProcessRenderer, IsolatedRenderer, Opened, PageFailed,
                              PageRendered, RendererConfig, decode_image, encode_image)
from padoc_ray.raster.worker import FAULTS_ENV

from .pdf_factory import image_only_pdf, png_page, text_pdf, xref_broken_pdf

RENDER = RenderConfig(longest_side=300)
def ALL(n: int) -> list[int]:  # select every page
    return list(range(n))


def _events(renderer, data, name="doc.pdf", select=ALL, encoding="zstd"):
    return list(renderer.render_document(data, name, select, RENDER, encoding))


def _summary(events):
    out = []
    for e in events:
        if isinstance(e, Opened):
            out.append(("opened", e.page_count))
        elif isinstance(e, DocFailed):
            out.append(("doc", e.code))
        elif isinstance(e, PageFailed):
            out.append((e.index, e.code))
        else:
            out.append((e.index, "ok"))
    return out


@pytest.fixture
def faults(monkeypatch):
    def set_faults(spec: dict) -> None:
        monkeypatch.setenv(FAULTS_ENV, json.dumps(spec))
    return set_faults


# ---- encodings ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("encoding", ENCODINGS)
def test_every_encoding_gives_back_the_rendered_pixels(encoding):
    from padoc_ray.pdf import open_pdf, render_page

    for data in (text_pdf(1, size=(613, 791)), image_only_pdf()):  # odd sizes: no row padding may leak in
        img = render_page(open_pdf(data), 0, RenderConfig(dpi=100)).image
        back = decode_image(encode_image(img, encoding))
        assert back.mode == "RGB" and back.size == img.size and back.tobytes() == img.tobytes()


def test_packed_pixels_equal_the_pil_image_whatever_the_row_padding():
    from padoc_ray.pdf import open_pdf, render_page

    widths = set()
    for side in (301, 302, 303, 304):  # pdfium pads rows of 3-byte pixels to 4 bytes
        doc = open_pdf(text_pdf(1))
        cfg = RenderConfig(longest_side=side)
        img, px = render_page(doc, 0, cfg).image, render_page(doc, 0, cfg, pixels=True).image
        widths.add(px.width % 4)
        assert (px.width, px.height) == img.size and bytes(px.data) == img.tobytes()
        for enc in ENCODINGS:
            assert decode_image(encode_image(px, enc)).tobytes() == img.tobytes()
    assert len(widths) > 1


def test_zstd_is_much_smaller_than_raw_pixels():
    from padoc_ray.pdf import open_pdf, render_page

    img = render_page(open_pdf(text_pdf(1)), 0, RenderConfig(dpi=144)).image
    assert len(encode_image(img, "zstd")) < len(encode_image(img, "ppm")) / 20


def test_unknown_encoding_is_refused():
    from PIL import Image

    with pytest.raises(ValueError, match="zstd, png, ppm"):
        encode_image(Image.new("RGB", (4, 4)), "webp")


# ---- the isolated renderer ----------------------------------------------------------------------------
def test_isolated_and_in_process_renderers_give_identical_pages():
    data = text_pdf(3)
    iso = IsolatedRenderer()
    try:
        a = _events(iso, data, select=lambda n: [2, 0])
    finally:
        iso.close()
    b = _events(InProcessRenderer(), data, select=lambda n: [2, 0])
    assert _summary(a) == _summary(b) == [("opened", 3), (2, "ok"), (0, "ok")]
    for x, y in zip(a[1:], b[1:]):
        assert x.image_bytes == y.image_bytes
        assert {k: v for k, v in x.meta.items() if k != "render_s"} == {k: v for k, v in y.meta.items()
                                                                         if k != "render_s"}


def test_bad_documents_keep_their_codes_and_page_images_work():
    r = IsolatedRenderer()
    try:
        assert _summary(_events(r, b"not a pdf at all")) == [("doc", "not_pdf")]
        assert _summary(_events(r, text_pdf(1, encrypt="secret"))) == [("doc", "encrypted_pdf")]
        assert _summary(_events(r, png_page(), "photo.png")) == [("opened", 1), (0, "ok")]
        ev = _events(r, text_pdf(2), select=lambda n: [0, 5])  # a page past the end
        assert _summary(ev) == [("opened", 2), (0, "ok"), (5, "page_load_failed")]
        rep = _events(r, xref_broken_pdf(text_pdf(2)))
        assert rep[0] == Opened(2, True) and _summary(rep)[1:] == [(0, "ok"), (1, "ok")]
        assert _events(r, text_pdf(2))[0] == Opened(2, False)
        assert r.restarts == 0
    finally:
        r.close()


def test_a_crashing_page_costs_that_page_and_the_rest_renders(faults):
    faults({"poison.pdf": "crash@2"})
    r = IsolatedRenderer(RendererConfig(crash_tries=2))
    try:
        ev = _events(r, text_pdf(5), "poison.pdf")
        assert _summary(ev) == [("opened", 5), (0, "ok"), (1, "ok"), (2, "render_crashed"), (3, "ok"), (4, "ok")]
        assert "crashed on it 2 time(s)" in ev[3].message and "SIGSEGV" in ev[3].message
        assert r.restarts == 2
        # the same bytes under another name are fine, in the same renderer
        assert _summary(_events(r, text_pdf(5), "fine.pdf"))[-1] == (4, "ok")
    finally:
        r.close()


def test_an_unexpected_render_error_is_that_pages_render_failed(faults, monkeypatch):
    """pdfium failing to render a page (not a crash) gives the page render_failed and the rest
    renders, in the renderer process (an unforeseen exception, injected there) and in process (a
    pdfium error from page.render)."""
    faults({"odd.pdf": "fail@1", "odd_open.pdf": "fail@open"})
    r = IsolatedRenderer(RendererConfig())
    try:
        ev = _events(r, text_pdf(3), "odd.pdf")
        assert _summary(ev) == [("opened", 3), (0, "ok"), (1, "render_failed"), (2, "ok")]
        assert "RuntimeError: injected failure at 1" in ev[2].message
        ev = _events(r, text_pdf(1), "odd_open.pdf")
        assert _summary(ev) == [("doc", "render_failed")] and "opening failed" in ev[0].message
        assert r.restarts == 0  # an error, not a crash: the same renderer goes on
    finally:
        r.close()
    import pypdfium2 as pdfium

    def broken(self, *a, **kw):
        raise pdfium.PdfiumError("Failed to render page")

    monkeypatch.setattr(pdfium.PdfPage, "render", broken)
    ev = _events(InProcessRenderer(), text_pdf(2), "doc.pdf")
    assert _summary(ev) == [("opened", 2), (0, "render_failed"), (1, "render_failed")]
    assert "Failed to render page" in ev[1].message


def test_a_document_that_crashes_on_every_page_is_bounded(faults):
    faults({"poison.pdf": "crash"})
    r = IsolatedRenderer(RendererConfig(crash_tries=2, max_crashes_per_doc=3))
    try:
        ev = _events(r, text_pdf(6), "poison.pdf")
        assert _summary(ev) == [("opened", 6)] + [(i, "render_crashed") for i in range(6)]
        assert r.restarts == 3  # two tries of page 0, one of page 1, then the rest is given up
        assert all("not rendered" in e.message for e in ev[3:])
    finally:
        r.close()


def test_a_crash_while_opening_is_one_document_row(faults):
    faults({"poison.pdf": "crash@open"})
    r = IsolatedRenderer()
    try:
        ev = _events(r, text_pdf(2), "poison.pdf")
        assert _summary(ev) == [("doc", "render_crashed")] and "SIGSEGV" in ev[0].message
        assert _summary(_events(r, text_pdf(2), "next.pdf")) == [("opened", 2), (0, "ok"), (1, "ok")]
    finally:
        r.close()


def test_a_hanging_page_times_out_and_the_rest_renders(faults):
    faults({"slow.pdf": "hang@1"})
    r = IsolatedRenderer(RendererConfig(page_timeout_s=1.5))
    try:
        t = time.monotonic()
        ev = _events(r, text_pdf(4), "slow.pdf")
        assert time.monotonic() - t < 30
        assert _summary(ev) == [("opened", 4), (0, "ok"), (1, "render_timeout"), (2, "ok"), (3, "ok")]
        assert "longer than 1.5 s" in ev[2].message
    finally:
        r.close()


def test_a_hanging_open_is_one_document_row(faults):
    faults({"slow.pdf": "hang@open"})
    r = IsolatedRenderer(RendererConfig(page_timeout_s=1.0))
    try:
        assert _summary(_events(r, text_pdf(2), "slow.pdf")) == [("doc", "render_timeout")]
    finally:
        r.close()


def test_the_document_deadline_covers_every_page_left(faults):
    faults({"slow.pdf": "hang@2"})
    r = IsolatedRenderer(RendererConfig(page_timeout_s=60, doc_timeout_s=1.5))
    try:
        t = time.monotonic()
        ev = _events(r, text_pdf(5), "slow.pdf")
        assert time.monotonic() - t < 30  # the page limit (60 s) never came into play
        assert _summary(ev) == [("opened", 5), (0, "ok"), (1, "ok"), (2, "render_timeout"), (3, "render_timeout"),
                                (4, "render_timeout")]
        assert "1.5 s" in ev[3].message and ev[4].message.startswith("not rendered")
    finally:
        r.close()


def test_a_consumer_that_stops_early_leaves_a_usable_renderer():
    r = IsolatedRenderer()
    try:
        gen = r.render_document(text_pdf(5), "a.pdf", ALL, RENDER, "zstd")
        assert isinstance(next(gen), Opened) and isinstance(next(gen), PageRendered)
        gen.close()  # the child is mid-stream: it is replaced, never read out of step
        assert _summary(_events(r, text_pdf(2), "b.pdf")) == [("opened", 2), (0, "ok"), (1, "ok")]
    finally:
        r.close()


def test_the_renderer_process_dies_with_its_parent(tmp_path):
    """A renderer stuck in a hostile file must not outlive the task that started it."""
    script = f"""
import json, os, sys
sys.path.insert(0, {os.getcwd()!r})
os.environ[{FAULTS_ENV!r}] = json.dumps({{"slow.pdf": "hang@open"}})
from padoc_ray.raster import IsolatedRenderer, RendererConfig
from tests.pdf_factory import text_pdf
r = IsolatedRenderer(RendererConfig(page_timeout_s=600))
r._send(("open", text_pdf(1), "slow.pdf", None))
print(r._proc.pid, flush=True)
import time; time.sleep(600)
"""
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    child = int(parent.stdout.readline())
    assert _alive(child)
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 20
    while _alive(child) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not _alive(child)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except FileNotFoundError:
        return False


def test_renderer_config_is_validated():
    with pytest.raises(ValueError):
        RendererConfig(page_timeout_s=0)
    with pytest.raises(ValueError):
        RendererConfig(crash_tries=0)


def test_bench_raster_reports_the_contract_keys(tmp_path):
    """`padoc-ray bench raster --json`: every variant renders every page; the keys scripts read stay."""
    for i, n in enumerate((2, 3)):
        (tmp_path / f"d{i}.pdf").write_bytes(text_pdf(n))
    out = tmp_path / "bench.json"
    run = subprocess.run([sys.executable, "-m", "padoc_ray.cli", "bench", "raster", "--input", str(tmp_path),
                          "--dpi", "36", "--workers", "1", "--json", str(out)], capture_output=True, text=True,
                         timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(out.read_text())["results"]
    for key in ("pypdfium2_render/1proc", "padoc_raster_stage/1proc", "padoc_raster_stage_in_process/1proc"):
        assert res[key]["pages"] == 5 and res[key]["pages_per_s"] > 0
