"""The batch job on a real two-node Ray cluster on this machine, with its inputs, output and model on
an S3 server (moto) behind a loopback proxy (tests/helpers/s3_proxy.py) that counts every request and can
throttle.

One cluster for the module: ``ray start --head`` plus a second ``ray start --address ...`` node,
each in a process group of its own (the worker node can be killed alone), each with its own model
cache (as separate machines have), token authentication on (conftest's token). Custom resources:
``padoc_gpu_node`` exists on the worker node only (2 of it: it pins engine actors there);
``padoc_engine_slot`` on both (1 on the head, 2 on the worker), so the head can host an engine actor
when the worker is lost.

The jobs run the no-op engine: these tests are about distribution and storage (which node runs
what, which rows land, which requests are retried), not the engine. The real vLLM engine did not
fit the module's time budget: one real-engine job on this cluster alone took 108-130 s on the
shared 2-core machine (engine start dominates); tests/cluster/pipeline/test_batch_job.py runs it through `ray job
submit` with the model on S3.
"""

from __future__ import annotations

import glob
import hashlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import tempfile
import time

import pyarrow.dataset as pads
import pypdfium2 as pdfium
import pytest

from tests.conftest import BIN, ROOT, _env, _free_port, stop_process_group
from tests.helpers.pdf_factory import text_pdf
from tests.helpers.s3_proxy import S3Proxy

pytestmark = [pytest.mark.engine, pytest.mark.slow]

EXAMPLES = os.path.join(ROOT, "examples")
HEAD_RESOURCES = {"padoc_engine_slot": 1}
WORKER_RESOURCES = {"padoc_gpu_node": 2, "padoc_engine_slot": 2}
#: the GCS declares a node dead after 5 health checks in a row went unanswered, one a second, each given 2 s (Ray's
#: default: 5 checks 3 s apart, each given 10 s): a killed node is dead to the job in about 5-7 s, and a live node
#: that a loaded machine slows (the module's other test expects none to die) would have to miss 10 s of checks
FAST_NODE_DEATH = {"RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "2000",
                   "RAY_health_check_failure_threshold": "5", "RAY_health_check_initial_delay_ms": "1000"}


def _ports(*names: str) -> list[str]:
    return [f"--{n}={_free_port()}" for n in names]


def _launch(cmd: list[str], env: dict, log: str) -> subprocess.Popen:
    """Start ``ray start`` in a new session: its pid is the process group of the daemons it leaves
    (raylet, agents; the raylet's workers get groups of their own, see :func:`node_pids`)."""
    with open(log, "w") as f:  # to a file: a pipe nobody reads can block the child
        return subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def _started(starter: subprocess.Popen, log: str) -> int:
    rc = starter.wait(timeout=180)
    assert rc == 0, open(log).read()[-3000:]
    return starter.pid


def _wait_port(port: int, timeout_s: float = 120.0) -> None:
    deadline = time.time() + timeout_s
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)


def _procs() -> dict[int, tuple[int, int, str]]:
    """{pid: (parent pid, process group, command line)} of every live process."""
    out = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            stat = open(f"/proc/{d}/stat").read()
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] == "Z":
                continue
            cmd = open(f"/proc/{d}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace").strip()
            out[int(d)] = (int(fields[1]), int(fields[2]), cmd)
        except (OSError, ValueError):
            continue
    return out


def node_pids(pgid: int) -> dict[int, str]:
    """{pid: command line} of a node started by ``ray start`` in process group ``pgid``: the group's
    daemons (raylet, agents, log monitor) and their descendants (the raylet's worker processes run
    in process groups of their own)."""
    procs = _procs()
    found = {pid for pid, (_, group, _) in procs.items() if group == pgid}
    while True:
        more = {pid for pid, (ppid, _, _) in procs.items() if ppid in found and pid not in found}
        if not more:  # a zombie's command line reads empty: it is already dead, and names nothing to kill
            return {pid: procs[pid][2] for pid in found if procs[pid][2].strip()}
        found |= more


@pytest.fixture(scope="module")
def two_nodes():
    # a short folder: Ray's socket paths under it must fit AF_UNIX's 107 bytes
    tmp = pathlib.Path(tempfile.mkdtemp(prefix="padoc-2n-"))
    head_cache, worker_cache = tmp / "cache-head", tmp / "cache-worker"
    port, dash = _free_port(), _free_port()
    common = ["--disable-usage-stats", "--node-ip-address=127.0.0.1", "--num-cpus=2"]
    node_ports = ("node-manager-port", "object-manager-port", "metrics-export-port", "dashboard-agent-listen-port",
                  "dashboard-agent-grpc-port", "runtime-env-agent-port")
    head_cmd = [os.path.join(BIN, "ray"), "start", "--head", *common, f"--port={port}", "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dash}", f"--temp-dir={tmp / 'ray'}", f"--resources={json.dumps(HEAD_RESOURCES)}",
                *_ports("ray-client-server-port", *node_ports)]
    # the worker node's own temp dir, as a separate machine has: with the head's, both nodes' runtime-env
    # agents unpack a job's working_dir into one folder, and the second unpacking (rmtree, then extract)
    # pulled the driver's own modules from under it (ModuleNotFoundError mid-import, two full runs in a row)
    worker_cmd = [os.path.join(BIN, "ray"), "start", f"--address=127.0.0.1:{port}", *common,
                  f"--temp-dir={tmp / 'ray-w'}", f"--resources={json.dumps(WORKER_RESOURCES)}", *_ports(*node_ports)]
    # each node's processes (raylet, workers, engine actors) copy s3:// models into that node's own cache
    head = _launch(head_cmd, _env(PADOC_RAY_MODEL_CACHE=str(head_cache), **FAST_NODE_DEATH), str(tmp / "head.log"))
    nodes = {"head": head.pid}
    try:
        _wait_port(port)  # the worker node joins as soon as the GCS listens (the head's start goes on)
        worker = _launch(worker_cmd, _env(PADOC_RAY_MODEL_CACHE=str(worker_cache)), str(tmp / "worker.log"))
        nodes["worker"] = worker.pid
        _started(head, str(tmp / "head.log"))
        _started(worker, str(tmp / "worker.log"))
        yield {"gcs": f"127.0.0.1:{port}", "dashboard": f"http://127.0.0.1:{dash}", "temp_dir": str(tmp / "ray"),
               "head_cache": str(head_cache), "worker_cache": str(worker_cache), **nodes}
    finally:
        stop_nodes(list(nodes.values()))
        shutil.rmtree(tmp, ignore_errors=True)


def stop_nodes(pgids: list[int], grace_s: float = 3.0) -> None:
    """SIGTERM the nodes' process groups, then SIGKILL whatever of them (and of their workers, which
    run in process groups of their own) is left after ``grace_s``."""
    pids: dict[int, str] = {}
    for g in pgids:
        pids.update(node_pids(g))
        try:
            os.killpg(g, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.time() + grace_s
    while time.time() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.2)
    for p, cmd in node_pids_alive(pids).items():
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass


def node_pids_alive(pids: dict[int, str]) -> dict[int, str]:
    """Those of ``pids`` still running the same command (a pid may have been reused)."""
    now = _procs()
    return {p: c for p, c in pids.items() if p in now and now[p][2] == c}


# ---- helpers ------------------------------------------------------------------------------------------
def upload_model(s3, model_dir: str, bucket: str, prefix: str) -> str:
    for f in os.listdir(model_dir):
        s3["client"].upload_file(os.path.join(model_dir, f), bucket, f"{prefix}/{f}")
    return f"s3://{bucket}/{prefix}"


def upload_pdfs(s3, bucket: str, prefix: str, pdfs: dict[str, bytes]) -> dict[str, tuple[str, int]]:
    """Uploads ``{name: bytes}``; returns ``{uri: (doc_id, page count)}``, the expected pages."""
    out = {}
    for name, data in pdfs.items():
        s3["client"].put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)
        out[f"s3://{bucket}/{prefix}/{name}"] = (hashlib.sha256(data).hexdigest(), len(pdfium.PdfDocument(data)))
    return out


def submit_cmd(cluster, *args: str) -> list[str]:
    runtime_env = {"env_vars": {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                                "AWS_DEFAULT_REGION": "us-east-1"},
                   "excludes": [".venv", "models", "out", ".git", "*.parquet"]}
    return [os.path.join(BIN, "ray"), "job", "submit", "--address", cluster["dashboard"], "--working-dir", ROOT,
            "--runtime-env-json", json.dumps(runtime_env), "--", "python", "jobs/batch_parse.py", *args]


def run_logged(cmd, log, timeout=300) -> tuple[int, str]:
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=_env(), timeout=timeout).returncode
    return rc, open(log).read()


def page_rows(s3, uri: str) -> list[dict]:
    """Every row under OUTPUT/pages, read from the S3 server directly (not through the proxy)."""
    from padoc_ray.storage import StorageConfig, filesystem

    fs, path = filesystem(uri.rstrip("/") + "/pages", StorageConfig(endpoint=s3["endpoint"]))
    cols = ["source_uri", "doc_id", "page_index", "status", "run_id", "processed_at"]
    return pads.dataset(path, filesystem=fs, format="parquet").to_table(columns=cols).to_pylist()


def assert_every_page_once(rows: list[dict], expected: dict[str, tuple[str, int]]) -> None:
    """One row per (doc_id, page_index) of every input page, none twice, none lost, none foreign."""
    keys = [(r["doc_id"], r["page_index"]) for r in rows]
    dupes = {k for k in keys if keys.count(k) > 1}
    assert not dupes, f"pages written more than once: {sorted(dupes)[:10]}"
    want = {(doc, i) for doc, n in expected.values() for i in range(n)}
    assert set(keys) == want, (f"missing {sorted(want - set(keys))[:10]}, unexpected {sorted(set(keys) - want)[:10]}")
    assert {r["source_uri"] for r in rows} == set(expected)


def copies_of(cache: str, model_uri: str) -> list[str]:
    """The complete copies of ``model_uri`` in a node's model cache."""
    out = []
    for d in sorted(glob.glob(os.path.join(cache, "*"))):
        if os.path.exists(os.path.join(d, ".complete")) and \
                json.load(open(os.path.join(d, ".source.json")))[0] == model_uri:
            out.append(d)
    return out


def model_downloads(proxy: S3Proxy, model_uri: str, model_dir: str) -> dict[str, float]:
    """How many times each object of the model was downloaded: the bytes the server sent for it
    (GETs, whole or ranged: a large object comes in parts) over its size."""
    prefix = "/" + model_uri[len("s3://"):] + "/"
    sent: dict[str, int] = {}
    for method, path, status, n in list(proxy.forwarded):
        if method == "GET" and path.startswith(prefix) and status in (200, 206):
            sent[path[len(prefix):]] = sent.get(path[len(prefix):], 0) + n
    return {f: round(n / os.path.getsize(os.path.join(model_dir, f)), 3) for f, n in sent.items()}


# ---- tests --------------------------------------------------------------------------------------------
def test_lock_whose_create_was_applied_but_its_answer_lost_is_still_ours(s3, monkeypatch):
    """A flaky store may apply a write and lose its answer: the output lock's conditional create is
    then retried by the client and fails its condition against the run's own object. The run
    recognizes its own lock and holds it (it does not refuse itself as "in use"); another run is
    still refused, and the lock is removed on release."""
    from padoc_ray.pipeline.lock import OutputInUse, OutputLock
    from padoc_ray.storage import StorageConfig

    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    s3["client"].create_bucket(Bucket="mn-l")
    with S3Proxy(s3["endpoint"], lose_conditional=1) as proxy:
        cfg = StorageConfig(endpoint=proxy.endpoint)
        with OutputLock("s3://mn-l/out", cfg, "run-a"):
            assert proxy.stats()["faults"].get("lost_answer") == 1 and proxy.unanswered() == []
            with pytest.raises(OutputInUse, match="run-a"):
                OutputLock("s3://mn-l/out", cfg, "run-b").acquire()
        assert s3["client"].list_objects_v2(Bucket="mn-l").get("KeyCount", 0) == 0


def many_pdfs(n: int, tag: str) -> dict[str, bytes]:
    """``n`` distinct PDFs of 1 to 3 pages."""
    return {f"{tag}{i:03d}.pdf": text_pdf(pages=1 + i % 3, label=f"{tag} {i}") for i in range(n)}


#: the no-op engine (see the module's docstring), small pages, many small units of work
NOOP = ["--engine", "noop", "--cpus-per-actor", "0.25", "--longest-side", "400", "--raster-docs-per-task", "1",
        "--engine-batch-pages", "2", "--pages-in-flight", "2", "--rows-per-file", "2"]


def test_two_nodes_engines_pinned_to_the_worker_through_a_throttling_store(two_nodes, s3, tiny_model_dir,
                                                                            tmp_path):
    """`ray job submit` on the two-node cluster; two engine actors pinned to the worker node by
    --engine-resources '{"padoc_gpu_node": 1}' (the worker has 2 of it, the head none). Every request
    of the job (lock, listing, model copies, input reads, Parquet writes, summary) goes through a
    proxy that answers 503 SlowDown to ~8% of them and drops ~3% of connections unanswered, reads
    and writes alike, and loses the answer of the lock's create after applying it. The job completes
    with every page written exactly once; every refused request was tried again until answered (none
    given up); the model is copied into the worker node's cache only, once for both actors there
    (each model object's bytes sent once), and the head's cache has no copy."""
    c = s3["client"]
    c.create_bucket(Bucket="mn-a")
    model = upload_model(s3, tiny_model_dir, "mn-a", "model/tiny")
    expected = upload_pdfs(s3, "mn-a", "docs", many_pdfs(6, "t"))
    with S3Proxy(s3["endpoint"], slow_down=0.08, drop=0.03, seed=14, lose_conditional=1) as proxy:
        cmd = submit_cmd(two_nodes, "--input", "s3://mn-a/docs", "--output", "s3://mn-a/out", "--model", model,
                         "--s3-endpoint", proxy.endpoint, "--actors", "2",
                         "--engine-resources", json.dumps({"padoc_gpu_node": 1}), *NOOP)
        rc, log = run_logged(cmd, tmp_path / "job.log")
        stats, unanswered = proxy.stats(), proxy.unanswered()
        copies = model_downloads(proxy, model, tiny_model_dir)
    print(f"throttling proxy: {stats}")
    assert rc == 0, log[-6000:]
    assert "all inputs accounted: True" in log
    assert_every_page_once(page_rows(s3, "s3://mn-a/out"), expected)
    # faults hit reads and writes, and every refused request came back until it was answered
    assert stats["faults"].get("slow_down:GET", 0) + stats["faults"].get("drop:GET", 0) > 0, stats
    assert stats["faults"].get("slow_down:PUT", 0) + stats["faults"].get("drop:PUT", 0) > 0, stats
    assert stats["faults"]["drop"] > 0 and stats["faults"]["lost_answer"] == 1, stats
    assert unanswered == [] and stats["retried"] == stats["faulted"], (unanswered, stats)
    # the engine actors ran on the worker node: one copy there for both, none on the head
    assert copies_of(two_nodes["head_cache"], model) == []
    assert len(copies_of(two_nodes["worker_cache"], model)) == 1
    assert copies == {f: 1 for f in os.listdir(tiny_model_dir)}, copies


def test_worker_node_killed_mid_run_every_page_once(two_nodes, s3, tiny_model_dir, tmp_path):
    """Three engine actors (padoc_engine_slot: one on the head, two on the worker node sharing one
    copy of the model). While pages remain, the worker node's raylet, its other daemons and the
    raylet's workers (its engine actors among them) are SIGKILLed by pid. The job completes on the
    head (or, if it fails, a rerun on the same output does); either way every input page is written
    exactly once (some of them only after the kill), and the model was copied once per node. Input reads
    are slowed (0.5 s per document GET) so the kill lands mid-run."""
    c = s3["client"]
    c.create_bucket(Bucket="mn-b")
    model = upload_model(s3, tiny_model_dir, "mn-b", "model/tiny")
    expected = upload_pdfs(s3, "mn-b", "docs", many_pdfs(12, "k"))
    total = sum(n for _, n in expected.values())
    with S3Proxy(s3["endpoint"], delay_s=0.5, delay_prefix="/mn-b/docs/") as proxy:
        cmd = submit_cmd(two_nodes, "--input", "s3://mn-b/docs", "--output", "s3://mn-b/out", "--model", model,
                         "--s3-endpoint", proxy.endpoint, "--actors", "3",
                         "--engine-resources", json.dumps({"padoc_engine_slot": 1}), *NOOP)
        log = open(tmp_path / "job.log", "w")
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
        killed, rows_at_kill = {}, None
        try:
            deadline = time.time() + 240
            while time.time() < deadline and proc.poll() is None:
                if not killed and copies_of(two_nodes["worker_cache"], model):
                    n = len(page_rows(s3, "s3://mn-b/out")) if _has_pages(c, "mn-b", "out") else 0
                    if n > 0:
                        rows_at_kill = n
                        killed = kill_node(two_nodes["worker"])
                time.sleep(0.2)
            rc = proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                stop_process_group(proc.pid)
            log.close()
        text = open(tmp_path / "job.log").read()
        print(f"worker node killed with {rows_at_kill} of {total} page rows written: "
              f"{sorted(c.split()[0][-40:] for c in killed.values())}")
        assert any(c.split()[0].endswith("/raylet") for c in killed.values()), killed
        assert any("EngineStage" in c for c in killed.values()), killed  # its engine actors, by pid
        assert rows_at_kill < total, "the kill came too late: every page was already written"
        rerun = None
        if rc != 0:  # the job may fail with its node; then a rerun on the same output completes it
            rerun, text2 = run_logged(cmd, tmp_path / "rerun.log")
            assert rerun == 0, text2[-6000:]
            text += text2
        copies = model_downloads(proxy, model, tiny_model_dir)
    print(f"first run rc={rc}, rerun rc={rerun}")
    assert "all inputs accounted: True" in text, text[-6000:]
    rows = page_rows(s3, "s3://mn-b/out")
    assert_every_page_once(rows, expected)
    assert len({r["run_id"] for r in rows}) == (1 if rerun is None else 2)
    # once per node: the head's actor and the worker's two actors (one copy between them)
    assert len(copies_of(two_nodes["head_cache"], model)) == 1
    assert len(copies_of(two_nodes["worker_cache"], model)) == 1
    assert copies == {f: 2 for f in os.listdir(tiny_model_dir)}, copies


def _has_pages(client, bucket: str, prefix: str) -> bool:
    return client.list_objects_v2(Bucket=bucket, Prefix=f"{prefix}/pages/").get("KeyCount", 0) > 0


def kill_node(pgid: int) -> dict[int, str]:
    """SIGKILL every process of the node (:func:`node_pids`), one by one by pid, the raylet first;
    returns {pid: command line} of those killed."""
    procs = node_pids(pgid)
    for pid in sorted(procs, key=lambda p: "raylet" not in procs[p]):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return procs
