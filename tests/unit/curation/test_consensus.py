"""Re-annotation without ground truth: importers of other parsers' formats, the consensus of several
noisy prediction sets, difficulty, and `reannotate --modes none` end to end (no engine, no Ray)."""

from __future__ import annotations

import copy
import json
import os
import random
import shutil
import statistics
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from padoc_ray.curation.agreement import AgreementConfig, compare_pages
from padoc_ray.curation.consensus import build_consensus, default_min_agree
from padoc_ray.curation.importers import load_set, parse_compare
from padoc_ray.storage import StorageConfig
from padoc_ray.protocol.page import Box, Page, Region, page_from_omnidocbench

from tests.conftest import ROOT, _env

EXAMPLES = os.path.join(ROOT, "examples")
GT = os.path.join(EXAMPLES, "ground_truth.json")
WORDS = "layout grounded parallel document parser branch region page table figure caption equation".split()


# ---- noisy prediction sets derived from a known truth ------------------------------------------------
def _truth(rng: random.Random, n: int) -> Page:
    regions, y = [], 0.04
    for _ in range(n):
        h = rng.uniform(0.03, 0.08)
        x1 = rng.uniform(0.05, 0.15)
        regions.append(Region(category="text_block", box=Box(x1, y, rng.uniform(0.6, 0.95), y + h),
                              content=" ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 12)))))
        y += h + rng.uniform(0.01, 0.03)
    return Page(width=1000, height=1400, regions=tuple(regions))


def _edit(rng: random.Random, text: str, rate: float) -> str:
    chars = list(text)
    for i in range(len(chars)):
        if rng.random() < rate:
            chars[i] = rng.choice("abcdefghijklmnopqrstuvwxyz ")
    return "".join(chars)


def _noisy(rng: random.Random, page: Page, *, jitter=0.01, drop=0.15, spurious=0.15, edit=0.08) -> Page:
    out = []
    for r in page.regions:
        if rng.random() < drop:
            continue
        b = r.box
        j = lambda v: min(1.0, max(0.0, v + rng.uniform(-jitter, jitter)))  # noqa: E731
        out.append(Region(category=r.category, box=Box(j(b.x1), j(b.y1), j(b.x2), j(b.y2)),
                          content=_edit(rng, r.content, edit)))
    for _ in range(sum(rng.random() < spurious for _ in page.regions)):
        x, y = rng.uniform(0.0, 0.8), rng.uniform(0.0, 0.9)
        out.insert(rng.randrange(len(out) + 1), Region(category="abandon", box=Box(x, y, x + 0.15, y + 0.05),
                                                       content=" ".join(rng.choice(WORDS) for _ in range(3))))
    return Page(width=page.width, height=page.height, regions=tuple(out))


def _score(truth: Page, page: Page) -> tuple[float, float]:
    a = compare_pages(truth, page)
    return a.layout_iou, a.content_edit


def test_the_consensus_of_three_noisy_sets_is_closer_to_the_truth_than_the_median_set():
    rng = random.Random(7)
    cons_iou, cons_edit, med_iou, med_edit = [], [], [], []
    for _ in range(30):
        truth = _truth(rng, rng.randint(4, 12))
        sets = {f"s{k}": _noisy(rng, truth) for k in range(3)}
        c = build_consensus(sets, min_agree=default_min_agree(3))
        assert c.page is not None and c.parsed == 3 and all(s >= 2 for s in c.support)
        assert len(c.sources) == len(c.page.regions) and 0 < c.coverage <= 1
        iou, edit = _score(truth, c.page)
        singles = [_score(truth, p) for p in sets.values()]
        cons_iou.append(iou)
        cons_edit.append(edit)
        med_iou.append(statistics.median(s[0] for s in singles))
        med_edit.append(statistics.median(s[1] for s in singles))
    # spurious regions rarely agree and text edits rarely coincide: the consensus wins on both
    assert statistics.mean(cons_iou) > statistics.mean(med_iou)
    assert statistics.mean(cons_edit) < statistics.mean(med_edit)
    assert sum(c > m for c, m in zip(cons_iou, med_iou)) > 20


def test_reading_order_comes_from_the_majority_and_categories_by_vote():
    a = Region("text_block", Box(0.1, 0.1, 0.9, 0.2), "first")
    b = Region("text_block", Box(0.1, 0.5, 0.9, 0.6), "second")
    fig = lambda cat: Region(cat, Box(0.1, 0.7, 0.5, 0.9), None if cat == "figure" else "x")  # noqa: E731
    pages = {"p": Page(10, 10, (a, b, fig("figure"))), "q": Page(10, 10, (b, a, fig("figure"))),
             "r": Page(10, 10, (a, b, fig("table")))}
    c = build_consensus(pages, min_agree=2)
    assert [r.content for r in c.page.regions] == ["first", "second", None]
    assert c.page.regions[2].category == "figure" and c.support == (3, 3, 3)
    # a region only one set saw stays out with min_agree 2, and enters with 1
    lone = {"p": Page(10, 10, (a,)), "q": Page(10, 10, (b,))}
    assert build_consensus(lone, min_agree=2).page is None
    assert "no region" in build_consensus(lone, min_agree=2).reason
    assert len(build_consensus(lone, min_agree=1).page.regions) == 2
    # too few parses; blank pages agree
    assert build_consensus({"p": pages["p"]}, min_agree=2).reason.startswith("1 prediction set")
    blank = build_consensus({"p": Page(10, 10), "q": Page(10, 10)}, min_agree=2)
    assert blank.page is not None and blank.page.regions == () and blank.coverage == 1.0


def test_the_content_is_the_medoid_of_the_members():
    box = Box(0.1, 0.1, 0.9, 0.3)
    texts = {"p": "the quick brown fox", "q": "the quick brown fax", "r": "zzzz qqqq"}
    pages = {n: Page(10, 10, (Region("text_block", box, t),)) for n, t in texts.items()}
    c = build_consensus(pages, min_agree=2)
    assert c.page.regions[0].content in ("the quick brown fox", "the quick brown fax") and c.sources[0] in "pq"


def test_disagreeing_pages_are_harder():
    from padoc_ray.curation.reannotate import PageSlot, compare

    rng = random.Random(3)
    slots, sets = [], {"a": {}, "b": {}, "c": {}}
    for i in range(12):
        truth = _truth(rng, 8)
        noisy = i % 2 == 1
        for n in sets:
            p = _noisy(rng, truth, jitter=0.04 if noisy else 0.002, drop=0.4 if noisy else 0.0,
                       spurious=0.4 if noisy else 0.0, edit=0.3 if noisy else 0.0)
            sets[n][("doc.pdf", i)] = ("ok", p)
        slots.append(PageSlot(f"doc_page{i}.png", "/x/doc.pdf", i))
    rows, consensus = compare(slots, sets, AgreementConfig(), "r", min_agree=2)
    page_rows = [r for r in rows if r["kind"] == "page"]
    pair_rows = [r for r in rows if r["kind"] == "pair"]
    assert len(page_rows) == 12 and len(pair_rows) == 12 * 3  # every pair of sets on every page
    assert {(r["ref"], r["hyp"]) for r in pair_rows} == {("a", "b"), ("a", "c"), ("b", "c")}
    easy = [r["difficulty"] for r in page_rows if r["page_index"] % 2 == 0]
    hard = [r["difficulty"] for r in page_rows if r["page_index"] % 2 == 1]
    assert max(easy) < min(hard)
    assert all(r["unanimous"] for r in page_rows if r["page_index"] % 2 == 0)
    assert len(consensus) == sum(r["consensus"] for r in page_rows)


# ---- importers: their formats, edge cases counted -------------------------------------------------------
def test_parse_compare():
    assert parse_compare("m=mineru:out/x") == ("m", "mineru", "out/x")
    assert parse_compare("m=s3://b/out") == ("m", None, "s3://b/out")
    assert parse_compare("m=out/x") == ("m", None, "out/x")
    with pytest.raises(ValueError):
        parse_compare("no-equals")


def test_mineru_content_list_edge_cases(tmp_path):
    blocks = [
        {"type": "text", "text": "Title", "text_level": 1, "bbox": [100, 50, 900, 100], "page_idx": 0},
        {"type": "text", "text": "Body text", "bbox": [100, 120, 900, 300], "page_idx": 0},
        {"type": "equation", "text": "$$\nE = mc^2\n$$", "text_format": "latex", "bbox": [200, 320, 800, 360],
         "page_idx": 0},
        {"type": "table", "table_body": "<table><tr><td>1</td></tr></table>", "table_caption": ["Table 1"],
         "bbox": [100, 400, 900, 600], "page_idx": 0},
        {"type": "image", "img_path": "images/a.jpg", "image_caption": ["Fig. 1"], "bbox": [100, 620, 500, 800],
         "page_idx": 0},
        {"type": "text", "text": "no box", "page_idx": 0},
        {"type": "hologram", "text": "?", "bbox": [0, 0, 10, 10], "page_idx": 0},
        {"type": "list", "list_items": ["a", "b"], "bbox": [100, 100, 900, 200], "page_idx": 2},
        "not a block",
    ]
    (tmp_path / "doc_content_list.json").write_text(json.dumps(blocks))
    (tmp_path / "empty_content_list.json").write_text("[]")
    (tmp_path / "broken_content_list.json").write_text("{not json")
    ps = load_set("m", str(tmp_path), None, StorageConfig())
    assert ps.format == "mineru"
    p0 = ps.pages[("doc", 0)][1]
    assert [r.category for r in p0.regions] == ["title", "text_block", "equation_isolated", "table", "figure"]
    assert p0.regions[2].content == "E = mc^2" and p0.regions[2].content_format == "latex"
    assert p0.regions[3].content.startswith("<table>") and p0.regions[4].content is None
    assert p0.regions[0].box == Box(0.1, 0.05, 0.9, 0.1)
    assert ps.pages[("doc", 2)][1].regions[0].content == "a\nb"
    assert ("doc", 1) not in ps.pages and set(ps.documents) == {"doc", "empty", "broken"}
    assert ps.counts["missing_box"] == 1 and ps.counts["unknown_category:hologram"] == 1
    assert ps.counts["caption_without_box"] == 2 and ps.counts["malformed_block"] == 1
    assert ps.counts["unreadable_file"] == 1 and ps.notes


def test_dots_layout_json_edge_cases(tmp_path):
    from PIL import Image

    cells = [{"bbox": [100, 100, 900, 200], "category": "Section-header", "text": "## Intro"},
             {"bbox": [100, 250, 900, 600], "category": "Text", "text": "Hello"},
             {"bbox": [100, 650, 500, 900], "category": "Picture"},
             {"bbox": [100, 950, 900, 1000], "category": "Formula", "text": "$$x^2$$"},
             {"category": "Text", "text": "no box"}, {"bbox": [1, 2, 3, 4], "category": "Sticker"}]
    (tmp_path / "doc").mkdir()
    (tmp_path / "doc" / "doc_page_0.json").write_text(json.dumps(cells))
    Image.new("RGB", (1000, 2000)).save(tmp_path / "doc" / "doc_page_0.jpg")
    (tmp_path / "doc" / "doc_page_1.json").write_text(json.dumps("raw model output that was not JSON"))
    (tmp_path / "doc" / "doc_page_2.json").write_text("[]")
    (tmp_path / "scan.json").write_text(json.dumps(cells[:1]))
    sizes = {("doc", 2): (500, 500)}
    ps = load_set("d", str(tmp_path), "dots", StorageConfig(), page_size=lambda d, i, dpi: sizes.get((d, i)))
    p0 = ps.pages[("doc", 0)][1]
    assert [r.category for r in p0.regions] == ["title", "text_block", "figure", "equation_isolated"]
    assert p0.regions[0].box == Box(0.1, 0.05, 0.9, 0.1) and p0.regions[3].content == "x^2"  # the jpg's size
    assert ps.pages[("doc", 1)] == ("malformed", None) and ps.pages[("doc", 2)][1].regions == ()
    assert ps.pages[("scan", 0)] == ("malformed", None)  # no image and no source size
    assert ps.counts["unparsed_model_output"] == 1 and ps.counts["missing_box"] == 1
    assert ps.counts["unknown_category:Sticker"] == 1 and ps.counts["page_size_unknown"] == 1


def test_omnidocbench_import_counts_what_it_cannot_read(tmp_path):
    gt = json.load(open(GT))
    odd = copy.deepcopy(gt[:2])
    odd[0]["layout_dets"].append({"category_type": "sticker", "poly": [0, 0, 1, 0, 1, 1, 0, 1]})
    odd[0]["layout_dets"].append({"category_type": "text_block", "text": "no poly"})
    odd[1]["layout_dets"] = []
    odd.append({"no": "page_info"})
    (tmp_path / "p.json").write_text(json.dumps(odd))
    ps = load_set("o", str(tmp_path / "p.json"), None, StorageConfig())
    assert ps.format == "omnidocbench"
    assert len(ps.pages[("report.pdf", 0)][1].regions) == len(gt[0]["layout_dets"])
    assert ps.pages[("report.pdf", 1)][1].regions == ()
    assert ps.counts["unknown_category:sticker"] == 1 and ps.counts["missing_box"] == 1
    assert ps.counts["page_without_page_info"] == 1


# ---- reannotate end to end, without an engine ---------------------------------------------------------
def to_mineru(page: dict) -> list[dict]:
    """An OmniDocBench page written the way MinerU 2.x writes content_list.json."""
    w, h = page["page_info"]["width"], page["page_info"]["height"]
    kinds = {"title": "text", "text_block": "text", "table": "table", "equation_isolated": "equation",
             "header": "header", "page_number": "page_number", "footer": "footer"}
    out = []
    for d in sorted(page["layout_dets"], key=lambda d: d.get("order") or 0):
        kind = kinds.get(d["category_type"])
        if kind is None:
            continue  # MinerU folds captions into their blocks
        xs, ys = d["poly"][0::2], d["poly"][1::2]
        b = {"type": kind, "bbox": [round(min(xs) / w * 1000), round(min(ys) / h * 1000),
                                    round(max(xs) / w * 1000), round(max(ys) / h * 1000)],
             "page_idx": page["page_info"]["page_no"]}
        if kind == "table":
            b["table_body"] = d.get("html", "")
        elif kind == "equation":
            b["text"] = f"$$\n{d.get('latex', '')}\n$$"
        else:
            b["text"] = d.get("text", "")
            if d["category_type"] == "title":
                b["text_level"] = 1
        out.append(b)
    return out


def to_dots(page: dict, dpi: int = 200) -> list[dict]:
    """An OmniDocBench page written the way dots.ocr writes a page's layout JSON (pixels at ``dpi``)."""
    w, h = page["page_info"]["width"], page["page_info"]["height"]
    sx, sy = 612 * dpi / 72 / w, 792 * dpi / 72 / h  # the example PDFs are US letter
    cats = {"title": "Title", "text_block": "Text", "table": "Table", "equation_isolated": "Formula",
            "header": "Page-header", "footer": "Page-footer", "page_number": "Page-footer",
            "table_caption": "Caption", "equation_caption": "Text"}
    out = []
    for d in sorted(page["layout_dets"], key=lambda d: d.get("order") or 0):
        xs, ys = d["poly"][0::2], d["poly"][1::2]
        cell = {"bbox": [int(min(xs) * sx), int(min(ys) * sy), int(max(xs) * sx), int(max(ys) * sy)],
                "category": cats[d["category_type"]]}
        text = d.get("html") or d.get("latex") or d.get("text")
        if text is not None:
            cell["text"] = text
        out.append(cell)
    return out


def _reannotate(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "padoc_ray.cli", "reannotate", *args], capture_output=True,
                          text=True, env=_env(), timeout=timeout)


def test_reannotate_without_ground_truth_from_three_formats(tmp_path):
    """Three parsers' outputs of the example corpus in three formats (OmniDocBench JSON with
    jittered boxes and a dropped region, MinerU content_list.json, dots.ocr layout JSON): the
    consensus holds every page of every PDF, agrees with the truth, and reads back as training
    data; `--gt` adds the truth's comparisons."""
    gt = json.load(open(GT))
    rng = random.Random(1)
    noisy = copy.deepcopy(gt)
    for p in noisy:
        p["layout_dets"].pop(rng.randrange(len(p["layout_dets"])))
        for d in p["layout_dets"]:
            d["poly"] = [v + rng.uniform(-3, 3) for v in d["poly"]]
    (tmp_path / "noisy.json").write_text(json.dumps(noisy))
    (tmp_path / "mineru" / "paper" / "auto").mkdir(parents=True)
    (tmp_path / "dots").mkdir()
    docs = {}
    for p in gt:
        docs.setdefault(p["page_info"]["source_pdf"][:-4], []).append(p)
    for doc, pages in docs.items():
        target = tmp_path / "mineru" / (f"{doc}/auto" if doc == "paper" else "")
        target.mkdir(parents=True, exist_ok=True)
        (target / f"{doc}_content_list.json").write_text(json.dumps([b for p in pages for b in to_mineru(p)]))
        for p in pages:
            (tmp_path / "dots" / f"{doc}_page_{p['page_info']['page_no']}.json").write_text(json.dumps(to_dots(p)))
    src = tmp_path / "src"
    src.mkdir()
    for doc in docs:
        shutil.copy(os.path.join(EXAMPLES, f"{doc}.pdf"), src)
    (src / "notes.txt").write_text("not a document")  # a source that is not a document: a page row with a reason
    out = tmp_path / "rean"
    base = ["--source", str(src), "--output", str(out), "--model", str(tmp_path), "--modes", "none",
            "--compare", f"odb={tmp_path / 'noisy.json'}", "--compare", f"mineru=mineru:{tmp_path / 'mineru'}",
            "--compare", f"dots={tmp_path / 'dots'}"]
    run = _reannotate(*base)
    assert run.returncode == 0, run.stderr[-3000:]
    summary = json.load(open(out / "reannotate_summary.json"))
    assert {n: s["format"] for n, s in summary["prediction_sets"].items()} == {
        "odb": "omnidocbench", "mineru": "mineru", "dots": "dots"}
    assert summary["runs"] == {} and summary["min_agree"] == 2
    assert summary["pages"] == 6 and summary["consensus_pages"] == 5
    assert summary["page_status"] == {"ok": 5, "source_unreadable": 1}
    assert summary["prediction_sets"]["mineru"]["skipped"]["caption_without_box"] == 0
    table = pq.read_table(out / "agreement" / "agreement.parquet").to_pylist()
    pages = [r for r in table if r["kind"] == "page" and r["status"] == "ok"]
    assert sorted((os.path.basename(r["source_uri"]), r["page_index"]) for r in pages) == sorted(
        (p["page_info"]["source_pdf"], p["page_info"]["page_no"]) for p in gt)
    assert all(dict(r["prediction_status"]) == {"odb": "ok", "mineru": "ok", "dots": "ok"} for r in pages)
    pairs = [r for r in table if r["kind"] == "pair"]
    assert len(pairs) == 5 * 3 and all(r["layout_iou"] > 0.5 for r in pairs)
    assert all(r["layout_iou"] > 0.9 for r in pairs if (r["ref"], r["hyp"]) == ("mineru", "dots"))  # both exact
    consensus = json.load(open(out / "consensus" / "consensus.json"))
    truth = {(p["page_info"]["source_pdf"], p["page_info"]["page_no"]): page_from_omnidocbench(p) for p in gt}
    for obj in consensus:
        page = page_from_omnidocbench(obj)
        t = truth[(obj["page_info"]["source_pdf"], obj["page_info"]["page_no"])]
        a = compare_pages(t, page)
        assert a.layout_iou > 0.9 and a.matched >= a.ref_regions - 1, (obj["page_info"], a)

    # the consensus is training data: train's reader finds every page's image in the source folder
    from padoc_ray.trainer.packing import pages_from_omnidocbench

    refs, skipped = pages_from_omnidocbench(str(out / "consensus" / "consensus.json"), str(src))
    assert len(refs) == 5 and not skipped

    # with the ground truth: pages are the truth's, and the truth is compared with every set and the consensus
    run = _reannotate(*base, "--gt", GT, "--output", str(tmp_path / "withgt"))
    assert run.returncode == 0, run.stderr[-3000:]
    s2 = json.load(open(tmp_path / "withgt" / "reannotate_summary.json"))
    assert {"gt~odb", "gt~mineru", "gt~dots", "gt~consensus", "odb~mineru"} <= set(s2["pairs"])
    assert s2["pairs"]["gt~consensus"]["layout_iou"] >= s2["pairs"]["gt~odb"]["layout_iou"]


def test_reannotate_arguments(tmp_path):
    base = ["--source", EXAMPLES, "--output", str(tmp_path / "o"), "--model", str(tmp_path)]
    for extra, msg in ((["--modes", "none"], "nothing to compare"),
                       (["--modes", "none,fork"], "cannot be combined"),
                       (["--modes", "none", "--compare", f"a={GT}", "--min-agree", "2"], "between 1 and"),
                       (["--modes", "none", "--compare", f"consensus={GT}"], "clash"),
                       (["--modes", "none", "--compare", f"a={tmp_path / 'nothing'}"], "no such file")):
        run = _reannotate(*base, *extra)
        assert run.returncode == 2 and msg in run.stderr, (extra, run.stderr[-800:])


# ---- train --sample-weights ------------------------------------------------------------------------
def test_weighted_draws_follow_difficulty_and_never_pick_pages_without_consensus():
    from padoc_ray.trainer.packing import SAMPLE_WEIGHT_FLOOR, sample_weight
    from padoc_ray.trainer.loop import batch_for_step

    assert sample_weight(False, 0.9) == 0.0 and sample_weight(None, None) == 0.0
    assert sample_weight(True, None) == SAMPLE_WEIGHT_FLOOR and sample_weight(True, 1.0) == SAMPLE_WEIGHT_FLOOR + 1
    weights = [sample_weight(True, 0.0), sample_weight(True, 1.0), sample_weight(False, 0.5)]
    draws = [i for step in range(1, 2001) for i in batch_for_step(3, step, 1, seed=4, weights=weights)]
    counts = [draws.count(i) for i in range(3)]
    assert counts[2] == 0 and 3.5 < counts[1] / counts[0] < 6.5  # expected 5x
    # stateless: a resumed run draws the same
    assert batch_for_step(3, 17, 2, 4, weights) == batch_for_step(3, 17, 2, 4, weights)


def test_apply_sample_weights_matches_pages_by_name_or_source(tmp_path):
    import pyarrow as pa

    from padoc_ray.curation.reannotate import AGREEMENT_SCHEMA
    from padoc_ray.trainer.packing import NO_CONSENSUS, NOT_WEIGHTED, ImageRef, PageRef, apply_sample_weights

    def row(**kw):
        base = {f.name: None for f in AGREEMENT_SCHEMA}
        return {**base, "run_id": "r", "kind": "page", **kw}

    rows = [row(image_path="a.png", source_uri="/s/a.png", page_index=0, consensus=True, difficulty=0.5),
            row(image_path="d_page1.png", source_uri="/s/d.pdf", page_index=1, consensus=False, difficulty=0.9),
            row(image_path="x", source_uri="/s/d.pdf", page_index=2, consensus=True, difficulty=0.0),
            {**row(image_path="a.png", source_uri="/s/a.png", page_index=0), "kind": "pair"}]
    pq.write_table(pa.Table.from_pylist(rows, schema=AGREEMENT_SCHEMA), tmp_path / "agreement.parquet")
    page = lambda name: Page(width=10, height=10, image_path=name)  # noqa: E731
    refs = [PageRef(page("a.png"), ImageRef("/imgs/a.png"), "a.png"),
            PageRef(page("d_page1.png"), ImageRef("/s/d.pdf", 1), "d1"),
            PageRef(page(None), ImageRef("/elsewhere/d.pdf", 2), "d2"),  # found by source file + page
            PageRef(page("zzz.png"), ImageRef("/imgs/zzz.png"), "zzz")]
    kept, skipped = apply_sample_weights(refs, str(tmp_path / "agreement.parquet"))
    assert [(r.source, r.weight) for r in kept] == [("a.png", 0.75), ("d2", 0.25)]
    assert [(s.source, s.code) for s in skipped] == [("d1", NO_CONSENSUS), ("zzz", NOT_WEIGHTED)]
    (tmp_path / "bad.parquet").write_text("nope")
    with pytest.raises(ValueError, match="not a re-annotation agreement.parquet"):
        apply_sample_weights(refs, str(tmp_path / "bad.parquet"))
