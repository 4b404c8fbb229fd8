"""`padoc-ray bench soak`: a long run of mixed traffic against the online endpoint, watching for
leaks (RSS slope per process), server errors and lost or duplicated job pages.

It starts ``padoc-ray serve`` itself (:class:`~padoc_ray.bench.soak.procs.ServeProcess`), runs
``clients`` closed-loop HTTP clients for ``minutes`` (the mix: :data:`~padoc_ray.bench.soak.traffic.MIX`, requests in
:mod:`padoc_ray.bench.soak.traffic`), lets unfinished jobs drain, samples RSS all along, stops the
server with SIGTERM and writes the report (:func:`~padoc_ray.bench.soak.report.build_report`).
It talks only HTTP, so it measures whatever server the checkout has.
"""

from __future__ import annotations

import json
import os
import random
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from padoc_ray.knobs import knob
from padoc_ray.bench.soak.report import build_report, warmup_seconds
from padoc_ray.bench.soak.traffic import MIX, Client, Shared, drain_jobs, soak_inputs, write_replay_truth

ENGINES = ("noop", "vllm")



@dataclass(frozen=True, kw_only=True)
class SoakConfig:
    """Start `padoc-ray serve` (its own local Ray, a bearer token), run --clients closed-loop clients for
    --minutes with a mix of sync parses, NDJSON streams, jobs (some cancelled), chat completions, bad inputs (must
    get 4xx) and client disconnects, drain the jobs, stop the server with SIGTERM, and write the figures: RSS
    slope (MB/h, after the warm-up) of every Serve process, and the slope of its floor (each 5-minute window's
    lowest sample: what a leak raises and work in flight does not), 5xx (503 with Retry-After apart), lost jobs,
    duplicated job pages, latency per kind. Exits 1 when there were 5xx, lost jobs or duplicated pages. Defaults:
    half an hour of eight clients on the no-op engine."""

    minutes: float = 30.0  #: how long the clients send traffic
    clients: int = 8  #: concurrent closed-loop clients
    engine: str = "noop"  #: "noop" (no model work: the service's own overhead and leaks) or "vllm" (the tiny model)
    model: str | None = None  #: checkpoint directory (None: models/tiny)
    #: teacher-forcing truth (uploads named like the examples are forced with it); None: the examples'
    #: ground truth with the vllm engine, none with noop
    replay: str | None = None
    #: share of the run left out of the RSS slopes (at least a minute, at most half the run)
    warmup_fraction: float = 0.2
    sample_interval_s: float = 10.0  #: how often RSS is sampled
    drain_s: float = 120.0  #: after the traffic, how long unfinished jobs may take to finish
    request_timeout_s: float = 300.0  #: client-side timeout of one request
    seed: int = 0  #: the clients' random picks
    json: str | None = knob(None, metavar="OUT.json", help="write the report here", required=True)

    def __post_init__(self) -> None:
        if self.minutes <= 0 or self.clients < 1:
            raise ValueError("minutes must be > 0 and clients >= 1")
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if not 0 <= self.warmup_fraction < 1:
            raise ValueError("warmup_fraction must be in [0, 1)")
        if self.sample_interval_s <= 0 or self.drain_s < 0 or self.request_timeout_s <= 0:
            raise ValueError("sample_interval_s and request_timeout_s must be > 0, drain_s >= 0")


def replay_source(cfg: SoakConfig, examples_dir: str) -> str | None:
    """The teacher-forcing truth the run starts from (None: none)."""
    replay = cfg.replay or (os.path.join(examples_dir, "ground_truth.json") if cfg.engine == "vllm" else None)
    if replay and not os.path.isfile(replay):
        raise ValueError(f"--replay: {replay} does not exist")
    return replay


def serve_flags(cfg: SoakConfig, examples_dir: str, inputs, tmp: str) -> list[str]:
    """The ``padoc-ray serve`` flags of the run (besides --model, --port and --job-store). With a
    replay truth, the generated PDFs' pages are added to it (a copy in ``tmp``)."""

    flags = ["--engine", cfg.engine]
    replay = replay_source(cfg, examples_dir)
    if replay:
        flags += ["--replay", write_replay_truth(replay, inputs, os.path.join(tmp, "replay.json"))]
    return flags


def run(cfg: SoakConfig, root: str, log: Callable[[str], None] = print) -> dict:
    """The whole soak; ``root``: the checkout (for examples/ and models/tiny). Returns the report."""
    from padoc_ray.bench.soak.procs import RssSampler, ServeProcess

    model = cfg.model or os.path.join(root, "models", "tiny")
    if not os.path.isfile(os.path.join(model, "padoc_protocol.json")):
        raise ValueError(f"{model} is not a PaDoc checkpoint (no padoc_protocol.json)")
    examples = os.path.join(root, "examples")
    inputs = soak_inputs(examples)
    with tempfile.TemporaryDirectory(prefix="padoc-soak-truth-") as tmp:
        flags = serve_flags(cfg, examples, inputs, tmp)
        srv = ServeProcess(model, flags)
        sampler = None
        try:
            log(f"starting padoc-ray serve {' '.join(flags)} on port {srv.port}")
            t_ready = time.monotonic()
            srv.start()
            log(f"ready in {time.monotonic() - t_ready:.0f} s; {cfg.clients} clients for {cfg.minutes:g} min")
            shared = Shared(url=srv.url, token=srv.token, inputs=inputs, timeout_s=cfg.request_timeout_s)
            stop = threading.Event()
            clients = [Client(shared, random.Random(cfg.seed * 1000 + i), stop) for i in range(cfg.clients)]
            threads = [threading.Thread(target=c.loop, name=f"soak-client-{i}", daemon=True)
                       for i, c in enumerate(clients)]
            sampler = RssSampler(srv.proc.pid, cfg.sample_interval_s).start()
            t0 = time.monotonic()
            for t in threads:
                t.start()
            _wait(stop, t0 + cfg.minutes * 60, log, shared)
            for t in threads:
                t.join(cfg.request_timeout_s + 30)
            duration = time.monotonic() - t0
            series = sampler.stop()
            left = drain_jobs(shared, cfg.drain_s)
            log(f"traffic done: {len(shared.responses)} requests in {duration:.0f} s; "
                f"{left} jobs still unfinished after the drain")
        finally:
            stopped = srv.stop(list(sampler.seen.values()) if sampler else ())
            srv.close()
    warm = warmup_seconds(duration, cfg.warmup_fraction)
    server = {"flags": flags, "model": model, "replay_from": replay_source(cfg, examples), **stopped}
    return build_report(shared.responses, shared.jobs, series, duration_s=duration, warmup_s=warm, server=server,
                        anomalies=shared.anomalies,
                        config={**asdict(cfg), "mix": MIX, "inputs": sorted(inputs.good) + sorted(inputs.bad),
                                "drain_unsettled_jobs": left})


def _wait(stop: threading.Event, end: float, log, shared) -> None:
    """Until ``end``, a progress line a minute; then tell the clients to stop."""
    while not stop.wait(min(60.0, max(0.0, end - time.monotonic()))):
        if time.monotonic() >= end:
            break
        log(f"{len(shared.responses)} requests so far, {len(shared.jobs)} jobs")
    stop.set()



def main(cfg: SoakConfig) -> int:
    """Run it, write the report to ``cfg.json`` and print its headline figures; exit 1 when there were 5xx, lost jobs or duplicated pages."""
    from padoc_ray.bench import service_report

    report = service_report(cfg, run)
    keys = ("requests", "http_5xx", "http_503_retry_after", "jobs_lost", "job_pages_duplicated")
    print(json.dumps({**{k: report[k] for k in keys}, "rss_slope_mb_per_h": report["rss_slope_mb_per_h"],
                      "rss_floor_slope_mb_per_h": report["rss_floor_slope_mb_per_h"]}, indent=2))
    return 1 if report["http_5xx"] or report["jobs_lost"] or report["job_pages_duplicated"] else 0
