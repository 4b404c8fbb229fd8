"""Offline corpus re-annotation: several parses of a corpus -> agreement, consensus, difficulty.

The paper's data-curation loop. Inputs: the source PDFs or page images (``--source``), any number of
prediction sets, and optionally existing annotations (``--gt``, OmniDocBench format):

1. **Prediction sets.** padoc-ray's own parses, one batch run per ``--modes`` entry, written to
   ``OUTPUT/predictions/<mode>/`` (they are the batch job itself, so they resume: a rerun parses
   only what is missing), plus ``--compare NAME=[FORMAT:]PATH`` sets read by
   :mod:`padoc_ray.curation.importers` (other padoc-ray batch outputs, OmniDocBench JSON, MinerU
   ``content_list.json``, dots.ocr layout JSON). A ``--compare NAME=PATH`` whose PATH is a
   checkpoint padoc-ray can run (a local folder of a known family: a PaDoc checkpoint, or an
   HPD-Parsing one; ``NAME=model:PATH`` says so for any path, s3:// included) is another parser:
   the sources are parsed with it here (fork, the batch job's other settings) into
   ``OUTPUT/predictions/NAME/``, and the set is that output.
2. **Pages.** With ``--gt``, the ground-truth pages, matched to their sources by
   ``page_info.source_pdf`` + ``page_no`` when that PDF is among the sources, else by
   ``page_info.image_path`` (a one-page document). Without it, every page of every source file
   (page counts from the batch rows, else from the file). Prediction sets name documents by file
   name; a name without extension (MinerU, dots.ocr) matches the source with that stem.
3. **Agreement.** Every pair of prediction sets is compared on every page (and, with ``--gt``, the
   ground truth with each set and with the consensus) by :func:`padoc_ray.curation.agreement.compare_pages`
   (PageIoU layout agreement, region matching, content distance).
4. **Consensus and difficulty.** :func:`padoc_ray.curation.consensus.build_consensus` keeps the regions
   at least ``min_agree`` sets agree on (default: a strict majority). A page's difficulty is the
   mean over its comparisons of ``((1 - layout IoU) + content distance) / 2``.

Outputs: ``OUTPUT/consensus/consensus.json`` (OmniDocBench format: what ``train --gt`` and ``eval``
read; pages without a consensus are left out), ``OUTPUT/agreement/agreement.parquet`` (one row
per page, ``kind = "page"``, and one per compared pair, ``kind = "pair"``) and
``OUTPUT/reannotate_summary.json``. The comparison is cheap and deterministic, so it is recomputed
from the saved predictions on every run and each file is replaced atomically. A page whose source
is missing, whose annotation is malformed, or that no set parsed gets a row with the reason; a
region an importer cannot read is counted in the summary; the run goes on.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass, field

import pyarrow as pa

from padoc_ray.curation.agreement import AgreementConfig, compare_pages, difficulty
from padoc_ray.curation.consensus import build_consensus, default_min_agree
from padoc_ray.groundtruth import GroundTruthError, parse_truth, source_for
from padoc_ray.output import rows
from padoc_ray.pipeline.config import BatchConfig
from padoc_ray.protocol.page import Page, page_to_omnidocbench
from padoc_ray.status import OK
from padoc_ray.storage import filesystem, is_s3, join, read_bytes, StorageConfig, write_bytes
from padoc_ray.listing import list_inputs

logger = logging.getLogger(__name__)

AGREEMENT_SCHEMA = pa.schema([
    ("run_id", pa.string()),
    ("kind", pa.string()),  # page | pair
    ("image_path", pa.string()),  # the page's name: the ground truth's page_info.image_path, or consensus.json's
    ("source_uri", pa.string()),  # the file parsed for this page (null when not found)
    ("page_index", pa.int32()),
    # page rows
    ("status", pa.string()),  # ok | source_missing | invalid_ground_truth | no_prediction
    ("reason", pa.string()),
    ("prediction_status", pa.map_(pa.string(), pa.string())),  # set name -> page status (or "missing")
    ("parsed", pa.int32()),  # prediction sets with a parse of this page
    ("consensus", pa.bool_()),  # a consensus annotation exists (the page is in consensus.json)
    ("consensus_reason", pa.string()),  # why not
    ("consensus_regions", pa.int32()),
    ("coverage", pa.float32()),  # parsed regions that ended in the consensus / all parsed regions
    ("unanimous", pa.bool_()),  # every comparison of the page agrees (null without comparisons)
    ("difficulty", pa.float32()),  # mean over comparisons of ((1 - layout IoU) + content distance) / 2
    # pair rows: ref vs hyp ("gt", a set name, or "consensus")
    ("ref", pa.string()), ("hyp", pa.string()),
    ("layout_iou", pa.float32()), ("layout_precision", pa.float32()), ("layout_recall", pa.float32()),
    ("ref_regions", pa.int32()), ("hyp_regions", pa.int32()), ("matched", pa.int32()),
    ("category_agreement", pa.float32()), ("content_edit", pa.float32()), ("content_pairs", pa.int32()),
    ("agree", pa.bool_()),  # layout IoU and content distance within the consensus thresholds
])
PAGE_FIELDS = ("status", "reason", "prediction_status", "parsed", "consensus", "consensus_reason",
               "consensus_regions", "coverage", "unanimous", "difficulty")
PAIR_FIELDS = ("ref", "hyp", "layout_iou", "layout_precision", "layout_recall", "ref_regions", "hyp_regions",
               "matched", "category_agreement", "content_edit", "content_pairs", "agree")


#: ``--compare NAME=model:PATH``: PATH is a checkpoint to parse the sources with (any path, s3:// too)
MODEL_PREFIX = "model:"


def _format_and_path(spec: str | tuple[str | None, str]) -> tuple[str | None, str]:
    """A ``compare`` entry as (format or None, path)."""
    return spec if isinstance(spec, tuple) else (None, spec)


def checkpoint_family(path: str) -> str | None:
    """The family of the checkpoint in the local folder ``path`` (None: not one padoc-ray can run, or
    not local): a ``--compare`` set naming a checkpoint is parsed here."""
    if is_s3(path) or not os.path.isfile(os.path.join(path, "config.json")):
        return None
    from padoc_ray.host import family_of

    return family_of(path)


@dataclass(frozen=True, kw_only=True)
class ReannotateConfig:
    source: str  #: folder / s3 prefix holding the PDFs or page images
    output: str  #: holds predictions/<mode>/, consensus/, agreement/, reannotate_summary.json
    batch: BatchConfig  #: engine, render and actor settings of the parsing runs (input/output/mode are set here)
    gt: str | None = None  #: OmniDocBench-format annotations to score against (local or s3://); optional
    modes: tuple[str, ...] = ("fork",)  #: one prediction set per mode parsed here; () parses nothing
    #: more prediction sets: name -> path, or name -> (format or None to detect, path)
    compare: dict[str, str | tuple[str | None, str]] = field(default_factory=dict)
    min_agree: int | None = None  #: sets that must agree on a region (None: a strict majority of all sets)
    agreement: AgreementConfig = field(default_factory=AgreementConfig)
    dots_dpi: int = 200  #: the dpi dots.ocr rendered PDF pages at (its default), for its pixel boxes

    def __post_init__(self) -> None:
        from padoc_ray.curation.importers import FORMATS

        for name, spec in self.compare.items():
            if _format_and_path(spec) == (None, MODEL_PREFIX):
                raise ValueError(f"--compare {name}=model:PATH needs the checkpoint's PATH")
        if not self.modes and not self.compare:
            raise ValueError("nothing to compare: give at least one mode or one --compare prediction set")
        for m in self.modes:
            if m not in ("fork", "sequential"):
                raise ValueError(f"mode must be fork or sequential (or none alone), got {m!r}")
        if len(set(self.modes)) != len(self.modes):
            raise ValueError("modes must be distinct")
        clash = set(self.compare) & (set(self.modes) | {"gt", "consensus"})
        if clash:
            raise ValueError(f"--compare names clash with mode names, 'gt' or 'consensus': {sorted(clash)}")
        for name, spec in self.compare.items():
            fmt = spec[0] if isinstance(spec, tuple) else None
            if fmt is not None and fmt not in FORMATS:
                raise ValueError(f"--compare {name}: unknown format {fmt!r}; one of {', '.join(FORMATS)}")
        n = len(self.modes) + len(self.compare)
        if self.min_agree is not None and not 1 <= self.min_agree <= n:
            raise ValueError(f"--min-agree must be between 1 and the number of prediction sets ({n}), "
                             f"got {self.min_agree}")

    @property
    def set_names(self) -> list[str]:
        return [*self.modes, *self.compare]

    @property
    def models(self) -> dict[str, str]:
        """The ``compare`` sets that are checkpoints to parse with here: name -> checkpoint (local or s3://)."""
        out = {}
        for name, spec in self.compare.items():
            fmt, path = _format_and_path(spec)
            if fmt is not None:
                continue
            if path.startswith(MODEL_PREFIX):
                out[name] = path[len(MODEL_PREFIX):]
            elif checkpoint_family(path) is not None:
                out[name] = path
        return out

    @property
    def k(self) -> int:
        return self.min_agree or default_min_agree(len(self.set_names))


@dataclass
class PageSlot:
    """One page to compare: its name, source file and page index, and the ground truth if any."""

    image_path: str
    source_uri: str | None
    page_index: int
    gt: Page | None = None
    problem: tuple[str, str] | None = None  # (status, reason)



class Sources:
    """The source files by name, and their pages' sizes (read once, on demand)."""

    def __init__(self, spec: str, storage: StorageConfig):
        self.storage = storage
        self.by_name = {os.path.basename(uri): uri for uri, _ in list_inputs(spec, storage)}
        self.by_stem: dict[str, str] = {}
        for name in sorted(self.by_name, key=lambda n: (not n.lower().endswith(".pdf"), n)):  # a PDF wins a stem
            self.by_stem.setdefault(os.path.splitext(name)[0], name)
        self._sizes: dict[str, list[tuple[float, float]] | None] = {}

    def resolve(self, name: str) -> str | None:
        """A prediction set's document name -> the source's file name (None: not among the sources)."""
        if name in self.by_name:
            return name
        return self.by_stem.get(name) or self.by_stem.get(os.path.splitext(name)[0])

    def page_sizes(self, name: str) -> list[tuple[float, float]] | None:
        """(width, height) of every page in PDF points (images: pixels); None when unreadable."""
        if name not in self._sizes:
            self._sizes[name] = None
            uri = self.by_name.get(name)
            if uri is not None:
                from padoc_ray.pdf import ImageDocument, PdfError, open_document

                try:
                    doc = open_document(read_bytes(uri, self.storage))
                except (PdfError, OSError, ValueError):
                    return None
                try:
                    if isinstance(doc, ImageDocument):
                        self._sizes[name] = [doc.size] * len(doc)
                    else:
                        self._sizes[name] = [tuple(doc[i].get_size()) for i in range(len(doc))]
                finally:
                    doc.close()
        return self._sizes[name]

    def pixel_size(self, doc: str, page: int, dpi: int) -> tuple[float, float] | None:
        """A page's size in pixels when rendered at ``dpi`` (images: their own size)."""
        name = self.resolve(doc)
        sizes = self.page_sizes(name) if name else None
        if not sizes or not 0 <= page < len(sizes):
            return None
        w, h = sizes[page]
        if name.lower().endswith(".pdf"):
            return w * dpi / 72.0, h * dpi / 72.0
        return w, h


def load_ground_truth(cfg: ReannotateConfig, sources: Sources | None = None) -> list[PageSlot]:
    """Ground-truth pages with their source files (:mod:`padoc_ray.groundtruth`'s one matching
    rule); malformed or unplaceable pages carry a problem."""
    sources = sources or Sources(cfg.source, cfg.batch.storage)
    try:
        entries = parse_truth(read_bytes(cfg.gt, cfg.batch.storage), cfg.gt)
    except GroundTruthError as e:
        raise ValueError(str(e)) from None
    out = []
    for t in entries:
        if t.page is None:
            out.append(PageSlot(t.name, None, -1, None, ("invalid_ground_truth", t.error)))
            continue
        found = source_for(t.name, t.source, sources.by_name)
        if found is not None:
            out.append(PageSlot(t.name, found[0], found[1], t.page))
        else:
            want = " or ".join(x for x in (t.source[0] if t.source else "", t.name) if x)
            out.append(PageSlot(t.name, None, -1, t.page, ("source_missing", f"{want} not found under {cfg.source}")))
    return out


def page_name(source_name: str, page_index: int) -> str:
    """consensus.json's ``image_path`` of a page without ground truth: the image itself, or
    ``<pdf stem>_page<N>.png`` (``source_pdf`` + ``page_no`` say where it really is)."""
    if not source_name.lower().endswith(".pdf"):
        return source_name
    return f"{os.path.splitext(source_name)[0]}_page{page_index}.png"


def source_pages(sources: Sources, sets: dict) -> list[PageSlot]:
    """Without ground truth: every page of every source file (page counts from the prediction sets
    that know them, else from the file; a file that cannot be opened is one page with a reason)."""
    counts: dict[str, int] = {}
    for ps in sets.values():
        for doc, n in ps.documents.items():
            name = sources.resolve(doc)
            if name and n is not None:
                counts.setdefault(name, n)
    out = []
    for name, uri in sorted(sources.by_name.items()):
        n = counts.get(name)
        if n is None:
            sizes = sources.page_sizes(name)
            if sizes is None:
                out.append(PageSlot(name, uri, 0, None, ("source_unreadable", f"{name} cannot be opened as a PDF "
                                                                                 f"or page image")))
                continue
            n = len(sizes)
        out.extend(PageSlot(page_name(name, i), uri, i) for i in range(n))
    return out


def _pages_by_source(ps, sources: Sources) -> dict[tuple[str, int], tuple[str, Page | None]]:
    """A prediction set's pages keyed by (source file name, page index); documents that are not
    among the sources are left out (counted by the caller)."""
    out, known = {}, {}
    for (doc, i), val in ps.pages.items():
        name = known.setdefault(doc, sources.resolve(doc))
        if name is not None:
            out[(name, i)] = val
    if ps.format == "mineru":  # MinerU lists blocks only: a page of a document it read without one is blank
        for doc in ps.documents:
            name = known.setdefault(doc, sources.resolve(doc))
            sizes = sources.page_sizes(name) if name else None
            for i in range(len(sizes or ())):
                out.setdefault((name, i), ("ok", Page(width=0, height=0, page_no=i)))
    missing = sum(v is None for v in known.values())
    if missing:
        ps.counts["documents_not_in_source"] = missing
    return out


def _pair_row(base: dict, ref: str, hyp: str, a) -> dict:
    return {**base, "kind": "pair", **{k: None for k in PAGE_FIELDS}, "ref": ref, "hyp": hyp,
            **{k: v for k, v in a.to_dict().items() if k != "consensus"}, "agree": a.consensus}


def compare(slots: list[PageSlot], sets: dict[str, dict], cfg: AgreementConfig, run_id: str, *,
            min_agree: int) -> tuple[list[dict], list[Page]]:
    """Agreement rows (page rows, each followed by its pair rows) and the consensus pages."""
    names = list(sets)
    table, consensus_pages = [], []
    for g in slots:
        base = {"run_id": run_id, "image_path": g.image_path, "source_uri": g.source_uri,
                "page_index": g.page_index}
        row = {**base, "kind": "page", "status": OK, "reason": None, "prediction_status": {}, "parsed": 0,
               "consensus": None, "consensus_reason": None, "consensus_regions": None, "coverage": None,
               "unanimous": None, "difficulty": None, **{k: None for k in PAIR_FIELDS}}
        if g.problem:
            row["status"], row["reason"] = g.problem
            table.append(row)
            continue
        key = (os.path.basename(g.source_uri), g.page_index)
        preds = {}
        for n in names:
            status, page = sets[n].get(key, ("missing", None))
            row["prediction_status"][n] = status
            if page is not None:
                preds[n] = page
        row["parsed"] = len(preds)
        pages = {"gt": g.gt, **preds} if g.gt is not None else dict(preds)
        order = list(pages)
        pairs = [(order[i], order[j]) for i in range(len(order)) for j in range(i + 1, len(order))]
        agreements = [(r, h, compare_pages(pages[r], pages[h], cfg)) for r, h in pairs]
        if not preds:
            row["status"], row["reason"] = "no_prediction", "no prediction set has a parse of this page"
        if agreements:
            row["unanimous"] = all(a.consensus for _, _, a in agreements)
            row["difficulty"] = difficulty(a for _, _, a in agreements)
        template = next((p for p in [g.gt, *preds.values()] if p is not None and p.width > 0), None)
        extra = {}
        if g.source_uri and g.source_uri.lower().endswith(".pdf"):
            extra = {"source_pdf": os.path.basename(g.source_uri)}
        shell = Page(width=template.width if template else 0, height=template.height if template else 0,
                     page_no=g.page_index, image_path=g.image_path, extra=extra)
        c = build_consensus(preds, min_agree=min_agree, match_iou=cfg.match_iou, template=shell)
        row["consensus"] = c.page is not None
        row["consensus_reason"] = c.reason
        if c.page is not None:
            row["consensus_regions"], row["coverage"] = len(c.page.regions), c.coverage
            consensus_pages.append(c.page)
            if g.gt is not None:
                agreements.append(("gt", "consensus", compare_pages(g.gt, c.page, cfg)))
        table.append(row)
        table.extend(_pair_row(base, r, h, a) for r, h, a in agreements)
    return table, consensus_pages


def _page_sizes_for(pages: list[Page], slots: dict[str, PageSlot], sources: Sources) -> list[Page]:
    """consensus.json needs a pixel size; a page no set gave one gets its source's (PDF points at 72 dpi)."""
    out = []
    for p in pages:
        if p.width <= 0 or p.height <= 0:
            s = slots[p.image_path]
            size = sources.pixel_size(os.path.basename(s.source_uri), s.page_index, 72) if s.source_uri else None
            w, h = size or (1000, 1000)
            p = dataclasses.replace(p, width=max(1, round(w)), height=max(1, round(h)))
        out.append(p)
    return out


def _write_atomic(uri_dir: str, name: str, data_writer, cfg: ReannotateConfig) -> str:
    fs, apath = filesystem(uri_dir, cfg.batch.storage)
    if not is_s3(uri_dir):
        os.makedirs(apath, exist_ok=True)
    tmp = f"{apath}/{name}.{cfg.batch.run_id}.tmp"  # unique: never shared with another run
    data_writer(tmp, fs)
    fs.move(tmp, f"{apath}/{name}")
    return join(uri_dir, name)


def _means(table: pa.Table, ref: str, hyp: str) -> dict | None:
    import pyarrow.compute as pc

    t = table.filter(pc.and_(pc.equal(table.column("ref"), ref), pc.equal(table.column("hyp"), hyp)))
    if not t.num_rows:
        return None
    return {"pages": t.num_rows, "layout_iou": round(pc.mean(t.column("layout_iou")).as_py(), 4),
            "content_edit": round(pc.mean(t.column("content_edit")).as_py(), 4)}


def _check_parsers(parsers: list[tuple[str, str, str]], host) -> None:
    """Refuse, before anything runs, a parse a checkpoint's family cannot do (an HPD-Parsing checkpoint
    in sequential mode, or with --constrain-layout): ValueError naming the set."""
    from types import SimpleNamespace

    from padoc_ray.host import check_family
    from padoc_ray.protocol import ProtocolError

    for name, model, mode in parsers:
        family = checkpoint_family(model)
        if family is None:
            continue  # s3://, or not readable here: the engine hosts check it once fetched
        try:
            check_family(SimpleNamespace(family=family), dataclasses.replace(host, mode=mode))
        except ProtocolError as e:
            raise ValueError(f"prediction set {name} ({model}): {e}") from None


def run_reannotate(cfg: ReannotateConfig, *, log=print, start_ray=None) -> dict:
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from padoc_ray.curation.importers import load_set
    from padoc_ray.pipeline.job import run_batch

    t0 = time.perf_counter()
    sources = Sources(cfg.source, cfg.batch.storage)
    slots = load_ground_truth(cfg, sources) if cfg.gt else None
    log(f"re-annotation: {len(sources.by_name)} source files"
        + (f", {len(slots)} ground-truth pages" if slots is not None else ", no ground truth")
        + f"; prediction sets: {', '.join(cfg.set_names)}; consensus needs {cfg.k} of {len(cfg.set_names)}")
    runs = {}
    models = cfg.models
    # (set name, checkpoint, mode): the modes with --model, then each --compare checkpoint (fork)
    parsers = [(m, cfg.batch.model, m) for m in cfg.modes] + [(n, path, "fork") for n, path in models.items()]
    _check_parsers(parsers, cfg.batch.engines.host)
    parse = sorted({s.source_uri for s in slots if s.source_uri}) if slots is not None else sorted(sources.by_name.values())
    if parse and parsers:
        manifest = join(cfg.output, "inputs.txt")
        write_bytes(manifest, ("\n".join(parse) + "\n").encode(), cfg.batch.storage)
        for name, model, m in parsers:
            b = cfg.batch
            bc = dataclasses.replace(b, model=model, input=manifest, output=join(cfg.output, "predictions", name),
                                     run_id=f"{b.run_id}-{name}",
                                     engines=dataclasses.replace(b.engines, host=dataclasses.replace(b.engines.host,
                                                                                                     mode=m)),
                                     inputs=dataclasses.replace(b.inputs, manifest_allow=(cfg.source,)))
            s = run_batch(bc, log=log, start_ray=start_ray)
            runs[name] = {k: s[k] for k in ("pages_written", "page_status", "all_inputs_accounted", "wall_s")}
            runs[name].update(model=model, mode=m)
    loaded = {m: load_set(m, join(cfg.output, "predictions", m), "padoc", cfg.batch.storage) for m in cfg.modes}
    for name, spec in cfg.compare.items():
        if name in models:  # parsed here, like the modes
            loaded[name] = load_set(name, join(cfg.output, "predictions", name), "padoc", cfg.batch.storage)
            continue
        fmt, path = _format_and_path(spec)
        loaded[name] = load_set(name, path, fmt, cfg.batch.storage,
                                page_size=lambda d, i, _dpi: sources.pixel_size(d, i, cfg.dots_dpi))
    if slots is None:
        slots = source_pages(sources, loaded)
    sets = {n: _pages_by_source(ps, sources) for n, ps in loaded.items()}
    table_rows, consensus = compare(slots, sets, cfg.agreement, cfg.batch.run_id, min_agree=cfg.k)
    table = pa.Table.from_pylist(table_rows, schema=AGREEMENT_SCHEMA)
    consensus = _page_sizes_for(consensus, {s.image_path: s for s in slots}, sources)
    cjson = json.dumps([page_to_omnidocbench(p) for p in consensus], ensure_ascii=False, indent=1).encode()

    def put_json(tmp, fs):
        with fs.open_output_stream(tmp) as f:
            f.write(cjson)

    cpath = _write_atomic(join(cfg.output, "consensus"), "consensus.json", put_json, cfg)
    apath = _write_atomic(join(cfg.output, "agreement"), "agreement.parquet",
                          lambda tmp, fs: pq.write_table(table, tmp, filesystem=fs), cfg)
    pages_t = table.filter(pc.equal(table.column("kind"), "page"))
    compared = pages_t.filter(pc.is_valid(pages_t.column("unanimous")))
    diff = compared.column("difficulty")
    pairs = sorted({(r["ref"], r["hyp"]) for r in table.filter(pc.equal(table.column("kind"), "pair"))
                   .select(["ref", "hyp"]).to_pylist()})
    summary = {
        "run_id": cfg.batch.run_id, "gt": cfg.gt, "source": cfg.source, "output": cfg.output,
        "prediction_sets": {n: {"format": ps.format, "path": ps.path, "pages": len(ps.pages),
                                "documents": len(ps.documents), "skipped": dict(ps.counts), "notes": ps.notes,
                                **({"model": runs[n]["model"], "mode": runs[n]["mode"]} if n in runs else {})}
                            for n, ps in loaded.items()},
        "runs": runs, "min_agree": cfg.k,
        "pages": pages_t.num_rows, "page_status": rows.status_counts(pages_t),
        "pages_compared": compared.num_rows,
        "consensus_pages": len(consensus),
        "unanimous_pages": int(pc.sum(compared.column("unanimous").cast(pa.int32())).as_py() or 0),
        "mean_difficulty": round(pc.mean(diff).as_py(), 4) if compared.num_rows else None,
        "pairs": {f"{r}~{h}": _means(table, r, h) for r, h in pairs},
        "consensus_json": cpath, "agreement_parquet": apath,
        "agreement_config": dataclasses.asdict(cfg.agreement),
        "wall_s": round(time.perf_counter() - t0, 3),
    }
    write_bytes(join(cfg.output, "reannotate_summary.json"), json.dumps(summary, indent=2).encode(), cfg.batch.storage)
    log(f"re-annotation done: {summary['pages_compared']}/{summary['pages']} pages compared, "
        f"{summary['consensus_pages']} with a consensus ({summary['unanimous_pages']} unanimous), mean difficulty "
        f"{summary['mean_difficulty']}; status {summary['page_status']}")
    return summary
