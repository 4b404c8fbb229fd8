"""The training loop on packed samples: pure torch + transformers, one packed sample per forward.

A step takes ``grad_accum`` packed samples, runs each through the model (B=1) with the
``padoc_tree`` attention (:mod:`padoc_ray.trainer.attention`; ``backend`` picks dense, flex or
tree_varlen), and accumulates gradients of the token-mean loss over all labeled tokens of the
step: every sample's summed cross-entropy is divided by the step's total label count (over all
workers when data-parallel, see ``reduce``), so long pages weigh by their tokens, not per page.
AdamW with linear warm-up then cosine decay (the paper's recipe: 500 warm-up steps, peak 5e-6),
gradient-norm clipping. Float32 on CPU; bf16 autocast on CUDA.

:func:`train` is the one loop: a single process runs it as it is (the reference the distributed
run is compared with); :mod:`padoc_ray.trainer.ray_train` runs it on every Ray Train worker with
:class:`LoopHooks` of its own (the all-reduce, checkpoint save and load, the metrics file, the
export). This module knows nothing of Ray, FSDP, checkpoints or where samples come from; its
settings are :class:`~padoc_ray.trainer.config.LoopConfig`'s.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Callable, Sequence

import torch
import torch.nn.functional as F

from .attention import FlexBackwardUnsupported, register_tree_attention
from .config import LoopConfig, OptimConfig, StepConfig
from .packing import PackedSample

log = logging.getLogger(__name__)

#: worker ``rank`` draws its samples with seed ``seed * SEED_STRIDE + rank``
SEED_STRIDE = 7919


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

    def step(self, step: int, samples: Sequence[PackedSample], *,
             before_clip: Callable[[], None] | None = None) -> dict:
        """Optimizer step ``step`` (1-based) on ``samples`` (this worker's share); ``before_clip``
        runs after the backward passes, before clipping (a debug hook: gradients are complete)."""
        t = time.perf_counter()
        lr = self.optim_cfg.lr_at(step, self.total_steps)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        figures = self.accumulate(samples)
        if before_clip is not None:
            before_clip()
        grad_norm = self.clip()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return {"step": step, **figures, "lr": lr, "grad_norm": grad_norm, "seconds": time.perf_counter() - t}


class LoopHooks:
    """What a caller adds to :func:`train`. These defaults are a single process: rank 0 of 1, no
    reduction, no resume, nothing saved. A data-parallel wrapper overrides them
    (:class:`padoc_ray.trainer.ray_train.RayHooks`)."""

    rank: int = 0
    world: int = 1

    def reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sum ``t`` over the workers in place and return it (a plain SUM, see :class:`Trainer`)."""
        return t

    def resume(self, trainer: Trainer) -> int:
        """Restore ``trainer`` (model and optimizer) if there is something to resume; returns the
        last step already done (0: start afresh)."""
        return 0

    def before_clip(self, trainer: Trainer, step: int, batch: Sequence[PackedSample]) -> None:
        """After step ``step``'s backward passes, before clipping."""

    def after_step(self, trainer: Trainer, metrics: dict) -> None:
        """After each optimizer step, with its metrics."""

    def finish(self, trainer: Trainer) -> None:
        """After the last step."""


def train(model, samples: Sequence[PackedSample], cfg: LoopConfig, *, hooks: LoopHooks | None = None,
          weighted: bool = False, device=None) -> list[dict]:
    """Train ``model`` on ``samples`` (this worker's share) up to step ``cfg.steps``; returns one
    metrics dict per step run (step, loss, labels, tokens, lr, grad_norm, seconds, backend,
    workers, time). Each step draws ``grad_accum`` samples with :func:`batch_for_step`, seeded by
    ``cfg.seed`` and the worker's rank; ``weighted``: draw by ``meta["weight"]`` (pages weighted by
    ``--sample-weights``) instead of walking a seeded permutation; ``device``: where the samples go
    (default: the model's)."""
    hooks = hooks or LoopHooks()
    if cfg.step.backend == "flex" and next(model.parameters()).device.type == "cpu":
        raise FlexBackwardUnsupported("flex attention cannot train on CPU (no backward); use dense or tree_varlen")
    torch.manual_seed(cfg.seed)
    trainer = Trainer(model, cfg.optim, cfg.step, cfg.steps, device=device, reduce=hooks.reduce)
    weights = [s.meta.get("weight", 1.0) for s in samples] if weighted else None
    seed = cfg.seed * SEED_STRIDE + hooks.rank
    history = []
    for step in range(hooks.resume(trainer) + 1, cfg.steps + 1):
        batch = [samples[i] for i in batch_for_step(len(samples), step, cfg.step.grad_accum, seed, weights)]
        m = trainer.step(step, batch, before_clip=lambda s=step, b=batch: hooks.before_clip(trainer, s, b))
        m.update(backend=cfg.step.backend, workers=hooks.world, time=time.time())
        history.append(m)
        hooks.after_step(trainer, m)
    hooks.finish(trainer)
    return history
