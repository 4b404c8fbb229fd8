"""The batch job against real components: a `ray start --head` cluster on loopback, an S3 server
(moto) on loopback, `ray job submit`, and the real CPU vLLM engine in the engine actors."""

from __future__ import annotations

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from datetime import datetime, timezone

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pypdfium2 as pdfium
import pytest

from .conftest import BIN, ROOT, _env, stop_session
from .pdf_factory import write_bad_input_folder

pytestmark = [pytest.mark.engine, pytest.mark.slow]

EXAMPLES = os.path.join(ROOT, "examples")


def parse_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "padoc_ray.cli", "parse", *args]


def read_pages(out: str):
    return pads.dataset(os.path.join(out, "pages"), format="parquet").to_table().to_pylist()


def keys(rows):
    return [(r["source_uri"], r["page_index"]) for r in rows]


def run_logged(cmd, log, env=None, timeout=600):
    """Run a child with its output in a file (never an unread pipe); returns (returncode, output)."""
    with open(log, "w") as f:
        rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, env=env or _env(), timeout=timeout).returncode
    return rc, open(log).read()


def forced_page(source: str, page_no: int, like: str = "memo.pdf", regions: int | None = None) -> dict:
    """An OmniDocBench page for ``source``/``page_no`` whose regions are those of an example page
    (the first ``regions`` of them): teacher-forced, any page parses exactly to it."""
    gt = json.load(open(os.path.join(EXAMPLES, "ground_truth.json")))
    q = json.loads(json.dumps(next(p for p in gt if p["page_info"]["source_pdf"] == like)))
    if regions is not None:
        q["layout_dets"] = q["layout_dets"][:regions]
    q["page_info"].update(source_pdf=source, page_no=page_no, image_path=f"{source}_{page_no}.png")
    return q


def test_job_submit_reads_and_writes_s3(ray_cluster, s3, tiny_model_dir, tmp_path, monkeypatch, own_model_cache):
    """`ray job submit` of jobs/batch_parse.py with everything on S3 (inputs, output, model,
    replay truth), the endpoint given by --s3-endpoint only. The model is copied from S3 into this
    session's own model cache (so the download happens on every run of the suite)."""
    c = s3["client"]
    c.create_bucket(Bucket="padoc-in")
    c.create_bucket(Bucket="padoc-out")
    for f in glob.glob(os.path.join(EXAMPLES, "*.pdf")):
        c.upload_file(f, "padoc-in", f"docs/{os.path.basename(f)}")
    c.put_object(Bucket="padoc-in", Key="docs/readme.txt", Body=b"not a pdf")
    c.upload_file(os.path.join(EXAMPLES, "ground_truth.json"), "padoc-in", "gt.json")
    for f in os.listdir(tiny_model_dir):
        c.upload_file(os.path.join(tiny_model_dir, f), "padoc-in", f"model/tiny/{f}")
    before = set(os.listdir(own_model_cache))  # other tests of the session may have cached other models
    runtime_env = {"env_vars": dict(s3["env"]),  # no AWS_ENDPOINT_URL: the endpoint comes from --s3-endpoint
                   "excludes": [".venv", "models", "out", ".git", "*.parquet"]}
    cmd = [os.path.join(BIN, "ray"), "job", "submit", "--address", ray_cluster["dashboard"], "--working-dir", ROOT,
           "--runtime-env-json", json.dumps(runtime_env), "--",
           "python", "jobs/batch_parse.py", "--input", "s3://padoc-in/docs", "--output", "s3://padoc-out/run1",
           "--model", "s3://padoc-in/model/tiny", "--replay", "s3://padoc-in/gt.json", "--rows-per-file", "2",
           "--s3-endpoint", s3["endpoint"]]
    env = _env()
    env.pop("AWS_ENDPOINT_URL", None)
    rc, log = run_logged(cmd, tmp_path / "job.log", env=env)
    assert rc == 0, log[-6000:]
    assert "all inputs accounted: True" in log
    summary = json.loads(c.get_object(Bucket="padoc-out", Key="run1/summary.json")["Body"].read())
    assert summary["pages_written"] == 5 and summary["page_status"] == {"ok": 5}
    assert summary["document_status"] == {"ok": 3, "skipped": 1}
    from padoc_ray.storage import StorageConfig, filesystem

    fs, path = filesystem("s3://padoc-out/run1/pages", StorageConfig(endpoint=s3["endpoint"]))
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    rows = pads.dataset(path, filesystem=fs, format="parquet").to_table().to_pylist()
    assert len(rows) == 6 and len(set(keys(rows))) == 6
    memo = next(r for r in rows if r["source_uri"].endswith("memo.pdf"))
    assert memo["status"] == "ok" and memo["regions"][0]["content"] == "MEMORANDUM"
    assert memo["doc_id"] == __import__("hashlib").sha256(open(os.path.join(EXAMPLES, "memo.pdf"), "rb").read()).hexdigest()
    assert memo["markdown"].startswith("# MEMORANDUM") and memo["f_padoc"] < memo["f_seq"]
    skipped = next(r for r in rows if r["source_uri"].endswith("readme.txt"))
    assert skipped["page_index"] == -1 and skipped["error_code"] == "not_pdf"
    # the engine actor copied the model from S3 into this session's cache, this run
    copies = [d for d in os.listdir(own_model_cache)
              if d not in before and os.path.exists(os.path.join(own_model_cache, d, ".complete"))]
    assert len(copies) == 1  # a new copy, made by this job
    copy = os.path.join(own_model_cache, copies[0])
    assert json.load(open(os.path.join(copy, ".source.json")))[0] == "s3://padoc-in/model/tiny"
    for f in os.listdir(tiny_model_dir):
        assert open(os.path.join(copy, f), "rb").read() == open(os.path.join(tiny_model_dir, f), "rb").read(), f


def test_bad_inputs_are_all_accounted_for(ray_cluster, tiny_model_dir, tmp_path):
    """One file per kind of bad input, and good files, in one run: each file gets exactly its
    expected status (every page that reaches the engine is teacher-forced, so it is ok), every page
    row carries its token counts and timings, the run's summary is also under runs/, and a rerun
    has nothing to do."""
    src = tmp_path / "in"
    src.mkdir()
    expect = write_bad_input_folder(str(src), big_pages=30)
    engine_pages = {name: exp.get("pages", exp.get("image_pages")) for name, exp in expect.items()
                    if ("pages" in exp or "image_pages" in exp) and "page_status" not in exp}
    gt = [forced_page(name, i, regions=2) for name, n in engine_pages.items() for i in range(n)]
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    out = tmp_path / "out"
    args = ["--input", str(src), "--output", str(out), "--model", tiny_model_dir, "--address", ray_cluster["gcs"],
            "--longest-side", "400", "--replay", str(tmp_path / "gt.json")]
    rc, log = run_logged(parse_cmd(*args), tmp_path / "run1.log")
    assert rc == 0, log[-4000:]
    rows = read_pages(str(out))
    assert len(keys(rows)) == len(set(keys(rows)))  # no duplicates
    docs = {os.path.basename(r["source_uri"]): r for r in pq.read_table(out / "documents").to_pylist()}
    assert {k: d["status"] for k, d in docs.items()} == {name: exp["doc_status"] for name, exp in expect.items()}
    for name, exp in expect.items():
        d = docs[name]
        file_rows = [r for r in rows if r["source_uri"].endswith("/" + name)]
        if "code" in exp:  # a document-level verdict: one row, page_index -1
            assert [(r["page_index"], r["status"], r["error_code"]) for r in file_rows] == [(-1, exp["code"],
                                                                                          exp["code"])], name
            assert d["error_code"] == exp["code"], name
            continue
        n = exp.get("pages", exp.get("image_pages"))
        assert d["page_count"] == n and sorted(r["page_index"] for r in file_rows) == list(range(n)), name
        assert {r["status"] for r in file_rows} == {exp.get("page_status") or "ok"}, name
        if name.endswith(".pdf"):
            assert d["page_count"] == len(pdfium.PdfDocument((src / name).read_bytes())), name
    photo = next(r for r in rows if r["source_uri"].endswith("/photo.png"))
    assert (photo["image_width"], photo["image_height"]) == (300, 400)  # a page image is never enlarged
    rotated = [r for r in rows if r["source_uri"].endswith("/rotated.pdf")]
    assert all(r["rotation"] == 90 and r["image_width"] > r["image_height"] for r in rotated)
    # what every parsed page carries: its prompt and prefix-cache tokens, first-token and layout times
    ok = [r for r in rows if r["status"] == "ok"]
    assert len(ok) == sum(engine_pages.values()) == 36
    for r in ok:
        assert r["n_branches"] == 2 and r["output_tokens"] > 0, r["source_uri"]
        assert r["prompt_tokens"] > r["cached_tokens"] > 0, r["source_uri"]  # the branches reuse the page's prefix
        assert 0 < r["ttft_s"] <= r["layout_s"] <= r["e2e_s"], r["source_uri"]
        assert r["render_s"] > 0 and r["markdown"].startswith("# MEMORANDUM")
    summary = json.load(open(out / "summary.json"))
    assert json.load(open(out / "runs" / f"{summary['run_id']}.json")) == summary
    assert summary["page_status"] == {"ok": 36, "absurd_page_size": 1} and summary["all_inputs_accounted"]
    # rerun: nothing to do, nothing added, one more run record
    rc, log = run_logged(parse_cmd(*args), tmp_path / "run2.log")
    assert rc == 0, log[-3000:]
    assert "0 to do" in log
    assert len(read_pages(str(out))) == len(rows)
    again = json.load(open(out / "summary.json"))
    assert sorted(os.listdir(out / "runs")) == sorted(f"{r['run_id']}.json" for r in (summary, again))
    assert again["run_id"] != summary["run_id"] and again["rows_written"] == 0


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


def _example_copies(d, n: int) -> None:
    os.makedirs(d, exist_ok=True)
    for i in range(n):
        for f in glob.glob(os.path.join(EXAMPLES, "*.pdf")):
            shutil.copy(f, os.path.join(d, f"{i}_{os.path.basename(f)}"))


def _gt_for_copies(path, n: int) -> str:
    gt = json.load(open(os.path.join(EXAMPLES, "ground_truth.json")))
    out = []
    for i in range(n):
        for p in gt:
            q = json.loads(json.dumps(p))
            q["page_info"]["source_pdf"] = f"{i}_{p['page_info']['source_pdf']}"
            out.append(q)
    with open(path, "w") as f:
        json.dump(out, f)
    return str(path)


def test_engine_deaths_restart_the_actor_and_every_page_lands_once(ray_cluster, tiny_model_dir, tmp_path):
    """Two ways an engine actor dies mid-run, in one job: (1) its engine really crashes (the
    ``kill_engine_core`` fault of padoc_ray.engine.faults: at the 12th request's first output the
    actor SIGKILLs its own vLLM engine core process; vLLM notices, every page in flight gets
    EngineDeadError, the actor process exits, Ray restarts it and retries its batches), then (2) the
    restarted actor is SIGKILLed while pages remain. Each time a new actor process takes over; the
    job completes with every page written exactly once, all ok, some of them after the kill.
    --max-live-branches rides along (every page still completes)."""
    n = 4  # 20 pages
    _example_copies(tmp_path / "in", n)
    gt = _gt_for_copies(tmp_path / "gt.json", n)
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
    assert said in text or _logged(ray_cluster, said)
    assert _logged(ray_cluster, "test fault: SIGKILL of vLLM engine core process")  # a real crash, not a raise
    # (2) the kill hit a restarted actor while pages were still to do; yet another one finished them
    assert killed is not None and killed != died and seen.index(killed) < len(seen) - 1, (seen, killed)
    assert 0 < rows_at_kill < 20
    rows = read_pages(str(out))
    assert len(rows) == 20 and len(set(keys(rows))) == 20  # every page exactly once
    assert all(r["status"] == "ok" for r in rows)
    assert sum(r["processed_at"] > kill_time for r in rows) >= 1  # parsed after the kill, by the new actor
    assert json.load(open(out / "summary.json"))["config"]["host"]["max_live_branches"] == 3


def _logged(ray_cluster, text: str) -> bool:
    """Whether any process of the test's own cluster logged ``text`` (its files under its temp dir)."""
    for path in glob.glob(os.path.join(ray_cluster["temp_dir"], "session_*", "logs", "*")):
        try:
            if text in open(path, errors="replace").read():
                return True
        except (IsADirectoryError, OSError):
            continue
    return False


def test_batch_flags_each_show_their_effect(ray_cluster, tiny_model_dir, tmp_path):
    """One run with many flags, each asserted by what it changes in the output: --pages 2-4 with
    --max-pages-per-doc 2 (pages 1, 2 of a 5-page PDF: neither flag alone gives that), --mode
    sequential (no branches, the truth's regions), --dpi 36 (306 x 396 px letter pages),
    --page-deadline 12 (a page forced to decode > 8192 tokens is cut at 12 s; the others, ~500
    tokens, are not), --image-encoding ppm and --actors 1,2 (recorded, pages decoded); a manifest
    line that is gone (missing_file) and one that cannot be read (read_failed) get their rows."""
    import random

    from padoc_ray.tokenizer import ModelProtocol
    from padoc_ray.groundtruth import truth_from_json
    from padoc_ray.protocol import quantized, serialize_sequential, to_markdown

    from .pdf_factory import text_pdf

    src = tmp_path / "in"
    src.mkdir()
    (src / "five.pdf").write_bytes(text_pdf(5))
    for f in ("paper.pdf", "report.pdf"):
        shutil.copy(os.path.join(EXAMPLES, f), src / f)
    (src / "list.txt").write_text("five.pdf\npaper.pdf\nreport.pdf\ngone.pdf\n/proc/self/mem\n")  # mem: EIO on read
    rng = random.Random(7)
    long = forced_page("five.pdf", 1, regions=1)
    long["layout_dets"][0]["text"] = " ".join("".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                                                      for _ in range(rng.randint(3, 9))) for _ in range(6000))
    gt = [*json.load(open(os.path.join(EXAMPLES, "ground_truth.json"))), long, forced_page("five.pdf", 2)]
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    mp = ModelProtocol(tiny_model_dir)
    truth = truth_from_json((tmp_path / "gt.json").read_bytes())
    assert len(serialize_sequential(mp.vocab, mp.tokenizer, truth[("five.pdf", 1)])) > 8192  # > --max-tokens
    out = tmp_path / "out"
    args = ["--input", str(src / "list.txt"), "--output", str(out), "--model", tiny_model_dir,
            "--address", ray_cluster["gcs"], "--replay", str(tmp_path / "gt.json"), "--manifest-allow", str(src),
            "--manifest-allow", "/proc/self",
            "--mode", "sequential", "--pages", "2-4", "--max-pages-per-doc", "2", "--dpi", "36",
            "--page-deadline", "12", "--image-encoding", "ppm", "--actors", "1,2"]
    rc, log = run_logged(parse_cmd(*args), tmp_path / "run.log")
    assert rc == 0, log[-4000:]
    rows = {(os.path.basename(r["source_uri"]), r["page_index"]): r for r in read_pages(str(out))}
    assert {k: r["status"] for k, r in rows.items()} == {
        ("five.pdf", 1): "deadline", ("five.pdf", 2): "ok", ("paper.pdf", 1): "ok", ("report.pdf", 1): "ok",
        ("gone.pdf", -1): "missing_file", ("mem", -1): "read_failed"}
    assert "Input/output error" in rows[("mem", -1)]["error_message"] and rows[("mem", -1)]["doc_id"] is None
    cut = rows[("five.pdf", 1)]
    assert not cut["valid"] and 12 <= cut["e2e_s"] < 30 and 0 < cut["output_tokens"] < 8192
    for key in (("five.pdf", 2), ("paper.pdf", 1), ("report.pdf", 1)):
        r = rows[key]
        want = quantized(truth[key], mp.vocab)
        assert r["mode"] == "sequential" and r["n_branches"] == 0 and r["valid"], key
        assert r["markdown"] == to_markdown(want) and len(r["regions"]) == len(want.regions), key
        assert r["f_seq"] == len(serialize_sequential(mp.vocab, mp.tokenizer, truth[key])), key
        assert (r["image_width"], r["image_height"]) == (306, 396), key  # 612 x 792 pt at 36 dpi
        assert r["e2e_s"] < 12, key
    docs = {os.path.basename(r["source_uri"]): r for r in pq.read_table(out / "documents").to_pylist()}
    assert {k: (d["status"], d["pages_selected"]) for k, d in docs.items()} == {
        "five.pdf": ("partial", 2), "paper.pdf": ("ok", 1), "report.pdf": ("ok", 1),
        "gone.pdf": ("missing_file", 0), "mem": ("read_failed", 0)}
    cfg = json.load(open(out / "summary.json"))["config"]
    assert cfg["image_encoding"] == "ppm" and cfg["num_actors"] == [1, 2] and cfg["render"]["dpi"] == 36
    assert cfg["pages"] == [1, 2, 3] and cfg["max_pages_per_doc"] == 2 and cfg["host"]["scheduler"]["deadline_s"] == 12


def test_interrupted_driver_completes_on_rerun_without_duplicates(ray_cluster, tiny_model_dir, tmp_path):
    n = 4  # 20 pages
    _example_copies(tmp_path / "in", n)
    gt = _gt_for_copies(tmp_path / "gt.json", n)
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


def test_reannotate_compares_modes_with_the_corpus_and_resumes(ray_cluster, tmp_path, tiny_model_dir):
    """Re-annotation over the example corpus, fork and sequential, teacher-forced by the annotations
    themselves: both parses agree with the corpus and with each other; a page whose source is gone
    gets a reason; a rerun parses nothing again and reproduces the agreement table."""
    gt = json.load(open(os.path.join(EXAMPLES, "ground_truth.json")))
    extra = json.loads(json.dumps(gt[0]))
    extra["page_info"].update(source_pdf="gone.pdf", image_path="gone_page0.png")
    (tmp_path / "gt.json").write_text(json.dumps([*gt, extra]))
    out = tmp_path / "rean"
    cmd = [sys.executable, "-m", "padoc_ray.cli", "reannotate", "--gt", str(tmp_path / "gt.json"), "--source", EXAMPLES,
           "--output", str(out), "--model", tiny_model_dir, "--address", ray_cluster["gcs"],
           "--replay", os.path.join(EXAMPLES, "ground_truth.json"), "--modes", "fork,sequential",
           "--compare", f"again={out / 'predictions' / 'fork'}"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    table = pq.read_table(out / "agreement" / "agreement.parquet").to_pylist()
    page_rows = [r for r in table if r["kind"] == "page"]
    assert len(page_rows) == len(gt) + 1
    by_status = {}
    for r in page_rows:
        by_status.setdefault(r["status"], []).append(r)
    assert len(by_status["ok"]) == len(gt) and len(by_status["source_missing"]) == 1
    for r in by_status["ok"]:
        pairs = {(c["ref"], c["hyp"]): c for c in table if c["kind"] == "pair" and c["image_path"] == r["image_path"]}
        assert set(pairs) == {("gt", "fork"), ("gt", "sequential"), ("gt", "again"), ("fork", "sequential"),
                              ("fork", "again"), ("sequential", "again"), ("gt", "consensus")}
        assert dict(r["prediction_status"]) == {"fork": "ok", "sequential": "ok", "again": "ok"}
        for c in pairs.values():  # teacher-forced: same regions and contents up to 1/1000 box quantization
            assert c["layout_iou"] > 0.95 and c["content_edit"] == 0.0 and c["agree"], (r["image_path"], c)
            assert c["matched"] == c["ref_regions"] == c["hyp_regions"] > 0
        assert r["unanimous"] and r["consensus"] and r["coverage"] == 1.0 and r["difficulty"] < 0.02
    summary = json.load(open(out / "reannotate_summary.json"))
    assert summary["pages_compared"] == summary["consensus_pages"] == summary["unanimous_pages"] == len(gt)
    assert len(json.load(open(out / "consensus" / "consensus.json"))) == len(gt)
    assert summary["runs"]["fork"]["page_status"] == {"ok": 5} and summary["runs"]["sequential"]["all_inputs_accounted"]
    again = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stdout.count("0 to do") == 2  # both prediction sets were complete
    table2 = pq.read_table(out / "agreement" / "agreement.parquet").to_pylist()
    strip = lambda rows: [{k: v for k, v in r.items() if k != "run_id"} for r in rows]  # noqa: E731
    assert strip(table2) == strip(table)


def test_poison_documents_cost_their_own_rows(tmp_path, tiny_model_dir):
    """One raster task holds good files, a file whose renderer crashes on every page, one whose
    renderer hangs on its second page, one that hangs while opening, one whose second page fails to
    render (an unexpected error: render_failed) and one only qpdf can repair.
    The job completes: every good page is written once by the real engine, each poison file is
    accounted for with its code, and a rerun has nothing to do and starts no Ray."""
    from .pdf_factory import text_pdf, xref_broken_pdf

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
