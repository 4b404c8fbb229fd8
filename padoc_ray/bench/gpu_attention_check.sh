#!/usr/bin/env bash
# Ancestor-attention benchmark on a CUDA machine: dense vs flex vs tree_varlen, S = 2048..16384.
#
# Needs only a CUDA build of torch and this repository (no vLLM, no Ray: their import is blocked,
# so the run proves it does not need them). flash-attn is used by tree_varlen when importable,
# otherwise torch's varlen_attn. Writes JSON and a log to $OUT (default out/gpu_attention, git-ignored).
#
#   bash padoc_ray/bench/gpu_attention_check.sh            # from the repository root
#   PYTHON=/path/to/python OUT=/tmp/att bash padoc_ray/bench/gpu_attention_check.sh
#
# Runs: (1) bfloat16, lengths 2048,4096,8192,16384, 8 branches, 16 q heads / 8 kv heads / dim 128;
#       (2) float32 at 2048 and 8192, a tighter agreement check (tree_varlen then uses per-segment SDPA).
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}"
OUT="${OUT:-out/gpu_attention}"
mkdir -p "$OUT"
LENGTHS="${LENGTHS:-2048,4096,8192,16384}"

"$PYTHON" - "$OUT" "$LENGTHS" <<'PY' 2>&1 | tee "$OUT/log.txt"
import importlib.abc, json, os, sys

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"vllm", "ray"}:
            raise ImportError(f"blocked import of {name}: this check must not need it")
        return None

sys.meta_path.insert(0, Block())
sys.path.insert(0, os.getcwd())
out, lengths = sys.argv[1], sys.argv[2]
import torch

if not torch.cuda.is_available():
    sys.exit("no CUDA device visible to torch: this script is for GPU machines")
from padoc_ray.trainer.attention import tree_varlen_kernel
from padoc_ray.cli import main as cli


def main(argv):
    return cli(["bench", "attention", *argv])


print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, tree_varlen kernel (bf16): "
      f"{tree_varlen_kernel('cuda', torch.bfloat16)}", flush=True)
rc = main(["--device", "cuda", "--dtype", "bfloat16", "--lengths", lengths, "--branches", "8", "--heads", "16",
           "--kv-heads", "8", "--head-dim", "128", "--repeats", "5", "--warmup", "2",
           "--memory-budget-gib", str(0.8 * torch.cuda.get_device_properties(0).total_memory / 2**30),
           "--json", os.path.join(out, "attention_bf16.json")])
rc |= main(["--device", "cuda", "--dtype", "float32", "--lengths", "2048,8192", "--branches", "8",
            "--repeats", "3", "--json", os.path.join(out, "attention_fp32.json")])
bad = [m for m in sys.modules if m.split(".")[0] in {"vllm", "ray"}]
assert not bad, bad
sys.exit(rc)
PY
echo "results: $OUT/attention_bf16.json $OUT/attention_fp32.json $OUT/log.txt"
