"""``multidraft demo``: end-to-end speed of multi-draft speculative decoding on a real pair.

On the default pair (Qwen2.5-Coder-1.5B-Instruct target, 0.5B draft) and a few HumanEval
prompts at temperature 1, every method decodes every prompt (the runs, their seeds, rows and
summary are the one decode runner's, :mod:`.decode_runs`):

* ``target-only``: the target alone, one token per forward pass (the reference);
* ``SD``: single-draft speculative decoding (verifier ``naive``, K = 1, a chain of depth L);
* multi-draft verifiers at each K (a full K-ary draft tree of depth L, the draft law the
  verifier implies, ``Verifier.implied_law``), skipping the ones that do not support that K.
  The default (``DEFAULT_VERIFIERS``) is specinfer, spectr and optimal at K = 2, sized so
  that a clean clone sets up and finishes the demo in about 6 minutes on 2 cores;
  ``verifiers=("all",)`` takes every registered verifier. (The without-replacement and
  greedy laws draw K distinct tokens, so their trees keep every node; on a CPU whose tree
  pass costs about one single-token pass per node they are the slowest rows.)
* one mixed row (``mixed``, on by default; issue 39): the SD chain with prompt lookup and the
  suffix index joining its tree (``sources = model,lookup,suffix``: their copied chains verified
  free drafts first, then the draft model's draft; ``decoding.sources``), labelled
  ``SD naive K=1 + lookup + suffix``: what copying adds to SD on the same prompts;
* sequence-level tree rules (``rules``: names from ``decoding.decoder_rules()``, or
  ``("all",)``; none by default) on the same trees, i.i.d. drafts: each rule at every K of
  ``ks`` it is lossless for on the full K-ary tree (``traversal K=2``), or, when it takes none
  of them, on the chain of depth L (``block K=1``, block verification against the SD row).

Runs are interleaved (for each prompt, every method in turn), so slow phases of a shared
machine hit all methods alike. Per method the summary pools the prompts:
``block_efficiency = sum new tokens / sum target calls``, ``tokens_per_s = sum new tokens /
sum seconds`` (decoding time; each prompt's prefill is computed once, shared by every method
through a ``PromptCache`` and reported apart as ``prefill_seconds``) and
``speedup = tokens_per_s / tokens_per_s(target-only)``, with per-prompt means and 95%
intervals beside them. Output: a JSONL file (a row per run and a summary row per method), a
Markdown table and a PNG plot.

``time_budget_s`` bounds the decoding time: before starting another prompt round the
runner projects its cost from the rounds done and stops (saying so) if it would overrun;
the first round always runs.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Sequence

import torch

from .. import verifiers as _verifiers
from .._errors import ArgumentError
from .._validate import as_int, as_ks, as_temperature
from ..datasets import encode_prompt, load_prompts
from ..decoding.settings import WALK, decoder_rules
from . import decode_runs, plots
from .decode_runs import MethodSpec, format_table, summarize, target_alone, tree_method
from .progress import progress as _progress
from .records import JsonlWriter, write_file

__all__ = ["DEFAULT_VERIFIERS", "DemoConfig", "plan_methods", "plan_rule_methods", "run_demo", "summarize", "format_table", "plot_summary"]

# verifiers that get no multi-draft row: the single-draft baseline has its own row, and the
# LP coupling enumerates V^K draft tuples (small vocabularies only)
EXCLUDED = {"naive": "single-draft baseline (its own row)", "lp_optimal": "linear program over V^K tuples: small V only"}

# the default multi-draft rows (i.i.d. drafts): the SpecInfer baseline, SpecTr's transport and the optimum
DEFAULT_VERIFIERS = ("specinfer", "spectr", "optimal")


@dataclass(frozen=True)
class DemoConfig:
    """The demo's settings, validated once when made: every field is checked in
    ``__post_init__`` (``ArgumentError`` naming it) and stored resolved (``ks`` sorted numbers of
    drafts >= 2). ``methods`` and ``skipped`` (not fields to give) are :func:`plan_methods`'s
    plan, each method's decoding settings built once (``decode_runs.MethodSpec.settings``).
    A variant is ``dataclasses.replace(cfg, ...)`` (validated again, as a new config)."""

    target: str | None = None
    draft: str | None = None
    prompts: int = 2
    max_new_tokens: int = 32
    depth: int = 3
    ks: tuple[int, ...] = (2,)
    temperature: float = 1.0
    seed: int = 0
    verifiers: tuple[str, ...] | None = None
    rules: tuple[str, ...] | None = None
    out_dir: str = "results/demo"
    cache_dir: str | None = None
    chat: bool = True
    stop_at_eos: bool = True
    time_budget_s: float | None = 180.0
    mixed: bool = True
    extra: dict = field(default_factory=dict)
    methods: tuple = field(init=False, repr=False, compare=False)
    skipped: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        for name in ("prompts", "max_new_tokens", "depth"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ArgumentError(name, f"must be a positive integer, got {v!r}")
        ks = as_ks(self.ks, "k")
        if min(ks) < 2:
            raise ArgumentError("k", f": the multi-draft rows need K >= 2 (K = 1 is the SD row), got {list(ks)}")
        set_("ks", ks)
        set_("temperature", as_temperature(self.temperature, "temperature"))
        set_("seed", as_int(self.seed, "seed", minimum=0))
        for name in ("target", "draft"):
            path = getattr(self, name)
            if path is not None and not Path(path).expanduser().exists():
                raise ArgumentError(name, f": model path {path} does not exist (a local model directory or .gguf file)")
        out = Path(self.out_dir)
        if out.exists() and not out.is_dir():
            raise ArgumentError("out_dir", f": {out} exists and is not a directory")
        if self.time_budget_s is not None and not self.time_budget_s > 0:
            raise ArgumentError("time_budget_s", f"must be > 0 or None, got {self.time_budget_s!r}")
        if self.verifiers is not None:
            set_("verifiers", (self.verifiers,) if isinstance(self.verifiers, str) else tuple(self.verifiers))
        if self.rules is not None:
            set_("rules", (self.rules,) if isinstance(self.rules, str) else tuple(self.rules))
        try:
            if not isinstance(self.mixed, bool):
                raise ArgumentError("mixed", f"must be True or False, got {self.mixed!r}")
            methods, skipped = plan_methods(self.ks, self.verifiers, depth=self.depth, temperature=self.temperature,
                                            mixed=self.mixed)
        except ArgumentError:
            raise
        except ValueError as exc:
            raise ArgumentError.of("verifiers", exc) from None
        rule_methods, rule_skipped = plan_rule_methods(self.ks, self.rules, depth=self.depth,
                                                       temperature=self.temperature)
        methods, skipped = methods + rule_methods, skipped + rule_skipped
        decode_runs.check_methods(methods, max_new_tokens=self.max_new_tokens)  # each method's settings, once
        set_("methods", tuple(methods))
        set_("skipped", tuple(skipped))

    def check(self) -> None:
        """Nothing left to check: a DemoConfig is validated when made (kept for older callers)."""

    def binding(self) -> dict:
        """The settings ``demo.jsonl``'s meta row holds (with the methods' labels)."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init and f.name != "extra"} | {
            "methods": [m.label for m in self.methods]}


MIXED_LABEL = "SD naive K=1 + lookup + suffix"  # the demo's mixed row (module notes)


def plan_methods(ks: Sequence[int], verifiers: Sequence[str] | None = None, *, depth: int = 3,
                 temperature: float = 1.0, mixed: bool = False) -> tuple[list[MethodSpec], list[str]]:
    """(methods, skipped notes): target-only, single-draft SD, then each multi-draft verifier x K
    (``decode_runs.MethodSpec``: the full K-ary tree of ``depth``, the verifier's implied law),
    then with ``mixed`` the one mixed row (``MIXED_LABEL``: the SD chain with ``sources``
    model, lookup, suffix).

    ``verifiers`` None means ``DEFAULT_VERIFIERS``; ``("all",)`` every registered verifier.
    """
    names = _verifiers.names()
    if verifiers is None:
        names = [n for n in names if n in DEFAULT_VERIFIERS]
    elif tuple(verifiers) == ("all",):
        verifiers = None
    else:
        for n in verifiers:
            _verifiers.get(n)  # ValueError listing the registered names
        names = [n for n in names if n in verifiers]
    methods = [target_alone("target-only", temperature=temperature),
               tree_method("SD naive K=1", "naive", 1, depth, law="iid", temperature=temperature)]
    skipped = []
    for name in names:
        if name in EXCLUDED:
            if verifiers is not None and name != "naive":
                skipped.append(f"{name}: {EXCLUDED[name]}")
            continue
        v = _verifiers.get(name)
        for k in ks:
            if not [x for x in v.laws_for(k) if x != "independent"]:
                krange = f"K >= {v.min_k}" if v.max_k is None else f"{v.min_k} <= K <= {v.max_k}"
                skipped.append(f"{name} K={k}: not supported (laws {', '.join(v.laws)} with {krange})")
                continue
            methods.append(tree_method(f"{name} K={k}", name, k, depth, law=v.implied_law(k), temperature=temperature))
    if mixed:
        methods.append(tree_method(MIXED_LABEL, "naive", 1, depth, law="iid", temperature=temperature,
                                   sources="model,lookup,suffix"))
    return methods, skipped


def plan_rule_methods(ks: Sequence[int], rules: Sequence[str] | None = None, *, depth: int = 3,
                      temperature: float = 1.0) -> tuple[list[MethodSpec], list[str]]:
    """(methods, skipped notes) of the sequence-level tree rules (see the module notes): each rule
    at every K of ``ks`` it is lossless for on the full K-ary tree with i.i.d. drafts, else on the
    chain of ``depth`` (K = 1). ``rules`` None: none; ``("all",)`` every rule the decoder takes;
    an unknown name or 'tree_lp' is an ``ArgumentError`` naming ``rules``."""
    from ..decoding import Settings

    if not rules:
        return [], []
    known = [r for r in decoder_rules() if r != WALK]
    if tuple(rules) == ("all",):
        rules = known
    for r in rules:
        if r not in known:
            raise ArgumentError("rules", f": {r!r} is not a sequence-level tree rule the decoder takes; "
                                         f"choose from {', '.join(known)} (or 'all')")

    def takes(rule: str, k: int) -> bool:
        try:
            Settings.from_args(rule=rule, k=k, depth=depth)
        except ValueError:
            return False
        return True

    methods, skipped = [], []
    for rule in rules:
        ok = [k for k in ks if takes(rule, k)]
        for k in ks:
            if k not in ok:
                skipped.append(f"{rule} K={k}: not lossless for the full {k}-ary tree with i.i.d. drafts")
        if not ok and takes(rule, 1):
            ok = [1]
        for k in ok:
            methods.append(tree_method(f"{rule} K={k}", None, k, depth, law="iid", temperature=temperature, rule=rule))
    return methods, skipped


def plot_summary(summary: Sequence[dict], path: str | Path, *, title: str) -> Path | None:
    """Two bar panels (speedup over target-only, block efficiency); None without matplotlib."""
    from .. import _optional

    if not _optional.available("matplotlib"):
        return None
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    labels = [s["method"] for s in summary]
    y = list(range(len(labels)))
    fig, axes = plt.subplots(1, 2, figsize=(10, 0.35 * len(labels) + 1.6), dpi=110, sharey=True)
    colors = ["0.55" if s["method_kind"] != "tree" else "tab:green" if s.get("rule") not in (None, "token_walk")
              else ("tab:orange" if s["k"] == 1 else "tab:blue") for s in summary]
    for ax, key, xlabel in ((axes[0], "speedup", "speedup vs target-only (tokens/s)"),
                            (axes[1], "block_efficiency", "block efficiency (tokens / target call)")):
        vals = [s[key] if s[key] == s[key] else 0.0 for s in summary]
        ax.barh(y, vals, color=colors)
        ax.axvline(1.0, color="black", lw=0.8, ls=":")
        for yi, v in zip(y, vals):
            ax.text(v, yi, f" {v:.2f}", va="center", fontsize=7)
        ax.set_xlabel(xlabel, fontsize=8)
        ax.grid(axis="x", alpha=0.3)
    axes[0].set_yticks(y, labels, fontsize=8)
    axes[0].invert_yaxis()
    fig.suptitle(title, fontsize=9)
    return plots.save(fig, path)


def _eprint(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def run_demo(cfg: DemoConfig, *, log: Callable[[str], None] = _eprint, show_progress: bool = True,
             models=None) -> dict:
    """Run the comparison; returns ``{"summary", "rows", "skipped", "jsonl", "markdown", "png", "settings"}``.

    ``models`` may pass an already loaded ``(target, draft, tokenizer)``.
    """
    if not isinstance(cfg, DemoConfig):
        raise ArgumentError("cfg", f"must be a DemoConfig, got {type(cfg).__name__}")
    methods, skipped = list(cfg.methods), list(cfg.skipped)  # planned and checked once, when cfg was made
    prompts = load_prompts("humaneval", cfg.prompts)
    out_dir = Path(cfg.out_dir)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise OSError(f"out_dir: cannot create {out_dir}: {exc.strerror or exc}") from None
    t_start = time.perf_counter()
    if models is None:
        from ..decoding.pair import load_pair

        models = load_pair("transformers", target=cfg.target, draft=cfg.draft, cache_dir=cfg.cache_dir, log=log)
    target, draft, tok = models
    eos = tok.eos_token_id if cfg.stop_at_eos else None
    encoded = [(tid, encode_prompt(tok, text, chat=cfg.chat)) for tid, text in prompts]

    settings = {
        "target": cfg.target or "default (Qwen2.5-Coder-1.5B-Instruct)",
        "draft": cfg.draft or "default (Qwen2.5-Coder-0.5B-Instruct)",
        "prompts": [tid for tid, _ in prompts],
        "max_new_tokens": cfg.max_new_tokens, "depth": cfg.depth, "ks": list(cfg.ks),
        "temperature": cfg.temperature, "seed": cfg.seed, "chat_template": cfg.chat,
        "stop_at_eos": cfg.stop_at_eos, "torch_threads": torch.get_num_threads(),
        "methods": [m.label for m in methods],
    }
    log("demo settings: " + ", ".join(f"{k}={v}" for k, v in settings.items() if k != "methods"))
    log(f"demo methods ({len(methods)}): " + ", ".join(m.label for m in methods))
    for note in skipped:
        log(f"demo skips {note}")

    # warm-up (first calls allocate); the prompt cache makes these prefills the first prompt's
    decode_runs.warm_up(target, draft, encoded[0][1], depth=cfg.depth, temperature=cfg.temperature)

    jsonl = out_dir / "demo.jsonl"
    if jsonl.exists():
        jsonl.unlink()  # one run per file; the previous run is replaced
    config = cfg.binding()
    with JsonlWriter(jsonl, config, cfg.seed, kind="demo", skipped=skipped) as w:
        done = decode_runs.run(target, draft, encoded, methods, seed=cfg.seed, max_new_tokens=cfg.max_new_tokens,
                               eos_token_id=eos, write=lambda row: w.write(**row), time_budget_s=cfg.time_budget_s,
                               progress=(lambda it, total, desc: _progress(it, total=total, desc=desc))
                               if show_progress else None, desc="demo", log=lambda m: log(f"demo {m}"))
        rows = done.rows
        summary = decode_runs.summarize(rows, methods)
        for s in summary:
            w.write(kind="summary", **s)
        if done.stopped:
            skipped = skipped + [done.stopped]
            settings["prompts"] = settings["prompts"][: len({r["prompt"] for r in rows})]

    elapsed = time.perf_counter() - t_start
    title = (f"multidraft demo: {len(prompts)} HumanEval prompts, {cfg.max_new_tokens} new tokens, "
             f"T={cfg.temperature:g}, depth {cfg.depth}")
    table = decode_runs.format_table(summary)
    md_path = out_dir / "demo.md"
    write_file(md_path,  # the whole file or nothing (records.write_file)
               f"# {title}\n\n"
               + "\n".join(f"- {k}: {v}" for k, v in settings.items())
               + f"\n- wall time: {elapsed:.0f} s (loading included)\n"
               + ("".join(f"- skipped {s}\n" for s in skipped))
               + "\n" + table + "\n", "write the demo table")
    png = plot_summary(summary, out_dir / "demo.png", title=title)
    return {"summary": summary, "rows": rows, "skipped": skipped, "jsonl": jsonl, "markdown": md_path,
            "png": png, "settings": settings, "title": title, "table": table, "seconds": elapsed}
