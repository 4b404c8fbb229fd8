"""Region events (``PageHost.events``) on the real CPU vLLM engine, teacher-forced: the protocol's
order (a region's box before its content, every region once) and content that rebuilds the Markdown."""

from __future__ import annotations

import asyncio
import glob
import os

import pytest

from padoc_ray import status
from padoc_ray.groundtruth import load_truth
from padoc_ray.host import HostConfig, PageHost, PageRequest
from padoc_ray.inputs import load_pages
from padoc_ray.output import rows
from padoc_ray.protocol import to_markdown
from padoc_ray.protocol.render import SEPARATOR
from padoc_ray.scheduler import PageRecord

from tests.conftest import ROOT

pytestmark = pytest.mark.engine


def check_protocol(events: list[dict], rec: PageRecord, page_index: int) -> None:
    seen_box, seen_content, blocks = {}, {}, {}
    for k, ev in enumerate(events):
        assert ev["page_index"] == page_index
        o = ev["order"]
        if ev["event"] == "region":
            assert o not in seen_box, f"region {o} announced twice"
            assert set(ev) == {"event", "page_index", "order", "bbox", "category"}
            seen_box[o] = k
        else:
            assert ev["event"] == "content" and set(ev) == {"event", "page_index", "order", "markdown"}
            assert o in seen_box, f"content of region {o} before its box"
            assert o not in seen_content, f"content of region {o} twice"
            seen_content[o] = k
            blocks[o] = ev["markdown"]
    n = len(rec.page.regions)
    assert n > 0 and sorted(seen_box) == sorted(seen_content) == list(range(n))
    for o, r in enumerate(rec.page.regions):  # the boxes announced are the page's
        box = next(e for e in events if e["event"] == "region" and e["order"] == o)
        assert box["category"] == r.category
        assert box["bbox"] == pytest.approx(list(r.box.as_tuple()), abs=1e-5)
    text = [blocks[o] for o in range(n) if blocks[o] is not None]
    assert SEPARATOR.join(text) + ("\n" if text else "") == to_markdown(rec.page)
    # the page row's span map points at the very blocks the events carried
    base = rows.base_row(run_id="r", uri="x.pdf", doc_id="d", page_index=page_index, page_count=1, mode=rec.mode,
                         model_id="m")
    row = rows.page_row(base, rec)
    assert [s["order"] for s in row["spans"]] == [o for o in range(n) if blocks[o] is not None]
    assert all(row["markdown"][s["start"]:s["end"]] == blocks[s["order"]] for s in row["spans"])


@pytest.mark.parametrize("mode", ["fork", "sequential"])
def test_events_follow_the_protocol_and_rebuild_the_markdown(cpu_engine, model_protocol, loop_thread,
                                                            tiny_model_dir, mode):
    truth = load_truth(os.path.join(ROOT, "examples", "ground_truth.json"))
    pages = [it.page for it in load_pages(sorted(glob.glob(os.path.join(ROOT, "examples", "*.pdf"))))]
    host = PageHost(tiny_model_dir, HostConfig(pages_in_flight=8), truth=truth, engine=cpu_engine,
                    model_protocol=model_protocol)

    async def one(p: PageRequest):
        items = [it async for it in host.events(PageRequest(**{**p.__dict__, "mode": mode, "salt": f"ev-{mode}"}))]
        assert isinstance(items[-1], PageRecord) and not any(isinstance(i, PageRecord) for i in items[:-1])
        return items[:-1], items[-1], p.page_index

    async def go():
        await host.start()
        return await asyncio.gather(*(one(p) for p in pages))

    got = loop_thread.run(go(), timeout=600)
    assert len(got) == 5
    for events, rec, page_index in got:
        assert rec.status == status.OK, (rec.page_id, rec.message)
        check_protocol(events, rec, page_index)
    # some page's blocks include a figure or title: the events carry rendered Markdown, not raw content
    assert any(e["markdown"] and e["markdown"].startswith(("# ", "![")) for ev, _, _ in got for e in ev
               if e["event"] == "content")
