"""The span map: each region's place in the page's ``markdown``, and old outputs without it still read."""

from __future__ import annotations

import os

import pyarrow as pa
import pyarrow.parquet as pq

from padoc_ray import status
from padoc_ray.groundtruth import truth_from_json
from padoc_ray.output import rows
from padoc_ray.output.reader import read_rows
from padoc_ray.output.show import find_row
from padoc_ray.pipeline import ledger
from padoc_ray.pipeline.pages import read_pages
from padoc_ray.protocol.render import FURNITURE, region_markdown
from tests.conftest import ROOT
from padoc_ray.scheduler import PageRecord

EXAMPLES = os.path.join(ROOT, "examples")


def demo_rows() -> list[dict]:
    """A finished row for every demo page (examples/ground_truth.json), built the batch job's way."""
    with open(os.path.join(EXAMPLES, "ground_truth.json"), "rb") as f:
        truth = truth_from_json(f.read())
    out = []
    for (name, index), page in truth.items():
        base = rows.base_row(run_id="r", uri=f"/in/{name}", doc_id=name * 8, page_index=index,
                             page_count=2, mode="fork", model_id="m")
        rec = PageRecord(page_id=f"{name}:{index}", mode="fork", status=status.OK, valid=True, page=page)
        out.append(rows.page_row(base, rec))
    return out


def test_every_region_is_found_at_its_span():
    got = demo_rows()
    assert len(got) == 5  # the five demo pages
    checked = 0
    # through Parquet, as readers see it
    for row in rows.to_table(got).to_pylist():
        md, spans, regions = row["markdown"], row["spans"], row["regions"]
        page = rows.page_from_row(row)
        want = [(i, region_markdown(r, i)) for i, r in enumerate(page.regions)
                if r.category not in FURNITURE and region_markdown(r, i) is not None]
        assert [s["order"] for s in spans] == [i for i, _ in want]  # one per region with content, reading order
        for s, (i, block) in zip(spans, want, strict=True):
            assert md[s["start"]:s["end"]] == block
            assert regions[s["order"]]["order"] == i
            checked += 1
        ends = [(s["start"], s["end"]) for s in spans]
        assert all(a < b for a, b in ends)
        assert all(prev[1] <= nxt[0] for prev, nxt in zip(ends, ends[1:], strict=False))  # no overlap, in order
    assert checked > 20


def test_error_rows_have_no_spans():
    base = rows.base_row(run_id="r", uri="/in/x.pdf", doc_id=None, page_index=-1, page_count=None, mode="fork",
                         model_id="m")
    row = rows.error_row(base, status.NOT_PDF, "not a PDF")
    assert row["spans"] == [] and rows.to_table([row]).column("spans").to_pylist() == [[]]


def test_outputs_written_before_spans_still_read(tmp_path):
    """Resume (the driver's scan and documents table), the reader and `show` on files without `spans`."""
    old = pa.schema([f for f in rows.PAGE_SCHEMA if f.name != "spans"])
    table = rows.to_table(demo_rows()[:3]).drop_columns(["spans"])
    assert table.schema == old
    pages = tmp_path / "out" / "pages"
    pages.mkdir(parents=True)
    pq.write_table(table, pages / "r_listing.parquet")
    got = read_rows(str(tmp_path / "out"))
    assert got.num_rows == 3 and got.column("spans").null_count == 3
    assert got.column("markdown").to_pylist() == table.column("markdown").to_pylist()
    from padoc_ray.storage import StorageConfig

    keys = read_pages(str(pages), StorageConfig())
    listed = sorted({(u, 1) for u in table.column("source_uri").to_pylist()})
    docs = ledger.documents_table(keys, listed, None, None).to_pylist()
    assert [(d["pages_ok"], d["status"]) for d in docs] == [(1, status.DOC_INCOMPLETE), (2, status.DOC_OK)]
    name = os.path.basename(table.column("source_uri")[0].as_py())
    assert find_row(str(tmp_path / "out"), name, table.column("page_index")[0].as_py())["status"] == status.OK
