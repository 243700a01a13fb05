"""Every registered tree rule in the decoder on the llama.cpp engine (tiny random GGUF pair).

At temperature 0 every rule x tree mode it supports equals llama.cpp's own greedy generation,
with a draft that always agrees (whole paths accepted and committed) and one that never does;
at temperature 1 (``slow``) the law of the first two tokens is the target's (chi-square), as
for the token-level walks in ``test_llamacpp.py`` (a chain, a trie and a dynamic tree).
"""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("llama_cpp")
pytest.importorskip("transformers")

import multidraft as md  # noqa: E402

from test_decoding import _chi2_pvalue  # noqa: E402
from test_llamacpp import PROMPT, _exact_two_token_law, files, greedy_ref, models  # noqa: E402,F401
from test_tree_rules_decoding import CASES, TREE_MODES  # noqa: E402


@pytest.mark.parametrize("rule,mode", CASES)
def test_greedy_equals_llama_cpp_greedy(greedy_ref, models, rule, mode):  # noqa: F811
    t, same, other = models
    n = 24
    for d, full_accept in ((same, True), (other, False)):
        r = md.generate(t, d, torch.tensor([PROMPT]), rule=rule, temperature=0.0, max_new_tokens=n, generator=0,
                        **TREE_MODES[mode])
        assert r.tokens.tolist() == greedy_ref[:n], (rule, mode, full_accept)
        if full_accept:
            assert r.block_efficiency > 1.5  # drafts were accepted, paths committed in both caches


# the law on this engine for one chain, one trie and one dynamic tree (about a minute of CPU each);
# every rule x mode is law-tested on the transformers engine (test_tree_rules_decoding.py), whose
# rule code path is the same
LAW_CASES = [c for c in CASES if c in (("block", "chain"), ("traversal", "sequences"), ("traversal", "dynamic"))]


@pytest.mark.slow
@pytest.mark.parametrize("rule,mode", LAW_CASES)
def test_two_token_law_at_temperature_one(models, rule, mode):  # noqa: F811
    t, same, _ = models
    exact = _exact_two_token_law(same, 1.0)
    V = t.vocab_size
    counts = torch.zeros(V * V, dtype=torch.float64)
    g = torch.Generator().manual_seed(17)
    ids = torch.tensor([PROMPT])
    kw = dict(TREE_MODES[mode], depth=2)
    acc = 0
    n = 1000
    for _ in range(n):
        # the draft is the target's weights at draft temperature 1.6: accepted often, not always
        r = md.generate(t, same, ids, rule=rule, temperature=1.0, draft_temperature=1.6, max_new_tokens=2,
                        generator=g, **kw)
        y = r.tokens.tolist()
        counts[y[0] * V + y[1]] += 1
        acc += r.accepted_lengths[0]
    assert 0.2 * n < acc < 0.95 * n  # paths kept and refused both happen
    assert _chi2_pvalue(counts, exact) > 1e-3
