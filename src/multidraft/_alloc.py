"""Keep freed multi-MB buffers inside the process (glibc only): the verifiers' full-vocabulary
float64 temporaries (1.2 MB a row at V = 151,936) are otherwise handed back to the OS when freed
and page-faulted in again at the next call.

glibc serves a request above its mmap threshold with a fresh mapping and trims the top of the
heap once more than the trim threshold lies free there; both thresholds start at 128 KiB and the
dynamic rule raises them only to the size of the largest chunk freed so far, so a verify that
frees several such rows at once still trims. The page faults cost about 1 ms per MB on this
project's 2-core VM when other jobs share it (``benchmarks/node_cost.py``'s allocator note; the
measurements: ``docs/results/node_cost/README.md``, issue 27 round 3).

:func:`keep_freed_memory` sets the mmap threshold to 32 MiB (glibc's largest) and the trim
threshold to 1 GiB, once per process. The decoder calls it when it is built (``generate``,
``BatchDecoder``, the server, the CLI), the benchmarks before they time; plain library calls
(a verifier's ``verify``) never do. It leaves the allocator alone where ``MULTIDRAFT_MALLOC=default``
is set, where the user set glibc's own ``MALLOC_MMAP_THRESHOLD_`` / ``MALLOC_TRIM_THRESHOLD_``, and
off glibc (macOS, musl). The cost is memory the process keeps: freed blocks under 32 MiB stay
mapped, at most about 1 GiB of free heap (model weights are mapped files or larger blocks and
are unaffected).
"""
from __future__ import annotations

import ctypes
import os
import platform
import threading

__all__ = ["allocator_state", "keep_freed_memory"]

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's ceiling for it on 64-bit (HEAP_MAX_SIZE / 2)
TRIM_THRESHOLD = 1 << 30

_lock = threading.Lock()
_state: str | None = None  # "tuned", or why not


def _why_not() -> str | None:
    if os.environ.get("MULTIDRAFT_MALLOC", "").lower() == "default":
        return "MULTIDRAFT_MALLOC=default"
    user = [k for k in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_") if k in os.environ]
    if user:
        return f"set by the user ({', '.join(user)})"
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return "not glibc"
    return None


def keep_freed_memory() -> bool:
    """Raise glibc's mmap and trim thresholds for this process (see the module notes), once.
    True when they are raised (now or before), False when left alone; never raises."""
    global _state
    with _lock:
        if _state is None:
            why = _why_not()
            if why is None:
                try:
                    libc = ctypes.CDLL(None)
                    ok = libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and libc.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
                except (OSError, AttributeError):
                    ok = False
                why = "tuned" if ok else "mallopt refused"
            _state = why
        return _state == "tuned"


def allocator_state() -> str:
    """What :func:`keep_freed_memory` did in this process: "tuned", the reason it did not, or
    "glibc defaults" when it was not called; benchmarks record it with their timings."""
    return _state or "glibc defaults"
