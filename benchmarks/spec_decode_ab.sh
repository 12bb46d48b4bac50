#!/usr/bin/env bash
# Speculative decoding speed, issue 15's workloads (docs/spec_decode/README.md, Speed workloads): for each of
# PAIRS rounds and each method of METHODS in turn (interleaved, each round starting one method later, so the
# machine's drift spreads over all arms),
# one server with that --speculative-config runs
#   A: code completion from the demo models' held-out files (80 windows of ~1200 characters), greedy,
#      128 output tokens;
#   B: open generation from each held-out file's first line (44 prompts), temperature 1.0, 128 tokens,
# both with ignore_eos, seed 0 on every request (with ngram a seeded request draws the same tokens with
# speculation on and off; the draft model's rejection sampling keeps only the distribution on B), PROMPTS
# requests at CONCURRENCY. Each server first runs each
# workload once untimed (WARMUP=1): on CPU every new batch shape costs a first-call set-up (oneDNN primitives),
# which verification steps, with their varying token counts, hit far more often than plain decoding -- a cold
# run measured ngram 10x slower than a warm one. The summary is each arm's mean output throughput and median
# TPOT over the rounds, the ratio to `off`, and acceptance.
#
#   usage: benchmarks/spec_decode_ab.sh [OUT_DIR]
#   env: METHODS="off ngram" (draft_model drafts with DRAFT; draft_model@NAME with the demo draft NAME, e.g.
#        draft_model@demo-draft-1l, so several drafts compare in one run), MODEL=demo-target, DRAFT=demo-draft, K=3,
#        PAIRS=3, PROMPTS=80, CONCURRENCY=8, OUTPUT_LEN=128, WORKLOADS="A B", WARMUP=1, SPEC_EXTRA (JSON fields merged into
#        every speculative config, e.g. '"acceptance_threshold": 0'), SERVER_ARGS (extra launch flags)
set -euo pipefail
cd "$(dirname "$0")/.."
# shellcheck source=benchmarks/common/spec_server.sh
source benchmarks/common/spec_server.sh
OUT="${1:-benchmark-results/spec-decode-$(date +%Y%m%d-%H%M%S)}"
METHODS="${METHODS:-off ngram}" MODEL="${MODEL:-demo-target}" DRAFT="${DRAFT:-demo-draft}" K="${K:-3}"
PAIRS="${PAIRS:-3}" PROMPTS="${PROMPTS:-80}" CONCURRENCY="${CONCURRENCY:-8}" OUTPUT_LEN="${OUTPUT_LEN:-128}"
WORKLOADS="${WORKLOADS:-A B}" WARMUP="${WARMUP:-1}"
PORT=31668
mkdir -p "$OUT"
python3 benchmarks/spec_decode_workloads.py code "$OUT/workload-A.jsonl"
python3 benchmarks/spec_decode_workloads.py open "$OUT/workload-B.jsonl"

spec_config() {  # spec_config METHOD: the --speculative-config JSON ("" for off)
    local extra="${SPEC_EXTRA:+, $SPEC_EXTRA}"
    case "$1" in
        off) echo "" ;;
        draft_model) echo "{\"method\": \"draft_model\", \"model\": \"$DRAFT\", \"num_speculative_tokens\": $K$extra}" ;;
        draft_model@*) echo "{\"method\": \"draft_model\", \"model\": \"${1#draft_model@}\", \"num_speculative_tokens\": $K$extra}" ;;
        *) echo "{\"method\": \"$1\", \"num_speculative_tokens\": $K$extra}" ;;
    esac
}

server=""
stop_server() {
    if [ -n "$server" ]; then kill -TERM "$server" 2>/dev/null || true; wait "$server" 2>/dev/null || true; fi
    server=""
}
trap stop_server EXIT
start_server() {  # start_server METHOD
    start_spec_server "$OUT/server-$1.log" "$(spec_config "$1")"
}

run() {  # run WORKLOAD LABEL
    bench_spec_workload "$1" "$2" --num-warmups 4 --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,99
}

read -r -a methods <<< "$METHODS"
for i in $(seq 1 "$PAIRS"); do
    # Round i starts at method (i - 1) mod n: no method always runs first (or last) in its round.
    shift_by=$(( (i - 1) % ${#methods[@]} ))
    for method in "${methods[@]:$shift_by}" "${methods[@]:0:$shift_by}"; do
        start_server "$method"
        if [ "$WARMUP" = 1 ]; then
            for workload in $WORKLOADS; do run "$workload" "warmup-$workload-$method-$i"; done
        fi
        for workload in $WORKLOADS; do
            run "$workload" "$workload-$method-$i"
        done
        stop_server
    done
done

python3 - "$OUT" "$PAIRS" "$METHODS" "$WORKLOADS" <<'PY' | tee "$OUT/summary.txt"
import json, statistics, sys
out, pairs, methods, workloads = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4].split()
print("workload  method                 tok/s (mean)  ratio  median TPOT ms  acceptance  mean acc. len  pauses  "
      "gate closes")
for workload in workloads:
    base = None
    for method in methods:
        results = [json.load(open(f"{out}/{workload}-{method}-{i}.json")) for i in range(1, pairs + 1)]
        if any(r["failed"] for r in results):
            sys.exit(f"{workload}-{method}: failed requests in {out}")
        throughput = statistics.mean(r["output_throughput"] for r in results)
        base = base if base is not None else (throughput if method == "off" else None)
        tpot = statistics.median(r["median_tpot_ms"] for r in results)
        spec = [r["spec_decode"] for r in results if r["spec_decode"]]
        drafts = sum(s["num_drafts"] for s in spec)
        draft_tokens = sum(s["num_draft_tokens"] for s in spec)
        accepted = sum(s["num_accepted_tokens"] for s in spec)
        rate = f"{accepted / draft_tokens:.3f}" if draft_tokens else "-"
        length = f"{1 + accepted / drafts:.2f}" if drafts else "-"
        pauses = sum(s["num_disables"] for s in spec) if spec else "-"
        closes = sum(s.get("num_gate_closes", 0) for s in spec) if spec else "-"
        ratio = f"{throughput / base:.3f}" if base else "-"
        print(f"{workload:<9} {method:<22} {throughput:>12.1f}  {ratio:>5}  {tpot:>14.2f}  {rate:>10}  {length:>13}  "
              f"{pauses:>6}  {closes:>11}")
PY
