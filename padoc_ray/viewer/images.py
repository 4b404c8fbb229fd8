"""Page images for the viewer: rendered on demand from the row's source, at the row's own size, and cached.

The batch job stores no images; a page is re-rendered from ``source_uri`` (local or s3) as
``padoc-ray show`` does. ``--source-root DIR`` relocates the inputs: the prefix all the output's
sources share is replaced by DIR (the input tree was moved or mounted elsewhere).

An output may come from someone else (a shared S3 prefix), and its rows name the files the viewer
reads: every source is confined (:func:`confined`). With ``--source-root`` it must lie under that
folder once ``..`` and links are resolved; without it, under the output's own common input folder,
unless the user opts out (``--any-source``).
"""

from __future__ import annotations

import io
import os
import threading
from collections import OrderedDict

from padoc_ray.storage import StorageConfig, is_s3, under_prefix


def confined(path: str, root: str) -> bool:
    """Whether ``path`` lies under ``root``: local paths after resolving ``..`` and links; an s3:// key
    holding a ``.`` or ``..`` part never (S3 keys are literal: such a key is nobody's input)."""
    if is_s3(path) and any(part in (".", "..") for part in path[len("s3://"):].split("/")):
        return False
    return under_prefix(path, root)


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
                 cache_pages: int = 256, confine: str | None = None):
        self.storage, self.source_root, self.prefix = storage, source_root, prefix
        #: every source read must lie under this (None: anywhere): the source root, else the output's own prefix
        self.confine = source_root or confine
        self.cache: OrderedDict[tuple, bytes] = OrderedDict()
        self.cache_pages = cache_pages
        self.lock = threading.Lock()
        self.renders = 0  #: pages rendered (not served from the cache)

    def locate(self, uri: str) -> str:
        """Where the source of ``uri`` is read from; :class:`~padoc_ray.output.show.ShowError` when that
        lies outside what the viewer may read (:attr:`confine`)."""
        path = uri
        if self.source_root:
            rest = uri[len(self.prefix):] if self.prefix and uri.startswith(self.prefix) else os.path.basename(uri)
            path = os.path.join(self.source_root, rest) if "://" not in self.source_root else \
                self.source_root.rstrip("/") + "/" + rest
        if self.confine and not confined(path, self.confine):
            from padoc_ray.output.show import ShowError

            where = "--source-root" if self.source_root else "the output's common input folder (--any-source: any)"
            raise ShowError(f"the source {uri} lies outside {where} {self.confine}: not read")
        return path

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
