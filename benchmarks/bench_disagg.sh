#!/usr/bin/env bash
# Prefill/decode disaggregation measured (docs/disaggregation.md, "Measured"), two workloads:
#  mixed     short prompts decoding (64 in, 128 out, 4 at a time) while long prompts arrive (1500 in, 8 out,
#            0.25/s): colocated (one instance on both cores) vs 1P1D (a prefill instance on core 0, a decode
#            instance on core 1: the same hardware) behind `python -m rapid_llm.router`; per request class TTFT,
#            TPOT and ITL percentiles and goodput under $SLO (bench_serving.py results), PAIRS times each.
#  transfer  the prefill and decode instances in two network namespaces joined by a veth pair whose both ends
#            `tc` rate-limits (tbf; this kernel has no netem, so no added delay or loss), long prompts through the
#            router one at a time; the decode instance's kv_transfer_bytes / kv_transfer_seconds counters give
#            the transfer throughput at each link speed in $RATES. Needs root (ip netns, tc).
# Ends with benchmarks/disagg_summary.py OUT_DIR > OUT_DIR/summary.md.
#
#   usage: benchmarks/bench_disagg.sh MODEL_DIR [OUT_DIR]
#   WORKLOADS  default "mixed transfer"
#   PAIRS      colocated/1P1D pairs of the mixed workload (default 2)
#   RATES      link speeds of the transfer workload (default "100mbit 1gbit 10gbit")
#   SLO        goodput SLOs in ms (default "ttft:3000 tpot:150")
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$1"
OUT="${2:-benchmark-results/disagg-$(date +%Y%m%d-%H%M%S)}"
WORKLOADS="${WORKLOADS:-mixed transfer}"
PAIRS="${PAIRS:-2}"
RATES="${RATES:-100mbit 1gbit 10gbit}"
read -r -a SLO <<< "${SLO:-ttft:3000 tpot:150}"
PORT=31700
PERCENTILES=(--percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99)
mkdir -p "$OUT"
grep -o -w -E 'avx2|avx512f|avx512_bf16|amx_tile|amx_bf16' /proc/cpuinfo | sort -u | tr '\n' ' ' > "$OUT/cpu_flags.txt"
pids=()

# wait_up URL PID [NETNS]: until URL answers (inside NETNS when given); fail at once if PID exits.
wait_up() {
    local run=()
    [ -n "${3:-}" ] && run=(ip netns exec "$3")
    for _ in $(seq 1 600); do
        "${run[@]}" curl -sf "$1" >/dev/null 2>&1 && return 0
        kill -0 "$2" 2>/dev/null || { echo "the process serving $1 exited; see $OUT/*.log" >&2; return 1; }
        sleep 0.5
    done
    echo "$1 did not answer" >&2
    return 1
}
stop_all() {
    for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
    for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
    pids=()
}
cleanup() {
    stop_all
    ip netns del rl-pd-p 2>/dev/null || true
    ip netns del rl-pd-d 2>/dev/null || true
}
trap cleanup EXIT

# serve NAME NETNS CPUS THREADS ARGS...: a launch_server in the background (NETNS/CPUS "-" for none).
serve() {
    local name="$1" netns="$2" cpus="$3" threads="$4"
    shift 4
    local run=()
    [ "$netns" != - ] && run+=(ip netns exec "$netns")
    [ "$cpus" != - ] && run+=(taskset -c "$cpus")
    OMP_NUM_THREADS="$threads" "${run[@]}" python3 -m rapid_llm.launch_server --model "$MODEL" --log-level warning \
        "$@" > "$OUT/$name.log" 2>&1 &
    pids+=($!)
}
route() {  # route NETNS PREFILL_URL DECODE_URL
    local run=()
    [ "$1" != - ] && run=(ip netns exec "$1")
    "${run[@]}" python3 -m rapid_llm.router --prefill "$2" --decode "$3" --port "$PORT" --log-level warning \
        > "$OUT/router.log" 2>&1 &
    pids+=($!)
}
producer() { echo "{\"kv_role\": \"kv_producer\", \"kv_ip\": \"$1\", \"kv_port\": $((PORT + 11))}"; }
consumer='{"kv_role": "kv_consumer"}'
RUN_IN=()  # the transfer workload's client runs in the decode instance's namespace
bench() {  # bench LABEL FILE ARGS...: bench_serving.py against the router (or colocated instance) on $PORT
    local label="$1" file="$2"
    shift 2
    "${RUN_IN[@]}" python3 benchmarks/bench_serving.py --base-url "http://127.0.0.1:$PORT" --temperature 0 --ignore-eos \
        --disable-tqdm --label "$label" "${PERCENTILES[@]}" --goodput "${SLO[@]}" --save-result --save-detailed \
        --result-dir "$OUT/$WORKLOAD_DIR" --result-filename "$file" "$@"
}
mixed_run() {  # mixed_run MODE PAIR: the decodes and the long prompts, side by side
    python3 benchmarks/bench_serving.py --base-url "http://127.0.0.1:$PORT" --dataset-name random \
        --random-input-len 64 --random-output-len 16 --num-prompts 4 --seed 99 --temperature 0 --disable-tqdm \
        > /dev/null  # warm-up
    bench "decode-$1" "decode-$1-$2.json" --dataset-name random --random-input-len 64 --random-output-len 128 \
        --random-range-ratio 0 --num-prompts 32 --max-concurrency 4 --seed 1 > /dev/null &
    local decodes=$!
    sleep 2
    bench "long-$1" "long-$1-$2.json" --dataset-name random --random-input-len 1500 --random-output-len 8 \
        --random-range-ratio 0 --num-prompts 6 --request-rate 0.25 --seed 2 > /dev/null
    wait "$decodes"
}

for WORKLOAD in $WORKLOADS; do
    WORKLOAD_DIR="$WORKLOAD"
    case "$WORKLOAD" in
    mixed)
        for pair in $(seq 1 "$PAIRS"); do
            serve colocated - - 2 --port "$PORT"
            wait_up "http://127.0.0.1:$PORT/health" "${pids[-1]}"
            mixed_run colocated "$pair"
            stop_all
            serve prefill - 0 1 --port $((PORT + 1)) --kv-transfer-config "$(producer 127.0.0.1)"
            serve decode - 1 1 --port $((PORT + 2)) --kv-transfer-config "$consumer"
            wait_up "http://127.0.0.1:$((PORT + 1))/health" "${pids[-2]}"
            wait_up "http://127.0.0.1:$((PORT + 2))/health" "${pids[-1]}"
            route - "http://127.0.0.1:$((PORT + 1))" "http://127.0.0.1:$((PORT + 2))"
            wait_up "http://127.0.0.1:$PORT/health" "${pids[-1]}"
            mixed_run pd "$pair"
            stop_all
        done
        ;;
    transfer)
        ip netns add rl-pd-p
        ip netns add rl-pd-d
        ip link add rl-pd-vp type veth peer name rl-pd-vd
        ip link set rl-pd-vp netns rl-pd-p
        ip link set rl-pd-vd netns rl-pd-d
        ip -n rl-pd-p addr add 10.123.0.1/24 dev rl-pd-vp
        ip -n rl-pd-d addr add 10.123.0.2/24 dev rl-pd-vd
        for ns in rl-pd-p rl-pd-d; do ip -n "$ns" link set lo up; done
        ip -n rl-pd-p link set rl-pd-vp up
        ip -n rl-pd-d link set rl-pd-vd up
        for rate in $RATES; do
            for end in "rl-pd-p rl-pd-vp" "rl-pd-d rl-pd-vd"; do
                read -r ns dev <<< "$end"
                ip netns exec "$ns" tc qdisc replace dev "$dev" root tbf rate "$rate" burst 4mb latency 200ms
            done
            serve prefill rl-pd-p - 1 --host 10.123.0.1 --port $((PORT + 1)) --kv-transfer-config \
                "$(producer 10.123.0.1)"
            serve decode rl-pd-d - 1 --port $((PORT + 2)) --kv-transfer-config "$consumer"
            wait_up "http://10.123.0.1:$((PORT + 1))/health" "${pids[-2]}" rl-pd-d
            wait_up "http://127.0.0.1:$((PORT + 2))/health" "${pids[-1]}" rl-pd-d
            route rl-pd-d "http://10.123.0.1:$((PORT + 1))" "http://127.0.0.1:$((PORT + 2))"
            wait_up "http://127.0.0.1:$PORT/health" "${pids[-1]}" rl-pd-d
            RUN_IN=(ip netns exec rl-pd-d)
            bench "link-$rate" "link-$rate.json" --dataset-name random --random-input-len 1500 --random-output-len 4 \
                --random-range-ratio 0 --num-prompts 8 --max-concurrency 1 --seed 3 > /dev/null
            RUN_IN=()
            mkdir -p "$OUT/transfer"
            ip netns exec rl-pd-d curl -sf "http://127.0.0.1:$((PORT + 2))/metrics" | grep '^rapid_llm:kv_transfer' \
                > "$OUT/transfer/metrics-$rate.txt"
            stop_all
        done
        ;;
    *) echo "unknown workload $WORKLOAD (mixed, transfer)" >&2; exit 2 ;;
    esac
done
python3 benchmarks/disagg_summary.py "$OUT" > "$OUT/summary.md"
cat "$OUT/summary.md"
