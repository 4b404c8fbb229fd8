"""The metrics an operator watches: every name, meaning, tag and bucket in one place, and the code
that records them through ``ray.util.metrics``.

Recorded by the engine host (:class:`padoc_ray.host.PageHost`, so by the batch job's engine actors
and by the Serve engine replicas alike), from the :class:`~padoc_ray.scheduler.PageRecord` each page
returns, and for the batch job's render stage (its error rows and render times) by the engine actor
that receives the stage's rows (:func:`padoc_ray.pipeline.stages.record_render`). Ray's
metrics agent on each node exports them to Prometheus with its ``ray_`` prefix (a counter also gets
``_total``, a histogram ``_bucket``/``_sum``/``_count``); :func:`exported_names` lists the series.
``cluster/METRICS.md`` documents them; ``cluster/grafana/padoc-ray.json`` charts them.

Ray is imported only when a process has already initialized it (a Ray worker, actor or driver):
elsewhere (``padoc-ray parse-page``, tests, benchmarks) :func:`get` returns a recorder that does
nothing, so this module and the engine host stay usable without Ray. Recording never raises into
the page path: a failed record is logged once and dropped.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import dataclass

logger = logging.getLogger(__name__)

EXPORT_PREFIX = "ray_"  #: what Ray's metrics agent puts before an application metric's name

#: seconds: sub-second engine latencies up to a stuck page
MAX_CATEGORY_TAGS = 64  #: distinct category names one process tags padoc_unknown_categories with
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
#: branches per page: 0.5 separates pages without a branch (boundaries must be positive)
BRANCH_BUCKETS = (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0)


@dataclass(frozen=True)
class MetricSpec:
    name: str  #: as recorded; exported as EXPORT_PREFIX + name (+ a kind suffix)
    kind: str  #: counter | gauge | histogram
    description: str
    tags: tuple[str, ...] = ()
    boundaries: tuple[float, ...] = ()  #: histogram bucket upper bounds

    def exported(self) -> tuple[str, ...]:
        """The Prometheus series names Ray exports for this metric."""
        base = EXPORT_PREFIX + self.name
        if self.kind == "counter":
            return (base + "_total",)
        if self.kind == "histogram":
            return (base + "_bucket", base + "_sum", base + "_count")
        return (base,)


PAGES = MetricSpec(
    "padoc_pages", "counter",
    "Pages finished, by final status (the status written in the page row). stage=render: the page failed "
    "rendering and never reached an engine; stage=engine: an engine host ran it (any status); stage=serve: the "
    "online service answered it without an engine finishing it (engine_unavailable, request_timeout).",
    ("status", "stage"))
DOCUMENT_ERRORS = MetricSpec(
    "padoc_document_errors", "counter",
    "Documents the render stage could not parse at all (one page_index -1 row), by error code.", ("status",))
BRANCHES = MetricSpec(
    "padoc_page_branches", "histogram", "Content branches forked per page run by an engine host.",
    boundaries=BRANCH_BUCKETS)
FORK_LATENCY = MetricSpec(
    "padoc_fork_latency_seconds", "histogram",
    "Per content branch: seconds from the layout stream closing its region to the branch's first token "
    "(admission wait + engine queueing + prefill of the uncached suffix).", boundaries=LATENCY_BUCKETS)
TTFT = MetricSpec(
    "padoc_ttft_seconds", "histogram",
    "Per page: seconds from the page starting on the engine to the first token of its layout (or sequential) "
    "stream.", boundaries=LATENCY_BUCKETS)
PAGE_SECONDS = MetricSpec(
    "padoc_page_seconds", "histogram", "Per page: seconds on the engine, start to record (e2e_s).",
    boundaries=LATENCY_BUCKETS)
OUTPUT_TOKENS = MetricSpec(
    "padoc_output_tokens", "counter", "Tokens generated, over all streams of every page (output_tokens).")
PROMPT_TOKENS = MetricSpec(
    "padoc_prompt_tokens", "counter", "Prompt tokens of every request of every page, as the engine counts them "
    "(image expanded; prompt_tokens).")
CACHED_TOKENS = MetricSpec(
    "padoc_cached_prompt_tokens", "counter", "Of padoc_prompt_tokens, those served from the prefix cache "
    "(cached_tokens). Hit rate = rate(cached) / rate(prompt).")
DRAFT_TOKENS = MetricSpec(
    "padoc_draft_tokens", "counter",
    "Branch tokens drafted from pages' text layers (--text-layer speculate), by outcome: drafted (sent to the "
    "model to check), accepted (kept: each one a decode step saved). Acceptance = rate(accepted) / "
    "rate(drafted).", ("outcome",))
IN_FLIGHT = MetricSpec(
    "padoc_pages_in_flight", "gauge", "Pages running on one engine host now (at most its pages_in_flight).",
    ("host",))
BRANCH_RETRIES = MetricSpec(
    "padoc_branch_retries", "counter",
    "Content branches that needed a re-fork (stopped as a loop or at the token limit), by outcome: recovered "
    "(a later attempt ended normally), exhausted (every attempt failed: branch_retries), budget (the page's "
    "retry_token_budget was spent first).", ("outcome",))
UNKNOWN_CATEGORIES = MetricSpec(
    "padoc_unknown_categories", "counter",
    "Regions whose category name the checkpoint's family does not map onto the rows' categories (hpd: a name "
    "outside its category map), kept as they are and rendered as text; by family and name (after "
    f"{MAX_CATEGORY_TAGS} distinct names in a process, the rest count as 'other').", ("family", "category"))
RENDER_SECONDS = MetricSpec(
    "padoc_render_seconds", "histogram", "Per rendered page: seconds the renderer took (render_s).",
    boundaries=LATENCY_BUCKETS)

HTTP_REQUESTS = MetricSpec(
    "padoc_http_requests", "counter", "Online service: requests answered, by route and HTTP status code.",
    ("route", "code"))
PAGES_WAITING = MetricSpec(
    "padoc_pages_waiting", "gauge", "Online service: pages waiting for engine capacity in one ingress replica, by "
    "class (interactive: /v1/parse and chat; job).", ("host", "class"))
JOBS = MetricSpec(
    "padoc_jobs", "gauge", "Online service: jobs of one ingress replica now, by state (queued, running).",
    ("host", "state"))

METRICS: tuple[MetricSpec, ...] = (PAGES, DOCUMENT_ERRORS, BRANCHES, FORK_LATENCY, TTFT, PAGE_SECONDS,
                                   OUTPUT_TOKENS, PROMPT_TOKENS, CACHED_TOKENS, DRAFT_TOKENS, IN_FLIGHT, RENDER_SECONDS,
                                   BRANCH_RETRIES, UNKNOWN_CATEGORIES, HTTP_REQUESTS, PAGES_WAITING, JOBS)


def exported_names() -> dict[str, MetricSpec]:
    """Every Prometheus series name Ray exports for padoc's metrics -> its metric."""
    return {series: m for m in METRICS for series in m.exported()}


def host_label() -> str:
    """The ``host`` tag of a per-process gauge: node name and pid (one series per engine host)."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Recorder:
    """Records padoc's metrics; this base class drops everything (no Ray in this process)."""

    enabled = False

    def page(self, rec) -> None:
        """One page an engine host finished, from its :class:`~padoc_ray.scheduler.PageRecord`."""

    def pages_in_flight(self, n: int) -> None:
        """Pages running on this process's engine host now."""

    def render_failed(self, status: str) -> None:
        """A page whose rendering failed (its row carries ``status``)."""

    def rendered(self, render_s: float | None) -> None:
        """A page rendered in ``render_s`` seconds."""

    def document_error(self, status: str) -> None:
        """A document that got one error row (``page_index`` -1) in the render stage (the batch job
        records it once an engine actor has run the row's batch)."""

    def page_unrun(self, status: str) -> None:
        """A page the online service answered without an engine finishing it."""

    def http_request(self, route: str, code: int) -> None:
        """One answered request of the online service."""

    def pages_waiting(self, klass: str, n: int) -> None:
        """Pages of ``klass`` waiting for engine capacity in this ingress replica now."""

    def jobs(self, state: str, n: int) -> None:
        """Jobs of this ingress replica in ``state`` now."""


class RayRecorder(Recorder):
    """Records through ``ray.util.metrics`` (created once per process)."""

    enabled = True

    def __init__(self):
        from ray.util import metrics as rm

        def make(m: MetricSpec):
            if m.kind == "counter":
                return rm.Counter(m.name, m.description, m.tags)
            if m.kind == "gauge":
                return rm.Gauge(m.name, m.description, m.tags)
            return rm.Histogram(m.name, m.description, list(m.boundaries), m.tags)

        self._m = {m.name: make(m) for m in METRICS}
        self._host = host_label()
        self._warned = False

    def _do(self, fn, *args) -> None:
        try:
            fn(*args)
        except Exception:  # noqa: BLE001 - a metric must never fail a page
            if not self._warned:
                self._warned = True
                logger.exception("recording a metric failed (later failures are not logged)")

    def _inc(self, spec: MetricSpec, value: float, tags: dict | None = None) -> None:
        if value > 0:  # Ray's counters refuse 0
            self._do(self._m[spec.name].inc, float(value), tags)

    def _observe(self, spec: MetricSpec, value: float | None) -> None:
        if value is not None:
            self._do(self._m[spec.name].observe, float(value))

    def page(self, rec) -> None:
        self._inc(PAGES, 1, {"status": rec.status, "stage": "engine"})
        self._observe(BRANCHES, rec.n_branches)
        for s in rec.fork_latency_s:
            self._observe(FORK_LATENCY, s)
        self._observe(TTFT, rec.ttft_s)
        self._observe(PAGE_SECONDS, rec.e2e_s)
        self._inc(OUTPUT_TOKENS, rec.output_tokens)
        self._inc(PROMPT_TOKENS, rec.prompt_tokens)
        self._inc(CACHED_TOKENS, rec.cached_tokens)
        self._inc(DRAFT_TOKENS, sum(getattr(rec, "region_draft_tokens", ())), {"outcome": "drafted"})
        self._inc(DRAFT_TOKENS, sum(getattr(rec, "region_accepted_tokens", ())), {"outcome": "accepted"})
        for outcome in getattr(rec, "retry_outcomes", ()):
            self._inc(BRANCH_RETRIES, 1, {"outcome": outcome})
        for name in getattr(rec, "unknown_categories", ()):
            self._inc(UNKNOWN_CATEGORIES, 1, {"family": rec.family, "category": self._category_tag(name)})

    def _category_tag(self, name: str) -> str:
        seen = self.__dict__.setdefault("_category_tags", set())
        if name in seen or len(seen) < MAX_CATEGORY_TAGS:
            seen.add(name)
            return name
        return "other"

    def pages_in_flight(self, n: int) -> None:
        self._do(self._m[IN_FLIGHT.name].set, float(n), {"host": self._host})

    def render_failed(self, status: str) -> None:
        self._inc(PAGES, 1, {"status": status, "stage": "render"})

    def rendered(self, render_s: float | None) -> None:
        self._observe(RENDER_SECONDS, render_s)

    def document_error(self, status: str) -> None:
        self._inc(DOCUMENT_ERRORS, 1, {"status": status})

    def page_unrun(self, status: str) -> None:
        self._inc(PAGES, 1, {"status": status, "stage": "serve"})

    def http_request(self, route: str, code: int) -> None:
        self._inc(HTTP_REQUESTS, 1, {"route": route, "code": str(code)})

    def pages_waiting(self, klass: str, n: int) -> None:
        self._do(self._m[PAGES_WAITING.name].set, float(n), {"host": self._host, "class": klass})

    def jobs(self, state: str, n: int) -> None:
        self._do(self._m[JOBS.name].set, float(n), {"host": self._host, "state": state})


NOOP = Recorder()
_recorder: Recorder | None = None  # decided once this process runs inside Ray


def get() -> Recorder:
    """The Ray-backed recorder once this process runs inside Ray, else :data:`NOOP`. Never imports
    ray itself: a process that has not imported (and initialized) it records nothing."""
    global _recorder
    ray = sys.modules.get("ray")
    if ray is None or not ray.is_initialized():
        return NOOP  # not (or no longer) inside Ray; asked again next time
    if _recorder is not None:
        return _recorder
    try:
        _recorder = RayRecorder()
    except Exception:  # noqa: BLE001 - no metrics rather than no pages
        logger.exception("could not create the Ray metrics; recording nothing in this process")
        _recorder = NOOP
    return _recorder
