"""The engine host's contract on the scripted engine: page errors become records, only an engine
death is fatal, page ids come from content (never names), pages in flight are bounded."""

from __future__ import annotations

import asyncio

import pytest
from PIL import Image

from padoc_ray.engine.fake import ScriptedEngine
from padoc_ray.engine.interface import EngineDeadError
from padoc_ray.host import HostConfig, PageHost, PageRequest, page_identity
from padoc_ray.protocol import quantized
from padoc_ray.raster import encode_image

from tests.unit.scheduler.test_run_page import P, page


def host(engine, truth=None, **cfg) -> PageHost:
    h = PageHost("unused", HostConfig(**cfg), truth=truth or {}, engine=engine, model_protocol=P)
    asyncio.run(h.start())
    return h


def img(color=(255, 255, 255)):
    return Image.new("RGB", (80, 100), color)


def hp(doc="a" * 64, index=0, **kw) -> PageRequest:
    kw.setdefault("image", img())
    return PageRequest(doc_id=doc, page_index=index, source_name="doc.pdf", **kw)


def test_replay_truth_is_matched_by_file_name_and_page():
    truth = page(4)
    h = host(ScriptedEngine(chunk=2), truth={("doc.pdf", 1): truth})
    rec = asyncio.run(h.parse(hp(index=1)))
    assert rec.status == "ok" and rec.valid and rec.page.regions == quantized(truth, P.vocab).regions
    other = asyncio.run(h.parse(hp(index=0)))  # no truth for page 0: the script emits nothing
    assert other.page.regions == () and other.status != "ok"


@pytest.mark.parametrize("where", ["main", "b1"])
def test_any_exception_mid_page_is_that_pages_record_and_aborts_its_requests(where):
    truth = page(4)

    def fail(req):
        return KeyError("boom") if req.request_id.endswith("/" + where) else None

    eng = ScriptedEngine(chunk=1, token_delay_s=0.002, fail=fail)
    h = host(eng, truth={("doc.pdf", 0): truth})
    rec = asyncio.run(h.parse(hp()))
    assert rec.status == "internal_error" and not rec.valid
    assert "KeyError" in rec.message and "boom" in rec.message
    assert eng.live == set() and eng.num_unfinished_requests() == 0
    # the host goes on: the next page runs normally
    eng.fail = None
    assert asyncio.run(h.parse(hp(index=0))).status == "ok"


def test_an_undecodable_image_is_one_error_record():
    eng = ScriptedEngine()
    h = host(eng)
    rec = asyncio.run(h.parse(PageRequest(doc_id="b" * 64, page_index=3, image_bytes=b"ZSTD-not-really",
                                       width=10, height=10)))
    assert rec.status == "image_unreadable" and "decoded" in rec.message and rec.page.page_no == 3
    assert eng.requests == []  # nothing reached the engine
    good = encode_image(img(), "png")
    rec = asyncio.run(h.parse(PageRequest(doc_id="b" * 64, page_index=0, image_bytes=good)))
    assert rec.status != "image_unreadable"


def test_pages_done_counts_every_record_the_metric_counts(monkeypatch):
    """The host's ``pages_done`` (what /readyz shows) and its pages metric count the same records: a
    page refused before the engine (an undecodable image, a mode the family lacks) counts in both."""
    from padoc_ray import metrics

    counted = []

    class Pages(metrics.Recorder):
        def page(self, rec):
            counted.append(rec.status)

    monkeypatch.setattr(metrics, "get", lambda: Pages())
    h = host(ScriptedEngine(), truth={("doc.pdf", 0): page(2)})
    asyncio.run(h.parse(hp()))
    asyncio.run(h.parse(hp(index=1, image=None, image_bytes=b"not an image", width=10, height=10)))
    asyncio.run(h.parse(hp(index=2, mode="nonsense")))
    assert counted == ["ok", "image_unreadable", "internal_error"]
    assert h.pages_done == len(counted) == h.stats()["pages_done"]


def test_an_engine_death_is_fatal_to_the_host_and_only_then():
    eng = ScriptedEngine(fail=lambda req: EngineDeadError("gone"))
    h = host(eng)
    with pytest.raises(EngineDeadError):
        asyncio.run(h.parse(hp()))
    assert h.stats()["engine_dead"]
    eng.fail = None
    with pytest.raises(EngineDeadError, match="died earlier"):  # refuses later pages: its owner restarts it
        asyncio.run(h.parse(hp()))


def test_page_ids_come_from_content_and_tenant_never_from_names():
    a, b = "1" * 64, "2" * 64
    assert page_identity(a, 0) == page_identity(a, 0)
    assert page_identity(a, 0)[0] != page_identity(b, 0)[0]
    assert page_identity(a, 0)[0] != page_identity(a, 1)[0]
    assert page_identity(a, 0, "t1")[0] != page_identity(a, 0, "t2")[0]  # tenants share nothing
    # a per-request salt separates everything: image uuid and prefix blocks
    (id1, s1), (id2, s2) = page_identity(a, 0, "t", "r1"), page_identity(a, 0, "t", "r2")
    assert id1 != id2 and s1 != s2 and page_identity(a, 0, "t", "r1") == (id1, s1)

    eng = ScriptedEngine()
    h = host(eng)
    asyncio.run(h.parse(PageRequest(doc_id=a, page_index=0, image=img(), source_name="same.pdf")))
    asyncio.run(h.parse(PageRequest(doc_id=b, page_index=0, image=img((0, 0, 0)), source_name="same.pdf")))
    uuids = {r.image_uuid for r in eng.requests}
    salts = {r.cache_salt for r in eng.requests}
    assert len(uuids) == 2 and len(salts) == 2  # one name, two contents: two cache identities
    assert not any("same.pdf" in u for u in uuids)


def test_pages_in_flight_are_bounded():
    truth = page(3)
    eng = ScriptedEngine(chunk=1, token_delay_s=0.003)
    h = host(eng, truth={(f"d{i}.pdf", 0): truth for i in range(6)}, pages_in_flight=2)
    peak = 0

    async def go():
        nonlocal peak

        async def watch():
            nonlocal peak
            while True:
                peak = max(peak, h.pages_running)
                await asyncio.sleep(0.001)

        w = asyncio.create_task(watch())
        recs = await asyncio.gather(*(h.parse(PageRequest(doc_id=str(i) * 64, page_index=0, image=img(),
                                                       source_name=f"d{i}.pdf")) for i in range(6)))
        w.cancel()
        return recs

    recs = asyncio.run(go())
    assert all(r.status == "ok" for r in recs) and peak == 2 and h.pages_done == 6


def test_config_is_validated():
    for bad in (dict(engine="tgi"), dict(preset="tpu"), dict(mode="parallel"), dict(pages_in_flight=0),
                dict(max_live_branches=0)):
        with pytest.raises(ValueError):
            HostConfig(**bad)


def test_an_engine_that_fails_a_request_gives_engine_error():
    """vLLM ends a request it failed with finish reason "error": the page says engine_error."""
    from padoc_ray.engine.interface import GenDelta

    class Failing(ScriptedEngine):
        async def generate(self, req):
            self.requests.append(req)
            yield GenDelta(req.request_id, [], finished=True, finish_reason="error", num_prompt_tokens=4)

    rec = asyncio.run(host(Failing(), truth={("doc.pdf", 0): page(3)}).parse(hp()))
    assert rec.status == "engine_error" and "error after 0 tokens" in rec.message and not rec.valid


def test_page_priority_runs_older_pages_first_and_layout_streams_ahead_of_their_branches():
    """page_priority: every request of the n-th page admitted carries a lower priority than those of
    later pages; with layout_priority the page's layout stream is ahead of its own branches. The
    host then asks the engine for priority scheduling."""
    from padoc_ray.scheduler import SchedulerConfig

    seen: list = []

    def record(req):
        seen.append((req.request_id, req.priority))

    eng = ScriptedEngine(chunk=2, fail=lambda req: record(req))
    sched = SchedulerConfig(page_priority=True, layout_priority=True)
    docs = ["a" * 64, "b" * 64, "c" * 64]
    truth = {("doc.pdf", 0): page(3)}
    h = host(eng, truth=truth, scheduler=sched, pages_in_flight=1)
    assert h.cfg.engine_config("unused").scheduling_policy == "priority"
    for d in docs:
        assert asyncio.run(h.parse(hp(doc=d))).status == "ok"
    by_page: dict = {}
    for rid, prio in seen:
        page_id, _, stream = rid.rpartition("/")
        by_page.setdefault(page_id.split("/")[0], []).append((stream, prio))
    order = list(by_page.values())
    assert len(order) == 3 and all(len(reqs) >= 2 for reqs in order)  # a layout stream + its branches
    for n, reqs in enumerate(order):
        (main, mp), *branches = reqs
        assert main == "main" and all(p == mp + 1 for _, p in branches)  # layout ahead of its branches
        if n:
            assert mp > max(p for _, p in order[n - 1])  # every request of a later page after the earlier's
    plain = host(ScriptedEngine(chunk=2, fail=lambda req: record(req)), truth=truth)
    seen.clear()
    asyncio.run(plain.parse(hp()))
    assert {p for _, p in seen} == {0} and plain.cfg.engine_config("unused").scheduling_policy == "fcfs"


@pytest.mark.parametrize("fails", [False, True])
def test_shutting_a_dead_engine_down_never_raises(fails, monkeypatch, caplog):
    """``shutdown_dead_engine``: what a batch engine actor calls before its ``os._exit`` and an engine
    replica's failing health check before Serve kills it. The host's own engine (here the no-op one) is
    shut down; a shutdown that fails is logged, never raised, so the process still goes."""
    import logging

    h = PageHost("unused", HostConfig(engine="noop"), model_protocol=P)
    asyncio.run(h.start())
    engine, calls = h.engine, []

    def shutdown():
        calls.append(1)
        if fails:
            raise OSError("the engine's temp folder could not be removed")

    monkeypatch.setattr(engine, "shutdown", shutdown)
    h.dead = "vLLM engine died: core gone"
    with caplog.at_level(logging.ERROR, logger="padoc_ray.host"):
        h.shutdown_dead_engine()
    assert calls == [1]
    assert ("shutting the dead engine down failed" in caplog.text) == fails
    with pytest.raises(EngineDeadError, match="died earlier"):  # still dead, not "not started"
        asyncio.run(h.parse(hp()))
