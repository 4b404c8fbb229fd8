"""``cluster/gpu_check.sh`` end to end on this CPU (both legs nightly; make test checks its usage errors):
its V1 leg is real here (doctor, the tiny model, teacher-forced parse-page with and without --constrain-layout, bench replay at C=4 and 16), and
its verdict says what each step did. Its Model Runner V2 leg needs a GPU (the script's default).
The benchmark runs without warm-up pages (--warmup 0): here only its wiring is checked, and the
four untimed pages cost about 30 s of the test."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.engine, pytest.mark.slow]


@pytest.mark.nightly  # make test-nightly (about 2 minutes): make test runs its commands on their own (doctor,
# parse-page, --constrain-layout, bench replay) and the script itself in the model leg below
def test_the_v1_leg_passes_here_and_the_verdict_says_so(tmp_path):
    out = tmp_path / "check"
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "PYTHON": sys.executable}
    p = subprocess.run(["bash", os.path.join(ROOT, "cluster", "gpu_check.sh"), "--out", str(out), "--runners", "v1",
                        "--pages", "2", "--warmup", "0", "--concurrency", "4"], capture_output=True, text=True, timeout=900, env=env)
    assert p.returncode == 0, p.stdout + p.stderr[-4000:]
    v = json.loads((out / "verdict.json").read_text())
    assert v["ok"] and v["machine"]["runner"] == "v1" and v["machine"]["processors_load"]
    names = [s["name"] for s in v["steps"]]
    assert names == ["doctor", "build-tiny-model", "parse-page-v1", "parse-page-v1-constrained", "corpus",
                     "bench-replay"]
    for s in v["steps"]:
        assert s["ok"] and s["rc"] == 0 and s["seconds"] > 0
    for s in v["steps"][2:4]:
        assert s["runner_env"] == "0" and s["page"]["status"] == "ok" and s["page"]["equals_truth"] is True
    bench = v["bench_replay"]
    assert set(bench["concurrency"]) == {"4"} and bench["pages"] == 2  # --concurrency reached it
    assert json.loads((out / "bench" / "report.json").read_text())["config"]["warmup"] == 0  # --warmup reached it
    assert "verdict: ok" in p.stdout


def test_a_bad_runner_name_is_a_usage_error(tmp_path):
    p = subprocess.run(["bash", os.path.join(ROOT, "cluster", "gpu_check.sh"), "--out", str(tmp_path / "x"),
                        "--runners", "v3"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"})
    assert p.returncode == 2 and "runner must be v1 or v2" in p.stderr


def test_a_concurrency_list_that_is_not_whole_numbers_is_a_usage_error(tmp_path):
    p = subprocess.run(["bash", os.path.join(ROOT, "cluster", "gpu_check.sh"), "--out", str(tmp_path / "x"),
                        "--runners", "v1", "--concurrency", "4,0"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"})
    assert p.returncode == 2 and "--concurrency must be positive whole numbers" in p.stderr
    assert not (tmp_path / "x").exists()


def test_a_warmup_that_is_no_whole_number_is_a_usage_error(tmp_path):
    p = subprocess.run(["bash", os.path.join(ROOT, "cluster", "gpu_check.sh"), "--out", str(tmp_path / "x"),
                        "--runners", "v1", "--warmup", "-1"], capture_output=True, text=True, timeout=300,
                       env={**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}"})
    assert p.returncode == 2 and "--warmup must be a whole number, got -1" in p.stderr
    assert not (tmp_path / "x").exists()  # refused before any step ran


@pytest.mark.nightly  # make test-nightly (about 2 minutes): make test runs its commands on their own with the dots
# checkpoint (doctor: tests/engine/protocol/test_dots_on_vllm.py; the batch job: reannotate in
# tests/cluster/pipeline/test_batch_job.py; bench serve in both modes: tests/engine/protocol/test_dots_on_vllm.py)
def test_the_model_leg_parses_the_examples_without_replay_and_benchmarks_fork_and_dots_own_request(
        tmp_path, tiny_dots_dir):
    """``--model DIR`` (what a GPU owner runs with real weights; here the tiny dots.ocr-format checkpoint, whose
    pages are noise without replay): the examples parsed freely, each page's status and Markdown in the verdict,
    and bench serve's pages/s per concurrency, in fork and, for a dots checkpoint, in sequential mode (its own
    single request on the same weights)."""
    out = tmp_path / "check"
    env = {**os.environ, "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}", "PYTHON": sys.executable}
    p = subprocess.run(["bash", os.path.join(ROOT, "cluster", "gpu_check.sh"), "--out", str(out), "--runners", "v1",
                        "--model", tiny_dots_dir, "--pages", "2", "--warmup", "0", "--concurrency", "2"],
                       capture_output=True, text=True, timeout=900, env=env)
    v = json.loads((out / "verdict.json").read_text())
    assert [s["name"] for s in v["steps"]] == ["doctor", "demo-v1", "corpus", "bench-serve"], p.stderr[-3000:]
    assert v["model"]["family"] == "dots"
    demo = v["steps"][1]
    assert demo["rc"] == 0 and demo["runner_env"] == "0", demo.get("log_tail")
    assert {pg["document"] for pg in demo["pages"]} == {"memo.pdf", "paper.pdf", "report.pdf"}
    assert all(pg["status"] and "markdown" in pg for pg in demo["pages"])  # noise, but every page accounted for
    assert v["steps"][3]["rc"] == 0, v["steps"][3].get("log_tail")
    assert set(v["bench_serve_fork"]) == {"2"} and v["bench_serve_fork"]["2"]["pages"] == 2
    assert set(v["bench_serve_sequential"]) == {"2"} and v["bench_serve_sequential"]["2"]["pages"] == 2
