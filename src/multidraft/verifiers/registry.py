"""The verifier registry: one name per verifier family, in registration (display) order.

The table itself is ``base.Verifier._registered`` (base reads it for its error messages and
imports nothing from here); this module is its interface. The package ``__init__`` imports
the verifier modules, which register themselves."""
from __future__ import annotations

from .._errors import ArgumentError
from .base import Verifier

__all__ = ["register", "names", "get", "check_names"]

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


def check_names(names, arg: str = "verifiers") -> tuple[str, ...]:
    """``names`` (one name or an iterable) as a tuple of registered names, checked once;
    ``ArgumentError`` naming ``arg`` for an empty list or an unknown name (listing the registered)."""
    out = (names,) if isinstance(names, str) else tuple(names)
    if not out:
        raise ArgumentError(arg, "is empty; give at least one verifier")
    for n in out:
        if isinstance(n, Verifier) or n not in _REGISTRY:
            try:
                get(n)
            except ValueError as exc:
                raise ArgumentError.of(arg, exc) from None
    return out
