"""Ancestor attention: the visibility rule, the three backends against each other and against running
each branch as its own causal sequence, and the transformers hook on the tiny Qwen3-VL."""

from __future__ import annotations

import json
import os
import random
import warnings

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from padoc_ray.trainer.tree import PREFIX, TreeLayout

import torch  # noqa: E402
F = torch.nn.functional

from padoc_ray.trainer import attention as A  # noqa: E402
from padoc_ray.trainer.attention import (  # noqa: E402
    BACKENDS, FlexBackwardUnsupported, dense_mask, register_tree_attention, tree_attention, tree_varlen_kernel,
)

from tests.conftest import ROOT  # noqa: E402


# ---- TreeLayout -----------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, match", [
    (dict(prefix_len=-1), "prefix_len = -1 is out of range"),
    (dict(prefix_len=4, forks=(5,), branch_lens=(1,)), r"forks\[0\] = 5 is out of range: it must be \[0, 4\]"),
    (dict(prefix_len=4, forks=(-1,), branch_lens=(1,)), r"forks\[0\] = -1"),
    (dict(prefix_len=4, forks=(1, 2), branch_lens=(3, 0)), r"branch_lens\[1\] = 0 is out of range"),
    (dict(prefix_len=4, forks=(1, 2), branch_lens=(3,)), "forks has 2 entries but branch_lens has 1"),
    (dict(prefix_len=4.0), "prefix_len must be an int"),
    (dict(prefix_len=True), "prefix_len must be an int"),
    (dict(prefix_len=4, forks=("1",), branch_lens=(1,)), r"forks\[0\] must be an int"),
    (dict(prefix_len=0), "empty layout"),
    (dict(prefix_len=3, forks=5, branch_lens=1), "sequences of ints"),
])
def test_layout_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        TreeLayout(**kwargs)


def test_layout_accepts_lists_and_is_hashable():
    a = TreeLayout(5, [2, 0], [3, 1])
    b = TreeLayout(5, (2, 0), (3, 1))
    assert a == b and hash(a) == hash(b) and a.forks == (2, 0)
    assert a.total_len() == 9 and a.branch_starts() == (5, 8)
    with pytest.raises(ValueError, match="q = 9 is out of range"):
        a.visible(9, 0)


layouts = st.integers(0, 12).flatmap(lambda p: st.lists(
    st.tuples(st.integers(0, p), st.integers(1, 5)), min_size=0 if p else 1, max_size=5).map(
    lambda br: TreeLayout(p, tuple(f for f, _ in br), tuple(n for _, n in br))))


@settings(max_examples=60, deadline=None)
@given(layouts)
def test_visibility_properties(lay):
    n, p = lay.total_len(), lay.prefix_len
    seg = lay.token_branch()
    vis = [[lay.visible(q, k) for k in range(n)] for q in range(n)]
    for q in range(n):
        assert vis[q][q], "every token sees itself"
        for k in range(n):
            if k > q:
                assert not vis[q][k]
            if q < p:  # the prefix is plainly causal
                assert vis[q][k] == (k <= q)
            elif k < p:  # a branch sees the prefix before its fork, nothing at or after it
                assert vis[q][k] == (k < lay.forks[seg[q]])
            elif seg[k] != seg[q]:
                assert not vis[q][k], "a branch never sees a sibling"
            else:
                assert vis[q][k] == (k <= q)
    assert sum(map(sum, vis)) == lay.visible_pairs()
    # each branch's linear sequence M[:f_k] + Y_k: positions count up from 0 and every token sees
    # exactly its predecessors in that sequence
    pos = lay.linear_positions()
    for b in range(lay.num_branches):
        idx = lay.linear_indices(b)
        assert [pos[i] for i in idx] == list(range(len(idx)))
        for j, q in enumerate(idx[lay.forks[b]:], start=lay.forks[b]):
            assert {k for k in range(n) if vis[q][k]} == set(idx[:j + 1])
    assert [pos[i] for i in range(p)] == list(range(p))
    assert seg == [PREFIX] * p + [b for b, m in enumerate(lay.branch_lens) for _ in range(m)]
    # the vectorized rule (dense mask and flex mask_mod) is the same rule
    assert dense_mask(lay).tolist() == vis


# ---- backends -------------------------------------------------------------------------------------
CASES = {
    "general": TreeLayout(23, (4, 11, 23, 0), (6, 9, 3, 5)),
    "length1_branches": TreeLayout(10, (3, 3, 7), (1, 1, 1)),
    "forks_at_0_and_end": TreeLayout(9, (0, 9, 0, 9), (4, 2, 1, 5)),
    "no_branches": TreeLayout(17),
    "empty_prefix": TreeLayout(0, (0, 0), (3, 4)),
}


def _qkv(lay, hq=4, hkv=2, d=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    s = lay.total_len()
    mk = lambda h: torch.randn(1, h, s, d, generator=g, dtype=torch.float64).requires_grad_()  # noqa: E731
    return mk(hq), mk(hkv), mk(hkv), torch.randn(1, s, hq, d, generator=g, dtype=torch.float64)


def _run(backend, lay, q, k, v, w):
    out = tree_attention(q, k, v, lay, backend=backend)
    grads = torch.autograd.grad((out * w).sum(), (q, k, v))
    return out.detach(), grads


def _linear_reference(lay, q, k, v, w):
    """Run M alone and each M[:f_k] + Y_k alone as plain causal sequences (GQA expanded by hand)."""
    rep = q.shape[1] // k.shape[1]
    ke, ve = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
    out = torch.zeros(1, lay.total_len(), q.shape[1], q.shape[3], dtype=q.dtype)
    loss = 0.0
    seqs = [list(range(lay.prefix_len))] if lay.prefix_len else []
    seqs += [lay.linear_indices(b) for b in range(lay.num_branches)]
    owners = [list(range(lay.prefix_len))] if lay.prefix_len else []
    owners += [list(range(s, s + n)) for s, n in zip(lay.branch_starts(), lay.branch_lens)]
    for idx, own in zip(seqs, owners):
        i = torch.tensor(idx)
        o = F.scaled_dot_product_attention(q[:, :, i], ke[:, :, i], ve[:, :, i], is_causal=True).transpose(1, 2)
        o = o[:, len(idx) - len(own):]  # the rows this sequence owns (the branch, or all of M)
        out[:, own] = o.detach()
        loss = loss + (o * w[:, own]).sum()
    return out, torch.autograd.grad(loss, (q, k, v))


@pytest.mark.parametrize("name", list(CASES))
@pytest.mark.parametrize("backend", ["dense", "tree_varlen"])
def test_backend_equals_each_branch_run_alone(name, backend):
    lay = CASES[name]
    q, k, v, w = _qkv(lay, seed=len(name))
    out, grads = _run(backend, lay, q, k, v, w)
    ref_out, ref_grads = _linear_reference(lay, q, k, v, w)
    assert out.shape == (1, lay.total_len(), 4, 8)
    torch.testing.assert_close(out, ref_out, rtol=0, atol=1e-12)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, rtol=0, atol=1e-12)


@pytest.mark.parametrize("hq, hkv", [(4, 4), (6, 2), (4, 1)])
def test_backends_agree_with_gqa(hq, hkv):
    lay = CASES["general"]
    q, k, v, w = _qkv(lay, hq, hkv, d=16, seed=hq * 10 + hkv)
    d_out, d_grads = _run("dense", lay, q, k, v, w)
    t_out, t_grads = _run("tree_varlen", lay, q, k, v, w)
    torch.testing.assert_close(t_out, d_out, rtol=0, atol=1e-12)
    for a, b in zip(t_grads, d_grads):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    # a custom scale reaches the kernels
    s1 = tree_attention(q, k, v, lay, backend="tree_varlen", scale=0.05)
    torch.testing.assert_close(s1, tree_attention(q, k, v, lay, backend="dense", scale=0.05), rtol=0, atol=1e-12)
    assert not torch.allclose(s1, t_out)


def test_tree_masking_matters():
    """Guard against a reference that cannot fail: plain causal attention over the packed sequence differs."""
    lay = CASES["general"]
    q, k, v, _ = _qkv(lay)
    causal = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True).transpose(1, 2)
    tree = tree_attention(q, k, v, lay, backend="tree_varlen")
    p = lay.prefix_len
    torch.testing.assert_close(tree[:, :p], causal[:, :p])
    assert (tree[:, p:] - causal[:, p:]).abs().max() > 1e-3


def test_flex_forward_equals_dense_on_cpu():
    warnings.filterwarnings("ignore", message=".*flex_attention.*")
    lay = TreeLayout(23, (0, 11, 23, 4), (6, 1, 3, 5))  # one eager call (slow on CPU): forks at 0 and |M|
    q, k, v, _ = _qkv(lay, 6, 2)
    with torch.no_grad():  # inputs still require grad: the backend detaches them for torch
        out = tree_attention(q, k, v, lay, backend="flex")
    torch.testing.assert_close(out, tree_attention(q, k, v, lay, backend="dense").detach(), rtol=0, atol=1e-12)


def test_flex_backward_on_cpu_is_refused_clearly():
    lay = CASES["general"]
    q, k, v, _ = _qkv(lay)
    with pytest.raises(FlexBackwardUnsupported, match="no backward on CPU.*tree_varlen"):
        tree_attention(q, k, v, lay, backend="flex")


@pytest.mark.gpu
def test_backends_agree_on_cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    lay = TreeLayout(300, (0, 77, 150, 300), (40, 1, 129, 64))
    for dtype, atol in ((torch.float32, 2e-3), (torch.bfloat16, 3e-2)):
        q, k, v, w = (t.detach().to("cuda", dtype) for t in _qkv(lay, 8, 2, 64))
        for t in (q, k, v):
            t.requires_grad_()
        d_out, d_grads = _run("dense", lay, q, k, v, w)
        for backend in ("flex", "tree_varlen"):
            out, grads = _run(backend, lay, q, k, v, w)
            torch.testing.assert_close(out.float(), d_out.float(), rtol=0, atol=atol)
            for a, b in zip(grads, d_grads):
                torch.testing.assert_close(a.float(), b.float(), rtol=0, atol=atol * 4)


def test_tree_attention_rejects_bad_inputs():
    lay = CASES["general"]
    q, k, v, _ = _qkv(lay)
    with pytest.raises(ValueError, match="unknown tree attention backend 'sparse'"):
        tree_attention(q, k, v, lay, backend="sparse")
    s = lay.total_len()
    with pytest.raises(ValueError, match=f"sequence length {s - 1} != layout total length {s}"):
        tree_attention(q[:, :, 1:], k[:, :, 1:], v[:, :, 1:], lay, backend="dense")
    with pytest.raises(ValueError, match="not a multiple"):
        tree_attention(q[:, :3], k, v, lay, backend="dense")
    with pytest.raises(ValueError, match="batch 2"):
        tree_attention(q.expand(2, -1, -1, -1), k.expand(2, -1, -1, -1), v.expand(2, -1, -1, -1), lay,
                       backend="dense")


def test_varlen_kernel_choice():
    assert tree_varlen_kernel("cpu") == A.KERNEL_SDPA_SEGMENTS
    assert tree_varlen_kernel("cuda", torch.float32) == A.KERNEL_SDPA_SEGMENTS  # fused kernels: half only
    assert tree_varlen_kernel("cuda", torch.bfloat16) in (A.KERNEL_FLASH_ATTN, A.KERNEL_TORCH_VARLEN)
    plan = A.varlen_plan(CASES["general"])
    lay = CASES["general"]
    # keys of branch k's segment are exactly M[:f_k] + Y_k, in order
    for b, (_, nq, k0, nk) in enumerate(plan.segments[1:]):
        assert plan.kv_index[k0:k0 + nk].tolist() == lay.linear_indices(b)
    assert plan.cu_q[-1] == lay.total_len() and plan.cu_k[-1] == len(plan.kv_index)


# ---- the transformers hook on the tiny Qwen3-VL ---------------------------------------------------
@pytest.fixture(scope="module")
def tiny_model(request):
    import transformers
    path = os.path.join(ROOT, "models", "tiny")
    if not os.path.exists(os.path.join(path, "model.safetensors")):
        path = request.getfixturevalue("tiny_model_dir")
    model = transformers.Qwen3VLForConditionalGeneration.from_pretrained(path, dtype=torch.float64)
    return model.eval()


def _model_run(model, impl, ids, pos, w, **kw):
    model.set_attn_implementation(impl)
    model.zero_grad()
    logits = model(input_ids=ids, position_ids=pos, **kw).logits
    (logits * w).sum().backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_qwen3vl_hook_matches_dense_reference_and_linear_runs(tiny_model):
    name = register_tree_attention()
    assert name == "padoc_tree"
    lay = TreeLayout(30, (0, 12, 30, 21), (5, 1, 7, 9))
    s = lay.total_len()
    g = torch.Generator().manual_seed(3)
    ids = torch.randint(10, tiny_model.config.text_config.vocab_size, (1, s), generator=g)
    pos = torch.tensor(lay.linear_positions()).view(1, 1, s).expand(3, 1, s)
    w = torch.randn(1, s, tiny_model.config.text_config.vocab_size, generator=g, dtype=torch.float64)

    # the reference: transformers' own SDPA with the materialized 4-D bool mask
    ref_logits, ref_grads = _model_run(tiny_model, "sdpa", ids, pos, w, attention_mask=dense_mask(lay)[None, None])
    assert len(ref_grads) > 10  # attention and MLP weights of the language model got gradients
    for backend in ("dense", "tree_varlen"):
        logits, grads = _model_run(tiny_model, name, ids, pos, w, tree_layout=lay, tree_backend=backend)
        torch.testing.assert_close(logits, ref_logits, rtol=0, atol=1e-10)
        assert grads.keys() == ref_grads.keys()
        for n in grads:
            torch.testing.assert_close(grads[n], ref_grads[n], rtol=1e-9, atol=1e-9, msg=f"{backend}: {n}")
    tiny_model.set_attn_implementation(name)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        flex = tiny_model(input_ids=ids, position_ids=pos, tree_layout=lay, tree_backend="flex").logits
    torch.testing.assert_close(flex, ref_logits, rtol=0, atol=1e-10)

    # each branch run alone as the causal sequence M[:f_k] + Y_k (positions 0..len-1), and M alone
    tiny_model.set_attn_implementation("sdpa")
    tiny_model.zero_grad()
    loss = 0.0
    seqs = [(list(range(lay.prefix_len)), lay.prefix_len)]
    seqs += [(lay.linear_indices(b), n) for b, n in enumerate(lay.branch_lens)]
    for idx, own in seqs:
        i = torch.tensor(idx)
        lin = torch.arange(len(idx)).view(1, 1, -1).expand(3, 1, -1)
        lg = tiny_model(input_ids=ids[:, i], position_ids=lin).logits[:, -own:]
        torch.testing.assert_close(lg.detach(), ref_logits[:, i[-own:]], rtol=0, atol=1e-10)
        loss = loss + (lg * w[:, i[-own:]]).sum()
    loss.backward()
    # Qwen3-VL's RMSNorm computes in float32 even for a float64 model, so gradients summed in another
    # order (separate runs instead of one) agree to float32 rounding (~1e-7 of their scale), not 1e-12;
    # a wrong mask or position shifts them by a sizeable fraction of their scale
    for n, p in tiny_model.named_parameters():
        if n in ref_grads:
            scale = ref_grads[n].abs().max().item()
            torch.testing.assert_close(p.grad, ref_grads[n], rtol=0, atol=1e-6 * scale, msg=lambda m: f"{n}: {m}")

    # and the tree really matters: plain causal attention over the packed ids gives other logits
    with torch.no_grad():
        plain = tiny_model(input_ids=ids, position_ids=pos).logits
    assert (plain[:, lay.prefix_len:] - ref_logits[:, lay.prefix_len:]).abs().max() > 1e-4


def test_hook_leaves_non_causal_modules_to_sdpa():
    """The vision tower's blocks (is_causal=False, no tree) get plain bidirectional SDPA."""
    from types import SimpleNamespace

    lay = CASES["no_branches"]
    q, k, v, _ = _qkv(lay, 2, 2)
    out, _ = A._padoc_tree_attention(SimpleNamespace(is_causal=False), q, k, v, None, scaling=0.3, is_causal=False)
    ref = F.scaled_dot_product_attention(q, k, v, scale=0.3).transpose(1, 2)
    torch.testing.assert_close(out, ref)


def test_qwen3vl_hook_errors(tiny_model):
    name = register_tree_attention()
    tiny_model.set_attn_implementation(name)
    ids = torch.tensor([[11, 12, 13, 14]])
    try:
        with torch.no_grad(), pytest.raises(ValueError, match="needs model.*tree_layout"):
            tiny_model(input_ids=ids)
        with torch.no_grad(), pytest.raises(ValueError, match="sequence length 4 != layout total length 5"):
            tiny_model(input_ids=ids, tree_layout=TreeLayout(5), tree_backend="dense")
    finally:
        tiny_model.set_attn_implementation("sdpa")


# ---- the benchmark ----------------------------------------------------------------------------------
def test_random_tree_shape():
    from padoc_ray.bench.attention import random_tree

    rng = random.Random(1)
    for s in (40, 2048, 16384):
        lay = random_tree(s, 8, rng)
        assert lay.total_len() == s and lay.num_branches == 8
        assert 0.44 * s <= lay.prefix_len <= 0.56 * s
        assert list(lay.forks) == sorted(lay.forks)
        # forks are spread: one in each eighth of the prefix
        assert all(i * lay.prefix_len // 8 <= f <= (i + 1) * lay.prefix_len // 8 + 1 for i, f in enumerate(lay.forks))
    assert random_tree(50, 0, rng) == TreeLayout(50)


def test_bench_attention_cli(tmp_path, capsys):
    from padoc_ray.cli import main

    out = tmp_path / "att.json"
    warnings.filterwarnings("ignore", message=".*flex_attention.*")
    rc = main(["bench", "attention", "--lengths", "40,64", "--branches", "3", "--heads", "4", "--kv-heads", "2",
               "--head-dim", "8", "--repeats", "1", "--warmup", "0", "--dtype", "float64", "--no-flex-compile",
               "--json", str(out)])
    assert rc == 0
    res = json.loads(out.read_text())
    assert set(res) == set(BACKENDS) and set(res["dense"]) == {"40", "64"}
    for s in ("40", "64"):
        for b in ("dense", "tree_varlen"):
            r = res[b][s]
            assert "error" not in r and r["fwd_bwd_s"] > 0 and r["peak_bytes"] >= 0
            assert r["max_abs_diff_out"] < 1e-12 and r["max_abs_diff_grad"] < 1e-12
        flex = res["flex"][s]
        assert "backward on CPU" in flex["error"] and flex["fwd_s"] > 0 and flex["max_abs_diff_out"] < 1e-12
    table = capsys.readouterr().out
    assert "tree_varlen" in table and "vs dense" in table

    # over the memory budget: recorded, not run
    rc = main(["bench", "attention", "--lengths", "64", "--backends", "dense", "--heads", "2", "--kv-heads", "1",
               "--head-dim", "8", "--repeats", "1", "--memory-budget-gib", "0.00001", "--json", str(out)])
    assert rc == 0 and "exceeds the 1e-05 GiB budget" in json.loads(out.read_text())["dense"]["64"]["error"]


@pytest.mark.parametrize("argv, msg", [
    (["--backends", "dense,sparse"], "unknown backend"),
    (["--heads", "6", "--kv-heads", "4"], "multiple of kv_heads"),
    (["--lengths", "10"], "at least 2 * branches + 2"),
])
def test_bench_attention_bad_usage(argv, msg, capsys):
    from padoc_ray.cli import main

    with pytest.raises(SystemExit) as e:  # every command's usage errors: die(), SystemExit(2)
        main(["bench", "attention", *argv])
    assert e.value.code == 2
    assert msg in capsys.readouterr().err
