"""``decoding.Settings``: the one validated settings object of ``generate``.

Made once by ``Settings.from_args`` (an ``ArgumentError`` naming each bad argument), taken as
is by ``generate(target, draft, ids, settings, generator=...)``; the keyword form makes the
same object, so both decode the same tokens, and each argument is validated once per call.
"""
from __future__ import annotations

import json

import pytest
import torch

import multidraft as md
from multidraft import _validate
from multidraft.decoding import ArgumentError, Settings
from multidraft.decoding import settings as settings_mod

PROMPT = torch.tensor([[1, 2, 3, 4, 5]])

CONFIGS = [
    dict(verifier="rrs_wor", k=4, depth=3, temperature=1.0, max_new_tokens=12),
    dict(verifier="specinfer", k=2, depth=2, temperature=0.8, top_k=10, top_p=0.9, max_new_tokens=10),
    dict(verifier="nss", k=3, depth=3, tree="sequences", draft_temperature=0.7, max_new_tokens=10),
    dict(verifier="specinfer", k=2, depth=2, draft_temperature=[0.5, 1.2], max_new_tokens=10),
    dict(verifier="nss", k=3, depth=3, tree="dynamic", max_nodes=6, min_gain=0.01, max_new_tokens=10),
    dict(verifier="nss", tree=[[0], [1], [0, 0]], max_new_tokens=10),
    dict(verifier=None, temperature=1.0, max_new_tokens=8),
]


torch.set_num_threads(1)  # as the other decoding tests; the tiny pair is tests/decoding/conftest.py's


@pytest.mark.parametrize("kw", CONFIGS)
def test_settings_object_and_keywords_decode_the_same_tokens(pair, kw):
    t, d = pair
    s = Settings.from_args(**kw)
    a = md.generate(t, d, PROMPT, s, generator=7)
    b = md.generate(t, d, PROMPT, generator=7, **kw)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert (a.target_calls, a.draft_calls, a.accepted_lengths) == (b.target_calls, b.draft_calls, b.accepted_lengths)
    assert a.new_tokens == kw["max_new_tokens"]  # no eos given: it decodes to the end


def test_the_public_keyword_call_still_works(pair):
    t, d = pair
    r = md.generate(t, d, PROMPT, verifier="rrs_wor", k=4, depth=3, temperature=1.0, max_new_tokens=16, generator=0)
    assert r.new_tokens == 16 and r.target_calls >= 1


def _counting(monkeypatch, module, name):
    calls = []
    real = getattr(module, name)

    def counted(*a, **kw):
        calls.append((a, kw))
        return real(*a, **kw)

    monkeypatch.setattr(module, name, counted)
    return calls


def test_each_argument_is_validated_once_per_call(pair, monkeypatch):
    t, d = pair
    made = []
    real = Settings.from_args.__func__
    monkeypatch.setattr(Settings, "from_args", classmethod(lambda cls, **kw: made.append(kw) or real(cls, **kw)))
    ks = _counting(monkeypatch, settings_mod, "as_k")
    temps = _counting(monkeypatch, settings_mod, "as_temperature")
    md.generate(t, d, PROMPT, verifier="specinfer", k=2, depth=2, temperature=0.9, max_new_tokens=6, generator=1)
    assert len(made) == 1 and len(ks) == 1
    assert [a[1] if len(a) > 1 else kw.get("name") for a, kw in temps] == ["temperature"]  # target T once, no draft T given
    # a Settings is taken as it is: nothing is validated again
    s = Settings.from_args(verifier="specinfer", k=2, depth=2, temperature=0.9, max_new_tokens=6)
    made.clear(), ks.clear(), temps.clear()
    md.generate(t, d, PROMPT, s, generator=1)
    assert made == [] and ks == [] and temps == []


@pytest.mark.parametrize("kw,arg", [
    (dict(k=0), "k"),
    (dict(k=True), "k"),
    (dict(depth=0), "depth"),
    (dict(draft_law="bogus"), "draft_law"),
    (dict(verifier="rrs_wor", draft_law="iid"), "draft_law"),
    (dict(verifier="naive", k=2), "k"),
    (dict(verifier="spechub", k=3), "k"),
    (dict(verifier="nope"), "verifier"),
    (dict(temperature=-1), "temperature"),
    (dict(temperature=float("nan")), "temperature"),
    (dict(draft_temperature=-1.0), "draft_temperature"),
    (dict(draft_temperature=[1.0, 2.0, 3.0]), "draft_temperature"),
    (dict(top_k=0), "top_k"),
    (dict(top_p=1.5), "top_p"),
    (dict(max_new_tokens=0), "max_new_tokens"),
    (dict(tree=[[1]]), "tree"),
    (dict(tree="bushy"), "tree"),
    (dict(max_nodes=8), "max_nodes"),
    (dict(tree="dynamic", max_nodes=1), "max_nodes"),
    (dict(tree="dynamic", min_gain=1.5), "min_gain"),
    (dict(tree="dynamic", draft_temperature=[1.0, 0.5]), "draft_law"),
])
def test_a_bad_argument_is_one_error_naming_it(kw, arg):
    with pytest.raises(ArgumentError) as info:
        Settings.from_args(**kw)
    exc = info.value
    assert isinstance(exc, ValueError) and exc.arg == arg
    assert str(exc).startswith(arg) and str(exc) == arg + exc.detail
    assert exc.restated("--flag") == "--flag" + exc.detail


def test_generate_refuses_a_settings_with_keywords_and_a_non_settings(pair):
    t, d = pair
    s = Settings.from_args(verifier="nss", k=2, depth=2, max_new_tokens=4)
    with pytest.raises(ArgumentError, match="not both") as info:
        md.generate(t, d, PROMPT, s, k=3, generator=0)
    assert info.value.arg == "settings"
    with pytest.raises(ArgumentError) as info:
        md.generate(t, d, PROMPT, {"k": 2}, generator=0)
    assert info.value.arg == "settings"
    with pytest.raises(ArgumentError) as info:  # model facts name their argument too
        md.generate(t, d, torch.tensor([[1, 99]]), s, generator=0)
    assert info.value.arg == "input_ids"
    with pytest.raises(TypeError):  # an unknown keyword is a TypeError, as for any Python call
        md.generate(t, d, PROMPT, verifier="nss", kk=2, generator=0)


def test_settings_are_frozen_and_resolved():
    s = Settings.from_args(verifier="rrs_wor", k=3, depth=2, temperature=0.5)
    assert s.law == "wor" and s.verifier.name == "rrs_wor" and s.draft_temps == (0.5,)
    with pytest.raises(AttributeError):
        s.k = 4
    ind = Settings.from_args(verifier="specinfer", k=2, draft_temperature=[0.5, 1.0])
    assert ind.law == "independent" and ind.draft_temps == (0.5, 1.0)


@pytest.mark.parametrize("kw", CONFIGS)
def test_a_description_gives_the_same_settings_again(kw):
    s = Settings.from_args(**kw)
    again = Settings.from_args(**Settings.args_of(s.describe()))
    assert again == s and again.describe() == s.describe()
    assert (again.rule_name, again.law, again.shape, again.draft_temps, again.sources) == \
        (s.rule_name, s.law, s.shape, s.draft_temps, s.sources)
    assert getattr(again.verifier, "name", None) == getattr(s.verifier, "name", None)
    assert json.loads(json.dumps(s.describe())) == s.describe()  # a JSON object as it is


def test_describe_spells_each_thing_once():
    alone = Settings.from_args(verifier=None, temperature=0.5).describe()
    assert (alone["rule"], alone["verifier"], alone["law"], alone["k"], alone["depth"], alone["tree"],
            alone["draft_temperature"], alone["sources"]) == (None, None, None, 0, 0, None, None, [])
    walk = Settings.from_args(verifier="specinfer", k=2, depth=3).describe()
    assert (walk["rule"], walk["verifier"], walk["law"], walk["k"], walk["tree"], walk["sources"]) == \
        ("token_walk", "specinfer", "iid", 2, None, ["model"])
    seq = Settings.from_args(rule="traversal", k=2, depth=3, tree="sequences").describe()
    assert (seq["rule"], seq["verifier"], seq["tree"]) == ("traversal", None, "sequences")
    paths = Settings.from_args(verifier="specinfer", k=2, depth=2, tree=[[0], [1], [0, 0]]).describe()
    assert paths["tree"] == [[0], [1], [0, 0]]
    dyn = Settings.from_args(verifier="specinfer", k=3, depth=4, tree="dynamic", max_nodes=9).describe()
    assert (dyn["tree"], dyn["max_nodes"], dyn["min_gain"]) == ("dynamic", 9, 0.0)
    assert set(alone) == set(walk) == set(dyn)


def test_the_rule_is_the_object_that_verifies():
    from multidraft import trees
    s = Settings.from_args(verifier="rrs_wor", k=2, depth=2)
    assert isinstance(s.rule, trees.TokenWalk) and s.rule.verifier is s.verifier and s.rule.law == "wor"
    r = Settings.from_args(rule="traversal", k=2, depth=2)
    assert isinstance(r.rule, trees.TreeRule) and r.rule.name == r.rule_name == "traversal" and r.verifier is None
    assert Settings.from_args(verifier=None).rule is None


def test_a_sampling_change_is_applied_to_the_resolved_object(monkeypatch):
    s = Settings.from_args(verifier="rrs_wor", k=3, depth=2, temperature=0.7)
    calls = []
    real = Settings.from_args.__func__
    monkeypatch.setattr(Settings, "from_args", classmethod(lambda cls, **kw: calls.append(kw) or real(cls, **kw)))
    t = s.derive(temperature=0.2, top_p=0.9, max_new_tokens=7, draft_temperature=0.3)
    assert calls == []  # no new settings call: only the changed fields are checked
    assert t.rule is s.rule and (t.temperature, t.top_p, t.max_new_tokens, t.draft_temps) == (0.2, 0.9, 7, (0.3,))
    assert t == real(Settings, verifier="rrs_wor", k=3, depth=2, temperature=0.2, top_p=0.9, max_new_tokens=7,
                     draft_temperature=0.3)
    assert s.derive(temperature=0.2).draft_temps == (0.7,)  # the draft temperature does not follow unless given
    for kw in (dict(temperature=0.2, draft_temperature=None), dict(draft_temperature=None)):  # None: from_args' default
        assert s.derive(**kw) == real(Settings, **{**Settings.args_of(s.describe()), **kw})
    ind = real(Settings, verifier="specinfer", k=2, depth=2, draft_temperature=[0.5, 1.0])
    assert ind.derive(temperature=0.3, draft_temperature=None).draft_temps == (0.3, 0.3)
    with pytest.raises(ArgumentError) as info:
        s.derive(top_p=1.5)
    assert info.value.arg == "top_p"
    with pytest.raises(TypeError):
        s.derive(kk=2)


def test_sources_name_the_draft_model():
    s = Settings.from_args(verifier="specinfer", k=2, depth=2, sources="model")
    assert [src.name for src in s.sources] == ["model"] and s.describe()["sources"] == ["model"]
    assert s == Settings.from_args(verifier="specinfer", k=2, depth=2)
    for bad in ([], ["model", "model"], 3):
        with pytest.raises(ArgumentError) as info:
            Settings.from_args(verifier="specinfer", sources=bad)
        assert info.value.arg == "sources"
    with pytest.raises(ArgumentError) as info:  # free sources alone read no verifier (free-only decoding)
        Settings.from_args(verifier="specinfer", sources="lookup")
    assert info.value.arg == "verifier"


def test_derive_checks_the_new_call():
    s = Settings.from_args(verifier="nss", k=2, depth=3)
    alone = s.derive(verifier=None)
    assert alone.verifier is None and alone.shape is None and alone.temperature == s.temperature
    chain = s.derive(tree=[[0], [0, 0]])
    assert chain.shape.depth == 2 and chain.law == "iid"
    with pytest.raises(ArgumentError) as info:
        s.derive(depth=0)
    assert info.value.arg == "depth"


def test_argument_error_of_keeps_the_name_once():
    e = ArgumentError.of("tree", ValueError("tree: path [1] exists but its sibling [0] does not"))
    assert str(e) == "tree: path [1] exists but its sibling [0] does not" and e.arg == "tree"
    e = ArgumentError.of("datasets", ValueError("dataset must be one of ..."))
    assert str(e) == "datasets: dataset must be one of ..."
    assert _validate.ArgumentError is ArgumentError
