"""The batch job against a hostile file system: links, special files, files that change, reads that
never end. The listing and the raster stage directly (fast), and the real batch job on a local Ray
cluster with the no-op engine."""

from __future__ import annotations

import os
import threading
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from padoc_ray.pipeline import limits
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.storage import ChangedDuringRead, LinkAtRead, NotRegularFile, read_bytes, StorageConfig
from padoc_ray.listing import DUPLICATE, list_inputs, NOT_REGULAR, SYMLINK, SYMLINK_OUTSIDE

from tests.helpers import components
from tests.helpers.pdf_factory import text_pdf


def _tree(tmp_path):
    """in/ with two PDFs (one in a subfolder), out/ beside it, outside/private.pdf."""
    inp, out, outside = tmp_path / "in", tmp_path / "out", tmp_path / "outside"
    (inp / "sub").mkdir(parents=True)
    out.mkdir()
    outside.mkdir()
    (inp / "a.pdf").write_bytes(text_pdf(2))
    (inp / "sub" / "c.pdf").write_bytes(text_pdf(1))
    (outside / "private.pdf").write_bytes(text_pdf(1))
    (out / "_lock").write_bytes(b"not yours")
    return inp, out, outside


def _rel(listed, inp):
    return {os.path.relpath(u, inp): s for u, s in listed}


def _timed(fn, limit_s=10.0):
    """Run ``fn`` in a thread; fail (instead of hanging the suite) when it outlives ``limit_s``."""
    box: dict = {}

    def go():
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - re-raised below
            box["error"] = e

    t = threading.Thread(target=go, daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(limit_s)
    assert not t.is_alive(), f"still running after {limit_s} s"
    if "error" in box:
        raise box["error"]
    return box["value"], time.monotonic() - t0


def test_links_are_listed_not_followed_and_followed_only_inside_the_folder(tmp_path):
    inp, out, outside = _tree(tmp_path)
    os.symlink("../outside/private.pdf", inp / "link.pdf")
    os.symlink("../out", inp / "to_out")
    os.symlink(".", inp / "loop")
    os.symlink(".", inp / "loop2")
    os.symlink("..", inp / "sub" / "up")
    os.symlink("a.pdf", inp / "alias.pdf")
    os.mkfifo(inp / "fifo.pdf")
    plain, s = _timed(lambda: list_inputs(str(inp)))
    assert s < 5
    assert _rel(plain, inp) == {"a.pdf": len(text_pdf(2)), "sub/c.pdf": len(text_pdf(1)), "link.pdf": SYMLINK,
                                "to_out": SYMLINK, "loop": SYMLINK, "loop2": SYMLINK, "sub/up": SYMLINK,
                                "alias.pdf": SYMLINK, "fifo.pdf": NOT_REGULAR}
    followed, s = _timed(lambda: list_inputs(str(inp), follow_symlinks=True))
    assert s < 5
    got = _rel(followed, inp)
    assert got["link.pdf"] == got["to_out"] == SYMLINK_OUTSIDE  # never read
    assert got["loop"] == got["loop2"] == got["sub/up"] == got["alias.pdf"] == DUPLICATE
    assert got["a.pdf"] > 0 and got["sub/c.pdf"] > 0 and got["fifo.pdf"] == NOT_REGULAR
    assert len(got) == 9  # every entry once, nothing below out/ or outside/
    # a link to a folder inside the input that is not reachable otherwise is walked (once)
    (tmp_path / "in" / "sub" / "deep").mkdir()
    (tmp_path / "in" / "sub" / "deep" / "d.pdf").write_bytes(text_pdf(1))
    os.symlink("sub/deep", inp / "shortcut")
    again = _rel(list_inputs(str(inp), follow_symlinks=True), inp)
    assert again["sub/deep/d.pdf"] > 0 and again["shortcut"] == DUPLICATE
    # globs list their folder's entries by the same rule
    assert _rel(list_inputs(str(inp / "*.pdf")), inp) == {"a.pdf": len(text_pdf(2)), "link.pdf": SYMLINK,
                                                         "alias.pdf": SYMLINK, "fifo.pdf": NOT_REGULAR}


_PROBE = """
import json, sys
import pyarrow as pa
from padoc_ray.listing import list_inputs
from padoc_ray.pipeline import limits
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.pipeline.stages import rasterize
inp = sys.argv[1]
c = BatchConfig.from_flat(input=inp, output=inp + "_out", model="m")
out = {}
for uri, size in list_inputs(inp):
    refused = limits.listing_refusal(size, limits.InputLimits())
    if refused:  # what the driver writes itself from the listing
        out[uri] = [[-1, refused[0]]]
        continue
    batch = pa.Table.from_pylist([{"uri": uri, "size": size, "done": []}])
    out[uri] = [[r["page_index"], r["status"]] for t in rasterize(batch, c, "m") for r in t.to_pylist()]
print("RESULT " + json.dumps(out))
"""


def test_a_real_hostile_tree_gives_every_entry_a_row(tmp_path):
    """Made for real, not patched: a file and a folder without permissions (root loses the capabilities that
    bypass them), a name that is not UTF-8, one with a newline, a folder named like a PDF. Every entry is a
    row with its own code; none is dropped, none stops the listing."""
    import json
    import shutil
    import subprocess
    import sys

    from tests.conftest import ROOT, _env

    inp = tmp_path / "in"
    (inp / "locked").mkdir(parents=True)
    (inp / "x.pdf").mkdir()
    for name in ("ok.pdf", "secret.pdf", "locked/in.pdf", "new\nline.pdf", "x.pdf/inner.pdf"):
        (inp / name).write_bytes(text_pdf(1))
    with open(os.path.join(os.fsencode(inp), b"caf\xe9.pdf"), "wb") as f:  # Latin-1 bytes: not UTF-8
        f.write(text_pdf(1))
    (inp / "secret.pdf").chmod(0)
    (inp / "locked").chmod(0)
    cmd = [sys.executable, "-c", _PROBE, str(inp)]
    if os.geteuid() == 0:  # root reads anything: drop the two capabilities that let it
        if shutil.which("setpriv") is None:
            components.missing("setpriv (util-linux), with which root drops CAP_DAC_OVERRIDE for this check",
                               "apt-get install util-linux")  # a skip, a failure on CI
        cmd = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search", *cmd]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=_env(), cwd=ROOT, timeout=300)
    finally:
        (inp / "locked").chmod(0o755)
    line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")), None)
    assert line, proc.stderr[-3000:]
    got = {os.path.relpath(u, inp): rows for u, rows in json.loads(line[7:]).items()}
    assert got == {
        "ok.pdf": [[0, None]], "new\nline.pdf": [[0, None]], "x.pdf/inner.pdf": [[0, None]],
        "secret.pdf": [[-1, "read_failed"]],  # listed (its folder is readable), refused when read
        "locked": [[-1, "unlistable_folder"]],  # its files are unknown: the folder itself is the row
        "caf\\xe9.pdf": [[-1, "undecodable_name"]],  # the bytes escaped: a string a Parquet row can hold
    }


def test_every_listing_code_has_a_row_and_is_decided_again_by_a_rerun():
    lim = limits.InputLimits()
    want = {SYMLINK: "symlink", SYMLINK_OUTSIDE: "symlink_outside_input", DUPLICATE: "duplicate_link",
            NOT_REGULAR: "not_regular_file"}
    for size, code in want.items():
        got, message = limits.listing_refusal(size, lim)
        assert got == code and message
        assert code in limits.LISTING_CODES and limits.retried(code, None, None, lim)
    assert limits.retried("changed_during_read", None, None, lim)


def _rasterize(uri, size, **cfg):
    from padoc_ray.pipeline.stages import rasterize

    c = BatchConfig.from_flat(input=os.path.dirname(uri), output=os.path.dirname(uri) + "_out", model="m", **cfg)
    batch = pa.Table.from_pylist([{"uri": uri, "size": size, "done": []}])
    return [r for t in rasterize(batch, c, "m") for r in t.to_pylist()]


def test_a_listed_file_swapped_for_a_fifo_gets_its_own_row_at_once(tmp_path):
    path = tmp_path / "b.pdf"
    path.write_bytes(text_pdf(1))
    size = path.stat().st_size  # what the listing saw
    path.unlink()
    os.mkfifo(path)  # nobody ever writes to it: a blocking open or read would wait forever
    with pytest.raises(NotRegularFile, match="FIFO"):
        _timed(lambda: read_bytes(str(path)))
    got, s = _timed(lambda: _rasterize(str(path), size))
    assert [(r["page_index"], r["status"]) for r in got] == [(-1, "not_regular_file")] and s < 10


def _append(path):
    with open(path, "ab") as f:
        f.write(b"% appended by someone else\n")


def _truncate(path):
    os.truncate(path, 100)  # a writer that starts over (the file is cut to its first 100 bytes)


@pytest.mark.parametrize("change", [_append, _truncate], ids=["appended", "truncated"])
def test_a_file_changed_while_it_is_read_is_a_row_not_a_mix(tmp_path, monkeypatch, change):
    import padoc_ray.storage as storage

    path = tmp_path / "c.pdf"
    path.write_bytes(text_pdf(2))
    real_read = os.read
    state = {"n": 0}

    def read_then_change(fd, n):  # another process changes the file, for real, while our read is under way
        b = real_read(fd, n)
        state["n"] += 1
        if state["n"] == 1:
            change(path)
        return b

    monkeypatch.setattr(storage.os, "read", read_then_change)
    with pytest.raises(ChangedDuringRead, match="changed while it was read"):
        read_bytes(str(path))
    path.write_bytes(text_pdf(2))  # whole again; the next read sees the same change
    state["n"] = 0
    got = _rasterize(str(path), 10)
    assert [(r["page_index"], r["status"]) for r in got] == [(-1, "changed_during_read")]
    monkeypatch.setattr(storage.os, "read", real_read)
    path.write_bytes(text_pdf(2))
    assert [r["page_index"] for r in _rasterize(str(path), 10)] == [0, 1]  # a stable file parses


def test_every_read_has_a_deadline(tmp_path, monkeypatch):
    import padoc_ray.storage as storage

    path = tmp_path / "slow.pdf"
    path.write_bytes(text_pdf(1))
    real_read = os.read
    monkeypatch.setattr(storage.os, "read", lambda fd, n: (time.sleep(30), real_read(fd, n))[1])  # a stuck mount
    cfg = StorageConfig(read_timeout_s=0.5)
    with pytest.raises(TimeoutError, match="did not finish within 0.5 s"):
        _timed(lambda: read_bytes(str(path), cfg), limit_s=5)
    got, s = _timed(lambda: _rasterize(str(path), 10, storage=cfg), limit_s=5)
    assert [(r["status"], r["error_code"]) for r in got] == [("read_failed", "read_failed")]
    assert "did not finish within" in got[0]["error_message"] and s < 5
    with pytest.raises(ValueError):
        StorageConfig(read_timeout_s=0)


# ---- the batch job ----------------------------------------------------------------------------------------------
def _run(inp, out, **kw):
    from padoc_ray.host import HostConfig
    from padoc_ray.pipeline.job import run_batch

    cfg = BatchConfig.from_flat(input=str(inp), output=str(out), model=kw.pop("model"), host=HostConfig(engine="noop"),
                                **kw)
    return run_batch(cfg, log=lambda _m: None)


def test_a_run_reads_nothing_outside_its_folder_and_ends(ray_driver, tiny_model_dir, tmp_path):
    inp, out, outside = _tree(tmp_path)
    os.symlink("../outside/private.pdf", inp / "link.pdf")
    os.symlink("../out", inp / "to_out")  # the output, reached through the input: never an input
    os.symlink(".", inp / "loop")
    os.symlink(".", inp / "loop2")
    os.mkfifo(inp / "fifo.pdf")
    t0 = time.monotonic()
    summary = _run(inp, out, model=tiny_model_dir)
    assert time.monotonic() - t0 < 120
    rows_ = pq.read_table(out / "pages").to_pylist()
    by = {os.path.relpath(r["source_uri"], inp): r for r in rows_ if r["page_index"] <= 0}
    assert {k: v["status"] for k, v in by.items()} == {"a.pdf": "ok", "sub/c.pdf": "ok", "link.pdf": "symlink",
                                                       "to_out": "symlink", "loop": "symlink", "loop2": "symlink",
                                                       "fifo.pdf": "not_regular_file"}
    assert not [r for r in rows_ if str(outside) in r["source_uri"] or str(out) in r["source_uri"]]
    assert summary["all_inputs_accounted"] and summary["inputs"] == 7
    # a rerun with links followed: the outside and the output stay out, the loops add nothing
    summary = _run(inp, out, model=tiny_model_dir, follow_symlinks=True)
    docs = {os.path.relpath(r["source_uri"], inp): r["status"] for r in pq.read_table(out / "documents").to_pylist()}
    assert docs["link.pdf"] == docs["to_out"] == "symlink_outside_input"
    assert docs["loop"] == docs["loop2"] == "duplicate_link" and docs["a.pdf"] == "ok"
    assert summary["all_inputs_accounted"]


def test_a_file_replaced_between_runs_is_parsed_again_in_full(ray_driver, tiny_model_dir, tmp_path):
    """Run 1 parses the first pages only; the files are then replaced by other PDFs; the rerun must
    not keep old pages beside new ones: every current row is of the new bytes, and the summary says so."""
    from padoc_ray.output.reader import pages_by_source, read_rows
    from padoc_ray.pdf import doc_id_of
    from padoc_ray.pipeline.ledger import current_rows

    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    old, new = text_pdf(3, label="Old"), text_pdf(2, label="New")
    shorter = text_pdf(1, label="Short")
    (inp / "a.pdf").write_bytes(old)
    (inp / "c.pdf").write_bytes(old)
    (inp / "b.pdf").write_bytes(text_pdf(1))
    first = _run(inp, out, model=tiny_model_dir, max_pages_per_doc=2)
    assert first["inputs_changed"] == 0
    (inp / "a.pdf").write_bytes(new)
    (inp / "c.pdf").write_bytes(shorter)
    second = _run(inp, out, model=tiny_model_dir)
    assert second["inputs_changed"] == 2  # b.pdf was complete; a.pdf and c.pdf changed and were parsed in full
    current = current_rows(read_rows(str(out))).to_pylist()
    a = [r for r in current if r["source_uri"].endswith("a.pdf")]
    assert sorted(r["page_index"] for r in a) == [0, 1] and {r["doc_id"] for r in a} == {doc_id_of(new)}
    c = [r for r in current if r["source_uri"].endswith("c.pdf")]
    assert [(r["page_index"], r["doc_id"]) for r in c] == [(0, doc_id_of(shorter))]  # not old page 1 beside it
    everything = pq.read_table(out / "pages").to_pylist()  # old rows stay in the files, never current
    assert {r["doc_id"] for r in everything if r["source_uri"].endswith("a.pdf")} == {doc_id_of(old), doc_id_of(new)}
    docs = {os.path.basename(r["source_uri"]): r for r in pq.read_table(out / "documents").to_pylist()}
    assert docs["a.pdf"]["doc_id"] == doc_id_of(new) and docs["a.pdf"]["status"] == "ok"
    assert docs["a.pdf"]["pages_ok"] == 2 and docs["c.pdf"]["pages_ok"] == 1 and docs["b.pdf"]["status"] == "ok"
    got = pages_by_source(str(out))  # what re-annotation and the importers read
    assert ("c.pdf", 0) in got and ("c.pdf", 1) not in got and got[("c.pdf", 0)][2] == 1
    third = _run(inp, out, model=tiny_model_dir)  # nothing changed: nothing to do
    assert third["inputs_changed"] == 0 and third["inputs_already_complete"] == 3


def test_a_complete_input_replaced_between_runs_is_read_and_parsed_again(ray_driver, tiny_model_dir, tmp_path):
    """The review's repro: report.pdf was parsed in full, then replaced by a different file; the rerun said
    "1 already complete, 0 to do" and documents.parquet kept the old doc_id. Rows now carry the size and
    time the listing saw: the rerun reads it again and its doc_id decides. A file that was not a PDF and
    became one is parsed; a file only touched (same bytes) is read, nothing is parsed."""
    from padoc_ray.pdf import doc_id_of

    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    old, new = text_pdf(2, label="Old"), text_pdf(3, label="New")
    (inp / "report.pdf").write_bytes(old)
    (inp / "memo.pdf").write_bytes(text_pdf(1))
    (inp / "notes.pdf").write_bytes(b"not a pdf at all")
    first = _run(inp, out, model=tiny_model_dir)
    assert first["document_status"] == {"ok": 2, "skipped": 1} and first["inputs_restamped"] == 0  # not_pdf: skipped
    (inp / "report.pdf").write_bytes(new)
    (inp / "notes.pdf").write_bytes(text_pdf(1, label="Now a PDF"))
    second = _run(inp, out, model=tiny_model_dir)
    assert second["inputs_already_complete"] == 1 and second["inputs_restamped"] == 2  # memo.pdf stands
    assert second["inputs_changed"] == 1 and second["document_status"] == {"ok": 3}  # report's done pages: other bytes
    docs = {os.path.basename(r["source_uri"]): r for r in pq.read_table(out / "documents").to_pylist()}
    assert docs["report.pdf"]["doc_id"] == doc_id_of(new) and docs["report.pdf"]["pages_ok"] == 3
    assert docs["notes.pdf"]["status"] == "ok"
    third = _run(inp, out, model=tiny_model_dir)
    assert third["inputs_already_complete"] == 3 and third["inputs_restamped"] == 0 and third["pages_written"] == 0
    # touched, not changed: read and hashed again, nothing parsed, the rows stand
    st = os.stat(inp / "memo.pdf")
    os.utime(inp / "memo.pdf", ns=(st.st_atime_ns, st.st_mtime_ns + 5_000_000_000))
    fourth = _run(inp, out, model=tiny_model_dir)
    assert fourth["inputs_restamped"] == 1 and fourth["inputs_changed"] == 0 and fourth["pages_written"] == 0
    assert fourth["document_status"] == {"ok": 3}


def test_current_rows_keep_only_the_newest_version_of_an_input():
    from padoc_ray.pipeline.ledger import current_rows

    def row(page, doc, t):
        return {"source_uri": "/in/a.pdf", "page_index": page, "processed_at": t, "doc_id": doc, "status": "ok"}

    import datetime as dt

    t = [dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc) + dt.timedelta(seconds=i) for i in range(5)]
    table = pa.Table.from_pylist([row(0, "d1", t[0]), row(1, "d1", t[1]), row(1, "d2", t[2])])
    got = current_rows(table).to_pylist()
    assert [(r["page_index"], r["doc_id"]) for r in got] == [(1, "d2")]  # page 0 of d1 is of another version
    # a read_failed row (no doc_id) newer than the pages still wins, as before
    table = pa.Table.from_pylist([row(0, "d1", t[0]), {**row(-1, None, t[3]), "status": "read_failed"}])
    assert [r["status"] for r in current_rows(table).to_pylist()] == ["read_failed"]


def _swap_after_listing(monkeypatch, swap) -> None:
    """Run ``swap()`` once the batch job has listed its inputs (before any raster task reads one)."""
    from padoc_ray.pipeline import job

    real = job.list_inputs

    def list_then_swap(*a, **kw):
        listed = real(*a, **kw)
        swap()
        return listed

    monkeypatch.setattr(job, "list_inputs", list_then_swap)


def test_a_file_swapped_for_a_fifo_after_the_listing_does_not_hang_the_run(ray_driver, tiny_model_dir, tmp_path,
                                                                           monkeypatch):
    """The listing sees a regular file; before any raster task reads it, it becomes a FIFO that nobody
    writes to (today's reads would wait forever): the run ends, with that file's own row."""
    inp, out = tmp_path / "in", tmp_path / "out"
    inp.mkdir()
    (inp / "a.pdf").write_bytes(text_pdf(1))
    (inp / "b.pdf").write_bytes(text_pdf(1))

    def swap():
        (inp / "b.pdf").unlink()
        os.mkfifo(inp / "b.pdf")

    _swap_after_listing(monkeypatch, swap)
    summary, s = _timed(lambda: _run(inp, out, model=tiny_model_dir), limit_s=180)
    docs = {os.path.basename(r["source_uri"]): r["status"] for r in pq.read_table(out / "documents").to_pylist()}
    assert docs == {"a.pdf": "ok", "b.pdf": "not_regular_file"} and summary["all_inputs_accounted"]


def test_a_file_swapped_for_a_link_is_not_read_where_the_link_points(tmp_path):
    """The read itself: with links not followed, a file that is (now) a link is refused, whatever it points to
    (before, the read followed it)."""
    inp = tmp_path / "in"
    inp.mkdir()
    (tmp_path / "secret.pdf").write_bytes(text_pdf(3))
    (inp / "b.pdf").symlink_to(tmp_path / "secret.pdf")
    with pytest.raises(LinkAtRead, match="symbolic link"):
        read_bytes(str(inp / "b.pdf"), follow_links=False)
    assert read_bytes(str(inp / "b.pdf")) == (tmp_path / "secret.pdf").read_bytes()  # followed when asked


def test_a_file_swapped_for_a_link_after_the_listing_is_refused_in_a_run(ray_driver, tiny_model_dir, tmp_path,
                                                                        monkeypatch):
    """The review's repro as a run: once the run has its plan, in/b.pdf (2 pages) becomes a link to
    outside/secret.pdf (30 pages). The documents table said "b.pdf ok, 30 pages" (the secret's); now b.pdf
    gets the listing's own code and no page of the secret is written."""
    inp, out, outside = tmp_path / "in", tmp_path / "out", tmp_path / "outside"
    inp.mkdir()
    outside.mkdir()
    (inp / "a.pdf").write_bytes(text_pdf(1))
    (inp / "b.pdf").write_bytes(text_pdf(2))
    (outside / "secret.pdf").write_bytes(text_pdf(30))

    def swap():
        (inp / "b.pdf").unlink()
        (inp / "b.pdf").symlink_to(outside / "secret.pdf")

    _swap_after_listing(monkeypatch, swap)
    summary, _ = _timed(lambda: _run(inp, out, model=tiny_model_dir), limit_s=180)
    docs = {os.path.basename(r["source_uri"]): r["status"] for r in pq.read_table(out / "documents").to_pylist()}
    assert docs == {"a.pdf": "ok", "b.pdf": "symlink"} and summary["all_inputs_accounted"]
    pages = [r for r in pq.read_table(out / "pages").to_pylist() if r["source_uri"].endswith("b.pdf")]
    assert pages and all(r["page_index"] == -1 and r["status"] == "symlink" for r in pages)


def test_a_folder_on_the_path_swapped_for_a_link_is_not_followed_either(tmp_path):
    """The read from the input folder opens each folder on the way without following a link: in/sub/ swapped
    for a link to outside/ (which has a sub.pdf of the same name) is refused; with links followed, a path
    that now leads outside the folder is refused too, one inside it is read."""
    from padoc_ray.storage import LinkOutside

    inp, outside = tmp_path / "in", tmp_path / "outside"
    (inp / "sub").mkdir(parents=True)
    outside.mkdir()
    (inp / "sub" / "b.pdf").write_bytes(text_pdf(2))
    (outside / "b.pdf").write_bytes(text_pdf(30))
    assert read_bytes(str(inp / "sub" / "b.pdf"), follow_links=False, root=str(inp)) == text_pdf(2)
    (inp / "sub" / "b.pdf").rename(tmp_path / "kept.pdf")
    (inp / "sub").rmdir()
    (inp / "sub").symlink_to(outside)
    assert read_bytes(str(inp / "sub" / "b.pdf")) == text_pdf(30)  # what a plain open does: the secret
    with pytest.raises(LinkAtRead, match="a folder on the path"):
        read_bytes(str(inp / "sub" / "b.pdf"), follow_links=False, root=str(inp))
    with pytest.raises(LinkOutside, match="outside the input folder"):
        read_bytes(str(inp / "sub" / "b.pdf"), follow_links=True, root=str(inp))
    (inp / "deep").mkdir()
    (inp / "deep" / "c.pdf").write_bytes(text_pdf(1))
    (inp / "alias").symlink_to(inp / "deep")
    assert read_bytes(str(inp / "alias" / "c.pdf"), follow_links=True, root=str(inp)) == text_pdf(1)


def test_a_folder_swapped_for_a_link_after_the_listing_is_refused_in_a_run(ray_driver, tiny_model_dir, tmp_path,
                                                                          monkeypatch):
    """The same as a run: once the run has its plan, in/sub/ (b.pdf, 2 pages) becomes a link to outside/
    (b.pdf, 30 pages). b.pdf gets the listing's code for a link and nothing of outside/ is written."""
    inp, out, outside = tmp_path / "in", tmp_path / "out", tmp_path / "outside"
    (inp / "sub").mkdir(parents=True)
    outside.mkdir()
    (inp / "a.pdf").write_bytes(text_pdf(1))
    (inp / "sub" / "b.pdf").write_bytes(text_pdf(2))
    (outside / "b.pdf").write_bytes(text_pdf(30))

    def swap():
        (inp / "sub").rename(tmp_path / "old-sub")
        (inp / "sub").symlink_to(outside)

    _swap_after_listing(monkeypatch, swap)
    summary, _ = _timed(lambda: _run(inp, out, model=tiny_model_dir), limit_s=180)
    docs = {os.path.relpath(r["source_uri"], inp): r["status"] for r in pq.read_table(out / "documents").to_pylist()}
    assert docs == {"a.pdf": "ok", "sub/b.pdf": "symlink"} and summary["all_inputs_accounted"]
    pages = [r for r in pq.read_table(out / "pages").to_pylist() if r["source_uri"].endswith("b.pdf")]
    assert [(r["page_index"], r["status"], r["page_count"]) for r in pages] == [(-1, "symlink", None)]


def test_an_s3_read_has_its_deadline_too(s3, monkeypatch):
    """An S3 store that does not answer in time (a proxy that holds the object's GET for 20 s): the
    read ends at its deadline (pyarrow's request time-out, or our own deadline: an OSError either way,
    read_failed in the job), not when the store answers."""
    from tests.helpers.s3_proxy import S3Proxy

    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    s3["client"].create_bucket(Bucket="slow-bucket")
    s3["client"].put_object(Bucket="slow-bucket", Key="in/a.pdf", Body=text_pdf(1))
    with S3Proxy(s3["endpoint"], delay_s=20.0, delay_prefix="/slow-bucket/in/") as proxy:
        cfg = StorageConfig(endpoint=proxy.endpoint, read_timeout_s=1.0, retry_attempts=1)
        t0 = time.monotonic()
        with pytest.raises(OSError, match="(?i)timeout|did not finish"):
            _timed(lambda: read_bytes("s3://slow-bucket/in/a.pdf", cfg), limit_s=10)
        assert time.monotonic() - t0 < 10
    fast = StorageConfig(endpoint=s3["endpoint"], read_timeout_s=5.0)
    assert read_bytes("s3://slow-bucket/in/a.pdf", fast) == text_pdf(1)
