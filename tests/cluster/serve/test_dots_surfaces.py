"""The tiny dots.ocr checkpoint (family dots: fork through grounding branches, and sequential as dots' own
single request) through the Serve endpoint over HTTP in both modes. Teacher-forced with the examples'
truth (memo.pdf's cut to its first regions), so every page must equal its truth; a dots box is in pixels
of the image the page was parsed from, so the truth is quantized at that size.

One `padoc-ray serve` (its own local Ray and session, stopped with SIGTERM). The batch job with the dots
checkpoint (`reannotate --compare dots=<checkpoint>`: Ray Data, an engine actor, rows of the padoc family's
schema) is in tests/cluster/pipeline/test_batch_job.py, one run beside the padoc checkpoint and the hpd one;
`bench serve` in both modes (and `bench replay`'s summary of that run), `parse-page` and `doctor` on dots are
in tests/engine/protocol/test_dots_on_vllm.py."""

from __future__ import annotations

import json
import os

import pytest
import requests

from tests.cluster.serve.test_http_endpoint import Service
from tests.conftest import ROOT

pytestmark = pytest.mark.engine

EXAMPLES = os.path.join(ROOT, "examples")
#: what a region is, as opposed to how it was decoded (tokens, drafts, attempts differ by mode)
REGION = ("order", "category", "bbox", "content", "content_format")


#: memo.pdf's first regions: sequential mode decodes a dots page as one JSON stream, token by token (the whole
#: memo page took about 11 s a parse on the CPU engine); four regions show what the tests check
MEMO_REGIONS = 4


def _truth(gt: str, model_dir: str, name: str, page: int, size: tuple[int, int]):
    """The page as a teacher-forced run on ``model_dir`` must give it from an image of ``size``."""
    from padoc_ray.groundtruth import load_truth
    from padoc_ray.protocol import quantized
    from padoc_ray.tokenizer import load_model_protocol

    return quantized(load_truth(gt)[(name, page)], load_model_protocol(model_dir).vocab, size)


# ---- Serve -----------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def gt(tmp_path_factory) -> str:
    """examples/ground_truth.json with memo.pdf cut to its first MEMO_REGIONS regions."""
    pages = json.load(open(os.path.join(EXAMPLES, "ground_truth.json")))
    for p in pages:
        if p["page_info"]["source_pdf"] == "memo.pdf":
            p["layout_dets"] = p["layout_dets"][:MEMO_REGIONS]
    path = tmp_path_factory.mktemp("dots-gt") / "gt.json"
    path.write_text(json.dumps(pages))
    return str(path)


@pytest.fixture(scope="module")
def dots_svc(tmp_path_factory, tiny_dots_dir, gt):
    """`padoc-ray serve --model <tiny dots> --replay GT` (the examples' truth, memo.pdf's cut) on 127.0.0.1 (no
    token)."""
    with Service.running(str(tmp_path_factory.mktemp("dots-serve")), tiny_dots_dir, gt, None, "--max-pages", "5") as s:
        yield s


def test_serve_parses_with_the_dots_checkpoint_in_both_modes_and_each_page_equals_its_truth(dots_svc,
                                                                                           tiny_dots_dir, gt):
    from padoc_ray.protocol import to_markdown

    models = requests.get(f"{dots_svc.url}/v1/models", timeout=60).json()["data"][0]
    assert models["protocol"] == "dots" and models["modes"] == ["fork", "sequential"]
    assert models["default_mode"] == "fork"
    memo = os.path.join(EXAMPLES, "memo.pdf")
    got = {}
    for mode in ("fork", "sequential"):
        r = dots_svc.parse(memo, mode=mode)
        assert r.status_code == 200, r.text
        body = r.json()
        assert (body["status"], body["mode"], len(body["pages"])) == ("ok", mode, 1), body
        got[mode] = page = body["pages"][0]
        assert page["status"] == "ok" and page["valid"] and page["mode"] == mode, page["error_message"]
    fork, seq = got["fork"], got["sequential"]
    assert fork["n_branches"] > 0 and seq["n_branches"] == 0  # grounding branches vs dots' own single request
    truth = _truth(gt, tiny_dots_dir, "memo.pdf", 0, (fork["image_width"], fork["image_height"]))
    assert fork["markdown"] == to_markdown(truth) and len(truth.regions) == MEMO_REGIONS
    assert [(x["category"], x["content"]) for x in fork["regions"]] == [(x.category, x.content) for x in truth.regions]
    for x, t in zip(fork["regions"], truth.regions):
        assert x["bbox"] == pytest.approx(list(t.box.as_tuple()), abs=1e-4)
    assert [{k: x[k] for k in REGION} for x in seq["regions"]] == [{k: x[k] for k in REGION} for x in fork["regions"]]
    assert seq["markdown"] == fork["markdown"]


@pytest.mark.parametrize("mode", ["fork", "sequential"])
def test_serve_streams_one_region_and_one_content_event_per_region(dots_svc, mode):
    """In both modes (sequential: the regions come out of dots' JSON as it streams), each region's
    event comes before its content's, and the page line after them all."""
    with open(os.path.join(EXAMPLES, "memo.pdf"), "rb") as f:
        r = requests.post(f"{dots_svc.url}/v1/parse", params={"stream": "regions", "mode": mode},
                          files={"file": ("memo.pdf", f)}, stream=True, timeout=300)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(x) for x in r.iter_lines() if x]
    assert lines[0]["type"] == "document" and lines[-1] == {"type": "result", "status": "ok", "pages": 1}
    (page,) = [x for x in lines if x.get("type") == "page"]
    events = [x for x in lines if "event" in x]
    n = len(page["regions"])
    assert page["status"] == "ok" and page["mode"] == mode and n == MEMO_REGIONS
    assert lines.index(page) > max(lines.index(e) for e in events)
    for kind in ("region", "content"):
        assert sorted(e["order"] for e in events if e["event"] == kind) == list(range(n)), kind
    keys = [(e["event"], e["order"]) for e in events]
    assert all(keys.index(("region", o)) < keys.index(("content", o)) for o in range(n))
    assert [e["category"] for e in sorted((e for e in events if e["event"] == "region"), key=lambda e: e["order"])] \
        == [x["category"] for x in page["regions"]]
    blocks = {e["order"]: e["markdown"] for e in events if e["event"] == "content"}
    assert "\n\n".join(blocks[o] for o in range(n) if blocks[o] is not None) + "\n" == page["markdown"]
