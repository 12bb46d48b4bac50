#!/usr/bin/env bash
# Build llama.cpp's `llama-server` as a second CPU comparison peer, from the llama.cpp source
# vendored in the llama-cpp-python sdist on PyPI (the only registry reachable here), outside the
# repo. Idempotent: a rerun only builds what is missing. See benchmarks/peers/README.md.
#
#   LLAMA_CPP_DIR   where the sdist is unpacked and built (default: $HOME/.peers/llama-cpp)
#   LLAMA_CPP_PYTHON_VERSION   the sdist's version (default: 0.3.36)
#   PYTHON          an interpreter with pip (default: python3)
#
# Prints the llama.cpp source directory last; the server is build/bin/llama-server inside it and
# the HF-to-GGUF converter is convert_hf_to_gguf.py beside it (see convert_to_gguf.py).
set -euo pipefail

LLAMA_CPP_DIR="${LLAMA_CPP_DIR:-$HOME/.peers/llama-cpp}"
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
PYTHON="${PYTHON:-python3}"
SRC="$LLAMA_CPP_DIR/llama_cpp_python-$VERSION/vendor/llama.cpp"
SERVER="$SRC/build/bin/llama-server"

log() { printf '[setup_llama_cpp] %s\n' "$*" >&2; }

for tool in cmake c++; do
    command -v "$tool" >/dev/null || { log "ERROR: $tool is needed (apt-get install cmake g++)"; exit 1; }
done

mkdir -p "$LLAMA_CPP_DIR"
if [ ! -f "$SRC/CMakeLists.txt" ]; then
    log "downloading the llama-cpp-python $VERSION sdist"
    "$PYTHON" -m pip download --disable-pip-version-check --no-deps --no-binary :all: \
        -d "$LLAMA_CPP_DIR" "llama-cpp-python==$VERSION" >&2
    tar xzf "$LLAMA_CPP_DIR/llama_cpp_python-$VERSION.tar.gz" -C "$LLAMA_CPP_DIR"
fi

if [ ! -x "$SERVER" ]; then
    log "building llama-server (GGML_NATIVE=ON; about 8 min on 2 cores)"
    generator=()
    command -v ninja >/dev/null && generator=(-G Ninja)
    cmake -S "$SRC" -B "$SRC/build" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
        -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
    cmake --build "$SRC/build" --target llama-server -j "$(nproc)" >&2
fi

"$SERVER" --version >&2
log "done: $SERVER"
echo "$SRC"
