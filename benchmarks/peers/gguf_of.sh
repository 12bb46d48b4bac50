#!/usr/bin/env bash
# Print the path of the bf16 GGUF conversion of an HF checkpoint directory for the llama.cpp peer, making it
# first if needed: MODEL_DIR/../gguf/<name>.gguf, by convert_to_gguf.py with the llama.cpp tree that
# setup_llama_cpp.sh builds (and builds first if missing).
#
#   usage: benchmarks/peers/gguf_of.sh MODEL_DIR
set -euo pipefail
MODEL_DIR="$(cd "${1:?usage: gguf_of.sh MODEL_DIR}" && pwd)"
cd "$(dirname "$0")/../.."
out="$(dirname "$MODEL_DIR")/gguf/$(basename "$MODEL_DIR").gguf"
if [ ! -f "$out" ] || [ -n "$(find "$MODEL_DIR" -name '*.safetensors' -newer "$out")" ]; then
    source_dir="$(benchmarks/peers/setup_llama_cpp.sh)"
    mkdir -p "$(dirname "$out")"
    python3 benchmarks/peers/convert_to_gguf.py "$source_dir" "$MODEL_DIR" "$out.partial" >&2
    mv "$out.partial" "$out"
fi
echo "$out"
