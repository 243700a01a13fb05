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
3. **Walk.** The tree (a ``trees.DraftTree``: drafts and q rows per node, p rows processed
   from the target logits on demand) goes to ``trees.TokenWalk``: from the root,
   ``verifiers.get(name).verify(p, q, drafts, law=kind)`` picks the output token at the node;
   if it is one of the node's drafts the walk enters that child (accepted token), otherwise
   it stops (recovered token). At a node without drafts (a leaf: the whole path was accepted)
   one bonus token is sampled from ``p``.
4. **Caches.** Both caches are compacted in place to the prefix plus the accepted path;
   the accepted prefix is never recomputed. The final token becomes the next ``r``.

Every output token is distributed exactly as the target's processed distribution given
the prefix (see ``trees.walk`` for the argument); at temperature 0 the output equals the
target's greedy decoding (up to floating-point differences between the tree pass and a
plain forward, which the tests bound on float32 models).

Batching: the engine decodes one sequence (``input_ids`` is ``[1, T]``). Batching would
need per-sequence trees padded to a common node count (masked padding nodes), per-row
cache lengths (left padding plus per-row position ids, or a cache that supports ragged
compaction, since rows accept different numbers of tokens) and per-row stopping.
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
from .. import verifiers as _verifiers
from .._validate import as_generator, as_int
from ..sampling import check_sampling_args, process_logits
from ..trees import MAX_DYNAMIC_NODES, DraftTree, TokenWalk, TreeShape, allocate, node_ks
from .kv import PromptCache
from .runners import is_model, model_context, model_vocab_size, runner_for

__all__ = ["generate", "GenerationResult", "Settings", "check_settings", "score_tree", "node_ks"]


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
    ``stop_reason``       'max_new_tokens', 'eos' or 'context' (the context window is full).
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


# ---------------------------------------------------------------------------------------------
def _unsupported(v, kind: str, k: int) -> str:
    """The message for a (verifier, law, K) the verifier is not lossless for; names what would work."""
    ok = v.laws_for(k)
    krange = f"K >= {v.min_k}" if v.max_k is None else f"{v.min_k} <= K <= {v.max_k}"
    if ok:
        return (f"draft_law: verifier {v.name!r} is not lossless for the {kind!r} draft law with {k} drafts "
                f"per node; laws that work with {k} drafts: {', '.join(ok)}")
    return (f"k: verifier {v.name!r} is not lossless with {k} drafts per node "
            f"(it supports laws {', '.join(v.laws)} with {krange})")


@dataclass(frozen=True)
class Settings:
    """The model-free part of a ``generate`` call, checked and resolved (see :func:`check_settings`).

    ``verifier`` is None for the target alone; ``law`` is the resolved draft law kind;
    ``shape`` the tree shape (None for the target alone); ``draft_temps`` one temperature
    per draft column (one entry unless the law is 'independent').
    """

    verifier: object
    law: str
    shape: TreeShape | None
    k: int
    depth: int
    temperature: float
    draft_temps: tuple
    top_k: int | None
    top_p: float | None
    max_new_tokens: int


def check_settings(*, verifier="specinfer", k=2, depth=4, draft_law=None, tree=None, temperature=1.0,
                   draft_temperature=None, top_k=None, top_p=None, max_new_tokens=128, max_nodes=None,
                   min_gain=None) -> Settings:
    """Check every argument of ``generate`` that needs no model; ValueError naming the argument.

    The CLI calls this before loading any model; ``generate`` calls it first. ``draft_law=None``
    means the law the verifier implies (``Verifier.implied_law``; 'independent' when
    ``draft_temperature`` is a list). ``tree="dynamic"``: ``k`` is the most drafts per node,
    ``depth`` the largest depth and ``max_nodes`` (default 16) the node budget per step, root
    included, and ``min_gain`` (default 0) the least value (reach x coverage increment, in
    expected tokens) for which a draft is granted; the verifier must be lossless for the law
    at every k in 2..k.
    """
    check_sampling_args(temperature, top_k, top_p, "temperature")
    top_k = None if top_k is None else operator.index(top_k)
    top_p = None if top_p is None else float(top_p)
    max_new_tokens = as_int(max_new_tokens, "max_new_tokens", minimum=1)
    if verifier is None or (isinstance(verifier, str) and verifier.lower() == "none"):
        return Settings(None, "iid", None, 0, 0, float(temperature), (), top_k, top_p, max_new_tokens)
    v = _verifiers.get(verifier)
    K = as_int(k, "k", minimum=1, what="an integer number of drafts")
    L = as_int(depth, "depth", minimum=1)
    listed = isinstance(draft_temperature, (list, tuple))
    dynamic = isinstance(tree, str) and tree == "dynamic"
    if max_nodes is not None and not dynamic:
        raise ValueError(f"max_nodes applies only to tree='dynamic', got tree={tree!r}")
    if dynamic and max_nodes is not None:
        max_nodes = as_int(max_nodes, "max_nodes", minimum=2)
        if max_nodes > MAX_DYNAMIC_NODES:
            raise ValueError(f"max_nodes must be <= {MAX_DYNAMIC_NODES}, got {max_nodes}")
    if min_gain is not None:
        if not dynamic:
            raise ValueError(f"min_gain applies only to tree='dynamic', got tree={tree!r}")
        try:
            min_gain = float(min_gain)
        except (TypeError, ValueError):
            raise ValueError(f"min_gain must be a number in [0, 1), got {min_gain!r}") from None
        if not 0 <= min_gain < 1:
            raise ValueError(f"min_gain must be in [0, 1) (a draft is worth at most one token), got {min_gain}")
    shape = TreeShape.from_args(tree, K, L, max_nodes, min_gain or 0.0)
    if dynamic and (listed or draft_law is not None and _drafts.law_kind(draft_law, "draft_law") == "independent"):
        raise ValueError("draft_law: tree='dynamic' supports the iid, wor and greedy laws, not 'independent' "
                         "(a list of draft temperatures)")
    if draft_law is None:  # the law the verifier implies at the largest node (Verifier.implied_law)
        kind = "independent" if listed else v.implied_law(shape.k)
    else:
        kind = _drafts.law_kind(draft_law, "draft_law")

    if draft_temperature is None:
        temps = [float(temperature)]
    elif listed:
        if kind not in ("iid", "independent"):
            raise ValueError(f"draft_temperature: a list (one per draft) means the independent law, not {draft_law!r}")
        if len(draft_temperature) != K:
            raise ValueError(f"draft_temperature has {len(draft_temperature)} entries but k = {K}; give one per draft")
        for t in draft_temperature:
            check_sampling_args(t, top_k, top_p, "draft_temperature")
        temps = [float(t) for t in draft_temperature]
        kind = "independent"
    else:
        check_sampling_args(draft_temperature, top_k, top_p, "draft_temperature")
        temps = [float(draft_temperature)]
    if kind == "independent" and len(temps) == 1:
        temps = temps * K

    if shape.mode == "paths" and tree is not None and kind == "independent" and shape.k > len(temps):
        raise ValueError(f"tree has a node with {shape.k} children but only {len(temps)} draft temperatures")
    if shape.mode == "sequences":
        ks = {shape.k}
    elif shape.mode == "dynamic":
        ks = set(range(1, shape.k + 1))  # the allocator may choose any k <= K
    else:
        ks = {n for n in shape.children.values() if n > 0}
    allowed = node_ks(v, kind, max(ks, default=1))
    for n in sorted(ks):
        if n not in allowed:
            raise ValueError(_unsupported(v, kind, n))
    return Settings(v, kind, shape, K, L, float(temperature), tuple(temps), top_k, top_p, max_new_tokens)


@dataclass
class _Plan:
    verifier: object            # Verifier or None (target alone)
    kind: str
    shape: TreeShape | None
    temperature: float
    draft_temps: list           # one entry per draft column
    top_k: int | None
    top_p: float | None
    max_new_tokens: int
    eos: frozenset
    K: int


def _make_plan(target, draft, input_ids, settings: Settings, eos_token_id) -> _Plan:
    if not is_model(target):
        raise ValueError("target must be a loaded transformers causal LM or a multidraft.decoding.LlamaCppModel")
    if not isinstance(input_ids, torch.Tensor) or input_ids.is_floating_point() or input_ids.dtype == torch.bool:
        raise ValueError("input_ids must be an integer LongTensor of shape [1, T]")
    if input_ids.ndim != 2 or input_ids.shape[0] != 1 or input_ids.shape[1] < 1:
        raise ValueError(f"input_ids must have shape [1, T] with T >= 1 (batch size 1), got {tuple(input_ids.shape)}")
    V = model_vocab_size(target, "target")
    if bool(((input_ids < 0) | (input_ids >= V)).any()):
        raise ValueError(f"input_ids holds token ids outside the target vocabulary [0, {V})")
    if eos_token_id is None:
        eos = frozenset()
    else:
        ids = [eos_token_id] if not isinstance(eos_token_id, (list, tuple, set, frozenset)) else list(eos_token_id)
        try:
            if any(isinstance(e, bool) or not (0 <= operator.index(e) < V) for e in ids):
                raise TypeError
        except TypeError:
            raise ValueError(f"eos_token_id must be None, a token id or a list of token ids in [0, {V}), got {eos_token_id!r}") from None
        eos = frozenset(operator.index(e) for e in ids)
    ctx = model_context(target)
    T = input_ids.shape[1]
    s = settings
    if s.verifier is None:
        if T >= ctx:
            raise ValueError(f"input_ids has {T} tokens but the target's context window is {ctx}; the prompt is too long")
        return _Plan(None, "iid", None, s.temperature, [], s.top_k, s.top_p, s.max_new_tokens, eos, 0)
    if not is_model(draft):
        raise ValueError("draft must be a loaded transformers causal LM or a multidraft.decoding.LlamaCppModel "
                         "(or use verifier=None for the target alone)")
    if getattr(draft, "engine", "transformers") != getattr(target, "engine", "transformers"):
        raise ValueError(f"target and draft must run on one engine, got {getattr(target, 'engine', 'transformers')} "
                         f"and {getattr(draft, 'engine', 'transformers')}")
    if draft is target and getattr(target, "engine", None) == "llama.cpp":
        raise ValueError("target and draft must be two LlamaCppModel objects (each owns one KV cache); "
                         "load the GGUF twice to draft with the target's own weights")
    Vd = model_vocab_size(draft, "draft")
    if Vd != V:
        raise ValueError(f"draft has a vocabulary of {Vd} tokens but target has {V}; they must share one tokenizer")
    ctx = min(ctx, model_context(draft))
    if T >= ctx:
        raise ValueError(f"input_ids has {T} tokens but the context window is {ctx}; the prompt is too long")
    return _Plan(s.verifier, s.law, s.shape, s.temperature, list(s.draft_temps), s.top_k, s.top_p,
                 s.max_new_tokens, eos, s.k)


# ---------------------------------------------------------------------------------------------
def score_tree(runner, tree: DraftTree) -> torch.Tensor:
    """One forward of ``[root] + tree nodes`` after the committed prefix of ``runner``.

    Node i (handle i) attends to the committed prefix and to its ancestors and sits at
    position ``pos(root) + depth(i)``. Returns logits ``[N, V]``; the N entries stay
    uncommitted until ``runner.commit``.
    """
    parents = [-1] + [nd.parent for nd in tree.nodes[1:]]
    return runner.extend([nd.token for nd in tree.nodes], parents)


def generate(target, draft, input_ids, *, verifier="specinfer", k=2, depth=4, draft_law=None,
             tree=None, temperature=1.0, draft_temperature=None, top_k=None, top_p=None,
             max_new_tokens=128, eos_token_id=None, generator=None, progress=None,
             prompt_cache: PromptCache | None = None, node_log: list | None = None,
             max_nodes: int | None = None, min_gain: float | None = None) -> GenerationResult:
    """Multi-draft speculative decoding of one sequence; lossless for the target's processed law.

    target, draft   loaded transformers causal LMs sharing a vocabulary (draft may be None
                    when ``verifier`` is None / "none": the target alone, one token per call).
    input_ids       LongTensor ``[1, T]``, the prompt.
    verifier        a registered verifier name (``multidraft.verifiers.names()``) or None.
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
    generator       a ``torch.Generator`` or an integer seed (required; all randomness).
    progress        optional callable ``progress(tokens_done, max_new_tokens)`` after each step.
    prompt_cache    optional ``PromptCache``: the prompt prefill of each model is computed
                    once per prompt and copied for later calls (e.g. several methods on one
                    prompt); the result is the same either way.
    node_log        optional list; every verified tree node appends ``(k, slot, depth)``: its
                    number of drafts, the draft slot the walk entered (the first slot holding
                    the output token) or None, and its depth (acceptance statistics for
                    ``treeopt.AcceptStats.from_records``). Decoding is unchanged.

    Every model-free argument is checked by :func:`check_settings` (also usable alone, before
    loading models); an unsupported (verifier, law, K) names the laws that would work.
    """
    g = as_generator(generator)
    settings = check_settings(verifier=verifier, k=k, depth=depth, draft_law=draft_law, tree=tree,
                              temperature=temperature, draft_temperature=draft_temperature, top_k=top_k,
                              top_p=top_p, max_new_tokens=max_new_tokens, max_nodes=max_nodes,
                              min_gain=min_gain)
    plan = _make_plan(target, draft, input_ids, settings, eos_token_id)
    if progress is not None and not callable(progress):
        raise ValueError("progress must be None or a callable progress(done, total)")
    if prompt_cache is not None and not isinstance(prompt_cache, PromptCache):
        raise ValueError(f"prompt_cache must be None or a multidraft.decoding.PromptCache, got {type(prompt_cache).__name__}")
    if node_log is not None and not isinstance(node_log, list):
        raise ValueError(f"node_log must be None or a list, got {type(node_log).__name__}")
    with torch.inference_mode():
        return _Decoder(target, draft if plan.verifier is not None else None, plan, g, progress,
                        prompt_cache, node_log).run(input_ids)


class _Decoder:
    def __init__(self, target, draft, plan: _Plan, g: torch.Generator, progress, prompt_cache=None, node_log=None):
        self.t = runner_for(target, prompt_cache)
        self.d = runner_for(draft, prompt_cache) if draft is not None else None
        self.plan, self.g, self.progress = plan, g, progress
        self.node_log = node_log
        self.ctx = model_context(target) if draft is None else min(model_context(target), model_context(draft))
        self.target_calls = 0
        self.draft_calls = 0
        self.tree_tokens = 0

    # the walk: the token-level verifier at each node (fallbacks in trees.TokenWalk) ------------
    @functools.cached_property
    def walk(self) -> TokenWalk:
        return TokenWalk(self.plan.verifier or "naive", self.plan.kind)

    def run(self, input_ids: torch.Tensor) -> GenerationResult:
        plan = self.plan
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
        while len(out) < plan.max_new_tokens:
            room = self.ctx - 1 - rootpos
            if room < 0:
                stop = "context"
                break
            remaining = plan.max_new_tokens - len(out)
            cap = 0 if plan.verifier is None else min(plan.shape.depth, remaining - 1, room)
            new, m, dd = self._step(root, cap)
            accepted.append(m)
            depths.append(dd)
            hit = next((j for j, tk in enumerate(new) if tk in plan.eos), None)
            if hit is not None:
                new = new[: hit + 1]
            out.extend(new)
            rootpos += m + 1
            root = new[-1]
            if self.progress is not None:
                self.progress(min(len(out), plan.max_new_tokens), plan.max_new_tokens)
            if hit is not None:
                stop = "eos"
                break
        out = out[: plan.max_new_tokens]
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
        plan = self.plan
        shape = plan.shape if plan.shape is not None else TreeShape("paths", 0, 1, {(): 0})
        tree = DraftTree(shape, root, cap, max(1, len(plan.draft_temps)), plan.kind)
        drafted = cap > 0
        if drafted:
            self._draft_tree(tree)
        # one target pass over [root] + tree
        logits = score_tree(self.t, tree)
        self.target_calls += 1
        self.tree_tokens += len(tree.nodes)
        # walk: p rows processed on demand, only at the nodes the walk visits
        tree.set_target(lambda i: process_logits(logits[i], plan.temperature, plan.top_k, plan.top_p))
        verdict = self.walk.verify(tree, self.g)
        if self.node_log is not None:
            self.node_log.extend(self.walk.node_records(tree, verdict))
        path, final = list(verdict.path), verdict.token
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
        # level 0: the pending tokens and the root, a plain causal chain
        chain = self.pending + [tree.nodes[0].token]
        c = self._chain = len(chain)
        logits = self.d.extend(chain, list(range(-1, c - 1)), last_only=True)
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
            logits = self.d.extend([tree.nodes[i].token for i in nxt],
                                   [c - 1 if j == 0 else c + tree.nodes[j].fed for j in par])
            self.draft_calls += 1
            for i in nxt:
                tree.nodes[i].fed = len(fed)
                fed.append(i)
            level = nxt

    def _allocate_level(self, tree: DraftTree, level: list[int], logits: torch.Tensor) -> None:
        """Dynamic trees: the drafts of every node of ``level`` (logits ``[len(level), V]``) from
        its q and reach, all decided here before ``_sample_level`` draws any of them."""
        plan = self.plan
        room = tree.shape.budget - len(tree)
        q = process_logits(logits, plan.draft_temps[0], plan.top_k, plan.top_p)  # [n, V]
        reach = torch.tensor([tree.nodes[i].reach for i in level], dtype=torch.float64)
        cap = [i for i in level if tree.nodes[i].depth < tree.depth_cap]
        ks = allocate(q, reach, tree.shape.k, room, plan.kind, tree.shape.min_gain).tolist()
        for r, i in enumerate(level):
            tree.nodes[i].k = int(ks[r]) if i in cap else 0

    def _sample_level(self, tree: DraftTree, level: list[int], logits: torch.Tensor) -> list[int]:
        """Draw the drafts of every node in ``level`` (logits ``[len(level), V]``); return new node ids."""
        plan = self.plan
        kind = plan.kind
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
