"""The Ray Serve application: a thin FastAPI ingress over the service's parts, and the engine deployment.

The parts (each usable and tested without Ray):

* :mod:`~padoc_ray.serve.guard`: auth, tenants, body size and time, per-tenant request slots;
* :mod:`~padoc_ray.serve.uploads`: the request's document and options;
* :mod:`~padoc_ray.serve.runner`: render -> pages -> engine calls, admitted by engine capacity;
* :mod:`~padoc_ray.serve.jobs` and :mod:`~padoc_ray.serve.job_manager`: async jobs (store, leases,
  retention, caps, the sweeper);
* :mod:`~padoc_ray.serve.openai`: the OpenAI-compatible route;
* :mod:`~padoc_ray.serve.playground`: the page view at ``/`` (and ``view=true``);
* :mod:`~padoc_ray.serve.engine`: the engine replica and its client.

:func:`build_app` turns a :class:`~padoc_ray.serve.config.ServeConfig` into the application (the
FastAPI app and the ingress class are made per application, so nothing is shared through module
globals); ``app_builder`` is what a Serve config file's ``import_path`` names. The routes' handlers
are the methods of :class:`IngressBase` marked with their route; :func:`make_ingress` registers them
on the application's app. A refusal (:class:`~padoc_ray.serve.errors.Refusal`) is answered here,
with its code's HTTP status. Endpoint reference: docs/serve.md and ``/docs`` on a running service.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import os
import uuid
from typing import Any

from fastapi import FastAPI, Query, Request
from fastapi.responses import JSONResponse, PlainTextResponse, StreamingResponse
from ray import serve
from ray.serve.config import AutoscalingConfig, BackpressureConfig

from padoc_ray import metrics, status
from padoc_ray.serve import docs, errors, playground
from padoc_ray.serve.config import ServeConfig
from padoc_ray.serve.documents import RenderPool, parse_page_spec
from padoc_ray.serve.engine import EngineReplica, RayEngine, mode_refusal
from padoc_ray.serve.fair import FairGate
from padoc_ray.serve.guard import Guard, GuardConfig, authenticated
from padoc_ray.serve.errors import Refusal
from padoc_ray.serve.job_manager import JobManager, result_refusal
from padoc_ray.serve.jobs import JobStore
from padoc_ray.serve.openai import chat as chat_completion
from padoc_ray.serve.runner import BATCH, INTERACTIVE, Document, DocumentRunner, EngineBusy, RunOptions
from padoc_ray.serve.runner import markdown as result_markdown
from padoc_ray.serve.runner import result as page_result
from padoc_ray.serve.schemas import API_DESCRIPTION, ChatRequest, Format, Mode, upload_body
from padoc_ray.serve.streams import REGIONS, page_lines, stream_mode
from padoc_ray.serve.uploads import read_document

logger = logging.getLogger("padoc_ray.serve")

#: niceness of the renderer processes of job documents (interactive ones keep the ingress's own)
BATCH_NICE = 10


def default_job_store(instance: str) -> str:
    """This service instance's own job folder, in the Ray session's directory on this node."""
    import ray

    ctx = ray.get_runtime_context()
    return os.path.join(ctx.get_temp_dir(), ctx.get_session_name(), "padoc-jobs", instance)


#: the API's title (OpenAPI, and the /docs page's)
TITLE = "padoc-ray"


def _route(method: str, path: str, **options):
    """Marks an :class:`IngressBase` method as the handler of ``method path`` (``options``: FastAPI's, as
    ``api.get(path, **options)`` takes them); :func:`make_ingress` registers it on each application's app.
    A handler has no docstring: FastAPI would publish it as the route's OpenAPI description."""

    def mark(handler):
        handler.http_route = (method, path, options)
        return handler

    return mark


class IngressBase:
    """The ingress's state and its route handlers, shared by every application: :func:`make_ingress`
    subclasses it per application (with that application's :attr:`guard`) and registers the marked
    handlers on the application's own FastAPI app. Serve finds the handlers by their ``__qualname__``
    (``IngressBase.parse``) in the class's MRO."""

    guard: GuardConfig  #: the application's HTTP guard (set by make_ingress; /readyz asks it who is authenticated)

    async def __init__(self, cfg: ServeConfig, engine, instance: str):
        self.cfg = cfg
        self.engine = RayEngine(engine)
        self.model_info: dict | None = None  # the served checkpoint's family and modes, once the engine said
        # job documents render in their own processes, at a lower CPU priority than interactive ones
        batch_renderer = dataclasses.replace(cfg.renderer, nice=max(cfg.renderer.nice, BATCH_NICE))
        self.pools = {INTERACTIVE: RenderPool(cfg.renderer, cfg.render_workers, cfg.render_workers_per_tenant),
                      BATCH: RenderPool(batch_renderer, cfg.render_workers, cfg.render_workers_per_tenant)}
        capacity = max(1, cfg.engine_max_ongoing * cfg.engine_replicas[1] // cfg.ingress_replicas)
        self.gate = FairGate(capacity, class_caps={BATCH: min(cfg.max_job_pages_in_flight, capacity)},
                             yield_caps={BATCH: min(cfg.max_job_pages_beside_interactive, capacity)},
                             yield_hold_s=cfg.interactive_hold_s)
        self.runner = DocumentRunner(cfg, self.engine, self.pools, self.gate, max_waiting=cfg.engine_max_queued)
        store = JobStore(cfg.job_store or default_job_store(instance), cfg.storage, key_file=cfg.job_key)
        self.replica_id = uuid.uuid4().hex[:8]
        self.jobs = JobManager(store, self._job_pages, replica_id=f"{os.getpid()}-{self.replica_id}",
                               max_jobs=cfg.max_jobs, max_jobs_per_tenant=cfg.max_jobs_per_tenant,
                               max_queued_jobs_per_tenant=cfg.max_queued_jobs_per_tenant,
                               lease_s=cfg.job_lease_s, ttl_s=cfg.job_ttl_s)
        await self.jobs.start()
        self.gauges = asyncio.create_task(self._gauges())

    async def __del__(self):  # Serve awaits it when the replica stops
        if getattr(self, "gauges", None) is not None:
            self.gauges.cancel()
        if getattr(self, "jobs", None) is not None:
            await self.jobs.close()
        for pool in getattr(self, "pools", {}).values():
            pool.close()

    async def _gauges(self) -> None:
        while True:
            rec = metrics.get()
            rec.pages_waiting("interactive", self.gate.waiting(INTERACTIVE))
            rec.pages_waiting("job", self.gate.waiting(BATCH))
            for state, n in self.jobs.counts().items():
                rec.jobs(state, n)
            await asyncio.sleep(5.0)

    async def _model(self) -> dict | None:
        """The engine replica's :func:`~padoc_ray.serve.engine.model_info` (asked once; None while no
        replica can say: requests are then not checked here, and the engine refuses a page itself)."""
        if self.model_info is None:
            try:
                self.model_info = await asyncio.wait_for(self.engine.describe(), 60)
            except (EngineBusy, TimeoutError):
                return None
            except Exception as e:  # noqa: BLE001 - a replica restarting: the page-level check remains
                logger.warning("the engine replica did not describe its checkpoint: %s", type(e).__name__)
                return None
        return self.model_info

    async def _check_mode(self, mode: str) -> None:
        """Refuse (``unsupported_mode``) a mode the served checkpoint's family lacks (hpd: sequential)."""
        refused = mode_refusal(await self._model(), mode)
        if refused is not None:
            raise refused

    def _answer(self, route: str, resp):
        code = resp.status_code if hasattr(resp, "status_code") else 200
        metrics.get().http_request(route, code)
        return resp

    def _refused(self, route: str, e: Refusal):
        """A route's answer to a refusal, counted. The guard's (they close the connection: a body that did
        not arrive whole) go on to the framework's handler, uncounted as every refusal of the guard."""
        if e.close:
            raise e
        return self._answer(route, e.response())

    def _options(self, request: Request, opts: dict, max_pages: int, klass: int, *, limit: int) -> RunOptions:
        return RunOptions(wanted=parse_page_spec(opts["pages"], limit), mode=opts["mode"] or self.cfg.host.mode,
                          max_pages=max_pages, tenant=request.state.tenant, salt=uuid.uuid4().hex,
                          run_id=uuid.uuid4().hex[:12], klass=klass)

    # ---- open routes ----
    @_route("get", "/healthz", summary="the process is up")
    async def healthz(self) -> dict:
        return {"status": status.OK}

    @_route("get", "/readyz", summary="the engine is loaded and answers a probe (its counts: authenticated callers)")
    async def readyz(self, request: Request):
        ready = {"status": "ready", "model": self.cfg.served_model_id}
        try:
            wait = self.cfg.readyz_wait_s
            stats = await asyncio.wait_for(self.engine.ready(wait), wait + 1)  # the replica's own probe ends first
        except EngineBusy:  # loaded, not broken: stay in rotation
            return {**ready, "engine": "busy"}
        except Exception as e:  # noqa: BLE001
            return JSONResponse({"status": errors.NOT_READY, "reason": type(e).__name__},
                                status_code=errors.http_status(errors.NOT_READY), headers={"Retry-After": "5"})
        # other clients' activity is nobody's business but the operator's (or everyone's, without auth)
        return {**ready, "engine": stats} if authenticated(request.scope, self.guard) else ready

    @_route("get", "/docs", include_in_schema=False)
    async def swagger(self, request: Request):
        return docs.page(request, TITLE)

    @_route("get", "/docs/assets/{name}", include_in_schema=False)
    async def swagger_asset(self, name: str):
        return docs.asset(name)

    @_route("get", "/", include_in_schema=False)
    async def page_view(self, request: Request):
        return playground.page(request, self.cfg.served_model_id)

    @_route("get", "/ui/{name}", include_in_schema=False)
    async def page_view_asset(self, name: str):
        return playground.asset(name)

    # ---- the API ----
    @_route("get", "/v1/models", summary="the served model and its protocol")
    async def models(self) -> dict:
        info = await self._model() or {"family": "padoc", "modes": ["fork", "sequential"]}
        return {"object": "list", "data": [{
            "id": self.cfg.served_model_id, "object": "model", "created": 0, "owned_by": "padoc-ray",
            "protocol": info["family"], "modes": list(info["modes"]), "default_mode": self.cfg.host.mode,
            "max_pages_per_request": self.cfg.max_pages, "max_job_pages": self.cfg.max_job_pages,
            "max_upload_bytes": self.cfg.max_upload_bytes,
        }]}

    @_route("post", "/v1/parse", summary="parse a document (multipart field `file`, or JSON)",
            openapi_extra=upload_body())
    async def parse(self, request: Request,
                    stream: str = Query("false", description="true: NDJSON, a line per page as it finishes; "
                                        "regions: also a line per region event; false: one JSON answer"),
                    pages: str | None = None, mode: Mode | None = None, format: Format | None = None,
                    view: bool = Query(False, description="each page also gets `view`: what the page view at "
                                       "/ draws, with its page image as a PNG data URL"),
                    timeout: float | None = Query(None, ge=1, le=86400, description="seconds before 504 (at "
                                                  "most the service's request timeout)")):
        cfg = self.cfg
        budget = min(timeout or cfg.request_timeout_s, cfg.request_timeout_s)
        route = "parse"
        try:
            streamed = stream_mode(stream)
            route = "parse_stream" if streamed else "parse"
            doc, opts = await read_document(request, cfg)
            opt = self._options(request, opts, cfg.max_pages, INTERACTIVE,
                                limit=cfg.max_pages if streamed else max(cfg.max_pages, cfg.max_job_pages))
            await self._check_mode(opt.mode)
            self.runner.admit()
            if streamed:
                lines = await page_lines(self.runner, doc, opt, budget, regions=streamed == REGIONS)
                return self._answer(route, StreamingResponse(lines, media_type="application/x-ndjson"))
            if view:
                opt = dataclasses.replace(opt, images=True)
            page_rows, count = await asyncio.wait_for(self.runner.parse_all(doc, opt), budget)
            if page_rows and all(r["status"] == status.UNSUPPORTED_MODE for r in page_rows):
                # the engine refused the mode (the ingress could not ask it first): the request's fault, not a page's
                raise Refusal(status.UNSUPPORTED_MODE, page_rows[0].get("error_message") or
                              f"mode {opt.mode} is not supported by the served checkpoint")
        except Refusal as e:
            return self._refused(route, e)
        except TimeoutError:
            return self._refused(route, Refusal(status.REQUEST_TIMEOUT, f"not finished within {budget:g} s; use "
                                                                        f"/v1/jobs for large documents"))
        result = page_result(cfg.served_model_id, doc.name, page_rows, count, opt.mode)
        return self._answer(route, self._format(result, opts["format"], view))

    @staticmethod
    def _format(result: dict, fmt: str | None, view: bool = False):
        if fmt == "markdown":
            return PlainTextResponse(result_markdown(result), media_type="text/markdown; charset=utf-8",
                                     headers={"X-Padoc-Status": result["status"]})
        return playground.add_views(result) if view else result

    # ---- async jobs ----
    @_route("post", "/v1/jobs", status_code=202, summary="start an async parse job (same body as /v1/parse)",
            openapi_extra=upload_body(with_format=False))
    async def create_job(self, request: Request, pages: str | None = None, mode: Mode | None = None):
        cfg = self.cfg
        try:
            doc, opts = await read_document(request, cfg)
            await self._check_mode(opts["mode"] or cfg.host.mode)
            wanted = parse_page_spec(opts["pages"], cfg.max_job_pages)
            opened = await self.runner.count_pages(doc, wanted, cfg.max_job_pages, request.state.tenant)
            options = {"pages": list(wanted) if wanted is not None else None,
                       "mode": opts["mode"] or cfg.host.mode}
            view = await self.jobs.create(tenant=request.state.tenant, name=doc.name, data=doc.data,
                                          options=options, pages_total=len(opened.selected))
        except Refusal as e:
            return self._refused("jobs", e)
        where = f"{request.scope.get('root_path', '')}/v1/jobs/{view['id']}"
        return self._answer("jobs", JSONResponse(view, status_code=202, headers={"Location": where}))

    async def _job_pages(self, state: dict, skip: frozenset[int]):
        """A job's page rows as they finish (JobManager's run_pages: ``state["data"]`` is its input)."""
        opts = state["options"]
        opt = RunOptions(wanted=tuple(opts["pages"]) if opts["pages"] is not None else None, mode=opts["mode"],
                         max_pages=self.cfg.max_job_pages, tenant=state["tenant"], salt=state["id"],
                         run_id=f"{state['id'][:12]}-{self.replica_id}", klass=BATCH, skip=skip)
        async for item in self.runner.pages(Document(state["data"], state["name"]), opt):
            if isinstance(item, dict):
                yield item

    @_route("get", "/v1/jobs/{job_id}", summary="a job's progress")
    async def get_job(self, job_id: str, request: Request):
        view = await self.jobs.view(job_id, request.state.tenant)
        return view if view is not None else _no_such_job()

    @_route("get", "/v1/jobs/{job_id}/result", summary="a finished job's result (as /v1/parse answers)")
    async def job_result(self, job_id: str, request: Request, format: Format | None = None,
                         view: bool = Query(False, description="each page also gets `view` (as /v1/parse's; "
                                            "no page image: jobs keep none)")):
        got = await self.jobs.rows(job_id, request.state.tenant)
        if got is None:
            return _no_such_job()
        st, page_rows = got
        refused = result_refusal(st)
        if refused is not None:
            return refused.response()
        count = next((r["page_count"] for r in page_rows if r["page_count"] is not None), None)
        result = {"id": job_id, **page_result(self.cfg.served_model_id, st["name"], page_rows, count,
                                              st["options"]["mode"])}
        return self._format(result, format, view)

    @_route("delete", "/v1/jobs/{job_id}", summary="cancel a job: its engine work stops")
    async def cancel_job(self, job_id: str, request: Request):
        view = await self.jobs.cancel(job_id, request.state.tenant)
        return view if view is not None else _no_such_job()

    # ---- OpenAI-compatible ----
    @_route("post", "/v1/chat/completions", summary="OpenAI-compatible: a page image in, its Markdown out")
    async def chat(self, body: ChatRequest, request: Request):
        resp = await chat_completion(body, cfg=self.cfg, runner=self.runner, tenant=request.state.tenant,
                                     model_info=await self._model())
        return self._answer("chat", resp)


def _no_such_job():
    """What the job routes answer for an unknown job, or another tenant's."""
    return Refusal(errors.JOB_NOT_FOUND, "no such job").response()


def make_ingress(cfg: ServeConfig):
    """The ingress class of one application, with its own FastAPI app (guard configured from ``cfg``)."""
    # no slash redirects: a 307's Location is built from the Host header the client sent
    api = FastAPI(title=TITLE, version="1", description=API_DESCRIPTION, docs_url=None, redoc_url=None,
                  redirect_slashes=False)
    guard = GuardConfig.from_serve(cfg)
    api.add_middleware(Guard, config=guard)  # before @serve.ingress, which keeps a copy of api as it is then
    errors.install(api)
    for handler in vars(IngressBase).values():
        if hasattr(handler, "http_route"):
            method, path, options = handler.http_route
            getattr(api, method)(path, **options)(handler)

    # defined here, so that its qualname (make_ingress.<locals>.Ingress) makes Serve ship the class by value
    class Ingress(IngressBase):
        pass

    Ingress.guard = guard
    return serve.ingress(api)(Ingress)


# ---- building the application ------------------------------------------------------------------------
def build_app(cfg: ServeConfig):
    """The Serve application for ``cfg``: ``serve.run(build_app(cfg))``. Each call is a new service
    instance, with its own job store folder unless ``cfg.job_store`` names one."""
    engine = serve.deployment(EngineReplica).options(
        name="Engine",
        ray_actor_options={"num_cpus": cfg.engine_cpus, "num_gpus": cfg.engine_gpus},
        max_ongoing_requests=cfg.engine_max_ongoing, max_queued_requests=cfg.engine_max_queued,
        autoscaling_config=AutoscalingConfig(
            min_replicas=cfg.engine_replicas[0], initial_replicas=cfg.engine_replicas[0],
            max_replicas=cfg.engine_replicas[1], target_ongoing_requests=cfg.target_ongoing_pages,
            upscale_delay_s=10, downscale_delay_s=300),
        health_check_period_s=5, health_check_timeout_s=60, graceful_shutdown_timeout_s=10,
    )
    ingress = serve.deployment(make_ingress(cfg)).options(
        name="Ingress", num_replicas=cfg.ingress_replicas, ray_actor_options={"num_cpus": cfg.ingress_cpus},
        max_ongoing_requests=cfg.ingress_max_ongoing, max_queued_requests=cfg.ingress_max_queued,
        backpressure_config=BackpressureConfig(status_code=503, retry_after_s=2),
        graceful_shutdown_timeout_s=10,
    )
    return ingress.bind(cfg, engine.bind(cfg), uuid.uuid4().hex[:12])


def app_builder(args: dict[str, Any]):
    """For Serve config files: ``import_path: padoc_ray.serve.app:app_builder`` with ``args`` as
    :meth:`ServeConfig.from_args` reads them (see cluster/serve.yaml)."""
    return build_app(ServeConfig.from_args(args))


__all__ = ["EngineReplica", "app_builder", "build_app", "make_ingress"]
