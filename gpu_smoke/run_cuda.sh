#!/usr/bin/env bash
# The GPU smoke on a CUDA machine (issue 7): one prepared run, under 8 minutes, no network.
#
#   bash gpu_smoke/run_cuda.sh [OUT_DIR]        # from anywhere; OUT_DIR defaults to $OUT, else
#                                               # /tmp/kvspec-gpu-smoke
#
# Needs python3 with torch (CUDA), triton and transformers (tested against torch 2.11, triton 3.6,
# transformers 5.17), plus numpy, xxhash, rich and hypothesis; nothing is installed or downloaded.
# Steps, each bounded by `timeout`:
#   1. preflight: GPU, versions                                   -> gpu.txt
#   2. tiny model on CUDA, no benchmark (compiles the kernels; a fast first answer)
#                                                                 -> smoke_tiny.json, smoke_tiny.log
#   3. full model (8 layers, hidden 4096, 32 q / 8 kv heads) + attention micro-benchmark
#                                                                 -> smoke_cuda.json, smoke_cuda.log
# `python3 -m kvspec.smoke` is the same code as `kvspec smoke`. Exit status: that of step 3
# (0 pass, 1 mismatch, 2 could not run, 124 timed out), or step 2's if step 3 never ran.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
out="${1:-${OUT:-/tmp/kvspec-gpu-smoke}}"
mkdir -p "$out" || exit 2
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
unset TRITON_INTERPRET

start=$SECONDS
{
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1
    python3 -c 'import sys, torch, triton, transformers; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "triton", triton.__version__, "transformers", transformers.__version__, "device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else None)' 2>&1
} | tee "$out/gpu.txt"

summary() {  # one line from a smoke JSON document
    python3 - "$1" <<'PY'
import json, sys
try:
    d = json.load(open(sys.argv[1]))
except Exception as exc:  # no document: the log says why
    print(f"  (no JSON: {exc})")
    raise SystemExit
print(f"  passed={d['passed']} tokens={d['tokens_generated']} match={d['tokens_match']} "
      f"max_abs_logit_err={d['max_abs_logit_err']} reused={d['pages_reused']} "
      f"poisoned={d['poisoned_pages']} seconds={d['seconds']}")
for r in d["runs"]:
    keys = ("tokens_match", "max_abs_logit_err", "err_ratio", "clear_margin_matches",
            "clear_margin_tokens", "error", "first_divergence")
    print(f"  {r['name']}: " + ", ".join(f"{k}={r[k]}" for k in keys if k in r))
b = d.get("attention_bench")
if b and "error" in b:
    print(f"  bench: {b['error']}")
elif b:
    print(f"  bench: dense SDPA {b['dense_sdpa_us']:.1f} us, Triton paged {b['paged_triton_us']} us "
          f"(paged/dense {b['paged_over_dense']}, goal <= {b['goal_paged_over_dense']}), "
          f"gather+SDPA {b['gather_sdpa_us']:.1f} us (gather/dense {b['gather_over_dense']:.2f}); "
          f"best {b['best_config']}")
PY
}

echo "== tiny on CUDA (no bench)"
timeout 150 python3 -m kvspec.smoke --device cuda --size tiny --no-bench --json --progress \
    > "$out/smoke_tiny.json" 2> >(tee "$out/smoke_tiny.log" >&2)
rc=$?
echo "tiny: exit $rc after $((SECONDS - start)) s"
summary "$out/smoke_tiny.json"

if [ "$rc" -eq 2 ]; then
    echo "could not run on CUDA (see $out/smoke_tiny.log)"
    exit 2
fi
left=$((470 - (SECONDS - start)))
if [ "$left" -lt 120 ]; then
    echo "not enough time left for the full run ($left s)"
    exit "$rc"
fi
echo "== full on CUDA (with the attention micro-benchmark), at most $left s"
timeout "$left" python3 -m kvspec.smoke --device cuda --json --progress \
    > "$out/smoke_cuda.json" 2> >(tee "$out/smoke_cuda.log" >&2)
rc=$?
echo "full: exit $rc after $((SECONDS - start)) s"
summary "$out/smoke_cuda.json"
echo "results in $out"
exit "$rc"
