"""``verify`` of the select-then-block rules (gbv, spectr_gbv) and of univer on chains reads rows
lazily (a node with one draft costs no pass over V; a row is converted, a residual computed only
where the scan or the decisions reach it). Run for run it is the eager computation: the same
verdicts and the same generator state, on float32 rows (whose float64 values are read entry by
entry) and float64 rows, chains and K = 2 trees."""
import pytest
import torch

from multidraft import trees
from multidraft.trees._check import row64
from multidraft.trees._postorder import first_kept
from multidraft.trees.block import chain_keeps, scan_verify


def _model(V, seed, dtype):
    g = torch.Generator().manual_seed(seed)
    base = torch.randn(V, generator=g, dtype=torch.float64) * 3
    cache = {}

    def rows(prefix, which):
        key = (tuple(prefix), which)
        if key not in cache:
            h = torch.Generator().manual_seed(hash(key) % (1 << 31))
            z = base + torch.randn(V, generator=h, dtype=torch.float64) * (0.3 if which == "q" else 0.6)
            cache[key] = (torch.softmax(z, -1) * (1 + 3e-7)).to(dtype)  # not normalised in float64
        return cache[key]

    return trees.TableModel(V, lambda s: rows(s, "p"), lambda s: rows(s, "q"))


def _eager_select_then_block(rule, tree, g):
    """The walk with every row converted up front (``row64``), the scan on full rows."""
    i, ids, xs, ps, ss = 0, [0], [], [row64(tree.p(0))], []
    while tree.nodes[i].drafts:
        nd = tree.nodes[i]
        if len(nd.drafts) == 1:
            s, j = row64(nd.q), 0
        else:
            s, key = rule._law(ps[-1], row64(nd.q), len(nd.drafts))
            j = rule._pick(key, nd.drafts, g)
        t = nd.drafts[j]
        i = nd.child[t]
        ids.append(i)
        xs.append(t)
        ps.append(row64(tree.p(i)))
        ss.append(s)
    tau, y = scan_verify(chain_keeps(ps, ss, xs), ps, ss, g)
    return tuple(ids[1 : tau + 1]), y


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", ["gbv", "spectr_gbv", "univer"])
def test_lazy_verify_is_the_eager_computation_run_for_run(name, dtype):
    rule = trees.get(name)
    laws = [trees.chain(3), trees.chain(1), trees.sequences(2, 3), trees.kary(2, 2)]
    runs = 0
    for V in (40, 5000):
        model = _model(V, V, dtype)
        for law in laws:
            for seed in range(6):
                tree = law.sample(model, torch.Generator().manual_seed(seed))
                for gs in range(4):
                    g1, g2 = torch.Generator().manual_seed(gs), torch.Generator().manual_seed(gs)
                    got = rule.verify(tree, g1)
                    if name == "univer":
                        want = first_kept(rule._decisions(rule.allocate(tree)), g2)
                        want = (want.path, want.token)
                    else:
                        want = _eager_select_then_block(rule, tree, g2)
                    assert (tuple(got.path), int(got.token)) == (tuple(want[0]), int(want[1])), (V, law.name, seed, gs)
                    assert torch.equal(g1.get_state(), g2.get_state())
                    runs += 1
    assert runs >= 100
