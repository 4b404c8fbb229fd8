"""``padoc-ray corpus``: the argparse front of the corpus package (generate, verify, profile).

``register(subparsers)`` adds the ``corpus`` parser to a ``padoc-ray`` subparsers object; every
subcommand's ``func(args)`` returns an exit code. Bad options give one line on stderr,
``padoc-ray: error: ...``, and exit code 2; a failed check exits 1. Options are validated here (not
with argparse ``type=``/``choices=``) so that every refusal is that one line. Library code lives in
the other modules; this one only parses and prints.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from padoc_ray.cli.common import add_command, die, group_help
from padoc_ray.corpus.profiles import PROFILES


def _positive_int(text: str, what: str) -> int:
    try:
        v = int(text)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a positive integer, got {text!r}") from None
    if v < 1:
        raise ValueError(f"{what} must be a positive integer, got {v}")
    return v


def cmd_generate(args) -> int:
    from padoc_ray.corpus.generate import CorpusError, GenerateConfig, generate_corpus, print_progress

    try:
        pages = _positive_int(args.pages, "--pages")
        workers = None if args.workers is None else _positive_int(args.workers, "--workers")
    except ValueError as e:
        return die(str(e), exit=False)
    try:
        seed = int(args.seed)
    except ValueError:
        return die(f"--seed must be an integer, got {args.seed!r}", exit=False)
    try:
        dpi = float(args.dpi)
    except ValueError:
        return die(f"--dpi must be a number, got {args.dpi!r}", exit=False)
    if args.profile not in PROFILES:
        return die(f"unknown profile {args.profile!r}; valid profiles: {', '.join(sorted(PROFILES))}", exit=False)
    if args.image_format not in ("jpg", "png"):
        return die(f"--image-format must be jpg or png, got {args.image_format!r}", exit=False)
    cfg = GenerateConfig(out=args.out, pages=pages, seed=seed, profile=args.profile, images=args.images,
                         image_format=args.image_format, dpi=dpi, workers=workers, force=args.force)
    try:
        res = generate_corpus(cfg, progress=print_progress)
    except CorpusError as e:
        return die(str(e), exit=False)
    except KeyboardInterrupt:
        return die("interrupted: no gt.json was written", 130, exit=False)
    print(f"wrote {res.pages} pages in {res.documents} PDFs to {args.out} ({args.profile}, seed {seed}) in "
          f"{res.seconds:.1f}s: {res.pages_per_s:.1f} pages/s on {res.workers} worker(s)")
    if args.images:
        with open(os.path.join(args.out, "manifest.json"), encoding="utf-8") as f:
            if json.load(f).get("cjk_glyphs_in_images") is False:
                print("padoc-ray: warning: this pdfium has no CJK font: Chinese text is missing from the page images "
                      "(the PDFs, their text layer and gt.json are unaffected)", file=sys.stderr)
    if res.errors:
        for e in res.errors[:5]:
            print(f"padoc-ray: {e}", file=sys.stderr)
        return die(f"{len(res.errors)} document(s) failed; gt.json lists only the {res.pages} pages written", 1,
                   exit=False)
    return 0


def cmd_verify(args) -> int:
    from padoc_ray.corpus.verify import verify_corpus

    if not os.path.isdir(args.dir):
        return die(f"corpus directory not found: {args.dir}", exit=False)
    gt = args.gt or os.path.join(args.dir, "gt.json")
    if not os.path.exists(gt):
        return die(f"no ground truth at {gt}", exit=False)
    if not 0 < args.min_coverage <= 1:
        return die(f"--min-coverage must be in (0, 1], got {args.min_coverage}", exit=False)
    try:
        rep = verify_corpus(args.dir, gt, pdf_dir=args.pdfs, min_coverage=args.min_coverage)
    except (ValueError, OSError) as e:
        return die(str(e), exit=False)
    for p in rep.pages:
        if args.verbose or not p.ok:
            cov = "skipped (scanned: no text layer)" if p.scanned else f"coverage {p.coverage:.3f}" \
                if p.coverage is not None else "not checked"
            print(f"{p.source} page {p.page_no}: {cov}, text {p.text_matched}/{p.text_regions}"
                  + ("" if p.ok else " FAIL"))
            for msg in p.problems:
                print(f"    {msg}")
    s = rep.summary()
    print(f"verified {s['pages']} pages: {s['text_pages']} with a text layer, {s['scanned_skipped']} scanned pages "
          f"skipped (no text layer); coverage of text-layer boxes by GT boxes min {s['coverage_min']} mean "
          f"{s['coverage_mean']} (pages below {args.min_coverage}: {s['pages_below_min_coverage']}); text "
          f"regions matching the text layer {s['text_matched']}/{s['text_regions']}; failed pages {s['failed_pages']}")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as f:
            json.dump({"summary": s, "pages": [p.__dict__ for p in rep.pages]}, f, indent=1, ensure_ascii=False)
    print("OK" if rep.ok else "FAILED")
    return 0 if rep.ok else 1


def cmd_profile(args) -> int:
    from padoc_ray.corpus.profile import format_report, profile_files

    paths = list(args.gt or []) + list(args.compare or [])
    if not paths:
        return die("give at least one --gt", exit=False)
    for p in paths:
        if not os.path.exists(p):
            return die(f"ground truth not found: {p}", exit=False)
    if not os.path.isdir(args.model):
        return die(f"model directory not found: {args.model}", exit=False)
    try:
        rep = profile_files(paths, args.model)
    except Exception as e:  # noqa: BLE001 - bad JSON, bad spec, bad tokenizer: one line
        return die(f"{type(e).__name__}: {e}", exit=False)
    print(format_report(rep))
    if args.json:
        try:
            with open(args.json, "w", encoding="utf-8") as f:
                json.dump(rep, f, indent=1, ensure_ascii=False)
        except OSError as e:
            return die(f"cannot write --json {args.json}: {e.strerror or e}", exit=False)
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``corpus`` (generate, verify, profile) to a ``padoc-ray`` subparsers object."""
    c = add_command(subparsers,
        "corpus", help="synthetic PDFs with exact ground truth: generate, verify, profile",
        description="Synthetic documents whose true layout and content are known: PDFs drawn with reportlab "
                    "(text, real tables with merged cells, mathtext formulas, matplotlib charts, headers, footers, "
                    "footnotes; some pages scanned or rotated) plus OmniDocBench-format ground truth.")
    sub = c.add_subparsers(dest="corpus_command", metavar="SUBCOMMAND")

    g = add_command(sub,
        "generate", help="write DIR/pdfs/*.pdf, DIR/gt.json and optionally DIR/images/",
        description="Generate PDFs and their OmniDocBench ground truth. GT boxes are pixels of each page as "
                    "pypdfium2 renders it by default (with /Rotate) at --dpi. The same seed gives byte-identical "
                    "gt.json and PDFs, whatever --workers is. Documents are built in parallel.")
    g.add_argument("--out", required=True, metavar="DIR",
                   help="output folder; must be empty or missing unless --force")
    g.add_argument("--pages", required=True, metavar="N", help="number of pages to generate (a positive integer)")
    g.add_argument("--seed", default="0", metavar="S", help="random seed (default 0)")
    g.add_argument("--profile", default="mixed", metavar="NAME",
                   help="content mix: " + "; ".join(f"{k}: {v.description}" for k, v in PROFILES.items())
                        + " (default mixed)")
    g.add_argument("--images", action="store_true",
                   help="also render every page into DIR/images/ (named as page_info.image_path says)")
    g.add_argument("--image-format", default="jpg", metavar="jpg|png",
                   help="format of the page images and of image_path (default jpg, quality 90)")
    g.add_argument("--dpi", default="144", help="render resolution that defines the GT pixel space (default 144, "
                                                "i.e. 2 pixels per point: a letter page is 1224 x 1584)")
    g.add_argument("--workers", default=None, metavar="N",
                   help="worker processes (default: one per available core)")
    g.add_argument("--force", action="store_true",
                   help="replace the corpus in a non-empty DIR (pdfs/, images/, gt.json, manifest.json; nothing else)")
    g.set_defaults(func=cmd_generate)

    v = add_command(
        sub, "verify", verbose=False, help="check gt.json against the PDFs' own text layer",
        description="Check that every text-layer box (pypdfium2) falls inside GT boxes (coverage per page >= "
                    "--min-coverage), that each text/table region's text equals the text layer inside its box "
                    "(whitespace removed), that page sizes match and that GT boxes do not overlap. Scanned pages "
                    "have no text layer: they are skipped and counted. Exit 1 on any failure.")
    v.add_argument("dir", metavar="DIR", help="corpus folder holding gt.json and pdfs/")
    v.add_argument("--gt", default=None, help="ground truth file (default DIR/gt.json)")
    v.add_argument("--pdfs", default=None, metavar="PDF_DIR",
                   help="folder holding the PDFs named by page_info.source_pdf (default DIR/pdfs)")
    v.add_argument("--min-coverage", type=float, default=0.95, help="per-page coverage needed (default 0.95)")
    v.add_argument("--json", default=None, metavar="OUT", help="also write the per-page results to OUT")
    v.add_argument("-v", "--verbose", action="store_true", help="print every page, not only failing ones")
    v.set_defaults(func=cmd_verify)

    p = add_command(sub,
        "profile", help="token-length profile of GT pages under a checkpoint's protocol",
        description="Regions per page, content tokens per region, layout tokens per page, sequential decode "
                    "steps per page (F_seq) and PaDoc decode depth (F_PaDoc): median, P90 and max, one column per "
                    "GT file. Pass a generated gt.json with --gt and real pages (e.g. the OmniDocBench demo) "
                    "with --compare to tune a corpus toward real documents.")
    p.add_argument("--gt", action="append", metavar="GT.json", help="OmniDocBench-format GT (repeatable)")
    p.add_argument("--compare", action="append", metavar="GT.json",
                   help="more GT files reported next to --gt, e.g. the 18 OmniDocBench demo pages (repeatable)")
    p.add_argument("--model", required=True, metavar="DIR", help="checkpoint directory with padoc_protocol.json "
                                                                 "and a tokenizer (e.g. models/tiny)")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the full report as JSON")
    p.set_defaults(func=cmd_profile)

    group_help(c)
    return c
