#!/usr/bin/env bash
# The GPU suite and the headline benchmarks in one go, on a CUDA machine.
#   scripts/gpu_check.sh OUT_DIR [all|tests|launch|latency|ttft|trace|report|serve]...
# Writes logs and JSON into OUT_DIR; every section runs even if an earlier one failed.
# Sections not in "all": moe (Qwen3-30B-A3B: the decode MoE kernels against the grouped path,
# then decode steps in bf16 and with FP8 experts).
set -uo pipefail
out=${1:-out}; shift || true
sections=${*:-all}
mkdir -p "$out"
want() { [[ " $sections " == *" all "* || " $sections " == *" $1 "* ]]; }
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$out/gpu.txt"
read -r -a model <<< "${MODEL_ARGS:---model qwen3-0.6b --load-format dummy}"

if want tests; then
  timeout ${TESTS_TIMEOUT:-480} python -m pytest -m gpu -q -rs -p no:cacheprovider 2>&1 \
    | tail -40 | tee "$out/gpu_tests.log"
fi

if want launch; then  # host cost per kernel launch: the runtime's launcher against Numba's, Triton's
  timeout 300 python scripts/launch_cost.py 2>&1 | tee "$out/launch_cost.log"
  timeout 300 python scripts/launch_cost.py --json > "$out/launch_cost.json" 2>/dev/null
fi

if want latency; then
  for mode in async sync eager; do
    case $mode in
      async) flags=();; sync) flags=(--no-async-scheduling);; eager) flags=(--enforce-eager);;
    esac
    timeout 150 python -m cadence bench latency "${model[@]}" "${flags[@]}" \
      --batch-sizes 1,8,32,128 --input-len 128 --output-len 256 --repeats 2 --no-progress \
      --json-out "$out/latency_$mode.json" 2>&1 | grep -v -E 'INFO|WARNING' | sed "s/^/$mode /" \
      | tee -a "$out/latency.log"
  done
fi

if want ttft; then
  for mode in graphs eager-mixed eager; do
    case $mode in
      graphs) flags=();; eager-mixed) flags=(--max-capture-tokens 0);; eager) flags=(--enforce-eager);;
    esac
    timeout 240 python -m cadence bench ttft "${model[@]}" "${flags[@]}" \
      --input-lens 16,128,1024,4096 --repeats 10 --no-progress --json-out "$out/ttft_$mode.json" \
      2>&1 | grep -v -E 'WARNING' | sed "s/^/$mode /" | tee -a "$out/ttft.log"
  done
fi

if want trace; then
  for bs in ${TRACE_BATCHES:-1 32 128}; do
    for mode in async sync; do
      flag=--async-scheduling; [ $mode = sync ] && flag=--no-async-scheduling
      timeout 90 python nsys/torch_trace.py "${model[@]}" $flag --batch-size "$bs" \
        --input-len 128 --steps 40 --warmup-steps 10 --out "/tmp/trace_${bs}_$mode.json" \
        --summary-out "$out/gaps_${bs}_$mode.json" > /dev/null 2>&1 || echo "trace $bs $mode failed"
      python - "$out/gaps_${bs}_$mode.json" "$bs" "$mode" <<'PY' | tee -a "$out/trace.log"
import json, sys
s = json.load(open(sys.argv[1]))
g = s.get("gap_us") or {}
print(f"batch {sys.argv[2]} {sys.argv[3]}: steps={s['num_steps']} gap_p50={g.get('p50')} "
      f"gap_p90={g.get('p90')} busy_p50={(s.get('gpu_busy_us') or {}).get('p50')} "
      f"host_p50={(s.get('host_us') or {}).get('p50')} kernels={s.get('kernels_per_step')} "
      f"idle={s.get('gpu_idle_fraction')} attribution={s.get('attribution')}")
PY
    done
  done
fi

if want report; then  # cadence trace: HTML reports and their figures (docs/perf.md)
  for load in decode_1 decode_64 prefill_1024; do
    case $load in
      decode_1) flags=(--load decode --batch-size 1 --input-len 128);;
      decode_64) flags=(--load decode --batch-size 64 --input-len 128);;
      prefill_1024) flags=(--load prefill --input-len 1024);;
    esac
    timeout 120 python -m cadence trace "${model[@]}" "${flags[@]}" --steps 20 \
      --warmup-steps 5 --out "$out/report_$load.html" --json-out "$out/report_$load.json" \
      --trace-out "/tmp/report_$load.trace.json" \
      2>&1 | tail -14 | sed "s/^/$load /" | tee -a "$out/report.log" || echo "report $load failed"
  done
fi

if [[ " $sections " == *" moe "* ]]; then
  timeout 120 python scripts/moe_sweep.py --decode --tokens 1,2,4 2>&1 | grep tokens \
    | tee "$out/moe_decode.log"
  for quant in none fp8; do
    flags=(); [ $quant = fp8 ] && flags=(--quantization fp8)
    timeout 150 python -m cadence bench latency --model qwen3-30b-a3b --load-format dummy \
      "${flags[@]}" --batch-sizes 1,32 --input-len 128 --output-len 128 --repeats 2 --no-progress \
      --json-out "$out/moe_latency_$quant.json" 2>&1 | grep -v -E 'INFO|WARNING' \
      | sed "s/^/$quant /" | tee -a "$out/moe_latency.log"
  done
fi

if want serve; then
  port=8011
  for mode in async sync; do
    flag=--async-scheduling; [ $mode = sync ] && flag=--no-async-scheduling
    python -m cadence serve "${model[@]}" $flag --port $port --max-model-len 1024 \
      --max-num-seqs 64 > "$out/serve_$mode.log" 2>&1 &
    pid=$!
    for _ in $(seq 120); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && break; sleep 1; done
    timeout 150 python -m cadence bench serve --base-url "http://127.0.0.1:$port" \
      --concurrency 1,32 --num-prompts 32 --input-len 128 --output-len 128 \
      --prompt-kind tokens --json-out "$out/serve_bench_$mode.json" 2>&1 | tail -4 \
      | sed "s/^/$mode /" | tee -a "$out/serve.log"
    kill $pid; wait $pid 2>/dev/null
  done
fi
