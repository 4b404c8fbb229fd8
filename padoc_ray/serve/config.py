"""The online service's configuration: one dataclass, validated, with documented defaults.

Pure (no ray, no fastapi): ``padoc-ray serve`` builds it from flags, a Serve config file from its
``args`` (see :func:`ServeConfig.from_args`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

from padoc_ray.host import HostConfig
from padoc_ray.pdf import RenderConfig
from padoc_ray.raster import ENCODINGS, RendererConfig
from padoc_ray.raster.document import InputLimits
from padoc_ray.storage import StorageConfig
from padoc_ray.knobs import MB, knob, range_text

TOKEN_ENV = "PADOC_RAY_API_TOKEN"

def token_digest(token: str | None) -> str | None:
    return hashlib.sha256(token.encode()).hexdigest() if token else None


def token_fields(tokens: str | None) -> dict[str, Any]:
    """``token_sha256`` and ``extra_token_sha256`` from the value of PADOC_RAY_API_TOKEN: one token, or
    several separated by commas (each its own tenant; blanks and repeats dropped). Unset or blank: no auth."""
    digests = list(dict.fromkeys(token_digest(t.strip()) for t in (tokens or "").split(",") if t.strip()))
    return {"token_sha256": digests[0] if digests else None, "extra_token_sha256": tuple(digests[1:])}


@dataclass(frozen=True, kw_only=True)
class ServeConfig:
    model: str  #: checkpoint directory, local or s3://
    model_id: str | None = None  #: the name clients send as ``model`` (None: the checkpoint folder's name)
    #: the engine replica's host: the paper's per-page limits; 32 pages in flight per replica
    host: HostConfig = field(default_factory=lambda: HostConfig(pages_in_flight=32))
    #: teacher forcing (tiny-model demos and tests): OmniDocBench-format ground truth, matched by the
    #: upload's file name and page, as the batch job matches by file name
    replay_gt: str | None = knob(None, flags=("--replay",), dest="replay", metavar="GT.json")
    render: RenderConfig = field(default_factory=RenderConfig)  #: 1600 px on the longest side
    #: rendering happens in the ingress, in renderer processes (pdfium is not thread-safe), with deadlines
    renderer: RendererConfig = field(default_factory=lambda: RendererConfig(doc_timeout_s=300.0))
    render_workers: int = 2  #: renderer processes per ingress replica (documents rendered at once)
    #: the batch job's per-input caps; the service applies their frame cap (frames of one image, 1,000).
    #: Its page caps are max_pages / max_job_pages and its byte cap max_upload_bytes (below)
    limits: InputLimits = field(default_factory=InputLimits)
    image_encoding: str = "zstd"  #: how page images travel from the ingress to the engine (lossless)
    #: request bodies above this get 413 (before they are read whole)
    max_upload_bytes: int = knob(50 << 20, flags=("--max-upload-mb",), dest="max_upload_mb", parse="positive_float",
                                 metavar="MB", to_field=lambda m: int(m * MB), from_field=lambda b: b / MB,
                                 help="largest request body; bigger ones get 413")
    max_pages: int = 50  #: pages one /v1/parse or chat request may select (413 above)
    max_job_pages: int = 5000  #: pages one /v1/jobs document may select (413 above)
    #: per-request deadline of /v1/parse and chat (504 after it)
    request_timeout_s: float = knob(600.0, flags=("--request-timeout",))
    #: how long /readyz waits for the engine to answer a one-token probe before it answers 503 not_ready
    #: (a replica still loading, or stuck); set a Kubernetes readiness probe's timeout above it
    readyz_wait_s: float = knob(30.0, flags=("--readyz-wait",), metavar="SECONDS")
    #: s3:// prefixes a request may name (``uri`` of /v1/parse, ``image_url`` of chat); empty: none
    allowed_s3: tuple[str, ...] = knob((), flags=("--allow-s3",), action="append", metavar="s3://BUCKET[/PREFIX]",
                                       to_field=tuple, from_field=list, note="repeatable")
    storage: StorageConfig = field(default_factory=StorageConfig)
    #: where async jobs live (local folder or s3://): their input, state and page rows (Parquet, the
    #: batch job's schema). Every ingress replica must see it; None: a folder under the Ray temp dir
    job_store: str | None = None
    #: a file holding the job store's signing key as hex (64+ hex digits: `openssl rand -hex 32`), e.g. a
    #: mounted Kubernetes Secret; every ingress replica must read the same key. None: the PADOC_RAY_JOB_KEY
    #: environment variable when set, else (a local store only) <job store>/store.key, created once. An
    #: s3:// job store needs one of the two: its key is never kept beside its jobs (cluster/README.md)
    job_key: str | None = None
    #: a running job whose owner has not written for this long is taken over
    job_lease_s: float = knob(15.0, flags=("--job-lease",))
    #: finished jobs (done, failed, cancelled: input, state and page rows) are deleted this long after
    #: they finished; 0 keeps them until deleted by hand
    job_ttl_s: float = knob(86400.0, flags=("--job-ttl",), metavar="SECONDS")
    max_jobs: int = 4  #: jobs one ingress replica runs at once; more wait queued, started round-robin by tenant
    #: job pages one ingress replica has at the engine at once (of its engine slots): the engine's batch
    #: keeps room for interactive pages. PaDoc's pages/s is flat from 16 concurrent pages up (the paper's
    #: Table 3), so the cap costs job throughput little
    max_job_pages_in_flight: int = 16
    #: job pages one ingress replica has at the engine at once while interactive pages are in flight
    #: (or were, less than interactive_hold_s ago). Every page in the batch slows the others' steps
    #: (on this project's 2-core CPU, tenant B's one-page P95 beside a 2,000-page job was 3.6x its
    #: idle P95 at 16 job pages, 1.5x at 4); jobs shrink to it as their pages finish, none is stopped
    max_job_pages_beside_interactive: int = 4
    #: seconds after an interactive page finished during which jobs stay at max_job_pages_beside_interactive
    interactive_hold_s: float = 5.0
    max_jobs_per_tenant: int = 2  #: jobs of one tenant running at once on one ingress replica
    #: unfinished jobs (queued or running) one tenant may have; past it POST /v1/jobs answers 429
    max_queued_jobs_per_tenant: int = 100
    #: seconds a client may take to send its whole request body; past it 408 (a slow client cannot hold
    #: a request slot for long)
    body_timeout_s: float = knob(60.0, flags=("--body-timeout",), metavar="SECONDS")
    #: HTTP requests of one tenant an ingress replica handles at once; past it 429 with Retry-After, so
    #: that no client holds every slot (keep it below ingress_max_ongoing)
    max_requests_per_tenant: int = 16
    #: take the tenant from the X-Padoc-Tenant header (a trusted gateway sets it; the bearer token is still
    #: required when one is set). Off: the tenant is the token (its digest), and without auth everyone is one
    tenant_header: bool = False
    #: renderer processes one tenant's documents may hold at once (of render_workers), so one client's
    #: heavy PDFs cannot take every renderer
    render_workers_per_tenant: int = 1
    #: the address Serve's HTTP proxy listens on (``padoc-ray serve --host``): its name is answered
    listen_host: str = "127.0.0.1"
    #: Host names the service answers to besides 127.0.0.1, localhost and listen_host. Without a token (or
    #: with this list set) any other name gets 400 bad_host, so a web page that rebinds its own name to
    #: this address reads nothing; with a token and no list, any name (the token guards it)
    allowed_hosts: tuple[str, ...] = knob((), flags=("--allowed-host",), metavar="NAME,NAME,...",
                                          note="comma list; besides 127.0.0.1, localhost and --host")
    #: sha256 of the bearer token; None: no auth. ``padoc-ray serve`` fills it from PADOC_RAY_API_TOKEN
    token_sha256: str | None = None
    #: sha256 of more accepted bearer tokens, each its own tenant (PADOC_RAY_API_TOKEN holds them all,
    #: comma-separated; the first is token_sha256)
    extra_token_sha256: tuple[str, ...] = ()
    # Serve deployment options (see docs/serve.md)
    #: (min, max) engine replicas, autoscaled between
    engine_replicas: tuple[int, int] = knob((1, 1), parse="range_pair", metavar="N|MIN,MAX", from_field=tuple,
                                            show=range_text)
    #: autoscaling target: pages in flight per engine replica (a page is one engine call)
    target_ongoing_pages: int = 16
    engine_max_ongoing: int = 64  #: pages one engine replica accepts at once (host queues past pages_in_flight)
    engine_max_queued: int = 256  #: pages waiting for a replica; past it: 503 with Retry-After
    ingress_replicas: int = 1
    ingress_max_ongoing: int = 64  #: HTTP requests one ingress replica handles at once
    ingress_max_queued: int = 64  #: HTTP requests waiting; past it Serve answers 503 with Retry-After
    engine_cpus: float = 1.0
    engine_gpus: float = knob(0.0, flags=("--gpus-per-replica",))  #: GPUs per engine replica (1 on GPU machines)
    ingress_cpus: float = 0.5

    def __post_init__(self) -> None:
        if not self.model:
            raise ValueError("model is required")
        if self.image_encoding not in ENCODINGS:
            raise ValueError(f"image_encoding must be one of {', '.join(ENCODINGS)}")
        for name in ("render_workers", "max_upload_bytes", "max_pages", "max_job_pages", "target_ongoing_pages",
                     "engine_max_ongoing", "engine_max_queued", "ingress_replicas", "ingress_max_ongoing",
                     "ingress_max_queued", "max_jobs", "max_jobs_per_tenant", "max_queued_jobs_per_tenant",
                     "max_job_pages_in_flight", "max_job_pages_beside_interactive",
                     "max_requests_per_tenant", "render_workers_per_tenant"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")
        if min(self.request_timeout_s, self.job_lease_s, self.body_timeout_s, self.readyz_wait_s) <= 0:
            raise ValueError("request_timeout_s, job_lease_s, body_timeout_s and readyz_wait_s must be > 0")
        if self.interactive_hold_s < 0:
            raise ValueError("interactive_hold_s must be >= 0")
        if self.job_ttl_s < 0:
            raise ValueError("job_ttl_s must be >= 0 (0: keep finished jobs)")
        if self.job_key is not None and (not self.job_key.strip() or self.job_key.startswith("s3://")):
            raise ValueError("job_key is a local file holding the job store's key as hex (a mounted secret), "
                             "not empty and not s3://; or leave it unset and set PADOC_RAY_JOB_KEY")
        if self.extra_token_sha256 and not self.token_sha256:
            raise ValueError("extra_token_sha256 needs token_sha256 (the first token)")
        lo, hi = self.engine_replicas
        if not 1 <= lo <= hi:
            raise ValueError(f"engine_replicas must satisfy 1 <= min <= max, got {self.engine_replicas}")
        for p in self.allowed_s3:
            if not p.startswith("s3://") or len(p.rstrip("/")) <= len("s3://"):
                raise ValueError(f"allowed_s3 entries are s3://bucket[/prefix], got {p!r}")

    @property
    def http_request_timeout_s(self) -> float:
        """Ray Serve's own end-to-end limit (``http_options.request_timeout_s``): past this service's
        deadlines (body, then request), so that its own 408/504 answers come first, yet no request,
        however it stalls, holds a slot longer."""
        return self.body_timeout_s + self.request_timeout_s + 30.0

    @property
    def served_model_id(self) -> str:
        return self.model_id or os.path.basename(self.model.rstrip("/")) or "padoc"

    @classmethod
    def from_args(cls, args: Mapping[str, Any]) -> "ServeConfig":
        """From a Serve config file's ``args`` (flat keys; ``host`` takes HostConfig's fields and a
        nested ``scheduler``; ``api_token_env`` names the variable holding the token)."""
        args = dict(args)
        from padoc_ray.scheduler import SchedulerConfig

        kw: dict[str, Any] = {}
        host = dict(args.pop("host", {}) or {})
        if "scheduler" in host:
            host["scheduler"] = SchedulerConfig(**host["scheduler"])
        kw["host"] = HostConfig(**{"pages_in_flight": 32, **host})
        if "render" in args:
            kw["render"] = RenderConfig(**args.pop("render"))
        if "renderer" in args:
            kw["renderer"] = RendererConfig(**args.pop("renderer"))
        if "storage" in args:
            kw["storage"] = StorageConfig(**args.pop("storage"))
        if "limits" in args:
            kw["limits"] = InputLimits(**args.pop("limits"))
        env = args.pop("api_token_env", TOKEN_ENV)
        if "token_sha256" not in args:
            kw.update(token_fields(os.environ.get(env)))
        for k in ("allowed_s3", "engine_replicas", "extra_token_sha256"):
            if k in args:
                args[k] = tuple(args[k])
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(args) - names)
        if unknown:
            raise ValueError(f"unknown serve config keys: {', '.join(unknown)}")
        return cls(**kw, **args)
