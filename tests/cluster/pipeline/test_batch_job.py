"""The batch job against real components: a `ray start --head` cluster on loopback, an S3 server
(moto) on loopback, `ray job submit`, and the real CPU vLLM engine in the engine actors. Runs that
are killed or fail on purpose (engine deaths, a killed driver, poison documents) are in
tests/cluster/pipeline/test_batch_job_faults.py: the two files run on different workers of `make test`."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pyarrow.dataset as pads
import pyarrow.parquet as pq
import pypdfium2 as pdfium
import pytest

from tests.helpers.batch_runs import EXAMPLES, forced_page, keys, parse_cmd, read_pages, run_logged
from tests.conftest import BIN, ROOT, _env
from tests.helpers.pdf_factory import write_bad_input_folder

pytestmark = [pytest.mark.engine, pytest.mark.slow]


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
    row carries its token counts, timings and engine time (summed and priced in the summary), the
    run's summary is also under runs/, and a rerun has nothing to do (and no engine time)."""
    src = tmp_path / "in"
    src.mkdir()
    expect = write_bad_input_folder(str(src), big_pages=30)
    engine_pages = {name: exp.get("pages", exp.get("image_pages")) for name, exp in expect.items()
                    if ("pages" in exp or "image_pages" in exp) and "page_status" not in exp}
    gt = [forced_page(name, i, regions=2) for name, n in engine_pages.items() for i in range(n)]
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    out = tmp_path / "out"
    args = ["--input", str(src), "--output", str(out), "--model", tiny_model_dir, "--address", ray_cluster["gcs"],
            "--longest-side", "400", "--replay", str(tmp_path / "gt.json"), "--gpu-hour-usd", "2.5"]
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
        assert 0 < r["engine_s"] <= r["e2e_s"], r["source_uri"]
    assert all(r["engine_s"] is None for r in rows if r["status"] != "ok")  # never reached the engine
    summary = json.load(open(out / "summary.json"))
    per_page = sum(r["engine_s"] for r in ok) / len(ok)
    assert summary["engine_seconds_per_page"] == pytest.approx(per_page, rel=1e-3)
    assert summary["usd_per_million_pages"] == pytest.approx(per_page / 3600 * 2.5 * 1e6, rel=1e-3)
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
    assert again["engine_seconds_per_page"] is None and again["usd_per_million_pages"] is None  # nothing ran


def test_batch_flags_each_show_their_effect(ray_cluster, tiny_model_dir, tmp_path):
    """One run with many flags, each asserted by what it changes in the output: --pages 2-4 with
    --max-pages-per-doc 2 (pages 1, 2 of a 5-page PDF: neither flag alone gives that), --mode
    sequential (no branches, the truth's regions), --dpi 36 (306 x 396 px letter pages),
    --page-deadline 4 (a page forced to decode > 8192 tokens is cut at 4 s; the others, one region
    of under 40 tokens each, are not), --image-encoding ppm and --actors 1,2 (recorded, pages decoded);
    a manifest line that is gone (missing_file) and one that cannot be read (read_failed) get their rows.

    Which pages the deadline cuts follows from their work, not from this machine's speed: the long page
    escapes it only at under 4 s / 8192 = 0.5 ms a decode step, a short one is cut only at over
    4 s / 40 = 100 ms a step (a CPU engine step of the tiny model is about 5 ms, 10-20 under the suite's load)."""
    import random

    from padoc_ray.tokenizer import ModelProtocol
    from padoc_ray.groundtruth import truth_from_json
    from padoc_ray.protocol import quantized, serialize_sequential, to_markdown

    from tests.helpers.pdf_factory import text_pdf

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
    parsed = [("five.pdf", 2), ("paper.pdf", 1), ("report.pdf", 1)]  # the pages that end ok: one region each
    gt = [p for p in json.load(open(os.path.join(EXAMPLES, "ground_truth.json")))
          if (p["page_info"]["source_pdf"], p["page_info"]["page_no"]) not in parsed]
    gt += [long, *(forced_page(f, i, like=f if f != "five.pdf" else "memo.pdf", regions=1) for f, i in parsed)]
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    mp = ModelProtocol(tiny_model_dir)
    truth = truth_from_json((tmp_path / "gt.json").read_bytes())
    assert len(serialize_sequential(mp.vocab, mp.tokenizer, truth[("five.pdf", 1)])) > 8192  # > --max-tokens
    assert all(len(serialize_sequential(mp.vocab, mp.tokenizer, truth[k])) < 40 for k in parsed)
    out = tmp_path / "out"
    args = ["--input", str(src / "list.txt"), "--output", str(out), "--model", tiny_model_dir,
            "--address", ray_cluster["gcs"], "--replay", str(tmp_path / "gt.json"), "--manifest-allow", str(src),
            "--manifest-allow", "/proc/self",
            "--mode", "sequential", "--pages", "2-4", "--max-pages-per-doc", "2", "--dpi", "36",
            "--page-deadline", "4", "--image-encoding", "ppm", "--actors", "1,2"]
    rc, log = run_logged(parse_cmd(*args), tmp_path / "run.log")
    assert rc == 0, log[-4000:]
    rows = {(os.path.basename(r["source_uri"]), r["page_index"]): r for r in read_pages(str(out))}
    assert {k: r["status"] for k, r in rows.items()} == {
        ("five.pdf", 1): "deadline", ("five.pdf", 2): "ok", ("paper.pdf", 1): "ok", ("report.pdf", 1): "ok",
        ("gone.pdf", -1): "missing_file", ("mem", -1): "read_failed"}
    assert "Input/output error" in rows[("mem", -1)]["error_message"] and rows[("mem", -1)]["doc_id"] is None
    cut = rows[("five.pdf", 1)]
    assert not cut["valid"] and 4 <= cut["e2e_s"] and 0 < cut["output_tokens"] < 8192  # cut before its end
    for key in parsed:
        r = rows[key]
        want = quantized(truth[key], mp.vocab)
        assert r["mode"] == "sequential" and r["n_branches"] == 0 and r["valid"], key
        assert r["markdown"] == to_markdown(want) and len(r["regions"]) == len(want.regions), key
        assert r["f_seq"] == len(serialize_sequential(mp.vocab, mp.tokenizer, truth[key])), key
        assert (r["image_width"], r["image_height"]) == (306, 396), key  # 612 x 792 pt at 36 dpi
        assert r["e2e_s"] < 4, key
    docs = {os.path.basename(r["source_uri"]): r for r in pq.read_table(out / "documents").to_pylist()}
    assert {k: (d["status"], d["pages_selected"]) for k, d in docs.items()} == {
        "five.pdf": ("partial", 2), "paper.pdf": ("ok", 1), "report.pdf": ("ok", 1),
        "gone.pdf": ("missing_file", 0), "mem": ("read_failed", 0)}
    cfg = json.load(open(out / "summary.json"))["config"]
    assert cfg["image_encoding"] == "ppm" and cfg["num_actors"] == [1, 2] and cfg["render"]["dpi"] == 36
    assert cfg["pages"] == [1, 2, 3] and cfg["max_pages_per_doc"] == 2 and cfg["host"]["scheduler"]["deadline_s"] == 4


def test_reannotate_compares_the_checkpoint_earlier_sets_and_families_with_the_corpus_and_resumes(
        ray_cluster, tmp_path, tiny_model_dir, tiny_hpd_dir, tiny_dots_dir):
    """Re-annotation over the example corpus with every kind of prediction set in one run: the padoc
    checkpoint (its default mode, fork), a folder of earlier predictions (``again``), and the hpd and
    dots checkpoints as parsers beside it (``--compare NAME=<checkpoint>``: a batch job each, on the
    module's `ray start` cluster), all teacher-forced by the annotations themselves: every set agrees
    with the corpus and with every other; a page whose source is gone gets a reason; each family's
    rows have the padoc family's schema; a rerun parses nothing again and reproduces the agreement table.
    (``--modes fork,sequential``, a batch run per mode, each in its mode: tests/cluster/pipeline/
    test_shared_outputs_and_caps.py's test_reannotate_runs_one_batch_per_mode_and_its_exit_codes; a
    sequential batch job on this engine: test_batch_flags_each_show_their_effect above.)"""
    from padoc_ray.output import rows as page_rows_schema

    # the corpus: the examples' pages, each cut to its first 4 regions (agreement needs regions, not whole pages,
    # and each set's batch job decodes what the annotations say), and a page whose source is gone
    gt = json.load(open(os.path.join(EXAMPLES, "ground_truth.json")))
    for p in gt:
        p["layout_dets"] = p["layout_dets"][:4]
    (tmp_path / "replay.json").write_text(json.dumps(gt))
    extra = json.loads(json.dumps(gt[0]))
    extra["page_info"].update(source_pdf="gone.pdf", image_path="gone_page0.png")
    (tmp_path / "gt.json").write_text(json.dumps([*gt, extra]))
    out = tmp_path / "rean"
    cmd = [sys.executable, "-m", "padoc_ray.cli", "reannotate", "--gt", str(tmp_path / "gt.json"), "--source", EXAMPLES,
           "--output", str(out), "--model", tiny_model_dir, "--address", ray_cluster["gcs"],
           "--replay", str(tmp_path / "replay.json"),
           "--compare", f"again={out / 'predictions' / 'fork'}", "--compare", f"hpd={tiny_hpd_dir}",
           "--compare", f"dots={tiny_dots_dir}"]
    run = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=900)
    assert run.returncode == 0, run.stderr[-4000:]
    sets = ("fork", "again", "hpd", "dots")
    summary = json.load(open(out / "reannotate_summary.json"))
    got = summary["prediction_sets"]
    assert tuple(got) == sets and got["hpd"]["model"] == tiny_hpd_dir and got["dots"]["model"] == tiny_dots_dir
    assert got["fork"]["model"] == tiny_model_dir and got["dots"]["path"] == str(out / "predictions" / "dots")
    table = pq.read_table(out / "agreement" / "agreement.parquet").to_pylist()
    page_rows = [r for r in table if r["kind"] == "page"]
    assert len(page_rows) == len(gt) + 1
    by_status = {}
    for r in page_rows:
        by_status.setdefault(r["status"], []).append(r)
    assert len(by_status["ok"]) == len(gt) and len(by_status["source_missing"]) == 1
    names = ("gt", *sets)
    want_pairs = {(a, b) for i, a in enumerate(names) for b in names[i + 1:]} | {("gt", "consensus")}
    for r in by_status["ok"]:
        pairs = {(c["ref"], c["hyp"]): c for c in table if c["kind"] == "pair" and c["image_path"] == r["image_path"]}
        assert set(pairs) == want_pairs
        assert dict(r["prediction_status"]) == dict.fromkeys(sets, "ok")
        for (a, b), c in pairs.items():  # teacher-forced: the same regions and contents in every set
            assert c["content_edit"] == 0.0 and c["agree"], (r["image_path"], c)
            assert c["matched"] == c["ref_regions"] == c["hyp_regions"] == 4
            if not {a, b} & {"hpd", "dots"}:  # one box quantization (1/1000 of the page); the families' differ
                assert c["layout_iou"] > 0.95, (r["image_path"], c)
        # difficulty: the mean over the comparisons of ((1 - layout IoU) + content edit) / 2; content edits are 0,
        # the families' boxes differ from padoc's by their own quantization (IoU 0.95-0.98 here): 0.006-0.015
        assert r["unanimous"] and r["consensus"] and r["coverage"] == 1.0 and r["difficulty"] < 0.02
    assert summary["pages_compared"] == summary["consensus_pages"] == summary["unanimous_pages"] == len(gt)
    assert set(summary["pairs"]) == {f"{a}~{b}" for a, b in want_pairs}
    assert len(json.load(open(out / "consensus" / "consensus.json"))) == len(gt)
    for name in ("fork", "hpd", "dots"):
        assert summary["runs"][name]["page_status"] == {"ok": 5} and summary["runs"][name]["all_inputs_accounted"]
    assert "again" not in summary["runs"]
    for name, model in (("hpd", tiny_hpd_dir), ("dots", tiny_dots_dir)):  # each family's batch job rows
        t = pq.read_table(out / "predictions" / name / "pages")
        assert set(page_rows_schema.PAGE_SCHEMA.names) <= set(t.schema.names), name  # the padoc family's schema
        family_rows = t.to_pylist()
        assert len(family_rows) == 5 and {x["model_id"] for x in family_rows} == {os.path.basename(model)}
        assert all(x["status"] == "ok" and x["valid"] and x["mode"] == "fork" and x["n_branches"] > 0
                   for x in family_rows), name
    again = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=900)
    assert again.returncode == 0, again.stderr[-4000:]
    assert again.stdout.count("0 to do") == 3  # the three prediction sets it parses were complete
    table2 = pq.read_table(out / "agreement" / "agreement.parquet").to_pylist()
    strip = lambda rows: [{k: v for k, v in r.items() if k != "run_id"} for r in rows]  # noqa: E731
    assert strip(table2) == strip(table)


def test_the_test_clusters_keep_token_authentication_on(ray_cluster, tmp_path):
    """The `ray start --head` fixture runs with token auth: a client without the token is refused,
    one with it (what _env() passes) gets in. (Here, on this module's cluster: a module of its own
    would start a cluster only for this.)"""
    ray_bin = os.path.join(os.path.dirname(sys.executable), "ray")
    cmd = [ray_bin, "job", "list", "--address", ray_cluster["dashboard"]]
    anonymous = _env(HOME=str(tmp_path))
    for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN"):
        anonymous.pop(k, None)
    refused = subprocess.run(cmd, capture_output=True, text=True, env=anonymous, timeout=120)
    assert refused.returncode != 0 and "authentication" in (refused.stdout + refused.stderr).lower()
    allowed = subprocess.run(cmd, capture_output=True, text=True, env=_env(), timeout=120)
    assert allowed.returncode == 0, allowed.stderr[-2000:]
