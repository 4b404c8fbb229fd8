"""`padoc-ray bench soak`: its pure parts on synthetic records (RSS slopes, the 5xx split, job
accounting, process labels), and one short run against a real `padoc-ray serve` (no-op engine)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from padoc_ray import status
from padoc_ray.bench.soak.procs import process_label
from padoc_ray.bench.soak.report import (
    BACKPRESSURE,
    CLIENT_ERROR,
    MB,
    NO_RESPONSE,
    OK,
    SERVER_ERROR,
    JobTrace,
    Response,
    RssSeries,
    build_report,
    classify,
    job_accounting,
    request_summary,
    rss_floor_slope_mb_per_h,
    rss_slope_mb_per_h,
    rss_summary,
    warmup_seconds,
)

from tests.conftest import ROOT, _env


# ---- RSS slopes ----
def test_slope_of_a_steady_growth_is_its_rate():
    samples = [(t, 500 * MB + t / 60 * MB) for t in range(0, 600, 10)]  # 1 MB a minute
    assert rss_slope_mb_per_h(samples) == pytest.approx(60.0)


def test_slope_leaves_the_warm_up_out():
    """A start-up climb, then flat: the slope after the warm-up is zero, with it far from zero."""
    climb = [(t, (100 + 5 * t) * MB) for t in range(0, 60, 10)]
    flat = [(t, 400 * MB) for t in range(60, 600, 10)]
    assert rss_slope_mb_per_h(climb + flat) > 100
    assert rss_slope_mb_per_h(climb + flat, after_s=60) == pytest.approx(0.0)


def test_slope_of_a_shrinking_process_is_negative_and_of_too_few_samples_none():
    assert rss_slope_mb_per_h([(0, 200 * MB), (3600, 190 * MB)]) == pytest.approx(-10.0)
    assert rss_slope_mb_per_h([(0, 1.0)]) is None
    assert rss_slope_mb_per_h([(5, 1.0), (5, 2.0)]) is None
    assert rss_slope_mb_per_h([(0, 1.0), (10, 2.0)], after_s=5) is None


def test_the_floor_slope_ignores_swings_of_work_in_flight_and_keeps_a_leak():
    """Work in flight lifts RSS for a while; where its swings fall moves the all-samples slope (here
    bursts late in the hour), not the floor. A leak lifts the floor at its rate."""
    def rss(t, leak_mb_per_h=0.0):
        burst = 150 if (t // 60) % 7 == 3 and t > 1800 else 0  # one busy minute in seven, the late ones
        return (1000 + burst + leak_mb_per_h * t / 3600) * MB
    steady = [(t, rss(t)) for t in range(0, 3600, 10)]
    assert rss_slope_mb_per_h(steady) > 20  # the swings alone read as a "leak"
    assert rss_floor_slope_mb_per_h(steady) == pytest.approx(0.0, abs=1e-6)
    leaking = [(t, rss(t, 40.0)) for t in range(0, 3600, 10)]
    assert rss_floor_slope_mb_per_h(leaking) == pytest.approx(40.0, rel=0.05)
    assert rss_floor_slope_mb_per_h(leaking, after_s=3000) is None  # two 5-minute windows: too few
    # a window must outlast a swing: 2-minute windows each hold a quiet minute, 1-minute ones may not
    assert rss_floor_slope_mb_per_h(leaking, after_s=2400, window_s=120) == pytest.approx(40.0, rel=0.05)
    assert rss_floor_slope_mb_per_h(leaking, after_s=2400, window_s=60) != pytest.approx(40.0, rel=0.2)


def test_warm_up_is_a_fifth_at_least_a_minute_at_most_half():
    assert warmup_seconds(30 * 60) == pytest.approx(6 * 60)
    assert warmup_seconds(3 * 60) == pytest.approx(60)
    assert warmup_seconds(61) == pytest.approx(30.5)
    assert warmup_seconds(30) == pytest.approx(15)
    assert warmup_seconds(30 * 60, fraction=0.5) == pytest.approx(15 * 60)
    with pytest.raises(ValueError, match="warm-up fraction"):
        warmup_seconds(60, fraction=1.0)


def test_rss_summary_reports_each_process_and_the_worst():
    grow = RssSeries("ProxyActor 7", [(t, (200 + t / 36) * MB) for t in (0, 100, 200, 300)])  # 100 MB/h
    flat = RssSeries("serve 1", [(t, 300 * MB) for t in (0, 100, 200, 300)])
    once = RssSeries("ServeReplica:padoc:Ingress/children 9", [(0, 80 * MB)], max_processes=2)
    out = rss_summary([grow, flat, once], warmup_s=50)
    slopes = out["rss_slope_mb_per_h"]
    assert slopes["processes"] == {"ProxyActor 7": pytest.approx(100.0), "serve 1": 0.0,
                                   "ServeReplica:padoc:Ingress/children 9": None}
    assert slopes["worst"] == pytest.approx(100.0)
    assert out["rss_floor_slope_mb_per_h"]["processes"]["serve 1"] is None  # 5 minutes: one window
    assert out["rss_mb"]["ProxyActor 7"]["start"] == 200.0 and out["rss_mb"]["ProxyActor 7"]["end"] > 208
    assert out["rss_mb"]["ServeReplica:padoc:Ingress/children 9"]["max_processes"] == 2
    assert out["rss_mb"]["ProxyActor 7"]["curve"] == [[0.0, 200.0], [1.67, 202.8], [3.33, 205.6], [5.0, 208.3]]
    assert out["rss_mb"]["serve 1"]["curve"] == [[m, 300.0] for m in (0.0, 1.67, 3.33, 5.0)]


# ---- responses ----
def test_classify_keeps_backpressure_apart_from_other_5xx():
    assert classify(503, "2") == BACKPRESSURE
    assert classify(503, None) == SERVER_ERROR
    assert classify(500) == SERVER_ERROR and classify(504, "2") == SERVER_ERROR
    assert classify(422) == CLIENT_ERROR and classify(429, "1") == CLIENT_ERROR
    assert classify(200) == OK and classify(202) == OK
    assert classify(None) == NO_RESPONSE


def test_request_summary_counts_kinds_codes_and_latency():
    rs = [Response("parse", 200, 0.1), Response("parse", 200, 0.3), Response("parse", 503, 0.01, retry_after="2"),
          Response("chat", 503, 0.2), Response("chat", 500, 0.2), Response("bad", 422, 0.05),
          Response("disconnect_upload", None, 0.01, error="disconnected")]
    out = request_summary(rs)
    assert out["requests"] == 7
    assert out["http_5xx"] == 2 and out["http_503_retry_after"] == 1 and out["http_4xx"] == 1
    assert out["no_response"] == 1 and out["client_errors"] == {"disconnected": 1}
    assert out["status_codes"] == {"200": 2, "422": 1, "500": 1, "503": 2, "none": 1}
    assert out["kinds"]["parse"]["requests"] == 3 and out["kinds"]["parse"]["codes"] == {"200": 2, "503": 1}
    assert out["kinds"]["parse"]["p50_s"] == pytest.approx(0.1)
    assert out["kinds"]["disconnect_upload"]["p50_s"] is None  # no response, no latency


# ---- jobs ----
def test_job_accounting():
    jobs = [
        JobTrace("done", (0, 1), status.JOB_DONE, [0, 1]),
        JobTrace("never-final", (0,), status.JOB_RUNNING),
        JobTrace("never-read", (0,)),
        JobTrace("missing-page", (0, 1, 2), status.JOB_DONE, [0, 2]),
        JobTrace("no-result", (0,), status.JOB_DONE, None),
        JobTrace("duplicate", (0, 1), status.JOB_DONE, [0, 1, 1, 0]),
        JobTrace("cancelled", (0, 1), status.JOB_CANCELLED, None, cancel_sent=True),
        JobTrace("failed", (0,), status.JOB_FAILED),
    ]
    out = job_accounting(jobs)
    assert out["jobs_created"] == 8
    assert sorted(out["lost_job_ids"]) == ["missing-page", "never-final", "never-read", "no-result"]
    assert out["jobs_lost"] == 4
    assert out["job_pages_duplicated"] == 2
    assert out["jobs_cancel_sent"] == 1
    assert out["jobs_by_final_status"] == {status.JOB_CANCELLED: 1, status.JOB_DONE: 4, status.JOB_FAILED: 1,
                                           status.JOB_RUNNING: 1, "never_final": 1}


def test_report_has_the_contract_keys():
    rep = build_report([Response("parse", 200, 0.1), Response("job_create", 202, 0.1)],
                       [JobTrace("a", (0,), status.JOB_DONE, [0])], [RssSeries("serve 1", [(0, MB), (60, 2 * MB)])],
                       duration_s=120, warmup_s=0, server={"flags": ["--engine", "noop"]}, config={"clients": 1},
                       anomalies={"stream_without_result_line": 1})
    assert rep["requests"] == 2 and rep["http_5xx"] == 0 and rep["jobs_lost"] == 0
    assert rep["job_pages_duplicated"] == 0
    assert rep["rss_slope_mb_per_h"] == {"worst": pytest.approx(60.0), "processes": {"serve 1": pytest.approx(60.0)}}
    assert rep["rss_floor_slope_mb_per_h"] == {"worst": None, "processes": {"serve 1": None}}  # under 3 windows
    assert rep["anomalies"] == {"stream_without_result_line": 1}
    assert rep["warmup_min"] == 0 and rep["duration_min"] == 2


# ---- which processes ----
def test_process_labels():
    assert process_label(["ray::ServeController"]) == "ServeController"
    assert process_label(["ray::ServeController.listen_for_change"]) == "ServeController"
    assert process_label(["ray::ProxyActor.receive_asgi_messages"]) == "ProxyActor"
    assert process_label(["ray::ServeReplica:padoc:Engine.handle_request"]) == "ServeReplica:padoc:Engine"
    assert process_label(["ray::IDLE"]) is None
    assert process_label(["ray::DashboardAgent"]) is None
    assert process_label(["/usr/bin/raylet", "--x"]) is None
    assert process_label(["python", "-m", "padoc_ray.raster.worker"], "ServeReplica:padoc:Ingress") == \
        "ServeReplica:padoc:Ingress/children"
    assert process_label(["python", "-m", "x"], "ServeController") is None


# ---- inputs ----
def test_inputs_and_the_replay_truth_of_the_generated_pdfs(tmp_path):
    """Every generated page is a copy of an example page, and the replay truth gives it that page's truth."""
    from padoc_ray.bench.soak.traffic import soak_inputs, write_replay_truth

    examples = os.path.join(ROOT, "examples")
    inputs = soak_inputs(examples)
    assert {"memo.pdf", "paper.pdf", "report.pdf", "soak-mix.pdf", "soak-long.pdf"} <= set(inputs.good)
    assert inputs.good["soak-long.pdf"][1] == 12 and len(inputs.origins["soak-long.pdf"]) == 12
    assert set(inputs.bad) == {"corrupt.pdf", "truncated.pdf", "notes.txt", "empty.pdf", "encrypted.pdf"}
    assert all(url.startswith("data:image/png;base64,") for url in inputs.images.values())
    gt_path = os.path.join(examples, "ground_truth.json")
    with open(write_replay_truth(gt_path, inputs, str(tmp_path / "gt.json"))) as f:
        truth = json.load(f)
    by_page = {(g["page_info"]["source_pdf"], g["page_info"]["page_no"]): g for g in truth}
    with open(gt_path) as f:
        assert len(truth) == len(json.load(f)) + 12 + inputs.good["soak-mix.pdf"][1]
    for name, origins in inputs.origins.items():
        for i, src in enumerate(origins):
            assert by_page[(name, i)]["layout_dets"] == by_page[src]["layout_dets"]


# ---- one short run ----
def test_short_soak_on_the_noop_engine(tmp_path, request):
    """The no-op engine reads only the checkpoint's protocol: the checkout's models/tiny when there is one."""
    model = os.path.join(ROOT, "models", "tiny")
    if not os.path.isfile(os.path.join(model, "padoc_protocol.json")):
        model = request.getfixturevalue("tiny_model_dir")
    out = tmp_path / "soak.json"
    proc = subprocess.run(
        [sys.executable, "-m", "padoc_ray.cli", "bench", "soak", "--minutes", "0.1", "--clients", "4", "--engine",
         "noop", "--model", str(model), "--sample-interval-s", "1", "--json", str(out)],  # drain: as long as it takes
        cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, proc.stderr[-4000:]
    rep = json.loads(out.read_text())
    for k in ("rss_slope_mb_per_h", "requests", "http_5xx", "http_503_retry_after", "jobs_lost",
              "job_pages_duplicated", "kinds", "status_codes", "rss_mb", "warmup_min", "server"):
        assert k in rep, k
    assert rep["requests"] > 0 and rep["http_5xx"] == 0
    assert rep["jobs_lost"] == 0 and rep["job_pages_duplicated"] == 0 and rep["jobs"]["jobs_created"] > 0
    assert rep["anomalies"] == {}  # bad inputs got 4xx, streams ended with their result line
    assert {"parse", "stream", "job_create", "chat"} <= set(rep["kinds"])
    labels = {name.rsplit(" ", 1)[0] for name in rep["rss_slope_mb_per_h"]["processes"]}
    assert {"serve", "ServeController", "ProxyActor", "ServeReplica:padoc:Engine",
            "ServeReplica:padoc:Ingress"} <= labels
    assert rep["rss_slope_mb_per_h"]["worst"] is not None
    assert rep["server"]["exit_code"] == 0 and rep["server"]["processes_left"] == []
    assert rep["server"]["flags"][:2] == ["--engine", "noop"]


def test_bench_fairness_refuses_bad_settings_before_starting_anything():
    p = subprocess.run([sys.executable, "-m", "padoc_ray.cli", "bench", "fairness", "--max-job-pages-in-flight", "0",
                        "--json", os.devnull], capture_output=True, text=True, env=_env(), timeout=120)
    assert p.returncode == 2 and "max_job_pages_in_flight must be >= 1" in p.stderr
    from padoc_ray.bench.serving.fairness import FairnessConfig

    with pytest.raises(ValueError, match="job_pages must be in 1..5000"):
        FairnessConfig(job_pages=6000)
