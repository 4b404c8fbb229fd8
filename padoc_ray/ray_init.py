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
* A fresh local cluster listens on loopback only (``local_only``): its node address is 127.0.0.1, so
  the GCS, raylet, object manager and worker gRPC servers, the dashboard and runtime-env agents and
  the Prometheus endpoints (metrics export, autoscaler, dashboard) bind 127.0.0.1 instead of every
  interface. What Ray 2.60 binds beyond loopback all the same (each Ray Serve replica's
  inter-deployment gRPC server) is measured and named by :func:`listeners_beyond_loopback`.
"""

from __future__ import annotations

import atexit
import contextlib
import ipaddress
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

#: Ray's switch for "no multi-node cluster on this machine" (on by default for macOS and Windows).
#: Off, Ray takes loopback for the node's address (ray/_private/services.py:get_node_ip_address,
#: ``if not ray_constants.ENABLE_RAY_CLUSTER: return get_localhost_ip()``), and every server that
#: binds "loopback when the node address is loopback, else everything" binds loopback.
SINGLE_NODE_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"

#: listeners that Ray 2.60 binds to every interface whatever the node address: (a test on the
#: process's title, what the listener is, why it cannot be moved)
KNOWN_BEYOND_LOOPBACK = (
    (re.compile(r"^ray::ServeReplica:"), "Ray Serve's inter-deployment gRPC server",
     'Ray 2.60 hard-codes "[::]:0" for it (ray/serve/_private/replica.py:1835) with no option to bind it '
     "elsewhere; Ray's token authentication guards it (replica.py:1182-1185)"),
)


def init_ray(address: str | None = None, *, verbose: bool = False, filter_noise: bool = True,
             local_only: bool | None = None, **kwargs) -> dict | None:
    """``ray.init`` for a command: ``address`` is a cluster address or ``"local"`` (a fresh local
    cluster); None: RAY_ADDRESS when set, else a fresh local cluster (never whatever `ray start`
    last recorded on the machine). Extra keyword arguments go to ``ray.init``. Returns the new
    cluster's address info (ports, e.g. ``metrics_export_port``); None when Ray was initialized already.

    ``local_only`` (None, the default: whenever this call starts a fresh local cluster): the new
    cluster listens on loopback only wherever Ray allows it (its node address is 127.0.0.1). The
    info then has ``beyond_loopback``: one line for each TCP listener of the new cluster that is
    not on loopback right after the start (:func:`listeners_beyond_loopback`; listeners that come
    later, such as Serve replicas', are found by calling it again). False: Ray's own choice, its
    node address and every interface. Joining a running cluster changes nothing of it (True then
    says so in ``beyond_loopback``)."""
    import ray

    address = address or os.environ.get("RAY_ADDRESS") or "local"

    if ray.is_initialized():
        return None
    loopback = address == "local" and local_only is not False
    if loopback:
        kwargs.setdefault("dashboard_host", "127.0.0.1")
    # Ray turns token auth on when RAY_AUTH_MODE is unset and warns that it did, on every start
    auth_log = logging.getLogger("ray._private.authentication.authentication_token_setup")
    level = auth_log.level
    if "RAY_AUTH_MODE" not in os.environ:
        auth_log.setLevel(logging.ERROR)
    try:
        with _single_node() if loopback else contextlib.nullcontext():
            ctx = ray.init(address=address, log_to_driver=verbose,
                           logging_level=logging.INFO if verbose else logging.WARNING, **kwargs)
    finally:
        auth_log.setLevel(level)
    if filter_noise:
        filter_stderr(KNOWN_NOISE)
    info = dict(getattr(ctx, "address_info", None) or {})
    if loopback:
        info["beyond_loopback"] = listeners_beyond_loopback()
        node_ip = info.get("node_ip_address")
        if node_ip and not is_loopback(node_ip):  # a Ray that no longer takes the switch
            info["beyond_loopback"].insert(0, f"Ray's node address is {node_ip}, not loopback: its GCS, raylet "
                                              f"and workers may listen on every interface")
    elif local_only:
        info["beyond_loopback"] = [f"joined the running cluster at {address}: where it listens was decided "
                                   f"when it started, not here"]
    return info


@contextlib.contextmanager
def _single_node():
    """While ``ray.init`` starts a local cluster: Ray's single-node switch off (:data:`SINGLE_NODE_ENV`).

    ``ray.init(_node_ip_address="127.0.0.1")`` alone does not do it: ray.init replaces a loopback
    address by the machine's routable one (ray/_private/worker.py:1843-1844, via
    services.resolve_ip_for_localhost). Ray reads the switch into ``ray_constants.ENABLE_RAY_CLUSTER``
    when ``ray`` is imported, which the caller may have done already: the constant is set too,
    for the driver; the environment variable reaches every process the start spawns (GCS, raylet,
    dashboard, agents, and the workers the raylet starts later). Both are restored afterwards, in
    this process only."""
    from ray._private import ray_constants

    before_env, before_const = os.environ.get(SINGLE_NODE_ENV), ray_constants.ENABLE_RAY_CLUSTER
    os.environ[SINGLE_NODE_ENV] = "0"
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before_const
        if before_env is None:
            os.environ.pop(SINGLE_NODE_ENV, None)
        else:
            os.environ[SINGLE_NODE_ENV] = before_env


def is_loopback(ip: str) -> bool:
    """Whether a listener on ``ip`` is reachable from this machine only: 127.0.0.0/8, ::1, and
    127.0.0.1 as an IPv4-mapped IPv6 address (where gRPC's dual-stack sockets show it)."""
    try:
        a = ipaddress.ip_address(ip.split("%", 1)[0])
    except ValueError:
        return ip == "localhost"
    mapped = getattr(a, "ipv4_mapped", None)  # ::ffff:127.0.0.1, gRPC's dual-stack socket on loopback
    return a.is_loopback or bool(mapped and mapped.is_loopback)


def tcp_listeners(root_pid: int | None = None) -> list[tuple[str, int, int, str]]:
    """(address, port, pid, process title) of every listening TCP socket of ``root_pid`` (default:
    this process) and of every process it started, directly or not: for a driver that started a
    local cluster, the cluster's GCS, raylet, dashboard, agents, workers and what they started."""
    import psutil

    root = psutil.Process(root_pid or os.getpid())
    procs = {root.pid: root}
    with contextlib.suppress(psutil.Error):
        procs.update((c.pid, c) for c in root.children(recursive=True))
    try:
        conns = [(c.pid, c) for c in psutil.net_connections(kind="tcp")]
    except psutil.AccessDenied:  # where the machine's table is not ours to read: process by process
        conns = []
        for p in procs.values():
            with contextlib.suppress(psutil.Error):
                conns += [(p.pid, c) for c in p.net_connections(kind="tcp")]
    titles: dict[int, str] = {}
    out = []
    for pid, conn in conns:
        if conn.status != psutil.CONN_LISTEN or pid not in procs or not conn.laddr:
            continue
        if pid not in titles:
            titles[pid] = _title(procs[pid])
        out.append((conn.laddr.ip, conn.laddr.port, pid, titles[pid]))
    return sorted(set(out), key=lambda r: (r[2], r[1], r[0]))


def _title(proc) -> str:
    """A process as Ray names it: a worker's title (``ray::ServeReplica:app:Deployment``), else
    its program (``raylet``, ``gcs_server``), with the script for Python (``python dashboard.py``)."""
    try:
        cmd = proc.cmdline() or [proc.name()]
    except Exception:  # noqa: BLE001 - gone, or not ours to read
        return "?"
    if cmd[0].startswith("ray::"):
        return " ".join(cmd).strip()
    prog = os.path.basename(cmd[0])
    if prog.startswith("python"):
        for i, a in enumerate(cmd[1:], 1):
            if a in ("-c", "-m"):
                return f"python {a} {cmd[i + 1] if a == '-m' and i + 1 < len(cmd) else '...'}"
            if not a.startswith("-"):
                return f"python {os.path.basename(a)}"
        return "python"
    return prog


def listeners_beyond_loopback(root_pid: int | None = None) -> list[str]:
    """One line for each TCP listener of this process and the processes it started
    (:func:`tcp_listeners`) that is not on loopback, now: where it listens, which process, and why
    when Ray 2.60 leaves no choice (:data:`KNOWN_BEYOND_LOOPBACK`). Empty: all on loopback."""
    lines = []
    for ip, port, pid, title in tcp_listeners(root_pid):
        if is_loopback(ip):
            continue
        where = f"[{ip}]:{port}" if ":" in ip else f"{ip}:{port}"
        what, why = "a listener", "not one that Ray 2.60 is known to keep beyond loopback on a loopback node"
        for pattern, known, reason in KNOWN_BEYOND_LOOPBACK:
            if pattern.search(title):
                what, why = known, reason
                break
        lines.append(f"{what} of {title} (pid {pid}) listens on {where}, beyond loopback: {why}")
    return lines


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
