"""The training step on packed samples: pure torch + transformers, one packed sample per forward.

A step takes ``grad_accum`` packed samples, runs each through the model (B=1) with the
``padoc_tree`` attention (:mod:`padoc_ray.trainer.attention`; ``backend`` picks dense, flex or
tree_varlen), and accumulates gradients of the token-mean loss over all labeled tokens of the
step: every sample's summed cross-entropy is divided by the step's total label count (over all
workers when data-parallel, see ``reduce``), so long pages weigh by their tokens, not per page.
AdamW with linear warm-up then cosine decay (the paper's recipe: 500 warm-up steps, peak 5e-6),
gradient-norm clipping. Float32 on CPU; bf16 autocast on CUDA.

:func:`train` is the single-process loop (the reference the distributed run is compared with);
:mod:`padoc_ray.trainer.ray_train` runs the same :class:`Trainer` under FSDP2 on Ray Train. This
module knows nothing of Ray, FSDP, checkpoints or where samples come from.
"""

from __future__ import annotations

import json
import logging
import math
import random
import time
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from .attention import BACKENDS, FlexBackwardUnsupported, register_tree_attention
from .packing import PackedSample

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class OptimConfig:
    """AdamW and its schedule.

    ``lr``: peak learning rate (paper: 5e-6 for the 2B model; a random tiny model wants ~1e-3).
    ``warmup_steps``: linear warm-up; None = min(500, 5% of the steps), the paper's 500 capped.
    ``min_lr_ratio``: cosine decays towards this fraction of ``lr`` (reached one step after the last).
    ``max_grad_norm``: clip the global gradient norm (<= 0: no clipping).
    """

    lr: float = 5e-6
    weight_decay: float = 0.0
    betas: tuple[float, float] = (0.9, 0.95)
    eps: float = 1e-8
    warmup_steps: int | None = None
    min_lr_ratio: float = 0.0
    max_grad_norm: float = 1.0

    def __post_init__(self) -> None:
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr}")
        if self.warmup_steps is not None and self.warmup_steps < 0:
            raise ValueError(f"warmup_steps must be >= 0, got {self.warmup_steps}")

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
    """What one optimizer step does: ``backend`` (dense | flex | tree_varlen), ``grad_accum``
    packed samples per step and per worker."""

    backend: str = "tree_varlen"
    grad_accum: int = 1

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise ValueError(f"unknown backend {self.backend!r}; choose one of {', '.join(BACKENDS)}")
        if self.grad_accum < 1:
            raise ValueError(f"grad_accum must be >= 1, got {self.grad_accum}")


def load_model(model_dir: str, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """The checkpoint as a trainable Qwen3-VL with the ``padoc_tree`` attention installed."""
    from transformers import AutoModelForImageTextToText

    model = AutoModelForImageTextToText.from_pretrained(model_dir, dtype=dtype)
    model.set_attn_implementation(register_tree_attention())
    model.config.use_cache = False
    return model.to(device).train()


def sample_loss(model, sample: PackedSample, backend: str, device=None) -> tuple[torch.Tensor, int]:
    """Summed next-token cross-entropy over ``sample``'s labeled tokens, and their count.

    Logits are computed only at labeled positions (``logits_to_keep`` with their indices).
    """
    device = device if device is not None else next(model.parameters()).device
    idx = sample.loss_mask.nonzero().squeeze(1).to(device)
    out = model(**sample.model_inputs(device), tree_layout=sample.tree, tree_backend=backend,
                logits_to_keep=idx, use_cache=False)
    logits = out.logits[0]
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    loss = F.cross_entropy(logits, sample.labels.to(device)[idx], reduction="sum")
    return loss, int(idx.numel())


def batch_for_step(n: int, step: int, grad_accum: int, seed: int, weights: Sequence[float] | None = None) -> list[int]:
    """Sample indices of optimizer step ``step`` (1-based). Unweighted: a fresh seeded permutation
    per epoch, walked in order. With ``weights`` (one per sample, >= 0, not all 0): each draw picks
    sample i with probability weights[i] / sum(weights), independently, seeded by the draw's
    number. Stateless either way, so a resumed run draws exactly what the original would have."""
    if n < 1:
        raise ValueError("no samples to train on")
    out = []
    for m in range((step - 1) * grad_accum, step * grad_accum):
        if weights is not None:
            out.append(random.Random(seed * 1_000_003 + m).choices(range(n), weights=weights)[0])
            continue
        epoch, pos = divmod(m, n)
        perm = list(range(n))
        random.Random(seed * 1_000_003 + epoch).shuffle(perm)
        out.append(perm[pos])
    return out


class Trainer:
    """Owns the optimizer of ``model`` and runs optimizer steps.

    ``reduce``: sums a tensor over data-parallel workers (identity when single-process); the
    gradient reduction itself must be a plain SUM (FSDP is set up that way), since every worker
    already divides by the global label count.
    """

    def __init__(self, model, optim: OptimConfig, step_cfg: StepConfig, total_steps: int, *,
                 device=None, reduce: Callable[[torch.Tensor], torch.Tensor] | None = None):
        self.model, self.optim_cfg, self.step_cfg, self.total_steps = model, optim, step_cfg, total_steps
        self.device = device if device is not None else next(model.parameters()).device
        self.reduce = reduce or (lambda t: t)
        params = [p for p in model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(params, lr=optim.lr, betas=optim.betas, eps=optim.eps,
                                           weight_decay=optim.weight_decay)
        self.before_clip: Callable[[], None] | None = None  # a hook after backward (tests inspect gradients)
        self.autocast = self.device.type == "cuda" and next(model.parameters()).dtype == torch.float32 \
            and not getattr(model, "_padoc_mixed_precision", False)

    def accumulate(self, samples: Sequence[PackedSample]) -> dict:
        """Forward + backward of ``samples`` into the gradients; returns the step's loss figures."""
        n_local = sum(s.num_labels for s in samples)
        counts = self.reduce(torch.tensor([float(n_local), float(sum(s.num_tokens for s in samples))],
                                          dtype=torch.float64, device=self.device))
        n_global = max(1.0, float(counts[0]))
        loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        for s in samples:
            with torch.autocast(self.device.type, dtype=torch.bfloat16, enabled=self.autocast):
                loss, _ = sample_loss(self.model, s, self.step_cfg.backend, self.device)
            (loss / n_global).backward()
            loss_sum += loss.detach().double()
        total = self.reduce(loss_sum)
        return {"loss": float(total) / n_global, "labels": int(n_global), "tokens": int(counts[1])}

    def clip(self) -> float:
        params = [p for p in self.model.parameters() if p.grad is not None]
        max_norm = self.optim_cfg.max_grad_norm if self.optim_cfg.max_grad_norm > 0 else float("inf")
        norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
        if hasattr(norm, "full_tensor"):
            norm = norm.full_tensor()
        return float(norm)

    def step(self, step: int, samples: Sequence[PackedSample]) -> dict:
        """Optimizer step ``step`` (1-based) on ``samples`` (this worker's share)."""
        t = time.perf_counter()
        lr = self.optim_cfg.lr_at(step, self.total_steps)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        figures = self.accumulate(samples)
        if self.before_clip is not None:
            self.before_clip()
        grad_norm = self.clip()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"step": step, **figures, "lr": lr, "grad_norm": grad_norm, "seconds": time.perf_counter() - t}


@dataclass(frozen=True, kw_only=True)
class LoopConfig:
    """The single-process loop: ``steps`` optimizer steps, samples drawn by :func:`batch_for_step`."""

    steps: int
    seed: int = 0
    optim: OptimConfig = OptimConfig()
    step: StepConfig = StepConfig()


def train(model, samples: Sequence[PackedSample], cfg: LoopConfig, *, metrics_path: str | None = None,
          on_step: Callable[[dict], None] | None = None) -> list[dict]:
    """Train ``model`` in this process; returns one metrics dict per step (also appended as JSON
    lines to ``metrics_path`` when given). Samples packed from weighted pages
    (``meta["weight"]``, see ``--sample-weights``) are drawn by weight."""
    if cfg.step.backend == "flex" and next(model.parameters()).device.type == "cpu":
        raise FlexBackwardUnsupported("flex attention cannot train on CPU (no backward); use dense or tree_varlen")
    torch.manual_seed(cfg.seed)
    trainer = Trainer(model, cfg.optim, cfg.step, cfg.steps)
    weights = [s.meta.get("weight", 1.0) for s in samples] if any("weight" in s.meta for s in samples) else None
    history = []
    for step in range(1, cfg.steps + 1):
        batch = [samples[i] for i in batch_for_step(len(samples), step, cfg.step.grad_accum, cfg.seed, weights)]
        m = trainer.step(step, batch)
        m["backend"] = cfg.step.backend
        history.append(m)
        if metrics_path:
            with open(metrics_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(m) + "\n")
        if on_step:
            on_step(m)
    return history


def config_dict(cfg) -> dict:
    return asdict(cfg)
