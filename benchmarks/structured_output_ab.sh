#!/usr/bin/env bash
# Structured-output overhead, the numbers in docs/benchmarks.md: one server, PAIRS interleaved runs of
# the same random workload (128 input / 64 output tokens, greedy, ignore_eos) without and with a JSON
# schema on every request (benchmarks/schemas/records.json, response_format json_schema). Interleaving
# spreads the machine's drift over both arms; the summary is the mean of each arm and their ratio.
#
#   usage: benchmarks/structured_output_ab.sh MODEL_DIR [OUT_DIR]
#   env: PAIRS=6 CONCURRENCY=8 PROMPTS=64, SERVER_ARGS (extra launch_server flags, e.g.
#        "--op-backend apply_token_bitmask=xgrammar" to time the library's CPU mask kernel)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$1"
OUT="${2:-benchmark-results/structured-output-$(date +%Y%m%d-%H%M%S)}"
PAIRS="${PAIRS:-6}" CONCURRENCY="${CONCURRENCY:-8}" PROMPTS="${PROMPTS:-64}"
PORT=31667
mkdir -p "$OUT"

# shellcheck disable=SC2086  # SERVER_ARGS is a list of flags
python3 -m rapid_llm.launch_server --model "$MODEL" --port "$PORT" --log-level warning ${SERVER_ARGS:-} &
server=$!
trap 'kill -TERM "$server" 2>/dev/null; wait "$server" || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do
    kill -0 "$server" 2>/dev/null || { echo "the server exited before becoming healthy" >&2; exit 1; }
    sleep 0.5
done

run() {  # run LABEL [bench args]
    python3 benchmarks/bench_serving.py --base-url "http://127.0.0.1:$PORT" --dataset-name random \
        --random-input-len 128 --random-output-len 64 --num-prompts "$PROMPTS" --max-concurrency "$CONCURRENCY" \
        --temperature 0 --seed 1 --num-warmups 8 --disable-tqdm --label "$1" --save-result --result-dir "$OUT" \
        --result-filename "$1.json" "${@:2}" > "$OUT/$1.log"
}
for i in $(seq 1 "$PAIRS"); do
    run "plain-$i"
    run "schema-$i" --json-schema-path benchmarks/schemas/records.json --structured-output-ratio 1.0
done

python3 - "$OUT" "$PAIRS" <<'PY' | tee "$OUT/summary.txt"
import json, statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
def arm(name):
    results = [json.load(open(f"{out}/{name}-{i}.json")) for i in range(1, pairs + 1)]
    if any(r["failed"] for r in results):
        sys.exit(f"{name}: failed requests in {out}")
    return [r["output_throughput"] for r in results], [r["median_tpot_ms"] for r in results]
plain, plain_tpot = arm("plain")
schema, schema_tpot = arm("schema")
print("pair  plain tok/s  schema tok/s  ratio")
for i, (p, s) in enumerate(zip(plain, schema), 1):
    print(f"{i:>4}  {p:>11.1f}  {s:>12.1f}  {s / p:.3f}")
mean_p, mean_s = statistics.mean(plain), statistics.mean(schema)
print(f"mean  {mean_p:>11.1f}  {mean_s:>12.1f}  {mean_s / mean_p:.3f}  (throughput cost {100 * (1 - mean_s / mean_p):.1f} %)")
print(f"median TPOT ms: plain {statistics.median(plain_tpot):.2f}, schema {statistics.median(schema_tpot):.2f}")
PY
