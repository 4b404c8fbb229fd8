"""Render a document in the caller's own process: :class:`InProcessRenderer`, the interface of
:class:`~padoc_ray.raster.renderer.IsolatedRenderer` with no deadline and no crash isolation (a
pdfium crash ends the caller). For benchmarks, for ``--no-render-isolation``, and for tools that
render one known-good page; :func:`~padoc_ray.raster.renderer.renderer_for` picks one of the two."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Iterator

from padoc_ray.pdf import PdfError, RenderConfig
from padoc_ray.raster.events import DocFailed, Event, Opened, PageFailed, PageRendered, Selector

if TYPE_CHECKING:  # renderer_for (in .renderer) makes these: no import back at run time
    from padoc_ray.raster.renderer import RendererConfig


class InProcessRenderer:
    """Renders in this process: no deadline, no crash isolation."""

    def __init__(self, cfg: RendererConfig | None = None):
        self.cfg = cfg  #: the config it was chosen by (None: the defaults); none of its limits applies here

    def render_document(self, data: bytes, name: str, select: Selector, render: RenderConfig, encoding: str, *,
                        max_frames: int | None = None, cancel: threading.Event | None = None) -> Iterator[Event]:
        """As :meth:`IsolatedRenderer.render_document`; ``cancel`` is seen between pages only."""
        from padoc_ray.pdf import ImageDocument, ReusedBitmapBuffer, is_repaired, open_document
        from padoc_ray.raster.worker import render_encoded

        buffer = ReusedBitmapBuffer()
        try:
            doc = open_document(data, max_frames=max_frames)
        except PdfError as e:
            yield DocFailed(e.code, e.message, getattr(e, "count", None))
            return
        try:
            yield Opened(len(doc), not isinstance(doc, ImageDocument) and is_repaired(doc))
            try:
                pages = select(len(doc))
            except PdfError as e:
                yield DocFailed(e.code, e.message, len(doc))
                return
            for i in pages:
                if cancel is not None and cancel.is_set():
                    return
                try:
                    meta, payload = render_encoded(doc, i, render, encoding, buffer)
                except PdfError as e:
                    yield PageFailed(i, e.code, e.message)
                else:
                    yield PageRendered(i, meta, payload)
        finally:
            doc.close()

    def close(self) -> None:
        pass
