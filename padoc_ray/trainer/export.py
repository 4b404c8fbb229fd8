"""Write a trained state dict as a Hugging Face checkpoint directory that vLLM and the batch job load.

The weights go through ``save_pretrained`` of a model built from the source checkpoint's config
(cast to that checkpoint's dtype); everything else a PaDoc checkpoint needs (tokenizer, chat
template, processor and preprocessor configs, ``padoc_protocol.json``, generation config) is
copied from the source directory; ``padoc_training.json`` records where the weights came from.
The directory is written next to its destination and renamed into place, so a reader never sees a
half-written export. Knows nothing of FSDP or Ray: callers hand it a full (unsharded) state dict.
"""

from __future__ import annotations

import json
import os
import shutil

from padoc_ray.protocol import SPEC_FILENAME

#: files of the source checkpoint that are weights or rewritten by save_pretrained
_NOT_COPIED = ("config.json",)
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".safetensors.index.json", ".bin.index.json")
TRAINING_INFO = "padoc_training.json"


def export_checkpoint(state_dict: dict, src_model_dir: str, out_dir: str, *, info: dict | None = None,
                      image_size: dict | None = None) -> str:
    """Save ``state_dict`` (full, on CPU) as an HF checkpoint at ``out_dir``; returns ``out_dir``.

    ``image_size``: the image processor ``size`` the model was trained with, when it was not the
    source checkpoint's (written into ``preprocessor_config.json`` so serving sees the same images).
    """
    import torch
    from transformers import AutoConfig, AutoModelForImageTextToText

    config = AutoConfig.from_pretrained(src_model_dir)
    dtype = _dtype_of(config)
    with torch.device("meta"):
        model = AutoModelForImageTextToText.from_config(config)
    sd = {k: v.to(dtype) if v.is_floating_point() else v for k, v in state_dict.items()}
    missing, unexpected = model.load_state_dict(sd, strict=False, assign=True)
    tied = set(getattr(model, "_tied_weights_keys", None) or ()) if getattr(config, "tie_word_embeddings", False) else set()
    missing = [k for k in missing if k not in tied]
    if missing or unexpected:
        raise ValueError(f"state dict does not match {src_model_dir}: missing {missing[:5]}, unexpected {unexpected[:5]}")
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    tmp = out_dir.rstrip("/") + ".partial"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    for name in sorted(os.listdir(src_model_dir)):
        src = os.path.join(src_model_dir, name)
        if not os.path.isfile(src) or name in _NOT_COPIED or name.endswith(_WEIGHT_SUFFIXES) or name == TRAINING_INFO:
            continue
        shutil.copy2(src, os.path.join(tmp, name))
    if image_size:
        _set_image_size(os.path.join(tmp, "preprocessor_config.json"), image_size)
    if not os.path.exists(os.path.join(tmp, SPEC_FILENAME)):
        raise FileNotFoundError(f"{src_model_dir} has no {SPEC_FILENAME}: not a PaDoc checkpoint")
    with open(os.path.join(tmp, TRAINING_INFO), "w", encoding="utf-8") as f:
        json.dump({"source_model": os.path.abspath(src_model_dir), "dtype": str(dtype).replace("torch.", ""),
                   **(info or {})}, f, indent=2, default=str)
    if os.path.isdir(out_dir):
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir


def _set_image_size(path: str, size: dict) -> None:
    with open(path, encoding="utf-8") as f:
        cfg = json.load(f)
    cfg["size"] = {**cfg.get("size", {}), **size}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(cfg, f, indent=2)


def _dtype_of(config):
    import torch

    d = getattr(config, "dtype", None) or getattr(getattr(config, "text_config", None), "dtype", None) or "float32"
    if isinstance(d, torch.dtype):
        return d
    return getattr(torch, str(d).replace("torch.", ""))
