"""Checkpoint families: which token protocol a checkpoint speaks, recognized from its own files.

A family says how a checkpoint's tokens encode a page:

* ``padoc``: special tokens per category, quantized coordinate tokens, and a ``padoc_protocol.json``
  (:class:`~padoc_ray.protocol.spec.ProtocolSpec`);
* ``hpd``: HPD-Parsing's text blocks between ``<BLOCK>`` and ``<FORK>``
  (:class:`~padoc_ray.protocol.hpd.HpdSpec`), recognized from ``config.json`` alone: an
  ``InternVLChatModel`` that declares ``fork_token_id`` and ``child_token_id``;
* ``dots``: dots.ocr's JSON layout and grounding branches (:class:`~padoc_ray.protocol.dots.DotsSpec`),
  recognized from ``config.json`` (``DotsOCRForCausalLM``); its pixel budget from
  ``preprocessor_config.json``.

Each family has a **branch shape** (:data:`BRANCH_SHAPES`): ``prefix-fork`` (padoc, hpd: a branch's
prompt is the page prompt + the layout tokens before its region's close + a branch start) or
``grounding`` (dots: the page's grounding prompt with the region's box, no layout tokens).

A ``padoc_protocol.json`` beside a checkpoint always wins: without a ``family`` key it is a padoc spec,
with ``"family": "hpd"`` (or ``"dots"``) it overrides the defaults it names (the box space, the category map...).
Reads two small JSON files; imports nothing heavy.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from typing import Any, Mapping

from .dots import FAMILY as DOTS, DotsSpec, is_dots_config, pixels_from_preprocessor
from .hpd import FAMILY as HPD, HpdSpec, hpd_config_tokens
from .spec import SPEC_FILENAME, ProtocolError, ProtocolSpec

PADOC = "padoc"
FAMILIES = (PADOC, HPD, DOTS)
#: the decoding modes each family has (hpd: fork only; its branches share positions with the layout
#: stream; dots: sequential is dots.ocr's own single request, prompt_layout_all_en)
MODES: dict[str, tuple[str, ...]] = {PADOC: ("fork", "sequential"), HPD: ("fork",), DOTS: ("fork", "sequential")}
PREFIX_FORK, GROUNDING = "prefix-fork", "grounding"
#: how each family's branch prompt is made (the scheduler asks the family's vocab: ``branch_prompt``)
BRANCH_SHAPES: dict[str, str] = {PADOC: PREFIX_FORK, HPD: PREFIX_FORK, DOTS: GROUNDING}


@dataclass(frozen=True)
class Recognized:
    family: str  #: one of FAMILIES
    spec: Any  #: ProtocolSpec | HpdSpec
    how: str  #: what it was recognized from, for people (doctor)
    config: Mapping[str, Any]  #: the checkpoint's config.json ({} when it has none)


def _read_json(path: str) -> dict:
    with open(path, encoding="utf-8") as f:
        try:
            data = json.load(f)
        except json.JSONDecodeError as e:
            raise ProtocolError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict):
        raise ProtocolError(f"{path}: not a JSON object")
    return data


def recognize(model_dir: str | os.PathLike) -> Recognized:
    """The family and spec of the checkpoint in ``model_dir``; :class:`ProtocolError` when it is none we know."""
    model_dir = os.fspath(model_dir)
    cfg_path = os.path.join(model_dir, "config.json")
    config = _read_json(cfg_path) if os.path.exists(cfg_path) else {}
    spec_path = os.path.join(model_dir, SPEC_FILENAME)
    if os.path.exists(spec_path):
        data = _read_json(spec_path)
        family = data.get("family", PADOC)
        if family == HPD:
            return Recognized(HPD, HpdSpec.from_dict(data), f"{SPEC_FILENAME} (family hpd)", config)
        if family == DOTS:
            return Recognized(DOTS, _dots_spec(model_dir, data), f"{SPEC_FILENAME} (family dots)", config)
        if family != PADOC:
            raise ProtocolError(f"{spec_path}: unknown family {family!r} (this build knows {', '.join(FAMILIES)})")
        return Recognized(PADOC, ProtocolSpec.from_dict({k: v for k, v in data.items() if k != "family"}),
                          SPEC_FILENAME, config)
    ids = hpd_config_tokens(config)
    if ids is not None:
        return Recognized(HPD, HpdSpec(), f"config.json: InternVLChatModel with fork_token_id "
                                          f"{ids['fork_token_id']} and child_token_id {ids['child_token_id']}", config)
    if is_dots_config(config):
        return Recognized(DOTS, _dots_spec(model_dir, {}), "config.json: DotsOCRForCausalLM", config)
    archs = ", ".join(config.get("architectures") or ()) or "none"
    raise ProtocolError(
        f"{model_dir}: not a checkpoint padoc-ray knows: no {SPEC_FILENAME} (a PaDoc checkpoint; "
        f"`padoc-ray init-model` makes one from Qwen3-VL), and its config.json (architectures: {archs}) is neither "
        f"HPD-Parsing's (InternVLChatModel with fork_token_id and child_token_id) nor dots.ocr's (DotsOCRForCausalLM)")


def _dots_spec(model_dir: str, data: dict) -> DotsSpec:
    """dots' spec: the defaults, the pixel budget of the checkpoint's own image processor, then what a
    ``padoc_protocol.json`` says."""
    pre_path = os.path.join(model_dir, "preprocessor_config.json")
    pixels = pixels_from_preprocessor(_read_json(pre_path)) if os.path.exists(pre_path) else {}
    return DotsSpec.from_dict({**pixels, **data})


def branch_shape(family: str) -> str:
    """``prefix-fork`` or ``grounding``: how the family's branch prompts are made."""
    return BRANCH_SHAPES[family]


def modes(family: str) -> tuple[str, ...]:
    return MODES[family]


def check_mode(family: str, mode: str) -> None:
    """Refuse a decoding mode the family does not have, saying why."""
    if mode not in MODES[family]:
        if family == HPD and mode == "sequential":
            raise ProtocolError("--mode sequential has no meaning for an HPD-Parsing checkpoint (family hpd): its "
                                "content branches share positions with the layout stream, so the model has no "
                                "single-stream form; use --mode fork")
        raise ProtocolError(f"family {family} has no mode {mode!r} (it has {', '.join(MODES[family])})")
