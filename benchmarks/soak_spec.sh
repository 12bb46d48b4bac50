#!/usr/bin/env bash
# Speculative-decoding soak (issue 15): one server with n-gram speculation (adaptive off at its defaults) under
# high concurrency for DURATION seconds. Rounds alternate workload A (greedy code completion from the held-out
# files) and B (temperature 1.0, seed 0 on every request), PROMPTS requests each at CONCURRENCY, each a
# bench_serving run with --save-detailed, which also samples the server's RSS and reads the spec-decode
# counters. benchmarks/soak_spec.py then checks every response from round 3 on against round 2's for its
# workload (greedy and seeded requests must repeat exactly; round 1 fills the prefix cache), that no request
# failed, and that each server process's RSS is flat; it writes summary.json and exits 1 if the soak failed.
#
#   usage: benchmarks/soak_spec.sh DURATION_S [OUT_DIR]
#   env: METHOD=ngram (off: the same soak without speculation, the control for memory), MODEL=demo-target, K=3,
#        CONCURRENCY=32, PROMPTS=64, OUTPUT_LEN=128, MAX_GROWTH_MIB=32,
#        SPEC_EXTRA (JSON fields merged into the speculative config), SERVER_ARGS (extra launch flags)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/common/spec_server.sh
source benchmarks/common/spec_server.sh
DURATION="$1"
OUT="${2:-benchmark-results/soak-spec-$(date +%Y%m%d-%H%M%S)}"
METHOD="${METHOD:-ngram}" MODEL="${MODEL:-demo-target}" K="${K:-3}" CONCURRENCY="${CONCURRENCY:-32}" PROMPTS="${PROMPTS:-64}"
OUTPUT_LEN="${OUTPUT_LEN:-128}" MAX_GROWTH_MIB="${MAX_GROWTH_MIB:-32}"
PORT=31671
mkdir -p "$OUT"
python3 benchmarks/spec_decode_workloads.py code "$OUT/workload-A.jsonl"
python3 benchmarks/spec_decode_workloads.py open "$OUT/workload-B.jsonl"

spec=""
[ "$METHOD" != off ] && spec="{\"method\": \"$METHOD\", \"num_speculative_tokens\": $K${SPEC_EXTRA:+, $SPEC_EXTRA}}"
server=""
trap 'kill -TERM "$server" 2>/dev/null; wait "$server" || true' EXIT
start_spec_server "$OUT/server.log" "$spec"

run() {  # run WORKLOAD ROUND
    bench_spec_workload "$1" "$1-$2" --resource-interval 2 --save-detailed
}

end=$((SECONDS + DURATION))
round=1
while [ "$SECONDS" -lt "$end" ]; do
    run A "$round"
    run B "$round"
    kill -0 "$server" 2>/dev/null || { echo "the server died in round $round" >&2; exit 1; }
    round=$((round + 1))
done
python3 benchmarks/soak_spec.py "$OUT" --max-growth-mib "$MAX_GROWTH_MIB" > "$OUT/summary.txt" || status=$?
tail -1 "$OUT/summary.txt"
exit "${status:-0}"
