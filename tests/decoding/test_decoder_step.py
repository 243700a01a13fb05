"""The decoder's public step (``decoding.DecoderStep``): drafting, scoring, verifying and committing
one tree at a time by hand gives generate's tokens for the same seed; the rule capabilities the one
verification path reads; the runners' public state (``uncommitted``, ``snapshot`` / ``restore``) and
the teacher-forcing forward the experiments use."""
import pytest
import torch

pytest.importorskip("transformers")

import multidraft as md  # noqa: E402
from multidraft import trees  # noqa: E402
from multidraft.decoding import ArgumentError, DecoderStep, Settings, StepResult, runners  # noqa: E402

IDS = torch.tensor([[3, 5, 7, 2]])

CASES = {
    "walk_kary": dict(verifier="specinfer", k=2, depth=3),
    "walk_sequences_wor": dict(verifier="rrs_wor", k=2, depth=3, tree="sequences"),
    "walk_dynamic": dict(verifier="nss", k=3, depth=3, tree="dynamic", max_nodes=7, draft_temperature=1.5),
    "walk_independent": dict(verifier="specinfer", k=2, depth=2, draft_temperature=[0.7, 1.3]),
    "traversal": dict(rule="traversal", k=2, depth=2),
    "block": dict(rule="block", k=1, depth=4),
    "target_alone": dict(verifier=None),
}


def _by_hand(t, d, settings: Settings, seed: int, *, node_log=None, rule=None, four=True):
    """generate's decode loop written out over the public step (no eos, the context never full)."""
    g = torch.Generator().manual_seed(seed)
    step = DecoderStep(runners.runner_for(t), None if settings.target_alone else runners.runner_for(d), settings, g,
                       node_log=node_log)
    out, accepted = [], []
    with torch.inference_mode():
        step.prefill(IDS)
        root = int(IDS[0, -1])
        while len(out) < settings.max_new_tokens:
            cap = 0 if settings.target_alone else min(settings.shape.depth, settings.max_new_tokens - len(out) - 1)
            if four:
                tree = step.serve(step.draft(root, cap))
                logits = step.serve(step.score(tree))  # [N, V]
                verdict = step.verify(tree, logits, rule)
                new = step.commit(tree, verdict)
                accepted.append(len(verdict.path))
                assert new == list(verdict.tokens(tree))
            else:
                res = step.serve(step.step(root, cap, rule))
                assert isinstance(res, StepResult)
                new = res.tokens
                accepted.append(res.accepted)
            out.extend(new)
            root = new[-1]
    return out[: settings.max_new_tokens], accepted, step


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("temperature", [1.0, 0.0])
def test_steps_by_hand_give_generates_tokens(pair, case, temperature):
    t, d = pair
    settings = Settings.from_args(temperature=temperature, max_new_tokens=20, **CASES[case])
    for seed in ((0, 7) if temperature else (0,)):
        ref = md.generate(t, d, IDS, settings, generator=seed)
        got, accepted, step = _by_hand(t, d, settings, seed)
        assert got == ref.tokens.tolist(), (case, seed)
        assert accepted == ref.accepted_lengths
        assert (step.target_calls, step.draft_calls, step.tree_tokens) == (ref.target_calls, ref.draft_calls,
                                                                           ref.tree_tokens)
        got4, _, _ = _by_hand(t, d, settings, seed, four=False)  # the convenience step: the same four parts
        assert got4 == got


def test_a_rule_given_to_verify_is_the_rule_used(pair):
    """``verify(tree, logits, rule)`` verifies with the rule object given (the step's own rule is
    left as it is): a walk and a sequence-level rule built by hand decode generate's tokens."""
    t, d = pair
    walk = Settings.from_args(verifier="specinfer", k=2, depth=3, max_new_tokens=20)
    got, _, _ = _by_hand(t, d, walk, 3, rule=trees.TokenWalk("specinfer", walk.law))
    assert got == md.generate(t, d, IDS, walk, generator=3).tokens.tolist()
    trav = Settings.from_args(rule="traversal", k=2, depth=2, max_new_tokens=20)
    mine = trees.get("traversal")
    got, _, step = _by_hand(t, d, trav, 3, rule=mine)
    assert got == md.generate(t, d, IDS, trav, generator=3).tokens.tolist()
    assert step.rule is not mine and step.rule.name == "traversal"


def test_node_log_through_the_step_is_generates(pair):
    t, d = pair
    settings = Settings.from_args(verifier="specinfer", k=2, depth=3, max_new_tokens=24)
    ref_log, log = [], []
    ref = md.generate(t, d, IDS, settings, generator=5, node_log=ref_log)
    got, _, _ = _by_hand(t, d, settings, 5, node_log=log)
    assert got == ref.tokens.tolist() and log == ref_log and log


def test_rule_capabilities_decide_rows_and_node_records():
    """The one verification path asks the rule: the walk reads rows lazily and decides node by node;
    every other registered rule reads all rows on the CPU and keeps no per-node records."""
    walk = trees.get("token_walk", verifier="specinfer", law="iid")
    assert walk.lazy_rows and walk.node_wise
    checked = 0
    for name in trees.names():
        if name == "token_walk":
            continue
        try:
            rule = trees.get(name)
        except (TypeError, ValueError):  # a rule built only with options (tree_lp: one instance's LP)
            continue
        assert not rule.lazy_rows and not rule.node_wise, name
        checked += 1
    assert checked >= 2
    m = trees.TableModel.random(3, seed=5, style="same")
    tree = trees.kary(2, 2, "iid").sample(m, torch.Generator().manual_seed(0))
    verdict = trees.get("traversal").verify(tree, torch.Generator().manual_seed(0))
    assert trees.get("traversal").node_records(tree, verdict) == []
    assert walk.node_records(tree, walk.verify(tree, torch.Generator().manual_seed(0)))


def test_node_log_refusal_follows_the_rule_capability(pair):
    t, d = pair
    with pytest.raises(ArgumentError, match="node_log") as exc:
        md.generate(t, d, IDS, rule="block", k=1, depth=2, generator=0, node_log=[])
    assert exc.value.arg == "node_log" and "'block'" in str(exc.value)
    log = []  # the target alone: nothing is verified node by node, nothing refused
    md.generate(t, None, IDS, verifier=None, max_new_tokens=3, generator=0, node_log=log)
    assert log == []


def test_the_step_verifies_with_the_settings_rule_object(pair):
    t, d = pair
    for s in (Settings.from_args(verifier=None), Settings.from_args(verifier="rrs_wor", k=2),
              Settings.from_args(rule="traversal", k=2)):
        step = DecoderStep(runners.runner_for(t), None if s.target_alone else runners.runner_for(d), s, torch.Generator())
        assert step.rule is s.rule
    w = Settings.from_args(verifier="rrs_wor", k=2).rule
    assert isinstance(w, trees.TokenWalk) and w.verifier.name == "rrs_wor" and w.law == "wor"


def test_commit_takes_the_tree_in_flight_and_discard_restores(pair):
    t, d = pair
    settings = Settings.from_args(verifier="specinfer", k=2, depth=3)
    step = DecoderStep(runners.runner_for(t), runners.runner_for(d), settings, torch.Generator().manual_seed(0))
    with torch.inference_mode():
        step.prefill(IDS)
        tree = step.serve(step.draft(2, 3))
        logits = step.serve(step.score(tree))
        assert step.target_runner.uncommitted == len(tree) and step.draft_runner.uncommitted > 0
        other = step.new_tree(2, 3)
        with pytest.raises(ValueError, match="tree"):
            step.commit(other, step.verify(tree, logits))
        step.discard()
        assert step.target_runner.uncommitted == step.draft_runner.uncommitted == 0
        assert step.target_runner.base == step.draft_runner.base == IDS.shape[1] - 1 and step.pending == []
        # the same generator state drafts the same tree again after a discard
        g = torch.Generator().manual_seed(0)
        step.generator = g
        a = step.serve(step.draft(2, 3))
        step.discard()
        step.generator = torch.Generator().manual_seed(0)
        b = step.serve(step.draft(2, 3))
        assert [(n.token, n.parent, n.drafts) for n in a.nodes] == [(n.token, n.parent, n.drafts) for n in b.nodes]


def test_runner_snapshot_restores_the_very_results(pair):
    t, _ = pair
    r = runners.runner_for(t)
    with torch.inference_mode():
        r.prefill(IDS)
        a = r.extend([4, 6, 8], [-1, 0, 0]).clone()
        state = r.snapshot()
        assert r.uncommitted == 3 and state.nbytes() > 0
        b1 = r.extend([9], [1]).clone()
        r.commit([])
        assert r.uncommitted == 0
        r.restore(state)
        assert r.uncommitted == 3
        b2 = r.extend([9], [1])
        assert torch.equal(b1, b2)
        r.commit([0, 1])  # moves entries: another committed prefix
        with pytest.raises(ValueError, match="snapshot"):
            r.restore(state)
        r.prefill(IDS)  # the same length again, but a new prefill
        with pytest.raises(ValueError, match="snapshot"):
            r.restore(state)
    assert a.shape[0] == 3


def test_teacher_forced_logits_is_one_plain_forward(pair):
    t, _ = pair
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6])
    got = runners.teacher_forced_logits(t, ids)
    with torch.inference_mode():
        want = t(input_ids=ids.unsqueeze(0)).logits[0].float()
    assert got.dtype == torch.float32 and got.shape == (8, t.config.vocab_size) and torch.equal(got, want)

    class FakeLlama:
        engine = "llama.cpp"

    with pytest.raises(ValueError, match="transformers"):
        runners.teacher_forced_logits(FakeLlama(), ids)
