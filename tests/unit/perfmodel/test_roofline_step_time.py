"""The roofline step time: its numbers come from the GPU and shape tables, and it lands on the side of
the roofline a 2B model's steps are known to be on."""

from __future__ import annotations

import dataclasses
import os

import pytest

from padoc_ray.perfmodel.gpus import GPUS, SHAPES, Gpu, gpu, model_shape
from padoc_ray.perfmodel.roofline import DTYPE_BYTES, Efficiency, RooflineStepTime
from padoc_ray.perfmodel.step import StepLoad

DECODE = StepLoad(decode_seqs=64, prefill_tokens=0, context_tokens=64 * 3000)  # 64 pages' streams at 3k context
PREFILL = StepLoad(decode_seqs=0, prefill_tokens=16384, context_tokens=16384)  # a big chunked prefill


def test_every_gpu_row_is_sourced_and_the_shape_counts_its_parameters():
    assert set(GPUS) == {"A800-80G", "H100-80G", "H200", "L40S"}
    assert set(SHAPES) == {"qwen3-vl-2b", "hpd-1b", "dots-ocr"}
    for g in GPUS.values():
        assert "datasheet" in g.source and g.hbm_bytes_per_s > 0 and g.bf16_flops_per_s > 0
    s = SHAPES["qwen3-vl-2b"]
    # q, k, v, o (16 and 8 heads of 128 over 2048) and the gated MLP (3 x 2048 x 6144), per layer
    assert s.layer_params == 2048 * 128 * (16 + 8 + 8 + 16) + 3 * 2048 * 6144
    lm = s.layers * s.layer_params + s.lm_head_params
    assert 1.6e9 < lm < 1.8e9 and 2.9e8 < s.vit_params < 4.5e8  # a "2B" model: ~1.7B LM + ~0.4B ViT
    assert s.kv_values_per_token == 2 * 28 * 8 * 128


def test_the_hpd_1b_shape_is_hpd_parsings_config():
    """HPD-Parsing (InternVL3.5-1B-based): InternViT-300M on 448-px tiles, pixel shuffle 0.5, mlp1 to a
    Qwen3 decoder of hidden 1024; sourced like the Qwen entry."""
    s = model_shape("hpd-1b")
    assert s is SHAPES["hpd-1b"] and "oar-ocr's config.rs" in s.source and "InternVL3.5-1B" in s.source
    text = (s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, s.vocab)
    vision = (s.vit_depth, s.vit_hidden, s.vit_intermediate, s.patch, s.merge, s.vit_out_hidden)
    assert text == (28, 1024, 16, 8, 128, 3072, 151681) and vision == (24, 1024, 4096, 14, 2, 1024)
    assert s.vit_window == (448 // 14) ** 2 == 1024 and s.deepstack_mergers == 0 and not s.tied_embeddings
    assert s.layer_params == 1024 * 128 * (16 + 8 + 8 + 16) + 3 * 1024 * 3072
    assert s.merger_params == 4096 * 1024 + 1024 * 1024  # mlp1: Linear 4096 -> 1024, Linear 1024 -> 1024
    assert 2.95e8 < s.vit_params < 3.1e8  # InternViT-300M and its projector
    lm = s.layers * s.layer_params + s.lm_head_params
    assert 5.8e8 < lm < 6.1e8 and s.resident_params == lm + 151681 * 1024 + s.vit_params  # untied: a 2nd table
    assert 1.0e9 < s.resident_params < 1.1e9  # a "1B" model
    assert s.kv_values_per_token == SHAPES["qwen3-vl-2b"].kv_values_per_token  # same layers, KV heads, head_dim


def test_hpd_1b_steps_are_cheaper_than_qwen3_vl_2bs_for_the_same_load():
    hpd, qwen = RooflineStepTime("H200", "hpd-1b"), RooflineStepTime("H200", "qwen3-vl-2b")
    image = StepLoad(0, 3328, 3328, images=1, image_tokens=3328)  # a 1224 x 1584 page: 12 tiles + the thumbnail
    for load in (DECODE, PREFILL, image, StepLoad(decode_seqs=1, prefill_tokens=0, context_tokens=2000)):
        assert hpd.seconds(load) < qwen.seconds(load), load
    # the weights read per step: decoder layers and LM head, fewer bytes in the same proportion
    h, q = SHAPES["hpd-1b"], SHAPES["qwen3-vl-2b"]
    ratio = (h.layers * h.layer_params + h.lm_head_params) / (q.layers * q.layer_params + q.lm_head_params)
    assert hpd.terms(DECODE)["weights"] == pytest.approx(ratio * qwen.terms(DECODE)["weights"])
    assert hpd.terms(DECODE)["kv"] == pytest.approx(qwen.terms(DECODE)["kv"])  # the same KV per token


def test_internvit_attends_within_a_tile_so_its_work_is_per_tile():
    """ViT FLOPs over (448/14)^2 = 1,024 patches a tile (the thumbnail is one more), attention within the tile:
    the encoder's seconds are the tiles' count times one tile's, however the tiles are split into images."""
    rt = RooflineStepTime("H200", "hpd-1b")
    s, g, e = SHAPES["hpd-1b"], GPUS["H200"], Efficiency()
    tile = (2 * s.vit_depth * s.vit_layer_params * 1024 + 4 * s.vit_depth * s.vit_hidden * 1024 * 1024
            + 2 * s.merger_params * 256)
    for tiles in (1, 13, 25):
        got = rt.terms(StepLoad(0, 256 * tiles, 256 * tiles, images=1, image_tokens=256 * tiles))["vit"]
        assert got == pytest.approx(tiles * tile / (g.bf16_flops_per_s * e.vit))  # compute-bound from one tile
    two = rt.terms(StepLoad(0, 6400, 6400, images=2, image_tokens=6400))["vit"]
    assert two == pytest.approx(rt.terms(StepLoad(0, 6400, 6400, images=1, image_tokens=6400))["vit"])


def test_the_terms_are_the_table_numbers_over_the_efficiencies():
    rt = RooflineStepTime("A800-80G", "qwen3-vl-2b")
    g, s, e = GPUS["A800-80G"], SHAPES["qwen3-vl-2b"], Efficiency()
    t = rt.terms(DECODE)
    assert t["weights"] == pytest.approx((s.layers * s.layer_params + s.lm_head_params) * DTYPE_BYTES
                                         / (g.hbm_bytes_per_s * e.weights))
    assert t["kv"] == pytest.approx(DECODE.context_tokens * s.kv_values_per_token * DTYPE_BYTES
                                    / (g.hbm_bytes_per_s * e.kv))
    assert t["matmul"] == pytest.approx(2 * (s.layers * s.layer_params + s.lm_head_params) * 64
                                        / (g.bf16_flops_per_s * e.matmul))
    assert rt.seconds(DECODE) == pytest.approx(e.step_overhead_s + t["weights"] + t["kv"])  # memory side
    per_key = 4 * s.layers * s.heads * s.head_dim / (g.bf16_flops_per_s * e.attention)
    assert t["attention"] == pytest.approx(per_key * DECODE.context_tokens)  # each decoding token sees its context
    p = PREFILL.prefill_tokens  # a lone prefill: causal, each token sees the ones before it
    assert rt.terms(PREFILL)["attention"] == pytest.approx(per_key * p * p / 2)


def test_changing_a_table_row_changes_the_result():
    base = RooflineStepTime("A800-80G", "qwen3-vl-2b")
    a800 = GPUS["A800-80G"]
    wide = RooflineStepTime(dataclasses.replace(a800, hbm_bytes_per_s=2 * a800.hbm_bytes_per_s), "qwen3-vl-2b")
    fast = RooflineStepTime(dataclasses.replace(a800, bf16_flops_per_s=2 * a800.bf16_flops_per_s), "qwen3-vl-2b")
    overhead = Efficiency().step_overhead_s
    assert wide.seconds(DECODE) - overhead == pytest.approx((base.seconds(DECODE) - overhead) / 2)
    assert fast.seconds(DECODE) == base.seconds(DECODE)  # decode does not care about FLOPs
    assert fast.seconds(PREFILL) - overhead == pytest.approx((base.seconds(PREFILL) - overhead) / 2)
    deeper = RooflineStepTime("A800-80G", dataclasses.replace(SHAPES["qwen3-vl-2b"], layers=56))
    assert deeper.terms(DECODE)["kv"] == pytest.approx(2 * base.terms(DECODE)["kv"])
    slow = RooflineStepTime("A800-80G", "qwen3-vl-2b", Efficiency(weights=0.35, kv=0.25))
    assert slow.seconds(DECODE) - overhead == pytest.approx(2 * (base.seconds(DECODE) - overhead))


def test_decode_is_memory_bound_and_a_big_prefill_compute_bound_on_the_a800():
    rt = RooflineStepTime("A800-80G", "qwen3-vl-2b")
    assert rt.bound(DECODE) == "memory"
    assert rt.bound(StepLoad(decode_seqs=1, prefill_tokens=0, context_tokens=2000)) == "memory"
    assert rt.bound(PREFILL) == "compute"


def test_decode_is_fastest_on_the_h200_then_the_a800_then_the_l40s():
    t = {name: RooflineStepTime(name, "qwen3-vl-2b").seconds(DECODE) for name in GPUS}
    assert t["H200"] < t["H100-80G"] < t["A800-80G"] < t["L40S"]


def test_the_vision_encoder_runs_only_for_images_and_grows_faster_than_its_tokens():
    rt = RooflineStepTime("A800-80G", "qwen3-vl-2b")
    assert rt.terms(StepLoad(0, 1800, 1800))["vit"] == 0.0
    one = rt.terms(StepLoad(0, 1800, 1800, images=1, image_tokens=1750))["vit"]
    big = rt.terms(StepLoad(0, 7000, 7000, images=1, image_tokens=7000))["vit"]
    two = rt.terms(StepLoad(0, 3600, 3600, images=2, image_tokens=3500))["vit"]
    assert one > 0 and big > 4 * one  # attention over the image's patches is quadratic in them
    assert two == pytest.approx(2 * one)  # two images are two separate attentions
    assert rt.seconds(StepLoad(0, 0, 0)) == Efficiency().step_overhead_s  # an empty step: overhead only


def test_model_shape_reads_a_checkpoints_config(tiny_model_dir):
    s = model_shape(tiny_model_dir)
    text = (s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, s.vocab)
    vision = (s.vit_depth, s.vit_hidden, s.vit_intermediate, s.patch, s.merge, s.vit_out_hidden)
    assert text == (2, 128, 4, 2, 32, 256, 9216) and vision == (2, 64, 128, 16, 2, 128)
    assert s.deepstack_mergers == 2 and s.source.endswith("config.json")
    assert not s.tied_embeddings and s.vit_window == 0  # its tie_word_embeddings (false); a Qwen-VL encoder
    d = RooflineStepTime("L40S", tiny_model_dir).describe()
    assert d["kind"] == "roofline" and d["gpu"] == "L40S" and d["model"] == os.path.basename(tiny_model_dir)
    assert set(d["efficiency"]) == {"weights", "kv", "matmul", "attention", "vit", "step_overhead_s"}


def test_bad_names_and_efficiencies_are_refused(tmp_path):
    with pytest.raises(ValueError, match="unknown GPU 'B200'"):
        gpu("B200")
    with pytest.raises(ValueError, match="neither a built-in shape"):
        model_shape(str(tmp_path))
    (tmp_path / "config.json").write_text('{"text_config": {"hidden_size": 8}}')
    with pytest.raises(ValueError, match="lacks num_hidden_layers"):
        model_shape(str(tmp_path))
    with pytest.raises(ValueError, match="efficiency kv"):
        Efficiency(kv=1.5)
    with pytest.raises(ValueError, match="step_overhead_s"):
        Efficiency(step_overhead_s=-1)
    assert isinstance(GPUS["H200"], Gpu)


def test_the_kv_cache_is_what_vllm_leaves_of_the_gpus_memory():
    """90% of the memory, less the weights (decoder, tied LM head, vision encoder) and the reserve, in blocks
    of block_size tokens of every layer's K and V."""
    from padoc_ray.perfmodel.roofline import GPU_MEMORY_UTILIZATION, NON_KV_BYTES, kv_cache_blocks

    g, s = GPUS["A800-80G"], SHAPES["qwen3-vl-2b"]
    weights = 2 * (s.layers * s.layer_params + s.lm_head_params + s.vit_params)
    assert 4.0e9 < weights < 4.6e9  # a 2.1B model in bf16
    per_block = 16 * 2 * s.layers * s.kv_heads * s.head_dim * 2
    want = int((g.memory_bytes * GPU_MEMORY_UTILIZATION - weights - NON_KV_BYTES) // per_block)
    assert kv_cache_blocks("A800-80G", "qwen3-vl-2b", 16) == want
    assert kv_cache_blocks("H200", "qwen3-vl-2b", 16) > want > kv_cache_blocks("L40S", "qwen3-vl-2b", 16)
    # hpd-1b: its untied embedding table is in memory too; fewer weights leave more KV blocks
    h = SHAPES["hpd-1b"]
    hpd_weights = 2 * (h.layers * h.layer_params + 2 * h.lm_head_params + h.vit_params)
    hpd_block = 16 * h.kv_values_per_token * 2
    assert kv_cache_blocks("A800-80G", "hpd-1b", 16) == int(
        (g.memory_bytes * GPU_MEMORY_UTILIZATION - hpd_weights - NON_KV_BYTES) // hpd_block) > want
    with pytest.raises(ValueError, match="does not fit"):
        kv_cache_blocks("L40S", "qwen3-vl-2b", 16, utilization=0.05)
