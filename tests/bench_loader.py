"""The scripts of benchmarks/ as modules in the tests (they are scripts, not a package)."""
from __future__ import annotations

import contextlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@contextlib.contextmanager
def benchmark_module(name: str, alias: str | None = None):
    """``benchmarks/<name>.py`` loaded as the module ``alias`` (default ``name``), registered in
    ``sys.modules`` while the block runs (its dataclasses look their module up there)."""
    spec = importlib.util.spec_from_file_location(alias or name, ROOT / "benchmarks" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    try:
        spec.loader.exec_module(mod)
        yield mod
    finally:
        sys.modules.pop(spec.name, None)
