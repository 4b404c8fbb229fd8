"""A local Ray started for a loopback-only command listens on loopback only, except what Ray 2.60
cannot move, which init_ray names (issue 46, item 8). Measured from outside: every listening TCP
socket of every process the driver's session holds (GCS, raylet, dashboard, agents, workers, Serve's
controller, proxy and replica), with psutil."""

from __future__ import annotations

import ipaddress
import json
import re
import select
import subprocess
import sys

import grpc
import pytest

from tests.conftest import ROOT, _env, _free_port, session_processes, stop_session

#: the driver: a local cluster through init_ray, optionally Ray Serve with one replica; prints what
#: init_ray reported and what is reported once Serve is up, then waits for its stdin to close
DRIVER = r"""
import json, os, sys
sys.path.insert(0, {root!r})
from padoc_ray.ray_init import SINGLE_NODE_ENV, init_ray, listeners_beyond_loopback
import ray  # before init_ray, as the CLI does: Ray has read its environment already
from ray._private import ray_constants

info = init_ray("local", local_only={local_only!r}, num_cpus=1, include_dashboard=False)
restored = os.environ.get(SINGLE_NODE_ENV) is None and ray_constants.ENABLE_RAY_CLUSTER
ray.get(ray.remote(lambda: 1).remote())  # a worker of the driver's job, listening too
if {serve_port!r}:
    from ray import serve

    serve.start(http_options={{"host": "127.0.0.1", "port": {serve_port!r}}})

    @serve.deployment
    class Echo:
        def __call__(self, request):
            return "ok"

    serve.run(Echo.bind(), name="echo", route_prefix="/")
print(json.dumps({{"node": info["node_ip_address"], "at_init": info.get("beyond_loopback"),
                  "now": listeners_beyond_loopback(), "restored": restored}}), flush=True)
sys.stdin.read()
ray.shutdown()
"""


def _loopback(ip: str) -> bool:
    a = ipaddress.ip_address(ip)
    return a.is_loopback or bool(getattr(a, "ipv4_mapped", None) and a.ipv4_mapped.is_loopback)


def _listeners(procs) -> list[tuple[str, int, int, str]]:
    """(address, port, pid, command line) of every listening TCP socket of ``procs``."""
    import psutil

    by_pid = {p.pid: p for p in procs}
    out = []
    for c in psutil.net_connections(kind="tcp"):
        if c.status == psutil.CONN_LISTEN and c.pid in by_pid:
            try:
                cmd = " ".join(by_pid[c.pid].cmdline()).strip()[:100]
            except psutil.Error:
                cmd = "?"
            out.append((c.laddr.ip, c.laddr.port, c.pid, cmd))
    return sorted(set(out))


def _run_driver(log, local_only: bool, serve_port: int = 0):
    """Start the driver in a session of its own (its stderr to ``log``); return (driver, its
    report, the listeners of every process of its session). The caller stops it."""
    code = DRIVER.format(root=ROOT, local_only=local_only, serve_port=serve_port)
    with open(log, "w") as err:
        driver = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=err, text=True, env=_env(), start_new_session=True)
    _DRIVERS.append(driver)
    # the report, once the cluster (and Serve) is up
    line = driver.stdout.readline() if select.select([driver.stdout], [], [], 180)[0] else ""
    assert line, f"the driver exited ({driver.wait(timeout=60)}) before reporting:\n{open(log).read()[-3000:]}"
    report = json.loads(line)
    return driver, report, _listeners(session_processes(driver))


_DRIVERS: list[subprocess.Popen] = []


@pytest.fixture
def drivers():
    """Stops every driver a test started, and everything its cluster started (the teardown fails if
    anything is left)."""
    yield _run_driver
    while _DRIVERS:
        _stop(_DRIVERS.pop())


def _stop(driver) -> None:
    try:
        driver.stdin.close()  # the driver shuts Ray down and exits
        driver.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    stop_session(driver, grace_s=2, check=True)  # and nothing of its cluster is left


@pytest.mark.slow
def test_a_local_only_cluster_listens_on_loopback_but_for_what_it_names(drivers, tmp_path):
    _, report, listeners = drivers(tmp_path / "driver.log", local_only=True, serve_port=_free_port())
    assert report["node"] == "127.0.0.1" and report["restored"], report
    # GCS, raylet (node manager, object manager), dashboard agent, runtime-env agent, workers:
    # a real measurement, not an empty list
    assert len(listeners) >= 6, listeners
    assert any("gcs_server" in cmd for *_, cmd in listeners), listeners
    assert any("raylet" in cmd for *_, cmd in listeners), listeners
    beyond = {(ip, port): cmd for ip, port, _, cmd in listeners if not _loopback(ip)}
    # what Ray 2.60 cannot move: each Serve replica's inter-deployment gRPC server on [::]
    assert beyond and all("ServeReplica" in cmd for cmd in beyond.values()), beyond
    # ... and init_ray's report names exactly those (nothing beyond loopback right after the start)
    assert report["at_init"] == [], report["at_init"]
    reported = {}
    for line in report["now"]:
        m = re.search(r"listens on \[?([0-9a-fA-F.:]+?)\]?:(\d+), beyond loopback: (.*)$", line)
        assert m, line
        reported[(m[1], int(m[2]))] = line
    assert set(reported) == set(beyond), (reported, beyond)
    for (_, port), line in reported.items():
        assert "inter-deployment gRPC" in line and "replica.py:1835" in line and "token auth" in line, line
        # as it says, Ray's token authentication guards it: a call without the token is refused
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary("/ray.serve.ASGIService/HandleRequest")
            with pytest.raises(grpc.RpcError) as refused:
                call(b"", timeout=10)
            assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, refused.value


@pytest.mark.slow
def test_without_local_only_ray_listens_on_every_interface(drivers, tmp_path):
    """The measurement above can see what it is meant to: Ray's own choice puts the GCS, the raylet
    and the metrics endpoint on every interface."""
    _, report, listeners = drivers(tmp_path / "driver.log", local_only=False)
    assert report["node"] != "127.0.0.1" and report["at_init"] is None, report
    wildcard = [(ip, port, cmd) for ip, port, _, cmd in listeners if ip in ("0.0.0.0", "::")]
    assert any("gcs_server" in cmd for *_, cmd in wildcard), listeners
    assert any("raylet" in cmd for *_, cmd in wildcard), listeners
    assert any("DashboardAgent" in cmd and ip == "0.0.0.0" for ip, _, cmd in wildcard), listeners
