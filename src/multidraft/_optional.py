"""Optional dependencies, probed in one place.

Each optional dependency has one entry here: the import name, the pyproject extra that
installs it and the one-line install hint. Every caller asks this module instead of writing
its own ``try: import ...`` and hint constant:

* :func:`available` -- can it be imported (``True`` / ``False``; imports it once);
* :func:`require` -- the imported module, or an ``ImportError`` with one line naming what
  needed it and the install command (the original error appended);
* :func:`hint` -- the install command alone, for messages written elsewhere (a CLI flag).

Modules are imported by name (``importlib``), so nothing here is imported until asked.
Setting ``sys.modules[name] = None`` makes a dependency look missing (the tests use it).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass

__all__ = ["Dependency", "OPTIONAL", "available", "require", "hint"]


@dataclass(frozen=True)
class Dependency:
    """One optional dependency: ``module`` is imported, ``extra`` is the pyproject extra,
    ``install`` the command that installs it, ``purpose`` what needs it (for messages)."""

    module: str
    extra: str
    install: str
    purpose: str


OPTIONAL: dict[str, Dependency] = {o.module: o for o in (
    Dependency("transformers", "models", "pip install -e '.[models]'", "multidraft's transformers models"),
    Dependency("gguf", "models", "pip install -e '.[models]' (or pip install gguf)", "multidraft.testing"),
    Dependency("llama_cpp", "llama", "scripts/install_llama_cpp.sh .venv/bin/python", "llama.cpp support"),
    Dependency("matplotlib", "plots", "pip install 'multidraft[plots]'", "plots"),
    Dependency("ray", "ray", "pip install 'multidraft[ray]'", "--ray"),
    Dependency("fastapi", "serve", "pip install -e '.[serve]'", "multidraft serve"),
    Dependency("uvicorn", "serve", "pip install -e '.[serve]'", "multidraft serve"),
    Dependency("prometheus_client", "serve", "pip install -e '.[serve]'", "multidraft serve's /metrics"),
)}


def _entry(name: str) -> Dependency:
    try:
        return OPTIONAL[name]
    except KeyError:
        raise ValueError(f"name must be one of {', '.join(OPTIONAL)}, got {name!r}") from None


def hint(name: str) -> str:
    """The install command of the optional dependency ``name`` (e.g. ``"llama_cpp"``)."""
    return _entry(name).install


def available(name: str) -> bool:
    """Whether the optional dependency ``name`` can be imported (it is imported if so)."""
    _entry(name)
    try:
        importlib.import_module(name)
    except ImportError:
        return False
    return True


def require(name: str, purpose: str | None = None):
    """The module ``name``, or an ``ImportError`` (one line): ``<purpose> needs the '<extra>'
    extra: <install> (<why the import failed>)``. ``purpose`` defaults to the entry's."""
    entry = _entry(name)
    try:
        return importlib.import_module(name)
    except ImportError as exc:
        raise ImportError(f"{purpose or entry.purpose} needs the '{entry.extra}' extra: {entry.install} "
                          f"({' '.join(str(exc).split())})") from exc
