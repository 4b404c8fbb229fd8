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

from padoc_ray.cli.common import add_command, add_mode, add_stream_limits, positive

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
    s = add_command(sub, "serve", help="the online HTTP endpoint (Ray Serve) on a local Ray", description=DESCRIPTION,
                       formatter_class=argparse.RawDescriptionHelpFormatter)
    s.add_argument("--model", required=True, help="checkpoint directory (or s3:// URI) with padoc_protocol.json")
    s.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1; 0.0.0.0 for all)")
    s.add_argument("--port", type=int, default=8000, help="HTTP port (default 8000)")
    s.add_argument("--replay", metavar="GT.json", default=None,
                   help="teacher-force the model with this OmniDocBench ground truth, matched by the upload's file "
                        "name and page (tiny-model demos and tests)")
    add_stream_limits(s, number=positive(int))
    s.add_argument("--max-upload-mb", type=positive(float), default=50.0,
                   help="largest request body; bigger ones get 413 (default 50)")
    s.add_argument("--max-pages", type=positive(int), default=50,
                   help="pages one /v1/parse request may select; more get 413 (default 50; use /v1/jobs)")
    s.add_argument("--engine", choices=("vllm", "noop"), default="vllm",
                   help="vllm, or noop (no model: empty layouts; measures the HTTP layer). Default vllm")
    add_mode(s, help_suffix=" (for requests that name none)")
    s.add_argument("--model-id", default=None, help="the model name clients send (default: the model folder's name)")
    s.add_argument("--page-deadline", type=positive(float), default=None,
                   help="seconds per page before it is cut (default: none)")
    s.add_argument("--request-timeout", type=positive(float), default=600.0,
                   help="seconds a /v1/parse or chat request may take before 504 (default 600)")
    s.add_argument("--max-job-pages", type=positive(int), default=5000, help="pages one /v1/jobs document may select "
                                                                               "(default 5000)")
    s.add_argument("--job-store", default=None,
                   help="folder or s3:// prefix for async jobs (input, state, Parquet page rows); every ingress replica "
                        "must see it (default: a folder under the system temp dir)")
    s.add_argument("--job-lease", type=positive(float), default=15.0,
                   help="seconds without a heartbeat after which another replica takes a job over (default 15)")
    s.add_argument("--allow-s3", action="append", default=[], metavar="s3://BUCKET[/PREFIX]",
                   help="a prefix requests may name as `uri` or `image_url` (repeatable; default: none)")
    s.add_argument("--s3-endpoint", default=None, help="S3-compatible endpoint URL (default: AWS_ENDPOINT_URL or AWS)")
    s.add_argument("--engine-replicas", type=_replicas, default=(1, 1), metavar="N|MIN,MAX",
                   help="engine replicas, autoscaled between MIN and MAX on pages in flight (default 1)")
    s.add_argument("--pages-in-flight", type=positive(int), default=32,
                   help="pages one engine replica runs at once (default 32)")
    s.add_argument("--engine-max-ongoing", type=positive(int), default=64,
                   help="pages one engine replica accepts at once (default 64; past --pages-in-flight they wait in it)")
    s.add_argument("--engine-max-queued", type=positive(int), default=256,
                   help="pages waiting for an engine replica; past it requests get 503 + Retry-After (default 256)")
    s.add_argument("--render-workers", type=positive(int), default=2,
                   help="renderer processes per ingress replica (default 2)")
    s.add_argument("--gpus-per-replica", type=float, default=0.0, help="GPUs per engine replica (default 0; 1 on GPUs)")
    s.add_argument("--ready-timeout", type=positive(float), default=900.0,
                   help="seconds to wait for /readyz before giving up (default 900)")
    s.set_defaults(func=run)


def config_from_args(args: argparse.Namespace):
    from padoc_ray.host import HostConfig
    from padoc_ray.scheduler import SchedulerConfig
    from padoc_ray.serve.config import TOKEN_ENV, ServeConfig, token_digest
    from padoc_ray.storage import StorageConfig

    return ServeConfig(
        model=args.model, model_id=args.model_id, replay_gt=args.replay,
        host=HostConfig(engine=args.engine, mode=args.mode, pages_in_flight=args.pages_in_flight,
                        scheduler=SchedulerConfig(max_tokens=args.max_tokens, max_branches=args.max_branches,
                                                  deadline_s=args.page_deadline, constrain_layout=args.constrain_layout)),
        max_upload_bytes=int(args.max_upload_mb * 2**20), max_pages=args.max_pages, max_job_pages=args.max_job_pages,
        request_timeout_s=args.request_timeout, allowed_s3=tuple(args.allow_s3), job_store=args.job_store,
        job_lease_s=args.job_lease, storage=StorageConfig(endpoint=args.s3_endpoint),
        engine_replicas=args.engine_replicas, render_workers=args.render_workers,
        engine_max_ongoing=args.engine_max_ongoing, engine_max_queued=args.engine_max_queued, engine_gpus=args.gpus_per_replica,
        token_sha256=token_digest(os.environ.get(TOKEN_ENV)),
    )


def _die(msg: str) -> None:
    print(f"padoc-ray serve: error: {msg}", file=sys.stderr)
    raise SystemExit(2)


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
        _die(f"--replay: {args.replay} does not exist")
    if not is_s3(args.model) and not os.path.isfile(os.path.join(args.model, "padoc_protocol.json")):
        _die(f"--model: {args.model} is not a PaDoc checkpoint (no padoc_protocol.json); build the tiny one with "
             f"`padoc-ray build-tiny-model {args.model}`")
    if not 0 < args.port < 65536:
        _die(f"--port: {args.port} is not a port")
    try:
        cfg = config_from_args(args)
    except ValueError as e:
        _die(str(e))

    stop = threading.Event()

    def on_signal(signum, _frame):
        stop.set()

    from ray import serve

    from padoc_ray.ray_init import init_ray
    from padoc_ray.serve.app import build_app

    init_ray("local", verbose=args.verbose, include_dashboard=False)
    import ray

    # after ray.init, whose core worker installs its own SIGTERM handler (it would end us uncleanly)
    signal.signal(signal.SIGINT, on_signal)
    signal.signal(signal.SIGTERM, on_signal)

    rc = 0
    try:
        try:
            serve.start(http_options={"host": args.host, "port": args.port})
        except Exception as e:  # noqa: BLE001 - a taken port, most often
            _die(f"cannot listen on {args.host}:{args.port}: {e}")
        serve.run(build_app(cfg), name="padoc", route_prefix="/", blocking=False)
        shown = "127.0.0.1" if args.host in ("0.0.0.0", "::") else args.host
        url = f"http://{shown}:{args.port}"
        if not _wait_ready(url, args.ready_timeout, stop):
            if not stop.is_set():
                print(f"padoc-ray serve: error: {url}/readyz did not answer 200 within {args.ready_timeout:g} s",
                      file=sys.stderr)
                rc = 1
        else:
            auth = "bearer token required" if cfg.token_sha256 else "no auth (set PADOC_RAY_API_TOKEN to require one)"
            print(f"padoc-ray serve: ready at {url} (model {cfg.served_model_id}; {auth}; API docs at {url}/docs)",
                  flush=True)
            stop.wait()
            print("padoc-ray serve: stopping", file=sys.stderr, flush=True)
    finally:
        try:
            serve.shutdown()
        finally:
            ray.shutdown()
    return rc
