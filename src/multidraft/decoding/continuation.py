"""Positions a decoder sees: a continuation sampled from the target, with both models' logits.

``continuation_logits(target, draft, input_ids, ...)`` samples ``max_new_tokens`` tokens from
the target alone and returns, at every position of the continuation, the raw next-token
logits of both models. Position i holds the logits of the distribution ``tokens[i]`` was
drawn from (given ``input_ids`` and ``tokens[:i]``), so the experiments evaluate verifiers on
exactly the (p, q) pairs a speculative decoder of this target meets on its own output, not on
reference text it would not have written.

The models are driven through the decoder's runners (``runners.runner_for``: ``HFRunner`` for
transformers, ``llamacpp.LlamaRunner`` for llama.cpp; ``prefill`` / ``extend`` / ``commit``),
one token per forward and model, and sampled by the decoder's own sampler
(``sampling.process_logits`` then ``sampling.sample_token``): one loop for either engine.
"""
from __future__ import annotations

import time

import torch

from .._validate import as_generator, as_int
from ..sampling import check_sampling_args, process_logits, sample_token
from .runners import is_model, model_vocab_size, runner_for

__all__ = ["continuation_logits", "Continuation"]


class Continuation:
    """What :func:`continuation_logits` returns.

    ``tokens``         LongTensor ``[n]``: the sampled continuation (n <= max_new_tokens; it
                       stops after an end-of-sequence token).
    ``target_logits``  float32 ``[n, V]``; ``draft_logits`` float32 ``[n, V]`` (None without a draft).
    ``seconds``        wall time (prefill included).
    """

    def __init__(self, tokens, target_logits, draft_logits, seconds):
        self.tokens, self.target_logits, self.draft_logits, self.seconds = tokens, target_logits, draft_logits, seconds

    def __len__(self) -> int:
        return int(self.tokens.numel())


def _step(runner, token: int) -> torch.Tensor:  # -> [V] float32
    """Feed one token after the committed prefix, keep it, and return the next-token logits (a copy:
    a llama.cpp runner returns a view of a buffer the next decode overwrites)."""
    logits = runner.extend([token], [-1])
    runner.commit([0])
    return logits[-1].float().cpu().clone()


@torch.inference_mode()
def continuation_logits(target, draft, input_ids: torch.Tensor, *, max_new_tokens: int, temperature: float = 1.0,
                        top_k: int | None = None, top_p: float | None = None, generator=None,
                        eos_token_id=None) -> Continuation:
    """Sample a continuation of ``input_ids`` ``[1, T]`` from the target; both models' logits along it.

    ``target``/``draft``: transformers causal LMs or ``llamacpp.LlamaCppModel`` objects (one
    engine; ``draft`` may be None). ``temperature``/``top_k``/``top_p`` define the target's
    sampling law (``temperature = 0``: greedy). ``generator``: a ``torch.Generator`` or an
    integer seed (stream ``"decode"``). ``eos_token_id``: an id or ids after which the
    continuation stops.
    """
    check_sampling_args(temperature, top_k, top_p)
    n = as_int(max_new_tokens, "max_new_tokens")
    if n < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if not isinstance(input_ids, torch.Tensor) or input_ids.ndim != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be [1, T] with T >= 1, got {tuple(getattr(input_ids, 'shape', ()))}")
    for name, model in (("target", target), ("draft", draft)):
        if (model is not None or name == "target") and not is_model(model):
            raise ValueError(f"{name} must be a loaded transformers causal LM or a multidraft.decoding.LlamaCppModel")
    if draft is not None and getattr(draft, "engine", "transformers") != getattr(target, "engine", "transformers"):
        raise ValueError("target and draft must run on one engine")
    if draft is target and getattr(target, "engine", None) == "llama.cpp":
        raise ValueError("target and draft must be two LlamaCppModel objects (each owns one KV cache)")
    V = model_vocab_size(target, "target")
    if bool(((input_ids < 0) | (input_ids >= V)).any()):
        raise ValueError(f"input_ids holds token ids outside the target vocabulary [0, {V})")
    g = as_generator(generator, purpose="decode")
    eos = set() if eos_token_id is None else ({int(eos_token_id)} if not isinstance(eos_token_id, (list, tuple, set))
                                             else {int(e) for e in eos_token_id})
    ids = input_ids.long()
    t0 = time.perf_counter()
    runners = [runner_for(target)] + ([runner_for(draft)] if draft is not None else [])
    for r in runners:
        r.prefill(ids[:, :-1])
    cur = int(ids[0, -1])
    toks, lts, lds = [], [], []
    for _ in range(n):
        lt = _step(runners[0], cur)
        lts.append(lt)
        if draft is not None:
            lds.append(_step(runners[1], cur))
        tok = int(sample_token(process_logits(lt, temperature, top_k, top_p), g))
        toks.append(tok)
        if tok in eos:
            break
        cur = tok
    return Continuation(
        tokens=torch.tensor(toks, dtype=torch.long),
        target_logits=torch.stack(lts),
        draft_logits=torch.stack(lds) if draft is not None else None,
        seconds=time.perf_counter() - t0,
    )
