"""A verifier checks the law it is told (issue 10): K, V, batch and q of a law object must
match the call, per-draft rows under a single-q law must agree, greedy drafts carry the top
K-1 tokens, wor drafts are distinct; every bad call raises a ValueError naming the argument
and never returns a verdict. Also: defaults that follow from the verifier, integer types."""
import numpy as np
import pytest
import torch

import multidraft as md
from multidraft import drafts as D
from multidraft._validate import as_int, as_k

V, B = 4, 6
G = lambda s=0: torch.Generator().manual_seed(s)  # noqa: E731
P = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
Q = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
Q2 = torch.tensor([0.25, 0.25, 0.3, 0.2], dtype=torch.float64)


def _qs(q, k):  # k per-draft rows for the independent law
    return torch.stack([q.roll(j) for j in range(k)]) if k > 1 else q.unsqueeze(0)


def _law(kind, q, k):
    return D.independent(_qs(q, k)) if kind == "independent" else D.make(kind, q, k)


def _combos():
    """(verifier, law kind, K): for each law a verifier supports, its smallest K >= 2 (K = 1 for naive)."""
    out = []
    for name in md.verifiers.names():
        v = md.verifiers.get(name)
        for kind in v.laws:
            k = next((k for k in (2, 3, 1) if v.supports(kind, k)), None)
            if k is not None:
                out.append((name, kind, k))
    return out


def _call(v, law, p, q, drafts, validate=True):
    """Both entry points must refuse; the caller's pytest.raises sees the first."""
    try:
        v.verify(p, q, drafts, generator=G(1), law=law, validate=validate)
    except ValueError:
        v.output_distribution(p, q, drafts, law=law)  # must raise too
        raise AssertionError("output_distribution accepted a call verify refused")  # pragma: no cover
    raise AssertionError("verify returned a verdict for a bad call")


def _good(kind, k):
    law = _law(kind, Q, k)
    drafts = law.sample(G(2), num_samples=B)  # [B, K]
    q = law.q.expand(B, *law.q.shape)
    return law, P.expand(B, V), q, drafts


@pytest.mark.parametrize("name,kind,k", _combos())
def test_matching_law_object_is_accepted(name, kind, k):
    v = md.verifiers.get(name)
    law, p, q, drafts = _good(kind, k)
    out = v.verify(p, q, drafts, generator=G(1), law=law)
    assert out.token.shape == (B,)
    assert torch.allclose(v.output_distribution(p, q, drafts, law=law).sum(-1), torch.ones(B, dtype=torch.float64))
    # the law's float64 form (what exact.certify passes) is the same q
    l32 = _law(kind, Q.float(), k)
    q64 = l32._q64().expand(B, *l32.q.shape)
    v.output_distribution(p, q64, l32.sample(G(3), num_samples=B), law=l32)


def _expect(match, v, law, p, q, drafts, validate=True):
    with pytest.raises(ValueError, match=match):
        v.verify(p, q, drafts, generator=G(1), law=law, validate=validate)
    with pytest.raises(ValueError, match=match):
        v.output_distribution(p, q, drafts, law=law)


@pytest.mark.parametrize("name,kind,k", _combos())
def test_law_object_with_other_k(name, kind, k):
    v = md.verifiers.get(name)
    law, p, q, drafts = _good(kind, k)
    wide = _law(kind, Q, k + 1)
    qw = wide.q.expand(B, *wide.q.shape)
    if v.supports(kind, k + 1):
        _expect(rf"law: the '{kind}' law was built for K = {k + 1} drafts but drafts has K = {k}", v, wide, p, qw if kind == "independent" else q, drafts)
    else:
        _expect(r"^law: ", v, wide, p, q, drafts)
    for validate in (True, False):  # cheap: checked even without validate
        with pytest.raises(ValueError, match="law: "):
            v.verify(p, qw if kind == "independent" else q, drafts, generator=G(), law=wide, validate=validate)


@pytest.mark.parametrize("name,kind,k", _combos())
def test_law_object_built_on_another_q(name, kind, k):
    v = md.verifiers.get(name)
    other = _law(kind, Q2, k)
    drafts = other.sample(G(4), num_samples=B)
    _, p, q, _ = _good(kind, k)
    _expect("draft_probs: not the q the law was built from", v, other, p, q, drafts)
    # a float32 copy of a float64 law's q is not its q either
    _expect("draft_probs: not the q the law was built from", v, _law(kind, Q, k), p, q.float(), _good(kind, k)[3])


@pytest.mark.parametrize("name,kind,k", _combos())
def test_law_object_with_other_v_or_batch(name, kind, k):
    v = md.verifiers.get(name)
    law, p, q, drafts = _good(kind, k)
    q5 = torch.tensor([0.3, 0.3, 0.2, 0.1, 0.1], dtype=torch.float64)
    _expect("law: the law has V = 5 but target_probs and draft_probs have V = 4", v, _law(kind, q5, k), p, q, drafts)
    batched = _law(kind, Q.expand(3, V), k) if kind != "independent" else D.independent(_qs(Q, k).expand(3, k, V))
    _expect(r"law: batch shape \(3,\) does not broadcast to the batch shape \(6,\)", v, batched, p, q, drafts)
    # a law over exactly this batch is fine
    full = _law(kind, Q.expand(B, V), k) if kind != "independent" else D.independent(q)
    v.verify(p, full.q, drafts, generator=G(), law=full)


def _shared(name):
    v = md.verifiers.get(name)
    return [(kind, next((k for k in (2, 3) if v.supports(kind, k)), None)) for kind in ("iid", "wor", "greedy")]


@pytest.mark.parametrize("name", md.verifiers.names())
def test_per_draft_rows_that_differ_under_a_single_q_law(name):
    v = md.verifiers.get(name)
    for kind, k in _shared(name):
        if k is None:
            continue
        law = _law(kind, Q, k)
        drafts = law.sample(G(5), num_samples=B)
        per = torch.stack([Q] + [Q2] * (k - 1)).expand(B, k, V)  # rows differ
        _expect(rf"draft_probs: the per-draft rows .* differ .* '{kind}' law .* law='independent'", v, kind, P.expand(B, V), per, drafts)
        same = Q.expand(B, k, V)  # identical rows are one shared q
        assert torch.equal(v.output_distribution(P.expand(B, V), same, drafts, law=kind),
                           v.output_distribution(P.expand(B, V), Q.expand(B, V), drafts, law=kind))


@pytest.mark.parametrize("name", ["greedy_optimal", "spechub", "nss", "lp_optimal"])
def test_greedy_drafts_must_carry_the_top_of_q(name):
    v = md.verifiers.get(name)
    p, q = P.expand(B, V), Q.expand(B, V)
    bad = torch.tensor([[1, 3]] * B)  # top of Q is token 0
    _expect(r"drafts: under the greedy law drafts\[..., :K-1\] are the top K-1 = 1 tokens .* has \[1\], expected \[0\]", v, "greedy", p, q, bad)
    _expect("drafts: under the greedy law", v, D.greedy(Q, 2), p, q, bad)
    v.verify(p, q, torch.tensor([[0, 3]] * B), generator=G(), law="greedy")
    # ties: any of the tied tokens is a top set
    qt = torch.tensor([0.3, 0.3, 0.2, 0.2], dtype=torch.float64).expand(B, V)
    for first in (0, 1):  # (lp_optimal enumerates the law, whose tie rule is the lower id)
        if name != "lp_optimal" or first == 0:
            v.verify(p, qt, torch.tensor([[first, 2]] * B), generator=G(), law="greedy")
    if v.supports("greedy", 3):
        _expect("drafts: under the greedy law", v, "greedy", p, q, torch.tensor([[0, 2, 1]] * B))
        if name != "lp_optimal":  # the rules that read T as a set take it in any order
            v.verify(p, q, torch.tensor([[1, 0, 3]] * B), generator=G(), law="greedy")


@pytest.mark.parametrize("name", [n for n in md.verifiers.names() if md.verifiers.get(n).supports("wor", 2)])
def test_wor_drafts_are_distinct(name):
    v = md.verifiers.get(name)
    rep = torch.tensor([[0, 1]] * (B - 1) + [[2, 2]])
    for validate in (True, False):
        with pytest.raises(ValueError, match="drafts: the 'wor' law gives K distinct draft tokens"):
            v.verify(P.expand(B, V), Q.expand(B, V), rep, generator=G(), law="wor", validate=validate)


# defaults that follow from the choice ------------------------------------------------------
def test_implied_law():
    get = md.verifiers.get
    assert get("rrs_wor").implied_law(2) == "wor"
    assert get("greedy_optimal").implied_law(3) == "greedy"
    assert get("spechub").implied_law(np.int64(2)) == "greedy"
    for name in ("specinfer", "spectr", "khisti_is", "nss", "lp_optimal", "optimal"):
        assert get(name).implied_law(2) == "iid"
    assert get("naive").implied_law(1) == "iid"
    assert get("khisti_is").laws_for(2) == ("iid", "independent")
    with pytest.raises(ValueError, match=r"k: verifier 'spechub' takes K = 2 drafts, got K = 3"):
        get("spechub").implied_law(3)
    with pytest.raises(ValueError, match="k: verifier 'naive' takes K = 1"):
        get("naive").implied_law(2)
    # verify/output_distribution use it when law is None
    d = D.without_replacement(Q, 2).sample(G(), num_samples=B)
    out = get("rrs_wor").output_distribution(P.expand(B, V), Q.expand(B, V), d)
    assert torch.equal(out, get("rrs_wor").output_distribution(P.expand(B, V), Q.expand(B, V), d, law="wor"))
    g = D.greedy(Q, 2).sample(G(), num_samples=B)
    get("greedy_optimal").verify(P.expand(B, V), Q.expand(B, V), g, generator=G())
    get("spechub").verify(P.expand(B, V), Q.expand(B, V), g, generator=G())


def test_unsupported_pair_names_what_works():
    d = torch.tensor([[0, 1]] * B)
    with pytest.raises(ValueError, match=r"law: verifier 'rrs_wor' is not lossless for the 'iid' draft law with K = 2: "
                                         r"it supports only the 'wor' law with K = 2; for 'iid' with K = 2 use one of nss, specinfer, spectr"):
        md.verifiers.get("rrs_wor").verify(P.expand(B, V), Q.expand(B, V), d, generator=G(), law="iid")
    with pytest.raises(ValueError, match=r"'spechub' .* 'greedy' draft law with K = 3: it takes K = 2 drafts .* use one of nss, greedy_optimal, lp_optimal"):
        md.verifiers.get("spechub").verify(P.expand(B, V), Q.expand(B, V), torch.tensor([[0, 1, 2]] * B), generator=G(), law="greedy")
    with pytest.raises(ValueError, match=r"'spectr' .* 'wor' .* it supports only the 'iid' law with K = 2; for 'wor' with K = 2 use one of nss, rrs_wor, lp_optimal"):
        md.verifiers.get("spectr").output_distribution(P.expand(B, V), Q.expand(B, V), d, law="wor")


def test_lp_optimal_without_law_and_per_draft_rows_names_law():
    qs = torch.stack([Q, Q2])  # [K, V], rows differ
    with pytest.raises(ValueError, match=r"^law: not given, .* pass law='independent'"):
        md.verifiers.get("lp_optimal").output_distribution(P, qs, torch.tensor([0, 1]))
    out = md.verifiers.get("lp_optimal").output_distribution(P, qs, torch.tensor([0, 1]), law="independent")
    assert abs(float(out.sum()) - 1) < 1e-12


# integers ----------------------------------------------------------------------------------
def test_numpy_integers_are_integers():
    k = np.int64(2)
    for law in (D.iid(Q, k), D.without_replacement(Q, k), D.greedy(Q, k), D.make("iid", Q, np.int32(2)),
                D.make("independent", Q, k)):
        assert law.k == 2 and type(law.k) is int
        assert law.sample(G(), num_samples=np.int64(3)).shape == (3, 2)
    assert md.verifiers.get("specinfer").supports("iid", k)
    assert as_k(torch.tensor(3)) == 3 and as_int(np.uint8(4), "x") == 4


@pytest.mark.parametrize("bad", [2.7, 2.0, True, "2", None, np.float64(2.0), torch.tensor([2, 3])])
def test_non_integers_are_refused(bad):
    if bad is not None:
        with pytest.raises(ValueError, match="num_samples must be an integer >= 1"):
            D.iid(Q, 2).sample(G(), num_samples=bad)
        with pytest.raises(ValueError, match="k must be a positive integer"):
            D.iid(Q, bad)
    with pytest.raises(ValueError, match="num_samples must be >= 1, got 0"):
        D.iid(Q, 2).sample(G(), num_samples=np.int64(0))


def test_provenance_is_one_record():
    """One provenance record (``_machine.provenance``): its keys, and the profile's machine_info and
    every meta row carry it (with the keys older files had beside it)."""
    import torch  # noqa: F401  (torch_threads is read from the imported torch)

    from multidraft import _machine
    from multidraft.experiments.records import meta_row

    p = _machine.provenance()
    assert tuple(p) == _machine.PROVENANCE_KEYS
    assert p["versions"]["python"] and "torch" in p["versions"] and isinstance(p["cpu"], str)
    assert p["cpu_flags"] is None or set(p["cpu_flags"]) <= _machine.SPEED_FLAGS
    assert p["load_average"] is None or len(p["load_average"]) == 3
    assert _machine.cpu_flags("processor : 0\nflags\t\t: fpu avx2 fma\n") == {"fpu", "avx2", "fma"}
    assert _machine.cpu_model("model name\t: Test CPU\n") == "Test CPU"
    meta = meta_row({"a": 1}, 3)
    assert set(_machine.PROVENANCE_KEYS) <= set(meta) and meta["versions"]["torch"]
    assert _machine.versions(also=("no_such_module_xyz",))["no_such_module_xyz"] is None


@pytest.mark.parametrize("name,kind,k", _combos())
def test_tensors_are_read_by_value(name, kind, k):
    """Issue 41: a tensor that requires grad is read detached (the same tokens and law as the
    detached one; nothing returned requires grad); sparse and meta tensors are refused in one
    ValueError naming the argument, where they ended in torch errors."""
    v = md.verifiers.get(name)
    law = _law(kind, Q2, k)
    q = law.q
    drafts = law.sample(G(1))
    ref = v.verify(P, q, drafts, G(2), law=law)
    got = v.verify(P.clone().requires_grad_(), q, drafts, G(2), law=law)
    assert torch.equal(got.token, ref.token)
    out = v.output_distribution(P.clone().requires_grad_(), q, drafts, law=law)
    assert not out.requires_grad and torch.equal(out, v.output_distribution(P, q, drafts, law=law))
    for bad, what in ((P.to("meta"), "meta tensor"), (P.to_sparse(), "dense tensor")):
        with pytest.raises(ValueError, match=f"target_probs.*{what}"):
            v.verify(bad, q, drafts, G(2), law=law)
    with pytest.raises(ValueError, match="drafts.*dense tensor"):
        v.verify(P, q, drafts.to_sparse(), G(2), law=law)


def test_laws_and_limits_read_tensors_by_value():
    with pytest.raises(ValueError, match="q is a meta tensor"):
        D.iid(Q.to("meta"), 2)
    with pytest.raises(ValueError, match="p must be a dense tensor"):
        md.optimal_acceptance(P.to_sparse(), D.iid(Q, 2))
    a = md.optimal_acceptance(P.clone().requires_grad_(), D.iid(Q.clone().requires_grad_(), 2))
    assert float(a) == float(md.optimal_acceptance(P, D.iid(Q, 2)))
    assert not D.iid(Q.clone().requires_grad_(), 2).sample(G(0)).requires_grad


def test_a_float32_law_takes_its_q_widened_to_float64():
    """Issue 41: draft_probs holding a float32 law's q as float64 values (``law.q.double()``) is
    the law's q: read as the law's renormalised row, so tokens and the exact law equal those of
    the float32 q; other float64 values are still refused."""
    g = G(5)
    p = torch.softmax(torch.randn(3, 50, generator=g, dtype=torch.float64), -1)
    q32 = torch.softmax(torch.randn(3, 50, generator=g), -1)
    assert bool(((q32.double().sum(-1) - 1).abs() > 0).any())  # the widened rows are not normalised
    for name in ("specinfer", "optimal", "khisti_is"):
        v = md.verifiers.get(name)
        law = D.iid(q32, 3)
        x = law.sample(G(1))
        ref = v.verify(p, q32, x, G(2), law=law).token
        assert torch.equal(v.verify(p, q32.double(), x, G(2), law=law).token, ref)
        assert torch.equal(v.output_distribution(p, q32.double(), x, law=law), v.output_distribution(p, q32, x, law=law))
        per = q32.double().unsqueeze(-2).expand(3, 3, 50)
        assert torch.equal(v.verify(p, per, x, G(2), law=law).token, ref)
        with pytest.raises(ValueError, match="not the q the law was built from"):
            v.verify(p, (q32.double() * 1.5 + 1e-3).softmax(-1), x, G(2), law=law)
