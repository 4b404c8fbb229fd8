"""The hpd family on the real CPU vLLM engine (stock vLLM, tiny random HPD-format checkpoint): a
teacher-forced page through the fork equals its truth, each branch's prompt is, as vLLM expands it,
the layout prompt + the parent's tokens before <FORK> + <CHILD> and hits the prefix cache on every full
block, both families give the same page for the same truth, and the CLI's parse-page, bench serve and doctor
take the checkpoint (all three in this process: parse-page and bench serve on this module's engine; the Serve
endpoint: tests/cluster/serve/test_hpd_surfaces.py; the batch job: tests/cluster/pipeline/test_batch_job.py's
reannotate test)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from padoc_ray.protocol import Box, Page, Region, hpd_tile_grid, quantized, to_markdown

from tests.engine.scheduler.test_run_page_on_vllm import Recording
from tests.helpers.family_engine import expanded_prompt, family_engine, parse_one

pytestmark = pytest.mark.engine

from tests.conftest import ROOT  # noqa: E402
EXAMPLES = os.path.join(ROOT, "examples")
GT = os.path.join(EXAMPLES, "ground_truth.json")
BLOCK = 32  # the CPU preset's KV block size


def truth_page(w=612, h=792) -> Page:
    regs = (
        Region(category="title", box=Box(0.1, 0.05, 0.9, 0.1), content="Quarterly report"),
        Region(category="text_block", box=Box(0.1, 0.12, 0.9, 0.3), content="Revenue grew in every region."),
        Region(category="figure", box=Box(0.2, 0.35, 0.8, 0.6), content=None, content_format="none"),
        Region(category="table", box=Box(0.1, 0.7, 0.9, 0.85), content="<table><tr><td>1</td></tr></table>",
               content_format="html"),
        Region(category="page_number", box=Box(0.45, 0.95, 0.55, 0.98), content="3"),
    )
    return Page(width=w, height=h, regions=regs)


@pytest.fixture(scope="module")
def hpd_engine(tiny_hpd_dir, loop_thread):
    """One real engine on the tiny HPD checkpoint, with the settings the host gives the family."""
    with family_engine(tiny_hpd_dir, loop_thread) as (cfg, eng):
        assert cfg.trust_remote_code and cfg.max_model_len >= 16384
        yield eng


def test_a_teacher_forced_page_through_the_fork_equals_its_truth(tiny_hpd_dir, hpd_engine, loop_thread):
    truth = truth_page()
    host, rec, reqs = parse_one(loop_thread, tiny_hpd_dir, hpd_engine, truth)
    mp = host.model_protocol
    assert mp.family == "hpd"
    assert rec.status == "ok" and rec.valid, rec.message
    assert rec.page.regions == quantized(truth, mp.vocab).regions
    assert rec.n_branches == 4 and len(reqs) == 5  # the figure's block has no <FORK>: no branch
    assert host.cfg.scheduler.max_tokens == 8000  # the family's generation limit
    # the image as sent: pre-resized to HPD's grid, named by that size, with max_dynamic_patch for the grid
    main = reqs[0]
    assert hpd_tile_grid(612, 792) == (3, 4)  # HPD's rule: of the 3 grids nearest in area, the nearest in aspect
    assert main.image.size == (1344, 1792) and main.mm_processor_kwargs == {"max_dynamic_patch": 12}
    assert main.image_uuid.endswith("@1344x1792") and all(r.image_uuid == main.image_uuid for r in reqs)


def test_each_branch_prompt_expands_to_the_layout_prompt_plus_the_prefix_and_hits_the_cache(
        tiny_hpd_dir, hpd_engine, loop_thread):
    """vLLM's own expansion of every branch prompt equals the expanded layout prompt + the parent's tokens
    before <FORK> + <CHILD>, and each branch's num_cached_tokens covers every full block of that prefix."""
    truth = truth_page()
    host, rec, reqs = parse_one(loop_thread, tiny_hpd_dir, hpd_engine, truth, name="q.png")
    v = host.model_protocol.vocab
    main, branches = reqs[0], reqs[1:]
    layout = list(main.forced_tokens)

    main_x = expanded_prompt(loop_thread, hpd_engine, main)
    ctx = host.model_protocol.tokenizer.token_to_id("<IMG_CONTEXT>")
    assert main_x.count(ctx) == 13 * 256  # a 3x4 grid: twelve tiles and the thumbnail
    forks = [i for i, t in enumerate(layout) if t == v.region_close]
    assert len(forks) == len(branches) == 4
    for req, fp, cached, n_prompt in zip(branches, forks, rec.branch_cached_tokens, rec.branch_prompt_tokens,
                                         strict=True):
        got = expanded_prompt(loop_thread, hpd_engine, req)
        assert got == main_x + layout[:fp] + [v.branch_start]
        assert n_prompt == len(got)
        assert cached >= (len(got) - 1) // BLOCK * BLOCK  # every full block of the prefix (the image's too)


def test_both_families_give_the_same_page_for_the_same_truth(tiny_hpd_dir, hpd_engine, tiny_model_dir, cpu_engine,
                                                              loop_thread):
    truth = truth_page()
    _, a, _ = parse_one(loop_thread, tiny_model_dir, cpu_engine, truth, name="padoc.png")
    _, b, _ = parse_one(loop_thread, tiny_hpd_dir, hpd_engine, truth, name="hpd.png")
    assert a.status == b.status == "ok"
    assert to_markdown(a.page) == to_markdown(b.page)
    for ra, rb in zip(a.page.regions, b.page.regions, strict=True):
        assert (ra.category, ra.content, ra.content_format) == (rb.category, rb.content, rb.content_format)
        assert all(abs(x - y) <= 1e-3 + 1e-9 for x, y in zip(ra.box.as_tuple(), rb.box.as_tuple()))


def on_family_engine(monkeypatch, capsys, engine, loop_thread, module):
    """``padoc-ray ARGS`` in this process on ``engine`` (on_session_engine: the command's own code, but for the
    engine it would start; that start is tested in tests/engine/cli/ and tests/cluster/checkpoint/): a function
    of the arguments giving (exit code, stdout, stderr)."""
    from tests.engine.cli.test_help_and_parse_page import on_session_engine
    from tests.helpers.cli import run_main

    on_session_engine(monkeypatch, engine, loop_thread, module)
    return lambda *argv: run_main(capsys, *argv)


@pytest.mark.slow
def test_parse_page_json_with_replay_and_sequential_refused(tiny_hpd_dir, hpd_engine, loop_thread, monkeypatch,
                                                           capsys):
    """``parse-page --model <hpd>`` in this process on this module's engine; a sequential request is refused."""
    import padoc_ray.cli.parse

    cli = on_family_engine(monkeypatch, capsys, Recording(hpd_engine), loop_thread, padoc_ray.cli.parse)
    pdf = os.path.join(ROOT, "examples", "memo.pdf")
    rc, stdout, stderr = cli("parse-page", pdf, "--model", tiny_hpd_dir, "--replay", GT, "--format", "json")
    assert rc == 0, stderr[-3000:]
    obj = json.loads(stdout)
    for key in ("status", "valid", "equals_truth", "regions", "n_branches", "markdown", "spans", "prompt_tokens",
                "cached_tokens"):
        assert key in obj, key
    assert obj["status"] == "ok" and obj["valid"] and obj["equals_truth"] is True and obj["family"] == "hpd"
    assert obj["n_branches"] >= 1 and 0 < obj["cached_tokens"] < obj["prompt_tokens"]
    for order, start, end in obj["spans"]:
        assert obj["markdown"][start:end].strip()
    rc, _, stderr = cli("parse-page", pdf, "--model", tiny_hpd_dir, "--mode", "sequential")
    assert rc == 2 and "no meaning for an HPD-Parsing checkpoint" in stderr


def test_doctor_reports_the_family_on_both_runners_and_its_problems(tiny_hpd_dir, tmp_path, capsys):
    """`doctor --model` (in process; no engine start: doctor's own start check is tests/engine/doctor/'s) on
    both runners, and on a broken copy, whose problems it names with exit code 1."""
    from padoc_ray.doctor import DoctorConfig, diagnose

    from tests.helpers.cli import run_main

    for runner in ("v1", "v2"):
        rep = diagnose(DoctorConfig(model=tiny_hpd_dir, runner=runner))
        assert rep["family"] == "hpd" and rep["ok"], rep["problems"]
        assert rep["processors_load"]
        assert "InternVLChatModel" in rep["model"]["recognized_by"]
        assert set(rep["model"]["tokens"]) >= {"<BLOCK>", "<FORK>", "<CHILD>", "<image>"}
    # a P-MTP head in the main weights (stock vLLM refuses it) and a tokenizer without <FORK>
    bad = tmp_path / "bad"
    shutil.copytree(tiny_hpd_dir, bad)
    _add_tensor(bad / "model.safetensors", "language_model.mtp.0.fc.weight")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        p = bad / name
        if p.exists():
            p.write_text(p.read_text().replace("<FORK>", "<FROK>"))
    rc, _, _ = run_main(capsys, "doctor", "--model", str(bad), "--json", str(tmp_path / "d.json"))
    rep = json.loads((tmp_path / "d.json").read_text())
    assert rc == 1 and rep["family"] == "hpd" and not rep["ok"]
    text = "\n".join(rep["problems"])
    assert "P-MTP head" in text and "language_model.mtp.0.fc.weight" in text
    assert "lacks HPD protocol tokens: <FORK>" in text


def test_doctor_says_when_the_image_placeholder_is_not_one_token(tiny_hpd_dir):
    from padoc_ray.doctor import placeholder_problems
    from padoc_ray.tokenizer import ModelProtocol

    mp = ModelProtocol(tiny_hpd_dir)
    assert placeholder_problems(mp) == []

    class Split:  # a tokenizer in which the placeholder is three tokens
        def __init__(self, t):
            self.t = t

        def encode(self, text):
            out = []
            for i, part in enumerate(text.split("<image>")):
                out += ([1, 2, 3] if i else []) + self.t.encode(part)
            return out

    mp2 = type("MP", (), {"spec": mp.spec, "tokenizer": Split(mp.tokenizer)})()
    assert "is 3 tokens" in placeholder_problems(mp2)[0]


def _add_tensor(path, name: str) -> None:
    import torch
    from safetensors.torch import load_file, save_file

    sd = load_file(str(path))
    sd[name] = torch.zeros(4, 4)
    save_file(sd, str(path), metadata={"format": "pt"})


# ---- bench serve ----------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def bench_pages(tmp_path_factory):
    """memo.pdf's and paper.pdf's pages as images (400 px), with their truth: 3 pages."""
    from padoc_ray.inputs import load_pages
    from padoc_ray.pdf import RenderConfig

    tmp = tmp_path_factory.mktemp("hpd-bench")
    images = tmp / "images"
    images.mkdir()
    for it in load_pages([os.path.join(EXAMPLES, f) for f in ("memo.pdf", "paper.pdf")],
                         render=RenderConfig(longest_side=400)):
        it.page.image.save(images / f"{os.path.splitext(it.source)[0]}_page{it.page_index}.png")
    gt = [p for p in json.load(open(GT)) if p["page_info"]["source_pdf"] in ("memo.pdf", "paper.pdf")]
    (tmp / "gt.json").write_text(json.dumps(gt))
    return str(tmp / "gt.json"), str(images)


@pytest.mark.slow
def test_bench_serve_runs_the_hpd_checkpoint_and_says_why_fork_only(tiny_hpd_dir, bench_pages, hpd_engine,
                                                                    loop_thread, monkeypatch, capsys, tmp_path):
    """`bench serve --model <hpd>` in this process on this module's engine: fork only, and why."""
    import padoc_ray.bench.serving.run

    gt, images = bench_pages
    out = tmp_path / "bench"
    engine = Recording(hpd_engine)
    cli = on_family_engine(monkeypatch, capsys, engine, loop_thread, padoc_ray.bench.serving.run)
    rc, stdout, stderr = cli("bench", "serve", "--gt", gt, "--images", images, "--model", tiny_hpd_dir,
                             "--concurrency", "2", "--warmup", "1", "--out", str(out))
    assert rc == 0, stderr[-4000:]
    assert engine.requests  # the pages ran on this engine
    assert "sequential left out" in stderr and "HPD-Parsing" in stderr  # the default fork,sequential: why not both
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["modes"] == ["fork"] and set(report["config"]["modes_skipped"]) == {"sequential"}
    assert "HPD-Parsing" in report["config"]["modes_skipped"]["sequential"]
    (row,) = report["rows"]
    assert (row["mode"], row["concurrency"], row["pages"], row["valid_pages"]) == ("fork", 2, 3, 3)
    assert row["statuses"] == {"ok": 3} and row["valid_pages_per_s"] > 0
    recs = [json.loads(ln) for ln in (out / "pages.jsonl").read_text().splitlines()]
    assert len(recs) == 3 and all(r["equals_truth"] for r in recs)
    md = (out / "report.md").read_text()
    assert "Mode sequential not run: mode sequential has no meaning for an HPD-Parsing checkpoint" in md
    assert "| valid pages/s | fork |" in md and md in stdout
