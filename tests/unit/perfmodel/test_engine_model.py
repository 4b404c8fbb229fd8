"""The engine model (`padoc-ray bench model`): hand-checked traces with exact step counts and times, the
real scheduler deciding every fork, image tokens, and the command's report. Fast: no engine, no Ray.

The step-time functions (fitted, roofline) and the paper384 workload are tested where they live
(tests/test_model_*.py): the engine model's own tests use a small linear step time, the command's the
real ones (a recorded `bench steps --json`, the A800 roofline, the paper's workload)."""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import pytest

from padoc_ray.perfmodel.plan import ForkMismatch, plan_page
from padoc_ray.perfmodel.sim import Envelope, simulate
from padoc_ray.perfmodel.step import StepLoad
from padoc_ray.perfmodel.trace import (
    PROCESSORS,
    ImageProcessor,
    TraceError,
    host_render_size,
    image_tokens,
    image_tokens_from_run,
    trace_from_page,
)
from padoc_ray.protocol import Box, Page, Region
from padoc_ray.scheduler import SchedulerConfig

from tests.helpers.byte_protocol import ByteProtocol
from tests.conftest import ROOT, require_demo_data

P = ByteProtocol()
CFG = SchedulerConfig()


class Linear:
    """seconds = fixed + per_decode x decode sequences + per_prefill x prefill tokens; keeps every load."""

    def __init__(self, fixed=1.0, per_decode=0.1, per_prefill=0.01):
        self.fixed, self.per_decode, self.per_prefill = fixed, per_decode, per_prefill
        self.loads: list[StepLoad] = []

    def seconds(self, load: StepLoad) -> float:
        self.loads.append(load)
        return self.fixed + self.per_decode * load.decode_seqs + self.per_prefill * load.prefill_tokens

    def describe(self) -> dict:
        return {"kind": "linear (test)", "fixed_s": self.fixed}


def page(*contents: str | None) -> Page:
    """One region per content (None: a figure, no content), top to bottom."""
    regs = []
    for i, c in enumerate(contents):
        box = Box(0.1, i * 0.1, 0.9, i * 0.1 + 0.05)
        regs.append(Region(category="figure", box=box, content=None, content_format="none") if c is None else
                    Region(category="text_block", box=box, content=c, content_format="text"))
    return Page(width=800, height=1000, regions=tuple(regs))


def plans(mode, *pages_, image=4, cfg=CFG):
    return [plan_page(trace_from_page(P, f"p{i}", pg, image), mode, P.vocab, cfg) for i, pg in enumerate(pages_)]


def near(a, b):
    return a == pytest.approx(b, abs=1e-9)


def L(dec, pre, ctx, images=0, image_tokens=0, *, pairs=None, kv=None, new=0):
    """A StepLoad whose attention pairs and KV tokens default to its context (decode only, nothing shared)."""
    return StepLoad(dec, pre, ctx, images, image_tokens, attention_pairs=ctx if pairs is None else pairs,
                    kv_tokens=ctx if kv is None else kv, new_requests=new)


# ---- the discrete-event core, by hand ------------------------------------------------------------------------
def test_one_page_one_branch():
    """Prompt 4 ids + 4 image tokens = 7; layout 8 tokens (region close at index 6); branch "ab" + EOS.
    Step 1 prefills the page (and encodes its image) and samples layout token 1; steps 2-7 decode up to
    the close; step 8 decodes the layout's end and admits the branch (prompt 4 + 6 + 1 = 11 ids, 14
    tokens, 13 shared: 12 cached in 4-token blocks, 2 to prefill), which samples its first token; steps
    9-10 decode the branch to its end. Attention pairs: the page's prefill 7 * 8 / 2 = 28; at step 8 the
    layout's 14 plus the branch's 2 tokens after 12 cached (2 * 12 + 2 * 3 / 2 = 27). KV read at step 8:
    the layout's 14 tokens, of which the branch's 13 shared ones are a prefix, plus its own 1."""
    st = Linear()
    (pl,) = plans("fork", page("ab"))
    assert [(r.key, r.prompt_tokens, r.shared_tokens, r.output_tokens, r.at_token) for r in pl.requests] == \
        [("main", 7, 0, 8, None), ("b0", 14, 13, 3, 7)]
    res = simulate([pl], 1, st, Envelope(max_num_seqs=8, max_num_batched_tokens=100, block_size=4))
    assert res.steps == 10 == pl.f_padoc
    assert st.loads[0] == L(0, 7, 7, 1, 4, pairs=28, new=1)
    assert st.loads[1:7] == [L(1, 0, 7 + k) for k in range(1, 7)]
    assert st.loads[7] == L(1, 2, 14 + 14, pairs=14 + 27, kv=14 + 1, new=1)
    assert st.loads[8:] == [L(1, 0, 15), L(1, 0, 16)]
    (rec,) = res.pages
    assert near(rec["e2e_s"], 1.07 + 6 * 1.1 + 1.12 + 2 * 1.1) and near(res.wall_s, rec["e2e_s"])
    assert (rec["output_tokens"], rec["prompt_tokens"], rec["cached_tokens"]) == (11, 21, 12)
    assert rec["valid"] and rec["status"] == "ok" and rec["n_branches"] == 1


def test_a_page_s_shared_prefix_is_read_once_in_a_step_s_kv():
    """Layout of 15 tokens closing regions at 7 and 14; branch b0 (prompt 14, 13 of it the layout stream's
    own tokens) decodes beside the layout stream from step 9. At step 9 the layout stream reads its 15
    tokens and b0 its 15 (14 + its first token): 30 context tokens, 30 pairs, but 17 distinct KV tokens
    (the layout's 15, and b0's branch-start token and first output). At step 15 b1 (prompt 21, 20 shared,
    20 cached in 4-token blocks) prefills 1 token after 20 while the layout stream reads 21: 42 context
    tokens, 21 + 21 pairs, 22 distinct."""
    st = Linear()
    (pl,) = plans("fork", page("abcd", "ef"))
    assert [(r.key, r.prompt_tokens, r.shared_tokens, r.at_token) for r in pl.requests] == \
        [("main", 7, 0, None), ("b0", 14, 13, 7), ("b1", 21, 20, 14)]
    simulate([pl], 1, st, Envelope(max_num_seqs=8, max_num_batched_tokens=100, block_size=4))
    assert st.loads[8] == L(2, 0, 30, kv=17)
    assert st.loads[11] == L(2, 0, 36, kv=18 + 5)  # the layout's 18, b0's branch-start token and 4 outputs
    assert st.loads[14] == L(1, 1, 42, pairs=21 + 21, kv=22, new=1)
    assert all(lo.distinct_kv_tokens <= lo.context_tokens for lo in st.loads)
    (seq,) = plans("sequential", page("abcd", "ef"))
    st = Linear()
    simulate([seq], 1, st, Envelope(max_num_seqs=8, max_num_batched_tokens=100, block_size=4))
    assert all(lo.distinct_kv_tokens == lo.context_tokens for lo in st.loads[1:])  # one stream: nothing shared


def test_two_pages_max_num_seqs_binds():
    """Sequential pages of 9 and 11 tokens, both in flight: with max_num_seqs 1 the second waits for the
    first (20 steps); with 2 they share steps (11)."""
    pls = plans("sequential", page("a"), page("abc"))
    assert [r.requests[0].output_tokens for r in pls] == [9, 11]
    one = simulate(pls, 2, Linear(), Envelope(max_num_seqs=1, max_num_batched_tokens=100))
    assert one.steps == 20
    a, b = one.pages
    assert near(a["e2e_s"], 1.07 + 8 * 1.1) and near(b["e2e_s"], a["e2e_s"] + 1.07 + 10 * 1.1)
    assert a["t_start"] == b["t_start"] == 0.0  # both entered at once: the engine kept b waiting
    two = simulate(pls, 2, Linear(), Envelope(max_num_seqs=2, max_num_batched_tokens=100))
    assert two.steps == 11
    a, b = two.pages
    assert near(a["e2e_s"], 1.14 + 8 * 1.2) and near(b["e2e_s"], a["e2e_s"] + 2 * 1.1)
    assert two.mean_batch == pytest.approx((2 * 9 + 2) / 11)


def test_prefill_bound_prompt_takes_several_chunks():
    """A 7-token prompt with 3 tokens per step: chunks of 3, 3, 1; the image (positions 2-5) is encoded
    in the first chunk, the first token comes with the last. Each chunk attends over itself (causal) and the
    chunks before it: 3 * 4 / 2 = 6, 3 * 3 + 6 = 15, 1 * 6 + 1 = 7 pairs."""
    st = Linear()
    (pl,) = plans("sequential", page("a"))
    res = simulate([pl], 1, st, Envelope(max_num_batched_tokens=3))
    assert st.loads[:3] == [L(0, 3, 3, 1, 4, pairs=6, new=1), L(0, 3, 6, pairs=15), L(0, 1, 7, pairs=7)]
    assert res.steps == 2 + 9 and st.loads[3] == L(1, 0, 8)


def test_token_budget_shared_by_decodes_and_prefill():
    """8 tokens per step, two pages: step 1 prefills page a (7) and the first token of page b's prompt;
    step 2 decodes a (1 token) and finishes b's prefill (6); from then on both decode."""
    st = Linear()
    pls = plans("sequential", page("a"), page("abc"))
    res = simulate(pls, 2, st, Envelope(max_num_batched_tokens=8))
    assert st.loads[0] == L(0, 8, 7 + 1, 1, 4, pairs=28 + 1, new=2)
    assert st.loads[1] == L(1, 6, 8 + 7, 1, 4, pairs=8 + 6 * 1 + 21)  # b's image is reached by its second chunk
    assert st.loads[2] == L(2, 0, 9 + 8)
    assert res.steps == 12  # b: first token at step 2, 10 more
    assert res.token_fill == pytest.approx(sum((lo.decode_seqs + lo.prefill_tokens) / 8 * st.seconds(lo)
                                               for lo in list(st.loads)) / res.wall_s)


def test_prefix_cache_reuses_full_blocks_only():
    """A branch prompt sharing 37 tokens with its main stream reuses 32 with 16-token blocks."""
    st = Linear()
    (pl,) = plans("fork", page("xy"), image=28)  # branch prompt: 4 + 6 + 1 ids - 1 + 28 = 38 tokens
    assert pl.requests[1].shared_tokens == 37
    res = simulate([pl], 1, st, Envelope(block_size=16))
    assert res.pages[0]["cached_tokens"] == 32
    assert st.loads[7].prefill_tokens == 38 - 32


def test_a_full_kv_cache_keeps_a_request_waiting_until_blocks_free():
    """Two sequential pages of 7 prompt + 9 and 11 output tokens in 4-token blocks: a needs 4 blocks at its
    end (7 + 8 tokens in the cache), b 5. With 6 they do not both fit to their ends: the engine never holds
    more than 6, takes more steps than with an unlimited cache, and loses no page."""
    pls = plans("sequential", page("a"), page("abc"))
    free = simulate(pls, 2, Linear(), Envelope(max_num_batched_tokens=100, block_size=4))
    assert free.steps == 11 and free.preempted_requests == 0
    tight = simulate(pls, 2, Linear(), Envelope(max_num_batched_tokens=100, block_size=4, kv_blocks=6))
    assert sorted(r["page"] for r in tight.pages) == ["p0", "p1"] and all(r["valid"] for r in tight.pages)
    assert tight.peak_kv_blocks <= 6 and tight.steps > free.steps


def test_a_running_request_that_cannot_grow_preempts_the_last_admitted():
    """KV for 5 blocks of 4 tokens, two sequential pages admitted together (2 blocks each for their 7-token
    prompts): when both need a third block only one fits, so the later one is preempted (vLLM's FCFS
    recompute), waits, and on readmission prefills its prompt plus what it had generated. Both pages end
    with every token their traces have."""
    st = Linear()
    pls = plans("sequential", page("ab"), page("ab"))
    res = simulate(pls, 2, st, Envelope(max_num_batched_tokens=100, block_size=4, kv_blocks=5))
    assert res.preempted_requests >= 1 and res.peak_kv_blocks <= 5
    assert [r["output_tokens"] for r in res.pages] == [pls[0].requests[0].output_tokens] * 2
    recompute = [lo.prefill_tokens for lo in st.loads[1:] if lo.prefill_tokens]
    assert recompute and recompute[0] > 7  # the prompt again, and the tokens generated before the preemption
    assert res.prefill_tokens == 14 + sum(recompute)


def test_a_request_bigger_than_the_kv_cache_is_a_clear_error():
    (pl,) = plans("sequential", page("abcdefgh"))
    with pytest.raises(RuntimeError, match="needs more KV blocks than the cache has"):
        simulate([pl], 1, Linear(), Envelope(max_num_batched_tokens=100, block_size=4, kv_blocks=2))


def test_a_branch_shares_its_pages_prefix_blocks_in_the_kv_count():
    """A fork page's branch finds the page prefix cached: the cache counts those blocks once. At step 8 the
    layout stream holds 4 blocks (7 prompt + 7 generated tokens) and the branch (prompt 14, 12 cached in
    3 of those blocks) needs 1 of its own: 5. With 4 blocks the branch waits one step, until the layout
    stream ends and leaves only the 3 prefix blocks the branch uses."""
    (pl,) = plans("fork", page("ab"))
    env = dict(max_num_seqs=8, max_num_batched_tokens=100, block_size=4)
    res = simulate([pl], 1, Linear(), Envelope(**env, kv_blocks=5))
    assert res.preempted_requests == 0 and res.steps == 10 and res.peak_kv_blocks == 5
    tight = simulate([pl], 1, Linear(), Envelope(**env, kv_blocks=4))
    assert tight.preempted_requests == 0 and tight.steps == 11 and tight.peak_kv_blocks == 4


def test_closed_loop_admits_a_page_when_one_ends():
    pls = plans("sequential", page("abc"), page("a"), page("ab"))
    res = simulate(pls, 2, Linear(), Envelope())
    by = {r["page"]: r for r in res.pages}
    assert [r["page"] for r in res.pages] == ["p1", "p0", "p2"]  # in the order they ended
    assert by["p2"]["t_start"] == by["p1"]["t_end"]  # the third page entered when the first ended


def test_engine_utilization_is_the_binding_limit_s_fill():
    pls = plans("sequential", page("a"), page("a"))
    res = simulate(pls, 2, Linear(fixed=1, per_decode=0, per_prefill=0), Envelope(max_num_seqs=4,
                                                                                   max_num_batched_tokens=14))
    # step 1: 2 seqs, 14 tokens (token-bound, fill 1); steps 2-9: 2 seqs of 4, 2 of 14 tokens (fill 0.5)
    assert res.engine_utilization == pytest.approx((1 + 8 * 0.5) / 9)
    assert res.seq_fill == pytest.approx(0.5) and res.token_fill == pytest.approx((1 + 8 * 2 / 14) / 9)


# ---- the real scheduler decides --------------------------------------------------------------------------------
def test_a_trace_whose_forks_differ_from_the_scheduler_s_is_caught():
    t = trace_from_page(P, "p", page("ab", "cd"), 4)
    assert t.fork.fork_points == (6, 13)
    bad = dataclasses.replace(t, fork=dataclasses.replace(t.fork, fork_points=(6, 12)))
    with pytest.raises(ForkMismatch, match="forks region 1 after 13 layout tokens, the trace says 12"):
        plan_page(bad, "fork", P.vocab, CFG)
    short = dataclasses.replace(t, fork=dataclasses.replace(t.fork, fork_points=(6,)))
    with pytest.raises(ForkMismatch, match="region 1 after 13 layout tokens, the trace says none"):
        plan_page(short, "fork", P.vocab, CFG)


def test_contentless_regions_are_not_forked_and_a_branch_limit_ends_the_page():
    (pl,) = plans("fork", page("ab", None, "cd"))
    assert [r.key for r in pl.requests] == ["main", "b0", "b2"] and pl.valid
    (pl,) = plans("fork", page("ab", "cd", "ef"), cfg=SchedulerConfig(max_branches=1))
    assert pl.status == "branch_limit" and not pl.valid and pl.stop_page == (0, 14)  # the second close
    res = simulate([pl], 1, Linear(), Envelope())
    assert res.steps == 14 and res.pages[0]["output_tokens"] == 14 + 3  # branch 0 ended before the stop


def test_max_tokens_ends_a_stream_as_length():
    (pl,) = plans("sequential", page("abcdefgh"), cfg=SchedulerConfig(max_tokens=10))
    assert pl.requests[0].output_tokens == 10 and pl.requests[0].finish_reason == "length"
    assert pl.status == "token_limit" and not pl.valid


# ---- image tokens ----------------------------------------------------------------------------------------------
def test_image_tokens_follow_the_processor_s_resize():
    tiny = ImageProcessor(16, 2, 4096, 262144)
    assert image_tokens(1000, 1000, tiny) == 16 * 16  # over the pixel budget: scaled down to 512 x 512
    assert image_tokens(1000, 2000, tiny) == 11 * 22  # 352 x 704: each side floored to a multiple of 32
    assert image_tokens(10, 10, tiny) == 2 * 2  # under min_pixels: scaled up to 64 x 64
    assert image_tokens(1600, 1200, PROCESSORS["qwen3-vl-2b"]) == 50 * 38
    assert host_render_size(2000, 1000, 1600, 10**9) == (1600, 800)
    assert host_render_size(800, 600, 1600, 10**9) == (800, 600)  # never enlarged
    with pytest.raises(TraceError, match="positive"):
        image_tokens(0, 10, tiny)


def test_hpd_1b_counts_256_tokens_a_tile_of_hpds_grid_and_its_thumbnail():
    """hpd-1b's processor is HPD's own rule (protocol.hpd_image): the grid's tiles plus a thumbnail when there
    is more than one, 256 tokens each."""
    from padoc_ray.perfmodel.trace import TiledImageProcessor, image_processor
    from padoc_ray.protocol.hpd_image import hpd_tile_grid

    proc = image_processor("hpd-1b")
    assert isinstance(proc, TiledImageProcessor) and proc.kind == "tiles" and proc.tile == 448
    assert PROCESSORS["qwen3-vl-2b"].kind == "resize"
    for (w, h), grid in (((1224, 1584), (3, 4)), ((1654, 2339), (4, 6)), ((1700, 2200), (4, 5)),
                         ((2339, 1654), (4, 3)), ((448, 448), (1, 1)), ((1000, 300), (7, 2))):
        assert hpd_tile_grid(w, h) == grid
        cols, rows = grid
        n = cols * rows
        assert image_tokens(w, h, proc) == 256 * (n + (1 if n > 1 else 0)), (w, h)
    assert image_tokens(1224, 1584, proc) == 256 * 13  # an A4-ish page: 3 x 4 tiles and the thumbnail
    assert image_tokens(1654, 2339, proc) == 256 * 25  # A4 at 200 dpi: the 24-tile cap and the thumbnail
    with pytest.raises(TraceError, match="positive"):
        image_tokens(0, 10, proc)


def test_the_tiny_model_s_processor_is_read_from_its_config(tiny_model_dir):
    from padoc_ray.perfmodel.trace import image_processor

    proc = image_processor(tiny_model_dir)
    assert (proc.patch_size, proc.merge_size, proc.min_pixels, proc.max_pixels) == (16, 2, 4096, 262144)
    with pytest.raises(TraceError, match="no image processor"):
        image_processor("no-such-model")


def test_image_tokens_from_a_measured_run(tmp_path):
    t = trace_from_page(P, "a.png", page("ab", "cd"), 1)
    path = tmp_path / "pages.jsonl"
    fork_prompt = 3 * (3 + 250) + (6 + 1) + (13 + 1)  # main + 2 branches, 250 image tokens each
    path.write_text(json.dumps({"mode": "fork", "page": "a.png", "prompt_tokens": fork_prompt, "n_branches": 2}) + "\n")
    assert image_tokens_from_run([t], str(path))[0].image_tokens == 250
    path.write_text(json.dumps({"mode": "sequential", "page": "a.png", "prompt_tokens": 3 + 250}) + "\n")
    assert image_tokens_from_run([t], str(path))[0].image_tokens == 250
    path.write_text(json.dumps({"mode": "sequential", "page": "b.png", "prompt_tokens": 300}) + "\n")
    with pytest.raises(TraceError, match="no usable prompt count for 1 page"):
        image_tokens_from_run([t], str(path))


# ---- the report's figures, by hand ------------------------------------------------------------------------------
def test_a_report_row_s_pages_dollars_and_step_figures_by_hand(tmp_path):
    """Two one-region sequential pages at C=2 take 9 steps (as in the utilization test above); at 2/9 s a step
    the run takes 2 s: 1 page/s, 222.222 ms a step, and a million pages are 10^6 s = 277.8 GPU hours, $1,000
    at $3.60 an hour. Twice the price is twice the dollars; steps twice as long are half the pages/s, twice
    the dollars and twice the step time, in the same 9 steps. A measured run of 0.75 pages/s in 18 steps of
    111.111 ms is 0.75 of the model, in 2x its steps of 0.5x its step time."""
    from padoc_ray.perfmodel.report import add_measured, run_model

    traces = [trace_from_page(P, f"p{i}", page("a"), 4) for i in range(2)]
    env = Envelope(max_num_seqs=4, max_num_batched_tokens=14)

    def row(step_s: float, usd: float) -> dict:
        (r,) = run_model(traces, P.vocab, CFG, Linear(fixed=step_s, per_decode=0, per_prefill=0), env, [2],
                         ["sequential"], gpu_hour_usd=usd)
        return r

    base = row(2 / 9, 3.6)
    assert (base["engine_steps"], base["wall_s"], base["valid_pages_per_s"]) == (9, 2.0, 1.0)
    assert base["mean_step_ms"] == 222.222 and base["usd_per_million_pages"] == 1000.0
    pricier = row(2 / 9, 7.2)
    assert pricier["usd_per_million_pages"] == 2 * base["usd_per_million_pages"]
    assert pricier["valid_pages_per_s"] == base["valid_pages_per_s"]
    slower = row(4 / 9, 3.6)
    assert slower["engine_steps"] == base["engine_steps"] and slower["wall_s"] == 2 * base["wall_s"]
    assert slower["valid_pages_per_s"] == base["valid_pages_per_s"] / 2 == 0.5
    assert slower["usd_per_million_pages"] == 2 * base["usd_per_million_pages"]
    assert slower["mean_step_ms"] == 444.444
    (tmp_path / "report.json").write_text(json.dumps({"rows": [
        {"mode": "sequential", "concurrency": 2, "valid_pages_per_s": 0.75, "engine_steps": 18,
         "mean_step_ms": 111.111}]}))
    add_measured([base], str(tmp_path))
    assert base["measured_over_modeled"] == 0.75
    assert base["measured_steps_over_modeled"] == 2.0 and base["measured_step_ms_over_modeled"] == 0.5


# ---- the command ------------------------------------------------------------------------------------------------
def _model(*argv) -> int:
    from padoc_ray.cli import main

    return main(["bench", "model", *argv])


def test_the_command_models_a_ground_truth_file_and_compares_a_measured_run(tmp_path, tiny_model_dir):
    demo = require_demo_data()
    steps = os.path.join(ROOT, "tests", "data", "bench_steps_tiny.json")  # a real run, recorded
    with open(steps) as f:
        engine = json.load(f)["engine"]
    measured = tmp_path / "serve"
    measured.mkdir()
    (measured / "report.json").write_text(json.dumps({"rows": [
        {"mode": "fork", "concurrency": 2, "valid_pages_per_s": 0.5, "p95_e2e_s": 9.0, "engine_steps": 900,
         "mean_step_ms": 8.0, "mean_running_seqs": 6.5, "mean_waiting_seqs": 0.5, "preempted_requests": 0,
         "prefill_tokens": 5000},
        {"mode": "sequential", "concurrency": 2, "valid_pages_per_s": 0.25, "p95_e2e_s": 12.0}]}))
    out = tmp_path / "model"
    assert _model("--gt", os.path.join(demo, "OmniDocBench_demo.json"), "--images", os.path.join(demo, "images"),
                  "--steps", steps, "--model", tiny_model_dir, "--concurrency", "2,4", "--pages", "4",
                  "--gpu-hour-usd", "2.5", "--compare", str(measured), "--out", str(out)) == 0
    report = json.loads((out / "report.json").read_text())
    keys = ("max_num_seqs", "max_num_batched_tokens", "block_size")
    assert report["config"]["envelope"] == {**{k: engine[k] for k in keys}, "kv_blocks": None}
    assert report["pages"]["used"] == 4 and "page images" in report["pages"]["image_tokens"]
    rows = {(r["mode"], r["concurrency"]): r for r in report["rows"]}
    assert set(rows) == {(m, c) for m in ("fork", "sequential") for c in (2, 4)}
    for r in rows.values():
        assert r["pages"] == r["valid_pages"] == 4 and r["p95_e2e_s"] >= r["p50_e2e_s"] > 0
        assert r["tokens_per_s"] > 0 and 0 < r["engine_utilization"] <= 1
        assert r["usd_per_million_pages"] == round(1e6 / r["valid_pages_per_s"] / 3600 * 2.5, 2)
    for m in ("fork", "sequential"):
        assert rows[(m, 4)]["measured_valid_pages_per_s"] is None and rows[(m, 4)]["measured_over_modeled"] is None
        got = rows[(m, 2)]
        want = {"fork": 0.5, "sequential": 0.25}[m]
        assert got["measured_valid_pages_per_s"] == want
        assert got["measured_over_modeled"] == round(want / got["valid_pages_per_s"], 4)
    fork2, seq2 = rows[("fork", 2)], rows[("sequential", 2)]
    # the step figures side by side: the model's from its own steps, the measured run's from its row
    assert fork2["mean_step_ms"] == round(fork2["wall_s"] / fork2["engine_steps"] * 1e3, 3)
    assert fork2["measured_steps_over_modeled"] == round(900 / fork2["engine_steps"], 4)
    assert fork2["measured_step_ms_over_modeled"] == round(8.0 / fork2["mean_step_ms"], 4)
    assert seq2["measured_engine_steps"] is None and seq2["measured_steps_over_modeled"] is None  # not measured
    assert rows[("fork", 2)]["valid_pages_per_s"] > rows[("sequential", 2)]["valid_pages_per_s"]
    assert rows[("fork", 2)]["prefix_cache_hit_rate"] > 0.5 and rows[("sequential", 2)]["prefix_cache_hit_rate"] == 0
    md = (out / "report.md").read_text()
    assert "## Table 3 analogue" in md and "## Assumptions" in md and "| valid pages/s | fork |" in md
    assert f"| 2 | fork | {fork2['measured_over_modeled']:.3f} | 900 ({fork2['engine_steps']}) |" in md
    for name in report["plots"]:
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_paper_workload_rows_carry_the_paper_s_table(tmp_path, tiny_model_dir):
    from padoc_ray.perfmodel.report import PAPER_TABLE3

    out = tmp_path / "paper"
    assert _model("--workload", "paper384", "--gpu", "A800-80G", "--model-config", "qwen3-vl-2b", "--model",
                  tiny_model_dir, "--concurrency", "16,48", "--pages", "6", "--out", str(out)) == 0
    report = json.loads((out / "report.json").read_text())
    from padoc_ray.perfmodel.roofline import kv_cache_blocks

    kv = kv_cache_blocks("A800-80G", "qwen3-vl-2b", 16)
    assert report["config"]["envelope"] == {"max_num_seqs": 384, "max_num_batched_tokens": 24576, "block_size": 16,
                                            "kv_blocks": kv}
    # Appendix E.3: Sequential SFT ran in vLLM's standard envelope, PaDoc in the paper's
    assert report["config"]["envelope_by_mode"] == {
        "fork": {"max_num_seqs": 384, "max_num_batched_tokens": 24576, "block_size": 16, "kv_blocks": kv},
        "sequential": {"max_num_seqs": 256, "max_num_batched_tokens": 32768, "block_size": 16, "kv_blocks": kv}}
    assert any("8,192-token generation limit" in a for a in report["assumptions"])
    rows = {(r["mode"], r["concurrency"]): r for r in report["rows"]}
    t3 = PAPER_TABLE3
    assert rows[("fork", 16)]["paper_valid_pages_per_s"] == t3["fork"]["valid_pages_per_s"][0]
    assert rows[("sequential", 16)]["paper_p95_e2e_s"] == t3["sequential"]["p95_e2e_s"][0]
    assert rows[("fork", 16)]["paper_fork_over_sequential"] == round(1.640 / 0.751, 4)
    assert rows[("fork", 48)]["paper_valid_pages_per_s"] is None  # the paper has no C=48
    assert report["paper"]["source"].startswith("PaDoc paper, Table 3")
    assert report["pages"]["used"] == 6
    assert rows[("sequential", 16)]["prefill_tokens"] > 6 * 3600  # A4 / Letter at 200 dpi: 3,657-3,796 image tokens


def test_the_paper_workload_takes_its_page_sizes_from_a_ground_truth(tmp_path, tiny_model_dir):
    gt = tmp_path / "gt.json"
    gt.write_text(json.dumps([{"page_info": {"image_path": f"p{i}.png", "page_no": i, "width": 729, "height": 516},
                               "layout_dets": []} for i in range(2)]))
    out = tmp_path / "sized"
    assert _model("--workload", "paper384", "--gpu", "A800-80G", "--model-config", "qwen3-vl-2b", "--model",
                  tiny_model_dir, "--concurrency", "4", "--pages", "4", "--mode", "sequential",
                  "--page-sizes", str(gt), "--out", str(out)) == 0
    report = json.loads((out / "report.json").read_text())
    assert str(gt) in report["pages"]["image_tokens"]
    from padoc_ray.tokenizer import load_model_protocol

    text = len(load_model_protocol(tiny_model_dir).prompt_ids("sequential")) - 1  # the placeholder expands
    # one request a page, nothing cached: every page prefills its prompt with a 729 x 516 image
    assert report["rows"][0]["prefill_tokens"] == 4 * (text + image_tokens(729, 516, PROCESSORS["qwen3-vl-2b"]))


def test_the_command_models_hpd_1b_on_an_h200_with_pages_per_s_and_dollars(tmp_path, tiny_model_dir):
    """--model-config hpd-1b: HPD-Parsing's shape in the roofline and its tiles in the image tokens, the
    report with pages/s and $ per million pages beside the same run of qwen3-vl-2b."""
    gt = tmp_path / "gt.json"
    gt.write_text(json.dumps([{"page_info": {"image_path": f"p{i}.png", "page_no": i, "width": 1224, "height": 1584},
                               "layout_dets": []} for i in range(2)]))
    argv = ("--workload", "paper384", "--gpu", "H200", "--model", tiny_model_dir, "--concurrency", "4",
            "--pages", "4", "--page-sizes", str(gt), "--gpu-hour-usd", "1.5")
    reports = {}
    for name in ("hpd-1b", "qwen3-vl-2b"):
        out = tmp_path / name
        assert _model(*argv, "--model-config", name, "--out", str(out)) == 0
        reports[name] = json.loads((out / "report.json").read_text())
    report = reports["hpd-1b"]
    st = report["config"]["step_time"]
    assert st["gpu"] == "H200" and st["model"] == "hpd-1b" and "oar-ocr's config.rs" in st["model_source"]
    assert "hpd-1b's processor" in report["pages"]["image_tokens"] and "448-px tiles" in report["pages"]["image_tokens"]
    from padoc_ray.tokenizer import load_model_protocol

    text = len(load_model_protocol(tiny_model_dir).prompt_ids("sequential")) - 1
    rows = {(r["mode"], r["concurrency"]): r for r in report["rows"]}
    # sequential: one request a page, nothing cached: each prefills its prompt with 3 x 4 tiles and the thumbnail
    assert rows[("sequential", 4)]["prefill_tokens"] == 4 * (text + 256 * 13)
    qwen = {(r["mode"], r["concurrency"]): r for r in reports["qwen3-vl-2b"]["rows"]}
    assert qwen[("sequential", 4)]["prefill_tokens"] == 4 * (text + image_tokens(1224, 1584,
                                                                                 PROCESSORS["qwen3-vl-2b"]))
    md = (tmp_path / "hpd-1b" / "report.md").read_text()
    assert "# Engine model (H200 roofline, hpd-1b)" in md and "$ / M pages" in md
    for m in ("fork", "sequential"):
        r = rows[(m, 4)]
        assert r["pages"] == 4 and r["valid_pages_per_s"] > 0
        assert r["usd_per_million_pages"] == round(1e6 / r["valid_pages_per_s"] / 3600 * 1.5, 2)
        assert f"| 4 | {m} | {r['valid_pages']} / 4 | {r['valid_pages_per_s']:.3f} |" in md
        assert f"| {r['usd_per_million_pages']:.2f} |" in md
        # fewer weight bytes a step, and a ViT that attends within 448-px tiles: more pages/s for the same pages
        assert r["valid_pages_per_s"] > qwen[(m, 4)]["valid_pages_per_s"]


@pytest.mark.parametrize("argv, message", [
    ([], "give --gt GT.json or --workload paper384"),
    (["--workload", "paper384", "--gpu", "A800-80G"], "--gpu needs --model-config"),
    (["--workload", "paper384", "--gpu", "A800-80G", "--model-config", "x", "--mode", "fork,bogus"],
     "--mode takes fork and/or sequential"),
    (["--workload", "paper384", "--gpu", "A800-80G", "--model-config", "x", "--page-priority"], "FCFS scheduler only"),
    (["--gt", "x.json", "--page-sizes", "y.json", "--gpu", "A800-80G", "--model-config", "x"],
     "--page-sizes is for --workload paper384"),
    (["--gt", "no-such.json", "--steps", "s.json"], "--gt no-such.json: no such file"),
])
def test_bad_input_is_refused_with_exit_2(argv, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as e:
        _model(*argv, *([] if "--steps" in argv or "--gpu" in argv else ["--steps", "s.json"]),
               "--out", str(tmp_path / "o"))
    assert e.value.code == 2 and message in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_compare_needs_a_bench_serve_output(tmp_path):
    from padoc_ray.perfmodel.report import add_measured

    with pytest.raises(ValueError, match="not a bench serve output"):
        add_measured([], str(tmp_path))


def test_the_speed_probe_takes_the_machines_drift_out_of_the_comparison(tmp_path):
    """A cell measured while the machine ran 1.25x slower than during bench steps: its modeled steps are
    scaled by that before measured / modeled, so the drift is not read as the host's inefficiency."""
    from padoc_ray.perfmodel.report import add_measured

    def rows():
        return [{"mode": "fork", "concurrency": 16, "valid_pages_per_s": 2.0},
                {"mode": "sequential", "concurrency": 16, "valid_pages_per_s": 1.0}]

    def measured(cfg):
        (tmp_path / "report.json").write_text(json.dumps({"config": cfg, "rows": [
            {"mode": "fork", "concurrency": 16, "valid_pages_per_s": 1.5, "speed_probe_step_ms": 25.0},
            {"mode": "sequential", "concurrency": 16, "valid_pages_per_s": 0.9}]}))  # no probe: no adjustment

    measured({"speed_probe": True, "speed_probe_tokens": 128})
    got = rows()
    info = add_measured(got, str(tmp_path), {"batch": 16, "tokens": 128, "step_ms": 20.0})
    fork, seq = got
    assert fork["measured_over_modeled"] == 0.75 and fork["machine_speed_ratio"] == 1.25
    assert fork["measured_over_modeled_at_cell_speed"] == pytest.approx(0.9375)
    assert seq["machine_speed_ratio"] is None and seq["measured_over_modeled_at_cell_speed"] is None
    assert "scaled by its speed probe" in info["speed_probe"]
    for cfg, steps_probe, why in (({"speed_probe": True, "speed_probe_tokens": 128}, None, "has no speed_probe"),
                                  ({}, {"tokens": 128, "step_ms": 20.0}, "without bench serve --speed-probe"),
                                  ({"speed_probe": True, "speed_probe_tokens": 64}, {"tokens": 128, "step_ms": 20.0},
                                   "the probes differ")):
        measured(cfg)
        got = rows()
        assert why in add_measured(got, str(tmp_path), steps_probe)["speed_probe"]
        assert got[0]["machine_speed_ratio"] is None and got[0]["measured_over_modeled"] == 0.75


def test_the_model_is_pure():
    """Its modules import no ray, vllm, torch or transformers (the pure-core check of test_pure_imports)."""
    import subprocess

    from tests.contracts.test_pure_imports import BLOCKER

    mods = [f"padoc_ray.perfmodel.{m}" for m in ("step", "trace", "plan", "sim", "report")]
    proc = subprocess.run([sys.executable, "-c", BLOCKER, *mods], capture_output=True, text=True, cwd=ROOT,
                          timeout=120)
    assert proc.returncode == 0 and proc.stdout.strip() == "ok", proc.stderr[-2000:]


def test_drafts_move_accepted_branch_tokens_from_decoding_into_the_prefill():
    from padoc_ray.perfmodel.plan import PagePlan, RequestPlan, with_drafts

    reqs = (RequestPlan("main", 500, 0, 80, "stop", image=True),
            RequestPlan("b0", 520, 500, 100, "stop", parent=0, at_token=10),
            RequestPlan("b1", 540, 500, 1, "stop", parent=0, at_token=20),
            RequestPlan("b0.r1", 520, 520, 60, "stop", parent=1))
    plan = PagePlan("p", "fork", reqs, 400, 5, None, "ok", True, 200, 120, 2)
    got = with_drafts(plan, 0.7)
    main, b0, b1, retry = got.requests
    assert (b0.prompt_tokens, b0.output_tokens) == (520 + 70, 30)  # 70 tokens checked in the prefill
    assert (b1.prompt_tokens, b1.output_tokens) == (540, 1)  # a branch still decodes its last token
    assert main == reqs[0] and retry == reqs[3]  # the layout stream and re-forks take no draft
    assert with_drafts(plan, 1.0).requests[1].output_tokens == 1
    assert with_drafts(dataclasses.replace(plan, mode="sequential"), 0.7) == dataclasses.replace(plan, mode="sequential")
    with pytest.raises(ValueError, match=r"accepted_fraction must be in \[0, 1\]"):
        with_drafts(plan, 1.5)


def test_the_command_models_text_layer_drafts_beside_the_plain_run(tmp_path, tiny_model_dir):
    out = tmp_path / "model"
    assert _model("--workload", "paper384", "--gpu", "H200", "--model-config", "qwen3-vl-2b", "--concurrency", "64",
                  "--gpu-hour-usd", "1.5", "--accepted-fraction", "0.6", "--pages", "64", "--model", tiny_model_dir,
                  "--out", str(out)) == 0
    report = json.loads((out / "report.json").read_text())
    plain = {(r["mode"], r["concurrency"]): r for r in report["rows"]}
    drafted = {(r["mode"], r["concurrency"]): r for r in report["drafts"]["rows"]}
    assert report["drafts"]["accepted_fraction"] == 0.6 and set(drafted) == set(plain)
    fork, fork_d = plain[("fork", 64)], drafted[("fork", 64)]
    # accepted tokens leave the decode loop: fewer steps, more pages/s, fewer dollars; sequential takes no draft
    assert fork_d["engine_steps"] < fork["engine_steps"] and fork_d["valid_pages_per_s"] > fork["valid_pages_per_s"]
    assert fork_d["usd_per_million_pages"] < fork["usd_per_million_pages"]
    assert drafted[("sequential", 64)]["engine_steps"] == plain[("sequential", 64)]["engine_steps"]
    assert "## Text-layer drafts, 60% of branch tokens accepted" in (out / "report.md").read_text()
    with pytest.raises(SystemExit):
        _model("--workload", "paper384", "--gpu", "H200", "--model-config", "qwen3-vl-2b", "--accepted-fraction", "2",
               "--model", tiny_model_dir, "--out", str(tmp_path / "x"))
