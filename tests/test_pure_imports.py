"""The pure core imports no ray, vllm, torch or transformers: proven by importing it with those blocked."""

import subprocess
import sys

BLOCKER = r"""
import sys
class Block:
    BLOCKED = {"ray", "vllm", "torch", "transformers", "tokenizers", "pyarrow"}
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in self.BLOCKED:
            raise ImportError(f"blocked import of {name}")
        return None
sys.meta_path.insert(0, Block())
import importlib
for mod in sys.argv[1:]:
    importlib.import_module(mod)
loaded = sorted(m for m in sys.modules if m.split(".")[0] in Block.BLOCKED)
assert not loaded, loaded
print("ok")
"""

PURE = [
    "padoc_ray.protocol",
    "padoc_ray.protocol.bytes_tokenizer",
    "padoc_ray.scheduler",
    "padoc_ray.engine",
    "padoc_ray.engine.interface",
    "padoc_ray.engine.config",
    "padoc_ray.eval.agreement",
    "padoc_ray.eval.consensus",
    "padoc_ray.eval.importers",
    "padoc_ray.trainer.config",
]


def test_pure_modules_import_with_heavy_packages_blocked():
    out = subprocess.run([sys.executable, "-c", BLOCKER, *PURE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_blocker_really_blocks():
    out = subprocess.run([sys.executable, "-c", BLOCKER, "padoc_ray.engine.forcing"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "blocked import of" in out.stderr
