"""The Ray Serve endpoint over real HTTP on 127.0.0.1: `padoc-ray serve` with the real CPU vLLM
engine and the tiny model, teacher-forced (--replay) so pages have known, real-length outputs.

Two services, each its own `padoc-ray serve` process (own local Ray, own session): ``svc`` with a
bearer token and the usual limits, ``tight`` without auth and with an engine queue of one page (for
overload). Their output goes to files; each is stopped with SIGTERM and must leave no process.
"""

from __future__ import annotations

import base64
import contextlib
import concurrent.futures as cf
import http.client
import io
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import time
import urllib.parse

import pytest
import requests

from tests.conftest import BIN, ROOT, _env, _free_port
from tests.helpers import components

pytestmark = pytest.mark.engine

EXAMPLES = os.path.join(ROOT, "examples")
#: what an error message must never show: an absolute path of this machine, a Python traceback, a bucket
LEAKS = re.compile(r"(?<![\w:/])/(?:tmp|home|root|usr|var|work|proc|etc|opt|srv|mnt)/|Traceback|File \"|padoc-in")
GT = os.path.join(EXAMPLES, "ground_truth.json")
TOKEN = "test-token-123"
OTHER_TENANTS = ("tenant-b-token", "tenant-c-token")  # svc's other tenants
LONG_PAGES = 40
JOB_REGIONS = 2  #: regions of each page of job.pdf (the 40-page job that is run to its end)
EXAMPLE_PDFS = ("memo.pdf", "paper.pdf", "report.pdf")
#: an example PDF sent as CUT + its name is replayed with its pages' first JOB_REGIONS regions (the truth goes by name)
CUT = "cut-"
TIGHT_JOBS_BUCKET = "tight-jobs"  # the tight service's job store (s3://tight-jobs/store)


def _long_pdf_and_truth(tmp) -> tuple[str, str]:
    """A 40-page PDF (report.pdf's pages, repeated) and ground truth for it and the examples, so a
    job or a request on it runs long enough to be interrupted, with known results. Beside it
    ``job.pdf``, the same pages with shorter truth (each page's first :data:`JOB_REGIONS` regions): a
    40-page job that still runs for seconds, with a sixth of the decode steps (report.pdf's pages: about 250
    fork steps and 690 tokens each in full, 40 steps and 50 tokens cut to two regions)."""
    path = os.path.join(tmp, "long.pdf")
    _long_copy(path)
    shutil.copyfile(path, os.path.join(tmp, "job.pdf"))
    with open(GT) as f:
        gt = json.load(f)
    report = [g for g in gt if g["page_info"]["source_pdf"] == "report.pdf"]
    for i in range(LONG_PAGES):
        g = json.loads(json.dumps(report[i % 2]))
        g["page_info"].update(source_pdf="long.pdf", page_no=i, image_path=f"long_page{i}.png")
        short = json.loads(json.dumps(g))
        short["layout_dets"] = short["layout_dets"][:JOB_REGIONS]
        short["page_info"].update(source_pdf="job.pdf", image_path=f"job_page{i}.png")
        gt += [g, short]
    for g in [g for g in gt if g["page_info"]["source_pdf"] in EXAMPLE_PDFS]:  # the examples' pages, cut (CUT)
        cut = json.loads(json.dumps(g))
        cut["layout_dets"] = cut["layout_dets"][:JOB_REGIONS]
        cut["page_info"].update(source_pdf=CUT + g["page_info"]["source_pdf"],
                                image_path=CUT + g["page_info"]["image_path"])
        gt.append(cut)
    gt_path = os.path.join(tmp, "gt.json")
    with open(gt_path, "w") as f:
        json.dump(gt, f)
    return path, gt_path


class Service:
    def __init__(self, tmp, model: str, gt: str, token: str | None, *extra: str, env: dict | None = None,
                 other_tokens: tuple[str, ...] = (), job_store: str | None = None):
        """``other_tokens``: more accepted tokens, each a tenant of its own (``token`` is this client's);
        ``job_store``: where its async jobs live (default: a folder of ``tmp``)."""
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out = open(os.path.join(tmp, f"serve-{self.port}.out"), "w")  # files, never unread pipes
        self.err = open(os.path.join(tmp, f"serve-{self.port}.err"), "w")
        env = _env(PADOC_RAY_API_TOKEN=",".join([token, *other_tokens]), **(env or {})) if token else \
            _env(**(env or {}))
        if not token:
            env.pop("PADOC_RAY_API_TOKEN", None)
        self.job_store = job_store or os.path.join(tmp, f"jobs-{self.port}")
        cmd = [os.path.join(BIN, "padoc-ray"), "serve", "--model", model, "--port", str(self.port), "--replay", gt,
               "--job-store", self.job_store, *extra]
        self.proc = subprocess.Popen(cmd, stdout=self.out, stderr=self.err, env=env, start_new_session=True)
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}

    @classmethod
    @contextlib.contextmanager
    def running(cls, tmp, model: str, gt: str, token: str | None, *extra: str, **kw):
        """A started service, ready; stopped, its whole session killed, at the end."""
        s = cls(tmp, model, gt, token, *extra, **kw)
        try:
            s.wait_ready()
            yield s
        finally:
            s.stop()
            s.kill_all()

    def wait_ready(self, timeout=600) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with open(self.out.name) as f:
                text = f.read()
            if "ready at" in text:
                assert self.url in text
                return
            if self.proc.poll() is not None:
                raise AssertionError(f"serve exited {self.proc.returncode}: {self.log()}")
            time.sleep(1)
        raise AssertionError(f"serve not ready in {timeout}s: {self.log()}")

    def log(self) -> str:
        with open(self.err.name) as f:
            return f.read()[-4000:]

    def session_processes(self) -> list[str]:
        out = subprocess.run(["ps", "-eo", "pid=,sid=,args="], capture_output=True, text=True, check=True).stdout
        return [line for line in out.splitlines() if line.split()[1] == str(self.proc.pid)]

    def terminate(self) -> None:
        """SIGTERM only (``stop`` waits for the exit): several services shut down side by side."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(120)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(30)
        self.out.close()
        self.err.close()
        return self.proc.returncode

    def kill_all(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    # ---- HTTP ----
    def parse(self, path: str, name: str | None = None, headers=None, http_timeout=300, **params):
        """POST the file to /v1/parse; ``params`` are query parameters (pages, mode, format, timeout)."""
        with open(path, "rb") as f:
            return requests.post(f"{self.url}/v1/parse", params=params, headers=self.headers if headers is None
                                 else headers, files={"file": (name or os.path.basename(path), f)},
                                 timeout=http_timeout)

    def engine_stats(self) -> dict:
        """The engine replica's counts (``pages_done`` counts the page records its host returned, a page
        refused before the engine included, not result files); /readyz shows them to an authenticated
        caller only."""
        r = requests.get(f"{self.url}/readyz", headers=self.headers, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["engine"]

    def wait_engine_idle(self, timeout=60) -> dict:
        """The engine replica's counts once no page runs and no request is unfinished; fails after
        ``timeout`` s (counts read while a page still runs would race what the caller compares them with)."""
        end = time.monotonic() + timeout
        while True:
            st = self.engine_stats()
            if st["unfinished_requests"] == 0 and st["pages_running"] == 0:
                return st
            assert time.monotonic() < end, f"the engine still had work after {timeout} s: {st}"
            time.sleep(0.3)


@pytest.fixture(scope="module")
def long_doc(tmp_path_factory):
    return _long_pdf_and_truth(str(tmp_path_factory.mktemp("long")))


@pytest.fixture(scope="module")
def services(tmp_path_factory, tiny_model_dir, long_doc, s3):
    """Both services start at once (their engines load side by side). ``tight`` keeps its jobs in S3 (the
    signing key from the environment, as a Kubernetes Secret gives it), lets a tenant have one unfinished
    job and an image three frames."""
    tmp = str(tmp_path_factory.mktemp("serve"))
    _, gt = long_doc
    metrics_port = _free_port()
    svc = Service(tmp, tiny_model_dir, gt, TOKEN, "--max-upload-mb", "2", "--max-pages", "20", "--job-lease", "3",
                  "--metrics-port", str(metrics_port), "--max-requests-per-tenant", "40",  # 32 clients share one token
                  "--body-timeout", "5",
                  "--allow-s3", "s3://padoc-in/allowed/", "--s3-endpoint", s3["endpoint"], env=s3["env"],
                  other_tokens=OTHER_TENANTS)
    s3["client"].create_bucket(Bucket=TIGHT_JOBS_BUCKET)
    tight = Service(tmp, tiny_model_dir, gt, None, "--engine-max-ongoing", "1", "--engine-max-queued", "1",
                    "--pages-in-flight", "1", "--max-pages", "5", "--max-queued-jobs-per-tenant", "1",
                    "--image-frame-limit", "3", "--s3-endpoint", s3["endpoint"],
                    env={**s3["env"], "PADOC_RAY_JOB_KEY": os.urandom(32).hex()},
                    job_store=f"s3://{TIGHT_JOBS_BUCKET}/store")
    svc.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
    try:
        svc.wait_ready()
        tight.wait_ready()
        yield {"svc": svc, "tight": tight}
    finally:
        for s in (svc, tight):
            s.terminate()
        for s in (svc, tight):
            s.stop()
            s.kill_all()


@pytest.fixture(scope="module")
def svc(services):
    return services["svc"]


@pytest.fixture(scope="module")
def tight(services):
    return services["tight"]


def _pages(resp) -> dict[int, dict]:
    assert resp.status_code == 200, resp.text
    return {p["page_index"]: p for p in resp.json()["pages"]}


# ---- results equal the batch job's and parse-page's ----------------------------------------------------
def _batch_rows(pdfs: list[str], model_dir: str, out: str, cpu_engine, model_protocol, loop_thread) -> list[dict]:
    """The page rows `padoc-ray parse --input examples/ --model MODEL --replay GT` makes for ``pdfs``, made in
    this process: the command's own BatchConfig (its parser, its defaults), the job's raster stage, then its
    EngineStage on a host whose engine is the session's (``cpu_engine``, the same tiny model on vLLM), as
    Parquet rows in the job's schema. That the job writes these rows (Ray Data, the writer, the ledger)
    is the batch-job tests' (tests/cluster/pipeline/); that the job's stages, Serve's and parse-page's make
    the same rows of the same input, tests/unit/output/test_row_parity.py's."""
    import pyarrow as pa

    from padoc_ray.cli import build_parser
    from padoc_ray.cli.batch import config_from_args
    from padoc_ray.groundtruth import truth_from_json
    from padoc_ray.host import PageHost
    from padoc_ray.output import rows
    from padoc_ray.pipeline.stages import EngineStage, rasterize

    cfg = config_from_args(build_parser().parse_args(["parse", "--input", EXAMPLES, "--output", out, "--model",
                                                      model_dir, "--replay", GT]))
    paths = [os.path.join(EXAMPLES, n) for n in pdfs]
    listing = pa.Table.from_pylist([{"uri": p, "size": os.path.getsize(p), "mtime": None, "done": [], "doc_id": None}
                                    for p in paths])  # what the job's listing hands the raster stage
    tables = list(rasterize(listing, cfg, os.path.basename(model_dir)))  # model_id: the job's, the model's folder
    with open(cfg.replay_gt, "rb") as f:
        truth = truth_from_json(f.read())

    async def engine_stage() -> list[dict]:
        stage = EngineStage(cfg)
        stage.host = await PageHost(model_dir, cfg.engines.host, truth=truth, engine=cpu_engine,
                                    model_protocol=model_protocol).start()  # what _ensure_host does, engine shared
        done = []
        for table in tables:
            async for t in stage(table):
                done += t.to_pylist()
        return done

    return rows.to_table(loop_thread.run(engine_stage(), timeout=600)).to_pylist()


def test_http_gives_the_batch_jobs_and_parse_pages_results(svc, tiny_model_dir, tmp_path, cpu_engine, model_protocol,
                                                          loop_thread):
    pdfs = ["memo.pdf", "paper.pdf", "report.pdf"]
    http = {name: _pages(svc.parse(os.path.join(EXAMPLES, name))) for name in pdfs}
    for name, pages in http.items():
        assert all(p["status"] == "ok" and p["valid"] for p in pages.values()), name

    rows = _batch_rows(pdfs, tiny_model_dir, str(tmp_path / "batch"), cpu_engine, model_protocol, loop_thread)
    batch = {(os.path.basename(r["source_uri"]), r["page_index"]): r for r in rows}
    assert sorted(batch) == sorted((name, i) for name, pages in http.items() for i in pages)  # the same pages
    for name, pages in http.items():
        for i, p in pages.items():
            b = batch[(name, i)]
            assert p["markdown"] == b["markdown"] and p["status"] == b["status"] == "ok", (name, i)
            # boxes: the batch job stores float32, the response the exact grid values (4 decimals)
            assert [(r["category"], r["content"], r["bbox"]) for r in p["regions"]] == \
                   [(r["category"], r["content"], [round(x, 4) for x in r["bbox"]]) for r in b["regions"]], (name, i)
            assert (p["doc_id"], p["page_count"], p["image_width"], p["image_height"]) == \
                   (b["doc_id"], b["page_count"], b["image_width"], b["image_height"])
            # an uploaded PDF's text layer reaches the engine replica: the same drafts as the batch job's
            assert p["text_layer"] == b["text_layer"] == "used" and p["accepted_tokens"] == b["accepted_tokens"] > 0
            assert [r["accepted_tokens"] for r in p["regions"]] == [r["accepted_tokens"] for r in b["regions"]]
            assert "text_layer_bytes" not in p

    # parse-page prints the teacher-forced truth's Markdown (tests/engine/cli/test_help_and_parse_page.py, on report.pdf): so does HTTP
    from padoc_ray.groundtruth import load_truth
    from padoc_ray.protocol import quantized, to_markdown
    from padoc_ray.tokenizer import load_model_protocol

    vocab = load_model_protocol(tiny_model_dir).vocab
    truth = load_truth(GT)
    for i, p in http["report.pdf"].items():
        assert p["markdown"] == to_markdown(quantized(truth[("report.pdf", i)], vocab)), i


def test_markdown_format_and_page_selection(svc):
    r = svc.parse(os.path.join(EXAMPLES, "report.pdf"), pages="2", format="markdown")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/markdown")
    assert r.headers["x-padoc-status"] == "ok"
    full = _pages(svc.parse(os.path.join(EXAMPLES, "report.pdf")))
    assert r.text == f"<!-- page 2: ok -->\n\n{full[1]['markdown']}"
    assert list(_pages(svc.parse(os.path.join(EXAMPLES, "report.pdf"), pages="2"))) == [1]


def test_json_body_with_base64_content(svc):
    with open(os.path.join(EXAMPLES, "memo.pdf"), "rb") as f:
        body = {"content_base64": base64.b64encode(f.read()).decode(), "filename": "memo.pdf", "mode": "sequential"}
    r = requests.post(f"{svc.url}/v1/parse", json=body, headers=svc.headers, timeout=300)
    got = r.json()
    assert r.status_code == 200 and got["mode"] == "sequential" and got["status"] == "ok", r.text
    p = got["pages"][0]
    assert p["mode"] == "sequential" and p["n_branches"] == 0
    assert p["markdown"] == _pages(svc.parse(os.path.join(EXAMPLES, "memo.pdf")))[0]["markdown"]


def test_stream_sends_one_line_per_page_as_they_finish(svc):
    with open(os.path.join(EXAMPLES, "report.pdf"), "rb") as f:
        r = requests.post(f"{svc.url}/v1/parse", params={"stream": "true"}, headers=svc.headers,
                          files={"file": ("report.pdf", f)}, stream=True, timeout=300)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(x) for x in r.iter_lines() if x]
    assert [x["type"] for x in lines] == ["document", "page", "page", "result"]
    assert lines[0]["page_count"] == 2 and lines[-1] == {"type": "result", "status": "ok", "pages": 2}
    assert sorted(x["page_index"] for x in lines[1:3]) == [0, 1]
    assert all(x["status"] == "ok" and x["markdown"] for x in lines[1:3])


def test_stream_regions_sends_each_region_then_its_content_then_the_pages(svc):
    """report.pdf, teacher-forced: every region's box line once, before its content line; a page's
    content blocks, joined, are the Markdown of its page line, which follows them; the result last."""
    bad = requests.post(f"{svc.url}/v1/parse", params={"stream": "maybe"}, headers=svc.headers,
                        files={"file": ("report.pdf", b"%PDF-")}, timeout=60)
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "bad_request", bad.text
    with open(os.path.join(EXAMPLES, "report.pdf"), "rb") as f:
        r = requests.post(f"{svc.url}/v1/parse", params={"stream": "regions"}, headers=svc.headers,
                          files={"file": ("report.pdf", f)}, stream=True, timeout=300)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(x) for x in r.iter_lines() if x]
    assert lines[0]["type"] == "document" and lines[-1] == {"type": "result", "status": "ok", "pages": 2}
    pages = {x["page_index"]: k for k, x in enumerate(lines) if x.get("type") == "page"}
    assert sorted(pages) == [0, 1]
    assert all("type" in x or "event" in x for x in lines)
    for i, at in pages.items():
        page = lines[at]
        assert page["status"] == "ok" and page["regions"], page
        mine = [(k, x) for k, x in enumerate(lines) if x.get("page_index") == i and "event" in x]
        assert all(k < at for k, _ in mine)  # the page's line after its region lines
        keys = [(x["event"], x["order"]) for _, x in mine]
        n = len(page["regions"])
        assert len(keys) == len(set(keys)) == 2 * n  # every region once, each a box and a content line
        for o in range(n):
            box = next(x for _, x in mine if x["event"] == "region" and x["order"] == o)
            assert set(box) == {"event", "page_index", "order", "bbox", "category"}
            assert box["category"] == page["regions"][o]["category"]
            assert keys.index(("region", o)) < keys.index(("content", o))
        blocks = {x["order"]: x["markdown"] for _, x in mine if x["event"] == "content"}
        assert "\n\n".join(blocks[o] for o in range(n) if blocks[o] is not None) + "\n" == page["markdown"]


def test_the_page_view_shows_an_uploaded_document_in_a_browser(svc, tmp_path):
    """``GET /`` in Debian's chromium (Playwright): the token is asked once, an upload shows each page
    with one box per region over its image and its Markdown beside it, and no request leaves
    127.0.0.1. The screenshot stays in the test's tmp dir."""
    chromium, sync_api = components.chromium(), components.playwright_sync_api()  # else skip, or fail on CI
    report = os.path.join(EXAMPLES, "report.pdf")
    page = requests.get(f"{svc.url}/", timeout=30)  # the page and its assets are open; the data is not
    assert page.status_code == 200 and "script-src 'self'" in page.headers["content-security-policy"]
    assert requests.get(f"{svc.url}/ui/page.js", timeout=30).status_code == 200
    assert requests.get(f"{svc.url}/ui/app.py", timeout=30).status_code == 404
    assert svc.parse(report, headers={}, view="true").status_code == 401
    want = _pages(svc.parse(report, view="true"))
    assert all(p["view"]["image_url"].startswith("data:image/png;base64,") and "image_url" not in p
               for p in want.values())
    with sync_api.sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium, args=["--no-sandbox", "--disable-gpu"])
        pg = browser.new_page(viewport={"width": 1400, "height": 1000})
        pg.set_default_timeout(300_000)  # each upload is parsed on the engine: a bound on a hang, not a timing
        sent, dialogs, errors = [], [], []
        pg.on("request", lambda r: sent.append(r.url))
        pg.on("dialog", lambda d: (dialogs.append(d.message), d.dismiss()))
        pg.on("pageerror", lambda e: errors.append(str(e)))
        pg.goto(f"{svc.url}/")
        for attempt in range(2):  # the second upload uses the token kept in sessionStorage: no prompt
            pg.set_input_files("#pd-upload input[type=file]", report)
            pg.click("#pd-upload button")
            if attempt == 0:
                pg.wait_for_selector("#pd-token:not([hidden])")
                pg.fill("#pd-token input[name=token]", TOKEN)
                pg.click("#pd-token button")
            pg.wait_for_selector('.pd-page[data-page="1"] .pd-view')  # the pages of this upload (cleared on submit)
            assert len(pg.query_selector_all(".pd-page .pd-view")) == 2 and pg.is_hidden("#pd-token")
        for i, want_page in want.items():
            sec = pg.query_selector(f'.pd-page[data-page="{i}"]')
            boxes = sec.query_selector_all(".pd-box")
            assert sorted(int(b.get_attribute("data-order")) for b in boxes) == [r["order"] for r in
                                                                                   want_page["regions"]]
            assert len(sec.query_selector_all(".pd-block")) == len(want_page["spans"])
            assert " ".join(sec.query_selector(".pd-md").inner_text().split())  # Markdown shown
        # the page images (data URLs) decode; polled with evaluate: the page's CSP forbids wait_for_function's eval
        loaded = "() => Array.from(document.querySelectorAll('.pd-img')).map(i => i.complete ? i.naturalWidth : 0)"
        end = time.monotonic() + 60
        while 0 in pg.evaluate(loaded) and time.monotonic() < end:
            time.sleep(0.2)
        assert pg.evaluate(loaded) == [want[i]["image_width"] for i in sorted(want)]
        first = pg.query_selector('.pd-page[data-page="0"]')
        span = want[0]["spans"][0]
        first.query_selector(f'.pd-box[data-order="{span["order"]}"]').click(position={"x": 3, "y": 3})
        active = first.query_selector_all(".pd-block.pd-active")
        assert [b.get_attribute("data-order") for b in active] == [str(span["order"])]
        shown = " ".join(active[0].inner_text().split())
        md = want[0]["markdown"][span["start"]:span["end"]]
        assert shown and shown in " ".join(md.split()), (shown, md)
        pg.screenshot(path=str(tmp_path / "serve-page-view.png"), full_page=True)
        parse_calls = [u for u in sent if "/v1/parse" in u]
        browser.close()
    local = urllib.parse.urlsplit(svc.url).netloc
    assert sent and all(urllib.parse.urlsplit(u).netloc == local for u in sent), sent
    assert len(parse_calls) == 3 and dialogs == [] and errors == []  # one 401, then two parses
    assert (tmp_path / "serve-page-view.png").stat().st_size > 0


# ---- OpenAI compatibility -------------------------------------------------------------------------------
def test_the_official_openai_client_gets_a_pages_markdown(svc):
    import openai
    import pypdfium2

    pdf = pypdfium2.PdfDocument(os.path.join(EXAMPLES, "memo.pdf"))
    buf = io.BytesIO()
    pdf[0].render(scale=2).to_pil().save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    client = openai.OpenAI(base_url=f"{svc.url}/v1", api_key=TOKEN, max_retries=0)
    assert [m.id for m in client.models.list().data] == [os.path.basename(svc_model(svc))]
    chat = client.chat.completions.create(
        model=os.path.basename(svc_model(svc)),
        messages=[{"role": "user", "content": [{"type": "text", "text": "Parse this page."},
                                               {"type": "image_url", "image_url": {"url": url}}]}],
        extra_body={"padoc": {"filename": "memo.pdf"}})  # --replay matches the truth by file name
    want = _pages(svc.parse(os.path.join(EXAMPLES, "memo.pdf")))[0]["markdown"]
    assert chat.choices[0].message.content == want and chat.choices[0].finish_reason == "stop"
    assert chat.usage.completion_tokens > 0 and chat.usage.prompt_tokens > 0
    # extra_body.padoc.mode: the same page decoded as one sequence gives the same text and forks no branch
    seq = client.chat.completions.create(
        model=os.path.basename(svc_model(svc)),
        messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}],
        extra_body={"padoc": {"filename": "memo.pdf", "mode": "sequential"}})
    assert seq.choices[0].message.content == want
    assert chat.model_extra["padoc"]["n_branches"] > 0 and seq.model_extra["padoc"]["n_branches"] == 0
    with pytest.raises(openai.UnprocessableEntityError):
        client.chat.completions.create(model=os.path.basename(svc_model(svc)), messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}]}], extra_body={"padoc": {"mode": "parallel"}})
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=f"{svc.url}/v1", api_key="wrong", max_retries=0).models.list()
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}]}])
    with pytest.raises(openai.BadRequestError, match="fetches no URLs"):
        client.chat.completions.create(model=os.path.basename(svc_model(svc)), messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "http://169.254.169.254/latest/meta-data"}}]}])


def svc_model(svc) -> str:
    return requests.get(f"{svc.url}/v1/models", headers=svc.headers, timeout=30).json()["data"][0]["id"]


# ---- errors, each with its status and code ---------------------------------------------------------------
def test_every_error_has_its_status_and_code(svc, tmp_path):
    memo = os.path.join(EXAMPLES, "memo.pdf")
    # auth: health endpoints open, /v1 closed without the token or with a wrong one
    assert requests.get(f"{svc.url}/healthz", timeout=30).status_code == 200
    assert requests.get(f"{svc.url}/openapi.json", timeout=30).status_code == 200
    for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": TOKEN}):
        r = svc.parse(memo, headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
        assert r.headers["www-authenticate"] == "Bearer"

    def err(resp, status, code):
        assert resp.status_code == status and resp.json()["error"]["code"] == code, resp.text
        assert not LEAKS.search(resp.text), resp.text  # no local path, traceback or bucket

    # bad files: the batch job's document codes, 422
    from tests.helpers.pdf_factory import text_pdf, zero_page_pdf

    bad = {"zero.pdf": (b"", "empty_file"), "notes.txt": (b"just some text, not a PDF", "not_pdf"),
           "encrypted.pdf": (text_pdf(1, encrypt="secret"), "encrypted_pdf"),
           "corrupt.pdf": (b"%PDF-1.7\n" + bytes(range(256)) * 40, "corrupt_pdf"),
           "nopages.pdf": (zero_page_pdf(), "no_pages"),
           "broken.jpg": (b"\xff\xd8\xff\xe0" + bytes(200), "corrupt_image")}
    for name, (data, code) in bad.items():
        (tmp_path / name).write_bytes(data)
        err(svc.parse(str(tmp_path / name)), 422, code)
    # limits: 413
    big = tmp_path / "big.pdf"
    big.write_bytes(b"%PDF-1.4\n" + os.urandom(3 << 20))
    err(svc.parse(str(big)), 413, "file_too_large")
    long_pdf = str(tmp_path / "l.pdf")
    _long_copy(long_pdf)
    err(svc.parse(long_pdf), 413, "too_many_pages")  # 40 pages, the service allows 20 per request
    # selections: 422
    err(svc.parse(memo, pages="2"), 422, "page_out_of_range")
    err(svc.parse(memo, pages="x-1"), 422, "bad_pages")
    err(svc.parse(memo, mode="parallel"), 422, "bad_request")
    err(svc.parse(memo, timeout="0.5"), 422, "bad_request")
    # request shape
    err(requests.post(f"{svc.url}/v1/parse", data=b"abc", headers={**svc.headers, "Content-Type": "text/plain"},
                      timeout=60), 415, "unsupported_media_type")
    err(requests.post(f"{svc.url}/v1/parse", files={"other": ("a", b"x")}, headers=svc.headers, timeout=60),
        400, "missing_file")
    err(requests.post(f"{svc.url}/v1/parse", json={"uri": "s3://private-bucket/x.pdf"}, headers=svc.headers,
                      timeout=60), 403, "disallowed_uri")
    err(requests.post(f"{svc.url}/v1/parse", json={"content_base64": "%%%"}, headers=svc.headers, timeout=60),
        400, "bad_request")
    # the per-request deadline: 504, and the engine work of the request stops: of its 20 pages, the
    # engine finishes only those done by the deadline (not all 20, as it would if nothing were cancelled)
    before = svc.wait_engine_idle()["pages_done"]
    err(svc.parse(long_pdf, pages="1-20", timeout="1"), 504, "request_timeout")
    idle = svc.wait_engine_idle()
    assert idle["unfinished_requests"] == 0 and idle["pages_running"] == 0
    assert idle["pages_done"] - before < 20, (before, idle)
    # jobs
    err(requests.get(f"{svc.url}/v1/jobs/{'0' * 32}", headers=svc.headers, timeout=30), 404, "job_not_found")
    err(requests.get(f"{svc.url}/v1/jobs/..%2F..%2Fetc", headers=svc.headers, timeout=30), 404, "not_found")
    err(requests.get(f"{svc.url}/v1/jobs/abc", headers=svc.headers, timeout=30), 404, "job_not_found")


def _long_copy(dest: str) -> None:
    import pikepdf

    src = pikepdf.open(os.path.join(EXAMPLES, "report.pdf"))
    out = pikepdf.new()
    for i in range(LONG_PAGES):
        out.pages.append(src.pages[i % 2])
    out.save(dest)


def _send_until_refused(url: str, path: str, headers: dict, chunks) -> tuple[int, dict, int]:
    """POST a chunked body piece by piece until the server answers (and closes) or it is all sent:
    (status, JSON body, bytes of body sent). A refusal mid-upload closes the connection, so the
    client's next send fails: the answer is read then."""
    u = urllib.parse.urlparse(url)
    sock = socket.create_connection((u.hostname, u.port), timeout=60)
    head = "".join(f"{k}: {v}\r\n" for k, v in {**headers, "Host": u.netloc, "Transfer-Encoding": "chunked"}.items())
    sock.sendall(f"POST {path} HTTP/1.1\r\n{head}\r\n".encode())
    sent = 0
    try:
        for c in chunks:
            sock.sendall(f"{len(c):x}\r\n".encode() + c + b"\r\n")
            sent += len(c)
        sock.sendall(b"0\r\n\r\n")
    except (BrokenPipeError, ConnectionResetError):
        pass
    resp = http.client.HTTPResponse(sock)
    resp.begin()
    body = json.loads(resp.read())
    sock.close()
    return resp.status, body, sent


def test_chunked_upload_over_the_cap_is_refused_through_the_whole_stack(svc):
    """A chunked body without a Content-Length, far over the cap, through Ray Serve's proxy: 413
    ``file_too_large`` (the guard counted it past the cap; nothing declared the size up front). That the
    guard refuses it while it arrives and its route never reads past the cap is proven where no proxy
    sits between (tests/unit/serve/test_guard.py::test_a_chunked_body_is_refused_as_it_passes_the_cap):
    how much of the body Ray Serve's proxy takes in before the replica's answer reaches it is Ray's (on a
    loaded machine it once took all 64 MiB)."""
    def body():
        yield b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"a.pdf\"\r\n\r\n%PDF-1.4\n"
        for _ in range(64):  # 64 MiB, far over the 2 MiB (+1 MiB envelope) cap
            yield b"0" * (1 << 20)
        yield b"\r\n--x--\r\n"

    code, answer, _ = _send_until_refused(svc.url, "/v1/parse", {
        **svc.headers, "Content-Type": "multipart/form-data; boundary=x"}, body())
    assert code == 413 and answer["error"]["code"] == "file_too_large"
    assert "over the limit" in answer["error"]["message"]
    assert requests.get(f"{svc.url}/healthz", timeout=30).status_code == 200  # the service took no harm


def test_slow_bodies_neither_stall_health_checks_nor_keep_their_slots(svc):
    """50 clients of one tenant each declare a 100 kB body and send one byte: past the tenant's 40
    slots they get 429 at once, the others 408 once the 5-s body deadline passes; meanwhile /healthz
    answers, and afterwards the tenant's slots are free again."""
    u = urllib.parse.urlparse(svc.url)
    socks = []
    for _ in range(50):
        sock = socket.create_connection((u.hostname, u.port), timeout=60)
        sock.sendall(f"POST /v1/parse HTTP/1.1\r\nHost: {u.netloc}\r\nAuthorization: Bearer {TOKEN}\r\n"
                     f"Content-Type: application/json\r\nContent-Length: 100000\r\n\r\n{{".encode())
        socks.append(sock)
    assert requests.get(f"{svc.url}/healthz", timeout=15).status_code == 200  # not stalled behind them
    codes = []
    for sock in socks:
        resp = http.client.HTTPResponse(sock)
        resp.begin()
        codes.append((resp.status, json.loads(resp.read())["error"]["code"]))
        sock.close()
    assert codes.count((429, "too_many_requests")) >= 10 and codes.count((408, "body_timeout")) >= 1, codes
    assert set(codes) <= {(429, "too_many_requests"), (408, "body_timeout")}, codes
    assert requests.get(f"{svc.url}/v1/models", headers=svc.headers, timeout=30).status_code == 200


def test_s3_uris_are_read_only_under_the_allowed_prefix(svc, s3, tmp_path):
    c = s3["client"]
    c.create_bucket(Bucket="padoc-in")
    with open(os.path.join(EXAMPLES, "memo.pdf"), "rb") as f:
        memo = f.read()
    for key in ("allowed/memo.pdf", "secret/memo.pdf"):
        c.put_object(Bucket="padoc-in", Key=key, Body=memo)

    def post(uri):
        return requests.post(f"{svc.url}/v1/parse", json={"uri": uri}, headers=svc.headers, timeout=120)

    r = post("s3://padoc-in/allowed/memo.pdf")
    assert r.status_code == 200 and r.json()["document"]["name"] == "memo.pdf", r.text[:300]
    assert r.json()["pages"][0]["markdown"] == _pages(svc.parse(os.path.join(EXAMPLES, "memo.pdf")))[0]["markdown"]
    for uri in ("s3://padoc-in/secret/memo.pdf", "s3://padoc-in/allowed/../secret/memo.pdf",
                "s3://padoc-in/allowedx/memo.pdf", "s3://other/allowed/memo.pdf", "file:///etc/passwd",
                "/etc/passwd"):
        got = post(uri)
        assert got.status_code == 403 and got.json()["error"]["code"] == "disallowed_uri", (uri, got.text)
    missing = post("s3://padoc-in/allowed/none.pdf")
    assert missing.status_code == 422 and missing.json()["error"]["code"] == "read_failed"
    assert "padoc-in" not in missing.text and "none.pdf" not in missing.text  # no bucket or key in errors
    # chat: an allowed s3:// image_url is read, like a data URL
    import pypdfium2

    buf = io.BytesIO()
    pypdfium2.PdfDocument(memo)[0].render(scale=1).to_pil().save(buf, format="PNG")
    c.put_object(Bucket="padoc-in", Key="allowed/page.png", Body=buf.getvalue())
    r = requests.post(f"{svc.url}/v1/chat/completions", headers=svc.headers, timeout=120, json={
        "messages": [{"role": "user", "content": [{"type": "image_url",
                                                    "image_url": {"url": "s3://padoc-in/allowed/page.png"}}]}]})
    assert r.status_code == 200 and r.json()["object"] == "chat.completion", r.text[:300]


# ---- load, disconnects -----------------------------------------------------------------------------------
def test_32_concurrent_clients_are_all_served(svc):
    """32 clients at once, each with an example PDF (their pages replayed cut to their first regions: the test
    is about the clients, and whole pages only made the engine's share longer)."""
    names = EXAMPLE_PDFS

    def one(i):
        r = svc.parse(os.path.join(EXAMPLES, names[i % 3]), name=CUT + names[i % 3])
        return r.status_code, r.json().get("status"), names[i % 3], r.json().get("pages")

    with cf.ThreadPoolExecutor(32) as ex:
        got = list(ex.map(one, range(32)))
    assert all(code == 200 and status == "ok" for code, status, _, _ in got), [g[:2] for g in got]
    first = {}
    for _, _, name, pages in got:  # the same document gives the same Markdown under load, its cut truth's
        md = [p["markdown"] for p in pages]
        assert first.setdefault(name, md) == md
        assert all(len(p["regions"]) == JOB_REGIONS and p["valid"] for p in pages), name
    assert svc.wait_engine_idle()["unfinished_requests"] == 0


def test_a_client_that_disconnects_mid_parse_leaves_no_engine_work(svc, long_doc):
    path, _ = long_doc
    u = urllib.parse.urlparse(svc.url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
    with open(path, "rb") as f:
        data = f.read()
    body = (b"--x\r\nContent-Disposition: form-data; name=\"file\"; filename=\"long.pdf\"\r\n"
            b"Content-Type: application/pdf\r\n\r\n" + data + b"\r\n--x--\r\n")
    conn.request("POST", "/v1/parse?pages=1-20", body=body,
                 headers={**svc.headers, "Content-Type": "multipart/form-data; boundary=x"})
    busy = None
    end = time.monotonic() + 60
    while time.monotonic() < end:  # wait until the engine is running this request's pages
        st = svc.engine_stats()
        if st["pages_running"] > 0:
            busy = st
            break
        time.sleep(0.05)
    assert busy is not None, "the request never reached the engine"
    conn.sock.shutdown(socket.SHUT_RDWR)
    conn.close()
    st = svc.wait_engine_idle()
    assert st["unfinished_requests"] == 0 and st["pages_running"] == 0, st
    assert st["pages_done"] - busy["pages_done"] < 20  # it stopped: not every page was parsed


def test_overload_gets_503_with_retry_after(tight):
    memo = os.path.join(EXAMPLES, "paper.pdf")

    def one(_):
        r = tight.parse(memo, pages="1")
        return r.status_code, r.headers.get("retry-after"), r.text

    with cf.ThreadPoolExecutor(12) as ex:
        got = list(ex.map(one, range(12)))
    codes = [c for c, _, _ in got]
    assert 200 in codes and 503 in codes, codes
    assert all(ra is not None and int(ra) >= 1 for c, ra, _ in got if c == 503)
    assert all(json.loads(t)["error"]["code"] == "overloaded" for c, _, t in got if c == 503)
    assert set(codes) <= {200, 503}


# ---- async jobs ----------------------------------------------------------------------------------------
def _job(svc, path, name=None, **params):
    with open(path, "rb") as f:
        r = requests.post(f"{svc.url}/v1/jobs", params=params, headers=svc.headers,
                          files={"file": (name or os.path.basename(path), f)}, timeout=120)
    assert r.status_code == 202 and r.headers["location"] == f"/v1/jobs/{r.json()['id']}", r.text
    return r.json()


def _wait_job(svc, job_id, until, timeout=300):
    end = time.monotonic() + timeout
    st = None
    while time.monotonic() < end:
        try:  # a poll may find no ingress replica for a while (one was killed): ask again
            r = requests.get(f"{svc.url}/v1/jobs/{job_id}", headers=svc.headers, timeout=30)
            st = r.json() if r.status_code == 200 else f"{r.status_code}: {r.text[:300]}"
        except (requests.RequestException, ValueError) as e:
            st = repr(e)
        if isinstance(st, dict) and until(st):
            return st
        time.sleep(0.2)
    raise AssertionError(f"job {job_id} stuck: {st}")


def _ingress_pids(svc) -> list[int]:
    return [int(line.split()[0]) for line in svc.session_processes() if "ServeReplica:padoc:Ingress" in line]


def _stored_rows(svc, job_id) -> list[dict]:
    """The job's page rows as the store holds them (Parquet, the batch job's schema, with ``run_id``:
    the job and the replica run that parsed the page)."""
    import pyarrow.parquet as pq

    folder = os.path.join(svc.job_store, "jobs", job_id, "pages")
    names = sorted(os.listdir(folder)) if os.path.isdir(folder) else []
    return [r for n in names if n.endswith(".parquet") for r in pq.read_table(os.path.join(folder, n)).to_pylist()]


def test_an_async_job_survives_its_ingress_replica_being_killed(svc, long_doc, model_protocol):
    from padoc_ray.groundtruth import load_truth
    from padoc_ray.protocol import quantized, to_markdown

    path, gt = long_doc
    job = _job(svc, os.path.join(os.path.dirname(path), "job.pdf"))  # 40 short pages (JOB_REGIONS each)
    assert job["pages_total"] == LONG_PAGES and job["status"] in ("queued", "running")
    _wait_job(svc, job["id"], lambda s: s["pages_done"] >= 2)
    (pid,) = _ingress_pids(svc)
    os.kill(pid, signal.SIGKILL)
    at_kill = _stored_rows(svc, job["id"])
    assert 2 <= len(at_kill) < LONG_PAGES, "the job must still be running when its replica dies"
    done = _wait_job(svc, job["id"], lambda s: s.get("status") in ("done", "failed", "cancelled"), timeout=600)
    assert done["status"] == "done" and done["pages_done"] == LONG_PAGES, done
    assert _ingress_pids(svc) and _ingress_pids(svc) != [pid]  # Serve replaced the replica
    r = requests.get(f"{svc.url}/v1/jobs/{job['id']}/result", headers=svc.headers, timeout=60)
    res = r.json()
    assert r.status_code == 200 and res["status"] == "ok", r.text[:500]
    assert [p["page_index"] for p in res["pages"]] == list(range(LONG_PAGES))  # each page exactly once
    truth = load_truth(gt)  # teacher-forced: each page is its truth
    want = [to_markdown(quantized(truth[("job.pdf", i)], model_protocol.vocab)) for i in range(LONG_PAGES)]
    assert [p["markdown"] for p in res["pages"]] == want and all(want)
    # the new replica parsed only the pages missing when the first died: the first run's rows are intact
    stored = {r["page_index"]: r["run_id"] for r in _stored_rows(svc, job["id"])}
    first = {r["page_index"]: r["run_id"] for r in at_kill}
    assert all(stored[i] == run for i, run in first.items())
    runs = set(stored.values())
    assert len(runs) == 2 and all(run.startswith(job["id"][:12]) for run in runs), runs


def test_deleting_a_job_stops_its_engine_work(svc, long_doc):
    path, _ = long_doc
    job = _job(svc, path)
    _wait_job(svc, job["id"], lambda s: s["pages_done"] >= 1)
    r = requests.delete(f"{svc.url}/v1/jobs/{job['id']}", headers=svc.headers, timeout=30)
    at_cancel = svc.engine_stats()["pages_done"]
    assert r.status_code == 200 and r.json()["status"] in ("cancelling", "cancelled"), r.text
    st = _wait_job(svc, job["id"], lambda s: s["status"] == "cancelled", timeout=60)
    idle = svc.wait_engine_idle()
    assert idle["unfinished_requests"] == 0 and idle["pages_running"] == 0
    # the engine finished (almost) nothing after the cancel: without it, the job's other pages would run
    assert idle["pages_done"] - at_cancel <= 2 < LONG_PAGES - st["pages_done"], (at_cancel, idle, st)
    later = requests.get(f"{svc.url}/v1/jobs/{job['id']}", headers=svc.headers, timeout=30).json()
    assert later["pages_done"] == st["pages_done"] < LONG_PAGES and later["status"] == "cancelled"
    r = requests.get(f"{svc.url}/v1/jobs/{job['id']}/result", headers=svc.headers, timeout=30)
    assert r.status_code == 409 and r.json()["error"]["code"] == "job_cancelled" and "retry-after" not in r.headers
    # another tenant (no token) cannot see it at all
    assert requests.get(f"{svc.url}/v1/jobs/{job['id']}", timeout=30).status_code == 401


def test_two_tenants_annotation_bombs_do_not_hold_a_third_tenants_memo(svc, tmp_path):
    """The review's repro through Serve: tenants b and c each send a page whose annotation appearance draws
    1,111,111 form XObjects (it rendered for seconds a page and held both renderers: tenant a's one-page
    memo took 10.3 s instead of 0.03 s). Both bombs get page_too_complex, the memo is parsed."""
    from functools import partial

    from tests.helpers.pdf_factory import annotation_bomb_page, drawn_pdf

    bomb = tmp_path / "bomb.pdf"
    bomb.write_bytes(drawn_pdf(partial(annotation_bomb_page, depth=6)))
    memo = os.path.join(EXAMPLES, "memo.pdf")
    with cf.ThreadPoolExecutor(3) as ex:
        b, c = (ex.submit(svc.parse, str(bomb), headers={"Authorization": f"Bearer {t}"}) for t in OTHER_TENANTS)
        a = ex.submit(svc.parse, memo)
        a, b, c = a.result(), b.result(), c.result()
    for r in (b, c):
        assert r.status_code == 200, r.text
        (page,) = r.json()["pages"]
        assert page["status"] == "page_too_complex" and "appearance" in json.dumps(page), page
    assert all(p["status"] == "ok" for p in _pages(a).values())


def test_requests_share_no_prefix_cache(svc, tmp_path):
    """The same file in two requests: each request is its own cache namespace, so the second one
    reuses nothing of the first (its cached tokens are the same), and a response cannot tell
    whether another client parsed the same file. The file is new to the service (text of its own),
    so nothing parsed before is in the cache under its content hash: were the requests to share a
    namespace, the second parse would find the first one's blocks (more cached tokens). It is sent
    as report.pdf, whose teacher-forced truth its two pages replay (a name picks the truth, never a
    cache key)."""
    import uuid

    from tests.helpers.pdf_factory import text_pdf

    fresh = tmp_path / "fresh.pdf"
    fresh.write_bytes(text_pdf(2, label=f"Parsed by this test only, {uuid.uuid4().hex}"))
    a = _pages(svc.parse(str(fresh), name="report.pdf"))
    b = _pages(svc.parse(str(fresh), name="report.pdf"))
    assert sorted(a) == sorted(b) == [0, 1]
    assert all(p["status"] == "ok" for p in [*a.values(), *b.values()])
    for i in a:
        assert a[i]["cached_tokens"] == b[i]["cached_tokens"], (a[i]["cached_tokens"], b[i]["cached_tokens"])


# ---- the OpenAPI schema fuzzed ---------------------------------------------------------------------------
def test_fuzzing_the_openapi_schema_finds_no_5xx(svc, tmp_path):
    log = tmp_path / "st.out"
    with open(log, "w") as f:  # to a file, never an unread pipe; st keeps a .schemathesis/ folder in its cwd
        code = subprocess.run(
            [os.path.join(BIN, "st"), "run", f"{svc.url}/openapi.json", "--checks", "not_a_server_error",
             "--max-examples", "15", "--request-timeout", "120", "--no-color", "-H", f"Authorization: Bearer {TOKEN}"],
            env=_env(), stdout=f, stderr=subprocess.STDOUT, timeout=900, check=False, cwd=tmp_path).returncode
    text = log.read_text()
    assert re.search(r"\d+ passed", text), text[-2000:]
    if code != 0:
        # the one 5xx allowed: 504 request_timeout, for a generated request that asked for a `timeout` of a
        # second or two (the documented answer to the client's own deadline), and only for such a request
        kinds = set(re.findall(r"❌ (ST\d+) ", text))
        failure = r"\[(5\d\d)\][^\n]*\n\s*\n\s*`([^`]*)`\s*\n\s*Reproduce with:\s*\n\s*\n(.*?)(?:\n\s*\n|$)"
        failures = re.findall(failure, text, re.S)
        assert kinds == {"ST101"} and failures and all(
            code == "504" and '"request_timeout"' in body and "timeout=" in curl
            for code, body, curl in failures), text[-5000:]
    # without the token nothing gets past the guard: every route of the schema answers 401 (the test below)


def test_every_route_of_the_schema_needs_the_token(svc):
    """Default-deny: every path of the OpenAPI schema (with its parameters filled in) answers 401
    without the token, but the open ones; with a body the route could not read (broken JSON, a broken
    multipart form) too: 401, never the body's 4xx or a 5xx (that the guard reads no body then:
    tests/unit/serve/test_guard.py)."""
    schema = requests.get(f"{svc.url}/openapi.json", timeout=30).json()
    open_ = {"/healthz", "/readyz"}
    bodies = ({}, {"data": b'{"content_base64": ', "headers": {"Content-Type": "application/json"}},
              {"data": b"--x\r\nContent-Disposition: form-data; name=file\r\n",
               "headers": {"Content-Type": "multipart/form-data; boundary=x"}})
    checked = 0
    for path, ops in schema["paths"].items():
        url = svc.url + re.sub(r"\{[^}]+\}", "0" * 32, path)
        for method in ops:
            for body in bodies if method in ("post", "put", "patch") else bodies[:1]:
                r = requests.request(method.upper(), url, timeout=60, **body)
                if path in open_:
                    assert r.status_code in (200, 503), (method, path, r.status_code)
                else:
                    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized", \
                        (method, path, body, r.text)
                    checked += 1
    assert checked >= 7 + 2 * 3  # models, parse, jobs (4 routes), chat; the 3 POST routes with each broken body


def test_readyz_is_503_until_the_engine_answers_its_probe_then_200(tiny_model_dir):
    """/readyz's handler as the ingress runs it, over RayEngine and an EngineReplica whose engine (the
    no-op one) does not answer its first requests yet (as an engine still warming up): 503 not_ready
    with Retry-After once the handler's wait (``readyz_wait_s``, 2 s here) is over, never 200; once the engine answers, 200
    with the engine's counts. Serve's handle is a stand-in that calls the one replica in this loop
    (the running services' engines answer from their start, so they cannot show the 503)."""
    import asyncio
    import types

    from starlette.requests import Request

    from padoc_ray.engine.fake import ScriptedEngine
    from padoc_ray.host import HostConfig, PageHost
    from padoc_ray.serve.app import IngressBase
    from padoc_ray.serve.config import ServeConfig
    from padoc_ray.serve.engine import EngineReplica, RayEngine
    from padoc_ray.serve.guard import GuardConfig
    from padoc_ray.tokenizer import ModelProtocol

    class NotAnsweringYet(ScriptedEngine):
        """The no-op engine (one end-of-stream token a request), whose requests wait for ``answering``."""

        def __init__(self, eos: int):
            super().__init__(lambda req: [eos], record=False)
            self.answering = asyncio.Event()

        async def generate(self, req):
            await self.answering.wait()
            async for d in super().generate(req):
                yield d

    class Handle:
        """Serve's deployment handle over one replica: ``handle.method.remote(*args)`` awaits the method."""

        def __init__(self, replica):
            self.replica = replica

        def options(self, **_):
            return self

        def __getattr__(self, name):
            return types.SimpleNamespace(remote=lambda *args: getattr(self.replica, name)(*args))

    async def probes() -> tuple:
        cfg = ServeConfig(model=tiny_model_dir, host=HostConfig(engine="noop"), readyz_wait_s=2.0)
        mp = ModelProtocol(tiny_model_dir)
        engine = NotAnsweringYet(mp.vocab.end_of_stream)
        replica = EngineReplica.__new__(EngineReplica)  # what its __init__ makes, with this engine
        replica.host = await PageHost(tiny_model_dir, cfg.host, engine=engine, model_protocol=mp).start()
        ingress = types.SimpleNamespace(cfg=cfg, engine=RayEngine(Handle(replica)), guard=GuardConfig.from_serve(cfg))
        request = Request({"type": "http", "method": "GET", "path": "/readyz", "headers": [], "query_string": b""})
        t0 = time.monotonic()
        before = await IngressBase.readyz(ingress, request)
        waited = time.monotonic() - t0
        engine.answering.set()
        after = await IngressBase.readyz(ingress, request)
        replica.host.shutdown()
        return before, after, cfg.served_model_id, waited

    before, after, model, waited = asyncio.run(probes())
    assert not isinstance(before, dict), f"200 before the engine answered: {before}"
    assert waited >= 2.0  # the whole wait the setting gives, not a shortcut
    assert before.status_code == 503 and before.headers["retry-after"] == "5", before
    assert json.loads(before.body) == {"status": "not_ready", "reason": "TimeoutError"}
    # a dict is what the route answers with 200 (a response object carries its own status)
    assert isinstance(after, dict) and after["status"] == "ready" and after["model"] == model, after
    assert after["engine"]["engine_dead"] is False and after["engine"]["pages_done"] == 0, after


# ---- metrics --------------------------------------------------------------------------------------------------
def _scrape(url: str) -> dict[tuple[str, frozenset], float]:
    out = {}
    for line in requests.get(url, timeout=30).text.splitlines():
        m = re.match(r'^(ray_padoc_\w+)\{([^}]*)\} ([0-9.e+-]+)$', line)
        if m:
            tags = frozenset(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
            out[(m.group(1), tags)] = out.get((m.group(1), tags), 0.0) + float(m.group(3))
    return out


def _sum(scraped, name, **want) -> float:
    return sum(v for (n, tags), v in scraped.items() if n == name and all((k, w) in tags for k, w in want.items()))


def test_a_tokenless_service_answers_only_to_its_own_names(tight, svc):
    """DNS rebinding (curl -H "Host: evil.example"): a service without a token answers 400 bad_host to a name it
    was not started for, on the API and the page view alike; the probes answer whatever the name. With a
    token, the token guards it and any name is answered."""
    import http.client
    import urllib.parse

    def get(url, path, host, headers=(), full=False):
        u = urllib.parse.urlsplit(url)
        conn = http.client.HTTPConnection(u.hostname, u.port, timeout=60)
        conn.request("GET", path, headers={"Host": host, **dict(headers)})
        r = conn.getresponse()
        body = r.read()
        conn.close()
        return (r.status, body, dict(r.getheaders())) if full else (r.status, body)

    port = urllib.parse.urlsplit(tight.url).port
    for path in ("/v1/models", "/", "/openapi.json"):
        code, body = get(tight.url, path, "evil.example")
        assert code == 400 and json.loads(body)["error"]["code"] == "bad_host", (path, code, body[:200])
        assert get(tight.url, path, f"127.0.0.1:{port}")[0] == 200, path
    assert get(tight.url, "/v1/models", f"localhost:{port}")[0] == 200
    assert get(tight.url, "/healthz", "evil.example")[0] == 200
    assert get(svc.url, "/v1/models", "evil.example", {"Authorization": f"Bearer {TOKEN}"})[0] == 200
    assert get(svc.url, "/v1/models", "evil.example")[0] == 401
    # no slash redirect takes its Location from the Host header; /docs carries its own policy
    code, _, headers = get(svc.url, "/v1/models/", "evil.example", {"Authorization": f"Bearer {TOKEN}"}, full=True)
    assert code == 404 and "Location" not in headers
    code, body, headers = get(tight.url, "/docs", f"127.0.0.1:{port}", full=True)
    assert code == 200 and "script-src 'self' 'sha256-" in headers["content-security-policy"]


def test_serves_metrics_count_each_page_once(svc):
    """Scraped from the service's Prometheus endpoint (`--metrics-port`): every page record the engine
    host returned counted once, as ``pages_done`` counts it (the engine host counts it; the ingress does
    not count it again), and the HTTP requests by route and code. Earlier tests' jobs (the fuzzer's too) may
    still be finishing pages: both counts move then, and they must meet once the workers have pushed (every
    10 s); a page counted twice or not at all keeps them apart."""
    assert svc.parse(os.path.join(EXAMPLES, "paper.pdf")).status_code == 200
    end = time.monotonic() + 90
    while True:
        done = svc.wait_engine_idle()["pages_done"]
        scraped = _scrape(svc.metrics_url)
        engine = _sum(scraped, "ray_padoc_pages_total", stage="engine")
        if engine == done or time.monotonic() > end:
            break
        time.sleep(2)
    assert engine == done, (engine, done)
    assert _sum(scraped, "ray_padoc_http_requests_total", route="parse", code="200") >= 1
    assert _sum(scraped, "ray_padoc_http_requests_total", route="parse", code="422") >= 1  # the error test's
    assert {dict(tags).get("class") for n, tags in scraped if n == "ray_padoc_pages_waiting"} >= {"interactive", "job"}


def test_the_engine_replica_keeps_writing_its_serve_log_after_vllm_starts(svc):
    """Ray Serve logs each replica into logs/serve/replica_*.log through a memory handler; vLLM's
    logging set-up closed it in the Engine replica, whose log then stopped at the engine's start while
    every later record stayed in the replica's memory. Each call's access line reaches the file."""
    import glob

    engine = [p.split()[0] for p in svc.session_processes() if "ServeReplica:padoc:Engine" in p]
    assert engine, svc.session_processes()
    # a Ray worker's stdout is a file in its session's logs folder
    logs_dir = os.path.dirname(os.readlink(f"/proc/{engine[0]}/fd/1"))
    svc.parse(os.path.join(EXAMPLES, "paper.pdf"))
    svc.wait_engine_idle()
    logs = glob.glob(os.path.join(logs_dir, "serve", "replica_padoc_Engine_*.log"))
    assert logs, os.listdir(logs_dir)
    text = "".join(open(p, encoding="utf-8", errors="replace").read() for p in logs)
    assert re.search(r"CALL parse_page OK", text), text[-2000:]


# ---- shutdown ---------------------------------------------------------------------------------------------
# ---- the tight service: an S3 job store, a tenant's job limit, a frame cap ----------------------------------
def _post_job(service, path, name=None):
    with open(path, "rb") as f:
        return requests.post(f"{service.url}/v1/jobs", headers=service.headers, timeout=120,
                             files={"file": (name or os.path.basename(path), f)})


def test_an_s3_job_store_runs_jobs_over_http_and_a_tenant_past_its_job_limit_gets_429(tight, long_doc, s3):
    long_pdf, _ = long_doc
    report = os.path.join(EXAMPLES, "report.pdf")
    first = _post_job(tight, long_pdf)
    assert first.status_code == 202, first.text
    first = first.json()
    # the tenant's one unfinished job is running (40 pages through an engine queue of one): a second is refused
    second = _post_job(tight, report)
    assert second.status_code == 429 and second.json()["error"]["code"] == "too_many_jobs", second.text
    assert int(second.headers["retry-after"]) >= 1
    r = requests.delete(f"{tight.url}/v1/jobs/{first['id']}", timeout=30)
    assert r.status_code == 200, r.text
    _wait_job(tight, first["id"], lambda st: st["status"] == "cancelled", timeout=120)
    # a cancelled job is finished: the tenant may submit again, and that job runs to the end from S3
    job = _job(tight, report)
    done = _wait_job(tight, job["id"], lambda st: st["status"] in ("done", "failed", "cancelled"))
    assert done["status"] == "done" and done["pages_done"] == done["pages_total"] == 2, done
    res = requests.get(f"{tight.url}/v1/jobs/{job['id']}/result", timeout=60).json()
    want = _pages(tight.parse(report))
    assert [(p["page_index"], p["markdown"]) for p in res["pages"]] == [(i, want[i]["markdown"]) for i in (0, 1)]
    # the job lives in the bucket: its input, its state and its page rows (the batch job's Parquet schema)
    import pyarrow.parquet as pq

    client = s3["client"]
    keys = [o["Key"] for o in client.list_objects_v2(Bucket=TIGHT_JOBS_BUCKET,
                                                    Prefix=f"store/jobs/{job['id']}/").get("Contents", [])]
    parquet = [k for k in keys if k.endswith(".parquet")]
    assert parquet and len(keys) > len(parquet), keys
    rows = [row for k in parquet for row in pq.read_table(io.BytesIO(
        client.get_object(Bucket=TIGHT_JOBS_BUCKET, Key=k)["Body"].read())).to_pylist()]
    assert sorted(row["page_index"] for row in rows) == [0, 1] and {row["status"] for row in rows} == {"ok"}
    assert not any(k.endswith(".key") for k in keys)  # the signing key came from the environment, never the store


def _tiff(frames: int) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    imgs = [Image.new("RGB", (64, 48), (40 * i, 90, 160)) for i in range(frames)]
    imgs[0].save(buf, format="TIFF", save_all=True, append_images=imgs[1:])
    return buf.getvalue()


def test_an_image_with_more_frames_than_the_cap_gets_413_on_every_route(tight, tmp_path):
    """tight's frame cap is 3 (--image-frame-limit): a 4-frame TIFF is refused by /v1/parse, /v1/jobs and
    the chat route, each with 413 too_many_frames, before a frame is decoded."""
    import openai

    scan = tmp_path / "scan.tiff"
    scan.write_bytes(_tiff(4))
    r = tight.parse(str(scan))
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_many_frames", r.text
    assert "4 frames" in r.json()["error"]["message"] and "3" in r.json()["error"]["message"]
    r = _post_job(tight, str(scan))
    assert r.status_code == 413 and r.json()["error"]["code"] == "too_many_frames", r.text
    client = openai.OpenAI(base_url=f"{tight.url}/v1", api_key="unused", max_retries=0)
    url = "data:image/tiff;base64," + base64.b64encode(scan.read_bytes()).decode()
    with pytest.raises(openai.APIStatusError) as e:
        client.chat.completions.create(model=svc_model(tight), messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": url}}]}])
    assert e.value.status_code == 413 and e.value.body["code"] == "too_many_frames", e.value.body


def test_sigterm_stops_the_service_and_leaves_no_process(tight):
    assert any("ServeReplica:padoc:Engine" in p for p in tight.session_processes())
    assert tight.stop() == 0, tight.log()
    end = time.monotonic() + 30
    while tight.session_processes() and time.monotonic() < end:
        time.sleep(0.5)
    assert tight.session_processes() == []


# ---- the Serve config file in the repo ----------------------------------------------------------------------
def test_the_repos_serve_config_runs_with_serve_run_under_a_route_prefix(tiny_model_dir, tmp_path):
    """cluster/serve.yaml as `serve run` deploys it, moved under ``route_prefix: /padoc``: the guard
    holds there too (Serve keeps the prefix in the path), /docs works from the service's own assets,
    and Serve's own request timeout is the one the config implies."""
    import yaml

    from padoc_ray.serve.config import ServeConfig

    with open(os.path.join(ROOT, "cluster", "serve.yaml")) as f:
        cfg = yaml.safe_load(f)
    args = cfg["applications"][0]["args"]
    assert cfg["http_options"]["request_timeout_s"] == ServeConfig.from_args(args).http_request_timeout_s
    port = _free_port()
    cfg["http_options"]["port"] = port
    cfg["applications"][0]["route_prefix"] = "/padoc"
    args.update(model=tiny_model_dir, replay_gt=GT, job_store=str(tmp_path / "jobs"), max_upload_bytes=1 << 20)
    args["host"]["engine"] = "noop"  # the application, not the engine, is under test here (and it starts fast)
    path = tmp_path / "serve.yaml"
    path.write_text(yaml.safe_dump(cfg))
    url = f"http://127.0.0.1:{port}/padoc"
    auth = {"Authorization": f"Bearer {TOKEN}"}
    with open(tmp_path / "run.log", "w") as log:
        proc = subprocess.Popen([os.path.join(BIN, "serve"), "run", "-a", "local", str(path)], cwd=ROOT,
                                env=_env(PADOC_RAY_API_TOKEN=TOKEN), stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)
    try:
        end = time.monotonic() + 300
        while time.monotonic() < end:
            try:
                if requests.get(f"{url}/readyz", timeout=10).status_code == 200:
                    break
            except requests.RequestException:
                pass
            assert proc.poll() is None, (tmp_path / "run.log").read_text()[-3000:]
            time.sleep(1)
        else:
            raise AssertionError((tmp_path / "run.log").read_text()[-3000:])
        memo = os.path.join(EXAMPLES, "memo.pdf")
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            assert requests.get(f"{url}/v1/models", headers=headers, timeout=30).status_code == 401
            with open(memo, "rb") as f:
                r = requests.post(f"{url}/v1/parse", files={"file": f}, headers=headers, timeout=60)
            assert r.status_code == 401
        # a 6 MB JSON body, over the 1 MiB cap (+1 MiB envelope): refused on its Content-Length, unread
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        conn.putrequest("POST", "/padoc/v1/parse")
        for k, v in {**auth, "Content-Type": "application/json", "Content-Length": str(6 << 20)}.items():
            conn.putheader(k, v)
        conn.endheaders()
        conn.send(b"{" + b" " * (64 << 10))
        big = conn.getresponse()
        assert big.status == 413 and json.loads(big.read())["error"]["code"] == "file_too_large"
        conn.close()
        with open(memo, "rb") as f:
            r = requests.post(f"{url}/v1/parse", files={"file": ("memo.pdf", f)}, timeout=120, headers=auth)
        assert r.status_code == 200 and [p["page_index"] for p in r.json()["pages"]] == [0], r.text[:500]
        assert r.json()["pages"][0]["regions"] == []  # the no-op engine: an empty layout
        job = requests.post(f"{url}/v1/jobs", files={"file": ("memo.pdf", open(memo, "rb"))}, timeout=60, headers=auth)
        assert job.status_code == 202 and job.headers["location"] == f"/padoc/v1/jobs/{job.json()['id']}"
        ready = requests.get(f"{url}/readyz", timeout=30).json()
        assert ready["status"] == "ready" and "engine" not in ready  # no one else's counts without the token
        assert "pages_done" in requests.get(f"{url}/readyz", headers=auth, timeout=30).json()["engine"]
        docs = requests.get(f"{url}/docs", timeout=30)
        assert docs.status_code == 200
        urls = re.findall(r"""(?:src|href|url)\s*[:=]\s*['"]([^'"]+)['"]""", docs.text)
        assert urls and all(u.startswith("/padoc/") for u in urls), urls  # nothing from a CDN
        for u in urls:
            assert requests.get(f"http://127.0.0.1:{port}{u}", timeout=30).status_code == 200, u
        # the page view: open, and every URL in it (its assets, the API's root) under the prefix
        view = requests.get(f"{url}/", timeout=30)
        assert view.status_code == 200 and view.headers["content-type"].startswith("text/html")
        assets = re.findall(r'(?:src|href)="([^"]+)"', view.text)
        assert len(assets) == 4 and 'data-root="/padoc"' in view.text
        for u in assets:
            assert u.startswith("/padoc/ui/") and requests.get(f"http://127.0.0.1:{port}{u}", timeout=30).ok, u
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
