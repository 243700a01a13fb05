"""The instruction sets the installed llama.cpp was compiled for, and the guard that refuses a
build this machine cannot run.

A llama.cpp compiled with ``-march=native`` on one machine dies by SIGILL on a machine that
lacks one of its instruction sets, and on Intel VMs that advertise AMX a native build's AMX
kernels trap although the flag is there (issue 25: ``tilezero`` in ``ggml::cpu::amx``). The
project builds llama-cpp-python for a portable baseline (``scripts/install_llama_cpp.sh``:
AVX2, FMA, F16C, BMI2; no AVX-512, no AMX), and :func:`check_build` refuses, with one line
naming the fix, any build that uses an instruction set this CPU does not advertise, or AMX
(unless ``MULTIDRAFT_ALLOW_AMX=1``), so a user action ends in an error instead of a signal.
"""
from __future__ import annotations

import os
import re

from .._machine import cpu_flags  # the CPU flags of this machine (/proc/cpuinfo), read once

__all__ = ["compiled_features", "cpu_flags", "check_build", "REBUILD_HINT"]

REBUILD_HINT = "rebuild it portably with: scripts/install_llama_cpp.sh .venv/bin/python"

# llama.cpp's feature names (llama_print_system_info) -> the /proc/cpuinfo flag each needs
_CPU_FLAG = {
    "SSE3": "pni", "SSSE3": "ssse3", "AVX": "avx", "AVX_VNNI": "avx_vnni", "AVX2": "avx2",
    "F16C": "f16c", "FMA": "fma", "BMI2": "bmi2", "AVX512": "avx512f",
    "AVX512_VBMI": "avx512vbmi", "AVX512_VNNI": "avx512_vnni", "AVX512_BF16": "avx512_bf16",
    "AMX_INT8": "amx_int8",
}


def compiled_features(system_info: str) -> dict[str, bool]:
    """``{'AVX2': True, 'AMX_INT8': False, ...}`` from llama.cpp's system-info line (the
    ``NAME = 0|1`` pairs; the CPU backend reports what it was compiled with)."""
    return {m.group(1): m.group(2) == "1" for m in re.finditer(r"([A-Z][A-Z0-9_]*) = ([01])\b", system_info)}


def check_build(system_info: str, flags: set[str] | None, *, allow_amx: bool | None = None) -> None:
    """ImportError (one line, naming the fix) when the build uses AMX or an instruction set
    missing from ``flags``; nothing when it is safe here or the CPU flags are unknown."""
    if allow_amx is None:
        allow_amx = os.environ.get("MULTIDRAFT_ALLOW_AMX") == "1"
    feats = compiled_features(system_info)
    if not allow_amx and feats.get("AMX_INT8"):
        raise ImportError("the installed llama-cpp-python was compiled with AMX kernels, which trap on VMs "
                          f"that advertise AMX (SIGILL); {REBUILD_HINT} (or set MULTIDRAFT_ALLOW_AMX=1)")
    if flags is None:
        return
    missing = sorted(n for n, on in feats.items() if on and n in _CPU_FLAG and _CPU_FLAG[n] not in flags)
    if missing:
        raise ImportError(f"the installed llama-cpp-python uses {', '.join(missing)}, which this CPU lacks "
                          f"(it would die by SIGILL); {REBUILD_HINT}")
