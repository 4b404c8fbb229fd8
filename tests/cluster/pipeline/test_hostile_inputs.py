"""Inputs written by someone else: model keys that climb out of the cache, manifests that name
anything, image and PDF bombs, and the caps that bound one input's cost (issue 18). No Ray here;
the runs through the real batch job are in test_integrity.py."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import threading

import pytest

from padoc_ray.pdf import ABSURD_PAGE_SIZE, TOO_MANY_FRAMES, PdfError, open_document
from padoc_ray import modelstore
from padoc_ray.pipeline import limits
from padoc_ray.pipeline.limits import InputLimits
from padoc_ray.output.rows import select_pages
from padoc_ray.storage import StorageConfig
from padoc_ray.listing import DISALLOWED, list_inputs, MISSING
from padoc_ray.modelstore import local_model_dir, relative_key, UnsafeKeyError

from tests.conftest import ROOT


# ---- hostile files, made on the fly -----------------------------------------------------------------------
def many_page_pdf(n: int, size: int = 200) -> bytes:
    """A valid PDF of ``n`` empty pages, written by hand (100,000 pages: ~10 MB in ~0.3 s)."""
    objs = [b"<< /Type /Catalog /Pages 2 0 R >>", b""]
    kids = []
    for i in range(n):
        kids.append(f"{i + 3} 0 R".encode())
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 {size} {size}] >>".encode())
    objs[1] = b"<< /Type /Pages /Count %d /Kids [" % n + b" ".join(kids) + b"] >>"
    from tests.helpers.pdf_factory import serialize_pdf

    return serialize_pdf(objs, 1)


def tiff_frames(sizes: list[tuple[int, int]]) -> bytes:
    """A multi-frame bilevel TIFF (group 4: a blank 13000x13000 frame is a few KB)."""
    from PIL import Image

    frames = [Image.new("1", s, 1) for s in sizes]
    buf = io.BytesIO()
    frames[0].save(buf, format="TIFF", compression="group4", save_all=True, append_images=frames[1:])
    return buf.getvalue()


@pytest.fixture(scope="module")
def tiff_bomb() -> bytes:
    """The issue's bomb: a small first frame, then 20 frames of 13000x13000 (~210 KB in all)."""
    from PIL import Image

    big = Image.new("1", (13000, 13000), 1)
    buf = io.BytesIO()
    Image.new("1", (100, 100), 1).save(buf, format="TIFF", compression="group4", save_all=True,
                                       append_images=[big] * 20)
    return buf.getvalue()


# ---- model copy from object storage ---------------------------------------------------------------------------
def _put_model(client, bucket: str, prefix: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        client.put_object(Bucket=bucket, Key=f"{prefix}/{name}", Body=data)


def test_relative_key_refuses_keys_that_leave_the_folder():
    assert relative_key("m/sub/w.bin", "m") == "sub/w.bin"
    assert relative_key("m/", "m") is None and relative_key("m/sub/", "m") is None  # folder markers
    for key in ("m/x/../../NAME", "m//etc/passwd", "m/./a", "m/a//b", "m/..", "n/a", "m2/a"):
        with pytest.raises(UnsafeKeyError):
            relative_key(key, "m")


def test_model_copy_refuses_a_traversal_key_and_writes_nothing(s3, tmp_path, monkeypatch):
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    c = s3["client"]
    c.create_bucket(Bucket="evil-models")
    _put_model(c, "evil-models", "m", {"config.json": b"{}", "x/../../../PWNED": b"import os  # code"})
    assert any(".." in o["Key"] for o in c.list_objects_v2(Bucket="evil-models")["Contents"])  # the server keeps it
    cache = tmp_path / "home" / "cache" / "models"
    with pytest.raises(UnsafeKeyError, match=r"refusing to copy"):
        local_model_dir("s3://evil-models/m", StorageConfig(endpoint=s3["endpoint"]), cache_root=str(cache))
    written = [os.path.join(d, f) for d, _, fs in os.walk(tmp_path) for f in fs]
    assert written == []  # not the traversal target, not a partial copy, nothing


def test_model_cache_keys_on_the_listing_downloads_once_and_cleans_failed_copies(s3, tmp_path, monkeypatch):
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    c = s3["client"]
    c.create_bucket(Bucket="models-ok")
    _put_model(c, "models-ok", "tiny", {"config.json": b'{"v": 1}', "weights/w.bin": b"A" * 1000})
    cfg = StorageConfig(endpoint=s3["endpoint"])
    cache = str(tmp_path / "cache")
    downloads = []
    real = modelstore._download_model

    def counting(*a, **kw):
        downloads.append(1)
        return real(*a, **kw)

    monkeypatch.setattr(modelstore, "_download_model", counting)
    # several actors on one node ask at once: one download, one copy
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(local_model_dir("s3://models-ok/tiny", cfg, cache)))
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 4 and len(set(got)) == 1 and len(downloads) == 1
    first = got[0]
    assert open(os.path.join(first, "weights", "w.bin"), "rb").read() == b"A" * 1000
    # the model is updated at the same URI: the new weights are served, not the cached ones
    _put_model(c, "models-ok", "tiny", {"weights/w.bin": b"B" * 1200})
    second = local_model_dir("s3://models-ok/tiny", cfg, cache)
    assert second != first and open(os.path.join(second, "weights", "w.bin"), "rb").read() == b"B" * 1200
    assert len(downloads) == 2
    # a copy that fails half-way leaves nothing behind, and the next try succeeds
    _put_model(c, "models-ok", "tiny", {"weights/w.bin": b"C" * 1300})

    def failing(client, bucket, objects, folder):
        real(client, bucket, objects[:1], folder)
        raise OSError("connection reset")

    monkeypatch.setattr(modelstore, "_download_model", failing)
    with pytest.raises(OSError, match="connection reset"):
        local_model_dir("s3://models-ok/tiny", cfg, cache)
    assert not [n for n in os.listdir(cache) if n.endswith(".tmp")]
    monkeypatch.setattr(modelstore, "_download_model", real)
    third = local_model_dir("s3://models-ok/tiny", cfg, cache)
    assert open(os.path.join(third, "weights", "w.bin"), "rb").read() == b"C" * 1300
    assert os.path.exists(os.path.join(third, ".complete"))


# ---- manifests --------------------------------------------------------------------------------------------------
def test_a_local_manifest_names_only_its_own_folder(tmp_path):
    inp = tmp_path / "in"
    (inp / "sub").mkdir(parents=True)
    for p in (inp / "a.pdf", inp / "sub" / "b.pdf", tmp_path / "outside.pdf"):
        p.write_bytes(b"%PDF-1.4 x")
    man = inp / "list.txt"
    man.write_text("\n".join(["a.pdf", "./a.pdf", str(inp / "a.pdf"), "sub/b.pdf", "../outside.pdf", "/etc/hostname",
                              "s3://other-bucket/secret.pdf", "file:///etc/passwd", "gone.pdf"]) + "\n")
    got = dict(list_inputs(str(man)))
    assert got == {
        str(inp / "a.pdf"): 10, str(inp / "sub" / "b.pdf"): 10,  # one key for three spellings
        str(tmp_path / "outside.pdf"): DISALLOWED, "/etc/hostname": DISALLOWED,
        "s3://other-bucket/secret.pdf": DISALLOWED, "file:///etc/passwd": DISALLOWED,
        str(inp / "gone.pdf"): MISSING,
    }
    wider = dict(list_inputs(str(man), allowed_prefixes=[str(tmp_path)]))  # --manifest-allow
    assert wider[str(tmp_path / "outside.pdf")] == 10 and wider["/etc/hostname"] == DISALLOWED


def test_an_s3_manifest_names_only_keys_under_its_prefix(s3, monkeypatch):
    for k, v in s3["env"].items():
        monkeypatch.setenv(k, v)
    c = s3["client"]
    for b in ("man-bucket", "other-bucket"):
        c.create_bucket(Bucket=b)
    c.put_object(Bucket="man-bucket", Key="lists/a.pdf", Body=b"%PDF-1.4 x")
    c.put_object(Bucket="man-bucket", Key="secret.pdf", Body=b"%PDF-1.4 secret")
    c.put_object(Bucket="other-bucket", Key="secret.pdf", Body=b"%PDF-1.4 secret")
    c.put_object(Bucket="man-bucket", Key="lists/list.txt", Body="\n".join([
        "a.pdf", "s3://man-bucket/lists/a.pdf", "/etc/passwd", "../secret.pdf", "x/../../secret.pdf",
        "s3://man-bucket/lists/../secret.pdf", "s3://other-bucket/secret.pdf"]).encode())
    got = dict(list_inputs("s3://man-bucket/lists/list.txt", StorageConfig(endpoint=s3["endpoint"])))
    assert got.pop("s3://man-bucket/lists/a.pdf") == 10
    assert got == {"/etc/passwd": DISALLOWED, "s3://man-bucket/lists/../secret.pdf": DISALLOWED,  # twice in the list
                   "s3://man-bucket/lists/x/../../secret.pdf": DISALLOWED, "s3://other-bucket/secret.pdf": DISALLOWED}


# ---- image and PDF bombs ---------------------------------------------------------------------------------------
@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="peak memory is read from /proc")
def test_tiff_bomb_is_rejected_frame_by_frame_in_bounded_memory(tiff_bomb, tmp_path):
    assert len(tiff_bomb) < 400_000
    path = tmp_path / "bomb.tif"
    path.write_bytes(tiff_bomb)
    probe = (  # counts PIL's decoders made (every decoded frame takes one: ImageFile.load, libtiff's load)
        "import sys\n"
        "from PIL import Image\n"
        "from padoc_ray.pdf import PdfError, open_document\n"
        "made, getdecoder = [], Image._getdecoder\n"
        "Image._getdecoder = lambda *a, **kw: made.append(a[:2]) or getdecoder(*a, **kw)\n"
        "data = open(sys.argv[1], 'rb').read()\n"
        "try:\n"
        "    open_document(data)\n"
        "    print('opened')\n"
        "except PdfError as e:\n"
        "    print(e.code, '|', e.message)\n"
        "hwm = [ln for ln in open('/proc/self/status') if ln.startswith('VmHWM')][0].split()[1]\n"  # peak RSS, kB
        "print(len(made), int(hwm) // 1024)\n"
    )
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", probe, str(path)], capture_output=True, text=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    verdict, figures = out.stdout.strip().splitlines()
    decoders, max_rss_mb = int(figures.split()[0]), int(figures.split()[1])
    assert verdict.startswith(ABSURD_PAGE_SIZE) and "frame 1 is 13000x13000" in verdict
    assert decoders == 0 and max_rss_mb < 200  # headers only: no frame decoded (one would be 169 MB as L, 507 as RGB)


def test_image_frame_cap_and_normal_multi_frame_tiffs():
    three = tiff_frames([(80, 100)] * 3)
    assert len(open_document(three)) == 3
    with pytest.raises(PdfError) as e:
        open_document(three, max_frames=2)
    assert e.value.code == TOO_MANY_FRAMES and e.value.count == 3
    img = open_document(tiff_frames([(80, 100), (120, 90)]))
    from padoc_ray.pdf import RenderConfig, render_page

    assert render_page(img, 1, RenderConfig()).image.size == (120, 90)


def test_a_hundred_thousand_page_pdf_is_over_the_default_page_cap():
    data = many_page_pdf(100_000)
    assert len(data) < 12_000_000
    doc = open_document(data)
    n = len(doc)
    assert n == 100_000
    lim = InputLimits()
    err = limits.page_cap_error(n, select_pages(n, None, None), lim)
    assert err is not None and err.code == limits.TOO_MANY_PAGES and "100000" in err.message
    assert limits.page_cap_error(n, select_pages(n, None, 10), lim) is None  # the user selected 10 pages
    assert limits.page_cap_error(n, select_pages(n, None, None), InputLimits(max_doc_pages=None)) is None
    doc.close()


def test_listing_refusals_and_what_a_rerun_retries():
    lim = InputLimits(max_file_bytes=1000)
    assert limits.listing_refusal(DISALLOWED, lim)[0] == "disallowed_uri"
    assert limits.listing_refusal(MISSING, lim)[0] == "missing_file"
    assert limits.listing_refusal(1001, lim)[0] == "file_too_large"
    assert limits.listing_refusal(1000, lim) is None
    assert limits.listing_refusal(10**12, InputLimits(max_file_bytes=None)) is None
    for code in ("read_failed", "missing_file", "disallowed_uri", "file_too_large"):
        assert limits.retried(code, None, None, lim)
    for code in ("corrupt_pdf", "not_pdf", "encrypted_pdf", "absurd_page_size", None):
        assert not limits.retried(code, None, None, lim)
    assert not limits.retried("too_many_pages", 100_000, 100_000, lim)  # still over the cap
    assert limits.retried("too_many_pages", 100_000, 10, lim)  # now only 10 pages are selected
    assert not limits.retried("too_many_frames", 1500, 1500, lim)
    assert limits.retried("too_many_frames", 1500, 1500, InputLimits(max_image_frames=2000))
    with pytest.raises(ValueError):
        InputLimits(max_doc_pages=0)


def test_a_file_that_grew_past_the_size_cap_after_listing_is_refused_when_read(tmp_path):
    """The listing said 10 bytes; by the time the raster task reads it, the file is over the cap:
    one row, and no more than cap + 1 bytes are read (counted where the file is read: the bytes the
    operating system's read calls return for it)."""
    import pyarrow as pa

    from padoc_ray.pipeline.config import BatchConfig
    from padoc_ray.pipeline.limits import InputLimits
    from padoc_ray.pipeline.stages import rasterize

    from tests.helpers.pdf_factory import text_pdf

    big = tmp_path / "grew.pdf"
    big.write_bytes(text_pdf(3))
    assert big.stat().st_size > 2000  # well over the cap: reading it whole would show
    cfg = BatchConfig.from_flat(input=str(tmp_path), output=str(tmp_path.parent / (tmp_path.name + "_out")), model="m",
                                limits=InputLimits(max_file_bytes=1000))
    batch = pa.Table.from_pylist([{"uri": str(big), "size": 10, "done": []}])
    read_from_big = []  # the bytes each os.read of the file returned, whatever thread or layer asked
    real_read, real_big = os.read, os.path.realpath(big)

    def counted_read(fd, n):
        data = real_read(fd, n)
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == real_big:
                read_from_big.append(len(data))
        except OSError:  # not a file descriptor of a path
            pass
        return data

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(os, "read", counted_read)
        rows_ = [r for t in rasterize(batch, cfg, "m") for r in t.to_pylist()]
    assert [(r["page_index"], r["status"]) for r in rows_] == [(-1, "file_too_large")]
    assert read_from_big and sum(read_from_big) == 1000 + 1, read_from_big  # cap + 1: enough to tell, no more
    ok = BatchConfig(input=str(tmp_path), output=str(tmp_path.parent / (tmp_path.name + "_out")), model="m")
    rows_ = [r for t in rasterize(batch, ok, "m") for r in t.to_pylist()]
    assert [(r["page_index"], r["status"]) for r in rows_] == [(0, None), (1, None), (2, None)]


def test_a_form_xobject_bomb_costs_its_own_rows_in_the_raster_stage(tmp_path):
    """Issue 27: 30 pages of forms nested 7 deep (pdfium aborts on each after a minute) beside two
    good files, through the raster stage's own renderer: the bomb's pages get page_too_complex before
    pdfium loads them, without a renderer crash or time-out (no restart), and every page of the good
    files is rendered."""
    from tests.helpers.batch_runs import raster_statuses
    from tests.helpers.pdf_factory import form_bomb_pdf, text_pdf

    got, restarts = raster_statuses(tmp_path, {"a.pdf": text_pdf(2), "bomb.pdf": form_bomb_pdf(pages=30, depth=7),
                                               "b.pdf": text_pdf(3)})
    assert restarts == 0
    assert got == ([("a.pdf", i, None) for i in range(2)] + [("bomb.pdf", i, "page_too_complex") for i in range(30)]
                   + [("b.pdf", i, None) for i in range(3)])
