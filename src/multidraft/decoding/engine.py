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
   from the target logits on demand) goes to the tree rule of ``Settings.rule``:
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

Batching: ``generate`` decodes one sequence (``input_ids`` is ``[1, T]``). The decode itself is
a generator (``_Decoder.decode``) that yields each forward pass it needs as a :class:`Call` and is
sent the logits back; ``generate`` serves the calls with its own runners (``drive``), and
``batch.BatchDecoder`` serves the calls of many such decodes (lanes, each with its own settings
and generator) with one forward per model for all of them (``batch.generate_batch``). So the
drafting, every generator draw, the verification and the commits are this one code path.
"""
from __future__ import annotations

import functools
import math
import operator
import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch

from .. import drafts as _drafts
from .. import trees as _trees
from .. import verifiers as _verifiers
from .._alloc import keep_freed_memory
from .._validate import ArgumentError, as_generator
from ..sampling import process_logits, sample_token
from ..trees import DraftTree, TokenWalk, TreeShape, TreeVerdict, allocate
from .kv import PromptCache
from .runners import is_model, model_context, model_vocab_size, runner_for
from .settings import WALK, Settings, node_ks, settings_or_kwargs

__all__ = ["generate", "GenerationResult", "Settings", "ArgumentError", "score_tree", "score_call", "Call", "drive", "node_ks"]


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
    if settings.target_alone:
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


# ---------------------------------------------------------------------------------------------
def score_call(tree: DraftTree) -> "Call":
    """The target pass of a step: ``[root] + tree nodes``, the root's parent -1 (the end of the
    committed prefix), every other node's its tree parent."""
    return Call("t", [nd.token for nd in tree.nodes], [-1] + [nd.parent for nd in tree.nodes[1:]])


def score_tree(runner, tree: DraftTree) -> torch.Tensor:
    """One forward of ``[root] + tree nodes`` after the committed prefix of ``runner``.

    Node i (handle i) attends to the committed prefix and to its ancestors and sits at
    position ``pos(root) + depth(i)``. Returns logits ``[N, V]``; the N entries stay
    uncommitted until ``runner.commit``.
    """
    call = score_call(tree)
    return runner.extend(call.tokens, call.parents)


@dataclass
class Call:
    """One forward pass a decode asks for (``_Decoder.decode`` yields it): ``model`` 't' (target)
    or 'd' (draft), and the runner protocol's ``extend(tokens, parents, last_only)`` arguments
    (``runners``). The decode is sent back the logits ``extend`` returns."""

    model: str
    tokens: list
    parents: list
    last_only: bool = False


def drive(gen, target_runner, draft_runner):
    """Run the decode generator ``gen`` (``_Decoder.decode`` or a part of it), serving each
    ``Call`` with ``target_runner`` / ``draft_runner``; returns the generator's return value."""
    try:
        call = next(gen)
        while True:
            r = target_runner if call.model == "t" else draft_runner
            call = gen.send(r.extend(call.tokens, call.parents, call.last_only))
    except StopIteration as stop:
        return stop.value


def generate(target, draft, input_ids, settings: Settings | None = None, *, generator=None, eos_token_id=None,
             progress=None, prompt_cache: PromptCache | None = None, node_log: list | None = None,
             on_step=None, **kwargs) -> GenerationResult:
    """Multi-draft speculative decoding of one sequence; lossless for the target's processed law.

    target, draft   loaded transformers causal LMs sharing a vocabulary (draft may be None
                    when the verifier is None / "none": the target alone, one token per call).
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
                    ``treeopt.AcceptStats.from_records``). Decoding is unchanged. Only for
                    the token walk (``rule='token_walk'``): a sequence-level rule decides whole
                    paths, not one node after another; its per-step record is
                    ``GenerationResult.accepted_lengths``.
    on_step         optional callable ``on_step(tokens)`` after each step with the tokens that
                    step emitted (a list of ints, already cut after an eos; streaming). A true
                    return value stops decoding after that step (``stop_reason`` 'stopped', the
                    statistics of the steps run); the tokens emitted are unchanged by it.

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
    if node_log is not None and settings.rule_name not in (None, WALK):
        raise ArgumentError("node_log", f": per-node records belong to the token walk; rule {settings.rule_name!r} decides "
                                        "whole paths (its accepted length per step is GenerationResult.accepted_lengths)")
    with torch.inference_mode():
        dec = _Decoder(target, None if settings.target_alone else draft, settings, g, progress,
                       prompt_cache, node_log, eos=eos)
        dec.on_step = on_step
        return dec.run(input_ids)


class _Decoder:
    """One decode: ``settings`` (model-free, validated once) and the model facts: ``eos`` the set of
    end-of-sequence ids (checked by ``_check_models``), the context window from the models."""

    def __init__(self, target, draft, settings: Settings, g: torch.Generator, progress, prompt_cache=None,
                 node_log=None, *, eos: frozenset = frozenset(), runners=None):
        keep_freed_memory()  # the verifiers' full-V temporaries stay in the process (_alloc)
        if runners is None:
            self.t = runner_for(target, prompt_cache)
            self.d = runner_for(draft, prompt_cache) if draft is not None else None
        else:  # a lane of a batch (``batch.BatchDecoder``): its views of the shared batch runners
            self.t, self.d = runners
        self.settings, self.eos, self.g, self.progress = settings, eos, g, progress
        self.node_log = node_log
        self.on_step = None  # generate's on_step (streaming; set after construction)
        self.ctx = model_context(target) if draft is None else min(model_context(target), model_context(draft))
        self.target_calls = 0
        self.draft_calls = 0
        self.tree_tokens = 0

    # the tree rule: the walk of the token-level verifier (fallbacks in trees.TokenWalk), or a
    # sequence-level rule from the registry --------------------------------------------------------
    @property
    def rule(self) -> _trees.TreeRule:
        """The settings' tree rule (the target alone has none: a step without drafts is one token
        from p at the root, whatever the rule)."""
        return self.settings.rule

    def run(self, input_ids: torch.Tensor) -> GenerationResult:
        """The whole decode of ``input_ids`` ``[1, T]``, each forward run by this decoder's runners."""
        return drive(self.decode(input_ids), self.t, self.d)

    # The decode as a generator of forward passes: it yields each ``Call`` it needs and is sent
    # the call's logits back; it returns the GenerationResult. ``run`` serves the calls with this
    # decoder's own runners; ``batch.BatchDecoder`` serves the calls of many lanes' decoders with
    # one forward per model for all of them. Everything else (drafting, every generator draw,
    # verification, commits) is this one code path.
    def decode(self, input_ids: torch.Tensor):
        s = self.settings
        ids = input_ids.long()
        T = ids.shape[1]
        prefill_s = self.t.prefill(ids[:, :-1])
        if self.d is not None:
            prefill_s += self.d.prefill(ids[:, :-1])
            self.pending: list[int] = []  # committed tokens not yet in the draft cache
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
            cap = 0 if s.target_alone else min(s.shape.depth, remaining - 1, room)
            new, m, dd = yield from self._step(root, cap)
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
        secs = time.perf_counter() - t0
        rates = [a / d for a, d in zip(accepted, depths) if d > 0]
        n = len(out)
        return GenerationResult(
            tokens=torch.tensor(out, dtype=torch.long),
            new_tokens=n,
            target_calls=self.target_calls,
            draft_calls=self.draft_calls,
            block_efficiency=n / self.target_calls if self.target_calls else 0.0,
            acceptance_rate=sum(rates) / len(rates) if rates else 0.0,
            seconds=secs,
            tokens_per_s=n / secs if secs > 0 else math.inf,
            accepted_lengths=accepted,
            draft_depths=depths,
            stop_reason=stop,
            prefill_seconds=prefill_s,
            tree_tokens=self.tree_tokens,
        )

    # one step ---------------------------------------------------------------------------
    def _step(self, root: int, cap: int):
        plan = self.settings
        shape = plan.shape if plan.shape is not None else TreeShape("paths", 0, 1, {(): 0})
        tree = DraftTree(shape, root, cap, max(1, len(plan.draft_temps)), plan.law or "iid")
        drafted = cap > 0
        if drafted:
            yield from self._draft_calls(tree)
        # one target pass over [root] + tree
        logits = yield score_call(tree)
        self.target_calls += 1
        self.tree_tokens += len(tree.nodes)
        rule = self.rule
        if rule is None:  # the target alone: one token from p at the root
            tree.set_target(lambda i: process_logits(logits[i], plan.temperature, plan.top_k, plan.top_p))
            verdict = TreeVerdict((), int(sample_token(tree.p(0), self.g)))
        elif isinstance(rule, TokenWalk):
            # walk: p rows processed on demand, only at the nodes the walk visits
            tree.set_target(lambda i: process_logits(logits[i], plan.temperature, plan.top_k, plan.top_p))
            verdict = rule.verify(tree, self.g)
            if self.node_log is not None:
                self.node_log.extend(rule.node_records(tree, verdict))
        else:
            # a sequence-level rule reads every node's p row (float64 math on [V] rows), on the CPU
            # with the CPU generator; a tree without drafts is no tree: one token from p at the root
            if logits.device.type != "cpu":
                for nd in tree.nodes:
                    if nd.q is not None:
                        nd.q = nd.q.cpu()
            tree.set_target(lambda i: process_logits(logits[i], plan.temperature, plan.top_k, plan.top_p).cpu())
            tree.rows_checked = True  # process_logits rows are distributions (trees.DraftTree notes)
            if tree.nodes[0].drafts:
                verdict = rule.verify(tree, self.g)
            else:
                verdict = TreeVerdict((), int(sample_token(tree.p(0), self.g)))
        path, final = list(verdict.path), int(verdict.token)
        m = len(path)
        # caches: keep prefix + root + accepted path
        self.t.commit([0] + path)
        if self.d is not None:
            if drafted:
                c = self._chain  # pending + root were fed as handles 0..c-1, fed nodes follow
                fed = [j for j in path if tree.nodes[j].fed >= 0]
                self.d.commit(list(range(c)) + [c + tree.nodes[j].fed for j in fed])
                self.pending = [tree.nodes[j].token for j in path[len(fed):]]
            else:
                self.pending = self.pending + [root]
        depth = max(n.depth for n in tree.nodes)
        return [tree.nodes[j].token for j in path] + [final], m, depth

    # drafting ---------------------------------------------------------------------------
    def _draft_tree(self, tree: DraftTree) -> None:
        """Draft ``tree`` with this decoder's own draft runner (``_draft_calls`` served at once)."""
        drive(self._draft_calls(tree), None, self.d)  # drafting asks the draft model only

    def _draft_calls(self, tree: DraftTree):
        # level 0: the pending tokens and the root, a plain causal chain
        chain = self.pending + [tree.nodes[0].token]
        c = self._chain = len(chain)
        logits = yield Call("d", chain, list(range(-1, c - 1)), True)
        self.draft_calls += 1
        fed: list[int] = []
        level = [0]
        dynamic = tree.shape.mode == "dynamic"
        while True:
            if dynamic:
                self._allocate_level(tree, level, logits)  # every k of the level, before any draw
            new = self._sample_level(tree, level, logits)
            if dynamic:
                for i in new:
                    nd = tree.nodes[i]
                    par = tree.nodes[nd.parent]
                    nd.reach = par.reach * float(par.q[nd.token])
                room = tree.shape.budget - len(tree)
                cand = sorted((i for i in new if tree.nodes[i].depth < tree.depth_cap),
                              key=lambda i: -tree.nodes[i].reach)
                nxt = sorted(cand[:max(0, room)])  # at most `room` nodes can receive a draft
            else:
                nxt = [i for i in new if tree.n_children(i) > 0]
            if not nxt:
                return
            par = [tree.nodes[i].parent for i in nxt]
            logits = yield Call("d", [tree.nodes[i].token for i in nxt],
                                [c - 1 if j == 0 else c + tree.nodes[j].fed for j in par])
            self.draft_calls += 1
            for i in nxt:
                tree.nodes[i].fed = len(fed)
                fed.append(i)
            level = nxt

    def _allocate_level(self, tree: DraftTree, level: list[int], logits: torch.Tensor) -> None:
        """Dynamic trees: the drafts of every node of ``level`` (logits ``[len(level), V]``) from
        its q and reach, all decided here before ``_sample_level`` draws any of them."""
        plan = self.settings
        room = tree.shape.budget - len(tree)
        q = process_logits(logits, plan.draft_temps[0], plan.top_k, plan.top_p)  # [n, V]
        reach = torch.tensor([tree.nodes[i].reach for i in level], dtype=torch.float64)
        cap = [i for i in level if tree.nodes[i].depth < tree.depth_cap]
        ks = allocate(q, reach, tree.shape.k, room, plan.law, tree.shape.min_gain).tolist()
        for r, i in enumerate(level):
            tree.nodes[i].k = int(ks[r]) if i in cap else 0

    def _sample_level(self, tree: DraftTree, level: list[int], logits: torch.Tensor) -> list[int]:
        """Draw the drafts of every node in ``level`` (logits ``[len(level), V]``); return new node ids."""
        plan = self.settings
        kind = plan.law
        ks = [tree.n_children(i) for i in level]
        cols = [tree.draft_cols(i, k) for i, k in zip(level, ks)]
        need = sorted({c for cs in cols for c in cs}) if kind == "independent" else [0]
        q = {c: process_logits(logits, plan.draft_temps[c], plan.top_k, plan.top_p) for c in need}
        groups: dict[tuple, list[int]] = defaultdict(list)
        nnz = (q[0] > 0).sum(-1).tolist() if kind in ("wor", "greedy") else None
        for r, k in enumerate(ks):
            if k == 0:
                continue
            if kind == "independent":
                groups[(k, cols[r])].append(r)
            else:
                groups[(min(k, nnz[r]) if nnz is not None else k,)].append(r)
        new: list[int] = []
        for key, rows in groups.items():
            ridx = torch.tensor(rows, dtype=torch.long, device=logits.device)
            k = key[0]
            if kind == "independent":
                qs = torch.stack([q[c].index_select(0, ridx) for c in key[1]], dim=-2)  # [n, k, V]
                law = _drafts.independent(qs)
            else:
                qs = q[0].index_select(0, ridx)  # [n, V]
                law = _drafts.make(kind, qs, k)
            toks = law.sample(self.g).tolist()
            for j, r in enumerate(rows):
                i = level[r]
                tree.nodes[i].q = qs[j]
                new.extend(tree.add_drafts(i, toks[j]))
        new.sort()
        return new
