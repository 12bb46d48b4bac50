"""glibc malloc settings for a CPU worker's activations: blocks up to 32 MiB come from the heap, and the heap is
never trimmed, so each step's activation tensors reuse the pages the previous step freed.

By default glibc serves blocks past its (adaptive) threshold with fresh mmaps and hands freed heap tops back to
the OS, so every prefill step faults its activations in again, each page zeroed by the kernel. Measured
(AMX Xeon, 2 threads, `perf stat -e page-faults` over `benchmarks/prefill_step_timing.py --prompt-len 4000
--budgets 2048 --repeats 8`, llama-10m-8k): 234k page faults by default, 84k with these settings. The cost: the
worker keeps its peak activation memory mapped, as a caching allocator would. Where the C library is not
glibc, or the user set glibc's own malloc variables, nothing changes.
Usage: `keep_freed_activation_pages()` once, in the worker before its first step.
"""

from __future__ import annotations

import ctypes
import logging
import os
import platform

logger = logging.getLogger(__name__)

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's largest mmap threshold on 64-bit systems
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES")


def keep_freed_activation_pages() -> bool:
    """Apply the settings; False (and nothing changed) where they do not apply or glibc refused them."""
    if platform.libc_ver()[0] != "glibc" or any(name in os.environ for name in _USER_SETTINGS):
        return False
    mallopt = ctypes.CDLL("libc.so.6").mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    # The mmap threshold first: the trim threshold alone would pin glibc's mmap threshold at its smallest
    # (128 KiB), which took 1.2M page faults and 1.6x the prefill time in the measurement above.
    applied = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, 2**31 - 1))
    if not applied:
        logger.warning("glibc refused the malloc settings for activations; freed activation pages go back to the OS")
    return applied
