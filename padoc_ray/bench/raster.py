"""Rasterization benchmark: padoc-ray's raster stage (pypdfium2 + PNG) vs pdftoppm (poppler).

Same PDFs, same resolution (a DPI), same output format (PNG). Reports pages/s for: pypdfium2
render only, render + PNG encode (what the pipeline's raster stage does per page), both with
1 and N processes, and pdftoppm (one process per PDF, N at a time) when it is installed.
"""

from __future__ import annotations

import glob
import io
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor


def _render_file(args: tuple[str, float, bool]) -> int:
    from padoc_ray.pdf import PdfError, RenderConfig, open_pdf, render_page

    path, dpi, encode = args
    with open(path, "rb") as f:
        data = f.read()
    try:
        doc = open_pdf(data)
    except PdfError:
        return 0
    n = 0
    cfg = RenderConfig(dpi=dpi)
    for i in range(len(doc)):
        try:
            r = render_page(doc, i, cfg)
        except PdfError:
            continue
        if encode:
            r.image.save(io.BytesIO(), format="PNG", compress_level=1)
        n += 1
    doc.close()
    return n


def _pdftoppm(args: tuple[str, float, str]) -> int:
    path, dpi, out = args
    prefix = os.path.join(out, os.path.basename(path))
    subprocess.run(["pdftoppm", "-r", str(dpi), "-png", path, prefix], check=False, capture_output=True)
    return len(glob.glob(prefix + "*.png"))


def _timed(fn, items, workers: int) -> tuple[int, float]:
    t = time.perf_counter()
    if workers == 1:
        n = sum(map(fn, items))
    else:
        with ProcessPoolExecutor(workers) as ex:
            n = sum(ex.map(fn, items))
    return n, time.perf_counter() - t


def run(paths: list[str], dpi: float, workers: int) -> dict:
    out: dict = {"pdfs": len(paths), "dpi": dpi, "workers": workers, "results": {}}
    for name, encode in (("pypdfium2_render", False), ("padoc_raster_stage", True)):
        for w in sorted({1, workers}):
            n, s = _timed(_render_file, [(p, dpi, encode) for p in paths], w)
            out["results"][f"{name}/{w}proc"] = {"pages": n, "seconds": round(s, 3), "pages_per_s": round(n / s, 2)}
    if shutil.which("pdftoppm"):
        for w in sorted({1, workers}):
            with tempfile.TemporaryDirectory() as d:
                n, s = _timed(_pdftoppm, [(p, dpi, d) for p in paths], w)
            out["results"][f"pdftoppm_png/{w}proc"] = {"pages": n, "seconds": round(s, 3), "pages_per_s": round(n / s, 2)}
    else:
        out["results"]["pdftoppm_png"] = "pdftoppm not installed (apt-get install poppler-utils)"
    return out
