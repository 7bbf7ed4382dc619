#!/usr/bin/env bash
# The GPU suite and the headline benchmarks, in one go, on a CUDA machine.
#   scripts/gpu_check.sh OUT_DIR [tests|bench|all] [extra pytest args...]
set -uo pipefail
out=${1:-out}; what=${2:-all}; shift 2 || true
mkdir -p "$out"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
if [ "$what" = tests ] || [ "$what" = all ]; then
  python -m pytest -m gpu -q -rs "$@" 2>&1 | tee "$out/gpu_tests.log"
fi
if [ "$what" = bench ] || [ "$what" = all ]; then
  for mode in "" "--no-async-scheduling" "--enforce-eager"; do
    tag=$(echo "graphs-async${mode}" | tr -d ' ')
    python -m cadence bench latency --model qwen3-0.6b --load-format dummy \
      --batch-sizes 1,8,32,128 --input-len 128 --output-len 256 --repeats 2 $mode \
      --json-out "$out/latency${tag}.json" 2>&1 | grep -v "^20..-" | tee -a "$out/bench.log"
  done
fi
