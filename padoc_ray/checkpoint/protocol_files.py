"""What turns a Qwen3-VL tokenizer and folder into a PaDoc one: the protocol tokens, the chat
template with the page prompts, ``padoc_protocol.json``.

One code path for both checkpoint makers: the tiny builder (:mod:`.tiny`) and ``init-model``
(:mod:`.init`) extend a tokenizer with :func:`add_protocol_tokens` and write the PaDoc files
with :func:`save_tokenizer_files`, so a checkpoint made from a real base holds exactly what the tiny
one holds.
"""

from __future__ import annotations

import os
import shutil

from padoc_ray.protocol.spec import ProtocolSpec

#: the special tokens of every Qwen3-VL tokenizer (the tiny builder adds them itself)
QWEN_SPECIAL_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>",
)

#: the chat template of a PaDoc checkpoint (Qwen's chat format): a user turn [image, text] with
#: add_generation_prompt renders exactly :meth:`ProtocolSpec.prompt` of the default prompt template.
#: Every newline is inside a Jinja string literal, so whitespace control cannot eat it.
CHAT_TEMPLATE = (
    "{%- for message in messages -%}"
    "{{ '<|im_start|>' + message['role'] + '\\n' }}"
    "{%- if message['content'] is string -%}{{ message['content'] }}"
    "{%- else -%}{%- for item in message['content'] -%}"
    "{%- if item['type'] == 'image' or 'image' in item -%}{{ '<|vision_start|><|image_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'video' or 'video' in item -%}{{ '<|vision_start|><|video_pad|><|vision_end|>' }}"
    "{%- elif item['type'] == 'text' -%}{{ item['text'] }}{%- endif -%}"
    "{%- endfor -%}{%- endif -%}"
    "{{ '<|im_end|>\\n' }}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}"
)

#: what the chat template and the page prompts need from the base tokenizer (never added)
REQUIRED_BASE_TOKENS = ("<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|image_pad|>", "<|vision_end|>")

#: embedding rows are padded to a multiple of this
VOCAB_MULTIPLE = 64


class ProtocolTokenConflict(ValueError):
    """The tokenizer already holds tokens the protocol would add (with another meaning, or because
    it already is a PaDoc tokenizer)."""


def padded_vocab_size(n_tokens: int, multiple: int = VOCAB_MULTIPLE) -> int:
    return ((n_tokens + multiple - 1) // multiple) * multiple


def protocol_tokens_to_add(vocab: dict[str, int] | set[str], spec: ProtocolSpec) -> list[str]:
    """The spec's tokens a tokenizer with ``vocab`` lacks, in the spec's order.

    Only the end-of-stream token may already be there: it is the chat model's end of turn
    (``<|im_end|>``), reused with the same meaning. Any other protocol token already present
    means the tokenizer is a PaDoc one already, or gives the string another meaning; both raise
    :class:`ProtocolTokenConflict`.
    """
    t = spec.tokens
    present = [tok for tok in spec.all_added_tokens() if tok in vocab and tok != t.end_of_stream]
    if present:
        control = [t.region_open, t.region_close, t.branch_start]
        shown = ", ".join(present[:6]) + (f" ... ({len(present)} in all)" if len(present) > 6 else "")
        if all(c in vocab for c in control):
            raise ProtocolTokenConflict(
                f"its tokenizer already holds the protocol's control tokens ({', '.join(control)}): it already is a "
                f"PaDoc checkpoint; init-model takes the plain Qwen3-VL base")
        raise ProtocolTokenConflict(
            f"its tokenizer already holds tokens the protocol would add, with another meaning: {shown}; write a "
            f"spec (--spec) whose control, category and coordinate tokens are new to this tokenizer")
    return [tok for tok in spec.all_added_tokens() if tok not in vocab]


def add_special_tokens(tok, tokens: list[str]) -> None:
    """Add ``tokens`` as single, special, unnormalized tokens (ids follow the tokenizer's last id)."""
    from transformers import AddedToken

    if tokens:
        tok.add_tokens([AddedToken(t, special=True, normalized=False) for t in tokens])


def add_protocol_tokens(tok, spec: ProtocolSpec) -> list[str]:
    """Extend a Hugging Face tokenizer with the spec's tokens it lacks (see
    :func:`protocol_tokens_to_add`); returns the tokens added, in id order."""
    new = protocol_tokens_to_add(tok.get_vocab(), spec)
    add_special_tokens(tok, new)
    return new


def save_tokenizer_files(out: str, tok, spec: ProtocolSpec | None) -> None:
    """Write the tokenizer with the PaDoc chat template (also as ``chat_template.jinja``) and, given a
    spec, ``padoc_protocol.json``. A base's own ``chat_template.json`` (the older format, which
    would take precedence) must not be left in ``out``."""
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    with open(os.path.join(out, "chat_template.jinja"), "w") as f:
        f.write(CHAT_TEMPLATE)
    if spec is not None:
        spec.save(out)


def refuse_existing(out: str, force: bool) -> None:
    """FileExistsError when ``out`` is a non-empty folder or not a folder, unless ``force``. Cheap: a
    command checks it before it imports what building a checkpoint takes."""
    if force:
        return
    if os.path.isdir(out) and os.listdir(out):
        raise FileExistsError(f"{out} is not empty; pass --force to overwrite it")
    if os.path.exists(out) and not os.path.isdir(out):
        raise FileExistsError(f"{out} exists and is not a directory; pass --force to overwrite it")


def prepare_out(out: str, force: bool) -> None:
    """Refuse a non-empty ``out`` unless ``force`` (then empty it); create it."""
    refuse_existing(out, force)
    if os.path.isdir(out) and os.listdir(out):
        shutil.rmtree(out)
    elif os.path.exists(out) and not os.path.isdir(out):
        os.remove(out)
    os.makedirs(out, exist_ok=True)
