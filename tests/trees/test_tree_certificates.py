"""Path certificates of the token-level walk: every registered verifier x every tree law it supports.

For each (verifier, law kind, tree law, sequence model) the emitted sequence continued by
target samples to length L + 1 must have the target's sequence law to 1e-12 (exact
enumeration of every draft tree, ``trees.certify_tree``). At L = 1 the walk of ``optimal`` /
``lp_optimal`` reaches 1 + alpha*. Fast by default (V = 3, L <= 2, K <= 3); the ``slow``
sweep covers V <= 4, L <= 3, K <= 3 and every model style.
"""
from __future__ import annotations

import itertools

import pytest
import torch

import multidraft as md
from multidraft import trees

TOL = 1e-12


def _tree_laws(kind: str, V: int, slow: bool) -> list:
    """Tree laws of node law ``kind`` small enough to enumerate at vocabulary V."""
    out = [trees.chain(2 if not slow else 3, kind), trees.kary(2, 2, kind), trees.kary(3, 1, kind),
           trees.explicit([[0], [1], [0, 0], [0, 0, 0]], kind), trees.explicit([[0], [1], [2], [1, 0]], kind)]
    if kind == "iid":
        out += [trees.sequences(2, 2), trees.sequences(3, 1)]
        if slow and V <= 3:
            out += [trees.sequences(2, 3), trees.sequences(3, 2)]
    if slow and V <= 2:
        out += [trees.kary(2, 3, kind), trees.kary(3, 2, kind)]
        if kind == "iid":
            out += [trees.sequences(3, 3)]
    return out


def _cases(slow: bool):
    """(verifier, law kind, tree law, model) for every supported combination; model styles rotate
    (one per combination by default, two in the slow sweep, so every style meets every law)."""
    styles = trees.STYLES
    Vs = (2, 3, 4) if slow else (3,)
    n = 0
    for V in Vs:
        for name in md.verifiers.names():
            v = md.verifiers.get(name)
            for kind in v.laws:
                if kind == "independent":
                    continue
                rule = trees.TokenWalk(name, kind)
                for law in _tree_laws(kind, V, slow):
                    if not rule.supports(law):
                        continue
                    reps = [styles[(n + j) % len(styles)] for j in range(2 if slow else 1)]
                    for style in reps:
                        yield rule, law, trees.TableModel.random(V, seed=n, style=style)
                        n += 1


def _check(rule, law, model):
    cert = trees.certify_tree(rule, law, model)
    assert cert.max_abs_error <= TOL, (rule, law, model.style, cert)
    assert 1.0 <= cert.expected_tokens <= law.depth + 1 + 1e-12
    return cert


def test_every_verifier_and_tree_law_is_lossless(one_thread):
    seen = set()
    for rule, law, model in _cases(slow=False):
        _check(rule, law, model)
        seen.add((rule.verifier.name, law.kind, law.shape.mode))
    names = {s[0] for s in seen}
    assert names == set(md.verifiers.names())  # every registered verifier ran through the walk
    assert ("rrs_wor", "wor", "paths") in seen and ("spechub", "greedy", "paths") in seen
    assert ("specinfer", "iid", "sequences") in seen


@pytest.mark.slow
def test_every_verifier_and_tree_law_is_lossless_sweep(one_thread):
    count = 0
    for rule, law, model in _cases(slow=True):
        _check(rule, law, model)
        count += 1
    assert count > 400


@pytest.mark.parametrize("style", ["random", "q_zero", "one_hot", "same", "flat", "peaked"])
def test_walk_on_single_nodes_gives_one_plus_alpha_star(style):
    """At L = 1 the walk's expected tokens are 1 + the verifier's acceptance; for optimal and
    lp_optimal that is 1 + alpha* (md.optimal_acceptance), for the others at most that."""
    for seed, k in itertools.product(range(2), (1, 2, 3)):
        model = trees.TableModel.random(4, seed=100 + seed, style=style)
        p, q = model.p(), model.q()
        for kind in ("iid", "wor", "greedy"):
            law = md.drafts.make(kind, q, min(k, int((q > 0).sum())) if kind != "iid" else k)
            alpha = md.optimal_acceptance(p, law)
            for name in ("lp_optimal", "optimal", "specinfer", "rrs_wor", "spechub", "greedy_optimal", "nss"):
                rule = trees.TokenWalk(name, kind)
                tl = trees.kary(k, 1, kind)
                if not rule.supports(tl):
                    continue
                cert = _check(rule, tl, model)
                if name in ("lp_optimal", "optimal"):
                    assert abs(cert.expected_tokens - (1 + alpha)) <= 1e-9, (name, kind, k, style, cert, alpha)
                else:
                    assert cert.expected_tokens <= 1 + alpha + 1e-9, (name, kind, k, style)


def test_certificate_catches_a_lossy_rule():
    """A rule that always accepts the first draft along the tree is not lossless: the
    certificate must say so (the check can fail)."""

    class FirstDraft(trees.TreeRule):
        name = "first_draft"

        def supports(self, tree_law):
            return True

        def output_distribution(self, tree):
            i, toks = 0, ()
            while tree.nodes[i].drafts:
                i = tree.nodes[i].child[tree.nodes[i].drafts[0]]
                toks += (tree.nodes[i].token,)
            p = tree.p(i)
            return {toks + (y,): float(p[y]) for y in range(p.numel()) if p[y] > 0}

    model = trees.TableModel.random(3, seed=1, style="random")
    cert = trees.certify_tree(FirstDraft(), trees.kary(2, 2), model)
    assert cert.max_abs_error > 1e-3
    with pytest.raises(ValueError, match="not lossless"):
        trees.certify_tree(trees.TokenWalk("rrs_wor", "wor"), trees.kary(2, 2, "iid"), model)


def test_tree_law_enumeration_sums_to_one_and_sampling_matches():
    model = trees.TableModel.random(3, seed=4, style="mixed")
    for law in (trees.kary(2, 2, "wor"), trees.sequences(2, 2), trees.explicit([[0], [1], [1, 0]], "greedy")):
        listed = law.enumerate(model)
        assert abs(sum(w for _, w in listed) - 1) <= 1e-12

        def key(t):
            return tuple((nd.parent, nd.token, tuple(nd.drafts)) for nd in t.nodes)

        probs = {}
        for t, w in listed:
            probs[key(t)] = probs.get(key(t), 0.0) + w
        g = torch.Generator().manual_seed(0)
        n = 400
        counts: dict = {}
        for _ in range(n):
            k = key(law.sample(model, g))
            assert k in probs  # every sampled tree is one the enumeration lists
            counts[k] = counts.get(k, 0) + 1
        # the most likely tree's frequency within 5 standard deviations
        top = max(probs, key=probs.get)
        pt = probs[top]
        assert abs(counts.get(top, 0) / n - pt) <= 5 * (pt * (1 - pt) / n) ** 0.5 + 1e-9


def test_walk_samples_follow_its_exact_law():
    """verify() against output_distribution() on one fixed tree (chi-square, fixed seed)."""
    from scipy.stats import chi2  # noqa: F401  (scipy is a dependency of the LP verifiers)

    model = trees.TableModel.random(3, seed=7, style="random")
    law = trees.kary(2, 2, "iid")
    tree = law.sample(model, torch.Generator().manual_seed(3))
    for name in ("specinfer", "nss"):
        rule = trees.TokenWalk(name, "iid")
        exact = rule.output_distribution(tree)
        assert abs(sum(exact.values()) - 1) <= 1e-12
        g = torch.Generator().manual_seed(11)
        n = 1500
        counts: dict = {}
        for _ in range(n):
            y = rule.verify(tree, g).tokens(tree)
            assert y in exact
            counts[y] = counts.get(y, 0) + 1
        stat = sum((counts.get(y, 0) - n * w) ** 2 / (n * w) for y, w in exact.items() if w > 0)
        dof = max(1, sum(1 for w in exact.values() if w > 0) - 1)
        assert chi2.sf(stat, dof) > 1e-4, (name, stat, dof)
