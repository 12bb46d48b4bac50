"""GPU memory and utilisation samples for the resource sampler: NVML through pynvml, else `nvidia-smi`.

Key design choice: the client never imports torch (a CUDA context in the client would itself take GPU
memory and the server's allocations are invisible to it), so the numbers come from the driver: NVML
when pynvml is installed (optional, not a dependency), else two `nvidia-smi --query-*` calls per sample.
Per-process memory is the driver's figure for the server's pids; each device's used memory and
utilisation cover every process on it.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass, field
from typing import Any, Protocol

MIB = 2**20


class GpuReader(Protocol):
    def sample(self, pids: set[int]) -> None: ...

    def summary(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


@dataclass
class _DeviceSeries:
    name: str
    memory_used_mib: list[float] = field(default_factory=list)
    utilization_percent: list[float] = field(default_factory=list)


class _GpuSeries:
    """Samples as both readers record them; one summary for both."""

    source = ""

    def __init__(self) -> None:
        self.devices: dict[int, _DeviceSeries] = {}
        self.per_process_mib_peak: dict[int, float] = {}

    def record(self, index: int, name: str, used_mib: float, utilization: float) -> None:
        device = self.devices.setdefault(index, _DeviceSeries(name))
        device.memory_used_mib.append(used_mib)
        device.utilization_percent.append(utilization)

    def record_processes(self, used_mib_by_pid: dict[int, float]) -> None:
        for pid, used_mib in used_mib_by_pid.items():
            self.per_process_mib_peak[pid] = max(self.per_process_mib_peak.get(pid, 0.0), used_mib)

    def summary(self) -> dict[str, Any]:
        return {
            "source": self.source,
            "devices": [
                {"index": index, "name": device.name,
                 "memory_used_mib_peak": max(device.memory_used_mib),
                 "memory_used_mib_mean": sum(device.memory_used_mib) / len(device.memory_used_mib),
                 "utilization_percent_mean": sum(device.utilization_percent) / len(device.utilization_percent),
                 "utilization_percent_peak": max(device.utilization_percent)}
                for index, device in sorted(self.devices.items())
            ],
            "server_memory_mib_peak": sum(self.per_process_mib_peak.values()),
            "per_process_mib_peak": dict(self.per_process_mib_peak),
        }


class NvmlReader(_GpuSeries):
    source = "nvml"

    def __init__(self, pynvml: Any) -> None:
        super().__init__()
        self._nvml = pynvml
        pynvml.nvmlInit()
        self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        self._names = [str(pynvml.nvmlDeviceGetName(handle)) for handle in self._handles]

    def sample(self, pids: set[int]) -> None:
        used_by_pid: dict[int, float] = {}
        for index, handle in enumerate(self._handles):
            memory = self._nvml.nvmlDeviceGetMemoryInfo(handle)
            utilization = self._nvml.nvmlDeviceGetUtilizationRates(handle)
            self.record(index, self._names[index], memory.used / MIB, float(utilization.gpu))
            for process in self._nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid in pids and process.usedGpuMemory is not None:
                    used_by_pid[process.pid] = used_by_pid.get(process.pid, 0.0) + process.usedGpuMemory / MIB
        self.record_processes(used_by_pid)

    def close(self) -> None:
        self._nvml.nvmlShutdown()


class NvidiaSmiReader(_GpuSeries):
    source = "nvidia-smi"

    def sample(self, pids: set[int]) -> None:
        for row in _query("--query-gpu=index,name,memory.used,utilization.gpu"):
            index, name, used, utilization = row
            self.record(int(index), name, float(used), float(utilization))
        used_by_pid: dict[int, float] = {}
        for pid, used in _query("--query-compute-apps=pid,used_memory"):
            if int(pid) in pids and used.replace(".", "", 1).isdigit():
                used_by_pid[int(pid)] = used_by_pid.get(int(pid), 0.0) + float(used)
        self.record_processes(used_by_pid)

    def close(self) -> None:
        pass


def _query(query: str) -> list[list[str]]:
    """Rows of `nvidia-smi QUERY --format=csv,noheader,nounits` (memory in MiB)."""
    output = subprocess.run(["nvidia-smi", query, "--format=csv,noheader,nounits"], capture_output=True,
                            text=True, timeout=10, check=True).stdout
    return [[value.strip() for value in line.split(",")] for line in output.splitlines() if line.strip()]


def open_gpu_reader() -> tuple[GpuReader | None, str | None]:
    """(a reader, None), or (None, why GPUs cannot be read here)."""
    try:
        import pynvml
    except ImportError:
        pynvml = None
    if pynvml is not None:
        try:
            return NvmlReader(pynvml), None
        except pynvml.NVMLError as error:
            nvml_failure = f"NVML failed ({error})"
    else:
        nvml_failure = "pynvml is not installed"
    if shutil.which("nvidia-smi") is None:
        return None, f"{nvml_failure} and nvidia-smi is not on PATH"
    reader = NvidiaSmiReader()
    try:
        reader.sample(set())
    except (OSError, subprocess.SubprocessError, ValueError) as error:
        return None, f"{nvml_failure} and nvidia-smi failed ({error})"
    reader.devices.clear()
    return reader, None
