"""``step.TokenLogprobs``: each emitted token's log-probability under the target, read from the
verification pass's tree rows (no extra forward), equals a plain target forward over prompt +
output; recording it changes no token. Float32 tiny pair: the tree-attention rows and the plain
forward's agree to rounding (1e-5)."""
from __future__ import annotations

import pytest
import tiny_models as tm
import torch

from multidraft.decoding import Settings
from multidraft.decoding.batch import BatchDecoder
from multidraft.decoding.step import TokenLogprobs


@pytest.fixture(scope="module")
def pair():
    return tm.tiny_pair(vocab_size=32, seed=4)


@pytest.mark.parametrize("temperature, verifier", [(0.0, "specinfer"), (1.0, "specinfer"), (1.0, None)])
def test_logprobs_are_the_plain_forwards(pair, temperature, verifier):
    t, d = pair
    settings = Settings.from_args(verifier=verifier, k=2, depth=3, temperature=temperature, max_new_tokens=12)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    runs = []
    for lp in (None, TokenLogprobs(4)):
        bd = BatchDecoder(t, d, max_lanes=2)
        bd.add(torch.tensor([prompt]), settings, generator=7, logprobs=lp)
        (res,) = bd.run().values()
        runs.append(res)
    assert torch.equal(runs[0].tokens, runs[1].tokens)  # recording changes nothing
    if verifier is not None and temperature == 1.0:
        assert sum(runs[1].accepted_lengths) > 0  # tree rows past the root were read
    out = runs[1].tokens.tolist()
    rows = lp.rows[: len(out)]
    assert len(rows) == len(out) == 12
    with torch.no_grad():
        z = t(torch.tensor([prompt + out])).logits[0]  # [T + n, V]
    ref = torch.log_softmax(z[len(prompt) - 1: len(prompt) - 1 + len(out)].float(), dim=-1)  # [n, V]
    got = torch.tensor([r[0] for r in rows], dtype=torch.float64)
    want = ref.gather(1, torch.tensor(out)[:, None])[:, 0].double()
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    vals, ids = ref.topk(4, dim=-1)
    assert [[v for v, _ in r[1]] for r in rows] == ids.tolist()
    assert torch.allclose(torch.tensor([[l for _, l in r[1]] for r in rows], dtype=torch.float64), vals.double(),
                          atol=1e-5, rtol=0)
