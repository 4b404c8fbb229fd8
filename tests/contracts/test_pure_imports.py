"""The pure core imports no ray, vllm, torch or transformers: proven by importing it with those blocked."""

import ast
import os
import pkgutil
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

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
assert os.path.isdir(os.path.join(ROOT, "padoc_ray")), ROOT

#: the pure core (docs/architecture.md, "Layers"): whole packages, every module in them, and single modules
PURE_PACKAGES = ["padoc_ray.protocol", "padoc_ray.scheduler", "padoc_ray.eval.e2e", "padoc_ray.perfmodel"]
PURE_MODULES = [
    "padoc_ray.engine", "padoc_ray.engine.interface", "padoc_ray.engine.config", "padoc_ray.engine.fake",
    "padoc_ray.engine.faults",
    "padoc_ray.eval.pageiou", "padoc_ray.curation", "padoc_ray.curation.agreement", "padoc_ray.curation.consensus",
    "padoc_ray.curation.importers", "padoc_ray.eval.coverage",
    "padoc_ray.trainer.tree", "padoc_ray.trainer.config", "padoc_ray.groundtruth", "padoc_ray.status",
    # the online service's HTTP edge (its runner, jobs and uploads run without Ray too, over pyarrow)
    "padoc_ray.serve.guard", "padoc_ray.serve.errors", "padoc_ray.serve.fair", "padoc_ray.serve.schemas",
]
#: pure at import; may look for torch when asked (engine.config: is there a GPU?)
IMPORT_ONLY = {"padoc_ray.engine.config"}
#: never imported by the pure core, not even inside a function (pyarrow may be, lazily, for file I/O)
HEAVY = {"ray", "vllm", "torch", "transformers", "tokenizers"}


def pure_modules() -> list[str]:
    out = []
    for pkg in PURE_PACKAGES:
        folder = os.path.join(ROOT, *pkg.split("."))
        out.append(pkg)
        out += [f"{pkg}.{m.name}" for m in pkgutil.walk_packages([folder]) if not m.ispkg]
    return out + PURE_MODULES


def _source(mod: str) -> str:
    path = os.path.join(ROOT, *mod.split("."))
    return path + "/__init__.py" if os.path.isdir(path) else path + ".py"


PURE = pure_modules()


def test_pure_core_never_imports_heavy_packages_even_lazily():
    """A static check of every import statement, at module level or inside functions."""
    assert "padoc_ray.eval.pageiou" in PURE and "padoc_ray.trainer.tree" in PURE and "padoc_ray.protocol.codec" in PURE
    bad = []
    for mod in PURE:
        if mod in IMPORT_ONLY:
            continue
        tree = ast.parse(open(_source(mod), encoding="utf-8").read())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            bad += [f"{mod}: {n}" for n in names if n.split(".")[0] in HEAVY]
    assert not bad, bad


def test_pure_modules_import_with_heavy_packages_blocked():
    out = subprocess.run([sys.executable, "-c", BLOCKER, *PURE], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_the_blocker_really_blocks():
    out = subprocess.run([sys.executable, "-c", BLOCKER, "padoc_ray.engine.forcing"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode != 0 and "blocked import of" in out.stderr
