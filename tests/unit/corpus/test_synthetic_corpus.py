"""The synthetic corpus: ground truth proven against the PDFs' own text layer, determinism, the
promised categories, rotated pages' pixel space, round trips through the protocol, bad options,
and the token-length profile report."""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter

import pytest

import matplotlib  # noqa: E402,F401 - the corpus profile is part of the test install
import pypdfium2 as pdfium  # noqa: E402
import reportlab  # noqa: E402,F401

from padoc_ray.corpus import generate as gen  # noqa: E402
from padoc_ray.cli.corpus import register  # noqa: E402
from padoc_ray.corpus.generate import GenerateConfig, generate_corpus  # noqa: E402
from padoc_ray.corpus.profiles import PROFILES  # noqa: E402
from padoc_ray.corpus.verify import verify_corpus  # noqa: E402
from padoc_ray.protocol import page_from_omnidocbench  # noqa: E402

from tests.conftest import DEMO_DIR, require_demo_data  # noqa: E402

DEMO_GT = os.path.join(DEMO_DIR, "OmniDocBench_demo.json")
FURNITURE = {"header", "footer", "page_number", "page_footnote"}

# (pages, seed) per profile, chosen so that each small corpus shows every promised category; the mixed
# one also has scanned pages, rotated pages, and English, Russian and Chinese text (about 38 pages in all)
CORPORA = {"mixed": (18, 36), "academic": (8, 0), "report": (6, 0), "cjk": (6, 0)}


@pytest.fixture(scope="module")
def corpora(tmp_path_factory):
    out = {}
    for name, (pages, seed) in CORPORA.items():
        d = str(tmp_path_factory.mktemp(f"corpus_{name}"))
        res = generate_corpus(GenerateConfig(out=d, pages=pages, seed=seed, profile=name, images=(name == "mixed")))
        assert res.pages == pages and not res.errors
        with open(os.path.join(d, "gt.json"), encoding="utf-8") as f:
            out[name] = (d, json.load(f))
    return out


def run_cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="padoc-ray")
    register(parser.add_subparsers(dest="command"))
    args = parser.parse_args(argv)
    return int(args.func(args))


# ---- ground truth is right --------------------------------------------------------------------
def test_ground_truth_matches_the_text_layer(corpora):
    pages = scanned = 0
    for name, (d, gt) in corpora.items():
        rep = verify_corpus(d)
        s = rep.summary()
        bad = [(p.source, p.page_no, p.problems) for p in rep.pages if not p.ok]
        assert rep.ok, bad
        assert s["pages"] == len(gt)
        assert s["coverage_min"] >= 0.95
        assert s["text_matched"] == s["text_regions"] > 0
        for p in rep.text_pages:
            assert p.coverage >= 0.95 and p.rects > 0
        pages += s["pages"]
        scanned += s["scanned_skipped"]
        assert s["scanned_skipped"] == sum(1 for g in gt if g["page_info"]["scanned"])
    assert pages >= 30
    assert scanned >= 1  # scanned pages were there, skipped and counted


def test_verify_cli_reports_skipped_scans(corpora, capsys):
    d, gt = corpora["mixed"]
    assert run_cli(["corpus", "verify", d]) == 0
    out = capsys.readouterr().out
    n_scanned = sum(1 for g in gt if g["page_info"]["scanned"])
    assert f"{n_scanned} scanned pages skipped (no text layer)" in out and out.strip().endswith("OK")


def test_the_bundled_examples_are_verified_by_the_corpus_verifier():
    """examples/*.pdf are fixed files; their ground truth is checked by the one verifier."""
    from tests.conftest import ROOT as root
    ex = os.path.join(root, "examples")
    rep = verify_corpus(ex, os.path.join(ex, "ground_truth.json"), ex)
    pdfs = sorted(f for f in os.listdir(ex) if f.endswith(".pdf"))
    assert rep.ok and len(rep.pages) == sum(len(pdfium.PdfDocument(os.path.join(ex, f))) for f in pdfs) == 5
    assert {p.source for p in rep.pages} == set(pdfs) and all(p.coverage == 1.0 for p in rep.pages)


def test_verify_catches_wrong_ground_truth(corpora, tmp_path):
    d, gt = corpora["report"]
    bad = json.loads(json.dumps(gt))
    for det in bad[0]["layout_dets"]:  # shift every box of the first page down by 40 px
        det["poly"] = [v + 40 if i % 2 else v for i, v in enumerate(det["poly"])]
    bad[1]["layout_dets"][0]["text"] = "not what the page says"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(bad), encoding="utf-8")
    rep = verify_corpus(d, str(path))
    assert not rep.ok
    assert rep.pages[0].coverage < 0.95
    assert any("text differs" in m for m in rep.pages[1].problems)


def test_every_promised_category_appears(corpora):
    for name, (_, gt) in corpora.items():
        cats = Counter(det["category_type"] for g in gt for det in g["layout_dets"])
        missing = set(PROFILES[name].promises) - set(cats)
        assert not missing, f"{name}: {sorted(missing)} never appear"
    _, mixed = corpora["mixed"]
    langs = {g["page_info"]["page_attribute"]["language"] for g in mixed}
    assert {"english", "simplified_chinese"} <= langs and langs & {"greek", "russian"}
    assert any(g["page_info"]["rotation"] == 90 for g in mixed)
    _, academic = corpora["academic"]
    assert all(g["page_info"]["page_attribute"]["layout"] == "double_column" for g in academic)
    tables = [det["html"] for g in mixed + academic for det in g["layout_dets"] if det["category_type"] == "table"]
    assert any("colspan=" in t for t in tables) and any("rowspan=" in t for t in tables)


def test_reading_order_and_round_trip(corpora):
    for _, (d, gt) in corpora.items():
        by_pdf = Counter(g["page_info"]["source_pdf"] for g in gt)
        for name, n in by_pdf.items():
            doc = pdfium.PdfDocument(os.path.join(d, "pdfs", name))
            assert len(doc) == n  # every GT page exists, and every PDF page has GT
            doc.close()
        for g in gt:
            dets = g["layout_dets"]
            orders = [det["order"] for det in dets if det["category_type"] not in FURNITURE]
            assert orders == list(range(1, len(orders) + 1))
            assert all(det["order"] is None for det in dets if det["category_type"] in FURNITURE)
            page = page_from_omnidocbench(g)
            assert [r.category for r in page.regions] == [det["category_type"] for det in dets]
            assert [r.order for r in page.regions] == [det["order"] for det in dets]
            assert page.extra["source_pdf"] == g["page_info"]["source_pdf"]
            for r, det in zip(page.regions, dets):
                assert 0 <= r.box.x1 < r.box.x2 <= 1 and 0 <= r.box.y1 < r.box.y2 <= 1
                key = {"text": "text", "latex": "latex", "html": "html"}.get(r.content_format)
                assert (r.content is None) == (key is None) and (key is None or r.content == det[key])
            eq = [det["latex"] for det in dets if det["category_type"] == "equation_isolated"]
            assert all(e.startswith("$$\n") and e.endswith("\n$$") for e in eq)


def test_boxes_land_on_ink_rotated_and_scanned_pages_included(corpora):
    """Render each page as a user would (pypdfium2's default applies /Rotate) and check that every GT box
    holds ink and that nearly all ink is inside GT boxes. Chinese pages are left out: their font is not
    embedded and this machine's pdfium may have no CJK font to draw it with."""
    import numpy as np
    from PIL import Image

    d, gt = corpora["mixed"]
    pages = [g for g in gt if g["page_info"]["page_attribute"]["language"] != "simplified_chinese"]
    assert any(g["page_info"]["rotation"] == 90 for g in pages) and any(g["page_info"]["scanned"] for g in pages)
    for g in pages:
        info = g["page_info"]
        doc = pdfium.PdfDocument(os.path.join(d, "pdfs", info["source_pdf"]))
        page = doc[info["page_no"]]
        assert page.get_rotation() == info["rotation"]
        img = page.render(scale=info["dpi"] / 72).to_pil().convert("L")
        doc.close()
        assert img.size == (info["width"], info["height"])
        if info["rotation"] == 90:
            assert img.width > img.height  # a landscape page, as displayed
        ink = np.asarray(img) < 128
        inside = np.zeros_like(ink)
        for det in g["layout_dets"]:
            xs, ys = det["poly"][0::2], det["poly"][1::2]
            x0, y0, x1, y1 = int(min(xs)), int(min(ys)), int(np.ceil(max(xs))), int(np.ceil(max(ys)))
            assert ink[y0:y1, x0:x1].sum() > 5, f"{info['image_path']}: {det['category_type']} box holds no ink"
            inside[y0:y1, x0:x1] = True
        assert ink[inside].sum() / ink.sum() > 0.95, info["image_path"]  # the rest: header and footnote rules
        assert Image.open(os.path.join(d, "images", info["image_path"])).size == img.size  # --images wrote it


# ---- determinism, partial runs, bad options -----------------------------------------------------------
def _files(d: str) -> dict[str, bytes]:
    out = {}
    for root, _, names in os.walk(d):
        for n in names:
            p = os.path.join(root, n)
            with open(p, "rb") as f:
                out[os.path.relpath(p, d)] = f.read()
    return out


def test_same_seed_same_bytes_whatever_the_worker_count(tmp_path):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    generate_corpus(GenerateConfig(out=a, pages=7, seed=13, workers=1))
    generate_corpus(GenerateConfig(out=b, pages=7, seed=13, workers=2))
    fa, fb = _files(a), _files(b)
    assert sorted(fa) == sorted(fb) and any(k.endswith(".pdf") for k in fa)
    for k in fa:
        assert fa[k] == fb[k], f"{k} differs between runs"
    gt = json.loads(fa["gt.json"])
    assert len(gt) == 7 and any(g["page_info"]["scanned"] for g in gt)  # the scan path is deterministic too


def test_a_failed_document_is_left_out_of_gt(tmp_path, monkeypatch):
    real = gen.build_document

    def flaky(out_dir, seed, profile, doc_index, *rest):
        if doc_index == 1:
            raise RuntimeError("disk on fire")
        return real(out_dir, seed, profile, doc_index, *rest)

    monkeypatch.setattr(gen, "build_document", flaky)
    d = str(tmp_path / "c")
    res = generate_corpus(GenerateConfig(out=d, pages=8, seed=3, workers=1))
    assert res.errors and "disk on fire" in res.errors[0]
    gt = json.loads(open(os.path.join(d, "gt.json"), encoding="utf-8").read())
    plan = dict(gen.plan_documents(3, 8, "mixed"))
    assert len(gt) == res.pages == 8 - plan[1]
    assert all(g["page_info"]["source_pdf"] != gen.pdf_name(1) for g in gt)
    assert all(os.path.exists(os.path.join(d, "pdfs", g["page_info"]["source_pdf"])) for g in gt)


@pytest.mark.parametrize("argv, message", [
    (["--pages", "0"], "--pages must be a positive integer"),
    (["--pages", "-4"], "--pages must be a positive integer"),
    (["--pages", "many"], "--pages must be a positive integer"),
    (["--pages", "2", "--profile", "poetry"], "valid profiles: academic, cjk, mixed, report"),
    (["--pages", "2", "--seed", "x"], "--seed must be an integer"),
    (["--pages", "2", "--dpi", "3"], "--dpi must be in"),
])
def test_bad_options_give_one_line(tmp_path, capsys, argv, message):
    out = tmp_path / "o"
    assert run_cli(["corpus", "generate", "--out", str(out), *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("padoc-ray: error: ") and message in err[0]
    assert not (out / "gt.json").exists()


def test_output_folder_rules(tmp_path, capsys):
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    assert run_cli(["corpus", "generate", "--out", str(full), "--pages", "1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("padoc-ray: error: ") and "not empty" in err and "\n" not in err
    assert not (full / "gt.json").exists()
    afile = tmp_path / "afile"
    afile.write_text("x")
    for bad in (afile, afile / "sub"):
        assert run_cli(["corpus", "generate", "--out", str(bad), "--pages", "1"]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith("padoc-ray: error: ") and "\n" not in err
    assert run_cli(["corpus", "generate", "--out", str(full), "--pages", "2", "--force", "--workers", "1"]) == 0
    assert (full / "keep.txt").read_text() == "mine"  # --force replaces only the corpus' own files
    assert len(json.loads((full / "gt.json").read_text(encoding="utf-8"))) == 2


def test_help_explains_options(capsys):
    with pytest.raises(SystemExit) as e:
        run_cli(["corpus", "generate", "--help"])
    assert e.value.code == 0
    text = " ".join(capsys.readouterr().out.split())
    for opt in ("--out", "--pages", "--seed", "--profile", "--images", "--force", "--dpi", "--workers"):
        assert opt in text
    assert "default mixed" in text and "academic" in text and "cjk" in text


# ---- token-length profile ---------------------------------------------------------------------------
def test_profile_report(corpora, tiny_model_dir, tmp_path, capsys):
    d, gt = corpora["mixed"]
    require_demo_data()
    paths = [os.path.join(d, "gt.json"), DEMO_GT]
    out = tmp_path / "profile.json"
    argv = ["corpus", "profile", "--gt", paths[0], "--model", tiny_model_dir, "--json", str(out), "--compare", paths[1]]
    assert run_cli(argv) == 0
    table = capsys.readouterr().out
    assert "F_seq" in table and "F_PaDoc" in table and "regions/page" in table
    rep = json.loads(out.read_text(encoding="utf-8"))
    assert [s["path"] for s in rep["sets"]] == paths
    s = rep["sets"][0]
    assert s["pages"] == len(gt)
    for key in ("regions_per_page", "content_tokens_per_region", "f_seq", "f_padoc", "layout_tokens_per_page"):
        assert {"median", "p90", "max"} <= set(s[key]) and s[key]["median"] <= s[key]["p90"] <= s[key]["max"]
    assert s["regions_per_page"]["max"] == max(len(g["layout_dets"]) for g in gt)
    assert s["f_padoc"]["median"] <= s["f_seq"]["median"]
    assert 0 < s["step_reduction_median"] < 1
    assert rep["sets"][1]["pages"] == 18
    assert run_cli(["corpus", "profile", "--gt", str(tmp_path / "nope.json"), "--model", tiny_model_dir]) == 2
