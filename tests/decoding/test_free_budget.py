"""Free sources' depth chosen by cost (issue 39 item 3, ``decoding.sources.budget``): the rule on
hand-made counters, and the decoder with a cost profile (exact: T = 0 is the target's greedy text,
T = 1 reproducible from the seed; a steep profile cuts the copied chains, a flat one keeps them)."""
from __future__ import annotations

import pytest
import torch

from multidraft.decoding.sources.budget import FreeBudget
from multidraft.decoding.treeopt import CostProfile


def test_free_width_takes_the_cap_and_dear_width_takes_nothing():
    free = FreeBudget({"lookup": 6}, lambda n: 1.0, explore_every=4)
    dear = FreeBudget({"lookup": 6}, lambda n: float(n), explore_every=4)
    assert free.depth("lookup", 5, [1, 2, 3, 4]) == 4  # first offer explores: the whole chain
    assert dear.depth("lookup", 5, [1, 2, 3, 4]) == 4
    for b in (free, dear):  # nothing ever gained by depth 1..4 in 30 steps
        for _ in range(30):
            b.record({"lookup": 4}, {"lookup": 0}, model_held=2)
    assert free.depth("lookup", 5, [1, 2, 3, 4]) == 4  # width costs nothing: every token may pay
    assert dear.depth("lookup", 5, [1, 2, 3, 4]) == 0  # a token costs a fifth of the step: none pays
    assert dear.gain("lookup")[:4] == [1 / 32] * 4 and dear.gain("lookup")[4:] == [0.5, 0.5]
    assert dear.expected_model_tokens() == 3.0


def test_cut_where_the_gain_falls_below_the_price():
    b = FreeBudget({"suffix": 8}, lambda n: 1.0 + 0.1 * n, explore_every=1000)
    for _ in range(98):  # depths 1-3 gain in every step, 4-6 never
        b.record({"suffix": 6}, {"suffix": 3}, model_held=0)
    b.offers["suffix"] = 1  # past the first (exploring) offer
    assert b.depth("suffix", 1, [1, 2, 3, 4, 5, 6]) == 3
    assert b.depth("suffix", 1, [1, 2]) == 2  # a shorter match: at most its length
    assert b.depth("suffix", 1, []) == 0  # no match: nothing, and no offer counted
    assert b.offers["suffix"] == 3


def test_the_steps_fixed_seconds_make_copied_tokens_cheaper():
    """A step's draft levels and per-step time do not grow with the chains but are paid all the
    same: counted (``base``), a copied token is a smaller share of the step, so chains go deeper."""
    b = FreeBudget({"suffix": 6}, lambda n: 0.1 * n, explore_every=1000)
    for _ in range(98):  # every depth gains a token a third of the time
        b.record({"suffix": 6}, {"suffix": 6} if _ % 3 == 0 else {}, model_held=0)
    b.offers["suffix"] = 1
    sizes = [1, 2, 3, 4, 5, 6]
    assert b.depth("suffix", 1, sizes) == 0           # a third of a token for a tenth of a 0.1-s step: no
    assert b.depth("suffix", 1, sizes, base=1.0) == 6  # the same token against a 1.1-s step: yes
    for bad in (-1.0, float("nan"), "1"):
        with pytest.raises(ValueError, match="base"):
            b.depth("suffix", 1, sizes, base=bad)


def test_a_step_that_drafts_no_model_tokens_keeps_the_copies_the_model_would_have_held():
    """The pace may draft the model 0 deep: the chain's first tokens, which the model's drafts used
    to hold too (no gain over them), are then the only drafts and must be read as such."""
    b = FreeBudget({"lookup": 8}, lambda n: 1.0 + 0.1 * n, explore_every=1000)
    for _ in range(50):  # the model drafts 4 deep and holds 4; the copy holds the same 4
        b.record({"lookup": 8}, {"lookup": 4}, model_held=4, drafted=4)
    b.offers["lookup"] = 1
    sizes = list(range(1, 9))
    assert b.depth("lookup", 5, sizes, drafted=4) == 0   # the model gives those 4 tokens: copying them adds none
    assert b.depth("lookup", 5, sizes) == 0              # as deep as ever: the same reading
    assert b.depth("lookup", 1, sizes, drafted=0) == 4   # no model drafts: the copy's 4 tokens are the step's
    assert b.expected_model_tokens(0) == 1.0 and b.expected_model_tokens(4) == pytest.approx(1 + 4 * 51 / 52)
    assert b.gain("lookup", 0)[:5] == pytest.approx([51 / 52] * 4 + [1 / 52])
    assert b.model_tries == [50] * 4 and b.offered["lookup"] == [50] * 8 and b.tried["lookup"] == [50] * 4 + [0] * 4
    with pytest.raises(ValueError, match="drafted"):
        b.record({}, {}, model_held=0, drafted=-1)


def test_model_held_tokens_are_not_the_sources_gain():
    b = FreeBudget({"lookup": 4}, lambda n: float(n))
    b.record({"lookup": 4}, {"lookup": 3}, model_held=2)  # only depth 3 was the chain's own
    assert b.hits["lookup"] == [0, 0, 1, 0] and b.tried["lookup"] == [1, 1, 1, 1]
    b.record({"lookup": 2}, {"lookup": 2}, model_held=0)
    assert b.hits["lookup"] == [1, 1, 1, 0] and b.tried["lookup"] == [2, 2, 1, 1]
    b.record({}, {}, model_held=1)
    assert b.steps == 3 and b.model_tokens == 3 + 1 + 2


def test_exploration_schedule_is_fixed():
    b = FreeBudget({"lookup": 3}, lambda n: float(n) ** 3, explore_every=4)
    for _ in range(10):
        b.record({"lookup": 3}, {}, model_held=0)
    got = [b.depth("lookup", 2, [1, 2, 3]) for _ in range(9)]
    assert got == [3, 0, 0, 0, 3, 0, 0, 0, 3]


@pytest.mark.parametrize("kw", [dict(caps={"x": -1}), dict(caps={"x": 1.5}), dict(explore_every=0),
                                dict(step_seconds=3.0)])
def test_bad_budget_arguments(kw):
    args = dict(caps={"x": 2}, step_seconds=lambda n: 1.0, explore_every=2)
    args.update(kw)
    with pytest.raises(ValueError):
        FreeBudget(**args)


# --- in the decoder ---------------------------------------------------------------------------------
REPEATS = torch.tensor([[3, 4, 5, 6, 7, 8, 3, 4, 5, 6, 7, 8, 3, 4, 5]])  # prompt lookup has a match
STEEP = CostProfile((1, 2, 40), (1.0, 2.0, 40.0), (1,), (0.01,))  # every tree token costs a whole pass
FLAT = CostProfile((1, 40), (1.0, 1.0), (1,), (0.01,))            # width costs nothing


def _decode(pair, temperature, cost, seed=0, n=24, ids=REPEATS):
    import multidraft as md

    t, d = pair
    return md.generate(t, d, ids, generator=seed, cost_profile=cost, verifier="specinfer", k=2, depth=2,
                       temperature=temperature, max_new_tokens=n, sources="model,lookup,suffix")


def test_decoder_greedy_with_a_budget_is_the_targets(pair):
    import tiny_models as tm

    ref = tm.greedy_reference(pair[0], REPEATS, 24).tolist()
    runs = {name: _decode(pair, 0.0, cost) for name, cost in (("none", None), ("steep", STEEP), ("flat", FLAT))}
    for r in runs.values():
        assert r.tokens.tolist() == ref
    proposed = {name: sum(s["proposed"] for s in r.source_stats.values()) for name, r in runs.items()}
    assert proposed["flat"] == proposed["none"] > 0  # free width: every source at its own depth
    assert proposed["steep"] < proposed["none"]       # dear width: chains cut after the first offers


def test_decoder_sampling_with_a_budget_is_reproducible(pair):
    a, b = _decode(pair, 1.0, STEEP, seed=5), _decode(pair, 1.0, STEEP, seed=5)
    assert a.tokens.tolist() == b.tokens.tolist() and a.source_stats == b.source_stats


def test_generate_refuses_a_cost_profile_that_is_not_one(pair):
    from multidraft.decoding import ArgumentError

    with pytest.raises(ArgumentError) as info:
        _decode(pair, 0.0, {"target_nodes": [1]})
    assert info.value.arg == "cost_profile"


# --- the drafting depth by cost (decoding.pace: speculation per request) ---------------------------
def test_shape_paths_cut_at_each_depth():
    from multidraft.decoding.pace import shape_paths
    from multidraft.trees import TreeShape

    full = TreeShape.from_args(None, 2, 3)
    assert shape_paths(full, 0) == [] and shape_paths(full, 1) == [(0,), (1,)] and len(shape_paths(full, 3)) == 14
    seq = TreeShape.from_args("sequences", 3, 4)
    assert shape_paths(seq, 2) == [(0,), (1,), (2,), (0, 0), (1, 0), (2, 0)]
    dyn = TreeShape.from_args("dynamic", 2, 4, max_nodes=6)
    assert len(shape_paths(dyn, 4)) == 5 and shape_paths(dyn, 1) == [(0,), (1,)]


def test_pace_drafts_deep_when_width_is_cheap_and_not_at_all_when_refused():
    from multidraft.decoding.pace import DepthPace
    from multidraft.trees import TreeShape

    chain = TreeShape.from_args(None, 1, 4)
    cheap, dear = DepthPace(chain, FLAT, warmup=2, explore_every=1000), DepthPace(chain, STEEP, warmup=2,
                                                                                  explore_every=1000)
    assert [cheap.cap(4), cheap.cap(3)] == [4, 3]  # warm-up: the whole cap
    for p in (cheap, dear):
        for _ in range(20):
            p.record(4, 3)  # three of four drafts kept, every step
    assert cheap.cap(4) == 4 and cheap.cap(2) == 2
    assert dear.cap(4) == 0  # a drafted token costs a whole pass: only a sure one would pay
    assert dear.tries == [20, 20, 20, 20] and dear.hits == [20, 20, 20, 0]
    refused = DepthPace(chain, FLAT, warmup=0, explore_every=1000)
    for _ in range(200):
        refused.record(4, 0)
    assert refused.tries == [200] * 4 and refused.hits == [0] * 4 and refused.cap(4) == 0  # always refused: alone
    copied = DepthPace(chain, FLAT, warmup=0, explore_every=1000)
    for _ in range(50):  # the free chains hold 4 of each path, the model's the same 3: it adds nothing
        copied.record(4, 3, free_held=4, free_tokens=6)
    assert copied.hits == [0] * 4 and copied.expected_tokens(0) == 5.0
    dear_copied = DepthPace(chain, STEEP, warmup=0, explore_every=1000)
    for _ in range(50):
        dear_copied.record(4, 3, free_held=4, free_tokens=6)
    assert dear_copied.seconds(0) == pytest.approx(7.0)  # the root and the 6 copies: 7 tokens' pass
    assert dear_copied.cap(4) == 0  # the model's drafting costs and adds nothing over the copies


def test_pace_conditions_on_the_free_chain_proposed():
    """Where the copies run long the model adds nothing and its passes are skipped; where nothing
    matches the same pace drafts deep. Pooled over both kinds of step it would draft nothing."""
    from multidraft.decoding.pace import DepthPace, signal_bucket
    from multidraft.trees import TreeShape

    assert [signal_bucket(s) for s in (None, 0, 1, 3, 4, 7, 8, 16)] == [None, 0, 1, 1, 2, 2, 3, 3]
    with pytest.raises(ValueError, match="signal"):
        signal_bucket(-1)
    mid = CostProfile((1, 40), (1.0, 2.95), (1,), (0.1,))  # a tree token costs 5% of a pass, a draft level 10%
    p = DepthPace(TreeShape.from_args(None, 1, 4), mid, warmup=0, explore_every=1000)
    for _ in range(30):
        p.record(4, 3, free_held=0, free_tokens=0, signal=0)     # nothing to copy: the model gives 3 of 4
        p.record(4, 3, free_held=8, free_tokens=10, signal=10)  # a long copy holds the path past the model
    assert p.b_steps == [30, 0, 0, 30] and p.steps == 60
    assert p.cap(4, signal=0) == 3       # the 4th level never pays
    assert p.cap(4, signal=12) == 0      # the copies give every token the model would
    assert p.cap(4) == 0                 # pooled: half the steps' copies drown the model's gain
    assert p.cap(4, signal=2) == 0       # a bucket never seen falls back to the pooled figures
    assert p.gain(0)[:3] == pytest.approx([(30 + 2 * 31 / 62) / 32] * 3)


def test_pace_warms_up_on_the_steps_with_nothing_to_copy():
    """With free sources only the steps without a copy warm up (the whole depth); a step with a copy
    is rated from the first, and does not use up the warm-up."""
    from multidraft.decoding.pace import DepthPace
    from multidraft.trees import TreeShape

    p = DepthPace(TreeShape.from_args(None, 1, 4), STEEP, warmup=2, explore_every=1000)
    assert p.cap(4, signal=10) == 0 and p.cap(4, signal=0) == 4 and p.cap(4) == 4
    for _ in range(3):
        p.record(0, 0, free_held=6, free_tokens=8, signal=10)
    assert p.cap(4, signal=0) == 4  # no step without a copy yet: still warming up
    for _ in range(2):
        p.record(4, 0, signal=0)
    assert p.cap(4, signal=0) == 0  # warmed up: on this profile no draft pays


def test_pace_explores_one_level_deeper_on_a_fixed_schedule():
    from multidraft.decoding.pace import DepthPace
    from multidraft.trees import TreeShape

    p = DepthPace(TreeShape.from_args(None, 1, 4), STEEP, warmup=0, explore_every=4)
    got = []
    for _ in range(8):
        c = p.cap(4)
        got.append(c)
        p.record(c, 0)
    assert got == [0, 0, 0, 1, 0, 0, 0, 1]


def test_decoder_paced_by_a_dear_profile_mostly_decodes_alone(pair):
    """STEEP: every drafted token costs a whole target pass, so after the warm-up the decode drafts
    only on the exploring steps; the text stays the target's greedy text."""
    import multidraft as md
    import tiny_models as tm

    t, d = pair
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 7, 9]])
    ref = tm.greedy_reference(t, ids, 32).tolist()
    plain = md.generate(t, d, ids, generator=0, verifier="specinfer", k=2, depth=3, temperature=0.0,
                        max_new_tokens=32)
    paced = md.generate(t, d, ids, generator=0, cost_profile=STEEP, verifier="specinfer", k=2, depth=3,
                        temperature=0.0, max_new_tokens=32)
    assert plain.tokens.tolist() == paced.tokens.tolist() == ref
    assert sum(dd > 0 for dd in paced.draft_depths) <= 4 + len(paced.draft_depths) // 8 + 1
    assert sum(dd > 0 for dd in plain.draft_depths) == len(plain.draft_depths) - (plain.draft_depths[-1] == 0)


def test_paced_methods_in_the_benchmark_grammar():
    from multidraft.experiments import decode_runs as dr

    m = dr.parse_method("sd:4+lookup+suffix@paced", temperature=0.0)
    plain = dr.parse_method("sd:4+lookup+suffix", temperature=0.0)
    assert m.paced and m.label == plain.label + " paced" and m.describe()["paced"] is True
    assert "paced" not in plain.describe() and m.settings == plain.settings
    assert dr.run_seed(3, "p0", m) == dr.run_seed(3, "p0", plain)  # paired with the unpaced method
    assert dr.parse_method("lookup@paced").paced
    for bad in ("target@paced", "sd:4@paced@paced", "specinfer:auto:2@paced"):
        with pytest.raises(ValueError):
            dr.parse_method(bad)
    with pytest.raises(ValueError, match="cost_profile"):
        dr.run(None, None, [("p", torch.tensor([[1, 2]]))], [m], seed=0, max_new_tokens=4)
