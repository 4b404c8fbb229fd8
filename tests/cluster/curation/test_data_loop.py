"""The whole data loop on CPU, through the commands a user runs: a base Qwen3-VL without the
protocol -> `init-model` -> re-annotation of a small synthetic corpus from two other parsers'
outputs (no ground truth) -> consensus.json + agreement.parquet -> `train` a few steps on the
consensus, pages drawn by difficulty -> the trained checkpoint parses a page in vLLM."""

from __future__ import annotations

import copy
import json
import os
import random
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

from tests.conftest import _env
from tests.unit.curation.test_consensus import to_mineru

#: make test-nightly (about 2 minutes): make test covers the steps one by one (init-model:
#: tests/cluster/checkpoint/test_init_model.py; reannotate --compare, consensus and the sample weights:
#: tests/unit/curation/test_consensus.py; the Ray Train run: tests/cluster/trainer/test_ray_train.py), this chains them
pytestmark = [pytest.mark.slow, pytest.mark.nightly]


def _cli(*args, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "padoc_ray.cli", *args], capture_output=True, text=True,
                          env=_env(), timeout=timeout)


def _ok(run: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert run.returncode == 0, (run.args[3:5], run.stdout[-2000:], run.stderr[-4000:])
    return run


def test_base_model_to_trained_checkpoint_through_consensus(tmp_path, ray_cluster):
    # 1. the base (a stand-in for Qwen3-VL-2B-Instruct) becomes a PaDoc checkpoint
    _ok(_cli("build-tiny-model", str(tmp_path / "base"), "--base"))
    _ok(_cli("init-model", "--base", str(tmp_path / "base"), "--out", str(tmp_path / "padoc"), "--no-verify"))
    assert os.path.exists(tmp_path / "padoc" / "padoc_protocol.json")

    # 2. a small synthetic corpus; two "parsers" saw it: an OmniDocBench-format set with jittered boxes
    #    and one region lost per page, and a MinerU content_list.json set
    _ok(_cli("corpus", "generate", "--out", str(tmp_path / "corpus"), "--pages", "4", "--seed", "5",
             "--profile", "report", "--dpi", "72"))
    truth = json.load(open(tmp_path / "corpus" / "gt.json"))
    rng = random.Random(2)
    noisy = copy.deepcopy(truth)
    for p in noisy:
        if len(p["layout_dets"]) > 2:
            p["layout_dets"].pop(rng.randrange(len(p["layout_dets"])))
        for d in p["layout_dets"]:
            d["poly"] = [v + rng.uniform(-1, 1) for v in d["poly"]]
    (tmp_path / "a.json").write_text(json.dumps(noisy))
    (tmp_path / "mineru").mkdir()
    docs: dict[str, list] = {}
    for p in truth:
        docs.setdefault(p["page_info"]["source_pdf"], []).append(p)
    for pdf, pages in docs.items():
        blocks = [b for p in pages for b in to_mineru(p)]
        (tmp_path / "mineru" / f"{pdf[:-4]}_content_list.json").write_text(json.dumps(blocks))
    src = tmp_path / "corpus" / "pdfs"
    rean = tmp_path / "rean"
    run = _ok(_cli("reannotate", "--source", str(src), "--output", str(rean), "--model", str(tmp_path / "padoc"),
                   "--modes", "none", "--compare", f"a={tmp_path / 'a.json'}",
                   "--compare", f"mineru=mineru:{tmp_path / 'mineru'}"))
    summary = json.load(open(rean / "reannotate_summary.json"))
    assert summary["page_status"] == {"ok": len(truth)}, run.stdout
    assert summary["consensus_pages"] == len(truth)
    consensus = rean / "consensus" / "consensus.json"
    agreement = rean / "agreement" / "agreement.parquet"
    rows = [r for r in pq.read_table(agreement).to_pylist() if r["kind"] == "page" and r["consensus"]]
    assert len(rows) == summary["consensus_pages"]

    # 3. train on the consensus, pages drawn by difficulty
    out = tmp_path / "train"
    run = _ok(_cli("train", "--model", str(tmp_path / "padoc"), "--gt", str(consensus), "--images", str(src),
                   "--sample-weights", str(agreement), "--out", str(out), "--steps", "2", "--lr", "1e-3",
                   "--warmup-steps", "0", "--max-len", "512", "--max-pixels", str(16 * 32 * 32),
                   "--address", ray_cluster["gcs"], timeout=900))
    result = json.loads(run.stdout[: run.stdout.rindex("}") + 1])
    assert result["steps"] == 2 and result["pages"] == len(rows)
    assert result["sample_weights"]["pages"] == len(rows) and result["sample_weights"]["min"] >= 0.25

    # 4. the trained checkpoint parses a page (teacher-forced by the consensus: the engine, tokenizer and
    #    protocol files of the exported model work together)
    first = json.load(open(consensus))[0]
    pdf = os.path.join(src, first["page_info"]["source_pdf"])
    run = _ok(_cli("parse-page", pdf, "--page", str(first["page_info"]["page_no"] + 1), "--model",
                   str(out / "model"), "--replay", str(consensus), "--longest-side", "400", "--format", "json"))
    assert "status=ok valid=True" in run.stderr, run.stderr[-2000:]
    assert json.loads(run.stdout)
