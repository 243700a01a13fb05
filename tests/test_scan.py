"""multidraft._scan: the fast CPU routes give exactly the plain torch results."""
import pytest
import torch

from multidraft._scan import argsort_desc_stable, cummin, ipow, rev_cummin


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
