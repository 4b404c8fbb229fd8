"""Offline corpus re-annotation: parse an annotated corpus again and measure agreement.

The paper's data-curation loop. For an OmniDocBench-format corpus (ground truth + the page images
or PDFs it was made from):

1. every source file the ground truth names becomes an input of the batch job, run once per
   prediction set (``--modes fork,sequential`` gives two; ``--compare DIR`` adds the pages of an
   existing batch output, e.g. another model's) into ``OUTPUT/predictions/<name>/``. Those runs
   are the batch job itself, so they resume: a rerun parses only what is missing;
2. every ground-truth page is compared with each prediction set, and the first prediction set with
   each other one (:mod:`padoc_ray.eval.agreement`: PageIoU layout agreement, region matching,
   content edit distance, consensus flag), and gets a difficulty score;
3. ``OUTPUT/agreement/agreement.parquet`` holds one row per ground-truth page and
   ``OUTPUT/reannotate_summary.json`` the totals. The comparison is cheap and deterministic, so it
   is recomputed from the saved predictions on every run and replaced atomically.

Ground-truth pages are matched to sources as the rest of padoc-ray does: ``page_info.source_pdf`` +
``page_no`` when that PDF is among the sources, else ``page_info.image_path`` (a one-page document).
A page whose source is missing, whose annotation is malformed, or whose prediction is absent gets
a row with the reason; the run goes on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field

import pyarrow as pa

from padoc_ray.eval.agreement import AgreementConfig, PageAgreement, compare_pages, difficulty
from padoc_ray.pipeline import rows
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.pipeline.storage import StorageConfig, filesystem, is_s3, join, list_inputs, read_bytes, write_bytes
from padoc_ray.protocol.page import Box, Page, PageFormatError, Region, page_from_omnidocbench

logger = logging.getLogger(__name__)

COMPARISON_TYPE = pa.struct([
    ("ref", pa.string()), ("hyp", pa.string()),
    ("layout_iou", pa.float32()), ("layout_precision", pa.float32()), ("layout_recall", pa.float32()),
    ("ref_regions", pa.int32()), ("hyp_regions", pa.int32()), ("matched", pa.int32()),
    ("category_agreement", pa.float32()), ("content_edit", pa.float32()), ("content_pairs", pa.int32()),
    ("consensus", pa.bool_()),
])

AGREEMENT_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("image_path", pa.string()),  # the ground truth's page_info.image_path (the page's name)
    ("source_uri", pa.string()),  # the file parsed for this page (null when not found)
    ("page_index", pa.int32()),
    ("status", pa.string()),  # ok | source_missing | invalid_ground_truth | no_prediction
    ("reason", pa.string()),
    ("prediction_status", pa.map_(pa.string(), pa.string())),  # set name -> page row status (or "missing")
    ("comparisons", pa.list_(COMPARISON_TYPE)),
    ("consensus", pa.bool_()),  # every comparison agrees (null without comparisons)
    ("difficulty", pa.float32()),  # mean over comparisons of ((1 - layout IoU) + content distance) / 2
])


@dataclass(frozen=True, kw_only=True)
class ReannotateConfig:
    gt: str  #: OmniDocBench-format ground truth (local or s3://)
    source: str  #: folder / s3 prefix holding the PDFs or page images the ground truth names
    output: str  #: holds predictions/<name>/, agreement/, reannotate_summary.json
    batch: BatchConfig  #: engine, render and actor settings of the parsing runs (input/output/mode are set here)
    modes: tuple[str, ...] = ("fork",)  #: one prediction set per mode; the first is the reference among them
    compare: dict[str, str] = field(default_factory=dict)  #: extra prediction sets: name -> batch output dir
    agreement: AgreementConfig = field(default_factory=AgreementConfig)

    def __post_init__(self) -> None:
        if not self.modes and not self.compare:
            raise ValueError("nothing to compare: give at least one mode or one --compare output")
        for m in self.modes:
            if m not in ("fork", "sequential"):
                raise ValueError(f"mode must be fork or sequential, got {m!r}")
        if len(set(self.modes)) != len(self.modes):
            raise ValueError("modes must be distinct")
        clash = set(self.compare) & (set(self.modes) | {"gt"})
        if clash:
            raise ValueError(f"--compare names clash with mode names or 'gt': {sorted(clash)}")


@dataclass
class GtPage:
    image_path: str
    page: Page | None
    source_uri: str | None
    page_index: int
    problem: tuple[str, str] | None = None  # (status, reason)


def load_ground_truth(cfg: ReannotateConfig) -> list[GtPage]:
    """Ground-truth pages with their source files; malformed or unplaceable pages carry a problem."""
    objs = json.loads(read_bytes(cfg.gt, cfg.batch.storage).decode("utf-8"))
    if not isinstance(objs, list):
        raise ValueError(f"{cfg.gt}: expected a JSON list of pages (OmniDocBench format)")
    files = {os.path.basename(uri): uri for uri, _ in list_inputs(cfg.source, cfg.batch.storage)}
    out = []
    for n, o in enumerate(objs):
        info = o.get("page_info") if isinstance(o, dict) else None
        name = str((info or {}).get("image_path") or f"<page {n}>")
        try:
            page = page_from_omnidocbench(o)
        except PageFormatError as e:
            out.append(GtPage(name, None, None, -1, ("invalid_ground_truth", str(e))))
            continue
        pdf = os.path.basename(str(info.get("source_pdf") or ""))
        img = os.path.basename(name)
        if pdf and pdf in files:
            out.append(GtPage(name, page, files[pdf], int(info.get("page_no") or 0)))
        elif img in files:
            out.append(GtPage(name, page, files[img], 0))
        else:
            want = " or ".join(x for x in (pdf, img) if x)
            out.append(GtPage(name, page, None, -1, ("source_missing", f"{want} not found under {cfg.source}")))
    return out


def prediction_pages(output: str, storage: StorageConfig) -> dict[tuple[str, int], tuple[str, Page | None]]:
    """(source file name, page_index) -> (status, page) from a batch output's page rows."""
    from padoc_ray.pipeline.job import read_pages

    t = read_pages(join(output, "pages"), storage, columns=["source_uri", "page_index", "status", "image_width",
                                                        "image_height", "regions", "processed_at"])
    out: dict[tuple[str, int], tuple[str, Page | None]] = {}
    for r in sorted(t.to_pylist(), key=lambda r: r["processed_at"]):  # the newest row wins
        if r["page_index"] < 0:
            continue
        regions = []
        for k, reg in enumerate(r["regions"] or []):
            b = reg.get("bbox") or [0, 0, 0, 0]
            regions.append(Region(category=reg["category"], box=Box(*map(float, b)), content=reg.get("content"),
                                  content_format=reg.get("content_format") or "text", order=reg.get("order", k)))
        page = Page(width=r["image_width"] or 0, height=r["image_height"] or 0, regions=tuple(regions),
                    page_no=r["page_index"]) if r["status"] is not None else None
        out[(os.path.basename(r["source_uri"]), r["page_index"])] = (r["status"], page)
    return out


def _comparison(ref: str, hyp: str, a: PageAgreement) -> dict:
    return {"ref": ref, "hyp": hyp, **a.to_dict()}


def compare(gt_pages: list[GtPage], sets: dict[str, dict], cfg: AgreementConfig, run_id: str) -> list[dict]:
    names = list(sets)
    out = []
    for g in gt_pages:
        row = {"run_id": run_id, "image_path": g.image_path, "source_uri": g.source_uri, "page_index": g.page_index,
               "status": "ok", "reason": None, "prediction_status": {}, "comparisons": [], "consensus": None,
               "difficulty": None}
        if g.problem:
            row["status"], row["reason"] = g.problem
            out.append(row)
            continue
        key = (os.path.basename(g.source_uri), g.page_index)
        preds = {}
        for n in names:
            status, page = sets[n].get(key, ("missing", None))
            row["prediction_status"][n] = status
            if page is not None:
                preds[n] = page
        pairs = [("gt", n) for n in preds]
        if names[0] in preds:
            pairs += [(names[0], n) for n in names[1:] if n in preds]
        pages = {"gt": g.page, **preds}
        agreements = [(r, h, compare_pages(pages[r], pages[h], cfg)) for r, h in pairs]
        if not preds:
            row["status"], row["reason"] = "no_prediction", "no prediction set has a parse of this page"
        row["comparisons"] = [_comparison(r, h, a) for r, h, a in agreements]
        if agreements:
            row["consensus"] = all(a.consensus for _, _, a in agreements)
            row["difficulty"] = difficulty(a for _, _, a in agreements)
        out.append(row)
    return out


def run_reannotate(cfg: ReannotateConfig, *, log=print, start_ray=None) -> dict:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from padoc_ray.pipeline.job import run_batch

    t0 = time.perf_counter()
    gt_pages = load_ground_truth(cfg)
    sources = sorted({g.source_uri for g in gt_pages if g.source_uri})
    log(f"re-annotation: {len(gt_pages)} ground-truth pages, {len(sources)} source files, "
        f"prediction sets: {', '.join([*cfg.modes, *cfg.compare]) or '-'}")
    runs = {}
    if sources and cfg.modes:
        manifest = join(cfg.output, "inputs.txt")
        write_bytes(manifest, ("\n".join(sources) + "\n").encode(), cfg.batch.storage)
        for m in cfg.modes:
            bc = dataclasses.replace(cfg.batch, input=manifest, output=join(cfg.output, "predictions", m), mode=m,
                                     run_id=f"{cfg.batch.run_id}-{m}", manifest_allow=(cfg.source,))
            s = run_batch(bc, log=log, start_ray=start_ray)
            runs[m] = {k: s[k] for k in ("pages_written", "page_status", "all_inputs_accounted", "wall_s")}
    sets = {m: prediction_pages(join(cfg.output, "predictions", m), cfg.batch.storage) for m in cfg.modes}
    for name, out_dir in cfg.compare.items():
        sets[name] = prediction_pages(out_dir, cfg.batch.storage)
    table = pa.Table.from_pylist(compare(gt_pages, sets, cfg.agreement, cfg.batch.run_id), schema=AGREEMENT_SCHEMA)
    fs, apath = filesystem(join(cfg.output, "agreement"), cfg.batch.storage)
    if not is_s3(cfg.output):
        os.makedirs(apath, exist_ok=True)
    tmp = f"{apath}/agreement.parquet.{cfg.batch.run_id}.tmp"  # unique: never shared with another run
    pq.write_table(table, tmp, filesystem=fs)
    fs.move(tmp, apath + "/agreement.parquet")
    compared = table.filter(pc.is_valid(table.column("consensus")))
    diff = compared.column("difficulty")
    summary = {
        "run_id": cfg.batch.run_id, "gt": cfg.gt, "source": cfg.source, "output": cfg.output,
        "prediction_sets": [*cfg.modes, *cfg.compare], "runs": runs,
        "pages": table.num_rows, "page_status": rows.status_counts(table),
        "pages_compared": compared.num_rows,
        "consensus_pages": int(pc.sum(compared.column("consensus").cast(pa.int32())).as_py() or 0),
        "mean_difficulty": round(pc.mean(diff).as_py(), 4) if compared.num_rows else None,
        "agreement_config": dataclasses.asdict(cfg.agreement),
        "wall_s": round(time.perf_counter() - t0, 3),
    }
    write_bytes(join(cfg.output, "reannotate_summary.json"), json.dumps(summary, indent=2).encode(), cfg.batch.storage)
    log(f"re-annotation done: {summary['pages_compared']}/{summary['pages']} pages compared, "
        f"{summary['consensus_pages']} in consensus, mean difficulty {summary['mean_difficulty']}; "
        f"status {summary['page_status']}")
    return summary
