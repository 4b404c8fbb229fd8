"""Commands beyond their --help: `demo`, `bench replay`, `bench pipeline`, each run for real on the
bundled examples (the tiny model; replay keeps its outputs exact). Output goes to files. `bench replay`
runs in this process on the session's engine (what it does with the engine is what it is tested for)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, _env

EXAMPLES = os.path.join(ROOT, "examples")
GT = os.path.join(EXAMPLES, "ground_truth.json")

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def cli_logged(tmp_path, name: str, *args, timeout=600) -> tuple[int, str, str]:
    """Run ``padoc-ray ARGS`` with stdout and stderr in files; returns (code, stdout, stderr)."""
    out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
    with open(out, "w") as o, open(err, "w") as e:
        rc = subprocess.run([sys.executable, "-m", "padoc_ray.cli", *args], stdout=o, stderr=e, env=_env(),
                            timeout=timeout, cwd=ROOT).returncode
    return rc, out.read_text(), err.read_text()


def test_demo_parses_the_examples_and_matches_their_truth(tiny_model_dir, tmp_path):
    out = tmp_path / "demo"
    rc, stdout, stderr = cli_logged(tmp_path, "demo", "demo", "--model", tiny_model_dir, "--output", str(out))
    assert rc == 0, stderr[-4000:]
    lines = [ln.split() for ln in stdout.splitlines() if ln.split()[:1] and ln.split()[0].endswith(".pdf")]
    assert [(ln[0], ln[1], ln[2], ln[-1]) for ln in lines] == [
        ("memo.pdf", "1", "ok", "yes"), ("paper.pdf", "1", "ok", "yes"), ("paper.pdf", "2", "ok", "yes"),
        ("report.pdf", "1", "ok", "yes"), ("report.pdf", "2", "ok", "yes")]  # every page equals its truth
    assert "--- Markdown of memo.pdf page 1 ---\n# MEMORANDUM" in stdout
    summary = json.loads(next(ln for ln in stdout.splitlines() if ln.startswith("summary: "))[len("summary: "):])
    assert summary["pages_written"] == 5 and summary["page_status"] == {"ok": 5} and summary["all_inputs_accounted"]
    assert json.load(open(out / "summary.json"))["pages_written"] == 5 and (out / ".padoc-demo-output").exists()
    # the examples are born digital: their text layers travelled from the renderer to the engine, and every
    # text region's draft was accepted whole (the truth reads perfectly); tables and formulas got none
    assert summary["text_layer"] == {"used": 5} and 0.5 < summary["accepted_fraction"] < 1, summary
    from padoc_ray.output.reader import read_rows

    rows = read_rows(str(out)).to_pylist()
    assert sum(r["accepted_tokens"] for r in rows) == summary["accepted_tokens"]
    for r in rows:
        assert r["text_layer"] == "used" and "text_layer_bytes" not in r
        for reg in r["regions"]:
            if reg["content_format"] == "text" and reg["content"]:
                assert reg["accepted_tokens"] == reg["draft_tokens"] > 0, (r["source_uri"], reg)
            else:
                assert reg["draft_tokens"] in (0, None), (r["source_uri"], reg)


def test_bench_replay_runs_both_modes_at_each_concurrency(tiny_model_dir, tmp_path, monkeypatch, capsys, cpu_engine,
                                                          loop_thread):
    import padoc_ray.bench.serving.run
    from padoc_ray.cli import main
    from padoc_ray.inputs import load_pages

    from tests.engine.cli.test_help_and_parse_page import on_session_engine

    images = tmp_path / "images"
    images.mkdir()
    from padoc_ray.pdf import RenderConfig

    for it in load_pages([os.path.join(EXAMPLES, f) for f in ("memo.pdf", "paper.pdf")], render=RenderConfig(
            longest_side=400)):
        it.page.image.save(images / f"{os.path.splitext(it.source)[0]}_page{it.page_index}.png")
    gt = [p for p in json.load(open(GT)) if p["page_info"]["source_pdf"] in ("memo.pdf", "paper.pdf")]
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    # both modes at two concurrencies: each page cut to its first 4 regions (sequential decodes a page token by
    # token: the whole pages took most of the test's time); the drafts run below has them whole
    short = [{**p, "layout_dets": p["layout_dets"][:4]} for p in gt]
    (tmp_path / "short.json").write_text(json.dumps(short))
    out = tmp_path / "bench"
    on_session_engine(monkeypatch, cpu_engine, loop_thread, padoc_ray.bench.serving.run)
    rc = main(["bench", "replay", "--gt", str(tmp_path / "short.json"), "--images", str(images), "--model",
               tiny_model_dir, "--concurrency", "1,3", "--warmup", "0", "--out", str(out)])
    assert rc == 0, capsys.readouterr().err[-4000:]
    summary = json.load(open(out / "summary.json"))
    assert summary["pages"] == 3 and summary["modes"] == ["fork", "sequential"]
    assert set(summary["concurrency"]) == {"1", "3"}
    for block in summary["concurrency"].values():
        for mode in ("fork", "sequential"):
            assert block[mode]["pages"] == block[mode]["valid_pages"] == 3 and block[mode]["pages_per_s"] > 0
        assert block["paired"]  # fork vs sequential per page
    recs = [json.loads(ln) for ln in open(out / "pages.jsonl")]
    assert len(recs) == 2 * 2 * 3
    assert all(r["status"] == "ok" and r["equals_truth"] for r in recs)
    assert all(r["f_padoc"] < r["f_seq"] for r in recs if r["mode"] == "fork")
    assert all(r["n_branches"] == 0 for r in recs if r["mode"] == "sequential")
    # no --pdfs: image pages carry no text layer, so no draft
    assert all(r["draft_tokens"] == 0 and r["text_layer"] == "absent" for r in recs if r["mode"] == "fork")
    # --pdfs: each page carries its PDF's text layer; replayed, every text draft is accepted, the pages unchanged
    rc = main(["bench", "replay", "--gt", str(tmp_path / "gt.json"), "--images", str(images), "--model",
               tiny_model_dir, "--concurrency", "3", "--modes", "fork", "--warmup", "0", "--pdfs", EXAMPLES,
               "--out", str(tmp_path / "drafts")])
    assert rc == 0, capsys.readouterr().err[-4000:]
    fork = json.load(open(tmp_path / "drafts" / "summary.json"))["concurrency"]["3"]["fork"]
    drafted = [json.loads(ln) for ln in open(tmp_path / "drafts" / "pages.jsonl")]
    assert all(r["status"] == "ok" and r["equals_truth"] and r["text_layer"] == "used" for r in drafted)
    assert 0 < fork["accepted_tokens"] == fork["draft_tokens"] == sum(r["accepted_tokens"] for r in drafted)
    assert 0 < fork["accepted_fraction"] < 1 and fork["engine_steps"] > 0
    capsys.readouterr()
    with pytest.raises(SystemExit) as e:  # a usage error names the PDF it lacks, before any page runs
        main(["bench", "replay", "--gt", str(tmp_path / "gt.json"), "--images", str(images), "--model",
              tiny_model_dir, "--pdfs", str(tmp_path), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "--pdfs: " in err and "paper.pdf not found (page 0 of" in err, err


def test_bench_pipeline_reports_both_sides(tiny_model_dir, tmp_path):
    rc, stdout, stderr = cli_logged(tmp_path, "pipe", "bench", "pipeline", "--input", EXAMPLES, "--model",
                                    tiny_model_dir, "--workers", "1", "--dpi", "72", "--json", str(tmp_path / "p.json"))
    assert rc == 0, stderr[-4000:]
    res = json.load(open(tmp_path / "p.json"))
    assert res["pdfs"] == 3 and res["raw_raster"]["before"]["pages"] == res["raw_raster"]["after"]["pages"] == 5
    pipe = res["noop_pipeline"]
    assert pipe["pages"] == 5 and pipe["page_status"] == {"ok": 5} and pipe["all_inputs_accounted"]
    assert res["ratio_wall"] > 0 and res["ratio_job"] > 0 and "no-op pipeline: 5 pages" in stdout
