"""Pure parts of the batch job: input listing, page selection, resume planning, documents table."""

from __future__ import annotations

import os
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from padoc_ray.output import rows
from padoc_ray.pipeline import ledger
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.output.reader import read_rows
from padoc_ray.pipeline.job import plan
from padoc_ray.pipeline.pages import read_pages
from padoc_ray.storage import InputError
from padoc_ray.listing import list_inputs


def _files(d, names):
    for n in names:
        p = d / n
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(b"%PDF-1.4 x" if n.endswith(".pdf") else b"x")


def test_list_inputs_folder_glob_and_manifest(tmp_path):
    _files(tmp_path, ["a.pdf", "b.pdf", "sub/c.pdf", "notes.txt", ".hidden.pdf"])
    got = [os.path.relpath(u, tmp_path) for u, _ in list_inputs(str(tmp_path))]
    assert got == ["a.pdf", "b.pdf", "notes.txt", "sub/c.pdf"]
    got = [os.path.relpath(u, tmp_path) for u, _ in list_inputs(str(tmp_path / "*.pdf"))]
    assert got == ["a.pdf", "b.pdf"]
    man = tmp_path / "list.txt"
    man.write_text(f"# inputs\n{tmp_path / 'a.pdf'}\n\n{tmp_path / 'gone.pdf'}\n")
    got = dict(list_inputs(str(man)))
    assert got[str(tmp_path / "a.pdf")] > 0 and got[str(tmp_path / "gone.pdf")] == -1
    with pytest.raises(InputError, match="no such file"):
        list_inputs(str(tmp_path / "nope"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(InputError, match="no files"):
        list_inputs(str(tmp_path / "empty"))


def test_select_pages():
    assert rows.select_pages(5, None, None) == [0, 1, 2, 3, 4]
    assert rows.select_pages(5, [0, 2, 9], None) == [0, 2]
    assert rows.select_pages(5, None, 2) == [0, 1]
    assert rows.select_pages(0, None, None) == []


def _page(uri, i, n, status="ok", run="r1"):
    b = rows.base_row(run_id=run, uri=uri, doc_id="d" + uri, page_index=i, page_count=n, mode="fork", model_id="m")
    return {**b, "status": status, "error_code": None if status == "ok" else status}


def test_plan_skips_complete_documents_and_done_pages(tmp_path):
    cfg = BatchConfig(input="x", output="y", model="m")
    existing = rows.to_table([_page("a", 0, 2), _page("a", 1, 2), _page("b", 0, 3),
                              {**_page("c", -1, None, "not_pdf")}])
    listed = [("a", 1), ("b", 1), ("c", 1), ("d", 1)]
    todo, complete = plan(listed, existing, cfg)
    assert complete == 2
    # done pages carry the version they are of: a raster task that reads other bytes parses them all again
    # (mtime: the listing's, -1 when it gave none; every row records it)
    assert todo == [{"uri": "b", "size": 1, "mtime": -1, "done": [0], "doc_id": "db"},
                    {"uri": "d", "size": 1, "mtime": -1, "done": [], "doc_id": None}]
    cfg2 = BatchConfig.from_flat(input="x", output="y", model="m", max_pages_per_doc=1)
    assert [t["uri"] for t in plan(listed, existing, cfg2)[0]] == ["d"]


def test_documents_table_statuses():
    t = rows.to_table([
        _page("ok", 0, 1), _page("part", 0, 2), _page("part", 1, 2, "runaway"), _page("bad", 0, 1, "token_limit"),
        _page("inc", 0, 3), _page("txt", -1, None, "not_pdf"), _page("enc", -1, None, "encrypted_pdf"),
    ])
    listed = [(u, 1) for u in ("ok", "part", "bad", "inc", "txt", "enc", "never")]
    d = {r["source_uri"]: r for r in ledger.documents_table(t, listed, None, None).to_pylist()}
    assert {k: v["status"] for k, v in d.items()} == {
        "ok": "ok", "part": "partial", "bad": "failed", "inc": "incomplete", "txt": "skipped",
        "enc": "encrypted_pdf", "never": "missing"}
    assert d["part"]["pages_ok"] == 1 and d["part"]["pages_failed"] == 1 and d["inc"]["pages_selected"] == 3
    # a failed document says why: its most common page code (ties: the first by name); others have none
    assert d["bad"]["error_code"] == "token_limit" and d["enc"]["error_code"] == "encrypted_pdf"
    assert d["ok"]["error_code"] is None and d["part"]["error_code"] is None


def test_failed_document_error_code_is_the_most_common_page_code():
    t = rows.to_table([_page("d", 0, 4, "render_timeout"), _page("d", 1, 4, "render_crashed"),
                       _page("d", 2, 4, "render_crashed"), _page("d", 3, 4, "runaway"),
                       _page("tie", 0, 2, "runaway"), _page("tie", 1, 2, "deadline")])
    d = {r["source_uri"]: r for r in ledger.documents_table(t, [("d", 1), ("tie", 1)], None, None).to_pylist()}
    assert d["d"]["status"] == "failed" and d["d"]["error_code"] == "render_crashed"
    assert d["tie"]["error_code"] == "deadline"


def test_read_pages_skips_half_written_files_and_only_the_driver_removes_leftovers(tmp_path):
    cfg = BatchConfig(input="x", output=str(tmp_path), model="m", run_id="live")
    pages = tmp_path / "pages"
    pages.mkdir()
    pq.write_table(rows.to_table([_page("a", 0, 1)]), pages / "good.parquet")
    uuid = "0123456789abcdef0123456789abcdef"
    torn = {name: pages / name for name in ("torn.parquet", f"killed_{uuid}_000003-0.parquet",
                                            f"live_{uuid}_000001-0.parquet")}
    for p in torn.values():
        p.write_bytes(b"PAR1 half a file")
    got = read_rows(str(pages), cfg.storage)  # read-only: skipped, kept
    assert got.num_rows == 1 and all(p.exists() for p in torn.values())
    got = read_pages(str(pages), cfg.storage, cleanup_for_run="live", grace_s=3600)  # the driver's cleanup
    assert got.num_rows == 1
    assert sorted(os.listdir(pages)) == sorted(["good.parquet", "torn.parquet", f"live_{uuid}_000001-0.parquet"])
    old = time.time() - 2 * 3600
    for p in pages.iterdir():
        os.utime(p, (old, old))
    read_pages(str(pages), cfg.storage, cleanup_for_run="live", grace_s=3600)
    assert sorted(os.listdir(pages)) == sorted(["good.parquet", f"live_{uuid}_000001-0.parquet"])  # never its own
    assert read_pages(str(tmp_path / "none"), cfg.storage).num_rows == 0


def test_page_rows_round_trip_the_schema():
    from padoc_ray.protocol import Box, Page, Region
    from padoc_ray.scheduler import PageRecord

    page = Page(width=10, height=10, regions=(Region(category="title", box=Box(0.1, 0.2, 0.3, 0.4), content="T"),))
    rec = PageRecord(page_id="p", mode="fork", status="ok", valid=True, page=page, n_branches=1,
                     region_finish_reasons=["stop"], region_tokens=[2], f_seq=10, f_padoc=9)
    row = rows.page_row(rows.base_row(run_id="r", uri="u", doc_id="d", page_index=0, page_count=1, mode="fork",
                                      model_id="m"), rec)
    t = rows.to_table([row])
    assert t.schema == rows.PAGE_SCHEMA
    r = t.to_pylist()[0]
    assert r["regions"][0]["category"] == "title" and r["regions"][0]["finish_reason"] == "stop"
    assert r["markdown"] == "# T\n" and r["error_code"] is None
    assert pa.types.is_timestamp(t.schema.field("processed_at").type)


def test_engine_resources_flag_reaches_the_config_and_bad_requests_are_refused(capsys):
    """--engine-resources: a JSON object of custom resources per engine actor, into BatchConfig;
    CPU/GPU/memory, amounts <= 0 and non-objects are refused with a message naming the problem."""
    import argparse

    from padoc_ray.cli.batch import add_batch_args, config_from_args

    p = argparse.ArgumentParser()
    add_batch_args(p)
    base = ["--input", "in", "--output", "out", "--model", "m"]
    cfg = config_from_args(p.parse_args([*base, "--engine-resources", '{"padoc_gpu_node": 1, "big_mem": 0.5}']))
    assert dict(cfg.engines.engine_resources) == {"padoc_gpu_node": 1, "big_mem": 0.5}
    assert dict(config_from_args(p.parse_args(base)).engines.engine_resources) == {}
    for bad in ("[1]", "{nope", '"x"'):
        with pytest.raises(SystemExit):
            p.parse_args([*base, "--engine-resources", bad])
        assert "--engine-resources" in capsys.readouterr().err
    for res, said in (({"GPU": 1}, "not a custom resource"), ({"x": 0}, "amount > 0"), ({"x": "1"}, "amount > 0"),
                      ({"": 1}, "non-empty"), ({"x": float("inf")}, "amount > 0")):
        with pytest.raises(ValueError, match=said):
            BatchConfig.from_flat(input="in", output="out", model="m", engine_resources=res)


def test_missing_engine_resources_are_named_before_actors_wait_for_them():
    from padoc_ray.pipeline.stages import missing_engine_resources

    cfg = BatchConfig.from_flat(input="in", output="out", model="m", engine_resources={"padoc_gpu_node": 1})
    assert missing_engine_resources(cfg, {"CPU": 4.0, "padoc_gpu_node": 2.0}) is None
    said = missing_engine_resources(cfg, {"CPU": 4.0})
    assert "padoc_gpu_node" in said and "padoc_gpu_node=0" in said
    assert missing_engine_resources(BatchConfig(input="in", output="out", model="m"), {}) is None
