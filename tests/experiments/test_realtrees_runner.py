"""The real-tree study (``experiments.realtrees``) on the tiny test pair: the trees it builds are the
decoder's, its rows are valid and resumable, and the report reads the JSONL files only."""
from __future__ import annotations

import json

import pytest
import torch

import multidraft as md
from multidraft.decoding import runners, step
from multidraft.experiments import realtrees


@pytest.fixture
def pair_tok(tiny_sharp):
    return tiny_sharp


def _run(pair_tok, out, **kw):
    t, d, tok = pair_tok
    args = dict(dataset=kw.pop("dataset"), n=2, out=out, seed=3, cont_tokens=6, stride=3, budgets=(4,))
    args.update(kw)
    return realtrees.run(t, d, tok, **args)


def test_shapes_have_the_node_budget():
    assert realtrees.bfs_tree(2, 4) == [[0], [1], [0, 0], [0, 1]]
    for b in (4, 8, 12):
        for s in realtrees.SHAPES:
            st = realtrees.shape_settings(s, b)
            assert st.shape.max_nodes() - 1 == b, (s, b)
    with pytest.raises(ValueError, match="budget"):
        realtrees.shape_settings("seq4", 6)
    with pytest.raises(ValueError, match="shape"):
        realtrees.shape_settings("star", 4)


@pytest.mark.parametrize("shape", realtrees.SHAPES)
def test_the_trees_built_are_the_decoders(pair_tok, shape, one_thread):
    """``build_tree`` at the prompt's last token with seed s gives the tree that ``generate`` with
    seed s drafts at its first step (same tokens, parents, drafts and q rows), and its p rows
    are the target's softmax at every node."""
    t, d, _ = pair_tok
    ids = torch.tensor([[1, 5, 7, 2]])
    st = realtrees.shape_settings(shape, 4)
    seen = []
    real = step.score_call

    class Stop(Exception):
        pass

    def spy(tree):
        seen.append(tree)
        raise Stop  # the first step's tree is drafted: enough

    step.score_call = spy
    try:
        with pytest.raises(Stop):
            md.generate(t, d, ids, st, generator=11)
    finally:
        step.score_call = real
    want = seen[0]
    with torch.inference_mode():
        rs = (runners.runner_for(t), runners.runner_for(d))
        for r in rs:
            r.prefill(ids[:, :-1])
        got = realtrees.build_tree(rs, st, int(ids[0, -1]), torch.Generator().manual_seed(11))
        # the runners are back at the committed prefix: a second build with the same seed is the same tree
        again = realtrees.build_tree(rs, st, int(ids[0, -1]), torch.Generator().manual_seed(11))
        assert [r.uncommitted for r in rs] == [0, 0] and rs[0].base == rs[1].base == ids.shape[1] - 1
    assert len(got) == len(want) > 1
    for a, b, c in zip(got.nodes, want.nodes, again.nodes):
        assert (a.token, a.parent, a.drafts) == (b.token, b.parent, b.drafts) == (c.token, c.parent, c.drafts)
        if b.q is not None:
            assert torch.allclose(a.q, b.q.double(), atol=1e-6)
    full = torch.tensor([ids[0].tolist()])
    logits = t(input_ids=full).logits[0, -1].double()
    assert torch.allclose(got.nodes[0].p, torch.softmax(logits, -1), atol=1e-5)


def test_runner_writes_valid_rows_and_resumes(pair_tok, prompt_file, tmp_path, one_thread):
    out = tmp_path / "r.jsonl"
    ds = f"file:{prompt_file}"
    got = _run(pair_tok, out, dataset=ds, max_trees=5)
    assert got["trees"] == 5 and got["stopped"] == "limit"
    from multidraft.experiments.records import read_jsonl

    meta, rows = read_jsonl(out)
    assert meta["seed"] == 3 and meta["config"]["dataset"] == ds and "torch" in meta["versions"]
    tree_rows = [r for r in rows if r["kind"] == "tree"]
    assert len(tree_rows) == 5
    for r in tree_rows:
        assert r["support"] == "full" and r["V"] == 32
        assert set(r["tokens"]) >= {"walk:specinfer", "walk:spectr", "walk:khisti_is", "walk:optimal", "traversal"}
        assert all(1.0 <= v <= 1 + r["depth"] + 1e-9 for v in r["tokens"].values())
        assert ("block" in r["tokens"]) == (r["shape"] == "chain")
        assert "tree_lp" in r["skipped"]  # no closed form at full V: recorded, not run
        if r["shape"] == "chain":  # traversal on a chain is block verification
            assert abs(r["tokens"]["block"] - r["tokens"]["traversal"]) <= 1e-12
    # resume: the rest is written, nothing twice, and the rows equal an uninterrupted run's
    got2 = _run(pair_tok, out, dataset=ds)
    assert got2["stopped"] == "done"
    _, rows = read_jsonl(out)
    keys = [(r["prompt"], r["position"], r["shape"], r["budget"]) for r in rows if r["kind"] == "tree"]
    conts = [r["tokens"] for r in rows if r["kind"] == "continuation"]
    assert len(conts) == 2
    # 4 shapes at each position 0, 3 of each continuation (6 tokens, or fewer where it met eos)
    assert len(keys) == len(set(keys)) == 4 * sum(len(range(0, len(c), 3)) for c in conts) >= 4 * 3
    once = tmp_path / "once.jsonl"
    _run(pair_tok, once, dataset=ds)
    _, rows1 = read_jsonl(once)
    a = {(r["prompt"], r["position"], r["shape"]): r["tokens"] for r in rows if r["kind"] == "tree"}
    b = {(r["prompt"], r["position"], r["shape"]): r["tokens"] for r in rows1 if r["kind"] == "tree"}
    assert a == b
    # a different config is refused, naming the key
    with pytest.raises(ValueError, match="stride"):
        _run(pair_tok, out, dataset=ds, stride=2)


def test_report_reads_the_jsonl_only(pair_tok, prompt_file, tmp_path, monkeypatch, one_thread):
    out = tmp_path / "r.jsonl"
    _run(pair_tok, out, dataset=f"file:{prompt_file}", shapes=("seq2", "chain"))
    import multidraft.decoding.pair as pair

    monkeypatch.setattr(pair, "load_pair", lambda *a, **k: (_ for _ in ()).throw(AssertionError("model loaded")))
    text = realtrees.report([out])
    assert "| walk:specinfer" in text and "traversal" in text and "seq2, budget 4: 4 trees, 2 prompts" in text
    assert "## Headline" in text
    # a damaged row is left out with a note, not counted
    with open(out, "a", encoding="utf-8") as f:
        row = json.loads(out.read_text().splitlines()[-1])
        row["tokens"] = {"walk:specinfer": "x"}
        row["position"] = 99
        f.write(json.dumps(row) + "\n")
    text2 = realtrees.report([out])
    assert "left out" in text2 and "seq2, budget 4: 4 trees" in text2


def test_paired_standard_errors():
    rows = [dict(prompt=f"p{i // 2}", tokens={"a": 1.0 + i, "b": 1.0 + i + (0.1 if i % 2 else 0.3)}) for i in range(6)]
    m, se, sc = realtrees._paired(rows, "b", "a")
    assert abs(m - 0.2) < 1e-12
    d = [0.3, 0.1] * 3
    sd = (sum((x - 0.2) ** 2 for x in d) / 5) ** 0.5
    assert abs(se - sd / 6 ** 0.5) < 1e-12
    assert abs(sc) < 1e-12  # every prompt's differences sum to the mean: no between-prompt spread


def test_report_has_per_category_rows(tmp_path):
    from multidraft.experiments.records import JsonlWriter

    out = tmp_path / "mt.jsonl"
    with JsonlWriter(out, {"dataset": "mtbench"}, 0) as w:
        for i in range(6):
            cat = "math" if i < 3 else "writing"
            w.write(kind="tree", dataset="mtbench", prompt=f"mtbench/{i}", category=cat, position=0, shape="seq2",
                    budget=4, tokens={"walk:specinfer": 1.5 + 0.01 * i, "walk:optimal": 1.6, "traversal": 1.7})
    text = realtrees.report([out])
    assert "### mtbench, seq2, budget 4: 6 trees, 6 prompts" in text
    assert "### mtbench/math, seq2, budget 4: 3 trees" in text and "### mtbench/writing, seq2, budget 4: 3 trees" in text
    assert "| mtbench | seq2 | 4 | 6 | 6 | walk:optimal | traversal | +0.1000 |" in text


def test_mtbench_categories():
    from multidraft import datasets

    try:
        cats = datasets.mtbench_categories()
    except (FileNotFoundError, ModuleNotFoundError, ImportError):
        pytest.skip("MT-bench data not installed")
    ids = [i for i, _ in datasets.load_prompts("mtbench", 80)]
    assert set(ids) <= set(cats) and len(set(cats.values())) == 8


def _reference_rows(pair_tok, dataset, conts, shapes, budgets, stride, seed):
    """Every tree's rule values computed the plain way (the runner before it shared anything): a
    fresh decoder per prompt with its own prefills, the root's draft forward run for every tree."""
    from multidraft import datasets
    from multidraft._validate import derive_seed

    t, d, tok = pair_tok
    name = "file:" + dataset[5:].rsplit("/", 1)[-1]
    out = {}
    for pid, prompt in datasets.load_prompts(dataset, len(conts)):
        ids = datasets.prompt_ids(tok, dataset, prompt)
        T = int(ids.shape[1])
        full = ids[0].tolist() + conts[pid]
        with torch.inference_mode():
            rs = (runners.runner_for(t), runners.runner_for(d))
            for r in rs:
                r.prefill(torch.tensor([full[:T - 1]]))
            cur = T - 1
            for j in range(0, len(conts[pid]), stride):
                while cur < T - 1 + j:
                    realtrees._advance(rs, full, cur, min(T - 1 + j, cur + stride))
                    cur = min(T - 1 + j, cur + stride)
                for s in shapes:
                    for b in budgets:
                        g = torch.Generator().manual_seed(derive_seed(seed, f"{name}|{pid}|{j}|{s}|{b}", rule="unit"))
                        tree = realtrees.build_tree(rs, realtrees.shape_settings(s, b), full[T - 1 + j], g)
                        rules, _ = realtrees.tree_rules(realtrees.tree_law(realtrees.shape_settings(s, b)))
                        out[(pid, j, s, b)] = realtrees.evaluate_tree(tree, rules)
    return out


def test_shared_work_gives_the_plain_rows(pair_tok, prompt_file, tmp_path, monkeypatch, one_thread):
    """What the runner shares (the root's draft forward across a position's trees, the prompt prefill
    with the continuation) changes no bit: every row equals the plain computation's, and the
    sharing did happen."""
    from multidraft.experiments.records import read_jsonl

    made = []

    class Spy(realtrees._SharedCalls):
        def __init__(self, runner):
            super().__init__(runner)
            made.append(self)

    monkeypatch.setattr(realtrees, "_SharedCalls", Spy)
    out = tmp_path / "r.jsonl"
    ds = f"file:{prompt_file}"
    _run(pair_tok, out, dataset=ds, budgets=(4, 8))
    assert sum(s.hits for s in made) > 0
    _, rows = read_jsonl(out)
    conts = {r["prompt"]: r["tokens"] for r in rows if r["kind"] == "continuation"}
    got = {(r["prompt"], r["position"], r["shape"], r["budget"]): r["tokens"] for r in rows if r["kind"] == "tree"}
    want = _reference_rows(pair_tok, ds, conts, realtrees.SHAPES, (4, 8), 3, 3)
    assert got == want and len(got) >= 8 * 3


def test_trees_written_before_a_rule_are_filled_exactly(pair_tok, prompt_file, tmp_path, monkeypatch, one_thread):
    """Rows written without a rule (here 'gbv', as if registered later) are resumed, not rewritten: the
    trees are rebuilt from their seeds, every written value is recomputed exactly (recheck 0), the
    added rule equals a fresh run's, and the report tables hold it for every tree."""
    from multidraft.experiments.records import read_jsonl

    ds = f"file:{prompt_file}"
    real = realtrees.tree_rules

    def without_gbv(law):
        todo, skipped = real(law)
        return [(x, r) for x, r in todo if x != "gbv"], skipped

    out = tmp_path / "old.jsonl"
    monkeypatch.setattr(realtrees, "tree_rules", without_gbv)
    first = _run(pair_tok, out, dataset=ds, shapes=("seq2", "chain"))
    monkeypatch.setattr(realtrees, "tree_rules", real)
    _, before = read_jsonl(out)
    assert first["trees"] > 0 and not any("gbv" in r["tokens"] for r in before if r["kind"] == "tree")
    again = _run(pair_tok, out, dataset=ds, shapes=("seq2", "chain"))
    assert again["trees"] == 0 and again["filled"] == first["trees"] and again["recheck_max"] == 0.0
    _, rows = read_jsonl(out)
    assert [r for r in rows if r["kind"] == "tree"] == [r for r in before if r["kind"] == "tree"]  # untouched
    fills = [r for r in rows if r["kind"] == "tree_fill"]
    assert len(fills) == first["trees"] and all(r["added"] == ["gbv"] for r in fills)
    assert all(v == 0.0 for r in fills for v in r["recheck"].values())
    assert _run(pair_tok, out, dataset=ds, shapes=("seq2", "chain"))["filled"] == 0  # filled once
    fresh = tmp_path / "fresh.jsonl"
    _run(pair_tok, fresh, dataset=ds, shapes=("seq2", "chain"))
    _, rows1 = read_jsonl(fresh)
    want = {(r["prompt"], r["position"], r["shape"]): r["tokens"] for r in rows1 if r["kind"] == "tree"}
    assert {(r["prompt"], r["position"], r["shape"]): r["tokens"] for r in fills} == want
    text = realtrees.report([out])
    assert "| gbv |" in text and "rebuilt from their seeds" in text
    assert "### " + ds + ", seq2, budget 4: 4 trees" in text


def test_mixed_trees_built_are_the_decoders(pair_tok, one_thread):
    """With free sources the study's ``build_tree`` (the committed text given) is the tree ``generate``
    drafts at its first step: the model's drafts and the lookup chain, every q row a distribution."""
    t, d, _ = pair_tok
    ids = torch.tensor([[1, 5, 7, 2, 1, 5, 7]])
    st = md.decoding.Settings.from_args(verifier="specinfer", k=2, depth=2, sources="model,lookup")
    seen = []
    real = step.score_call

    class Stop(Exception):
        pass

    def spy(tree):
        seen.append(tree)
        raise Stop

    step.score_call = spy
    try:
        with pytest.raises(Stop):
            md.generate(t, d, ids, st, generator=11)
    finally:
        step.score_call = real
    want = seen[0]
    with torch.inference_mode():
        rs = (runners.runner_for(t), runners.runner_for(d))
        for r in rs:
            r.prefill(ids[:, :-1])
        got = realtrees.build_tree(rs, st, int(ids[0, -1]), torch.Generator().manual_seed(11), ids[0].tolist())
    assert got.law == "iid" and any(nd.slot is None for nd in got.nodes[1:])  # the model's law; free-only nodes
    assert [(a.token, a.parent, a.drafts) for a in got.nodes] == [(b.token, b.parent, b.drafts) for b in want.nodes]
    for nd in got.nodes:
        if len(nd.drafts) > nd.free:  # model drafts: the model's q row [V]; free drafts have none
            assert nd.q.ndim == 1 and abs(float(nd.q.sum()) - 1.0) < 1e-12
        elif nd.drafts:
            assert nd.q is None
    assert realtrees.tree_law(st).kind == "iid"
    rules, _ = realtrees.tree_rules(realtrees.tree_law(st))
    assert rules and all(name.startswith("walk:") for name, _ in rules)
    assert all(v > 0 for v in realtrees.evaluate_tree(got, rules).values())
