"""Outputs shared by several runs (one run at a time per output, leftovers of killed runs, an
output inside its input), and inputs that must not exhaust the job (page, frame and size caps,
manifests naming what they may not), through the real batch job: Ray Data on a local cluster with
token authentication (in process, or this worker's `ray start` cluster for runs of the CLI; an S3 output's
runs start their own, whose workers get the S3 settings of the run's environment), the no-op engine (no vLLM: these tests are about what reaches the engine
and what lands in pages/, not about generation)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pyarrow.parquet as pq
import pytest

from padoc_ray.host import HostConfig
from padoc_ray.output import rows
from padoc_ray.pipeline import ledger
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.pipeline.limits import InputLimits
from padoc_ray.storage import StorageConfig

from tests.conftest import _env, stop_session
from tests.helpers import components
from tests.helpers.pdf_factory import text_pdf
from tests.cluster.pipeline.test_hostile_inputs import many_page_pdf, tiff_frames


def run(tmp_path, inp, out, model, **kw):
    from padoc_ray.pipeline.job import run_batch

    cfg = BatchConfig.from_flat(input=str(inp), output=str(out), model=model, host=HostConfig(engine="noop"),
                                rows_per_file=4, **kw)
    lines: list[str] = []
    return run_batch(cfg, log=lines.append), lines


def page_rows(out) -> list[dict]:
    return pq.read_table(os.path.join(out, "pages")).to_pylist()


def documents(out) -> dict[str, dict]:
    return {os.path.basename(r["source_uri"]): r for r in pq.read_table(os.path.join(out, "documents")).to_pylist()}


# ---- one input must not exhaust the job -----------------------------------------------------------------------
@pytest.mark.slow
def test_caps_refuse_bombs_with_their_codes_and_a_raised_cap_retries(ray_driver, tiny_model_dir, tmp_path):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    (inp / "good.pdf").write_bytes(text_pdf(2))
    (inp / "big.pdf").write_bytes(many_page_pdf(100_000))
    (inp / "bomb.tif").write_bytes(tiff_frames([(100, 100)] + [(13000, 13000)] * 2))
    (inp / "frames.tif").write_bytes(tiff_frames([(80, 100)] * 5))
    with open(inp / "large.bin", "wb") as f:
        f.truncate(16 << 20)  # 16 MiB (sparse)
    caps = InputLimits(max_image_frames=3, max_file_bytes=12 << 20)
    t = time.perf_counter()
    summary, _ = run(tmp_path, inp, out, tiny_model_dir, limits=caps)
    assert time.perf_counter() - t < 120  # 100,000 pages never reach the engine
    docs = documents(out)
    assert {k: d["status"] for k, d in docs.items()} == {
        "good.pdf": "ok", "big.pdf": "too_many_pages", "bomb.tif": "absurd_page_size",
        "frames.tif": "too_many_frames", "large.bin": "file_too_large"}
    assert docs["big.pdf"]["page_count"] == 100_000 and docs["frames.tif"]["page_count"] == 5
    got = page_rows(out)
    assert sorted((os.path.basename(r["source_uri"]), r["page_index"]) for r in got) == [
        ("big.pdf", -1), ("bomb.tif", -1), ("frames.tif", -1), ("good.pdf", 0), ("good.pdf", 1), ("large.bin", -1)]
    big = next(r for r in got if r["source_uri"].endswith("big.pdf"))
    assert "100000" in big["error_message"] and "--doc-page-limit" in big["error_message"]
    assert summary["all_inputs_accounted"] and summary["pages_written"] == 2
    # the same caps again: nothing to do, no row added
    summary, lines = run(tmp_path, inp, out, tiny_model_dir, limits=caps)
    assert "0 to do" in lines[0] and len(page_rows(out)) == len(got)
    # raised caps: the refused inputs are parsed now; the page cap still holds for big.pdf
    summary, lines = run(tmp_path, inp, out, tiny_model_dir, limits=InputLimits(max_image_frames=10))
    assert "2 to do" in lines[0]
    docs = documents(out)
    assert docs["frames.tif"]["status"] == "ok" and docs["frames.tif"]["pages_ok"] == 5
    assert docs["large.bin"]["status"] == "skipped" and docs["big.pdf"]["status"] == "too_many_pages"  # read: not_pdf
    keys = [(r["source_uri"], r["page_index"]) for r in page_rows(out) if r["page_index"] >= 0]
    assert len(keys) == len(set(keys)) == 2 + 5


# ---- manifests, normalized URIs, retried reads ---------------------------------------------------------------
@pytest.mark.slow
def test_manifest_lines_outside_get_rows_and_failed_reads_are_retried(ray_driver, tiny_model_dir, tmp_path):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    (inp / "a.pdf").write_bytes(text_pdf(1))
    (inp / "b.pdf").write_bytes(text_pdf(2))
    (tmp_path / "secret.pdf").write_bytes(text_pdf(1, label="Secret"))
    man = inp / "list.txt"
    man.write_text("a.pdf\n./a.pdf\nb.pdf\n../secret.pdf\n/etc/hostname\ns3://other-bucket/x.pdf\nlater.pdf\n")
    # an earlier run could not read b.pdf (a transient storage error)
    os.makedirs(out / "pages")
    earlier = rows.error_row(rows.base_row(run_id="earlier", uri=str(inp / "b.pdf"), doc_id=None, page_index=-1,
                                           page_count=None, mode="fork", model_id="tiny"), "read_failed", "timed out")
    pq.write_table(rows.to_table([earlier]), out / "pages" / "earlier.parquet")

    summary, lines = run(tmp_path, man, out, tiny_model_dir)
    docs = documents(out)
    assert {k: d["status"] for k, d in docs.items()} == {
        "a.pdf": "ok", "b.pdf": "ok", "secret.pdf": "disallowed_uri", "hostname": "disallowed_uri",
        "x.pdf": "disallowed_uri", "later.pdf": "missing_file"}
    got = page_rows(out)
    outside = [r for r in got if r["source_uri"] in (str(tmp_path / "secret.pdf"), "/etc/hostname")]
    assert len(outside) == 2 and all(r["doc_id"] is None and r["markdown"] is None and r["page_index"] == -1
                                     for r in outside)  # never read: no hash, no content, no hint of what exists
    assert sorted(r["page_index"] for r in got if r["source_uri"] == str(inp / "b.pdf")) == [-1, 0, 1]  # retried
    assert len([r for r in got if r["source_uri"].endswith("a.pdf")]) == 1  # one file, one key
    assert summary["all_inputs_accounted"]
    # the missing file appears: the rerun parses it, and only it
    (inp / "later.pdf").write_bytes(text_pdf(1))
    summary, lines = run(tmp_path, man, out, tiny_model_dir)
    assert "1 to do" in lines[0] and documents(out)["later.pdf"]["status"] == "ok"
    summary, lines = run(tmp_path, man, out, tiny_model_dir)
    assert "0 to do" in lines[0]
    # a wider --manifest-allow reads what was refused
    summary, lines = run(tmp_path, man, out, tiny_model_dir, manifest_allow=(str(tmp_path),))
    assert documents(out)["secret.pdf"]["status"] == "ok" and documents(out)["hostname"]["status"] == "disallowed_uri"


# ---- outputs several runs share ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_the_driver_removes_only_leftovers_of_runs_that_are_over(ray_driver, tiny_model_dir, tmp_path):
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    (inp / "a.pdf").write_bytes(text_pdf(1))
    os.makedirs(out / "pages")
    (out / "pages" / "live.parquet").write_bytes(b"PAR1 a live run's half-written file")
    (out / "pages" / "dead.parquet").write_bytes(b"PAR1 an old leftover")
    old = time.time() - 2 * 3600
    os.utime(out / "pages" / "dead.parquet", (old, old))
    killed = out / "pages" / "0123abcd4567_0123456789abcdef0123456789abcdef_000002-0.parquet"
    killed.write_bytes(b"PAR1 torn by a killed run")
    from padoc_ray.output.show import ShowError, find_row

    with pytest.raises(ShowError):  # a read-only command deletes nothing, however old
        find_row(str(out), "a.pdf", 0)
    assert (out / "pages" / "dead.parquet").exists()
    summary, _ = run(tmp_path, inp, out, tiny_model_dir)
    assert summary["all_inputs_accounted"]
    from padoc_ray.output.reader import RUN_FILE

    written = set(os.listdir(out / "pages")) - {"live.parquet"}
    assert written and all(RUN_FILE.match(n)["run"] == summary["run_id"] for n in written)  # named by their run
    assert (out / "pages" / "live.parquet").exists()  # young, of unknown origin: maybe being written
    assert not (out / "pages" / "dead.parquet").exists() and not killed.exists()  # old; an earlier run's


HOLDER = """
import sys, time
from padoc_ray.pipeline.lock import OutputLock
from padoc_ray.storage import StorageConfig
lock = OutputLock(sys.argv[1], StorageConfig(), "live-run-1")
lock.acquire()
import os
os.makedirs(os.path.join(sys.argv[1], "pages"), exist_ok=True)
open(os.path.join(sys.argv[1], "pages", "half.parquet"), "wb").write(b"PAR1 being written")
print("held", flush=True)
time.sleep(600)
"""


def parse(*args, timeout=600):
    cmd = [sys.executable, "-m", "padoc_ray.cli", "parse", *args]
    return subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=timeout)


@pytest.mark.slow
def test_a_second_run_refuses_a_live_output_and_a_dead_runs_lock_is_recovered(ray_cluster, tiny_model_dir, tmp_path):
    """The runs are drivers on this worker's `ray start` cluster (a local Ray each would cost its start)."""
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    for i in range(3):
        (inp / f"d{i}.pdf").write_bytes(text_pdf(2, label=f"Doc {i}"))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True, env=_env(),
                              start_new_session=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        args = ["--input", str(inp), "--output", str(out), "--model", tiny_model_dir, "--engine", "noop",
                "--address", ray_cluster["gcs"]]
        second = parse(*args)
        assert second.returncode == 2, second.stderr[-3000:]
        assert "in use by run live-run-1" in second.stderr and "--wait-lock" in second.stderr
        assert os.listdir(out / "pages") == ["half.parquet"]  # nothing planned, written or removed
    finally:
        os.killpg(holder.pid, signal.SIGKILL)  # the live run dies without releasing anything
        holder.wait(timeout=30)
    third = parse(*args)
    assert third.returncode == 0, third.stderr[-3000:]
    assert (out / "pages" / "half.parquet").exists()  # young: maybe a live run's, so kept
    from padoc_ray.output.reader import read_rows as read_pages

    got = read_pages(str(out / "pages"), StorageConfig()).to_pylist()  # skips the unreadable file
    assert len(got) == 6 and len({(r["source_uri"], r["page_index"]) for r in got}) == 6
    # --engine noop: no model runs, every page is an empty layout (one end-of-stream token)
    full = read_pages(str(out / "pages"), StorageConfig(),
                      columns=["status", "regions", "output_tokens", "n_branches", "markdown"]).to_pylist()
    assert all(r["status"] == "ok" and r["regions"] == [] and r["output_tokens"] == 1 and r["n_branches"] == 0
               and r["markdown"] == "" for r in full)


@pytest.mark.slow
def test_two_concurrent_runs_on_one_output_write_every_row_once(ray_cluster, tiny_model_dir, tmp_path):
    """Two runs started on one output while a third holds it: both wait; when the holder dies, one
    runs and the other, after it, finds nothing to do. The runs are drivers on this worker's `ray start`
    cluster."""
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    for i in range(4):
        (inp / f"d{i}.pdf").write_bytes(text_pdf(3, label=f"Doc {i}"))
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(out)], stdout=subprocess.PIPE, text=True, env=_env(),
                              start_new_session=True)
    procs: list[subprocess.Popen] = []
    try:  # every child is stopped whatever fails, from the holder's first line on
        assert holder.stdout.readline().strip() == "held"
        os.remove(out / "pages" / "half.parquet")
        args = ["--input", str(inp), "--output", str(out), "--model", tiny_model_dir, "--engine", "noop",
                "--address", ray_cluster["gcs"], "--wait-lock", "600", "--rows-per-file", "2"]
        logs = [tmp_path / f"run{i}.out" for i in range(2)]
        for log in logs:
            with open(log, "w") as f:
                procs.append(subprocess.Popen([sys.executable, "-m", "padoc_ray.cli", "parse", *args], stdout=f,
                                              stderr=subprocess.DEVNULL, env=_env(), start_new_session=True))
        deadline = time.time() + 400
        while time.time() < deadline and not all("waiting up to 600 s" in log.read_text() for log in logs):
            assert all(p.poll() is None for p in procs), [log.read_text()[-2000:] for log in logs]
            time.sleep(0.5)
        assert all("waiting up to 600 s" in log.read_text() for log in logs)  # both are at the lock
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=30)
        assert [p.wait(timeout=900) for p in procs] == [0, 0], [log.read_text()[-2000:] for log in logs]
    finally:
        for p in (*procs, holder):  # each run in a session of its own: it and what it started
            stop_session(p)
        holder.stdout.close()
    todo = sorted(int(log.read_text().split(" to do")[0].rsplit(" ", 1)[-1]) for log in logs)
    assert todo == [0, 4]  # the second planned after the first had finished
    got = pq.read_table(out / "pages").to_pylist()
    assert len(got) == 12 and len({(r["source_uri"], r["page_index"]) for r in got}) == 12
    assert json.load(open(out / "summary.json"))["all_inputs_accounted"]


# ---- commands that refuse before doing anything ------------------------------------------------------------------
def cli(*args, env=None, timeout=300):
    return subprocess.run([sys.executable, "-m", "padoc_ray.cli", *args], capture_output=True, text=True,
                          env=env or _env(), timeout=timeout)


def test_an_output_inside_the_input_is_refused_with_exit_code_2(tmp_path):
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "a.pdf").write_bytes(text_pdf(1))
    for spec, out in ((inp, inp / "parsed"), (inp, inp), (inp / "*.pdf", inp)):
        r = cli("parse", "--input", str(spec), "--output", str(out), "--model", str(tmp_path), "--engine", "noop")
        assert r.returncode == 2 and "is inside --input" in r.stderr, r.stderr[-2000:]
    assert sorted(os.listdir(inp)) == ["a.pdf"]  # nothing created


def test_demo_refuses_a_folder_that_is_not_a_previous_demo_output(tmp_path):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "thesis.tex").write_text("years of work")
    r = cli("demo", "--output", str(keep), "--model", str(tmp_path))
    assert r.returncode == 2 and "not a previous demo output" in r.stderr
    assert (keep / "thesis.tex").read_text() == "years of work"
    (tmp_path / "afile").write_text("x")
    assert cli("demo", "--output", str(tmp_path / "afile"), "--model", str(tmp_path)).returncode == 2


def test_train_resumes_only_from_a_trusted_checkpoint(tmp_path, tiny_model_dir):
    from padoc_ray.trainer.ray_train import STATE_FILE, TrainInputError, check_resume_path

    out = tmp_path / "out"
    own = out / "ray_results" / "train" / "checkpoint_000001"
    own.mkdir(parents=True)
    check_resume_path(str(own), str(out))  # the run's own output
    ckpt = tmp_path / "shared" / "checkpoint_000001"
    ckpt.mkdir(parents=True)
    (ckpt / STATE_FILE).write_text('{"step": 1}')
    (ckpt / ".metadata").write_bytes(b"pickled metadata")
    check_resume_path(str(ckpt), str(out))  # owned by this user, writable by no one else
    os.chmod(ckpt / ".metadata", 0o666)
    with pytest.raises(TrainInputError, match="writable by group or others"):
        check_resume_path(str(ckpt), str(out))
    os.chmod(ckpt / ".metadata", 0o644)
    os.symlink("/etc/hostname", ckpt / "link")
    with pytest.raises(TrainInputError, match="symbolic link"):
        check_resume_path(str(ckpt), str(out))
    os.remove(ckpt / "link")
    os.chmod(ckpt, 0o777)
    gt, images = tmp_path / "gt.json", tmp_path / "images"
    gt.write_text("[]")
    images.mkdir()
    r = cli("train", "--model", tiny_model_dir, "--gt", str(gt), "--images", str(images), "--steps", "1",
            "--out", str(out), "--resume", str(ckpt))
    assert r.returncode == 2 and "refusing to load it" in r.stderr and "unpickles" in r.stderr, r.stderr[-2000:]
    assert "unpickles" in cli("train", "--help").stdout
    os.chmod(ckpt, 0o755)
    components.root("giving the checkpoint's file to another uid")  # else the last check is a reported skip
    os.chown(ckpt / ".metadata", 65534, 65534)
    with pytest.raises(TrainInputError, match="owned by uid 65534"):
        check_resume_path(str(ckpt), str(out))


@pytest.mark.slow
def test_the_trainer_keeps_ray_token_authentication_on(tmp_path):
    """A new local cluster started by the trainer has token auth (Ray's default), and the trainer
    does not turn it off; run with a fresh HOME, so Ray makes a token of its own there."""
    env = _env(HOME=str(tmp_path))
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN"):
        env.pop(k, None)
    probe = ("import os, ray\n"
             "from padoc_ray.trainer.ray_train import init_ray\n"
             "init_ray('local')\n"
             "from ray._raylet import AuthenticationMode, get_authentication_mode\n"
             "print(get_authentication_mode() == AuthenticationMode.TOKEN, os.environ.get('RAY_AUTH_MODE'))\n"
             "ray.shutdown()\n")
    r = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["True", "token"]
    assert (tmp_path / ".ray" / "auth_token").stat().st_size > 0


def _lock_written(client, bucket: str, key: str, after=None, hang_s: float = 120.0):
    """When the store last wrote the lock object (its Last-Modified), polled until that is later than
    ``after``: the moment a heartbeat lands, seen within a poll of it. ``hang_s`` only ends a test whose
    heartbeat never comes; no outcome depends on how long it takes."""
    give_up = time.monotonic() + hang_s
    while True:
        written = client.head_object(Bucket=bucket, Key=key)["LastModified"]
        if after is None or written > after:
            return written
        if time.monotonic() > give_up:
            pytest.fail(f"no heartbeat rewrote s3://{bucket}/{key} after {after} in {hang_s:g} s")
        time.sleep(0.05)


def test_the_lock_on_an_s3_output_heartbeats_and_a_dead_runs_lock_is_taken_over(s3, monkeypatch, caplog):
    """Staleness is judged by the store's clock (Last-Modified against the response's Date, both in whole
    seconds), so the test reads that clock too instead of sleeping against it: run-a's heartbeat rewrites its
    lock past stale_s after taking it, and run-b, asking as that beat lands, is refused (a lock never rewritten
    would be stale by then). Once run-a dies, run-b waits and takes the lock over when the store says its last
    beat is older than stale_s."""
    import datetime as dt
    import logging

    from padoc_ray.pipeline.lock import OutputInUse, OutputLock

    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    s3["client"].create_bucket(Bucket="locked-out")
    cfg, out = StorageConfig(endpoint=s3["endpoint"]), "s3://locked-out/run"
    a = OutputLock(out, cfg, "run-a", stale_s=2)
    a.acquire()
    with pytest.raises(OutputInUse, match="in use by run run-a"):
        OutputLock(out, cfg, "run-b", stale_s=2).acquire()
    taken = _lock_written(s3["client"], "locked-out", "run/_lock.json")
    _lock_written(s3["client"], "locked-out", "run/_lock.json", after=taken + dt.timedelta(seconds=2))
    with pytest.raises(OutputInUse):  # a beat just landed, more than stale_s after the lock was taken
        OutputLock(out, cfg, "run-b", stale_s=2).acquire()
    a.lease.abandon()  # run-a dies: no heartbeat, no release
    said: list[str] = []
    b = OutputLock(out, cfg, "run-b", stale_s=2, wait_s=30, poll_s=0.5, log=said.append)
    with caplog.at_level(logging.WARNING, logger="padoc_ray.lease"):
        b.acquire()  # waits until the lock is stale, then takes it over (OutputInUse after wait_s)
    assert [m for m in said if "in use by run run-a" in m and "waiting up to 30 s" in m]
    (took,) = [r for r in caplog.records if r.getMessage().startswith("took over the stale lock of run run-a")]
    assert took.args[-1] > 2  # run-a's last heartbeat, by the store's clock, was older than stale_s
    body = json.loads(s3["client"].get_object(Bucket="locked-out", Key="run/_lock.json")["Body"].read())
    assert body["run_id"] == "run-b"
    b.release()
    with OutputLock(out, cfg, "run-c"):
        pass
    assert "Contents" not in s3["client"].list_objects_v2(Bucket="locked-out")


# ---- pure parts: what a rerun retries, which rows are current, storage errors ----------------------------------
def _row(uri, page, count, code=None, t=0):
    import datetime as dt

    r = rows.base_row(run_id="r", uri=uri, doc_id="d", page_index=page, page_count=count, mode="fork", model_id="m")
    at = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=t)
    return {**(rows.error_row(r, code, code) if code else {**r, "status": "ok"}), "processed_at": at}


def test_plan_retries_failed_reads_and_missing_files_and_keeps_other_verdicts():
    from padoc_ray.pipeline.job import plan
    from padoc_ray.listing import DISALLOWED

    existing = rows.to_table([
        _row("read", -1, None, "read_failed"),
        _row("gone", -1, None, "missing_file"),
        _row("bad", -1, None, "corrupt_pdf"),
        _row("healed", -1, None, "read_failed", t=0), _row("healed", 0, 1, t=5),  # retried earlier, now done
        _row("outside", -1, None, "disallowed_uri"),
        _row("grew", 0, 100_000, t=0), _row("grew", -1, 100_000, "too_many_pages", t=9),  # refused after a change
    ])
    listed = [("read", 10), ("gone", 10), ("bad", 10), ("healed", 10), ("outside", DISALLOWED), ("grew", 10)]
    todo, complete = plan(listed, existing, BatchConfig(input="x", output="y", model="m"))
    assert [t["uri"] for t in todo] == ["read", "gone"] and complete == 4
    assert all(t["done"] == [] for t in todo)
    todo, _ = plan(listed, existing, BatchConfig.from_flat(input="x", output="y", model="m", max_pages_per_doc=10))
    assert [t["uri"] for t in todo] == ["read", "gone", "grew"]  # 10 selected pages are under the cap


def test_current_rows_take_the_newest_verdict_per_input():
    t = rows.to_table([
        _row("a", -1, None, "read_failed", t=0), _row("a", 0, 2, t=3), _row("a", 1, 2, "runaway", t=4),
        _row("b", 0, 1, t=0), _row("b", -1, None, "corrupt_pdf", t=7),
        _row("c", 0, 1, "deadline", t=0), _row("c", 0, 1, t=2),
    ])
    got = sorted((r["source_uri"], r["page_index"], r["status"]) for r in ledger.current_rows(t).to_pylist())
    assert got == [("a", 0, "ok"), ("a", 1, "runaway"), ("b", -1, "corrupt_pdf"), ("c", 0, "ok")]
    docs = {d["source_uri"]: d["status"] for d in
            ledger.documents_table(ledger.current_rows(t), [("a", 1), ("b", 1), ("c", 1)], None, None).to_pylist()}
    assert docs == {"a": "partial", "b": "corrupt_pdf", "c": "ok"}


def test_a_storage_error_while_reading_pages_is_retried_and_never_deletes(tmp_path, monkeypatch):
    from padoc_ray.output import reader
    from padoc_ray.pipeline import pages as pg

    pages = tmp_path / "pages"
    pages.mkdir()
    pq.write_table(rows.to_table([_row("a", 0, 1)]), pages / "good.parquet")
    old = time.time() - 2 * 3600
    os.utime(pages / "good.parquet", (old, old))
    real, calls = reader.footer, []

    def flaky(fs, path):
        calls.append(path)
        if len(calls) <= 2:
            raise OSError("AWS Error SLOW_DOWN during GetObject operation: please reduce your request rate")
        return real(fs, path)

    waits: list[float] = []
    monkeypatch.setattr(reader, "footer", flaky)
    monkeypatch.setattr(reader, "backoff_sleep", waits.append)  # the reader's backoff, not time.sleep
    got = pg.read_pages(str(pages), StorageConfig(), cleanup_for_run="now", grace_s=0)
    assert got.num_rows == 1 and len(calls) == 3 and (pages / "good.parquet").exists()
    assert waits == [0.5, 1.0]  # one backoff after each failed try, doubling

    def down(fs, path):
        raise OSError("connection refused")

    monkeypatch.setattr(reader, "footer", down)
    waits.clear()
    with pytest.raises(OSError, match="after 4 attempts"):
        pg.read_pages(str(pages), StorageConfig(), cleanup_for_run="now", grace_s=0)
    assert (pages / "good.parquet").exists()
    assert waits == [0.5, 1.0, 2.0]  # none after the last try


# ---- resume and leftover clean-up on S3 ----------------------------------------------------------------------
@pytest.mark.slow
def test_resume_and_leftover_cleanup_on_an_s3_output(s3, ray_cluster, tiny_model_dir, tmp_path, monkeypatch):
    """`padoc-ray parse` on an s3:// output (no-op engine, on the worker's `ray start` cluster, whose processes
    have the S3 server's credentials as a cluster's own would be): a rerun parses only
    what is missing; the driver removes a torn file an earlier run left under pages/ at once, keeps
    a young unreadable file of unknown origin, and removes it once it is older than --leftover-grace."""
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)  # for this process's reads; the runs get them through _env()
    c = s3["client"]
    c.create_bucket(Bucket="resume-out")
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "a.pdf").write_bytes(text_pdf(2))
    storage = StorageConfig(endpoint=s3["endpoint"])
    out = "s3://resume-out/run"
    args = ["--input", str(inp), "--output", out, "--model", tiny_model_dir, "--engine", "noop",
            "--address", ray_cluster["gcs"], "--s3-endpoint", s3["endpoint"]]

    def listing():
        return sorted(o["Key"] for o in c.list_objects_v2(Bucket="resume-out", Prefix="run/pages/").get("Contents", []))

    def summary():
        return json.loads(c.get_object(Bucket="resume-out", Key="run/summary.json")["Body"].read())

    first_run = parse(*args)
    assert first_run.returncode == 0, first_run.stderr[-3000:]
    assert summary()["pages_written"] == 2
    first = listing()
    torn = "run/pages/0123abcd4567_0123456789abcdef0123456789abcdef_000001-0.parquet"  # an earlier run's name
    c.put_object(Bucket="resume-out", Key=torn, Body=b"PAR1 torn by a killed run")
    c.put_object(Bucket="resume-out", Key="run/pages/unknown.parquet", Body=b"PAR1 maybe being written")
    (inp / "b.pdf").write_bytes(text_pdf(1))
    second = parse(*args)
    assert second.returncode == 0, second.stderr[-3000:]
    assert "1 to do" in second.stdout and summary()["pages_written"] == 1  # only b.pdf: a.pdf is not parsed again
    assert torn not in listing() and "run/pages/unknown.parquet" in listing()  # young, unknown: kept
    assert set(first) <= set(listing())  # the first run's files stay
    from padoc_ray.output.reader import read_rows as read_pages

    got = read_pages(out + "/pages", storage).to_pylist()
    assert sorted((os.path.basename(r["source_uri"]), r["page_index"]) for r in got) == [
        ("a.pdf", 0), ("a.pdf", 1), ("b.pdf", 0)]
    third = parse(*args, "--leftover-grace", "0")
    assert third.returncode == 0, third.stderr[-3000:]
    assert "0 to do" in third.stdout and "run/pages/unknown.parquet" not in listing()  # older than the grace
    assert read_pages(out + "/pages", storage).num_rows == 3


# ---- exit codes and configuration checks of the batch commands -----------------------------------------------
def _patched_no_work(monkeypatch):
    """The pipeline "loses" its work (writes nothing) and no Ray starts: what exit code 1 is for."""
    from padoc_ray.cli import batch as cli_args
    from padoc_ray.pipeline import job

    monkeypatch.setattr(job, "_pipeline", lambda work, cfg, model_id: None)
    monkeypatch.setattr(cli_args, "_init_ray", lambda args: None)


def test_parse_exits_1_when_an_input_is_not_accounted_for_and_2_on_bad_arguments(tmp_path, monkeypatch, capsys):
    from padoc_ray.cli import build_parser
    from padoc_ray.cli.batch import run_from_args

    _patched_no_work(monkeypatch)
    inp = tmp_path / "in"
    inp.mkdir()
    (inp / "a.pdf").write_bytes(text_pdf(1))
    parser = build_parser()
    args = parser.parse_args(["parse", "--input", str(inp), "--output", str(tmp_path / "out"), "--model",
                              str(tmp_path), "--engine", "noop"])
    assert run_from_args(args) == 1
    summary = json.load(open(tmp_path / "out" / "summary.json"))
    assert not summary["all_inputs_accounted"] and summary["unaccounted"] == [str(inp / "a.pdf")]
    assert documents(tmp_path / "out")["a.pdf"]["status"] == "missing"
    # 2: arguments argparse accepts but the configuration refuses, and ones argparse refuses
    args = parser.parse_args(["parse", "--input", str(inp), "--output", str(inp / "o"), "--model", str(tmp_path)])
    assert run_from_args(args) == 2 and "is inside --input" in capsys.readouterr().err
    for bad in (["--actors", "2,1"], ["--actors", "x"], ["--mode", "both"], ["--engine", "gpt"],
                ["--image-encoding", "jpeg"], ["--pages", "0-2"]):
        with pytest.raises(SystemExit) as e:
            parser.parse_args(["parse", "--input", str(inp), "--output", str(tmp_path / "o"), "--model", "m", *bad])
        assert e.value.code == 2, bad


def test_reannotate_runs_one_batch_per_mode_and_its_exit_codes(tmp_path, monkeypatch, capsys):
    from padoc_ray.cli import build_parser
    from padoc_ray.cli.common import EXAMPLES_DIR
    from padoc_ray.cli.batch import reannotate_from_args

    _patched_no_work(monkeypatch)
    parser = build_parser()
    gt = os.path.join(EXAMPLES_DIR, "ground_truth.json")
    base = ["reannotate", "--gt", gt, "--source", EXAMPLES_DIR, "--model", str(tmp_path), "--engine", "noop"]
    # 1: prediction sets with inputs not accounted for; one batch run per mode, each in its own folder
    assert reannotate_from_args(parser.parse_args([*base, "--output", str(tmp_path / "r1"),
                                                   "--modes", "fork,sequential"])) == 1
    runs = json.load(open(tmp_path / "r1" / "reannotate_summary.json"))["runs"]
    assert list(runs) == ["fork", "sequential"]
    for mode, run in runs.items():  # each set's run parsed in its mode, into its own output
        assert run["mode"] == mode and run["all_inputs_accounted"] is False
        summary = json.load(open(tmp_path / "r1" / "predictions" / mode / "summary.json"))
        assert summary["config"]["host"]["mode"] == mode and summary["unaccounted"], (mode, summary)
    # 2: bad arguments, and a ground truth that is not there
    for extra, msg in ((["--modes", "fork,fork"], "distinct"), (["--modes", "greedy"], "fork or sequential"),
                       (["--compare", "gt=" + str(tmp_path)], "clash")):
        assert reannotate_from_args(parser.parse_args([*base, "--output", str(tmp_path / "r2"), *extra])) == 2
        assert msg in capsys.readouterr().err, extra
    missing = ["reannotate", "--gt", str(tmp_path / "none.json"), "--source", EXAMPLES_DIR, "--model", str(tmp_path),
               "--output", str(tmp_path / "r3")]
    assert reannotate_from_args(parser.parse_args(missing)) == 2
    with pytest.raises(SystemExit) as e:
        parser.parse_args([*base, "--output", str(tmp_path / "r4"), "--compare", "no-equals-sign"])
    assert e.value.code == 2


@pytest.mark.parametrize("field,value,message", [
    ("mode", "both", "mode must be fork or sequential"),
    ("num_actors", (2, 1), "1 <= min <= max"),
    ("num_actors", (0, 1), "1 <= min <= max"),
    ("image_encoding", "jpeg", "image_encoding must be one of"),
    ("raster_pages_per_block", 0, "must be >= 1"),
    ("engine_batch_pages", 0, "must be >= 1"),
    ("raster_docs_per_task", 0, "must be >= 1"),
    ("max_pages_per_doc", 0, "max_pages_per_doc must be >= 1"),
    ("gpus_per_actor", -1.0, "cannot be negative"),
    ("cpus_per_actor", -0.5, "cannot be negative"),
    ("raster_cpus", 0.0, "must be > 0"),
    ("writer_cpus", 0.0, "must be > 0"),
    ("leftover_grace_s", -1.0, "leftover_grace_s"),
    ("lock_wait_s", -1.0, "lock_wait_s"),
    ("lock_stale_s", 0.0, "lock_stale_s"),
    ("run_id", "../x", "run_id must be letters"),
    ("run_id", "", "run_id must be letters"),
    ("output", "IN/out", "is inside --input"),
])
def test_batch_config_refuses_each_bad_field(field, value, message, tmp_path):
    """(The engine host's fields, engine and pages in flight among them: tests/unit/host/test_page_host.py.)"""
    base = {"input": str(tmp_path), "output": str(tmp_path.parent / "elsewhere"), "model": "m"}
    BatchConfig(**base)  # the base itself is fine
    if field == "output":
        value = str(tmp_path / "out")
    with pytest.raises(ValueError, match=message):
        BatchConfig.from_flat(**{**base, field: value})


def test_the_s3_endpoint_comes_from_the_flag_else_the_environment(monkeypatch):
    from padoc_ray.cli.batch import config_from_args

    from padoc_ray.cli import build_parser

    for k in ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3"):
        monkeypatch.delenv(k, raising=False)
    assert StorageConfig().resolved_endpoint() is None
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://env:9000")
    assert StorageConfig().resolved_endpoint() == "http://env:9000"
    args = build_parser().parse_args(["parse", "--input", "s3://b/in", "--output", "s3://b/out", "--model", "m",
                                      "--s3-endpoint", "http://flag:9000"])
    assert config_from_args(args).storage.resolved_endpoint() == "http://flag:9000"  # the flag wins
