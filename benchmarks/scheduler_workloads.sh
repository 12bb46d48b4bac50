#!/usr/bin/env bash
# The scheduler's own workloads in docs/benchmarks.md ("Scheduler workloads"), each an A/B on one machine:
#  batching  continuous batching (bench_serving.py, --max-concurrency B) vs static batching emulated on the
#            client (bench_static_batching.py: a batch of B, wait for all of it, the next), same server, on
#            a mixed long/short random workload; run in interleaved pairs, the prefix cache flushed before each;
#  chunked   short prompts decoding 128 tokens at concurrency 4 while 1500-token prompts arrive at 0.5/s, on a
#            server with a small token budget (prompts chunked) and one >= the longest prompt (not chunked);
#  prefix    benchmarks/prefix_cache_ab.sh (P50/P90/P99 and the hit rate sampled every second);
#  prefix-order  prefix_cache_ab.sh's shared-prompt workload with every request's TTFT saved, caching on / off
#            in interleaved pairs (one server each), for TTFT by arrival order and cold vs warm requests
#            (workload_summary.py prefix-order); WARMUP=1 sends 8 short requests before each run.
# Ends with benchmarks/workload_summary.py scheduler OUT_DIR > OUT_DIR/summary.md.
#
#   usage: benchmarks/scheduler_workloads.sh MODEL_DIR [OUT_DIR]
#   WORKLOADS   which to run (default "batching chunked prefix"; prefix-order only when named)
#   PAIRS       A/B pairs per workload (default 2)
#   BUDGETS     token budgets of the chunked workload, small then large (default "256 2048")
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$1"
OUT="${2:-benchmark-results/scheduler-workloads-$(date +%Y%m%d-%H%M%S)}"
WORKLOADS="${WORKLOADS:-batching chunked prefix}"
PAIRS="${PAIRS:-2}"
BUDGETS="${BUDGETS:-256 2048}"
PORT=31667
URL="http://127.0.0.1:$PORT"
PERCENTILES=(--percentile-metrics ttft,tpot,itl,e2el,client_queue_time --metric-percentiles 50,90,99)
mkdir -p "$OUT"

start_server() {  # start_server ARGS... -> sets $server once /health answers
    python3 -m rapid_llm.launch_server --model "$MODEL" --port "$PORT" --log-level warning "$@" &
    server=$!
    until curl -sf "$URL/health" >/dev/null 2>&1; do
        kill -0 "$server" 2>/dev/null || { echo "the server exited before becoming healthy" >&2; exit 1; }
        sleep 0.5
    done
}
stop_server() { kill -TERM "$server"; wait "$server" || true; }
flush() { curl -sf -X POST "$URL/flush_cache" >/dev/null; }

for workload in $WORKLOADS; do
    case "$workload" in
    batching)
        start_server
        mixed=(--dataset-name random --random-input-len 256 --random-output-len 128 --random-range-ratio 0.9
               --num-prompts 64 --max-concurrency 8 --temperature 0 --ignore-eos --disable-tqdm --save-result
               --save-detailed --result-dir "$OUT/batching" "${PERCENTILES[@]}")
        python3 benchmarks/bench_serving.py --base-url "$URL" --dataset-name random --random-input-len 64 \
            --random-output-len 16 --num-prompts 8 --seed 99 --temperature 0 --disable-tqdm >/dev/null  # warm-up
        for pair in $(seq 1 "$PAIRS"); do
            flush
            python3 benchmarks/bench_serving.py --base-url "$URL" "${mixed[@]}" --label continuous \
                --result-filename "continuous-$pair.json"
            flush
            python3 benchmarks/bench_static_batching.py --base-url "$URL" "${mixed[@]}" --label static \
                --result-filename "static-$pair.json"
        done
        stop_server
        ;;
    chunked)
        for pair in $(seq 1 "$PAIRS"); do
            for budget in $BUDGETS; do
                start_server --max-num-batched-tokens "$budget"
                python3 benchmarks/bench_serving.py --base-url "$URL" --dataset-name random --random-input-len 64 \
                    --random-output-len 16 --num-prompts 8 --seed 99 --temperature 0 --disable-tqdm >/dev/null
                python3 benchmarks/bench_serving.py --base-url "$URL" --dataset-name random --random-input-len 64 \
                    --random-output-len 128 --random-range-ratio 0 --num-prompts 64 --max-concurrency 4 --seed 1 \
                    --temperature 0 --disable-tqdm --label "decode-budget$budget" "${PERCENTILES[@]}" \
                    --save-result --save-detailed --result-dir "$OUT/chunked" \
                    --result-filename "decode-budget$budget-$pair.json" &
                decodes=$!
                sleep 1
                python3 benchmarks/bench_serving.py --base-url "$URL" --dataset-name random --random-input-len 1500 \
                    --random-output-len 8 --random-range-ratio 0 --num-prompts 6 --request-rate 0.5 --seed 2 \
                    --temperature 0 --disable-tqdm --label "prefill-budget$budget" "${PERCENTILES[@]}" \
                    --save-result --save-detailed --result-dir "$OUT/chunked" \
                    --result-filename "prefill-budget$budget-$pair.json" >/dev/null
                wait "$decodes"
                stop_server
            done
        done
        ;;
    prefix)
        benchmarks/prefix_cache_ab.sh "$MODEL" "$OUT/prefix"
        ;;
    prefix-order)
        suffix=""
        [ "${WARMUP:-0}" = 1 ] && suffix="-warm"
        for pair in $(seq 1 "$PAIRS"); do
            for mode in on off; do
                flag=()
                [ "$mode" = off ] && flag=(--disable-prefix-caching)
                start_server "${flag[@]}"
                if [ "${WARMUP:-0}" = 1 ]; then
                    python3 benchmarks/bench_serving.py --base-url "$URL" --dataset-name random --random-input-len 64 \
                        --random-output-len 16 --num-prompts 8 --seed 99 --temperature 0 --disable-tqdm >/dev/null
                    flush
                fi
                python3 benchmarks/bench_serving.py --base-url "$URL" --dataset-name generated-shared-prefix \
                    --gsp-num-groups 8 --gsp-prompts-per-group 8 --gsp-system-prompt-len 512 --gsp-question-len 64 \
                    --gsp-output-len 32 --max-concurrency 8 --temperature 0 --ignore-eos --disable-tqdm \
                    --label "gsp-$mode" "${PERCENTILES[@]}" --save-result --save-detailed \
                    --result-dir "$OUT/prefix-order" --result-filename "caching-$mode$suffix-$pair.json" >/dev/null
                stop_server
            done
        done
        ;;
    *) echo "unknown workload $workload (batching, chunked, prefix, prefix-order)" >&2; exit 2 ;;
    esac
done
python3 benchmarks/workload_summary.py scheduler "$OUT" | tee "$OUT/summary.md"
