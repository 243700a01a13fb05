"""Lossless multi-draft verifiers, one family per module, registered by name.

>>> import multidraft as md
>>> md.verifiers.names()       # doctest: +SKIP
>>> v = md.verifiers.get("rrs_wor")
"""
from __future__ import annotations

from .base import Verdict, Verifier, first_match, per_draft

_REGISTRY: dict[str, type[Verifier]] = {}


def register(cls: type[Verifier]) -> type[Verifier]:
    """Class decorator adding a verifier to the registry under ``cls.name``."""
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"verifier name {cls.name!r} is empty or already registered")
    _REGISTRY[cls.name] = cls
    return cls


def names() -> list[str]:
    """Registered verifier names, in registration order."""
    return list(_REGISTRY)


def get(name: str) -> Verifier:
    """A verifier instance by registered name; ``ValueError`` listing the names otherwise."""
    if isinstance(name, Verifier):
        return name
    try:
        return _REGISTRY[name]()
    except (KeyError, TypeError):
        raise ValueError(f"unknown verifier {name!r}; registered: {', '.join(_REGISTRY)}") from None


# registration order is the display order of tables
from . import naive, nss, specinfer, rrs_wor, spectr, spechub, khisti_is, greedy_optimal, lp_optimal  # noqa: E402,F401

__all__ = ["Verdict", "Verifier", "first_match", "per_draft", "register", "names", "get"]
