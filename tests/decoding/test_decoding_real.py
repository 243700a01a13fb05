"""Slow smoke test of the decoder on the real default pair (skipped when it is not installed)."""
from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def real_pair():
    from multidraft import models

    ok, why = models.default_models_installed()
    if not ok:
        pytest.skip(f"default model pair not installed: {why}")
    return models.resolve_pair(None, None)


@pytest.mark.slow
@pytest.mark.xdist_group("real_pair")  # one xdist worker: one real pair in memory, one writer of the model cache
def test_real_pair_greedy_and_sampling(real_pair):
    import multidraft as md

    target, draft, tok = real_pair
    ids = tok("def fibonacci(n):", return_tensors="pt")["input_ids"]
    base = md.generate(target, None, ids, verifier=None, temperature=0, max_new_tokens=16, generator=0)
    with torch.inference_mode():
        hf = target.generate(ids, do_sample=False, max_new_tokens=16, min_new_tokens=16)[0, ids.shape[1]:]
    assert base.tokens.tolist() == hf.tolist()
    spec = md.generate(target, draft, ids, verifier="nss", k=2, depth=3, temperature=0, max_new_tokens=16, generator=0)
    # bf16 tree pass vs sequential pass: equal unless the target has a near-tie; require a long common prefix
    same = 0
    for a, b in zip(spec.tokens.tolist(), base.tokens.tolist()):
        if a != b:
            break
        same += 1
    assert same >= 8, (spec.tokens.tolist(), base.tokens.tolist())
    assert spec.block_efficiency > 1.2
    r = md.generate(target, draft, ids, verifier="nss", k=2, depth=3, temperature=1.0, max_new_tokens=16, generator=1)
    assert r.new_tokens == 16 and r.target_calls <= 16
