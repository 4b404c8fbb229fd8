"""``padoc-ray serve``: the online endpoint on a local Ray, in the foreground."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
import time
import urllib.error
import urllib.request

from padoc_ray.cli.common import add_command, die, positive
from padoc_ray.cli.flags import add_fields, add_mode, add_scheduler_flags, from_args, scheduler_from_args

DESCRIPTION = """Serve PaDoc parsing over HTTP on a local Ray cluster (Ray Serve): one engine replica
hosting vLLM with the layout-fork scheduler, and a FastAPI ingress that renders uploads and answers
POST /v1/parse (multipart field `file`, or JSON; ?stream=true for NDJSON), async jobs at /v1/jobs,
the OpenAI-compatible POST /v1/chat/completions, GET /v1/models, /healthz, /readyz and /docs.
Prints the URL once /readyz answers, and stops cleanly on Ctrl-C or SIGTERM. Bearer-token auth
when the environment variable PADOC_RAY_API_TOKEN is set. For a cluster, deploy cluster/serve.yaml
with `serve deploy` instead."""


def _replicas(text: str) -> tuple[int, int]:
    parts = text.split(",")
    try:
        lo, hi = (int(parts[0]), int(parts[-1])) if len(parts) <= 2 else (None, None)
    except ValueError:
        lo = hi = None
    if lo is None or not 1 <= lo <= hi:
        raise argparse.ArgumentTypeError(f"expected N or MIN,MAX with 1 <= MIN <= MAX, got {text!r}")
    return lo, hi


def register(sub) -> None:
    from padoc_ray.host import HostConfig
    from padoc_ray.raster.document import InputLimits
    from padoc_ray.serve.config import ServeConfig
    from padoc_ray.storage import StorageConfig

    d = ServeConfig(model="-")
    s = add_command(sub, "serve", help="the online HTTP endpoint (Ray Serve) on a local Ray", description=DESCRIPTION,
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--model", required=True, help="checkpoint directory (or s3:// URI): a PaDoc checkpoint "
                                                  "(padoc_protocol.json), an HPD-Parsing one (family hpd: fork only) or a "
                                                  "dots.ocr one (family dots: grounding branches; fork and sequential)")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    s.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    add_fields(s, ServeConfig, ("allowed_hosts", "replay_gt"), base=d)
    add_scheduler_flags(s, number=positive, base=d.host.scheduler)
    add_fields(s, ServeConfig, ("max_upload_bytes", "max_pages"), base=d, number=positive)
    add_fields(s, InputLimits, ("max_image_frames",), base=d.limits)
    add_fields(s, HostConfig, ("engine",), base=d.host)
    add_mode(s, base=d.host)
    add_fields(s, ServeConfig, ("model_id", "request_timeout_s", "readyz_wait_s", "max_job_pages", "job_store", "job_key", "job_lease_s",
                                "allowed_s3"), base=d, number=positive)
    add_fields(s, ServeConfig, ("job_ttl_s", "max_jobs", "max_jobs_per_tenant", "max_queued_jobs_per_tenant",
                                "max_job_pages_in_flight", "max_job_pages_beside_interactive",
                                "body_timeout_s", "max_requests_per_tenant", "tenant_header",
                                "render_workers_per_tenant"), base=d, number=positive,
               numbers=("max_jobs", "max_jobs_per_tenant", "max_queued_jobs_per_tenant", "max_job_pages_in_flight",
                        "max_job_pages_beside_interactive",
                        "max_requests_per_tenant",
                        "render_workers_per_tenant"))
    add_fields(s, StorageConfig, ("endpoint",), base=d.storage)
    add_fields(s, ServeConfig, ("engine_replicas",), base=d)
    add_fields(s, HostConfig, ("pages_in_flight", "max_live_branches", "engine_overrides"), base=d.host,
               number=positive)
    add_fields(s, ServeConfig, ("engine_max_ongoing", "engine_max_queued", "render_workers", "engine_gpus"),
               base=d, number=positive, numbers=("engine_max_ongoing", "engine_max_queued", "render_workers"))
    s.add_argument("--metrics-port", type=int, default=None, metavar="PORT",
                   help="serve this local Ray's Prometheus metrics (padoc's and Ray Serve's, cluster/METRICS.md) "
                        "at http://127.0.0.1:PORT/metrics (default: a free port, printed when ready)")
    s.add_argument("--ready-timeout", type=positive(float), default=900.0,
                   help="seconds to wait for /readyz before giving up (default 900)")
    s.set_defaults(func=run)


#: how serve's errors begin (``padoc-ray serve: error: ...``)
PROG = "padoc-ray serve"


def config_from_args(args: argparse.Namespace):
    from padoc_ray.host import HostConfig
    from padoc_ray.raster.document import InputLimits
    from padoc_ray.serve.config import TOKEN_ENV, ServeConfig, token_fields
    from padoc_ray.storage import StorageConfig

    d = ServeConfig(model="-")
    host = from_args(HostConfig, args, base=d.host, scheduler=scheduler_from_args(args))
    return from_args(ServeConfig, args, model=args.model, host=host, listen_host=args.host,
                     storage=from_args(StorageConfig, args, base=d.storage),
                     limits=from_args(InputLimits, args, base=d.limits),
                     **token_fields(os.environ.get(TOKEN_ENV)))


def _local_family(model: str) -> str:
    """The checkpoint family of a local ``--model`` folder (padoc: padoc_protocol.json; hpd: HPD-Parsing's
    config.json), or exit 2 saying why it is none padoc-ray knows."""
    from padoc_ray.protocol import ProtocolError
    from padoc_ray.protocol.family import recognize

    if not os.path.isdir(model):
        die(f"--model: {model} is not a folder (a checkpoint directory or an s3:// URI)", prog=PROG)
    try:
        return recognize(model).family
    except (ProtocolError, OSError) as e:
        die(f"--model: {e}; build the tiny one with `padoc-ray build-tiny-model {model}`", prog=PROG)


def _wait_ready(url: str, timeout_s: float, stop: threading.Event) -> bool:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end and not stop.is_set():
        try:
            with urllib.request.urlopen(url + "/readyz", timeout=30) as r:
                if r.status == 200:
                    return True
        except (urllib.error.URLError, OSError):
            pass
        stop.wait(1.0)
    return False


def run(args: argparse.Namespace) -> int:
    from padoc_ray.storage import is_s3

    if args.replay and not is_s3(args.replay) and not os.path.isfile(args.replay):
        die(f"--replay: {args.replay} does not exist", prog=PROG)
    family = None if is_s3(args.model) else _local_family(args.model)
    if not 0 < args.port < 65536:
        die(f"--port: {args.port} is not a port", prog=PROG)
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        die(str(e), prog=PROG)
    if family is not None:  # what the engine replica would refuse at its start, said before Ray starts
        from types import SimpleNamespace

        from padoc_ray.host import check_family
        from padoc_ray.protocol import ProtocolError

        try:
            check_family(SimpleNamespace(family=family), cfg.host)
        except ProtocolError as e:
            die(f"--model {args.model}: {e}", prog=PROG)
    if cfg.job_store:  # a refused store (or a missing key) would only show as a replica that never starts
        from padoc_ray.serve.jobs import JobStore, signing_key

        try:
            if is_s3(cfg.job_store):  # its key is checked here; the bucket by the replicas
                signing_key(cfg.job_store, cfg.job_key)
            else:
                JobStore(cfg.job_store, cfg.storage, key_file=cfg.job_key)
        except (ValueError, OSError) as e:
            die(f"--job-store: {e}", prog=PROG)

    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    from ray import serve

    from padoc_ray.ray_init import init_ray, is_loopback, listeners_beyond_loopback
    from padoc_ray.serve.app import build_app

    if args.metrics_port is not None and not 0 < args.metrics_port < 65536:
        die(f"--metrics-port: {args.metrics_port} is not a port", prog=PROG)
    extra = {"_metrics_export_port": args.metrics_port} if args.metrics_port else {}
    info = init_ray("local", verbose=args.verbose, include_dashboard=False, local_only=is_loopback(args.host), **extra)
    import ray

    # after ray.init, whose core worker installs its own SIGTERM handler (it would end us uncleanly)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    rc = 0
    try:
        try:
            serve.start(http_options={"host": args.host, "port": args.port,
                                      "request_timeout_s": cfg.http_request_timeout_s})
        except Exception as e:  # noqa: BLE001 - a taken port, most often
            die(f"cannot listen on {args.host}:{args.port}: {e}", prog=PROG)
        serve.run(build_app(cfg), name="padoc", route_prefix="/", blocking=False)
        shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        url = f"http://{shown}:{args.port}"
        if not _wait_ready(url, args.ready_timeout, stop):
            if not stop.is_set():
                rc = die(f"{url}/readyz did not answer 200 within {args.ready_timeout:g} s", 1,
                         prog=PROG, exit=False)
        else:
            auth = "bearer token required" if cfg.token_sha256 else "no auth (set PADOC_RAY_API_TOKEN to require one)"
            port = (info or {}).get("metrics_export_port") or args.metrics_port
            where = f"; metrics at http://127.0.0.1:{port}/metrics" if port else ""
            if port and not is_loopback(args.host):
                where += " (on every interface, without auth)"
            print(f"padoc-ray serve: ready at {url} (model {cfg.served_model_id}; {auth}; API docs at {url}/docs"
                  f"{where})", flush=True)
            for note in listeners_beyond_loopback() if is_loopback(args.host) else ():
                print(f"padoc-ray serve: note: {note}", file=sys.stderr, flush=True)
            stop.wait()
            print("padoc-ray serve: stopping", file=sys.stderr, flush=True)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    return rc
