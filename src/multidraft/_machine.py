"""The provenance of a measurement: one record of the machine and the software a result was made
with, for every runner and benchmark.

:func:`provenance` returns one dict (the keys of :data:`PROVENANCE_KEYS`):

``versions``       python and the packages that shaped the result (:func:`versions`)
``cpu``            the CPU model (``model name`` of ``/proc/cpuinfo``, else ``platform.processor()``)
``cpu_flags``      the CPU's :data:`SPEED_FLAGS` (what decides how cheap width is), sorted; None where
                   ``/proc/cpuinfo`` cannot be read
``cores``          ``os.cpu_count()``
``torch_threads``  torch's intra-op threads (None where torch is not imported)
``load_average``   the 1, 5 and 15 minute load averages (:func:`load_average`; None where there are none)
``platform``       ``platform.platform()``

``/proc/cpuinfo`` is read once per process. Result files written before this record keep their own
keys (``load_average_before``, ``loadavg_start``, ``load_avg_1min``, ...): the writers still write
those keys beside the record, so every reader reads old and new files alike.

Pure standard library (torch is read from ``sys.modules`` only), so the lowest floor can hold it.
"""
from __future__ import annotations

import os
import platform
import sys

__all__ = ["SPEED_FLAGS", "PROVENANCE_KEYS", "cpuinfo", "cpu_model", "cpu_flags", "load_average", "versions",
           "provenance"]

SPEED_FLAGS = frozenset({"avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"})  # what
# decides how cheap width is on a CPU (wide bf16 matrix products): recorded beside every timing

PROVENANCE_KEYS = ("versions", "cpu", "cpu_flags", "cores", "torch_threads", "load_average", "platform")

# the packages whose versions a result records when the run imported them
PACKAGES = ("multidraft", "torch", "numpy", "scipy", "transformers", "llama_cpp")

_CPUINFO: list = []


def cpuinfo() -> str | None:
    """The text of ``/proc/cpuinfo`` (read once per process), or None where it cannot be read."""
    if not _CPUINFO:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
                _CPUINFO.append(fh.read())
        except OSError:
            _CPUINFO.append(None)
    return _CPUINFO[0]


def cpu_model(text: str | None = None) -> str:
    """The CPU model: the first ``model name`` line of ``text`` (``/proc/cpuinfo`` by default), else
    ``platform.processor()`` (possibly empty)."""
    text = cpuinfo() if text is None else text
    for line in (text or "").splitlines():
        if line.lower().startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or ""


def cpu_flags(text: str | None = None) -> set[str] | None:
    """The CPU flags in ``text`` (``/proc/cpuinfo`` by default), or None where they cannot be read."""
    text = cpuinfo() if text is None else text
    for line in (text or "").splitlines():
        if line.startswith("flags"):
            return set(line.split(":", 1)[1].split())
    return None


def load_average() -> list[float] | None:
    """The 1, 5 and 15 minute load averages, rounded to 0.01; None where the platform has none."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except (OSError, AttributeError):  # pragma: no cover (no load average on this platform)
        return None


def _version(module: str) -> str | None:
    m = sys.modules.get(module)
    if m is None:
        try:
            m = __import__(module)
        except Exception:  # noqa: BLE001 (absent or broken: no version to record)
            return None
    return str(getattr(m, "__version__", "?"))


def versions(also: tuple[str, ...] = ()) -> dict[str, str | None]:
    """``python`` and the version of each of :data:`PACKAGES` this process imported (one it did not
    import did not shape the result), plus each module of ``also`` (imported to read its version;
    None when it is absent)."""
    out: dict[str, str | None] = {"python": platform.python_version()}
    for mod in PACKAGES:
        if sys.modules.get(mod) is not None:
            out[mod] = str(getattr(sys.modules[mod], "__version__", "?"))
    for mod in also:
        if mod not in out:
            out[mod] = _version(mod)
    return out


def provenance(also: tuple[str, ...] = ()) -> dict:
    """The machine and software of a measurement now (keys :data:`PROVENANCE_KEYS`; the module
    docstring); ``also`` names modules whose versions are recorded even when not imported."""
    flags = cpu_flags()
    torch = sys.modules.get("torch")
    return {"versions": versions(also), "cpu": cpu_model(),
            "cpu_flags": None if flags is None else sorted(flags & SPEED_FLAGS), "cores": os.cpu_count(),
            "torch_threads": torch.get_num_threads() if torch is not None else None,
            "load_average": load_average(), "platform": platform.platform()}
