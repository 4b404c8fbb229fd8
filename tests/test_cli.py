"""The padoc-ray command line: help texts, bad input, and one real parse through the engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from .conftest import ROOT

CLI = [sys.executable, "-m", "padoc_ray.cli"]


def run_cli(*args, timeout=300):
    return subprocess.run([*CLI, *args], capture_output=True, text=True, timeout=timeout, cwd=ROOT)


@pytest.mark.parametrize("cmd", [[], ["build-tiny-model"], ["parse-page"], ["demo"], ["parse"], ["reannotate"], ["show"],
                                 ["train"], ["eval"], ["eval", "layout"], ["eval", "e2e"], ["bench"], ["bench", "replay"],
                                 ["bench", "raster"], ["bench", "pipeline"], ["bench", "attention"],
                                 ["bench", "pageiou"]])
def test_every_command_explains_itself(cmd):
    out = run_cli(*cmd, "--help")
    assert out.returncode == 0, out.stderr
    assert "usage: padoc-ray" in out.stdout and len(out.stdout) > 200


def test_no_command_prints_help_and_fails():
    out = run_cli()
    assert out.returncode == 2 and "COMMAND" in out.stdout


def test_build_tiny_model_refuses_a_non_empty_dir(tmp_path):
    (tmp_path / "x").write_text("keep")
    out = run_cli("build-tiny-model", str(tmp_path))
    assert out.returncode == 2 and "--force" in out.stderr and (tmp_path / "x").exists()


def test_parse_page_bad_inputs_are_clear(tmp_path, tiny_model_dir):
    out = run_cli("parse-page", str(tmp_path / "missing.pdf"), "--model", tiny_model_dir)
    assert out.returncode == 2 and "no such file" in out.stderr
    out = run_cli("parse-page", os.path.join(ROOT, "examples", "memo.pdf"), "--model", str(tmp_path / "nomodel"))
    assert out.returncode == 2 and "model directory not found" in out.stderr
    notpdf = tmp_path / "notes.pdf"
    notpdf.write_text("just text")
    out = run_cli("parse-page", str(notpdf), "--model", tiny_model_dir)
    assert out.returncode == 1 and "not_pdf" in out.stderr
    empty = tmp_path / "empty.pdf"
    empty.write_bytes(b"")
    out = run_cli("parse-page", str(empty), "--model", tiny_model_dir)
    assert out.returncode == 1 and "empty_file" in out.stderr


@pytest.mark.engine
def test_parse_page_replays_a_sample_page_through_the_engine(tiny_model_dir):
    out = run_cli("parse-page", os.path.join(ROOT, "examples", "memo.pdf"), "--model", tiny_model_dir, "--page", "1",
                  "--format", "json", "--replay", os.path.join(ROOT, "examples", "ground_truth.json"))
    assert out.returncode == 0, out.stderr[-3000:]
    obj = json.loads(out.stdout)
    gt = json.load(open(os.path.join(ROOT, "examples", "ground_truth.json")))
    memo = next(p for p in gt if p["page_info"]["source_pdf"] == "memo.pdf")
    assert obj["status"] == "ok" and obj["valid"] is True
    assert [r["content"] for r in obj["regions"]][:3] == [d["text"] for d in sorted(
        (d for d in memo["layout_dets"] if d["order"] is not None), key=lambda d: d["order"])][:3]
    assert obj["f_padoc"] < obj["f_seq"] and obj["n_branches"] == len(memo["layout_dets"])
