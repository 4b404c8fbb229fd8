"""``padoc-ray doctor`` on this CPU machine: the runner vLLM picks, what each runner's loader accepts,
and the one-page smoke test on the real engine."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from padoc_ray.cli import main
from padoc_ray.engine.runners import V1_PROCESSORS, V2_PROCESSORS

BIN = os.path.dirname(sys.executable)


def _doctor(tmp_path, *args) -> tuple[int, dict]:
    out = tmp_path / f"doctor-{len(list(tmp_path.iterdir()))}.json"
    try:
        rc = main(["doctor", *args, "--json", str(out)])
    except SystemExit as e:
        rc = e.code
    return rc, json.loads(out.read_text())


def test_auto_picks_v1_here_and_its_processors_load(tmp_path, tiny_model_dir, capsys, monkeypatch):
    monkeypatch.delenv("VLLM_USE_V2_MODEL_RUNNER", raising=False)
    rc, r = _doctor(tmp_path, "--model", tiny_model_dir)
    assert rc == 0 and r["ok"] and r["problems"] == []
    assert r["runner"] == "v1" == r["vllm_runner"] and r["runner_source"] == "vLLM's choice"
    assert r["logits_processors"] == list(V1_PROCESSORS) and r["processors_load"] and not r["trace_replay"]
    assert r["attention_backend"] == "CPU_ATTN" and r["cuda"]["available"] is False
    assert r["versions"]["vllm"] == "0.32.0" and r["versions"]["padoc_ray"]
    assert r["model"]["version"] == 1 and r["model"]["categories"] > 0 and r["start"] is None
    assert capsys.readouterr().out.strip().endswith("ok")


def test_runner_v2_checks_the_v2_loader_and_trace_replay(tmp_path, capsys):
    rc, r = _doctor(tmp_path, "--runner", "v2")  # no --model: a tiny model is built for the check
    assert rc == 0 and r["ok"], r["problems"]
    assert r["runner"] == "v2" and r["vllm_runner"] == "v1" and r["runner_source"] == "--runner"
    assert r["logits_processors"] == list(V2_PROCESSORS) and r["processors_load"] and r["trace_replay"]
    assert r["model"] is None
    assert any("VLLM_USE_V2_MODEL_RUNNER=1" in n for n in r["notes"])
    assert r["teacher_forcing"] == "vLLM's trace replay (enable_trace_replay, trace_decode_token_ids)"


def test_a_trace_vllm_refuses_under_v2_is_a_problem(tmp_path, tiny_model_dir, monkeypatch):
    """trace_replay is vLLM's verdict on the smoke page's traces, as the engine adapter would send them: sampling
    parameters vLLM refuses beside a trace (here bad_words) make it false, with vLLM's reason as a problem."""
    from padoc_ray.engine import vllm_engine

    made = vllm_engine.sampling_params

    def with_bad_words(req, runner):
        params = made(req, runner)
        params.bad_words = ["padoc"]
        return params

    monkeypatch.setattr(vllm_engine, "sampling_params", with_bad_words)
    rc, r = _doctor(tmp_path, "--runner", "v2", "--model", tiny_model_dir)
    assert rc == 1 and not r["ok"] and not r["trace_replay"] and r["processors_load"]
    assert any("vLLM refuses the layout stream's trace" in p and "not supported with bad_words" in p
               for p in r["problems"]), r["problems"]
    assert r["teacher_forcing"].endswith("REFUSED, see the problems")


def test_a_v1_interface_processor_under_v2_is_a_problem_naming_the_class(tmp_path, tiny_model_dir, capsys):
    rc, r = _doctor(tmp_path, "--runner", "v2", "--model", tiny_model_dir,
                    "--logits-processor", "padoc_ray.engine.forcing:ForcedTokensProcessor")
    assert rc == 1 and not r["ok"] and not r["processors_load"]
    assert r["logits_processors"][-1] == "padoc_ray.engine.forcing:ForcedTokensProcessor"
    err = capsys.readouterr().err
    assert "problem:" in err and "ForcedTokensProcessor is not a subclass" in err
    assert any("ForcedTokensProcessor" in p for p in r["problems"])


def test_not_a_checkpoint_is_a_problem(tmp_path):
    empty = tmp_path / "not-a-model"
    empty.mkdir()
    (empty / "config.json").write_text(json.dumps({"model_type": "qwen3_vl"}))
    rc, r = _doctor(tmp_path, "--runner", "v1", "--model", str(empty))
    assert rc == 1 and any("padoc_protocol.json" in p for p in r["problems"])
    with pytest.raises(SystemExit) as e:
        main(["doctor", "--model", str(tmp_path / "missing")])
    assert e.value.code == 2


@pytest.mark.engine
def test_start_runs_one_teacher_forced_page_on_the_real_engine(tmp_path, tiny_model_dir):
    out = tmp_path / "start.json"
    p = subprocess.run([os.path.join(BIN, "padoc-ray"), "doctor", "--model", tiny_model_dir, "--start",
                        "--json", str(out)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    s = json.loads(out.read_text())["start"]
    assert s["runner"] == "v1" and s["status"] == "ok" and s["valid"] and s["equals_truth"]
    assert s["n_branches"] == 2 and s["engine_start_s"] > 0
    assert "smoke test: engine up" in p.stdout
