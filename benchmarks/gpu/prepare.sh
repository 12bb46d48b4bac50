#!/usr/bin/env bash
# Prepares a GPU run (device tool) on this CPU machine: downloads the wheels the lent machine lacks
# (benchmarks/gpu/wheels.txt: cp312, manylinux x86_64, no dependencies resolved there) into the ignored
# folder .whl/, and reports what would travel. The lent machine has no network, so gpu_check.sh installs
# only these files (pip --no-index --no-deps --target). At most 64 MiB travel with a call: the tracked tree
# plus the carried .whl/. The demo models and benchmark-results/ push the tree over that, so
#   benchmarks/gpu/prepare.sh --leave-behind   also untracks them in the index (ignored via .git/info/exclude),
#   benchmarks/gpu/prepare.sh --restore        puts the index and the exclude file back (run it after the call).
# Usage: bash benchmarks/gpu/prepare.sh [--leave-behind|--restore]; then run gpu_check.sh with carry [".whl"].
set -euo pipefail
cd "$(dirname "$0")/../.."
LIMIT=$((64 * 1024 * 1024))
LEAVE_BEHIND=(rapid_llm/demo_models benchmark-results docs/images)
MARK="# benchmarks/gpu/prepare.sh --leave-behind"
exclude=.git/info/exclude

if [[ "${1:-}" == --restore ]]; then
    git reset -q -- "${LEAVE_BEHIND[@]}"
    sed -i "\\|^$MARK\$|,\\|^$MARK end\$|d" "$exclude"
    echo "restored: ${LEAVE_BEHIND[*]} tracked again"
    exit 0
fi

# A fresh folder each time: a wheel of another version left from an older list would stop the whole
# --no-deps install there.
rm -rf .whl && mkdir .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux1_x86_64 \
    -d .whl -r benchmarks/gpu/wheels.txt 2> >(grep -v "is ignored: it is neither" >&2)

if [[ "${1:-}" == --leave-behind ]]; then
    git rm -r -q --cached -- "${LEAVE_BEHIND[@]}"
    grep -qxF "$MARK" "$exclude" 2>/dev/null || printf '%s\n' "$MARK" "${LEAVE_BEHIND[@]/#//}" "$MARK end" >>"$exclude"
fi

wheels=$(du -cb .whl/*.whl | tail -1 | cut -f1)
tree=$( (git ls-files -z; git ls-files -z --others --exclude-standard) | xargs -0 -r du -cb 2>/dev/null \
    | awk '$2 == "total" {sum += $1} END {print sum + 0}')
total=$((wheels + tree))
printf 'wheels: %d files, %.1f MiB; tree that travels: %.1f MiB; together %.1f MiB of 64 MiB\n' \
    "$(ls .whl/*.whl | wc -l)" "$(bc -l <<<"$wheels/1048576")" "$(bc -l <<<"$tree/1048576")" "$(bc -l <<<"$total/1048576")"
if ((total > LIMIT)); then
    echo "over the 64 MiB a device call carries: run with --leave-behind (or restore and shrink)" >&2
    exit 1
fi
