"""Ray Train wrapper: the one loop (:func:`loop.train`) on W workers with FSDP2, checkpoints,
resume and export. Its settings are a :class:`~padoc_ray.trainer.config.TrainConfig`.

The driver (:func:`run_training`) checks the inputs, then runs a ``TorchTrainer`` with
``ScalingConfig(num_workers=W, use_gpu=...)`` and ``TorchConfig(backend="gloo" | "nccl")``. Each
worker (:func:`train_func`) packs its shard of the pages (page ``i`` goes to rank ``i % W``),
loads the checkpoint, applies FSDP2 and calls :func:`loop.train` with :class:`RayHooks`:

* FSDP2 ``fully_shard`` is applied by the worker itself, on CPU as on GPU (Ray's
  ``prepare_model(parallel_strategy="fsdp")`` refuses CPU): every text decoder layer and vision
  block, then the root; gradients are reduced with a plain SUM (never AVG: gloo's AVG is
  unreliable, pytorch issue 162338) because each worker already divides its loss by the global
  label count of the step;
* resume: from the latest checkpoint of the run (``RunConfig(storage_path=OUT/ray_results,
  name=run_name)``: rerunning the same command continues), else from ``resume`` (a checkpoint
  folder every worker can read; Ray's ``resume_from_checkpoint`` is deprecated in Train V2).
  Loading a checkpoint unpickles its metadata, so ``resume`` must be under OUT or pass
  :func:`check_resume_path` (owned by this user, writable by no one else);
* every ``checkpoint_every`` steps and at the end a distributed checkpoint
  (``get_state_dict`` + ``torch.distributed.checkpoint.save``), reported with
  ``ray.train.report(..., checkpoint=Checkpoint.from_directory(...))``;
* rank 0 appends one JSON line per step to ``OUT/metrics.jsonl`` (step, loss, lr, tokens,
  labels, grad_norm, seconds, backend, workers, time) and, after the last step, the full state
  dict is gathered and exported to ``OUT/model/`` (:func:`export.export_checkpoint`).

OUT must be a path every worker can write (local or shared filesystem). No parsing, packing or
training-step logic lives here.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
import time
from dataclasses import replace

from .config import TrainConfig, TrainInputError

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
STATE_FILE = "trainer_state.json"
RESULTS_DIR = "ray_results"


# ---- inputs --------------------------------------------------------------------------------------
def check_inputs(cfg: TrainConfig):
    """Validate paths and read the page list; returns (refs, skipped). Raises TrainInputError."""
    from padoc_ray.protocol import SPEC_FILENAME

    if not os.path.isdir(cfg.model):
        raise TrainInputError(f"model directory not found: {cfg.model}")
    for name in ("config.json", SPEC_FILENAME):
        if not os.path.exists(os.path.join(cfg.model, name)):
            raise TrainInputError(f"{cfg.model} has no {name}: not a PaDoc checkpoint directory")
    data, resume = cfg.data, cfg.ray.resume
    if data.gt is not None:
        if not os.path.isfile(data.gt):
            raise TrainInputError(f"--gt: no such file: {data.gt}")
        if not os.path.isdir(data.images):
            raise TrainInputError(f"--images: no such directory: {data.images}")
    elif not os.path.exists(data.batch_output):
        raise TrainInputError(f"--batch-output: no such file or directory: {data.batch_output}")
    if data.sample_weights is not None and not os.path.isfile(data.sample_weights):
        raise TrainInputError(f"--sample-weights: no such file: {data.sample_weights}")
    if resume is not None:
        if not os.path.isdir(resume):
            raise TrainInputError(f"--resume: no such checkpoint directory: {resume}")
        check_resume_path(resume, cfg.out)
        if not os.path.exists(os.path.join(resume, STATE_FILE)):
            raise TrainInputError(f"--resume: {resume} is not a training checkpoint (no {STATE_FILE}); give a "
                                  f"checkpoint_* folder under OUT/{RESULTS_DIR}/RUN_NAME")
    refs, skipped = load_refs(cfg)
    if not refs:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(_count(skipped).items()))
        first = f"; first: {skipped[0].source}: {skipped[0].message}" if skipped else ""
        raise TrainInputError(f"no usable page: {len(skipped)} skipped ({reasons}){first}" if skipped
                              else "no pages in the input")
    return refs, skipped


def check_resume_path(resume: str, out: str) -> None:
    """Refuse a ``--resume`` folder someone else could have written: loading a checkpoint
    unpickles its metadata (``torch.distributed.checkpoint``), so a crafted folder runs code on
    every worker. Accepted: a folder under ``out`` (the run's own output), or one whose every file
    and folder is this user's, no symbolic link, writable by no one else, below folders owned by
    this user or root that no one else may write to (unless sticky, like /tmp)."""
    real, own = os.path.realpath(resume), os.path.realpath(out)
    if real == own or real.startswith(own.rstrip(os.sep) + os.sep):
        return
    uid = os.getuid()
    problems = []
    for dirpath, dirnames, filenames in os.walk(real):
        for p in [dirpath] + [os.path.join(dirpath, n) for n in dirnames + filenames]:
            st = os.lstat(p)
            if stat.S_ISLNK(st.st_mode):
                problems.append(f"{p} is a symbolic link")
            elif st.st_uid != uid:
                problems.append(f"{p} is owned by uid {st.st_uid}, not {uid}")
            elif st.st_mode & 0o022:
                problems.append(f"{p} is writable by group or others ({stat.filemode(st.st_mode)})")
    parent = os.path.dirname(real)
    while True:
        st = os.stat(parent)
        if st.st_uid not in (uid, 0):
            problems.append(f"{parent} is owned by uid {st.st_uid}")
        elif st.st_mode & 0o022 and not st.st_mode & stat.S_ISVTX:
            problems.append(f"{parent} is writable by group or others ({stat.filemode(st.st_mode)})")
        if os.path.dirname(parent) == parent:
            break
        parent = os.path.dirname(parent)
    if problems:
        more = f" (and {len(problems) - 3} more)" if len(problems) > 3 else ""
        raise TrainInputError(
            f"--resume {resume}: refusing to load it: {'; '.join(problems[:3])}{more}. Loading a checkpoint unpickles "
            f"its metadata, so resume only from a checkpoint under --out, or one owned by you and writable by no one "
            f"else")


def load_refs(cfg: TrainConfig):
    """The pages of ``cfg.data`` (weighted by ``sample_weights`` when given): (refs, skipped)."""
    from padoc_ray.protocol import ProtocolSpec

    from .packing import apply_sample_weights, pages_from_batch_output, pages_from_omnidocbench

    data = cfg.data
    try:
        if data.gt is not None:
            refs, skipped = pages_from_omnidocbench(data.gt, data.images, ProtocolSpec.load(cfg.model))
        else:
            refs, skipped = pages_from_batch_output(data.batch_output)
        if data.sample_weights is not None:
            refs, more = apply_sample_weights(refs, data.sample_weights)
            skipped = [*skipped, *more]
    except ValueError as e:
        raise TrainInputError(str(e)) from None
    return refs, skipped


def _count(skipped) -> dict:
    out: dict = {}
    for s in skipped:
        out[s.code] = out.get(s.code, 0) + 1
    return out


# ---- FSDP2 ---------------------------------------------------------------------------------------
def shard_model(model, *, mixed_precision: bool) -> None:
    """FSDP2 ``fully_shard`` on each text layer and vision block, then the root; SUM reduction."""
    import torch
    from torch.distributed.fsdp import FSDPModule, MixedPrecisionPolicy, fully_shard

    kw = {}
    if mixed_precision:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    inner = model.model
    for layer in inner.language_model.layers:
        fully_shard(layer, **kw)
    for block in inner.visual.blocks:
        fully_shard(block, **kw)
    fully_shard(model, **kw)
    for m in model.modules():
        if isinstance(m, FSDPModule):
            m.set_force_sum_reduction_for_comms(True)
            m.set_gradient_divide_factor(1.0)
    model._padoc_mixed_precision = mixed_precision


def _all_reduce_sum(t):
    import torch.distributed as dist

    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return t


# ---- checkpoints ---------------------------------------------------------------------------------
def save_checkpoint(trainer, step: int, metrics: dict, rank: int) -> None:
    import ray.train
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(trainer.model, trainer.optimizer)
    with tempfile.TemporaryDirectory(prefix="padoc-ckpt-") as d:
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=d)
        if rank == 0:
            with open(os.path.join(d, STATE_FILE), "w", encoding="utf-8") as f:
                json.dump({"step": step, "metrics": metrics}, f)
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(d))


def load_checkpoint(trainer, ckpt) -> int:
    """Restore model + optimizer from a Ray checkpoint; returns the step it was saved at."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    with ckpt.as_directory() as d:
        with open(os.path.join(d, STATE_FILE), encoding="utf-8") as f:
            step = int(json.load(f)["step"])
        msd, osd = get_state_dict(trainer.model, trainer.optimizer)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=d)
        set_state_dict(trainer.model, trainer.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    return step


def _trim_metrics(path: str, upto: int) -> None:
    """Drop metric lines of steps after ``upto`` (they are redone after a resume)."""
    if not os.path.exists(path):
        return
    with open(path, encoding="utf-8") as f:
        lines = [ln for ln in f if ln.strip() and json.loads(ln).get("step", 0) <= upto]
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)


def _dump_grads(model, path: str, sources: list, rank: int) -> None:
    import torch

    grads = {}
    for name, p in model.named_parameters():
        if p.grad is None:
            continue
        g = p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad
        grads[name] = g.detach().cpu().clone()
    import torch.distributed as dist

    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, sources)
    if rank == 0:
        torch.save({"grads": grads, "sources": gathered}, path)


# ---- the worker ----------------------------------------------------------------------------------
def train_func(config: dict) -> None:
    """One Ray Train worker: its shard of the samples, the FSDP2 model, then :func:`loop.train`
    with :class:`RayHooks` (see the module docstring)."""
    import ray.train
    import torch

    from .loop import load_model, train

    cfg = TrainConfig.from_dict(config)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    use_gpu = cfg.ray.device == "cuda"
    device = ray.train.torch.get_device() if use_gpu else torch.device("cpu")
    packer, samples, skipped = _pack_shard(cfg, rank, world, device)
    model = load_model(cfg.model, device=device)
    shard_model(model, mixed_precision=use_gpu)
    loop = cfg.loop
    info = {"steps": loop.steps, "backend": loop.step.backend, "workers": world, "lr": loop.optim.lr,
            "grad_accum": loop.step.grad_accum, "max_len": cfg.data.packing.max_len, "seed": loop.seed,
            "max_pixels": cfg.data.packing.max_pixels, "skipped_pages_rank0": len(skipped)}
    hooks = RayHooks(cfg, rank=rank, world=world, export_info=info, image_size=packer.processor_size_override)
    train(model, samples, loop, hooks=hooks, weighted=cfg.data.sample_weights is not None, device=device)


def _pack_shard(cfg: TrainConfig, rank: int, world: int, device):
    """This worker's pages (page ``i`` goes to rank ``i % world``) as packed samples; fails when
    any worker has none. Returns (packer, samples, skipped)."""
    import torch
    import torch.distributed as dist

    from .packing import Packer, pack_pages

    refs, _ = load_refs(cfg)
    packer = Packer(cfg.model, cfg.data.packing)
    samples, skipped = pack_pages(packer, refs[rank::world])
    n = torch.tensor([len(samples)], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(counts, n)
    if min(int(c) for c in counts) == 0:
        raise RuntimeError(f"a worker has no usable page (usable pages per worker: {[int(c) for c in counts]}); "
                           f"use fewer workers or more pages")
    return packer, samples, skipped


class RayHooks:
    """:func:`loop.train`'s hooks on a Ray Train worker (the :class:`loop.LoopHooks` interface,
    written out so this module imports no torch): the SUM all-reduce; resume from the run's own
    latest checkpoint, else from ``ray.resume``; rank 0's line per step in OUT/metrics.jsonl; a
    distributed checkpoint every ``checkpoint_every`` steps and at the last; the gradient dump of
    the first step run (``ray.grad_dump``); the export of OUT/model after the last step."""

    def __init__(self, cfg: TrainConfig, *, rank: int, world: int, export_info: dict, image_size: dict | None):
        self.cfg, self.rank, self.world = cfg, rank, world
        self.export_info, self.image_size = export_info, image_size
        self.metrics_path = os.path.join(cfg.out, METRICS_FILE)
        self.start = 0

    def reduce(self, t):
        return _all_reduce_sum(t)

    def resume(self, trainer) -> int:
        import ray.train

        ckpt = ray.train.get_checkpoint()  # the run's own latest checkpoint wins over --resume
        if ckpt is None and self.cfg.ray.resume:
            ckpt = ray.train.Checkpoint.from_directory(self.cfg.ray.resume)
        if ckpt is not None:
            self.start = load_checkpoint(trainer, ckpt)
            log.info("rank %d resumed from step %d", self.rank, self.start)
        if self.rank == 0:
            os.makedirs(self.cfg.out, exist_ok=True)
            _trim_metrics(self.metrics_path, self.start)
        return self.start

    def before_clip(self, trainer, step: int, batch) -> None:
        if self.cfg.ray.grad_dump and step == self.start + 1:
            _dump_grads(trainer.model, self.cfg.ray.grad_dump, [s.meta["source"] for s in batch], self.rank)

    def after_step(self, trainer, metrics: dict) -> None:
        step = metrics["step"]
        if self.rank == 0:
            with open(self.metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(metrics) + "\n")
        if step % self.cfg.ray.checkpoint_every == 0 or step == self.cfg.loop.steps:
            save_checkpoint(trainer, step, metrics, self.rank)  # reports to Ray only here: a report costs ~1 s on CPU

    def finish(self, trainer) -> None:
        import torch.distributed as dist
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        from .export import export_checkpoint

        sd = get_model_state_dict(trainer.model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank == 0:
            export_checkpoint(sd, self.cfg.model, os.path.join(self.cfg.out, "model"), info=self.export_info,
                              image_size=self.image_size)
        dist.barrier()


# ---- the driver ----------------------------------------------------------------------------------
def init_ray(address: str | None) -> None:
    """Join the cluster at ``address`` (or RAY_ADDRESS), else start a fresh local one. Token
    authentication is left as Ray sets it (on for a new local cluster; joining a cluster needs its
    token, e.g. RAY_AUTH_MODE=token with ~/.ray/auth_token): never turned off here."""
    from padoc_ray.ray_init import init_ray as start

    start(address, verbose=True, filter_noise=False)


def _resolve_device(cfg: TrainConfig) -> str:
    import ray

    if cfg.ray.device != "auto":
        return cfg.ray.device
    gpus = ray.cluster_resources().get("GPU", 0)
    return "cuda" if gpus >= cfg.ray.workers else "cpu"


def run_training(cfg: TrainConfig, *, progress=None) -> dict:
    """Run (or resume) a training run; returns a summary dict. Raises TrainInputError on bad input."""
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    refs, skipped = check_inputs(cfg)
    out = os.path.abspath(cfg.out)
    os.makedirs(out, exist_ok=True)
    init_ray(cfg.ray.address)
    device = _resolve_device(cfg)
    backend, ray_cfg = cfg.loop.step.backend, cfg.ray
    if backend == "flex" and device == "cpu":
        raise TrainInputError("--backend flex cannot train on CPU (torch has no FlexAttention backward there); "
                              "use tree_varlen or dense, or GPU workers")
    cfg = replace(cfg, out=out, model=os.path.abspath(cfg.model),
                  ray=replace(ray_cfg, device=device, resume=os.path.abspath(ray_cfg.resume) if ray_cfg.resume else None))
    if progress:
        progress(f"training on {len(refs)} pages ({len(skipped)} skipped: {_count(skipped)}) with {ray_cfg.workers} "
                 f"worker(s) on {device}, backend {backend}, {cfg.loop.steps} steps; output {out}")
    trainer = TorchTrainer(
        train_func,
        train_loop_config=cfg.to_dict(),
        torch_config=TorchConfig(backend="nccl" if device == "cuda" else "gloo"),
        scaling_config=ScalingConfig(num_workers=ray_cfg.workers, use_gpu=device == "cuda"),
        run_config=RunConfig(name=ray_cfg.run_name, storage_path=os.path.join(out, RESULTS_DIR),
                             checkpoint_config=CheckpointConfig(num_to_keep=ray_cfg.keep_checkpoints)),
    )
    t = time.perf_counter()
    result = trainer.fit()
    history = read_metrics(os.path.join(out, METRICS_FILE))
    return {
        "out": out, "model": os.path.join(out, "model"), "pages": len(refs), "skipped": _count(skipped),
        "steps": len(history), "first_loss": history[0]["loss"] if history else None,
        "last_loss": history[-1]["loss"] if history else None, "seconds": time.perf_counter() - t,
        "checkpoint": result.checkpoint.path if result.checkpoint else None, "device": device,
        "sample_weights": _weights_summary(refs) if cfg.data.sample_weights else None,
    }


def _weights_summary(refs) -> dict:
    w = sorted(r.weight for r in refs)
    return {"pages": len(w), "min": round(w[0], 4), "median": round(w[len(w) // 2], 4), "max": round(w[-1], 4)}


def read_metrics(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(ln) for ln in f if ln.strip()]
