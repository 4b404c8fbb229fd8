"""Operator metrics (padoc_ray.metrics): the batch job on a `ray start` cluster exports them on the
node's Prometheus endpoint with the values its output rows imply; the Grafana dashboard charts
exactly them; fork latency is measured as documented; without Ray nothing is recorded or imported."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import subprocess
import sys
import time
import urllib.request
from collections import Counter

import pyarrow as pa
import pytest

from padoc_ray import metrics
from padoc_ray.engine.fake import ScriptedEngine
from padoc_ray.engine.interface import GenDelta
from padoc_ray.scheduler import replay_input, run_page
from padoc_ray.scheduler.runner import branch_admission

from tests.contracts import test_pure_imports as pure
from tests.conftest import ROOT
from tests.helpers.pdf_factory import text_pdf
from tests.unit.scheduler.test_run_page import P, base, page

DASHBOARD = os.path.join(ROOT, "cluster", "grafana", "padoc-ray.json")


# ---- the catalogue and the dashboard -------------------------------------------------------------------
def _dashboard_exprs() -> list[str]:
    dash = json.load(open(DASHBOARD))
    return [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]


def test_dashboard_queries_use_exactly_the_defined_metrics():
    exported = metrics.exported_names()
    exprs = _dashboard_exprs()
    assert exprs
    used = set()
    for e in exprs:
        names = set(re.findall(r"\b(?:ray_)?padoc_[a-z0-9_]+", e))
        assert names, f"a query charts no padoc metric: {e}"
        unknown = names - set(exported)
        assert not unknown, f"{e}: not an exported padoc series {sorted(unknown)} (Ray exports {metrics.EXPORT_PREFIX}*)"
        assert not re.search(r"\bray_(?!padoc_)\w+", e), f"{e}: a metric that is not padoc's"
        used |= {exported[n].name for n in names}
    assert used == {m.name for m in metrics.METRICS}, f"never charted: {sorted({m.name for m in metrics.METRICS} - used)}"


def test_metric_catalogue_is_consistent_and_documented():
    names = [m.name for m in metrics.METRICS]
    assert len(names) == len(set(names)) and all(re.fullmatch(r"padoc_[a-z_]+", n) for n in names)
    doc = open(os.path.join(ROOT, "cluster", "METRICS.md")).read()
    for m in metrics.METRICS:
        assert m.kind in ("counter", "gauge", "histogram") and m.description
        assert (m.kind == "histogram") == bool(m.boundaries)
        assert list(m.boundaries) == sorted(set(m.boundaries)) and all(b > 0 for b in m.boundaries)
        assert f"`{m.exported()[0].removesuffix('_bucket')}`" in doc, m.name  # the series name an operator queries


# ---- without Ray ---------------------------------------------------------------------------------------
def test_host_and_metrics_import_without_ray_and_record_nothing():
    out = subprocess.run([sys.executable, "-c", pure.BLOCKER, "padoc_ray.metrics", "padoc_ray.host"],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    probe = ("import sys; from padoc_ray import metrics; r = metrics.get(); "
             "print(r is metrics.NOOP, 'ray' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.stdout.split() == ["True", "False"], out.stderr


class Capture(metrics.Recorder):
    def __init__(self):
        self.pages, self.in_flight = [], []

    def page(self, rec):
        self.pages.append(rec)

    def pages_in_flight(self, n):
        self.in_flight.append(n)


def test_host_records_every_page_and_pages_in_flight(monkeypatch):
    """Every record a host returns (an unreadable image too) is recorded once; the gauge follows
    the pages running, up to pages_in_flight and back to 0."""
    from tests.unit.host.test_page_host import host, img

    cap = Capture()
    monkeypatch.setattr(metrics, "get", lambda: cap)
    h = host(ScriptedEngine(token_delay_s=0.003), truth={(f"d{i}.pdf", 0): page(3) for i in range(5)},
             pages_in_flight=2)
    from padoc_ray.host import PageRequest

    async def go():
        pages = [PageRequest(doc_id=str(i) * 64, page_index=0, image=img(), source_name=f"d{i}.pdf") for i in range(5)]
        pages.append(PageRequest(doc_id="f" * 64, page_index=0, image_bytes=b"not an image"))
        return await asyncio.gather(*(h.parse(p) for p in pages))

    recs = asyncio.run(go())
    assert [r.status for r in recs] == ["ok"] * 5 + ["image_unreadable"]
    assert sorted(map(id, cap.pages)) == sorted(map(id, recs))
    assert max(cap.in_flight) == 2 and cap.in_flight[-1] == 0 and len(cap.in_flight) == 10


class RenderCapture(metrics.Recorder):
    """What the render stage records, in order."""

    def __init__(self):
        self.calls: list[tuple] = []

    def render_failed(self, status):
        self.calls.append(("render_failed", status))

    def rendered(self, render_s):
        self.calls.append(("rendered", render_s))

    def document_error(self, status):
        self.calls.append(("document_error", status))


def test_the_engine_actor_records_the_render_stages_rows_and_the_raster_task_nothing(monkeypatch, tmp_path):
    """The batch job's render-stage metrics come from the engine stage, once a batch of raster rows is parsed (a
    raster task's worker may exit before its next push to Ray's metrics agent; an engine actor lives for
    the run): rasterizing alone records nothing, then every error row is counted once with its status,
    every rendered page's render time observed once, and nothing for pages the engine host ran."""
    from padoc_ray.pipeline.config import BatchConfig
    from padoc_ray.pipeline.limits import InputLimits
    from padoc_ray.pipeline.stages import EngineStage, rasterize
    from padoc_ray.pdf import RenderConfig
    from padoc_ray.raster import RendererConfig

    from tests.unit.output import test_row_parity as parity

    cap = RenderCapture()
    monkeypatch.setattr(metrics, "get", lambda: cap)
    files = parity._inputs()
    (tmp_path / "in").mkdir()
    cfg = BatchConfig.from_flat(input=str(tmp_path / "in"), output=str(tmp_path / "out"), model="unused",
                                limits=InputLimits(max_doc_pages=parity.CAP, max_image_frames=parity.FRAMES),
                                render=RenderConfig(), image_encoding="zstd", renderer=RendererConfig())

    async def run(tables):
        stage = EngineStage(cfg)
        stage.host = await parity._host().start()
        return [r for t in tables async for done in stage(t) for r in done.to_pylist()]

    want: list[tuple] = []
    for name, data in files.items():
        (tmp_path / "in" / name).write_bytes(data)
        batch = pa.Table.from_pylist([{"uri": str(tmp_path / "in" / name), "size": len(data), "done": [],
                                       "doc_id": None}])
        tables = list(rasterize(batch, cfg, parity.MODEL_ID))
        raster = [r for t in tables for r in t.to_pylist()]
        assert cap.calls == want, name  # the raster task recorded nothing
        out = asyncio.run(run(tables))
        assert len(out) == len(raster), name
        for r in raster:
            if r["page_index"] < 0:
                want.append(("document_error", r["status"]))
            elif r["status"] is not None:
                want.append(("render_failed", r["status"]))
            else:
                want.append(("rendered", r["render_s"]))
        assert cap.calls == want, name
    kinds = Counter(k for k, _ in want)
    assert kinds["document_error"] >= 2 and kinds["render_failed"] >= 2 and kinds["rendered"] >= 8, kinds
    assert all(v is not None and v >= 0 for k, v in want if k == "rendered")


# ---- fork latency, measured in the runner --------------------------------------------------------------
class FinalOnlyBranches(ScriptedEngine):
    """Branches arrive whole after ``hold_s`` (like stream=False), saying their first token came
    ``first_token_s`` after submission (None: the engine does not say)."""

    def __init__(self, hold_s: float, first_token_s: float | None):
        super().__init__()
        self.hold_s, self.first_token_s = hold_s, first_token_s

    async def generate(self, req):
        if "/b" not in req.request_id:
            async for d in super().generate(req):
                yield d
            return
        toks, last = [], None
        async for d in super().generate(req):
            toks += d.token_ids
            last = d
        await asyncio.sleep(self.hold_s)
        yield GenDelta(req.request_id, toks, True, last.finish_reason, last.num_prompt_tokens,
                       last.num_cached_tokens, first_token_s=self.first_token_s)


@pytest.mark.parametrize("reported", [0.02, None])
def test_fork_latency_uses_the_engines_first_token_time(reported):
    inp = replay_input(P, page(6), base(), "fork")
    rec = asyncio.run(run_page(FinalOnlyBranches(0.3, reported), P, inp, mode="fork"))
    assert rec.status == "ok" and rec.n_branches == 5 and len(rec.fork_latency_s) == 5
    for s in rec.fork_latency_s:
        if reported is None:  # only the final delta tells: the branch's arrival
            assert 0.3 <= s <= rec.e2e_s
        else:
            assert reported <= s < 0.3  # submission + the engine's first-token time


def test_fork_latency_includes_the_wait_for_admission():
    """One branch at a time (max_live_branches=1): a branch waits for the slot, and that counts.
    The branch admitted last starts after every other branch streamed all its tokens, and its
    region closed before the layout stream ended, so its latency has a lower bound."""
    delay = 0.002
    inp = replay_input(P, page(6, "region %d " + "lorem ipsum " * 5), base(), "fork")
    rec = asyncio.run(run_page(ScriptedEngine(token_delay_s=delay), P, inp, mode="fork", admission=branch_admission(1)))
    assert rec.status == "ok" and len(rec.fork_latency_s) == rec.n_branches == 5
    bound = (sum(rec.branch_tokens) - max(rec.branch_tokens)) * delay - rec.layout_s
    assert bound > 0 and max(rec.fork_latency_s) >= bound
    assert all(0 <= s <= rec.e2e_s for s in rec.fork_latency_s)


# ---- a batch job on a `ray start` cluster, scraped -------------------------------------------------------
@pytest.fixture(scope="module", autouse=True)
def _fast_metrics_export():
    """The cluster of this module (conftest's own_ray_cluster reads the environment when it starts,
    after this autouse fixture) pushes metrics every second, not every 10 s."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_metrics_report_interval_ms", "1000")
        yield


def scrape(url: str) -> dict[str, list[tuple[dict, float]]]:
    """padoc's series on a Prometheus endpoint: name -> [(labels, value)]."""
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    out: dict[str, list[tuple[dict, float]]] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(metrics.EXPORT_PREFIX + "padoc_"):
                out.setdefault(s.name, []).append((s.labels, s.value))
    return out


def total(series, name: str, **labels) -> float:
    return sum(v for lab, v in series.get(name, []) if all(lab.get(k) == w for k, w in labels.items()))


def buckets(series, name: str) -> dict[float, float]:
    """A histogram's cumulative bucket counts, summed over Ray's per-worker series."""
    out: dict[float, float] = {}
    for lab, v in series.get(name + "_bucket", []):
        le = float(lab["le"])
        out[le] = out.get(le, 0) + v
    return out


def expect_buckets(values, spec: metrics.MetricSpec) -> dict[float, float]:
    return {**{b: sum(v <= b for v in values) for b in spec.boundaries}, float("inf"): len(values)}


@pytest.mark.engine
@pytest.mark.slow
def test_batch_job_exports_the_metrics_its_rows_imply(own_ray_cluster, tiny_model_dir, tmp_path):
    """A teacher-forced PDF (one page, 12 branches), a page too large to render and a file that is
    no PDF, through `padoc-ray parse` on the cluster: every counter equals the sum over the rows
    written, every histogram's buckets hold the rows' values, and the pages-in-flight gauge was
    exported while the job ran, within --pages-in-flight."""
    import threading

    from tests.helpers.batch_runs import parse_cmd, read_pages, run_logged

    src = tmp_path / "in"
    src.mkdir()
    shutil.copy(os.path.join(ROOT, "examples", "memo.pdf"), src / "memo.pdf")
    (src / "huge.pdf").write_bytes(text_pdf(1, size=(20000, 20000)))  # absurd_page_size: a render-stage page
    (src / "notes.txt").write_bytes(b"not a PDF")  # not_pdf: a document error
    url = own_ray_cluster["metrics"]
    assert not scrape(url), "a fresh cluster has no padoc metrics"
    in_flight: list[float] = []
    done = threading.Event()

    def watch():  # the gauge while the job runs
        while not done.wait(0.3):
            try:
                in_flight.extend(v for _, v in scrape(url).get("ray_padoc_pages_in_flight", []))
            except OSError:
                pass

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    out = tmp_path / "out"
    args = ["--input", str(src), "--output", str(out), "--model", tiny_model_dir, "--address", own_ray_cluster["gcs"],
            "--longest-side", "400", "--replay", os.path.join(ROOT, "examples", "ground_truth.json"),
            "--pages-in-flight", "2"]
    try:
        rc, log = run_logged(parse_cmd(*args), tmp_path / "run.log", timeout=300)
    finally:
        done.set()
        watcher.join()
    assert rc == 0, log[-4000:]
    rows = read_pages(str(out))
    pages = [r for r in rows if r["page_index"] >= 0]
    engine = [r for r in pages if r["e2e_s"] is not None]  # rows an engine host returned
    assert Counter(r["status"] for r in pages) == {"ok": 1, "absurd_page_size": 1}
    assert sum(r["n_branches"] for r in engine) > 0
    want = Counter(("engine" if r["e2e_s"] is not None else "render", r["status"]) for r in pages)

    # the engine actor's last pushes reach the agent within seconds on an idle machine; give a loaded one (the
    # suite's other worker) more. The render stage's counts come from the engine actor too (record_render): a
    # raster task's worker that exited before its next push lost them, and the test failed now and then
    deadline = time.time() + 90
    while True:
        m = scrape(url)
        got = {k: total(m, "ray_padoc_pages_total", stage=k[0], status=k[1]) for k in want}
        if (got == want and total(m, "ray_padoc_render_seconds_count") >= 1) or time.time() > deadline:
            break
        time.sleep(0.5)
    assert got == want
    assert total(m, "ray_padoc_pages_total") == len(pages)  # no other status or stage
    docs = [r for r in rows if r["page_index"] < 0]
    assert {lab["status"]: v for lab, v in m["ray_padoc_document_errors_total"]} == Counter(r["status"] for r in docs)
    assert total(m, "ray_padoc_output_tokens_total") == sum(r["output_tokens"] for r in engine)
    assert total(m, "ray_padoc_prompt_tokens_total") == sum(r["prompt_tokens"] for r in engine)
    cached = sum(r["cached_tokens"] for r in engine)
    assert cached > 0 and total(m, "ray_padoc_cached_prompt_tokens_total") == cached  # branches share the prefix
    # memo.pdf is born digital: its text regions' drafts (its own text layer) were checked and, replayed, accepted
    accepted = sum(r["accepted_tokens"] for r in engine)
    drafted = sum(reg["draft_tokens"] or 0 for r in engine for reg in r["regions"])
    assert 0 < accepted <= drafted and total(m, "ray_padoc_draft_tokens_total", outcome="accepted") == accepted
    assert total(m, "ray_padoc_draft_tokens_total", outcome="drafted") == drafted
    assert buckets(m, "ray_padoc_page_branches") == expect_buckets([r["n_branches"] for r in engine], metrics.BRANCHES)
    assert buckets(m, "ray_padoc_ttft_seconds") == expect_buckets([r["ttft_s"] for r in engine], metrics.TTFT)
    assert buckets(m, "ray_padoc_page_seconds") == expect_buckets([r["e2e_s"] for r in engine], metrics.PAGE_SECONDS)
    rendered = [r["render_s"] for r in pages if r["render_s"] is not None]
    assert len(rendered) == 1 and buckets(m, "ray_padoc_render_seconds") == expect_buckets(rendered,
                                                                                           metrics.RENDER_SECONDS)
    # every branch of a teacher-forced page produces tokens: one fork latency each, none past its page's end
    fork = buckets(m, "ray_padoc_fork_latency_seconds")
    assert fork[float("inf")] == sum(r["n_branches"] for r in engine)
    assert fork[min(b for b in metrics.FORK_LATENCY.boundaries if b >= max(r["e2e_s"] for r in engine))] == \
        fork[float("inf")]
    # the gauge is sampled once a second and one page runs for less: it was exported, within bounds
    assert in_flight and all(0 <= v <= 2 for v in in_flight), in_flight
