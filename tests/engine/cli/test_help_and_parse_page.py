"""The padoc-ray command line: help texts, bad input, and real parses through the engine (in this
process, on the session's engine: :func:`on_session_engine`)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.helpers.cli import run_cli

CLI = [sys.executable, "-m", "padoc_ray.cli"]


class _OnEngineLoop:
    """Stands in for the ``asyncio`` module of a command's module: its ``run`` runs the coroutine on the
    loop of the session's engine (where ``cpu_engine`` lives); everything else is asyncio's own."""

    def __init__(self, loop_thread):
        self._loop_thread = loop_thread

    def run(self, coro, **_):
        return self._loop_thread.run(coro, timeout=600)

    def __getattr__(self, name):
        return getattr(asyncio, name)


def on_session_engine(monkeypatch, cpu_engine, loop_thread, *modules) -> None:
    """Commands run in this process (``padoc_ray.cli.main``) use the session's engine until the test ends:
    a PageHost made without an engine gets ``cpu_engine`` (the tiny model on vLLM) instead of starting one,
    and the ``asyncio.run`` of each of ``modules`` runs on that engine's loop. Everything else (the flags,
    rendering, the pages, the output) is the command's own code. Where the engine's start is what is
    tested, the command runs as a process of its own: parse-page in
    tests/cluster/checkpoint/test_init_model.py, SIGTERM below."""
    import padoc_ray.host as host

    class SessionEngineHost(host.PageHost):
        def __init__(self, *args, engine=None, **kw):
            super().__init__(*args, engine=cpu_engine if engine is None else engine, **kw)

    monkeypatch.setattr(host, "PageHost", SessionEngineHost)
    for m in modules:
        monkeypatch.setattr(m, "asyncio", _OnEngineLoop(loop_thread))
    for k in ("VLLM_LOGGING_STREAM", "VLLM_LOGGING_LEVEL"):  # main() sets these defaults for engine processes
        monkeypatch.setenv(k, os.environ.get(k, "unset-by-test"))


@pytest.fixture
def parse_page(monkeypatch, capsys, cpu_engine, loop_thread):
    """``padoc-ray parse-page ARGS`` in this process on the session's engine: (exit code, stdout, stderr)."""
    import padoc_ray.cli.parse

    from tests.helpers.cli import run_main

    on_session_engine(monkeypatch, cpu_engine, loop_thread, padoc_ray.cli.parse)
    return lambda *args: run_main(capsys, "parse-page", *args)


@pytest.fixture(scope="module")
def parser():
    """The real ``padoc-ray`` parser, built once in this process (not one interpreter per command)."""
    from padoc_ray.cli import build_parser

    return build_parser()


@pytest.mark.parametrize("cmd", [[], ["build-tiny-model"], ["init-model"], ["parse-page"], ["demo"], ["parse"],
                                 ["reannotate"], ["show"], ["train"], ["eval"], ["eval", "layout"], ["eval", "e2e"],
                                 ["bench"], ["bench", "replay"],
                                 ["bench", "raster"], ["bench", "pipeline"], ["bench", "attention"],
                                 ["bench", "pageiou"], ["bench", "serve"], ["bench", "steps"], ["bench", "model"]])
def test_every_command_explains_itself(cmd, parser, capsys):
    with pytest.raises(SystemExit) as e:
        parser.parse_args([*cmd, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: padoc-ray " + " ".join(cmd)) and len(out) > 200


def test_no_command_prints_help_and_fails(capsys, monkeypatch):
    from padoc_ray.cli import main

    for k in ("VLLM_LOGGING_STREAM", "VLLM_LOGGING_LEVEL"):  # main() sets these defaults for engine processes
        monkeypatch.setenv(k, os.environ.get(k, "unset-by-test"))
    assert main([]) == 2
    assert "COMMAND" in capsys.readouterr().out


def test_a_page_past_the_end_is_a_usage_error(tiny_model_dir, capsys):
    """memo.pdf has one page: --page 2 is refused before any engine starts."""
    memo = os.path.join(ROOT, "examples", "memo.pdf")
    out = run_cli(capsys, "parse-page", memo, "--model", tiny_model_dir, "--page", "2")
    assert out.returncode == 2 and "page 2 does not exist in" in out.stderr and out.stdout == ""


def test_build_tiny_model_refuses_a_non_empty_dir(tmp_path, capsys):
    (tmp_path / "x").write_text("keep")
    out = run_cli(capsys, "build-tiny-model", str(tmp_path))
    assert out.returncode == 2 and "--force" in out.stderr and (tmp_path / "x").exists()


def test_parse_page_bad_inputs_are_clear(tmp_path, tiny_model_dir, capsys):
    out = run_cli(capsys, "parse-page", str(tmp_path / "missing.pdf"), "--model", tiny_model_dir)
    assert out.returncode == 2 and "no such file" in out.stderr
    memo = os.path.join(ROOT, "examples", "memo.pdf")
    out = run_cli(capsys, "parse-page", memo, "--model", str(tmp_path / "nomodel"))
    assert out.returncode == 2 and "model directory not found" in out.stderr
    notpdf = tmp_path / "notes.pdf"
    notpdf.write_text("just text")
    out = run_cli(capsys, "parse-page", str(notpdf), "--model", tiny_model_dir)
    assert out.returncode == 1 and "not_pdf" in out.stderr
    empty = tmp_path / "empty.pdf"
    empty.write_bytes(b"")
    out = run_cli(capsys, "parse-page", str(empty), "--model", tiny_model_dir)
    assert out.returncode == 1 and "empty_file" in out.stderr


@pytest.mark.engine
def test_parse_page_replays_a_sample_page_through_the_engine(tiny_model_dir, parse_page):
    pdf, truth = os.path.join(ROOT, "examples", "memo.pdf"), os.path.join(ROOT, "examples", "ground_truth.json")
    rc, stdout, stderr = parse_page(pdf, "--model", tiny_model_dir, "--page", "1", "--format", "json", "--replay", truth)
    assert rc == 0, stderr[-3000:]
    obj = json.loads(stdout)
    gt = json.load(open(os.path.join(ROOT, "examples", "ground_truth.json")))
    memo = next(p for p in gt if p["page_info"]["source_pdf"] == "memo.pdf")
    assert obj["status"] == "ok" and obj["valid"] is True
    assert [r["content"] for r in obj["regions"]][:3] == [d["text"] for d in sorted(
        (d for d in memo["layout_dets"] if d["order"] is not None), key=lambda d: d["order"])][:3]
    assert obj["f_padoc"] < obj["f_seq"] and obj["n_branches"] == len(memo["layout_dets"])
    assert obj["output_tokens"] > 0 and obj["retries"] == 0  # every generated token, every attempt
    assert all(r["attempts"] == 1 and r["finish"] == "stop" for r in obj["regions"])


@pytest.mark.engine
def test_sigterm_stops_a_command_and_shuts_its_engine_down(tiny_model_dir, tmp_path):
    """SIGTERM unwinds a command like Ctrl-C: its engine shuts down and no vLLM engine-core process
    outlives it (with Python's default the core was left running, orphaned)."""
    import contextlib
    import signal
    import time

    import psutil

    log = open(tmp_path / "stderr.txt", "w+")
    proc = subprocess.Popen([*CLI, "bench", "steps", "--model", tiny_model_dir, "--batch", "1", "--tokens", "4000",
                             "--series", "prefill", "--prefill", "64"], cwd=ROOT, stdout=subprocess.DEVNULL,
                            stderr=log)
    cores: list = []
    try:
        deadline = time.monotonic() + 240
        while not cores and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.5)
            kids = psutil.Process(proc.pid).children(recursive=True)
            cores = [k for k in kids if "EngineCore" in " ".join(k.cmdline() or [k.name()])]
        assert cores, f"no engine core started: exit {proc.poll()}, {(tmp_path / 'stderr.txt').read_text()[-2000:]}"
        # up (the command says so once its engine is built), then decoding: the core, idle once started, has
        # worked a CPU-second since (the first request alone decodes 4,000 tokens)
        while time.monotonic() < deadline and "engine up in" not in (tmp_path / "stderr.txt").read_text():
            time.sleep(0.2)
        up = cores[0].cpu_times()
        while time.monotonic() < deadline and sum(cores[0].cpu_times()[:2]) < sum(up[:2]) + 1:
            time.sleep(0.2)
        assert proc.poll() is None, (tmp_path / "stderr.txt").read_text()[-2000:]
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 128 + signal.SIGTERM
        _, alive = psutil.wait_procs(cores, timeout=30)
        assert not alive, f"engine core outlived its command: {alive}"
    finally:
        for p in [proc, *cores]:  # nothing left behind when an assertion failed
            with contextlib.suppress(Exception):
                p.kill()
        log.close()


@pytest.mark.engine
def test_parse_page_prints_markdown_of_every_page(tiny_model_dir, parse_page):
    """Without --page and --format: every page of the PDF as Markdown on stdout (the teacher-forced
    truth, so exactly the truth's Markdown), one status line per page on stderr (report.pdf: 2 pages)."""
    from padoc_ray.groundtruth import load_truth
    from padoc_ray.protocol import quantized, to_markdown

    from tests.conftest import ROOT as root

    gt = os.path.join(root, "examples", "ground_truth.json")
    rc, stdout, stderr = parse_page(os.path.join(root, "examples", "report.pdf"), "--model", tiny_model_dir, "--replay",
                                    gt, "--longest-side", "400")  # a smaller image: less to encode, same forced output
    assert rc == 0, stderr[-3000:]
    truth = load_truth(gt)
    from padoc_ray.tokenizer import load_model_protocol

    vocab = load_model_protocol(tiny_model_dir).vocab
    want = "".join(to_markdown(quantized(truth[("report.pdf", i)], vocab)) for i in (0, 1))
    assert stdout == want and stdout.startswith("# ")
    status = [ln for ln in stderr.splitlines() if ln.startswith("[report.pdf page ")]
    assert [ln.split(" status")[0] for ln in status] == ["[report.pdf page 1:", "[report.pdf page 2:"]
    assert all("status=ok valid=True" in ln for ln in status)
