"""The raster stage's machinery: isolated, time-boxed rendering (:mod:`.renderer`, :mod:`.worker`;
:mod:`.inprocess` without the isolation), what rendering a document yields (:mod:`.events`), and the
lossless encodings rendered pages travel in (:mod:`.codec`). Knows nothing of Ray.

:mod:`.document` (imported on its own: it needs pyarrow, which a renderer process never loads)
turns one document's renderer events into page rows, for the batch job and the service alike."""

from padoc_ray.raster.codec import ENCODINGS, decode_image, encode_image
from padoc_ray.raster.events import DocFailed, Opened, PageFailed, PageRendered
from padoc_ray.raster.inprocess import InProcessRenderer
from padoc_ray.raster.renderer import RENDER_CRASHED, RENDER_TIMEOUT, IsolatedRenderer, RendererConfig, renderer_for

__all__ = ["ENCODINGS", "RENDER_CRASHED", "RENDER_TIMEOUT", "DocFailed", "InProcessRenderer", "IsolatedRenderer",
           "Opened", "PageFailed", "PageRendered", "RendererConfig", "decode_image", "encode_image", "renderer_for"]
