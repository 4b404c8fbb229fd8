"""Rasterization benchmark: padoc-ray's raster stage vs plain pypdfium2 vs pdftoppm (poppler).

Same PDFs, same resolution (a DPI). Reports pages/s, each with 1 and N processes, for:

* ``pypdfium2_render``: open + render to an RGB image, nothing else (the ceiling);
* ``padoc_raster_stage``: what the batch job's raster stage does per page: read the file, render
  in the isolated renderer process (deadlines, crash isolation) and encode the page as the engine
  stage receives it (``--encoding``, default zstd);
* ``padoc_raster_stage_in_process``: the same without isolation (the cost of isolation is the gap);
* ``png_encode_in_process``: render + PNG (compress_level 1) in process, the encoding used before zstd;
* ``pdftoppm_png``: poppler, one process per PDF, N at a time (when installed).
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

from padoc_ray.bench import pdf_paths, write_json
from padoc_ray.knobs import knob


def _render_file(args: tuple) -> int:
    """Pages rendered from one file: ``args`` = (path, dpi, encoding or None, isolate)."""
    from padoc_ray.pdf import RenderConfig
    from padoc_ray.raster import PageRendered, RendererConfig, renderer_for

    path, dpi, encoding, isolate = args
    with open(path, "rb") as f:
        data = f.read()
    if encoding is None:  # render only, in process: the ceiling
        from padoc_ray.pdf import PdfError, open_pdf, render_page

        try:
            doc = open_pdf(data)
        except PdfError:
            return 0
        n = 0
        for i in range(len(doc)):
            try:
                render_page(doc, i, RenderConfig(dpi=dpi))
                n += 1
            except PdfError:
                pass
        doc.close()
        return n
    renderer = renderer_for(RendererConfig(isolate=isolate))
    events = renderer.render_document(data, os.path.basename(path), lambda n: list(range(n)), RenderConfig(dpi=dpi),
                                      encoding)
    return sum(isinstance(e, PageRendered) for e in events)


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


#: name -> (encoding, isolate); encoding None renders only
VARIANTS = {
    "pypdfium2_render": (None, False),
    "padoc_raster_stage": ("zstd", True),
    "padoc_raster_stage_in_process": ("zstd", False),
    "png_encode_in_process": ("png", False),
}


def run(paths: list[str], dpi: float, workers: int, encoding: str = "zstd") -> dict:
    out: dict = {"pdfs": len(paths), "dpi": dpi, "workers": workers, "encoding": encoding, "results": {}}
    for name, (enc, isolate) in VARIANTS.items():
        enc = encoding if enc == "zstd" else enc
        for w in sorted({1, workers}):
            n, s = _timed(_render_file, [(p, dpi, enc, isolate) for p in paths], w)
            out["results"][f"{name}/{w}proc"] = {"pages": n, "seconds": round(s, 3), "pages_per_s": round(n / s, 2)}
    if shutil.which("pdftoppm"):
        for w in sorted({1, workers}):
            with tempfile.TemporaryDirectory() as d:
                n, s = _timed(_pdftoppm, [(p, dpi, d) for p in paths], w)
            out["results"][f"pdftoppm_png/{w}proc"] = {"pages": n, "seconds": round(s, 3), "pages_per_s": round(n / s, 2)}
    else:
        out["results"]["pdftoppm_png"] = "pdftoppm not installed (apt-get install poppler-utils)"
    r = out["results"]
    base = r["pypdfium2_render/1proc"]["pages_per_s"]
    out["ratio_stage_to_render_1proc"] = round(r["padoc_raster_stage/1proc"]["pages_per_s"] / base, 3)
    out["isolation_cost_1proc"] = round(1 - r["padoc_raster_stage/1proc"]["pages_per_s"]
                                        / r["padoc_raster_stage_in_process/1proc"]["pages_per_s"], 3)
    return out


def _cores() -> int:
    return os.cpu_count() or 1


@dataclass(frozen=True, kw_only=True)
class RasterBenchConfig:
    """Rasterize the same PDFs at the same DPI with pypdfium2 (render only), with the batch job's raster stage
    (isolated renderer process + page encoding, and the same in process, to show the cost of isolation), render
    + PNG in process, and pdftoppm (poppler), each with 1 and N processes, and print pages/s."""

    input: str = knob(help="folder (searched recursively) or glob of PDFs")
    dpi: float = 144  #: resolution for every tool
    workers: int = knob(factory=_cores, help="processes", show=lambda v: "all cores")
    #: page encoding of the raster stage variants (zstd: the batch job's default)
    encoding: str = knob("zstd", choices=("zstd", "png", "ppm"))
    json: str | None = knob(None, metavar="OUT.json", help="also write the results here as JSON")


def main(cfg: RasterBenchConfig) -> int:
    res = run(pdf_paths(cfg.input), cfg.dpi, cfg.workers, encoding=cfg.encoding)
    print(json.dumps(res, indent=2))
    write_json(cfg.json, res, announce=False)
    return 0
