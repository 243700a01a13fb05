"""The verifier registry: one name per verifier family, in registration (display) order.

The table itself is ``base.Verifier._registered`` (base reads it for its error messages and
imports nothing from here); this module is its interface. The package ``__init__`` imports
the verifier modules, which register themselves."""
from __future__ import annotations

from .base import Verifier

__all__ = ["register", "names", "get"]

_REGISTRY: dict[str, type[Verifier]] = Verifier._registered


def register(cls: type[Verifier]) -> type[Verifier]:
    """Class decorator adding a verifier to the registry under ``cls.name``."""
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"verifier name {cls.name!r} is empty or already registered")
    _REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    """Registered verifier names, in registration order."""
    return list(_REGISTRY)


def get(name) -> Verifier:
    """A verifier instance by registered name (an instance is returned as is); ``ValueError``
    listing the registered names otherwise."""
    if isinstance(name, Verifier):
        return name
    try:
        return _REGISTRY[name]()
    except (KeyError, TypeError):
        raise ValueError(f"unknown verifier {name!r}; registered: {', '.join(_REGISTRY)}") from None
