"""One model and its KV cache during one ``generate`` call: the engine's only view of a model.

The decoder (``step.DecoderStep``) never touches a model directly; it talks to a *runner*
with three operations, so the same drafting, verification and walk serve every engine:

``prefill(ids)``
    Reset the cache to the committed prefix ``ids`` (LongTensor ``[1, T]``); returns the
    seconds of model time it took (0.0 when the prefix was reused).
``extend(tokens, parents, last_only=False)``
    Append uncommitted entries and return their logits: ``tokens`` (ints) are new entries,
    each with a handle equal to the number of entries appended since the last commit (the
    first new one gets ``len(pending)``); ``parents[i]`` is the handle of token i's parent
    (an earlier uncommitted entry or an earlier token of this call), or -1 for the end of
    the committed prefix. Token i sits at position ``pos(parent) + 1`` and attends to the
    committed prefix, its uncommitted ancestors and itself (tree attention). Returns float
    logits ``[n, V]``, or ``[1, V]`` for the last token with ``last_only``.
``commit(handles)``
    Keep the committed prefix followed by the entries ``handles`` (a path: ``handles[0]``'s
    parent is -1 and each next one is the child of the previous) as the new committed
    prefix; every other uncommitted entry is dropped. Nothing is recomputed.

Runners: :class:`HFRunner` (transformers causal LMs; 4D additive tree masks over a
``DynamicCache``, compacted in place by ``kv.keep``) and ``llamacpp.LlamaRunner`` (llama.cpp
through llama-cpp-python; tree attention through sequence ids over a unified KV cache). Both
tell ``uncommitted``, the entries appended since the last commit; an ``HFRunner`` also takes a
``snapshot()`` of its cache and uncommitted entries and ``restore``s it (a caller that repeats
the same calls on the same committed prefix gets their very results back: ``experiments.realtrees``).

Outside a decode, :func:`teacher_forced_logits` is one plain forward of a transformers model over
a whole text (every position's next-token logits), for the experiments that read positions.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .kv import PromptCache, fresh_prefill, keep, tree_attention_mask

__all__ = ["HFRunner", "HFState", "runner_for", "is_model", "teacher_forced_logits"]


@dataclass(frozen=True)
class HFState:
    """What :meth:`HFRunner.snapshot` keeps: the prefill it belongs to and the committed length
    (``epoch``, ``base``), the cache's ``(keys, values)`` per layer (``[1, H, base + M, D]``, the
    tensors themselves, not copies), the positions of the M uncommitted entries and their
    ancestor-or-self matrix ``[M, M]``."""

    epoch: int
    base: int
    layers: tuple
    positions: tuple
    ancestors: torch.Tensor

    def nbytes(self) -> int:
        """Bytes of the cache tensors it holds."""
        return sum(t.numel() * t.element_size() for pair in self.layers for t in pair)


class HFRunner:
    """A transformers causal LM (``model(input_ids, position_ids, attention_mask, cache)``)."""

    engine = "transformers"

    def __init__(self, model, prompt_cache: PromptCache | None = None):
        self.model = model
        self.prompt_cache = prompt_cache
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.cache = None
        self.epoch = 0                                  # prefills so far (a snapshot's prefix)
        self.base = 0                                   # committed entries in the cache
        self._pos: list[int] = []                       # position of each uncommitted handle
        self._anc = torch.zeros(0, 0, dtype=torch.bool)  # [M, M] ancestor-or-self of the handles

    @property
    def vocab_size(self) -> int:
        return model_vocab_size(self.model, "model")

    @property
    def context(self) -> int:
        return model_context(self.model)

    def prefill(self, ids: torch.Tensor) -> float:  # ids [1, T]
        pf = self.prompt_cache.prefill if self.prompt_cache is not None else fresh_prefill
        self.cache, secs = pf(self.model, ids.to(self.device))
        self.epoch += 1
        self.base = int(ids.shape[1])
        self._pos, self._anc = [], torch.zeros(0, 0, dtype=torch.bool)
        return secs

    def extend(self, tokens: list[int], parents: list[int], last_only: bool = False) -> torch.Tensor:
        M, n = len(self._pos), len(tokens)
        anc = torch.zeros(M + n, M + n, dtype=torch.bool)
        anc[:M, :M] = self._anc
        chain = M == 0
        for i, par in enumerate(parents):
            h = M + i
            if par >= 0:
                anc[h] = anc[par]
            anc[h, h] = True
            self._pos.append(self._pos[par] + 1 if par >= 0 else self.base)
            chain = chain and par == h - 1
        self._anc = anc
        return hf_forward(self.model, self.cache, tokens, self._pos[M:], anc[M:], self.base, chain, last_only)

    def commit(self, handles: list[int]) -> None:
        j = 0  # handles already in place (a committed chain) are not moved
        while j < len(handles) and handles[j] == j:
            j += 1
        extra = torch.tensor([self.base + h for h in handles[j:]], dtype=torch.long)
        keep(self.cache, self.base + j, extra)
        self.base += len(handles)
        self._pos, self._anc = [], torch.zeros(0, 0, dtype=torch.bool)

    @property
    def uncommitted(self) -> int:
        """Entries appended by ``extend`` since the last commit (their handles are 0..n-1)."""
        return len(self._pos)

    def snapshot(self) -> HFState:
        """The cache and the uncommitted entries now, for :meth:`restore`.

        The cache tensors are kept as they are, not copied: ``extend`` grows a layer by
        concatenation into new tensors and a commit that moves no entry (nothing, or a chain
        already in place) only slices, so the kept tensors stay exact while the committed
        prefix stays this one. A commit that moves entries (a tree path) writes into them and
        changes ``base``; :meth:`restore` refuses a snapshot of another committed prefix."""
        layers = tuple((layer.keys, layer.values) for layer in self.cache.layers)
        return HFState(self.epoch, self.base, layers, tuple(self._pos), self._anc.clone())

    def restore(self, state: HFState) -> None:
        """Set the cache and the uncommitted entries to ``state`` (a :meth:`snapshot` of this
        runner on the same committed prefix: same prefill, same ``base``)."""
        if (state.epoch, state.base) != (self.epoch, self.base):
            raise ValueError(f"state: a snapshot of another committed prefix (prefill {state.epoch}, {state.base} "
                             f"entries) than this runner's (prefill {self.epoch}, {self.base} entries)")
        for layer, (k, v) in zip(self.cache.layers, state.layers):
            layer.keys, layer.values = k, v
        self._pos, self._anc = list(state.positions), state.ancestors.clone()


@torch.inference_mode()
def teacher_forced_logits(model, ids: torch.Tensor) -> torch.Tensor:
    """One forward of a transformers causal LM over the whole text ``ids`` ``[T]`` (no cache, no
    mask: teacher forcing); the next-token logits at every position, float32 ``[T, V]``."""
    if _is_llama(model):
        raise ValueError("model: teacher forcing runs transformers models only")
    out = model(input_ids=ids.unsqueeze(0))
    logits = out.logits if hasattr(out, "logits") else out
    return logits[0].float()


def hf_forward(model, cache, tokens: list[int], pos: list[int], visible: torch.Tensor, past: int, chain: bool,
               last_only: bool) -> torch.Tensor:
    """One forward of ``tokens`` (one sequence) after ``cache``: ``pos`` their positions, ``visible``
    ``[n, M + n]`` which of the cache's last M entries and of these tokens each one sees (it also
    sees the first ``past`` entries). A plain causal continuation (``chain``) runs without a mask.
    Returns logits ``[n, V]``, or ``[1, V]`` for the last token with ``last_only``. ``HFRunner`` and
    a lone lane of ``batch.HFBatchRunner`` run exactly this (so a batch of one is bitwise ``generate``)."""
    p = next(model.parameters())
    n = len(tokens)
    tok = torch.tensor(tokens, dtype=torch.long, device=p.device).view(1, n)
    keep_n = 1 if last_only else 0
    if chain:  # a plain causal continuation of the committed prefix: no mask needed
        out = model(input_ids=tok, cache=cache, use_cache=True, logits_to_keep=keep_n)
    else:
        pos_t = torch.tensor(pos, dtype=torch.long, device=p.device).view(1, n)
        mask = tree_attention_mask(visible, past, p.dtype).to(p.device)
        out = model(input_ids=tok, position_ids=pos_t, attention_mask=mask, cache=cache,
                    use_cache=True, logits_to_keep=keep_n)
    return out.logits[0]


def model_vocab_size(model, name: str) -> int:
    if _is_llama(model):
        return model.vocab_size
    emb = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if emb is not None and getattr(emb, "weight", None) is not None:
        return int(emb.weight.shape[0])
    v = getattr(getattr(model, "config", None), "vocab_size", None)
    if v is None:
        raise ValueError(f"{name} is not a causal LM with an output vocabulary")
    return int(v)


def model_context(model) -> int:
    if _is_llama(model):
        return model.context
    cfg = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    n = getattr(cfg, "max_position_embeddings", None)
    return int(n) if n else 1 << 62


def _is_llama(model) -> bool:
    return getattr(model, "engine", None) == "llama.cpp"


def is_model(model) -> bool:
    """A model ``generate`` can decode with: a transformers causal LM or a ``LlamaCppModel``."""
    return model is not None and (_is_llama(model) or callable(model))


def runner_for(model, prompt_cache: PromptCache | None = None):
    """The runner of ``model``: ``LlamaRunner`` for a ``llamacpp.LlamaCppModel``, else ``HFRunner``."""
    if _is_llama(model):
        return model.runner()
    return HFRunner(model, prompt_cache)
