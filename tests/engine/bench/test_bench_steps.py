"""`padoc-ray bench steps`: engine step time vs batch size, and the batching gain left at each size."""

from __future__ import annotations

import asyncio
import os

import pytest

from padoc_ray.bench.steps.run import (
    StepsConfig,
    batching_gain_left,
    fit_linear,
    forced_tokens,
    format_report,
    measure,
    page_image,
)
from padoc_ray.engine.fake import ScriptedEngine

from tests.conftest import ROOT  # noqa: E402
PAPER_PDF = os.path.join(ROOT, "examples", "paper.pdf")


def test_fit_recovers_a_line_and_its_saturation_rate():
    rows = [{"batch": n, "step_ms": 1.5 + 0.05 * n} for n in (1, 4, 16, 64)]
    fit = fit_linear(rows)
    assert fit["fixed_ms"] == pytest.approx(1.5) and fit["per_seq_ms"] == pytest.approx(0.05)
    assert fit["saturation_tokens_per_s"] == pytest.approx(20000.0)
    flat = fit_linear([{"batch": n, "step_ms": 2.0} for n in (1, 8, 64)])  # a step that does not grow
    assert flat["per_seq_ms"] == 0 and flat["saturation_tokens_per_s"] is None
    one = fit_linear([{"batch": 4, "step_ms": 3.0}])
    assert one == {"fixed_ms": 3.0, "per_seq_ms": 0.0, "saturation_tokens_per_s": None}


def test_gain_left_is_the_best_rate_over_the_rate_at_each_batch():
    rows = [{"batch": 16, "step_ms": 2.5, "tokens_per_s": 6000.0}, {"batch": 1, "step_ms": 1.25, "tokens_per_s": 700.0},
            {"batch": 128, "step_ms": 10.0, "tokens_per_s": 13000.0}]
    gains = batching_gain_left(rows)
    assert [g["batch"] for g in gains] == [1, 16, 128]
    got = {g["batch"]: g["batching_gain_left"] for g in gains}
    assert got == {1: pytest.approx(18.571, abs=1e-3), 16: pytest.approx(2.167, abs=1e-3), 128: 1.0}
    text = format_report({"rows": rows, "batching_gain_left": gains, "fit": fit_linear(rows)})
    assert "| 16 | 2.50 | 2.00x | 6000 | 2.17x |" in text and "| 128 | 10.00 | 8.00x | 13000 | 1.00x |" in text


@pytest.mark.parametrize("kw, msg", [
    ({"batches": ()}, "positive"), ({"batches": (0, 4)}, "positive"), ({"batches": (4, 4)}, "distinct"),
    ({"tokens": 1}, "tokens"), ({"repeat": 0}, "repeat"),
])
def test_config_refuses_nonsense(kw, msg):
    with pytest.raises(ValueError, match=msg):
        StepsConfig(**kw)


def test_the_speed_probe_is_a_decode_row_at_its_batch(cpu_engine, model_protocol, loop_thread):
    """bench steps' and bench serve --speed-probe's probe: PROBE_BATCH requests decoding the forced tokens
    on the real engine, its median step in ms."""
    from padoc_ray.bench.steps.run import PROBE_BATCH, speed_probe

    assert PROBE_BATCH == 16
    ms = loop_thread.run(speed_probe(cpu_engine, model_protocol, page_image(PAPER_PDF), tokens=4, repeat=1,
                                     batch=2), timeout=300)
    assert isinstance(ms, float) and 0 < ms < 60_000


def test_a_request_that_stops_short_is_an_error_not_a_fast_step():
    eng = ScriptedEngine(script=lambda req: list(req.forced_tokens)[:3])  # stops after 3 of 8 tokens
    cfg = StepsConfig(batches=(2,), tokens=8, repeat=1)
    with pytest.raises(RuntimeError, match="decoded 3 tokens, not 8"):
        asyncio.run(measure(eng, [1, 2, 3], [7], None, list(range(10, 18)), cfg))


def test_measure_on_the_real_engine(cpu_engine, model_protocol, loop_thread):
    """Every request of every batch decodes exactly the forced tokens on the real engine, and each
    batch gets a row with its step time and rate."""
    cfg = StepsConfig(batches=(1, 3), tokens=6, repeat=2)
    forced = forced_tokens(model_protocol.tokenizer, cfg.tokens)
    specials = {model_protocol.tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_end|>")}
    assert len(forced) == 6 and not set(forced) & (model_protocol.vocab.control_ids | specials)
    image = page_image(PAPER_PDF)
    rows = loop_thread.run(measure(cpu_engine, model_protocol.prompt_ids("fork"),
                                   forced_tokens(model_protocol.tokenizer, 3), image, forced, cfg), timeout=300)
    assert [r["batch"] for r in rows] == [1, 3]
    for r in rows:
        assert len(r["runs_s"]) == 2 and r["wall_s"] > 0
        assert r["step_ms"] == pytest.approx(1000 * r["wall_s"] / 6, rel=1e-2)
        assert r["tokens_per_s"] == pytest.approx(r["batch"] * 6 / r["wall_s"], rel=1e-2)
    assert [g["batch"] for g in batching_gain_left(rows)] == [1, 3]


def test_cli_refuses_bad_input_before_starting_an_engine(tiny_model_dir, tmp_path, capsys):
    from padoc_ray.cli import main

    junk = tmp_path / "junk.txt"
    junk.write_text("not a page")
    for argv, msg in (
        (["--model", tiny_model_dir, "--image", str(junk)], "not_pdf"),
        (["--model", tiny_model_dir, "--image", str(tmp_path / "missing.png")], "is not a file"),
        (["--model", str(tmp_path)], "not a padoc-ray checkpoint"),
        (["--model", tiny_model_dir, "--batch", "1,500"], "exceed the engine's max_num_seqs 384"),
        (["--model", tiny_model_dir, "--tokens", "1"], "tokens must be >= 2"),
        (["--model", str(tmp_path / "nothing")], "build one with: padoc-ray build-tiny-model"),
    ):
        with pytest.raises(SystemExit) as e:
            main(["bench", "steps", *argv])
        assert e.value.code == 2
        assert msg in capsys.readouterr().err


def test_the_model_series_on_the_real_engine(cpu_engine, model_protocol, loop_thread):
    """Prefill prompts are new to the cache, context prefixes are served from it, and a new image costs
    more than the same page cached; image tokens are what Qwen's processor makes of the image's size."""
    from padoc_ray.perfmodel.workload import image_tokens
    from padoc_ray.bench.steps.series import measure_admit, measure_context, measure_prefill, measure_vision

    text = lambda n: forced_tokens(model_protocol.tokenizer, n)  # noqa: E731
    pre = loop_thread.run(measure_prefill(cpu_engine, text, (64, 512), 2), timeout=300)
    assert [r["prompt_tokens"] for r in pre] == [64, 512]
    assert all(r["cached_tokens"] == 0 and len(r["runs_ms"]) == 2 and r["ttft_ms"] == min(r["runs_ms"]) for r in pre)
    ctx = loop_thread.run(measure_context(cpu_engine, text, (256,), 2, text(4), 1), timeout=300)
    assert ctx[0]["context_tokens"] == 257 and ctx[0]["batch"] == 2 and ctx[0]["cached_tokens"] >= 256 - 32
    image = page_image(PAPER_PDF, 256)
    page = (model_protocol.prompt_ids("fork"), image)
    expanded = len(page[0]) - 1 + image_tokens(*image.size, min_pixels=4096, max_pixels=262144) + 256 + 1
    for shared in (True, False):  # the page and 256 text tokens: one prefix for both sequences, or one each
        before = cpu_engine.prefix_cache_counters()
        (row,) = loop_thread.run(measure_context(cpu_engine, text, (256,), 2, text(4), 1, shared=shared, page=page),
                                 timeout=300)
        after = cpu_engine.prefix_cache_counters()
        computed = ((after["prefix_cache_queries"] - before["prefix_cache_queries"])
                    - (after["prefix_cache_hits"] - before["prefix_cache_hits"]))
        assert row["context_tokens"] == expanded and row["image"] and row["text_tokens"] == 256
        assert row["cached_tokens"] >= expanded - 32  # the timed requests found their prefix cached
        if shared:  # one prefix computed (the timed requests recompute at most their last partial block)
            assert expanded <= computed <= expanded + 2 * 32
        else:  # each sequence computed its own (its own image uuid and salt)
            assert computed >= 2 * (expanded - 32)
    admit = loop_thread.run(measure_admit(cpu_engine, text, page, (1, 3), 256, 2), timeout=300)
    assert [r["requests"] for r in admit] == [1, 3]
    for r in admit:  # the page and the text prefix cached, the 4 own tokens (and a partial block) computed
        assert r["prompt_tokens"] == expanded + 3 and r["prompt_tokens"] - 36 <= r["cached_tokens"] < r["prompt_tokens"]
        assert len(r["runs_ms"]) == 2 and r["wall_ms"] == min(r["runs_ms"]) > 0
    vis = loop_thread.run(measure_vision(cpu_engine, model_protocol.prompt_ids("fork"), text, [(256, image)], 1),
                          timeout=300)
    (row,) = vis
    assert row["image_tokens"] == image_tokens(*image.size, min_pixels=4096, max_pixels=262144)  # its preprocessor
    assert row["prompt_tokens"] == len(model_protocol.prompt_ids("fork")) - 1 + row["image_tokens"]
    assert row["cached_tokens"] >= row["prompt_tokens"] - 32  # the second request found the page cached
    assert row["encoder_ms"] == pytest.approx(row["new_image_ms"] - row["text_prompt_ms"], abs=1e-2)


@pytest.mark.parametrize("argv, msg", [
    (["--series", "prefill,bogus"], "unknown series ['bogus']"),
    (["--prefill", "8192"], "max_num_batched_tokens 4096"),
    (["--context", "40000"], "max_model_len"),
    (["--image-sides", "256,256"], "image_sides sizes must be distinct"),
    (["--series-repeat", "0"], "series_repeat must be >= 1"),
    (["--distinct", "40000"], "distinct sizes + tokens must fit"),
    (["--distinct-batch", "0"], "distinct_batch must be >= 1"),
    (["--series", "distinct", "--distinct", ""], "needs at least one distinct size"),
    (["--admit", "0,4"], "admit sizes must be distinct positive integers"),
    (["--admit-prefix", "-1"], "admit_prefix must be >= 0"),
])
def test_cli_refuses_bad_series_before_starting_an_engine(tiny_model_dir, capsys, argv, msg):
    from padoc_ray.cli import main

    with pytest.raises(SystemExit) as e:
        main(["bench", "steps", "--model", tiny_model_dir, *argv])
    assert e.value.code == 2 and msg in capsys.readouterr().err
