"""transformers' ``model.generate(..., custom_generate=md.custom_generate)`` runs multidraft's decoder."""
import pytest
import torch

import multidraft as md

pytest.importorskip("transformers")


def _batch(rows, pad):
    """Left-padded [B, T] ids and the attention mask of a list of 1-D prompts."""
    T = max(len(r) for r in rows)
    ids = torch.full((len(rows), T), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), T), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, T - len(r):] = torch.tensor(r)
        mask[i, T - len(r):] = 1
    return ids, mask


PROMPTS = [[1, 2, 3, 4], [5, 6], [7, 8, 9]]


@pytest.mark.parametrize("spec", [dict(verifier="specinfer", k=2, depth=3), dict(rule="traversal", k=2, depth=3),
                                  dict(rule="block", k=1, depth=3),
                                  dict(verifier="specinfer", k=2, depth=2, sources="model,lookup,suffix")])
def test_greedy_equals_the_targets_own_greedy_generate_row_by_row(pair, spec):
    t, d = pair
    ids, mask = _batch(PROMPTS, pad=0)
    out = t.generate(ids, attention_mask=mask, assistant_model=d, custom_generate=md.custom_generate,
                     **spec, do_sample=False, max_new_tokens=10, pad_token_id=0)
    assert out.shape == (3, ids.shape[1] + 10)
    assert torch.equal(out[:, :ids.shape[1]], ids)
    for i, r in enumerate(PROMPTS):
        ref = t.generate(torch.tensor([r]), do_sample=False, max_new_tokens=10, pad_token_id=0)
        assert torch.equal(out[i, ids.shape[1]:], ref[0, len(r):]), i


@pytest.mark.parametrize("verifier,k", [("optimal", 2), ("specinfer", 3), ("naive", 1)])
def test_sampling_is_multidraft_generate_with_seed_plus_row(pair, verifier, k):
    """Row i of a batch is the prompt decoded alone by md.generate with seed + i: the other rows
    never change a row's tokens."""
    t, d = pair
    ids, mask = _batch(PROMPTS, pad=0)
    out = t.generate(ids, attention_mask=mask, assistant_model=d, custom_generate=md.custom_generate,
                     verifier=verifier, k=k, depth=2, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                     max_new_tokens=8, seed=11, pad_token_id=0, return_dict_in_generate=True)
    assert out.seeds.tolist() == [11, 12, 13]
    for i, r in enumerate(PROMPTS):
        ref = md.generate(t, d, torch.tensor([r]), verifier=verifier, k=k, depth=2, temperature=1.0,
                          max_new_tokens=8, generator=11 + i, eos_token_id=t.generation_config.eos_token_id)
        n = int(out.new_tokens[i])
        assert n == ref.new_tokens
        assert torch.equal(out.sequences[i, ids.shape[1]:ids.shape[1] + n], ref.tokens)
        assert int(out.target_calls[i]) == ref.target_calls
        assert float(out.block_efficiency[i]) == pytest.approx(ref.block_efficiency)
    alone = t.generate(torch.tensor([PROMPTS[1]]), assistant_model=d, custom_generate=md.custom_generate,
                       verifier=verifier, k=k, depth=2, do_sample=True, temperature=1.0, top_k=0, top_p=1.0,
                       max_new_tokens=8, seed=12, pad_token_id=0)
    n = int(out.new_tokens[1])
    assert torch.equal(alone[0, 2:2 + n], out.sequences[1, ids.shape[1]:ids.shape[1] + n])


@pytest.mark.parametrize("spec", [dict(verifier="spectr"), dict(rule="traversal")])
def test_top_k_top_p_and_temperature_reach_the_decoder(pair, spec):
    t, d = pair
    ids = torch.tensor([PROMPTS[0]])
    out = t.generate(ids, draft_model=d, custom_generate=md.custom_generate, **spec, k=2, depth=2,
                     do_sample=True, temperature=0.7, top_k=5, top_p=0.9, max_new_tokens=8, seed=3, pad_token_id=0)
    ref = md.generate(t, d, ids, **spec, k=2, depth=2, temperature=0.7, top_k=5, top_p=0.9,
                      max_new_tokens=8, generator=3, eos_token_id=t.generation_config.eos_token_id)
    assert torch.equal(out[0, 4:4 + ref.new_tokens], ref.tokens)


def test_the_seed_comes_from_torch_manual_seed_when_not_given(pair):
    t, d = pair
    ids = torch.tensor([PROMPTS[0]])
    kw = dict(assistant_model=d, custom_generate=md.custom_generate, k=2, depth=2, do_sample=True, top_k=0,
              max_new_tokens=6, pad_token_id=0, return_dict_in_generate=True)
    torch.manual_seed(5)
    a = t.generate(ids, **kw)
    torch.manual_seed(5)
    b = t.generate(ids, **kw)
    assert torch.equal(a.sequences, b.sequences) and torch.equal(a.seeds, b.seeds)


def test_rows_that_stop_early_are_padded_with_the_pad_id(pair):
    t, d = pair
    ids, mask = _batch(PROMPTS, pad=0)
    ref = [t.generate(torch.tensor([r]), do_sample=False, max_new_tokens=6, pad_token_id=0)[0, len(r):] for r in PROMPTS]
    eos = int(ref[0][1])  # row 0 stops after its second token
    out = t.generate(ids, attention_mask=mask, assistant_model=d, custom_generate=md.custom_generate, k=2, depth=2,
                     do_sample=False, max_new_tokens=6, eos_token_id=eos, pad_token_id=23,
                     return_dict_in_generate=True)
    T = ids.shape[1]
    assert int(out.new_tokens[0]) == 2
    assert out.sequences[0, T + 2:].tolist() == [23] * (out.sequences.shape[1] - T - 2)


@pytest.mark.parametrize("kwargs,arg", [
    (dict(repetition_penalty=1.3), "logits_processor"),
    (dict(num_beams=2), "num_beams"),
    (dict(num_return_sequences=2, do_sample=True), "num_return_sequences"),
    (dict(output_scores=True, return_dict_in_generate=True), "output_scores"),
    (dict(min_new_tokens=3), "logits_processor"),
    (dict(verifier="no-such-verifier"), "verifier"),
    (dict(k=0), "k"),
    (dict(seed=-1), "seed"),
])
def test_settings_multidraft_would_ignore_are_refused(pair, kwargs, arg):
    t, d = pair
    kw = dict(assistant_model=d, custom_generate=md.custom_generate, do_sample=False, max_new_tokens=4, pad_token_id=0)
    kw.update(kwargs)
    with pytest.raises(ValueError) as e:
        t.generate(torch.tensor([PROMPTS[0]]), **kw)
    assert getattr(e.value, "arg", arg) == arg, str(e.value)


def test_a_streamer_receives_every_step_and_batches_are_refused(pair):
    from transformers.generation.streamers import BaseStreamer

    class Recorder(BaseStreamer):
        def __init__(self):
            self.puts, self.ended = [], False

        def put(self, value):
            self.puts.append(value.tolist())

        def end(self):
            self.ended = True

    t, d = pair
    rec = Recorder()
    out = t.generate(torch.tensor([PROMPTS[0]]), assistant_model=d, custom_generate=md.custom_generate, streamer=rec,
                     k=2, depth=3, do_sample=True, top_k=0, seed=4, max_new_tokens=9, pad_token_id=0)
    assert rec.puts[0] == [PROMPTS[0]] and rec.ended  # transformers puts the prompt first
    streamed = [tok for step in rec.puts[1:] for tok in step]
    assert streamed == out[0, 4:4 + len(streamed)].tolist() and len(streamed) == out.shape[1] - 4
    assert len(rec.puts) - 1 < len(streamed)  # several tokens per step: the steps are streamed, not single tokens
    ids, mask = _batch(PROMPTS, pad=0)
    with pytest.raises(ValueError, match="streamer"):
        t.generate(ids, attention_mask=mask, assistant_model=d, custom_generate=md.custom_generate, streamer=Recorder(),
                   do_sample=False, max_new_tokens=4, pad_token_id=0)


def test_right_padding_and_a_missing_draft_are_refused(pair):
    t, d = pair
    ids, mask = _batch(PROMPTS, pad=0)
    with pytest.raises(ValueError, match="left-padded"):
        t.generate(ids, attention_mask=mask.flip(-1), assistant_model=d, custom_generate=md.custom_generate,
                   do_sample=False, max_new_tokens=4, pad_token_id=0)
    with pytest.raises(ValueError, match="assistant_model"):
        t.generate(ids, attention_mask=mask, custom_generate=md.custom_generate, do_sample=False, max_new_tokens=4,
                   pad_token_id=0)
    out = t.generate(ids, attention_mask=mask, custom_generate=md.custom_generate, verifier=None, do_sample=False,
                     max_new_tokens=4, pad_token_id=0)  # the target alone needs no draft
    ref = t.generate(torch.tensor([PROMPTS[2]]), do_sample=False, max_new_tokens=4, pad_token_id=0)
    assert torch.equal(out[2, ids.shape[1]:], ref[0, 3:])
