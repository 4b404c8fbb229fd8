"""Ancestor attention over one packed sample ``[M | Y_1 .. Y_N]``, with three interchangeable backends.

* ``dense``: SDPA with the materialized (S, S) bool mask. O(S^2) memory; the reference.
* ``flex``: ``torch.nn.attention.flex_attention`` with a block mask (fully masked blocks skipped).
  Compiled on CUDA, eager on CPU by default. torch refuses its backward on CPU: a call on CPU with an
  input that requires grad raises :class:`FlexBackwardUnsupported` before doing any work.
* ``tree_varlen``: the visible key/value rows of each branch (``M[:f_k]`` then ``Y_k``) are gathered
  with ``index_select`` into their own contiguous segment (autograd sums the branches' gradients
  into the shared prefix rows), the prefix ``M`` is one causal segment, and every segment runs
  bottom-right-aligned causal attention: flash-attn's ``flash_attn_varlen_func`` on CUDA when it is
  installed, else torch's ``varlen_attn`` on CUDA, else per-segment SDPA on 4-D tensors (CPU, and
  CUDA with float32/float64). :func:`tree_varlen_kernel` says which one a call will use.

The visibility rule is :meth:`padoc_ray.trainer.tree.TreeLayout.visible`; here it is vectorized
once, in :func:`visible_mask_mod`, over per-token branch ids and prefix limits taken from the
layout, and both the dense mask and the flex ``mask_mod`` are that function. :func:`register_tree_attention`
hooks :func:`tree_attention` into transformers' ``AttentionInterface``. This module knows nothing of
tokens, labels, losses or optimizers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .config import BACKENDS
from .tree import PREFIX, TreeLayout

ATTENTION_NAME = "padoc_tree"
DEFAULT_HOOK_BACKEND = "tree_varlen"  # used by the transformers hook when no tree_backend is passed

# kernel names reported by tree_varlen_kernel
KERNEL_FLASH_ATTN = "flash_attn.flash_attn_varlen_func"
KERNEL_TORCH_VARLEN = "torch.nn.attention.varlen.varlen_attn"
KERNEL_SDPA_SEGMENTS = "sdpa_per_segment"

_CACHE = 16  # layouts kept per cache (one training step reuses one layout across all layers)


class FlexBackwardUnsupported(NotImplementedError):
    """flex attention was asked for gradients on CPU, where torch has no FlexAttention backward."""


# ---- the vectorized visibility rule -------------------------------------------------------------
def _token_arrays(layout: TreeLayout, device) -> tuple[torch.Tensor, torch.Tensor]:
    """(branch id per token, -1 for the prefix; number of prefix tokens each token may see)."""
    seg = torch.tensor(layout.token_branch(), dtype=torch.int32, device=device)
    lim = torch.tensor(layout.token_fork(), dtype=torch.int32, device=device)
    return seg, lim


def visible_mask_mod(seg: torch.Tensor, lim: torch.Tensor):
    """``TreeLayout.visible`` over tensors: returns ``mask_mod(b, h, q_idx, kv_idx) -> bool tensor``.

    Key ``k`` is visible to query ``q`` iff ``k <= q`` and either ``k`` is a prefix token before
    ``q``'s prefix limit (its fork, or ``q + 1`` for prefix queries) or ``k`` is in ``q``'s own
    segment. Works for scalar index tensors (flex) and broadcast index grids (dense mask) alike.
    """

    def mask_mod(b, h, q_idx, kv_idx):
        seg_k = seg[kv_idx]
        in_prefix = (seg_k == PREFIX) & (kv_idx < lim[q_idx])
        return (kv_idx <= q_idx) & (in_prefix | (seg_k == seg[q_idx]))

    return mask_mod


def dense_mask(layout: TreeLayout, device=None) -> torch.Tensor:
    """The (S, S) bool mask, ``True`` where query row attends to key column."""
    return _dense_mask_cached(layout, str(torch.device(device or "cpu")))


@functools.lru_cache(maxsize=_CACHE)
def _dense_mask_cached(layout: TreeLayout, device: str) -> torch.Tensor:
    seg, lim = _token_arrays(layout, device)
    idx = torch.arange(layout.total_len(), device=device, dtype=torch.int32)
    return visible_mask_mod(seg, lim)(None, None, idx[:, None], idx[None, :])


# ---- dense --------------------------------------------------------------------------------------
def _dense(q, k, v, layout, scale):
    mask = dense_mask(layout, q.device)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(1, 2)


# ---- flex ---------------------------------------------------------------------------------------
@functools.lru_cache(maxsize=_CACHE)
def _block_mask(layout: TreeLayout, device: str, block_size: int):
    from torch.nn.attention.flex_attention import create_block_mask

    seg, lim = _token_arrays(layout, device)
    s = layout.total_len()
    return create_block_mask(visible_mask_mod(seg, lim), 1, None, s, s, device=device, BLOCK_SIZE=block_size)


@functools.lru_cache(maxsize=2)
def _flex_fn(compiled: bool):
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention) if compiled else flex_attention  # dynamic after the first new length


def _flex(q, k, v, layout, scale, compile_: bool | None, block_size: int):
    if q.device.type == "cpu" and any(t.requires_grad for t in (q, k, v)):
        if not torch.is_grad_enabled():  # torch refuses inputs that require grad even under no_grad
            q, k, v = q.detach(), k.detach(), v.detach()
        else:
            raise FlexBackwardUnsupported(
                "flex attention has no backward on CPU (torch: 'FlexAttention does not support backward on "
                "CPU'); train on CPU with backend 'tree_varlen' or 'dense', or call flex under torch.no_grad()")
    compiled = q.device.type == "cuda" if compile_ is None else compile_
    bm = _block_mask(layout, str(q.device), block_size)
    if compiled:
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    out = _flex_fn(compiled)(q, k, v, block_mask=bm, scale=scale, enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(1, 2)


# ---- tree-varlen --------------------------------------------------------------------------------
@dataclass(frozen=True)
class VarlenPlan:
    """Segments of a layout for varlen attention. Queries keep packed order (segment i's queries are
    ``[cu_q[i], cu_q[i+1])`` of the packed sequence); keys are ``k[kv_index]``, segment i's keys
    ``[cu_k[i], cu_k[i+1])``, aligned bottom-right to its queries."""

    kv_index: torch.Tensor  # (T_k,) int64 packed row of each gathered key
    cu_q: torch.Tensor  # (n_seg + 1,) int32
    cu_k: torch.Tensor  # (n_seg + 1,) int32
    max_q: int
    max_k: int
    segments: tuple[tuple[int, int, int, int], ...]  # (q_start, q_len, k_start, k_len)


def varlen_plan(layout: TreeLayout, device=None) -> VarlenPlan:
    return _varlen_plan_cached(layout, str(torch.device(device or "cpu")))


@functools.lru_cache(maxsize=_CACHE)
def _varlen_plan_cached(layout: TreeLayout, device: str) -> VarlenPlan:
    p = layout.prefix_len
    rows: list[range] = []
    segs: list[tuple[int, int, int, int]] = []
    kpos = 0
    if p:
        rows.append(range(p))
        segs.append((0, p, 0, p))
        kpos = p
    for f, s, n in zip(layout.forks, layout.branch_starts(), layout.branch_lens):
        rows += [range(f), range(s, s + n)]
        segs.append((s, n, kpos, f + n))
        kpos += f + n
    index = torch.tensor([i for r in rows for i in r], dtype=torch.long, device=device)
    cu_q = torch.tensor([0, *(a + b for a, b, _, _ in segs)], dtype=torch.int32, device=device)
    cu_k = torch.tensor([0, *(c + d for _, _, c, d in segs)], dtype=torch.int32, device=device)
    return VarlenPlan(index, cu_q, cu_k, max(x[1] for x in segs), max(x[3] for x in segs), tuple(segs))


@functools.lru_cache(maxsize=1)
def _flash_attn_varlen():
    try:
        from flash_attn import flash_attn_varlen_func
    except Exception:  # not installed, or built for another torch/CUDA
        return None
    return flash_attn_varlen_func


def _torch_varlen():
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    return varlen_attn


def tree_varlen_kernel(device, dtype: torch.dtype = torch.bfloat16) -> str:
    """Which kernel backend ``tree_varlen`` uses for tensors on ``device`` of ``dtype``."""
    dev = torch.device(device)
    if dev.type == "cuda" and dtype in (torch.float16, torch.bfloat16):
        if _flash_attn_varlen() is not None:
            return KERNEL_FLASH_ATTN
        if _torch_varlen() is not None:
            return KERNEL_TORCH_VARLEN
    return KERNEL_SDPA_SEGMENTS


def _tree_varlen(q, k, v, layout, scale):
    plan = varlen_plan(layout, q.device)
    kernel = tree_varlen_kernel(q.device, q.dtype)
    if kernel == KERNEL_SDPA_SEGMENTS:
        return _sdpa_segments(q, k, v, plan, layout, scale)
    qt = q[0].transpose(0, 1)  # (S, Hq, D)
    kt = k[0].transpose(0, 1).index_select(0, plan.kv_index)  # (T_k, Hkv, D)
    vt = v[0].transpose(0, 1).index_select(0, plan.kv_index)
    if kernel == KERNEL_FLASH_ATTN:
        out = _flash_attn_varlen()(qt.contiguous(), kt, vt, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k,
                                   softmax_scale=scale, causal=True)
    else:
        out = _torch_varlen()(qt.contiguous(), kt, vt, plan.cu_q, plan.cu_k, plan.max_q, plan.max_k, scale=scale,
                              window_size=(-1, 0), enable_gqa=q.shape[1] != k.shape[1])
    return out.unsqueeze(0)


def _sdpa_segments(q, k, v, plan: VarlenPlan, layout: TreeLayout, scale):
    """Per-segment SDPA on 4-D views. ``split`` (not slicing) keeps the backward a single concat."""
    gqa = q.shape[1] != k.shape[1]
    q_lens = [nq for _, nq, _, _ in plan.segments]
    k_lens = [nk for _, _, _, nk in plan.segments]
    qs = q.split(q_lens, dim=2)
    ks = k.index_select(2, plan.kv_index).split(k_lens, dim=2)  # (1, Hkv, T_k, D) -> segments
    vs = v.index_select(2, plan.kv_index).split(k_lens, dim=2)
    masks = _segment_masks(layout, str(q.device), q.dtype)
    outs = []
    for qi, ki, vi, m in zip(qs, ks, vs, masks):
        if m is None:  # square segment: top-left causal is bottom-right causal
            o = F.scaled_dot_product_attention(qi, ki, vi, is_causal=True, scale=scale, enable_gqa=gqa)
        else:
            o = F.scaled_dot_product_attention(qi, ki, vi, attn_mask=m, scale=scale, enable_gqa=gqa)
        outs.append(o.transpose(1, 2))  # (1, L, H, D)
    return torch.cat(outs, dim=1)


@functools.lru_cache(maxsize=_CACHE)
def _segment_masks(layout: TreeLayout, device: str, dtype: torch.dtype) -> tuple[torch.Tensor | None, ...]:
    """Additive bottom-right causal masks (query i sees key j iff j <= i + nk - nq); None for square
    segments. Float, so SDPA does not convert a bool mask on every call."""
    out = []
    for _, nq, _, nk in varlen_plan(layout, device).segments:
        if nq == nk:
            out.append(None)
            continue
        keep = torch.ones(nq, nk, dtype=torch.bool, device=device).tril(nk - nq)
        out.append(torch.zeros(nq, nk, dtype=dtype, device=device).masked_fill_(~keep, float("-inf")))
    return tuple(out)


# ---- public entry point -------------------------------------------------------------------------
def tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layout: TreeLayout, *, backend: str,
                   scale: float | None = None, flex_compile: bool | None = None,
                   flex_block_size: int = 128) -> torch.Tensor:
    """Ancestor attention of one packed sample.

    ``q``: (1, Hq, S, D); ``k``/``v``: (1, Hkv, S, D) with Hq a multiple of Hkv (GQA);
    S == ``layout.total_len()``. Returns (1, S, Hq, D) (transformers' layout). ``scale`` defaults to
    1/sqrt(D). ``flex_compile``: compile flex attention (default: on CUDA only).
    """
    if backend not in BACKENDS:
        raise ValueError(f"unknown tree attention backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"q, k, v must be 4-D (1, H, S, D); got {tuple(q.shape)}, {tuple(k.shape)}, {tuple(v.shape)}")
    if q.shape[0] != 1 or k.shape[0] != 1 or v.shape[0] != 1:
        raise ValueError(f"tree attention takes one packed sample per call (batch 1); got batch {q.shape[0]}")
    if k.shape != v.shape or q.shape[2:] != k.shape[2:]:
        raise ValueError(f"shape mismatch: q {tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}")
    if q.shape[1] % k.shape[1]:
        raise ValueError(f"{q.shape[1]} query heads is not a multiple of {k.shape[1]} key/value heads")
    if q.shape[2] != layout.total_len():
        raise ValueError(f"sequence length {q.shape[2]} != layout total length {layout.total_len()}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    if backend == "dense":
        return _dense(q, k, v, layout, scale)
    if backend == "flex":
        return _flex(q, k, v, layout, scale, flex_compile, flex_block_size)
    return _tree_varlen(q, k, v, layout, scale)


# ---- transformers hook --------------------------------------------------------------------------
def _padoc_tree_attention(module, query, key, value, attention_mask, dropout: float = 0.0,
                          scaling: float | None = None, **kwargs):
    """transformers AttentionInterface function: ``model(..., tree_layout=L, tree_backend=...)``."""
    if not getattr(module, "is_causal", True) or kwargs.get("is_causal") is False:
        # non-causal modules (the vision tower) are not tree-shaped: plain SDPA
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        kwargs.pop("tree_layout", None), kwargs.pop("tree_backend", None)
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    layout = kwargs.get("tree_layout")
    if not isinstance(layout, TreeLayout):
        raise ValueError(f"attention {ATTENTION_NAME!r} needs model(..., tree_layout=TreeLayout(...)); "
                         f"got {type(layout).__name__}")
    if dropout:
        raise ValueError(f"attention {ATTENTION_NAME!r} does not implement attention dropout (got {dropout})")
    if key.shape[2] != query.shape[2]:
        raise ValueError(f"attention {ATTENTION_NAME!r} is for training on whole packed samples; got "
                         f"{query.shape[2]} queries against {key.shape[2]} keys (a KV cache?)")
    backend = kwargs.get("tree_backend") or DEFAULT_HOOK_BACKEND
    return tree_attention(query, key, value, layout, backend=backend, scale=scaling), None


def register_tree_attention() -> str:
    """Register the ``padoc_tree`` attention with transformers (idempotent); returns its name.

    Then ``model.set_attn_implementation(name)`` and call ``model(..., tree_layout=..., tree_backend=...)``.
    """
    from transformers import AttentionInterface

    AttentionInterface.register(ATTENTION_NAME, _padoc_tree_attention)
    return ATTENTION_NAME
