r"""Every tree rule's exact tokens per call on the decoder's own draft trees, paired (issue 26, item 6).

What is measured. For each prompt of a data set the target's own continuation is sampled at
temperature 1 (``generate`` with the target alone, seed ``derive_seed(seed, <dataset>, <id>, "continuation", rule="unit")``;
a ``file:PATH`` data set is named by its file name there, so seeds do not depend on where it lies).
At positions ``j = 0, stride, 2 stride, ...`` of it the decoder's state is recreated (committed
text = prompt + continuation[:j], root = its last token) and, for every shape and node budget,
the draft tree is built by the decoder's own step (``decoding.DecoderStep``: ``draft`` with the
shape's ``Settings``, seed ``derive_seed(seed, <dataset>, <id>, <j>, <shape>, <budget>, rule="unit")``, then
``score``: one target pass; then ``discard``): the tree is exactly the one ``generate``
would build and verify at that step. Every registered rule then gives its exact expected
tokens per call ON THAT TREE, ``rule.expected_tokens(tree)`` (E|Y| given the tree, from the p
and q rows at every node), so rules are compared tree by tree.

Shapes at node budget N (drafted nodes, root excluded; duplicate drafts merge, so a trie may
have fewer): ``chain`` (one sequence of length N), ``seq2`` / ``seq4`` (K = 2 / 4 i.i.d.
sequences of length N / K merged into a trie), ``kary2`` (the binary tree cut to its first N
nodes in breadth-first order: an explicit shape, i.i.d. drafts at every node). All trees are
drafted i.i.d. at temperature 1, no top-k / top-p.

Rows. p rows are the target's softmax of the scored logits in float64 over the whole
vocabulary; q rows are the decoder's own float32 draft rows (the ones the drafts were drawn
from), renormalised in float64. Nothing is truncated (``support: "full"``, V = 151,936 for
the default pair), so no truncation bound is needed.

Rules. Token walks ``walk:<v>`` for v in ``WALKS`` (specinfer, spectr, khisti_is, optimal; optimal
with its exact scan over every token, ``head=None``: the per-node optimum);
then every other name of ``trees.names()`` built with no options (block on chains,
traversal, and any rule registered later). A rule that does not support the shape's law is
left out; one whose ``expected_tokens`` is only the enumeration default (no closed form at
full V, e.g. ``tree_lp``) is skipped with the reason recorded in the row's ``skipped``.

Files. One JSONL per data set (``records.JsonlWriter``: meta row with config, seed and
versions; every row carries the code version). Rows ``kind: "continuation"`` (the sampled
tokens, reused on resume) and ``kind: "tree"`` keyed by (prompt, position, shape, budget):
a rerun with the same config skips every tree already written (resumable; trees have their
own seeds, so a resumed run writes the same rows as an uninterrupted one). A tree written
before some rule of today's set existed is rebuilt from its seed and a ``kind: "tree_fill"``
row holds every rule's value on it today (``recheck``: today's minus the written value, per
rule; nonzero where a rule's code changed since); ``report`` takes today's values, so every
rule in a table is one version of its code, and states the differences.

Cost, and what is shared (exactly). Per prompt: the continuation (one target forward per token)
and one prefill of each model (the target's shared with the continuation's, ``PromptCache``);
per position: one chunk of ``stride`` tokens in each model and every distinct sequence of draft
calls (the root's forward is the same call on the same cache for all of the position's trees,
and trees whose drafts coincide repeat whole sequences) and every distinct target pass (trees
with the same nodes), each paid once (``_SharedCalls``); per tree: the rest of its draft levels,
its target pass unless shared, and the rules. Trees are NOT
scored in one pass over their union, nor batched: that changes the bf16 logits (a tree's nodes
at other key positions moved logits by up to 0.22 on the default pair), hence the rows.

    multidraft experiment realtrees run --dataset humaneval -n 164 --out runs/real_trees/humaneval.jsonl
    multidraft experiment realtrees report docs/results/real_trees/*.jsonl.gz --markdown runs/real_trees/table.md

``report`` reads the JSONL files only: per (data set, shape, budget), and per MT-bench
category, the mean tokens per call of every rule and its mean difference to the best token
walk (the walk of highest mean in that group) with the standard error over trees and the
standard error clustered by prompt (trees of one continuation are not independent).
"""
from __future__ import annotations

import math
import time
from pathlib import Path

import torch

from .. import trees
from ..sampling import process_logits
from ..trees import rules as _rules
from .._validate import derive_seed
from .records import JsonlWriter, read_jsonl

__all__ = ["SHAPES", "BUDGETS", "WALKS", "shape_settings", "bfs_tree", "tree_rules", "build_tree", "evaluate_tree",
           "run", "report"]

SHAPES = ("chain", "seq2", "seq4", "kary2")
BUDGETS = (4, 8, 12)
WALKS = trees.rule_table.WALKS  # the walked verifiers: defined once, in trees.rule_table
KEY = ("kind", "prompt", "position", "shape", "budget")


def bfs_tree(k: int, n: int) -> list[list[int]]:
    """The first n nodes of the full k-ary tree in breadth-first order, as child-index paths."""
    out, level = [], [()]
    while len(out) < n:
        level = [p + (c,) for p in level for c in range(k)]
        out.extend(level[: n - len(out)])
    return [list(p) for p in out]


def shape_settings(shape: str, budget: int):
    """The decoder's ``Settings`` that draft ``shape`` at node budget ``budget`` (temperature 1)."""
    from ..decoding.settings import Settings

    if shape not in SHAPES:
        raise ValueError(f"shape must be one of {', '.join(SHAPES)}, got {shape!r}")
    if isinstance(budget, bool) or not isinstance(budget, int) or budget < 1:
        raise ValueError(f"budget must be a positive integer (drafted nodes), got {budget!r}")
    if shape == "chain":
        return Settings.from_args(verifier="specinfer", k=1, depth=budget)
    if shape in ("seq2", "seq4"):
        K = int(shape[3:])
        if budget % K:
            raise ValueError(f"budget: {shape} needs a multiple of {K} nodes, got {budget}")
        return Settings.from_args(verifier="specinfer", k=K, depth=budget // K, tree="sequences")
    return Settings.from_args(verifier="specinfer", tree=bfs_tree(2, budget))


def tree_law(settings) -> "trees.TreeLaw":
    """The tree law of ``settings``' trees; with free sources a mixed law (the walks verify free drafts
    first under the model's law; its chains are the step's own, so none are fixed here)."""
    base = trees.TreeLaw(settings.shape, settings.law, repr(settings.shape))
    return trees.mixed(base, []) if getattr(settings, "mixed", False) else base


def _walk_verifier(name: str):
    """The token-level verifier of ``walk:<name>``: the registered one, but ``optimal`` with its exact
    scan over every token (``head=None``): the per-node optimum this study compares against (the
    decoder's default plans a head and lumps the tail at V > 4,096, within ~5e-6 of it)."""
    from .. import verifiers
    from ..verifiers.optimal import Optimal

    return Optimal(head=None) if name == "optimal" else verifiers.get(name)


def tree_rules(law) -> tuple[list, dict]:
    """``([(name, rule)], {name: reason skipped})`` for a tree law (see the module notes)."""
    todo, skipped = [], {}
    for v in WALKS:
        w = trees.TokenWalk(_walk_verifier(v), law.kind)
        if w.supports(law):
            todo.append((f"walk:{v}", w))
    for name in trees.names():
        if name == "token_walk":
            continue
        try:
            rule = trees.get(name)
        except (TypeError, ValueError) as exc:
            skipped[name] = f"cannot be built without options: {exc}"
            continue
        try:
            ok = rule.supports(law)
        except Exception as exc:  # a rule under construction elsewhere: recorded, not fatal
            skipped[name] = f"supports() failed: {type(exc).__name__}: {exc}"
            continue
        if not ok:
            continue
        if not _rules.has_fast_expected_tokens(rule):
            skipped[name] = "no closed form of expected_tokens at full V (only the enumeration default); not run"
            continue
        todo.append((name, rule))
    return todo, skipped


def build_tree(runners, settings, root: int, generator: torch.Generator, committed: list[int] | None = None):
    """Draft and score one tree with the decoder's step over ``runners`` (the target's and the draft's,
    both holding the committed prefix) exactly as ``generate`` does at a step; the runners are left as
    they were. ``committed``: the committed tokens, root last (the free sources' proposers read them;
    None: no free drafts). Returns the filled ``DraftTree`` (float64 p rows over the vocabulary, q
    rows renormalised, each row of an 'independent' node's ``[k, V]``; free-only nodes have none)."""
    from ..decoding import DecoderStep

    step = DecoderStep(*runners, settings, generator)
    if committed is not None:
        step.observe(committed, fresh=True)
    tree = step.serve(step.draft(root, settings.shape.depth))
    step.finish()
    logits = step.serve(step.score(tree))  # [N, V]
    step.discard()
    p = process_logits(logits.float(), settings.temperature, settings.top_k, settings.top_p, dtype=torch.float64)  # [N, V]
    for i, nd in enumerate(tree.nodes):
        nd.p = p[i]
        if nd.q is not None:
            q = nd.q.double()  # [V], or [k, V] (independent columns)
            nd.q = q / q.sum(-1, keepdim=True)
    tree.checked = True  # drafted by the decoder's step, every row a distribution: rules skip their input check
    return tree


def evaluate_tree(tree, rules: list) -> dict:
    """``{name: exact expected tokens per call}`` of every rule on one filled tree."""
    return {name: float(rule.expected_tokens(tree)) for name, rule in rules}


def _advance(runners, full: list[int], cur: int, to: int) -> None:
    """Commit ``full[cur:to]`` in both runners (a plain causal chain)."""
    if to <= cur:
        return
    chunk = full[cur:to]
    for r in runners:
        r.extend(chunk, list(range(-1, len(chunk) - 1)))
        r.commit(list(range(len(chunk))))


class _SharedCalls:
    """A runner as the decoder's step sees it (drafting and scoring), paying each distinct call once per position.

    A model call's result depends only on the committed cache and the calls made since the last
    commit. Every tree of a position starts with the same draft call on the same cache
    (``extend([root], [-1], last_only=True)``); trees whose drafts coincide (often on peaked rows:
    a chain of budget 8 whose first draws equal another chain's) repeat whole sequences of draft
    calls, and trees with the same nodes (a K-ary tree and two sequences whose drafts all
    merged into one chain) the same target call. The first time a sequence of calls is made, its
    logits and the runner's state after it are kept (``HFRunner.snapshot``: the cache tensors as
    they are, exact here because nothing writes into a cache tensor in place: ``commit([])`` and
    the chunk commits of ``_advance`` only slice); a repeat gets them back (``HFRunner.restore``),
    the very bits the call computes. Kept per committed length (cleared when ``_advance``
    commits), at most ``MAX_BYTES`` of tensors at a time (then cleared: a later repeat is paid)."""

    MAX_BYTES = 1 << 28

    def __init__(self, runner):
        from ..decoding.runners import HFRunner

        self.runner = runner
        self.active = isinstance(runner, HFRunner)
        self.kept: dict = {}
        self.kept_base = None
        self.kept_bytes = 0
        self.calls: tuple = ()
        self.hits = self.misses = 0

    def __getattr__(self, name):
        return getattr(self.runner, name)

    def extend(self, tokens: list[int], parents: list[int], last_only: bool = False) -> torch.Tensor:
        r = self.runner
        if not self.active:
            return r.extend(tokens, parents, last_only)
        if r.base != self.kept_base or self.kept_bytes > self.MAX_BYTES:
            self.kept, self.kept_base, self.kept_bytes = {}, r.base, 0
        if not r.uncommitted:  # the first call since a commit
            self.calls = ()
        key = self.calls + ((tuple(int(t) for t in tokens), tuple(int(p) for p in parents), bool(last_only)),)
        self.calls = key
        hit = self.kept.get(key)
        if hit is not None:
            state, logits = hit
            r.restore(state)
            self.hits += 1
            return logits.clone()
        logits = r.extend(tokens, parents, last_only)  # [n, V] or [1, V]
        state = r.snapshot()
        self.kept[key] = (state, logits.clone())
        self.kept_bytes += logits.numel() * logits.element_size() + state.nbytes()
        self.misses += 1
        return logits


def _missing(row: dict, rules: list, fills: dict) -> list[str]:
    """Names of ``rules`` (today's runnable rules) that a written tree row and the fill rows of its key
    do not hold (a rule skipped when the row was written, and runnable today, is missing too)."""
    have = set(row.get("tokens") or {}) | set(fills)
    return [name for name, _ in rules if name not in have]


def run(target, draft, tokenizer, *, dataset: str, n: int, out, seed: int = 0, prompt_seed: int | None = None,
        cont_tokens: int = 128, stride: int = 8, shapes=SHAPES, budgets=BUDGETS, max_trees: int | None = None,
        deadline: float | None = None, log=None, model_names: dict | None = None, fill: bool = True) -> dict:
    """Write the rows of ``dataset`` (see the module notes) to ``out``; returns counts and timings.
    Stops cleanly after ``max_trees`` trees built (new or filled) or at ``deadline`` (time.time()), whichever first.

    ``fill``: a tree already written without some rule of today's set (a rule registered after it
    was written) is rebuilt from its seed (the same tree, bit for bit) and a ``tree_fill`` row holds
    every rule's value on it today (``added``: the rules it lacked; ``recheck``: today's value minus
    the written one, per rule written; the report uses today's values and states the differences)."""
    from .. import datasets

    shapes, budgets = tuple(shapes), tuple(int(b) for b in budgets)
    settings = {(s, b): shape_settings(s, b) for s in shapes for b in budgets}
    if cont_tokens < 1 or stride < 1:
        raise ValueError(f"cont_tokens and stride must be >= 1, got {cont_tokens}, {stride}")
    config = dict(dataset=dataset, n=n, prompt_seed=prompt_seed, cont_tokens=cont_tokens, stride=stride,
                  shapes=list(shapes), budgets=list(budgets), temperature=1.0, models=model_names or {})
    prompts = datasets.load_prompts(dataset, n, seed=prompt_seed)
    cats = datasets.mtbench_categories() if dataset == "mtbench" else {}
    state = _Run(target, draft, tokenizer, dataset=dataset, seed=seed, cont_tokens=cont_tokens, stride=stride,
                 shapes=shapes, budgets=budgets, settings=settings, cats=cats, fill=fill, log=log,
                 max_trees=max_trees, deadline=deadline)
    with JsonlWriter(out, config, seed, keyed=("n", "shapes", "budgets")) as w:
        state.resume(w)
        for pid, prompt in prompts:
            if not state.prompt(pid, datasets.prompt_ids(tokenizer, dataset, prompt)):  # ids [1, T]
                break
    return state.result()


class _Run:
    """One call of :func:`run`: its inputs, the rows written before (resume), and the counts and
    timings it returns."""

    def __init__(self, target, draft, tokenizer, *, dataset: str, seed: int, cont_tokens: int, stride: int,
                 shapes: tuple, budgets: tuple, settings: dict, cats: dict, fill: bool, log, max_trees: int | None,
                 deadline: float | None):
        self.target, self.draft = target, draft
        self.dataset, self.seed, self.cont_tokens, self.stride = dataset, seed, cont_tokens, stride
        self.shapes, self.budgets, self.settings = shapes, budgets, settings
        self.cats, self.fill, self.log = cats, fill, log
        self.max_trees, self.deadline = max_trees, deadline
        self.laws = {sb: tree_law(st) for sb, st in settings.items()}
        self.rulesets = {sb: tree_rules(law) for sb, law in self.laws.items()}
        self.eos = getattr(tokenizer, "eos_token_id", None)
        # seeds name the data set by what it is, not where it lies: a prompt file by its file name
        self.ds_name = "file:" + Path(dataset[5:]).name if dataset.startswith("file:") else dataset
        self.made, self.filled, self.t_start, self.worst = 0, 0, time.time(), 0.0
        self.cpu = {"continuations": 0.0, "prefill": 0.0, "trees": 0.0}  # process CPU seconds (load-independent)
        self.n_cont_tokens = 0
        self.calls = {"draft paid": 0, "draft shared": 0, "target paid": 0, "target shared": 0}
        self.stopped = "done"

    def resume(self, w: JsonlWriter) -> None:
        """Take the writer and the rows it already holds: continuations, trees and fills by key."""
        self.w = w
        self.conts = {r["prompt"]: r["tokens"] for r in w.rows if r.get("kind") == "continuation"}
        self.written = {(r["prompt"], r["position"], r["shape"], r["budget"]): r for r in w.rows if r.get("kind") == "tree"}
        self.fills: dict = {}
        for r in w.rows:
            if r.get("kind") == "tree_fill":
                self.fills.setdefault((r["prompt"], r["position"], r["shape"], r["budget"]), {}).update(r.get("tokens") or {})

    def limit(self) -> bool:
        return ((self.max_trees is not None and self.made + self.filled >= self.max_trees)
                or (self.deadline is not None and time.time() >= self.deadline))

    def result(self) -> dict:
        el = time.time() - self.t_start
        return dict(trees=self.made, filled=self.filled, recheck_max=self.worst, seconds=el, cpu_seconds=self.cpu,
                    continuation_tokens=self.n_cont_tokens, model_calls=self.calls,
                    trees_per_min=60 * (self.made + self.filled) / el if el > 0 else 0.0, stopped=self.stopped)

    def prompt(self, pid: str, ids: torch.Tensor) -> bool:
        """Write the rows of one prompt (``ids`` [1, T]); False when the run stops here (``max_trees`` or ``deadline``)."""
        from ..decoding.kv import PromptCache

        T = int(ids.shape[1])
        if self.limit():
            self.stopped = "limit"
            return False
        # the continuation's prompt prefill is the tree runners' target prefill (same ids, same
        # call): kept once and copied exactly (PromptCache)
        pc = PromptCache(max_entries=2)
        if pid not in self.conts:
            self.continuation(pid, ids, pc)
        cont = self.conts[pid]
        full = ids[0].tolist() + cont
        todo = self.todo(pid, cont)
        if not todo:
            return True
        runners = self.prefill(pc, full[:T - 1])
        done = self.trees(pid, T, full, todo, runners)
        for who, x in (("target", runners[0]), ("draft", runners[1])):
            self.calls[f"{who} paid"] += x.misses
            self.calls[f"{who} shared"] += x.hits
        return done

    def continuation(self, pid: str, ids: torch.Tensor, pc) -> None:
        """Sample the target's continuation of prompt ``pid`` (``ids`` [1, T]) and write its row."""
        from ..decoding import generate

        c0 = time.process_time()
        cseed = derive_seed(self.seed, self.ds_name, pid, "continuation", rule="unit")
        res = generate(self.target, None, ids, verifier=None, temperature=1.0, max_new_tokens=self.cont_tokens,
                       generator=cseed, eos_token_id=self.eos, prompt_cache=pc)
        self.conts[pid] = res.tokens.tolist()
        self.cpu["continuations"] += time.process_time() - c0
        self.n_cont_tokens += len(self.conts[pid])
        self.w.write(kind="continuation", dataset=self.dataset, prompt=pid, category=self.cats.get(pid), seed=cseed,
                     prompt_tokens=int(ids.shape[1]), tokens=self.conts[pid])

    def todo(self, pid: str, cont: list[int]) -> list[tuple]:
        """``[(position, shape, budget, written row or None)]``: the trees of prompt ``pid`` not written
        yet, and (with ``fill``) those written without some rule of today's set, in order."""
        todo = []
        for j in range(0, len(cont), self.stride):
            for s in self.shapes:
                for b in self.budgets:
                    old = self.written.get((pid, j, s, b))
                    if old is None:
                        todo.append((j, s, b, None))
                    elif self.fill and _missing(old, self.rulesets[(s, b)][0], self.fills.get((pid, j, s, b), {})):
                        todo.append((j, s, b, old))
        return todo

    def prefill(self, pc, prefix: list[int]) -> tuple:
        """The prompt's two runners (target, draft) holding ``prefix`` (the prompt less its last token),
        each behind a ``_SharedCalls``."""
        from ..decoding.runners import runner_for

        # one decoder per prompt: prefill the prompt, then advance position by position in the
        # same chunks whether or not a position's trees are already written (so a resumed run
        # computes every row from the same caches as an uninterrupted one)
        c0 = time.process_time()
        with torch.inference_mode():
            plain = (runner_for(self.target, pc), runner_for(self.draft, pc))
            for r in plain:
                r.prefill(torch.tensor([prefix]))
        runners = (_SharedCalls(plain[0]), _SharedCalls(plain[1]))
        self.cpu["prefill"] += time.process_time() - c0
        return runners

    def trees(self, pid: str, T: int, full: list[int], todo: list[tuple], runners: tuple) -> bool:
        """Build the trees ``todo`` of prompt ``pid`` (``full``: its T tokens then the continuation) and
        write their rows; False when the run stops here (``max_trees`` or ``deadline``)."""
        cur = T - 1
        for j, s, b, old in todo:
            if self.limit():
                self.stopped = "limit"
                return False
            r = T - 1 + j  # root index: committed text full[:r], root full[r]
            t0, c0 = time.perf_counter(), time.process_time()
            tseed = derive_seed(self.seed, self.ds_name, pid, j, s, b, rule="unit")
            with torch.inference_mode():
                while cur < r:  # the positions' chunks, stride tokens at a time
                    _advance(runners, full, cur, min(r, cur + self.stride))
                    cur = min(r, cur + self.stride)
                tree = build_tree(runners, self.settings[(s, b)], full[r], torch.Generator().manual_seed(tseed),
                                  full[:r + 1])
            t1 = time.perf_counter()
            if old is None:
                self.write_tree(pid, j, s, b, r, tree, tseed, t0, t1)
            else:
                self.write_fill(pid, j, s, b, old, tree, tseed, t0, t1)
            self.cpu["trees"] += time.process_time() - c0
            if self.log is not None and (self.made + self.filled) % 12 == 0:
                el = time.time() - self.t_start
                self.log(f"{self.dataset}: {self.made} trees (+{self.filled} filled) in {el:.0f} s "
                         f"({60 * (self.made + self.filled) / el:.1f} trees/min)")
        return True

    def write_tree(self, pid: str, j: int, s: str, b: int, r: int, tree, tseed: int, t0: float, t1: float) -> None:
        """Every rule's tokens per call on a new tree: its ``tree`` row (model time t1 - t0)."""
        rules, skipped = self.rulesets[(s, b)]
        tokens = evaluate_tree(tree, rules)
        t2 = time.perf_counter()
        self.w.write(kind="tree", dataset=self.dataset, prompt=pid, category=self.cats.get(pid), position=j,
                     root_index=r, shape=s, budget=b, law=self.laws[(s, b)].kind, nodes=len(tree) - 1,
                     depth=max(nd.depth for nd in tree.nodes), seed=tseed, support="full",
                     V=int(tree.nodes[0].p.shape[0]), tokens=tokens, skipped=skipped,
                     model_seconds=round(t1 - t0, 4), rule_seconds=round(t2 - t1, 4))
        self.made += 1

    def write_fill(self, pid: str, j: int, s: str, b: int, old: dict, tree, tseed: int, t0: float, t1: float) -> None:
        """Every rule's tokens per call today on a tree written before (row ``old``), rebuilt from its
        seed: its ``tree_fill`` row, with today's minus the written values (model time t1 - t0)."""
        rules, skipped = self.rulesets[(s, b)]
        key = (pid, j, s, b)
        new = _missing(old, rules, self.fills.get(key, {}))
        tokens = evaluate_tree(tree, rules)
        recheck = {x: tokens[x] - v for x, v in old["tokens"].items() if x in tokens}
        self.worst = max([self.worst] + [abs(d) for d in recheck.values()])
        if len(tree) - 1 != old.get("nodes", len(tree) - 1):
            recheck["nodes"] = len(tree) - 1 - old["nodes"]
            self.worst = math.inf
        t2 = time.perf_counter()
        self.w.write(kind="tree_fill", dataset=self.dataset, prompt=pid, category=self.cats.get(pid), position=j,
                     shape=s, budget=b, seed=tseed, tokens=tokens, skipped=skipped, added=new, recheck=recheck,
                     model_seconds=round(t1 - t0, 4), rule_seconds=round(t2 - t1, 4))
        self.fills.setdefault(key, {}).update(tokens)
        self.filled += 1


def row_done(done: set, pid: str, j: int, s: str, b: int) -> bool:
    from .records import row_key

    return row_key(dict(kind="tree", prompt=pid, position=j, shape=s, budget=b), KEY) in done


# --------------------------------------------------------------------------------------------
# the report: JSONL only

_TREE_FIELDS = {"dataset": str, "prompt": str, "position": int, "shape": str, "budget": int, "tokens": dict}


def _tree_rows(paths) -> tuple[list[dict], list[str]]:
    rows, notes = [], []
    for path in paths:
        meta, rs = read_jsonl(path)
        if meta is None:
            notes.append(f"{path}: no meta row, left out")
            continue
        # tree_fill rows: a tree written before some rules existed, every rule's value today (they win,
        # so a table holds one version of each rule's code)
        fills: dict = {}
        worst: dict = {}
        for r in rs:
            if r.get("kind") != "tree_fill":
                continue
            vals = r.get("tokens")
            if not isinstance(vals, dict) or not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 1.0
                                                     for v in vals.values()):
                notes.append(f"{path}: a tree_fill row with bad tokens left out")
                continue
            fills.setdefault((r.get("dataset"), r.get("prompt"), r.get("position"), r.get("shape"), r.get("budget")), {}).update(vals)
            for x, d in (r.get("recheck") or {}).items():
                d = abs(d) if isinstance(d, (int, float)) else math.inf
                m, c = worst.get(x, (0.0, 0))
                worst[x] = (max(m, d), c + (d > 1e-12))
        if fills:
            diffs = ", ".join(f"{x} {m:.3g} ({c} trees > 1e-12)" for x, (m, c) in sorted(worst.items()))
            notes.append(f"{path}: {len(fills)} trees written before some rules existed were rebuilt from their seeds "
                         f"(tree_fill rows); their values are today's; largest |today - written| per rule: {diffs}")
        seen = set()
        for r in rs:
            if r.get("kind") != "tree":
                continue
            bad = [f for f, ty in _TREE_FIELDS.items() if not isinstance(r.get(f), ty) or isinstance(r.get(f), bool)]
            vals = r.get("tokens") if isinstance(r.get("tokens"), dict) else {}
            if bad or not vals or not all(isinstance(v, (int, float)) and math.isfinite(v) and v >= 1.0 for v in vals.values()):
                notes.append(f"{path}: a tree row with bad fields {bad or ['tokens']} left out")
                continue
            key = (r["dataset"], r["prompt"], r["position"], r["shape"], r["budget"])
            if key in seen:
                notes.append(f"{path}: a repeated tree row {key} left out")
                continue
            seen.add(key)
            if key in fills:
                r = dict(r, tokens={**vals, **fills[key]})
            rows.append(r)
    return rows, notes


def _paired(rows: list[dict], name: str, ref: str) -> tuple[float, float, float]:
    """Mean of (name - ref) over the rows, its standard error over trees, and clustered by prompt."""
    d = [r["tokens"][name] - r["tokens"][ref] for r in rows]
    n = len(d)
    m = sum(d) / n
    se = math.sqrt(sum((x - m) ** 2 for x in d) / (n - 1) / n) if n > 1 else float("nan")
    by: dict = {}
    for r, x in zip(rows, d):
        by.setdefault(r["prompt"], []).append(x - m)
    G = len(by)
    sc = math.sqrt(G / (G - 1) * sum(sum(v) ** 2 for v in by.values())) / n if G > 1 else float("nan")
    return m, se, sc


def _group_table(rows: list[dict]) -> tuple[list[str], dict]:
    names = sorted({k for r in rows for k in r["tokens"]}, key=lambda x: (not x.startswith("walk:"), x))
    names = [x for x in names if all(x in r["tokens"] for r in rows)]
    mean = {x: sum(r["tokens"][x] for r in rows) / len(rows) for x in names}
    walks = [x for x in names if x.startswith("walk:")]
    # the walk of highest mean; near-ties (1e-12: e.g. on chains every walk is naive's) go to WALKS order
    rank = {f"walk:{v}": i for i, v in enumerate(WALKS)}
    top = max((mean[x] for x in walks), default=None)
    best = min((x for x in walks if mean[x] >= top - 1e-12), key=lambda x: rank.get(x, len(rank))) if walks else None
    out = ["| rule | tokens/call | diff to best walk | SE (trees) | SE (prompts) | diff % |", "|---|---|---|---|---|---|"]
    summary = {"best_walk": best, "mean": mean, "diff": {}}
    for x in names:
        if best is None:
            out.append(f"| {x} | {mean[x]:.4f} | | | | |")
            continue
        m, se, sc = _paired(rows, x, best)
        summary["diff"][x] = (m, se, sc)
        tag = " (best walk)" if x == best else ""
        out.append(f"| {x}{tag} | {mean[x]:.4f} | {m:+.4f} | {se:.4f} | {sc:.4f} | {100 * m / mean[best]:+.2f} % |")
    return out, summary


def report(paths) -> str:
    """The markdown tables of the JSONL files ``paths`` (see the module notes); reads nothing else."""
    rows, notes = _tree_rows(paths)
    if not rows:
        return "(no tree rows)\n" + "".join(f"- {n}\n" for n in notes)
    order = {s: i for i, s in enumerate(SHAPES)}
    groups: dict = {}
    for r in rows:
        groups.setdefault((r["dataset"], r["shape"], r["budget"]), []).append(r)
        if r.get("category"):
            groups.setdefault((r["dataset"] + "/" + r["category"], r["shape"], r["budget"]), []).append(r)
    keys = sorted(groups, key=lambda k: ("/" in k[0], k[0], order.get(k[1], 9), k[2]))
    head = ["## Headline: the best non-walk rule against the best token walk", "",
            "| data set | shape | budget | trees | prompts | best walk | best other rule | diff | SE (trees) | SE (prompts) | diff % |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    body = []
    for key in keys:
        rs = groups[key]
        tab, summ = _group_table(rs)
        n_prompts = len({r["prompt"] for r in rs})
        skipped = sorted({f"{k}: {v}" for r in rs for k, v in (r.get("skipped") or {}).items()})
        body.append(f"### {key[0]}, {key[1]}, budget {key[2]}: {len(rs)} trees, {n_prompts} prompts\n")
        body.extend(tab)
        if skipped:
            body.append("")
            body.extend(f"- skipped {s}" for s in skipped)
        body.append("")
        others = [x for x in summ["mean"] if not x.startswith("walk:")]
        if "/" not in key[0] and summ["best_walk"] and others:
            bo = max(others, key=lambda x: summ["mean"][x])
            m, se, sc = summ["diff"][bo]
            head.append(f"| {key[0]} | {key[1]} | {key[2]} | {len(rs)} | {n_prompts} | {summ['best_walk']} | {bo} | "
                        f"{m:+.4f} | {se:.4f} | {sc:.4f} | {100 * m / summ['mean'][summ['best_walk']]:+.2f} % |")
    out = head + [""] + body
    if notes:
        out += ["Notes (rows left out, trees rebuilt):", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"
