"""``--tree auto``: the draft tree a decode uses, chosen by cost; the one home of that choice.

``multidraft decode``, ``multidraft serve`` and ``benchmarks/decode_speed.py`` (``V:auto:K``)
all go through here, in two steps:

1. :func:`check_auto` (no model): the request (:class:`AutoRequest`: the cost profile written
   by ``multidraft profile``, its statistic, the acceptance statistics file, the bounds of the
   tree) checked against the resolved :class:`~multidraft.decoding.settings.Settings`, giving
   an :class:`Auto`: the profile with its points by the statistic, the numbers of drafts per
   node the rule takes (``node_ks``, all <= ``settings.k``; a sequence-level rule: the node
   sizes it supports, ``settings.rule_node_ks``, rated with the ``AUTO_PROXY`` walk's i.i.d.
   acceptances) and, when a file gives them, the acceptance statistics.
2. :func:`choose` (the models loaded): the acceptances (from the file, else a warm-up decode),
   ``treeopt.choose_tree`` on them, and the decision: the best tree, or the target alone when
   no tree is predicted faster (``force_tree`` keeps the best tree anyway).

The warm-up rule (one for every caller): a K-ary tree of depth 2 decodes
``warmup_tokens`` tokens (default :data:`WARMUP_TOKENS`) of the prompt ids the caller gives
(``decode``: the prompt it is about to decode; ``serve``: ``--warmup-prompt`` or its default
prompt; the benchmark: a held-out prompt of the set it times), stopping at the decode's
end-of-sequence tokens, with its own seed stream ``derive_seed(seed, "tree-auto-warmup")`` (so
the choice is independent of the decode's randomness and the decode stays lossless).

Free sources alone (``settings.free_only``: prompt lookup, the suffix index, no draft model) have
no model tree to choose: ``--tree auto`` then means each step's free chains cut by cost from the
profile (``decoding.sources.budget.FreeBudget``, which ``generate(cost_profile=...)`` and the
batch decoder build whenever free sources draft): a copied token is proposed only while its
measured chance of adding a token over the root, g_j, pays for the wider target pass,
``(1 + sum_{j <= L} g_j) / c(1 + m_L)`` at its largest over the chain's depth L (L = 0: a plain
target step). :func:`check_auto` then reads the profile alone and refuses the fields that rate a
model tree (``accept_stats``, ``accept_dataset``, ``warmup_tokens``, ``force_tree``, ``max_nodes``,
``max_depth``); :func:`choose` gives no tree and the settings stay free-only.

Acceptance statistics files come in two kinds: an ``AcceptStats`` JSON, or a study's
acceptance JSONL (``multidraft experiment paper|acceptance``). Reading the study's format is
the experiments' business (``experiments.acceptance.tree_acceptance``), so the caller passes the
reader in (``read_acceptance``); this module knows neither experiments nor the command line, and
prints nothing (messages go to the caller's ``log``).

Every mistake is an ``ArgumentError`` naming the request's field (``profile``,
``profile_statistic``, ``accept_stats``, ``accept_dataset``, ``warmup_tokens``, ``max_nodes``,
``max_depth``; ``rule``), which the command line restates with its flag.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from .._errors import ArgumentError
from .treeopt import MAX_DEPTH, MAX_NODES, AcceptStats, CostProfile, choose_tree

__all__ = ["AutoRequest", "Auto", "check_auto", "choose", "load_profile", "WARMUP_TOKENS", "WARMUP_PURPOSE"]

WARMUP_TOKENS = 32                  # tokens of the warm-up decode that measures per-node acceptance
WARMUP_PURPOSE = "tree-auto-warmup"  # its seed stream: derive_seed(seed, WARMUP_PURPOSE)


@dataclass(frozen=True)
class AutoRequest:
    """What a ``--tree auto`` decode asks for (the model-free inputs of :func:`check_auto`).

    ``profile`` the cost profile JSON (required); ``profile_statistic`` recomputes its points
    from the kept samples ('median', 'mean', 'min', or 'stored': as written; None: the median
    where the profile keeps samples, else its points as stored); ``accept_stats`` an acceptance
    statistics file (None: a warm-up decode of ``warmup_tokens``) and ``accept_dataset`` the
    data set to take from a study with several; ``max_nodes`` / ``max_depth`` bound the tree
    (root included); ``force_tree`` decodes with the best tree even when it is predicted slower
    than the target alone; ``seed`` the decode's seed (the warm-up's stream is derived from it);
    ``engine`` / ``dtype`` what the decode runs on (only compared with the profile's, in a note).
    """

    profile: str | Path | None
    profile_statistic: str | None = None
    accept_stats: str | Path | None = None
    accept_dataset: str | None = None
    warmup_tokens: int | None = None
    max_nodes: int = MAX_NODES
    max_depth: int = MAX_DEPTH
    force_tree: bool = False
    seed: int = 0
    engine: str = "transformers"
    dtype: str | None = None


@dataclass(frozen=True)
class Auto:
    """A checked request (:func:`check_auto`): ``profile`` with its points by the statistic,
    ``ks`` the numbers of drafts per node the tree may have, ``rater`` the verifier whose walk's
    acceptances rate the trees, ``stats`` / ``along`` the acceptances from the file (None
    without one: :func:`choose` measures them with a warm-up decode)."""

    request: AutoRequest
    profile: CostProfile
    ks: tuple
    rater: str
    stats: AcceptStats | None = None
    along: dict | None = None
    free_only: bool = False  # free sources alone: no model tree; the profile cuts the free chains (module notes)

    @property
    def warmup_tokens(self) -> int:
        return WARMUP_TOKENS if self.request.warmup_tokens is None else self.request.warmup_tokens


def load_profile(path, statistic: str | None = None) -> CostProfile:
    """The cost profile JSON at ``path`` (``multidraft profile``), its points recomputed from its
    kept samples by ``statistic`` ('median', 'mean', 'min', 'stored'; None: the median where it
    keeps samples, else its points as stored). ``ArgumentError`` naming ``profile`` or
    ``profile_statistic``; the one reader of a profile file (``--tree auto``, paced methods)."""
    try:
        text = Path(path).expanduser().read_text(encoding="utf-8")
    except OSError as exc:
        raise ArgumentError("profile", f": cannot read {path}: {exc.strerror or exc}") from None
    try:
        profile = CostProfile.from_json(text)
    except ValueError as exc:
        raise ArgumentError("profile", f": {path}: {exc}") from None
    stat = statistic or "median"
    try:   # the default takes a profile without samples as stored
        return profile.with_statistic(stat, strict=statistic is not None)
    except ValueError as exc:
        raise ArgumentError("profile_statistic", f" {stat}: {path}: {exc}") from None


def check_auto(request: AutoRequest, settings, *, read_acceptance: Callable | None = None) -> Auto:
    """The request checked against ``settings`` (a resolved ``Settings``) before any model loads.

    ``read_acceptance(path, *, verifier, law, ks, t_target, t_draft, dataset) -> (stats, along)``
    reads ``request.accept_stats`` (``experiments.acceptance.tree_acceptance``: a study JSONL or
    an ``AcceptStats`` JSON; its ValueError is restated as one of ``accept_stats``); needed only
    with a file.
    """
    from .settings import AUTO_PROXY, node_ks, rule_node_ks
    from ..verifiers import get as get_verifier

    r = request
    if r.profile is None:
        raise ArgumentError("profile", "FILE is needed by --tree auto (write one with `multidraft profile --out FILE`)")
    if not 2 <= r.max_nodes <= MAX_NODES:
        raise ArgumentError("max_nodes", f"must be in [2, {MAX_NODES}], got {r.max_nodes}")
    if not 1 <= r.max_depth <= MAX_DEPTH:
        raise ArgumentError("max_depth", f"must be in [1, {MAX_DEPTH}], got {r.max_depth}")
    if r.warmup_tokens is not None and r.warmup_tokens < 1:
        raise ArgumentError("warmup_tokens", f"must be >= 1, got {r.warmup_tokens}")
    if r.accept_dataset is not None and r.accept_stats is None:
        raise ArgumentError("accept_dataset", "needs --accept-stats FILE (a study's acceptance JSONL)")
    profile = load_profile(r.profile, r.profile_statistic)
    if settings.free_only:
        _check_free_only(r, settings)
        return Auto(r, profile, (), "", free_only=True)
    v = settings.verifier
    if v is None:  # a sequence-level rule: the node sizes it supports, rated by the AUTO_PROXY walk
        if settings.law != "iid":
            raise ArgumentError("rule", f": --tree auto rates trees with the {AUTO_PROXY} walk's i.i.d. acceptances; "
                                        f"rule {settings.rule_name!r} with the {settings.law!r} law has none: use --draft-law iid")
        ks = rule_node_ks(settings.rule_name, settings.law, settings.k)
        if not ks:
            raise ArgumentError("rule", f": {settings.rule_name!r} takes no K-ary tree with K <= {settings.k} "
                                        "(--tree auto chooses among such trees); use a fixed --tree")
        v = get_verifier(AUTO_PROXY)
    else:
        ks = node_ks(v, settings.law, settings.k)
    stats = along = None
    if r.accept_stats is not None:
        if read_acceptance is None:
            raise ValueError("read_acceptance: needed to read accept_stats (experiments.acceptance.tree_acceptance)")
        td = settings.draft_temps   # per-draft temperatures: the study row's is the target's
        td = td[0] if len(set(td)) == 1 else settings.temperature
        try:
            stats, along = read_acceptance(r.accept_stats, verifier=v.name, law=settings.law, ks=ks,
                                           t_target=settings.temperature, t_draft=td, dataset=r.accept_dataset)
        except ValueError as exc:
            raise ArgumentError("accept_stats", f": {exc}") from None
    return Auto(r, profile, tuple(ks), v.name, stats, along)


def _check_free_only(r: AutoRequest, settings) -> None:
    """``ArgumentError`` naming the first field of ``r`` that rates or bounds a model tree
    (free sources alone have none; module notes)."""
    names = ",".join(src.name for src in settings.sources)
    given = [("accept_stats", r.accept_stats is not None), ("accept_dataset", r.accept_dataset is not None),
             ("warmup_tokens", r.warmup_tokens is not None), ("force_tree", bool(r.force_tree)),
             ("max_nodes", r.max_nodes != MAX_NODES), ("max_depth", r.max_depth != MAX_DEPTH)]
    for name, on in given:
        if on:
            raise ArgumentError(name, f"rates or bounds the draft model's tree; sources {names!r} (no 'model') have "
                                      "none: --tree auto then cuts each step's free chains by cost from the profile "
                                      "alone (acceptances measured as the decode goes): drop it, or add 'model' to "
                                      "sources")


def choose(target, draft, ids, settings, auto: Auto, eos=None, log: Callable | None = None):
    """The tree to decode with: ``(paths or None, info)``; None means the target alone.

    ``ids`` the warm-up prompt ``[1, T]`` (used only when ``auto`` has no acceptance
    statistics: the warm-up rule of the module notes), ``eos`` the decode's end-of-sequence
    token id(s) or None, ``log`` a callable taking one line (the choice, the profile's points,
    notes), or None. ``info`` is the JSON object ``decode --json`` writes as
    ``settings.auto``: ``treeopt.Choice.to_dict()`` with the statistics, the profile's facts and
    ``decoded_with`` ('tree' or 'target-only') and ``forced``. Free sources alone
    (``auto.free_only``): ``(None, info)`` at once, no warm-up and no model run, ``decoded_with``
    'free-chains-by-cost' (the settings stay free-only; the caller decodes with
    ``cost_profile=auto.profile``).
    """
    from .._validate import derive_seed
    from ..trees import full_tree
    from .engine import generate
    from .settings import AUTO_PROXY

    r = auto.request
    profile, stats, along, ks = auto.profile, auto.stats, auto.along, list(auto.ks)
    facts = {"profile": str(r.profile), "profile_statistic": profile.statistic,
             "target_seconds_1": profile.target_seconds(1), "per_step_seconds": profile.per_step_seconds,
             "per_node_seconds": profile.per_node_seconds}
    if auto.free_only:
        if log is not None:
            log(f"--tree auto with free sources alone: no model tree to choose; each step's free chains are cut by "
                f"cost from {r.profile} ({profile.statistic}; depth 0: a plain target step)")
        return None, {"decoded_with": "free-chains-by-cost", **facts}
    if stats is None:
        records: list = []
        warmup = settings.derive(depth=2, tree=full_tree(settings.k, 2), max_new_tokens=auto.warmup_tokens,
                                 **({} if settings.verifier is not None else {"verifier": AUTO_PROXY, "rule": None}))
        generate(target, draft, ids, warmup, eos_token_id=eos,
                 generator=derive_seed(r.seed, WARMUP_PURPOSE), node_log=records)
        if not records:
            raise ValueError("--tree auto: the warm-up decode verified no tree node (it stopped at once); "
                             "give --accept-stats FILE or a longer prompt")
        stats = AcceptStats.from_records(records, max_k=settings.k, source=f"warm-up decode, {len(records)} nodes")
    usable = [k for k in ks if k in stats.accept]
    if not usable:
        raise ArgumentError("accept_stats", f": no statistics for any k the verifier takes here ({ks}); "
                                            f"have {list(stats.ks)}")
    stats = stats.restrict(usable)
    choice = choose_tree(profile, stats, max_nodes=r.max_nodes, max_depth=r.max_depth, along=along)
    use = choice.tree is not None and (choice.pays or r.force_tree)
    info = {**choice.to_dict(), "accept_stats": stats.to_dict(), **facts,
            "decoded_with": "tree" if use else "target-only", "forced": bool(r.force_tree and not choice.pays)}
    if log is not None:
        _log_choice(log, r, profile, stats, choice, use)
    return (choice.tree.paths if use else None), info


def _log_choice(log, r: AutoRequest, profile: CostProfile, stats: AcceptStats, choice, use: bool) -> None:
    pe = profile.meta.get("engine", "transformers")
    pm = profile.meta.get("dtype")
    if pe != r.engine:
        log(f"tree auto: note: the profile was measured on {pe}, decoding on {r.engine}")
    elif pm and r.engine == "transformers" and r.dtype is not None and pm != r.dtype:
        log(f"tree auto: note: the profile was measured in {pm}, decoding in {r.dtype}")
    log(f"tree auto: acceptance from {stats.source} ({choice.model} model); profile points: "
        f"{profile.statistic or 'as stored'} (target forward {1e3 * profile.target_seconds(1):.1f} ms; decoder's own "
        f"time {1e3 * profile.per_step_seconds:.1f} ms a step + {1e3 * profile.per_node_seconds:.2f} ms a node)")
    base = choice.target_only_tokens_per_s
    t = choice.tree
    if t is not None:
        log(f"tree auto: best tree {t.nodes} nodes, depth {t.depth}, E[tokens/step] {t.expected_tokens:.3f}, "
            f"predicted {t.tokens_per_s:.2f} tok/s vs target-only {base:.2f} tok/s ({choice.speedup:.2f}x): "
            f"{json.dumps(t.paths, separators=(',', ':'))}")
    if not choice.pays:
        log("tree auto: no tree beats the target alone under this profile; "
            + ("decoding with the best tree anyway (--force-tree)" if use else
               "decoding target-only (--force-tree decodes with the best tree)"))
