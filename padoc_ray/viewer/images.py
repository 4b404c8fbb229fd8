"""Page images for the viewer: rendered on demand from the row's source, at the row's own size, and cached.

The batch job stores no images; a page is re-rendered from ``source_uri`` (local or s3) as
``padoc-ray show`` does. ``--source-root DIR`` relocates the inputs: the prefix all the output's
sources share is replaced by DIR (the input tree was moved or mounted elsewhere).
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict

from padoc_ray.storage import StorageConfig


def common_prefix(uris: list[str]) -> str:
    """The folder prefix (ending in ``/``) every one of ``uris`` starts with ("" when none)."""
    if not uris:
        return ""
    lo, hi = min(uris), max(uris)
    n = 0
    while n < min(len(lo), len(hi)) and lo[n] == hi[n]:
        n += 1
    return lo[:lo.rfind("/", 0, n) + 1] if "/" in lo[:n] else ""


class PageImages:
    """PNG bytes of pages, least recently used ones dropped past ``cache_pages``."""

    def __init__(self, storage: StorageConfig, *, source_root: str | None = None, prefix: str = "",
                 cache_pages: int = 256):
        self.storage, self.source_root, self.prefix = storage, source_root, prefix
        self.cache: OrderedDict[tuple, bytes] = OrderedDict()
        self.cache_pages = cache_pages
        self.lock = threading.Lock()
        self.renders = 0  #: pages rendered (not served from the cache)

    def locate(self, uri: str) -> str:
        if not self.source_root:
            return uri
        rest = uri[len(self.prefix):] if self.prefix and uri.startswith(self.prefix) else os.path.basename(uri)
        return os.path.join(self.source_root, rest) if "://" not in self.source_root else \
            self.source_root.rstrip("/") + "/" + rest

    def png(self, row: dict) -> bytes:
        """The page of ``row`` as PNG; :class:`padoc_ray.output.show.ShowError` when its source cannot be read."""
        from padoc_ray.output.show import render_source

        key = (row["source_uri"], row["doc_id"], row["page_index"], row.get("image_width"), row.get("image_height"))
        with self.lock:
            if key in self.cache:
                self.cache.move_to_end(key)
                return self.cache[key]
        img = render_source({**row, "source_uri": self.locate(row["source_uri"])}, self.storage)
        buf = io.BytesIO()
        img.convert("RGB").save(buf, "PNG", optimize=False)
        data = buf.getvalue()
        with self.lock:
            self.renders += 1
            self.cache[key] = data
            while len(self.cache) > self.cache_pages:
                self.cache.popitem(last=False)
        return data
