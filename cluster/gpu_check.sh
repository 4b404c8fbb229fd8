#!/usr/bin/env bash
# One command for a CUDA machine with the gpu profile installed: does padoc-ray's engine work on both of
# vLLM's model runners, and what does the serving benchmark do there? Writes one JSON verdict.
#
#   cluster/gpu_check.sh [--out DIR] [--runners v2,v1] [--pages N] [--warmup N] [--concurrency LIST]
#                        [--model CHECKPOINT]
#
#   --out DIR      where the verdict (DIR/verdict.json), the logs and the benchmark go
#                  (default: gpu-check-<UTC time>)
#   --runners LIST the model runners to check, in order (default v2,v1: Model Runner V2, vLLM 0.32's
#                  default on CUDA, then the V1 runner through VLLM_USE_V2_MODEL_RUNNER=0)
#   --pages N      synthetic pages for the benchmark (default 32)
#   --warmup N     untimed warm-up pages per mode before the benchmark's timed runs (default 2;
#                  0 when only the wiring is checked, as the CPU suite does: the figures need them)
#   --concurrency LIST  pages in flight for the benchmark, comma-separated (default 4,16; with --model 16,64)
#   --model DIR    a real checkpoint (PaDoc; HPD-Parsing: huggingface-cli download PaddlePaddle/HPD-Parsing
#                  --local-dir DIR; dots.ocr: huggingface-cli download rednote-hilab/dots.ocr --local-dir DIR)
#                  instead of the tiny one: the examples are parsed WITHOUT replay (the model reads them),
#                  each page's status and Markdown go into the verdict, and the benchmark is bench serve
#                  --no-replay on the synthetic pages (fork pages/s per C; a dots checkpoint: fork and
#                  sequential, its own single request, on the same weights)
#
# Steps (each one's output goes to DIR/logs/STEP.log, its outcome into the verdict):
#   1. padoc-ray doctor (the runner vLLM picks here, the processors its loader accepts, trace replay)
#   2. build the tiny model (random weights, built offline in seconds)
#   3. per runner: parse-page with teacher forcing (--replay), which must equal the ground truth,
#      then the same with --constrain-layout
#   4. bench replay at each --concurrency (fork vs sequential, teacher-forced) on synthetic pages, on
#      the first runner of --runners; its summary goes into the verdict
# With --model, steps 2-4 become: per runner, demo --model DIR --no-replay (the batch job on examples/, one
# engine); then bench serve --no-replay --modes fork on the first runner.
# Exit 0 when every step passed, 1 otherwise. Needs no network. Meant to take under 10 minutes on one GPU
# (most of it engine starts: five of them). On a machine without CUDA only --runners v1 can pass.
set -uo pipefail
cd "$(dirname "$0")/.."
out="gpu-check-$(date -u +%Y%m%dT%H%M%SZ)"
runners="v2,v1"
pages=32
warmup=2
concurrency=4,16
real_model=""
concurrency_set=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --out) out="${2:?--out needs a folder}"; shift 2 ;;
    --runners) runners="${2:?--runners needs a list}"; shift 2 ;;
    --pages) pages="${2:?--pages needs a number}"; shift 2 ;;
    --warmup) warmup="${2:?--warmup needs a number}"; shift 2 ;;
    --concurrency) concurrency="${2:?--concurrency needs a list}"; concurrency_set=1; shift 2 ;;
    --model) real_model="${2:?--model needs a checkpoint folder}"; concurrency_set=${concurrency_set:-}; shift 2 ;;
    -h|--help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
if [[ -n "$real_model" ]]; then
  [[ -d "$real_model" ]] || { echo "gpu_check.sh: --model $real_model is not a folder" >&2; exit 2; }
  [[ -n "$concurrency_set" ]] || concurrency=16,64
fi
for r in ${runners//,/ }; do
  [[ "$r" == v1 || "$r" == v2 ]] || { echo "gpu_check.sh: runner must be v1 or v2, got $r" >&2; exit 2; }
done
[[ "$concurrency" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || {
  echo "gpu_check.sh: --concurrency must be positive whole numbers separated by commas, got $concurrency" >&2; exit 2; }
[[ "$warmup" =~ ^[0-9]+$ ]] || { echo "gpu_check.sh: --warmup must be a whole number, got $warmup" >&2; exit 2; }
padoc="${PADOC_RAY:-padoc-ray}"
py="${PYTHON:-python3}"
command -v "$padoc" >/dev/null || { echo "gpu_check.sh: $padoc not found (install the gpu profile: pip install -e '.[gpu]')" >&2; exit 2; }
mkdir -p "$out/logs"
steps="$out/steps.jsonl"
: > "$steps"
model="$out/tiny"
gt=examples/ground_truth.json
pdf=examples/paper.pdf
t_start=$(date +%s)

# step NAME RUNNER_ENV CMD... : run a command (stdout to logs/NAME.out, stderr to logs/NAME.log), record its
# exit code and duration
step() {
  local name="$1" env_runner="$2"; shift 2
  local t0 t1 rc ms
  t0=$(date +%s%N)
  echo "== $name: $*" >&2
  if [[ -n "$env_runner" ]]; then
    VLLM_USE_V2_MODEL_RUNNER="$env_runner" "$@" >"$out/logs/$name.out" 2>"$out/logs/$name.log"; rc=$?
  else
    "$@" >"$out/logs/$name.out" 2>"$out/logs/$name.log"; rc=$?
  fi
  t1=$(date +%s%N)
  ms=$(( (t1 - t0) / 1000000 ))
  printf '{"name": "%s", "rc": %d, "seconds": %d.%03d, "runner_env": "%s"}\n' "$name" "$rc" \
    $((ms / 1000)) $((ms % 1000)) "$env_runner" >> "$steps"
  echo "   rc=$rc ($((ms / 1000)) s)" >&2
}

if [[ -n "$real_model" ]]; then
  model="$real_model"
  step doctor "" "$padoc" doctor --model "$model" --json "$out/doctor.json"
  first=""
  for r in ${runners//,/ }; do
    if [[ "$r" == v2 ]]; then envv=1; else envv=0; fi
    [[ -z "$first" ]] && first="$envv"
    step "demo-$r" "$envv" "$padoc" demo --model "$model" --no-replay --output "$out/demo-$r"
  done
  step corpus "" "$padoc" corpus generate --out "$out/corpus" --pages "$pages" --images --seed 1 --force
  # a dots checkpoint also runs its own single request (sequential) on the same weights: fork against it
  modes=fork
  [[ "$("$py" -c 'import json,sys; print(json.load(open(sys.argv[1])).get("family"))' "$out/doctor.json" \
       2>/dev/null)" == dots ]] && modes=fork,sequential
  step bench-serve "$first" "$padoc" bench serve --gt "$out/corpus/gt.json" --images "$out/corpus/images" \
    --model "$model" --modes "$modes" --no-replay --concurrency "$concurrency" --pages "$pages" --warmup "$warmup" \
    --out "$out/bench"
else
step doctor "" "$padoc" doctor --json "$out/doctor.json"
step build-tiny-model "" "$padoc" build-tiny-model "$model" --force
first=""
for r in ${runners//,/ }; do
  if [[ "$r" == v2 ]]; then envv=1; else envv=0; fi
  [[ -z "$first" ]] && first="$envv"
  step "parse-page-$r" "$envv" "$padoc" parse-page "$pdf" --page 1 --model "$model" --replay "$gt" --format json
  step "parse-page-$r-constrained" "$envv" "$padoc" parse-page "$pdf" --page 1 --model "$model" --replay "$gt" \
    --format json --constrain-layout
done
step corpus "" "$padoc" corpus generate --out "$out/corpus" --pages "$pages" --images --seed 1 --force
step bench-replay "$first" "$padoc" bench replay --gt "$out/corpus/gt.json" --images "$out/corpus/images" \
  --model "$model" --concurrency "$concurrency" --warmup "$warmup" --out "$out/bench"
fi

"$py" - "$out" "$t_start" <<'PY'
import json
import os
import sys
import time

out, t_start = sys.argv[1], int(sys.argv[2])
steps = [json.loads(line) for line in open(os.path.join(out, "steps.jsonl"))]


def read(name, ext):
    path = os.path.join(out, "logs", f"{name}.{ext}")
    with open(path, errors="replace") as f:
        return f.read()


def page_json(text):
    """parse-page --format json prints one JSON object on stdout."""
    try:
        return json.loads(text)
    except ValueError:
        return None


def demo_pages(folder):
    """Each page row of a demo output: its status, its Markdown and how long it took."""
    try:
        import pyarrow.dataset as ds
    except ImportError:
        return []
    pages = os.path.join(folder, "pages")
    if not os.path.isdir(pages):
        return []
    cols = ["source_uri", "page_index", "status", "error_message", "markdown", "n_branches", "e2e_s"]
    rows = ds.dataset(pages, format="parquet").to_table(columns=cols).to_pylist()
    rows.sort(key=lambda r: (r["source_uri"], r["page_index"]))
    return [{"document": os.path.basename(r["source_uri"]), "page": r["page_index"] + 1, "status": r["status"],
             "message": r["error_message"], "n_branches": r["n_branches"], "e2e_s": r["e2e_s"],
             "markdown": r["markdown"]} for r in rows if r["page_index"] >= 0]


def mode_rates(report_path, mode):
    """bench serve's rows of one mode: valid pages/s (and P95) per concurrency."""
    if not os.path.exists(report_path):
        return None
    rows = json.load(open(report_path)).get("rows", [])
    return {str(r.get("concurrency")): {k: r.get(k) for k in ("valid_pages_per_s", "pages_per_s", "p95_e2e_s",
                                                                 "valid_pages", "pages")}
            for r in rows if r.get("mode") == mode}


for s in steps:
    s["ok"] = s["rc"] == 0
    text = read(s["name"], "log")
    if s["name"].startswith("parse-page"):
        page = page_json(read(s["name"], "out")) or {}
        s["page"] = {k: page.get(k) for k in ("status", "valid", "equals_truth", "n_branches", "e2e_s")}
        s["ok"] = s["ok"] and page.get("status") == "ok" and page.get("equals_truth") is True
    if s["name"].startswith("demo-"):  # --model: every page of the examples, parsed without replay
        s["pages"] = demo_pages(os.path.join(out, s["name"]))
        s["ok"] = s["ok"] and bool(s["pages"])
    if not s["ok"]:
        s["log_tail"] = text[-3000:]
doctor = json.load(open(os.path.join(out, "doctor.json"))) if os.path.exists(os.path.join(out, "doctor.json")) else {}
bench_path = os.path.join(out, "bench", "summary.json")
verdict = {
    "ok": all(s["ok"] for s in steps),
    "seconds": round(time.time() - t_start, 1),
    "machine": {k: doctor.get(k) for k in ("versions", "cuda", "runner", "attention_backend", "async_scheduling",
                                           "cuda_graphs", "dtype", "logits_processors", "processors_load",
                                           "trace_replay", "problems")},
    "steps": steps,
    "bench_replay": json.load(open(bench_path)) if os.path.exists(bench_path) else None,
}
if any(s["name"] == "bench-serve" for s in steps):  # --model: the free-running benchmark (dots: and sequential)
    verdict["model"] = {k: doctor.get(k) for k in ("family", "model")}
    verdict["bench_serve_fork"] = mode_rates(os.path.join(out, "bench", "report.json"), "fork")
    if doctor.get("family") == "dots":
        verdict["bench_serve_sequential"] = mode_rates(os.path.join(out, "bench", "report.json"), "sequential")
with open(os.path.join(out, "verdict.json"), "w") as f:
    json.dump(verdict, f, indent=2)
for s in steps:
    print(f"{'ok  ' if s['ok'] else 'FAIL'} {s['name']:<28} {s['seconds']:>7.1f} s")
print(f"verdict: {'ok' if verdict['ok'] else 'FAILED'} in {verdict['seconds']} s -> {os.path.join(out, 'verdict.json')}")
sys.exit(0 if verdict["ok"] else 1)
PY
