#!/usr/bin/env bash
# One bounded call on the lent GPU machine (device tool; docs/benchmarks.md "GPU"): its own stack (Python 3.12,
# torch 2.11, Triton 3.6, transformers 5.17), no network. Prepare here first: `bash benchmarks/gpu/prepare.sh
# --leave-behind`, then run `bash benchmarks/gpu_check.sh` with carry [".whl"], then `prepare.sh --restore`.
# Stages, each with its own time limit inside one budget (GPU_CHECK_BUDGET_S, default 480 s), each recorded
# with its exit status even when it fails: environment and the GPU's ceilings; the engine's gpu-marked tests
# (CUDA graphs golden, parity on CUDA for every architecture, sampler, the CUDA C++ extension's build and
# dispatch); a 1B-shaped bf16 Llama's decode step and prefill (bench_latency.py); transformers' generate on
# the same checkpoint; serving at concurrency 1/32/128 with CUDA graphs and with --enforce-eager, GPU memory
# sampled, one profiled window of decode steps; then the Triton kernel tests with the time left.
# GPU_CHECK_STAGES="install environment ..." runs only the stages named (a rerun of what failed).
# Comes back under $OUT (at most 8 files): results.json, summary.txt, logs.tar.gz, worker-trace.json.gz.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT="${OUT:-/tmp/rapid_llm-gpu-check}"
WORK=/tmp/rapid_llm-gpu-work
MODEL="$WORK/llama-1b"
PORT=31888
DEADLINE=$((SECONDS + ${GPU_CHECK_BUDGET_S:-480}))
RESERVE_S=15  # kept for the report at the end
rm -rf "$WORK" && mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1 RAPID_LLM_EXTENSION_CACHE="$WORK/torch_extensions"

report() { python3 benchmarks/gpu/report.py --work "$WORK" --out "$OUT" >/dev/null 2>&1; }

# stage NAME LIMIT_S CMD...: runs CMD under min(LIMIT_S, what the budget has left), output in $WORK/NAME.log,
# one line "NAME<TAB>exit<TAB>seconds" in stages.tsv (exit 124: timed out; 125: no time left to start).
stage() {
    local name=$1 limit=$2 left rc start=$SECONDS
    shift 2
    [[ -n "${GPU_CHECK_STAGES:-}" && " $GPU_CHECK_STAGES " != *" $name "* ]] && return 0
    left=$((DEADLINE - RESERVE_S - SECONDS))
    ((limit > left)) && limit=$left
    if ((limit < 5)); then
        rc=125
    else
        echo "== $name (limit ${limit} s)"
        # timeout signals its whole process group, so a stage's servers and test workers end with it.
        timeout --kill-after=5 "$limit" bash -c '"$@"' "$name" "$@" >"$WORK/$name.log" 2>&1
        rc=$?
        tail -n 3 "$WORK/$name.log"
    fi
    printf '%s\t%d\t%d\n' "$name" "$rc" $((SECONDS - start)) >>"$WORK/stages.tsv"
    echo "== $name: exit $rc after $((SECONDS - start)) s"
    report
    return "$rc"
}

install_wheels() {
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
}

environment() {
    nvidia-smi
    python3 - <<'PY'
import importlib.metadata as md
for name in ("torch", "triton", "transformers", "tokenizers", "safetensors", "numpy", "pytest", "pytest-xdist",
             "pyzmq", "msgspec", "starlette", "uvicorn", "xgrammar", "openai", "pydantic", "typing-extensions"):
    try:
        print(f"{name} {md.version(name)}")
    except md.PackageNotFoundError:
        print(f"{name} MISSING")
import rapid_llm, torch
print("rapid_llm imports; cuda", torch.version.cuda, torch.cuda.get_device_name())
PY
    python3 benchmarks/gpu/ceilings.py --json "$WORK/ceilings.json"
}

# Llama-3.2-1B's shape (bf16 weights 2.47 GB, tied embeddings) with random weights and a word-per-id tokenizer
# of the same 128256 ids, so every sampled token streams as text (TTFT and TPOT mean what they say).
build_model() {
    python3 - "$MODEL" <<'PY'
import sys, torch
from rapid_llm.utils.tiny_checkpoint import build_tiny_checkpoint, build_word_tokenizer
torch.set_num_threads(8)
build_tiny_checkpoint(sys.argv[1], "LlamaForCausalLM", dtype=torch.bfloat16, with_tokenizer=False, hidden_size=2048,
                      intermediate_size=8192, num_hidden_layers=16, num_attention_heads=32, num_key_value_heads=8,
                      head_dim=64, vocab_size=128256, tie_word_embeddings=True, max_position_embeddings=8192)
build_word_tokenizer(sys.argv[1], 128256, model_max_length=8192)
PY
}

wait_model() { while [[ ! -f "$WORK/model-built" ]]; do kill -0 "$builder" 2>/dev/null || return 1; sleep 1; done; }

gpu_tests() { python3 -m pytest -m gpu -q -p no:cacheprovider -n "$1" "${@:2}"; }

serve_and_bench() {
    local mode=$1 flags=() server
    pkill -TERM -f rapid_llm.launch_server && sleep 5  # one left by a stage that timed out
    [[ "$mode" == eager ]] && flags=(--enforce-eager)
    if [[ "$mode" == graphs ]]; then
        # Worker steps 40..103 of the first run below (concurrency 1) are traced (step_profiler.py).
        export RAPID_LLM_TORCH_PROFILER_DIR="$WORK/trace" RAPID_LLM_PROFILE_STEPS="40:64"
    fi
    python3 -m rapid_llm.launch_server --model "$MODEL" --port "$PORT" ${flags[@]+"${flags[@]}"} \
        >"$WORK/server-$mode.log" 2>&1 &
    server=$!
    unset RAPID_LLM_TORCH_PROFILER_DIR RAPID_LLM_PROFILE_STEPS
    until python3 -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=2)" 2>/dev/null; do
        kill -0 "$server" 2>/dev/null || { echo "server ($mode) exited before /health"; tail -n 40 "$WORK/server-$mode.log"; return 1; }
        sleep 0.5
    done
    local bench=(python3 benchmarks/bench_serving.py --base-url "http://127.0.0.1:$PORT" --dataset-name random
                 --random-input-len 512 --random-output-len 128 --temperature 0 --ignore-eos --disable-tqdm)
    [[ "$mode" == graphs ]] && "${bench[@]}" --num-prompts 2 --max-concurrency 1
    for concurrency in 1 32 128; do
        "${bench[@]}" --num-prompts $((concurrency == 1 ? 16 : 2 * concurrency)) --max-concurrency "$concurrency" \
            --save-result --result-dir "$WORK" --result-filename "serving-$mode-c$concurrency.json" || break
    done
    kill -TERM "$server"
    wait "$server"
}

parallel_check() {
    local gpus
    gpus=$(nvidia-smi --list-gpus | wc -l)
    if ((gpus < 2)); then
        echo "skipped: $gpus GPU visible, TP/DP over NCCL need 2"
        return 0
    fi
    python3 -m pytest tests/distributed/test_tp_golden.py tests/distributed/test_dp_offline.py -q -p no:cacheprovider
}

export OUT WORK MODEL PORT
export -f install_wheels environment build_model wait_model gpu_tests serve_and_bench parallel_check
stage install 60 install_wheels
export PYTHONPATH="/tmp/site:$PWD"
stage environment 60 environment
{ build_model && touch "$WORK/model-built"; } >"$WORK/build-model.log" 2>&1 &
export builder=$!
# The extension compiles once (a file lock holds the other workers that need it) while the parity tests run.
stage tests-engine 150 gpu_tests 8 tests/models/test_cuda_graphs.py tests/models/test_cuda_parity.py \
    tests/unit/test_sampler.py tests/kernels/test_decode_graph_attention.py tests/kernels/test_cuda_cpp.py
stage build-model 90 wait_model
# Prefix caching off: every iteration repeats the same prompts, which would otherwise be cache hits.
stage latency-decode 90 python3 benchmarks/bench_latency.py --model "$MODEL" --disable-prefix-caching --batch-size 1 \
    --input-len 128 --output-len 128 --num-iters-warmup 1 --num-iters 5 --save-result --result-dir "$WORK" \
    --result-filename latency-decode.json
stage latency-prefill 90 python3 benchmarks/bench_latency.py --model "$MODEL" --disable-prefix-caching --batch-size 8 \
    --input-len 2048 --output-len 2 --num-iters-warmup 1 --num-iters 5 --save-result --result-dir "$WORK" \
    --result-filename latency-prefill.json
stage hf-generate 60 python3 benchmarks/gpu/hf_generate.py --model "$MODEL" --input-len 128 --output-len 128 \
    --json "$WORK/hf-generate.json"
stage serving-graphs 120 serve_and_bench graphs
stage serving-eager 100 serve_and_bench eager
stage parallel 60 parallel_check
stage tests-kernels-core 600 gpu_tests 16 tests/kernels/test_attention_triton.py tests/kernels/test_triton_ops.py \
    tests/kernels/test_triton_fused_moe.py tests/kernels/test_attention_mla_triton.py
stage tests-kernels-rest 600 gpu_tests 16 tests/kernels --ignore=tests/kernels/test_cuda_cpp.py \
    --ignore=tests/kernels/test_decode_graph_attention.py --ignore=tests/kernels/test_attention_triton.py \
    --ignore=tests/kernels/test_triton_ops.py --ignore=tests/kernels/test_triton_fused_moe.py \
    --ignore=tests/kernels/test_attention_mla_triton.py
kill "$builder" 2>/dev/null
python3 benchmarks/gpu/step_gaps.py "$WORK"/trace/worker-rank0.json.gz --json "$WORK/step-gaps.json" \
    >"$WORK/step-gaps.log" 2>&1
cp "$WORK"/trace/worker-rank0.json.gz "$OUT/worker-trace.json.gz" 2>/dev/null
report
tar -czf "$OUT/logs.tar.gz" -C "$WORK" --exclude=llama-1b --exclude=torch_extensions --exclude=trace .
cat "$OUT/summary.txt"
