"""The worker's glibc malloc settings (worker_proc/host_malloc.py): freed activation-sized blocks are reused
instead of being mapped and faulted in again, and a user's own glibc malloc variables are left alone."""

from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="the settings are glibc's")

# Ten steps, each holding four 8 MiB blocks at once (a 2048-token step's larger activations), written then
# freed together; prints the page faults.
_ALLOCATE = """
import resource, sys
from rapid_llm.worker_proc.host_malloc import keep_freed_activation_pages
applied = keep_freed_activation_pages() if sys.argv[1] == "tuned" else None
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(10):
    blocks = [bytearray(8 << 20) for _ in range(4)]
    del blocks
print(applied, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def _faults(mode: str, **env: str) -> tuple[str, int]:
    environment = {key: value for key, value in os.environ.items() if not key.startswith(("MALLOC_", "GLIBC_"))}
    out = subprocess.run([sys.executable, "-c", _ALLOCATE, mode], capture_output=True, text=True, check=True,
                         env={**environment, **env}).stdout.split()
    return out[0], int(out[1])


def test_freed_blocks_are_reused_instead_of_faulted_in_again() -> None:
    applied, tuned = _faults("tuned")
    _, default = _faults("default")
    assert applied == "True"
    assert default >= 5 * 4 * 2048  # glibc hands the freed blocks back to the OS, then faults them in again
    assert tuned < default / 4


def test_a_user_s_own_malloc_settings_are_kept() -> None:
    applied, faults = _faults("tuned", MALLOC_TRIM_THRESHOLD_="131072")
    assert applied == "False"
