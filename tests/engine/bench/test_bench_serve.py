"""`padoc-ray bench serve`: the figures' aggregation on scripted page results, its bad-input errors,
and one real run on the tiny engine (4 short demo pages in two page sets, C=2,4)."""

from __future__ import annotations

import json
import os

import pytest

from padoc_ray.perfmodel.table3 import (
    add_pairs,
    format_markdown,
    legacy_summary,
    mode_row,
    paired_speedup,
    peak_rate,
    quantile,
    spread_samples,
    step_figures,
)

from tests.conftest import ROOT, require_demo_data


def rec(page, e2e, valid=True, status="ok", t0=0.0, out=100, f_seq=100, f_padoc=40, prompt=50, cached=25):
    return {"page": page, "status": status, "valid": valid, "e2e_s": e2e, "t_start": t0, "t_end": t0 + e2e,
            "output_tokens": out, "prompt_tokens": prompt, "cached_tokens": cached, "f_seq": f_seq, "f_padoc": f_padoc}


# ---- aggregation (pure) ----------------------------------------------------------------------------------------
def test_quantile_interpolates_between_order_statistics():
    assert quantile([], 0.5) is None
    assert quantile([3.0], 0.95) == 3.0
    assert quantile([4, 1, 3, 2], 0.5) == 2.5  # sorted, linear between the middle two
    assert quantile(list(range(101)), 0.95) == pytest.approx(95.0)
    assert quantile([0, 10], 0.9) == pytest.approx(9.0)


def test_peak_rate_finds_the_busiest_fixed_window():
    # 100 tok/s for 30 s, with 1000 extra tokens between t=12 and t=14: the busiest 10 s window holds the burst
    samples, c = [], 0.0
    for i in range(151):
        t = i * 0.2
        samples.append((t, c))
        c += 20 + (100 if 12 <= t < 14 else 0)
    peak, win = peak_rate(samples, 10.0)
    assert win == 10.0 and peak == pytest.approx((1000 + 1000) / 10, rel=0.02)
    # a run shorter than the window: its whole span is the one window
    assert peak_rate([(0.0, 0.0), (2.0, 50.0), (4.0, 400.0)], 10.0) == (100.0, 4.0)
    assert peak_rate([(0.0, 5.0)], 10.0) == (None, None)


def test_spread_samples_spread_each_pages_tokens_over_its_interval():
    s = spread_samples([rec("a", 2.0, out=100), rec("b", 1.0, t0=1.0, out=50)], step_s=0.5)
    assert s[0] == (0.0, 0.0) and s[-1] == (2.0, 150.0)
    assert dict(s)[1.0] == pytest.approx(50.0) and dict(s)[1.5] == pytest.approx(75 + 25)


def test_mode_row_counts_every_page_but_latency_only_over_valid_ones():
    recs = [rec("a", 1.0), rec("b", 2.0), rec("c", 3.0), rec("d", 50.0, valid=False, status="max_tokens")]
    row = mode_row(recs, 10.0, "fork", 16, samples=[(0.0, 0), (5.0, 300), (10.0, 400)],
                   cache={"queries": 200, "hits": 150})
    assert (row["mode"], row["concurrency"], row["pages"], row["valid_pages"]) == ("fork", 16, 4, 3)
    assert row["statuses"] == {"max_tokens": 1, "ok": 3}
    assert row["valid_pages_per_s"] == 0.3 and row["pages_per_s"] == 0.4
    assert row["p50_e2e_s"] == 2.0 and row["p95_e2e_s"] == pytest.approx(2.9) and row["p99_e2e_s"] < 3.0
    assert row["mean_output_tokens_per_s"] == 40.0  # invalid pages' tokens count too
    assert row["peak_output_tokens_per_s"] == 40.0 and row["token_rate_source"] == "engine_counter"
    assert row["prefix_cache_hit_rate"] == 0.75 and row["prefix_cache_source"] == "engine_counter"
    no_counters = mode_row(recs, 10.0, "fork", 16)
    assert no_counters["prefix_cache_hit_rate"] == 0.5 and no_counters["token_rate_source"] == "page_records"


def test_paired_speedup_pairs_pages_valid_in_both_runs():
    fork = [rec("a", 1.0), rec("b", 2.0), rec("c", 1.0), rec("d", 1.0, valid=False)]
    seq = [rec("c", 4.0), rec("b", 3.0), rec("a", 2.0, valid=False), rec("d", 9.0)]  # any order
    p = paired_speedup(fork, seq)
    assert p["paired_pages"] == 2 and p["paired_median_speedup"] == pytest.approx((1.5 + 4.0) / 2)
    assert p["paired_p25_speedup"] == pytest.approx(1.5 + 2.5 * 0.25)


def test_step_figures_and_fork_rows_against_sequential():
    fork = [rec("a", 1.0, f_seq=100, f_padoc=50), rec("b", 1.0, f_seq=200, f_padoc=50),
            rec("c", 1.0, f_seq=400, f_padoc=400, valid=False)]
    seq = [rec("a", 2.0, f_seq=110), rec("b", 4.0, f_seq=190), rec("c", 9.0, f_seq=400)]
    st = step_figures(fork, seq)
    assert st["step_pages"] == 2 and st["median_f_seq"] == 150 and st["median_f_padoc"] == 50
    assert st["median_step_reduction"] == pytest.approx((0.5 + 0.75) / 2)
    assert st["median_sequential_run_steps"] == 190
    rows = [mode_row(fork, 4.0, "fork", 8), mode_row(seq, 8.0, "sequential", 8)]
    add_pairs(rows, {("fork", 8): fork, ("sequential", 8): seq})
    f, s = rows
    assert f["paired_median_speedup"] == 3.0 and "paired_median_speedup" not in s
    assert f["valid_pages_per_s_vs_sequential"] == pytest.approx(0.5 / 0.375, abs=1e-3)
    report = {"config": {"target": "direct", "model": "m", "warmup": 2, "modes": ["fork", "sequential"]},
              "pages": {"requested": 384, "used": 3, "sets": [{"gt": "g.json", "count": 3}]}, "rows": rows}
    md = format_markdown(report)
    assert "| valid pages/s | fork | 0.500 (+33.3%) |" in md and "| P95 e2e s | sequential | 8.50 |" in md
    assert "| 8 | 2 | 150.0 | 50.0 | 62.5% (56.2%-68.8%) | 190.0 | 3.00x" in md
    assert "384 requested (fewer exist: all were used)" in md
    legacy = legacy_summary(report)
    assert legacy["concurrency"]["8"]["paired"]["median_speedup"] == 3.0
    assert legacy["concurrency"]["8"]["sequential"]["valid_pages"] == 3


# ---- bad input: clear errors, exit 2, before any engine starts ---------------------------------------------------
def _bench(capsys, *argv):
    from padoc_ray.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "serve", *argv])
    return e.value.code, capsys.readouterr().err


def test_bad_input_is_refused_with_exit_2(tmp_path, capsys):
    demo = require_demo_data()
    gt, images = os.path.join(demo, "OmniDocBench_demo.json"), os.path.join(demo, "images")
    model = os.path.join(ROOT, "examples")  # any folder: nothing gets as far as loading it
    base = ["--model", model, "--out", str(tmp_path / "o")]
    code, err = _bench(capsys, "--gt", gt, "--gt", gt, "--images", images, *base)
    assert code == 2 and "2 --gt and 1 --images" in err
    code, err = _bench(capsys, "--gt", gt, "--images", images, "--concurrency", "16,x", *base)
    assert code == 2 and "comma-separated integers" in err
    code, err = _bench(capsys, "--gt", gt, "--images", images, "--concurrency", "0,4", *base)
    assert code == 2 and "positive integers" in err
    with open(gt) as f:
        bad = json.load(f)[:2]
    bad[1]["page_info"]["image_path"] = "no-such-page.jpg"
    (tmp_path / "bad.json").write_text(json.dumps(bad))
    code, err = _bench(capsys, "--gt", str(tmp_path / "bad.json"), "--images", images, *base)
    assert code == 2 and "page 1: image" in err and "no-such-page.jpg not found" in err
    code, err = _bench(capsys, "--gt", gt, "--images", images, "--gt", gt, "--images", images, *base)
    assert code == 2 and "is in both" in err  # the same page twice: its truth would be ambiguous
    code, err = _bench(capsys, "--gt", str(tmp_path / "none.json"), "--images", images, *base)
    assert code == 2 and "none.json: no such file" in err
    code, err = _bench(capsys, "--gt", gt, "--images", images, "--speed-probe", "--target", "http", *base)
    assert code == 2 and "speed_probe needs the direct target" in err
    code, err = _bench(capsys, "--gt", gt, "--images", images, "--speed-probe", "--speed-probe-image",
                       str(tmp_path / "no.pdf"), *base)
    assert code == 2 and "no.pdf is not a file" in err
    assert not (tmp_path / "o").exists()


# ---- one real run ------------------------------------------------------------------------------------------------
@pytest.mark.engine
@pytest.mark.slow
def test_bench_serve_runs_the_tiny_engine_and_writes_the_report(cpu_engine, tiny_model_dir, model_protocol,
                                                               loop_thread, tmp_path, capsys):
    """The benchmark on the session's engine (no engine start of its own: `bench replay`'s test in
    test_commands runs the same code from the command line, engine and all)."""
    from padoc_ray.bench.serving.run import DirectTarget, ServeBenchConfig, bench_truth, load_page_sets, run_bench
    from padoc_ray.host import HostConfig, PageHost

    demo = require_demo_data()
    with open(os.path.join(demo, "OmniDocBench_demo.json")) as f:
        pages = json.load(f)

    def size(o):
        return sum(len(str(e.get("text") or e.get("html") or e.get("latex") or "")) for e in o["layout_dets"])

    short = sorted(pages, key=size)[:4]  # the 4 shortest pages, as two page sets
    (tmp_path / "a.json").write_text(json.dumps(short[:3]))
    (tmp_path / "b.json").write_text(json.dumps(short[3:]))
    images = os.path.join(demo, "images")
    cfg = ServeBenchConfig(concurrency=(2, 4), warmup=1)
    bench_pages, sets = load_page_sets([(str(tmp_path / "a.json"), images), (str(tmp_path / "b.json"), images)],
                                       cfg.pages)
    out = tmp_path / "bench"

    async def go():
        host = await PageHost(tiny_model_dir, HostConfig(pages_in_flight=4), truth=bench_truth(bench_pages),
                              engine=cpu_engine, model_protocol=model_protocol).start()
        header = {"config": {"model": tiny_model_dir},
                  "pages": {"requested": cfg.pages, "used": len(bench_pages), "sets": sets}}
        return await run_bench(DirectTarget(host), bench_pages, cfg, str(out), header=header)

    loop_thread.run(go(), timeout=600)
    report = json.loads((out / "report.json").read_text())
    assert report["pages"]["used"] == 4 and report["pages"]["requested"] == 384
    assert [s["count"] for s in report["pages"]["sets"]] == [3, 1]
    assert [p.name for p in bench_pages] == [o["page_info"]["image_path"] for o in short]
    rows = {(r["mode"], r["concurrency"]): r for r in report["rows"]}
    assert set(rows) == {(m, c) for m in ("fork", "sequential") for c in (2, 4)}
    for (mode, _c), r in rows.items():
        assert r["pages"] == 4 == sum(r["statuses"].values()) == r["valid_pages"] + r["invalid_pages"]
        assert r["valid_pages"] == 4 and r["statuses"] == {"ok": 4}  # teacher-forced: every page valid
        assert r["valid_pages_per_s"] > 0 and r["p95_e2e_s"] >= r["p50_e2e_s"] > 0
        assert r["peak_output_tokens_per_s"] >= r["mean_output_tokens_per_s"] * 0.5 > 0
        assert r["token_rate_source"] == "engine_counter" and r["prefix_cache_source"] == "engine_counter"
        # the engine's own step counters: a running sequence makes at most one token a step (no speculation);
        # vLLM counts the running ones after the step, so a request's last step is not counted; and one
        # page's stream alone takes as many steps as it has tokens
        requests = sum(1 + (p["n_branches"] if mode == "fork" else 0) for p in recs_of(out, mode, _c))
        assert r["engine_steps"] * r["mean_running_seqs"] + requests >= r["output_tokens"] * 0.99
        if mode == "sequential":
            assert r["engine_steps"] >= max(p["output_tokens"] for p in recs_of(out, mode, _c))
        assert r["mean_step_ms"] == pytest.approx(r["wall_s"] / r["engine_steps"] * 1e3, rel=1e-3)
        assert r["prefill_tokens"] > 0 and r["preempted_requests"] == 0
        if mode == "fork":
            assert r["paired_pages"] == 4 and r["paired_median_speedup"] > 0
            assert 0 < r["median_step_reduction"] < 1 and r["median_f_padoc"] < r["median_f_seq"]
            assert r["prefix_cache_hit_rate"] > 0.5  # branches reuse their page's image + layout prefix
    recs = [json.loads(ln) for ln in (out / "pages.jsonl").read_text().splitlines()]
    assert len(recs) == 2 * 2 * 4 and all(r["equals_truth"] for r in recs)
    md = (out / "report.md").read_text()
    assert "## The engine's steps" in md
    assert "## Table 3 analogue" in md and "| valid pages/s | fork |" in md and "| P95 e2e s | sequential |" in md
    assert report["config"]["replay"] is True and "teacher-forced with the ground truth" in md
    assert "## Table 11 analogue" in md and "| C | pages | median F_seq | median F_PaDoc |" in md
    assert report["plots"] == ["valid_pages_per_s.png", "p95_e2e_s.png"]
    for name in report["plots"]:
        data = (out / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert "bench serve" in capsys.readouterr().err  # the progress bar


def recs_of(out, mode: str, c: int) -> list[dict]:
    return [r for r in map(json.loads, (out / "pages.jsonl").read_text().splitlines())
            if r["mode"] == mode and r["concurrency"] == c]


def test_no_replay_lets_the_model_generate_freely(cpu_engine, tiny_model_dir, loop_thread, tmp_path):
    """`--no-replay` (a real checkpoint's run): the same report, but no page is teacher-forced, so the random
    tiny model reproduces none of its truth (forced runs equal it: the test above). The command line as
    `bench serve` parses it, run on the session's engine (the command itself, in process on an engine of its
    module: the hpd and dots checkpoints' bench runs in tests/engine/protocol/; over HTTP, a service and its
    engine started by the command: tests/cluster/bench/test_bench_end_to_end.py)."""
    import dataclasses

    from padoc_ray.bench.serving.run import _header, _run_direct, load_page_sets
    from padoc_ray.cli import build_parser
    from padoc_ray.cli.bench import config_from_args

    from tests.engine.scheduler.test_run_page_on_vllm import Recording

    demo = require_demo_data()
    with open(os.path.join(demo, "OmniDocBench_demo.json")) as f:
        pages = json.load(f)[:2]
    (tmp_path / "gt.json").write_text(json.dumps(pages))
    out = tmp_path / "bench"
    args = build_parser().parse_args(
        ["bench", "serve", "--gt", str(tmp_path / "gt.json"), "--images", os.path.join(demo, "images"),
         "--model", tiny_model_dir, "--concurrency", "2", "--modes", "fork", "--warmup", "0", "--max-tokens", "48",
         "--max-branches", "4", "--no-replay", "--out", str(out)])
    cmd = config_from_args(args)
    cfg = cmd.bench
    assert cfg.replay is False and cfg.modes == ("fork",) and cfg.concurrency == (2,)
    host_cfg = dataclasses.replace(cmd.host, pages_in_flight=max(cfg.concurrency))  # as `bench serve` does
    assert (host_cfg.scheduler.max_tokens, host_cfg.scheduler.max_branches) == (48, 4)
    bench_pages, sets = load_page_sets(list(zip(cmd.gt, cmd.images)), cfg.pages)

    header = _header(tiny_model_dir, bench_pages, sets, cfg, host_cfg)
    engine = Recording(cpu_engine)  # the session's engine, every request it is given recorded

    async def go():  # bench serve's direct run (`run`), on the session's engine instead of one of its own
        return await _run_direct(tiny_model_dir, bench_pages, cfg, host_cfg, str(out), header, print, engine=engine)

    loop_thread.run(go(), timeout=600)
    assert engine.requests and not any(r.forced_tokens for r in engine.requests)  # nothing teacher-forced
    report = json.loads((out / "report.json").read_text())
    assert report["config"]["replay"] is False
    (row,) = report["rows"]
    assert row["pages"] == 2 == sum(row["statuses"].values())  # every page has a record, whatever its status
    recs = [json.loads(ln) for ln in (out / "pages.jsonl").read_text().splitlines()]
    assert len(recs) == 2 and not any(r["equals_truth"] for r in recs)
    assert all(r["output_tokens"] > 0 for r in recs)  # the model did generate
    assert "free generation (no forcing)" in (out / "report.md").read_text()
