"""Issue 41, item 1: the token level's exactness at the float edges (``tests/verifiers/test_float_edges.py``),
at path level. Every registered tree rule, on every tree law it verifies, with rows holding subnormal
float64 masses, float32 rows (a confident q with 1e-9 tails, float32 subnormals) and float16 rows
(float16 subnormals), p = 0 on drafted tokens:

* no exception (the sequence rules raised ``ZeroDivisionError`` on a drafted token of q = 1e-310);
* for every enumerated tree, whatever its probability, the rule's law of Y is a distribution (finite,
  nonnegative, summing to 1 within 1e-12), gives no mass to a Y holding a token of target
  probability 0, and agrees with ``expected_tokens``; ``verify`` emits only Y of that law;
* the path-level certificate against the target's sequence law is 1e-12, the trees read as the
  float64 laws their rows represent (each row over its float64 sum, as ``rows64``).

Fast by default (one model per family, V = 3, small trees, one token-level verifier per law kind in the
walk); ``slow`` runs more laws and the other walks at another seed (the full K-ary trees of depth 2
have hundreds of trees at V = 3: minutes, so they are left out).
"""
from __future__ import annotations

import math

import pytest
import torch

from multidraft import trees

SUB64 = 5e-324
V = 3


def _raw(family: str, seed: int):
    """``(p_raw, q_raw)``: prefix -> row ``[V]`` in the family's dtype (float32 and float16 rows not
    normalised in float64). At every prefix q has two or three tokens: a (mass ~1) and tiny ones; which
    tokens, and where p puts its tiny masses and zeros, turn with the prefix."""
    base = trees.TableModel.random(V, seed=seed)

    def toks(prefix):
        r = (sum(prefix) * 2 + len(prefix) + seed) % V
        return r, (r + 1) % V, (r + 2) % V, (sum(prefix) + len(prefix)) % 3  # a, b, c, case

    def p_raw(prefix):
        a, b, c, case = toks(prefix)
        p = base.p(prefix).clone()
        if family == "f64":  # subnormal masses and p = 0 on a drafted token
            if case == 0:
                p[b] = 0.0
            elif case == 1:
                p[a] = 1e-310
            else:
                p[b], p[c] = SUB64, 0.0
            return p / p.sum()
        if family == "f32":  # one-hot float32 target (on a drafted token or not), or a float32 subnormal
            if case == 2:
                p[b] = 1e-45
                return (p / p.sum()).float()
            p = torch.zeros(V, dtype=torch.float32)
            p[a if case == 0 else c] = 1.0
            return p
        p[b if case else a] = 6e-8  # float16 subnormal
        return (p / p.sum()).half()

    def q_raw(prefix):
        a, b, c, case = toks(prefix)
        q = torch.zeros(V, dtype=torch.float64)
        if family == "f64":
            q[a], q[b] = 1.0, (1e-310 if case != 1 else SUB64)
            if case == 0:
                q[c] = 1e-300
            return q
        if family == "f32":  # sums to 1 in float32, to 1 + 1e-9 in float64 (the confident draft)
            q[a], q[b] = 1.0, (1e-9 if case != 2 else 1e-45)
            return q.float()
        q[a], q[b] = 1.0, 6e-8
        return q.half()

    return p_raw, q_raw


FAMILIES = ("f64", "f32", "f16")
SMALL = [[0], [1], [0, 0]]  # two drafts at the root, one below the first
LAWS = (trees.chain(2), trees.explicit(SMALL), trees.explicit(SMALL, "wor"), trees.explicit(SMALL, "greedy"))
SLOW_LAWS = (trees.chain(3), trees.kary(2, 1), trees.kary(2, 1, "wor"), trees.sequences(2, 1))
RULES = [n for n in trees.names() if n not in ("token_walk", "tree_lp")]
WALKS = [("specinfer", "iid"), ("rrs_wor", "wor"), ("greedy_optimal", "greedy")]  # one verifier per law kind
SLOW_WALKS = WALKS + [("spectr", "iid"), ("khisti_is", "iid"), ("optimal", "iid"), ("spechub", "greedy")]


def _instance(family: str, seed: int, law):
    """The model (rows read as float64 laws) and the enumerated trees holding the raw rows."""
    p_raw, q_raw = _raw(family, seed)
    model = trees.TableModel(V, p_raw, q_raw)
    out = []
    for tree, w in law.enumerate(model):
        t = tree.copy()
        for i, nd in enumerate(t.nodes):
            if nd.q is not None:
                nd.q = q_raw(t.prefix(i))
            nd.p = None
        t.set_target(lambda i, t=t: p_raw(t.prefix(i)))
        out.append((t, w))
    return model, out


def _p_zero(model, y) -> bool:
    """Whether Y holds a token of target probability 0 (after its prefix)."""
    return any(not float(model.p(y[:j])[y[j]]) > 0 for j in range(len(y)))


def _check(rule, law, family: str, seed: int, n_verify: int = 3) -> None:
    model, enumerated = _instance(family, seed, law)
    n = law.depth + 1
    got = torch.zeros((V,) * n, dtype=torch.float64)
    for t, w in enumerated:
        out = rule.output_distribution(t)
        vals = list(out.values())
        assert all(math.isfinite(x) and x >= 0 for x in vals), (family, t.prefix, out)
        assert abs(sum(vals) - 1.0) < 1e-12, (family, sum(vals))
        bad = [y for y, x in out.items() if x > 0 and _p_zero(model, y)]
        assert not bad, f"{rule!r} on {law.name}/{family}: emits Y with a p = 0 token: {bad}"
        e = rule.expected_tokens(t)
        assert abs(e - sum(len(y) * x for y, x in out.items())) < 1e-12
        for s in range(n_verify):
            y = rule.verify(t, torch.Generator().manual_seed(s)).tokens(t)
            assert out.get(y, 0.0) > 0, f"{rule!r} on {law.name}/{family}: verify emitted {y}, outside its law"
        for y, x in out.items():
            if x > 0:
                got[y] += w * x * model.sequence_law(y, n - len(y))
    err = float((got - model.sequence_law((), n)).abs().max())
    assert err < 1e-12, f"{rule!r} on {law.name}/{family}: certificate {err:.3g}"


def _rules(laws=LAWS, walks=WALKS):
    out = [(name, law) for name in RULES for law in laws if trees.get(name).supports(law)]
    for v, kind in walks:
        r = trees.get("token_walk", verifier=v, law=kind)
        out += [(r, law) for law in laws if r.supports(law)]
    return out


def _id(case):
    rule, law = case
    return f"{rule if isinstance(rule, str) else rule.verifier.name}-{law.name}"


@pytest.mark.parametrize("case", _rules(), ids=_id)
@pytest.mark.parametrize("family", FAMILIES)
def test_tree_rules_exact_at_float_edges(case, family):
    rule, law = case
    _check(trees.get(rule), law, family, seed=0, n_verify=2)


@pytest.mark.slow
@pytest.mark.parametrize("case", _rules(SLOW_LAWS) + _rules(LAWS, SLOW_WALKS[len(WALKS):]), ids=_id)
def test_tree_rules_exact_at_float_edges_more_laws(case):
    rule, law = case
    for family in FAMILIES:
        _check(trees.get(rule), law, family, seed=1, n_verify=3)

@pytest.mark.parametrize("law", [trees.chain(2), trees.explicit(SMALL)], ids=lambda l: l.name)
@pytest.mark.parametrize("family", FAMILIES)
def test_tree_lp_takes_trees_of_tiny_probability(law, family):
    """``tree_lp`` refused the valid trees of probability below the LP's resolution (1e-310, or 0.0 after
    underflow: HiGHS leaves their coupling rows empty), so its certificate could not be computed."""
    p_raw, q_raw = _raw(family, 0)
    rule = trees.get("tree_lp", tree_law=law, model=trees.TableModel(V, p_raw, q_raw))  # the rows _check reads
    _check(rule, law, family, seed=0, n_verify=1)
