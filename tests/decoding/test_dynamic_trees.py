"""Dynamic draft trees (tree='dynamic'): the allocator, T = 0 equality, the two-token law, the CLI."""
from __future__ import annotations


import pytest
import torch

pytest.importorskip("transformers")

import tiny_models as tm  # noqa: E402
from test_decoding import _law_case  # noqa: E402

import multidraft as md  # noqa: E402
from multidraft import trees  # noqa: E402
from multidraft.decoding import engine  # noqa: E402
from multidraft.decoding.step import DecoderStep  # noqa: E402

torch.set_num_threads(1)




# --- the allocator on tensors ----------------------------------------------------------------
def _rows():
    flat = torch.full((10,), 0.1)
    sharp = torch.tensor([0.97] + [0.03 / 9] * 9)
    return torch.stack([flat, sharp])


def test_coverage_matches_definition_and_is_concave():
    q = torch.softmax(torch.randn(5, 13, generator=torch.Generator().manual_seed(0)), -1)
    c = trees.coverage(q, 4, "iid")
    for k in range(1, 5):
        ref = (q.double() * (1 - (1 - q.double()) ** k)).sum(-1)
        assert torch.allclose(c[:, k - 1], ref, atol=1e-12)
    inc = torch.diff(c, dim=-1)
    assert (inc >= -1e-15).all() and (torch.diff(inc, dim=-1) <= 1e-15).all()
    g = trees.coverage(q, 4, "greedy")
    assert torch.allclose(g[:, 0], q.double().max(-1).values)
    assert torch.allclose(g[:, 3], q.double().sort(-1, descending=True).values[:, :4].sum(-1))


@pytest.mark.parametrize("kind", ["iid", "wor", "greedy"])
def test_confident_q_gets_fewer_drafts_and_budget_holds(kind):
    q = _rows()
    ks = trees.allocate(q, torch.ones(2), 4, 5, kind)
    assert int(ks.sum()) <= 5 and int(ks.max()) <= 4
    assert ks[0] > ks[1] >= 1
    for budget in range(0, 10):
        ks = trees.allocate(q, torch.ones(2), 3, budget, kind)
        assert int(ks.sum()) == min(budget, 6)  # every draft has positive value: the budget is spent
        assert int(ks.max()) <= 3


def test_reach_zero_or_point_mass_gets_no_drafts():
    q = _rows()
    ks = trees.allocate(q, torch.tensor([0.0, 1.0]), 4, 8, "iid")
    assert ks[0] == 0 and ks[1] >= 1  # a node of reach 0 is never expanded
    point = torch.zeros(1, 6)
    point[0, 2] = 1.0
    ks = trees.allocate(point, torch.ones(1), 4, 8, "wor")
    assert ks.tolist() == [1]  # one nonzero token: one draft, more are worthless
    assert trees.allocate(q, torch.ones(2), 4, 0, "iid").tolist() == [0, 0]


def test_min_gain_grants_only_drafts_worth_it():
    q = _rows()                                      # row 0 uncertain, row 1 confident
    reach = torch.tensor([1.0, 0.5])
    c = trees.coverage(q, 4, "wor")
    values = reach.double().view(2, 1) * torch.diff(c, dim=-1, prepend=torch.zeros(2, 1, dtype=c.dtype))
    for g in (0.0, 0.05, 0.1, 0.2, 0.4, 0.99):
        ks = trees.allocate(q, reach, 4, 8, "wor", min_gain=g)
        want = (values >= g).logical_and(values > 0).sum(-1)    # increments fall: a prefix per row
        assert ks.tolist() == want.tolist(), g
    ks0 = trees.allocate(q, reach, 4, 8, "wor")
    assert trees.allocate(q, reach, 4, 8, "wor", min_gain=0.0).tolist() == ks0.tolist()
    # the budget still binds under the threshold
    assert int(trees.allocate(q, reach, 4, 2, "wor", min_gain=0.01).sum()) <= 2


def test_allocation_follows_reach_across_a_level():
    q = _rows()[:1].expand(3, -1)
    ks = trees.allocate(q, torch.tensor([0.5, 0.1, 0.9]), 4, 6, "iid")
    assert ks[2] >= ks[0] >= ks[1] and int(ks.sum()) == 6


def test_every_k_of_a_level_is_decided_before_any_draft_is_drawn(pair, monkeypatch):
    # record the order of allocation and sampling calls: for each level, allocate comes first,
    # and the k of every node of the level is already fixed when its drafts are drawn
    t, d = pair
    events = []
    alloc, samp = DecoderStep._allocate_level, DecoderStep._sample_level

    def a(self, tree, level, logits):
        assert all(not tree.nodes[i].drafts for i in level)
        alloc(self, tree, level, logits)
        events.append(("alloc", tuple(level), tuple(tree.nodes[i].k for i in level)))

    def s(self, tree, level, logits):
        ks = tuple(tree.nodes[i].k for i in level)
        assert events and events[-1] == ("alloc", tuple(level), ks)
        out = samp(self, tree, level, logits)
        assert tuple(len(tree.nodes[i].drafts) <= tree.nodes[i].k for i in level) == (True,) * len(level)
        assert len(tree) <= tree.shape.budget
        events.append(("sample", tuple(level)))
        return out

    monkeypatch.setattr(DecoderStep, "_allocate_level", a)
    monkeypatch.setattr(DecoderStep, "_sample_level", s)
    md.generate(t, d, torch.tensor([[1, 2, 3]]), verifier="nss", k=4, depth=3, tree="dynamic", max_nodes=9,
                temperature=1.0, draft_temperature=1.5, max_new_tokens=10, generator=2)
    assert sum(e[0] == "alloc" for e in events) == sum(e[0] == "sample" for e in events) > 0


# --- temperature 0 ---------------------------------------------------------------------------
@pytest.mark.parametrize("verifier,law", [("nss", "iid"), ("specinfer", "iid"), ("rrs_wor", "wor"),
                                          ("nss", "greedy"), ("greedy_optimal", "greedy"), ("naive", "iid")])
def test_dynamic_greedy_equals_target_greedy(pair, verifier, law):
    t, d = pair
    v = md.verifiers.get(verifier)
    kmax = 1 if v.max_k == 1 else (v.max_k or 4) if (v.max_k or 4) < 4 else 4
    for ids in (torch.tensor([[9, 9, 0, 11, 3, 20, 2]]), torch.tensor([[7]])):
        ref = tm.greedy_reference(t, ids, 14)
        for dt in (None, 1.5):  # T = 0 drafts are point masses (k = 1); a hot draft spreads k
            log = []
            r = md.generate(t, d, ids, verifier=verifier, k=kmax, depth=4, draft_law=law, tree="dynamic",
                            max_nodes=10, temperature=0, draft_temperature=dt, max_new_tokens=14, generator=0,
                            node_log=log)
            assert r.tokens.tolist() == ref.tolist(), (verifier, law, dt)
            assert log and all(1 <= k <= kmax for k, _, _ in log)
            g = md.generate(t, d, ids, verifier=verifier, k=kmax, depth=4, draft_law=law, tree="dynamic",
                            max_nodes=10, min_gain=0.3, temperature=0, draft_temperature=dt, max_new_tokens=14,
                            generator=0)
            assert g.tokens.tolist() == ref.tolist(), (verifier, law, dt, "min_gain")


def test_hot_draft_spreads_drafts_under_the_budget(pair):
    t, d = pair
    log = []
    r = md.generate(t, d, torch.tensor([[1, 2, 3]]), verifier="nss", k=4, depth=5, tree="dynamic", max_nodes=12,
                    temperature=1.0, draft_temperature=2.0, max_new_tokens=30, generator=4, node_log=log)
    assert r.new_tokens == 30 and max(r.draft_depths) <= 5
    ks = [k for k, _, _ in log]
    assert max(ks) > 1 and max(ks) <= 4


# --- temperature 1: the two-token law ---------------------------------------------------------
def test_two_token_law_dynamic_fast(small_pair):
    _law_case(small_pair, 300, 21, verifier="nss", k=3, depth=2, tree="dynamic", max_nodes=6, draft_law="iid",
              temperature=1.0, draft_temperature=1.4)


def test_two_token_law_dynamic_min_gain(small_pair):
    # the threshold makes k_v depend on q_v and the reach: still fixed before v's drafts, still lossless
    _law_case(small_pair, 300, 25, verifier="rrs_wor", k=3, depth=2, tree="dynamic", max_nodes=7, draft_law="wor",
              min_gain=0.15, temperature=1.0, draft_temperature=1.4)


@pytest.mark.slow
@pytest.mark.parametrize("verifier,law", [("specinfer", "iid"), ("rrs_wor", "wor"), ("nss", "greedy")])
def test_two_token_law_dynamic_slow(small_pair, verifier, law):
    _law_case(small_pair, 1200, 23, verifier=verifier, k=3, depth=2, tree="dynamic", max_nodes=7, draft_law=law,
              temperature=1.0, draft_temperature=1.5)


# --- settings and CLI --------------------------------------------------------------------------
def test_dynamic_settings_errors():
    s = engine.Settings.from_args(verifier="nss", k=4, depth=3, tree="dynamic")
    assert s.shape.mode == "dynamic" and s.shape.budget == trees.DEFAULT_MAX_NODES and s.shape.k == 4
    with pytest.raises(ValueError, match="max_nodes"):
        engine.Settings.from_args(verifier="nss", k=4, tree="dynamic", max_nodes=1)
    with pytest.raises(ValueError, match="max_nodes"):
        engine.Settings.from_args(verifier="nss", k=4, tree=None, max_nodes=8)
    with pytest.raises(ValueError, match="independent"):
        engine.Settings.from_args(verifier="specinfer", k=2, tree="dynamic", draft_temperature=[0.5, 1.0])
    assert engine.Settings.from_args(verifier="nss", k=4, tree="dynamic", min_gain=0.1).shape.min_gain == 0.1
    with pytest.raises(ValueError, match="min_gain applies only"):
        engine.Settings.from_args(verifier="nss", k=4, tree=None, min_gain=0.1)
    for bad in (-0.1, 1.0, "x"):
        with pytest.raises(ValueError, match="min_gain must"):
            engine.Settings.from_args(verifier="nss", k=4, tree="dynamic", min_gain=bad)
    if "spechub" in md.verifiers.names():
        with pytest.raises(ValueError, match="spechub"):
            engine.Settings.from_args(verifier="spechub", k=3, tree="dynamic")


def test_cli_decode_tree_dynamic(saved_pair, capsys):
    import json

    from multidraft.cli import main

    t, tok, target_dir, draft_dir = saved_pair
    base = ["decode", "--prompt", "hellothere", "--target", str(target_dir), "--draft", str(draft_dir),
            "--dtype", "float32", "--quiet", "--ignore-eos", "--max-new-tokens", "8", "--tree", "dynamic"]
    assert main(base + ["--verifier", "nss", "--max-nodes", "8", "--k-max", "3", "--max-depth", "3", "--json",
                        "--temperature", "0", "--draft-temperature", "1.5"]) == 0
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for key in ("text", "new_tokens", "target_calls", "block_efficiency", "acceptance_rate", "settings"):
        assert key in obj
    assert obj["new_tokens"] == 8 and obj["settings"]["tree"] == "dynamic"
    assert obj["settings"]["k"] == 3 and obj["settings"]["depth"] == 3 and obj["settings"]["max_nodes"] == 8
    ids = tok("hellothere", return_tensors="pt")["input_ids"]
    assert obj["text"] == tok.decode(tm.greedy_reference(t, ids, 8).tolist(), skip_special_tokens=True)
    assert main(base + ["--verifier", "rrs_wor", "--min-gain", "0.2", "--json", "--temperature", "0"]) == 0
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert obj["settings"]["min_gain"] == 0.2
    assert obj["text"] == tok.decode(tm.greedy_reference(t, ids, 8).tolist(), skip_special_tokens=True)
    plain = [a for a in base if a not in ("--tree", "dynamic")]
    assert main(plain + ["--verifier", "nss", "--min-gain", "0.2"]) == 2
    assert "--min-gain applies to --tree dynamic only" in capsys.readouterr().err
    for bad, msg in ((["--max-nodes", "1"], "--max-nodes"), (["--k-max", "0"], "--k-max"),
                     (["--min-gain", "1.5"], "--min-gain"),
                     (["--max-depth", "0"], "--max-depth"), (["--verifier", "none"], "--tree dynamic"),
                     (["--draft-temperature", "0.5,1.0", "--k-max", "2"], "independent")):
        assert main(base + bad) == 2, bad
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0] and "Traceback" not in err[0], err
