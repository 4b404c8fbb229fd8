"""The batch job's raster stage reads a page's text layer only when the job drafts with it (``--text-layer
speculate``, the default); under ``off`` no page pays for a layer nothing would read, and none travels to the
engine. The stage's own function, on a local file, without Ray."""

from __future__ import annotations

from dataclasses import replace

import pyarrow as pa
import pytest

from padoc_ray.host import HostConfig
from padoc_ray.output.rows import TEXT_LAYER_KEY
from padoc_ray.pipeline.config import BatchConfig, EnginesConfig
from padoc_ray.pipeline.stages import _rasterize_doc
from padoc_ray.protocol.text_layer import TextLayer
from padoc_ray.scheduler import SchedulerConfig

from tests.helpers.pdf_factory import text_pdf


@pytest.mark.parametrize("mode", ["speculate", "off"])
def test_the_raster_stage_carries_a_text_layer_only_where_drafts_read_it(tmp_path, mode):
    src = tmp_path / "in"
    src.mkdir()
    (src / "a.pdf").write_bytes(text_pdf(2))
    host = HostConfig(scheduler=SchedulerConfig(text_layer=mode))
    cfg = replace(BatchConfig(input=str(src), output=str(tmp_path / "out"), model="m"),
                  engines=EnginesConfig(host=host))
    base = {"run_id": "r", "uri": str(src / "a.pdf"), "mode": "fork", "model_id": "m"}
    tables = list(_rasterize_doc(str(src / "a.pdf"), set(), cfg, base))
    rows = pa.concat_tables(tables).to_pylist()
    assert [r["page_index"] for r in rows] == [0, 1] and all(r["image_bytes"] for r in rows)
    layers = [r[TEXT_LAYER_KEY] for r in rows]
    if mode == "off":
        assert layers == [None, None]
    else:
        assert all(TextLayer.from_bytes(b).text.strip() for b in layers)
