"""multidraft.sampling: the one logits -> distribution function, shared by decoding and experiments."""
import pytest
import torch

from multidraft import sampling
from multidraft.experiments import collect, store


def test_top_k_ties_regression():
    # [2, 1, 1, 0] with top-k 2: exactly two tokens survive (ties to the lower id), in every dtype
    logits = torch.tensor([[2.0, 1.0, 1.0, 0.0]])
    want = torch.tensor([[0.7310585786, 0.2689414214, 0.0, 0.0]], dtype=torch.float64)
    for dtype in (torch.float32, torch.float64):
        p = sampling.process_logits(logits, 1.0, 2, None, dtype=dtype)
        assert p.dtype == dtype
        torch.testing.assert_close(p.double(), want, atol=1e-7, rtol=0)


def test_process_logits_matches_transformers_warpers():
    pytest.importorskip("transformers")
    from transformers.generation.logits_process import TopKLogitsWarper, TopPLogitsWarper

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=g) * 3
    for T, k, p in [(1.0, None, None), (0.7, 10, None), (1.3, None, 0.8), (0.9, 7, 0.6)]:
        x = logits / T
        if k is not None:
            x = TopKLogitsWarper(k)(None, x)
        if p is not None:
            x = TopPLogitsWarper(p)(None, x)
        torch.testing.assert_close(sampling.process_logits(logits, T, k, p), torch.softmax(x, -1), atol=1e-6, rtol=1e-5)
    z = sampling.process_logits(logits, 0.0)
    assert torch.equal(z.argmax(-1), logits.argmax(-1)) and torch.all(z.sum(-1) == 1)


def test_sample_token_law():
    from scipy.stats import chisquare

    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    g = torch.Generator().manual_seed(1)
    c = torch.bincount(torch.stack([sampling.sample_token(p, g) for _ in range(3000)]), minlength=4).double()
    assert c[1] == 0
    keep = p > 0
    pk = p[keep].double() / p[keep].double().sum()
    assert chisquare(c[keep].numpy(), (pk * c.sum()).numpy()).pvalue > 1e-3


@pytest.mark.parametrize("temperature,top_k,top_p", [(1.0, None, None), (0.7, 2, None), (1.0, 3, None),
                                                     (1.3, None, 0.6), (0.9, 5, 0.7), (0.0, None, None)])
def test_decoding_and_experiments_see_the_same_distribution(tmp_path, temperature, top_k, top_p):
    """The same logits through the decoder's path and through the position collector give
    the same processed target distribution (the collector stores it untruncated with eps = 0)."""
    pytest.importorskip("transformers")
    from multidraft.decoding import step
    from tiny_models import tiny_pair, tiny_tokenizer

    assert step.process_logits is sampling.process_logits  # the decoder's p at every node (DecoderStep.verify)
    t, d = tiny_pair(vocab_size=32, seed=0, init_scale=8.0)
    tok = tiny_tokenizer()
    f = tmp_path / "corpus.txt"
    f.write_text("abc abc abd abe abc, the cat sat on the mat.\n", encoding="utf-8")
    td = temperature if temperature > 0 else 1.0
    paths = collect.collect(tmp_path / "run", models=lambda: (t, d, tok), model_names={"target": "t", "draft": "d"},
                            datasets=[f"file:{f}"], configs=[(temperature, td)], top_k=top_k, top_p=top_p,
                            n_texts=1, positions_per_text=6, max_tokens=64, min_context=2, eps=0.0, k_max=2, seed=3)
    ps = store.load(next(iter(paths.values())))
    ids = torch.tensor(tok(f.read_text(encoding="utf-8").strip(), add_special_tokens=False)["input_ids"][:64])
    with torch.no_grad():
        lt = t(input_ids=ids[None]).logits[0]
        ld = d(input_ids=ids[None]).logits[0]
    for i, src in enumerate(ps.info["sources"]):
        a, b = int(ps.offsets[i]), int(ps.offsets[i + 1])
        sup = ps.ids[a:b].long()
        for stored, logits, T in ((ps.p, lt, temperature), (ps.q, ld, td)):
            dec = sampling.process_logits(logits[src["position"]], T, top_k, top_p)  # what engine.generate uses
            full = torch.zeros(dec.shape[-1], dtype=torch.float64)
            full[sup] = stored[a:b].double()
            torch.testing.assert_close(full, dec.double(), atol=2e-7, rtol=0)


def test_check_sampling_args_numpy_numbers_and_bools():
    import numpy as np
    sampling.check_sampling_args(np.float32(0.7), np.int64(5), np.float64(0.9))
    sampling.check_sampling_args(np.int32(1), np.uint8(3), None)
    for args, word in [((True, None, None), "temperature"), ((np.bool_(True), None, None), "temperature"),
                       ((1.0, True, None), "top_k"), ((1.0, np.bool_(True), None), "top_k"),
                       ((1.0, 2.0, None), "top_k"), ((1.0, np.float64(2.0), None), "top_k"),
                       ((1.0, np.int64(0), None), "top_k"), ((1.0, None, True), "top_p"),
                       ((1.0, None, np.float64(1.5)), "top_p"), ((np.float64("nan"), None, None), "temperature"),
                       ((-1, None, None), "temperature"), (("1", None, None), "temperature")]:
        with pytest.raises(ValueError, match=word):
            sampling.check_sampling_args(*args)
    # numpy values flow through process_logits unchanged
    logits = torch.tensor([2.0, 1.0, 1.0, 0.0])
    torch.testing.assert_close(sampling.process_logits(logits, np.float64(1.0), np.int64(2)),
                               sampling.process_logits(logits, 1.0, 2))


def _process_logits_sorted(logits, temperature, top_k=None, top_p=None, *, dtype=torch.float32):
    """The full-sort path of process_logits, as it was before the head cut (the reference)."""
    x = logits.to(dtype)
    V = x.shape[-1]
    probs = torch.softmax(x / float(temperature), dim=-1)
    cut_k = top_k is not None and top_k < V
    cut_p = top_p is not None and top_p < 1.0
    if cut_k or cut_p:
        sp, si = torch.sort(probs, dim=-1, descending=True, stable=True)
        keep = torch.ones_like(sp, dtype=torch.bool)
        if cut_k:
            keep[..., top_k:] = False
        if cut_p:
            sk = torch.where(keep, sp, torch.zeros_like(sp))
            before = torch.cumsum(sk, -1) - sk
            keep &= before < top_p * sk.sum(-1, keepdim=True)
            keep[..., 0] = True
        probs = torch.zeros_like(probs).scatter_(-1, si, torch.where(keep, sp, torch.zeros_like(sp)))
    return probs / probs.sum(-1, keepdim=True)


@pytest.mark.parametrize("heads", [None, (3, 40)])
def test_head_cut_is_bit_identical_to_the_full_sort(monkeypatch, heads):
    """top-k / top-p at large V without sorting the vocabulary: the same tensor, bit for bit,
    as the full stable sort, on bf16-rounded logits (ties at every cut), peaked and flat rows,
    batched, float32 and float64; with tiny heads (second parametrisation) most rows need the
    second head or the full-sort fallback."""
    if heads is not None:
        monkeypatch.setattr(sampling, "_HEADS", heads)
    g = torch.Generator().manual_seed(31)
    n_head = 0
    for trial in range(12):
        V = (5000, 30011, 151936)[trial % 3]
        shape = ((3, V), (2, 2, V), (1, V))[trial % 3]
        scale = (0.5, 2.0, 6.0)[(trial // 3) % 3]
        logits = (torch.randn(*shape, generator=g) * scale).bfloat16().float()
        if trial % 4 == 0:
            logits[..., :7] = logits.max() + 1.0  # seven tied maxima
        for T, top_k, top_p in ((1.0, 1, None), (1.0, 5, None), (0.7, 50, None), (1.0, None, 0.9), (1.3, None, 0.5),
                                (1.0, 8, 0.8), (1.0, 300, 0.95), (0.5, None, 0.999), (1.0, 7, 0.3)):
            for dtype in (torch.float32, torch.float64):
                want = _process_logits_sorted(logits, T, top_k, top_p, dtype=dtype)
                got = sampling.process_logits(logits, T, top_k, top_p, dtype=dtype)
                assert got.dtype == dtype and torch.equal(got, want), (trial, T, top_k, top_p, dtype)
                probs = torch.softmax(logits.to(dtype) / T, -1)
                n_head += sampling._cut_head(probs, top_k if top_k and top_k < V else None, top_p) is not None
    assert n_head > 50  # the head decides most cuts (the rest exercise the fallback)


def test_head_cut_falls_back_when_the_boundary_is_too_close(monkeypatch):
    """A row whose top-p boundary sits within the rounding margin goes to the full sort."""
    logits = torch.zeros(1, 8192)
    logits[0, :4] = torch.tensor([5.0, 4.0, 3.0, 2.0])
    probs = torch.softmax(logits, -1)
    sp = probs.sort(descending=True).values[0].double()
    edge = float(sp[:2].sum() / sp.sum())  # the mass before the third token, as a top-p
    assert sampling._cut_head(probs, None, edge) is None
    assert sampling._cut_head(probs, None, edge + 0.01) is not None
    assert torch.equal(sampling.process_logits(logits, 1.0, None, edge), _process_logits_sorted(logits, 1.0, None, edge))
