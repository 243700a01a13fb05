"""Draft laws: enumeration sums to one, prob matches sampling, batching, bad input."""
from collections import Counter

import pytest
import torch

import multidraft as md
from multidraft import drafts as D
from multidraft._validate import derive_seed


def _q(V, seed, zeros=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.rand(V, generator=g, dtype=torch.float64)
    if zeros:
        q[torch.randperm(V, generator=g)[:zeros]] = 0
    return q / q.sum()


LAWS = [
    ("iid", lambda q, k: D.iid(q, k)),
    ("wor", lambda q, k: D.without_replacement(q, k)),
    ("greedy", lambda q, k: D.greedy(q, k)),
    ("independent", lambda q, k: D.independent(torch.stack([q.roll(j) for j in range(k)]))),
]


@pytest.mark.parametrize("name,make", LAWS)
@pytest.mark.parametrize("k", [1, 2, 3])
def test_enumerate_sums_to_one_and_matches_prob(name, make, k):
    q = _q(5, 10 * k, zeros=1)
    law = make(q, k)
    assert law.kind == name and law.k == k
    tuples, probs = law.enumerate()
    assert tuples.shape[1] == k
    assert probs.dtype == torch.float64
    assert abs(float(probs.sum()) - 1) < 1e-12
    assert torch.allclose(law.prob(tuples), probs, rtol=0, atol=1e-15)
    assert len({tuple(t) for t in tuples.tolist()}) == len(tuples)


@pytest.mark.parametrize("name,make", LAWS)
def test_sampling_matches_enumeration(name, make):
    q = _q(4, 3)
    law = make(q, 2)
    tuples, probs = law.enumerate()
    n = 40_000
    s = law.sample(torch.Generator().manual_seed(7), num_samples=n)
    assert s.shape == (n, 2)
    counts = Counter(map(tuple, s.tolist()))
    assert set(counts) <= {tuple(t) for t in tuples.tolist()}
    # chi-square, df = N - 1; threshold far beyond the 0.999 quantile for these sizes
    exp = probs * n
    obs = torch.tensor([counts[tuple(t)] for t in tuples.tolist()], dtype=torch.float64)
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < 3 * len(tuples) + 30, chi2


def test_sampling_is_reproducible_and_batched():
    q = torch.softmax(torch.randn(3, 7, 50, generator=torch.Generator().manual_seed(0)), -1)
    for law in (D.iid(q, 4), D.without_replacement(q, 4), D.greedy(q, 4)):
        a = law.sample(1)
        b = law.sample(1)  # an integer seed names a stream: the same seed, the same drafts
        assert a.shape == (3, 7, 4) and torch.equal(a, b)
        c = law.sample(torch.Generator().manual_seed(derive_seed(1, "drafts")))
        assert torch.equal(a, c)  # ... the seed's "drafts" stream
        assert bool((law.prob(a) > 0).all())
    wor = D.without_replacement(q, 4).sample(2)
    assert bool((wor.sort(-1).values.diff(dim=-1) != 0).all())


def test_greedy_structure():
    q = torch.tensor([0.1, 0.4, 0.2, 0.2, 0.1], dtype=torch.float64)
    law = D.greedy(q, 3)
    assert law.top_set().tolist() == [1, 2]  # tie 0.2/0.2 broken to the lower id
    tuples, probs = law.enumerate()
    assert tuples[:, :2].tolist() == [[1, 2]] * 3
    assert torch.allclose(probs, torch.tensor([0.25, 0.5, 0.25], dtype=torch.float64))


def test_wor_prob_formula():
    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    law = D.without_replacement(q, 2)
    assert float(law.prob(torch.tensor([1, 0]))) == pytest.approx(0.3 * 0.5 / 0.7, abs=1e-15)
    assert float(law.prob(torch.tensor([1, 1]))) == 0.0


@pytest.mark.parametrize(
    "call,match",
    [
        (lambda: D.iid(torch.tensor([0.5, float("nan")]), 1), "q contains NaN"),
        (lambda: D.iid(torch.tensor([0.5, 0.6]), 1), "q must sum to 1"),
        (lambda: D.iid(torch.tensor([1.5, -0.5]), 1), "q has negative"),
        (lambda: D.iid(torch.tensor([0.5, 0.5]), 0), "k must be >= 1"),
        (lambda: D.iid(torch.tensor([0.5, 0.5]), 1.5), "k must be a positive integer"),
        (lambda: D.without_replacement(torch.tensor([0.5, 0.5, 0.0]), 3), "at least k = 3"),
        (lambda: D.greedy(torch.tensor([1.0, 0.0]), 2), "at least k = 2"),
        (lambda: D.independent(torch.tensor([0.5, 0.5])), "qs must have at least 2"),
        (lambda: D.iid(torch.tensor([0.5, 0.5]), 1).sample(None), "generator must be"),
        (lambda: D.iid(torch.tensor([0.5, 0.5]), 2).prob(torch.tensor([0, 2])), "outside the vocabulary"),
        (lambda: D.iid(torch.tensor([0.5, 0.5]), 2).prob(torch.tensor([0])), "last dimension K = 2"),
        (lambda: D.iid(torch.ones(2, 3) / 3, 2).enumerate(), "unbatched"),
    ],
)
def test_bad_input(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_half_precision_accepted_and_renormalised():
    q = torch.softmax(torch.randn(1000, generator=torch.Generator().manual_seed(0)), -1).to(torch.bfloat16)
    law = D.iid(q, 2)
    assert law.q.dtype == torch.float64  # half values are exact in float64, normalised there (issue 41)
    assert abs(float(law.q.sum()) - 1) < 1e-12
    assert torch.equal(law.q, q.double() / q.double().sum())


def test_public_names():
    assert md.drafts.iid is D.iid and md.drafts.without_replacement and md.drafts.greedy and md.drafts.independent


def test_float32_law_is_exact_in_float64():
    """A float32 q (sums to 1 only to ~1e-7) still gives an exactly normalised float64 law."""
    q = torch.softmax(torch.randn(6, generator=torch.Generator().manual_seed(5)), -1)
    for law in (D.iid(q, 3), D.without_replacement(q, 3), D.greedy(q, 3)):
        _, probs = law.enumerate()
        assert abs(float(probs.sum()) - 1) < 1e-14
    p = torch.softmax(torch.randn(6, generator=torch.Generator().manual_seed(6)), -1)
    assert md.certify("rrs_wor", p, D.without_replacement(q, 3)).max_abs_error < 1e-12


def test_make_by_name():
    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    assert D.make("iid", q, 2).kind == "iid"
    assert D.make("without_replacement", q, 2).kind == "wor"
    assert D.make("greedy", q, 2).kind == "greedy"
    ind = D.make("independent", q, 3)
    assert ind.kind == "independent" and ind.k == 3 and ind.q.shape == (3, 3)
    with pytest.raises(ValueError, match="unknown draft law"):
        D.make("bogus", q, 2)
    with pytest.raises(ValueError, match="k is required"):
        D.make("iid", q)


@pytest.mark.parametrize("q", [[0.97, 0.01, 0.01, 0.01], [0.6, 0.2, 0.15, 0.05], [0.25, 0.25, 0.25, 0.25]])
def test_wor_sampler_exact_on_both_paths(q):
    """The i.i.d.-stream path and the exponential-race fallback (peaked q) both give the
    successive-sampling law exactly (chi-square against enumeration)."""
    from scipy import stats

    q = torch.tensor(q, dtype=torch.float64)
    law = D.without_replacement(q, 3)
    tuples, probs = law.enumerate()
    n = 60_000
    s = law.sample(torch.Generator().manual_seed(11), num_samples=n)
    counts = Counter(map(tuple, s.tolist()))
    assert set(counts) <= {tuple(t) for t in tuples.tolist()}
    obs = torch.tensor([counts[tuple(t)] for t in tuples.tolist()], dtype=torch.float64)
    exp = probs * n
    chi2 = float(((obs - exp) ** 2 / exp).sum())
    assert chi2 < stats.chi2.ppf(1 - 1e-6, len(tuples) - 1), chi2


def test_wor_sampler_exact_in_chunks_of_rows(monkeypatch):
    """Rows are sampled in chunks (bounded memory); with many chunks and both paths mixed in
    one batch the law is still exactly successive sampling (chi-square per row kind)."""
    from scipy import stats

    flat = torch.tensor([0.3, 0.3, 0.2, 0.2], dtype=torch.float64)   # stream path
    peaked = torch.tensor([0.9, 0.05, 0.03, 0.02], dtype=torch.float64)  # exponential race
    monkeypatch.setattr(D.WithoutReplacement, "CHUNK_BYTES", 8 * 4 * 700)  # 700 rows per chunk
    n = 15_000
    q = torch.stack([flat, peaked]).repeat(n, 1)  # [2n, 4], alternating rows
    s = D.without_replacement(q, 3).sample(torch.Generator().manual_seed(3))  # [2n, 3]
    for j, row in enumerate((flat, peaked)):
        tuples, probs = D.without_replacement(row, 3).enumerate()
        counts = Counter(map(tuple, s[j::2].tolist()))
        assert set(counts) <= {tuple(t) for t in tuples.tolist()}
        obs = torch.tensor([counts[tuple(t)] for t in tuples.tolist()], dtype=torch.float64)
        chi2 = float(((obs - probs * n) ** 2 / (probs * n)).sum())
        assert chi2 < stats.chi2.ppf(1 - 1e-6, len(tuples) - 1), (j, chi2)


def test_law_construction_does_not_build_count_tensors():
    """_check_nnz reads the k-th largest entry per row (topk), and still names a bad row."""
    q = torch.tensor([[0.5, 0.5, 0.0], [0.2, 0.3, 0.5]], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"q has only 2 token\(s\) with positive probability in some row; .* at least k = 3"):
        D.without_replacement(q, 3)
    with pytest.raises(ValueError, match="q has V = 3 tokens; the greedy law needs at least k = 4"):
        D.greedy(q[1], 4)
    assert D.without_replacement(q, 2).k == 2


# one-token draws (the K = 1 laws, the greedy law's last draft, the independent law) -------------
def test_categorical_is_the_inverse_cdf_of_its_uniforms():
    """_categorical reads one float64 uniform per row, in row order, and returns the first
    token whose cumulative mass exceeds u * total: the same draws as that definition."""
    g = torch.Generator().manual_seed(12)
    q = torch.rand(64, 9, generator=g, dtype=torch.float64)
    q[q < 0.3] = 0.0
    q[:, 4] += 0.1  # every row has mass
    q32 = q.float()
    for x in (q, q32, q32 * 3.0):  # any scale: the law is q / sum(q)
        s = torch.Generator().manual_seed(5)
        u = torch.rand(64, 1, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
        got = D._categorical(x, s)
        c = torch.cumsum(x.double(), -1)
        want = (c <= u * c[:, -1:]).sum(-1)  # number of entries <= target = first index above it
        assert torch.equal(got, want)
        assert bool((x.gather(-1, got.unsqueeze(-1)) > 0).all())


def test_categorical_law_exact_on_a_grid_of_uniforms(monkeypatch):
    """Stratified uniforms u_i = (i + 1/2) / n: the token frequencies equal q / sum(q) to 1/n,
    zeros never drawn, and a target that rounds up to the total (u = 1) lands on the last
    positive token, never past it."""
    q = torch.tensor([0.0, 0.25, 0.0, 0.125, 0.5, 0.125, 0.0, 0.0], dtype=torch.float32) * 0.7
    n = 4096
    grid = ((torch.arange(n, dtype=torch.float64) + 0.5) / n).unsqueeze(-1)
    real_rand = torch.rand
    monkeypatch.setattr(torch, "rand", lambda *a, **k: grid.clone())
    got = D._categorical(q.expand(n, -1), torch.Generator())
    freq = torch.bincount(got, minlength=8).double() / n
    assert torch.allclose(freq, q.double() / q.double().sum(), atol=1.0 / n, rtol=0)
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.ones(3, 1, dtype=torch.float64))
    assert D._categorical(q.expand(3, -1), torch.Generator()).tolist() == [5, 5, 5]
    monkeypatch.setattr(torch, "rand", real_rand)


@pytest.mark.parametrize("name,make", LAWS)
@pytest.mark.parametrize("k", [1, 3])
def test_sampling_matches_enumeration_k(name, make, k):
    """The law of the sampled tuples is the enumerated law (chi-square) at K = 1 (one-token
    draws by inverse CDF) and K = 3 (the greedy top set without a sort, then one draw)."""
    from scipy import stats

    q = _q(6, 17 + k, zeros=1)
    law = make(q, k)
    tuples, probs = law.enumerate()
    n = 30_000
    s = law.sample(torch.Generator().manual_seed(8), num_samples=n)
    counts = Counter(map(tuple, s.tolist()))
    assert set(counts) <= {tuple(t) for t in tuples.tolist()}
    obs = torch.tensor([counts[tuple(t)] for t in tuples.tolist()], dtype=torch.float64)
    chi2 = float(((obs - probs * n) ** 2 / (probs * n)).sum())
    assert chi2 < stats.chi2.ppf(1 - 1e-6, max(1, len(tuples) - 1)), chi2


def test_greedy_top_set_at_full_vocabulary_equals_the_stable_sort():
    """V = 151,936 with bf16-rounded probabilities (exact ties in the head): the top set the
    sampler and top_set() use is the first K-1 of a stable descending sort, and the sampled
    last draft is outside it with q > 0."""
    g = torch.Generator().manual_seed(9)
    logits = (torch.randn(4, 151936, generator=g) * 2.5).bfloat16().float()
    q = torch.softmax(logits, -1)
    q[1, 10:20] = q[1].max()  # ten equal maxima
    q = q / q.sum(-1, keepdim=True)
    order = torch.sort(q, dim=-1, descending=True, stable=True).indices
    for k in (2, 3, 5, 8):
        law = D.greedy(q, k)
        assert torch.equal(law.top_set(), order[:, : k - 1])
        s = law.sample(torch.Generator().manual_seed(k))
        assert torch.equal(s[:, : k - 1], order[:, : k - 1])
        assert not bool((s[:, -1:] == s[:, : k - 1]).any())
        assert bool((q.gather(-1, s[:, -1:]) > 0).all())


def test_categorical_chunks_of_rows_do_not_change_the_draws(monkeypatch):
    """Rows are cumulated in chunks (bounded temporaries); the uniforms are drawn for all rows
    first, so the draws do not depend on the chunk size."""
    q = torch.softmax(torch.randn(7, 3, 500, generator=torch.Generator().manual_seed(4)), -1)
    a = D._categorical(q, torch.Generator().manual_seed(1))
    monkeypatch.setattr(D, "CATEGORICAL_CHUNK_ELEMS", 1200)  # 2 rows per chunk
    b = D._categorical(q, torch.Generator().manual_seed(1))
    assert a.shape == (7, 3) and torch.equal(a, b)
