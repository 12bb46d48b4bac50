#!/usr/bin/env bash
# Multi-LoRA serving cost (docs/lora.md, "Measured"): output tok/s at concurrency $CONCURRENCY of the base model
# served without --enable-lora ("base"), then of one --enable-lora server whose requests name 0 adapters (the
# base model through the wrapped linears), 1, 4 and 16 adapters spread evenly (bench_serving.py --lora-names);
# ROUNDS interleaved rounds of the whole sequence. The 16 adapters are random PEFT folders of rank $RANK on every
# attention and MLP projection (benchmarks/common/lora_adapters.py), all named at start; --max-loras 16 so no
# request waits for a slot. Ends with benchmarks/lora_summary.py OUT_DIR > OUT_DIR/summary.md.
#
#   usage: benchmarks/bench_lora.sh MODEL_DIR [OUT_DIR]
#   ROUNDS       interleaved rounds (default 2)
#   CONCURRENCY  requests in flight (default 8)
#   NUM_PROMPTS  per run (default 48); RANK (default 16); INPUT_LEN / OUTPUT_LEN (default 128 / 64)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$1"
OUT="${2:-benchmark-results/lora-$(date +%Y%m%d-%H%M%S)}"
ROUNDS="${ROUNDS:-2}"
CONCURRENCY="${CONCURRENCY:-8}"
NUM_PROMPTS="${NUM_PROMPTS:-48}"
RANK="${RANK:-16}"
INPUT_LEN="${INPUT_LEN:-128}"
OUTPUT_LEN="${OUTPUT_LEN:-64}"
PORT=31800
mkdir -p "$OUT/adapters"
grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_tile|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/cpu_flags.txt"

python3 - "$MODEL" "$OUT/adapters" "$RANK" <<'PY'
import sys
from pathlib import Path
from benchmarks.common.lora_adapters import ATTENTION, MLP, random_adapter
model, root, rank = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
for index in range(16):
    if not (root / f"l{index}" / "adapter_config.json").is_file():
        random_adapter(model, root / f"l{index}", rank, ATTENTION + MLP, seed=index)
PY
modules=()
for index in $(seq 0 15); do modules+=("l$index=$OUT/adapters/l$index"); done

server=""
stop_server() { [ -n "$server" ] && kill "$server" 2>/dev/null && wait "$server" 2>/dev/null; server=""; }
trap stop_server EXIT
# serve LOG ARGS...: start a server and wait until it answers /health (fail at once if it exits).
serve() {
    local log="$1"; shift
    python3 -m rapid_llm.launch_server --model "$MODEL" --port "$PORT" --log-level warning "$@" > "$OUT/$log.log" 2>&1 &
    server=$!
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        kill -0 "$server" 2>/dev/null || { echo "the server exited; see $OUT/$log.log" >&2; return 1; }
        sleep 0.5
    done
    return 1
}
# bench NAME [--lora-names ...]: one bench_serving.py run, saved as NAME.json
bench() {
    local name="$1"; shift
    python3 benchmarks/bench_serving.py --port "$PORT" --dataset-name random --random-input-len "$INPUT_LEN" \
        --random-output-len "$OUTPUT_LEN" --num-prompts "$NUM_PROMPTS" --max-concurrency "$CONCURRENCY" \
        --temperature 0 --num-warmups 2 --disable-tqdm --save-result --result-dir "$OUT" \
        --result-filename "$name.json" "$@" > "$OUT/$name.txt"
}

for round in $(seq 1 "$ROUNDS"); do
    serve "base-$round"
    bench "base-r$round"
    stop_server
    serve "lora-$round" --enable-lora --max-loras 16 --max-cpu-loras 16 --max-lora-rank "$RANK" \
        --lora-modules "${modules[@]}"
    bench "lora0-r$round"
    bench "lora1-r$round" --lora-names l0
    bench "lora4-r$round" --lora-names l0 l1 l2 l3
    bench "lora16-r$round" --lora-names $(seq -f "l%g" 0 15)
    stop_server
done
python3 benchmarks/lora_summary.py "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
