"""The resource sampler's GPU part without a GPU: an `nvidia-smi` stand-in, and the unavailable case."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from benchmarks.common.gpu_sampling import open_gpu_reader
from benchmarks.common.resources import ResourceSampler, format_resources

# Answers the two queries the sampler sends, in nvidia-smi's csv,noheader,nounits format; memory.used
# grows by 100 MiB a call (kept in a counter file) so peak and mean differ.
FAKE_NVIDIA_SMI = """#!/bin/sh
count=$(cat "$0.count" 2>/dev/null || echo 0); echo $((count + 1)) > "$0.count"
case "$1" in
  --query-gpu=*) echo "0, NVIDIA Fake, $((1000 + 100 * count)), 40"; echo "1, NVIDIA Fake, 5, 0" ;;
  --query-compute-apps=*) echo "$SERVER_PID, 1234"; echo "1, 99" ;;
  *) exit 2 ;;
esac
"""


@pytest.fixture
def no_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # `import pynvml` raises ImportError


def test_nvidia_smi_samples_devices_and_the_servers_processes(no_pynvml, tmp_path: Path,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    script = tmp_path / "nvidia-smi"
    script.write_text(FAKE_NVIDIA_SMI)
    script.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("SERVER_PID", str(os.getpid()))
    with ResourceSampler([os.getpid()], interval_s=0.05) as sampler:
        time.sleep(0.2)
    resources = sampler.summary()
    gpu = resources["gpu"]
    assert gpu["source"] == "nvidia-smi"
    first, second = gpu["devices"]
    assert first["name"] == "NVIDIA Fake" and first["utilization_percent_mean"] == 40.0
    assert first["memory_used_mib_peak"] > first["memory_used_mib_mean"] > 1000
    assert second["memory_used_mib_peak"] == 5.0
    # pid 1 is not in the sampled tree: only this process's 1234 MiB count as the server's.
    assert gpu["server_memory_mib_peak"] == 1234.0
    [process] = [p for p in resources["processes"] if p["pid"] == os.getpid()]
    assert process["gpu_memory_mib_peak"] == 1234.0
    assert "GPU 0 peak memory used (MiB):" in format_resources(resources)


def test_without_nvml_or_nvidia_smi_the_gpu_is_unavailable_with_the_reason(no_pynvml,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    assert open_gpu_reader() == (None, "pynvml is not installed and nvidia-smi is not on PATH")
    with ResourceSampler([os.getpid()], interval_s=0.05) as sampler:
        pass
    resources = sampler.summary()
    assert resources["gpu"] == {"unavailable": "pynvml is not installed and nvidia-smi is not on PATH"}
    [process] = [p for p in resources["processes"] if p["pid"] == os.getpid()]
    assert process["samples"] == 2 and process["rss_mib_peak"] > 0 and process["cpu_percent_mean"] >= 0
