"""What the vLLM adapter hands each model runner: processors, trace replay, sampling parameters.

Model Runner V2 cannot run on CPU; these are its contracts, checked against vLLM 0.32's own code
(its loaders and its trace-replay rules). The V1 path is unchanged, and runs for real in the
engine tests."""

from __future__ import annotations

import logging
import os
import types

import pytest

from padoc_ray.engine.config import EngineConfig, cpu_engine_config
from padoc_ray.engine.interface import GenRequest, forced_token
from padoc_ray.engine.layout_mask import CONSTRAIN_LAYOUT_KEY
from padoc_ray.engine.runners import V1_PROCESSORS, V2_PROCESSORS, logits_processors, uses_trace_replay

from tests.helpers import components

TRACE = [11, 12, 13, 2]


def _req(**kw) -> GenRequest:
    base = dict(request_id="r", prompt_ids=[1, 2, 3], max_tokens=100, stop_token_ids=(2,))
    return GenRequest(**{**base, **kw})


def test_the_one_forcing_rule():
    assert [forced_token(TRACE, k) for k in range(6)] == [11, 12, 13, 2, None, None]
    assert forced_token(TRACE, -1) is None
    assert _req(forced_tokens=TRACE).generation_limit == 4  # a forced request ends with its trace
    assert _req(forced_tokens=TRACE, max_tokens=3).generation_limit == 3
    assert _req().generation_limit == 100


def test_forced_requests_end_where_vllms_trace_replay_ends_them():
    """vLLM's input processor caps a trace-replay request's max_tokens (input_processor.py,
    _normalize_trace_replay_params); generation_limit is the same rule, applied on both runners."""
    from vllm import SamplingParams
    from vllm.v1.engine.input_processor import InputProcessor

    stub = types.SimpleNamespace(model_config=types.SimpleNamespace(max_model_len=4096))
    for max_tokens in (2, 4, 100):
        sp = SamplingParams(max_tokens=max_tokens, trace_decode_token_ids=list(TRACE))
        InputProcessor._normalize_trace_replay_params(stub, sp, prompt_len=10)
        assert sp.max_tokens == _req(forced_tokens=TRACE, max_tokens=max_tokens).generation_limit


def test_v2_sampling_params_carry_forced_tokens_as_a_trace():
    from padoc_ray.engine.forcing import FORCED_TOKENS_KEY
    from padoc_ray.engine.vllm_engine import sampling_params

    sp = sampling_params(_req(forced_tokens=TRACE, constrain_layout_regions=7), "v2")
    assert sp.trace_decode_token_ids == TRACE and sp.max_tokens == 4
    assert sp.extra_args == {CONSTRAIN_LAYOUT_KEY: 7}  # no forcing key: no V1 processor is there to read it
    vocab = types.SimpleNamespace(get_vocab_size=lambda: 9280)  # vLLM's own checks of a trace request
    sp._validate_trace_replay(vocab, None)  # (n=1, ids in the vocabulary, no structured outputs ...)
    free = sampling_params(_req(), "v2")
    assert free.trace_decode_token_ids is None and free.extra_args is None and free.max_tokens == 100
    assert FORCED_TOKENS_KEY not in (sp.extra_args or {})


def test_v1_sampling_params_are_unchanged():
    from padoc_ray.engine.forcing import FORCED_TOKENS_KEY
    from padoc_ray.engine.vllm_engine import sampling_params

    sp = sampling_params(_req(forced_tokens=TRACE, constrain_layout_regions=7, temperature=1.0, seed=5), "v1")
    assert sp.trace_decode_token_ids is None
    assert sp.extra_args == {FORCED_TOKENS_KEY: TRACE, CONSTRAIN_LAYOUT_KEY: 7}
    assert (sp.max_tokens, sp.temperature, sp.seed, sp.stop_token_ids) == (4, 1.0, 5, [2])
    assert sampling_params(_req(), "v1").extra_args is None


@pytest.mark.parametrize("runner", ["v1", "v2"])
def test_a_chunked_branch_stream_reaches_vllm_on_both_runners(runner):
    """Branches stream in chunks (SchedulerConfig.branch_stream_interval): vLLM's per-request
    stream_interval, a frontend setting both runners share, allowed with a trace (MRv2's forcing)."""
    from vllm.sampling_params import RequestOutputKind

    from padoc_ray.engine.vllm_engine import sampling_params

    sp = sampling_params(_req(forced_tokens=TRACE, stream=True, stream_interval=64, seed=7), runner)
    assert sp.stream_interval == 64 and sp.output_kind == RequestOutputKind.DELTA and sp.seed == 7
    if runner == "v2":
        sp._validate_trace_replay(types.SimpleNamespace(get_vocab_size=lambda: 9280), None)
    # no interval for a final-only request, nor when none is asked for
    assert sampling_params(_req(stream=False, stream_interval=64), runner).stream_interval is None
    assert sampling_params(_req(stream=True), runner).stream_interval is None


def test_engine_arguments_per_runner(tiny_model_dir):
    from padoc_ray.engine.vllm_engine import engine_args

    v1 = engine_args(cpu_engine_config(tiny_model_dir), "v1")
    assert v1.logits_processors == list(V1_PROCESSORS) and not v1.enable_trace_replay
    v2 = engine_args(EngineConfig(model=tiny_model_dir), "v2")
    assert v2.logits_processors == list(V2_PROCESSORS) and v2.enable_trace_replay
    assert (v2.max_num_seqs, v2.max_num_batched_tokens, v2.enable_prefix_caching) == (384, 24576, True)
    # the processed-image LRU: small on CPU (it fills, and a page's branches are all it serves), vLLM's own on GPU
    assert v1.mm_processor_cache_gb == 0.25 and v2.mm_processor_cache_gb == 4
    with pytest.raises(ValueError, match="mm_processor_cache_gb"):
        EngineConfig(model=tiny_model_dir, mm_processor_cache_gb=-1)
    with pytest.raises(ValueError, match="onednn_primitive_cache"):
        EngineConfig(model=tiny_model_dir, onednn_primitive_cache=-1)

    # a user's own processors come after ours, on either runner
    mine = "my_pkg.procs:MyProcessor"
    own = engine_args(EngineConfig(model=tiny_model_dir, extra={"logits_processors": [mine]}), "v2")
    assert own.logits_processors == [*V2_PROCESSORS, mine]
    assert uses_trace_replay("v2") and not uses_trace_replay("v1")
    with pytest.raises(ValueError, match="model runner"):
        logits_processors("v3")


def test_the_runner_is_vllms_own_decision(tiny_model_dir, monkeypatch):
    from padoc_ray.engine.vllm_engine import engine_runner

    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    assert engine_runner(cpu_engine_config(tiny_model_dir)) == "v1"  # no Triton backend on CPU
    monkeypatch.setenv("VLLM_USE_V2_MODEL_RUNNER", "1")  # vLLM's own switch reaches its own rule
    with pytest.raises(Exception, match="Model Runner V2 requires Triton"):
        engine_runner(cpu_engine_config(tiny_model_dir))


def test_the_engines_own_counters_add_what_vllm_reports_per_step():
    """The adapter counts from its own stat logger, not from Prometheus's process-wide registry (a
    second engine in the process unregisters the first one's series there). vLLM builds a per-engine
    logger from the factory and calls ``record`` once per engine step."""
    from vllm.v1.metrics.loggers import PerEngineStatLoggerAdapter
    from vllm.v1.metrics.stats import IterationStats, PrefixCacheStats, SchedulerStats

    from padoc_ray.engine.vllm_engine import _counting_logger

    sink = dict.fromkeys(("generation_tokens", "queries", "hits", "steps", "running_seqs", "waiting_seqs",
                          "preempted", "prefill_tokens"), 0.0)
    logger = PerEngineStatLoggerAdapter(None, [0], _counting_logger(sink))  # vLLM's wrapping of the factory
    for queries, hits, gen, running, waiting, preempted, computed in (
            (48, 32, 1, 1, 2, 0, 16), (0, 0, 3, 3, 0, 1, 0), (16, 16, 2, 2, 0, 0, 0)):
        it = IterationStats()
        it.num_generation_tokens, it.num_preempted_reqs = gen, preempted
        it.prompt_token_stats.computed = computed
        logger.record(SchedulerStats(prefix_cache_stats=PrefixCacheStats(queries=queries, hits=hits),
                                     num_running_reqs=running, num_waiting_reqs=waiting), it, engine_idx=0)
    logger.record(None, None, engine_idx=0)  # a batch without stats changes nothing
    assert sink == {"generation_tokens": 6.0, "queries": 64.0, "hits": 48.0, "steps": 3.0, "running_seqs": 6.0,
                    "waiting_seqs": 2.0, "preempted": 1.0, "prefill_tokens": 16.0}


def test_the_engine_processes_get_onednns_kernel_cache_cap(tiny_model_dir, monkeypatch):
    """The CPU preset caps oneDNN's per-shape kernel cache for the processes the engine spawns (it grew the
    engine core for hours at oneDNN's 1024); the variable is set only while they start, then restored."""

    from padoc_ray.engine.vllm_engine import _spawn_env

    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "1024")
    cpu = cpu_engine_config(tiny_model_dir)
    assert cpu.onednn_primitive_cache == 8
    with _spawn_env(cpu):
        assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "8" and os.environ["OMP_NUM_THREADS"] == "1"
    assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024"
    with _spawn_env(EngineConfig(model=tiny_model_dir)):  # GPU: oneDNN's own
        assert os.environ["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] == "1024"


def test_the_cpu_presets_engine_processes_compile_nothing(tiny_model_dir, monkeypatch):
    """The CPU preset starts the engine's processes with torch.compile off (vLLM compiles its logprob rank
    count even when eager: a dynamo trace and a g++ build at each engine's first draft check); the GPU
    preset leaves vLLM its choice, and a variable the user set stands. (The real engine:
    tests/engine/scheduler/test_drafts_on_vllm.py.)"""
    from padoc_ray.engine.vllm_engine import _spawn_env

    monkeypatch.delenv("TORCH_COMPILE_DISABLE", raising=False)
    cpu = cpu_engine_config(tiny_model_dir)
    assert cpu.torch_compile is False and cpu.enforce_eager
    with _spawn_env(cpu):
        assert os.environ["TORCH_COMPILE_DISABLE"] == "1"
    assert "TORCH_COMPILE_DISABLE" not in os.environ
    with _spawn_env(EngineConfig(model=tiny_model_dir)):
        assert "TORCH_COMPILE_DISABLE" not in os.environ
    monkeypatch.setenv("TORCH_COMPILE_DISABLE", "1")
    with _spawn_env(EngineConfig(model=tiny_model_dir)):
        assert os.environ["TORCH_COMPILE_DISABLE"] == "1"


def test_an_engine_that_compiles_keeps_inductors_headers_past_its_temp_folder(tiny_model_dir, tmp_path, monkeypatch):
    """torch puts inductor's precompiled C++ headers in its folder in the temp folder, which is the engine's own
    (removed at shutdown) in the engine's processes: the folder they get there is a link to this process's, so
    the next engine start does not build them again; nothing is linked where nothing compiles."""
    import shutil
    import tempfile

    from torch._inductor import codecache  # where torch puts the headers: under that folder, wherever the cache is
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    from padoc_ray.engine.vllm_engine import _spawn_env

    home = default_cache_dir()
    assert codecache._HEADER_DIR == os.path.join(home, "precompiled_headers")
    compiling, eager = tmp_path / "compiling", tmp_path / "eager"
    for folder, cfg in ((compiling, EngineConfig(model=tiny_model_dir)), (eager, cpu_engine_config(tiny_model_dir))):
        folder.mkdir()
        with _spawn_env(cfg, str(folder)):
            assert os.environ["TMPDIR"] == str(folder)
    with monkeypatch.context() as m:  # what torch computes in an engine process, whose temp folder is the engine's
        m.setattr(tempfile, "tempdir", str(compiling))
        in_engine = default_cache_dir()
    assert in_engine.startswith(str(compiling)) and os.path.realpath(in_engine) == os.path.realpath(home)
    assert os.listdir(eager) == []
    shutil.rmtree(compiling)  # what the engine's shutdown does: the link goes, the headers' folder stays
    assert os.path.isdir(home)


def test_the_engine_processes_bind_their_sockets_in_the_engines_temp_folder(tiny_model_dir, monkeypatch):
    """vLLM's ZeroMQ sockets (VLLM_RPC_BASE_PATH) go in the engine's temp folder while its processes start,
    so they are removed with it; a folder the user chose stands, and so does vLLM's default where a
    socket's path would be longer than Unix allows. (The real engine: tests/engine/host/test_page_host_on_vllm.py.)"""
    from padoc_ray.engine.vllm_engine import UNIX_SOCKET_PATH_MAX, _spawn_env

    cfg = cpu_engine_config(tiny_model_dir)
    folder = "/tmp/padoc-engine-k2x9q1zw"  # what tempfile.mkdtemp makes in /tmp (the block only names it)
    monkeypatch.delenv("VLLM_RPC_BASE_PATH", raising=False)
    with _spawn_env(cfg, folder):
        assert os.environ["VLLM_RPC_BASE_PATH"] == folder and os.environ["TMPDIR"] == folder
    assert "VLLM_RPC_BASE_PATH" not in os.environ
    with _spawn_env(cfg):  # no folder of its own: vLLM's default
        assert "VLLM_RPC_BASE_PATH" not in os.environ
    longest = folder + "d" * (UNIX_SOCKET_PATH_MAX - len(folder) - 37)  # + "/<uuid4>": 107 bytes
    too_long = longest + "x"
    with _spawn_env(cfg, longest):
        assert os.environ["VLLM_RPC_BASE_PATH"] == longest
    with _spawn_env(cfg, too_long):  # a long TMPDIR: the folder still, the sockets where vLLM puts them
        assert "VLLM_RPC_BASE_PATH" not in os.environ and os.environ["TMPDIR"] == too_long
    monkeypatch.setenv("VLLM_RPC_BASE_PATH", "/run/mine")
    with _spawn_env(cfg, folder):
        assert os.environ["VLLM_RPC_BASE_PATH"] == "/run/mine"


def test_the_heap_release_is_on_by_default_and_its_extension_reaches_vllm(tiny_model_dir):
    from padoc_ray.engine.memory import EXTENSION, FreeHeapExtension, RPC_METHOD
    from padoc_ray.engine.vllm_engine import engine_kwargs

    assert EngineConfig(model=tiny_model_dir).release_free_heap_s == 60.0
    assert engine_kwargs(cpu_engine_config(tiny_model_dir))["worker_extension_cls"] == EXTENSION
    assert "worker_extension_cls" not in engine_kwargs(cpu_engine_config(tiny_model_dir, release_free_heap_s=None))
    mine = engine_kwargs(EngineConfig(model=tiny_model_dir, extra={"worker_extension_cls": "my.Ext"}))
    assert mine["worker_extension_cls"] == "my.Ext"  # a user's own wins
    assert callable(getattr(FreeHeapExtension, RPC_METHOD))
    for bad in (0, -5):
        with pytest.raises(ValueError, match="release_free_heap_s"):
            EngineConfig(model=tiny_model_dir, release_free_heap_s=bad)


@pytest.mark.parametrize("allocator", ["glibc", "tcmalloc"])
def test_releasing_free_heap_returns_freed_pages_that_free_alone_keeps(allocator):
    """Both allocators keep freed blocks below a live one; the release hands their pages back (glibc's
    malloc_trim, tcmalloc's ReleaseFreeMemory when it is preloaded). A fresh process, so nothing else
    allocates meanwhile."""
    import json
    import subprocess
    import sys

    env = dict(os.environ)
    env.pop("LD_PRELOAD", None)
    if allocator == "tcmalloc":
        env["LD_PRELOAD"] = components.tcmalloc()  # without it: a skip, a failure on CI
    code = (
        "import json\n"
        "from padoc_ray.engine.memory import release_free_heap, _rss_bytes\n"
        "blocks = [bytearray(100_000) for _ in range(2000)]\n"  # 200 MB of heap blocks (under the mmap threshold)
        "for b in blocks: b[::4096] = b'x' * len(b[::4096])\n"  # touched: resident
        "keep = blocks[-1]; del blocks\n"  # the last block pins the heap's top
        "kept = _rss_bytes()\n"
        "print(json.dumps({'kept': kept, 'release': release_free_heap()}))\n")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    out = json.loads(run.stdout)
    rel = out["release"]
    assert rel["allocator"] == allocator
    assert rel["rss_before"] >= out["kept"] - (8 << 20)  # freeing alone gave (almost) nothing back
    assert rel["rss_before"] - rel["rss_after"] > 150 << 20, rel  # the release returned the freed 200 MB


def test_the_allocator_setting_preloads_its_library_for_the_engine_processes_only(tiny_model_dir, monkeypatch,
                                                                                tmp_path, caplog):
    """``allocator`` becomes LD_PRELOAD inside the engine's spawn block and is restored after it; a
    tcmalloc the user preloads already stands; a missing library is an error, a missing tcmalloc a
    warning (the engine then runs on glibc)."""
    from padoc_ray.engine import memory
    from padoc_ray.engine.interface import EngineError
    from padoc_ray.engine.vllm_engine import _spawn_env

    assert memory.preload_value("/x/libtc.so", None) == "/x/libtc.so"
    assert memory.preload_value("/x/libtc.so", "/a/liba.so /b/libb.so") == "/x/libtc.so:/a/liba.so:/b/libb.so"
    tc = "/x/libtcmalloc_minimal.so.4"
    assert memory.preload_value(tc, "/y/libtcmalloc.so.4:/a/liba.so") is None  # the user's tcmalloc stands
    assert memory.preload_value("/x/libtc.so", "/y/libtcmalloc.so.4") == "/x/libtc.so:/y/libtcmalloc.so.4"
    assert memory.preload_value("/x/libtc.so", "/x/libtc.so") is None
    with pytest.raises(ValueError, match="allocator"):
        EngineConfig(model=tiny_model_dir, allocator="jemalloc")  # neither "tcmalloc" nor a path
    assert cpu_engine_config(tiny_model_dir).allocator is None  # measured and kept off (glibc)

    lib = tmp_path / "liballoc.so"
    lib.write_bytes(b"")
    monkeypatch.setenv("LD_PRELOAD", "/a/liba.so")
    with _spawn_env(EngineConfig(model=tiny_model_dir, allocator=str(lib))):
        assert os.environ["LD_PRELOAD"] == f"{lib}:/a/liba.so"
    assert os.environ["LD_PRELOAD"] == "/a/liba.so"
    with pytest.raises(EngineError, match="no such library file"):
        with _spawn_env(EngineConfig(model=tiny_model_dir, allocator=str(tmp_path / "missing.so"))):
            pass

    find_tcmalloc = memory.find_tcmalloc
    monkeypatch.setattr(memory, "find_tcmalloc", lambda: None)
    with caplog.at_level(logging.WARNING, logger="padoc_ray.engine.vllm_engine"):
        with _spawn_env(EngineConfig(model=tiny_model_dir, allocator="tcmalloc")):
            assert os.environ["LD_PRELOAD"] == "/a/liba.so"  # no tcmalloc here: unchanged
    assert "libtcmalloc-minimal4" in caplog.text
    monkeypatch.setattr(memory, "find_tcmalloc", find_tcmalloc)
    found = components.tcmalloc()  # make test installs Debian's libtcmalloc-minimal4: else a skip (CI: a failure)
    with _spawn_env(EngineConfig(model=tiny_model_dir, allocator="tcmalloc")) as preload:
        assert preload == os.environ["LD_PRELOAD"] == f"{found}:/a/liba.so" and os.path.isfile(found)


def test_vllms_logging_set_up_leaves_the_processs_memory_handlers_their_targets(tmp_path):
    """vLLM's dictConfig closes every handler of the process; a MemoryHandler closed keeps each record
    from then on (Ray Serve's replica logger is one). Around the engine's set-up they get their targets
    back, and a file target reopens. A fresh process: dictConfig would close pytest's handlers too."""
    import json
    import subprocess
    import sys

    log = tmp_path / "replica.log"
    code = f"""
import json, logging, logging.handlers
from vllm.config.logging import LoggingConfig
from vllm.logger import configure_logging
from padoc_ray.engine.vllm_engine import _kept_memory_handlers

def buffered(name, target):
    lg = logging.getLogger(name)
    lg.propagate = False
    lg.setLevel(logging.INFO)
    mh = logging.handlers.MemoryHandler(capacity=1, target=target)
    lg.addHandler(mh)
    return lg, mh

bare, bare_mh = buffered("bare", logging.NullHandler())
configure_logging(LoggingConfig(configure_logging=True))
for i in range(3):
    bare.info("lost %d", i)
kept, kept_mh = buffered("kept", logging.handlers.RotatingFileHandler({str(log)!r}, maxBytes=1 << 20))
with _kept_memory_handlers():
    configure_logging(LoggingConfig(configure_logging=True))
for i in range(3):
    kept.info("kept %d", i)
print(json.dumps({{"bare_target": repr(bare_mh.target), "bare_buffer": len(bare_mh.buffer),
                  "kept_buffer": len(kept_mh.buffer)}}))
"""
    out = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    check=True).stdout.splitlines()[-1])
    # why: without the guard vLLM's set-up leaves the handler without a target, keeping every record
    assert out["bare_target"] == "None" and out["bare_buffer"] == 3, out
    assert out["kept_buffer"] == 0, out
    assert log.read_text().split() == ["kept", "0", "kept", "1", "kept", "2"]
