"""``padoc-ray view`` in a real browser: Debian's chromium driven by Playwright (never a downloaded
browser). The DOM is checked, never pixels; one screenshot per view is kept under pytest's tmp dir.
Without chromium or Playwright the browser tests skip, saying which is missing, and fail on CI
(tests/helpers/components.py); the two tests of the server alone run either way."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import urllib.parse

import pytest

from padoc_ray import status

from tests.helpers import components, viewer_demo
from tests.conftest import ROOT


@pytest.fixture(scope="module")
def viewer(tmp_path_factory):
    root = tmp_path_factory.mktemp("viewer")
    demo = viewer_demo.build(str(root))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.Popen([sys.executable, "-m", "padoc_ray.cli", "view", demo["out"], "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    line = proc.stdout.readline()
    assert line.startswith("padoc-ray view: http://127.0.0.1:"), (line, proc.stderr.read() if proc.poll() else "")
    url = line.split(": ", 1)[1].strip()
    yield {"url": url, "demo": demo, "proc": proc, "shots": root / "screenshots"}
    if proc.poll() is None:
        proc.kill()
        proc.wait()


@pytest.fixture(scope="module")
def browser():
    chromium, sync_api = components.chromium(), components.playwright_sync_api()  # else skip, or fail on CI
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        yield b
        b.close()


@pytest.fixture()
def page(browser, viewer):
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
    pg = ctx.new_page()
    pg.requests, pg.dialogs, pg.errors = [], [], []
    pg.on("request", lambda r: pg.requests.append(r.url))
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("pageerror", lambda err: pg.errors.append(str(err)))
    yield pg
    local = urllib.parse.urlsplit(viewer["url"]).netloc
    assert pg.requests and all(urllib.parse.urlsplit(u).netloc == local for u in pg.requests), pg.requests
    assert pg.dialogs == []
    ctx.close()


def shot(pg, viewer, name):
    viewer["shots"].mkdir(exist_ok=True)
    pg.screenshot(path=str(viewer["shots"] / f"{name}.png"), full_page=True)


def doc_url(viewer, name, page=None):
    uri = os.path.join(viewer["demo"]["src"], name)
    return viewer["url"] + "doc?" + urllib.parse.urlencode({"uri": uri, **({} if page is None else {"page": page})})


def test_table_counts_equal_the_documents_table(page, viewer):
    page.goto(viewer["url"])
    docs = viewer["demo"]["documents"].to_pylist()
    want = {}
    for d in docs:
        want[d["status"]] = want.get(d["status"], 0) + 1
    got = {el.get_attribute("data-status"): int(el.get_attribute("data-count"))
           for el in page.query_selector_all(".pd-count[data-status]")}
    assert got == want
    assert len(page.query_selector_all("tr.pd-doc")) == len(docs)
    # the bad input's row shows its code
    bad = page.query_selector(f'tr.pd-doc[data-status="{status.DOC_SKIPPED}"] .pd-code')
    assert bad.inner_text() == status.NOT_PDF
    shot(page, viewer, "documents")
    # a filter and the file-name search
    # (both are links to another page: wait for it, not only for the click; reading the rows while the new page
    # loads found none, once in a loaded suite)
    with page.expect_navigation():
        page.click(f'.pd-count[data-status="{status.DOC_PARTIAL}"]')
    assert [r.get_attribute("data-status") for r in page.query_selector_all("tr.pd-doc")] == [status.DOC_PARTIAL]
    page.goto(viewer["url"])
    page.fill("input[name=q]", "EVIL")
    with page.expect_navigation():
        page.click(".pd-search button")
    assert "q=EVIL" in page.url
    assert [r.inner_text().split("\t")[0] for r in page.query_selector_all("tr.pd-doc")] == ["evil.pdf"]


def test_a_page_shows_one_box_per_region_and_links_box_and_markdown(page, viewer):
    page.goto(doc_url(viewer, "good0.pdf", 0))
    page.wait_for_selector(".pd-box")
    row = next(r for r in viewer["demo"]["rows"] if r["source_uri"].endswith("good0.pdf") and r["page_index"] == 0)
    boxes = page.query_selector_all(".pd-box")
    assert sorted(int(b.get_attribute("data-order")) for b in boxes) == [r["order"] for r in row["regions"]]
    assert len(page.query_selector_all(".pd-block")) == len(row["spans"])
    page.wait_for_function("(() => { const i = document.querySelector('.pd-img');"
                           " return i.complete && i.naturalWidth > 0; })()")
    text = next(s for s in row["spans"] if row["regions"][s["order"]]["category"] == "text")["order"]
    page.click(f'.pd-box[data-order="{text}"]', position={"x": 5, "y": 5})
    active = page.query_selector_all(".pd-block.pd-active")
    assert [b.get_attribute("data-order") for b in active] == [str(text)]
    assert "First paragraph" in active[0].inner_text()
    shot(page, viewer, "page")
    # and the other way round: a block highlights its box
    table = next(s for s in row["spans"] if row["regions"][s["order"]]["category"] == "table")["order"]
    page.click(f'.pd-block[data-order="{table}"]')
    assert [b.get_attribute("data-order") for b in page.query_selector_all(".pd-box.pd-active")] == [str(table)]
    page.click("summary")
    assert '"source_uri"' in page.inner_text(".pd-json")


def test_error_rows_show_their_code_and_lost_pages(page, viewer):
    page.goto(doc_url(viewer, "broken.pdf"))
    assert page.inner_text(".pd-error .pd-code") == status.NOT_PDF
    shot(page, viewer, "error")
    page.goto(doc_url(viewer, "good0.pdf", 1))
    assert page.inner_text(".pd-error .pd-code") == status.RUNAWAY
    assert "lost pages: 2" in page.inner_text(".pd-lost")


def test_content_with_script_runs_nothing(page, viewer):
    page.goto(doc_url(viewer, "evil.pdf", 0))
    page.wait_for_selector(".pd-block")
    assert page.evaluate("window.__pwned") is None
    md = page.query_selector(".pd-md")
    assert md.query_selector_all("script, img, [onerror], [onclick]") == []
    assert "window.__pwned = 1" in md.inner_text()  # the text is shown as text
    assert page.query_selector_all(".pd-md table td") and page.errors == []
    shot(page, viewer, "evil")


def test_an_exported_page_runs_its_own_scripts_and_no_inline_one_from_disk(browser, viewer, tmp_path):
    """``view --export`` pages open from file:// under the viewer's policy (a <meta> element): the page's
    own script draws its boxes, an inline script added to the page does not run."""
    from padoc_ray.storage import StorageConfig
    from padoc_ray.viewer.data import Output
    from padoc_ray.viewer.export import export
    from padoc_ray.viewer.images import PageImages

    out = Output(viewer["demo"]["out"])
    info = export(out, PageImages(StorageConfig()), str(tmp_path / "report"))
    assert info["pages"] > 0
    ctx = browser.new_context()
    pg = ctx.new_page()
    violations = []
    pg.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
    pg.goto((tmp_path / "report" / "p0.html").as_uri())
    pg.wait_for_selector(".pd-box")  # page.js ran
    ran = pg.evaluate("() => { const s = document.createElement('script'); s.textContent = 'window.__inline = 1';"
                      " document.body.appendChild(s); return window.__inline; }")
    assert ran is None and any("script-src" in v for v in violations), violations
    pg.goto((tmp_path / "report" / "index.html").as_uri())
    assert pg.query_selector_all("table.pd-docs tr") and pg.evaluate("window.__inline") is None
    ctx.close()


def test_the_live_viewer_refuses_a_foreign_host_header(viewer):
    """What a rebinding page's requests look like (curl -H "Host: evil.example"): 400, no Markdown."""
    import http.client

    u = urllib.parse.urlsplit(viewer["url"])
    for name, code in (("evil.example", 400), (u.netloc, 200), (f"localhost:{u.port}", 200)):
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=30)
        conn.request("GET", "/", headers={"Host": name})
        r = conn.getresponse()
        body = r.read().decode()
        conn.close()
        assert r.status == code, (name, r.status, body[:200])
        assert ("pd-doc" in body) == (code == 200)


def test_sigterm_stops_it_cleanly(viewer):
    proc = viewer["proc"]
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0
