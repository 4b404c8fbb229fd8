"""`padoc-ray bench fairness`: one tenant's one-page requests while another tenant's long job runs.

It starts ``padoc-ray serve --tenant-header`` (:class:`~padoc_ray.bench.soak.procs.ServeProcess`),
measures tenant B's sequential one-page ``/v1/parse`` latency on an idle service, then again while
tenant A's ``job_pages``-page job runs, and reports both P50/P95, their ratio (the target: P95
loaded within 2x of idle) and the job's progress during the probes (the job must still be running
at the last probe, or the figure says nothing). Teacher-forced with the vllm engine, so every
page's work is the same real length.
"""

from __future__ import annotations

import copy
import io
import json
import os
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass

from padoc_ray import status
from padoc_ray.knobs import knob

ENGINES = ("noop", "vllm")


@dataclass(frozen=True, kw_only=True)
class FairnessConfig:
    """Start `padoc-ray serve --tenant-header`, time tenant B's sequential one-page /v1/parse requests on the
    idle service, then while tenant A's --job-pages job runs; print P50/P95 of both, the loaded/idle P95 ratio
    (target: within 2x) and the job's progress during the probes."""

    engine: str = "noop"  #: "noop" (the service's own scheduling) or "vllm" (the tiny model, teacher-forced)
    model: str | None = None  #: checkpoint directory (None: models/tiny)
    job_pages: int = 2000  #: pages of tenant A's job (copies of memo.pdf's page)
    probes: int = 40  #: tenant B's one-page requests, idle and again loaded
    request_timeout_s: float = 300.0  #: client-side timeout of one request
    #: the service's --max-job-pages-in-flight (job pages at the engine at once); None: its default
    max_job_pages_in_flight: int | None = None
    #: the service's --max-job-pages-beside-interactive (job pages at the engine while interactive pages
    #: come); None: its default
    max_job_pages_beside_interactive: int | None = None
    json: str | None = knob(None, metavar="OUT.json", help="write the report here", required=True)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise ValueError(f"engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        if not 1 <= self.job_pages <= 5000 or self.probes < 5:
            raise ValueError("job_pages must be in 1..5000 (the service's max_job_pages) and probes >= 5")
        for name in ("max_job_pages_in_flight", "max_job_pages_beside_interactive"):
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1")


def _job_pdf(examples: str, pages: int) -> bytes:
    import pikepdf

    src = pikepdf.open(os.path.join(examples, "memo.pdf"))
    out = pikepdf.new()
    for _ in range(pages):
        out.pages.append(src.pages[0])
    buf = io.BytesIO()
    out.save(buf)
    return buf.getvalue()


def _truth(examples: str, pages: int, path: str) -> str:
    """The examples' truth plus memo.pdf's first page for every page of the job's document."""
    with open(os.path.join(examples, "ground_truth.json"), encoding="utf-8") as f:
        gt = json.load(f)
    memo = next(g for g in gt if g["page_info"]["source_pdf"] == "memo.pdf" and g["page_info"]["page_no"] == 0)
    for i in range(pages):
        g = copy.deepcopy(memo)
        g["page_info"].update(source_pdf="fair-job.pdf", page_no=i, image_path=f"fair-job_{i}.png")
        gt.append(g)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(gt, f)
    return path


def _quantiles(xs: list[float]) -> dict:
    q = statistics.quantiles(xs, n=20, method="inclusive")
    return {"n": len(xs), "p50_s": round(statistics.median(xs), 4), "p95_s": round(q[18], 4),
            "max_s": round(max(xs), 4)}


def run(cfg: FairnessConfig, root: str, log=print) -> dict:
    import requests

    from padoc_ray.bench.soak.procs import ServeProcess

    examples = os.path.join(root, "examples")
    model = cfg.model or os.path.join(root, "models", "tiny")
    with tempfile.TemporaryDirectory(prefix="padoc-fair-") as tmp:
        flags = ["--engine", cfg.engine, "--tenant-header"]
        if cfg.max_job_pages_in_flight is not None:
            flags += ["--max-job-pages-in-flight", str(cfg.max_job_pages_in_flight)]
        if cfg.max_job_pages_beside_interactive is not None:
            flags += ["--max-job-pages-beside-interactive", str(cfg.max_job_pages_beside_interactive)]
        if cfg.engine == "vllm":
            flags += ["--replay", _truth(examples, cfg.job_pages, os.path.join(tmp, "gt.json"))]
        svc = ServeProcess(model, flags)
        log(f"starting padoc-ray serve {' '.join(flags)}")
        svc.start()
        try:
            auth = {"Authorization": f"Bearer {svc.token}"}
            a, b = {**auth, "X-Padoc-Tenant": "tenant-a"}, {**auth, "X-Padoc-Tenant": "tenant-b"}
            with open(os.path.join(examples, "memo.pdf"), "rb") as f:
                memo = f.read()

            def probe() -> float:
                t = time.perf_counter()
                r = requests.post(f"{svc.url}/v1/parse", headers=b, files={"file": ("memo.pdf", memo)},
                                  timeout=cfg.request_timeout_s)
                if r.status_code != 200 or r.json()["status"] != status.DOC_OK:
                    raise RuntimeError(f"a probe got {r.status_code}: {r.text[:300]}")
                return time.perf_counter() - t

            for _ in range(3):  # warm-up
                probe()
            idle = [probe() for _ in range(cfg.probes)]
            log(f"idle: {_quantiles(idle)}")
            r = requests.post(f"{svc.url}/v1/jobs", headers=a, files={"file": ("fair-job.pdf",
                                                                               _job_pdf(examples, cfg.job_pages))},
                              timeout=cfg.request_timeout_s)
            if r.status_code != 202:
                raise RuntimeError(f"the job was refused: {r.status_code} {r.text[:300]}")
            job = r.json()["id"]

            def progress() -> dict:
                return requests.get(f"{svc.url}/v1/jobs/{job}", headers=a, timeout=60).json()

            while progress()["pages_done"] < 1:
                time.sleep(0.2)
            before, t0 = progress(), time.perf_counter()
            loaded = [probe() for _ in range(cfg.probes)]
            after, t1 = progress(), time.perf_counter()
            log(f"loaded: {_quantiles(loaded)}; job {before['pages_done']} -> {after['pages_done']} pages")
            requests.delete(f"{svc.url}/v1/jobs/{job}", headers=a, timeout=60)
        finally:
            stopped = svc.stop()
            svc.close()
    ratio = _quantiles(loaded)["p95_s"] / _quantiles(idle)["p95_s"]
    return {
        "config": asdict(cfg), "idle": _quantiles(idle), "loaded": _quantiles(loaded),
        "p95_loaded_over_idle": round(ratio, 3), "target_p95_ratio": 2.0,
        "job": {"pages_total": cfg.job_pages, "pages_done_at_first_probe": before["pages_done"],
                "pages_done_at_last_probe": after["pages_done"], "status_at_last_probe": after["status"],
                "pages_per_s_during_probes": round((after["pages_done"] - before["pages_done"]) / (t1 - t0), 3),
                "running_throughout": after["status"] == status.JOB_RUNNING and after["pages_done"] < cfg.job_pages},
        "server": stopped,
    }


def main(cfg: FairnessConfig) -> int:
    """Run it, write the report to ``cfg.json`` and print its headline figures."""
    from padoc_ray.bench import service_report

    report = service_report(cfg, run)
    print(json.dumps({k: report[k] for k in ("idle", "loaded", "p95_loaded_over_idle", "job")}, indent=2))
    return 0
