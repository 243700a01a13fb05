"""The token walk's memo of exact node laws is bounded in row elements, not only in entries: at full
vocabulary 4,096 entries of three [V] rows would hold ~15 GB (the real-tree study's first run
reached 22 GB of resident memory through it)."""
import torch

from multidraft import trees


def test_the_memo_holds_at_most_its_element_budget():
    w = trees.TokenWalk("specinfer", "iid")
    w._MEMO_ELEMS = 3 * 50 * 4  # four node laws of V = 50
    g = torch.Generator().manual_seed(0)
    rows = []
    for _ in range(11):
        p = torch.softmax(torch.randn(50, generator=g, dtype=torch.float64), -1)
        q = torch.softmax(torch.randn(50, generator=g, dtype=torch.float64), -1)
        rows.append((p, q))
        first = w._node_law(p, q, [1, 2])
        assert w._node_law(p, q, [1, 2]) is first  # a hit while the entry is held
        assert w._memo_elems == 3 * 50 * len(w._memo) <= w._MEMO_ELEMS
    p, q = rows[-1]
    again = w._node_law(p, q, [1, 2])
    assert torch.equal(again, trees.TokenWalk("specinfer", "iid")._node_law(p, q, [1, 2]))
