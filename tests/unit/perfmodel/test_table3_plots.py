"""The serving benchmark's figures (padoc_ray/perfmodel/table3.py's ``plot_report``): one PNG per figure, a line
per mode. A figure none of whose modes has a value (P95 latency of valid pages in a run where no page was
valid, as a random model's free run gives) says so on the figure instead of drawing an empty legend, which
matplotlib warns about on the user's console. From a real `bench serve` run: tests/engine/bench/test_bench_serve.py."""

from __future__ import annotations

import warnings

import pytest

from padoc_ray.perfmodel.table3 import PLOTS, plot_report


def _report(pages_per_s, p95) -> dict:
    rows = [{"mode": m, "concurrency": c, "valid_pages_per_s": pages_per_s, "p95_e2e_s": p95}
            for m in ("fork", "sequential") for c in (1, 4, 16)]
    return {"rows": rows, "config": {"target": "engine"}}


@pytest.mark.parametrize("pages_per_s, p95", [(2.5, 0.8), (0.0, None)], ids=["values", "no-valid-page"])
def test_each_figure_is_written_without_a_warning(tmp_path, pages_per_s, p95):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # matplotlib's "No artists with labels found to put in legend" included
        names = plot_report(_report(pages_per_s, p95), str(tmp_path))
    assert names == [name for _, _, name in PLOTS]
    for name in names:
        data = (tmp_path / name).read_bytes()
        assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
