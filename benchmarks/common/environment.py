"""What a result was measured on: software versions, git commit, CPU, GPU, and the server's own settings.

Key design choice: nothing heavy is imported to find this out -- package versions come from their
installed metadata and GPU facts from `nvidia-smi` -- so collecting it costs milliseconds in a
client that never imports torch; torch is asked about CUDA only when the caller has imported it.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

REPO_ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("rapid_llm", "torch", "triton", "transformers")
# The CPU features the CPU kernels choose by: every result says which of them its machine had.
CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_tile", "amx_bf16", "amx_int8")


def fetch_server_info(base_url: str, headers: dict[str, str] | None = None) -> dict[str, Any] | None:
    """`GET {base_url}/server_info` as JSON, or None where the server has no such route or is unreachable."""
    try:
        response = httpx.get(f"{base_url}/server_info", headers=headers, timeout=10.0)
        response.raise_for_status()
        info = response.json()
    except (httpx.HTTPError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def collect_environment(server_info: dict[str, Any] | None) -> dict[str, Any]:
    return {
        "versions": {"python": platform.python_version(), **{name: _version(name) for name in PACKAGES}},
        "git_commit": _git_commit(),
        "platform": platform.platform(),
        "cpu": {**_cpu_model_and_flags(), "count": os.cpu_count(), "usable": len(os.sched_getaffinity(0))},
        "gpus": _gpus(),
        "server_info": server_info,
    }


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _run(*command: str) -> str | None:
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip()


def _git_commit() -> str | None:
    """HEAD of the checkout these benchmarks live in, suffixed "-dirty" when it has uncommitted changes."""
    if not (REPO_ROOT / ".git").exists() or shutil.which("git") is None:
        return None
    commit = _run("git", "-C", str(REPO_ROOT), "rev-parse", "HEAD")
    if not commit:
        return None
    status = _run("git", "-C", str(REPO_ROOT), "status", "--porcelain", "--untracked-files=no")
    return f"{commit}-dirty" if status else commit


def _cpu_model_and_flags() -> dict[str, Any]:
    """The CPU's model name and which of CPU_FLAGS it has (None where /proc/cpuinfo does not say)."""
    model, flags = None, None
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
    except OSError:
        cpuinfo = ""
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model is None:
            model = value.strip()
        elif key.strip() == "flags" and flags is None:
            present = set(value.split())
            flags = [flag for flag in CPU_FLAGS if flag in present]
    return {"model": model or platform.processor() or None, "flags": flags}


def _gpus() -> list[dict[str, Any]]:
    if shutil.which("nvidia-smi"):
        rows = _run("nvidia-smi", "--query-gpu=name,driver_version,memory.total", "--format=csv,noheader")
        header = _run("nvidia-smi") or ""
        cuda = header.split("CUDA Version:")[1].split()[0] if "CUDA Version:" in header else None
        gpus = []
        for row in (rows or "").splitlines():
            name, driver, memory = (field.strip() for field in row.split(","))
            gpus.append({"name": name, "driver": driver, "memory": memory, "cuda": cuda})
        return gpus
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return []
    return [
        {"name": torch.cuda.get_device_name(i), "driver": None, "memory": None, "cuda": torch.version.cuda}
        for i in range(torch.cuda.device_count())
    ]
