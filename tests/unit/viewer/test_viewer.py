"""The viewer without a browser or a server process: the sanitizer, page views, what it reads of an
output, the export (also through `padoc-ray view --export`), and the app's answers in process
(FastAPI's TestClient: Host names, images outside the inputs). The `padoc-ray view` server process:
tests/cluster/viewer/test_viewer_server.py; in a browser: tests/cluster/viewer/test_viewer_browser.py."""

from __future__ import annotations

import os
import re
import shutil

import pyarrow.parquet as pq
import pytest

from padoc_ray import status
from padoc_ray.viewer import data as viewer_data
from padoc_ray.viewer.app import ViewerConfig, make_app
from padoc_ray.viewer.data import DocQuery, Output, ViewerInputError
from padoc_ray.viewer.export import export
from padoc_ray.viewer.images import PageImages, common_prefix
from padoc_ray.viewer.pageview import embed_json, page_view
from padoc_ray.viewer.sanitize import sanitize_html

from tests.helpers import viewer_demo


@pytest.mark.parametrize("dirty, clean", [
    ("<script>alert(1)</script>x", "x"),
    ("<img src=x onerror=alert(1)>y", "y"),
    ('<td colspan="2" onclick="alert(1)" style="x">a</td>', '<td colspan="2">a</td>'),
    ('<td colspan="2 onmouseover=alert(1)">a</td>', "<td>a</td>"),
    ('<a href="javascript:alert(1)">link</a>', "link"),
    ("<svg><script>alert(1)</script><circle/></svg>z", "z"),
    ("<style>*{}</style><iframe src=x></iframe>w", "w"),
    ("<table><tr><td>1 &lt; 2</td></tr></table>", "<table><tr><td>1 &lt; 2</td></tr></table>"),
    ("<b>open<i>nested</b>tail", "<b>open<i>nested</i></b>tail"),
    ("<script>never closed", ""),
    ("<!-- <script>x</script> -->c", "c"),
    ("<p>a<br/>b</p>", "<p>a<br>b</p>"),
    # a self-closed svg or math holds nothing: what follows it stays (a table after an inline <svg/>)
    ("<svg onload=z/>after", "after"),
    ("<math/><table><tr><td>1</td></tr></table>", "<table><tr><td>1</td></tr></table>"),
    ("<svg/>x<svg>inside</svg>y", "xy"),
    # a browser reads on after <script/> or <iframe/> as raw text: it goes with them
    ("<script/>alert(1)</script>z", "z"),
    ("<iframe/>w", ""),
])
def test_sanitizer_keeps_only_the_allow_list(dirty, clean):
    assert sanitize_html(dirty) == clean


def test_embedded_json_cannot_close_its_script_element():
    text = embed_json({"md": "</script><script>alert(1)</script>&"})
    assert "<" not in text and ">" not in text and "&" not in text


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    return viewer_demo.build(str(tmp_path_factory.mktemp("demo")), copies=6)


def _row(demo, name, page):
    return next(r for r in demo["rows"] if r["source_uri"].endswith("/" + name) and r["page_index"] == page)


def test_page_view_blocks_follow_the_span_map(demo):
    row = _row(demo, "good0.pdf", 0)
    view = page_view(row)
    assert [b["order"] for b in view["blocks"]] == [s["order"] for s in row["spans"]]
    assert [r["order"] for r in view["regions"]] == [r["order"] for r in row["regions"]]
    by = {b["category"]: b["html"] for b in view["blocks"]}
    assert by["title"] == "<h3>Quarterly report</h3>" and by["table"].startswith("<table>")
    assert "header" not in by  # page furniture is not in the Markdown, its box still is
    assert "header" in {r["category"] for r in view["regions"]}
    old = page_view({**row, "spans": None})  # a row written before the span map: the same blocks
    assert old["blocks"] == view["blocks"]
    evil = page_view(_row(demo, "evil.pdf", 0))
    html = "".join(b["html"] for b in evil["blocks"])
    assert "<script" not in html and "<img" not in html and not re.search(r"<[^>]*\son\w+=", html)
    assert "&lt;script&gt;" in html  # shown as text


def test_documents_table_counts_filters_search_and_paging(demo, monkeypatch):
    out = Output(demo["out"])
    docs = demo["documents"].to_pylist()
    assert dict(out.counts("status")) == {s: sum(d["status"] == s for d in docs) for s in {d["status"] for d in docs}}
    assert dict(out.counts("error_code"))[status.NOT_PDF] == 1
    rows, n = out.select(DocQuery(status=status.DOC_PARTIAL))
    assert n == 6 and {r["status"] for r in rows} == {status.DOC_PARTIAL}
    assert out.select(DocQuery(q="EVIL"))[1] == 1
    assert out.select(DocQuery(error_code="-"))[1] == len(docs) - 1  # "-": no error code
    monkeypatch.setattr(viewer_data, "PAGE_SIZE", 3)
    pages = [out.select(DocQuery(page=k))[0] for k in range(4)]
    assert [len(p) for p in pages] == [3, 3, 2, 0]
    assert sorted(r["source_uri"] for p in pages for r in p) == sorted(d["source_uri"] for d in docs)


def test_a_document_reads_only_its_row_groups(demo, monkeypatch):
    out = Output(demo["out"])
    read = []
    real = pq.ParquetFile.read_row_groups
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", lambda self, groups, **kw: (read.extend(groups),
                                                                                      real(self, groups, **kw))[1])
    uri = os.path.join(demo["src"], "good3.pdf")
    got = out.page_rows(uri)
    assert [(r["page_index"], r["status"]) for r in got] == [(0, status.OK), (1, status.RUNAWAY)]
    total = pq.ParquetFile(os.path.join(demo["out"], "pages", "r1_listing.parquet")).metadata.num_row_groups
    assert 0 < len(read) <= 2 < total


def test_an_output_without_documents_table_is_a_clear_error(tmp_path):
    (tmp_path / "pages").mkdir()
    with pytest.raises(ViewerInputError, match="no documents table"):
        Output(str(tmp_path))


def test_source_root_relocates_the_inputs(demo, tmp_path):
    moved = tmp_path / "moved"
    shutil.copytree(demo["src"], moved)
    uris = demo["documents"].column("source_uri").to_pylist()
    assert common_prefix(uris) == demo["src"] + "/"
    images = PageImages(out_storage(), source_root=str(moved), prefix=common_prefix(uris))
    row = _row(demo, "good1.pdf", 0)
    assert images.locate(row["source_uri"]) == str(moved / "good1.pdf")
    os.rename(demo["src"], demo["src"] + ".gone")
    try:
        assert images.png(row)[:4] == b"\x89PNG" and images.png(row) and images.renders == 1  # cached
        from fastapi.testclient import TestClient

        client = TestClient(make_app(demo["out"], ViewerConfig(source_root=str(moved))), base_url="http://127.0.0.1")
        r = client.get("/image", params={"uri": row["source_uri"], "page": 0})
        assert r.status_code == 200 and r.headers["content-type"] == "image/png"
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert TestClient(make_app(demo["out"]), base_url="http://127.0.0.1").get(
            "/image", params={"uri": row["source_uri"], "page": 0}).status_code == 404
    finally:
        os.rename(demo["src"] + ".gone", demo["src"])


def out_storage():
    from padoc_ray.storage import StorageConfig

    return StorageConfig()


def test_export_has_every_error_and_a_sample_per_status(demo, tmp_path):
    out = Output(demo["out"])
    info = export(out, PageImages(out_storage()), str(tmp_path / "report"), per_status=2)
    errors = sum(r["status"] != status.OK for r in demo["rows"])
    assert info["errors"] == errors
    # every partial document's failed page, the evil page (ok: 1 document), the bad input has no page
    assert info["pages"] == 6 + 1
    index = (tmp_path / "report" / "index.html").read_text()
    assert index.count("<tr>") == 1 + 6 + 1 + 1 and status.NOT_PDF in index  # the header, then each document
    assert (tmp_path / "report" / "static" / "page.js").exists()
    pages = [(tmp_path / "report" / f"p{k}.html").read_text() for k in range(info["pages"])]
    assert all('src="static/page.js"' in p and "pd-page-data" in p and "/doc?" not in p for p in pages)
    assert sum(status.RUNAWAY in p for p in pages) == 6
    assert all((tmp_path / "report" / f"p{k}.png").exists() for k in range(info["pages"]))


def test_view_export_through_the_command_line(tmp_path, capsys):
    """``padoc-ray view OUT --export DIR --export-pages N --source-root ROOT``: the flags reach the export. The
    inputs moved after the run: without --source-root no page image can be drawn; with it every sampled page
    has its PNG. --export-pages 0 samples the error pages only, 1 adds one page per other document status."""
    from padoc_ray.cli import main

    demo = viewer_demo.build(str(tmp_path / "run"), copies=3)
    moved = str(tmp_path / "moved")
    shutil.move(str(tmp_path / "run" / "in"), moved)

    def run(report: str, *flags: str) -> tuple[str, list[str]]:
        assert main(["view", demo["out"], "--export", str(tmp_path / report), *flags]) == 0
        line = capsys.readouterr().out.strip()
        return line, sorted(f for f in os.listdir(tmp_path / report) if f.endswith(".png"))

    errors = sum(r["status"] != status.OK for r in demo["rows"])
    line, pngs = run("lost", "--export-pages", "1")
    assert line.endswith(f"4 page views, {errors} error rows") and pngs == []  # the sources are gone
    line, pngs = run("found", "--export-pages", "1", "--source-root", moved)
    assert line.endswith(f"4 page views, {errors} error rows") and pngs == [f"p{k}.png" for k in range(4)]
    line, pngs = run("errors-only", "--export-pages", "0", "--source-root", moved)
    assert line.endswith(f"3 page views, {errors} error rows") and len(pngs) == 3


def test_the_viewer_answers_only_to_the_names_it_was_started_for(demo):
    """DNS rebinding: a web page the user opens can point its own name at 127.0.0.1:8100; the browser then
    sends that name as Host. Only 127.0.0.1, localhost, --host and --allowed-host get an answer."""
    from fastapi.testclient import TestClient

    app = make_app(demo["out"], ViewerConfig(allowed_hosts=("viewer.internal",)))
    client = TestClient(app, base_url="http://127.0.0.1:8100")
    assert client.get("/").status_code == 200
    for name in ("localhost:8100", "viewer.internal", "127.0.0.1"):
        assert client.get("/", headers={"Host": name}).status_code == 200, name
    for name in ("evil.example", "evil.example:8100", "127.0.0.1.evil.example", ""):
        r = client.get("/", headers={"Host": name})
        assert r.status_code == 400 and "First paragraph" not in r.text, name
    assert TestClient(make_app(demo["out"], ViewerConfig(host="10.1.2.3")),
                      base_url="http://10.1.2.3").get("/").status_code == 200


def test_a_crafted_output_cannot_make_the_viewer_render_a_file_outside_its_inputs(tmp_path):
    """A row whose source_uri climbs out of the inputs (``in/../outside/secret.pdf``), viewed with and without
    --source-root: refused (404, nothing rendered); the output's own pages still render; --any-source opts in."""
    from fastapi.testclient import TestClient

    demo = viewer_demo.build(str(tmp_path / "d"), crafted="../outside/secret.pdf")
    crafted = os.path.join(demo["src"], "../outside/secret.pdf")
    assert os.path.exists(crafted)
    good = os.path.join(demo["src"], "good0.pdf")
    moved = tmp_path / "moved"
    shutil.copytree(demo["src"], moved)

    def image(cfg, uri):
        client = TestClient(make_app(demo["out"], cfg), base_url="http://127.0.0.1")
        return client.get("/image", params={"uri": uri, "page": 0})

    for cfg in (ViewerConfig(), ViewerConfig(source_root=str(moved))):
        r = image(cfg, crafted)
        assert r.status_code == 404 and "lies outside" in r.text, (cfg, r.status_code, r.text[:200])
        assert image(cfg, good).status_code == 200
    assert image(ViewerConfig(any_source=True), crafted).status_code == 200
    from padoc_ray.viewer.images import confined

    assert not confined("s3://b/in/../other/x.pdf", "s3://b/in") and confined("s3://b/in/a/x.pdf", "s3://b/in")
