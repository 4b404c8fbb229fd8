"""`bench replay --inject-loops`: the re-fork recovery benchmark through the command line, in this process on
the session's engine. Every branch's first attempt is forced to loop; with re-forks the pages still equal
their truth, with `--branch-retries 0` they cannot."""

from __future__ import annotations

import json
import os

import pytest

from tests.conftest import ROOT

EXAMPLES = os.path.join(ROOT, "examples")

pytestmark = [pytest.mark.engine]


def _replay(tmp_path, model: str, name: str, *flags: str) -> list[dict]:
    from padoc_ray.cli import main

    out = tmp_path / name
    rc = main(["bench", "replay", "--gt", str(tmp_path / "gt.json"), "--images", str(tmp_path / "images"),
               "--model", model, "--concurrency", "1", "--modes", "fork", "--warmup", "0",
               "--max-tokens", "600", "--inject-loops", "1", "--seed", "1", *flags, "--out", str(out)])
    assert rc == 0
    return [json.loads(ln) for ln in open(out / "pages.jsonl")]


def test_injected_loops_are_recovered_by_re_forks_and_not_without_them(tiny_model_dir, tmp_path, monkeypatch,
                                                                       cpu_engine, loop_thread):
    import padoc_ray.bench.serving.run
    from padoc_ray.inputs import load_pages
    from padoc_ray.pdf import RenderConfig

    from tests.engine.cli.test_help_and_parse_page import on_session_engine

    images = tmp_path / "images"
    images.mkdir()
    for it in load_pages([os.path.join(EXAMPLES, "memo.pdf")], render=RenderConfig(longest_side=400)):
        it.page.image.save(images / f"memo_page{it.page_index}.png")
    gt = [p for p in json.load(open(os.path.join(EXAMPLES, "ground_truth.json")))
          if p["page_info"]["source_pdf"] == "memo.pdf"]
    (tmp_path / "gt.json").write_text(json.dumps(gt))
    on_session_engine(monkeypatch, cpu_engine, loop_thread, padoc_ray.bench.serving.run)

    recovered = _replay(tmp_path, tiny_model_dir, "refork")
    assert recovered and all(r["injected_loops"] > 0 for r in recovered)  # every page had branches forced to loop
    assert all(r["status"] == "ok" and r["equals_truth"] for r in recovered)  # each re-fork replayed the truth

    lost = _replay(tmp_path, tiny_model_dir, "no-refork", "--branch-retries", "0")
    assert all(r["injected_loops"] > 0 for r in lost)
    assert all(r["status"] != "ok" and not r["equals_truth"] for r in lost)  # a looped branch stays lost
