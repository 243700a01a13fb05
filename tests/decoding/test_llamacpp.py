"""The llama.cpp engine (``decoding.llamacpp``) on tiny random GGUF models (``multidraft.testing``).

* the tree pass over sequence ids equals llama.cpp's plain decode of every path, and commits
  keep exactly the accepted path (later levels over uncommitted entries too);
* at temperature 0 every tree mode equals llama.cpp's own greedy generation
  (``llama_cpp.Llama.generate``), with a draft that always agrees and one that never does;
* at temperature 1 the law of the first two tokens is the target's (chi-square), in every
  tree mode, with the draft's drafts accepted only sometimes;
* clear errors: a missing extra names it, one model as both target and draft, mixed engines.
"""
from __future__ import annotations

import sys

import pytest
import torch

llama_cpp = pytest.importorskip("llama_cpp")

import tiny_models as tm  # noqa: E402

import multidraft as md  # noqa: E402
from multidraft import sampling  # noqa: E402
from multidraft import trees  # noqa: E402
from multidraft.decoding import engine  # noqa: E402
from multidraft.decoding.llamacpp import LlamaCppModel  # noqa: E402
from multidraft.testing import tiny_gguf  # noqa: E402

from test_decoding import _chi2_pvalue  # noqa: E402

PROMPT = [3, 1, 4, 1, 5]


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    d = tmp_path_factory.mktemp("gguf")
    return tiny_gguf(d / "target.gguf", seed=1), tiny_gguf(d / "other.gguf", seed=2)


@pytest.fixture(scope="module")
def models(files):
    """target, a second copy of the target's weights (a draft that agrees), an unrelated draft."""
    t, o = files
    # float32 KV cells and no flash attention (which forms Q.K in float16 on the CPU): tree passes
    # and plain decodes then agree to float32 rounding, so a wrong mask cannot hide in a tolerance
    kw = dict(n_ctx=512, cache_type="f32", flash_attn=False)
    ms = [LlamaCppModel(t, **kw), LlamaCppModel(t, **kw), LlamaCppModel(o, **kw)]
    yield ms
    for m in ms:
        m.close()


def _plain_logits(model: LlamaCppModel, seq: list[int]) -> torch.Tensor:
    model.clear()
    return model.decode(seq, list(range(len(seq))), [[0]] * len(seq), [i == len(seq) - 1 for i in range(len(seq))])[0].clone()


def test_tree_pass_and_commits_match_plain_decodes(models):
    t, ref, _ = models
    run = t.runner()
    run.prefill(torch.tensor([PROMPT[:-1]]))
    shape = trees.TreeShape.from_args([[0], [1], [2], [0, 0], [0, 1], [2, 0], [0, 1, 0]], 3, 3)
    tree = trees.DraftTree(shape, PROMPT[-1], 3, 1)
    for i, toks in [(0, [7, 8, 7]), (1, [2, 9])]:  # duplicate 7: one child node
        tree.add_drafts(i, toks)
    tree.add_drafts(3, [10])
    logits = engine.score_tree(run, tree).clone()
    assert logits.shape == (len(tree), t.vocab_size)
    for i in range(len(tree)):
        seq = PROMPT + [tree.nodes[j].token for j in tree.path_to(i)]
        torch.testing.assert_close(logits[i], _plain_logits(ref, seq), atol=1e-5, rtol=0)
    path = tree.path_to(tree.nodes[3].child[10])
    run.commit([0] + path)
    seq = PROMPT + [tree.nodes[j].token for j in path]
    assert run.base == len(seq)
    torch.testing.assert_close(run.extend([5], [-1])[-1].clone(), _plain_logits(ref, seq + [5]), atol=1e-5, rtol=0)
    # levels over uncommitted entries (how the draft grows its tree): 6 under 5, then 1 and 2 under 6
    lv = run.extend([6], [0]).clone()
    lv2 = run.extend([1, 2], [1, 1]).clone()
    torch.testing.assert_close(lv[0], _plain_logits(ref, seq + [5, 6]), atol=1e-5, rtol=0)
    for r, tk in enumerate([1, 2]):
        torch.testing.assert_close(lv2[r], _plain_logits(ref, seq + [5, 6, tk]), atol=1e-5, rtol=0)
    run.commit([0, 1, 3])
    torch.testing.assert_close(run.extend([4], [-1])[-1].clone(), _plain_logits(ref, seq + [5, 6, 2, 4]),
                               atol=1e-5, rtol=0)
    # exactly the committed cells survive: the prefix sequence ends at the last committed position
    assert int(llama_cpp.llama_memory_seq_pos_max(t._mem, 0)) == run.base - 1


MODES = [
    dict(verifier="specinfer", k=2, depth=3),
    dict(verifier="naive", k=1, depth=5),
    dict(verifier="rrs_wor", k=3, depth=2, tree="sequences"),
    dict(verifier="spechub", k=2, depth=3, tree=[[0], [1], [0, 0], [0, 0, 0], [1, 0]]),
    dict(verifier="specinfer", k=3, depth=4, tree="dynamic", max_nodes=12),
]


def _llama_greedy(path, prompt: list[int], n: int) -> list[int]:
    m = llama_cpp.Llama(model_path=str(path), n_ctx=256, verbose=False)
    out = []
    for tok in m.generate(prompt, temp=0.0, top_k=1):
        out.append(int(tok))
        if len(out) == n:
            break
    m.close()
    return out


@pytest.fixture(scope="module")
def greedy_ref(files):
    return _llama_greedy(files[0], PROMPT, 40)


@pytest.mark.parametrize("kw", MODES, ids=lambda kw: f"{kw['verifier']}-{kw.get('tree', 'full')}")
def test_greedy_equals_llama_cpp_greedy(greedy_ref, models, kw):
    t, same, other = models
    want = greedy_ref
    for d, full_accept in ((same, True), (other, False)):
        r = md.generate(t, d, torch.tensor([PROMPT]), temperature=0.0, max_new_tokens=40, generator=0, **kw)
        assert r.tokens.tolist() == want
        if full_accept:
            assert r.block_efficiency > 1.5  # drafts were accepted, paths committed
    base = md.generate(t, None, torch.tensor([PROMPT]), verifier=None, temperature=0.0, max_new_tokens=40, generator=0)
    assert base.tokens.tolist() == want and base.target_calls == 40


def _exact_two_token_law(ref: LlamaCppModel, temperature: float) -> torch.Tensor:
    p1 = sampling.process_logits(_plain_logits(ref, PROMPT), temperature).double()
    V = p1.numel()
    rows = []
    for y in range(V):
        if float(p1[y]) == 0:
            rows.append(torch.zeros(V, dtype=torch.float64))
            continue
        rows.append(sampling.process_logits(_plain_logits(ref, PROMPT + [y]), temperature).double())
    return (p1.unsqueeze(1) * torch.stack(rows)).flatten()  # [V*V], index y1*V + y2


@pytest.mark.slow
@pytest.mark.parametrize("kw", MODES, ids=lambda kw: f"{kw['verifier']}-{kw.get('tree', 'full')}")
def test_two_token_law_at_temperature_one(models, kw):
    t, same, _ = models
    exact = _exact_two_token_law(same, 1.0)
    V = t.vocab_size
    counts = torch.zeros(V * V, dtype=torch.float64)
    g = torch.Generator().manual_seed(7)
    ids = torch.tensor([PROMPT])
    acc = 0
    n = 1500
    for _ in range(n):
        # the draft is the target's weights at draft temperature 1.6: accepted often, not always
        r = md.generate(t, same, ids, temperature=1.0, draft_temperature=1.6, max_new_tokens=2,
                        generator=g, **kw)
        y = r.tokens.tolist()
        counts[y[0] * V + y[1]] += 1
        acc += r.accepted_lengths[0]
    assert 0.2 * n < acc < 0.95 * n * max(1, kw["depth"] - 1)  # both branches of the walk taken
    assert _chi2_pvalue(counts, exact) > 1e-3


def test_errors(files, models, monkeypatch):
    t, same, _ = models
    ids = torch.tensor([PROMPT])
    with pytest.raises(ValueError, match="two LlamaCppModel objects"):
        md.generate(t, t, ids, max_new_tokens=2, generator=0)
    hf, _ = tm.tiny_pair()
    with pytest.raises(ValueError, match="one engine"):
        md.generate(t, hf, ids, max_new_tokens=2, generator=0)
    with pytest.raises(ValueError, match="outside the target vocabulary"):
        md.generate(t, same, torch.tensor([[t.vocab_size]]), max_new_tokens=2, generator=0)
    with pytest.raises(FileNotFoundError, match="no GGUF file"):
        LlamaCppModel(files[0].parent / "missing.gguf")
    monkeypatch.setitem(sys.modules, "llama_cpp", None)
    with pytest.raises(ImportError, match=r"install_llama_cpp.sh"):
        LlamaCppModel(files[0])


def test_same_prompt_reuses_the_prefill_and_decodes_the_same(models):
    t, same, _ = models
    ids = torch.tensor([PROMPT * 3])
    a = md.generate(t, same, ids, temperature=1.0, draft_temperature=1.3, max_new_tokens=20, generator=4)
    b = md.generate(t, same, ids, temperature=1.0, draft_temperature=1.3, max_new_tokens=20, generator=4)
    assert a.tokens.tolist() == b.tokens.tolist()
    assert a.prefill_seconds > 0 and b.prefill_seconds == 0.0


def test_cli_decode_on_llama_cpp(files, capsys):
    import json

    from multidraft.cli import main

    argv = ["decode", "--engine", "llama.cpp", "--target", str(files[0]), "--draft", str(files[0]), "--prompt", "hello",
            "--chat", "--ignore-eos", "--max-new-tokens", "12", "--temperature", "0", "--k", "2", "--depth", "3",
            "--threads", "1", "--json", "--quiet"]
    assert main(argv) == 0
    obj = json.loads(capsys.readouterr().out)
    assert obj["new_tokens"] == 12 and obj["run"]["engine"] == "llama.cpp" and obj["run"]["threads"] == 1
    assert obj["block_efficiency"] > 1.5  # the draft is the target's weights: greedy drafts are accepted
    m = LlamaCppModel(files[0], n_ctx=256)
    want = _llama_greedy(files[0], m.tokenize("hello", chat=True), 12)
    assert obj["tokens"] == want and obj["text"] == m.detokenize(want)
    m.close()
    assert main(["decode", "--engine", "llama.cpp", "--bf16-target", "--target", str(files[0]), "--prompt", "x",
                 "--quiet"]) == 2
    assert "--bf16-target picks the default target" in capsys.readouterr().err
    assert main(["decode", "--engine", "llama.cpp", "--draft-ftype", "q4_0", "--draft", str(files[0]), "--prompt", "x",
                 "--quiet"]) == 2
    assert "--draft-ftype picks the default draft's requantized GGUF" in capsys.readouterr().err
    assert main(["decode", "--engine", "llama.cpp", "--draft-ftype", "Q2", "--prompt", "x", "--quiet"]) == 2
    assert "--draft-ftype must be one of" in capsys.readouterr().err


def test_small_n_batch_is_an_error_or_works_never_an_abort(files):
    """llama.cpp aborts the process (GGML_ASSERT) when a context's batch is smaller than its
    sequence count (256): the model asks llama.cpp for at least that and chunks by ``n_batch``
    itself, so a small ``n_batch`` decodes, and a step that does not fit is a ValueError."""
    ms = [LlamaCppModel(files[0], n_ctx=256, n_batch=16, cache_type="f32", flash_attn=False) for _ in range(2)]
    try:
        ids = torch.tensor([PROMPT * 7])  # 35 prompt tokens: prefilled in chunks of 16
        r = md.generate(ms[0], ms[1], ids, max_new_tokens=6, generator=0, k=2, depth=2)
        assert r.new_tokens == 6
        with pytest.raises(ValueError, match="n_batch = 16"):
            md.generate(ms[0], ms[1], ids, max_new_tokens=6, generator=0, k=4, depth=2)  # 1 + 4 + 16 tree tokens
    finally:
        for m in ms:
            m.close()


@pytest.mark.parametrize("kw", [dict(k=2, depth=2)])
def test_greedy_mixed_sources_equal_llama_cpp_greedy(greedy_ref, models, kw):
    """Free sources' chains beside the draft model (mixed trees) on llama.cpp: the target's greedy
    text, from both drafts (one that agrees, one unrelated), and on the batch decoder's lanes."""
    t, same, other = models
    for d in (same, other):
        r = md.generate(t, d, torch.tensor([PROMPT]), verifier="specinfer", temperature=0.0, max_new_tokens=40,
                        generator=0, sources="model,lookup,suffix", **kw)
        assert r.tokens.tolist() == greedy_ref
    got = md.generate_batch(t, other, [torch.tensor([PROMPT])] * 2, verifier="specinfer", temperature=0.0,
                            max_new_tokens=40, generator=0, sources="model,lookup,suffix", **kw)
    assert all(g.tokens.tolist() == greedy_ref for g in got)


def test_a_context_below_the_sequence_count_is_a_value_error_not_an_abort(files, tmp_path):
    # llama.cpp cuts its batch to n_ctx; below its 256 parallel sequences it aborts the whole
    # process (GGML_ASSERT). Run in a child so that a regression fails this test, not the suite.
    import subprocess
    code = ("import sys\nfrom multidraft.decoding.llamacpp import LlamaCppModel\n"
            "try:\n    LlamaCppModel(sys.argv[1], n_ctx=64, n_threads=1)\n"
            "except ValueError as e:\n    print('refused:', e)\n")
    out = subprocess.run([sys.executable, "-c", code, str(files[0])], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, (out.returncode, out.stderr[-500:])
    assert "refused: n_ctx must be at least 256" in out.stdout
    m = LlamaCppModel(files[0], n_ctx=256, n_threads=1)  # the smallest context allowed works
    assert m.context == 256


@pytest.mark.parametrize("src", ["lookup", "suffix", "lookup,suffix"])
def test_greedy_free_only_equals_llama_cpp_greedy(greedy_ref, models, src):
    """Free sources alone (no draft model: none is passed, none runs) on llama.cpp: the target's
    greedy text, from ``generate`` and on the batch decoder's lanes (which hold no draft sequences)."""
    t = models[0]
    r = md.generate(t, None, torch.tensor([PROMPT]), temperature=0.0, max_new_tokens=40, generator=0, sources=src)
    assert r.tokens.tolist() == greedy_ref and r.draft_calls == 0
    assert r.tree_tokens > r.target_calls  # copies were scored and verified (this random model's text copies little)
    if src != "lookup,suffix":
        return
    got = md.generate_batch(t, None, [torch.tensor([PROMPT])] * 2, temperature=0.0, max_new_tokens=40, generator=0,
                            sources=src)
    assert all(g.tokens.tolist() == greedy_ref for g in got)
