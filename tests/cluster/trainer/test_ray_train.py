"""The trainer on Ray: a 2-worker Ray Train run (FSDP2 on gloo, from this process as a driver of the
worker's `ray start` cluster: conftest's ``ray_driver``) with checkpoint, resume and gradients compared with a single
process, and the Ray job entry point jobs/train.py (a child process) with the `train` command's flags.
The trainer in one process: tests/unit/trainer/test_trainer.py."""

from __future__ import annotations

import json
import os

import pytest

import torch

from padoc_ray.protocol import page_to_omnidocbench
from padoc_ray.trainer.packing import Packer, pages_from_omnidocbench

from tests.unit.trainer.test_trainer import SMALL_PIXELS, _image, _page


# ---- the Ray job entry point ----------------------------------------------------------------------------
def test_ray_job_entry_point_has_the_same_flags():
    import subprocess
    import sys

    from tests.conftest import ROOT as root
    r = subprocess.run([sys.executable, os.path.join(root, "jobs", "train.py"), "--help"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 0
    for flag in ("--model", "--gt", "--images", "--steps", "--backend", "--workers", "--out", "--lr", "--max-len",
                 "--grad-accum", "--checkpoint-every", "--seed", "--address", "--resume"):
        assert flag in r.stdout, flag


# ---- Ray Train: 2 workers, FSDP2 on gloo -------------------------------------------------------------
def _corpus(root, n: int = 4) -> tuple[str, str]:
    imgs = root / "images"
    imgs.mkdir(parents=True)
    objs = []
    for i in range(n):
        page = _page([f"page {i} title", "word " * (2 + 3 * i), f"{i * 7} items"], image_path=f"p{i}.png")
        objs.append(page_to_omnidocbench(page))
        _image(i).save(imgs / f"p{i}.png")
    gt = root / "gt.json"
    gt.write_text(json.dumps(objs))
    return str(gt), str(imgs)


@pytest.fixture(scope="module")
def ray_cpu(ray_driver):
    """conftest's ray_driver: this process joined to the worker's `ray start` cluster, token auth on."""
    import ray.train  # noqa: F401

    return ray_driver


@pytest.mark.slow
def test_ray_train_two_workers_checkpoint_resume_and_gradients(tmp_path, tiny_model_dir, ray_cpu):
    from dataclasses import replace

    from transformers import AutoModelForImageTextToText

    from padoc_ray.trainer.config import (DataConfig, LoopConfig, OptimConfig, PackingConfig, RayConfig, StepConfig,
                                          TrainConfig)
    from padoc_ray.trainer.loop import Trainer, batch_for_step, load_model, sample_loss
    from padoc_ray.trainer.ray_train import read_metrics, run_training

    gt, images = _corpus(tmp_path / "corpus")
    out = tmp_path / "out"
    base = TrainConfig(model=tiny_model_dir, out=str(out),
                       data=DataConfig(gt=gt, images=images, packing=PackingConfig(max_len=256, max_pixels=SMALL_PIXELS)),
                       loop=LoopConfig(steps=2, seed=3, optim=OptimConfig(lr=1e-3, warmup_steps=0)),
                       ray=RayConfig(workers=2, checkpoint_every=1))

    def job(steps: int, *, out: str = str(out), **ray) -> TrainConfig:
        return replace(base, out=out, loop=replace(base.loop, steps=steps), ray=replace(base.ray, **ray))

    dump = str(tmp_path / "grads.pt")
    s1 = run_training(job(2, grad_dump=dump))
    m1 = read_metrics(str(out / "metrics.jsonl"))
    assert [m["step"] for m in m1] == [1, 2] and s1["steps"] == 2 and s1["device"] == "cpu"
    assert all(m["workers"] == 2 and m["tokens"] > 0 and m["seconds"] > 0 for m in m1)
    ckpts = sorted(p.name for p in (out / "ray_results" / "train").glob("checkpoint_*") if p.is_dir())
    assert len(ckpts) == 2

    # the 2-worker reduced gradients of step 1 == one process on the same two pages (FSDP sums,
    # each worker divides by the global label count: the token mean over both pages)
    dumped = torch.load(dump)
    sources = [src for per_rank in dumped["sources"] for src in per_rank]
    assert len(sources) == 2 and len(set(sources)) == 2
    packer = Packer(tiny_model_dir, PackingConfig(max_len=256, max_pixels=SMALL_PIXELS))
    refs = {r.source: r for r in pages_from_omnidocbench(gt, images)[0]}
    samples = [packer.pack_ref(refs[s]) for s in sources]
    model = load_model(tiny_model_dir)
    n_total = sum(s.num_labels for s in samples)
    for s in samples:
        (sample_loss(model, s, "tree_varlen")[0] / n_total).backward()
    assert dumped["grads"].keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for name, p in model.named_parameters():
        torch.testing.assert_close(dumped["grads"][name], p.grad, rtol=1e-4, atol=1e-7, msg=name)

    # rerunning the same run with more steps resumes from the step-2 checkpoint
    s2 = run_training(job(3))
    m2 = read_metrics(str(out / "metrics.jsonl"))
    assert [m["step"] for m in m2] == [1, 2, 3] and m2[:2] == m1  # steps 1-2 not redone
    assert s2["first_loss"] == m1[0]["loss"]

    # the export equals a single-process replay of the same three steps (resume restored model and
    # optimizer: otherwise step 3 would differ by ~lr)
    refs_list = list(refs.values())
    shards = [[packer.pack_ref(r) for r in refs_list[rank::2]] for rank in range(2)]
    ref_model = load_model(tiny_model_dir)
    trainer = Trainer(ref_model, OptimConfig(lr=1e-3, warmup_steps=0), StepConfig(), 2)
    for step in (1, 2, 3):
        trainer.total_steps = 2 if step < 3 else 3
        batch = [shards[r][batch_for_step(len(shards[r]), step, 1, 3 * 7919 + r)[0]] for r in range(2)]
        m = trainer.step(step, batch)
        assert m["loss"] == pytest.approx(m2[step - 1]["loss"], rel=1e-5)
    # --resume DIR: a new run (its own --out) starts from the step-3 checkpoint of this one: it trains
    # only step 4, from the restored model (its loss is the single-process step 4 after steps 1-3)
    from padoc_ray.trainer.ray_train import STATE_FILE

    ckpt3 = next(p for p in (out / "ray_results" / "train").glob("checkpoint_*")
                 if p.is_dir() and json.load(open(p / STATE_FILE))["step"] == 3)
    out2 = tmp_path / "out2"
    run_training(job(4, out=str(out2), resume=str(ckpt3)))
    m3 = read_metrics(str(out2 / "metrics.jsonl"))
    assert [m["step"] for m in m3] == [4]  # steps 1-3 come from the checkpoint
    continued = load_model(tiny_model_dir)
    continued.load_state_dict(ref_model.state_dict())
    ref4 = Trainer(continued, OptimConfig(lr=1e-3, warmup_steps=0), StepConfig(), 4)
    batch = [shards[r][batch_for_step(len(shards[r]), 4, 1, 3 * 7919 + r)[0]] for r in range(2)]
    assert ref4.step(4, batch)["loss"] == pytest.approx(m3[0]["loss"], rel=1e-5)
    exported = AutoModelForImageTextToText.from_pretrained(str(out / "model"))
    original = AutoModelForImageTextToText.from_pretrained(tiny_model_dir).state_dict()
    moved = 0.0
    for name, v in exported.state_dict().items():
        want = ref_model.state_dict()[name]
        torch.testing.assert_close(v, want, rtol=0, atol=5e-5, msg=name)
        moved = max(moved, float((v - original[name]).abs().max()))
    assert moved > 1e-3
    assert os.path.exists(out / "model" / "padoc_protocol.json")
