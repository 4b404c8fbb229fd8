"""The benchmarks that start a service of their own, end to end, short: `bench http`, `bench serve --target
http`, `bench fairness` (serve --tenant-header through Ray Serve), `bench soak --engine vllm`, and `demo
--no-replay`. Each takes a minute or more on 2 cores (a local Ray, Ray Serve, a vLLM engine of its own), so
they run with `make test-nightly`, not `make test`; what they run is tested piece by piece in make test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT, _env, require_demo_data

pytestmark = [pytest.mark.nightly, pytest.mark.slow]


def _cli(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "padoc_ray.cli", *args], cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def test_bench_http_answers_every_request_on_both_sides(tiny_model_dir, tmp_path):
    _cli("bench", "http", "--model", tiny_model_dir, "--input", os.path.join(ROOT, "examples", "memo.pdf"),
         "--concurrency", "1,2", "--requests", "4", "--warmup", "1", "--out", str(tmp_path))
    report = json.loads((tmp_path / "http_bench.json").read_text())
    assert report["pages"] == 1 and set(report["concurrency"]) == {"1", "2"}
    for block in report["concurrency"].values():
        for side in ("direct", "direct_prerendered", "http"):
            assert block[side]["requests"] == block[side]["ok"] == 4, (side, block[side])
        assert block["http_over_direct_pages_per_s"] == round(block["http"]["pages_per_s"]
                                                              / block["direct"]["pages_per_s"], 3)


def test_bench_serve_over_http_parses_every_page(tiny_model_dir, tmp_path):
    demo = require_demo_data()
    pages = json.load(open(os.path.join(demo, "OmniDocBench_demo.json")))[:2]
    (tmp_path / "gt.json").write_text(json.dumps(pages))
    out = tmp_path / "bench"
    _cli("bench", "serve", "--target", "http", "--gt", str(tmp_path / "gt.json"), "--images",
         os.path.join(demo, "images"), "--model", tiny_model_dir, "--concurrency", "2", "--modes", "fork",
         "--warmup", "0", "--out", str(out))
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["target"] == "http"
    (row,) = report["rows"]
    assert row["pages"] == 2 and row["valid_pages"] == 2
    recs = [json.loads(ln) for ln in (out / "pages.jsonl").read_text().splitlines()]
    # the service's page row does not say whether it equals the truth (the direct target checks that)
    assert len(recs) == 2 and all(r["status"] == "ok" and r["valid"] and r["equals_truth"] is None for r in recs)


def test_bench_fairness_runs_two_tenants_through_ray_serve(tiny_model_dir, tmp_path):
    out = tmp_path / "fair.json"
    _cli("bench", "fairness", "--engine", "noop", "--model", tiny_model_dir, "--job-pages", "40", "--probes", "6",
         "--json", str(out))
    rep = json.loads(out.read_text())
    assert rep["idle"]["n"] == rep["loaded"]["n"] == 6  # every probe of tenant B answered, idle and loaded
    assert rep["p95_loaded_over_idle"] == pytest.approx(rep["loaded"]["p95_s"] / rep["idle"]["p95_s"], rel=0.01)
    job = rep["job"]
    assert job["pages_total"] == 40 and 0 <= job["pages_done_at_first_probe"] <= job["pages_done_at_last_probe"]


def test_bench_soak_on_the_vllm_engine(tiny_model_dir, tmp_path):
    out = tmp_path / "soak.json"
    _cli("bench", "soak", "--minutes", "1", "--clients", "2", "--engine", "vllm", "--model", tiny_model_dir,
         "--drain-s", "60", "--json", str(out), timeout=1200)
    rep = json.loads(out.read_text())
    assert rep["requests"] > 0 and rep["http_5xx"] == 0
    assert rep["jobs_lost"] == 0 and rep["job_pages_duplicated"] == 0
    assert rep["server"]["flags"][:2] == ["--engine", "vllm"] and rep["server"]["exit_code"] == 0


def test_demo_without_replay_stalls_retries_once_and_ends_layout_unrecovered(tiny_model_dir, tmp_path):
    """The random tiny model never closes a region: the layout stream stalls, is retried once from the page's
    start, stalls again, and the page ends `layout_unrecovered` (docs/batch.md). Every input is accounted for,
    so the demo exits 0: without replay there is no truth to check the pages against."""
    out = tmp_path / "demo"
    proc = subprocess.run([sys.executable, "-m", "padoc_ray.cli", "demo", "--no-replay", "--model", tiny_model_dir,
                           "--output", str(out)], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "layout_unrecovered" in proc.stdout  # its table says so, page by page
    import pyarrow.parquet as pq

    rows = pq.read_table(out / "pages").to_pylist()
    assert rows and all(r["status"] == "layout_unrecovered" for r in rows), {r["status"] for r in rows}
