"""Serve's page view apart from HTTP: ``stream=`` values, ``view=true`` page views (sanitized blocks,
the image moved into the view) and the page's HTML under a route prefix."""

from __future__ import annotations

import pytest

from padoc_ray.serve import playground
from padoc_ray.serve.errors import Refusal
from padoc_ray.serve.streams import PAGES, REGIONS, stream_mode


def test_stream_takes_fastapis_bool_spellings_and_regions():
    for v in (None, "", "false", "False", "0", "no", "off"):
        assert stream_mode(v) is None, v
    for v in ("true", "TRUE", "1", "yes", "on"):
        assert stream_mode(v) == PAGES, v
    assert stream_mode("regions") == REGIONS
    for v in ("maybe", "region", "2"):
        with pytest.raises(Refusal) as e:
            stream_mode(v)
        assert (e.value.code, e.value.status) == ("bad_request", 422)


def _page(markdown: str, regions: list[dict], spans: list[dict], **kw) -> dict:
    return {"source_uri": "a.pdf", "doc_id": "d", "page_index": 0, "status": "ok", "image_width": 100,
            "image_height": 200, "markdown": markdown, "regions": regions, "spans": spans, **kw}


def test_views_draw_sanitized_blocks_and_carry_the_page_image():
    md = "Hello\n\n<table><tr><td onclick=\"x()\">1</td></tr></table><script>window.__pwned=1</script>\n"
    end = md.index("\n", 7)
    regions = [{"order": 0, "category": "text", "bbox": [0.1, 0.1, 0.9, 0.2], "content_format": "text"},
               {"order": 1, "category": "table", "bbox": [0.1, 0.3, 0.9, 0.6], "content_format": "html"}]
    result = {"pages": [_page(md, regions, [{"order": 0, "start": 0, "end": 5}, {"order": 1, "start": 7,
                                                                                     "end": end}],
                              image_url="data:image/png;base64,AAAA")]}
    page = playground.add_views(result)["pages"][0]
    view = page["view"]
    assert "image_url" not in page and view["image_url"] == "data:image/png;base64,AAAA"
    assert "row" not in view  # the raw row is the page itself
    assert [b["order"] for b in view["regions"]] == [0, 1] and view["regions"][1]["bbox"] == [0.1, 0.3, 0.9, 0.6]
    html = [b["html"] for b in view["blocks"]]
    assert html[0] == "<p>Hello</p>"
    assert "<td>1</td>" in html[1] and "script" not in html[1] and "onclick" not in html[1]


def test_the_page_is_under_the_route_prefix_and_its_assets_are_an_allow_list():
    class Req:
        scope = {"root_path": "/gw/padoc"}

    resp = playground.page(Req(), "padoc-tiny")
    body = resp.body.decode()
    assert 'data-root="/gw/padoc"' in body and 'src="/gw/padoc/ui/page.js"' in body
    assert "'self'" in resp.headers["content-security-policy"]
    assert playground.asset("playground.js").status_code == 200
    assert playground.asset("../app.py").status_code == 404 and playground.asset("viewer.js").status_code == 404
