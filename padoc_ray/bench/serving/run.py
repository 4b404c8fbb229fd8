"""The serving benchmark (`padoc-ray bench serve`; `bench replay` is its short form): fork vs
sequential on one engine, on one fixed page set, in closed loops keeping C pages in flight.

Pages come from OmniDocBench-format ground truth (the demo pages, synthetic corpus pages, ...):
each page image is one request, teacher-forced with its truth so a random-weight model does a
trained model's work with real document lengths. A real checkpoint runs the same command with
``replay=False`` (``--no-replay``): the model generates freely and the truth only names the pages.
For each concurrency C and mode, every page runs once through C workers (a worker takes the next
page as soon as its previous one finishes), after ``warmup`` untimed pages per mode. Targets: a
:class:`~padoc_ray.host.PageHost` in this process (``direct``), or the Serve application on a local
Ray over HTTP (``http``: the same pages, so the HTTP cost shows).

Measured here: per page, its status, validity and latency (from sending it to its record); per run,
the wall time and the engine's generation-token counter every 0.2 s (direct only). The figures and
report files are made by :mod:`padoc_ray.perfmodel.table3`. Holds no engine or scheduler code.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from padoc_ray.perfmodel.table3 import (
    STEP_COUNTERS,
    add_pairs,
    format_markdown,
    legacy_summary,
    mode_row,
    plot_report,
    quantile,
)
from padoc_ray.bench.serving.pages import BenchPage, PageSetError, bench_truth, load_page_sets
from padoc_ray.bench.steps.run import StepsConfig
from padoc_ray.knobs import comma_items, comma_text, knob, negate
from padoc_ray.protocol import Page, quantized

__all__ = [
    "BenchPage",
    "ModeError",
    "PageSetError",
    "ServeBenchConfig",
    "bench_truth",
    "checkpoint_modes",
    "host_config",
    "legacy_summary",
    "load_page_sets",
    "quantile",
    "run",
    "run_bench",
]

TARGETS = ("direct", "http")
#: tokens each probe request decodes: bench steps' default --tokens, which its own probe uses
SPEED_PROBE_TOKENS = StepsConfig.tokens
_EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))),
                         "examples")


@dataclass(frozen=True, kw_only=True)
class ServeBenchConfig:
    """One benchmark run. Defaults: the paper's serving benchmark (Table 3, Appendix E.3)."""

    #: closed-loop levels (pages in flight)
    concurrency: tuple[int, ...] = knob((16, 32, 64, 128, 256), parse="ints", note="comma list")
    #: use the first N pages of the set (the paper's subset size); None: all
    pages: int | None = knob(384, metavar="N", note="all when fewer exist")
    #: decode modes to run, comma list
    modes: tuple[str, ...] = knob(("fork", "sequential"), from_field=comma_text, to_field=comma_items)
    warmup: int = 2  #: untimed pages per mode before the timed runs (the paper: two warm-up requests)
    #: "direct" (a PageHost here) or "http" (the Serve endpoint on a local Ray)
    target: str = knob("direct", choices=("direct", "http"))
    sample_interval_s: float = 0.2  #: how often the engine's generation-token counter is read
    peak_window_s: float = 10.0  #: window of the peak output-token rate
    http_timeout_s: float = 3600.0  #: per HTTP request (client and service)
    #: teacher-force every page with its truth (a random-weight model then does a trained model's work);
    #: False: the model generates freely and the truth only picks the page set (a real checkpoint)
    replay: bool = knob(True, flags=("--no-replay",), dest="no_replay", action="store_true", to_field=negate,
                        from_field=negate,
                        help="let the model generate freely (a real checkpoint): the ground truth then only names "
                             "the pages (default: teacher-force every page with its truth, so the tiny "
                             "random-weight model does a trained model's work)")
    #: before and after every cell, time bench steps' speed probe (a batch of 16 teacher-forced requests on the
    #: same engine): rows get speed_probe_step_ms, which bench model --compare uses to cancel this machine's drift
    #: between the bench steps run and this one (direct target only)
    speed_probe: bool = False
    #: the probe's page image: bench steps' --image (its prompt length must be the same for the probes to compare)
    speed_probe_image: str = os.path.join(_EXAMPLES, "paper.pdf")
    #: the folder of the page set's source PDFs (each truth's page_info.source_pdf): every page carries its
    #: text layer, so --text-layer speculate drafts from it (direct target only); None: image pages, no drafts
    pdfs: str | None = knob(None, metavar="DIR")

    def __post_init__(self) -> None:
        if self.speed_probe and self.target != "direct":
            raise ValueError("speed_probe needs the direct target (the probe runs on this process's engine)")
        if self.pdfs is not None and self.target != "direct":
            raise ValueError("pdfs needs the direct target (an HTTP upload of a page image has no text layer)")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError("concurrency levels must be positive integers")
        if self.pages is not None and self.pages < 1:
            raise ValueError("pages must be >= 1")
        if not self.modes or not set(self.modes) <= {"fork", "sequential"}:
            raise ValueError("modes are fork and/or sequential")
        if self.warmup < 0:
            raise ValueError("warmup must be >= 0")
        if self.target not in TARGETS:
            raise ValueError(f"target must be one of {', '.join(TARGETS)}")
        if self.sample_interval_s <= 0 or self.peak_window_s <= 0 or self.http_timeout_s <= 0:
            raise ValueError("sample_interval_s, peak_window_s and http_timeout_s must be > 0")


def host_config(*, pages_in_flight: int, max_tokens: int | None = None, max_branches: int | None = None,
                max_num_seqs: int | None = None, layout_priority: bool = False, page_priority: bool = False,
                max_live_branches: int | None = None, stream_branches: bool = False, constrain_layout: bool = False):
    """The benchmark's :class:`~padoc_ray.host.HostConfig` (None: the config dataclasses' defaults)."""
    from padoc_ray.host import HostConfig
    from padoc_ray.scheduler import SchedulerConfig

    overrides: dict = {}  # the host asks for priority scheduling when a priority knob is on
    if max_num_seqs:
        overrides["max_num_seqs"] = max_num_seqs
    sched = {k: v for k, v in (("max_tokens", max_tokens), ("max_branches", max_branches)) if v is not None}
    return HostConfig(engine_overrides=overrides, pages_in_flight=pages_in_flight, max_live_branches=max_live_branches,
                      scheduler=SchedulerConfig(**sched, layout_priority=layout_priority, page_priority=page_priority,
                                                stream_branches=stream_branches, constrain_layout=constrain_layout))


def _decode(data: bytes):
    import io

    from PIL import Image

    with Image.open(io.BytesIO(data)) as img:
        return img.convert("RGB")


# ---- targets ----------------------------------------------------------------------------------------------
class DirectTarget:
    """Pages straight into a started :class:`~padoc_ray.host.PageHost` (its truth: :func:`bench_truth`)."""

    name = "direct"

    def __init__(self, host):
        self.host = host
        self._truth: dict[str, Page] = {}

    def counters(self) -> dict[str, float]:
        out: dict[str, float] = {}
        for name in ("prefix_cache_counters", "step_counters"):
            get = getattr(self.host.engine, name, None)
            out.update(get() if get else {})
        return out

    def generation_tokens(self) -> float | None:
        get = getattr(self.host.engine, "generation_tokens", None)
        return get() if get else None

    async def speed_probe(self, image_path: str) -> float:
        """bench steps' speed probe (ms per decode step) on this host's engine."""
        from padoc_ray.bench.steps.run import page_image, speed_probe

        if not hasattr(self, "_probe_image"):
            self._probe_image = page_image(image_path)
        return await speed_probe(self.host.engine, self.host.model_protocol, self._probe_image,
                                 tokens=SPEED_PROBE_TOKENS)

    async def run(self, page: BenchPage, mode: str, tag: str, i: int) -> dict:
        from padoc_ray.host import PageRequest

        img = await asyncio.to_thread(_decode, page.data)
        t = time.perf_counter()
        # the run's tag as tenant, the page's position as salt: no run profits from another run's cache
        rec = await self.host.parse(PageRequest(doc_id=page.doc_id, page_index=0, image=img, source_name=page.name,
                                             mode=mode, tenant=tag, salt=str(i), text_layer=page.text_layer))
        e2e = time.perf_counter() - t
        if page.name not in self._truth:
            self._truth[page.name] = quantized(page.truth, self.host.model_protocol.vocab,
                                               (rec.page.width, rec.page.height))
        return {"t_send": t, "e2e_s": e2e, "status": rec.status, "valid": rec.valid, "ttft_s": rec.ttft_s,
                "output_tokens": rec.output_tokens, "prompt_tokens": rec.prompt_tokens,
                "cached_tokens": rec.cached_tokens, "n_branches": rec.n_branches, "f_seq": rec.f_seq,
                "f_padoc": rec.f_padoc, "equals_truth": rec.page.regions == self._truth[page.name].regions,
                "injected_loops": rec.injected_loops, "text_layer": rec.text_layer,
                "draft_tokens": sum(rec.region_draft_tokens), "accepted_tokens": sum(rec.region_accepted_tokens)}


class HttpTarget:
    """Pages as one-image documents to ``POST /v1/parse`` (threads of blocking clients). A page's
    latency is the client's: upload, rendering (the service shrinks images to its render size,
    1600 px on the longest side by default), the engine, the JSON answer. The engine's counters are
    out of reach, so token rates and the cache hit rate come from the pages' records."""

    name = "http"

    def __init__(self, url: str, token: str, threads: int, timeout_s: float):
        import concurrent.futures as cf
        import threading

        self.url, self.token, self.timeout_s = url, token, timeout_s
        self.pool = cf.ThreadPoolExecutor(threads, thread_name_prefix="bench-http")
        self.local = threading.local()

    def counters(self) -> dict[str, float]:
        return {}

    def generation_tokens(self) -> float | None:
        return None

    def _post(self, page: BenchPage, mode: str) -> dict:
        import requests

        s = getattr(self.local, "s", None) or requests.Session()
        self.local.s = s
        t = time.perf_counter()
        try:
            r = s.post(f"{self.url}/v1/parse", params={"mode": mode}, headers={"Authorization": f"Bearer {self.token}"},
                       files={"file": (page.name, page.data, "application/octet-stream")}, timeout=self.timeout_s)
            e2e = time.perf_counter() - t
            row = r.json()["pages"][0] if r.status_code == 200 and r.json().get("pages") else None
        except (requests.RequestException, ValueError) as e:
            return {"t_send": t, "e2e_s": time.perf_counter() - t, "status": f"client_{type(e).__name__}",
                    "valid": False}
        if row is None:
            return {"t_send": t, "e2e_s": e2e, "status": f"http_{r.status_code}", "valid": False}
        out = {"t_send": t, "e2e_s": e2e, "status": row["status"], "valid": bool(row.get("valid")),
               "equals_truth": None, "injected_loops": None}  # the page row does not say; see --target direct
        for k in ("ttft_s", "output_tokens", "prompt_tokens", "cached_tokens", "n_branches", "f_seq", "f_padoc"):
            out[k] = row.get(k)
        return out

    async def run(self, page: BenchPage, mode: str, tag: str, i: int) -> dict:
        return await asyncio.get_running_loop().run_in_executor(self.pool, self._post, page, mode)

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


# ---- the closed loop --------------------------------------------------------------------------------------
async def closed_loop(target, pages: Sequence[BenchPage], mode: str, concurrency: int, tag: str, *,
                      sample_s: float | None = None, on_page: Callable[[], None] | None = None
                      ) -> tuple[list[dict], float, list[tuple[float, float]]]:
    """Every page once through ``concurrency`` workers. Returns (results in page order, wall
    seconds, generation-token counter samples (seconds from the start, tokens) when readable)."""
    results: list[dict | None] = [None] * len(pages)
    samples: list[tuple[float, float]] = []
    nxt = 0
    t0 = time.perf_counter()

    async def worker():
        nonlocal nxt
        while nxt < len(pages):
            i = nxt
            nxt += 1
            p = pages[i]
            r = await target.run(p, mode, tag, i)
            r["t_start"] = round(r.pop("t_send") - t0, 4)
            r["t_end"] = round(r["t_start"] + r["e2e_s"], 4)
            results[i] = {"page": p.name, **r}
            if on_page:
                on_page()

    async def sampler():
        while True:
            c = target.generation_tokens()
            if c is None:
                return
            samples.append((time.perf_counter() - t0, c))
            await asyncio.sleep(sample_s)

    sam = asyncio.create_task(sampler()) if sample_s else None
    try:
        await asyncio.gather(*(worker() for _ in range(max(1, concurrency))))
    finally:
        if sam is not None:
            sam.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sam
    wall = time.perf_counter() - t0
    if sam is not None and samples:
        samples.append((wall, target.generation_tokens()))
    return [r for r in results if r is not None], wall, samples


def _progress(total: int):
    try:
        from tqdm import tqdm
    except ImportError:  # no bar, same figures
        return None
    return tqdm(total=total, file=sys.stderr, unit="page", dynamic_ncols=True, desc="bench serve")


async def run_bench(target, pages: Sequence[BenchPage], cfg: ServeBenchConfig, out_dir: str, *,
                    header: dict | None = None, log: Callable[[str], None] = print) -> dict:
    """Warm-up, then every (C, mode) run; writes ``report.json``, ``report.md``, ``pages.jsonl``
    and the PNG plots into ``out_dir``; returns the report."""
    os.makedirs(out_dir, exist_ok=True)
    for mode in cfg.modes:  # warm-up: not timed
        await closed_loop(target, pages[:cfg.warmup], mode, 1, f"warm-{mode}")
    bar = _progress(len(cfg.modes) * len(cfg.concurrency) * len(pages))
    say = bar.write if bar is not None else log
    rows: list[dict] = []
    results: dict[tuple[str, int], list[dict]] = {}
    try:
        with open(os.path.join(out_dir, "pages.jsonl"), "w", encoding="utf-8") as pj:
            for c in cfg.concurrency:
                for mode in cfg.modes:
                    if bar is not None:
                        bar.set_postfix_str(f"C={c} {mode}")
                    probe = [await target.speed_probe(cfg.speed_probe_image)] if cfg.speed_probe else []
                    before = target.counters()
                    recs, wall, samples = await closed_loop(target, pages, mode, c, f"c{c}-{mode}",
                                                            sample_s=cfg.sample_interval_s,
                                                            on_page=bar.update if bar is not None else None)
                    after = target.counters()
                    if cfg.speed_probe:
                        probe.append(await target.speed_probe(cfg.speed_probe_image))
                    cache = {k: after.get(f"prefix_cache_{k}", 0) - before.get(f"prefix_cache_{k}", 0)
                             for k in ("queries", "hits")} if after else None
                    steps = {k: after[k] - before.get(k, 0) for k in STEP_COUNTERS if k in after} or None
                    results[(mode, c)] = recs
                    row = mode_row(recs, wall, mode, c, samples=samples, cache=cache, window_s=cfg.peak_window_s,
                                   steps=steps)
                    if probe:  # the machine's speed around this cell (before, after)
                        row["speed_probe_step_ms"] = round(sum(probe) / len(probe), 3)
                        row["speed_probe_runs_ms"] = probe
                    rows.append(row)
                    for r in recs:
                        pj.write(json.dumps({"concurrency": c, "mode": mode, **r}) + "\n")
                    say(f"C={c:<3} {mode:<10} {row['valid_pages_per_s']:.3f} valid pages/s  "
                        f"p50 {row['p50_e2e_s'] or 0:.2f}s  p95 {row['p95_e2e_s'] or 0:.2f}s  "
                        f"valid {row['valid_pages']}/{row['pages']}  {row['mean_output_tokens_per_s']:.0f} tok/s")
    finally:
        if bar is not None:
            bar.close()
    add_pairs(rows, results)
    report = {**(header or {}), "config": {**(header or {}).get("config", {}), "target": cfg.target,
                                           "concurrency": list(cfg.concurrency), "modes": list(cfg.modes),
                                           "warmup": cfg.warmup, "peak_window_s": cfg.peak_window_s,
                                           "replay": cfg.replay, "speed_probe": cfg.speed_probe,
                                           "speed_probe_image": cfg.speed_probe_image if cfg.speed_probe else None,
                                           "speed_probe_tokens": SPEED_PROBE_TOKENS if cfg.speed_probe else None},
              "rows": rows}
    try:
        report["plots"] = plot_report(report, out_dir)
    except ImportError as e:  # matplotlib is an optional extra
        report["plots"] = []
        log(f"no plots: {e}")
    with open(os.path.join(out_dir, "report.json"), "w") as f:
        json.dump(report, f, indent=2)
    with open(os.path.join(out_dir, "report.md"), "w") as f:
        f.write(format_markdown(report))
    return report


# ---- one whole run --------------------------------------------------------------------------------------
def _header(model: str, pages: Sequence[BenchPage], sets: list[dict], cfg: ServeBenchConfig, host_cfg) -> dict:
    used = len(pages)
    return {"config": {"model": model, "host": {"pages_in_flight": host_cfg.pages_in_flight,
                                                "max_live_branches": host_cfg.max_live_branches,
                                                "engine_overrides": dict(host_cfg.engine_overrides),
                                                "max_tokens": host_cfg.scheduler.max_tokens,
                                                "max_branches": host_cfg.scheduler.max_branches,
                                                "layout_priority": host_cfg.scheduler.layout_priority,
                                                "page_priority": host_cfg.scheduler.page_priority,
                                                "stream_branches": host_cfg.scheduler.stream_branches}},
            "pages": {"requested": cfg.pages or used, "used": used, "sets": sets, "names": [p.name for p in pages]}}


async def _run_direct(model: str, pages, cfg, host_cfg, out_dir, header, log, engine=None) -> dict:
    """The direct target's run on a PageHost of this process; ``engine``: a running engine for the host to
    share (left running afterwards), None: the host starts its own."""
    from padoc_ray.host import PageHost

    host = await PageHost(model, host_cfg, truth=bench_truth(pages) if cfg.replay else None, engine=engine).start()
    try:
        ec = getattr(host.engine, "cfg", None)
        if ec is not None:
            header["engine"] = (f"max_num_seqs {ec.max_num_seqs}, max_num_batched_tokens {ec.max_num_batched_tokens}, "
                                f"dtype {ec.dtype}, scheduling {ec.scheduling_policy}, "
                                f"allocator {getattr(host.engine, 'allocator_library', None) or 'unchanged'}")
        return await run_bench(DirectTarget(host), pages, cfg, out_dir, header=header, log=log)
    finally:
        host.shutdown()
        await asyncio.sleep(0.2)


def _run_http(model: str, pages, cfg, host_cfg, out_dir, header, log) -> dict:
    from padoc_ray.bench.serving.http import local_service

    c = max(cfg.concurrency)
    with tempfile.TemporaryDirectory(prefix="padoc-bench-") as tmp:
        merged = None
        if cfg.replay:  # one replay truth for the service: every set's pages
            objs = []
            for gt in dict.fromkeys(p.gt for p in pages):
                with open(gt, encoding="utf-8") as f:
                    objs += json.load(f)
            merged = os.path.join(tmp, "gt.json")
            with open(merged, "w", encoding="utf-8") as f:
                json.dump(objs, f)
        serve_kw = dict(engine_max_ongoing=c, engine_max_queued=max(256, c), ingress_max_ongoing=c,
                        ingress_max_queued=max(64, c), request_timeout_s=cfg.http_timeout_s)
        with local_service(model, merged, host_cfg, **serve_kw) as (url, token):
            header["engine"] = f"Serve app at {url} (engine replica: the machine's preset)"
            target = HttpTarget(url, token, c, cfg.http_timeout_s)
            try:
                return asyncio.run(run_bench(target, pages, cfg, out_dir, header=header, log=log))
            finally:
                target.close()


class ModeError(ValueError):
    """The checkpoint has none of the modes asked for (an hpd checkpoint asked for sequential only)."""


def checkpoint_modes(model: str, modes: Sequence[str]) -> tuple[tuple[str, ...], dict[str, str]]:
    """``modes`` split by what the checkpoint in ``model`` can run: (those it has, in order; {each
    other mode: why not}). An HPD-Parsing checkpoint (family hpd) has fork only, so its benchmark
    is fork alone. A folder whose family cannot be told keeps every mode (the host says what is wrong)."""
    from padoc_ray.host import family_of
    from padoc_ray.protocol.family import check_mode

    family = family_of(model)
    if family is None:
        return tuple(modes), {}
    kept, skipped = [], {}
    for m in modes:
        try:
            check_mode(family, m)
        except ValueError as e:
            skipped[m] = str(e).replace("--mode ", "mode ")  # the family's reason, for any flag spelling
        else:
            kept.append(m)
    return tuple(kept), skipped


def run(sets: Sequence[tuple[str, str]], model: str, cfg: ServeBenchConfig, host_cfg, out_dir: str,
        log: Callable[[str], None] = print) -> dict:
    """Load the page set and run the benchmark on ``cfg.target``; returns the report. Modes the
    checkpoint lacks (hpd: sequential) are left out, with why in the report (``config.modes_skipped``);
    :class:`ModeError` when none is left."""
    modes, skipped = checkpoint_modes(model, cfg.modes)
    if not modes:
        raise ModeError("; ".join(f"--modes {m}: {why}" for m, why in skipped.items()))
    if skipped:
        cfg = dataclasses.replace(cfg, modes=modes)
        for m, why in skipped.items():
            log(f"bench: {m} left out ({why}); running {', '.join(modes)} only")
    pages, info = load_page_sets(sets, cfg.pages, pdfs=cfg.pdfs)
    if cfg.pages and len(pages) < cfg.pages:
        log(f"{len(pages)} pages in the set, fewer than the {cfg.pages} asked for: using all {len(pages)}")
    header = _header(model, pages, info, cfg, host_cfg)
    if skipped:
        header["config"]["modes_skipped"] = skipped
    if cfg.target == "http":
        return _run_http(model, pages, cfg, host_cfg, out_dir, header, log)
    return asyncio.run(_run_direct(model, pages, cfg, host_cfg, out_dir, header, log))
