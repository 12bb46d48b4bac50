#!/usr/bin/env bash
# Prefix caching on vs off, the numbers in docs/benchmarks.md:
#  1. generated-shared-prefix workload through bench_serving.py, with the prefix-cache hit rate
#     taken from the server's /metrics counters (hits / queries, in tokens) over the run, and those
#     counters sampled every second during it (benchmarks/metrics_sampler.py: the hit rate over time);
#  2. one ~1000-token prompt sent twice in a row: TTFT of the first and second request.
#
#   usage: [SERVER_ARGS="--state-snapshot-interval 4"] benchmarks/prefix_cache_ab.sh MODEL_DIR [OUT_DIR]
#   (SERVER_ARGS: more flags for both servers, split on spaces)
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL="$1"
OUT="${2:-benchmark-results/prefix-cache-$(date +%Y%m%d-%H%M%S)}"
PORT=31666
mkdir -p "$OUT"

counter() {  # counter NAME -> its value in /metrics (awk reads to the end: an early exit could SIGPIPE curl)
    curl -sf "http://127.0.0.1:$PORT/metrics" | awk -v name="$1" '!found && $1 ~ "^"name"(\\{|$)" {print $2; found = 1}'
}

python3 - "$MODEL" "$OUT/repeat.jsonl" <<'PY'
import json, sys
from transformers import AutoTokenizer
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
words = "the scheduler hands out a token budget every step and the worker computes the batch".split()
text = " ".join(words[i % len(words)] + str(i) for i in range(400))
ids = tokenizer.encode(text)[:1000]
line = json.dumps({"prompt": tokenizer.decode(ids)})
open(sys.argv[2], "w").write(line + "\n" + line + "\n")
PY

for mode in on off; do
    flag=()
    [ "$mode" = off ] && flag=(--disable-prefix-caching)
    read -r -a extra <<< "${SERVER_ARGS:-}"
    python3 -m rapid_llm.launch_server --model "$MODEL" --port "$PORT" --log-level warning "${flag[@]}" "${extra[@]}" &
    server=$!
    until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null 2>&1; do sleep 0.5; done

    queries_before=$(counter rapid_llm:prefix_cache_queries_total); hits_before=$(counter rapid_llm:prefix_cache_hits_total)
    python3 benchmarks/metrics_sampler.py --base-url "http://127.0.0.1:$PORT" --interval 1 \
        --counters rapid_llm:prefix_cache_queries_total rapid_llm:prefix_cache_hits_total \
        --out "$OUT/gsp-caching-$mode-counters.jsonl" &
    sampler=$!
    python3 benchmarks/bench_serving.py --base-url "http://127.0.0.1:$PORT" --dataset-name generated-shared-prefix \
        --gsp-num-groups 8 --gsp-prompts-per-group 8 --gsp-system-prompt-len 512 --gsp-question-len 64 \
        --gsp-output-len 32 --max-concurrency 8 --temperature 0 --ignore-eos --disable-tqdm --label "gsp-$mode" \
        --percentile-metrics ttft,tpot,itl,e2el --metric-percentiles 50,90,99 \
        --save-result --result-dir "$OUT" --result-filename "gsp-caching-$mode.json"
    kill -TERM "$sampler"; wait "$sampler"
    queries=$(counter rapid_llm:prefix_cache_queries_total); hits=$(counter rapid_llm:prefix_cache_hits_total)
    python3 -c "q=$queries-$queries_before; h=$hits-$hits_before; print(f'caching $mode: prefix-cache hit rate {100*h/q if q else 0:.1f}% ({h:.0f} of {q:.0f} prompt tokens)')" \
        | tee "$OUT/gsp-caching-$mode-hit-rate.txt"

    curl -sf -X POST "http://127.0.0.1:$PORT/flush_cache" >/dev/null || true
    python3 benchmarks/bench_serving.py --base-url "http://127.0.0.1:$PORT" --dataset-name custom \
        --dataset-path "$OUT/repeat.jsonl" --skip-chat-template --custom-output-len 1 --num-prompts 2 \
        --disable-shuffle --no-oversample --max-concurrency 1 --temperature 0 --disable-tqdm \
        --label "repeat-$mode" --save-result --save-detailed --result-dir "$OUT" \
        --result-filename "repeat-caching-$mode.json" >/dev/null
    python3 -c "import json; r=json.load(open('$OUT/repeat-caching-$mode.json')); t=r['ttfts']; \
print(f'caching $mode: {r[\"input_lens\"][0]}-token prompt twice: TTFT {1000*t[0]:.1f} ms then {1000*t[1]:.1f} ms (ratio {t[0]/t[1]:.1f}x)')" \
        | tee "$OUT/repeat-caching-$mode.txt"

    kill -TERM "$server"; wait "$server" || true
done
