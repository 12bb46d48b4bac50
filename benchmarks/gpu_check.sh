#!/usr/bin/env bash
# One-call GPU check for a session lent a GPU (device tool): the gpu-marked tests (among them the CUDA
# graph golden test, tests/models/test_cuda_graphs.py: greedy tokens with graphs == --enforce-eager), the
# model parity tests on CUDA, the quantized linear op timings, and a short serving benchmark on a random 100M
# Llama, with CUDA graphs and with --enforce-eager. Output goes to $OUT if set.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/rapid_llm-gpu-check}"
mkdir -p "$OUT"
nvidia-smi | tee "$OUT/nvidia-smi.txt"
python3 -m pip install -q -e ".[test]" 2>&1 | tail -2
# Bounded: the gpu-marked tests include the Triton kernels' CUDA runs (tests/kernels), whose first run
# compiles each kernel specialisation; a hang must not eat the session's device time.
timeout 600 python3 -m pytest tests -m gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.txt"
# The quantized linears (fp8 / int4 / fp4: torch_ref vs the Triton dequantize-GEMM) at a 0.5B model's gate_up
# shape, decode and prefill token counts; bounded like the tests.
timeout 300 python3 benchmarks/bench_ops.py --device cuda --model-shape qwen2.5-0.5b --dtype bf16 --num-tokens 1,16,256 \
    --ops fp8_linear,int4_linear,fp4_linear --json "$OUT/quant-linear-ops.json" 2>&1 | tee "$OUT/quant-linear-ops.txt"
python3 - <<'PY'
import torch
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint
build_tiny_checkpoint("/tmp/gpu-llama-100m", "LlamaForCausalLM", dtype=torch.bfloat16, hidden_size=768,
                      num_hidden_layers=14, num_attention_heads=12, num_key_value_heads=4, intermediate_size=2560,
                      max_position_embeddings=2048)
PY
# mode "graphs": decode steps replayed from CUDA graphs (the default); "eager": --enforce-eager.
for mode in graphs eager; do
    flags=()
    [[ "$mode" == eager ]] && flags=(--enforce-eager)
    python3 -m rapid_llm.launch_server --model /tmp/gpu-llama-100m --port 31888 --log-level info ${flags[@]+"${flags[@]}"} \
        >"$OUT/server-$mode.log" 2>&1 &
    server=$!
    # Bounded: a server that never comes up (or died) must not hang the session's device time.
    deadline=$((SECONDS + 300))
    until curl -sf http://127.0.0.1:31888/health >/dev/null 2>&1; do
        if ((SECONDS >= deadline)) || ! kill -0 "$server" 2>/dev/null; then
            echo "server ($mode) not healthy after $((SECONDS - deadline + 300)) s; last lines of" \
                "$OUT/server-$mode.log:" >&2
            tail -n 50 "$OUT/server-$mode.log" >&2
            kill -TERM "$server" 2>/dev/null
            exit 1
        fi
        sleep 0.5
    done
    for concurrency in 1 32; do
        python3 benchmarks/bench_serving.py --base-url http://127.0.0.1:31888 --dataset-name random \
            --random-input-len 512 --random-output-len 128 --num-prompts 128 --max-concurrency "$concurrency" \
            --temperature 0 --ignore-eos --disable-tqdm --save-result --result-dir "$OUT" \
            --result-filename "serving-$mode-c$concurrency.json" 2>&1 | tee "$OUT/serving-$mode-c$concurrency.txt"
    done
    kill -TERM "$server"; wait "$server"
done
# Tensor and data parallelism over NCCL (docs/parallelism.md): needs 2 GPUs, skipped with a line otherwise.
# The TP golden tests (LLM tensor_parallel_size=2 against transformers), the DP offline test, then
# bench_parallel.py at tp1/tp2/dp2 with the collectives timed (RAPID_LLM_TIME_COLLECTIVES=1 synchronizes around
# each one; CUDA graphs would bypass the timers, hence --enforce-eager). Bounded like the rest.
gpus=$(nvidia-smi --list-gpus 2>/dev/null | wc -l)
if ((gpus >= 2)); then
    timeout 600 python3 -m pytest tests/distributed/test_tp_golden.py tests/distributed/test_dp_offline.py -q \
        -p no:cacheprovider 2>&1 | tee "$OUT/parallel-tests.txt"
    RAPID_LLM_TIME_COLLECTIVES=1 timeout 900 python3 benchmarks/bench_parallel.py --model /tmp/gpu-llama-100m \
        --layouts tp1,tp2,dp2 --input-len 512 --output-len 128 --num-prompts 64 --max-concurrency 16 \
        --server-args "--enforce-eager" --out "$OUT/parallel.json" 2>&1 | tee "$OUT/parallel.txt"
else
    echo "parallel (NCCL) check skipped: $gpus GPU(s) visible, TP/DP need 2" | tee "$OUT/parallel.txt"
fi
