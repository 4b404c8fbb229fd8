"""``parse-page`` (one local engine, no Ray), ``demo`` and ``parse`` (the batch job)."""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys

from padoc_ray.cli.common import DEFAULT_MODEL, EXAMPLES_DIR, add_command, die
from padoc_ray.cli.flags import add_fields, add_mode, add_render, add_scheduler_flags, from_args, scheduler_from_args
from padoc_ray import status

_scheduler_cfg = scheduler_from_args  # the name tests/unit/cli/test_constrain_layout_flag.py imports


def _add_generation_args(p: argparse.ArgumentParser) -> None:
    add_mode(p)
    add_scheduler_flags(p)
    add_render(p)


def _add_render_limits(p: argparse.ArgumentParser) -> None:
    """The batch job's caps on one input and its renderer's limits (``--doc-page-limit``,
    ``--render-timeout``, ``--no-render-isolation``, ...), from the same config fields."""
    from padoc_ray.raster import RendererConfig
    from padoc_ray.raster.document import InputLimits

    g = p.add_argument_group("rendering (the batch job's caps and renderer limits)")
    add_fields(g, InputLimits, ("max_doc_pages", "max_image_frames", "max_file_bytes"))
    add_fields(g, RendererConfig, ("page_timeout_s", "doc_timeout_s", "page_budget_s", "memory_limit_mb", "isolate"),
               helps={"isolate": "render in this command's own process: no crash isolation and no time-outs (a "
                                 "renderer crash then ends the command)"})
    add_render(g, names=("max_page_draws",))


def _page_cap_message(n: int, count: int, cap: int) -> str:
    """parse-page's ``too_many_pages`` message (the batch job's names its own flags)."""
    return (f"{n} of its {count} pages selected, over the limit of {cap} (--doc-page-limit); select one with "
            f"--page or raise it")


def render_input(path: str, args):
    """``path`` rendered as the batch job renders an input (:func:`padoc_ray.inputs.render_local`: the
    renderer with the flags' caps, limits and codes), as an :class:`~padoc_ray.inputs.LocalDocument`
    of page rows in the batch job's schema."""
    import uuid

    from padoc_ray.inputs import LocalDocument, render_local
    from padoc_ray.pdf import RenderConfig, doc_id_of
    from padoc_ray.pipeline.config import RasterConfig
    from padoc_ray.pipeline.limits import listing_refusal
    from padoc_ray.raster import DocFailed, RendererConfig, renderer_for
    from padoc_ray.raster.document import InputLimits, PageChoice

    name = os.path.basename(path)
    limits = from_args(InputLimits, args)
    st = os.stat(path)
    too_large = listing_refusal(st.st_size, limits)
    if too_large is not None:  # as the batch job's listing refuses it: never read
        return LocalDocument(name, failed=DocFailed(*too_large))
    with open(path, "rb") as f:
        data = f.read()
    # the row names the file as Serve names an upload, by its file name (as parse-page's pages always were)
    base = dict(run_id=uuid.uuid4().hex[:12], uri=name, doc_id=doc_id_of(data), mode=args.mode,
                model_id=os.path.basename(args.model.rstrip("/")), source_size=len(data),
                source_mtime=st.st_mtime_ns // 1_000_000)
    choice = PageChoice(wanted=None if not args.page else (args.page - 1,), cap=limits.max_doc_pages,
                        cap_message=_page_cap_message)
    renderer = renderer_for(from_args(RendererConfig, args))
    try:
        render = from_args(RenderConfig, args).with_text_layer(scheduler_from_args(args).text_layer)
        return render_local(renderer, data, name, base, choice, render, RasterConfig().encoding,
                            max_frames=limits.max_image_frames)
    finally:
        renderer.close()  # its process is not needed while the engine runs


def _run_local(args, model_protocol, cfg, doc, truth) -> list:
    """Start a local engine (only when a page rendered) and run the document's rendered pages:
    [(row, record or None)] in page order."""
    from padoc_ray.host import PageHost
    from padoc_ray.inputs import parse_rows

    if not doc.rendered:
        return [(p.row, None) for p in doc.pages]

    async def go():
        host = await PageHost(args.model, cfg, truth=truth, model_protocol=model_protocol).start()
        try:
            return await parse_rows(host, doc.pages)
        finally:
            host.shutdown()

    try:
        return asyncio.run(go())
    except Exception as e:  # noqa: BLE001 - page errors are records; what reaches here is the engine's
        msg = " ".join(str(e).split())
        die(f"the engine failed ({type(e).__name__}): {msg[:600]} (padoc-ray doctor checks this machine)", code=1)


def _local_model(args):
    """The model's protocol and the host config of ``args``, checked before anything renders (exit 2
    when they do not fit: hpd has no --mode sequential)."""
    from padoc_ray.host import HostConfig, check_family
    from padoc_ray.protocol import ProtocolError
    from padoc_ray.tokenizer import ModelProtocol

    try:
        model_protocol = ModelProtocol(args.model)
    except (ProtocolError, OSError) as e:
        die(f"cannot load model {args.model}: {e}")
    cfg = HostConfig(mode=args.mode, scheduler=scheduler_from_args(args), pages_in_flight=1)
    try:
        check_family(model_protocol, cfg)
    except ProtocolError as e:
        die(f"{args.model}: {e}")
    return model_protocol, cfg


#: parse-page's JSON keys beside the shared row JSON's: the page as the protocol writes it (Page.to_dict's
#: width, height, page_no, image_path, errors; each region also gets its index and ignore), the record's
#: message (error_message is null for an ok page) and retries, the model's family, and the --replay verdict
PAGE_JSON_EXTRAS = ("width", "height", "page_no", "image_path", "errors", "message", "retries", "family",
                    "equals_truth")


def page_json(row: dict, rec, *, family: str, equals_truth: bool | None) -> dict:
    """parse-page's JSON of one parsed page: the shared row JSON (:func:`padoc_ray.output.rows.row_json`,
    what Serve answers for a page) with :data:`PAGE_JSON_EXTRAS`; ``spans`` stays parse-page's
    ``[order, start, end]`` lists (the row's ``{order, start, end}``, same values)."""
    from padoc_ray.output.rows import row_json

    obj = row_json(row)
    page = rec.page.to_dict()
    mine = page.pop("regions")
    obj.update(page)
    obj["regions"] = [{**r, **shared} for r, shared in zip(mine, row["regions"], strict=True)]
    obj.update(message=rec.message, retries=rec.retries, family=family, equals_truth=equals_truth,
               spans=[[s["order"], s["start"], s["end"]] for s in row["spans"]])
    return obj


def cmd_parse_page(args) -> int:
    from padoc_ray.groundtruth import load_truth
    from padoc_ray.protocol import quantized, to_markdown

    if not os.path.exists(args.input):
        die(f"no such file: {args.input}")
    if not os.path.isdir(args.model):
        die(f"model directory not found: {args.model} (build one with: padoc-ray build-tiny-model {args.model})")
    if args.replay and not os.path.exists(args.replay):
        die(f"ground truth {args.replay} not found")
    truth = load_truth(args.replay)
    model_protocol, cfg = _local_model(args)
    doc = render_input(args.input, args)
    if doc.failed is not None:
        print(f"padoc-ray: {doc.source}: {doc.failed.code}: {doc.failed.message}", file=sys.stderr)
        return 1
    if not doc.pages:
        die(f"page {args.page} does not exist in {args.input}")
    family = getattr(model_protocol, "family", "padoc")
    rc = 0
    for row, rec in _run_local(args, model_protocol, cfg, doc, truth):
        if rec is None:
            print(f"padoc-ray: {doc.source}: {row['status']}: {row['error_message']}", file=sys.stderr)
            rc = 1
            continue
        # with --replay: did the teacher-forced run reproduce its ground-truth page? (None: no truth for it)
        t = truth.get((doc.source, row["page_index"])) if args.replay else None
        size = (rec.page.width, rec.page.height)
        equals = None if t is None else rec.page.regions == quantized(t, model_protocol.vocab, size).regions
        if args.format == "json":
            print(json.dumps(page_json(row, rec, family=family, equals_truth=equals), ensure_ascii=False, indent=2))
        else:
            print(to_markdown(rec.page), end="")
        shown = "" if equals is None else f" truth={'match' if equals else 'DIFFERS'}"
        print(f"[{doc.source} page {row['page_index'] + 1}: status={rec.status} valid={rec.valid} "
              f"regions={len(rec.page.regions)} branches={rec.n_branches} {rec.e2e_s:.2f}s "
              f"F_seq={rec.f_seq} F_PaDoc={rec.f_padoc}{shown}]", file=sys.stderr)
        rc = rc or (0 if rec.status == status.OK and equals is not False else 1)
    return rc


def cmd_demo(args) -> int:
    import glob
    import shutil

    from padoc_ray.groundtruth import load_truth
    from padoc_ray.host import HostConfig, model_problem
    from padoc_ray.output.reader import read_rows
    from padoc_ray.pdf import RenderConfig
    from padoc_ray.pipeline.config import BatchConfig, EnginesConfig, RasterConfig
    from padoc_ray.pipeline.job import run_batch
    from padoc_ray.protocol import quantized

    paths = sorted(glob.glob(os.path.join(args.examples, "*.pdf")))
    if not paths:
        die(f"no PDFs in {args.examples}")
    if not os.path.isdir(args.model):
        die(f"model directory not found: {args.model} (build it with: padoc-ray build-tiny-model {args.model})")
    gt = os.path.join(args.examples, "ground_truth.json")
    replay = not args.no_replay and os.path.exists(gt)
    problem = model_problem(args.model, HostConfig(mode=args.mode, scheduler=scheduler_from_args(args)))
    if problem:
        die(problem)
    print(f"padoc-ray demo: the batch job on {len(paths)} PDFs from {args.examples} on a local Ray cluster, "
          f"model {args.model}, mode {args.mode}")
    if replay:
        print("  the tiny model has random weights: its outputs are teacher-forced from ground_truth.json so the\n"
              "  real engine and scheduler do a trained model's work (use --no-replay to see raw generation)")
    if os.path.exists(args.output):
        if not os.path.isdir(args.output) or (os.listdir(args.output)
                                               and not os.path.exists(os.path.join(args.output, DEMO_MARKER))):
            die(f"--output {args.output} exists and is not a previous demo output (no {DEMO_MARKER}); the demo "
                 f"replaces its output, so give a new or empty folder, or remove this one yourself")
        shutil.rmtree(args.output)  # the demo always parses afresh (the batch job itself resumes)
    os.makedirs(args.output)
    open(os.path.join(args.output, DEMO_MARKER), "w").close()
    import ray
    import ray.data

    from padoc_ray.ray_init import init_ray

    init_ray("local", verbose=args.verbose)
    ray.data.DataContext.get_current().enable_progress_bars = args.verbose
    cfg = BatchConfig(input=os.path.join(args.examples, "*.pdf"), output=args.output, model=args.model,
                      replay_gt=gt if replay else None, raster=RasterConfig(render=from_args(RenderConfig, args)),
                      engines=EnginesConfig(host=HostConfig(mode=args.mode, scheduler=scheduler_from_args(args))))
    summary = run_batch(cfg)
    table = read_rows(args.output).to_pylist()
    table.sort(key=lambda r: (r["source_uri"], r["page_index"]))
    truth = load_truth(gt if replay else None)
    vocab = _vocab(args.model)
    print(f"\n{'document':<12} {'page':>4} {'status':<16} {'regions':>7} {'branches':>8} {'e2e s':>6} "
          f"{'F_seq':>6} {'F_PaDoc':>7}  matches truth")
    for r in table:
        name = os.path.basename(r["source_uri"])
        t = truth.get((name, r["page_index"]))
        size = (r.get("image_width"), r.get("image_height"))
        match = "-" if t is None else ("yes" if _row_matches(r, quantized(t, vocab, size)) else "NO")
        print(f"{name:<12} {r['page_index'] + 1:>4} {r['status']:<16} {len(r['regions']):>7} {r['n_branches'] or 0:>8} "
              f"{r['e2e_s'] or 0:>6.2f} {r['f_seq'] or 0:>6} {r['f_padoc'] or 0:>7}  {match}")
    if table:
        print(f"\n--- Markdown of {os.path.basename(table[0]['source_uri'])} page 1 ---\n{table[0]['markdown']}")
    keys = ('pages_written', 'page_status', 'document_status', 'wall_s', 'pages_per_s', 'all_inputs_accounted',
            'text_layer', 'accepted_tokens', 'accepted_fraction')
    print(f"summary: {json.dumps({k: summary[k] for k in keys})}")
    print(f"output: {os.path.abspath(args.output)}/pages (Parquet, one row per page), documents/, summary.json")
    ok = summary["all_inputs_accounted"] and (not replay or summary["page_status"] == {"ok": summary["pages_written"]})
    return 0 if ok else 1


#: marks a folder as a demo output, which the next demo may replace (it never deletes anything else)
DEMO_MARKER = ".padoc-demo-output"


def _row_matches(row: dict, truth) -> bool:
    import math

    if len(row["regions"]) != len(truth.regions):
        return False
    for r, t in zip(row["regions"], truth.regions):
        if r["category"] != t.category or r["content"] != t.content:
            return False
        if any(not math.isclose(a, b, abs_tol=1e-6) for a, b in zip(r["bbox"], t.box.as_tuple())):
            return False
    return True


def _vocab(model: str):
    from padoc_ray.tokenizer import load_model_protocol

    return load_model_protocol(model).vocab




def register(sub) -> None:
    pp = add_command(sub, "parse-page", help="parse one page of a PDF or one image with a local engine",
                        description="Parse one PDF page (or an image) on a local vLLM engine, no Ray, and print "
                                    "Markdown or JSON on stdout; a status line goes to stderr. Exit 1 if the page "
                                    "did not parse cleanly (or, with --replay, differs from its truth).")
    pp.add_argument("input", metavar="IMAGE_OR_PDF")
    pp.add_argument("--model", required=True, help="checkpoint directory with padoc_protocol.json")
    pp.add_argument("--page", type=int, default=None, help="1-based page of a PDF (default: every page)")
    pp.add_argument("--format", choices=("markdown", "json"), default="markdown", help="output format (default markdown)")
    pp.add_argument("--replay", metavar="GT.json", default=None,
                    help="teacher-force the model with this OmniDocBench ground truth (matched by file name and "
                         "page); the result says whether the page equals its truth (JSON: equals_truth), and a "
                         "page that does not exits 1")
    _add_generation_args(pp)
    _add_render_limits(pp)
    pp.set_defaults(func=cmd_parse_page)

    d = add_command(sub, "demo", help="run the batch job on the bundled sample PDFs with the tiny model",
                       description="Run the batch job (Ray Data, local Ray cluster, one engine actor) on "
                                   "examples/*.pdf with the tiny model, write Parquet, and print a summary. "
                                   "The tiny model has random weights, so by default its outputs are teacher-forced "
                                   "from examples/ground_truth.json.")
    d.add_argument("--model", default=DEFAULT_MODEL, help=f"checkpoint directory (default {DEFAULT_MODEL})")
    d.add_argument("--examples", default=EXAMPLES_DIR, help="folder of PDFs (default: the bundled examples)")
    d.add_argument("--no-replay", action="store_true", help="let the model generate freely (noise for the tiny model)")
    d.add_argument("--output", default=os.path.join(os.path.dirname(EXAMPLES_DIR), "out", "demo"),
                   help="output folder (default out/demo); replaced when it is a previous demo output, refused when it "
                        "is any other non-empty folder")
    _add_generation_args(d)
    d.set_defaults(func=cmd_demo)
