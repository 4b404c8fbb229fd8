"""The real CPU engine with a checkpoint family's host settings, and one page through a PageHost on it, for the
family tests (tests/engine/protocol/test_*_on_vllm.py): the engine's requests are recorded, and each one's
prompt can be expanded by vLLM itself."""

from __future__ import annotations

import asyncio
import contextlib

from PIL import Image

from padoc_ray.protocol import Page

from tests.engine.scheduler.test_run_page_on_vllm import Recording


@contextlib.contextmanager
def family_engine(model_dir: str, loop_thread):
    """(the engine's settings as the host gives them to the checkpoint's family, a started VllmEngine)."""
    from padoc_ray.engine.vllm_engine import VllmEngine
    from padoc_ray.host import HostConfig

    cfg = HostConfig(preset="cpu").engine_config(model_dir)

    async def make():
        return VllmEngine(cfg)

    async def stop():
        eng.shutdown()
        await asyncio.sleep(0.1)

    eng = loop_thread.run(make(), timeout=300)
    try:
        yield cfg, eng
    finally:
        loop_thread.run(stop(), timeout=120)


def parse_one(loop_thread, model_dir: str, engine, truth: Page | None, name: str = "p.png", mode: str = "fork",
              size: tuple[int, int] = (612, 792), **cfg):
    """One white page (``truth``'s size, else ``size``) through a PageHost on ``engine``, teacher-forced with
    ``truth`` (None: decoded freely): (host, its PageRecord, the engine requests it made)."""
    from padoc_ray.host import HostConfig, PageHost, PageRequest

    rec_engine = Recording(engine)
    if truth is not None:
        size = (truth.width, truth.height)

    async def go():
        host = await PageHost(model_dir, HostConfig(preset="cpu", mode=mode, **cfg),
                              truth={(name, 0): truth} if truth is not None else None, engine=rec_engine).start()
        rec = await host.parse(PageRequest(doc_id="d" * 64, page_index=0, source_name=name,
                                           image=Image.new("RGB", size, "white")))
        return host, rec

    host, rec = loop_thread.run(go(), timeout=300)
    return host, rec, rec_engine.requests


def expanded_prompt(loop_thread, engine, req) -> list[int]:
    """``req``'s prompt as vLLM expands it (the image placeholder replaced by its tokens)."""
    from vllm import SamplingParams

    async def go():
        out = None
        params = SamplingParams(max_tokens=1, detokenize=False)
        async for out in engine.llm.generate(engine._prompt(req), params, f"expand-{req.request_id}"):
            pass
        return list(out.prompt_token_ids)

    return loop_thread.run(go(), timeout=120)
