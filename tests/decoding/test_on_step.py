"""generate's ``on_step`` callback (streaming): each step's tokens, in order, and a stop request."""
import pytest
import torch

from multidraft.decoding import ArgumentError, generate

IDS = torch.tensor([[3, 5, 7, 2]])


@pytest.mark.parametrize("verifier", ["specinfer", None])
def test_on_step_sees_every_token_once_and_changes_nothing(pair, verifier):
    t, d = pair
    kw = dict(verifier=verifier, k=2, depth=3, temperature=1.0, max_new_tokens=30) if verifier else \
        dict(verifier=None, temperature=1.0, max_new_tokens=30)
    steps = []
    res = generate(t, d, IDS, generator=11, on_step=lambda toks: steps.append(list(toks)), **kw)
    ref = generate(t, d, IDS, generator=11, **kw)
    assert res.tokens.tolist() == ref.tokens.tolist()
    assert [x for s in steps for x in s] == res.tokens.tolist()
    assert len(steps) == res.target_calls and all(steps)
    if verifier:  # a step emits its accepted drafts and one more token
        assert [len(s) for s in steps] == [a + 1 for a in res.accepted_lengths]


def test_on_step_true_stops_after_that_step(pair):
    t, d = pair
    calls = []

    def stop_second(toks):
        calls.append(list(toks))
        return len(calls) == 2

    full = generate(t, d, IDS, generator=5, verifier="specinfer", k=2, depth=3, max_new_tokens=40)
    res = generate(t, d, IDS, generator=5, verifier="specinfer", k=2, depth=3, max_new_tokens=40, on_step=stop_second)
    assert res.stop_reason == "stopped" and res.target_calls == 2 and len(calls) == 2
    assert res.tokens.tolist() == calls[0] + calls[1] == full.tokens.tolist()[: res.new_tokens]


def test_on_step_must_be_callable(pair):
    t, d = pair
    with pytest.raises(ArgumentError, match="on_step"):
        generate(t, d, IDS, generator=0, verifier="specinfer", on_step=3)
