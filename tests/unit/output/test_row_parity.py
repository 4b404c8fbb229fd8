"""Issue 26, one path from renderer to row: the batch job's stages (``rasterize`` then
``EngineStage``), the online service's document path (``RenderPool`` then the engine replica's
``parse_page``) and ``padoc-ray parse-page`` (its flags, ``render_input`` then ``parse_rows``; issue 47)
give the same page rows, images and document status for the same input, and one row shape: Serve's
page JSON and parse-page's JSON are the one row JSON (``rows.row_json``), parse-page's with its own keys.

Both run in this process on the scripted engine (it replays the teacher-forced truth of
examples/ground_truth.json, so pages that have truth come back with content, the others with an
empty layout): no Ray cluster, no
Ray Serve, no HTTP. Each surface keeps its own messages for its own caps (the batch job names its
flags, the service its request fields); codes and everything else must agree."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os

import pyarrow as pa
import pytest

from padoc_ray.engine.fake import ScriptedEngine
from padoc_ray.groundtruth import truth_from_json
from padoc_ray.host import HostConfig, PageHost
from padoc_ray.output import rows
from padoc_ray.pdf import TOO_MANY_FRAMES, RenderConfig, doc_id_of
from padoc_ray.pipeline import ledger
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.pipeline.limits import TOO_MANY_PAGES, InputLimits
from padoc_ray.pipeline.stages import EngineStage, rasterize
from padoc_ray.raster import DocFailed, RendererConfig
from padoc_ray.raster.document import PAGE_OUT_OF_RANGE, DocumentOpened
from padoc_ray.serve.app import EngineReplica
from padoc_ray.serve.config import ServeConfig
from padoc_ray.serve import documents
from padoc_ray.serve.documents import RenderPool, document_status, page_choice

from tests.helpers.pdf_factory import png_page, text_pdf, xref_broken_pdf
from tests.unit.scheduler.test_run_page import P

from tests.conftest import ROOT  # noqa: E402
EXAMPLES = os.path.join(ROOT, "examples")
GT = os.path.join(EXAMPLES, "ground_truth.json")
MODEL_ID = "tiny"
CAP = 4  #: both surfaces' page cap here: the batch job's --doc-page-limit, the service's max_pages
FRAMES = 2  #: both surfaces' frame cap here (InputLimits.max_image_frames)

#: row fields that differ between the two surfaces by design, each with its reason
DIFFER_BY_DESIGN = {
    "run_id": "each batch run and each request has its own id",
    "processed_at": "the wall-clock time the row was made",
    "render_s": "timing", "e2e_s": "timing", "ttft_s": "timing", "layout_s": "timing",
    "engine_s": "timing (the page's share of its engine's busy time)",
    "cached_tokens": "prefix-cache hits depend on what ran before and on the cache salt (the service salts "
                     "each request, the batch job does not)",
    "source_size": "the batch job records the input as its listing saw it, to read a replaced input again; "
                   "an upload has no listing (null)",
    "source_mtime": "likewise",
    "source_uri": "the batch job writes the input's URI, the service the upload's label (its file name), "
                  "parse-page the file's name: compared by base name instead",
}



def _mixed_pdf() -> bytes:
    """Two pages: a normal one, and one too large to render (absurd_page_size): a partial document."""
    import io

    from reportlab.pdfgen import canvas

    buf = io.BytesIO()
    c = canvas.Canvas(buf, pagesize=(612, 792), invariant=1)
    c.drawString(36, 400, "a page that renders")
    c.showPage()
    c.setPageSize((20000, 20000))
    c.drawString(36, 400, "a page too large to render")
    c.showPage()
    c.save()
    return buf.getvalue()


def _tiff(frames: int) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    imgs = [Image.new("RGB", (200, 260), (255, 255, 255 - 40 * i)) for i in range(frames)]
    imgs[0].save(buf, format="TIFF", save_all=True, append_images=imgs[1:])
    return buf.getvalue()


def _inputs() -> dict[str, bytes]:
    files = {n: open(os.path.join(EXAMPLES, n), "rb").read() for n in ("report.pdf", "paper.pdf", "memo.pdf")}
    files.update({
        "plain.pdf": text_pdf(3),  # no truth: its pages are empty layouts
        "repaired.pdf": xref_broken_pdf(text_pdf(2)),  # opens after qpdf's repair (repaired = true)
        "mixed.pdf": _mixed_pdf(),  # one page ok, one page error: partial
        "huge.pdf": text_pdf(1, size=(20000, 20000)),  # its one page fails: failed
        "corrupt.pdf": b"%PDF-1.7\n" + bytes(range(256)) * 40,  # a document-level error
        "notes.txt": b"just some text, not a PDF",  # not_pdf (the batch job: skipped)
        "long.pdf": text_pdf(CAP + 2),  # more pages than the cap: too_many_pages, nothing rendered
        "photo.png": png_page(),  # a page image
        "scan.tif": _tiff(FRAMES),  # a multi-page scan: one page per frame
        "frames.tif": _tiff(FRAMES + 1),  # more frames than the cap: too_many_frames
    })
    return files


def _host() -> PageHost:
    with open(GT, "rb") as f:
        truth = truth_from_json(f.read())
    eos = P.vocab.end_of_stream  # a page without truth: an empty layout, as the no-op engine writes

    def script(req):
        return list(req.forced_tokens) if req.forced_tokens else [eos]

    return PageHost("unused", HostConfig(), truth=truth, engine=ScriptedEngine(script, chunk=3), model_protocol=P)


# ---- the batch job: rasterize, then EngineStage (no Ray) --------------------------------------------------
async def _batch(path: str, data: bytes, cfg: BatchConfig) -> tuple[list[dict], dict[int, str], dict]:
    stage = EngineStage(cfg)
    stage.host = await _host().start()  # what _ensure_host does, with the scripted engine
    batch = pa.Table.from_pylist([{"uri": path, "size": len(data), "done": [], "doc_id": None}])
    out, images = [], {}
    for table in rasterize(batch, cfg, MODEL_ID):
        for r in table.to_pylist():
            if r["image_bytes"] is not None:
                images[r["page_index"]] = hashlib.sha256(r["image_bytes"]).hexdigest()
        async for done in stage(table):
            out += done.to_pylist()
    doc = ledger.documents_table(rows.to_table(out), [(path, len(data))], cfg.inputs.pages,
                                 cfg.inputs.max_pages_per_doc)
    return out, images, doc.to_pylist()[0]


# ---- the service: RenderPool, then the engine replica's parse_page (no Serve, no HTTP) -------------------
async def _serve(name: str, data: bytes, cfg: ServeConfig, wanted) -> tuple[list[dict], dict[int, str], object]:
    replica = EngineReplica.__new__(EngineReplica)  # its __init__ starts a host from the config (see below)
    replica.host = await _host().start()
    pool = RenderPool(cfg.renderer, 1)
    base = dict(run_id="request", uri=name, doc_id=doc_id_of(data), mode=cfg.host.mode, model_id=MODEL_ID)
    out, images, tasks, verdict = [], {}, [], None
    try:
        async with contextlib.aclosing(pool.render(data, name, page_choice(wanted, cfg.max_pages), cfg.render,
                                                   cfg.image_encoding, base,
                                                   max_frames=cfg.limits.max_image_frames)) as items:
            async for item in items:
                if isinstance(item, DocFailed):
                    verdict = item
                elif isinstance(item, DocumentOpened):
                    verdict = item
                elif item.rendered:
                    images[item.row["page_index"]] = hashlib.sha256(item.image).hexdigest()
                    tasks.append(asyncio.create_task(replica.parse_page(item.row, item.image, "tenant", "salt")))
                else:
                    out.append(item.row)
        out += await asyncio.gather(*tasks)
    finally:
        pool.close()
    # the service's job store keeps rows as Parquet in the batch job's schema: compare them as such
    return rows.to_table(sorted(out, key=lambda r: r["page_index"])).to_pylist(), images, verdict


# ---- parse-page: its flags, render_input, parse_rows (no engine process), then its JSON -------------------------
async def _parse_page(path: str, pages, model_dir: str) -> tuple[list[dict], dict[int, str], object, list]:
    """parse-page's rows (as the batch job's schema), images, verdict (DocFailed, or the page count), and for
    each parsed page the JSON it prints with the row it printed it from."""
    from padoc_ray.cli import build_parser
    from padoc_ray.cli.parse import page_json, render_input
    from padoc_ray.inputs import parse_rows

    argv = ["parse-page", path, "--model", model_dir, "--doc-page-limit", str(CAP), "--image-frame-limit",
            str(FRAMES), *(["--page", str(pages[0] + 1)] if pages else [])]
    doc = render_input(path, build_parser().parse_args(argv))
    images = {p.row["page_index"]: hashlib.sha256(p.image).hexdigest() for p in doc.pages if p.rendered}
    host = await _host().start()
    try:
        done = await parse_rows(host, doc.pages)
    finally:
        host.shutdown()
    printed = [(page_json(row, rec, family="padoc", equals_truth=None), row) for row, rec in done if rec is not None]
    out = rows.to_table([row for row, _ in done]).to_pylist()
    return out, images, doc.failed or doc.page_count, printed


def _same_row_shape(printed: dict, row: dict, serve_row: dict) -> None:
    """parse-page's JSON of a page is its row's JSON plus its own keys (the same values, ``spans`` as
    [order, start, end] lists, each region with its index and ignore besides), and has the shape of what
    Serve answers for that page (``rows.row_json`` of Serve's row) plus those keys."""
    from padoc_ray.cli.parse import PAGE_JSON_EXTRAS

    shared, served = rows.row_json(row), rows.row_json(serve_row)
    assert set(shared) == set(served) and "run_id" not in served
    assert set(printed) == set(served) | set(PAGE_JSON_EXTRAS), set(printed) ^ (set(served) | set(PAGE_JSON_EXTRAS))
    for k, v in shared.items():
        if k == "spans":
            assert printed[k] == [[s["order"], s["start"], s["end"]] for s in v]
        elif k == "regions":
            assert [{k2: r[k2] for k2 in s} for r, s in zip(printed[k], v, strict=True)] == v
            assert all(set(r) == set(s) | {"index", "ignore"} for r, s in zip(printed[k], served[k], strict=True))
        else:
            assert printed[k] == v, k


def _comparable(r: dict) -> dict:
    out = {k: v for k, v in r.items() if k not in DIFFER_BY_DESIGN}
    out["source_name"] = os.path.basename(r["source_uri"])
    return out


@pytest.mark.parametrize("pages", [None, (1,)], ids=["all-pages", "page-2"])
def test_batch_and_serve_make_the_same_rows(tmp_path, pages):
    files = _inputs()
    (tmp_path / "in").mkdir()
    for n, d in files.items():
        (tmp_path / "in" / n).write_bytes(d)
    bcfg = BatchConfig.from_flat(input=str(tmp_path / "in"), output=str(tmp_path / "out"), model="unused", pages=pages,
                       limits=InputLimits(max_doc_pages=CAP, max_image_frames=FRAMES), render=RenderConfig(),
                       image_encoding="zstd", renderer=RendererConfig())
    scfg = ServeConfig(model="unused", max_pages=CAP, render=RenderConfig(), image_encoding="zstd",
                       limits=InputLimits(max_image_frames=FRAMES))

    async def surfaces(name: str, data: bytes):
        path = str(tmp_path / "in" / name)
        return (await _batch(path, data, bcfg), await _serve(name, data, scfg, pages),
                await _parse_page(path, pages, str(tmp_path / MODEL_ID)))

    assert documents.row_json is rows.row_json  # the one row JSON: Serve's pages are rows.row_json(row)
    seen = set()
    for name, data in files.items():
        (b_rows, b_images, b_doc), (s_rows, s_images, verdict), (p_rows, p_images, p_verdict, printed) = \
            asyncio.run(surfaces(name, data))
        b_doc_level = [r for r in b_rows if r["page_index"] == -1]
        if pages is not None and name in ("memo.pdf", "huge.pdf", "photo.png"):
            # a one-page document asked for page 2: by design the batch job drops the page (--pages applies to
            # every input: nothing selected, no row, so the documents table cannot count its pages: missing),
            # the service refuses the request (page_out_of_range), parse-page renders nothing (and exits 2:
            # "page 2 does not exist")
            assert b_rows == [] and b_doc["status"] == "missing", name
            assert isinstance(verdict, DocFailed) and verdict.code == PAGE_OUT_OF_RANGE, (name, verdict)
            assert p_rows == [] and p_verdict == 1, (name, p_verdict)
            seen.add("out_of_range")
            continue
        if b_doc_level:  # a document-level failure: one batch row; the service refuses the document
            (row,) = b_rows
            assert isinstance(verdict, DocFailed), (name, verdict)
            assert (row["error_code"], row["page_count"], row["doc_id"]) == (verdict.code, verdict.page_count,
                                                                              doc_id_of(data)), name
            if verdict.code != TOO_MANY_PAGES:
                assert row["error_message"] == verdict.message, name
            else:  # the cap's message names each surface's own settings
                assert f"{CAP + 2} of its {CAP + 2} pages selected" in row["error_message"], row
                assert "(--doc-page-limit)" in row["error_message"], row
                assert verdict.message.startswith(f"{CAP + 2} pages selected, over this service's limit of {CAP} "
                                                  f"per request"), verdict
            assert b_doc["error_code"] == verdict.code and b_doc["status"] in (verdict.code, "skipped"), name
            assert s_rows == [] and s_images == {}, name
            # parse-page: the same code (its stderr line), its own message for the page cap
            assert isinstance(p_verdict, DocFailed) and p_rows == [] and p_images == {}, (name, p_verdict)
            assert (p_verdict.code, p_verdict.page_count) == (verdict.code, verdict.page_count), name
            if verdict.code != TOO_MANY_PAGES:
                assert p_verdict.message == verdict.message, name
            else:
                assert p_verdict.message.startswith(f"{CAP + 2} of its {CAP + 2} pages selected, over the limit of "
                                                    f"{CAP} (--doc-page-limit); select one with --page"), p_verdict
            seen.add(verdict.code)
            continue
        assert isinstance(verdict, DocumentOpened), (name, verdict)
        assert verdict.page_count == b_doc["page_count"] and len(verdict.pages) == b_doc["pages_selected"], name
        assert [r["page_index"] for r in b_rows] == [r["page_index"] for r in s_rows] == list(verdict.pages), name
        assert [_comparable(r) for r in b_rows] == [_comparable(r) for r in s_rows], name
        assert [_comparable(r) for r in p_rows] == [_comparable(r) for r in b_rows], name
        assert p_verdict == verdict.page_count and p_images == b_images, name
        parsed = [r for r in s_rows if r["e2e_s"] is not None]  # the pages that reached the engine
        assert len(printed) == len(parsed), name
        for (j, row), r in zip(printed, parsed):
            _same_row_shape(j, row, r)
            if j["regions"] and j["spans"]:
                seen.add("json")
        for r in b_rows + s_rows:  # both surfaces carry the engine time of a page that ran, none for one that did not
            if r["status"] == "ok":
                assert r["engine_s"] is not None, (name, r["page_index"])
            if r["e2e_s"] is None:  # it never reached the engine (its rendering failed)
                assert r["engine_s"] is None, (name, r["page_index"], r["status"])
        assert b_images == s_images, name  # the very same encoded images went to the engine
        if any(r["regions"] for r in b_rows):
            seen.add("content")
        # one document-status vocabulary (padoc_ray/status.py): documents.parquet says what Serve answers
        assert b_doc["status"] == document_status(s_rows), name
        seen.add(b_doc["status"])
    if pages is None:  # every outcome was covered
        assert seen >= {"ok", "partial", "failed", "content", "json", "corrupt_pdf", "not_pdf", TOO_MANY_PAGES,
                        TOO_MANY_FRAMES}, seen
    else:
        assert seen >= {"ok", "content", "json", "out_of_range"}, seen


def test_both_surfaces_start_their_host_from_the_config(tiny_model_dir):
    """EngineStage._ensure_host and EngineReplica.__init__ are one PageHost.from_config: the model,
    the host config and the replay truth."""
    from padoc_ray.storage import StorageConfig

    async def go():
        stage = EngineStage(BatchConfig.from_flat(input="x", output="y", model=tiny_model_dir, replay_gt=GT,
                                        host=HostConfig(engine="noop")))
        await stage._ensure_host()
        replica = EngineReplica.__new__(EngineReplica)
        await EngineReplica.__init__(replica, ServeConfig(model=tiny_model_dir, replay_gt=GT,
                                                          host=HostConfig(engine="noop", pages_in_flight=3)))
        plain = await PageHost.from_config(tiny_model_dir, HostConfig(engine="noop"), StorageConfig())
        for h in (stage.host, replica.host, plain):
            assert h.started and h.model_dir == tiny_model_dir
        assert stage.host.truth_for("report.pdf", 0) is not None
        assert replica.host.truth_for("/any/where/report.pdf", 0) is not None
        assert replica.host.cfg.pages_in_flight == 3 and plain.truth == {}
        for h in (stage.host, replica.host, plain):
            h.shutdown()

    asyncio.run(go())


def test_one_page_choice_with_each_surfaces_rules():
    from padoc_ray.pdf import PdfError
    from padoc_ray.pipeline.stages import page_choice as batch_choice

    def refusal(choice, count):
        with pytest.raises(PdfError) as e:
            choice.select(count)
        return e.value.code, str(e.value.message)

    batch = BatchConfig.from_flat(input="x", output="y", model="m", pages=(0, 2, 9), max_pages_per_doc=None,
                        limits=InputLimits(max_doc_pages=2))
    assert batch_choice(batch).select(3) == [0, 2]  # page 10 of a 3-page document: dropped
    assert refusal(batch_choice(BatchConfig.from_flat(input="x", output="y", model="m", limits=InputLimits(max_doc_pages=2))),
                   5) == (TOO_MANY_PAGES, "5 of its 5 pages selected, over the limit of 2 (--doc-page-limit); select "
                                          "fewer with --pages/--max-pages-per-doc or raise it")
    assert batch_choice(BatchConfig.from_flat(input="x", output="y", model="m", max_pages_per_doc=2,
                                    limits=InputLimits(max_doc_pages=2))).select(5) == [0, 1]
    assert page_choice((0, 2), 5).select(3) == [0, 2]
    assert refusal(page_choice((0, 2, 9), 5), 3) == (PAGE_OUT_OF_RANGE, "page 10 does not exist: the document has "
                                                                        "3 page(s)")
    assert refusal(page_choice(None, 2), 5) == (
        TOO_MANY_PAGES, "5 pages selected, over this service's limit of 2 per request (select fewer with pages=, or "
                        "use /v1/jobs)")


def test_document_rows_skip_count_only_and_an_early_stop():
    """Skipped pages are selected but not rendered; count_only renders nothing; a consumer that
    stops early abandons the document, and the pool's renderer thread renders the next one."""
    from padoc_ray.raster import InProcessRenderer
    from padoc_ray.raster.document import PageChoice, PageRow, document_rows

    data = text_pdf(3)
    base = dict(run_id="r", uri="a.pdf", doc_id=doc_id_of(data), mode="fork", model_id=MODEL_ID)
    items = list(document_rows(InProcessRenderer(), data, "a.pdf", base, PageChoice(), RenderConfig(), "zstd",
                               skip={0}))
    assert items[0] == DocumentOpened(3, False, (0, 1, 2), (1, 2))
    assert [(type(i), i.row["page_index"], i.row["page_count"], i.rendered) for i in items[1:]] == \
           [(PageRow, 1, 3, True), (PageRow, 2, 3, True)]
    items = list(document_rows(InProcessRenderer(), data, "a.pdf", {}, PageChoice(), RenderConfig(), "zstd",
                               count_only=True))
    assert items == [DocumentOpened(3, False, (0, 1, 2), (0, 1, 2))]

    async def go():
        pool = RenderPool(RendererConfig(), 1)
        try:
            async with contextlib.aclosing(pool.render(data, "a.pdf", PageChoice(), RenderConfig(), "zstd", base,
                                                       max_frames=10)) as gen:
                async for item in gen:
                    if isinstance(item, PageRow):
                        break  # the client left
            (renderer,) = pool._all
            assert renderer._proc is None  # the abandoned document's renderer process was ended
            got = [item async for item in pool.render(data, "a.pdf", PageChoice(), RenderConfig(), "zstd", base,
                                                      max_frames=10)]
            assert [i.row["page_index"] for i in got if isinstance(i, PageRow)] == [0, 1, 2]
            assert pool._all == [renderer]  # the same long-lived thread and renderer
        finally:
            pool.close()

    asyncio.run(go())


def test_the_service_takes_its_frame_cap_from_the_input_limits():
    assert ServeConfig(model="m").limits == InputLimits() and InputLimits().max_image_frames == 1000
    cfg = ServeConfig.from_args({"model": "m", "limits": {"max_image_frames": 5}})
    assert cfg.limits.max_image_frames == 5 and cfg.limits.max_doc_pages == InputLimits().max_doc_pages
