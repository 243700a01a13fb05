"""Bad input to any verifier: a ValueError naming the argument, never a silent NaN."""
import pytest
import torch

import multidraft as md

P = torch.tensor([[0.2, 0.3, 0.5], [0.6, 0.2, 0.2]], dtype=torch.float64)
Q = torch.tensor([[0.5, 0.25, 0.25], [0.1, 0.1, 0.8]], dtype=torch.float64)
D1 = torch.tensor([[0], [2]])
G = lambda: torch.Generator().manual_seed(0)  # noqa: E731


def _all():
    return [md.verifiers.get(n) for n in md.verifiers.names()]


def _drafts_for(v):
    k = max(v.min_k, 1)
    law = v.default_law if v.supports(v.default_law, k) else next(l for l in v.laws if v.supports(l, k))
    return k, law, torch.tensor([[0, 1, 2, 0][:k], [2, 1, 0, 2][:k]])


@pytest.mark.parametrize("name", md.verifiers.names())
@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda p, q, d: (p.clone().index_put_((torch.tensor([0]), torch.tensor([1])), torch.tensor(float("nan"), dtype=torch.float64)), q, d), "target_probs contains NaN"),
        (lambda p, q, d: (p, q.clone().index_put_((torch.tensor([1]), torch.tensor([1])), torch.tensor(float("inf"), dtype=torch.float64)), d), "draft_probs contains NaN or inf"),
        (lambda p, q, d: (p * 1.1, q, d), "target_probs must sum to 1"),
        (lambda p, q, d: (p, torch.tensor([[1.2, -0.1, -0.1], [0.1, 0.1, 0.8]], dtype=torch.float64), d), "draft_probs has negative"),
        (lambda p, q, d: (p, q[:, :2] / q[:, :2].sum(-1, keepdim=True), d), "draft_probs has V = 2"),
        (lambda p, q, d: (p, q, d[:1]), "drafts has batch shape"),
        (lambda p, q, d: (p, q, d + 5), "outside the vocabulary"),
        (lambda p, q, d: (p, q, d[:, :0]), "K >= 1"),
        (lambda p, q, d: (p, q, d.double()), "integer token ids"),
        (lambda p, q, d: (p, q[:1], d), "draft_probs has shape"),
    ],
)
def test_bad_input_names_the_argument(name, mutate, match):
    v = md.verifiers.get(name)
    k, law, d = _drafts_for(v)
    q = Q
    p2, q2, d2 = mutate(P, q, d)
    with pytest.raises(ValueError, match=match):
        v.verify(p2, q2, d2, generator=G(), law=law)
    with pytest.raises(ValueError, match=match):
        v.output_distribution(p2, q2, d2, law=law)


@pytest.mark.parametrize("name", md.verifiers.names())
def test_draft_with_zero_draft_probability(name):
    v = md.verifiers.get(name)
    k, law, d = _drafts_for(v)
    q = torch.tensor([[0.0, 0.5, 0.5], [0.5, 0.5, 0.0]], dtype=torch.float64)
    d = torch.tensor([[1, 0, 2, 1][:k], [2, 0, 1, 2][:k]])
    with pytest.raises(ValueError, match="drafts: token . has draft probability 0"):
        v.verify(P, q, d, generator=G(), law=law)


@pytest.mark.parametrize("name", md.verifiers.names())
def test_unsupported_law_and_k(name):
    v = md.verifiers.get(name)
    for kind in ("iid", "wor", "greedy", "independent"):
        for k in (1, 2, 3):
            if not v.supports(kind, k):
                d = torch.tensor([[0, 1, 2][:k], [2, 1, 0][:k]])
                with pytest.raises(ValueError, match="law: verifier"):
                    v.verify(P, Q, d, generator=G(), law=kind)
    with pytest.raises(ValueError, match="unknown draft law"):
        v.supports("bogus")


@pytest.mark.parametrize("name", md.verifiers.names())
def test_generator_is_required(name):
    v = md.verifiers.get(name)
    k, law, d = _drafts_for(v)
    with pytest.raises(TypeError, match="generator"):
        v.verify(P, Q, d, law=law)  # no default: randomness is always explicit
    for bad in (None, 1.5, True, "0"):
        with pytest.raises(ValueError, match="generator must be"):
            v.verify(P, Q, d, bad, law=law)


@pytest.mark.parametrize("name", md.verifiers.names())
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_low_precision_inputs(name, dtype):
    v = md.verifiers.get(name)
    k, law, d = _drafts_for(v)
    p = torch.softmax(torch.randn(4, 50, generator=G()), -1)
    q = torch.softmax(torch.randn(4, 50, generator=G()) * 0.5 + torch.log(p), -1)
    d = torch.stack([torch.topk(q[i], k).indices for i in range(4)])
    out = v.verify(p.to(dtype), q.to(dtype), d, generator=G(), law=law)
    assert out.token.shape == (4,) and out.token.dtype == torch.int64
    assert bool(((out.token >= 0) & (out.token < 50)).all())


def test_unknown_verifier():
    with pytest.raises(ValueError, match="unknown verifier 'nope'"):
        md.verifiers.get("nope")


def test_verdict_shapes_batched():
    v = md.verifiers.get("naive")
    p = torch.softmax(torch.randn(2, 3, 10, generator=G()), -1)
    q = torch.softmax(torch.randn(2, 3, 10, generator=G()), -1)
    d = md.drafts.iid(q, 1).sample(G())
    out = v.verify(p, q, d, generator=G())
    assert out.token.shape == (2, 3) and out.accepted_index.shape == (2, 3)
    assert v.output_distribution(p, q, d).shape == (2, 3, 10)


@pytest.mark.parametrize("name", [n for n in md.verifiers.names() if n != "lp_optimal"])
@pytest.mark.parametrize("k", [1, 2, 4])
def test_prepared_rows_equal_the_expanded_call(name, k):
    """prepare(p, q).output_distribution(drafts [c, n, K]) is the output_distribution of the
    expanded rows (bit for bit but for khisti_is's last bit), for every verifier and law it takes (the experiments and the
    certificates rely on it: the work on (p, q) alone is done once)."""
    from multidraft.experiments.acceptance import make_law

    v = md.verifiers.get(name)
    for law in v.laws_for(k):
        g = torch.Generator().manual_seed(k)
        n, V, c = 3, 40, 5
        p = torch.rand(n, V, generator=g, dtype=torch.float64) ** 3
        p[:, :4] = p[:, :1]
        p /= p.sum(-1, keepdim=True)
        q = torch.rand(n, k, V, generator=g, dtype=torch.float64) ** 2 if law == "independent" else torch.rand(n, V, generator=g, dtype=torch.float64) ** 2
        q /= q.sum(-1, keepdim=True)
        drafts = make_law(q, law, k).sample(g, num_samples=c)  # [c, n, K]
        prepared = v.prepare(p, q, law=law)
        got = prepared.output_distribution(drafts)
        want = v.output_distribution(p.unsqueeze(0).expand(c, *p.shape), q.unsqueeze(0).expand(c, *q.shape), drafts, law=law)
        assert got.shape == (c, n, V)
        if name == "khisti_is":  # its q_I histograms are matrix products over n rows instead of c * n:
            # BLAS blocks them differently, so entries may differ in the last bit
            torch.testing.assert_close(got, want, rtol=0, atol=1e-15)
            torch.testing.assert_close(prepared.output_distribution(drafts[:2]), want[:2], rtol=0, atol=1e-15)
        else:
            assert torch.equal(got, want), (name, law, k, float((got - want).abs().max()))
            assert torch.equal(prepared.output_distribution(drafts[:2]), want[:2])  # the state is reused


@pytest.mark.parametrize("name", ["optimal", "khisti_is", "specinfer"])
def test_prepared_rows_check_their_drafts(name):
    v = md.verifiers.get(name)
    k, law, d = _drafts_for(v)
    prepared = v.prepare(P, Q, law=law)
    with pytest.raises(ValueError, match=r"drafts must be \[c, 2, K\]"):
        prepared.output_distribution(d)  # no leading tuple dimension
    with pytest.raises(ValueError, match="outside the vocabulary"):
        prepared.output_distribution((d + 5).unsqueeze(0))
    with pytest.raises(ValueError, match="target_probs must sum to 1"):
        v.prepare(P * 1.1, Q, law=law)


def test_check_names_is_the_one_check_of_verifier_lists():
    from multidraft._errors import ArgumentError

    assert md.verifiers.check_names("optimal") == ("optimal",)
    assert md.verifiers.check_names(["specinfer", "spectr"]) == ("specinfer", "spectr")
    with pytest.raises(ArgumentError, match="^verifiers is empty") as e:
        md.verifiers.check_names([])
    assert e.value.arg == "verifiers"
    with pytest.raises(ArgumentError, match="unknown verifier 'nope'; registered: naive") as e:
        md.verifiers.check_names(("specinfer", "nope"), "names")
    assert e.value.arg == "names"
