"""Every registered tree rule in the decoder (``Settings.rule``), on both engines.

* temperature 0: every rule x every tree mode it supports equals the target's greedy decoding,
  token for token (transformers tiny pair; llama.cpp tiny GGUF pair against llama.cpp's own
  greedy generation);
* temperature 1: the law of the first two tokens is the target's (chi-square, as the token
  walk's law tests), one fast case per rule and every rule x mode in ``slow``;
* block and traversal on full-vocabulary rows (V = 151,936, float32 rows as the decoder
  processes them);
* bad input: unknown rule, a rule with a tree mode it does not support, tree_lp, depth 0, a
  verifier given with a sequence-level rule, node_log with one: one ArgumentError naming it;
* the command line: ``decode --rule traversal`` end to end with the tiny saved pair.
"""
from __future__ import annotations


import pytest
import torch

pytest.importorskip("transformers")

import tiny_models as tm  # noqa: E402

import multidraft as md  # noqa: E402
from multidraft import trees  # noqa: E402
from multidraft.decoding import Settings  # noqa: E402
from multidraft.decoding.settings import WALK, decoder_rules  # noqa: E402

from test_decoding import PROMPTS, _law_case  # noqa: E402

torch.set_num_threads(1)

# the decoder's tree modes, each as the keyword settings of one small tree
TREE_MODES = {
    "chain": dict(k=1, depth=3),
    "kary": dict(k=2, depth=3),
    "sequences": dict(k=2, depth=3, tree="sequences"),
    "explicit": dict(k=2, depth=3, tree=[[0], [1], [0, 0], [0, 0, 0], [1, 0]]),
    "dynamic": dict(k=3, depth=3, tree="dynamic", max_nodes=8),
    "dynamic_chain": dict(k=1, depth=3, tree="dynamic", max_nodes=4),  # a chain whose length the allocator picks
}
SEQUENCE_RULES = [r for r in decoder_rules() if r != WALK]


def _supported(rule: str, kw: dict) -> bool:
    try:
        Settings.from_args(rule=rule, **kw)
    except ValueError:
        return False
    return True


CASES = [(r, m) for r in SEQUENCE_RULES for m, kw in TREE_MODES.items() if _supported(r, kw)]


def test_the_cases_cover_block_and_traversal():
    # the parametrized cases below cannot pass by being empty
    assert {"block", "traversal"} <= set(SEQUENCE_RULES)
    assert "tree_lp" not in decoder_rules() and "tree_lp" in trees.names()
    assert [m for r, m in CASES if r == "block"] == ["chain", "dynamic_chain"]
    assert [m for r, m in CASES if r == "traversal"] == list(TREE_MODES)
    for r in SEQUENCE_RULES:
        assert any(rr == r for rr, _ in CASES), f"rule {r!r} takes none of the decoder's tree modes"


def test_settings_resolve_the_rule_and_its_tree_law():
    s = Settings.from_args(rule="traversal", k=2, depth=3, tree="sequences")
    assert (s.rule_name, s.rule.name, s.verifier, s.law, s.target_alone) == ("traversal", "traversal", None, "iid", False)
    assert s.tree_law.name == "sequences(K=2, L=3)"
    assert Settings.from_args(rule="block", k=1, depth=4).tree_law.name == "chain(L=4, iid)"
    walk = Settings.from_args(verifier="specinfer", k=2, depth=3)
    assert walk.rule_name == WALK and walk.verifier.name == "specinfer" and walk.rule.verifier is walk.verifier
    same = Settings.from_args(rule="token_walk", k=2, depth=3)
    assert (same.rule_name, same.verifier.name, same.law, same.shape) == (WALK, "specinfer", walk.law, walk.shape)
    # derive keeps the rule; verifier=None gives the target alone, a verifier the walk
    assert s.derive(max_new_tokens=5).rule_name == "traversal"
    assert s.derive(verifier=None).target_alone
    assert s.derive(verifier="nss").rule_name == WALK
    assert walk.derive(rule="traversal").rule_name == "traversal"
    assert Settings.from_args(**Settings.args_of(s.describe())) == s


# --- temperature 0: target greedy, transformers ---------------------------------------------------
@pytest.mark.parametrize("rule,mode", CASES)
def test_greedy_equals_target_greedy(pair, rule, mode):
    t, d = pair
    for ids in PROMPTS[:2]:
        ref = tm.greedy_reference(t, ids, 12)
        r = md.generate(t, d, ids, rule=rule, temperature=0, max_new_tokens=12, generator=1, **TREE_MODES[mode])
        assert r.tokens.tolist() == ref.tolist(), (rule, mode)
        assert r.new_tokens == 12 and r.target_calls <= 12
        assert len(r.accepted_lengths) == r.target_calls


def test_draft_equal_to_target_accepts_every_path(pair):
    t, _ = pair
    ids = PROMPTS[0]
    for rule, mode in CASES:
        kw = TREE_MODES[mode]
        r = md.generate(t, t, ids, rule=rule, temperature=1.0, max_new_tokens=9, generator=3, **kw)
        if mode != "dynamic":  # dynamic trees may grant fewer levels; the others are accepted whole
            assert r.accepted_lengths[0] == kw["depth"], (rule, mode)


# --- temperature 1: the two-token law ----------------------------------------------------------
@pytest.mark.parametrize("rule", SEQUENCE_RULES)
def test_two_token_law_fast(small_pair, rule):
    modes = [m for r, m in CASES if r == rule]  # a K-ary tree or a chain where the rule takes one
    mode = next((m for m in modes if m in ("kary", "chain")), modes[0])
    kw = dict(TREE_MODES[mode], depth=2)
    _law_case(small_pair, 300, 21 + len(rule), rule=rule, temperature=1.0, draft_temperature=1.4, **kw)


@pytest.mark.slow
@pytest.mark.parametrize("rule,mode", CASES)
def test_two_token_law_every_mode_slow(small_pair, rule, mode):
    kw = dict(TREE_MODES[mode], depth=2)
    _law_case(small_pair, 1200, 40 + len(rule) + len(mode), rule=rule, temperature=1.0, draft_temperature=1.5, **kw)


# --- full-vocabulary rows -----------------------------------------------------------------------
def _full_vocab_tree(shape, V: int, seed: int):
    """A filled draft tree with float32 softmax rows at vocabulary size V (as ``process_logits``)."""
    g = torch.Generator().manual_seed(seed)
    tree = trees.DraftTree(shape, 0, shape.depth, 1, "iid")
    rows = {}
    i = 0
    while i < len(tree.nodes):
        k = tree.n_children(i)
        if k:
            q = torch.softmax(torch.randn(V, generator=g) * 3, -1)  # [V]
            tree.nodes[i].q = q
            drafts = torch.multinomial(q, k, replacement=True, generator=g).tolist()
            tree.add_drafts(i, drafts)
        i += 1
    for j in range(len(tree.nodes)):
        rows[j] = torch.softmax(torch.randn(V, generator=g) * 3, -1)  # [V]
    tree.set_target(lambda j: rows[j])
    return tree


@pytest.mark.parametrize("rule,tree,k", [("block", None, 1), ("traversal", None, 2), ("traversal", "sequences", 2)])
def test_full_vocabulary_rows(rule, tree, k):
    V = 151_936
    shape = trees.TreeShape.from_args(tree, k, 3)
    for seed in range(2):
        tr = _full_vocab_tree(shape, V, seed)
        v = trees.get(rule).verify(tr, torch.Generator().manual_seed(seed))
        assert 0 <= v.token < V and len(v.path) <= 3
        assert all(tr.nodes[j].parent == (v.path[n - 1] if n else 0) for n, j in enumerate(v.path))


# --- bad input ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kw,arg,words", [
    (dict(rule="bogus"), "rule", "unknown tree rule 'bogus'"),
    (dict(rule="tree_lp"), "rule", "small V"),
    (dict(rule="block", k=2), "rule", "k = 1"),
    (dict(rule="block", k=2, tree="sequences"), "rule", "'traversal'"),
    (dict(rule="traversal", draft_law="wor"), "rule", "draft_law = 'iid'"),
    (dict(rule="traversal", draft_temperature=[0.5, 1.0]), "rule", "independent"),
    (dict(rule="block", k=1, draft_temperature=[0.7]), "rule", "independent"),  # supports() admits it, verify refuses
    (dict(rule="traversal", depth=0), "depth", ">= 1"),
    (dict(rule="block", k=1, depth=0), "depth", ">= 1"),
    (dict(rule="traversal", verifier="specinfer"), "verifier", "token_walk"),
    (dict(rule=3), "rule", "registered tree rule name"),
])
def test_bad_rule_settings(kw, arg, words):
    with pytest.raises(md.decoding.ArgumentError) as exc:
        Settings.from_args(**kw)
    assert exc.value.arg == arg and str(exc.value).startswith(arg)
    assert words in str(exc.value), str(exc.value)


def test_bad_rule_in_generate(pair):
    t, d = pair
    ids = PROMPTS[0]
    with pytest.raises(md.decoding.ArgumentError) as exc:
        md.generate(t, d, ids, rule="block", k=2, generator=0)
    assert exc.value.arg == "rule"
    with pytest.raises(md.decoding.ArgumentError) as exc:
        md.generate(t, d, ids, rule="traversal", k=2, depth=2, generator=0, node_log=[])
    assert exc.value.arg == "node_log"


# --- the command line ------------------------------------------------------------------------------
def test_cli_decode_rule_traversal(saved_pair, capsys):
    import json

    from multidraft.cli import main

    t, tok, target_dir, draft_dir = saved_pair
    base = ["decode", "--prompt", "hellothere", "--target", str(target_dir), "--draft", str(draft_dir),
            "--dtype", "float32", "--quiet", "--ignore-eos", "--max-new-tokens", "8"]
    assert main(base + ["--rule", "traversal", "--k", "2", "--depth", "2", "--json", "--temperature", "0"]) == 0
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert obj["settings"]["rule"] == "traversal" and obj["settings"]["verifier"] is None
    assert obj["settings"]["law"] == "iid" and obj["new_tokens"] == 8
    ids = tok("hellothere", return_tensors="pt")["input_ids"]
    ref = tm.greedy_reference(t, ids, 8)
    assert obj["text"] == tok.decode(ref.tolist(), skip_special_tokens=True)
    assert main(base + ["--rule", "block", "--k", "1", "--tree", "sequences", "--json"]) == 0
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert obj["settings"]["rule"] == "block" and obj["new_tokens"] == 8
    for bad, flag in ((["--rule", "bogus"], "--rule"), (["--rule", "block", "--k", "2"], "--rule"),
                      (["--rule", "tree_lp"], "--rule"), (["--rule", "traversal", "--verifier", "nss"], "--verifier"),
                      (["--rule", "traversal", "--verifier", "none"], "--rule")):
        assert main(base + bad) == 2, bad
        err = capsys.readouterr().err
        assert flag in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err


# --- --tree auto with a sequence-level rule ----------------------------------------------------------
@pytest.mark.parametrize("rule,k_max", [("traversal", 3), ("block", 3)])
def test_cli_tree_auto_with_a_rule(saved_pair, capsys, tmp_path, rule, k_max):
    import json

    from multidraft.cli import main
    from multidraft.decoding.treeopt import CostProfile

    t, tok, target_dir, draft_dir = saved_pair
    prof = tmp_path / "prof.json"  # a cheap verify pass: a tree pays
    prof.write_text(CostProfile(list(range(1, 65)), [0.1 + 1e-4 * n for n in range(1, 65)], [1, 8], [1e-3, 2e-3],
                                meta={"dtype": "float32"}).to_json())
    argv = ["decode", "--prompt", "hellothere", "--target", str(target_dir), "--draft", str(draft_dir), "--dtype", "float32",
            "--ignore-eos", "--max-new-tokens", "8", "--rule", rule, "--k", str(k_max), "--tree", "auto", "--profile",
            str(prof), "--warmup-tokens", "12", "--max-nodes", "16", "--max-depth", "4", "--temperature", "0", "--json"]
    assert main(argv) == 0
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    ids = tok("hellothere", return_tensors="pt")["input_ids"]
    assert obj["tokens"] == tm.greedy_reference(t, ids, 8).tolist()
    auto = obj["auto"]
    assert auto["decoded_with"] == "tree" and obj["settings"]["rule"] == rule
    paths = auto["tree"]["paths"]
    if rule == "block":  # block takes one chain: the choice is among chains only
        assert all(p[-1] == 0 for p in paths)
    assert main(argv[:-1] + ["--draft-law", "wor"]) == 2
    assert "--rule" in capsys.readouterr().err


# --- certificates of the laws the decoder draws ----------------------------------------------------
CERT_MODES = {  # the decoder's tree modes at certificate sizes (V = 3, depth 2)
    "chain": dict(k=1, depth=2),
    "kary": dict(k=2, depth=2),
    "sequences": dict(k=2, depth=2, tree="sequences"),
    "explicit": dict(k=2, depth=2, tree=[[0], [1], [0, 0]]),
    "dynamic": dict(k=2, depth=2, tree="dynamic", max_nodes=4),
    "dynamic_chain": dict(k=1, depth=2, tree="dynamic", max_nodes=3),
}


def _certify_decoder_laws(styles, seeds):
    worst = 0.0
    n = 0
    for rule in SEQUENCE_RULES:
        for mode, kw in CERT_MODES.items():
            if not _supported(rule, kw):
                continue
            law = Settings.from_args(rule=rule, **kw).tree_law  # the law the decoder's settings admitted
            for style in styles:
                for seed in seeds:
                    m = trees.TableModel.random(V=3, seed=seed, style=style)
                    cert = trees.certify_tree(trees.get(rule), law, m)
                    worst = max(worst, cert.max_abs_error)
                    n += 1
    assert n >= 6 and worst <= 1e-12, worst


def test_every_admitted_tree_law_is_certified():
    """What Settings admits (rule.supports of the mapped tree law) is lossless by enumeration."""
    _certify_decoder_laws(("random",), (0,))


@pytest.mark.slow
def test_every_admitted_tree_law_is_certified_slow():
    _certify_decoder_laws(("random", "peaked", "one_hot", "same", "q_zero", "mixed"), (1, 2))
