"""A checkpoint's token protocol: its family's spec bound to its Hugging Face tokenizer (:class:`ModelProtocol`).

Binds a Hugging Face tokenizer to the protocol's :class:`~padoc_ray.protocol.spec.TextTokenizer`.

Loads the tokenizer of a checkpoint directory, recognizes the checkpoint's family
(:mod:`padoc_ray.protocol.family`: ``padoc``, ``hpd`` or ``dots``) and exposes what the codec and the scheduler
need: content text <-> ids (no special tokens added), protocol-token lookup, the page prompt ids, and
the page image as the family sends it (:meth:`ModelProtocol.prepare_image`).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import logging
import os
import tempfile
from functools import lru_cache
from typing import Any, Sequence

from padoc_ray.protocol import ProtocolError, Vocab
from padoc_ray.protocol.family import DOTS, HPD, branch_shape, check_mode, modes, recognize

logger = logging.getLogger(__name__)

#: families whose checkpoints carry their config class as Python (hpd: InternVL's; dots: configuration_dots.py)
REMOTE_CODE_FAMILIES = (HPD, DOTS)

#: where the tokenizer class each checkpoint resolved to is remembered (default ``~/.cache/padoc-ray/tokenizer-classes``)
TOKENIZER_CACHE_ENV = "PADOC_RAY_TOKENIZER_CACHE"
#: the files whose bytes decide which class ``AutoTokenizer`` picks (with the folder's file names)
_RESOLUTION_FILES = ("config.json", "tokenizer_config.json")


def _class_cache_dir() -> str:
    return os.environ.get(TOKENIZER_CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "padoc-ray",
                                                                "tokenizer-classes")


def _resolution_key(model_dir: str, trust_remote_code: bool) -> str | None:
    """What ``AutoTokenizer``'s choice of class depends on: the versions of transformers and tokenizers,
    ``trust_remote_code``, the checkpoint's config files (their bytes) and its file names. None when the
    folder cannot be listed (no folder) or a file cannot be read (then nothing is remembered)."""
    try:
        import tokenizers
        import transformers  # the package's lazy top level: no torch until a class is used
    except ImportError:
        return None
    try:
        names = sorted(os.listdir(model_dir))
    except OSError:
        return None
    h = hashlib.sha256(json.dumps([transformers.__version__, tokenizers.__version__, bool(trust_remote_code),
                                   names]).encode())
    for name in _RESOLUTION_FILES:
        path = os.path.join(model_dir, name)
        try:
            with open(path, "rb") as f:
                h.update(name.encode() + b"\0" + f.read() + b"\0")
        except FileNotFoundError:
            h.update(name.encode() + b"\0-\0")
        except OSError:
            return None
    return h.hexdigest()


def _remembered_class(key: str):
    """The tokenizer class remembered under ``key``: a class of transformers itself (never the checkpoint's
    own code, nor anything a cache entry could name outside transformers' tokenizers), or None."""
    try:
        with open(os.path.join(_class_cache_dir(), key + ".json"), encoding="utf-8") as f:
            entry = json.load(f)
        module, name = entry["module"], entry["name"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if not (isinstance(module, str) and isinstance(name, str) and module.startswith("transformers.")):
        return None
    try:
        from transformers.tokenization_utils_base import PreTrainedTokenizerBase

        cls = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None
    return cls if isinstance(cls, type) and issubclass(cls, PreTrainedTokenizerBase) else None


def _remember_class(key: str, cls: type) -> None:
    """Write ``key -> cls`` (atomically); a cache folder that cannot be written is skipped, said in the debug log."""
    if not cls.__module__.startswith("transformers."):  # a checkpoint's own tokenizer code: resolved each time
        return
    folder = _class_cache_dir()
    try:
        os.makedirs(folder, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=folder, prefix=".tmp-", suffix=".json")
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump({"module": cls.__module__, "name": cls.__name__}, f)
        os.replace(tmp, os.path.join(folder, key + ".json"))
    except OSError as e:
        logger.debug("tokenizer class not remembered in %s: %s", folder, e)


def load_hf_tokenizer(model_dir: str, *, trust_remote_code: bool = False):
    """The checkpoint's Hugging Face tokenizer, as ``AutoTokenizer.from_pretrained`` gives it.

    ``AutoTokenizer`` reads the checkpoint's model config to choose the class, and that imports torch
    (transformers' config module imports its generation code): about 4 CPU-seconds in a process that
    runs no model, such as a Serve ingress replica or a no-op engine actor. So the class it chose is
    remembered (:data:`TOKENIZER_CACHE_ENV`), keyed on everything the choice depends on
    (:func:`_resolution_key`), and a later load of the same checkpoint calls that class's
    ``from_pretrained`` as ``AutoTokenizer`` does, without torch. Only transformers' own classes are
    remembered; a checkpoint's own tokenizer code goes through ``AutoTokenizer`` every time."""
    key = _resolution_key(model_dir, trust_remote_code)  # None for what is no folder (a hub id: AutoTokenizer)
    cls = _remembered_class(key) if key else None
    if cls is not None:
        # what AutoTokenizer passes on for a local folder: its marker, and the revision a folder keeps (None)
        return cls.from_pretrained(model_dir, _from_auto=True, revision=None)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir, trust_remote_code=trust_remote_code)
    if key:
        _remember_class(key, type(tok))
    return tok


class HFTextTokenizer:
    def __init__(self, hf_tokenizer):
        self.hf = hf_tokenizer
        self._vocab = hf_tokenizer.get_vocab()

    @classmethod
    def from_pretrained(cls, model_dir: str, *, trust_remote_code: bool = False) -> "HFTextTokenizer":
        """``trust_remote_code``: the checkpoint's config is its own Python (hpd: InternVL's), which
        transformers would otherwise ask about on the terminal."""
        return cls(load_hf_tokenizer(model_dir, trust_remote_code=trust_remote_code))

    def encode(self, text: str) -> list[int]:
        return list(self.hf.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return self.hf.decode(list(ids), skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def token_to_id(self, token: str) -> int | None:
        return self._vocab.get(token)


class ModelProtocol:
    """Everything protocol-related a checkpoint directory defines: family, spec, tokenizer, resolved vocab."""

    def __init__(self, model_dir: str):
        self.model_dir = model_dir
        found = recognize(model_dir)
        #: "padoc" | "hpd" | "dots", and what it was recognized from (doctor reports both)
        self.family, self.recognized_by, self.config = found.family, found.how, found.config
        #: "prefix-fork" | "grounding": how a branch's prompt is made
        self.branch_shape = branch_shape(self.family)
        self.spec = found.spec
        self.tokenizer = HFTextTokenizer.from_pretrained(model_dir,
                                                         trust_remote_code=self.family in REMOTE_CODE_FAMILIES)
        if self.family == DOTS:
            from padoc_ray.protocol.dots import DotsVocab

            self.vocab = DotsVocab.from_spec(self.spec, self.tokenizer)
        elif self.family == HPD:
            from padoc_ray.protocol.hpd import HpdVocab, check_config_ids

            self.vocab = HpdVocab.from_spec(self.spec, self.tokenizer)
            mismatch = check_config_ids(self.vocab, self.config)
            if mismatch:
                raise ProtocolError("; ".join(mismatch))
        else:
            self.vocab = Vocab.from_spec(self.spec, self.tokenizer)
        self.modes = modes(self.family)
        self._prompts = {m: self._prompt_ids(m) for m in self.modes}

    def _prompt_ids(self, mode: str) -> tuple[int, ...]:
        if self.family == DOTS:
            from padoc_ray.protocol.dots import prompt_ids

            return prompt_ids(self.vocab, mode)
        if self.family == HPD:
            # the placeholder as vLLM's InternVL processor looks for it: its own tokenization, whatever BPE
            # would make of it in context (doctor says when the two differ)
            before, after = self.spec.prompt(mode).split(self.spec.image_placeholder, 1)
            enc = self.tokenizer.encode
            return tuple(enc(before) + enc(self.spec.image_placeholder) + enc(after))
        ids = self.tokenizer.encode(self.spec.prompt(mode))
        pad = self.tokenizer.token_to_id("<|image_pad|>")
        if pad is not None and ids.count(pad) != 1:
            raise ProtocolError(f"the {mode} prompt must hold exactly one unexpanded image placeholder, got {ids.count(pad)}")
        return tuple(ids)

    def prompt_ids(self, mode: str) -> tuple[int, ...]:
        """Unexpanded page-prompt ids (one image placeholder) for ``fork`` or ``sequential``."""
        try:
            return self._prompts[mode]
        except KeyError:
            check_mode(self.family, mode)
            raise ProtocolError(f"unknown mode {mode!r}; expected one of {sorted(self._prompts)}") from None

    def prepare_image(self, image: Any, page_id: str) -> tuple[Any, dict | None, str]:
        """The page image as this family sends it, the request's ``mm_processor_kwargs``, and the
        multimodal uuid that names the image as sent. padoc: the image as it is. hpd: resized to
        ``cols*448 x rows*448`` of HPD's tile grid, with ``max_dynamic_patch = cols*rows`` (stock vLLM's
        InternVL processor then cuts exactly those tiles and the thumbnail). dots: resized as its image
        processor would (:func:`~padoc_ray.protocol.dots.smart_resize`), so the boxes the model writes are
        in the pixels of the image we hold."""
        from PIL import Image

        if self.family == DOTS:
            w, h = self.spec.input_size(image.width, image.height)
            if image.mode != "RGB":
                image = image.convert("RGB")
            if image.size != (w, h):
                image = image.resize((w, h), Image.BICUBIC)
            return image, None, f"{page_id}@{w}x{h}"
        if self.family != HPD:
            return image, None, page_id

        from padoc_ray.protocol.hpd_image import hpd_image_request

        (w, h), kwargs = hpd_image_request(image.width, image.height, tile=self.spec.tile)
        if image.mode != "RGB":
            image = image.convert("RGB")
        if image.size != (w, h):
            image = image.resize((w, h), Image.BICUBIC)
        return image, kwargs, f"{page_id}@{w}x{h}"


@lru_cache(maxsize=4)
def load_model_protocol(model_dir: str) -> ModelProtocol:
    return ModelProtocol(model_dir)
