"""The decoder's public step: draft one tree, score it with the target, verify it with a tree rule, commit it.

A :class:`DecoderStep` holds what one sequence's steps share: its two runners (``runners``:
the target's and the draft's, each holding that model's committed prefix), the ``Settings``,
the ``torch.Generator`` every draw reads in order, and the tree rule (a ``trees.TreeRule``;
None for the target alone). One step, with ``root`` the last committed token (not yet in
either cache) and ``cap`` the largest depth to draft:

    tree = yield from step.draft(root, cap)     # DraftTree: drafts and q rows of every node
    logits = yield from step.score(tree)        # [N, V]: one target pass over [root] + tree
    verdict = step.verify(tree, logits)         # TreeVerdict(path, token) of the rule
    tokens = step.commit(tree, verdict)         # the emitted tokens; both caches compacted

or ``yield from step.step(root, cap)`` for all four (a :class:`StepResult`). ``draft`` and
``score`` are generators of forward passes: they yield each :class:`Call` they need and are
sent its logits back, so one decode's calls can be served by its own runners
(``step.serve(gen)``, :func:`drive`) or share one forward with other decodes
(``batch.BatchDecoder``). The engine's decode loop (``engine._Decoder.decode``), the batch
decoder's lanes and the real-tree study (``experiments.realtrees``) all step through this class.

Drafting. The draft model runs once per tree level: level 0 is the committed tokens the draft
cache lacks (``pending``) and the root, a plain chain; each later level feeds every node of
the previous level that gets drafts, in one forward with tree attention. At each node the
processed draft distribution ``q`` (temperature, top-k, top-p) gives its drafts by the draft
law (``drafts.make``), nodes grouped by their number of drafts; a dynamic tree's node gets its
number of drafts from its q and reach (``trees.allocate``) before any draft of its level is drawn.

Verification goes through the rule's interface alone: a rule with ``lazy_rows`` (the token
walk) gets p rows processed on the logits' device when it reads them; any other rule gets every
node's row on the CPU (q rows moved there too) and ``tree.rows_checked`` (the rows are
distributions by construction); the tree this step drafted is marked ``checked`` (valid by
construction: no rule re-checks it). A tree without drafts (the depth cap is 0, or a dynamic tree
that grants none) emits one token sampled from p at the root, whatever the rule. With a
``node_log`` list, ``rule.node_records(tree, verdict)`` is appended to it.

Free sources (``settings.free_sources``: prompt lookup, the suffix index; DESIGN.md "Draft
sources"). Each has a per-decode proposer that sees the committed text: ``prefill`` extends it
with the prompt, ``commit`` with the emitted tokens, ``finish`` ends it (the engine's decode
calls it). After the draft model drafted a step's tree, ``draft`` appends each source's chains
(``propose(depth)``, depth the source's own, capped by the step's ``limit``: the tokens left to
emit and the context's room) as deterministic drafts (``DraftTree.add_chains``): the chains
depend only on the committed text, never on the model's draws, so the walk of the settings'
verifier under the model's law verifies each node free drafts first and then the model's drafts
on the residual target, losslessly (``trees.TokenWalk``). Free-only nodes are not fed to the draft
model (``fed`` -1): along any path the fed nodes are a prefix (a free-only node's children are
free-only), which ``commit`` relies on. A step drafted to depth 0 has no free drafts either,
unless the sources are free alone or a cost profile paces the depth (``pace``: depth 0 chosen by
cost still takes the chains; ``limit`` 0 none).
``source_stats[name] = [proposed, accepted]`` counts, per free source over the decode, the trie
nodes it added to the steps' trees (before the merge with the model's tree) and, per step, the
longest prefix of the accepted path that one of its chains holds (the accepted tokens it proposed;
the model may have proposed them too).

Free-only decoding (``settings.free_only``: sources without the draft model): ``draft_runner`` is
None (no draft prefill, no draft cache), ``cap`` is 0 (no model drafts) and each step's tree is the
free chains alone, up to ``limit`` deep (None: each source's own depth); no chain: a tree without
drafts, one token from p at the root (a plain target step).
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from typing import NamedTuple

import torch

from .. import drafts as _drafts
from ..sampling import process_logits, sample_token
from ..trees import DraftTree, TreeShape, TreeVerdict, allocate
from .pace import DepthPace, shape_paths
from .sources.budget import FreeBudget
from .treeopt import drafting_seconds

__all__ = ["DecoderStep", "StepResult", "Call", "TokenLogprobs", "drive", "score_call", "score_tree"]


@dataclass
class Call:
    """One forward pass a decode asks for (a step's ``draft`` and ``score`` yield it): ``model`` 't'
    (target) or 'd' (draft), and the runner protocol's ``extend(tokens, parents, last_only)``
    arguments (``runners``). The generator is sent back the logits ``extend`` returns."""

    model: str
    tokens: list
    parents: list
    last_only: bool = False


def drive(gen, target_runner, draft_runner):
    """Run the generator ``gen`` (a decode, a step or a part of it), serving each ``Call`` with
    ``target_runner`` / ``draft_runner``; returns the generator's return value."""
    try:
        call = next(gen)
        while True:
            r = target_runner if call.model == "t" else draft_runner
            call = gen.send(r.extend(call.tokens, call.parents, call.last_only))
    except StopIteration as stop:
        return stop.value


def score_call(tree: DraftTree) -> Call:
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


def _common_prefix(a, b) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def _model_held(tree: DraftTree, path) -> int:
    """How deep the accepted ``path`` (node ids) holds the draft model's drafts: each node's token
    among its parent's model drafts (a node's free drafts are the last ``free`` of its ``drafts``)."""
    n = 0
    for j in path:
        nd = tree.nodes[j]
        par = tree.nodes[nd.parent]
        if nd.token not in par.drafts[:len(par.drafts) - par.free]:
            break
        n += 1
    return n


class TokenLogprobs:
    """The target's log-probabilities of each emitted token (a decode's ``logprobs`` record).

    For emitted token ``x_j`` with ``r_j`` the tree node it was drawn at (the root for the first
    token of a step, then the accepted path's nodes: ``[0] + verdict.path``), ``rows`` gets
    ``(log p_t(x_j), [(v, log p_t(v)) for the top ``top`` v])`` with
    ``p_t = softmax(z_t[r_j])`` the RAW target logits' law (float32 log-softmax, no temperature,
    top-k or top-p: vLLM's default and OpenAI's meaning). The rows are those of the target's
    scoring pass of the step: no extra forward. Under tree attention node ``r_j``'s context is
    exactly the committed prefix and its ancestors, so ``z_t[r_j]`` is the target's logits of a
    plain forward over prompt + output at that position (up to the engine's batch-shape float
    differences). At ``temperature`` 1 without top-k / top-p this is the law the output is
    distributed as (the verifiers are lossless for ``process_logits``' law); at other settings the
    output's law is ``process_logits(z_t, T, top_k, top_p)`` (T = 0: the argmax) and these are the
    model's own log-probabilities beside it. Cost per step: one log-softmax over the accepted
    path's rows ``[m + 1, V]`` and a top-k, one host copy."""

    def __init__(self, top: int = 0):
        self.top = int(top)
        self.rows: list[tuple[float, list[tuple[int, float]]]] = []

    def record(self, logits: torch.Tensor, rows: list[int], tokens: list[int]) -> None:
        """Append the entries of ``tokens`` drawn at ``rows`` of ``logits`` ``[N, V]``."""
        idx = torch.tensor(rows, dtype=torch.long, device=logits.device)
        lp = torch.log_softmax(logits.index_select(0, idx).float(), dim=-1)  # [m + 1, V]
        tok = torch.tensor(tokens, dtype=torch.long, device=logits.device)
        chosen = lp.gather(1, tok[:, None])[:, 0].tolist()
        if self.top > 0:
            vals, ids = lp.topk(min(self.top, lp.shape[-1]), dim=-1)  # [m + 1, top], sorted descending
            tops = [list(zip(i, v)) for i, v in zip(ids.tolist(), vals.tolist())]
        else:
            tops = [[] for _ in tokens]
        self.rows.extend(zip(chosen, tops))


class StepResult(NamedTuple):
    """What :meth:`DecoderStep.step` returns: ``tokens`` the emitted tokens (the accepted path's,
    then the recovered or bonus token), ``accepted`` the accepted path's length and ``depth`` the
    drafted tree's depth (0 when nothing was drafted)."""

    tokens: list
    accepted: int
    depth: int


class DecoderStep:
    """One sequence's decoding steps (module notes): draft, score, verify and commit one tree at a time.

    ``target_runner`` / ``draft_runner``: runners (``runners.runner_for``, or a batch lane's
    views) holding each model's committed prefix; ``draft_runner`` None for the target alone.
    ``settings``: a ``Settings``; ``generator``: the ``torch.Generator`` every draft and
    verification draw reads, in order. ``rule``: the ``trees.TreeRule`` that verifies (default
    ``settings.rule``, None for the target alone); ``verify`` also takes one per call. ``node_log``: None or a
    list that each verification extends with ``rule.node_records``.

    ``pending`` holds the committed tokens the draft cache lacks (fed at the next draft's level 0);
    ``target_calls``, ``draft_calls`` and ``tree_tokens`` count the forward passes and the tokens
    the target scored. ``logprobs``: None or a :class:`TokenLogprobs` that :meth:`step` extends with
    the target's log-probabilities of every emitted token (from the step's scoring pass). One tree
    is in flight at a time: ``commit`` takes the last drafted tree.
    """

    def __init__(self, target_runner, draft_runner, settings, generator: torch.Generator, *, rule=None,
                 node_log: list | None = None, index=None, cost=None, logprobs: TokenLogprobs | None = None):
        self.target_runner, self.draft_runner = target_runner, draft_runner
        self.logprobs = logprobs
        self.settings, self.generator = settings, generator
        self.rule = settings.rule if rule is None else rule
        self.node_log = node_log
        self.pending: list[int] = []
        self.target_calls = self.draft_calls = self.tree_tokens = 0
        self._tree: DraftTree | None = None  # the tree in flight
        self._chain = 0  # tokens fed at the in-flight tree's level 0 (pending + root): draft handles 0..c-1
        self.index = index  # shared state of the free sources' proposers (the suffix source's SuffixIndex), or None
        self._free = tuple(getattr(settings, "free_sources", ()))
        self._proposers: list = []  # (source, proposer) of each free source, from prefill on
        # per free source: [nodes proposed, accepted tokens it proposed] over the decode (StepResult notes)
        self.source_stats: dict = {src.name: [0, 0] for src in self._free}
        self._step_chains: dict = {}  # source name -> its chains on the in-flight tree
        self._step_offered: dict = {}  # source name -> the depth it proposed on the in-flight tree
        self.budget = None  # FreeBudget: each free source's depth by cost (a cost profile given)
        self.pace = None    # DepthPace: each step's drafting depth by cost (a cost profile given)
        self._cap = 0       # the in-flight tree's depth cap
        self._step_free = 0  # tokens the free chains added to the in-flight tree
        self._proposals: dict = {}  # (source name, depth) -> its chains, for the step in flight (the text decides)
        self._signal = None  # the longest free chain proposed for the step in flight (the pace's signal)
        shape = settings.shape
        if cost is not None and shape is not None and shape.depth > 0 and not settings.target_alone:
            self.pace = DepthPace(shape, cost)
        self._cost = cost
        if cost is not None and self._free:
            self.budget = FreeBudget({src.name: src.depth for src in self._free},
                                     lambda n: cost.target_seconds(n) + cost.per_node_seconds * (n - 1))

    # the four parts -------------------------------------------------------------------------
    def prefill(self, input_ids: torch.Tensor) -> float:
        """Reset both caches to ``input_ids[:, :-1]`` (``input_ids`` ``[1, T]``; its last token is the
        first root); returns the models' seconds."""
        secs = self.target_runner.prefill(input_ids[:, :-1])
        if self.draft_runner is not None:
            secs += self.draft_runner.prefill(input_ids[:, :-1])
        self.pending = []
        if self._free:
            self.observe(input_ids[0].tolist(), fresh=True)
        return secs

    def observe(self, tokens: list[int], fresh: bool = False) -> None:
        """The free sources' proposers read committed ``tokens`` (``fresh``: new proposers, for a new
        decode, ``tokens`` its prompt); ``prefill`` and ``commit`` call it."""
        self._proposals = {}  # the text changed: proposals made before it are stale
        if fresh:
            self.finish()
            self._proposers = [(src, src.proposer(self.index)) for src in self._free]
        for _, prop in self._proposers:
            prop.extend(list(tokens))

    def finish(self) -> None:
        """End the decode for the free sources' proposers (a suffix index keeps its output)."""
        for _, prop in self._proposers:
            prop.finish()
        self._proposers = []

    def new_tree(self, root: int, cap: int) -> DraftTree:
        """The empty tree of this step's shape at ``root``, drafted to depth ``cap`` at most."""
        plan = self.settings
        shape = plan.shape if plan.shape is not None else TreeShape("paths", 0, 1, {(): 0})
        return DraftTree(shape, root, cap, max(1, len(plan.draft_temps)), plan.law or "iid")  # the target alone: a root without drafts (any law)

    def draft(self, root: int, cap: int, limit: int | None = None):
        """Generator (yields the draft model's ``Call``s): the tree of ``root`` drafted to depth
        ``cap``, then the free sources' chains to their own depth, at most ``limit`` (None: no
        bound); returns it (no drafts when ``cap`` is 0)."""
        tree = self.new_tree(root, cap)
        self._tree, self._chain, self._cap, self._step_free = tree, 0, cap, 0
        if cap > 0:
            yield from self._draft_calls(tree)
        if self._free:
            self._add_free(tree, cap, limit)
        return tree

    def _add_free(self, tree: DraftTree, cap: int, limit: int | None) -> None:
        """The free sources' chains on the drafted ``tree`` (module notes), each source's trie cut
        to its ``depth`` nodes (``Settings.free_nodes``)."""
        chains = []
        self._step_chains, self._step_offered = {}, {}
        n = base = 0
        if self.budget is not None:
            # the model's tree as its shape allows it (root included), and the seconds of the step the
            # chains do not change: its draft levels and the per-step time
            paths = self._nominal_paths(cap)
            n, base = 1 + len(paths), drafting_seconds(paths, self._cost) + self._cost.per_step_seconds
        # chains join when the model drafts, or with free sources alone, or when the pace chose to
        # draft nothing this step (free-only nodes at the root: the walk's free-first rule)
        drafting = cap > 0 or self.settings.free_only or self.pace is not None
        for src, prop in (self._proposers if drafting else ()):
            d = src.depth if limit is None else min(src.depth, limit)
            if d <= 0:
                continue
            seen: set = set()
            mine = []
            for ch in self._propose(src, prop, d):
                ch = tuple(ch[:d])
                grown = {ch[:j] for j in range(1, len(ch) + 1)} - seen
                if not ch or len(seen) + len(grown) > src.depth:
                    continue
                seen |= grown
                mine.append(ch)
            if self.budget is not None and mine:  # cut by cost (sources.budget): the text and counters decide
                sizes = [len({ch[:j] for ch in mine for j in range(1, min(L, len(ch)) + 1)})
                         for L in range(1, max(map(len, mine)) + 1)]
                L = self.budget.depth(src.name, n, sizes, base, self._drafted(cap))
                self._step_offered[src.name] = L
                mine = list(dict.fromkeys(ch[:L] for ch in mine if L))
                seen = {ch[:j] for ch in mine for j in range(1, len(ch) + 1)}
                n += len(seen)
            if mine:
                chains.extend(mine)
                self._step_chains[src.name] = mine
            self.source_stats[src.name][0] += len(seen)
        if chains:
            self._step_free = len(tree.add_chains(chains))  # the tokens the free chains added to the tree

    def _propose(self, src, prop, d: int) -> list:
        """``prop.propose(d)``, once a step (the choice of the depth reads it too)."""
        key = (src.name, d)
        if key not in self._proposals:
            self._proposals[key] = prop.propose(d)
        return self._proposals[key]

    def free_signal(self, limit: int | None = None) -> int | None:
        """The longest chain the free sources propose for the next step, at most ``limit`` deep (the
        pace's signal, ``pace.signal_bucket``); None without free sources."""
        if not self._proposers:
            return None
        longest = 0
        for src, prop in self._proposers:
            d = src.depth if limit is None else min(src.depth, limit)
            if d > 0:
                longest = max([longest] + [min(len(ch), d) for ch in self._propose(src, prop, d)])
        return longest

    def score(self, tree: DraftTree):
        """Generator (yields the target's ``Call``): one target pass over ``[root] + tree``;
        returns its logits ``[N, V]`` (uncommitted until ``commit``)."""
        logits = yield score_call(tree)
        self.target_calls += 1
        self.tree_tokens += len(tree.nodes)
        return logits

    def verify(self, tree: DraftTree, logits: torch.Tensor, rule=None) -> TreeVerdict:
        """The verdict of ``rule`` (default ``self.rule``) on ``tree`` scored by ``logits`` ``[N, V]``
        (module notes: rows as the rule reads them; no drafts: one token from p at the root)."""
        rule = self.rule if rule is None else rule
        plan = self.settings
        if tree is self._tree:  # drafted by this step: rules skip their input check (DraftTree notes)
            tree.checked = True
        if rule is None or rule.lazy_rows:
            # p rows processed on demand, on the logits' device, at the nodes the rule visits
            tree.set_target(lambda i: process_logits(logits[i], plan.temperature, plan.top_k, plan.top_p))
        else:
            # every node's p row (float64 math on [V] rows) on the CPU, with the CPU generator
            if logits.device.type != "cpu":
                for nd in tree.nodes:
                    if nd.q is not None:
                        nd.q = nd.q.cpu()
            tree.set_target(lambda i: process_logits(logits[i], plan.temperature, plan.top_k, plan.top_p).cpu())
            tree.rows_checked = True  # process_logits rows are distributions (trees.DraftTree notes)
        if tree.nodes[0].drafts:
            verdict = rule.verify(tree, self.generator)
        else:  # a tree without drafts is no tree: one token from p at the root
            verdict = TreeVerdict((), int(sample_token(tree.p(0), self.generator)))
        if self.node_log is not None and rule is not None:
            self.node_log.extend(rule.node_records(tree, verdict))
        return verdict

    def commit(self, tree: DraftTree, verdict: TreeVerdict) -> list[int]:
        """Keep the committed prefix, the root and the accepted path in both caches (nothing
        recomputed; the path's tokens the draft cache lacks become ``pending``); returns the
        emitted tokens (the path's and ``verdict.token``)."""
        if tree is not self._tree:
            raise ValueError("tree: commit takes the tree this step drafted last")
        path = list(verdict.path)
        self.target_runner.commit([0] + path)
        if self.draft_runner is not None:
            if self._chain:
                c = self._chain  # pending + root were fed as handles 0..c-1, fed nodes follow
                fed = [j for j in path if tree.nodes[j].fed >= 0]
                self.draft_runner.commit(list(range(c)) + [c + tree.nodes[j].fed for j in fed])
                self.pending = [tree.nodes[j].token for j in path[len(fed):]]
            else:
                # the model did not draft (depth 0): the root and any accepted free chain are pending
                self.pending = self.pending + [tree.nodes[0].token] + [tree.nodes[j].token for j in path]
        self._tree = None
        out = [tree.nodes[j].token for j in path] + [int(verdict.token)]
        # a source's accepted tokens: the accepted path's prefix one of its chains holds
        held = {name: max(_common_prefix(ch, out[:-1]) for ch in chains) for name, chains in self._step_chains.items()}
        for name, h in held.items():
            self.source_stats[name][1] += h
        if self.budget is not None or self.pace is not None:
            model_held = _model_held(tree, path)
            if self.budget is not None:
                self.budget.record(self._step_offered, held, model_held, self._drafted(self._cap))
            if self.pace is not None:
                self.pace.record(self._cap, model_held, max(held.values(), default=0), self._step_free,
                                 self._signal)
        self._step_chains, self._step_offered = {}, {}
        self._proposals, self._signal = {}, None
        if self._proposers:
            self.observe(out)
        return out

    def discard(self) -> None:
        """Drop every uncommitted entry of both runners (a tree drafted and scored, not committed):
        the caches and ``pending`` are as before the tree was drafted."""
        self.target_runner.commit([])
        if self.draft_runner is not None:
            self.draft_runner.commit([])
        self._tree = None
        self._step_chains, self._step_offered = {}, {}
        self._proposals, self._signal = {}, None

    def _nominal_paths(self, cap: int) -> list:
        """The paths of the model's tree drafted ``cap`` deep as its shape allows it: never as
        drawn, so a free source's depth never depends on this step's draws."""
        if self.pace is not None:  # its paths per depth, made once
            return self.pace.paths[min(cap, self.pace.depth)]
        shape = self.settings.shape
        return shape_paths(shape, cap) if shape is not None and cap > 0 else []

    def _drafted(self, cap: int) -> int | None:
        """The model's depth this step as the free budget reads it: ``cap`` where the pace chooses
        it step by step, else None (as deep as ever: a fixed shape, or free sources alone)."""
        return cap if self.pace is not None else None


    def choose_cap(self, cap: int, limit: int | None = None) -> int:
        """The depth this step drafts, at most ``cap``: ``cap`` itself, or with a cost profile the
        depth that pays by the acceptances measured so far (``pace.DepthPace``; 0: the target alone),
        given the free chains proposed for it, at most ``limit`` deep (the step's own ``limit``)."""
        if self.pace is None:
            return cap
        self._signal = self.free_signal(limit)
        return self.pace.cap(cap, self._signal)

    def step(self, root: int, cap: int, rule=None, limit: int | None = None):
        """Generator (yields every ``Call``): draft (free chains at most ``limit`` deep), score,
        verify (with ``rule``, default ``self.rule``) and commit one tree; returns a :class:`StepResult`."""
        tree = yield from self.draft(root, cap, limit)
        logits = yield from self.score(tree)
        verdict = self.verify(tree, logits, rule)
        tokens = self.commit(tree, verdict)
        if self.logprobs is not None:  # token j was drawn at the root (j = 0) or at path node j - 1
            self.logprobs.record(logits, [0] + list(verdict.path), tokens)
        return StepResult(tokens, len(verdict.path), max(n.depth for n in tree.nodes))

    def serve(self, gen):
        """Run a generator of this step's (``draft``, ``score``, ``step``, a decode) with its own
        runners (:func:`drive`); returns its return value."""
        return drive(gen, self.target_runner, self.draft_runner)

    # drafting ---------------------------------------------------------------------------
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
            toks = law.sample(self.generator).tolist()
            for j, r in enumerate(rows):
                i = level[r]
                tree.nodes[i].q = qs[j]
                new.extend(tree.add_drafts(i, toks[j]))
        new.sort()
        return new
