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

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pypdfium2 as pdfium
import pytest

from .conftest import BIN, ROOT, _env
from .pdf_factory import write_bad_input_folder

pytestmark = [pytest.mark.engine, pytest.mark.slow]

EXAMPLES = os.path.join(ROOT, "examples")


def parse_cmd(*args) -> list[str]:
    return [sys.executable, "-m", "padoc_ray.cli", "parse", *args]


def read_pages(out: str):
    return pads.dataset(os.path.join(out, "pages"), format="parquet").to_table().to_pylist()


def keys(rows):
    return [(r["source_uri"], r["page_index"]) for r in rows]


def test_job_submit_reads_and_writes_s3(ray_cluster, s3, tiny_model_dir, tmp_path):
    c = s3["client"]
    c.create_bucket(Bucket="padoc-in")
    c.create_bucket(Bucket="padoc-out")
    for f in glob.glob(os.path.join(EXAMPLES, "*.pdf")):
        c.upload_file(f, "padoc-in", f"docs/{os.path.basename(f)}")
    c.put_object(Bucket="padoc-in", Key="docs/readme.txt", Body=b"not a pdf")
    c.upload_file(os.path.join(EXAMPLES, "ground_truth.json"), "padoc-in", "gt.json")
    for f in os.listdir(tiny_model_dir):
        c.upload_file(os.path.join(tiny_model_dir, f), "padoc-in", f"model/tiny/{f}")
    runtime_env = {"env_vars": {**s3["env"], "AWS_ENDPOINT_URL": s3["endpoint"]},
                   "excludes": [".venv", "models", "out", ".git", "*.parquet"]}
    cmd = [os.path.join(BIN, "ray"), "job", "submit", "--address", ray_cluster["dashboard"], "--working-dir", ROOT,
           "--runtime-env-json", json.dumps(runtime_env), "--",
           "python", "jobs/batch_parse.py", "--input", "s3://padoc-in/docs", "--output", "s3://padoc-out/run1",
           "--model", "s3://padoc-in/model/tiny", "--replay", "s3://padoc-in/gt.json", "--rows-per-file", "2"]
    out = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=600)
    print(out.stdout[-6000:], out.stderr[-3000:])
    assert out.returncode == 0
    assert "all inputs accounted: True" in out.stdout
    summary = json.loads(c.get_object(Bucket="padoc-out", Key="run1/summary.json")["Body"].read())
    assert summary["pages_written"] == 5 and summary["page_status"] == {"ok": 5}
    assert summary["document_status"] == {"ok": 3, "skipped": 1}
    from padoc_ray.pipeline.storage import StorageConfig, filesystem

    fs, path = filesystem("s3://padoc-out/run1/pages", StorageConfig(endpoint=s3["endpoint"]))
    os.environ.update(s3["env"])
    rows = pads.dataset(path, filesystem=fs, format="parquet").to_table().to_pylist()
    assert len(rows) == 6 and len(set(keys(rows))) == 6
    memo = next(r for r in rows if r["source_uri"].endswith("memo.pdf"))
    assert memo["status"] == "ok" and memo["regions"][0]["content"] == "MEMORANDUM"
    assert memo["doc_id"] == __import__("hashlib").sha256(open(os.path.join(EXAMPLES, "memo.pdf"), "rb").read()).hexdigest()
    assert memo["markdown"].startswith("# MEMORANDUM") and memo["f_padoc"] < memo["f_seq"]
    skipped = next(r for r in rows if r["source_uri"].endswith("readme.txt"))
    assert skipped["page_index"] == -1 and skipped["error_code"] == "not_pdf"


def test_bad_inputs_are_all_accounted_for(ray_cluster, tiny_model_dir, tmp_path):
    src = tmp_path / "in"
    src.mkdir()
    expect = write_bad_input_folder(str(src), big_pages=30)
    out = tmp_path / "out"
    args = ["--input", str(src), "--output", str(out), "--model", tiny_model_dir, "--address", ray_cluster["gcs"],
            "--max-tokens", "24", "--longest-side", "400"]
    run = subprocess.run(parse_cmd(*args), capture_output=True, text=True, env=_env(), timeout=600)
    assert run.returncode == 0, run.stderr[-4000:]
    rows = read_pages(str(out))
    assert len(keys(rows)) == len(set(keys(rows)))  # no duplicates
    docs = {os.path.basename(r["source_uri"]): r for r in pq.read_table(out / "documents").to_pylist()}
    assert set(docs) == set(expect)  # every file accounted for
    for name, exp in expect.items():
        d = docs[name]
        if "doc_status" in exp:
            assert d["status"] == exp["doc_status"], (name, d)
        if "doc_status_in" in exp:
            assert d["status"] in exp["doc_status_in"], (name, d)
        if "pages" in exp:
            data = (src / name).read_bytes()
            assert d["page_count"] == len(pdfium.PdfDocument(data)) == exp["pages"], name
            page_rows = [r for r in rows if r["source_uri"].endswith("/" + name) and r["page_index"] >= 0]
            assert sorted(r["page_index"] for r in page_rows) == list(range(exp["pages"])), name
        if "image_pages" in exp:  # a page image is a one-page document
            page_rows = [r for r in rows if r["source_uri"].endswith("/" + name) and r["page_index"] >= 0]
            assert d["page_count"] == exp["image_pages"] and len(page_rows) == exp["image_pages"], name
            assert page_rows[0]["image_width"] == 300 and page_rows[0]["image_height"] == 400  # never enlarged
        if "page_status" in exp:
            assert {r["status"] for r in rows if r["source_uri"].endswith("/" + name)} == {exp["page_status"]}
    rotated = [r for r in rows if r["source_uri"].endswith("/rotated.pdf")]
    assert all(r["rotation"] == 90 and r["image_width"] > r["image_height"] for r in rotated)
    # a page whose generation fails gets its status (the random tiny model never closes the page)
    assert {r["status"] for r in rows if r["source_uri"].endswith("/good.pdf")} <= {"token_limit", "runaway",
                                                                                    "malformed_layout", "ok"}
    # rerun: nothing to do, nothing added
    again = subprocess.run(parse_cmd(*args), capture_output=True, text=True, env=_env(), timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 to do" in again.stdout
    assert len(read_pages(str(out))) == len(rows)


def _ray_state_pids(dashboard: str, class_fragment: str) -> list[int]:
    from ray.util.state import list_actors

    acts = list_actors(address=dashboard, filters=[("state", "=", "ALIVE")], limit=100)
    return [a.pid for a in acts if class_fragment in (a.class_name or "")]


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


def test_killed_engine_actor_is_restarted_and_every_page_lands_once(ray_cluster, tiny_model_dir, tmp_path):
    n = 6  # 30 pages
    _example_copies(tmp_path / "in", n)
    gt = _gt_for_copies(tmp_path / "gt.json", n)
    out = tmp_path / "out"
    proc = subprocess.Popen(parse_cmd("--input", str(tmp_path / "in"), "--output", str(out), "--model", tiny_model_dir,
                                      "--address", ray_cluster["gcs"], "--replay", gt, "--pages-in-flight", "4",
                                      "--rows-per-file", "2"),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env())
    killed = None
    deadline = time.time() + 300
    while time.time() < deadline and killed is None:
        pids = _ray_state_pids(ray_cluster["dashboard"], "EngineStage")
        files = glob.glob(str(out / "pages" / "*.parquet"))
        if pids and files:  # the engine is up and pages are landing: kill it mid-run
            os.kill(pids[0], signal.SIGKILL)
            killed = pids[0]
        time.sleep(0.5)
    assert killed, "the engine actor never started"
    stdout, stderr = proc.communicate(timeout=900)
    assert proc.returncode == 0, stderr[-4000:]
    rows = read_pages(str(out))
    assert len(rows) == 30 and len(set(keys(rows))) == 30  # every page exactly once
    assert all(r["status"] == "ok" for r in rows)


def test_interrupted_driver_completes_on_rerun_without_duplicates(ray_cluster, tiny_model_dir, tmp_path):
    n = 4  # 20 pages
    _example_copies(tmp_path / "in", n)
    gt = _gt_for_copies(tmp_path / "gt.json", n)
    out = tmp_path / "out"
    args = ["--input", str(tmp_path / "in"), "--output", str(out), "--model", tiny_model_dir, "--address",
            ray_cluster["gcs"], "--replay", gt, "--rows-per-file", "1", "--pages-in-flight", "2"]
    proc = subprocess.Popen(parse_cmd(*args), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=_env(),
                            start_new_session=True)
    deadline = time.time() + 300
    while time.time() < deadline and len(glob.glob(str(out / "pages" / "*.parquet"))) < 3:
        time.sleep(0.2)
    assert glob.glob(str(out / "pages" / "*.parquet")), "no page was written before the deadline"
    os.killpg(proc.pid, signal.SIGKILL)  # the driver dies mid-run
    proc.wait(timeout=60)
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
    assert len(table) == len(gt) + 1
    by_status = {}
    for r in table:
        by_status.setdefault(r["status"], []).append(r)
    assert len(by_status["ok"]) == len(gt) and len(by_status["source_missing"]) == 1
    for r in by_status["ok"]:
        pairs = {(c["ref"], c["hyp"]): c for c in r["comparisons"]}
        assert set(pairs) == {("gt", "fork"), ("gt", "sequential"), ("gt", "again"), ("fork", "sequential"),
                              ("fork", "again")}
        assert dict(r["prediction_status"]) == {"fork": "ok", "sequential": "ok", "again": "ok"}
        for c in pairs.values():  # teacher-forced: same regions and contents up to 1/1000 box quantization
            assert c["layout_iou"] > 0.95 and c["content_edit"] == 0.0 and c["consensus"], (r["image_path"], c)
            assert c["matched"] == c["ref_regions"] == c["hyp_regions"] > 0
        assert r["consensus"] and r["difficulty"] < 0.02
    summary = json.load(open(out / "reannotate_summary.json"))
    assert summary["pages_compared"] == summary["consensus_pages"] == len(gt)
    assert summary["runs"]["fork"]["page_status"] == {"ok": 5} and summary["runs"]["sequential"]["all_inputs_accounted"]
    again = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stdout.count("0 to do") == 2  # both prediction sets were complete
    table2 = pq.read_table(out / "agreement" / "agreement.parquet").to_pylist()
    strip = lambda rows: [{k: v for k, v in r.items() if k != "run_id"} for r in rows]  # noqa: E731
    assert strip(table2) == strip(table)


def test_poison_documents_cost_their_own_rows(tmp_path, tiny_model_dir):
    """One raster task holds good files, a file whose renderer crashes on every page, one whose
    renderer hangs on its second page, one that hangs while opening and one only qpdf can repair.
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
    (src / "repaired.pdf").write_bytes(xref_broken_pdf(text_pdf(2)))  # its pages are forced like memo's
    gt = json.load(open(os.path.join(EXAMPLES, "ground_truth.json")))
    extra = []
    for p in gt:  # the poison files' good pages are teacher-forced like the originals they copy
        for copy, orig, page_no in (("hang.pdf", "report.pdf", None), ("repaired.pdf", "memo.pdf", 0),
                                    ("repaired.pdf", "memo.pdf", 1)):
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
    faults = {"crash.pdf": "crash", "hang.pdf": "hang@1", "hangopen.pdf": "hang@open"}
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
        ("repaired.pdf", 0): "ok", ("repaired.pdf", 1): "ok"}
    assert got[("repaired.pdf", 0)]["repaired"] is True and got[("memo.pdf", 0)]["repaired"] is False
    assert got[("repaired.pdf", 0)]["markdown"] == got[("memo.pdf", 0)]["markdown"]
    assert "SIGSEGV" in got[("crash.pdf", 0)]["error_message"]
    docs = {os.path.basename(r["source_uri"]): r for r in pq.read_table(out / "documents").to_pylist()}
    assert {k: (d["status"], d["error_code"]) for k, d in docs.items()} == {
        "memo.pdf": ("ok", None), "paper.pdf": ("ok", None), "report.pdf": ("ok", None),
        "crash.pdf": ("failed", "render_crashed"), "hang.pdf": ("partial", None),
        "hangopen.pdf": ("render_timeout", "render_timeout"), "repaired.pdf": ("ok", None)}
    assert "constructor arguments" not in run.stderr and "Token authentication" not in run.stderr
    # rerun: answered from the listing and the rows, without Ray
    again = subprocess.run(parse_cmd(*args), capture_output=True, text=True, env=env, timeout=120)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "0 to do" in again.stdout and "ray" not in again.stderr.lower()
    assert len(read_pages(str(out))) == len(rows)
