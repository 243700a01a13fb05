"""multidraft._scan: the fast CPU routes give exactly the plain torch results."""
import pytest
import torch

import multidraft._scan as _scan
from multidraft._scan import (_lift_numpy, _lift_torch, argsort_desc_stable, cummin, ipow, rev_cummin, segment_search,
                              top_desc_stable)


def _rows(g, trial):
    R, V = int(torch.randint(1, 5, (1,), generator=g)), int(torch.randint(1, 300, (1,), generator=g))
    if trial % 3 == 0:
        x = torch.rand(R, V, generator=g, dtype=torch.float64)
    else:  # many exact ties
        x = torch.randint(0, 6, (R, V), generator=g).double() / 3
    if trial % 5 == 0:
        x[:, : V // 2] = torch.inf
    if trial % 7 == 0:
        x = x.float()
    return x


def test_argsort_equals_the_stable_torch_sort_with_ties():
    g = torch.Generator().manual_seed(3)
    for trial in range(150):
        x = _rows(g, trial)
        ref = torch.sort(x, dim=-1, descending=True, stable=True).indices
        assert torch.equal(argsort_desc_stable(x), ref), trial


def test_argsort_signed_values_zeros_and_infinities():
    """The integer-key route orders negative values, -0.0 (equal to 0.0: a tie kept in index
    order) and both infinities exactly like the stable float sort, float32 and float64."""
    g = torch.Generator().manual_seed(8)
    special = torch.tensor([0.0, -0.0, float("inf"), -float("inf"), 1e-310, -1e-310, 5e-324, -5e-324], dtype=torch.float64)
    for trial in range(60):
        R, V = int(torch.randint(1, 4, (1,), generator=g)), int(torch.randint(2, 400, (1,), generator=g))
        x = torch.randn(R, V, generator=g, dtype=torch.float64) * 10.0 ** float(torch.randint(-3, 4, (1,), generator=g))
        pick = torch.rand(R, V, generator=g) < 0.3
        x[pick] = special[torch.randint(0, len(special), (int(pick.sum()),), generator=g)]
        if trial % 3 == 0:
            x = x.round()  # ties
        for y in (x, x.float()):
            ref = torch.sort(y, dim=-1, descending=True, stable=True).indices
            assert torch.equal(argsort_desc_stable(y), ref), (trial, y.dtype)


def test_argsort_large_row_with_a_tied_tail():
    g = torch.Generator().manual_seed(4)
    x = torch.rand(2, 151936, generator=g, dtype=torch.float64)
    x[:, 150000:] = 0.25  # a block of identical values, as untrained vocabulary entries give
    x[1, ::7] = 0.0
    ref = torch.sort(x, dim=-1, descending=True, stable=True).indices
    assert torch.equal(argsort_desc_stable(x), ref)


@pytest.mark.parametrize("small_v", [False, True])
def test_top_desc_stable_equals_the_stable_sort_prefix(monkeypatch, small_v):
    """The top n without a sort: the same ids, in the same order, as the first n of a stable
    descending sort, ties across the boundary included (they go to the lower ids)."""
    if not small_v:  # rows above TOP_SORT_V take the topk route; force it at test sizes too
        monkeypatch.setattr(_scan, "TOP_SORT_V", 8)
    g = torch.Generator().manual_seed(6)
    for trial in range(200):
        x = _rows(g, trial)
        if trial % 4 == 1:  # ties everywhere: 3 distinct values
            x = torch.randint(0, 3, x.shape, generator=g).to(x.dtype)
        V = x.shape[-1]
        for n in {0, 1, 2, 3, min(7, V), V, V + 2}:
            ref = torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :n]
            got = top_desc_stable(x, n)
            assert got.dtype == torch.long and torch.equal(got, ref), (trial, n)


def test_top_desc_stable_large_rows_batched_with_boundary_ties():
    g = torch.Generator().manual_seed(7)
    x = torch.softmax(torch.randn(3, 2, 151936, generator=g), -1)
    x[0, 0, 100:110] = x[0, 0].max() * 2  # ten equal maxima: a tie across every n < 10
    x[1, 1, ::5000] = 0.5  # 31 equal tokens above everything
    x[2, 0] = x[2, 0].bfloat16().float()  # bf16 values: many exact ties in the head
    for n in (1, 2, 3, 5, 7, 9, 12, 40):
        ref = torch.sort(x, dim=-1, descending=True, stable=True).indices[..., :n]
        assert torch.equal(top_desc_stable(x, n), ref), n


def test_scans_equal_torch():
    g = torch.Generator().manual_seed(5)
    for trial in range(100):
        x = _rows(g, trial)
        assert torch.equal(cummin(x), torch.cummin(x, -1).values)
        assert torch.equal(rev_cummin(x), torch.flip(torch.cummin(torch.flip(x, [-1]), -1).values, [-1]))
        assert cummin(x).dtype == x.dtype


@pytest.mark.parametrize("k", range(0, 10))
def test_ipow(k):
    x = torch.linspace(0.0, 1.5, 101, dtype=torch.float64)
    torch.testing.assert_close(ipow(x, k), x**k, rtol=4e-16 * max(k, 1), atol=0.0)
    with pytest.raises(ValueError, match="k must be"):
        ipow(x, -1)


def _segments(g, n_seg, sorted_keys):
    lens = torch.randint(0, 40, (n_seg,), generator=g)
    lens[0] = 1000  # one long segment, as the tail layer of a real row
    first = torch.cumsum(lens, 0) - lens
    keys = []
    for L in lens.tolist():
        k = torch.rand(L, generator=g, dtype=torch.float64)
        k[torch.rand(L, generator=g) < 0.2] = 0.5  # ties
        k[torch.rand(L, generator=g) < 0.05] = torch.inf  # tokens without draft mass
        keys.append(torch.sort(k).values if sorted_keys else k)
    return torch.cat(keys), first, first + lens


@pytest.mark.parametrize("sorted_keys", [True, False])
def test_segment_search(sorted_keys):
    g = torch.Generator().manual_seed(6)
    for trial in range(20):
        c, first, end = _segments(g, 12, sorted_keys)
        w = torch.rand(12, 7, generator=g, dtype=torch.float64)
        w[:, 0] = 0.5
        w[:, 1] = torch.inf
        w[:, 2] = 0.0
        f, e = first.unsqueeze(-1), end.unsqueeze(-1)
        got = segment_search(c, f, e, w)
        assert torch.equal(got, _lift_torch(c, f, e, w, int((end - first).max()).bit_length()))
        assert torch.equal(got, _lift_numpy(c, f, e, w, int((end - first).max()).bit_length()))
        assert bool(((got >= f) & (got <= e)).all())
        if sorted_keys:  # the first index of the segment with key >= w
            for s in range(12):
                seg = c[first[s] : end[s]]
                ref = first[s] + torch.searchsorted(seg.contiguous(), w[s], side="left")
                assert torch.equal(got[s], ref), (trial, s)
