"""The one decode configuration: ``Settings``, model-free, made and validated once, then passed down.

``Settings.from_args(verifier=..., k=..., depth=..., ...)`` checks every argument that needs
no model and resolves it (the rule to its ``trees.TreeRule`` object, the law name to a kind from
``drafts.LAW_KINDS``, the tree argument to a ``TreeShape``, the draft sources to
``decoding.sources`` objects with one draft temperature per draft column). Every edge builds its
settings here: ``generate``'s keywords, the CLI flags, the benchmarks' method grammar, a server
request (``derive`` on the server's settings) and ``custom_generate``. A bad argument raises
``ArgumentError`` (a ``ValueError``) whose ``arg`` is the argument's name and whose message starts
with it; the CLI turns ``arg`` into its flag from one table. ``generate(target, draft, ids,
settings, generator=...)`` then uses the object as it is: nothing below re-checks it.
``settings.describe()`` is the one description (``decode --json``, result rows, the server's
``speculative`` object).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from .. import drafts as _drafts
from .. import trees as _trees
from .. import verifiers as _verifiers
from .._validate import ArgumentError, as_int, as_k, as_temperature, as_top_k, as_top_p
from ..trees import MIXED_REFUSALS, TreeShape, node_ks
from .sources import DraftModel, free_source, parse_sources

__all__ = ["Settings", "ArgumentError", "node_ks", "WALK", "AUTO_PROXY", "decoder_rules", "rule_node_ks", "tree_law",
           "settings_or_kwargs"]

WALK = _trees.TokenWalk.name  # the default tree rule: the root-first walk of the token-level ``verifier``
_UNSET = object()  # verifier not given (its default, 'specinfer', is the walk's verifier)


def decoder_rules() -> list[str]:
    """The tree rules the decoder takes: every registered rule (``trees.names()``) but those that
    need small V (``trees.small_v_only``: today 'tree_lp'); 'token_walk' is the default (the walk
    of ``verifier``)."""
    return [n for n in _trees.names() if _trees.small_v_only(n) is None]


def tree_law(shape: TreeShape, kind: str, n_cols: int = 1):
    """The ``trees.TreeLaw`` of the trees the decoder drafts with ``shape`` and the node law ``kind``:
    ``chain`` (one draft per node), ``sequences``, ``kary`` (the full K-ary tree), ``explicit``
    (any other shape of paths) or ``dynamic``; ``n_cols`` draft columns for 'independent'."""
    cols = n_cols if kind == "independent" else None
    if shape.mode == "sequences":
        return _trees.sequences(shape.k, shape.depth, kind, cols)
    if shape.mode == "dynamic":
        return _trees.dynamic(shape.k, shape.depth, shape.budget, kind, shape.min_gain)
    if shape.k <= 1:
        return _trees.chain(shape.depth, kind)
    if shape.children == _trees.parse_tree(_trees.full_tree(shape.k, shape.depth)):
        return _trees.kary(shape.k, shape.depth, kind, cols)
    return _trees.explicit([list(p) for p in shape.children if p], kind, cols)


AUTO_PROXY = "specinfer"  # --tree auto rates trees for a sequence-level rule with this verifier's walk


def rule_node_ks(rule: str, law: str, k_max: int) -> list[int]:
    """The numbers of drafts 1..k_max per node for which the sequence-level ``rule`` is lossless on
    the K-ary tree of depth 2 with node law ``law`` (k = 1: one chain): the node sizes ``--tree
    auto`` may give a tree verified by ``rule``."""
    obj = _trees.get(rule)
    return [k for k in range(1, k_max + 1) if obj.supports(_trees.kary(k, 2, law))]


def _rule_name(rule) -> str:
    """The tree rule name (``WALK`` for None), checked against the registry and the decoder's refusals."""
    if rule is None:
        return WALK
    if isinstance(rule, _trees.TreeRule):
        rule = rule.name
    if not isinstance(rule, str) or not rule.strip():
        raise ArgumentError("rule", f"must be a registered tree rule name, got {rule!r}")
    name = rule.strip()
    if name in _trees.names() and _trees.small_v_only(name) is not None:
        raise ArgumentError("rule", f": {name!r} {_trees.small_v_only(name)}; it cannot run at a model's vocabulary: "
                                    "use 'traversal' (trees) or 'block' (one chain)")
    if name not in _trees.names():
        raise ArgumentError("rule", f": unknown tree rule {name!r}; the decoder takes {', '.join(decoder_rules())}")
    return name


def _alternatives(rule: str, shape: TreeShape, kind: str, n_cols: int) -> str:
    """What would work instead of (rule, tree law): the tree modes of these sizes the rule takes,
    and the other rules that take this tree."""
    K, L = shape.k, shape.depth
    modes = []
    for what, sh in (("k = 1 (one chain)", TreeShape.from_args(None, 1, L)),
                     ("tree = 'sequences'", TreeShape.from_args("sequences", K, L)),
                     ("the full K-ary tree (tree = None)", TreeShape.from_args(None, K, L)),
                     ("tree = 'dynamic'", TreeShape.from_args("dynamic", K, L))):
        for kd in dict.fromkeys((kind, "iid")):
            try:
                if _takes(_trees.get(rule), sh, kd, n_cols):
                    modes.append(what + ("" if kd == kind else f" with draft_law = {kd!r}"))
                    break
            except ValueError:
                continue
    others = []
    for name in decoder_rules():
        if name in (rule, WALK):
            continue
        try:
            if _takes(_trees.get(name), shape, kind, n_cols):
                others.append(repr(name))
        except (TypeError, ValueError):  # a rule that needs options the decoder does not give
            continue
    out = []
    if modes:
        out.append(f"use {' or '.join(dict.fromkeys(modes))}")
    if others:
        out.append(f"rule {' or '.join(others)}")
    out.append(f"rule {WALK!r} (the walk of a token-level verifier)")
    return ", or ".join(out)


def _check_rule(rule: str, shape: TreeShape, kind: str, n_cols: int) -> None:
    """``ArgumentError`` naming ``rule`` unless the sequence-level ``rule`` is lossless for the
    decoder's tree law (``rule.supports(tree_law(...))``), naming what would work."""
    law = tree_law(shape, kind, n_cols)
    obj = _trees.get(rule)
    if obj.supports(law):
        why = _dry_run(obj, shape, kind, n_cols)
        if why is None:
            return
    else:
        why = obj.refusal(law) if hasattr(obj, "refusal") else None
    raise ArgumentError("rule", f": {rule!r} is not lossless for {law.name}"
                                + (f" ({why})" if why else "") + f"; {_alternatives(rule, shape, kind, n_cols)}")


def _takes(obj, shape: TreeShape, kind: str, n_cols: int) -> bool:
    """Whether the rule ``obj`` verifies the decoder's trees of this mode and law (``supports``
    and a dry run)."""
    return obj.supports(tree_law(shape, kind, n_cols)) and _dry_run(obj, shape, kind, n_cols) is None


def _dry_run(obj, shape: TreeShape, kind: str, n_cols: int) -> str | None:
    """Why ``obj`` refuses a tree of this mode and node law at verify time (None when it verifies
    one): a small tree of the same mode, K and law (depth <= 2, V = 3 tables) drawn and verified
    once, so that a rule whose ``supports`` admits a law its checks then refuse is refused here,
    before any model runs, not in the middle of a decode."""
    L = min(shape.depth, 2)
    if shape.mode == "paths":
        small = TreeShape.from_args([list(p) for p in shape.children if p and len(p) <= L], shape.k, L)
    else:
        small = TreeShape.from_args(shape.mode, shape.k, L, shape.budget if shape.mode == "dynamic" else None,
                                    shape.min_gain)
    law = tree_law(small, kind, n_cols)
    cols = n_cols if kind == "independent" else 1
    model = _trees.TableModel.random(V=3, seed=0, cols=max(cols, 1))
    try:
        tree = law.sample(model, torch.Generator().manual_seed(0))
        if tree.nodes[0].drafts:
            obj.verify(tree, torch.Generator().manual_seed(0))
    except ValueError as exc:
        return str(exc)
    return None


def _unsupported(v, kind: str, k: int) -> ArgumentError:
    """The error for a (verifier, law, K) the verifier is not lossless for; names what would work."""
    ok = v.laws_for(k)
    krange = f"K >= {v.min_k}" if v.max_k is None else f"{v.min_k} <= K <= {v.max_k}"
    if ok:
        return ArgumentError("draft_law", f": verifier {v.name!r} is not lossless for the {kind!r} draft law with "
                                          f"{k} drafts per node; laws that work with {k} drafts: {', '.join(ok)}")
    return ArgumentError("k", f": verifier {v.name!r} is not lossless with {k} drafts per node "
                              f"(it supports laws {', '.join(v.laws)} with {krange})")


def _verifier(verifier):
    """None for the target alone (None or 'none'), else a Verifier (a registered name or an instance)."""
    if verifier is None or (isinstance(verifier, str) and verifier.strip().lower() == "none"):
        return None
    try:
        return _verifiers.get(verifier)
    except ValueError as exc:
        raise ArgumentError("verifier", f": {exc}, none") from None


def _mixed_rule(rule: str) -> None:
    """A decode with free sources (DESIGN.md "Draft sources") takes the token walk of any verifier
    lossless for the model's law (free drafts first at a node, ``trees.TokenWalk``); ``ArgumentError``
    for a sequence-level rule, with the reason its ``refusal`` gives (``trees.MIXED_REFUSALS``)."""
    if rule != WALK:
        raise ArgumentError("rule", f": {rule!r} does not verify mixed trees (free sources' copies beside the "
                                    f"model's drafts): {MIXED_REFUSALS.get(rule, 'it needs one q row per node')}; "
                                    f"use rule {WALK!r} (any verifier), or sources 'model'")


_SAMPLING = ("temperature", "top_k", "top_p", "max_new_tokens")  # fields a change checks alone


@dataclass(frozen=True, eq=False)
class Settings:
    """The one decode configuration: every model-free argument of a decode, checked and resolved
    once. Make it with :meth:`from_args` (the one constructor: ``generate``'s keyword settings, the
    CLI flags, the benchmarks' method grammar, a server request and ``custom_generate`` all go
    through it); change it with :meth:`derive`; read it with :meth:`describe` (the one schema of
    ``decode --json``, every result row and the server's ``speculative`` object).

    ``rule`` the tree rule object (``trees.TreeRule``) that verifies each step's tree: a
    ``trees.TokenWalk`` (the walk of a token-level verifier) or a sequence-level rule ('block',
    'traversal', ...); None for the target alone (no tree). ``law`` the draft law's kind
    (``drafts.LAW_KINDS``; None for the target alone); ``shape`` the tree shape (None for the
    target alone); ``k`` and ``depth`` as given (0 for the target alone; an explicit tree has its
    own sizes, ``shape.k`` and ``shape.depth``, which :meth:`describe` gives); ``sources`` the ordered
    draft sources (``decoding.sources``; empty for the target alone; today the draft model,
    whose ``temperatures`` are the draft temperatures, one per draft column).
    """

    rule: object
    law: str | None
    shape: TreeShape | None
    k: int
    depth: int
    temperature: float
    top_k: int | None
    top_p: float | None
    max_new_tokens: int
    sources: tuple = ()

    # --- what the fields imply ----------------------------------------------------------------
    @property
    def target_alone(self) -> bool:
        """True when the target decodes alone (no draft, no tree)."""
        return self.rule is None

    @property
    def free_only(self) -> bool:
        """True when free sources alone draft (``sources`` without 'model': prompt lookup, the
        suffix index): each step's tree is their chains only, no draft model runs (no draft
        prefill, no draft KV cache), and a step without a match is a plain target step."""
        return self.rule is not None and self.draft_model is None

    @property
    def uses_draft(self) -> bool:
        """Whether the draft model runs (False for the target alone and for free-only decoding)."""
        return self.draft_model is not None

    @property
    def rule_name(self) -> str | None:
        """The registered name of ``rule`` ('token_walk', 'block', ...; None for the target alone)."""
        return None if self.rule is None else self.rule.name

    @property
    def verifier(self):
        """The walk's token-level ``Verifier`` (None for the target alone and for a sequence-level
        rule, which reads no token-level verifier)."""
        if self.rule_name != WALK or self.free_only:  # free-only: the free-first rule reads no verifier
            return None
        return getattr(self.rule, "verifier", None)

    @property
    def draft_model(self):
        """The draft model's source (``sources.DraftModel``; None for the target alone)."""
        return next((src for src in self.sources if src.name == DraftModel.name), None)

    @property
    def draft_temps(self) -> tuple:
        """One draft temperature per draft column (empty for the target alone)."""
        dm = self.draft_model
        return dm.temperatures if dm is not None else ()

    @property
    def free_sources(self) -> tuple:
        """The free sources (``free = True``: prompt lookup, the suffix index), in order."""
        return tuple(src for src in self.sources if getattr(src, "free", False))

    @property
    def mixed(self) -> bool:
        """Whether each step's tree is a mixed tree: the model's tree plus free sources' chains
        (``trees.DraftTree.add_chains``), verified by the walk free drafts first (``trees.TokenWalk``)."""
        return bool(self.free_sources)

    @property
    def free_nodes(self) -> int:
        """The most nodes the free sources add to one step's tree (each source at most its
        ``depth``: lookup one chain, the suffix index a trie of at most ``depth`` nodes)."""
        return sum(src.depth for src in self.free_sources)

    @property
    def max_nodes(self) -> int:
        """The most nodes of one step's tree, root included (0 for the target alone): the shape's
        and the free sources'."""
        if self.rule is None:
            return 0
        return (1 if self.shape is None else self.shape.max_nodes()) + self.free_nodes

    @property
    def tree_law(self):
        """The ``trees.TreeLaw`` of this decode's full-depth trees (None for the target alone and
        for free-only decoding)."""
        if self.rule is None or self.shape is None:  # the target alone, free-only decoding (no model tree)
            return None
        return tree_law(self.shape, self.law, len(self.draft_temps))

    @property
    def chain(self) -> bool:
        """One draft per node (single-draft SD on a chain)."""
        return self.shape is not None and self.shape.mode == "paths" and self.shape.k == 1

    def tree_arg(self):
        """The tree as ``from_args`` takes it and ``describe`` writes it: None for the full K-ary
        tree of ``k`` and ``depth`` (and for the target alone), 'sequences', 'dynamic', or the
        explicit paths (a list of lists)."""
        s = self.shape
        if s is None or s.mode in ("sequences", "dynamic"):
            return None if s is None else s.mode
        if s.k == self.k and s.depth == self.depth and s.children == _trees.parse_tree(_trees.full_tree(self.k,
                                                                                                         self.depth)):
            return None
        return [list(p) for p in s.children if p]

    def describe(self) -> dict:
        """The one description of a decode configuration (``decode --json``, result rows, the
        server's ``speculative`` object): ``rule`` (registered name; None: the target alone),
        ``verifier`` (the walk's; None otherwise), ``law`` (None for the target alone), ``k``,
        ``depth`` (0 for the target alone), ``tree`` (:meth:`tree_arg`), ``max_nodes`` and
        ``min_gain`` (dynamic trees; else None), ``temperature``, ``draft_temperature`` (a number,
        a list for the independent law, None for the target alone), ``top_k``, ``top_p``,
        ``max_new_tokens`` and ``sources`` (the draft sources' names, in order)."""
        dyn = self.shape is not None and self.shape.mode == "dynamic"
        temps = self.draft_temps
        tree = self.tree_arg()
        explicit = tree if isinstance(tree, list) else None  # an explicit tree's sizes are its own
        return {
            "rule": self.rule_name,
            "verifier": self.verifier.name if self.verifier is not None else None,
            "law": self.law, "k": self.k if explicit is None else self.shape.k,
            "depth": self.depth if explicit is None else self.shape.depth, "tree": tree,
            "max_nodes": self.shape.budget if dyn else None, "min_gain": self.shape.min_gain if dyn else None,
            "temperature": self.temperature,
            "draft_temperature": (None if not temps else list(temps) if self.law == "independent" else temps[0]),
            "top_k": self.top_k, "top_p": self.top_p, "max_new_tokens": self.max_new_tokens,
            "sources": [src.describe() for src in self.sources],
        }

    def _key(self) -> tuple:
        d = self.describe()
        return tuple((k, tuple(map(tuple, v)) if k == "tree" and isinstance(v, list) else
                      tuple(v) if isinstance(v, list) else v) for k, v in d.items())

    def __eq__(self, other) -> bool:
        return isinstance(other, Settings) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    # --- the one constructor --------------------------------------------------------------------
    @classmethod
    def from_args(cls, *, verifier=_UNSET, k=_UNSET, depth=_UNSET, draft_law=None, tree=None, temperature=1.0,
                  draft_temperature=None, top_k=None, top_p=None, max_new_tokens=128, max_nodes=None,
                  min_gain=None, rule=None, sources=None) -> "Settings":
        """Check every argument of ``generate`` that needs no model, each once; ``ArgumentError``
        naming the first bad one.

        ``draft_law=None`` means the law the verifier implies (``Verifier.implied_law``;
        'independent' when ``draft_temperature`` is a list). ``tree="dynamic"``: ``k`` is the most
        drafts per node, ``depth`` the largest depth, ``max_nodes`` (default 16) the node budget
        per step, root included, and ``min_gain`` (default 0) the least value (reach x coverage
        increment, in expected tokens) for which a draft is granted; the verifier must be
        lossless for the law at every k in 2..k.

        ``rule`` (default None: 'token_walk', the walk of ``verifier``, default 'specinfer') names
        the tree rule that verifies each step's tree (``decoder_rules()``). A sequence-level rule
        ('block', 'traversal', ...) reads no token-level verifier, so ``verifier`` must not be
        given with it; ``draft_law`` then defaults to 'iid', and the rule must be lossless for the
        decoder's tree law (``tree_law``: chain, sequences, kary / explicit paths or dynamic,
        decided by ``rule.supports``), else ``ArgumentError`` naming ``rule`` and what would work.
        'tree_lp' (small V only) is refused. ``sources`` the draft sources' names
        (``decoding.sources.SOURCE_NAMES``; default: the draft model alone).

        Free-only decoding (``sources`` without 'model', e.g. ``"lookup"``, ``"suffix"``,
        ``"lookup,suffix"``; vLLM's ``ngram`` method, transformers' ``prompt_lookup_num_tokens``):
        no draft model runs; each step's tree is the free sources' chains alone (each source to
        its own depth), verified by the token walk's free-first rule (``trees.TokenWalk``): at a
        node with copies x_1..x_m and target p, x_i is output with probability r_(i-1)(x_i)
        (r_0 = p, r_i = r_(i-1) with x_i zeroed, renormalised), else a token is drawn from r_m.
        That is exact for the target's law and reads no token-level verifier, draft law or draft
        temperature; with no match the step is one plain target step (one token from p). So
        ``verifier``, ``k``, ``depth``, ``draft_law``, ``tree``, ``draft_temperature``,
        ``max_nodes``, ``min_gain`` and a sequence-level ``rule`` (the draft model's tree) are
        refused with it (``ArgumentError`` naming the first given); ``verifier=None`` is still
        the target alone. The settings have ``rule`` the walk, ``law`` and ``shape`` None,
        ``k = depth = 0`` (:attr:`free_only`).
        """
        temperature = as_temperature(temperature, "temperature")
        top_k = as_top_k(top_k, "top_k")
        top_p = as_top_p(top_p, "top_p")
        max_new_tokens = as_int(max_new_tokens, "max_new_tokens", minimum=1)
        rule = _rule_name(rule)
        if rule != WALK:
            if verifier is not _UNSET and verifier is not None:
                raise ArgumentError("verifier", f": rule {rule!r} verifies whole paths and reads no token-level "
                                                f"verifier; drop verifier, or use rule {WALK!r} (the walk of a verifier)")
            v = None
        else:
            v = _verifier("specinfer" if verifier is _UNSET else verifier)
            if v is None:
                return cls(None, None, None, 0, 0, temperature, top_k, top_p, max_new_tokens)
        names = parse_sources(sources)
        if DraftModel.name not in names:
            return cls._free_only(names, rule, temperature, top_k, top_p, max_new_tokens, dict(
                verifier=verifier, k=k, depth=depth, draft_law=draft_law, tree=tree,
                draft_temperature=draft_temperature, max_nodes=max_nodes, min_gain=min_gain))
        K = as_k(2 if k is _UNSET else k, "k")
        L = as_int(4 if depth is _UNSET else depth, "depth", minimum=1)
        listed = isinstance(draft_temperature, (list, tuple))
        dynamic = isinstance(tree, str) and tree == "dynamic"
        if max_nodes is not None:
            if not dynamic:
                raise ArgumentError("max_nodes", f"applies only to tree='dynamic', got tree={tree!r}")
            max_nodes = as_int(max_nodes, "max_nodes", minimum=2)  # its bound is TreeShape's (MAX_DYNAMIC_NODES)
        if min_gain is not None:
            if not dynamic:
                raise ArgumentError("min_gain", f"applies only to tree='dynamic', got tree={tree!r}")
            try:
                min_gain = float(min_gain)
            except (TypeError, ValueError):
                raise ArgumentError("min_gain", f"must be a number in [0, 1), got {min_gain!r}") from None
            if not 0 <= min_gain < 1:
                raise ArgumentError("min_gain", f"must be in [0, 1) (a draft is worth at most one token), got {min_gain}")
        try:
            shape = TreeShape.from_args(tree, K, L, max_nodes, min_gain or 0.0)
        except ArgumentError:  # a size bound (k or depth), named as such
            raise
        except ValueError as exc:
            raise ArgumentError.of("tree", exc) from None
        kind = None if draft_law is None else _drafts.law_kind(draft_law, "draft_law")
        if dynamic and (listed or kind == "independent"):
            raise ArgumentError("draft_law", ": tree='dynamic' supports the iid, wor and greedy laws, not "
                                             "'independent' (a list of draft temperatures)")
        if kind is None and listed:
            kind = "independent"
        elif kind is None and v is None:  # a sequence-level rule: i.i.d. drafts unless a law is named
            kind = "iid"
        elif kind is None:  # the law the verifier implies at the largest node (Verifier.implied_law)
            try:
                kind = v.implied_law(shape.k)
            except ValueError as exc:  # the verifier takes no law at this K
                raise ArgumentError.of("k", exc) from None

        if draft_temperature is None:
            temps = [temperature]
        elif listed:
            if kind != "independent":  # a law named with a list ('iid' included): refused, never overridden
                raise ArgumentError("draft_temperature", f": a list (one temperature per draft) means the independent "
                                                         f"law, not the {draft_law!r} law; drop one of them")
            if len(draft_temperature) != K:
                raise ArgumentError("draft_temperature", f"has {len(draft_temperature)} entries but k = {K}; "
                                                         "give one per draft")
            temps = [as_temperature(t, "draft_temperature") for t in draft_temperature]
            kind = "independent"
        else:
            temps = [as_temperature(draft_temperature, "draft_temperature")]
        if kind == "independent" and len(temps) == 1:
            temps = temps * K

        if shape.mode == "paths" and tree is not None and kind == "independent" and shape.k > len(temps):
            raise ArgumentError("tree", f"has a node with {shape.k} children but only {len(temps)} draft temperatures")
        if shape.mode == "sequences":
            ks = {shape.k}
        elif shape.mode == "dynamic":
            ks = set(range(1, shape.k + 1))  # the allocator may choose any k <= K
        else:
            ks = {n for n in shape.children.values() if n > 0}
        srcs = tuple(DraftModel(tuple(temps)) if n == DraftModel.name else free_source(n) for n in names)
        if any(src.free for src in srcs):
            _mixed_rule(rule)
        if v is None:
            _check_rule(rule, shape, kind, len(temps))
            obj = _trees.get(rule)
        else:
            allowed = node_ks(v, kind, max(ks, default=1))
            for n in sorted(ks):
                if n not in allowed:
                    raise _unsupported(v, kind, n)
            obj = _trees.TokenWalk(v, kind)
        return cls(obj, kind, shape, K, L, temperature, top_k, top_p, max_new_tokens, srcs)

    @classmethod
    def _free_only(cls, names, rule: str, temperature, top_k, top_p, max_new_tokens, model_args: dict) -> "Settings":
        """The settings of free-only decoding (``from_args`` notes): ``ArgumentError`` naming the first
        draft-model argument given (``_UNSET`` / None: not given)."""
        if rule != WALK:
            raise ArgumentError("rule", f": {rule!r} verifies the draft model's trees; sources {','.join(names)!r} "
                                        "(no 'model') make trees of free copies alone, verified by the token walk's "
                                        "free-first rule: drop rule, or add 'model' to sources")
        for name, value in model_args.items():
            if value is not _UNSET and value is not None:
                raise ArgumentError(name, f"applies to the draft model's drafts; sources {','.join(names)!r} (no "
                                          "'model') draft with free sources alone (free-first walk, no verifier, "
                                          "law or tree sizes): drop it, or add 'model' to sources")
        walk = _trees.TokenWalk("specinfer", "iid")  # only its free-first rule runs: free-only nodes have no model drafts
        return cls(walk, None, None, 0, 0, temperature, top_k, top_p, max_new_tokens,
                   tuple(free_source(n) for n in names))

    @staticmethod
    def args_of(description: dict) -> dict:
        """The keyword arguments of :meth:`from_args` that a :meth:`describe` dict stands for (the
        law and the draft temperatures as resolved), so ``from_args(**args_of(s.describe())) == s``."""
        d = description
        if d.get("rule") is None:
            return dict(verifier=None, **{f: d[f] for f in _SAMPLING})
        if DraftModel.name not in d["sources"]:  # free-only decoding: the sources and the sampling fields
            return dict(sources=d["sources"], **{f: d[f] for f in _SAMPLING})
        who = dict(verifier=d["verifier"]) if d["rule"] == WALK else dict(rule=d["rule"])
        args = dict(**who, k=d["k"], depth=d["depth"], draft_law=d["law"], tree=d["tree"],
                    draft_temperature=d["draft_temperature"], sources=d["sources"], **{f: d[f] for f in _SAMPLING})
        if d["tree"] == "dynamic":
            args.update(max_nodes=d["max_nodes"], min_gain=d["min_gain"])
        return args

    def derive(self, **changes) -> "Settings":
        """These settings with ``changes`` (keyword arguments of :meth:`from_args`).

        Changes of the sampling fields alone (``temperature``, ``top_k``, ``top_p``,
        ``max_new_tokens``, and a single ``draft_temperature`` under a law with one draft
        temperature) are applied to this resolved object, each changed field checked alone (a
        server request's temperature is one check, not a new settings call); the draft
        temperatures do not follow ``temperature`` unless given. Any other change (the rule,
        verifier, tree, sizes, law, sources) is checked as one new :meth:`from_args` call, since
        it may change what the rest means. ``verifier=None`` gives the target alone at the same
        sampling settings (whatever the rule); ``verifier=NAME`` the walk of that verifier."""
        unknown = set(changes) - set(_FROM_ARGS)
        if unknown:
            raise TypeError(f"derive() got unknown settings {sorted(unknown)}")
        sampling = set(changes) <= set(_SAMPLING) | {"draft_temperature"}
        dt = changes.get("draft_temperature")
        if sampling and (dt is None or (not isinstance(dt, (list, tuple)) and self.law != "independent")):
            new = {}
            for name in set(changes) & set(_SAMPLING):
                new[name] = _CHECK[name](changes[name], name)
            if "draft_temperature" in changes and self.sources:  # None: the draft follows the temperature, as in from_args
                t = new.get("temperature", self.temperature) if dt is None else as_temperature(dt, "draft_temperature")
                new["sources"] = tuple(dataclasses.replace(src, temperatures=(t,) * len(src.temperatures))
                                       if src.name == DraftModel.name else src for src in self.sources)
            return dataclasses.replace(self, **new)
        args = self.args_of(self.describe())
        if "verifier" in changes and "rule" not in changes:
            args.pop("rule", None)
            if changes["verifier"] is None:
                return Settings.from_args(**{k: v for k, v in {**args, **changes}.items()
                                             if k in ("verifier",) + _SAMPLING})
        elif "rule" in changes and changes["rule"] not in (None, WALK):
            args.pop("verifier", None)
        if "sources" in changes and DraftModel.name not in parse_sources(changes["sources"]):
            # to free-only decoding: this object's draft-model arguments are not carried (only those changed)
            args = {k: v for k, v in args.items() if k in ("sources",) + _SAMPLING}
        return Settings.from_args(**{**args, **changes})


_CHECK = {"temperature": as_temperature, "top_k": as_top_k, "top_p": as_top_p,
          "max_new_tokens": lambda x, name: as_int(x, name, minimum=1)}
_FROM_ARGS = ("verifier", "k", "depth", "draft_law", "tree", "temperature", "draft_temperature", "top_k", "top_p",
              "max_new_tokens", "max_nodes", "min_gain", "rule", "sources")


def settings_or_kwargs(settings, kwargs: dict, what: str = "a multidraft.decoding.Settings (Settings.from_args(...))"):
    """The ``Settings`` of a decoding call given either a ``Settings`` or keyword settings (never
    both): ``Settings.from_args(**kwargs)`` when ``settings`` is None. ``what`` names what
    ``settings`` may be in the error."""
    if settings is None:
        return Settings.from_args(**kwargs)
    if not isinstance(settings, Settings):
        raise ArgumentError("settings", f"must be {what} or None, got {type(settings).__name__}")
    if kwargs:
        raise ArgumentError("settings", f": give a Settings or keyword settings, not both (got {', '.join(sorted(kwargs))})")
    return settings
