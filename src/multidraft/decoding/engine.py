"""End-to-end multi-draft speculative decoding on transformers causal LMs or llama.cpp models.

The decoder sees each model through a runner (``runners``: ``prefill`` / ``extend`` /
``commit``), so drafting, verification and the walk are one code path for every engine:
``runners.HFRunner`` for transformers, ``llamacpp.LlamaRunner`` for llama.cpp.

One decoding step, with ``r`` the last committed token (not yet in either KV cache):

1. **Draft tree.** The draft model runs once per tree level (all nodes of a level batched
   in one forward with a tree attention mask over its own KV cache). At each node the
   draft distribution ``q`` (temperature / top-k / top-p processed) gives the node's drafts
   by the chosen draft law (``multidraft.drafts``), with the explicit generator.
2. **One target pass.** ``[r] + tree nodes`` are scored in ONE target forward: a 4D
   additive mask lets each node attend to the cached prefix and to its ancestors only,
   and node positions are ``pos(r) + depth``. Logits of node i give ``p`` after the path
   to i.
3. **Verify.** The tree (a ``trees.DraftTree``: drafts and q rows per node, p rows processed
   from the target logits as the rule reads them: ``TreeRule.lazy_rows``) goes to the tree rule
   of ``Settings.rule``:
   ``rule.verify(tree, generator) -> TreeVerdict(path, token)``. The default, 'token_walk'
   (``trees.TokenWalk``), walks from the root: ``verifiers.get(name).verify(p, q, drafts,
   law=kind)`` picks the output token at the node; if it is one of the node's drafts the walk
   enters that child (accepted token), otherwise it stops (recovered token); at a node without
   drafts (a leaf: the whole path was accepted) one bonus token is sampled from ``p``. A
   sequence-level rule ('block', 'traversal', ...) reads the whole tree (every node's p row)
   and emits an accepted path and one token the same way. A step whose tree has no drafts
   (the depth cap is 0 at the last token, or a dynamic tree that grants none) emits one
   token sampled from ``p`` at the root, whatever the rule.
4. **Caches.** Both caches are compacted in place to the prefix plus the accepted path;
   the accepted prefix is never recomputed. The final token becomes the next ``r``.

Every output token is distributed exactly as the target's processed distribution given
the prefix (see ``trees.walk`` for the argument, and each rule's module for its own; the
settings admit a sequence-level rule only for a tree law it ``supports``); at temperature 0 the output equals the
target's greedy decoding (up to floating-point differences between the tree pass and a
plain forward, which the tests bound on float32 models).

The step itself (steps 1-4: drafting, the target pass, verification through the rule's
interface, the commits) is the public ``step.DecoderStep``; this module is its decode loop
(when to stop, the context window, eos, streaming) and ``generate``.

Batching: ``generate`` decodes one sequence (``input_ids`` is ``[1, T]``). The decode itself is
a generator (``_Decoder.decode``) that yields each forward pass it needs as a ``step.Call`` and is
sent the logits back; ``generate`` serves the calls with its own runners (``step.drive``), and
``batch.BatchDecoder`` serves the calls of many such decodes (lanes, each with its own settings
and generator) with one forward per model for all of them (``batch.generate_batch``). So the
drafting, every generator draw, the verification and the commits are this one code path.
"""
from __future__ import annotations

import math
import operator
import time
from dataclasses import dataclass, field

import torch

from .._alloc import keep_freed_memory
from .._validate import ArgumentError, as_generator
from .kv import PromptCache
from .runners import is_model, model_context, model_vocab_size, runner_for
from .settings import Settings, node_ks, settings_or_kwargs
from .step import Call, DecoderStep, drive, score_call, score_tree
from .pace import check_cost_profile

__all__ = ["generate", "GenerationResult", "Settings", "ArgumentError", "DecoderStep", "score_tree", "score_call", "Call",
           "drive", "node_ks", "decode_context"]


@dataclass
class GenerationResult:
    """What ``generate`` returns.

    ``tokens``            LongTensor ``[new_tokens]``: the generated ids (prompt excluded).
    ``target_calls``      target forward passes while decoding (the prompt prefill excluded);
                          one per step.
    ``draft_calls``       draft forward passes while decoding (one per tree level per step).
    ``block_efficiency``  ``new_tokens / target_calls`` (1.0 for the target alone).
    ``tree_tokens``       tokens scored by all target passes (root included; duplicates merged
                          away): ``tree_tokens / target_calls`` is the mean tree size a step
                          pays for (1.0 for the target alone).
    ``acceptance_rate``   mean over steps that drafted a tree of ``accepted / depth``, where
                          ``accepted`` is the number of draft tokens kept in the step (the
                          accepted path length, bonus/recovered token excluded) and ``depth``
                          is the depth of that step's draft tree; 0.0 when nothing was drafted.
    ``accepted_lengths``  per step, the number of accepted draft tokens.
    ``draft_depths``      per step, the depth of the draft tree (0 for target-only steps).
    ``stop_reason``       'max_new_tokens', 'eos', 'context' (the context window is full) or
                          'stopped' (``on_step`` asked to stop).
    ``seconds``           wall time of the decoding steps, the prompt prefill excluded;
                          ``tokens_per_s = new_tokens / seconds`` (decoding speed).
    ``prefill_seconds``   model time of the prompt prefill (target and draft); 0.0 when a
                          ``PromptCache`` supplied it.
    ``source_stats``      per free draft source, ``{"proposed": nodes it added to the trees,
                          "accepted": accepted tokens it proposed}`` (``step.DecoderStep``);
                          empty without free sources.
    """

    tokens: torch.Tensor
    new_tokens: int
    target_calls: int
    draft_calls: int
    block_efficiency: float
    acceptance_rate: float
    seconds: float
    tokens_per_s: float
    accepted_lengths: list = field(default_factory=list)
    draft_depths: list = field(default_factory=list)
    stop_reason: str = "max_new_tokens"
    prefill_seconds: float = 0.0
    tree_tokens: int = 0
    source_stats: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__ if k != "tokens"}
        d["tokens"] = self.tokens.tolist()
        return d


def _check_models(target, draft, input_ids, settings: Settings, eos_token_id) -> frozenset:
    """The model-dependent arguments of ``generate`` against ``settings``: the models, the
    prompt (its ids in the vocabulary, shorter than the context window) and the eos ids,
    returned as a set."""
    if not is_model(target):
        raise ArgumentError("target", "must be a loaded transformers causal LM or a multidraft.decoding.LlamaCppModel")
    if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise ArgumentError("input_ids", "must be an integer LongTensor of shape [1, T]")
    if input_ids.ndim != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ArgumentError("input_ids", f"must have shape [1, T] with T >= 1 (batch size 1), got {tuple(input_ids.shape)}")
    V = model_vocab_size(target, "target")
    if bool(((input_ids < 0) | (input_ids >= V)).any()):
        raise ArgumentError("input_ids", f"holds token ids outside the target vocabulary [0, {V})")
    if eos_token_id is None:
        eos = frozenset()
    else:
        ids = [eos_token_id] if not isinstance(eos_token_id, (list, tuple, set, frozenset)) else list(eos_token_id)
        try:
            if any(isinstance(e, bool) or not (0 <= operator.index(e) < V) for e in ids):
                raise TypeError
        except TypeError:
            raise ArgumentError("eos_token_id", f"must be None, a token id or a list of token ids in [0, {V}), got {eos_token_id!r}") from None
        eos = frozenset(operator.index(e) for e in ids)
    ctx = model_context(target)
    T = input_ids.shape[1]
    if not settings.uses_draft:  # the target alone or free-only decoding: ``draft`` is not read
        if T >= ctx:
            raise ArgumentError("input_ids", f"has {T} tokens but the target's context window is {ctx}; the prompt is too long")
        return eos
    if not is_model(draft):
        raise ArgumentError("draft", "must be a loaded transformers causal LM or a multidraft.decoding.LlamaCppModel "
                                     "(or use verifier=None for the target alone)")
    if getattr(draft, "engine", "transformers") != getattr(target, "engine", "transformers"):
        raise ArgumentError("draft", f"and target must run on one engine, got {getattr(target, 'engine', 'transformers')} "
                                     f"and {getattr(draft, 'engine', 'transformers')}")
    if draft is target and getattr(target, "engine", None) == "llama.cpp":
        raise ArgumentError("draft", "and target must be two LlamaCppModel objects (each owns one KV cache); "
                                     "load the GGUF twice to draft with the target's own weights")
    Vd = model_vocab_size(draft, "draft")
    if Vd != V:
        raise ArgumentError("draft", f"has a vocabulary of {Vd} tokens but target has {V}; they must share one tokenizer")
    ctx = min(ctx, model_context(draft))
    if T >= ctx:
        raise ArgumentError("input_ids", f"has {T} tokens but the context window is {ctx}; the prompt is too long")
    return eos


def generate(target, draft, input_ids, settings: Settings | None = None, *, generator=None, eos_token_id=None,
             progress=None, prompt_cache: PromptCache | None = None, node_log: list | None = None,
             on_step=None, cost_profile=None, **kwargs) -> GenerationResult:
    """Multi-draft speculative decoding of one sequence; lossless for the target's processed law.

    target, draft   loaded transformers causal LMs sharing a vocabulary (draft may be None
                    when the verifier is None / "none": the target alone, one token per call;
                    and with free sources alone, ``sources="lookup"`` etc.: never run).
    input_ids       LongTensor ``[1, T]``, the prompt.
    settings        a :class:`Settings` (``Settings.from_args(...)``, validated once), or None
                    and the same settings as keyword arguments (``**kwargs``, below), which
                    are validated here by ``Settings.from_args``; not both.
    generator       a ``torch.Generator`` or an integer seed (required; all randomness).
    eos_token_id    None, a token id or a list of them: decoding stops after emitting one.
    progress        optional callable ``progress(tokens_done, max_new_tokens)`` after each step.
    prompt_cache    optional ``PromptCache``: the prompt prefill of each model is computed
                    once per prompt and copied for later calls (e.g. several methods on one
                    prompt); the result is the same either way.
    node_log        optional list; every verified tree node appends ``(k, slot, depth)``: its
                    number of drafts, the draft slot the walk entered (the first slot holding
                    the output token) or None, and its depth (acceptance statistics for
                    ``treeopt.AcceptStats.from_records``; ``TreeRule.node_records``). Decoding
                    is unchanged. Only for a rule that decides node after node
                    (``TreeRule.node_wise``: the token walk, ``rule='token_walk'``): a
                    sequence-level rule decides whole paths; its per-step record is
                    ``GenerationResult.accepted_lengths``.
    on_step         optional callable ``on_step(tokens)`` after each step with the tokens that
                    step emitted (a list of ints, already cut after an eos; streaming). A true
                    return value stops decoding after that step (``stop_reason`` 'stopped', the
                    statistics of the steps run); the tokens emitted are unchanged by it.
    cost_profile    optional ``treeopt.CostProfile`` (``multidraft profile``): each step drafts
                    only as deep as pays by the profile's costs and the acceptances this decode
                    measured so far (``decoding.pace``; depth 0: the target alone), and with free
                    sources cuts each source's chains where one more token no longer pays
                    (``decoding.sources.budget``); None: the settings' depth and every source's
                    own depth. Exact either way.

    Keyword settings (``Settings.from_args``):

    verifier        a registered verifier name (``multidraft.verifiers.names()``) or None
                    (default 'specinfer'): the token-level verifier of the walk.
    rule            the tree rule that verifies each step's tree (``trees.names()`` but
                    'tree_lp'): None or 'token_walk' (default) the walk of ``verifier``;
                    'block' (one chain: k = 1), 'traversal' (i.i.d. trees of every mode), or
                    any other registered rule, given without ``verifier``, for the tree
                    modes it ``supports`` (``Settings.from_args`` refuses the others).
    k, depth        K drafts per node and tree depth L: the full K-ary tree of depth L, or
                    with ``tree="sequences"`` K draft sequences of length L merged into a
                    trie; ``tree=[[0], [1], [0, 0], ...]`` an explicit shape (overrides both);
                    ``tree="dynamic"`` a per-step tree whose node v gets 0..k drafts chosen from
                    the draft distribution at v before its drafts are drawn (``trees.allocate``),
                    depth <= ``depth``, at most ``max_nodes`` nodes (default 16, root included);
                    ``min_gain`` (default 0): a draft is granted only if reach x coverage
                    increment, its value in expected tokens, is at least this.
    draft_law       a name from ``multidraft.drafts.LAW_KINDS``; None (default) means the law
                    the verifier implies (``Verifier.implied_law``: 'wor' for ``rrs_wor``,
                    'greedy' for ``spechub`` and ``greedy_optimal``, else 'iid'); a list
                    ``draft_temperature=[t1, ..., tK]`` means the independent law (draft j at
                    temperature t_j).
    temperature     target temperature (0 = greedy); ``draft_temperature`` defaults to it.
    top_k, top_p    applied to both target and draft distributions (see ``sampling``).
    max_new_tokens  tokens to generate at most (default 128).
    sources         the draft sources (``decoding.sources``): "model" (default), or a comma list
                    of "model", "lookup", "suffix"; without "model" the free sources draft alone
                    (no draft model runs; ``Settings.from_args`` notes).

    A bad argument raises ``ArgumentError`` (a ValueError) naming it; an unsupported
    (verifier, law, K) names the laws that would work.
    """
    g = as_generator(generator)
    settings = settings_or_kwargs(settings, kwargs)
    eos = _check_models(target, draft, input_ids, settings, eos_token_id)
    if progress is not None and not callable(progress):
        raise ArgumentError("progress", "must be None or a callable progress(done, total)")
    if prompt_cache is not None and not isinstance(prompt_cache, PromptCache):
        raise ArgumentError("prompt_cache", f"must be None or a multidraft.decoding.PromptCache, got {type(prompt_cache).__name__}")
    if node_log is not None and not isinstance(node_log, list):
        raise ArgumentError("node_log", f"must be None or a list, got {type(node_log).__name__}")
    if on_step is not None and not callable(on_step):
        raise ArgumentError("on_step", "must be None or a callable on_step(tokens)")
    check_cost_profile(cost_profile)
    rule = settings.rule
    if node_log is not None and rule is not None and not rule.node_wise:
        raise ArgumentError("node_log", f": per-node records belong to a rule that decides node after node (the token "
                                        f"walk); rule {rule.name!r} decides whole paths (its accepted length per step "
                                        "is GenerationResult.accepted_lengths)")
    draft = draft if settings.uses_draft else None  # the target alone, free-only decoding: the draft never runs
    with torch.inference_mode():
        step = DecoderStep(runner_for(target, prompt_cache), runner_for(draft, prompt_cache) if draft is not None else None,
                           settings, g, rule=rule, node_log=node_log, cost=cost_profile)
        return _Decoder(step, decode_context(target, draft), eos=eos, progress=progress, on_step=on_step).run(input_ids)


def decode_context(target, draft) -> int:
    """The context window a decode of ``target`` (and ``draft``, None for the target alone) has."""
    return model_context(target) if draft is None else min(model_context(target), model_context(draft))


class _Decoder:
    """One decode: a sequence of steps of ``step`` (a :class:`step.DecoderStep`: its runners, settings,
    generator and rule) until ``max_new_tokens``, an ``eos`` id (a set, checked by ``_check_models``),
    the context window ``ctx`` or a true ``on_step``; ``progress`` as ``generate``'s."""

    def __init__(self, step: DecoderStep, ctx: int, *, eos: frozenset = frozenset(), progress=None, on_step=None):
        keep_freed_memory()  # the verifiers' full-V temporaries stay in the process (_alloc)
        self.step, self.ctx, self.eos = step, ctx, eos
        self.progress, self.on_step = progress, on_step

    def run(self, input_ids: torch.Tensor) -> GenerationResult:
        """The whole decode of ``input_ids`` ``[1, T]``, each forward run by the step's own runners."""
        return self.step.serve(self.decode(input_ids))

    # The decode as a generator of forward passes: it yields each ``Call`` it needs and is sent
    # the call's logits back; it returns the GenerationResult. ``run`` serves the calls with the
    # step's own runners; ``batch.BatchDecoder`` serves the calls of many lanes' decoders with
    # one forward per model for all of them. Everything else (drafting, every generator draw,
    # verification, commits: ``DecoderStep.step``) is this one code path.
    def decode(self, input_ids: torch.Tensor):
        st = self.step
        s = st.settings
        ids = input_ids.long()
        T = ids.shape[1]
        prefill_s = st.prefill(ids)
        t0 = time.perf_counter()
        root = int(ids[0, -1])
        rootpos = T - 1
        out: list[int] = []
        accepted, depths = [], []
        stop = "max_new_tokens"
        while len(out) < s.max_new_tokens:
            room = self.ctx - 1 - rootpos
            if room < 0:
                stop = "context"
                break
            remaining = s.max_new_tokens - len(out)
            limit = min(remaining - 1, room)  # the deepest draft worth scoring (free chains go past the shape's depth)
            cap = 0 if not s.uses_draft else st.choose_cap(min(s.shape.depth, limit), limit)  # the draft model's depth (none: free-only)
            new, m, dd = yield from st.step(root, cap, limit=limit)
            accepted.append(m)
            depths.append(dd)
            hit = next((j for j, tk in enumerate(new) if tk in self.eos), None)
            if hit is not None:
                new = new[: hit + 1]
            out.extend(new)
            rootpos += m + 1
            root = new[-1]
            if self.progress is not None:
                self.progress(min(len(out), s.max_new_tokens), s.max_new_tokens)
            halt = self.on_step is not None and bool(self.on_step(list(new)))
            if hit is not None:
                stop = "eos"
                break
            if halt:
                stop = "stopped"
                break
        out = out[: s.max_new_tokens]
        st.finish()  # the free sources' proposers (a shared suffix index keeps this output)
        secs = time.perf_counter() - t0
        rates = [a / d for a, d in zip(accepted, depths) if d > 0]
        n = len(out)
        return GenerationResult(
            tokens=torch.tensor(out, dtype=torch.long),
            new_tokens=n,
            target_calls=st.target_calls,
            draft_calls=st.draft_calls,
            block_efficiency=n / st.target_calls if st.target_calls else 0.0,
            acceptance_rate=sum(rates) / len(rates) if rates else 0.0,
            seconds=secs,
            tokens_per_s=n / secs if secs > 0 else math.inf,
            accepted_lengths=accepted,
            draft_depths=depths,
            stop_reason=stop,
            prefill_seconds=prefill_s,
            tree_tokens=st.tree_tokens,
            source_stats={name: {"proposed": p, "accepted": a}
                          for name, (p, a) in getattr(st, "source_stats", {}).items()},
        )
