"""Start or join Ray the same way in every command: the right cluster, token auth on, no false alarms.

* ``address="local"`` starts a fresh cluster for this process; ``ray.init(address=None)`` would
  instead join whatever cluster `ray start` last recorded on the machine, and hang for minutes
  retrying it if that cluster died without `ray stop`.
* Token authentication stays on (Ray's default for a new cluster); Ray's warning that it turned
  it on by default, printed on every start when ``RAY_AUTH_MODE`` is unset, is not shown.
* One line of Ray's own stderr is a known false alarm for Ray Data's engine actor pool (its
  actors are restartable and get their constructor arguments from the object store, which Ray
  Data keeps alive for the whole run): an ERROR-level C++ log line on every run. The driver's
  stderr is passed through a filter that drops exactly that line and forwards everything else.
"""

from __future__ import annotations

import atexit
import logging
import os
import re
import sys
import threading

#: lines of Ray's stderr that are known to be false alarms for padoc-ray (dropped by the filter)
KNOWN_NOISE = (
    re.compile(rb"core_worker\.cc:\d+: Actor with class name: '[^']*' and ID: '[0-9a-f]+' has constructor "
               rb"arguments in the object store and max_restarts > 0\."),
)

_filter_lock = threading.Lock()
_filter_installed = False


def init_ray(address: str | None = None, *, verbose: bool = False, filter_noise: bool = True, **kwargs) -> dict | None:
    """``ray.init`` for a command: ``address`` is a cluster address or ``"local"`` (a fresh local
    cluster); None: RAY_ADDRESS when set, else a fresh local cluster (never whatever `ray start`
    last recorded on the machine). Extra keyword arguments go to ``ray.init``. Returns the new
    cluster's address info (ports, e.g. ``metrics_export_port``); None when Ray was initialized already."""
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or "local"

    if ray.is_initialized():
        return None
    # Ray turns token auth on when RAY_AUTH_MODE is unset and warns that it did, on every start
    auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = auth_log.level
    if "RAY_AUTH_MODE" not in os.environ:
        auth_log.setLevel(logging.ERROR)
    try:
        ctx = ray.init(address=address, log_to_driver=verbose,
                       logging_level=logging.INFO if verbose else logging.WARNING, **kwargs)
    finally:
        auth_log.setLevel(level)
    if filter_noise:
        filter_stderr(KNOWN_NOISE)
    return dict(getattr(ctx, "address_info", None) or {})


def filter_stderr(patterns) -> None:
    """Drop lines matching ``patterns`` from everything written to this process's stderr (file
    descriptor 2, so C++ logs too) from now on; the rest is forwarded unchanged and promptly.
    Installed once per process; undone at exit after the last bytes are forwarded."""
    global _filter_installed
    with _filter_lock:
        if _filter_installed:
            return
        try:
            sys.stderr.flush()
            original = os.dup(2)
            read_end, write_end = os.pipe()
            os.dup2(write_end, 2)
            os.close(write_end)
        except (OSError, ValueError):
            return  # no usable stderr: nothing to filter
        _filter_installed = True

    def pump() -> None:
        # Never stop reading: a full pipe would block every write to stderr in this process (Ray's
        # C++ threads included). If the real stderr goes away (a closed pipe), output is dropped.
        forward = True
        while True:
            try:
                chunk = os.read(read_end, 65536)
            except OSError:
                return
            if not chunk:
                return
            if not forward:
                continue
            lines = chunk.splitlines(keepends=True)
            kept = b"".join(ln for ln in lines if not any(p.search(ln) for p in patterns))
            try:
                while kept:
                    kept = kept[os.write(original, kept):]
            except OSError:
                forward = False

    t = threading.Thread(target=pump, name="padoc-stderr-filter", daemon=True)
    t.start()

    def restore() -> None:
        try:
            sys.stderr.flush()
        except (OSError, ValueError):
            pass
        os.dup2(original, 2)  # the pipe's last writer is gone: the pump reads to the end and stops
        t.join(timeout=5)

    atexit.register(restore)
