"""The layout-fork scheduler on the real CPU vLLM engine (tiny Qwen3-VL, float32), teacher-forced."""

from __future__ import annotations

import asyncio
import json
import glob
import os
import re

import pytest

from padoc_ray.protocol import page_from_omnidocbench, quantized, serialize_padoc, serialize_sequential
from padoc_ray.scheduler import PageInput, SchedulerConfig, replay_input, run_page

from tests.conftest import ROOT, demo_image

pytestmark = pytest.mark.engine


class Recording:
    """Wraps the real engine and records every request (the engine does all the work)."""

    def __init__(self, inner):
        self.inner, self.requests = inner, []

    def generate(self, req):
        self.requests.append(req)
        return self.inner.generate(req)

    async def abort(self, ids):
        await self.inner.abort(ids)

    def num_unfinished_requests(self):
        return self.inner.num_unfinished_requests()


def _example_pages():
    from padoc_ray.groundtruth import load_truth
    from padoc_ray.inputs import load_pages

    truth = load_truth(os.path.join(ROOT, "examples", "ground_truth.json"))
    out = []
    for it in load_pages(sorted(glob.glob(os.path.join(ROOT, "examples", "*.pdf")))):
        p = it.page
        inp = PageInput(page_id=f"{p.doc_id[:16]}:{p.page_index}", image=p.image, width=p.image.width,
                        height=p.image.height, cache_salt=p.doc_id, page_no=p.page_index, image_path=it.source)
        out.append((f"ex-{it.source}-{it.page_index}", inp, truth[(it.source, it.page_index)]))
    return out


@pytest.fixture(scope="module")
def corpus(demo_gt):
    """(name, PageInput, truth) for the 18 OmniDocBench demo pages and the 5 synthetic example pages."""
    out = []
    for i, obj in enumerate(demo_gt):
        truth = page_from_omnidocbench(obj)
        img = demo_image(truth.image_path)
        out.append((f"demo-{i}", PageInput(page_id=f"demo{i}:0", image=img, width=img.width, height=img.height,
                                           cache_salt=f"demo{i}", image_path=truth.image_path), truth))
    out += _example_pages()
    assert len(out) == 23
    return out


#: the sequential replay's per-stream token limit (the demo pages' sequential lengths run 185..9443)
SEQ_LIMIT = 3000


@pytest.fixture(scope="module")
def replays(corpus, cpu_engine, model_protocol, loop_thread):
    """All 23 pages at once in each mode (so >= 20 pages are in flight with forks). The sequential
    run's token limit is :data:`SEQ_LIMIT`, not the default 8192: three pages run into it (the
    longest stops there) and the rest fit, with a third of the steps."""
    rec_engine = Recording(cpu_engine)

    async def go(mode, cfg=None):
        return await asyncio.gather(*(run_page(rec_engine, model_protocol, replay_input(model_protocol, t, inp, mode),
                                               mode=mode, cfg=cfg) for _, inp, t in corpus))

    fork = loop_thread.run(go("fork"), timeout=900)
    fork_requests = list(rec_engine.requests)
    seq = loop_thread.run(go("sequential", SchedulerConfig(max_tokens=SEQ_LIMIT)), timeout=900)
    return {"fork": fork, "sequential": seq, "fork_requests": fork_requests}


def test_fork_equals_truth_for_every_page_with_all_in_flight(corpus, replays, model_protocol, cpu_engine):
    for (name, _, truth), rec in zip(corpus, replays["fork"]):
        assert rec.status == "ok" and rec.valid, (name, rec.status, rec.message)
        assert rec.page.regions == quantized(truth, model_protocol.vocab).regions and not rec.page.errors, name
        assert rec.f_padoc <= rec.f_seq
    assert cpu_engine.num_unfinished_requests() == 0


def test_sequential_equals_fork_equals_truth_within_the_token_limit(corpus, replays, model_protocol):
    limit = SEQ_LIMIT
    over = 0
    for (name, _, truth), f, s in zip(corpus, replays["fork"], replays["sequential"]):
        n = len(serialize_sequential(model_protocol.vocab, model_protocol.tokenizer, truth))
        if n <= limit:
            assert s.status == "ok" and s.page == f.page, name
            assert s.page.regions == quantized(truth, model_protocol.vocab).regions, name
            assert s.f_seq == f.f_seq == n  # the trace the fork run reconstructs is the real sequential length
        else:  # the paper's failure mode of sequential decoding: the page does not fit one stream
            over += 1
            assert s.status == "token_limit" and not s.valid and f.status == "ok", name
    assert over >= 1  # the 87-region demo page needs ~9.4k sequential tokens


def test_every_child_hits_the_prefix_cache(replays):
    block = 32
    n = 0
    for rec in replays["fork"]:
        for prompt, cached in zip(rec.branch_prompt_tokens, rec.branch_cached_tokens):
            assert cached >= (prompt - 1) // block * block, (rec.page_id, prompt, cached)
            n += 1
    assert n > 300


def test_child_prompts_are_branch_isolated(corpus, replays, model_protocol):
    v = model_protocol.vocab
    prompt = list(model_protocol.prompt_ids("fork"))
    reqs = replays["fork_requests"]
    for (name, inp, truth) in corpus[:6]:
        s = serialize_padoc(v, model_protocol.tokenizer, truth)
        children = [r for r in reqs if r.request_id.startswith(inp.page_id + "/") and _branch(r.request_id) is not None]
        assert children
        for r in children:
            k = _branch(r.request_id)
            assert list(r.prompt_ids) == prompt + list(s.layout[: s.fork_points[k]]) + [v.branch_start], (name, k)
            assert r.image_uuid == inp.page_id and r.cache_salt == inp.cache_salt and r.image is inp.image


def _branch(request_id: str) -> int | None:
    """Branch index of a request id `<page>/<run token>/b<k>` (None for the layout stream `/main`)."""
    m = re.search(r"/b(\d+)$", request_id)
    return int(m.group(1)) if m else None


@pytest.fixture(scope="module")
def bundled():
    """The 5 example pages bundled in the repository (examples/): the limit, cancel and error tests
    run on them, so they never depend on the shared data."""
    return _example_pages()


def _one(corpus, name):
    return next((inp, t) for n, inp, t in corpus if n == name)


def _run(loop_thread, engine, model_protocol, inp, mode="fork", **cfg):
    return loop_thread.run(run_page(engine, model_protocol, inp, mode=mode, cfg=SchedulerConfig(**cfg)), timeout=300)


def test_limits_give_their_status_and_leave_no_live_requests(bundled, cpu_engine, model_protocol, loop_thread):
    mp, v = model_protocol, model_protocol.vocab
    inp, truth = _one(bundled, "ex-paper.pdf-0")  # 13 regions, 566 sequential tokens
    assert len(truth.regions) > 3 and len(serialize_sequential(v, mp.tokenizer, truth)) > 40
    cases = {
        "branch_limit": (replay_input(mp, truth, inp, "fork"), "fork", dict(max_branches=3)),
        "token_limit": (replay_input(mp, truth, inp, "sequential"), "sequential", dict(max_tokens=40)),
    }
    # a branch that repeats itself forever
    rp = replay_input(mp, truth, inp, "fork")
    loop = mp.tokenizer.encode("ab") * 400
    cases["runaway"] = (type(rp)(**{**rp.__dict__, "forced_branches": [loop] * len(rp.forced_branches)}), "fork",
                        dict(runaway_window=64, runaway_max_period=4, stream_branches=True,
                             branch_retries=0))  # checked as it streams; re-forks off (today's status)
    # a layout stream with a broken region
    bad = [v.region_open, v.coord_ids[5], v.region_close, *serialize_padoc(v, mp.tokenizer, truth).layout]
    cases["malformed_layout"] = (type(rp)(**{**rp.__dict__, "forced_main": bad}), "fork", {})
    for status, (page_in, mode, cfg) in cases.items():
        rec = _run(loop_thread, cpu_engine, mp, page_in, mode, **cfg)
        assert rec.status == status and not rec.valid, (status, rec.status, rec.message)
        assert cpu_engine.num_unfinished_requests() == 0, status
    big_inp, big = _one(bundled, "ex-report.pdf-0")  # 862 sequential tokens: seconds of decoding
    rec = _run(loop_thread, cpu_engine, mp, replay_input(mp, big, big_inp, "sequential"), "sequential", deadline_s=0.3)
    stream = serialize_sequential(v, mp.tokenizer, big)
    assert rec.status == "deadline" and rec.output_tokens < len(stream)  # cut mid-page
    assert rec.e2e_s >= 0.3, rec.e2e_s  # when its deadline passed, not before (the page's own clock)
    # what was decoded before the cut is kept, whenever the cut came (a loaded machine decodes less in 0.3 s):
    # every region whose next one had started, in order and equal to the truth (the last one kept may be cut)
    started = stream[:rec.output_tokens].count(v.region_open)
    got, want = rec.page.regions, quantized(big, v).regions
    assert max(0, started - 1) <= len(got) <= started < len(want), (started, len(got), rec.output_tokens)
    assert got[:-1] == want[:len(got) - 1] and all(g.category == w.category for g, w in zip(got, want))
    assert cpu_engine.num_unfinished_requests() == 0


def test_a_looping_branch_is_cut_early_and_reforked_to_the_truth(bundled, cpu_engine, model_protocol, loop_thread):
    """Issue 31: branch k's first attempt is teacher-forced to a phrase repeated to the token limit, its
    re-fork to the truth. Branches stream in chunks (branch_stream_interval): the loop detector cuts the
    first attempt within its window plus one chunk, and the page comes out valid and equal to the truth."""
    import dataclasses

    mp = model_protocol
    inp, truth = _one(bundled, "ex-paper.pdf-0")
    rp = replay_input(mp, truth, inp, "fork")
    clean = _run(loop_thread, cpu_engine, mp, rp)
    k = next(i for i, b in enumerate(rp.forced_branches) if len(b) > 1)
    loop = (mp.tokenizer.encode("the same sentence again, ") * 2000)[:SchedulerConfig().max_tokens]
    rec = _run(loop_thread, cpu_engine, mp, dataclasses.replace(rp, forced_first_attempt={k: loop}))
    assert clean.status == "ok" and rec.status == "ok" and rec.valid, rec.message
    assert rec.page == clean.page  # the re-fork reproduces the truth
    assert rec.region_attempts[k] == 2 and rec.region_finish[k] == "stop"  # region k: the k-th in reading order
    assert sum(rec.region_attempts) == sum(clean.region_attempts) + 1
    spent = rec.region_tokens[k] - clean.region_tokens[k]
    assert 0 < spent <= 256 + 64 + 64, spent  # the detector's span, a chunk, and one more in flight
    assert rec.output_tokens == clean.output_tokens + spent
    assert cpu_engine.num_unfinished_requests() == 0


def test_cancelling_mid_page_leaves_no_live_requests(bundled, cpu_engine, model_protocol, loop_thread):
    inp, truth = _one(bundled, "ex-paper.pdf-0")
    spy = Recording(cpu_engine)

    async def go():
        task = asyncio.create_task(run_page(spy, model_protocol, replay_input(model_protocol, truth, inp, "fork")))
        try:
            # Cancel at the first moment the engine holds two of the page's requests, a branch forked. The check
            # and the cancel share one loop turn (vLLM's output handler runs in this loop), so both are still live
            # when the cancel lands, however loaded the machine. The layout stream and its 13 branches overlap
            # for most of the page's run.
            while not (any(_branch(r.request_id) is not None for r in spy.requests)
                       and cpu_engine.num_unfinished_requests() >= 2):
                assert not task.done(), "the page ended before the engine held two of its requests at once"
                await asyncio.sleep(0.005)
            task.cancel()
            try:
                await task
            except asyncio.CancelledError:
                return True
            return False
        finally:  # a failed check must not leave the page running into the module's next tests
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    assert loop_thread.run(go(), timeout=300)
    assert cpu_engine.num_unfinished_requests() == 0


def test_the_adapter_maps_vllm_rejections_to_engine_error(bundled, cpu_engine, model_protocol, loop_thread):
    """vLLM's refusals of one request become EngineError in the adapter (a page status, never an
    actor death): a prompt over max_model_len, and sampling parameters vLLM rejects; through
    run_page the page gets engine_error and nothing stays live in the engine."""
    from padoc_ray.engine.interface import EngineDeadError, EngineError, GenRequest

    too_long = GenRequest(request_id="too-long", prompt_ids=[model_protocol.vocab.region_open] * 40_000, max_tokens=4)

    async def go():
        async for _ in cpu_engine.generate(too_long):
            pass

    with pytest.raises(EngineError, match="too-long rejected: .*maximum context length") as e:
        loop_thread.run(go(), timeout=120)
    assert not isinstance(e.value, EngineDeadError)
    inp, truth = _one(bundled, "ex-memo.pdf-0")
    rec = _run(loop_thread, cpu_engine, model_protocol, replay_input(model_protocol, truth, inp, "fork"),
               temperature=-1.0)  # vLLM refuses a negative temperature
    assert rec.status == "engine_error" and not rec.valid and "rejected" in rec.message, (rec.status, rec.message)
    assert cpu_engine.num_unfinished_requests() == 0


def test_an_engine_death_is_raised_as_engine_dead_error_once(bundled, cpu_engine, model_protocol, loop_thread,
                                                            tmp_path, monkeypatch):
    """The test fault (PADOC_RAY_ENGINE_FAULTS, read where the engine is created) makes the N-th
    request fail as vLLM's own EngineDeadError; the adapter maps it to EngineDeadError, which
    run_page lets through (the engine actor exits on it); the marker file makes it fire once only,
    in whichever process gets there first."""
    from padoc_ray.engine.faults import ENGINE_FAULTS_ENV, EngineFault
    from padoc_ray.engine.interface import EngineDeadError

    marker = tmp_path / "died"
    monkeypatch.setenv(ENGINE_FAULTS_ENV, json.dumps({"die_at_request": 2, "once": str(marker)}))
    monkeypatch.setattr(cpu_engine, "_fault", EngineFault.from_env())
    inp, truth = _one(bundled, "ex-memo.pdf-0")
    with pytest.raises(EngineDeadError, match="engine died"):
        _run(loop_thread, cpu_engine, model_protocol, replay_input(model_protocol, truth, inp, "fork"))
    assert marker.read_text().strip() == str(os.getpid())
    assert cpu_engine.num_unfinished_requests() == 0
    rec = _run(loop_thread, cpu_engine, model_protocol, replay_input(model_protocol, truth, inp, "fork"))
    assert rec.status == "ok"  # fired once: the marker stops it in this process and any restarted one
    assert EngineFault.from_env().fires() is False and EngineFault(1, str(tmp_path / "other")).fires() is True


# ---- where the CPU engine runs its model (EngineConfig.executor / cpu_threads) ---------------------------
def _engine_processes():
    import psutil

    return psutil.Process(os.getpid()).children(recursive=True)


def test_the_cpu_preset_runs_the_model_in_the_engine_core_process(cpu_engine):
    """cpu_engine_config: one engine core process and no worker process (the engine core would spin
    waiting on it). The engine core renames itself, which hides its environment from /proc, so the
    OMP_NUM_THREADS it starts with is checked through _spawn_env in the next test."""
    assert cpu_engine.cfg.executor == "uni" and cpu_engine.cfg.cpu_threads == 1
    procs = _engine_processes()
    names = [" ".join(p.cmdline()) or p.name() for p in procs]
    cores = [p for p, n in zip(procs, names) if "EngineCore" in n]
    assert cores, names
    assert not [n for n in names if "Worker" in n], names


def test_engine_args_name_the_executor_vllm_cannot_rewrite(tiny_model_dir, monkeypatch):
    from padoc_ray.engine.config import EngineConfig, cpu_engine_config
    from padoc_ray.engine.vllm_engine import UNIPROC_EXECUTOR, _spawn_env, engine_args

    assert engine_args(cpu_engine_config(tiny_model_dir), "v1").distributed_executor_backend == UNIPROC_EXECUTOR
    assert engine_args(cpu_engine_config(tiny_model_dir, executor="mp"), "v1").distributed_executor_backend == "mp"
    default = engine_args(EngineConfig(model=tiny_model_dir), "v1").distributed_executor_backend
    assert default not in (UNIPROC_EXECUTOR, "mp")  # None: vLLM decides
    for bad in ({"executor": "ray"}, {"executor": "uni", "tensor_parallel_size": 2}, {"cpu_threads": 0}):
        with pytest.raises(ValueError):
            EngineConfig(model=tiny_model_dir, **bad)
    for before in (None, "3"):
        if before is None:
            monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        else:
            monkeypatch.setenv("OMP_NUM_THREADS", before)
        with _spawn_env(cpu_engine_config(tiny_model_dir, cpu_threads=2)):
            assert os.environ["OMP_NUM_THREADS"] == "2"
        assert os.environ.get("OMP_NUM_THREADS") == before
        with _spawn_env(cpu_engine_config(tiny_model_dir, cpu_threads=None)):
            assert os.environ.get("OMP_NUM_THREADS") == before


def test_the_engine_returns_free_heap_to_the_os_in_its_core_and_here(bundled, cpu_engine, model_protocol,
                                                                      loop_thread):
    """The periodic heap release reaches vLLM's engine core (the CPU preset's worker runs there) through
    the worker extension, and the loop keeps releasing until it is cancelled."""
    import psutil
    import vllm

    from padoc_ray.engine.memory import RPC_METHOD, allocator

    mp = model_protocol
    inp, truth = _one(bundled, "ex-paper.pdf-0")
    _run(loop_thread, cpu_engine, mp, replay_input(mp, truth, inp, "fork"))  # a page through the engine
    assert cpu_engine._releaser is not None  # the first request started the periodic release

    outs = loop_thread.run(cpu_engine.llm.collective_rpc(RPC_METHOD), timeout=60)
    assert len(outs) == 1 and outs[0]["pid"] != os.getpid()
    core = psutil.Process(outs[0]["pid"])
    assert core.ppid() == os.getpid() and "EngineCore" in " ".join(core.cmdline())
    assert outs[0]["rss_after"] <= outs[0]["rss_before"]
    # the CPU preset's allocator: glibc's, unless vLLM preloads the tcmalloc its own CPU wheels bundle
    vllms_tcmalloc = glob.glob(os.path.join(os.path.dirname(vllm.__file__), "libs", "libtcmalloc*.so*"))
    assert outs[0]["allocator"] == ("tcmalloc" if vllms_tcmalloc else "glibc") and allocator() == "glibc"

    before = dict(cpu_engine.heap_releases)

    async def three_turns():  # counted in turns of the loop, not in seconds (a loaded machine is slow)
        task = asyncio.get_running_loop().create_task(cpu_engine._release_loop(0.05))
        try:
            while cpu_engine.heap_releases["releases"] < before["releases"] + 3:
                assert not task.done(), task  # the loop must keep going, not end (nor raise)
                await asyncio.sleep(0.05)
        finally:
            task.cancel()

    loop_thread.run(three_turns(), timeout=120)  # only a loop that stopped releasing runs into this
    assert cpu_engine.heap_releases["releases"] >= before["releases"] + 3
