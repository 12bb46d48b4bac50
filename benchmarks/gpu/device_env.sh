#!/usr/bin/env bash
# A CPU venv shaped like the lent GPU machine (benchmarks/gpu/device-versions.txt: Python 3.12, torch 2.11,
# Triton 3.6, transformers 5.17), then the README's test suite in it. PyPI's Linux torch 2.11 is the CUDA
# build (about 5 GB with its nvidia-* wheels); it runs on a machine without a GPU, where the gpu-marked tests
# skip as in CI. CI keeps its own venv (.ci/run); this one is .venv-device/, ignored by git.
# Usage: bash benchmarks/gpu/device_env.sh [pytest args...]   (PYTHON=python3.12 by default)
set -euo pipefail
cd "$(dirname "$0")/../.."
PYTHON="${PYTHON:-python3.12}"
if [[ ! -x .venv-device/bin/python ]]; then
    "$PYTHON" -m venv .venv-device
fi
.venv-device/bin/python -m pip install -q -c benchmarks/gpu/device-versions.txt torch triton transformers
.venv-device/bin/python -m pip install -q -c benchmarks/gpu/device-versions.txt -e ".[test]"
.venv-device/bin/python -c "import sys, torch, triton, transformers; print('device-shaped venv: Python', \
sys.version.split()[0], 'torch', torch.__version__, 'triton', triton.__version__, 'transformers', transformers.__version__)"
exec .venv-device/bin/python -m pytest tests -q "$@"
