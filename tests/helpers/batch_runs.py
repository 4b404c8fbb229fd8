"""What the batch-job tests (tests/test_pipeline*.py, tests/cluster/metrics/test_operator_metrics.py) share: the `padoc-ray
parse` command line, the raster stage run over a few files, reading a run's page rows back, teacher-forced ground truth for example pages
and copies of them, and a search of a test cluster's logs. No fixtures: the tests' own ``ray_cluster``
(tests/conftest.py: one per pytest worker, lent to one file at a time) is the cluster they run on."""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys

import pyarrow.dataset as pads

from tests.conftest import ROOT, _env

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


def example_copies(d, n: int) -> None:
    os.makedirs(d, exist_ok=True)
    for i in range(n):
        for f in glob.glob(os.path.join(EXAMPLES, "*.pdf")):
            shutil.copy(f, os.path.join(d, f"{i}_{os.path.basename(f)}"))


def gt_for_copies(path, n: int, regions: int | None = None) -> str:
    """Ground truth (written to ``path``) for the ``n`` copies of the example PDFs that
    :func:`example_copies` makes: each page teacher-forced to its original's regions, the first
    ``regions`` of them if given (fewer tokens a page, for tests about runs rather than pages)."""
    gt = json.load(open(os.path.join(EXAMPLES, "ground_truth.json")))
    out = []
    for i in range(n):
        for p in gt:
            q = json.loads(json.dumps(p))
            q["page_info"]["source_pdf"] = f"{i}_{p['page_info']['source_pdf']}"
            if regions is not None:
                q["layout_dets"] = q["layout_dets"][:regions]
            out.append(q)
    with open(path, "w") as f:
        json.dump(out, f)
    return str(path)


def logged(ray_cluster, text: str) -> bool:
    """Whether any process of the test's own cluster logged ``text`` (its files under its temp dir)."""
    for path in glob.glob(os.path.join(ray_cluster["temp_dir"], "session_*", "logs", "*")):
        try:
            if text in open(path, errors="replace").read():
                return True
        except (IsADirectoryError, OSError):
            continue
    return False


def raster_statuses(folder, files: dict[str, bytes]) -> tuple[list[tuple[str, int, str | None]], int]:
    """Write ``files`` (name -> bytes) into ``folder`` and run them through the batch job's raster stage (its
    own isolated renderer): each row's (file name, page index, status), in order, and how many times the
    stage's renderer process was restarted meanwhile (after a crash or a time-out: ``IsolatedRenderer.restarts``)."""
    import pyarrow as pa

    from padoc_ray.pipeline.config import BatchConfig
    from padoc_ray.pipeline.stages import rasterize
    from padoc_ray.raster.renderer import renderer_for

    for name, data in files.items():
        (folder / name).write_bytes(data)
    cfg = BatchConfig(input=str(folder), output=str(folder.parent / (folder.name + "_out")), model="m")
    batch = pa.Table.from_pylist([{"uri": str(folder / n), "size": len(d), "done": []} for n, d in files.items()])
    renderer = renderer_for(cfg.raster.renderer)  # the one rasterize uses in this process (kept between calls)
    before = renderer.restarts
    got = [(os.path.basename(r["source_uri"]), r["page_index"], r["status"])
           for tab in rasterize(batch, cfg, "m") for r in tab.to_pylist()]
    return got, renderer.restarts - before
