#!/usr/bin/env bash
# Served vs offline figures on a GPU machine: the front end's share (256 streams) and latency
# under Poisson arrivals (512 in / 128 out).
#   scripts/serve_check.sh OUT_DIR [front|arrivals]...
# Writes logs and JSON into OUT_DIR. Extra server flags: SERVE_FLAGS="..."; extra bench flags
# (e.g. --clients 4): BENCH_FLAGS="..."; no py-spy: NO_SPY=1.
set -uo pipefail
out=${1:-out}; shift || true
sections=${*:-front arrivals}
mkdir -p "$out"
want() { [[ " $sections " == *" $1 "* ]]; }
model=(--model qwen3-0.6b --load-format dummy)
port=8011
read -r -a extra <<< "${SERVE_FLAGS:-}"
read -r -a bench_extra <<< "${BENCH_FLAGS:-}"

start_server() {  # $1: log name, then server flags
  local log=$1; shift
  python -m cadence serve "${model[@]}" --port $port "$@" "${extra[@]}" > "$out/$log" 2>&1 &
  server=$!
  for _ in $(seq 180); do curl -sf "http://127.0.0.1:$port/health" > /dev/null && return 0; sleep 1; done
  echo "server did not start"; tail -20 "$out/$log"; return 1
}

stop_server() { kill -INT "$server" 2>/dev/null; wait "$server" 2>/dev/null; }

bench() {  # $1: label, then bench flags
  local label=${LABEL_PREFIX:-}$1; shift
  timeout 240 python -m cadence bench serve --base-url "http://127.0.0.1:$port" --warmup 4 \
    --json-out "$out/serve_$label.json" "${bench_extra[@]}" "$@" 2>&1 | grep '^{' \
    | python -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line)
    print('$label', {k: (round(v, 2) if isinstance(v, float) else v) for k, v in r.items()
                     if k in ('request_rate', 'concurrency', 'completed', 'failed',
                              'output_throughput', 'p50_ttft_ms', 'p99_ttft_ms', 'p50_tpot_ms',
                              'p50_itl_ms', 'p90_itl_ms', 'p99_itl_ms', 'max_itl_ms')})
" | tee -a "$out/serve.log"
}

if want front; then
  [ -n "${SKIP_OFFLINE:-}" ] || timeout 200 python -m cadence bench throughput "${model[@]}" --num-prompts 256 \
    --max-num-seqs 256 --input-len 128 --output-len 256 2>&1 | grep '^{"num_prompts' \
    | sed 's/^/offline /' | tee -a "$out/serve.log"
  start_server serve_front.log --max-num-seqs 256 --max-model-len 1024 && {
    spy=/tmp/site/bin/py-spy
    if [ -x "$spy" ] && [ -z "${NO_SPY:-}" ]; then  # who holds the interpreter lock during the 256-stream run
      "$spy" record -p "$server" -d 5 -r 250 --gil --threads --nonblocking -f raw \
        -o "$out/spy_c256.txt" > "$out/spy.log" 2>&1 &
    fi
    bench c256 --concurrency 256 --num-prompts 256 --input-len 128 --output-len 256
    wait %2 2>/dev/null
    [ -s "$out/spy_c256.txt" ] && python scripts/spy_summary.py "$out/spy_c256.txt" | head -60
    bench c512 --concurrency 512 --num-prompts 512 --input-len 128 --output-len 256
    bench c1 --concurrency 1 --num-prompts 8 --input-len 128 --output-len 256
    bench c32 --concurrency 32 --num-prompts 64 --input-len 128 --output-len 256
    stop_server
  }
fi

if want arrivals; then
  start_server serve_arrivals.log --max-num-seqs 256 --max-model-len 1024 && {
    bench poisson --request-rate 20,40 --num-prompts 300 --input-len 512 --output-len 128 \
      --plot "$out/arrivals.png"
    stop_server
  }
fi
