"""Parse pages on one local engine, without Ray: what ``padoc-ray demo`` and ``parse-page`` run.

Starts one engine, loads the checkpoint's protocol, renders PDF pages (or takes images), and runs
pages through the scheduler with bounded concurrency. Optional teacher forcing from OmniDocBench
ground truth (``--replay``) makes a random-weight model produce real-length, correct outputs.
"""

from __future__ import annotations

import asyncio
import json
import os
from dataclasses import dataclass
from typing import Iterable, Sequence

from padoc_ray.pdf import PdfError, RenderConfig, doc_id_of, iter_pages, open_pdf
from padoc_ray.protocol import Page, page_from_omnidocbench
from padoc_ray.scheduler import PageInput, PageRecord, SchedulerConfig, replay_input, run_page

IMAGE_EXTS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")


@dataclass
class LocalPage:
    source: str
    page_index: int
    inp: PageInput | None
    error: PdfError | None = None
    truth: Page | None = None


def load_truth(gt_path: str | None) -> dict[tuple[str, int], Page]:
    """Ground truth keyed by (source PDF name, page_no) and by (image name, 0)."""
    if not gt_path:
        return {}
    with open(gt_path, "rb") as f:
        return truth_from_json(f.read())


def truth_from_json(data: bytes) -> dict[tuple[str, int], Page]:
    objs = json.loads(data.decode("utf-8"))
    out = {}
    for o in objs:
        page = page_from_omnidocbench(o)
        info = o.get("page_info", {})
        if info.get("source_pdf"):  # a page of a PDF: (file name, 0-based page_no)
            out[(os.path.basename(info["source_pdf"]), int(info.get("page_no", 0) or 0))] = page
        if info.get("image_path"):  # the page image itself is a one-page document; OmniDocBench's
            # page_no is then the page's number in a PDF we do not have, so it is not part of the key
            out.setdefault((os.path.basename(info["image_path"]), 0), page)
    return out


def load_pages(paths: Sequence[str], *, render: RenderConfig = RenderConfig(), pages: Iterable[int] | None = None,
               truth: dict[tuple[str, int], Page] | None = None) -> list[LocalPage]:
    """Render every requested page of PDFs, or take images as single pages."""
    from PIL import Image

    truth = truth or {}
    want = sorted(set(pages)) if pages is not None else None
    out: list[LocalPage] = []
    for path in paths:
        name = os.path.basename(path)
        if path.lower().endswith(IMAGE_EXTS):
            img = Image.open(path).convert("RGB")
            inp = PageInput(page_id=f"{name}:0", image=img, width=img.width, height=img.height,
                            cache_salt=name, image_path=name)
            out.append(LocalPage(name, 0, inp, truth=truth.get((name, 0))))
            continue
        with open(path, "rb") as f:
            data = f.read()
        try:
            doc = open_pdf(data)
        except PdfError as e:
            out.append(LocalPage(name, -1, None, e))
            continue
        doc_id = doc_id_of(data)
        indices = [i for i in want if 0 <= i < len(doc)] if want is not None else None
        for r in iter_pages(doc, indices, render):
            if isinstance(r, PdfError):
                out.append(LocalPage(name, -1, None, r))
                continue
            inp = PageInput(page_id=f"{doc_id[:16]}:{r.index}", image=r.image, width=r.image.width,
                            height=r.image.height, cache_salt=doc_id, page_no=r.index, image_path=name)
            out.append(LocalPage(name, r.index, inp, truth=truth.get((name, r.index))))
        doc.close()
    return out


async def parse_local(engine, proto, pages: list[LocalPage], *, mode: str = "fork",
                      cfg: SchedulerConfig = SchedulerConfig(), concurrency: int = 4,
                      replay: bool = False) -> list[PageRecord | None]:
    """Run pages with at most ``concurrency`` in flight; returns records in input order."""
    sem = asyncio.Semaphore(max(1, concurrency))

    async def one(p: LocalPage) -> PageRecord | None:
        if p.inp is None:
            return None
        inp = replay_input(proto, p.truth, p.inp, mode) if (replay and p.truth is not None) else p.inp
        async with sem:
            return await run_page(engine, proto, inp, mode=mode, cfg=cfg)

    return list(await asyncio.gather(*(one(p) for p in pages)))


def start_engine(model: str, **overrides):
    """The CPU-tuned engine when no GPU is visible, else the paper's defaults."""
    from padoc_ray.engine.config import EngineConfig, cpu_engine_config
    from padoc_ray.engine.vllm_engine import VllmEngine

    try:
        import torch

        gpu = torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        gpu = False
    if gpu:
        import importlib.util

        if importlib.util.find_spec("flashinfer") is not None:
            overrides.setdefault("attention_backend", "FLASHINFER")  # the paper's serving setup
        cfg = EngineConfig(model=model, **overrides)
    else:
        cfg = cpu_engine_config(model, **overrides)
    return VllmEngine(cfg)
