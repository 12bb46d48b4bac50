"""The CPU engine's children poll for OpenMP work only briefly once it ends (entrypoints/openmp_spin.py): the
spawn environment carries GOMP_SPINCOUNT, torch's libgomp honours it, and a user's own setting is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from rapid_llm.entrypoints.openmp_spin import SPIN_COUNT, openmp_spin_environment

# One parallel op on two threads, then a 30 ms sleep: the process's CPU time during the sleep is what the idle
# OpenMP thread spent polling (median of 7, in ms).
_IDLE_POLLING = """
import statistics, time, torch
torch.set_num_threads(2)
values = torch.ones(1 << 22)
idle = []
for _ in range(7):
    values.mul_(1.0001)
    start = time.process_time()
    time.sleep(0.03)
    idle.append(time.process_time() - start)
print(statistics.median(idle) * 1e3)
"""


@pytest.fixture(autouse=True)
def _no_user_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GOMP_SPINCOUNT", raising=False)
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)


def _idle_polling_ms() -> float:
    return float(subprocess.run([sys.executable, "-c", _IDLE_POLLING], capture_output=True, text=True,
                                check=True).stdout)


@pytest.mark.skipif((os.cpu_count() or 1) < 2, reason="needs a second core for the polling thread")
def test_children_stop_polling_sooner_than_libgomp_s_default() -> None:
    default = _idle_polling_ms()
    with openmp_spin_environment("cpu"):
        bounded = _idle_polling_ms()
    # Measured on the AMX Xeon (2 cores): 4.1 ms by default, 0.8 ms bounded.
    assert bounded * 2 < default, (bounded, default)


def test_the_setting_lives_only_while_children_start() -> None:
    with openmp_spin_environment("cpu"):
        assert os.environ["GOMP_SPINCOUNT"] == str(SPIN_COUNT)
    assert "GOMP_SPINCOUNT" not in os.environ
    with openmp_spin_environment("cuda"):
        assert "GOMP_SPINCOUNT" not in os.environ


@pytest.mark.parametrize("name, value", [("GOMP_SPINCOUNT", "300000"), ("OMP_WAIT_POLICY", "passive")])
def test_a_user_s_own_setting_is_kept(monkeypatch: pytest.MonkeyPatch, name: str, value: str) -> None:
    monkeypatch.setenv(name, value)
    with openmp_spin_environment("cpu"):
        assert os.environ.get("GOMP_SPINCOUNT") == (value if name == "GOMP_SPINCOUNT" else None)
