"""Pipeline-overhead benchmark: the batch job with the no-op engine vs raw rasterization.

Both sides do the same per-page work (pypdfium2 render + zstd encode, same PDFs, same DPI) on the
same machine. The raw side is a process pool with no Ray; the pipeline side is the whole batch job
(listing, Ray Data raster tasks, the engine actor with the scheduler and a no-op engine, Parquet
writer, documents table and summary). The raw side is measured before and after the pipeline and
averaged, so a change of machine load during the run shows up as a spread instead of a bias.

Three pipeline figures are reported: ``wall`` (everything, local Ray start included), ``job``
(the batch job alone on a running cluster, as under ``ray job submit``: listing, actor start,
rasterization, parsing, writing, documents table and summary), and ``steady``: the rate between
the 25th and the 90th percentile of the rows' ``processed_at``, i.e. after start-up and the
backlog that builds while the actor starts, before the tail; what a long job runs at.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from dataclasses import dataclass

from padoc_ray.bench import UsageError, pdf_paths, write_json
from padoc_ray.bench.raster import _cores, _render_file, _timed
from padoc_ray.host import HostConfig
from padoc_ray.knobs import knob


def raw_raster(paths: list[str], dpi: float, workers: int) -> dict:
    n, s = _timed(_render_file, [(p, dpi, "zstd", False) for p in paths], workers)  # the stage's work, no Ray
    return {"pages": n, "seconds": round(s, 3), "pages_per_s": round(n / s, 2)}


def noop_pipeline(paths: list[str], model: str, dpi: float, out: str, *, pages_in_flight: int,
                  cpus_per_actor: float, raster_cpus: float) -> dict:
    import ray

    from padoc_ray.pdf import RenderConfig
    from padoc_ray.pipeline.config import BatchConfig, EnginesConfig, InputsConfig, RasterConfig
    from padoc_ray.pipeline.job import run_batch
    from padoc_ray.ray_init import init_ray

    manifest = os.path.join(out, "inputs.txt")
    with open(manifest, "w") as f:
        f.write("\n".join(paths) + "\n")
    t0 = time.perf_counter()
    if not ray.is_initialized():
        init_ray("local", num_cpus=os.cpu_count(), include_dashboard=False)
    t_ray = time.perf_counter() - t0
    cfg = BatchConfig(input=manifest, output=os.path.join(out, "run"), model=model,
                      engines=EnginesConfig(host=HostConfig(engine="noop", pages_in_flight=pages_in_flight),
                                            cpus_per_actor=cpus_per_actor),
                      raster=RasterConfig(render=RenderConfig(dpi=dpi), cpus=raster_cpus),
                      inputs=InputsConfig(manifest_allow=tuple(sorted({os.path.dirname(os.path.abspath(p))
                                                                      for p in paths}))))
    summary = run_batch(cfg, log=lambda *_: None)
    wall = time.perf_counter() - t0
    n = summary["pages_written"]
    return {"pages": n, "ray_init_s": round(t_ray, 3), "seconds": round(wall, 3),
            "pages_per_s": round(n / wall, 2), "job_seconds": summary["wall_s"],
            "job_pages_per_s": summary["pages_per_s"],
            "steady_pages_per_s": steady_rate(os.path.join(out, "run", "pages")),
            "page_status": summary["page_status"], "all_inputs_accounted": summary["all_inputs_accounted"],
            "config": {"pages_in_flight": pages_in_flight, "cpus_per_actor": cpus_per_actor,
                       "raster_cpus": raster_cpus, "raster_pages_per_block": cfg.raster.pages_per_block,
                       "rows_per_file": cfg.outputs.rows_per_file,
                       "engine_batch_pages": cfg.engines.batch_pages, "writer_cpus": cfg.outputs.writer_cpus}}


def steady_rate(pages_dir: str, lo: float = 0.25, hi: float = 0.90) -> float | None:
    """Pages per second between the ``lo`` and ``hi`` quantiles of the rows' ``processed_at``."""
    from padoc_ray.output.reader import read_rows as read_pages
    from padoc_ray.storage import StorageConfig

    t = read_pages(pages_dir, StorageConfig(), columns=["page_index", "processed_at"])
    ts = sorted(r["processed_at"] for r in t.to_pylist() if r["page_index"] >= 0)
    if len(ts) < 20:
        return None
    i, j = int(lo * (len(ts) - 1)), int(hi * (len(ts) - 1))
    span = (ts[j] - ts[i]).total_seconds()
    return round((j - i) / span, 2) if span > 0 else None


def run(paths: list[str], model: str, dpi: float, workers: int, *, pages_in_flight: int = 64,
        cpus_per_actor: float = 0.0, raster_cpus: float = 0.25, out: str | None = None) -> dict:
    tmp = out or tempfile.mkdtemp(prefix="padoc-bench-pipeline-")
    try:
        before = raw_raster(paths, dpi, workers)
        pipe = noop_pipeline(paths, model, dpi, tmp, pages_in_flight=pages_in_flight,
                             cpus_per_actor=cpus_per_actor, raster_cpus=raster_cpus)
        after = raw_raster(paths, dpi, workers)
    finally:
        if out is None:
            shutil.rmtree(tmp, ignore_errors=True)
    raw = (before["pages_per_s"] + after["pages_per_s"]) / 2
    return {
        "pdfs": len(paths), "dpi": dpi, "workers": workers, "cpus": os.cpu_count(),
        "raw_raster": {"before": before, "after": after, "mean_pages_per_s": round(raw, 2)},
        "noop_pipeline": pipe,
        "ratio_wall": round(pipe["pages_per_s"] / raw, 3),
        "ratio_job": round(pipe["job_pages_per_s"] / raw, 3),
        "ratio_steady": round(pipe["steady_pages_per_s"] / raw, 3) if pipe["steady_pages_per_s"] else None,
    }


@dataclass(frozen=True, kw_only=True)
class PipelineBenchConfig:
    """Run the raster stage's work (render + zstd page encoding) in a plain process pool, then the whole batch
    job on a local Ray with the no-op engine, then the raw side again; print pages/s of both and the ratio
    (wall with local Ray start, and the job alone on the running cluster). The no-op actor stands for a GPU
    engine, so by default it reserves no CPU (--cpus-per-actor 0)."""

    input: str = knob(help="folder (searched recursively) or glob of PDFs")
    model: str = knob(help="checkpoint directory (only its protocol and tokenizer are used)")
    dpi: float = 144  #: resolution
    workers: int = knob(factory=_cores, help="raw-side processes", show=lambda v: "all cores")
    pages_in_flight: int = 64  #: pages in flight in the actor
    cpus_per_actor: float = 0.0  #: CPUs reserved by the no-op actor
    raster_cpus: float = knob(0.25, help="CPUs per raster task (as the batch job)")
    json: str | None = knob(None, metavar="OUT.json", help="also write the results here as JSON")


def main(cfg: PipelineBenchConfig) -> int:
    paths = pdf_paths(cfg.input)
    if not os.path.exists(os.path.join(cfg.model, "padoc_protocol.json")):
        raise UsageError(f"{cfg.model} is not a padoc-ray checkpoint (no padoc_protocol.json)")
    res = run([os.path.abspath(p) for p in paths], os.path.abspath(cfg.model), cfg.dpi, cfg.workers,
              pages_in_flight=cfg.pages_in_flight, cpus_per_actor=cfg.cpus_per_actor, raster_cpus=cfg.raster_cpus)
    raw, pipe = res["raw_raster"], res["noop_pipeline"]
    print(f"raw raster stage ({cfg.workers} processes): {raw['before']['pages_per_s']} / "
          f"{raw['after']['pages_per_s']} pages/s (before / after), mean {raw['mean_pages_per_s']}")
    print(f"no-op pipeline: {pipe['pages']} pages in {pipe['seconds']} s (Ray start {pipe['ray_init_s']} s): "
          f"{pipe['pages_per_s']} pages/s wall; the job alone (cluster up) {pipe['job_seconds']} s, "
          f"{pipe['job_pages_per_s']} pages/s")
    steady = f", {res['ratio_steady']:.0%} (steady: {pipe['steady_pages_per_s']} pages/s)" if res["ratio_steady"] \
        else ""
    print(f"pipeline / raw: {res['ratio_wall']:.0%} (wall), {res['ratio_job']:.0%} (job on a running cluster)"
          f"{steady}")
    write_json(cfg.json, res, announce=False)
    return 0
