"""Every knob of a training run, as one tree of small frozen dataclasses (pure: no torch, no Ray).

::

    TrainConfig                 model, out: the checkpoint to start from, the output folder
    ├── data: DataConfig        gt + images | batch_output, sample_weights
    │   └── packing: PackingConfig      max_len, max_pixels, min_pixels
    ├── loop: LoopConfig        steps, seed                       (all :func:`loop.train` reads)
    │   ├── optim: OptimConfig          lr, warmup_steps, min_lr_ratio, max_grad_norm, AdamW's own
    │   └── step: StepConfig            backend, grad_accum
    └── ray: RayConfig          workers, device, address, run_name, checkpoint_every,
                                keep_checkpoints, resume, grad_dump

The single-process loop (:func:`padoc_ray.trainer.loop.train`) takes a :class:`LoopConfig`; the
packer takes a :class:`PackingConfig`; the Ray Train run (:mod:`padoc_ray.trainer.ray_train`)
takes the whole :class:`TrainConfig`, which ``padoc-ray train``'s flags build
(:func:`padoc_ray.cli.train.config_from_args`). Each class validates itself in ``__post_init__`` and raises
:class:`TrainInputError` (a ``ValueError``); defaults are documented field by field.
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass

from padoc_ray.knobs import knob

#: the ancestor-attention backends of :mod:`padoc_ray.trainer.attention`
BACKENDS = ("dense", "flex", "tree_varlen")
DEVICES = ("auto", "cpu", "cuda")


class TrainInputError(ValueError):
    """Bad training inputs (a bad setting; missing model, ground truth, images; no usable page)."""


def _at_least(cfg, names: tuple[str, ...], low: int) -> None:
    for name in names:
        if getattr(cfg, name) < low:
            raise TrainInputError(f"{name} must be >= {low}, got {getattr(cfg, name)}")


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW and its schedule.

    ``lr``: peak learning rate (default 5e-6, the paper's for the 2B model; a random tiny model
    wants ~1e-3). ``weight_decay`` (default 0), ``betas`` (default (0.9, 0.95)), ``eps`` (default
    1e-8): AdamW's. ``warmup_steps``: linear warm-up; None (default) = min(500, 5% of the steps),
    the paper's 500 capped. ``min_lr_ratio``: cosine decays towards this fraction of ``lr``
    (default 0; reached one step after the last). ``max_grad_norm``: clip the global gradient norm
    (default 1.0; <= 0: no clipping).
    """

    lr: float = 5e-6  #: peak learning rate, after linear warm-up, cosine decay to 0 (5e-6: the paper's)
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    warmup_steps: int | None = None  #: warm-up steps (None: min(500, 5% of the steps))
    min_lr_ratio: float = 0.0
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise TrainInputError(f"lr must be a positive number, got {self.lr}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise TrainInputError(f"warmup_steps must be >= 0, got {self.warmup_steps}")
        object.__setattr__(self, "betas", tuple(self.betas))  # a list after a round trip through JSON

    def lr_at(self, step: int, total: int) -> float:
        """Learning rate of optimizer step ``step`` (1-based) out of ``total``."""
        warm = self.warmup_steps if self.warmup_steps is not None else min(500, max(1, total // 20))
        if warm and step <= warm:
            return self.lr * step / warm
        progress = min(1.0, (step - warm) / (total - warm + 1))  # the last step keeps a small lr
        cos = 0.5 * (1 + math.cos(math.pi * progress))
        return self.lr * (self.min_lr_ratio + (1 - self.min_lr_ratio) * cos)


@dataclass(frozen=True, kw_only=True)
class StepConfig:
    """What one optimizer step does. ``backend``: the attention realization, dense | flex |
    tree_varlen (default tree_varlen); ``grad_accum``: packed samples per step and per worker
    (default 1; global batch = workers x grad_accum)."""

    #: ancestor-attention backend: dense (materialized mask, the reference), flex (flex attention; no backward on
    #: CPU), tree_varlen (gathered prefixes + varlen causal attention)
    backend: str = knob("tree_varlen", choices=BACKENDS)
    grad_accum: int = 1  #: packed pages per step and worker (global batch = workers x grad_accum)

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise TrainInputError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        _at_least(self, ("grad_accum",), 1)


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """The loop (:func:`padoc_ray.trainer.loop.train`): ``steps`` optimizer steps in total (a
    resumed run continues up to this number); ``seed``: the data order (default 0; worker ``r``
    draws with seed ``seed * 7919 + r``, see :func:`~padoc_ray.trainer.loop.batch_for_step`)."""

    steps: int  #: optimizer steps in total (a resumed run continues up to this number)
    seed: int = 0  #: data-order seed
    optim: OptimConfig = OptimConfig()
    step: StepConfig = StepConfig()

    def __post_init__(self) -> None:
        _at_least(self, ("steps",), 1)


@dataclass(frozen=True, kw_only=True)
class PackingConfig:
    """How pages become samples (:class:`padoc_ray.trainer.packing.Packer`).

    ``max_len``: packed tokens per sample (prompt + image + layout + all branches); default 8192.
    ``max_pixels`` / ``min_pixels``: override the checkpoint processor's image pixel budget (None:
    the processor's own, which is what vLLM serves with; smaller budgets make CPU runs cheaper at
    the price of a train/serve mismatch in image resolution).
    """

    max_len: int = 8192  #: tokens per packed page; longer pages drop whole trailing regions
    #: image pixel budget instead of the checkpoint processor's (fewer image tokens; written into the exported
    #: preprocessor_config.json)
    max_pixels: int | None = None
    min_pixels: int | None = None

    def __post_init__(self) -> None:
        if self.max_len < 16:
            raise TrainInputError(f"max_len must be at least 16, got {self.max_len}")
        for name in ("max_pixels", "min_pixels"):
            v = getattr(self, name)
            if v is not None and v < 1024:
                raise TrainInputError(f"{name} must be at least 1024 (32x32), got {v}")


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    """The pages: ``gt`` + ``images`` (an OmniDocBench-format JSON and the folder holding each
    page's ``image_path``) or ``batch_output`` (padoc-ray batch output; ``ok`` rows, images
    re-rendered from their source). ``sample_weights``: a re-annotation's agreement.parquet; pages
    are then drawn by difficulty (:func:`padoc_ray.trainer.packing.sample_weight`; pages without a
    consensus never), default None: every page equally often. ``packing``: how a page becomes a
    sample."""

    gt: str | None = None  #: OmniDocBench-format ground-truth JSON (a list of pages)
    images: str | None = None  #: folder holding each page's page_info.image_path
    #: instead of gt/images: padoc-ray batch output (folder with pages/ or Parquet files); rows with status ok
    #: are trained on, their images re-rendered from source_uri
    batch_output: str | None = None
    #: a re-annotation's OUTPUT/agreement/agreement.parquet: draw pages by difficulty, with probability
    #: proportional to 0.25 + difficulty (the hardest pages 5x as often as the easiest); pages without a
    #: consensus, or not in the table, are never drawn
    sample_weights: str | None = None
    packing: PackingConfig = PackingConfig()

    def __post_init__(self) -> None:
        if (self.gt is None) == (self.batch_output is None):
            raise TrainInputError("give either --gt with --images, or --batch-output")
        if self.gt is not None and self.images is None:
            raise TrainInputError("--gt needs --images (the folder holding each page's image_path)")


@dataclass(frozen=True, kw_only=True)
class RayConfig:
    """Ray Train: scaling and checkpoints.

    ``workers``: Ray Train workers (default 1); ``device``: auto (default: GPUs when the cluster has
    one per worker, else CPU) | cpu | cuda; ``address``: the Ray cluster to join (default None: a
    local cluster started for the run); ``run_name``: the run's folder under OUT/ray_results
    (default "train"; rerunning the same run resumes it); ``checkpoint_every``: steps between
    distributed checkpoints (default 50; the last step always saves); ``keep_checkpoints``: how
    many are kept (default 2); ``resume``: a checkpoint folder to start from when the run has none
    of its own (default None); ``grad_dump``: a debug and test aid (default None): rank 0 writes
    the full reduced gradients of the first step run (before clipping) and the sources of its
    samples to this file.
    """

    workers: int = 1  #: Ray Train workers
    device: str = knob("auto", choices=DEVICES)  #: auto: GPUs when the cluster has one per worker, else CPU
    address: str | None = None
    run_name: str = "train"  #: run name under OUT/ray_results
    checkpoint_every: int = 50  #: steps between distributed checkpoints; the last step always saves
    keep_checkpoints: int = 2
    #: start from this checkpoint (a checkpoint_* folder) when the run has none of its own. Loading a checkpoint
    #: unpickles its metadata (a crafted folder runs code on every worker), so it must be under --out, or owned
    #: by you, with no symbolic links, writable by no one else
    resume: str | None = knob(None, metavar="CHECKPOINT_DIR")
    grad_dump: str | None = None

    def __post_init__(self) -> None:
        _at_least(self, ("workers", "checkpoint_every", "keep_checkpoints"), 1)
        if self.device not in DEVICES:
            raise TrainInputError(f"device must be auto, cpu or cuda, got {self.device!r}")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run: ``model`` (the checkpoint directory to start from), ``out`` (the output
    folder: metrics.jsonl, ray_results/, model/), and its parts ``data``, ``loop``, ``ray``."""

    model: str
    out: str
    data: DataConfig
    loop: LoopConfig
    ray: RayConfig = RayConfig()

    def to_dict(self) -> dict:
        """Plain nested dicts (Ray Train's ``train_loop_config``); :meth:`from_dict` reverses it."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> TrainConfig:
        return _from_dict(cls, d)


def _from_dict(cls, d: dict):
    hints = typing.get_type_hints(cls)
    kw = {}
    for f in dataclasses.fields(cls):
        if f.name not in d:
            continue
        v, t = d[f.name], hints[f.name]
        kw[f.name] = _from_dict(t, v) if dataclasses.is_dataclass(t) and isinstance(v, dict) else v
    return cls(**kw)
