"""The dots family on the real CPU vLLM engine (stock vLLM, tiny random dots.ocr-format checkpoint): a
teacher-forced page through grounding branches equals its truth and the same truth through dots' own
single request (``--mode sequential``); each grounding prompt is, as vLLM expands it, the page's
grounding prompt with its region's box, and reads the image-and-prompt prefix from the cache; a free
run (no replay) ends with a status; parse-page, bench serve (both in this process, on this module's engine)
and doctor take the checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from padoc_ray.protocol import Box, Page, Region, quantized
from padoc_ray.protocol.dots import box_text, layout_cells

from tests.conftest import ROOT
from tests.engine.protocol import test_hpd_on_vllm
from tests.engine.protocol.test_hpd_on_vllm import on_family_engine
from tests.engine.scheduler.test_run_page_on_vllm import Recording
from tests.helpers.family_engine import expanded_prompt, family_engine, parse_one

pytestmark = pytest.mark.engine

CLI = [sys.executable, "-m", "padoc_ray.cli"]
bench_pages = test_hpd_on_vllm.bench_pages  # memo.pdf's and paper.pdf's 3 pages as 400 px images, with their truth
BLOCK = 32  # the CPU preset's KV block size


def truth_page(w=612, h=792) -> Page:
    regs = (
        Region(category="header", box=Box(0.1, 0.02, 0.6, 0.04), content="Quarterly report, page 3"),
        Region(category="title", box=Box(0.1, 0.05, 0.9, 0.1), content="Quarterly report"),
        Region(category="text_block", box=Box(0.1, 0.12, 0.9, 0.3), content='Revenue grew in every region: "all {four}".'),
        Region(category="figure", box=Box(0.2, 0.35, 0.8, 0.6), content=None, content_format="none"),
        Region(category="table", box=Box(0.1, 0.7, 0.9, 0.85), content="<table><tr><td>1</td></tr></table>",
               content_format="html"),
        Region(category="equation_isolated", box=Box(0.3, 0.86, 0.7, 0.9), content="E = m c^{2}",
               content_format="latex"),
    )
    return Page(width=w, height=h, regions=regs)


@pytest.fixture(scope="module")
def dots_engine(tiny_dots_dir, loop_thread):
    """One real engine on the tiny dots checkpoint, with the settings the host gives the family."""
    with family_engine(tiny_dots_dir, loop_thread) as (cfg, eng):
        assert cfg.trust_remote_code  # the checkpoint's configuration_dots.py (vLLM registers no dots_ocr config)
        yield eng


def test_a_teacher_forced_page_through_grounding_branches_equals_its_truth_and_dots_own_request(
        tiny_dots_dir, dots_engine, loop_thread):
    truth = truth_page()
    host, rec, reqs = parse_one(loop_thread, tiny_dots_dir, dots_engine, truth)
    mp = host.model_protocol
    assert (mp.family, mp.branch_shape) == ("dots", "grounding")
    assert rec.status == "ok" and rec.valid, rec.message
    assert rec.page.regions == quantized(truth, mp.vocab).regions
    assert rec.n_branches == 5 and len(reqs) == 6  # the Picture gets no branch
    # the image as sent: resized by the family's rule (sides on 28 px), named by that size, the same for all
    w, h = mp.spec.input_size(612, 792)
    assert w % 28 == 0 and h % 28 == 0 and reqs[0].image.size == (w, h)
    assert reqs[0].image_uuid.endswith(f"@{w}x{h}") and all(r.image_uuid == reqs[0].image_uuid for r in reqs)
    # the same truth through dots' own single request (prompt_layout_all_en), on the same weights
    _, seq, seq_reqs = parse_one(loop_thread, tiny_dots_dir, dots_engine, truth, name="s.png", mode="sequential")
    assert seq.status == "ok" and seq.valid, seq.message
    assert len(seq_reqs) == 1 and list(seq_reqs[0].prompt_ids) == list(mp.prompt_ids("sequential"))
    assert seq.page.regions == rec.page.regions
    assert seq.f_seq > rec.f_padoc  # one long stream against the layout + the longest branch


def test_each_grounding_prompt_is_the_pages_grounding_prompt_with_its_box_and_reads_the_prefix_from_the_cache(
        tiny_dots_dir, dots_engine, loop_thread):
    """vLLM's expansion of every branch prompt is the expanded grounding prompt up to the box, the box as
    dots.ocr's client writes it, then the prompt's end; no layout token is in it. Every branch reads the
    image's full blocks from the cache (the layout request computed them), and every branch after the first
    also the grounding prompt's text up to the box."""
    truth = truth_page()
    host, rec, reqs = parse_one(loop_thread, tiny_dots_dir, dots_engine, truth, name="q.png")
    mp = host.model_protocol
    v, tok = mp.vocab, mp.tokenizer
    main, branches = reqs[0], reqs[1:]

    main_x = expanded_prompt(loop_thread, dots_engine, main)
    w, h = v.spec.input_size(612, 792)
    assert main_x.count(v.image_pad) == (w // 28) * (h // 28)  # one token per 28x28 pixels after the merge
    image_end = main_x.index(tok.token_to_id("<|endofimg|>")) + 1  # shared with every branch: user turn + image
    cells = [r for r in layout_cells(v, main.forced_tokens) if v.has_branch(r)]
    before, after = v._grounding_ids
    n_before = len(before) - 1 + main_x.count(v.image_pad)  # the placeholder expands
    for k, (req, cell, cached, n_prompt) in enumerate(zip(branches, cells, rec.branch_cached_tokens,
                                                          rec.branch_prompt_tokens, strict=True)):
        got = expanded_prompt(loop_thread, dots_engine, req)
        assert got[:image_end] == main_x[:image_end]
        assert got[n_before:] == [*tok.encode(box_text(cell.bins)), *after]
        assert got[-1] == v.branch_start and n_prompt == len(got)
        assert cached >= image_end // BLOCK * BLOCK
        if k:
            assert cached >= n_before // BLOCK * BLOCK, (k, cached, n_before)


def test_a_free_run_ends_with_a_status_and_no_replay(tiny_dots_dir, dots_engine, loop_thread):
    """Random weights write no JSON: the page ends with a status of its own (not an exception)."""
    from padoc_ray.scheduler import SchedulerConfig

    _, rec, reqs = parse_one(loop_thread, tiny_dots_dir, dots_engine, None, name="free.png",
                          scheduler=SchedulerConfig(max_tokens=48))
    assert rec.status in ("malformed_layout", "token_limit", "runaway", "layout_unrecovered"), rec.status
    assert reqs[0].forced_tokens is None


def _cli(*args, timeout=600):
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=env)


@pytest.mark.slow
def test_parse_page_json_with_replay_and_the_text_layers_drafts(tiny_dots_dir, dots_engine, loop_thread, monkeypatch,
                                                                capsys):
    """``parse-page --model <dots>`` (in this process, on this module's engine): a page of a real PDF, rendered smaller than its truth's size (boxes are pixels of the image the model saw),
    equals its truth; its text layer drafts the grounding branches too (the model checks them; the content is
    its own). Sequential on the same weights: the tests above, and Serve's (tests/cluster/serve/test_dots_surfaces.py)."""
    gt = os.path.join(ROOT, "examples", "ground_truth.json")
    pdf = os.path.join(ROOT, "examples", "report.pdf")
    import padoc_ray.cli.parse

    cli = on_family_engine(monkeypatch, capsys, Recording(dots_engine), loop_thread, padoc_ray.cli.parse)
    rc, stdout, stderr = cli("parse-page", pdf, "--model", tiny_dots_dir, "--replay", gt, "--format", "json",
                             "--page", "1", "--longest-side", "800")
    assert rc == 0, stderr[-3000:]
    obj = json.loads(stdout)
    assert obj["status"] == "ok" and obj["valid"] and obj["equals_truth"] is True and obj["family"] == "dots"
    assert obj["n_branches"] >= 1 and 0 < obj["cached_tokens"] < obj["prompt_tokens"]
    assert max(obj["image_width"], obj["image_height"]) == 800
    assert sum(r["accepted_tokens"] or 0 for r in obj["regions"]) > 0


def test_doctor_reports_the_dots_family_and_a_config_naming_another_image_token(tiny_dots_dir, tmp_path):
    """`doctor --model` (in process; no engine start): the family, how it was told, its tokens; a copy whose
    config.json names another image token than the tokenizer's <|imgpad|> is a problem, said so."""
    import shutil

    from padoc_ray.doctor import DoctorConfig, diagnose, summary_lines

    rep = diagnose(DoctorConfig(model=tiny_dots_dir))
    assert rep["family"] == "dots" and rep["ok"], rep["problems"]
    m = rep["model"]
    assert "DotsOCRForCausalLM" in m["recognized_by"] and m["modes"] == ["fork", "sequential"]
    assert {"<|imgpad|>", "<|img|>", "<|endofimg|>", "<|assistant|>"} <= set(m["tokens"])
    assert any(ln.strip().startswith("model family: dots") for ln in summary_lines(rep))
    bad = tmp_path / "bad"
    shutil.copytree(tiny_dots_dir, bad)
    config = json.loads((bad / "config.json").read_text())
    assert config["image_token_id"] == m["tokens"]["<|imgpad|>"]
    config["image_token_id"] = m["tokens"]["<|img|>"]
    (bad / "config.json").write_text(json.dumps(config))
    rep = diagnose(DoctorConfig(model=str(bad)))
    assert rep["family"] == "dots" and not rep["ok"]
    assert any(f"image_token_id={m['tokens']['<|img|>']}" in p and "<|imgpad|>" in p for p in rep["problems"]), \
        rep["problems"]


# ---- bench serve (and bench replay's summary of the run) -------------------------------------------------------------
@pytest.mark.slow
def test_bench_serve_runs_the_dots_checkpoint_in_both_modes(tiny_dots_dir, bench_pages, dots_engine, loop_thread,
                                                            monkeypatch, capsys, tmp_path):
    """Unlike hpd, dots has sequential (its own single request): the benchmark (in this process, on this
    module's engine) runs both modes on the three pages and every page equals its truth in both; `bench
    replay`'s summary (the same run, shaped as that command writes it) pairs the modes on every page."""
    from padoc_ray.perfmodel.table3 import format_table, legacy_summary

    gt, images = bench_pages
    out = tmp_path / "bench"
    import padoc_ray.bench.serving.run

    engine = Recording(dots_engine)
    cli = on_family_engine(monkeypatch, capsys, engine, loop_thread, padoc_ray.bench.serving.run)
    rc, stdout, stderr = cli("bench", "serve", "--gt", gt, "--images", images, "--model", tiny_dots_dir, "--modes",
                             "fork,sequential", "--concurrency", "2", "--warmup", "0", "--out", str(out))
    assert rc == 0, stderr[-4000:]
    assert engine.requests  # the pages ran on this engine
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["modes"] == ["fork", "sequential"] and not report["config"].get("modes_skipped")
    assert [(r["mode"], r["concurrency"], r["pages"], r["valid_pages"], r["statuses"]) for r in report["rows"]] == \
        [("fork", 2, 3, 3, {"ok": 3}), ("sequential", 2, 3, 3, {"ok": 3})]
    recs = [json.loads(ln) for ln in (out / "pages.jsonl").read_text().splitlines()]
    assert sorted(r["mode"] for r in recs) == ["fork"] * 3 + ["sequential"] * 3
    assert all(r["status"] == "ok" and r["valid"] and r["equals_truth"] for r in recs)
    assert all((r["n_branches"] > 0) == (r["mode"] == "fork") for r in recs)
    md = (out / "report.md").read_text()
    assert "not run" not in md and "| valid pages/s | sequential |" in md and md in stdout

    summary = legacy_summary(report)
    block = summary["concurrency"]["2"]
    assert summary["modes"] == ["fork", "sequential"] and summary["pages"] == 3
    assert block["fork"]["valid_pages"] == block["sequential"]["valid_pages"] == 3
    assert block["paired"]["paired_pages"] == 3 and block["paired"]["median_speedup"] > 0
    assert "| 2 | fork |" in format_table(summary) and "| 2 | sequential |" in format_table(summary)
