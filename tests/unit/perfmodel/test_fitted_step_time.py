"""The fitted step time (bench model --steps): one linear model over every series `bench steps` measures:
exact on a hand-made linear machine, reproducing a recorded run's stored fit, and predicting each of that
run's points from a fit of the others."""

from __future__ import annotations

import copy
import json
import os

import pytest

from padoc_ray.perfmodel.fitted import FittedStepTime, StepsJsonError, fit_points, fit_steps, points
from padoc_ray.perfmodel.step import StepLoad

from tests.conftest import ROOT  # noqa: E402
RECORDED = os.path.join(ROOT, "tests", "data", "bench_steps_tiny.json")

#: seconds of each term, for a hand-made report measured on an exactly linear machine
TRUE = {"fixed": 0.002, "per_seq": 5e-5, "per_prefill_token": 2e-5, "per_attention_pair": 1e-7, "per_kv_token": 3e-7,
        "per_request": 0.0015, "per_image": 0.004, "per_image_token": 1e-4}
OVERHEAD = 0.003  # what a first token costs beyond its step


def _step(load: StepLoad) -> float:
    return (TRUE["fixed"] + TRUE["per_seq"] * load.decode_seqs + TRUE["per_prefill_token"] * load.prefill_tokens
            + TRUE["per_attention_pair"] * load.pairs + TRUE["per_kv_token"] * load.distinct_kv_tokens
            + TRUE["per_request"] * load.new_requests + TRUE["per_image"] * load.images
            + TRUE["per_image_token"] * load.image_tokens)


def _decode(n: int, prompt: int, tokens: int, shared: bool) -> StepLoad:
    """The average of ``tokens`` steps in which n sequences (admitted in the first) decode over a prompt
    (shared but its last token, or each its own) plus half of ``tokens``."""
    ctx = n * (prompt + tokens / 2)
    kv = (prompt - 1) + n * (1 + tokens / 2) if shared else ctx
    return StepLoad(n, 0, round(ctx), attention_pairs=round(ctx), kv_tokens=round(kv), new_requests=n / tokens)


def _prefill(new: int, cached: int = 0, images: int = 0, image_tokens: int = 0, n: int = 1) -> StepLoad:
    """n requests admitted at once, each computing ``new`` tokens after the ``cached`` ones they share."""
    return StepLoad(0, n * new, n * (new + cached), images, image_tokens,
                    attention_pairs=n * (new * cached + new * (new + 1) // 2), kv_tokens=cached + n * new,
                    new_requests=n)


def hand_made() -> dict:
    """A bench steps report whose every row is the linear machine above, written out row by row."""
    prompt, tokens = 300, 64
    rows = [{"batch": n, "prompt_tokens": prompt, "step_ms": 1000 * _step(_decode(n, prompt, tokens, True))}
            for n in (1, 8, 64, 256)]
    ctx = [{"context_tokens": ln, "batch": 4, "tokens": tokens, "step_ms": 1000 * _step(_decode(4, ln, tokens, True))}
           for ln in (257, 2049, 8193)]
    own = [{"context_tokens": ln, "batch": 16, "tokens": tokens,
            "step_ms": 1000 * _step(_decode(16, ln, tokens, False))} for ln in (257, 1025, 4097)]
    pre = [{"prompt_tokens": p, "cached_tokens": 0, "ttft_ms": 1000 * (_step(_prefill(p)) + OVERHEAD)}
           for p in (256, 1024, 4096)]
    admit = [{"requests": n, "prompt_tokens": 1368, "cached_tokens": 1344,
              "wall_ms": 1000 * (_step(_prefill(24, 1344, n=n)) + OVERHEAD)} for n in (1, 4, 16)]
    vis = []
    for t in (48, 108, 252):
        e = t + 24
        vis.append({"prompt_tokens": e, "image_tokens": t, "cached_tokens": e - 8,
                    "new_image_ms": 1000 * (_step(_prefill(e, 0, 1, t)) + OVERHEAD),
                    "cached_image_ms": 1000 * (_step(_prefill(8, e - 8)) + OVERHEAD),
                    "text_prompt_ms": 1000 * (_step(_prefill(e)) + OVERHEAD)})
    return {"tokens": tokens, "rows": rows,
            "series": {"context": {"rows": ctx}, "distinct": {"rows": own}, "prefill": {"rows": pre},
                       "admit": {"rows": admit}, "vision": {"rows": vis}}}


def test_a_linear_machine_is_recovered_term_by_term():
    st = FittedStepTime.from_steps_json(hand_made())
    for term, want in TRUE.items():
        assert st.terms_s[term] == pytest.approx(want, rel=1e-6, abs=1e-12), term
    assert st.first_token_overhead_s == pytest.approx(OVERHEAD, rel=1e-6)
    assert st.residual["max_rel"] < 1e-9
    load = StepLoad(decode_seqs=100, prefill_tokens=500, context_tokens=200_000, images=2, image_tokens=3000,
                    attention_pairs=300_000, kv_tokens=50_000, new_requests=3)
    assert st.seconds(load) == pytest.approx(_step(load), rel=1e-9)
    assert st.first_token_seconds(load) == pytest.approx(_step(load) + OVERHEAD, rel=1e-9)
    d = st.describe()
    assert d["kind"] == "fitted" and d["source"] == "dict" and set(d["terms_ms"]) == set(TRUE)


def test_a_term_the_data_makes_negative_is_dropped_not_kept_negative():
    rep = hand_made()
    for r in rep["rows"]:  # decode steps that get cheaper per sequence: a negative per_seq fits them best
        r["step_ms"] -= 1000 * 6e-5 * r["batch"]
    fit = fit_steps(rep)
    assert "per_seq" in fit["dropped"] and fit["terms_s"]["per_seq"] == 0.0
    assert all(v >= 0 for v in fit["terms_s"].values())


def _shape(load: StepLoad) -> tuple:
    """What a step's price depends on: every term's count."""
    return (load.decode_seqs, load.prefill_tokens, load.context_tokens, load.images, load.image_tokens, load.pairs,
            load.distinct_kv_tokens, load.new_requests)


def test_the_recorded_run_s_stored_fit_is_reproduced():
    """A real `bench steps --json` run of the tiny model on this machine: today's code reads the same points
    from its rows (the loads, times and series the report stored point by point when it was recorded), fits
    the terms and residual the report stored, and prices every point as the stored fit did. The residual is
    the largest relative error over the points (so no point is further off than it)."""
    with open(RECORDED) as f:
        rep = json.load(f)
    st = FittedStepTime.from_steps_json(RECORDED)
    stored = rep["step_model"]
    assert st.terms_s == pytest.approx(stored["terms_s"], rel=1e-9, abs=1e-15)
    assert st.residual["max_rel"] == pytest.approx(stored["residual"]["max_rel"], rel=1e-9)
    pts = points(rep)
    assert len(pts) == stored["points"] == len(rep["rows"]) + sum(
        len(rep["series"][s]["rows"]) * (3 if s == "vision" else 1) for s in ("prefill", "context", "distinct", "admit", "vision"))
    for series, load, measured, first in pts:
        got = st.first_token_seconds(load) if first else st.seconds(load)
        assert abs(got - measured) / measured <= st.residual["max_rel"] + 1e-9, (series, load)
    assert {p["series"] for p in stored["per_point"]} == {"decode", "context", "distinct", "admit", "prefill", "vision"}
    assert len(stored["per_point"]) == len(pts)
    for (series, load, measured, first), was in zip(pts, stored["per_point"], strict=True):
        assert (series, first) == (was["series"], was["first_token"])
        assert _shape(load) == _shape(StepLoad(**was["load"])), series
        assert 1000 * measured == pytest.approx(was["measured_ms"], abs=1e-3)
        got = st.first_token_seconds(load) if first else st.seconds(load)
        assert 1000 * got == pytest.approx(was["fitted_ms"], abs=1e-4), (series, load)  # stored to 4 decimals


def test_a_recorded_point_left_out_of_the_fit_is_predicted_within_twice_the_fit_s_residual():
    """Held out: each point of the recorded run, priced by a fit of all the other points, is within twice the
    largest relative error that fit has on its own points (1.6x at worst on this run). The fitted function
    predicts a step it has not seen about as well as the ones it was fitted on: its terms are the machine's,
    not a curve through its own rows."""
    with open(RECORDED) as f:
        pts = points(json.load(f))
    for i, (series, load, measured, first) in enumerate(pts):
        fit = fit_points(pts[:i] + pts[i + 1:])
        st = FittedStepTime(fit["terms_s"], fit["residual"], first_token_overhead_s=fit["first_token_overhead_s"])
        got = st.first_token_seconds(load) if first else st.seconds(load)
        assert abs(got - measured) / measured <= 2 * fit["residual"]["max_rel"], (i, series, load)


def test_an_old_steps_json_is_refused_naming_what_it_lacks(tmp_path):
    old = {"tokens": 128, "rows": [{"batch": 1, "step_ms": 2.0}], "fit": {}, "batching_gain_left": []}
    with pytest.raises(StepsJsonError, match="no prefill, context, distinct, admit, vision series"):
        FittedStepTime.from_steps_json(old)
    partial = hand_made()
    del partial["series"]["vision"]
    with pytest.raises(StepsJsonError, match="no vision series"):
        FittedStepTime.from_steps_json(partial)
    before = hand_made()  # a report from before the distinct series
    del before["series"]["distinct"]
    with pytest.raises(StepsJsonError, match="no distinct series"):
        FittedStepTime.from_steps_json(before)
    path = tmp_path / "old.json"
    path.write_text(json.dumps(old))
    with pytest.raises(StepsJsonError, match="rerun: padoc-ray bench steps --json"):
        FittedStepTime.from_steps_json(str(path))
    path.write_text("[1, 2]")
    with pytest.raises(StepsJsonError, match="is an object, got list"):
        FittedStepTime.from_steps_json(path)
    with pytest.raises(StepsJsonError, match="cannot read"):
        FittedStepTime.from_steps_json(tmp_path / "missing.json")


def test_rows_missing_a_field_or_a_time_are_clear_errors():
    rep = hand_made()
    del rep["rows"][0]["prompt_tokens"]
    with pytest.raises(StepsJsonError, match="prompt_tokens"):
        FittedStepTime.from_steps_json(rep)
    rep = hand_made()
    del rep["series"]["prefill"]["rows"][0]["ttft_ms"]
    with pytest.raises(StepsJsonError, match="lacks 'ttft_ms'"):
        FittedStepTime.from_steps_json(rep)
    rep = copy.deepcopy(hand_made())
    rep["series"]["context"]["rows"][0]["step_ms"] = 0.0
    with pytest.raises(StepsJsonError, match="not positive"):
        FittedStepTime.from_steps_json(rep)
    with pytest.raises(ValueError, match="non-negative"):
        FittedStepTime({"fixed": -1.0}, {})
