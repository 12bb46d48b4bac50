#!/usr/bin/env bash
# Train the demo family in order -- target, draft, then moe upcycled from the exported draft, then the one-layer
# draft and its distillation from the exported target (packaged as demo-draft-1l) -- at
# nice 19, so it only takes CPU that nothing else wants. Rerunning resumes every preset from its work
# directory (a finished one only re-exports). Arguments after ROOT go to every train command, e.g.
# `--max-minutes 30` to cap each run (the schedule then continues on the next rerun).
# Usage: tools/demo_model/train_all.sh [ROOT=/work/demo_train] [train options...]
set -euo pipefail
root=${1:-/work/demo_train}
shift || true
python=${PYTHON:-python}
cd "$(dirname "$0")/../.."
mkdir -p "$root"

run() {
    local name=$1
    shift
    nice -n 19 "$python" -m tools.demo_model.train --preset "$name" --work-dir "$root/$name/work" \
        --out "$root/$name/model" "$@" >>"$root/$name.log" 2>&1
}

run target "$@"
run draft "$@"
run moe --init-from "$root/draft/model" "$@"
run draft-1l "$@"
run draft-1l-kd --init-from "$root/draft-1l/model" --teacher "$root/target/model" "$@"
