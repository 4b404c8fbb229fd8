"""Ray Train wrapper: the :mod:`loop` step on W workers with FSDP2, checkpoints, resume and export.

The driver (:func:`run_training`) checks the inputs, then runs a ``TorchTrainer`` with
``ScalingConfig(num_workers=W, use_gpu=...)`` and ``TorchConfig(backend="gloo" | "nccl")``. Each
worker (:func:`train_func`):

* packs its shard of the pages (page ``i`` goes to rank ``i % W``) with :class:`Packer`;
* loads the checkpoint and applies FSDP2 ``fully_shard`` itself, on CPU as on GPU (Ray's
  ``prepare_model(parallel_strategy="fsdp")`` refuses CPU): every text decoder layer and vision
  block, then the root; gradients are reduced with a plain SUM (never AVG: gloo's AVG is
  unreliable, pytorch issue 162338) because each worker already divides its loss by the global
  label count of the step;
* resumes from the latest checkpoint of the run (``RunConfig(storage_path=OUT/ray_results,
  name=run_name)``: rerunning the same command continues), else from ``resume`` (a checkpoint
  folder every worker can read; Ray's ``resume_from_checkpoint`` is deprecated in Train V2).
  Loading a checkpoint unpickles its metadata, so ``resume`` must be under OUT or pass
  :func:`check_resume_path` (owned by this user, writable by no one else);
* every ``checkpoint_every`` steps and at the end saves a distributed checkpoint
  (``get_state_dict`` + ``torch.distributed.checkpoint.save``) and reports it with
  ``ray.train.report(..., checkpoint=Checkpoint.from_directory(...))``;
* rank 0 appends one JSON line per step to ``OUT/metrics.jsonl`` (step, loss, lr, tokens,
  labels, grad_norm, seconds) and, after the last step, gathers the full state dict and exports
  it to ``OUT/model/`` (:func:`export.export_checkpoint`).

OUT must be a path every worker can write (local or shared filesystem). No parsing or packing
logic lives here.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import tempfile
import time
from dataclasses import asdict, dataclass, replace

log = logging.getLogger(__name__)

METRICS_FILE = "metrics.jsonl"
STATE_FILE = "trainer_state.json"
RESULTS_DIR = "ray_results"


class TrainInputError(ValueError):
    """Bad training inputs (missing model, ground truth, images; no usable page)."""


@dataclass(frozen=True, kw_only=True)
class TrainJobConfig:
    """One training run. Data: ``gt`` + ``images`` (OmniDocBench JSON and its images folder) or
    ``batch_output`` (padoc-ray batch output; ``ok`` rows, images re-rendered from their PDFs).

    ``steps``: optimizer steps; ``grad_accum``: packed samples per step and worker (global batch =
    workers x grad_accum pages); ``lr``: peak learning rate (warm-up then cosine);
    ``max_len``: tokens per packed sample (longer pages drop trailing regions);
    ``max_pixels``: image pixel budget override (None: the checkpoint processor's);
    ``checkpoint_every``: steps between distributed checkpoints (the last step always saves);
    ``device``: auto (GPU when the cluster has enough) | cpu | cuda;
    ``resume``: a checkpoint directory to start from when the run has none of its own;
    ``sample_weights``: a re-annotation's agreement.parquet: pages are drawn by difficulty (see
    :func:`padoc_ray.eval.agreement.sample_weight`; pages without a consensus never);
    ``grad_dump``: debug/test aid: rank 0 writes the full reduced gradients of the first step
    run (before clipping) and the sources of its samples to this file.
    """

    model: str
    out: str
    steps: int
    gt: str | None = None
    images: str | None = None
    batch_output: str | None = None
    backend: str = "tree_varlen"
    workers: int = 1
    lr: float = 5e-6
    warmup_steps: int | None = None
    max_grad_norm: float = 1.0
    weight_decay: float = 0.0
    grad_accum: int = 1
    max_len: int = 8192
    max_pixels: int | None = None
    checkpoint_every: int = 50
    keep_checkpoints: int = 2
    seed: int = 0
    device: str = "auto"
    run_name: str = "train"
    resume: str | None = None
    address: str | None = None
    grad_dump: str | None = None
    sample_weights: str | None = None

    def __post_init__(self) -> None:
        from .attention import BACKENDS

        for name in ("steps", "workers", "grad_accum", "checkpoint_every", "keep_checkpoints"):
            if getattr(self, name) < 1:
                raise TrainInputError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.backend not in BACKENDS:
            raise TrainInputError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.device not in ("auto", "cpu", "cuda"):
            raise TrainInputError(f"device must be auto, cpu or cuda, got {self.device!r}")
        if (self.gt is None) == (self.batch_output is None):
            raise TrainInputError("give either --gt with --images, or --batch-output")
        if self.gt is not None and self.images is None:
            raise TrainInputError("--gt needs --images (the folder holding each page's image_path)")


# ---- inputs --------------------------------------------------------------------------------------
def check_inputs(cfg: TrainJobConfig):
    """Validate paths and read the page list; returns (refs, skipped). Raises TrainInputError."""
    from padoc_ray.protocol import SPEC_FILENAME

    if not os.path.isdir(cfg.model):
        raise TrainInputError(f"model directory not found: {cfg.model}")
    for name in ("config.json", SPEC_FILENAME):
        if not os.path.exists(os.path.join(cfg.model, name)):
            raise TrainInputError(f"{cfg.model} has no {name}: not a PaDoc checkpoint directory")
    if cfg.gt is not None:
        if not os.path.isfile(cfg.gt):
            raise TrainInputError(f"--gt: no such file: {cfg.gt}")
        if not os.path.isdir(cfg.images):
            raise TrainInputError(f"--images: no such directory: {cfg.images}")
    elif not os.path.exists(cfg.batch_output):
        raise TrainInputError(f"--batch-output: no such file or directory: {cfg.batch_output}")
    if cfg.sample_weights is not None and not os.path.isfile(cfg.sample_weights):
        raise TrainInputError(f"--sample-weights: no such file: {cfg.sample_weights}")
    if cfg.resume is not None:
        if not os.path.isdir(cfg.resume):
            raise TrainInputError(f"--resume: no such checkpoint directory: {cfg.resume}")
        check_resume_path(cfg.resume, cfg.out)
        if not os.path.exists(os.path.join(cfg.resume, STATE_FILE)):
            raise TrainInputError(f"--resume: {cfg.resume} is not a training checkpoint (no {STATE_FILE}); give a "
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


def load_refs(cfg: TrainJobConfig):
    from padoc_ray.protocol import ProtocolSpec

    from .packing import apply_sample_weights, pages_from_batch_output, pages_from_omnidocbench

    try:
        if cfg.gt is not None:
            refs, skipped = pages_from_omnidocbench(cfg.gt, cfg.images, ProtocolSpec.load(cfg.model))
        else:
            refs, skipped = pages_from_batch_output(cfg.batch_output)
        if cfg.sample_weights is not None:
            refs, more = apply_sample_weights(refs, cfg.sample_weights)
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
    """Ray Train worker loop (see the module docstring)."""
    import ray.train
    import torch
    import torch.distributed as dist

    from .export import export_checkpoint
    from .loop import OptimConfig, StepConfig, Trainer, batch_for_step, load_model
    from .packing import Packer, PackingConfig, pack_pages

    cfg = TrainJobConfig(**config)
    ctx = ray.train.get_context()
    rank, world = ctx.get_world_rank(), ctx.get_world_size()
    use_gpu = cfg.device == "cuda"
    device = ray.train.torch.get_device() if use_gpu else torch.device("cpu")
    torch.manual_seed(cfg.seed)

    refs, _ = load_refs(cfg)
    packer = Packer(cfg.model, PackingConfig(max_len=cfg.max_len, max_pixels=cfg.max_pixels))
    samples, skipped = pack_pages(packer, refs[rank::world])
    weights = [s.meta.get("weight", 1.0) for s in samples] if cfg.sample_weights else None
    n = torch.tensor([len(samples)], dtype=torch.int64, device=device)
    counts = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(counts, n)
    if min(int(c) for c in counts) == 0:
        raise RuntimeError(f"a worker has no usable page (usable pages per worker: {[int(c) for c in counts]}); "
                           f"use fewer workers or more pages")

    model = load_model(cfg.model, device=device)
    shard_model(model, mixed_precision=use_gpu)
    optim = OptimConfig(lr=cfg.lr, warmup_steps=cfg.warmup_steps, max_grad_norm=cfg.max_grad_norm,
                        weight_decay=cfg.weight_decay)
    trainer = Trainer(model, optim, StepConfig(backend=cfg.backend, grad_accum=cfg.grad_accum), cfg.steps,
                      device=device, reduce=_all_reduce_sum)

    start = 0
    ckpt = ray.train.get_checkpoint()  # the run's own latest checkpoint wins over --resume
    if ckpt is None and cfg.resume:
        ckpt = ray.train.Checkpoint.from_directory(cfg.resume)
    if ckpt is not None:
        start = load_checkpoint(trainer, ckpt)
        log.info("rank %d resumed from step %d", rank, start)
    out = os.path.abspath(cfg.out)
    metrics_path = os.path.join(out, METRICS_FILE)
    if rank == 0:
        os.makedirs(out, exist_ok=True)
        _trim_metrics(metrics_path, start)

    for step in range(start + 1, cfg.steps + 1):
        idx = batch_for_step(len(samples), step, cfg.grad_accum, cfg.seed * 7919 + rank, weights)
        batch = [samples[i] for i in idx]
        if cfg.grad_dump and step == start + 1:
            trainer.before_clip = lambda b=batch: _dump_grads(model, cfg.grad_dump, [s.meta["source"] for s in b], rank)
        m = trainer.step(step, batch)
        trainer.before_clip = None
        m.update(backend=cfg.backend, workers=world, time=time.time())
        if rank == 0:
            with open(metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(m) + "\n")
        if step % cfg.checkpoint_every == 0 or step == cfg.steps:
            save_checkpoint(trainer, step, m, rank)  # reports to Ray only here: a report costs ~1 s on CPU

    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        info = {"steps": cfg.steps, "backend": cfg.backend, "workers": world, "lr": cfg.lr,
                "grad_accum": cfg.grad_accum, "max_len": cfg.max_len, "seed": cfg.seed,
                "max_pixels": cfg.max_pixels, "skipped_pages_rank0": len(skipped)}
        export_checkpoint(sd, cfg.model, os.path.join(out, "model"), info=info,
                          image_size=packer.processor_size_override)
    dist.barrier()


# ---- the driver ----------------------------------------------------------------------------------
def init_ray(address: str | None) -> None:
    """Join the cluster at ``address`` (or RAY_ADDRESS), else start a fresh local one. Token
    authentication is left as Ray sets it (on for a new local cluster; joining a cluster needs its
    token, e.g. RAY_AUTH_MODE=token with ~/.ray/auth_token): never turned off here."""
    from padoc_ray.ray_init import init_ray as start

    start(address or os.environ.get("RAY_ADDRESS") or "local", verbose=True, filter_noise=False)


def _resolve_device(cfg: TrainJobConfig) -> str:
    import ray

    if cfg.device != "auto":
        return cfg.device
    gpus = ray.cluster_resources().get("GPU", 0)
    return "cuda" if gpus >= cfg.workers else "cpu"


def run_training(cfg: TrainJobConfig, *, progress=None) -> dict:
    """Run (or resume) a training run; returns a summary dict. Raises TrainInputError on bad input."""
    from ray.train import CheckpointConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchConfig, TorchTrainer

    refs, skipped = check_inputs(cfg)
    out = os.path.abspath(cfg.out)
    os.makedirs(out, exist_ok=True)
    init_ray(cfg.address)
    device = _resolve_device(cfg)
    if cfg.backend == "flex" and device == "cpu":
        raise TrainInputError("--backend flex cannot train on CPU (torch has no FlexAttention backward there); "
                              "use tree_varlen or dense, or GPU workers")
    cfg = replace(cfg, device=device, out=out, model=os.path.abspath(cfg.model),
                  resume=os.path.abspath(cfg.resume) if cfg.resume else None)
    if progress:
        progress(f"training on {len(refs)} pages ({len(skipped)} skipped: {_count(skipped)}) with {cfg.workers} "
                 f"worker(s) on {device}, backend {cfg.backend}, {cfg.steps} steps; output {out}")
    trainer = TorchTrainer(
        train_func,
        train_loop_config=_jsonable(cfg),
        torch_config=TorchConfig(backend="nccl" if device == "cuda" else "gloo"),
        scaling_config=ScalingConfig(num_workers=cfg.workers, use_gpu=device == "cuda"),
        run_config=RunConfig(name=cfg.run_name, storage_path=os.path.join(out, RESULTS_DIR),
                             checkpoint_config=CheckpointConfig(num_to_keep=cfg.keep_checkpoints)),
    )
    t = time.perf_counter()
    result = trainer.fit()
    history = read_metrics(os.path.join(out, METRICS_FILE))
    return {
        "out": out, "model": os.path.join(out, "model"), "pages": len(refs), "skipped": _count(skipped),
        "steps": len(history), "first_loss": history[0]["loss"] if history else None,
        "last_loss": history[-1]["loss"] if history else None, "seconds": time.perf_counter() - t,
        "checkpoint": result.checkpoint.path if result.checkpoint else None, "device": device,
        "sample_weights": _weights_summary(refs) if cfg.sample_weights else None,
    }


def _weights_summary(refs) -> dict:
    w = sorted(r.weight for r in refs)
    return {"pages": len(w), "min": round(w[0], 4), "median": round(w[len(w) // 2], 4), "max": round(w[-1], 4)}


def _jsonable(cfg: TrainJobConfig) -> dict:
    return asdict(cfg)


def read_metrics(path: str) -> list[dict]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(ln) for ln in f if ln.strip()]
