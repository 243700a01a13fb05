"""The one decode runner behind every end-to-end table: the demo, the blocks stage and the
decode-speed benchmark.

A **method** (:class:`MethodSpec`) is a label and the ``decoding.Settings`` one decode run
decodes with (the target alone, or a draft tree verified by the walk of a token-level verifier
or by a sequence-level tree rule), or a peer (a callable that decodes one prompt its own way,
e.g. ``transformers``' assisted generation or llama.cpp's binaries; see
``benchmarks/decode_speed.py``). Methods are made by :func:`target_alone`, :func:`tree_method`,
:func:`peer_method` or the short grammar of :func:`parse_method`, each through
``Settings.from_args``.

:func:`run` decodes every prompt with every method, **interleaved** (for each prompt, every
method in turn; with ``rounds`` > 1 each prompt is decoded ``rounds`` times, the method order
reversed every other round), so slow phases of a shared machine hit every method alike.
The work comes in **units** (prompt, round): every method once on one prompt. By default a
prompt's rounds follow each other (prompt-major); ``rounds_first=True`` runs round 0 of every
prompt, then round 1, ... (round-major: a run cut by its time budget still covers every prompt
once). Each unit gets one ``PromptCache`` (prompt-major: each prompt): its prefill runs once
per model and is shared by every method (and left out of tokens/s). ``skip_unit`` leaves out
the units a resumed file already holds for every method (:func:`complete_units`).

**One seed rule** (:func:`run_seed`): the run of method m on prompt ``pid`` draws everything
from ``torch.Generator().manual_seed(derive_seed(seed, pid, name, law, K, depth, rule="unit"))``
(``name`` the walk's verifier or the sequence-level rule; for the target alone
``SEED_TARGET_ALONE`` with law ``-`` and K = depth = 0). It depends on that run's identity alone,
never on the order or on the other methods, so a run can be resumed, reordered or rerun alone
with the same tokens; every round of a run repeats its tokens (only the timing differs).
Methods that differ only in the tree shape (a full tree and ``sequences`` of the same K and
depth) share the seed: a paired comparison. This is the rule the blocks stage always used, so
``docs/results/paper/blocks.jsonl`` reproduces.

**One row schema** (:func:`run_row`; every row through :class:`.records.JsonlWriter`, which
adds the run id and the code version and whose meta row holds the config, seed and
versions): ``kind="run"``, ``method`` (label), ``method_kind`` (``target``, ``tree``, ``auto``
or a peer's kind), then the settings' one description (``Settings.describe()``: ``rule``,
``verifier``, ``law``, ``k``, ``depth``, ``tree``, ``max_nodes``, ``min_gain``,
``temperature``, ``draft_temperature``, ``top_k``, ``top_p``, ``max_new_tokens``, ``sources``;
the target alone is ``rule`` None), ``auto`` (the facts of an automatically chosen tree), then
``prompt``, ``prompt_tokens``, ``round``, ``seed``, ``new_tokens``, ``target_calls``,
``draft_calls``, ``tree_tokens``, ``block_efficiency``, ``acceptance_rate`` (None for the
target alone), ``seconds``, ``tokens_per_s``, ``prefill_seconds``, ``stop_reason``, ``tokens``
(the generated ids; a peer's rows have none, and carry its own ``k`` and ``depth``, e.g.
llama-speculative's parallel drafts and draft length). Rows written before this schema
(``K``, ``verifier: "autoregressive"``, ``law: "-"``) are read in it (``records.read_jsonl``).
The blocks key (``verifier, rule, law, k, depth, temperature, prompt``) is a subset.

**One summary** (:func:`summarize`, :func:`format_table`): per method, rounds pooled per
prompt first (:func:`merge_rounds`), then pooled over prompts: block efficiency (new tokens /
target calls) with the per-prompt mean and its 95% t-interval, acceptance, tokens/s pooled and
per-prompt mean ± 95%, the speed-up over the reference (the target alone unless named)
pooled and paired per prompt with its 95% interval, tree tokens per pass and ms per step.
"""
from __future__ import annotations

import dataclasses
import json
import re
import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from .. import verifiers as _verifiers
from ..decoding import PromptCache, Settings, generate
from ..decoding.settings import WALK, decoder_rules
from ..decoding.sources import SOURCE_NAMES, DraftModel
from .findings import mean_ci  # the one summary of rows (also the report's)
from .records import finite_number
from .._validate import derive_seed

__all__ = [
    "MethodSpec", "target_alone", "tree_method", "peer_method", "parse_method", "check_methods", "run_seed", "run",
    "RunOutcome", "run_row", "warm_up", "merge_rounds", "mean_ci", "paired_ratio", "same_tree", "rules_against_walks",
    "round_spread", "summarize", "format_table", "SEED_TARGET_ALONE", "complete_units", "first_difference",
]

# The name a target-alone run's seed is derived with (``run_seed``): the spelling of the rows
# before the one description (``Settings.describe``), kept in the seed key alone so that every
# committed run reproduces; no row or table spells the target alone this way any more.
SEED_TARGET_ALONE = "autoregressive"
_MAX_NEW_TOKENS = 128  # a method's settings before the run gives its max_new_tokens (``run``)
FREE_SOURCES = tuple(n for n in SOURCE_NAMES if n != DraftModel.name)  # the methods of free sources alone


@dataclass(frozen=True)
class MethodSpec:
    """One decoding method: a label, the ``decoding.Settings`` it decodes with (the one decode
    configuration, ``settings.describe()`` in every row), and what is not decoding.

    ``kind``: None for the library's decoder (``method_kind`` 'target' or 'tree'), 'auto' for a
    tree chosen later from a cost profile (``settings`` is then a placeholder of the verifier or
    rule and K until :meth:`chosen` gives the tree), or a peer's kind. ``peer``: a callable
    ``peer(prompt_id, input_ids, seed) -> dict`` of measurements (``new_tokens``,
    ``target_calls``, ``draft_calls``, ``seconds``, ``block_efficiency``, ``acceptance_rate``)
    for methods that are not this library's decoder; a peer's ``settings`` is the target alone
    at its sampling settings, and ``facts`` its own sizes (``(("k", 2), ("depth", 4))``), which
    its rows carry. ``info``: facts of an automatically chosen tree (the rows' ``auto``).
    """

    label: str
    settings: Settings
    kind: str | None = None
    peer: Callable | None = field(default=None, compare=False, repr=False)
    info: dict | None = field(default=None, compare=False, repr=False)
    facts: tuple = ()
    paced: bool = False  # decoded with the run's cost profile (generate(cost_profile=): decoding.pace)

    @property
    def target_alone(self) -> bool:
        """The target decodes alone (no draft, no tree), and not by a peer."""
        return self.settings.target_alone and self.peer is None

    @property
    def method_kind(self) -> str:
        if self.kind is not None:
            return self.kind
        return "target" if self.settings.target_alone else "tree"

    def chosen(self, paths, info: dict) -> "MethodSpec":
        """An 'auto' method with its tree chosen: the explicit ``paths`` and the choice's facts."""
        return dataclasses.replace(self, settings=self.settings.derive(tree=[list(p) for p in paths]), info=info)

    def describe(self) -> dict:
        """The method's columns of a row: its label and kind, then ``Settings.describe()`` (a peer's
        own ``facts`` over it; an automatically chosen tree's ``auto`` facts)."""
        d = {"method": self.label, "method_kind": self.method_kind, **self.settings.describe(), **dict(self.facts)}
        if self.info is not None:
            d["auto"] = self.info
        if self.paced:
            d["paced"] = True
        return d


def target_alone(label: str = "target-only", *, temperature: float = 1.0, top_k=None, top_p=None) -> MethodSpec:
    return MethodSpec(label, Settings.from_args(verifier=None, temperature=temperature, top_k=top_k, top_p=top_p,
                                                max_new_tokens=_MAX_NEW_TOKENS))


def tree_method(label: str, verifier: str | None, k: int, depth: int, *, rule: str | None = None,
                **settings) -> MethodSpec:
    """A draft tree verified by the walk of ``verifier`` or, with ``rule`` (and ``verifier`` None),
    by a sequence-level tree rule; ``settings`` the other keyword settings of
    ``Settings.from_args`` (``law`` is its ``draft_law``), resolved here (ValueError naming the
    first bad one)."""
    if "law" in settings:
        settings["draft_law"] = settings.pop("law")
    who = {"rule": rule} if rule not in (None, WALK) else {}
    if verifier is not None or not who:
        who["verifier"] = verifier
    settings.setdefault("max_new_tokens", _MAX_NEW_TOKENS)
    return MethodSpec(label, Settings.from_args(**who, k=k, depth=depth, **settings))


def peer_method(label: str, kind: str, peer: Callable | None = None, *, temperature: float = 1.0, k: int = 0,
                depth: int = 0) -> MethodSpec:
    """A method decoded by a peer (``peer``; None until bound), with its own sizes ``k`` and ``depth``."""
    s = Settings.from_args(verifier=None, temperature=temperature, max_new_tokens=_MAX_NEW_TOKENS)
    return MethodSpec(label, s, kind=kind, peer=peer, facts=(("k", int(k)), ("depth", int(depth))))


def _who(name: str, spec: str) -> dict:
    """A method's verifier or sequence-level rule, by name: ``{"verifier": name}`` or ``{"rule": name}``."""
    if name in _verifiers.names():
        return {"verifier": name}
    if name in decoder_rules() and name != WALK:
        return {"rule": name}
    raise ValueError(f"method {spec!r}: unknown verifier or tree rule {name!r}; verifiers: "
                     f"{', '.join(_verifiers.names())}; tree rules the decoder takes: "
                     f"{', '.join(r for r in decoder_rules() if r != WALK)}")


def parse_method(spec: str, *, temperature: float = 1.0) -> MethodSpec:
    """A method from its short form (``benchmarks/decode_speed.py --methods``), its settings made
    by ``Settings.from_args`` (ValueError naming a bad one):
    ``target`` the target alone; ``sd:D`` single-draft SD on a chain of depth D; ``V:KxD``
    verifier V on the full K-ary tree of depth D; ``V:seqKxD`` on K draft sequences of length
    D; ``V:dyn:K:N:D[:G]`` on dynamic trees (at most K drafts a node, N nodes, depth D, gain G);
    ``V:auto:K`` a tree chosen later from a cost profile (``kind="auto"``; the caller gives the
    tree by ``MethodSpec.chosen``). V is a verifier (its walk) or a sequence-level tree rule such
    as ``block`` (``block:1xD``) or ``traversal`` (``traversal:seq2x6``); the label names it
    either way (``traversal seq K=2 depth 6``). A drafted method may end in ``+SOURCE`` once per
    free draft source (``sd:4+lookup``, ``optimal:2x3+lookup+suffix``): the free sources' chains join
    the model's tree (``Settings.sources``; label ``... + lookup``). Free sources alone, no draft
    model (``Settings.free_only``; vLLM's ``ngram`` method): ``lookup``, ``suffix`` or
    ``lookup+suffix`` (each source once; label ``lookup alone``, ``lookup + suffix alone``); their
    rows have ``sources`` without 'model', ``verifier`` None and ``k = depth = 0``. A drafted or
    free-only method may end in ``@paced``: decoded with the run's cost profile, each step as deep
    as pays by it and the decode's own acceptances, free chains cut by cost (``generate(...,
    cost_profile=)``; label ``... paced``, rows ``paced: true``, the same seeds as unpaced).
    ValueError for anything else."""
    spec = spec.strip()
    if spec.endswith("@paced"):
        m = parse_method(spec.removesuffix("@paced"), temperature=temperature)
        if m.settings.target_alone or m.kind is not None or m.paced:
            raise ValueError(f"method {spec!r}: @paced takes a drafted or free-only method, not "
                             f"{spec.removesuffix('@paced')!r}")
        return dataclasses.replace(m, label=m.label + " paced", paced=True)
    s, *free = [part.strip() for part in spec.split("+")]
    if s in FREE_SOURCES:  # free sources alone: no draft model
        names = (s, *free)
        bad = [f for f in names if f not in FREE_SOURCES]
        if bad or len(set(names)) != len(names):
            raise ValueError(f"method {spec!r}: free sources alone are {' or '.join(FREE_SOURCES)} joined by '+', "
                             "each once (lookup, suffix, lookup+suffix)")
        settings = Settings.from_args(sources=names, temperature=float(temperature), max_new_tokens=_MAX_NEW_TOKENS)
        return MethodSpec(" + ".join(names) + " alone", settings)
    if free:
        m = parse_method(s, temperature=temperature)
        if m.settings.target_alone or m.kind == "auto":
            raise ValueError(f"method {spec!r}: free draft sources join a drafted method's tree "
                             f"(sd:D, V:KxD, V:seqKxD, V:dyn:...), not {s!r}; alone they are "
                             f"{', '.join(FREE_SOURCES)} or lookup+suffix")
        settings = Settings.from_args(**{**Settings.args_of(m.settings.describe()), "sources": ("model", *free)})
        return MethodSpec(m.label + "".join(f" + {f}" for f in free), settings)
    t = float(temperature)
    if s == "target":
        return target_alone(temperature=t)
    m = re.fullmatch(r"sd:(\d+)", s)
    if m:
        d = int(m.group(1))
        return tree_method(f"SD depth {d}", "naive", 1, d, temperature=t)
    m = re.fullmatch(r"(\w+):(seq)?(\d+)x(\d+)", s)
    if m:
        v, seq, k, d = m.group(1), m.group(2), int(m.group(3)), int(m.group(4))
        return MethodSpec(f"{v} {'seq ' if seq else ''}K={k} depth {d}",
                          Settings.from_args(**_who(v, s), k=k, depth=d, tree="sequences" if seq else None,
                                             temperature=t, max_new_tokens=_MAX_NEW_TOKENS))
    m = re.fullmatch(r"(\w+):dyn:(\d+):(\d+):(\d+)(?::([0-9.]+))?", s)
    if m:
        v, k, n, d = m.group(1), int(m.group(2)), int(m.group(3)), int(m.group(4))
        gain = float(m.group(5)) if m.group(5) is not None else None
        label = f"{v} dynamic K<={k} {n} nodes depth<={d}" + (f" gain>={gain:g}" if gain is not None else "")
        return MethodSpec(label, Settings.from_args(**_who(v, s), k=k, depth=d, tree="dynamic", max_nodes=n,
                                                    min_gain=gain, temperature=t, max_new_tokens=_MAX_NEW_TOKENS))
    m = re.fullmatch(r"(\w+):auto:(\d+)", s)
    if m:
        v, k = m.group(1), int(m.group(2))
        who = _who(v, s)
        placeholder = [[0]] if "rule" in who else None  # until the tree is chosen (cli decode --tree auto too)
        return MethodSpec(f"{v} auto K<={k}", Settings.from_args(**who, k=k, depth=1, tree=placeholder,
                                                                 temperature=t, max_new_tokens=_MAX_NEW_TOKENS),
                          kind="auto")
    raise ValueError(f"cannot read method {spec!r} (target, sd:D, V:KxD, V:seqKxD, V:dyn:K:N:D[:G], V:auto:K; "
                     "a drafted one + a free source: sd:4+lookup; free sources alone: lookup, suffix, lookup+suffix)")


def check_methods(methods: Sequence[MethodSpec], *, max_new_tokens: int) -> None:
    """The methods of one run, before any model loads: each label once, and ``max_new_tokens``
    (each method's settings were checked when it was made). ValueError naming the problem."""
    labels = [m.label for m in methods]
    if len(set(labels)) != len(labels):
        raise ValueError(f"methods: a label is listed twice: {sorted(x for x in set(labels) if labels.count(x) > 1)}")
    for m in methods:
        if not isinstance(m, MethodSpec):
            raise ValueError(f"methods: expected MethodSpec objects, got {type(m).__name__}")
    if methods:
        methods[0].settings.derive(max_new_tokens=max_new_tokens)


def run_seed(seed: int, prompt: str, method: MethodSpec) -> int:
    """The seed of one run (see the module docstring): a function of (seed, prompt, verifier or
    rule, law, K, depth) alone."""
    d = method.describe()
    if method.peer is not None:
        name, law, k, depth = method.method_kind, "-", 0, 0
    elif method.settings.target_alone:
        name, law, k, depth = SEED_TARGET_ALONE, "-", 0, 0
    elif method.settings.free_only:  # free sources alone: named by them (no verifier, law or sizes)
        name, law, k, depth = "+".join(d["sources"]), "-", 0, 0
    else:
        name = d["verifier"] if d["rule"] == WALK else d["rule"]
        law, k, depth = d["law"], d["k"], d["depth"]
    return derive_seed(seed, prompt, name, law, k, depth, rule="unit")


def _num(x):
    if x is None:
        return None
    if isinstance(x, bool):
        return x
    if isinstance(x, int):
        return int(x)
    return float(x)


def run_row(method: MethodSpec, prompt: str, ids: torch.Tensor, seed: int, res, *, round_: int = 0) -> dict:
    """The row of one run: ``res`` a ``GenerationResult`` or a peer's dict of measurements; the
    method's columns are ``MethodSpec.describe()`` (the one description of its settings)."""
    row = {"kind": "run", **method.describe(),
           "prompt": prompt, "prompt_tokens": int(ids.shape[-1]), "round": int(round_), "seed": int(seed)}
    if isinstance(res, dict):
        meas = {k: _num(res.get(k)) for k in ("new_tokens", "target_calls", "draft_calls", "tree_tokens",
                                               "block_efficiency", "acceptance_rate", "seconds")}
        meas["prefill_seconds"] = _num(res.get("prefill_seconds"))
        meas["stop_reason"] = res.get("stop_reason")
        tokens = res.get("tokens")
    else:
        meas = {"new_tokens": int(res.new_tokens), "target_calls": int(res.target_calls),
                "draft_calls": int(res.draft_calls), "tree_tokens": int(res.tree_tokens),
                "block_efficiency": float(res.block_efficiency),
                "acceptance_rate": None if method.target_alone else float(res.acceptance_rate),
                "seconds": float(res.seconds), "prefill_seconds": float(res.prefill_seconds),
                "stop_reason": res.stop_reason}
        tokens = res.tokens.tolist()
    row.update(meas)
    secs = row["seconds"]
    row["tokens_per_s"] = row["new_tokens"] / secs if secs and secs > 0 else float("nan")
    row["tokens"] = tokens
    return row


@dataclass
class RunOutcome:
    """What :func:`run` returns: the rows written, and why it stopped early (None: it did not)."""

    rows: list
    stopped: str | None = None
    prompts_done: int = 0


def run(target, draft, prompts: Sequence[tuple[str, torch.Tensor]], methods: Sequence[MethodSpec], *, seed: int,
        max_new_tokens: int, eos_token_id=None, rounds: int = 1, skip: Callable[[str, MethodSpec], bool] | None = None,
        write: Callable[[dict], None] | None = None, time_budget_s: float | None = None,
        progress=None, desc: str = "decode", log: Callable[[str], None] = lambda _m: None,
        on_row: Callable[[dict, int, int], None] | None = None, cost_profile=None, rounds_first: bool = False,
        skip_unit: Callable[[str, int], bool] | None = None) -> RunOutcome:
    """Decode every prompt ``(id, input_ids [1, T])`` with every method, interleaved (module docstring).

    ``skip(prompt_id, method)`` True leaves a run out (a resumed file's finished rows);
    ``skip_unit(prompt_id, round)`` True leaves a whole unit out (every method of that prompt and
    round: a resumed file's complete units); ``rounds_first`` runs the units round-major (round 0 of
    every prompt first) instead of prompt-major; the seeds and the method order within a unit are
    the same either way. ``write(row)`` is called for every row as soon as it exists;
    ``time_budget_s`` stops before a unit (prompt-major: a prompt with all its rounds) that would
    overrun the budget (projected from the units done; the first always runs). ``progress``: a
    tqdm-like wrapper ``progress(iterable, total, desc)``; ``on_row(row, done, total)`` after each
    row (e.g. a log line); ``cost_profile`` the ``treeopt.CostProfile`` the ``paced`` methods decode
    with (required when one is given)."""
    if cost_profile is None and any(m.paced for m in methods):
        raise ValueError("paced methods need a cost_profile")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be a positive integer, got {rounds!r}")
    units = ([(pi, rnd) for rnd in range(rounds) for pi in range(len(prompts))] if rounds_first else
             [(pi, rnd) for pi in range(len(prompts)) for rnd in range(rounds)])
    jobs = []
    for pi, rnd in units:
        if skip_unit is not None and skip_unit(prompts[pi][0], rnd):
            continue
        for m in (methods if rnd % 2 == 0 else list(methods)[::-1]):
            if skip is None or not skip(prompts[pi][0], m):
                jobs.append((pi, rnd, m))
    # the budget's unit: a (prompt, round) round-major, a prompt with all its rounds prompt-major
    unit_of = (lambda pi, rnd: (pi, rnd)) if rounds_first else (lambda pi, rnd: pi)
    n_units = len({unit_of(pi, rnd) for pi, rnd, _ in jobs})
    what = "prompts" if not rounds_first or rounds == 1 else "prompt rounds"
    # each method at this run's max_new_tokens (a change of one sampling field: checked alone)
    sized = {m.label: dataclasses.replace(m, settings=m.settings.derive(max_new_tokens=max_new_tokens))
             for m in methods}
    out = RunOutcome([])
    it = jobs if progress is None else progress(jobs, total=len(jobs), desc=desc)
    cache, cache_unit, units_done, seen = None, None, 0, set()
    t_loop = time.perf_counter()
    for pi, rnd, m in it:
        pid, ids = prompts[pi]
        unit = unit_of(pi, rnd)
        if unit != cache_unit:  # a new unit: a fresh prefill cache, and the time budget
            if cache_unit is not None and time_budget_s is not None:
                per_unit = (time.perf_counter() - t_loop) / max(units_done, 1)
                if time.perf_counter() - t_loop + per_unit > time_budget_s:
                    out.stopped = (f"time budget {time_budget_s:.0f} s: stopped after {units_done} of {n_units} "
                                   f"{what} ({per_unit:.0f} s per prompt round)")
                    log(out.stopped)
                    break
            cache, cache_unit = PromptCache(max_entries=2), unit  # target and draft prefill of this prompt
            units_done += 1
            if pi not in seen:
                seen.add(pi)
                out.prompts_done += 1
        s = run_seed(seed, pid, m)
        m = sized[m.label]
        if m.peer is not None:
            res = m.peer(pid, ids, s)
        else:
            res = generate(target, None if m.target_alone else draft, ids, m.settings, eos_token_id=eos_token_id,
                           generator=torch.Generator().manual_seed(s), prompt_cache=cache,
                           cost_profile=cost_profile if m.paced else None)
        row = run_row(m, pid, ids, s, res, round_=rnd)
        out.rows.append(row)
        if write is not None:
            write(row)
        if on_row is not None:
            on_row(row, len(out.rows), len(jobs))
    return out


def complete_units(rows: Sequence[dict], methods: Sequence[MethodSpec] | Sequence[str]) -> set[tuple[str, int]]:
    """The units ``(prompt, round)`` of ``rows`` (a results file's) that hold a run row of every one of
    ``methods`` (labels or specs): what a resumed run skips. A unit with only some methods' rows (an
    interrupted run) is not complete: it is decoded again. Rows without ``round`` are round 0."""
    labels = {m if isinstance(m, str) else m.label for m in methods}
    have: dict[tuple[str, int], set[str]] = {}
    for r in rows:
        if r.get("kind", "run") == "run":
            have.setdefault((r["prompt"], int(r.get("round") or 0)), set()).add(r["method"])
    return {u for u, got in have.items() if labels <= got}


def first_difference(old: dict, new: dict, free: Sequence[str] = ()) -> tuple[str, object, object] | None:
    """The first setting (in ``new``'s order, then ``old``'s) whose value differs between two run
    configurations, as ``(key, old value, new value)`` (values compared as they read back from
    JSON: tuples as lists), or None; keys in ``free`` may differ (a resumed run's ``rounds``)."""
    def canon(x):
        return json.loads(json.dumps(x, sort_keys=True, default=str))
    a, b = canon(dict(old)), canon(dict(new))
    for k in list(b) + [k for k in a if k not in b]:
        if k not in free and a.get(k) != b.get(k):
            return k, a.get(k), b.get(k)
    return None


def warm_up(target, draft, ids: torch.Tensor, *, depth: int = 2, temperature: float = 1.0,
            prompt_cache: PromptCache | None = None) -> None:
    """A few tokens with the target alone, single-draft SD and a K = 2 tree: the first decodes of a
    process pay one-off costs (allocation, kernels) that no measured run should carry."""
    generate(target, None, ids, verifier=None, max_new_tokens=2, temperature=temperature, generator=0,
             prompt_cache=prompt_cache)
    if draft is not None:
        for kw in ({"verifier": "naive", "k": 1}, {"verifier": "specinfer", "k": 2}):
            generate(target, draft, ids, depth=depth, max_new_tokens=4, temperature=temperature, generator=0,
                     prompt_cache=prompt_cache, **kw)


# --- statistics ------------------------------------------------------------------------------
def merge_rounds(rows: Sequence[dict]) -> list[dict]:
    """One row per (method, prompt): the rounds of a run pooled (tokens, seconds, target calls and
    tree tokens summed, block efficiency and tokens/s recomputed from the sums, acceptance
    averaged); ``round_tokens_per_s`` keeps each round's rate. A single round passes through (with
    ``round_tokens_per_s``), and merged rows are left as they are (idempotent)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["method"], r["prompt"]), []).append(r)
    out = []
    for rs in groups.values():
        if len(rs) == 1:
            r = rs[0]
            out.append(r if "round_tokens_per_s" in r else
                       dict(r, round_tokens_per_s=[r["new_tokens"] / r["seconds"]] if r["seconds"] > 0 else []))
            continue
        m = dict(rs[0])
        for k in ("new_tokens", "target_calls", "draft_calls", "seconds"):
            if all(k in r for r in rs):  # a peer's draft_calls may be None (not counted): None pooled
                m[k] = None if any(r[k] is None for r in rs) else sum(r[k] for r in rs)
        m["tree_tokens"] = sum(r["tree_tokens"] for r in rs) if all(r.get("tree_tokens") for r in rs) else 0
        m["block_efficiency"] = m["new_tokens"] / m["target_calls"] if m["target_calls"] else float("nan")
        acc = [r["acceptance_rate"] for r in rs if finite_number(r.get("acceptance_rate"))]
        m["acceptance_rate"] = sum(acc) / len(acc) if acc else float("nan")
        m["tokens_per_s"] = m["new_tokens"] / m["seconds"] if m["seconds"] > 0 else float("nan")
        m["round_tokens_per_s"] = [r["new_tokens"] / r["seconds"] for r in rs if r["seconds"] > 0]
        m["rounds"] = len(rs)
        out.append(m)
    return out


def paired_ratio(rows: Sequence[dict], a: str, b: str, per: str = "seconds") -> tuple[float, float, int]:
    """Per prompt, tokens/s of method ``a`` over method ``b`` (rounds pooled): mean, 95% half-width,
    prompts. ``per="target_calls"``: block efficiency (tokens per target pass) instead."""
    rows = merge_rounds(rows)
    ra = {r["prompt"]: r for r in rows if r["method"] == a}
    rb = {r["prompt"]: r for r in rows if r["method"] == b}
    xs = [(ra[p]["new_tokens"] / ra[p][per]) / (rb[p]["new_tokens"] / rb[p][per])
          for p in ra if p in rb and ra[p][per] > 0 and rb[p][per] > 0 and rb[p]["new_tokens"] > 0]
    m, ci = mean_ci(xs)
    return m, ci, len(xs)


def same_tree(rows: Sequence[dict]) -> list[dict]:
    """Token-level verifiers decoding the same fixed tree in one run (issue 27, item 4): per tree
    (law, K, depth and shape; dynamic trees and sequence-level rules left out, as they grow or judge
    different trees), the verifier with the highest block efficiency (pooled) against the fastest
    (pooled tokens/s), paired per prompt. One dict per tree that at least two verifiers decoded:
    ``tree``, ``methods`` (labels), ``best_block``, ``fastest``, ``ratio`` / ``ci95`` / ``prompts``
    (per-prompt tokens/s of ``best_block`` over ``fastest``; 1.0, NaN when they are the same method)
    and ``verdict``: ``"fastest"``, ``"within"`` (the interval reaches 1), ``"slower"`` or
    ``"undetermined"`` (one prompt: no interval). Ties in block efficiency go to the faster verifier.
    ``others``: every other verifier of the tree against the fastest, per prompt, in ``methods``
    order: ``method``, ``block_efficiency`` (pooled), tokens/s ``ratio`` / ``ci95`` and block
    efficiency ``block_ratio`` / ``block_ci95`` (so a near-tie at the top reads as one)."""
    rows = merge_rounds([r for r in rows if r.get("kind", "run") == "run"])
    out = []
    for tree, by in _fixed_trees(rows).items():
        by = {lab: rs for lab, rs in by.items() if _walk(rs[0])}
        if len(by) < 2:
            continue
        pooled = {lab: _pooled(rs) for lab, rs in by.items()}
        top = max(b for b, _ in pooled.values())
        best = max((lab for lab in pooled if pooled[lab][0] == top), key=lambda lab: pooled[lab][1])  # ties: the faster
        fastest = max(pooled, key=lambda lab: pooled[lab][1])
        others, paired = [], {}
        for lab in by:
            if lab != fastest:
                om, oci, on = paired[lab] = paired_ratio(rows, lab, fastest)
                bm, bci, _ = paired_ratio(rows, lab, fastest, per="target_calls")
                others.append({"method": lab, "block_efficiency": pooled[lab][0], "ratio": om, "ci95": oci,
                               "block_ratio": bm, "block_ci95": bci})
        m, ci, n = (1.0, float("nan"), len(by[best])) if best == fastest else paired[best]
        verdict = "fastest" if best == fastest else ("undetermined" if not finite_number(ci) else
                                                     "within" if m + ci >= 1.0 else "slower")
        out.append({"tree": tree, "methods": list(by), "best_block": best,
                    "block_efficiency": pooled[best][0], "fastest": fastest, "tokens_per_s": pooled[fastest][1],
                    "best_block_tokens_per_s": pooled[best][1], "ratio": m, "ci95": ci, "prompts": n,
                    "verdict": verdict, "others": others})
    return out


def _fixed_trees(rows: Sequence[dict]) -> dict[str, dict[str, list[dict]]]:
    """Runs on fixed trees (no dynamic or chosen ones), by tree (``"<shape> K=<K> depth <D> (<law>)"``,
    then ``" + <source>"`` for each free source joining it) and method; free sources alone (no model
    tree) and paced runs (their depth changes step by step) left out; rounds merged by the caller."""
    groups: dict[str, dict[str, list[dict]]] = {}
    for r in rows:
        if _kind(r) != "tree" or r.get("auto") is not None or r.get("tree") == "dynamic" or r.get("paced"):
            continue
        sources = r.get("sources") or [DraftModel.name]
        if DraftModel.name not in sources:  # free sources alone: no model tree to compare verifiers on
            continue
        shape = r.get("tree") or ("chain" if r.get("k") == 1 else "kary")
        tree = f"{shape} K={r.get('k')} depth {r.get('depth')} ({r.get('law')})" + \
            "".join(f" + {x}" for x in sources if x != DraftModel.name)
        groups.setdefault(tree, {}).setdefault(r["method"], []).append(r)
    return groups


def _walk(r: dict) -> bool:
    """A run whose tree a token-level verifier walked (not a sequence-level rule)."""
    return r.get("rule") == WALK


def _pooled(rs: Sequence[dict]) -> tuple[float, float]:
    """(block efficiency, tokens/s) pooled over runs."""
    tok, calls, secs = (sum(r[f] for r in rs) for f in ("new_tokens", "target_calls", "seconds"))
    return tok / calls if calls else float("nan"), tok / secs if secs > 0 else float("nan")


def rules_against_walks(rows: Sequence[dict]) -> list[dict]:
    """Every sequence-level rule run on a fixed tree against the fastest token-level walk of the same
    tree (law, K, depth and shape; its own draws) in one run (issue 26): per prompt, paired, tokens/s
    (``ratio``, ``ci95``) and block efficiency (``block_ratio``, ``block_ci95``) of the rule over the
    walk. One dict per rule with ``tree``, ``rule`` (label), ``walk`` (label), ``prompts``."""
    rows = merge_rounds([r for r in rows if r.get("kind", "run") == "run"])
    out = []
    for tree, by in _fixed_trees(rows).items():
        walks = {lab: _pooled(rs)[1] for lab, rs in by.items() if _walk(rs[0])}
        if not walks:
            continue
        walk = max(walks, key=walks.get)
        for lab, rs in by.items():
            if rs[0].get("rule") in (None, WALK):  # a walk, not a rule
                continue
            m, ci, n = paired_ratio(rows, lab, walk)
            bm, bci, _ = paired_ratio(rows, lab, walk, per="target_calls")
            out.append({"tree": tree, "rule": lab, "walk": walk, "ratio": m, "ci95": ci, "prompts": n,
                        "block_ratio": bm, "block_ci95": bci})
    return out


def round_spread(rows: Sequence[dict]) -> dict[str, float]:
    """Per method, the median over prompts of ``(max - min) / mean`` of the rounds' tokens/s on one
    prompt (same seed, so the same tokens: pure timing noise); methods with one round left out."""
    per: dict[str, list[float]] = {}
    for r in merge_rounds(rows):
        xs = r.get("round_tokens_per_s") or []
        if len(xs) >= 2:
            per.setdefault(r["method"], []).append((max(xs) - min(xs)) / (sum(xs) / len(xs)))
    out = {}
    for m, v in per.items():
        v = sorted(v)
        n = len(v)
        out[m] = v[n // 2] if n % 2 else (v[n // 2 - 1] + v[n // 2]) / 2
    return out


def _kind(r: dict) -> str:
    if "method_kind" in r:
        return r["method_kind"]
    return "target" if r.get("rule") is None else "tree"


def summarize(rows: Sequence[dict], methods: Sequence[MethodSpec] | Sequence[str] | None = None, *,
              reference: str | None = None, peer_reference: str | None = None) -> list[dict]:
    """One row per method (in ``methods`` order, else first appearance), rounds pooled per prompt.

    ``reference``: the method every speed-up is measured against (default: the first target-alone
    method); ``peer_reference``: a second one (default: a ``llama-target`` peer if the run has one),
    reported as ``vs_llama_*``."""
    rows = merge_rounds([r for r in rows if r.get("kind", "run") == "run"])
    order = [m if isinstance(m, str) else m.label for m in methods] if methods is not None else \
        list(dict.fromkeys(r["method"] for r in rows))
    first = {}
    for r in rows:
        first.setdefault(r["method"], r)
    if reference is None:
        reference = next((lab for lab in order if lab in first and _kind(first[lab]) == "target"), None)
    if peer_reference is None:
        peer_reference = next((lab for lab in order if lab in first and _kind(first[lab]) == "llama-target"), None)
    base = None
    if reference is not None:
        rs = [r for r in rows if r["method"] == reference]
        tok, secs = sum(r["new_tokens"] for r in rs), sum(r["seconds"] for r in rs)
        base = tok / secs if secs > 0 else None
    out = []
    for label in order:
        rs = [r for r in rows if r["method"] == label]
        if not rs:
            continue
        r0 = rs[0]
        kind = _kind(r0)
        tokens = sum(r["new_tokens"] for r in rs)
        calls = sum(r["target_calls"] for r in rs)
        secs = sum(r["seconds"] for r in rs)
        tps = tokens / secs if secs > 0 else float("nan")
        acc = [r["acceptance_rate"] for r in rs if kind != "target" and finite_number(r.get("acceptance_rate"))]
        scored = [r.get("tree_tokens") for r in rs if r.get("tree_tokens")]
        s = {"method": label, "method_kind": kind, "verifier": r0.get("verifier"), "rule": r0.get("rule"),
             "sources": r0.get("sources"),
             "law": r0.get("law"), "k": r0.get("k", 0), "depth": r0.get("depth", 0),
             "prompts": len(rs), "new_tokens": tokens, "target_calls": calls,
             "draft_calls": None if any(r.get("draft_calls") is None for r in rs)  # a peer that does not count them
             else sum(r["draft_calls"] for r in rs), "seconds": secs,
             "block_efficiency": tokens / calls if calls else float("nan"),
             "acceptance_rate": sum(acc) / len(acc) if acc else float("nan"),
             "tokens_per_s": tps,
             "tree_tokens_per_pass": sum(scored) / calls if len(scored) == len(rs) and calls else float("nan"),
             "ms_per_step": 1000.0 * secs / calls if calls else float("nan"),
             "speedup": tps / base if base else float("nan")}
        s["tokens_per_s_mean"], s["tokens_per_s_ci95"] = mean_ci(r["new_tokens"] / r["seconds"] for r in rs
                                                                 if r["seconds"] > 0)
        s["block_efficiency_mean"], s["block_efficiency_ci95"] = mean_ci(r["block_efficiency"] for r in rs)
        if reference is not None:
            s["speedup_mean"], s["speedup_ci95"], _ = paired_ratio(rows, label, reference)
        else:
            s["speedup_mean"] = s["speedup_ci95"] = float("nan")
        if peer_reference is not None:
            s["vs_llama_mean"], s["vs_llama_ci95"], _ = paired_ratio(rows, label, peer_reference)
        if r0.get("auto") is not None:
            s["auto"] = r0["auto"]
        out.append(s)
    return out


def _f(x, nd=2) -> str:
    return "-" if x is None or not isinstance(x, (int, float)) or x != x else f"{x:.{nd}f}"


def format_table(summary: Sequence[dict]) -> str:
    """The summary as one Markdown table (also readable in a terminal): ``± 95%`` intervals are over
    prompts (rounds pooled first); ``-`` where a value is undefined (one prompt, no drafts)."""
    llama = any("vs_llama_mean" in s for s in summary)
    head = ("| method | law | K | block eff. ± 95% | acceptance | tokens/s | tokens/s mean ± 95% | speed-up "
            "| speed-up per prompt ± 95% | tree tokens / pass | ms / step | tokens | target calls |"
            + (" vs llama-completion ± 95% |" if llama else ""))
    lines = [head, "|" + "---|" * (13 + llama)]
    for s in summary:
        lines.append(
            f"| {s['method']} | {s.get('law') or '-'} | {s.get('k') or '-'} | "
            f"{_f(s['block_efficiency'])} ± {_f(s['block_efficiency_ci95'])} | {_f(s['acceptance_rate'])} | "
            f"{_f(s['tokens_per_s'])} | {_f(s['tokens_per_s_mean'])} ± {_f(s['tokens_per_s_ci95'])} | "
            f"{_f(s['speedup'])}x | {_f(s['speedup_mean'])} ± {_f(s['speedup_ci95'])} | "
            f"{_f(s.get('tree_tokens_per_pass'), 1)} | {_f(s.get('ms_per_step'), 1)} | {s['new_tokens']} | "
            f"{s['target_calls']} |" + (f" {_f(s.get('vs_llama_mean'))} ± {_f(s.get('vs_llama_ci95'))} |" if llama else ""))
    return "\n".join(lines)
