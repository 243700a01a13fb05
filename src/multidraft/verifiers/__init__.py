"""Lossless multi-draft verifiers, one family per module, registered by name.

>>> import multidraft as md
>>> md.verifiers.names()       # doctest: +SKIP
>>> v = md.verifiers.get("rrs_wor")
"""
from __future__ import annotations

from .base import Verdict, Verifier, first_match, per_draft
from .registry import check_names, get, names, register

# registration order is the display order of tables
from . import naive, nss, specinfer, rrs_wor, spectr, spechub, khisti_is, greedy_optimal, lp_optimal, optimal  # noqa: E402,F401

__all__ = ["Verdict", "Verifier", "first_match", "per_draft", "register", "names", "get", "check_names"]
