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
from padoc_ray.raster.worker import FAULTS_ENV, START_DELAY_ENV

from tests.conftest import ROOT
from tests.helpers.pdf_factory import image_only_pdf, png_page, text_pdf, xref_broken_pdf

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


def _recorded_waits(r: IsolatedRenderer) -> list[float]:
    """The renderer time ``r`` gives each answer of its renderer process (the page's limit, or what is
    left of the document's), as the renderer computed it: its own limits, not a clock of the test's.
    A hanging renderer is waited for exactly that long, then killed."""
    waits: list[float] = []
    recv = r._recv

    def recording(doc, cancel):
        waits.append(doc.budget())
        return recv(doc, cancel)

    r._recv = recording
    return waits


@pytest.fixture
def pdfium_refuses(monkeypatch):
    """``pdfium_refuses(page_count, pages)``: from now on, pdfium in this process refuses to load those
    pages of any document of ``page_count`` pages (AssertionError: a page the draw counter should
    have refused reached pdfium, which would spend minutes on it). Returns the list of the pages
    pdfium did load, as (page count, index)."""
    import pypdfium2 as pdfium

    loads: list[tuple[int, int]] = []
    refused: dict[int, set[int]] = {}
    get_page = pdfium.PdfDocument.get_page

    def guarded(doc, index):
        if index in refused.get(len(doc), ()):
            raise AssertionError(f"pdfium was asked to load page {index} of the {len(doc)}-page document")
        loads.append((len(doc), index))
        return get_page(doc, index)

    monkeypatch.setattr(pdfium.PdfDocument, "get_page", guarded)

    def refuse(page_count: int, pages) -> list[tuple[int, int]]:
        refused[page_count] = set(pages)
        return loads

    return refuse


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
        waits = _recorded_waits(r)
        ev = _events(r, text_pdf(4), "slow.pdf")
        assert _summary(ev) == [("opened", 4), (0, "ok"), (1, "render_timeout"), (2, "ok"), (3, "ok")]
        assert "longer than 1.5 s (stuck: neither running nor waiting for a CPU" in ev[2].message
        # the hanging page was waited for its 1.5 s (no wait was longer), then its renderer killed once
        assert waits and max(waits) <= 1.5 and r.restarts == 1, (waits, r.restarts)
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
        waits = _recorded_waits(r)
        ev = _events(r, text_pdf(5), "slow.pdf")
        assert _summary(ev) == [("opened", 5), (0, "ok"), (1, "ok"), (2, "render_timeout"), (3, "render_timeout"),
                                (4, "render_timeout")]
        assert "1.5 s" in ev[3].message and ev[4].message.startswith("not rendered")
        # the page limit (60 s) never came into play: no wait was longer than the document's 1.5 s,
        # and the renderer was killed once (page 2), not once a page
        assert waits and max(waits) <= 1.5 and r.restarts == 1, (waits, r.restarts)
    finally:
        r.close()


def test_a_renderer_waiting_for_a_cpu_is_not_stuck(faults):
    """Starved for real: the renderer runs at niceness 19 on CPU 0 beside two busy loops there (well under
    1% of that CPU), so each 0.5 s of its page's limit gives it less than the 10 ms of CPU time that the
    stuck rule looks for. It waits to run the whole time, though (its run-queue wait grows): it is
    starved, not stuck, and its page (0.02 s of CPU, ``burn``) renders, in more than its 0.5 s of wall time."""
    faults({"starved.pdf": "burn@0"})
    r = IsolatedRenderer(RendererConfig(page_timeout_s=0.5, doc_timeout_s=600, nice=19))
    hogs = []
    try:
        assert _summary(_events(r, text_pdf(1), "warm.pdf")) == [("opened", 1), (0, "ok")]
        os.sched_setaffinity(r.pid, {0})
        spin = "import os; os.sched_setaffinity(0, {0}); exec('while True: pass')"
        hogs = [subprocess.Popen([sys.executable, "-c", spin]) for _ in range(2)]
        time.sleep(0.3)  # the loops are running on CPU 0
        waited = lambda: int(open(f"/proc/{r.pid}/schedstat").read().split()[1]) / 1e9  # noqa: E731
        w, t = waited(), time.monotonic()
        ev = _events(r, text_pdf(1), "starved.pdf")
        assert time.monotonic() - t > 0.5 and waited() - w > 0.5  # starved: longer than its limit, waiting to run
        assert _summary(ev) == [("opened", 1), (0, "ok")], [getattr(e, "message", "") for e in ev]
    finally:
        for h in hogs:
            h.kill()
            h.wait()
        r.close()


def test_a_slow_renderer_start_costs_no_document_its_time(faults, monkeypatch):
    """A fresh renderer process whose start takes 2 s of CPU time (Python and pdfium loading on a
    slow machine) does not eat a document's limits of 0.5 s a page and 1.5 s in all: the first document, and the one
    after a hang killed the renderer (its pages go on in a fresh, as slow, process), render; only the hanging
    page times out. The hang spends 0.5 s of the document's 1.5: the 1 s left covers the fresh process opening the
    document again and rendering its last page on a loaded machine (0.3 s did not, once, on a machine at half
    its usual speed)."""
    monkeypatch.setenv(START_DELAY_ENV, "2")
    faults({"slow.pdf": "hang@1"})
    r = IsolatedRenderer(RendererConfig(page_timeout_s=0.5, doc_timeout_s=1.5))
    try:
        waits = _recorded_waits(r)
        assert _summary(_events(r, text_pdf(2), "first.pdf")) == [("opened", 2), (0, "ok"), (1, "ok")]
        ev = _events(r, text_pdf(3), "slow.pdf")
        assert _summary(ev) == [("opened", 3), (0, "ok"), (1, "render_timeout"), (2, "ok")]
        assert "longer than 0.5 s" in ev[2].message and r.restarts == 1
        assert waits and max(waits) <= 0.5, waits  # the start was not waited for on a document's limit
    finally:
        r.close()


def test_a_renderer_that_is_not_ready_in_time_counts_as_a_crash(monkeypatch):
    """A renderer process that does not say it is ready within start_timeout_s is killed and counted
    as a crash: the document gets its row (render_crashed, saying why) after crash_tries starts, and a
    renderer that starts in time renders the next document."""
    monkeypatch.setenv(START_DELAY_ENV, "30")
    r = IsolatedRenderer(RendererConfig(start_timeout_s=0.3))
    try:
        t = time.monotonic()
        ev = _events(r, text_pdf(2), "a.pdf")
        assert _summary(ev) == [("doc", "render_crashed")] and time.monotonic() - t < 20
        assert "not ready within 0.3 s" in ev[0].message and "2 time(s)" in ev[0].message
        monkeypatch.delenv(START_DELAY_ENV)
        r.cfg = RendererConfig()
        assert _summary(_events(r, text_pdf(2), "b.pdf")) == [("opened", 2), (0, "ok"), (1, "ok")]
    finally:
        r.close()
    with pytest.raises(ValueError):
        RendererConfig(start_timeout_s=0)


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
from tests.helpers.pdf_factory import text_pdf
r = IsolatedRenderer(RendererConfig(page_timeout_s=600))
r._start(None)
r._send(("open", text_pdf(1), "slow.pdf", None))
print(r._proc.pid, flush=True)
import time; time.sleep(600)
"""
    parent = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT)
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


# ---- issue 27: time limits that count the renderer's time, pages that cost minutes, safeguards ----------
def test_the_document_clock_stands_still_while_the_consumer_waits(faults):
    """Backpressure: the consumer holds every event 0.05 s, 1.2 s of wall time for 24 pages against a
    document limit of 1 s; only the renderer's own (CPU) time counts, so every page is ok. A page that
    never answers (hang@6, a renderer that uses no CPU) still gets render_timeout once the document's
    1 s has passed, with the pages after it."""
    faults({"slow.pdf": "hang@6"})
    r = IsolatedRenderer(RendererConfig(page_timeout_s=60, doc_timeout_s=1.0))
    try:
        for name, n in (("fine.pdf", 24), ("slow.pdf", 8)):
            got = []
            t = time.monotonic()
            for ev in r.render_document(text_pdf(n), name, ALL, RENDER, "zstd"):
                got.append(ev)
                if name == "fine.pdf":
                    time.sleep(0.05)  # the consumer holds the event
            if name == "fine.pdf":
                assert time.monotonic() - t > 1.0
                assert _summary(got) == [("opened", 24)] + [(i, "ok") for i in range(24)]
                assert r.restarts == 0  # the warm renderer rendered them all
            else:
                assert _summary(got) == [("opened", 8)] + [(i, "ok") for i in range(6)] + [
                    (6, "render_timeout"), (7, "render_timeout")]
                assert "1 s of renderer time" in got[7].message
                # page 6 was cut by the document's limit, not by its own 60 s; page 7 was never sent
                assert "renderer killed" in got[7].message and got[8].message.startswith("not rendered")
    finally:
        r.close()


def test_a_starved_renderer_is_not_cut_and_a_spinning_one_is(faults):
    """A page's limit is renderer CPU time, not the wall clock. crawl@0 takes 1.5 s of wall time with
    0.15 s of CPU in it (a renderer a loaded machine starves): with a 0.5 s page limit, it renders.
    spin@1 uses the CPU without end: it is cut once it has used 0.5 s of CPU time, and rendering goes on."""
    faults({"starved.pdf": "crawl@0", "spin.pdf": "spin@1"})
    r = IsolatedRenderer(RendererConfig(page_timeout_s=0.5, doc_timeout_s=600))
    try:
        t = time.monotonic()
        assert _summary(_events(r, text_pdf(2), "starved.pdf")) == [("opened", 2), (0, "ok"), (1, "ok")]
        assert time.monotonic() - t >= 1.5 and r.restarts == 0
        ev = _events(r, text_pdf(3), "spin.pdf")
        assert _summary(ev) == [("opened", 3), (0, "ok"), (1, "render_timeout"), (2, "ok")]
        assert "longer than 0.5 s (of renderer CPU time" in ev[2].message and r.restarts == 1
    finally:
        r.close()


def test_a_document_gets_renderer_time_in_proportion_to_its_pages(faults):
    """page_budget_s * selected pages (at least page_timeout_s) caps a document with few pages
    far below doc_timeout_s: 4 hanging pages cost max(1, 4 * 0.5) = 2 s, not 4 page time-outs."""
    faults({"slow.pdf": "hang"})
    cfg = RendererConfig(page_timeout_s=1.0, doc_timeout_s=600, page_budget_s=0.5)
    assert cfg.doc_limit_s(4) == 2.0 and cfg.doc_limit_s(1) == 1.0
    assert cfg.doc_limit_s(10_000) == 600 and RendererConfig(page_budget_s=None).doc_limit_s(3) == 600
    r = IsolatedRenderer(cfg)
    try:
        waits = _recorded_waits(r)
        ev = _events(r, text_pdf(4), "slow.pdf")
        assert _summary(ev) == [("opened", 4)] + [(i, "render_timeout") for i in range(4)]
        # no wait longer than a page's 1 s, and two renderer kills (page 0's limit, then the document's),
        # not four page time-outs
        assert waits and max(waits) <= 1.0 and r.restarts == 2, (waits, r.restarts)
        assert "longer than 1 s" in ev[1].message  # page 0: its own limit came first
        assert "2 s of renderer time" in ev[2].message and ev[4].message.startswith("not rendered")
    finally:
        r.close()
    with pytest.raises(ValueError):
        RendererConfig(page_budget_s=0)


def test_a_form_xobject_bomb_gets_page_too_complex_quickly_and_good_files_render(pdfium_refuses):
    """Forms nested 7 deep, 10 draws each (10^7 draws a page, 3 KB): pdfium aborts on such a page
    after a minute; the draw count refuses every page before pdfium loads it (quickly, as nothing of
    it reaches pdfium: in this process pdfium refuses to load a page of it), without a crash or a
    time-out of the isolated renderer."""
    from tests.helpers.pdf_factory import form_bomb_pdf

    bomb = form_bomb_pdf(pages=30, depth=7)
    assert len(bomb) < 20_000
    loads = pdfium_refuses(30, range(30))  # the in-process renderer's pdfium: the bomb is the only 30-page file
    for r in (IsolatedRenderer(), InProcessRenderer()):
        try:
            assert _summary(_events(r, text_pdf(2), "a.pdf")) == [("opened", 2), (0, "ok"), (1, "ok")]
            ev = _events(r, bomb, "bomb.pdf")
            assert _summary(ev) == [("opened", 30)] + [(i, "page_too_complex") for i in range(30)]
            assert "more than 1,000,000" in ev[1].message and "--page-draw-limit" in ev[1].message
            assert _summary(_events(r, text_pdf(2), "b.pdf")) == [("opened", 2), (0, "ok"), (1, "ok")]
            # a lower limit refuses a shallower tree; no limit lets a small one render
            low = RenderConfig(longest_side=300, max_page_draws=1000)
            ev = list(r.render_document(form_bomb_pdf(1, depth=3), "c.pdf", ALL, low, "zstd"))
            assert _summary(ev) == [("opened", 1), (0, "page_too_complex")] and "counted 1,110" in ev[1].message
            off = RenderConfig(longest_side=300, max_page_draws=0)
            assert _summary(list(r.render_document(form_bomb_pdf(1, depth=3), "c.pdf", ALL, off, "zstd")))[-1] == (
                0, "ok")
            if isinstance(r, IsolatedRenderer):
                assert r.restarts == 0  # no page of it cost the renderer a time-out or a crash
            else:  # pdfium, in this process, loaded the good files' pages (and, refusing them, none of the bomb's)
                assert (2, 1) in loads and (1, 0) in loads
        finally:
            r.close()


def _drawing_bombs() -> bytes:
    """Issue 46: seven pages of 2 KB each, whose costs hide outside the page's content, beside plain
    ones: page 1's annotation appearance draws 1,111,111 forms (32 s of pypdfium2 at 1600 px), page
    2 fills 10 times with a tiling pattern whose cell draws 111,111 (20 s), page 3 shows 10 glyphs of
    a Type 3 font whose procedure does (8.5 s); page 5 holds two forms drawing each other once
    (pdfium cuts that cycle at 40 levels: 0.07 s), page 6 two drawing each other twice (2**41 draws)."""
    from functools import partial

    from tests.helpers.pdf_factory import (annotation_bomb_page, drawn_pdf, form_cycle_page, pattern_bomb_page,
                              type3_bomb_page)

    def plain(pdf):
        pdf.add_blank_page(page_size=(200, 200))

    return drawn_pdf(plain, partial(annotation_bomb_page, depth=6), pattern_bomb_page, type3_bomb_page, plain,
                     form_cycle_page, partial(form_cycle_page, fanout=2))


def test_annotation_pattern_and_glyph_bombs_get_page_too_complex_quickly_and_good_pages_render(pdfium_refuses):
    """Through both renderers: every bomb page is refused before pdfium loads it (in this process
    pdfium refuses to load one: only the good pages and the cycle pdfium cuts reach it), the cycle
    renders, and the good pages and files render. What counting costs (under 1 ms a bomb page) is
    measured by hand (docs/batch.md, "Pages that cost minutes"), not asserted here."""
    from padoc_ray.pdf import DrawCounter

    bombs = _drawing_bombs()
    c = DrawCounter(bombs)
    counts = [c.page_draws(i, 1_000_000) for i in range(7)]
    assert counts[0] == counts[4] == 0 and counts[5] == 41 and all(counts[i] > 1_000_000 for i in (1, 2, 3, 6))
    loads = pdfium_refuses(7, (1, 2, 3, 6))  # the bombs are the only 7-page file
    for r in (IsolatedRenderer(), InProcessRenderer()):
        try:
            assert _summary(_events(r, text_pdf(2), "a.pdf")) == [("opened", 2), (0, "ok"), (1, "ok")]
            ev = _events(r, bombs, "bombs.pdf")
            assert _summary(ev) == [("opened", 7), (0, "ok"), (1, "page_too_complex"), (2, "page_too_complex"),
                                    (3, "page_too_complex"), (4, "ok"), (5, "ok"), (6, "page_too_complex")]
            assert "in its annotations' appearance streams" in ev[2].message and "--page-draw-limit" in ev[2].message
            assert "in its content" in ev[3].message and "draws itself" in ev[7].message
            assert _summary(_events(r, text_pdf(2), "b.pdf")) == [("opened", 2), (0, "ok"), (1, "ok")]
            if isinstance(r, IsolatedRenderer):
                assert r.restarts == 0  # no page cost the renderer a time-out or a crash
            else:  # pdfium, in this process, loaded the good pages (and the cycle it cuts) only
                assert sorted(i for n, i in loads if n == 7) == [0, 4, 5]
        finally:
            r.close()


def test_drawing_bombs_cost_their_own_rows_in_the_batch_jobs_raster_stage(tmp_path):
    """The same pages through the batch job's raster stage (its own isolated renderer), between two
    good files: the bombs' pages get page_too_complex, every other page is rendered, and no page cost
    the renderer a time-out or a crash (a bomb page pdfium loaded would: one draws 2**41 forms)."""
    from tests.helpers.batch_runs import raster_statuses

    got, restarts = raster_statuses(tmp_path, {"a.pdf": text_pdf(2), "bombs.pdf": _drawing_bombs(),
                                               "b.pdf": text_pdf(3)})
    assert restarts == 0
    refused = {1, 2, 3, 6}
    assert got == ([("a.pdf", i, None) for i in range(2)]
                   + [("bombs.pdf", i, "page_too_complex" if i in refused else None) for i in range(7)]
                   + [("b.pdf", i, None) for i in range(3)])


def _mixed_size_pdf(sizes) -> bytes:
    import io

    from reportlab.pdfgen import canvas

    buf = io.BytesIO()
    c = canvas.Canvas(buf, invariant=1)
    for size in sizes:
        c.setPageSize(size)
        c.drawString(10, 10, "x")
        c.showPage()
    c.save()
    return buf.getvalue()


def test_a_page_over_the_renderers_memory_limit_fails_alone():
    """With a 768 MB address-space limit (the renderer itself takes ~330 MB), a 13889x13889 pixel
    page (a 770 MB bitmap) gets render_out_of_memory; the next page and the next document render
    in the same process."""
    big = RenderConfig(dpi=100, max_pixels=200_000_000)
    r = IsolatedRenderer(RendererConfig(memory_limit_mb=768))
    try:
        ev = list(r.render_document(_mixed_size_pdf([(10000, 10000), (300, 300)]), "m.pdf", ALL, big, "zstd"))
        assert _summary(ev) == [("opened", 2), (0, "render_out_of_memory"), (1, "ok")]
        assert "13889x13889" in ev[1].message and "memory_limit_mb" in ev[1].message
        assert _summary(_events(r, text_pdf(2), "next.pdf")) == [("opened", 2), (0, "ok"), (1, "ok")]
        assert r.restarts == 0
    finally:
        r.close()


def test_the_renderer_is_recycled_mid_document_without_losing_or_repeating_a_page():
    r = IsolatedRenderer(RendererConfig(recycle_after_pages=3))
    try:
        seen, pids = [], []
        for name, n in (("a.pdf", 8), ("b.pdf", 2)):
            for ev in r.render_document(text_pdf(n, label=name), name, ALL, RENDER, "zstd"):
                if isinstance(ev, PageRendered):
                    seen.append((name, ev.index))
                    pids.append(r._proc.pid if r._proc is not None else None)
        assert seen == [("a.pdf", i) for i in range(8)] + [("b.pdf", 0), ("b.pdf", 1)]
        live = [p for p in pids if p is not None]
        assert len(set(live)) >= 3, pids  # 10 pages, a fresh process every 3
        assert r.recycles >= 3 and r.restarts == 0
    finally:
        r.close()


def test_parse_flags_reach_the_render_limits():
    import argparse

    from padoc_ray.cli.batch import add_batch_args, config_from_args

    p = argparse.ArgumentParser()
    add_batch_args(p)
    base = ["--input", "x", "--output", "y", "--model", "m"]
    cfg = config_from_args(p.parse_args(base))
    assert cfg.raster.render.max_page_draws == 1_000_000 and cfg.raster.renderer.page_budget_s == 10.0
    assert cfg.raster.renderer.memory_limit_mb == 8192
    cfg = config_from_args(p.parse_args(base + ["--page-draw-limit", "5", "--page-render-budget", "0",
                                                "--render-memory-limit-mb", "1024"]))
    assert cfg.raster.render.max_page_draws == 5 and cfg.raster.renderer.page_budget_s is None
    assert cfg.raster.renderer.memory_limit_mb == 1024


def test_a_renderer_runs_at_the_niceness_it_is_given():
    """The online service renders job documents at a lower CPU priority (RendererConfig.nice)."""
    import psutil

    base = psutil.Process().nice()
    for nice in (0, 10):
        r = IsolatedRenderer(RendererConfig(nice=nice))
        try:
            gen = r.render_document(text_pdf(2), "a.pdf", ALL, RENDER, "zstd")
            assert isinstance(next(gen), Opened)
            assert psutil.Process(r.pid).nice() == min(19, base + nice)
            gen.close()
        finally:
            r.close()


@pytest.mark.parametrize("make", [InProcessRenderer, lambda: IsolatedRenderer(RendererConfig())], ids=["inprocess", "isolated"])
def test_a_page_carries_its_text_layer_only_where_drafts_will_read_it(make):
    """``--text-layer off`` (RenderConfig.with_text_layer("off")): the renderer reads no layer, so no page pays
    for one and no row carries it to the engine; ``speculate`` (the default): the layer rides with the page."""
    from padoc_ray.output.rows import TEXT_LAYER_KEY
    from padoc_ray.protocol.text_layer import TextLayer

    assert RENDER.with_text_layer("speculate") is RENDER and RENDER.text_layer
    r = make()
    try:
        got = {}
        for mode in ("speculate", "off"):
            ev = list(r.render_document(text_pdf(1), "doc.pdf", ALL, RENDER.with_text_layer(mode), "zstd"))
            (page,) = [e for e in ev if isinstance(e, PageRendered)]
            got[mode] = page.meta[TEXT_LAYER_KEY]
    finally:
        r.close()
    assert got["off"] is None
    assert TextLayer.from_bytes(got["speculate"]).text.strip()  # the text the factory drew
