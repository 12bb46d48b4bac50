#!/usr/bin/env bash
# Train the demo family in order -- target, draft, then moe upcycled from the exported target -- at
# nice 19. Each preset has a wall-clock cap; rerunning the script resumes every preset from its work
# directory (a finished one only re-exports). Usage: tools/demo_model/train_all.sh [ROOT=/work/demo_train]
set -euo pipefail
root=${1:-/work/demo_train}
python=${PYTHON:-python}
cd "$(dirname "$0")/../.."
mkdir -p "$root"

run() {
    local name=$1
    shift
    nice -n 19 "$python" -m tools.demo_model.train --preset "$name" --work-dir "$root/$name/work" \
        --out "$root/$name/model" "$@" >>"$root/$name.log" 2>&1
}

run target --max-minutes 50
run draft --max-minutes 12
run moe --init-from "$root/target/model" --max-minutes 28
