"""multidraft._scan: the fast CPU routes give exactly the plain torch results."""
import pytest
import torch

from multidraft._scan import _lift_numpy, _lift_torch, argsort_desc_stable, cummin, ipow, rev_cummin, segment_search


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


def test_argsort_large_row_with_a_tied_tail():
    g = torch.Generator().manual_seed(4)
    x = torch.rand(2, 151936, generator=g, dtype=torch.float64)
    x[:, 150000:] = 0.25  # a block of identical values, as untrained vocabulary entries give
    x[1, ::7] = 0.0
    ref = torch.sort(x, dim=-1, descending=True, stable=True).indices
    assert torch.equal(argsort_desc_stable(x), ref)


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
