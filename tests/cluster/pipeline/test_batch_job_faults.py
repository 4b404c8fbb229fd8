"""The batch job when something dies on purpose, against real components (a `ray start --head`
cluster on loopback; in the engine actors the real CPU vLLM engine, or the no-op engine where the
runs and not the engine are under test): an engine that crashes and an actor that is killed, a
driver killed mid-run, documents whose renderer crashes or hangs. Split from
tests/cluster/pipeline/test_batch_job.py so that the two run on different workers of `make test`."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import tempfile
import time
from datetime import datetime, timezone

import pyarrow.parquet as pq
import pytest

from tests.helpers.batch_runs import EXAMPLES, example_copies, gt_for_copies, keys, logged, parse_cmd, read_pages
from tests.conftest import BIN, CLUSTER_ENV, ROOT, _env, stop_session

pytestmark = [pytest.mark.engine, pytest.mark.slow]


def _engine_actor_pids(tag: str) -> set[int]:
    """Process ids of the live engine actors that carry ``tag`` in their environment (this test's
    job sets it through its runtime env): read from /proc, so only this test's processes count and
    no Ray client (or its authentication) is involved."""
    out = set()
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/cmdline", "rb") as f:
                if b"EngineStage" not in f.read():
                    continue
            with open(f"/proc/{d}/environ", "rb") as f:
                if tag.encode() in f.read():
                    out.add(int(d))
        except OSError:  # gone meanwhile, or not ours to read
            continue
    return out


#: the no-op engine (every page an empty layout, no model run) in many small units of work (a document a raster
#: task, a page an engine call), so that page files trickle in through the run and a kill lands mid-run
NOOP = ["--engine", "noop", "--raster-docs-per-task", "1", "--engine-batch-pages", "1"]


def _written(out) -> list:
    """When each page row written so far under ``out`` was made (its ``processed_at``)."""
    from padoc_ray.output.reader import read_rows as read_some
    from padoc_ray.storage import StorageConfig

    if not (out / "pages").is_dir():
        return []
    return read_some(str(out / "pages"), StorageConfig(), columns=["processed_at"]).column("processed_at").to_pylist()


def test_an_engine_crash_restarts_the_actor_and_every_page_lands_once(ray_cluster, tiny_model_dir, tmp_path):
    """An engine actor's engine really crashes mid-run (the ``kill_engine_core`` fault of
    padoc_ray.engine.faults: at the 12th request's first output the actor SIGKILLs its own vLLM engine
    core process; vLLM notices, every page in flight gets EngineDeadError, the actor process exits, Ray
    restarts it and retries its batches). A new actor process takes over; the job completes with every
    page written exactly once, all ok, some of them after the crash. --max-live-branches rides along
    (every page still completes). Each page is forced to its first 4 regions (4 branches, one more than
    --max-live-branches): the test is about the actors, and a full page's decoding only made each
    actor's share longer. The actor whose engine died shuts it down before it exits: no engine leaves
    its temp folder or a socket in the job's temp folder. (An actor process killed from outside: the
    no-op run below.)"""
    n = 2  # 10 pages, 50 requests (a page's layout stream and its 4 branches)
    example_copies(tmp_path / "in", n)
    gt = gt_for_copies(tmp_path / "gt.json", n, regions=4)
    out, marker = tmp_path / "out", tmp_path / "engine_died"
    # the job's temp folder, where each engine makes its own (VllmEngine.temp_dir); short, as in /tmp, so that
    # vLLM's sockets fit in the engine's folder (a Unix socket's path has at most 107 bytes)
    temp = tempfile.mkdtemp(prefix="padoc-test-job-")
    fault = {"die_at_request": 12, "once": str(marker), "how": "kill_engine_core"}
    runtime_env = {"env_vars": {"PADOC_RAY_ENGINE_FAULTS": json.dumps(fault), "TMPDIR": temp},
                   "excludes": [".venv", "models", "out", ".git", "*.parquet"]}
    cmd = [os.path.join(BIN, "ray"), "job", "submit", "--address", ray_cluster["dashboard"], "--working-dir", ROOT,
           "--runtime-env-json", json.dumps(runtime_env), "--", "python", "jobs/batch_parse.py",
           "--input", str(tmp_path / "in"), "--output", str(out), "--model", tiny_model_dir, "--replay", gt,
           "--pages-in-flight", "4", "--engine-batch-pages", "4", "--rows-per-file", "2", "--max-live-branches", "3"]
    log = open(tmp_path / "job.log", "w")  # to a file: nobody reads a pipe for minutes
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    seen: list[int] = []  # engine actor pids, in the order they appeared
    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            seen += sorted(_engine_actor_pids(str(marker)) - set(seen))
            time.sleep(0.5)
        rc = proc.wait(timeout=60)
    finally:
        stop_session(proc)
        log.close()
        left = os.listdir(temp)
        shutil.rmtree(temp, ignore_errors=True)
    text = open(tmp_path / "job.log").read()
    assert rc == 0, text[-4000:]
    # the engine died in the first actor, which exited; Ray started another, which finished the pages
    died = int(marker.read_text())
    assert seen[0] == died and len(seen) >= 2, seen
    said = f"engine died in actor pid {died}: exiting so Ray restarts the actor"
    assert said in text or logged(ray_cluster, said)
    assert logged(ray_cluster, "test fault: SIGKILL of vLLM engine core process")  # a real crash, not a raise
    rows = read_pages(str(out))
    assert len(rows) == 5 * n and len(set(keys(rows))) == 5 * n  # every page exactly once
    assert all(r["status"] == "ok" for r in rows)
    crash_time = datetime.fromtimestamp(os.path.getmtime(marker), timezone.utc)  # written as the fault fires
    assert sum(r["processed_at"] > crash_time for r in rows) >= 1  # parsed after the crash, by the new actor
    assert json.load(open(out / "summary.json"))["config"]["host"]["max_live_branches"] == 3
    # the actor whose engine died shut it down before exiting, as the other one did at the job's end: no engine's
    # temp folder (its core's file store, the sockets between its processes) is left behind, nor a socket
    assert not [p for p in left if p.startswith("padoc-engine-")], left
    assert not [p for p in left if len(p) == 36 and p.count("-") == 4], left  # vLLM's sockets: uuid4 names


def test_a_killed_actor_and_an_interrupted_driver_complete_on_rerun_without_duplicates(ray_cluster, tiny_model_dir,
                                                                                       tmp_path):
    """One run loses its engine actor, then its driver, mid-run; a rerun finishes it. (1) The engine
    actor's process is SIGKILLed once pages were written: Ray restarts the actor and retries its
    batches, and the new actor process parses pages of the same run. (2) Then the driver is SIGKILLed
    (once a page the new actor parsed was written): a rerun writes the pages it had not, and no page
    twice. On the no-op engine: the test is about the runs, not the engine (its crash: the test above)."""
    n = 16  # 80 pages
    total = 5 * n
    example_copies(tmp_path / "in", n)
    out = tmp_path / "out"
    args = ["--input", str(tmp_path / "in"), "--output", str(out), "--model", tiny_model_dir, "--address",
            ray_cluster["gcs"], "--rows-per-file", "1", "--pages-in-flight", "2", *NOOP]
    tag = f"{CLUSTER_ENV}={ray_cluster['temp_dir']}"  # what every process of the cluster (this module's now) carries
    proc = subprocess.Popen(parse_cmd(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
                            start_new_session=True)
    seen: list[int] = []  # engine actor pids, in the order they appeared
    kill: dict = {}  # the actor's: pid, rows written then, when
    try:
        deadline = time.time() + 300
        while True:
            assert proc.poll() is None, f"the driver exited with {proc.returncode} before it was killed"
            assert time.time() < deadline, f"no actor kill and page after it before the deadline: {seen}, {kill}"
            seen += sorted(_engine_actor_pids(tag) - set(seen))
            made = _written(out)
            if not kill and seen and made:
                os.kill(seen[0], signal.SIGKILL)  # the engine actor dies mid-run
                kill = {"pid": seen[0], "rows": len(made), "time": datetime.now(timezone.utc)}
            elif kill and any(t > kill["time"] for t in made):
                break  # a page parsed after the kill (by a new actor process) is written
            time.sleep(0.2)
        seen += sorted(_engine_actor_pids(tag) - set(seen))  # the new actor lives until the driver dies
        os.killpg(proc.pid, signal.SIGKILL)  # then the driver dies mid-run
        proc.wait(timeout=60)
    finally:  # a failing assert above must not leave the driver (or anything it started) running
        stop_session(proc)
    run = subprocess.run(parse_cmd(*args), capture_output=True, text=True, env=_env(), timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    rows = read_pages(str(out))
    assert len(rows) == total and len(set(keys(rows))) == total  # every page exactly once
    assert all(r["status"] == "ok" for r in rows)
    summary = json.load(open(out / "summary.json"))
    first = [r for r in rows if r["run_id"] != summary["run_id"]]  # the killed run's
    assert 0 < len(first) < total  # the killed run had written some pages, the rerun did the rest
    assert summary["all_inputs_accounted"] and summary["pages_written"] == total - len(first)
    assert 0 < kill["rows"] < total and seen.index(kill["pid"]) < len(seen) - 1, (seen, kill)  # a new actor process
    assert sum(r["processed_at"] > kill["time"] for r in first) >= 1  # the killed run went on, on it


def test_poison_documents_cost_their_own_rows(tmp_path, tiny_model_dir):
    """One raster task holds good files, a file whose renderer crashes on every page, one whose
    renderer hangs on its second page, one that hangs while opening, one whose second page fails to
    render (an unexpected error: render_failed) and one only qpdf can repair.
    The job completes: every good page reaches the engine and is written once, each poison file is
    accounted for with its code, and a rerun has nothing to do and starts no Ray. On the no-op engine
    (an empty layout for every page it is given): the renderer, not the engine, is under test. Its own
    local Ray: the render faults are set in the environment of the run, which its raster workers inherit."""
    from tests.helpers.pdf_factory import text_pdf, xref_broken_pdf

    src = tmp_path / "in"
    src.mkdir()
    for f in ("memo.pdf", "paper.pdf", "report.pdf"):
        shutil.copy(os.path.join(EXAMPLES, f), src / f)
    ex = lambda name: open(os.path.join(EXAMPLES, name), "rb").read()  # noqa: E731
    (src / "crash.pdf").write_bytes(ex("paper.pdf") + b"\n% crash\n")
    (src / "hang.pdf").write_bytes(ex("report.pdf") + b"\n% hang\n")
    (src / "hangopen.pdf").write_bytes(ex("memo.pdf") + b"\n% hang while opening\n")
    (src / "failing.pdf").write_bytes(ex("paper.pdf") + b"\n% render error on page 1\n")
    (src / "repaired.pdf").write_bytes(xref_broken_pdf(text_pdf(2)))
    out = tmp_path / "out"
    args = ["--input", str(src), "--output", str(out), "--model", tiny_model_dir, "--engine", "noop",
            "--raster-docs-per-task", "8", "--render-timeout", "3"]
    faults = {"crash.pdf": "crash", "hang.pdf": "hang@1", "hangopen.pdf": "hang@open", "failing.pdf": "fail@1"}
    env = _env(PADOC_RAY_RENDER_FAULTS=json.dumps(faults))
    run = subprocess.run(parse_cmd(*args), capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    rows = read_pages(str(out))
    assert len(keys(rows)) == len(set(keys(rows)))
    got = {(os.path.basename(r["source_uri"]), r["page_index"]): r for r in rows}
    assert {k: r["status"] for k, r in got.items()} == {
        ("memo.pdf", 0): "ok", ("paper.pdf", 0): "ok", ("paper.pdf", 1): "ok", ("report.pdf", 0): "ok",
        ("report.pdf", 1): "ok", ("crash.pdf", 0): "render_crashed", ("crash.pdf", 1): "render_crashed",
        ("hang.pdf", 0): "ok", ("hang.pdf", 1): "render_timeout", ("hangopen.pdf", -1): "render_timeout",
        ("repaired.pdf", 0): "ok", ("repaired.pdf", 1): "ok", ("failing.pdf", 0): "ok",
        ("failing.pdf", 1): "render_failed"}
    assert got[("repaired.pdf", 0)]["repaired"] is True and got[("memo.pdf", 0)]["repaired"] is False
    ok = [r for r in rows if r["status"] == "ok"]  # each went through the engine stage: the no-op engine's layout
    assert all(r["output_tokens"] == 1 and r["regions"] == [] and r["image_width"] > 0 for r in ok)
    assert "SIGSEGV" in got[("crash.pdf", 0)]["error_message"]
    docs = {os.path.basename(r["source_uri"]): r for r in pq.read_table(out / "documents").to_pylist()}
    assert {k: (d["status"], d["error_code"]) for k, d in docs.items()} == {
        "memo.pdf": ("ok", None), "paper.pdf": ("ok", None), "report.pdf": ("ok", None),
        "crash.pdf": ("failed", "render_crashed"), "hang.pdf": ("partial", None),
        "hangopen.pdf": ("render_timeout", "render_timeout"), "repaired.pdf": ("ok", None),
        "failing.pdf": ("partial", None)}
    assert "injected failure at 1" in got[("failing.pdf", 1)]["error_message"]
    assert "constructor arguments" not in run.stderr and "Token authentication" not in run.stderr
    # rerun: answered from the listing and the rows, without Ray
    again = subprocess.run(parse_cmd(*args), capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 to do" in again.stdout and "ray" not in again.stderr.lower()
    assert len(read_pages(str(out))) == len(rows)
