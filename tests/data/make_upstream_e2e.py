"""Regenerate ``upstream_e2e_demo.json``: the upstream OmniDocBench evaluator's own per-page values
for the 18 demo pages (``../shared/data/omnidocbench_demo``), which ``tests/test_eval_e2e.py``
compares with ``padoc-ray eval e2e`` page by page. Not run by the suite.

    python tests/data/make_upstream_e2e.py UPSTREAM_CHECKOUT UPSTREAM_PYTHON

UPSTREAM_CHECKOUT: opendatalab/OmniDocBench at UPSTREAM_COMMIT (its ``demo_data/`` is byte-identical
to the shared demo data; checked here). UPSTREAM_PYTHON: an interpreter with upstream's
dependencies (its pyproject.toml). The evaluator runs its ``configs/end2end.yaml`` without CDM
(no TeX toolchain), with one worker per stage; its ``result/`` files are read back and the values
stored as they are (no rounding).
"""

from __future__ import annotations

import filecmp
import json
import os
import subprocess
import sys
from collections import defaultdict

UPSTREAM_REPO = "opendatalab/OmniDocBench"
UPSTREAM_COMMIT = "147cd5ac9472002f5751221d390bf00abdbc0d2f"
HERE = os.path.dirname(os.path.abspath(__file__))
DEMO = os.path.normpath(os.path.join(HERE, "..", "..", "..", "shared", "data", "omnidocbench_demo"))
CONFIG = """\
end2end_eval:
  metrics:
    text_block: {metric: [Edit_dist]}
    display_formula: {metric: [Edit_dist]}
    table: {metric: [TEDS, Edit_dist], teds_workers: 1}
    reading_order: {metric: [Edit_dist]}
  dataset:
    dataset_name: end2end_dataset
    ground_truth: {data_path: ./demo_data/omnidocbench_demo/OmniDocBench_demo.json}
    prediction: {data_path: ./demo_data/end2end}
    match_method: quick_match
    match_workers: 1
    quick_match_truncated_timeout_sec: 300
    match_timeout_sec: 420
    timeout_fallback_max_chunk_span: 10
    timeout_fallback_order_penalty: 0.10
"""
SAVE = "end2end_quick_match"


def _same_demo_data(up: str) -> None:
    pairs = [(os.path.join(DEMO, "OmniDocBench_demo.json"),
              os.path.join(up, "demo_data", "omnidocbench_demo", "OmniDocBench_demo.json"))]
    pairs += [(os.path.join(DEMO, "predictions_md", n), os.path.join(up, "demo_data", "end2end", n))
              for n in sorted(os.listdir(os.path.join(DEMO, "predictions_md")))]
    for a, b in pairs:
        if not filecmp.cmp(a, b, shallow=False):
            raise SystemExit(f"{a} differs from upstream's {b}")


def main(up: str, python: str) -> None:
    head = subprocess.run(["git", "-C", up, "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    if head and head != UPSTREAM_COMMIT:
        raise SystemExit(f"{up} is at {head}, not {UPSTREAM_COMMIT}")
    _same_demo_data(up)
    cfg = os.path.join(up, "configs", "padoc_e2e_nocdm.yaml")
    with open(cfg, "w") as f:
        f.write(CONFIG)
    os.makedirs(os.path.join(up, "result"), exist_ok=True)
    subprocess.run([python, "pdf_validation.py", "--config", cfg], cwd=up, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    res = os.path.join(up, "result")

    def load(name):
        with open(os.path.join(res, f"{SAVE}_{name}.json"), encoding="utf-8") as f:
            return json.load(f)

    metric = load("metric_result")
    pages: dict[str, dict] = defaultdict(dict)
    for kind, key in (("text_block", "text_edit"), ("display_formula", "formula_edit"), ("table", "table_edit"),
                      ("reading_order", "reading_order_edit")):
        for page, v in load(f"{kind}_per_page_edit").items():
            pages[page][key] = v
    tables: dict[str, list] = defaultdict(list)
    for k, v in load("table_per_table_TEDS").items():
        page, idx = k.rsplit("_[", 1)
        tables[page].append((idx.rstrip("]"), v["TEDS"], v["TEDS_structure_only"]))
    for page, ts in tables.items():
        pages[page]["table_teds"] = 100 * sum(t[1] for t in ts) / len(ts)  # percent, as padoc-ray reports TEDS
        pages[page]["table_teds_s"] = 100 * sum(t[2] for t in ts) / len(ts)
        pages[page]["n_table"] = len(ts)
    versions = subprocess.run([python, "-c", "import importlib.metadata as m, sys; print(sys.version.split()[0]); "
                               "[print(p, m.version(p)) for p in ('apted', 'beautifulsoup4', 'Levenshtein', 'lxml', "
                               "'pylatexenc', 'scipy', 'numpy', 'pandas')]"],
                              capture_output=True, text=True, check=True).stdout.split("\n")
    out = {
        "source": {
            "repo": UPSTREAM_REPO, "commit": UPSTREAM_COMMIT,
            "checkout": "a git checkout of that commit (this script refuses any other HEAD)",
            "command": "python pdf_validation.py --config <config below> (the upstream evaluator, end2end quick_match)",
            "config": CONFIG, "cdm": "not run (needs a TeX toolchain)",
            "python": versions[0], "packages": dict(v.split(" ", 1) for v in versions[1:] if v),
            "data": "upstream demo_data/ (byte-identical to ../shared/data/omnidocbench_demo, checked)",
            "generated_by": "tests/data/make_upstream_e2e.py",
            "units": "edits 0-1 per page (sum of edit ops / sum of lengths of the page's pairs); table_teds and "
                     "table_teds_s percent (mean over the page's tables)",
        },
        "metrics": {
            "text_edit": metric["text_block"]["page"]["Edit_dist"]["ALL"],
            "formula_edit": metric["display_formula"]["page"]["Edit_dist"]["ALL"],
            "table_edit": metric["table"]["page"]["Edit_dist"]["ALL"],
            "table_teds": 100 * metric["table"]["page"]["TEDS"]["ALL"],
            "table_teds_s": 100 * metric["table"]["page"]["TEDS_structure_only"]["ALL"],
            "reading_order_edit": metric["reading_order"]["page"]["Edit_dist"]["ALL"],
        },
        "pages": {k: pages[k] for k in sorted(pages)},
    }
    with open(os.path.join(HERE, "upstream_e2e_demo.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print(f"wrote {len(pages)} pages")


if __name__ == "__main__":
    main(*sys.argv[1:3])
