"""Handing an engine's free heap memory back to the operating system.

glibc's ``malloc`` keeps the memory a process frees: it goes back to the OS only from the top of a
heap, so one live block high in the heap pins every free page below it. A serving engine frees
buffers of many sizes every step (images, activations, token lists), so its RSS holds freed memory:
mid-run in a ``bench replay`` (64 pages, 16 in flight) glibc's ``malloc_info`` showed 94 MB free inside
the tiny model's engine-core heaps, and ``malloc_trim(0)`` took its RSS from 1,381 to 1,327 MB.
``malloc_trim(0)`` returns the free pages in the middle of every heap (``MADV_DONTNEED``) without
moving live data (returning 477 MB of freed 100 kB blocks took 40 ms here). In a 50-minute
``bench soak --engine vllm`` a release every 60 s kept the engine core about 80 MB lower (mean
1,574 MB against 1,656 in the 60-minute run without it); it did not stop its slow creep (see the
README's soak section).

Fixing the allocator instead costs throughput: a fixed mmap threshold (``MALLOC_TRIM_THRESHOLD_``,
what dask sets for its workers) made the CPU engine 16-19% slower (fork, 32 pages at 16 in flight:
1.34-1.42 against 1.64-1.68 pages/s), because every buffer over 128 KiB is then mapped and faulted
in anew each step.

:func:`release_free_heap` trims the calling process. :class:`FreeHeapExtension` is a vLLM worker
extension (``worker_extension_cls``) that lets ``collective_rpc`` run it in the engine's worker
process, which under the CPU preset (``executor="uni"``) is the engine core itself.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import os
import sys

#: the worker method ``collective_rpc`` calls (a name no vLLM worker has)
RPC_METHOD = "padoc_release_free_heap"
EXTENSION = f"{__name__}.FreeHeapExtension"


@functools.cache
def _malloc_trim():
    """glibc's ``malloc_trim``, or None (not Linux, musl, or no libc found)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    fn.argtypes, fn.restype = [ctypes.c_size_t], ctypes.c_int
    return fn


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trim_heap() -> bool:
    """glibc's ``malloc_trim(0)`` on this process; False where it is not available (nothing done)."""
    trim = _malloc_trim()
    if trim is None:
        return False
    trim(0)
    return True


def release_free_heap() -> dict | None:
    """:func:`trim_heap`, measured: ``{"pid", "rss_before", "rss_after"}`` (bytes), or None where
    glibc's ``malloc_trim`` is not available."""
    if _malloc_trim() is None:
        return None
    before = _rss_bytes()
    trim_heap()
    return {"pid": os.getpid(), "rss_before": before, "rss_after": _rss_bytes()}


class FreeHeapExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``): adds :data:`RPC_METHOD`."""

    def padoc_release_free_heap(self) -> dict | None:
        return release_free_heap()
