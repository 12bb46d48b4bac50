# Sourced by benchmarks/spec_decode_ab.sh and benchmarks/soak_spec.sh: a rapid_llm server per speculative config
# and the bench_serving call both make on their workloads.
# start_spec_server LOG SPEC starts `$MODEL` on `$PORT` with `--speculative-config SPEC` ("" for off) and
# `$SERVER_ARGS`, sets `server` to its pid and returns once /health answers; if the server dies first it prints
# the log's tail and exits 1.
start_spec_server() {
    local log="$1" spec="$2"
    # shellcheck disable=SC2086  # SERVER_ARGS is a list of flags
    python3 -m rapid_llm.launch_server --model "$MODEL" --port "$PORT" --log-level warning \
        ${spec:+--speculative-config "$spec"} ${SERVER_ARGS:-} > "$log" 2>&1 &
    server=$!
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
        kill -0 "$server" 2>/dev/null || { echo "the server exited before becoming healthy ($log):" >&2;
                                           tail -5 "$log" >&2; exit 1; }
        sleep 0.5
    done
}

# bench_spec_workload WORKLOAD LABEL [FLAGS...] runs bench_serving on OUT/workload-WORKLOAD.jsonl (A greedy, B at
# temperature 1.0; every request seeded 0) against that server, saving OUT/LABEL.json and OUT/LABEL.log.
bench_spec_workload() {
    local workload="$1" label="$2" temperature=0
    shift 2
    [ "$workload" = B ] && temperature=1.0
    python3 benchmarks/bench_serving.py --base-url "http://127.0.0.1:$PORT" --dataset-name custom \
        --dataset-path "$OUT/workload-$workload.jsonl" --skip-chat-template --custom-output-len "$OUTPUT_LEN" \
        --num-prompts "$PROMPTS" --max-concurrency "$CONCURRENCY" --ignore-eos --temperature "$temperature" \
        --extra-body '{"seed": 0}' --seed 0 --disable-tqdm --label "$label" --save-result --result-dir "$OUT" \
        --result-filename "$label.json" "$@" > "$OUT/$label.log"
}
