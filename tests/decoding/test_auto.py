"""decoding.auto: the one home of ``--tree auto`` (issue 38): model-free checks naming the request's
fields, the study reader passed in, and one warm-up rule (seed stream, token count, prompt ids)."""
from __future__ import annotations

import json

import pytest

from multidraft._errors import ArgumentError
from multidraft.decoding import Settings
from multidraft.decoding.auto import WARMUP_TOKENS, AutoRequest, check_auto, choose
from multidraft.decoding.treeopt import AcceptStats, CostProfile


def _profile(tmp_path, target_seconds=lambda n: 0.1 + 1e-4 * n):
    pr = CostProfile(list(range(1, 65)), [target_seconds(n) for n in range(1, 65)], [1, 8], [1e-3, 2e-3])
    path = tmp_path / "prof.json"
    path.write_text(pr.to_json())
    return path


def _settings(**kw):
    return Settings.from_args(**{"verifier": "specinfer", "k": 3, "depth": 1, "temperature": 0.0, **kw})


@pytest.mark.parametrize("changes,arg", [
    (dict(profile=None), "profile"),
    (dict(profile="/no/such/file.json"), "profile"),
    (dict(max_nodes=65), "max_nodes"),
    (dict(max_depth=0), "max_depth"),
    (dict(warmup_tokens=0), "warmup_tokens"),
    (dict(accept_dataset="toy"), "accept_dataset"),
    (dict(profile_statistic="min"), "profile_statistic"),  # a profile without samples
])
def test_a_bad_request_names_its_field(tmp_path, changes, arg):
    req = AutoRequest(**{"profile": str(_profile(tmp_path)), **changes})
    with pytest.raises(ArgumentError) as exc:
        check_auto(req, _settings())
    assert exc.value.arg == arg


def test_files_go_through_the_reader_passed_in(tmp_path):
    stats = AcceptStats({1: [0.7], 2: [0.6, 0.2], 3: [0.6, 0.2, 0.1]}, {}, "given")
    path = tmp_path / "stats.json"
    path.write_text(stats.to_json())
    req = AutoRequest(profile=str(_profile(tmp_path)), accept_stats=str(path))
    with pytest.raises(ValueError, match="read_acceptance"):
        check_auto(req, _settings())
    seen = {}

    def reader(p, **kw):
        seen.update(kw, path=p)
        return AcceptStats.from_json(path.read_text()), None

    auto = check_auto(req, _settings(temperature=0.5, draft_temperature=0.7), read_acceptance=reader)
    assert auto.ks == (1, 2, 3) and auto.rater == "specinfer" and auto.stats.source == "given"
    assert seen == dict(path=str(path), verifier="specinfer", law="iid", ks=[1, 2, 3], t_target=0.5, t_draft=0.7,
                        dataset=None)

    def broken(p, **kw):
        raise ValueError("cannot read it")

    with pytest.raises(ArgumentError, match="accept_stats: cannot read it"):
        check_auto(req, _settings(), read_acceptance=broken)


def test_a_sequence_level_rule_is_rated_by_the_proxy_walk(tmp_path):
    auto = check_auto(AutoRequest(profile=str(_profile(tmp_path))),
                      Settings.from_args(rule="traversal", k=2, depth=1, tree=[[0]]))
    assert auto.rater == "specinfer" and auto.ks and max(auto.ks) <= 2


def test_the_warm_up_is_one_rule(tmp_path):
    pytest.importorskip("transformers")
    import tiny_models as tm
    import torch

    from multidraft._validate import derive_seed
    from multidraft.decoding import full_tree, generate

    t, d = tm.tiny_pair(vocab_size=32, seed=4)
    ids = torch.tensor([[3, 5, 7, 9]])
    settings = _settings()
    auto = check_auto(AutoRequest(profile=str(_profile(tmp_path)), seed=11), settings)
    assert auto.warmup_tokens == WARMUP_TOKENS == 32
    lines: list = []
    paths, info = choose(t, d, ids, settings, auto, None, lines.append)
    records: list = []
    generate(t, d, ids, settings.derive(depth=2, tree=full_tree(3, 2), max_new_tokens=32),
             generator=derive_seed(11, "tree-auto-warmup"), node_log=records)
    want = AcceptStats.from_records(records, max_k=3)
    assert info["accept_stats"]["accept"] == json.loads(json.dumps(want.to_dict()))["accept"]
    assert info["accept_stats"]["source"] == f"warm-up decode, {len(records)} nodes"
    assert info["decoded_with"] == "tree" and paths == info["tree"]["paths"]
    assert any(x.startswith("tree auto: best tree") for x in lines)
