"""The batch job when something dies on purpose, against real components (a `ray start --head`
cluster on loopback, the real CPU vLLM engine in the engine actors): an engine that crashes and an
actor that is killed, a driver killed mid-run, documents whose renderer crashes or hangs. Split from
tests/cluster/pipeline/test_batch_job.py so that the two run on different workers of `make test`."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import time
from datetime import datetime, timezone

import pyarrow.parquet as pq
import pytest

from tests.helpers.batch_runs import EXAMPLES, example_copies, gt_for_copies, keys, logged, parse_cmd, read_pages
from tests.conftest import BIN, ROOT, _env, stop_session

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


def test_engine_deaths_restart_the_actor_and_every_page_lands_once(ray_cluster, tiny_model_dir, tmp_path):
    """Two ways an engine actor dies mid-run, in one job: (1) its engine really crashes (the
    ``kill_engine_core`` fault of padoc_ray.engine.faults: at the 12th request's first output the
    actor SIGKILLs its own vLLM engine core process; vLLM notices, every page in flight gets
    EngineDeadError, the actor process exits, Ray restarts it and retries its batches), then (2) the
    restarted actor is SIGKILLed while pages remain. Each time a new actor process takes over; the
    job completes with every page written exactly once, all ok, some of them after the kill.
    --max-live-branches rides along (every page still completes). Each page is forced to its
    first 4 regions (4 branches, one more than --max-live-branches): the test is about the actors,
    and a full page's decoding only made each actor's share longer."""
    n = 4  # 20 pages
    example_copies(tmp_path / "in", n)
    gt = gt_for_copies(tmp_path / "gt.json", n, regions=4)
    out, marker = tmp_path / "out", tmp_path / "engine_died"
    fault = {"die_at_request": 12, "once": str(marker), "how": "kill_engine_core"}
    runtime_env = {"env_vars": {"PADOC_RAY_ENGINE_FAULTS": json.dumps(fault)},
                   "excludes": [".venv", "models", "out", ".git", "*.parquet"]}
    cmd = [os.path.join(BIN, "ray"), "job", "submit", "--address", ray_cluster["dashboard"], "--working-dir", ROOT,
           "--runtime-env-json", json.dumps(runtime_env), "--", "python", "jobs/batch_parse.py",
           "--input", str(tmp_path / "in"), "--output", str(out), "--model", tiny_model_dir, "--replay", gt,
           "--pages-in-flight", "4", "--engine-batch-pages", "4", "--rows-per-file", "2", "--max-live-branches", "3"]
    log = open(tmp_path / "job.log", "w")  # to a file: nobody reads a pipe for minutes
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=_env(), start_new_session=True)
    seen: list[int] = []  # engine actor pids, in the order they appeared
    killed = kill_time = rows_at_kill = floor = None

    def written() -> int:
        from padoc_ray.output.reader import read_rows as read_some
        from padoc_ray.storage import StorageConfig

        return read_some(str(out / "pages"), StorageConfig()).num_rows

    try:
        deadline = time.time() + 600
        while time.time() < deadline and proc.poll() is None:
            for pid in sorted(_engine_actor_pids(str(marker)) - set(seen)):
                seen.append(pid)
            if killed is None and len(seen) >= 2 and marker.exists():
                n_rows = written()
                if floor is None:
                    floor = n_rows  # rows written when the restarted actor appeared
                elif floor < n_rows < 20:  # it has written pages, and pages remain: kill it now
                    try:
                        os.kill(seen[-1], signal.SIGKILL)
                    except ProcessLookupError:  # it was replaced between the scan and now: look again
                        seen.pop()
                        floor = None
                        continue
                    killed, rows_at_kill, kill_time = seen[-1], n_rows, datetime.now(timezone.utc)
            time.sleep(0.5)
        rc = proc.wait(timeout=60)
    finally:
        stop_session(proc)
        log.close()
    text = open(tmp_path / "job.log").read()
    assert rc == 0, text[-4000:]
    # (1) the engine died in the first actor, which exited; Ray started another
    died = int(marker.read_text())
    assert seen[0] == died and len(seen) >= 3, seen
    said = f"engine died in actor pid {died}: exiting so Ray restarts the actor"
    assert said in text or logged(ray_cluster, said)
    assert logged(ray_cluster, "test fault: SIGKILL of vLLM engine core process")  # a real crash, not a raise
    # (2) the kill hit a restarted actor while pages were still to do; yet another one finished them
    assert killed is not None and killed != died and seen.index(killed) < len(seen) - 1, (seen, killed)
    assert 0 < rows_at_kill < 20
    rows = read_pages(str(out))
    assert len(rows) == 20 and len(set(keys(rows))) == 20  # every page exactly once
    assert all(r["status"] == "ok" for r in rows)
    assert sum(r["processed_at"] > kill_time for r in rows) >= 1  # parsed after the kill, by the new actor
    assert json.load(open(out / "summary.json"))["config"]["host"]["max_live_branches"] == 3


def test_interrupted_driver_completes_on_rerun_without_duplicates(ray_cluster, tiny_model_dir, tmp_path):
    """A driver SIGKILLed mid-run (after its third page file): a rerun writes the pages it had not,
    and no page twice. Pages are forced to their first 2 regions: the test is about the runs."""
    n = 4  # 20 pages
    example_copies(tmp_path / "in", n)
    gt = gt_for_copies(tmp_path / "gt.json", n, regions=2)
    out = tmp_path / "out"
    args = ["--input", str(tmp_path / "in"), "--output", str(out), "--model", tiny_model_dir, "--address",
            ray_cluster["gcs"], "--replay", gt, "--rows-per-file", "1", "--pages-in-flight", "2"]
    proc = subprocess.Popen(parse_cmd(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
                            start_new_session=True)
    try:
        deadline = time.time() + 300
        while time.time() < deadline and len(glob.glob(str(out / "pages" / "*.parquet"))) < 3:
            assert proc.poll() is None, f"the driver exited with {proc.returncode} before it was killed"
            time.sleep(0.2)
        assert glob.glob(str(out / "pages" / "*.parquet")), "no page was written before the deadline"
        os.killpg(proc.pid, signal.SIGKILL)  # the driver dies mid-run
        proc.wait(timeout=60)
    finally:  # a failing assert above must not leave the driver (or anything it started) running
        stop_session(proc)
    run = subprocess.run(parse_cmd(*args), capture_output=True, text=True, env=_env(), timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    rows = read_pages(str(out))
    assert len(rows) == 20 and len(set(keys(rows))) == 20
    assert all(r["status"] == "ok" for r in rows)
    summary = json.load(open(out / "summary.json"))
    partial = sum(r["run_id"] != summary["run_id"] for r in rows)
    assert 0 < partial < 20  # the killed run had written some pages, the rerun did the rest
    assert summary["all_inputs_accounted"] and summary["pages_written"] == 20 - partial


def test_poison_documents_cost_their_own_rows(tmp_path, tiny_model_dir):
    """One raster task holds good files, a file whose renderer crashes on every page, one whose
    renderer hangs on its second page, one that hangs while opening, one whose second page fails to
    render (an unexpected error: render_failed) and one only qpdf can repair.
    The job completes: every good page is written once by the real engine, each poison file is
    accounted for with its code, and a rerun has nothing to do and starts no Ray."""
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
    (src / "repaired.pdf").write_bytes(xref_broken_pdf(text_pdf(2)))  # its pages are forced like memo's
    gt = json.load(open(os.path.join(EXAMPLES, "ground_truth.json")))
    extra = []
    for p in gt:  # the poison files' good pages are teacher-forced like the originals they copy
        for copy, orig, page_no in (("hang.pdf", "report.pdf", None), ("repaired.pdf", "memo.pdf", 0),
                                    ("repaired.pdf", "memo.pdf", 1), ("failing.pdf", "paper.pdf", None)):
            if p["page_info"]["source_pdf"] == orig:
                q = json.loads(json.dumps(p))
                q["page_info"]["source_pdf"] = copy
                if page_no is not None:
                    q["page_info"]["page_no"] = page_no
                extra.append(q)
    (tmp_path / "gt.json").write_text(json.dumps(gt + extra))
    out = tmp_path / "out"
    args = ["--input", str(src), "--output", str(out), "--model", tiny_model_dir, "--replay", str(tmp_path / "gt.json"),
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
    assert got[("repaired.pdf", 0)]["markdown"] == got[("memo.pdf", 0)]["markdown"]
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
