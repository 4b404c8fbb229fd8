"""Ray Data stages of the batch job: thin plumbing around pure code, no parsing logic.

* :func:`rasterize` (map_batches over input files, in tasks): read bytes, open the PDF, and yield
  one row per selected page with the rendered image (losslessly encoded, see padoc_ray.raster.codec),
  page by page, so a large document is never held whole as images. Rendering runs in a separate
  renderer process with deadlines, so a file that crashes or hangs the renderer costs its own rows
  only. Bad files become error rows, never exceptions.
* :class:`EngineStage` (map_batches over pages, in an actor pool): one vLLM engine with the
  layout-fork scheduler per actor, many pages in flight; a page error becomes its row's status,
  an engine death ends the actor process so Ray restarts it and retries its pages.

Metrics (:mod:`padoc_ray.metrics`): the engine actors record both stages: the render stage's error
rows and render times once a batch of rows is parsed (:func:`record_render`: a raster task's worker can exit
before its counts are exported), and the pages their engine host runs.
"""

from __future__ import annotations

import asyncio
import logging
import os
from typing import AsyncIterator, Iterator

import pyarrow as pa

from padoc_ray import metrics
from padoc_ray.pdf import doc_id_of
from padoc_ray.output import rows
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.pipeline import limits
from padoc_ray.pipeline.limits import listing_refusal
from padoc_ray.storage import ChangedDuringRead, LinkAtRead, LinkOutside, NotRegularFile, read_bytes
from padoc_ray.listing import walk_root, walks_folder
from padoc_ray.raster import DocFailed, renderer_for
from padoc_ray.raster.document import DocumentOpened, PageChoice, document_error_row, document_rows

logger = logging.getLogger(__name__)

#: the raster stage's rows: page rows with the encoded image and the page's text layer (TextLayer.to_bytes)
RASTER_SCHEMA = rows.PAGE_SCHEMA.append(pa.field("image_bytes", pa.binary())).append(
    pa.field(rows.TEXT_LAYER_KEY, pa.binary()))


def _doc_error(base: dict, doc_id: str | None, code: str, message: str, page_count: int | None = None) -> pa.Table:
    """The one row of a document that cannot be parsed at all (``page_index = -1``)."""
    row = document_error_row({**base, "doc_id": doc_id}, code, message, page_count)
    return pa.Table.from_pylist([{**row, "image_bytes": None}], schema=RASTER_SCHEMA)


def page_choice(cfg: BatchConfig) -> PageChoice:
    """The batch job's page selection: ``--pages`` (pages past the end dropped), the first
    ``--max-pages-per-doc``, refused over ``--doc-page-limit`` (``too_many_pages``)."""
    return PageChoice(wanted=cfg.inputs.pages, first=cfg.inputs.max_pages_per_doc, cap=cfg.inputs.limits.max_doc_pages,
                      cap_message=limits.page_cap_message)


def rasterize(batch: pa.Table, cfg: BatchConfig, model_id: str) -> Iterator[pa.Table]:
    """Input rows: ``uri``, ``size`` and ``mtime`` (the listing's, recorded in every row), ``done`` (page
    indices already written) and ``doc_id`` (the version those pages are of; a file whose bytes differ now
    is parsed again in full). Yields page rows."""
    for item in batch.to_pylist():
        uri, done = item["uri"], set(item["done"] or ())
        base = dict(run_id=cfg.run_id, uri=uri, mode=cfg.mode, model_id=model_id, source_size=item["size"],
                    source_mtime=item.get("mtime"))
        if item["size"] is not None and item["size"] < 0:
            yield _doc_error(base, None, *listing_refusal(item["size"], cfg.inputs.limits))
            continue
        yield from _rasterize_doc(uri, done, cfg, base, item.get("doc_id"))


def _rasterize_doc(uri: str, done: set[int], cfg: BatchConfig, base: dict,
                   done_doc_id: str | None = None) -> Iterator[pa.Table]:
    """Render page by page in this worker's renderer process (crash- and hang-isolated, see
    padoc_ray.raster.renderer); rows leave in tables of up to ``raster_pages_per_block`` pages (or
    ``raster_block_mb`` of images), so a large document is never held whole and small ones do not
    cost one Ray object per page."""
    try:
        # a folder or glob's files are read from its folder, following no link on the way (unless links are
        # followed: then the file must still be inside it); a manifest line or one named file as named
        data = read_bytes(uri, cfg.storage, max_bytes=cfg.inputs.limits.max_file_bytes,
                          follow_links=cfg.inputs.follow_symlinks or not walks_folder(cfg.input),
                          root=walk_root(cfg.input))
    except LinkOutside as e:  # a followed link (or folder) swapped to lead outside after the listing
        yield _doc_error(base, None, limits.SYMLINK_OUTSIDE, str(e))
        return
    except LinkAtRead as e:  # swapped for a link after a listing that follows none: the listing's own code
        yield _doc_error(base, None, limits.SYMLINK, str(e))
        return
    except NotRegularFile as e:  # swapped for a FIFO (or folder) after the listing
        yield _doc_error(base, None, limits.NOT_REGULAR_FILE, str(e))
        return
    except ChangedDuringRead as e:  # a mix of two versions: nothing of it is parsed (a rerun reads it again)
        yield _doc_error(base, None, limits.CHANGED_DURING_READ, str(e))
        return
    except OSError as e:  # TimeoutError included: the read has a deadline (StorageConfig.read_timeout_s)
        yield _doc_error(base, None, limits.READ_FAILED, str(e) or type(e).__name__)
        return
    too_large = listing_refusal(len(data), cfg.inputs.limits)  # the file grew past the cap after it was listed
    if too_large is not None:
        yield _doc_error(base, None, too_large[0], f"more than {cfg.inputs.limits.max_file_bytes} bytes when read "
                                                   f"(--file-size-limit-mb)")
        return
    doc_id = doc_id_of(data)
    if done and done_doc_id and doc_id != done_doc_id:
        # the file's bytes changed since its done pages were written: those pages are of another version
        logger.info("doc %s changed since its rows were written (was %s): parsed again in full", uri, done_doc_id[:12])
        done = set()
    pending: list[dict] = []
    pending_bytes = 0
    render = cfg.raster.render.with_text_layer(cfg.engines.host.scheduler.text_layer)  # layers only where drafts use them
    for item in document_rows(renderer_for(cfg.raster.renderer), data, os.path.basename(uri.rstrip("/")),
                              {**base, "doc_id": doc_id}, page_choice(cfg), render, cfg.raster.encoding,
                              max_frames=cfg.inputs.limits.max_image_frames, skip=done):
        if isinstance(item, DocFailed):
            yield _doc_error(base, doc_id, item.code, item.message, item.page_count)
            return
        if isinstance(item, DocumentOpened):
            logger.info("doc %s (%s): %d pages, %d selected, %d already done", doc_id[:12], uri, item.page_count,
                        len(item.selected), len(item.selected) - len(item.pages))
            continue
        if item.rendered:
            pending_bytes += len(item.image)
        pending.append({**item.row, "image_bytes": item.image})
        if len(pending) >= cfg.raster.pages_per_block or pending_bytes >= cfg.raster.block_mb << 20:
            yield pa.Table.from_pylist(pending, schema=RASTER_SCHEMA)
            pending, pending_bytes = [], 0
    if pending:
        yield pa.Table.from_pylist(pending, schema=RASTER_SCHEMA)


def missing_engine_resources(cfg: BatchConfig, cluster: dict[str, float]) -> str | None:
    """A warning when no node of the cluster now has the custom resources one engine actor asks for
    (``cfg.engines.engine_resources``; ``cluster`` is ``ray.cluster_resources()``): its actors then wait for
    such a node to join (an autoscaler may add one), else the job never finishes."""
    short = {k: v for k, v in cfg.engines.engine_resources.items() if cluster.get(k, 0.0) < v}
    if not short:
        return None
    have = ", ".join(f"{k}={cluster.get(k, 0.0):g}" for k in short)
    return (f"--engine-resources asks {dict(short)} per engine actor, but the cluster has {have}: engine actors "
            f"wait until a node with these resources joins (ray start --resources '{{...}}')")


def record_render(row: dict) -> None:
    """The render stage's metrics of one raster row (a document error, a page whose rendering failed,
    or a rendered page and its render time), recorded by the engine actor that receives the row, not
    by the raster task that made it. A raster task's worker may exit soon after its task (Ray ends
    idle workers after a second), and what a worker recorded since its last periodic push (every few
    seconds) reaches the metrics agent only if the flush at its exit, which Ray bounds at 0.5 s, gets
    through; under load some did not, and the count was lost for good. An engine actor lives for the
    whole run, and it receives every row of the stage. :class:`EngineStage` records a batch's rows
    when their output is ready, so a batch that Ray retries after an engine death counts once."""
    m = metrics.get()
    if row["page_index"] < 0:
        m.document_error(row["status"])
    elif row.get("status") is not None:
        m.render_failed(row["status"])
    else:
        m.rendered(row.get("render_s"))


class EngineStage:
    """One :class:`~padoc_ray.host.PageHost` per actor, created inside the actor's event loop on the
    first batch. A page error is its row's status; an engine death ends the actor process, so Ray
    restarts the actor and retries its batches."""

    def __init__(self, cfg: BatchConfig):
        self.cfg = cfg
        self.host = None
        self._init_lock = asyncio.Lock()

    async def _ensure_host(self) -> None:
        if self.host is not None:
            return
        async with self._init_lock:
            if self.host is not None:
                return
            from padoc_ray.host import PageHost

            self.host = await PageHost.from_config(self.cfg.model, self.cfg.engines.host, self.cfg.storage,
                                                   self.cfg.replay_gt)

    async def __call__(self, batch: pa.Table) -> AsyncIterator[pa.Table]:
        from padoc_ray.engine.interface import EngineDeadError

        await self._ensure_host()
        # image bytes stay in Arrow until a page needs them (the no-op engine never does)
        images = batch.column("image_bytes")
        metas = batch.drop_columns(["image_bytes"]).to_pylist()
        tasks = [asyncio.create_task(self._one(r, images[i])) for i, r in enumerate(metas)]
        try:
            # One table per batch, in input order: a batch retried after an actor death yields exactly
            # the same output, so Ray's retry can neither duplicate nor drop rows. Pages of a batch run
            # concurrently; several batches are in flight per actor (see job._pipeline).
            out = [await t for t in tasks]
        except EngineDeadError:
            logger.exception("engine died in actor pid %d: exiting so Ray restarts the actor", os.getpid())
            if self.host is not None:
                self.host.shutdown_dead_engine()  # os._exit runs no finalizer: the engine's folder would stay
            os._exit(1)
        for r in metas:  # once the batch's output exists: a batch retried after an engine death counts once
            record_render(r)
        yield rows.to_table(out)

    async def _one(self, row: dict, image: pa.BinaryScalar) -> dict:
        from padoc_ray.host import parse_row

        if row.get("status") is not None or not image.is_valid:
            return row  # an error row from rasterization: passes through
        out = await parse_row(self.host, row, image.as_buffer())
        logger.info("page %s:%d %s in %.2fs", row["doc_id"][:12], row["page_index"], out["status"], out["e2e_s"] or 0.0)
        return out
