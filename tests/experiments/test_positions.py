"""Positions along the target's own continuation, and the independent law's per-draft rows in the stores."""
from __future__ import annotations

import pytest
import torch

from multidraft import datasets
from multidraft.experiments import acceptance, collect, store
from multidraft.experiments.records import JsonlWriter, read_jsonl
from multidraft.sampling import process_logits

TEMPS = [1.0, 0.7, 1.3, 0.5]


@pytest.fixture
def tiny(tiny_sharp):
    return tiny_sharp


@pytest.fixture
def textfile(prompt_file):
    return prompt_file


def _continuation_stores(run_dir, tiny, textfile, **kw):
    args = dict(models=lambda: tiny, model_names={"target": "t", "draft": "d"}, datasets=[f"file:{textfile}"],
                configs=[(1.0, 1.0), (0.5, 1.0)], n_texts=3, positions_per_text=None, eps=1e-3, k_max=4, seed=0,
                positions_from="continuation", new_tokens=12, independent_temperatures=TEMPS)
    args.update(kw)
    return collect.collect(run_dir, **args)


def test_store_with_independent_rows_round_trips(tmp_path):
    g = torch.Generator().manual_seed(0)
    R, V = 5, 50
    lt = torch.randn(R, V, generator=g, dtype=torch.float64) * 3
    ld = lt + torch.randn(R, V, generator=g, dtype=torch.float64)
    P, Q = torch.softmax(lt, -1), torch.softmax(ld, -1)
    qs = torch.stack([torch.softmax(ld / t, -1) for t in TEMPS], 1)  # [R, J, V]
    rows = store.truncate(P, Q, eps=1e-3, k_max=3, qs=qs)
    ps = store.from_rows(rows, {"dataset": "x", "t_target": 1.0, "t_draft": 1.0, "settings": {}})
    store.save(ps, tmp_path / "s.pt")
    back = store.load(tmp_path / "s.pt")
    assert torch.equal(back.qs, ps.qs) and torch.equal(back.qs_tail, ps.qs_tail)
    assert float(back.qs_tail.max()) <= 1e-3 + 1e-12  # every draft temperature's tail is within eps
    Pl, Ql = store.lumped(back)
    Qs = store.lumped_qs(back)  # [R, J, M+1], same columns as Ql
    assert Qs.shape == (R, len(TEMPS), Pl.shape[-1])
    assert torch.allclose(Qs.sum(-1), torch.ones(R, len(TEMPS), dtype=torch.float64), atol=1e-12)
    for i in range(R):  # column j of row i is token ids[j]; the last column is the tail
        a, b = int(back.offsets[i]), int(back.offsets[i + 1])
        ids = back.ids[a:b].long()
        assert torch.allclose(Qs[i, :, : b - a], qs[i][:, ids], atol=1e-6)
        assert torch.allclose(Qs[i, 0, : b - a], Ql[i, : b - a], atol=1e-6)  # t_1 = the store's draft temperature
    with pytest.raises(ValueError, match="relumping"):
        store.relump(back, eps=1e-2, k_max=2, max_support=3)
    plain = store.from_rows([r[:5] for r in rows], {"dataset": "x"})
    with pytest.raises(ValueError, match="no independent-law"):
        store.lumped_qs(plain)


def test_continuation_positions_are_the_targets_own_sampled_tokens(tiny, textfile, tmp_path):
    paths = _continuation_stores(tmp_path, tiny, textfile)
    ps = store.load(paths[(f"file:{textfile}", 1.0, 1.0)])
    info = ps.info
    assert info["settings"]["positions_from"] == "continuation" and info["independent_temperatures"] == TEMPS
    t, d, tok = tiny
    prompts = dict(datasets.load_prompts(f"file:{textfile}", 3, seed=0))
    by_text: dict = {}
    for i, src in enumerate(info["sources"]):
        by_text.setdefault(src["text"], []).append((i, src))
    assert len(by_text) == 3
    for tid, items in by_text.items():
        ids = datasets.prompt_ids(tok, f"file:{textfile}", prompts[tid])[0]
        cont = torch.tensor([s["token"] for _, s in items])
        assert [s["position"] for _, s in items] == list(range(ids.numel(), ids.numel() + len(items)))
        full = torch.cat([ids, cont])
        with torch.no_grad():  # teacher-forced recompute over prompt + continuation
            lt = t(input_ids=full[None]).logits[0].float()
            ld = d(input_ids=full[None]).logits[0].float()
        for i, src in items:
            pos = src["position"] - 1  # logits at pos predict the token at src["position"]
            a, b = int(ps.offsets[i]), int(ps.offsets[i + 1])
            ids_s = ps.ids[a:b].long()
            p = process_logits(lt[pos], 1.0, dtype=torch.float64)
            q = process_logits(ld[pos], 1.0, dtype=torch.float64)
            assert torch.allclose(ps.p[a:b].double(), p[ids_s], atol=2e-5)
            assert torch.allclose(ps.q[a:b].double(), q[ids_s], atol=2e-5)
            q3 = process_logits(ld[pos], TEMPS[2], dtype=torch.float64)
            assert torch.allclose(ps.qs[a:b, 2].double(), q3[ids_s], atol=2e-5)
            assert float(p[src["token"]]) > 0  # the token was sampled from p
    # same seed, same continuation; another seed, another one
    again = store.load(_continuation_stores(tmp_path / "again", tiny, textfile)[(f"file:{textfile}", 1.0, 1.0)])
    assert again.info["sources"] == info["sources"]
    other = store.load(_continuation_stores(tmp_path / "other", tiny, textfile, seed=7)[(f"file:{textfile}", 1.0, 1.0)])
    assert other.info["sources"] != info["sources"]


def test_continuation_settings_are_checked(tiny, textfile, tmp_path):
    with pytest.raises(ValueError, match="positions_from"):
        _continuation_stores(tmp_path, tiny, textfile, positions_from="reference")
    with pytest.raises(ValueError, match="independent temperatures must be > 0"):
        _continuation_stores(tmp_path, tiny, textfile, independent_temperatures=[1.0, 0.0])
    _continuation_stores(tmp_path, tiny, textfile)
    with pytest.raises(ValueError, match="different settings"):
        _continuation_stores(tmp_path, lambda: None, textfile, new_tokens=5)


def test_independent_law_rows(tmp_path):
    g = torch.Generator().manual_seed(3)
    R, V = 10, 40
    lt = torch.randn(R, V, generator=g, dtype=torch.float64) * 2
    ld = lt + 0.7 * torch.randn(R, V, generator=g, dtype=torch.float64)
    qs = torch.stack([torch.softmax(ld / t, -1) for t in TEMPS], 1)
    rows = store.truncate(torch.softmax(lt, -1), qs[:, 0], eps=1e-6, k_max=4, qs=qs)
    ps = store.from_rows(rows, {"dataset": "x", "t_target": 1.0, "t_draft": 1.0, "settings": {},
                                "independent_temperatures": TEMPS})
    with JsonlWriter(tmp_path / "a.jsonl", {"c": 1}, 0) as w:
        acceptance.evaluate(ps, w, done=set(), laws=("iid", "independent"), ks=(1, 2, 4, 6), draws=64, seed=0,
                            verifiers=["specinfer", "khisti_is", "nss", "spectr"])
    got = {(r["law"], r["K"], r["verifier"]): r for r in read_jsonl(tmp_path / "a.jsonl")[1]}
    assert ("independent", 6, "alpha*") not in got  # K = 6 > J = 4 draft temperatures
    assert ("independent", 2, "spectr") not in got  # spectr needs identical drafts
    a = got[("independent", 2, "alpha*")]
    assert a["independent_temperatures"] == TEMPS[:2] and 0 <= a["bound_width_max"] <= 1e-4
    # the K = 1 independent law is the iid law at t_1 (= the store's draft temperature); the iid rows
    # use the p and q prefixes alone (the other temperatures' tokens lumped), so they agree within both lump bounds
    ind1, iid1 = got[("independent", 1, "alpha*")], got[("iid", 1, "alpha*")]
    assert ind1["acceptance"] == pytest.approx(iid1["acceptance"], abs=ind1["lump_bound_max"] + iid1["lump_bound_max"] + 1e-12)
    assert iid1["p_tail_max"] <= 1e-6 + 1e-15  # the relumped tails stay within eps
    for k in (2, 4):
        al = got[("independent", k, "alpha*")]["acceptance"]
        for name in ("specinfer", "khisti_is", "nss"):
            r = got[("independent", k, name)]
            assert r["independent_temperatures"] == TEMPS[:k]
            assert r["estimator"] == "rao-blackwell"
            assert r["acceptance"] <= al + 4 * r["se_mc"] + 1e-9  # below the ceiling
    assert got[("independent", 4, "specinfer")]["acceptance"] > got[("independent", 2, "specinfer")]["acceptance"]


def _reference_supports(p, q, eps, k_max, offset):
    """The supports by full stable sorts (the definition in store.truncate's docstring)."""
    R, V = p.shape
    out = []
    for r in range(R):
        ps, pi = torch.sort(p[r], descending=True, stable=True)
        qs, qi = torch.sort(q[r], descending=True, stable=True)
        ptail = torch.cat([ps.flip(0).cumsum(0).flip(0), torch.zeros(1, dtype=p.dtype)]) + offset[r]
        ok = ptail <= eps
        ok[V] = True
        mp = int(ok.nonzero()[0])
        qtail = torch.cat([qs.flip(0).cumsum(0).flip(0), torch.zeros(1, dtype=q.dtype)]) + offset[r]
        kth = qs[max(0, k_max - 2)] if k_max >= 2 else float("inf")
        ok = (qtail <= eps) & ((qtail < kth) | (qtail == 0)) & (torch.arange(V + 1) >= k_max)
        ok[V] = True
        mq = int(ok.nonzero()[0])
        out.append(torch.unique(torch.cat([pi[:mp], qi[:mq]])))  # no support cap: as long as eps needs
    return out


@pytest.mark.parametrize("V", [7, 300, 20000])
def test_truncate_supports_equal_the_full_sort_definition(V):
    g = torch.Generator().manual_seed(V)
    for scale, zeros, ties in ((0.3, False, False), (3.0, True, False), (8.0, False, True), (30.0, True, True)):
        x = torch.randn(5, V, generator=g, dtype=torch.float64) * scale
        y = 0.8 * x + torch.randn(5, V, generator=g, dtype=torch.float64)
        if ties:
            x, y = x.round(), y.round()
        p, q = torch.softmax(x, -1), torch.softmax(y, -1)
        if zeros:
            p[:, ::3] = 0
            q[:, 1::4] = 0
            p, q = p / p.sum(-1, keepdim=True), q / q.sum(-1, keepdim=True)
        for eps in (0.0, 1e-4, 1e-2):
            for k_max in (1, 4, 8):
                for off in (torch.zeros(5, dtype=torch.float64), torch.full((5,), 5e-5, dtype=torch.float64)):
                    got = store.truncate(p, q, eps=eps, k_max=k_max, p_offset=off, q_offset=off)
                    ref = _reference_supports(p, q, eps, k_max, off)
                    for (ids, *_), want in zip(got, ref):
                        assert torch.equal(ids, want), (scale, zeros, ties, eps, k_max)


def test_cell_shards_by_width_keep_every_row_and_return_estimates_in_row_order():
    g = torch.Generator().manual_seed(4)
    n, M = 150, 60
    P = torch.zeros(n, M + 1, dtype=torch.float64)
    Q = torch.zeros(n, M + 1, dtype=torch.float64)
    widths = torch.randint(2, M + 1, (n,), generator=g)
    for i in range(n):  # lumped rows: support in the first columns, the tail last, zeros between
        w = int(widths[i])
        P[i, :w] = torch.rand(w, generator=g, dtype=torch.float64)
        P[i, M] = 1e-3
        Q[i] = P[i] if i % 2 == 0 else P[i] * torch.rand(M + 1, generator=g, dtype=torch.float64) ** 2
    P, Q = P / P.sum(-1, keepdim=True), Q / Q.sum(-1, keepdim=True)
    parts = acceptance.cell_shards(P, Q, widths)
    assert sum(Pb.shape[0] for Pb, _ in parts.parts) == n
    for b, (Pb, Qb) in enumerate(parts.parts):
        rows = parts.order[b * acceptance.SHARD: b * acceptance.SHARD + Pb.shape[0]]
        assert Pb.shape[-1] == int(widths[rows].max()) + 1 <= M + 1  # the shard's own width plus the tail
        assert torch.allclose(Pb.sum(-1), torch.ones(Pb.shape[0], dtype=torch.float64), atol=1e-15)  # no mass dropped
        assert torch.equal(Pb[:, -1], P[rows, M])
    mean, var, est = acceptance.cell_acceptance("naive", P, Q, "iid", 1, 64, 0, ("c",), parts=parts)
    assert est == "rao-blackwell"
    even, odd = mean[0::2], mean[1::2]
    assert torch.allclose(even, torch.ones_like(even), atol=1e-12)  # q = p: SD always accepts
    assert bool((odd < 1 - 1e-6).all())  # estimates came back to their own rows
    ref = torch.minimum(P, Q).sum(-1)  # single-draft SD: expected acceptance sum min(p, q)
    assert bool(((mean - ref).abs() <= 6 * var.sqrt() + 1e-12).all())  # each row's estimate is its own row's
