"""padoc_ray.tokenizer.load_hf_tokenizer: the tokenizer class AutoTokenizer chose for a checkpoint is
remembered, so a later process loads the same tokenizer without importing torch (AutoTokenizer's model
config does). Each load runs in a fresh interpreter (torch must not be imported yet), with the cache in
the test's folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from tests.conftest import _env

#: what the child prints of the tokenizer it loaded: everything the protocol reads of it, and whether torch came in
CHILD = r"""
import json, sys
from padoc_ray.tokenizer import load_hf_tokenizer
model_dir, trust = sys.argv[1], sys.argv[2] == "1"
t = load_hf_tokenizer(model_dir, trust_remote_code=trust)
texts = ["Hello world", "<|im_start|>user\n<|image_pad|>x<|im_end|>", "  spaces\tand\nnewlines ",
         "Uberprufung \u6570\u5b57 1234.5", "<|box_start|>(1,2),(3,4)<|box_end|>"]
print(json.dumps({
    "class": f"{type(t).__module__}.{type(t).__name__}",
    "vocab": sorted(t.get_vocab().items()),
    "added": sorted((k, str(v)) for k, v in t.added_tokens_decoder.items()),
    "special": {k: str(v) for k, v in t.special_tokens_map.items()},
    "encoded": [t.encode(x, add_special_tokens=False) for x in texts],
    "with_special": [t.encode(x) for x in texts],
    "decoded": [t.decode(t.encode(x, add_special_tokens=False), skip_special_tokens=False,
                         clean_up_tokenization_spaces=False) for x in texts],
    "init": sorted((k, str(v)) for k, v in t.init_kwargs.items() if k != "name_or_path"),
    "chat_template": getattr(t, "chat_template", None),
    "torch": "torch" in sys.modules,
}))
"""


def _load(model_dir: str, cache: str, trust: bool = False) -> dict:
    p = subprocess.run([sys.executable, "-c", CHILD, model_dir, "1" if trust else "0"], capture_output=True,
                       text=True, timeout=120, env=_env(PADOC_RAY_TOKENIZER_CACHE=cache))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _entries(cache: str) -> list[str]:
    return sorted(n for n in os.listdir(cache) if n.endswith(".json")) if os.path.isdir(cache) else []


@pytest.mark.parametrize("family", ["padoc", "hpd", "dots"])
def test_a_remembered_class_loads_the_same_tokenizer_without_torch(family, tiny_model_dir, tiny_hpd_dir,
                                                                    tiny_dots_dir, tmp_path):
    model_dir, trust = {"padoc": (tiny_model_dir, False), "hpd": (tiny_hpd_dir, True),
                        "dots": (tiny_dots_dir, True)}[family]
    cache = str(tmp_path / "cache")
    first = _load(model_dir, cache, trust)
    assert first["torch"] is True  # AutoTokenizer read the model config
    (entry,) = _entries(cache)
    remembered = json.load(open(os.path.join(cache, entry)))
    assert f"{remembered['module']}.{remembered['name']}" == first["class"]
    second = _load(model_dir, cache, trust)
    assert second.pop("torch") is False
    first.pop("torch")
    assert second == first
    assert _entries(cache) == [entry]


def test_the_key_follows_the_files_that_choose_the_class(tiny_model_dir, tmp_path):
    """A checkpoint whose tokenizer_config.json, config.json or file names differ, or a load with
    trust_remote_code, is resolved by AutoTokenizer again (a new entry) instead of reusing another's class."""
    from padoc_ray.tokenizer import _resolution_key

    copy = tmp_path / "tiny"
    shutil.copytree(tiny_model_dir, copy)
    keys = {_resolution_key(str(copy), False)}
    assert _resolution_key(str(copy), False) in keys  # stable
    keys.add(_resolution_key(str(copy), True))
    for name in ("tokenizer_config.json", "config.json"):
        path = copy / name
        cfg = json.loads(path.read_text())
        cfg["padoc_test_marker"] = name
        path.write_text(json.dumps(cfg))
        keys.add(_resolution_key(str(copy), False))
    (copy / "tokenizer.model").write_bytes(b"")  # a file AutoTokenizer could choose another backend by
    keys.add(_resolution_key(str(copy), False))
    assert len(keys) == 5


def test_an_entry_naming_anything_but_a_transformers_tokenizer_is_ignored(tiny_model_dir, tmp_path, monkeypatch):
    """A cache entry is only a hint: one naming a class outside transformers, a transformers class that
    is no tokenizer, or unreadable JSON, is not used (AutoTokenizer resolves again); a cache folder that
    cannot be written only means nothing is remembered."""
    from padoc_ray import tokenizer
    from padoc_ray.tokenizer import _remember_class, _remembered_class, _resolution_key

    cache = tmp_path / "cache"
    cache.mkdir()
    monkeypatch.setenv(tokenizer.TOKENIZER_CACHE_ENV, str(cache))
    key = _resolution_key(tiny_model_dir, False)
    entry = cache / f"{key}.json"
    for forged in ({"module": "subprocess", "name": "Popen"}, {"module": "os", "name": "system"},
                   {"module": "transformers.configuration_utils", "name": "PretrainedConfig"},
                   {"module": "transformers.models.qwen2", "name": "NoSuchClass"}, "not json", "[]"):
        entry.write_text(forged if isinstance(forged, str) else json.dumps(forged))
        assert _remembered_class(key) is None, forged
    from transformers.models.qwen2.tokenization_qwen2 import Qwen2Tokenizer

    _remember_class(key, Qwen2Tokenizer)
    assert _remembered_class(key) is Qwen2Tokenizer
    _remember_class(key, type("CheckpointsOwnTokenizer", (Qwen2Tokenizer,), {"__module__": "transformers_modules.x"}))
    assert _remembered_class(key) is Qwen2Tokenizer  # a checkpoint's own code is never remembered
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv(tokenizer.TOKENIZER_CACHE_ENV, str(blocked))
    _remember_class(key, Qwen2Tokenizer)  # no error: nothing remembered
    assert _remembered_class(key) is None
