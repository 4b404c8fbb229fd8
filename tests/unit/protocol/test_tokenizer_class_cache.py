"""padoc_ray.tokenizer.load_hf_tokenizer: the tokenizer class AutoTokenizer chose for a checkpoint is
remembered, so a later process loads the same tokenizer without importing torch (AutoTokenizer's model
config does). The loads run in two fresh interpreters (torch must not be imported yet), each loading every
family's checkpoint in turn, with the cache in the test's folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

from tests.conftest import _env

#: what the child prints of each tokenizer it loads (argv: DIR=1 to trust the checkpoint's code, DIR=0 not), in
#: turn: everything the protocol reads of it, and whether torch had come in once it was loaded
CHILD = r"""
import json, sys
from padoc_ray.tokenizer import load_hf_tokenizer
texts = ["Hello world", "<|im_start|>user\n<|image_pad|>x<|im_end|>", "  spaces\tand\nnewlines ",
         "Uberprufung \u6570\u5b57 1234.5", "<|box_start|>(1,2),(3,4)<|box_end|>"]
out = []
for arg in sys.argv[1:]:
    model_dir, trust = arg.rsplit("=", 1)
    t = load_hf_tokenizer(model_dir, trust_remote_code=trust == "1")
    out.append({
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
    })
print(json.dumps(out))
"""


def _load(checkpoints: list[tuple[str, bool]], cache: str) -> list[dict]:
    """Each of ``checkpoints`` (model dir, trust remote code) loaded in turn in one fresh interpreter."""
    p = subprocess.run([sys.executable, "-c", CHILD, *(f"{d}={int(trust)}" for d, trust in checkpoints)],
                       capture_output=True, text=True, timeout=120, env=_env(PADOC_RAY_TOKENIZER_CACHE=cache))
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


def _entries(cache: str) -> list[str]:
    return sorted(n for n in os.listdir(cache) if n.endswith(".json")) if os.path.isdir(cache) else []


def test_a_remembered_class_loads_the_same_tokenizer_without_torch(tiny_model_dir, tiny_hpd_dir, tiny_dots_dir,
                                                                    tmp_path):
    """The three families' checkpoints (padoc, hpd and dots, the last two trusted): the first process
    resolves each through AutoTokenizer (which imports torch) and remembers one class a checkpoint; the
    second loads all three from what was remembered, the same tokenizers, and never imports torch."""
    checkpoints = [(tiny_model_dir, False), (tiny_hpd_dir, True), (tiny_dots_dir, True)]
    cache = str(tmp_path / "cache")
    first = _load(checkpoints, cache)
    assert first[0]["torch"] is True  # AutoTokenizer read the model config
    entries = _entries(cache)
    assert len(entries) == len(checkpoints)
    remembered = [json.load(open(os.path.join(cache, e))) for e in entries]
    assert sorted(f"{r['module']}.{r['name']}" for r in remembered) == sorted(t["class"] for t in first)
    second = _load(checkpoints, cache)
    assert [t.pop("torch") for t in second] == [False] * len(checkpoints)
    for t in first:
        t.pop("torch")
    assert second == first
    assert _entries(cache) == entries


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
