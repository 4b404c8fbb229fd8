"""One engine host: everything about running pages on one engine, shared by every surface.

The batch job's engine actors (:class:`padoc_ray.pipeline.stages.EngineStage`), the Serve engine
replica (:mod:`padoc_ray.serve`), local parsing (``demo``, ``parse-page``) and ``bench replay`` are
thin adapters over :class:`PageHost`; the batch job and the Serve replica start theirs with
:meth:`PageHost.from_config` and run page rows with :func:`parse_row`. It owns:

* starting the engine (vLLM with the machine's preset, or the no-op engine) and the checkpoint's
  protocol;
* pages in flight (a semaphore) and branch admission (a cap on live branches across pages);
* the engine's time per page: one :class:`~padoc_ray.scheduler.meter.EngineMeter` splits the engine's
  busy time among the requests of every page it runs (each record's ``engine_s``; they add up to
  :meth:`PageHost.stats`' ``engine_busy_s``);
* teacher-forcing truth (``--replay``), matched by the page's source file name and page index;
* the page-id and ``cache_salt`` policy: both come from the content hash (and the tenant), never
  from a client-supplied name, so two different files with one name never share cached image
  embeddings or prefix blocks;
* the error contract: *any* exception while a page runs becomes that page's record with a status
  and message (the page's live requests are aborted by the runner first); only an engine death
  (:class:`~padoc_ray.engine.interface.EngineDeadError`) is fatal: it propagates, and the host
  refuses every later page, so its owner can restart it (Ray restarts the actor or replica).

Metrics (:mod:`padoc_ray.metrics`): every page's record is counted when it returns, and pages in
flight are a gauge; they go to Ray's metrics agent inside Ray and nowhere otherwise.

Ray-free: imports neither ray nor vllm at module level (vLLM is imported when the engine starts).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from dataclasses import dataclass, replace
from typing import Any, AsyncIterator, Mapping

from padoc_ray import metrics
from padoc_ray.knobs import knob
from padoc_ray.engine.interface import EngineDeadError, GenRequest
from padoc_ray.engine.memory import freeze_startup_heap, paused_gc, thaw_heap
from padoc_ray.protocol import Page
from padoc_ray.scheduler import EventSink, PageInput, PageRecord, RegionEvent, SchedulerConfig, replay_input, run_page
from padoc_ray.scheduler.meter import EngineMeter
from padoc_ray.scheduler.replay import inject_loops
from padoc_ray.scheduler.runner import branch_admission
from padoc_ray.scheduler.slots import PrioritySlots
from padoc_ray.scheduler.config import DECODE_MODES, SCHEDULER_FLAGS
from padoc_ray.status import IMAGE_UNREADABLE, INTERNAL_ERROR, UNSUPPORTED_MODE

logger = logging.getLogger(__name__)

ENGINES = ("vllm", "noop")


def _max_num_seqs(n: int | None) -> dict:
    """``--max-num-seqs N``: the engine overrides it stands for (none: the preset's)."""
    return {"max_num_seqs": n} if n else {}


def _max_num_seqs_of(overrides: Mapping[str, Any]) -> int | None:
    return overrides.get("max_num_seqs")


@dataclass(frozen=True, kw_only=True)
class HostConfig:
    """How one engine host runs pages. Engine settings: the machine's preset (see
    :func:`padoc_ray.engine.config.engine_preset`) plus ``engine_overrides``."""

    #: "vllm", or "noop" (no model: every page is an empty layout; measures overhead)
    engine: str = knob("vllm", choices=("vllm", "noop"))
    preset: str = "auto"  #: engine preset: auto (gpu when CUDA is visible, else cpu), gpu or cpu
    #: EngineConfig fields on top of the preset; on the command line: --max-num-seqs
    engine_overrides: Mapping[str, Any] = knob(factory=dict, flags=("--max-num-seqs",), dest="max_num_seqs",
                                               parse="int", to_field=_max_num_seqs, from_field=_max_num_seqs_of,
                                               help="engine max_num_seqs", default_text="the engine preset's")
    #: per-page limits (every field is a flag)
    scheduler: SchedulerConfig = knob(factory=SchedulerConfig, nested=SCHEDULER_FLAGS)
    #: fork: the PaDoc layout stream + concurrent content branches; sequential: one interleaved stream (the
    #: paper's baseline). The mode of a page that names none
    mode: str = knob("fork", choices=DECODE_MODES)
    pages_in_flight: int = 16  #: pages run concurrently on the engine (more wait their turn)
    #: cap on content branches live in the engine at once (None: none)
    max_live_branches: int | None = knob(None, default_text="no cap")
    #: benchmarks: the share of teacher-forced branches whose first attempt is forced to repeat a phrase
    #: to its token limit (chosen per page by ``inject_seed``); every later attempt replays the truth. 0: none
    inject_loops: float = knob(0.0, metavar="FRACTION")
    #: picks the branches inject_loops forces to loop (the same seed, the same branches)
    inject_seed: int = knob(0, flags=("--seed",), metavar="N")

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if self.preset not in ("auto", "gpu", "cpu"):
            raise ValueError(f"preset must be auto, gpu or cpu, got {self.preset!r}")
        if self.mode not in DECODE_MODES:
            raise ValueError(f"mode must be fork or sequential, got {self.mode!r}")
        if self.pages_in_flight < 1:
            raise ValueError("pages_in_flight must be >= 1")
        if self.max_live_branches is not None and self.max_live_branches < 1:
            raise ValueError("max_live_branches must be >= 1 (or None for no cap)")
        if not 0.0 <= self.inject_loops <= 1.0:
            raise ValueError(f"inject_loops is a fraction of branches in [0, 1], got {self.inject_loops!r}")

    def engine_config(self, model_dir: str):
        """The engine's settings for the checkpoint in ``model_dir``: the preset, the family's needs
        (:func:`family_engine_overrides`), then ``engine_overrides``."""
        from padoc_ray.engine.config import engine_preset

        over = {**family_engine_overrides(model_dir), **self.engine_overrides}
        if self.scheduler.layout_priority or self.scheduler.page_priority:  # request priorities need it
            over.setdefault("scheduling_policy", "priority")
        cfg = engine_preset(model_dir, self.preset, **over)
        if cfg.extra.get("speculative_config") and family_of(model_dir) == "hpd":
            from padoc_ray.protocol import ProtocolError

            raise ProtocolError("no speculative decoding for an HPD-Parsing checkpoint: its P-MTP head feeds the "
                                "token embedding back in, which stock vLLM's Medusa heads cannot do")
        return cfg


@dataclass(frozen=True, kw_only=True)
class PageRequest:
    """One page to run on a :class:`PageHost` (a request to the host, not the host). Give ``image``
    (PIL) or ``image_bytes`` (see :mod:`padoc_ray.raster.codec`)."""

    doc_id: str  #: content hash of the document (sha256 of its bytes): names the page in the engine
    page_index: int  #: 0-based
    image: Any = None
    image_bytes: bytes | memoryview | None = None
    width: int | None = None  #: pixel size; taken from the image when not given
    height: int | None = None
    source_name: str | None = None  #: the file's name: matches replay truth; never a cache key
    mode: str | None = None  #: None: the host's mode
    tenant: str = ""  #: namespaces page ids and cache salts between clients ("" for the batch job)
    #: extra cache namespace (e.g. a request id): requests with different salts share no prefix blocks
    salt: str | None = None
    #: lower runs first: in the host's queue of pages waiting for a turn and, under vLLM's priority
    #: scheduling policy, in the engine (Serve: 0 for interactive pages, 1 for job pages)
    priority: int = 0
    #: the page's text layer (:func:`padoc_ray.pdf.page_text_layer`): drafts for its text branches, checked
    #: by the model (the content stays the model's own); None: none
    text_layer: Any = None


def page_identity(doc_id: str, page_index: int, tenant: str = "", salt: str | None = None) -> tuple[str, str]:
    """(page id, cache salt) of a page: both from the content hash, the tenant and ``salt``. The
    page id is vLLM's multimodal uuid (its image cache key); the cache salt namespaces prefix
    caching per document, so a document's pages share their image and layout prefix and nothing
    else. With a ``salt`` (one per request online) a request shares nothing with another, not even
    the image cache: vLLM (0.32) fails a request (finish reason "error", no token) whose image uuid
    belonged to a request aborted before the engine had its image (a client that disconnected)."""
    key = doc_id if not tenant else hashlib.sha256(f"{tenant}\0{doc_id}".encode()).hexdigest()
    if salt is not None:
        key = hashlib.sha256(f"{key}\0{salt}".encode()).hexdigest()
    return f"{key[:16]}:{page_index}", key


def error_record(page_id: str, mode: str, code: str, message: str, width: int = 0, height: int = 0,
                 page_no: int = 0) -> PageRecord:
    """The record of a page that failed outside the scheduler (its image, an unexpected error)."""
    return PageRecord(page_id=page_id, mode=mode, status=code, valid=False,
                      page=Page(width=width or 0, height=height or 0, page_no=page_no), message=message[:2000])


class PageHost:
    """Hosts one engine. Create it, ``await start()`` inside the event loop that will run pages
    (vLLM's output handler lives on that loop), then ``await parse(page)`` concurrently."""

    def __init__(self, model_dir: str, cfg: HostConfig = HostConfig(), *, truth: Mapping | None = None,
                 engine=None, model_protocol=None):
        self.model_dir, self.cfg = model_dir, cfg
        #: teacher forcing: {(file name, page index): Page}, see padoc_ray.groundtruth.Truth
        self.truth = truth if truth is not None else {}
        self.engine = engine  # tests and benchmarks may hand in an engine they own
        self._own_engine = engine is None
        self.model_protocol = model_protocol
        self.sem: asyncio.Semaphore | None = None
        self.admission: asyncio.Semaphore | None = None
        #: the engine's busy time and each page's share of it (every page on this host's engine goes through it)
        self.meter = EngineMeter()
        self.dead: str | None = None  # why the engine died, once it has
        self.pages_running = 0
        #: records this host returned (ok or not, prepared or refused before the engine): what its metric counts
        self.pages_done = 0
        self.pages_admitted = 0  #: admission order of pages (SchedulerConfig.page_priority)
        self.started = False

    # ---- life cycle ---------------------------------------------------------------------------------
    @classmethod
    async def from_config(cls, model: str, cfg: HostConfig, storage_cfg=None,
                          replay_gt: str | None = None) -> "PageHost":
        """A started host for the checkpoint ``model`` (local or s3://, fetched with ``storage_cfg``,
        a :class:`~padoc_ray.storage.StorageConfig`), with the teacher-forcing truth of ``replay_gt``
        (OmniDocBench-format ground truth) when given. Await it in the loop that will run pages."""
        from padoc_ray.groundtruth import truth_from_json
        from padoc_ray.storage import read_bytes, StorageConfig
        from padoc_ray.modelstore import local_model_dir

        storage_cfg = storage_cfg if storage_cfg is not None else StorageConfig()
        truth = truth_from_json(read_bytes(replay_gt, storage_cfg)) if replay_gt else {}
        return await cls(local_model_dir(model, storage_cfg), cfg, truth=truth).start()

    async def start(self) -> "PageHost":
        if self.started:
            return self
        with paused_gc():  # the tokenizer's and vLLM's imports: 1.7-2 CPU-s less (padoc_ray.engine.memory)
            self._start()
            if self._own_engine:  # what its start left lives on: out of each collection's walk (shutdown thaws it).
                freeze_startup_heap()  # Inside the pause: the first collection after it would walk all of it again
        self.started = True
        logger.info("page host pid %d ready (model %s, engine %s)", os.getpid(), self.model_dir, self.cfg.engine)
        return self

    def _start(self) -> None:
        if self.model_protocol is None:
            from padoc_ray.tokenizer import ModelProtocol

            self.model_protocol = ModelProtocol(self.model_dir)
        check_family(self.model_protocol, self.cfg)
        self.cfg = family_host_config(self.cfg, getattr(self.model_protocol, "family", "padoc"))
        self.sem = PrioritySlots(self.cfg.pages_in_flight)
        self.admission = branch_admission(self.cfg.max_live_branches)
        if self.engine is None:
            if self.cfg.engine == "noop":
                from padoc_ray.engine.fake import ScriptedEngine

                eos = self.model_protocol.vocab.end_of_stream
                self.engine = ScriptedEngine(lambda req: [eos], record=False)  # long-running: keep nothing
            else:
                from padoc_ray.engine.vllm_engine import VllmEngine

                self.engine = VllmEngine(self.cfg.engine_config(self.model_dir))

    def shutdown(self) -> None:
        if self.engine is not None and self._own_engine:
            self.engine.shutdown()
        if self.started and self._own_engine:  # start froze the heap: the engine's cycles can go now
            thaw_heap()
        self.engine = None
        self.started = False

    def shutdown_dead_engine(self) -> None:
        """:meth:`shutdown` for a host whose engine died, just before the process hosting it goes (a batch
        engine actor's ``os._exit``, Serve's kill of an engine replica whose health check failed, neither of
        which runs a finalizer): the engine's core ends if it still runs and its temp folder goes. Never
        raises: the process goes either way (a failure is logged)."""
        try:
            self.shutdown()
        except Exception:  # noqa: BLE001 - the caller exits or fails its health check next
            logger.exception("shutting the dead engine down failed")

    # ---- state ------------------------------------------------------------------------------------------
    def unfinished_requests(self) -> int:
        return self.engine.num_unfinished_requests() if self.engine is not None else 0

    def stats(self) -> dict:
        return {"pages_running": self.pages_running, "pages_done": self.pages_done,
                "unfinished_requests": self.unfinished_requests(), "engine_dead": self.dead is not None,
                "engine_busy_s": round(self.meter.busy_s(), 3)}

    async def probe(self, timeout_s: float = 60.0) -> None:
        """One one-token, text-only request: raises unless the engine answers within ``timeout_s``."""
        self._check_alive()
        prompt = list(self.model_protocol.prompt_ids("fork"))[:4] or [0]
        req = GenRequest(request_id=f"probe-{time.monotonic_ns()}", prompt_ids=prompt, max_tokens=1)

        async def go():
            async for d in self.engine.generate(req):
                if d.finished:
                    return

        try:
            await asyncio.wait_for(go(), timeout_s)
        except EngineDeadError as e:
            self.dead = str(e) or "engine died"
            raise

    def _check_alive(self) -> None:
        if self.dead is not None:  # first: a host whose dead engine was shut down is still a dead one
            raise EngineDeadError(f"the engine died earlier: {self.dead}")
        if not self.started:
            raise RuntimeError("PageHost.start() was not awaited")

    # ---- pages ------------------------------------------------------------------------------------------
    async def parse(self, page: PageRequest, *, on_event: EventSink | None = None) -> PageRecord:
        """Run one page; returns its record whatever happened to it. Raises only
        :class:`EngineDeadError` (the engine is gone) and :class:`asyncio.CancelledError`.
        ``on_event`` receives its region events as they happen (see :meth:`events`)."""
        rec = await self._parse(page, on_event)
        self.pages_done += 1  # one home with the metric: the stat and ray_padoc_pages_total{stage="engine"} agree
        metrics.get().page(rec)
        return rec

    async def events(self, page: PageRequest) -> AsyncIterator[dict | PageRecord]:
        """Run one page, yielding its events as they happen, then its record (the last item):

        * ``{"event": "region", "page_index", "order", "bbox": [x1, y1, x2, y2], "category"}`` when
          the layout stream closes a region (box normalized 0-1, origin top-left, as in page rows);
        * ``{"event": "content", "page_index", "order", "markdown"}`` when its branch has finished:
          its block in the page's Markdown (None: it has none there, e.g. a page header).

        Every region of the finished page gets one of each, its box first; the blocks in reading
        order, joined by a blank line, are the page's Markdown. A page that fails before it runs
        (an unreadable image) yields its record only. Closing the iterator early cancels the page."""
        queue: asyncio.Queue = asyncio.Queue()
        done = object()
        task = asyncio.create_task(self.parse(page, on_event=queue.put_nowait))
        task.add_done_callback(lambda _: queue.put_nowait(done))
        try:
            while (item := await queue.get()) is not done:
                yield event_json(item, page.page_index)
            yield task.result()
        finally:
            if not task.done():
                task.cancel()
                await asyncio.gather(task, return_exceptions=True)

    def _in_flight(self, delta: int) -> None:
        self.pages_running += delta
        metrics.get().pages_in_flight(self.pages_running)

    async def _parse(self, page: PageRequest, on_event: EventSink | None = None) -> PageRecord:
        self._check_alive()
        mode = page.mode or self.cfg.mode
        page_id, cache_salt = page_identity(page.doc_id, page.page_index, page.tenant, page.salt)
        try:
            if mode not in DECODE_MODES:
                raise ValueError(f"mode must be fork or sequential, got {mode!r}")
            if mode not in getattr(self.model_protocol, "modes", DECODE_MODES):
                from padoc_ray.protocol.family import check_mode

                try:
                    check_mode(self.model_protocol.family, mode)
                except ValueError as e:
                    return error_record(page_id, mode, UNSUPPORTED_MODE, str(e), page.width or 0, page.height or 0,
                                        page.page_index)
            inp = self._input(page, page_id, cache_salt)
        except _Unreadable as e:
            return error_record(page_id, mode, IMAGE_UNREADABLE, str(e), page.width or 0, page.height or 0,
                                page.page_index)
        except Exception as e:  # noqa: BLE001 - the contract: any page error is that page's record
            logger.exception("page %s: could not be prepared", page_id)
            return error_record(page_id, mode, INTERNAL_ERROR, f"{type(e).__name__}: {e}", page.width or 0,
                                page.height or 0, page.page_index)
        async with self.sem.slot(page.priority):
            self._in_flight(+1)
            self.pages_admitted += 1
            inp = replace(inp, seq=self.pages_admitted, priority=page.priority)
            try:
                rec = await run_page(self.engine, self.model_protocol, inp, mode=mode, cfg=self.cfg.scheduler,
                                     admission=self.admission, on_event=on_event, meter=self.meter)
            except EngineDeadError as e:
                self.dead = str(e) or "engine died"
                raise
            except Exception as e:  # noqa: BLE001 - run_page cleaned up its requests before raising
                logger.exception("page %s: unexpected error", page_id)
                rec = error_record(page_id, mode, INTERNAL_ERROR, f"{type(e).__name__}: {e}", inp.width, inp.height,
                                   page.page_index)
            finally:
                self._in_flight(-1)
        return rec

    def _input(self, page: PageRequest, page_id: str, cache_salt: str) -> PageInput:
        img = page.image
        if img is None and page.image_bytes is not None and self.cfg.engine != "noop":
            # the no-op engine never looks at the image: do not decode it (it measures the pipeline alone)
            from padoc_ray.raster import decode_image

            try:
                img = decode_image(page.image_bytes)
            except Exception as e:  # noqa: BLE001
                raise _Unreadable(f"the page image could not be decoded: {type(e).__name__}: {e}") from None
        elif img is None and page.image_bytes is None:
            raise _Unreadable("the page has no image")
        width = page.width if page.width is not None else getattr(img, "width", None)
        height = page.height if page.height is not None else getattr(img, "height", None)
        if not width or not height:
            raise _Unreadable("the page image has no size")
        inp = PageInput(page_id=page_id, image=img, width=int(width), height=int(height), cache_salt=cache_salt,
                        page_no=page.page_index, image_path=page.source_name, text_layer=page.text_layer)
        truth = self.truth_for(page.source_name, page.page_index)
        if truth is not None:
            mode = page.mode or self.cfg.mode
            inp = replay_input(self.model_protocol, truth, inp, mode)
            if self.cfg.inject_loops and mode == "fork":
                key = f"{os.path.basename(page.source_name.rstrip('/'))}:{page.page_index}"
                inp = inject_loops(self.model_protocol, inp, fraction=self.cfg.inject_loops,
                                   seed=self.cfg.inject_seed, key=key, max_tokens=self.cfg.scheduler.max_tokens)
        return inp

    def truth_for(self, source_name: str | None, page_index: int) -> Page | None:
        if not self.truth or not source_name:
            return None
        return self.truth.get((os.path.basename(source_name.rstrip("/")), page_index))


class _Unreadable(Exception):
    pass


#: the generation limit of an hpd checkpoint's streams (its authors' max_tokens), where --max-tokens is left
#: at the padoc default
HPD_MAX_TOKENS = 8000
#: the context an hpd checkpoint needs at least (its authors' max_model_len)
HPD_MIN_MODEL_LEN = 16384


def family_of(model_dir: str) -> str | None:
    """The checkpoint family of ``model_dir`` (None: none padoc-ray knows, or not a local folder yet)."""
    from padoc_ray.protocol import ProtocolError
    from padoc_ray.protocol.family import recognize

    try:
        return recognize(model_dir).family
    except (ProtocolError, OSError):
        return None


#: the context a dots checkpoint needs at least (dots.ocr's client asks for up to 16,384 new tokens, after a page
#: image of up to ~4,800 tokens at 200 dpi)
DOTS_MIN_MODEL_LEN = 24576


def family_engine_overrides(model_dir: str) -> dict:
    """Engine settings a checkpoint's family needs: hpd loads InternVL's remote-code config
    (``trust_remote_code``) and runs with at least a 16,384-token context; dots loads its
    ``configuration_dots.py`` (vLLM registers no ``dots_ocr`` config) with at least 24,576."""
    family = family_of(model_dir)
    if family not in ("hpd", "dots"):
        return {}
    from padoc_ray.engine.config import EngineConfig

    need = HPD_MIN_MODEL_LEN if family == "hpd" else DOTS_MIN_MODEL_LEN
    return {"trust_remote_code": True, "max_model_len": max(EngineConfig.max_model_len, need)}


def family_host_config(cfg: HostConfig, family: str) -> HostConfig:
    """``cfg`` with the family's scheduler defaults where the flags left the padoc ones: an hpd stream's
    generation limit is its authors' 8,000 tokens."""
    from padoc_ray.scheduler import SchedulerConfig

    if family == "hpd" and cfg.scheduler.max_tokens == SchedulerConfig.max_tokens:
        return replace(cfg, scheduler=replace(cfg.scheduler, max_tokens=HPD_MAX_TOKENS))
    return cfg


def check_family(model_protocol, cfg: HostConfig) -> None:
    """Refuse, before any page runs, host settings the checkpoint's family cannot honour: a default mode it
    lacks (hpd has no sequential stream) and the layout grammar (``constrain_layout`` masks the padoc
    family's layout tokens; an hpd or dots layout is text). Raises ProtocolError (a ValueError)."""
    family = model_protocol if isinstance(model_protocol, str) else getattr(model_protocol, "family", "padoc")
    if family == "padoc":
        return
    from padoc_ray.protocol.family import check_mode

    check_mode(family, cfg.mode)
    if cfg.scheduler.constrain_layout:
        from padoc_ray.protocol import ProtocolError

        raise ProtocolError(f"--constrain-layout masks the padoc family's layout tokens; a {family} checkpoint "
                            f"writes its layout as text, which the grammar does not cover: leave it off")


def model_problem(model: str, cfg: HostConfig) -> str | None:
    """What stops ``cfg`` running on the checkpoint ``model``, said before a job starts (None: nothing seen):
    a mode or setting its family cannot honour. Checks local folders of a family it recognizes (an s3://
    checkpoint, or a folder that is none, is the engine hosts' to refuse once they load it)."""
    if "://" in model or not os.path.isdir(model):
        return None
    from padoc_ray.protocol import ProtocolError
    from padoc_ray.protocol.family import recognize

    try:
        family = recognize(model).family
    except (ProtocolError, OSError):
        return None
    try:
        check_family(family, cfg)
    except ProtocolError as e:
        return f"{model}: {e}"
    return None


def event_json(ev: RegionEvent, page_index: int) -> dict:
    """A region event as a JSON-ready dict (the NDJSON line of a streamed parse)."""
    out: dict[str, Any] = {"event": ev.kind, "page_index": page_index, "order": ev.order}
    if ev.kind == "region":
        out.update(bbox=[round(v, 6) for v in ev.region.box.as_tuple()], category=ev.region.category)
    else:
        out["markdown"] = ev.markdown
    return out


def row_request(row: dict, image: bytes | memoryview, *, tenant: str = "", salt: str | None = None,
                priority: int = 0) -> PageRequest:
    """The :class:`PageRequest` of a rendered page row and its encoded ``image``."""
    from padoc_ray.output.rows import TEXT_LAYER_KEY
    from padoc_ray.protocol.text_layer import TextLayer

    layer = row.get(TEXT_LAYER_KEY)
    return PageRequest(doc_id=row["doc_id"], page_index=row["page_index"], image_bytes=image,
                       width=row["image_width"], height=row["image_height"], source_name=row["source_uri"],
                       mode=row["mode"], tenant=tenant, salt=salt, priority=priority,
                       text_layer=TextLayer.from_bytes(layer) if layer else None)



async def parse_row(host: PageHost, row: dict, image: bytes | memoryview, *, tenant: str = "",
                    salt: str | None = None, priority: int = 0) -> dict:
    """Run the page of a rendered page row (the batch job's schema, see
    :func:`padoc_ray.raster.document.document_rows`) with its encoded ``image``; returns its
    finished row. The one path row -> :class:`PageRequest` -> row of the batch job's engine actors and
    the Serve engine replica. Raises what :meth:`PageHost.parse` raises (an engine death)."""
    from padoc_ray.output import rows

    rec = await host.parse(row_request(row, image, tenant=tenant, salt=salt, priority=priority))
    return rows.page_row(row, rec, render_s=row.get("render_s"))


async def stream_row(host: PageHost, row: dict, image: bytes | memoryview, *, tenant: str = "",
                     salt: str | None = None, priority: int = 0) -> AsyncIterator[dict]:
    """:func:`parse_row` with the page's region events: yields each event dict of
    :meth:`PageHost.events` as it happens, then ``{"event": "row", "row": <the finished row>}``."""
    from padoc_ray.output import rows

    async for item in host.events(row_request(row, image, tenant=tenant, salt=salt, priority=priority)):
        if isinstance(item, PageRecord):
            yield {"event": "row", "row": rows.page_row(row, item, render_s=row.get("render_s"))}
        else:
            yield item
