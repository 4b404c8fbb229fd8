"""`bench model --model-config dots-ocr`: dots.ocr's shape (a Qwen2 decoder and the 42-layer SwiGLU dots_vit),
its image rule (dots' own smart_resize, 28-px squares) and its grounding branches, whose prompts hold the
image, the grounding text and the region's box but no layout token. Fast: no engine, no Ray."""

from __future__ import annotations

import dataclasses
import json

import pytest

from padoc_ray.perfmodel.gpus import SHAPES, model_shape
from padoc_ray.perfmodel.plan import plan_page
from padoc_ray.perfmodel.trace import (
    PROCESSORS,
    DotsImageProcessor,
    grounding_prompts,
    image_processor,
    image_tokens,
    trace_from_page,
)
from padoc_ray.protocol import Box, Page, Region
from padoc_ray.protocol.codec import RawRegion
from padoc_ray.protocol.dots import GROUNDING_TEXT, box_text, smart_resize
from padoc_ray.protocol.family import GROUNDING, PREFIX_FORK
from padoc_ray.scheduler import SchedulerConfig

from tests.helpers.byte_protocol import ByteProtocol

P = ByteProtocol()
CFG = SchedulerConfig()
#: dots.ocr's config.json as published (rednote-hilab/dots.ocr), the fields a shape reads
DOTS_CONFIG = {
    "architectures": ["DotsOCRForCausalLM"], "model_type": "dots_ocr", "hidden_size": 1536, "intermediate_size": 8960,
    "num_hidden_layers": 28, "num_attention_heads": 12, "num_key_value_heads": 2, "vocab_size": 151936,
    "tie_word_embeddings": False,
    "vision_config": {"embed_dim": 1536, "hidden_size": 1536, "intermediate_size": 4224, "num_hidden_layers": 42,
                      "num_attention_heads": 12, "patch_size": 14, "spatial_merge_size": 2, "temporal_patch_size": 1},
}


# ---- the shape ------------------------------------------------------------------------------------------------
def test_the_dots_ocr_shape_is_dots_ocrs_config_and_prompts_grounding_branches(tmp_path):
    s = model_shape("dots-ocr")
    assert s is SHAPES["dots-ocr"] and "rednote-hilab/dots.ocr config.json" in s.source
    text = (s.layers, s.hidden, s.heads, s.kv_heads, s.head_dim, s.intermediate, s.vocab)
    vision = (s.vit_depth, s.vit_hidden, s.vit_intermediate, s.patch, s.merge, s.vit_out_hidden)
    assert text == (28, 1536, 12, 2, 128, 8960, 151936) and vision == (42, 1536, 4224, 14, 2, 1536)
    assert s.branch_shape == GROUNDING and s.vit_gated_mlp and not s.tied_embeddings
    assert s.vit_window == 0 and s.deepstack_mergers == 0  # full attention over the image, one merger
    # dots_vit's layers are SwiGLU (fc1, fc3, fc2): three 1536 x 4224 matrices beside q, k, v, o
    assert s.vit_layer_params == 4 * 1536 ** 2 + 3 * 1536 * 4224
    assert 1.2e9 < s.vit_params < 1.3e9  # "a 1.2B vision encoder"
    assert 1.5e9 < s.layers * s.layer_params + s.lm_head_params < 1.6e9  # the Qwen2-1.5B-class decoder
    assert all(SHAPES[n].branch_shape == PREFIX_FORK and not SHAPES[n].vit_gated_mlp for n in ("qwen3-vl-2b", "hpd-1b"))
    # the same shape read from a dots.ocr checkpoint's config.json (flat, its own vision_config names)
    (tmp_path / "config.json").write_text(json.dumps(DOTS_CONFIG))
    read = model_shape(str(tmp_path))
    assert dataclasses.replace(read, name=s.name, source=s.source) == s
    with pytest.raises(ValueError, match="branch_shape"):
        dataclasses.replace(s, branch_shape="sideways")


def test_a_dots_checkpoint_folder_gives_its_shape_and_its_own_pixel_budget(tiny_dots_dir):
    s = model_shape(tiny_dots_dir)
    assert (s.vit_depth, s.vit_hidden, s.vit_out_hidden, s.branch_shape) == (2, 64, 128, GROUNDING)
    proc = image_processor(tiny_dots_dir)  # its preprocessor_config.json: max_pixels 235200
    assert isinstance(proc, DotsImageProcessor)
    assert (proc.factor, proc.min_pixels, proc.max_pixels) == (28, 3136, 235200)
    h, w = smart_resize(2339, 1654, 28, 3136, 235200)
    assert image_tokens(1654, 2339, proc) == (h // 28) * (w // 28) < image_tokens(1654, 2339, PROCESSORS["dots-ocr"])


# ---- the image rule -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("width, height", [(1654, 2339), (1700, 2200), (2339, 1654), (1224, 1584), (729, 516),
                                           (20, 30), (5000, 7000)])
def test_dots_ocr_image_tokens_are_smart_resizes_28_px_squares(width, height):
    """Under the budget, over it (5000 x 7000 > 11,289,600 px) and under min_pixels (20 x 30)."""
    h, w = smart_resize(height, width, 28, 3136, 11289600)
    assert image_tokens(width, height, PROCESSORS["dots-ocr"]) == (h // 28) * (w // 28)
    assert h * w <= 11289600 and h * w >= 3136


def test_an_a4_page_at_200_dpi_is_84_by_59_squares():
    assert smart_resize(2339, 1654) == (84 * 28, 59 * 28)
    assert image_tokens(1654, 2339, image_processor("dots-ocr")) == 84 * 59 == 4956


# ---- the branch shape -----------------------------------------------------------------------------------------
def _page() -> Page:
    """Three text regions, top to bottom, whose boxes (in dots' 812 x 1008 resized image) are written with as
    many characters each: a late branch's grounding prompt is as long as an early one's."""
    regs = tuple(Region("text_block", Box(0.15, 0.2 * (i + 1), 0.85, 0.2 * (i + 1) + 0.1), c, "text")
                 for i, c in enumerate(("abcd", "efghij", "kl")))
    return Page(width=800, height=1000, regions=regs)


def test_a_grounding_branch_prompt_holds_no_layout_prefix():
    """prefix-fork: region k's branch prompt is the page prompt + the layout before its close + the branch
    start, so a later branch's is longer. grounding: the image, dots' grounding text and the box, counted in
    the trace's tokenizer (bytes here; dots' added tokens one each), the same for every region whose box is
    written as long. The first branch shares the chat's start and the image with the page prompt; a later one
    the grounding text too."""
    image = 40
    pg = _page()
    prefix = plan_page(trace_from_page(P, "p", pg, image), "fork", P.vocab, CFG)
    trace = trace_from_page(P, "p", pg, image, GROUNDING)
    grounding = plan_page(trace, "fork", P.vocab, CFG)
    assert trace.branch_shape == GROUNDING and trace_from_page(P, "p", pg, image).branch_shape == PREFIX_FORK
    assert prefix.requests[0] == grounding.requests[0]  # the layout stream is the same request
    fp = trace.fork.fork_points
    assert fp[0] < fp[1] < fp[2]
    # the boxes in the 812 x 1008 image dots sees (smart_resize of 800 x 1000): x 0.15-0.85, y 0.2-0.3, 0.4-0.5...
    boxes = [box_text(b) for b in ([122, 202, 690, 302], [122, 403, 690, 504], [122, 605, 690, 706])]
    assert len({len(b) for b in boxes}) == 1
    # <|user|> <|img|> <|imgpad|> <|endofimg|>, the text, the box, <|endofuser|> <|assistant|>; image expanded
    want = 4 + len(GROUNDING_TEXT.encode()) + len(boxes[0]) + 2 - 1 + image
    branches = [r for r in grounding.requests if r.key.startswith("b")]
    assert [r.key for r in branches] == ["b0", "b1", "b2"]
    assert [r.prompt_tokens for r in branches] == [want] * 3
    assert [r.shared_tokens for r in branches] == [4 - 1 + image] + [4 + len(GROUNDING_TEXT.encode()) - 1 + image] * 2
    old = [r for r in prefix.requests if r.key.startswith("b")]
    assert [r.prompt_tokens for r in old] == [len(trace.fork.prompt_ids) - 1 + image + f + 1 for f in fp]
    assert [r.shared_tokens for r in old] == [r.prompt_tokens - 1 for r in old]
    assert [(r.output_tokens, r.at_token) for r in old] == [(r.output_tokens, r.at_token) for r in branches]


def test_grounding_prompt_lengths_are_the_dots_familys_own_branch_prompts(tiny_dots_dir):
    """Counted with a dots checkpoint's tokenizer, each region's modeled prompt is as long as the one the
    dots family's scheduler sends for it (DotsVocab.branch_prompt, the box as dots writes it)."""
    from padoc_ray.tokenizer import load_model_protocol

    mp = load_model_protocol(tiny_dots_dir)
    pg = _page()
    g = grounding_prompts(mp.tokenizer, pg, mp.vocab.spec)  # its pixel budget: the boxes' digits
    for k, r in enumerate(pg.regions):
        raw = RawRegion(index=k, category=r.category, bins=tuple(mp.vocab.coords(r.box, pg.width, pg.height)),
                        fork_point=0)
        assert g.lengths[k] == len(mp.vocab.branch_prompt((), (), raw))
    assert g.image_end == 4 and g.image_end < g.text_end < min(g.lengths)


# ---- the command ----------------------------------------------------------------------------------------------
def _model(*argv) -> int:
    from padoc_ray.cli import main

    return main(["bench", "model", *argv])


def test_bench_model_models_dots_ocr_with_its_image_tokens_and_grounding_branches(tmp_path, tiny_model_dir):
    """Through the CLI: dots.ocr's shape in the roofline, smart_resize's image tokens (sequential: one
    request a page, nothing cached) and grounding branches (fork: every request's prefill is its prompt less
    the full blocks of what it shares, as the grounding plans have them, not the prefix-fork plans)."""
    from padoc_ray.perfmodel.workload import paper384_traces
    from padoc_ray.tokenizer import load_model_protocol

    gt = tmp_path / "gt.json"
    gt.write_text(json.dumps([{"page_info": {"image_path": "p.png", "page_no": 0, "width": 1224, "height": 1584},
                               "layout_dets": []}]))
    out = tmp_path / "dots"
    assert _model("--workload", "paper384", "--gpu", "H200", "--model-config", "dots-ocr", "--model", tiny_model_dir,
                  "--concurrency", "4", "--pages", "4", "--page-sizes", str(gt), "--gpu-hour-usd", "1.5",
                  "--out", str(out)) == 0
    report = json.loads((out / "report.json").read_text())
    st = report["config"]["step_time"]
    assert st["gpu"] == "H200" and st["model"] == "dots-ocr" and "dots.ocr config.json" in st["model_source"]
    assert st["vit_params"] == SHAPES["dots-ocr"].vit_params
    how = report["pages"]["image_tokens"]
    assert "dots-ocr's processor" in how and "smart_resize" in how
    mp = load_model_protocol(tiny_model_dir)
    text = len(mp.prompt_ids("sequential")) - 1
    h, w = smart_resize(1584, 1224)
    rows = {(r["mode"], r["concurrency"]): r for r in report["rows"]}
    assert rows[("sequential", 4)]["prefill_tokens"] == 4 * (text + (h // 28) * (w // 28))

    def prefill(shape: str) -> int:
        traces, _ = paper384_traces(mp, pages=4, page_sizes=[(1224, 1584)], proc=PROCESSORS["dots-ocr"],
                                    branch_shape=shape)
        reqs = [r for t in traces for r in plan_page(t, "fork", mp.vocab, CFG).requests]
        return sum(r.prompt_tokens - min(r.shared_tokens, r.prompt_tokens - 1) // 16 * 16 for r in reqs)

    fork = rows[("fork", 4)]
    assert fork["prefill_tokens"] == prefill(GROUNDING) != prefill(PREFIX_FORK)
    assert 0 < fork["prefix_cache_hit_rate"] < 1
    md = (out / "report.md").read_text()
    assert "# Engine model (H200 roofline, dots-ocr)" in md and "$ / M pages" in md
    for m in ("fork", "sequential"):
        r = rows[(m, 4)]
        assert r["pages"] == r["valid_pages"] == 4 and r["valid_pages_per_s"] > 0
        assert r["usd_per_million_pages"] == round(1e6 / r["valid_pages_per_s"] / 3600 * 1.5, 2)
        assert f"| {r['usd_per_million_pages']:.2f} |" in md
