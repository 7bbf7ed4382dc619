#!/usr/bin/env bash
# Nsight Systems capture of engine steps, with the engine's NVTX phase ranges switched on.
#
#   nsys/nsys_profile.sh [-o OUT] [--plain] [--dry-run] [TORCH_TRACE_ARGS...]
#   nsys/nsys_profile.sh [-o OUT] [--dry-run] --command CMD [ARGS...]
#
# Default: runs nsys/torch_trace.py --profiler cuda-api TORCH_TRACE_ARGS under
#   nsys profile -t cuda,nvtx,osrt --capture-range=cudaProfilerApi
# so only the measured steps are recorded (warm-up, start-up and graph capture are not).
# --plain records the whole run (torch_trace.py --profiler none). --command profiles any command,
# whole run. Then: nsys stats (kernel, CUDA API and NVTX summaries as CSV), an SQLite export, and
# nsys/gaps.py on that export. Outputs: OUT.nsys-rep, OUT.sqlite, OUT_*.csv, OUT_gaps.txt.
# CADENCE_NVTX=1 is exported for the profiled process. PYTHON selects the interpreter.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
out="cadence_nsys"
plain=0
dry=0
command_mode=0
args=()
while [[ $# -gt 0 ]]; do
    case "$1" in
        -o|--out) out="$2"; shift 2 ;;
        --plain) plain=1; shift ;;
        --dry-run) dry=1; shift ;;
        --command) command_mode=1; shift; args=("$@"); break ;;
        -h|--help) sed -n '2,13p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; exit 0 ;;
        *) args+=("$1"); shift ;;
    esac
done

python="${PYTHON:-python}"
if [[ $command_mode -eq 1 ]]; then
    [[ ${#args[@]} -gt 0 ]] || { echo "nsys_profile.sh: --command needs a command" >&2; exit 2; }
    target=("${args[@]}")
    capture=()
elif [[ $plain -eq 1 ]]; then
    target=("$python" "$here/torch_trace.py" --device cuda --profiler none "${args[@]}")
    capture=()
else
    target=("$python" "$here/torch_trace.py" --device cuda --profiler cuda-api "${args[@]}")
    capture=(--capture-range=cudaProfilerApi --capture-range-end=stop)
fi

profile=(nsys profile -t cuda,nvtx,osrt "${capture[@]}" -o "$out" -f true "${target[@]}")
stats=(nsys stats -q --report cuda_gpu_kern_sum,cuda_api_sum,nvtx_sum --format csv
       -o "$out" "$out.nsys-rep")
export_db=(nsys export -q -t sqlite -f true -o "$out.sqlite" "$out.nsys-rep")
gaps=("$python" "$here/gaps.py" "$out.sqlite")

if [[ $dry -eq 1 ]]; then
    echo "CADENCE_NVTX=1 ${profile[*]}"
    echo "${stats[*]}"
    echo "${export_db[*]}"
    echo "${gaps[*]} > ${out}_gaps.txt"
    exit 0
fi

if ! command -v nsys >/dev/null 2>&1; then
    echo "nsys_profile.sh: Nsight Systems ('nsys') is not on PATH on this machine." >&2
    echo "Install Nsight Systems, or use the torch-profiler path instead:" >&2
    echo "  python nsys/torch_trace.py --out trace.json ...; python nsys/gaps.py trace.json" >&2
    exit 3
fi

export CADENCE_NVTX=1
"${profile[@]}"
"${stats[@]}" || echo "nsys_profile.sh: nsys stats failed (older nsys report names?)" >&2
"${export_db[@]}"
"${gaps[@]}" | tee "${out}_gaps.txt"
