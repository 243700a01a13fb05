"""The ceiling: optimal acceptance alpha* of multi-draft speculative sampling.

``optimal_acceptance(p, law)``       exact, any V, batched (the transport dual; dual.py)
``lp_optimal_acceptance(p, law)``    full coupling LP with HiGHS, small V (lp.py)
``is_lp_optimal_acceptance(p, law)`` two-step importance-sampling LP (Khisti et al.), small V
``k2_optimal_acceptance(p, q)``      K = 2 identical drafts: min_S [1 + p(S) - q(S)^2] (k2.py)
``unit_acceptance_possible(p, q, k)`` whether acceptance 1 is reachable, O(V log V)

Ceilings only: the law of llama.cpp's lossy llama-speculative node rule, a peer compared
against, is ``multidraft.peers``.

See docs/guide/optimal_acceptance.md for the derivations.
"""
from __future__ import annotations

from .dual import AcceptanceBounds, dual_objective, optimal_acceptance, prefix_order
from .k2 import k2_optimal_acceptance, unit_acceptance_possible
from .lp import (
    MAX_LP_TUPLES,
    CouplingSolution,
    check_lp_size,
    coupling_rows,
    is_lp_optimal_acceptance,
    lp_optimal_acceptance,
    solve_coupling,
    tuple_count,
)

__all__ = [
    "optimal_acceptance",
    "lp_optimal_acceptance",
    "is_lp_optimal_acceptance",
    "k2_optimal_acceptance",
    "unit_acceptance_possible",
    "dual_objective",
    "prefix_order",
    "AcceptanceBounds",
    "solve_coupling",
    "coupling_rows",
    "CouplingSolution",
    "tuple_count",
    "check_lp_size",
    "MAX_LP_TUPLES",
]
