"""The trainer in one process, without Ray: packing (labels, tree, M-RoPE against the model's own
get_rope_index, truncation, the input readers), the training loss against independent linear forwards
and across attention backends, the single-process loop and its learning-rate schedule, export, and
the `train` command's flags and input errors. The 2-worker Ray Train run and the Ray job entry point:
tests/cluster/trainer/test_ray_train.py (which imports this file's pages and image)."""

from __future__ import annotations

import json
import os

import pytest

import torch  # noqa: E402
import transformers  # noqa: E402,F401

from padoc_ray.protocol import Box, Page, Region, child_prompt, page_to_omnidocbench, serialize_padoc  # noqa: E402
from padoc_ray.trainer.packing import (  # noqa: E402
    IGNORE, IMAGE_MISSING, BAD_ANNOTATION, PROMPT_TOO_LONG, REGION_TOO_LONG, Packer, PackingConfig, PackingError,
    pages_from_omnidocbench,
)

SMALL_PIXELS = 16 * 32 * 32  # 16 image tokens: fast on CPU


def _page(contents: list[str], categories: list[str] | None = None, image_path: str | None = None) -> Page:
    cats = categories or ["text_block"] * len(contents)
    regs = []
    for i, (c, cat) in enumerate(zip(contents, cats)):
        y = 0.05 + 0.9 * i / max(1, len(contents))
        fmt = "none" if cat == "figure" else "text"
        regs.append(Region(category=cat, box=Box(0.1, y, 0.9, y + 0.05), content=None if fmt == "none" else c,
                           content_format=fmt))
    return Page(width=320, height=400, regions=tuple(regs), image_path=image_path)


def _image(seed: int = 0):
    from PIL import Image, ImageDraw

    im = Image.new("RGB", (320, 400), "white")
    d = ImageDraw.Draw(im)
    for i in range(5):
        y = 20 + 70 * i + seed
        d.rectangle([30, y, 290, y + 30], fill=(40 * i % 255, 90, 160))
    return im


PAGE = _page(["The quarterly report describes revenue.", "", "Table 1 shows the accuracy of each model.",
              "Page 1 of 12."], ["title", "figure", "text_block", "page_number"])


@pytest.fixture(scope="module")
def packer(tiny_model_dir):
    return Packer(tiny_model_dir, PackingConfig(max_pixels=SMALL_PIXELS))


@pytest.fixture(scope="module")
def sample(packer):
    return packer.pack(PAGE, _image())


@pytest.fixture(scope="module")
def model64(tiny_model_dir):
    from padoc_ray.trainer.loop import load_model

    return load_model(tiny_model_dir, dtype=torch.float64)


# ---- packing -----------------------------------------------------------------------------------------
def test_packed_sample_is_prompt_layout_then_serving_branches(packer, sample, model_protocol):
    vocab, tok = model_protocol.vocab, model_protocol.tokenizer
    ref = serialize_padoc(vocab, tok, PAGE)
    ids = sample.input_ids.tolist()
    tree = sample.tree
    n_img = int(sample.image_grid_thw.prod()) // 4
    prompt = list(model_protocol.prompt_ids("fork"))
    pad = prompt.index(packer.image_token_id)
    expanded = prompt[:pad] + [packer.image_token_id] * n_img + prompt[pad + 1:]
    P = len(expanded)
    assert n_img == sample.meta["image_tokens"] and ids.count(packer.image_token_id) == n_img
    assert ids[:tree.prefix_len] == expanded + list(ref.layout)
    assert tree.forks == tuple(P + f for f in ref.fork_points)
    for k, (s, n) in enumerate(zip(tree.branch_starts(), tree.branch_lens)):
        assert tuple(ids[s:s + n]) == ref.branches[k]
        # the linear sequence branch k is trained on is exactly what serving prompts it with
        linear = [ids[i] for i in tree.linear_indices(k)]
        child = child_prompt(expanded, ref.layout, ref.fork_points[k], vocab)
        assert linear[:len(child)] == child and linear[len(child):] == list(ref.branches[k][1:])
    assert tree.total_len() == len(ids) == sample.num_tokens


def test_labels_train_layout_and_content_not_prompt_or_branch_start(sample, model_protocol):
    vocab = model_protocol.vocab
    ids, labels, tree = sample.input_ids.tolist(), sample.labels.tolist(), sample.tree
    P = sample.meta["prompt_len"]
    assert all(x == IGNORE for x in labels[:P - 1])  # prompt and image: nothing
    for i in range(P - 1, tree.prefix_len - 1):  # layout: next token of M
        assert labels[i] == ids[i + 1]
    assert labels[tree.prefix_len - 1] == IGNORE  # after the layout EOS there is nothing
    for s, n in zip(tree.branch_starts(), tree.branch_lens):
        assert labels[s:s + n - 1] == ids[s + 1:s + n]  # content and the branch's EOS
        assert labels[s + n - 1] == IGNORE
        assert ids[s] == vocab.branch_start
        assert ids[s + n - 1] == vocab.end_of_stream
    # branch-start is an input of each branch and never a target
    assert vocab.branch_start not in labels
    assert sample.loss_mask.tolist() == [x != IGNORE for x in labels]
    n_layout = tree.prefix_len - P
    assert sample.num_labels == n_layout + sum(n - 1 for n in tree.branch_lens)


def test_branch_positions_equal_get_rope_index_of_the_linear_sequence(sample, model64, packer):
    """M-RoPE of every branch token == what the model's own get_rope_index gives M[:f_k] + Y_k."""
    ids, pos, tree = sample.input_ids, sample.position_ids, sample.tree
    grid = sample.image_grid_thw

    def rope(seq):
        t = seq[None]
        return model64.model.get_rope_index(t, (t == packer.image_token_id).int(), image_grid_thw=grid)[0][:, 0]

    M = ids[:tree.prefix_len]
    assert torch.equal(pos[:, :tree.prefix_len], rope(M))
    assert int(pos[1, :tree.prefix_len].max()) < tree.prefix_len - 1  # the image really compresses positions
    for k in range(tree.num_branches):
        idx = torch.tensor(tree.linear_indices(k))
        assert torch.equal(pos[:, idx], rope(ids[idx])), f"branch {k}"


def _with_max_len(packer, max_len):
    """The same packer (processor, rope index) with another max_len."""
    import copy
    from dataclasses import replace

    p = copy.copy(packer)
    p.cfg = replace(packer.cfg, max_len=max_len)
    return p


REGION_LAYOUT = 7  # region-open, category, 4 coordinates, region-close


@pytest.mark.parametrize("max_len", [55, 70, 85, 100, 120, 140, 170])
def test_truncation_drops_whole_trailing_regions(packer, max_len, model_protocol):
    vocab = model_protocol.vocab
    page = _page([f"region {i} " + "word " * (3 + 4 * i) for i in range(6)])
    full = packer.pack(page, _image())
    assert full.num_tokens > max_len
    P = full.meta["prompt_len"]
    try:
        s = _with_max_len(packer, max_len).pack(page, _image())
    except PackingError as e:
        assert e.code == REGION_TOO_LONG
        assert P + REGION_LAYOUT + 1 + full.tree.branch_lens[0] > max_len
        return
    kept = s.meta["kept_regions"]
    assert s.num_tokens <= max_len and s.meta["truncated"] and 0 < kept < 6
    assert s.meta["dropped_regions"] == 6 - kept
    # every kept branch is whole, identical to the untruncated sample's
    for k in range(kept):
        a, n = s.tree.branch_starts()[k], s.tree.branch_lens[k]
        b = full.tree.branch_starts()[k]
        assert torch.equal(s.input_ids[a:a + n], full.input_ids[b:b + n])
    # the layout is re-closed with EOS, which is input only (never teaches stopping early)
    M = s.input_ids[:s.tree.prefix_len].tolist()
    assert M[-1] == vocab.end_of_stream and M[-2] == vocab.region_close
    assert s.tree.prefix_len == P + kept * REGION_LAYOUT + 1
    assert s.labels[s.tree.prefix_len - 2] == IGNORE and s.labels[s.tree.prefix_len - 3] == vocab.region_close
    # maximal: one more region would not have fit
    assert s.num_tokens + REGION_LAYOUT + full.tree.branch_lens[kept] > max_len


def test_prompt_too_long_and_region_too_long_are_recorded_skips(packer, sample):
    P = sample.meta["prompt_len"]
    with pytest.raises(PackingError) as e:
        _with_max_len(packer, P).pack(PAGE, _image())
    assert e.value.code == PROMPT_TOO_LONG
    with pytest.raises(PackingError) as e:
        _with_max_len(packer, P + REGION_LAYOUT + 2).pack(PAGE, _image())
    assert e.value.code == REGION_TOO_LONG


def test_omnidocbench_pages_with_missing_images_are_skipped_and_counted(tmp_path, packer):
    imgs = tmp_path / "images"
    imgs.mkdir()
    objs = []
    for i in range(3):
        objs.append(page_to_omnidocbench(_page(["hello"], image_path=f"p{i}.png")))
        if i != 1:
            _image(i).save(imgs / f"p{i}.png")
    objs.append({"layout_dets": "nope", "page_info": {"width": 1, "height": 1}})
    gt = tmp_path / "gt.json"
    gt.write_text(json.dumps(objs))
    refs, skipped = pages_from_omnidocbench(str(gt), str(imgs))
    assert [r.source for r in refs] == ["p0.png", "p2.png"]
    assert sorted(s.code for s in skipped) == [BAD_ANNOTATION, IMAGE_MISSING]
    s = packer.pack_ref(refs[0])
    assert s.meta["source"] == "p0.png" and s.num_labels > 0


def test_batch_output_rows_become_pages_with_rerendered_images(tmp_path, packer):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from padoc_ray.trainer.packing import pages_from_batch_output

    pdf, png = tmp_path / "doc.pdf", tmp_path / "page.png"
    _image(0).save(pdf)  # a one-page PDF holding the image
    _image(1).save(png)
    region = {"order": 0, "category": "title", "bbox": [0.1, 0.1, 0.9, 0.2], "content": "Hello",
              "content_format": "text"}
    rows = [
        {"source_uri": str(pdf), "page_index": 0, "status": "ok", "regions": [region], "image_width": 320,
         "image_height": 400},
        {"source_uri": str(png), "page_index": 0, "status": "ok", "regions": [region, {**region, "order": 1}],
         "image_width": 320, "image_height": 400},
        {"source_uri": str(pdf), "page_index": 1, "status": "render_failed", "regions": [], "image_width": None,
         "image_height": None},
    ]
    (tmp_path / "out" / "pages").mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "out" / "pages" / "part-0.parquet")
    refs, skipped = pages_from_batch_output(str(tmp_path / "out"))
    assert [len(r.page.regions) for r in refs] == [1, 2] and [s.code for s in skipped] == [BAD_ANNOTATION]
    for ref in refs:
        s = packer.pack_ref(ref)
        assert s.tree.num_branches == len(ref.page.regions) and s.meta["image_tokens"] > 0


# ---- the loss ----------------------------------------------------------------------------------------
def _linear_loss_sum(model, sample, image_token_id) -> float:
    """Sum of CE of M and of every M[:f_k] + Y_k run as its own ordinary causal sequence
    (transformers' sdpa attention, positions computed by the model itself)."""
    import torch.nn.functional as F

    ids, tree = sample.input_ids, sample.tree
    P = sample.meta["prompt_len"]

    def run(seq):
        t = seq[None]
        return model(input_ids=t, pixel_values=sample.pixel_values.to(torch.float64), image_grid_thw=sample.image_grid_thw,
                     mm_token_type_ids=(t == image_token_id).int(), use_cache=False).logits[0]

    M = ids[:tree.prefix_len]
    total = F.cross_entropy(run(M)[P - 1:-1], M[P:], reduction="sum")
    for k in range(tree.num_branches):
        seq = ids[torch.tensor(tree.linear_indices(k))]
        f = tree.forks[k]
        total = total + F.cross_entropy(run(seq)[f:-1], seq[f + 1:], reduction="sum")
    return float(total)


def test_packed_loss_equals_independent_linear_sequences(tiny_model_dir, sample, model64, packer):
    from transformers import AutoModelForImageTextToText

    from padoc_ray.trainer.loop import sample_loss

    ref_model = AutoModelForImageTextToText.from_pretrained(tiny_model_dir, dtype=torch.float64,
                                                            attn_implementation="sdpa").eval()
    with torch.no_grad():
        want = _linear_loss_sum(ref_model, sample, packer.image_token_id)
        got, n = sample_loss(model64.eval(), sample, "tree_varlen")
    assert n == sample.num_labels
    assert float(got) == pytest.approx(want, rel=1e-9)


def test_backends_give_the_same_loss_and_gradients(sample, model64):
    from padoc_ray.trainer.loop import sample_loss

    model64.train()
    losses, grads = {}, {}
    for backend in ("dense", "tree_varlen"):
        model64.zero_grad(set_to_none=True)
        loss, _ = sample_loss(model64, sample, backend)
        loss.backward()
        losses[backend] = float(loss.detach())
        grads[backend] = {n: p.grad.clone() for n, p in model64.named_parameters() if p.grad is not None}
    model64.zero_grad(set_to_none=True)
    with torch.no_grad():  # flex: torch has no FlexAttention backward on CPU, compare the forward
        losses["flex"] = float(sample_loss(model64, sample, "flex")[0])
    assert losses["tree_varlen"] == pytest.approx(losses["dense"], rel=1e-10)
    assert losses["flex"] == pytest.approx(losses["dense"], rel=1e-10)
    assert grads["dense"].keys() == grads["tree_varlen"].keys() and len(grads["dense"]) > 50
    for name, g in grads["dense"].items():
        torch.testing.assert_close(grads["tree_varlen"][name], g, rtol=1e-9, atol=1e-12, msg=name)


def test_single_process_loop_fits_a_page(tiny_model_dir, packer):
    from padoc_ray.trainer.config import LoopConfig, OptimConfig
    from padoc_ray.trainer.loop import load_model, train

    model = load_model(tiny_model_dir)
    s = packer.pack(_page(["alpha beta gamma", "delta epsilon"]), _image())
    hist = train(model, [s], LoopConfig(steps=8, optim=OptimConfig(lr=3e-3, warmup_steps=0, min_lr_ratio=1.0)))
    assert [h["step"] for h in hist] == list(range(1, 9))
    assert hist[-1]["loss"] < hist[0]["loss"] - 1.0
    assert all(h["labels"] == s.num_labels for h in hist)


def test_lr_schedule_warms_up_then_decays():
    from padoc_ray.trainer.config import OptimConfig

    o = OptimConfig(lr=1.0, warmup_steps=10)
    lrs = [o.lr_at(s, 100) for s in range(1, 101)]
    assert lrs[9] == 1.0 and lrs[0] == pytest.approx(0.1)
    assert all(a <= b for a, b in zip(lrs[:10], lrs[1:10]))
    assert all(a > b for a, b in zip(lrs[10:], lrs[11:])) and 0 < lrs[-1] < 1e-3


# ---- export ----------------------------------------------------------------------------------------
def test_export_loads_with_transformers_and_keeps_the_protocol(tmp_path, tiny_model_dir):
    from transformers import AutoModelForImageTextToText, AutoProcessor

    from padoc_ray.tokenizer import ModelProtocol
    from padoc_ray.trainer.export import export_checkpoint

    src = AutoModelForImageTextToText.from_pretrained(tiny_model_dir)
    sd = {k: v + 0.01 if v.is_floating_point() else v for k, v in src.state_dict().items()}
    out = export_checkpoint(sd, tiny_model_dir, str(tmp_path / "model"), info={"steps": 3},
                            image_size={"longest_edge": SMALL_PIXELS})
    for name in ("padoc_protocol.json", "tokenizer.json", "chat_template.jinja", "preprocessor_config.json",
                 "config.json", "padoc_training.json"):
        assert os.path.exists(os.path.join(out, name)), name
    back = AutoModelForImageTextToText.from_pretrained(out)
    for k, v in back.state_dict().items():
        torch.testing.assert_close(v, sd[k], msg=k)
    assert ModelProtocol(out).prompt_ids("fork") == ModelProtocol(tiny_model_dir).prompt_ids("fork")
    assert AutoProcessor.from_pretrained(out).image_processor.size["longest_edge"] == SMALL_PIXELS
    assert json.load(open(os.path.join(out, "padoc_training.json")))["steps"] == 3


# ---- CLI ------------------------------------------------------------------------------------------
def test_cli_backends_match_attention():
    """`train --backend` offers exactly the attention backends the trainer has."""
    import argparse

    from padoc_ray.cli import train as cli
    from padoc_ray.trainer import attention

    sub = argparse.ArgumentParser().add_subparsers()
    cli.register(sub)
    train = sub.choices["train"]
    backend = next(a for a in train._actions if "--backend" in a.option_strings)
    assert tuple(backend.choices) == attention.BACKENDS


def test_cli_rejects_bad_inputs(tmp_path, tiny_model_dir, capsys):
    from padoc_ray.cli import main

    gt = tmp_path / "gt.json"
    gt.write_text(json.dumps([page_to_omnidocbench(_page(["x"], image_path="missing.png"))]))
    base = ["train", "--steps", "2", "--out", str(tmp_path / "out")]
    assert main([*base, "--model", str(tmp_path / "nope"), "--gt", str(gt), "--images", str(tmp_path)]) == 2
    assert "model directory not found" in capsys.readouterr().err
    assert main([*base, "--model", tiny_model_dir, "--gt", str(tmp_path / "no.json"), "--images", str(tmp_path)]) == 2
    assert "--gt: no such file" in capsys.readouterr().err
    assert main([*base, "--model", tiny_model_dir, "--gt", str(gt), "--images", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no usable page" in err and "image_missing: 1" in err
    assert main([*base, "--model", tiny_model_dir, "--gt", str(gt)]) == 2
    assert "--gt needs --images" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main([*base, "--model", tiny_model_dir, "--gt", str(gt), "--images", str(tmp_path), "--backend", "nope"])
    assert e.value.code == 2


def test_every_train_flag_lands_in_the_config_tree_and_the_tree_survives_the_trip_to_the_workers():
    import argparse

    from padoc_ray.cli.train import add_train_args, config_from_args
    from padoc_ray.trainer.config import TrainConfig

    p = argparse.ArgumentParser()
    add_train_args(p)
    assert {a.dest for a in p._actions} - {"help"} == {
        "model", "gt", "images", "batch_output", "sample_weights", "out", "steps", "backend", "workers", "lr",
        "warmup_steps", "max_len", "max_pixels", "grad_accum", "checkpoint_every", "seed", "device", "resume",
        "run_name", "address"}
    cfg = config_from_args(p.parse_args([
        "--model", "M", "--gt", "G", "--images", "I", "--sample-weights", "W", "--out", "O", "--steps", "7",
        "--backend", "dense", "--workers", "3", "--lr", "0.01", "--warmup-steps", "2", "--max-len", "300",
        "--max-pixels", "4096", "--grad-accum", "4", "--checkpoint-every", "5", "--seed", "9", "--device", "cpu",
        "--resume", "R", "--run-name", "N", "--address", "A"]))
    d, lp, r = cfg.data, cfg.loop, cfg.ray
    assert (cfg.model, cfg.out, d.gt, d.images, d.batch_output, d.sample_weights) == ("M", "O", "G", "I", None, "W")
    assert (d.packing.max_len, d.packing.max_pixels) == (300, 4096)
    assert (lp.steps, lp.seed, lp.optim.lr, lp.optim.warmup_steps, lp.step.backend, lp.step.grad_accum) == \
        (7, 9, 0.01, 2, "dense", 4)
    assert (r.workers, r.device, r.address, r.run_name, r.checkpoint_every, r.resume) == (3, "cpu", "A", "N", 5, "R")
    # Ray Train hands each worker plain data (and its dashboard keeps it as JSON): the same tree comes back
    back = TrainConfig.from_dict(json.loads(json.dumps(cfg.to_dict())))
    assert back == cfg and isinstance(back.loop.optim.betas, tuple)


@pytest.mark.parametrize("flags, message", [
    (["--max-len", "8"], "max_len must be at least 16"),
    (["--warmup-steps", "-1"], "warmup_steps must be >= 0"),
    (["--max-pixels", "100"], "max_pixels must be at least 1024"),
    (["--batch-output", "B"], "give either --gt with --images, or --batch-output"),
])
def test_bad_settings_are_refused_before_ray_starts(tmp_path, capsys, flags, message):
    from padoc_ray.cli import main

    base = ["train", "--model", str(tmp_path), "--gt", "gt.json", "--images", str(tmp_path), "--steps", "2",
            "--out", str(tmp_path / "out")]
    assert main([*base, *flags]) == 2
    assert message in capsys.readouterr().err
