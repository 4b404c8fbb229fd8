"""The tiny HPD-Parsing checkpoint (family hpd: fork only) through the Serve endpoint over HTTP, and what
`serve`, `bench replay`, `bench serve` and `reannotate` refuse for it. Teacher-forced (--replay) with the
examples' truth, so every page must equal its truth; a request for the mode hpd lacks (sequential) is
the client's error (422 ``unsupported_mode``), never a 500, and the benchmarks run fork alone, saying why.

The batch job with the hpd checkpoint (`reannotate --compare hpd=<checkpoint>`, rows of the padoc family's
schema) is in tests/cluster/pipeline/test_batch_job.py, one run beside the padoc checkpoint and the dots
checkpoint; `bench serve` and `parse-page` on it in tests/engine/protocol/test_hpd_on_vllm.py. The checks
without an engine come first; one `padoc-ray serve` (its own local Ray and session, stopped with SIGTERM)
serves the module's last tests."""

from __future__ import annotations

import base64
import io
import json
import os
import subprocess
import sys

import pytest
import requests

from tests.conftest import ROOT, _env
from tests.cluster.serve.test_http_endpoint import LEAKS, Service

EXAMPLES = os.path.join(ROOT, "examples")
GT = os.path.join(EXAMPLES, "ground_truth.json")


def _truth(model_dir: str, name: str, page: int):
    """The page as a teacher-forced run on ``model_dir`` must give it: its truth, quantized to the vocab."""
    from padoc_ray.groundtruth import load_truth
    from padoc_ray.protocol import quantized
    from padoc_ray.tokenizer import load_model_protocol

    return quantized(load_truth(GT)[(name, page)], load_model_protocol(model_dir).vocab)


# ---- what the surfaces know of the family (no engine) ----------------------------------------------------------
def test_the_serve_and_bench_mode_checks_follow_the_family(tiny_hpd_dir, tiny_model_dir):
    from padoc_ray.bench.serving.run import checkpoint_modes
    from padoc_ray.serve.engine import mode_refusal, model_info
    from padoc_ray.tokenizer import load_model_protocol

    hpd = model_info(load_model_protocol(tiny_hpd_dir), "fork")
    assert (hpd["family"], hpd["modes"], hpd["default_mode"]) == ("hpd", ["fork"], "fork")
    assert set(hpd["refused"]) == {"sequential"} and "--mode" not in hpd["refused"]["sequential"]
    refused = mode_refusal(hpd, "sequential")
    assert (refused.code, refused.status) == ("unsupported_mode", 422)
    assert "sequential" in refused.message and "hpd" in refused.message and "modes: fork" in refused.message
    assert mode_refusal(hpd, "fork") is None and mode_refusal(None, "sequential") is None  # None: not known yet
    padoc = model_info(load_model_protocol(tiny_model_dir), "fork")
    assert (padoc["family"], padoc["modes"], padoc["refused"]) == ("padoc", ["fork", "sequential"], {})
    assert mode_refusal(padoc, "sequential") is None

    assert checkpoint_modes(tiny_model_dir, ("fork", "sequential")) == (("fork", "sequential"), {})
    kept, skipped = checkpoint_modes(tiny_hpd_dir, ("fork", "sequential"))
    assert kept == ("fork",) and set(skipped) == {"sequential"} and "HPD-Parsing" in skipped["sequential"]
    assert checkpoint_modes(tiny_hpd_dir, ("sequential",))[0] == ()


def test_the_commands_refuse_what_hpd_cannot_do_before_starting_anything(tiny_hpd_dir, tiny_model_dir, tmp_path):
    """Exit 2 with the reason, before Ray or an engine starts: `serve --mode sequential` (the host's
    default mode), `serve` on a folder that is no checkpoint, `bench replay --modes sequential` (all it
    asked for is missing), `reannotate` asking the hpd checkpoint for a sequential parse."""
    bin_ = os.path.join(os.path.dirname(sys.executable), "padoc-ray")

    def run(*args):
        p = subprocess.run([bin_, *args], capture_output=True, text=True, env=_env(), timeout=120, cwd=ROOT)
        return p.returncode, p.stderr

    code, err = run("serve", "--model", tiny_hpd_dir, "--mode", "sequential", "--port", "1")
    assert code == 2 and "HPD-Parsing" in err and "sequential" in err, err[-2000:]
    code, err = run("serve", "--model", EXAMPLES, "--port", "1")
    assert code == 2 and "not a checkpoint padoc-ray knows" in err, err[-2000:]
    code, err = run("bench", "replay", "--gt", GT, "--images", EXAMPLES, "--model", tiny_hpd_dir, "--modes",
                    "sequential", "--out", str(tmp_path / "b"))
    assert code == 2 and "--modes sequential" in err and "HPD-Parsing" in err, err[-2000:]
    assert not (tmp_path / "b").exists()
    code, err = run("reannotate", "--source", EXAMPLES, "--gt", GT, "--output", str(tmp_path / "r"), "--model",
                    tiny_hpd_dir, "--modes", "fork,sequential", "--compare", f"padoc=model:{tiny_model_dir}")
    assert code == 2 and "prediction set sequential" in err and "HPD-Parsing" in err, err[-2000:]
    assert not (tmp_path / "r" / "predictions").exists()


# ---- Serve ---------------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def hpd_svc(tmp_path_factory, tiny_hpd_dir):
    """`padoc-ray serve --model <tiny hpd> --replay examples/ground_truth.json` on 127.0.0.1 (no token)."""
    with Service.running(str(tmp_path_factory.mktemp("hpd-serve")), tiny_hpd_dir, GT, None, "--max-pages", "5") as s:
        yield s


@pytest.mark.engine
def test_serve_parses_with_the_hpd_checkpoint_and_each_page_equals_its_truth(hpd_svc, tiny_hpd_dir):
    models = requests.get(f"{hpd_svc.url}/v1/models", timeout=60).json()["data"][0]
    assert models["protocol"] == "hpd" and models["modes"] == ["fork"] and models["default_mode"] == "fork"
    r = hpd_svc.parse(os.path.join(EXAMPLES, "memo.pdf"))
    assert r.status_code == 200, r.text
    got = r.json()
    assert got["status"] == "ok" and got["mode"] == "fork" and len(got["pages"]) == 1
    (page,) = got["pages"]
    truth = _truth(tiny_hpd_dir, "memo.pdf", 0)
    from padoc_ray.protocol import to_markdown

    assert page["status"] == "ok" and page["valid"] and page["n_branches"] > 0
    assert page["markdown"] == to_markdown(truth)
    assert [(x["category"], x["content"]) for x in page["regions"]] == [(x.category, x.content) for x in truth.regions]
    for x, t in zip(page["regions"], truth.regions):
        assert x["bbox"] == pytest.approx(list(t.box.as_tuple()), abs=1e-4)


@pytest.mark.engine
def test_serve_streams_one_region_and_one_content_event_per_region(hpd_svc):
    with open(os.path.join(EXAMPLES, "memo.pdf"), "rb") as f:
        r = requests.post(f"{hpd_svc.url}/v1/parse", params={"stream": "regions"}, files={"file": ("memo.pdf", f)},
                          stream=True, timeout=300)
    assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
    lines = [json.loads(x) for x in r.iter_lines() if x]
    assert lines[0]["type"] == "document" and lines[-1] == {"type": "result", "status": "ok", "pages": 1}
    (page,) = [x for x in lines if x.get("type") == "page"]
    events = [x for x in lines if "event" in x]
    n = len(page["regions"])
    assert n > 0 and lines.index(page) > max(lines.index(e) for e in events)  # the page line after its events
    for kind in ("region", "content"):
        assert sorted(e["order"] for e in events if e["event"] == kind) == list(range(n)), kind
    keys = [(e["event"], e["order"]) for e in events]
    assert all(keys.index(("region", o)) < keys.index(("content", o)) for o in range(n))
    assert [e["category"] for e in sorted((e for e in events if e["event"] == "region"), key=lambda e: e["order"])] \
        == [x["category"] for x in page["regions"]]
    blocks = {e["order"]: e["markdown"] for e in events if e["event"] == "content"}
    assert "\n\n".join(blocks[o] for o in range(n) if blocks[o] is not None) + "\n" == page["markdown"]


@pytest.mark.engine
def test_serve_chat_completion_gives_the_pages_markdown(hpd_svc):
    import pypdfium2

    pdf = pypdfium2.PdfDocument(os.path.join(EXAMPLES, "memo.pdf"))
    buf = io.BytesIO()
    pdf[0].render(scale=2).to_pil().save(buf, format="PNG")
    url = "data:image/png;base64," + base64.b64encode(buf.getvalue()).decode()
    model = requests.get(f"{hpd_svc.url}/v1/models", timeout=60).json()["data"][0]["id"]
    assert model == os.path.basename(hpd_svc.proc.args[3])  # the checkpoint folder's name
    r = requests.post(f"{hpd_svc.url}/v1/chat/completions", timeout=300, json={
        "model": model, "messages": [{"role": "user", "content": [
            {"type": "text", "text": "Parse this page."}, {"type": "image_url", "image_url": {"url": url}}]}],
        "padoc": {"filename": "memo.pdf"}})  # --replay matches the truth by file name
    assert r.status_code == 200, r.text
    chat = r.json()
    want = hpd_svc.parse(os.path.join(EXAMPLES, "memo.pdf")).json()["pages"][0]["markdown"]
    assert chat["choices"][0]["message"]["content"] == want and chat["choices"][0]["finish_reason"] == "stop"
    assert chat["padoc"]["status"] == "ok" and chat["padoc"]["valid"] and chat["usage"]["completion_tokens"] > 0


@pytest.mark.engine
def test_serve_refuses_sequential_with_422_unsupported_mode(hpd_svc):
    """Every way to ask for sequential (query, JSON body, stream, job, chat) gets 422 ``unsupported_mode``
    with the reason, before anything runs; the service then still parses."""
    memo = os.path.join(EXAMPLES, "memo.pdf")

    def refused(resp, openai_shape=False):
        assert resp.status_code == 422, resp.text
        err = resp.json()["error"]
        assert err["code"] == "unsupported_mode" and "sequential" in err["message"] and "hpd" in err["message"], err
        assert not LEAKS.search(resp.text), resp.text
        if openai_shape:
            assert err["type"] == "invalid_request_error"

    refused(hpd_svc.parse(memo, mode="sequential"))
    refused(hpd_svc.parse(memo, mode="sequential", stream="regions"))
    with open(memo, "rb") as f:
        data = base64.b64encode(f.read()).decode()
    refused(requests.post(f"{hpd_svc.url}/v1/parse", json={"content_base64": data, "filename": "memo.pdf",
                                                           "mode": "sequential"}, timeout=60))
    with open(memo, "rb") as f:
        refused(requests.post(f"{hpd_svc.url}/v1/jobs", params={"mode": "sequential"},
                              files={"file": ("memo.pdf", f)}, timeout=60))
    refused(requests.post(f"{hpd_svc.url}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + data}}]}],
        "padoc": {"filename": "memo.pdf", "mode": "sequential"}}), openai_shape=True)
    assert hpd_svc.parse(memo, mode="fork").json()["status"] == "ok"
