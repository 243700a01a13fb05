"""Positions a decoder sees: a continuation sampled from the target, with both models' logits.

``continuation_logits(target, draft, input_ids, ...)`` samples ``max_new_tokens`` tokens from
the target alone (KV caches, one forward per token and model, ``sampling.process_logits``
then ``sampling.sample_token``, the decoder's own sampler) and returns, at every position of
the continuation, the raw next-token logits of both models. Position i holds the logits of
the distribution ``tokens[i]`` was drawn from (given ``input_ids`` and ``tokens[:i]``), so
the experiments evaluate verifiers on exactly the (p, q) pairs a speculative decoder of
this target meets on its own output, not on reference text it would not have written.
"""
from __future__ import annotations

import time

import torch

from .._validate import as_generator, as_int
from ..sampling import check_sampling_args, process_logits, sample_token
from .kv import fresh_prefill

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


def _last_logits(model, cache, ids: torch.Tensor) -> torch.Tensor:  # ids [1, t] -> [V] float32
    out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
    logits = out.logits if hasattr(out, "logits") else out
    return logits[0, -1].float()


@torch.inference_mode()
def continuation_logits(target, draft, input_ids: torch.Tensor, *, max_new_tokens: int, temperature: float = 1.0,
                        top_k: int | None = None, top_p: float | None = None, generator=None,
                        eos_token_id=None) -> Continuation:
    """Sample a continuation of ``input_ids`` ``[1, T]`` from the target; both models' logits along it.

    ``temperature``/``top_k``/``top_p`` define the target's sampling law (``temperature = 0``:
    greedy). ``generator``: a ``torch.Generator`` or an integer seed (stream ``"decode"``).
    ``eos_token_id``: an id or ids after which the continuation stops.
    """
    check_sampling_args(temperature, top_k, top_p)
    n = as_int(max_new_tokens, "max_new_tokens")
    if n < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    if input_ids.ndim != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must be [1, T] with T >= 1, got {tuple(input_ids.shape)}")
    g = as_generator(generator, purpose="decode")
    eos = set() if eos_token_id is None else ({int(eos_token_id)} if not isinstance(eos_token_id, (list, tuple, set))
                                             else {int(e) for e in eos_token_id})
    device = next(target.parameters()).device
    ids = input_ids.to(device).long()
    t0 = time.perf_counter()
    tcache, _ = fresh_prefill(target, ids[:, :-1])
    dcache = fresh_prefill(draft, ids[:, :-1])[0] if draft is not None else None
    cur = ids[:, -1:]
    toks, lts, lds = [], [], []
    for _ in range(n):
        lt = _last_logits(target, tcache, cur)
        lts.append(lt)
        if draft is not None:
            lds.append(_last_logits(draft, dcache, cur))
        tok = int(sample_token(process_logits(lt, temperature, top_k, top_p), g))
        toks.append(tok)
        if tok in eos:
            break
        cur = torch.tensor([[tok]], dtype=torch.long, device=device)
    return Continuation(
        tokens=torch.tensor(toks, dtype=torch.long),
        target_logits=torch.stack(lts).cpu(),
        draft_logits=torch.stack(lds).cpu() if draft is not None else None,
        seconds=time.perf_counter() - t0,
    )
