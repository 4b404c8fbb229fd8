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
docs/results/2026-12-04-soak.md).

Fixing the allocator instead costs throughput: a fixed mmap threshold (``MALLOC_TRIM_THRESHOLD_``,
what dask sets for its workers) made the CPU engine 16-19% slower (fork, 32 pages at 16 in flight:
1.34-1.42 against 1.64-1.68 pages/s), because every buffer over 128 KiB is then mapped and faulted
in anew each step.

tcmalloc instead of glibc (``EngineConfig.allocator="tcmalloc"``; vLLM's own CPU wheels preload the
copy they bundle in ``vllm/libs``, PyPI's wheel has none): :func:`find_tcmalloc` finds one and
:func:`preload_value` puts it in ``LD_PRELOAD`` for the processes vLLM spawns. Measured and kept off
in the CPU preset: the same pages/s (fork, 32 pages at 16 in flight: 1.38-1.52 against 1.19-1.48
on glibc, the same evening), but in a 90-minute ``bench soak --engine vllm`` the engine core swung
between 1.51 and 1.92 GB and rose 129 MB/h after the warm-up, against 21.6 over 2 hours on glibc.

:func:`release_free_heap` releases the calling process's free heap, through whichever allocator
serves it. :class:`FreeHeapExtension` is a vLLM worker
extension (``worker_extension_cls``) that lets ``collective_rpc`` run it in the engine's worker
process, which under the CPU preset (``executor="uni"``) is the engine core itself.

:func:`paused_gc` holds Python's cyclic garbage collector off while an engine host starts. Importing
vLLM (torch, torch._inductor, transformers) allocates millions of long-lived objects, and the collector,
run every 700 net allocations, walks them again and again: here ``from vllm.v1.engine.async_llm import
AsyncLLM`` took 8.0-8.3 CPU-s with it and 6.3-6.4 with it paused (python 3.11, 2 cores). vLLM's engine
core freezes its own heap after its start for the same reason (``freeze_gc_heap``); its import, in the
process vLLM spawns, is out of this package's reach.

:func:`freeze_startup_heap` then does in the engine host what vLLM's own OpenAI server does once it is up
(``freeze_gc_heap``): one collection, and what survives it (modules, the engine, its tokenizer and
processor: a few million objects that live as long as the process) leaves the collector's view
(``gc.freeze``). A full collection walked all of them before: 0.2-0.36 CPU-s each in this project's pytest workers
(torch, transformers and vLLM imported), during which the event loop that runs the pages waits. Only a
host that built its own engine does this (one that was handed an engine leaves the heap to whoever owns
the process), and it does so before the collector is back on: every object made while it was off is in the
youngest generation, so the first automatic collection after the pause walks all of them (0.3-0.45 CPU-s
after vLLM's import), only to have the freeze's collection walk them again.
:func:`thaw_heap` gives them back to the collector when the host shuts down, so that what the engine
leaves behind can be collected.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import os
import sys
import threading

_gc_lock = threading.Lock()
_gc_pauses = 0  #: paused_gc blocks open in this process
_gc_was_enabled = False  #: the collector's state when the outermost block opened


@contextlib.contextmanager
def paused_gc():
    """Python's cyclic garbage collector off for the block, then back as it was (nested blocks, in
    any thread: the outermost one restores it). Reference counting still frees what it can; cycles
    made meanwhile wait for the first collection after the block. For a process's start (imports,
    an engine's construction), not for serving: a long block would let cyclic garbage pile up."""
    global _gc_pauses, _gc_was_enabled
    with _gc_lock:
        if _gc_pauses == 0:
            _gc_was_enabled = gc.isenabled()
            gc.disable()
        _gc_pauses += 1
    try:
        yield
    finally:
        with _gc_lock:
            _gc_pauses -= 1
            if _gc_pauses == 0 and _gc_was_enabled:
                gc.enable()


def freeze_startup_heap() -> None:
    """Collect once, then keep every object that survived out of the collector's passes (``gc.freeze``):
    for a process whose start is over and whose startup objects live on (an engine host, once started; the
    engine core vLLM spawns, once its imports are done: padoc_ray/engine/spawn_boot/sitecustomize.py).
    Reference counting still frees frozen objects; only cycles among them wait for :func:`thaw_heap`."""
    gc.collect()
    gc.freeze()


def thaw_heap() -> None:
    """Frozen objects back in the collector's view (``gc.unfreeze``): when a host that froze its start
    shuts down, the cycles its engine leaves can be collected."""
    gc.unfreeze()


#: the worker method ``collective_rpc`` calls (a name no vLLM worker has)
RPC_METHOD = "padoc_release_free_heap"
EXTENSION = f"{__name__}.FreeHeapExtension"


@functools.cache
def _release_fn():
    """The function that hands this process's free heap back to the OS, and the allocator's name:
    tcmalloc's ``MallocExtension_ReleaseFreeMemory`` where tcmalloc is loaded (preloaded: it then
    serves every ``malloc``), else glibc's ``malloc_trim``; None off Linux, on musl, or with no
    libc found."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        process = ctypes.CDLL(None)  # every library loaded into the process, preloaded ones first
        fn = process.MallocExtension_ReleaseFreeMemory
    except (OSError, AttributeError):
        pass
    else:
        fn.argtypes, fn.restype = [], None
        return "tcmalloc", fn
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return "glibc", lambda: trim(0)


def allocator() -> str | None:
    """The allocator serving this process's ``malloc``: "tcmalloc", "glibc", or None (unknown)."""
    found = _release_fn()
    return None if found is None else found[0]


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def trim_heap() -> bool:
    """Return this process's free heap pages to the OS (glibc's ``malloc_trim(0)``, or tcmalloc's
    ``ReleaseFreeMemory`` where tcmalloc is preloaded); False where neither is available (nothing
    done)."""
    found = _release_fn()
    if found is None:
        return False
    found[1]()
    return True


def release_free_heap() -> dict | None:
    """:func:`trim_heap`, measured: ``{"pid", "allocator", "rss_before", "rss_after"}`` (bytes), or
    None where the allocator cannot be told to release."""
    name = allocator()
    if name is None:
        return None
    before = _rss_bytes()
    trim_heap()
    return {"pid": os.getpid(), "allocator": name, "rss_before": before, "rss_after": _rss_bytes()}


#: the library the "tcmalloc" allocator setting preloads: gperftools' minimal tcmalloc (Debian and
#: Ubuntu package it as libtcmalloc-minimal4), the one vLLM's CPU docs name
TCMALLOC_SONAME = "libtcmalloc_minimal.so.4"


def find_tcmalloc() -> str | None:
    """Path of a tcmalloc to preload, or None: vLLM's own copy first (its CPU wheels bundle one in
    ``vllm/libs``, which vLLM's CPU platform preloads itself), then the system's."""
    import glob
    import importlib.util

    spec = importlib.util.find_spec("vllm")
    if spec is not None and spec.submodule_search_locations:
        for pkg in spec.submodule_search_locations:
            for pattern in ("libtcmalloc_minimal*.so*", "libtcmalloc.so*"):
                bundled = sorted(glob.glob(os.path.join(pkg, "libs", pattern)))
                if bundled:
                    return bundled[0]
    for lib_dir in ("/usr/lib/x86_64-linux-gnu", "/usr/lib/aarch64-linux-gnu", "/usr/lib64", "/usr/lib",
                    "/usr/local/lib"):
        path = os.path.join(lib_dir, TCMALLOC_SONAME)
        if os.path.exists(path):
            return path
    return None


def preload_value(library: str, current: str | None) -> str | None:
    """``LD_PRELOAD`` with ``library`` first, or None where ``current`` already preloads it (for a
    tcmalloc: any tcmalloc; a user's choice stands)."""
    def tcmalloc(path: str) -> bool:
        return "libtcmalloc" in os.path.basename(path)

    entries = [e for e in (current or "").replace(" ", ":").split(":") if e]
    if any(e == library or (tcmalloc(e) and tcmalloc(library)) for e in entries):
        return None
    return ":".join([library, *entries])


class FreeHeapExtension:
    """Mixed into vLLM's worker class (``worker_extension_cls``): adds :data:`RPC_METHOD`."""

    def padoc_release_free_heap(self) -> dict | None:
        return release_free_heap()
