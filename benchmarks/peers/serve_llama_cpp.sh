#!/usr/bin/env bash
# Run llama.cpp's llama-server (built by setup_llama_cpp.sh) on a GGUF file, in the foreground (exec, so
# SIGTERM reaches it), with continuous batching over PARALLEL slots and every core. See README.md.
#
#   usage: benchmarks/peers/serve_llama_cpp.sh MODEL.gguf [PORT] [extra llama-server args...]
#
#   LLAMA_CPP_DIR, LLAMA_CPP_PYTHON_VERSION   as in setup_llama_cpp.sh
#   PARALLEL        server slots, i.e. requests decoded together (default 8)
#   CTX_PER_SLOT    context tokens per slot (default 2048); the KV cache holds PARALLEL x CTX_PER_SLOT
set -euo pipefail

MODEL="${1:?usage: serve_llama_cpp.sh MODEL.gguf [PORT] [extra args...]}"
PORT="${2:-8000}"
shift $(( $# < 2 ? $# : 2 ))
LLAMA_CPP_DIR="${LLAMA_CPP_DIR:-$HOME/.peers/llama-cpp}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PARALLEL="${PARALLEL:-8}"
CTX_PER_SLOT="${CTX_PER_SLOT:-2048}"

server="$LLAMA_CPP_DIR/llama_cpp_python-$VERSION/vendor/llama.cpp/build/bin/llama-server"
[ -x "$server" ] || { echo "$server not found: run benchmarks/peers/setup_llama_cpp.sh" >&2; exit 1; }
exec "$server" -m "$MODEL" --host 127.0.0.1 --port "$PORT" --threads "$(nproc)" --threads-batch "$(nproc)" \
    --parallel "$PARALLEL" --ctx-size $(( PARALLEL * CTX_PER_SLOT )) --cont-batching "$@"
