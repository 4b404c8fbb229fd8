"""Run a function of a test module in a child interpreter (its own HF module cache, offline), for the tiny
remote-code checkpoints' tests: loading such a checkpoint imports its config's Python, which must not leak into
the test process, and vLLM's engine must start from a clean interpreter."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

#: the repository (not from tests.conftest: the child interpreter imports the test module, and this, alone)
ROOT = str(Path(__file__).resolve().parents[2])
_MARK = "@@RESULT@@"


def digest(d: str, name: str) -> str:
    """sha256 of the file ``name`` in the folder ``d``."""
    with open(os.path.join(d, name), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def child_env(tmp: Path, **extra: str) -> dict:
    """The environment of a child: offline, its own HF module cache under ``tmp``, the repository importable."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", HF_MODULES_CACHE=str(tmp / "hf-modules"), TOKENIZERS_PARALLELISM="false",
               PYTHONUNBUFFERED="1", **extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    return env


#: the children ask stock vLLM for logprobs, whose rank count vLLM wraps in torch.compile (inductor: dynamo's
#: trace and a C++ build on first use, about 2-4 CPU-s a child on this machine, more where nothing is cached
#: yet); these tests are about the checkpoint in stock vLLM, not that helper: it runs eagerly, as the model does
NO_TORCH_COMPILE = {"TORCH_COMPILE_DISABLE": "1"}


def run_worker(module_file: str, fn: str, model_dir: str, tmp: Path, timeout: int, **env: str) -> dict:
    """Run ``fn(model_dir)`` of the test module at ``module_file`` in a child interpreter (with
    :data:`NO_TORCH_COMPILE`); its JSON result."""
    env = {**NO_TORCH_COMPILE, **env}
    module = Path(module_file).stem
    code = (f"import json, sys; sys.path.insert(1, sys.argv[2]); import {module} as t; "
            f"print({_MARK!r} + json.dumps(t.{fn}(sys.argv[1])))")
    proc = subprocess.run([sys.executable, "-c", code, model_dir, str(Path(module_file).parent)],
                          env=child_env(tmp, **env), capture_output=True, text=True, timeout=timeout, cwd=str(tmp))
    marker = [line for line in proc.stdout.splitlines() if line.startswith(_MARK)]
    assert proc.returncode == 0 and marker, f"{fn} failed (rc={proc.returncode}):\n{proc.stdout[-3000:]}\n" \
                                            f"{proc.stderr[-6000:]}"
    return json.loads(marker[0][len(_MARK):])
