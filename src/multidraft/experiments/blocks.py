"""Blocks experiment: end-to-end block efficiency vs K and depth per verifier.

For each prompt (HumanEval by default), verifier, draft law, K and depth,
``multidraft.generate`` decodes ``max_new_tokens`` tokens; one JSONL row per run with block
efficiency (tokens per target forward pass), acceptance rate, target/draft calls and
tokens/s. A target-only run of the same engine (``verifier=None``: one token per target
call, KV cache) per prompt gives the tokens/s baseline (``verifier = "autoregressive"``,
K = depth = 0). The runs go through the one decode runner (:mod:`.decode_runs`: its seed rule,
row schema and interleaving); each prompt's prefill runs once (``PromptCache``) and is left
out of tokens/s. Rows are keyed by ``KEY``; a rerun writes only the missing ones.

Tree shapes: the full K-ary tree of each depth (default), or with ``budget`` = B the
``sequences`` trees of Khisti et al.'s and SpecTr's experiments at equal tree budget: K draft
sequences of length L = B // K (at most B draft nodes), one depth per K.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable, Sequence

from .. import verifiers as _verifiers
from .._errors import ArgumentError
from .._validate import as_int, as_ks, as_temperature, as_top_k, as_top_p
from ..datasets import check_dataset, load_prompts, prompt_ids
from ..decoding.pair import ENGINES
from ..drafts import parse_laws
from . import decode_runs
from .decode_runs import MethodSpec
from .records import JsonlWriter, lock_run_dir, resume, row_key

__all__ = ["KEY", "ENGINES", "BlocksConfig", "run"]

KEY = ("verifier", "law", "k", "depth", "temperature", "prompt")
# config keys that only choose which rows exist (rows carry them in KEY): may grow on a resume
KEYED = ("verifiers", "laws", "k", "depths", "temperature", "no_baseline")
DEFAULT_DEPTHS = (1, 3)


@dataclass(frozen=True)
class BlocksConfig:
    """One blocks experiment, validated once when made: every field is checked in
    ``__post_init__`` (``ArgumentError`` naming it) and stored resolved, so nothing below
    re-checks it: ``verifiers`` registered names (None: every registered one but lp_optimal),
    ``laws`` kinds (None: each verifier's implied law at each K), ``ks`` sorted numbers of
    drafts (``k``), ``depths`` the full K-ary trees' depths (None: 1, 3; None again once
    ``budget`` is given, which sets each depth to budget // K on ``sequences`` trees).
    ``dataset`` None is HumanEval, left out of the binding (runs made before the option);
    ``engine`` is not bound (the same rows on either engine), but llama.cpp's one batch a
    step bounds the tree sizes. ``methods`` (not a field to give) are the runs of every cell,
    the target-only baseline first, each one's decoding settings built once
    (``decode_runs.MethodSpec.settings``).
    """

    verifiers: tuple | None = None
    laws: tuple | None = None
    ks: tuple = (1, 2, 4)
    depths: tuple | None = None
    budget: int | None = None
    n_prompts: int = 2
    max_new_tokens: int = 32
    max_prompt_tokens: int | None = None
    temperature: float = 1.0
    draft_temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    baseline: bool = True
    dataset: str | None = None
    engine: str = "transformers"
    methods: tuple = field(init=False, repr=False, compare=False)

    def __post_init__(self):
        set_ = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 (frozen)
        if self.verifiers is None:
            names = tuple(n for n in _verifiers.names() if n != "lp_optimal")
        else:
            names = _verifiers.check_names(self.verifiers)
        set_("verifiers", names)
        if self.laws is not None:
            set_("laws", parse_laws(self.laws, name="laws"))
        ks = as_ks(self.ks, "k")
        set_("ks", ks)
        if self.budget is not None:
            if self.depths is not None:
                raise ArgumentError("budget", "sets each depth (budget // K); leave depths out")
            budget = as_int(self.budget, "budget", minimum=1)
            if budget < max(ks):
                raise ArgumentError("budget", f"must be >= every K (K sequences of length budget // K), "
                                              f"got {budget} and K = {list(ks)}")
            set_("budget", budget)
        else:
            depths = DEFAULT_DEPTHS if self.depths is None else \
                ((self.depths,) if not isinstance(self.depths, (list, tuple, range)) else tuple(self.depths))
            if not depths:
                raise ArgumentError("depths", "is empty; give at least one depth")
            set_("depths", tuple(as_int(d, "depths", minimum=1) for d in depths))
        set_("n_prompts", as_int(self.n_prompts, "n_prompts", minimum=1))
        set_("max_new_tokens", as_int(self.max_new_tokens, "max_new_tokens", minimum=1))
        if self.max_prompt_tokens is not None:
            set_("max_prompt_tokens", as_int(self.max_prompt_tokens, "max_prompt_tokens", minimum=1))
        set_("temperature", as_temperature(self.temperature, "temperature"))
        if self.draft_temperature is not None:
            set_("draft_temperature", as_temperature(self.draft_temperature, "draft_temperature"))
        set_("top_k", as_top_k(self.top_k, "top_k"))
        set_("top_p", as_top_p(self.top_p, "top_p"))
        if not isinstance(self.baseline, bool):
            raise ArgumentError("baseline", f"must be True or False, got {self.baseline!r}")
        if self.dataset is not None:
            try:
                set_("dataset", check_dataset(self.dataset))
            except ValueError as exc:
                raise ArgumentError.of("dataset", exc) from None
        if self.engine not in ENGINES:
            raise ArgumentError("engine", f"must be one of {', '.join(ENGINES)}, got {self.engine!r}")
        cells = self._cells()
        if self.engine == "llama.cpp":  # one batch a step there: checked from the sizes, before any model loads
            from ..trees import LLAMA_CPP_TREE_NODES, tree_nodes

            mode, cap = ("sequences" if self.budget is not None else "full"), LLAMA_CPP_TREE_NODES - 1
            for k, d in sorted({(k, d) for _, _, k, d in cells}):
                if tree_nodes(mode, k, d, cap) > cap:
                    raise ArgumentError("budget" if self.budget is not None else "depths",
                                        f": K = {k}, depth {d} has more than {cap} drafted nodes a step; "
                                        f"engine llama.cpp takes at most {cap} (one batch)")
        tree = "sequences" if self.budget is not None else None
        methods = [decode_runs.target_alone("target-only", temperature=self.temperature, top_k=self.top_k,
                                            top_p=self.top_p)] if self.baseline else []
        methods += [decode_runs.tree_method(f"{name} {law} K={k} depth {depth}", name, k, depth, law=law, tree=tree,
                                            temperature=self.temperature, draft_temperature=self.draft_temperature,
                                            top_k=self.top_k, top_p=self.top_p) for name, law, k, depth in cells]
        decode_runs.check_methods(methods, max_new_tokens=self.max_new_tokens)  # each method's settings, once
        set_("methods", tuple(methods))

    def _cells(self) -> list[tuple[str, str, int, int]]:
        """(verifier, law, K, depth) of every decoding run; ArgumentError ``laws`` (naming the laws
        that would work) when none is left."""
        cells = []
        for name in self.verifiers:
            v = _verifiers.get(name)
            for k in self.ks:
                here = v.laws_for(k)
                for law in (self.laws if self.laws is not None else [v.implied_law(k)] if here else []):
                    if law in here:
                        for depth in ([self.budget // k] if self.budget is not None else self.depths):
                            cells.append((name, law, k, depth))
        if not cells:
            lf = {name: _verifiers.get(name).laws_for for name in self.verifiers}
            works = "; ".join(f"{name}: " + (", ".join(f"K={k} {'/'.join(lf[name](k))}" for k in self.ks if lf[name](k))
                                             or "none at these K") for name in self.verifiers)
            raise ArgumentError("laws", f": no (verifier, law, K) combination is supported for laws "
                                        f"{list(self.laws or [])} and K in {list(self.ks)}; laws that would work: {works}")
        return cells

    @property
    def prompts_dataset(self) -> str:
        return self.dataset or "humaneval"

    def binding(self, model_names: dict) -> dict:
        """The config ``blocks.jsonl`` is bound to (JSON-ready; ``KEYED`` keys may grow on a
        resume): the keys and order the blocks runs have always written, ``budget`` and ``tree``
        only with a budget and ``dataset`` only when given, so that older files still resume."""
        b = {"experiment": "blocks", "models": dict(model_names), "verifiers": list(self.verifiers),
             "laws": list(self.laws) if self.laws is not None else None, "k": list(self.ks),
             "depths": list(self.depths) if self.depths is not None else None}
        if self.budget is not None:
            b.update(budget=self.budget, tree="sequences")
        b.update(prompts=self.n_prompts, max_new_tokens=self.max_new_tokens, max_prompt_tokens=self.max_prompt_tokens,
                 temperature=self.temperature, draft_temperature=self.draft_temperature, top_k=self.top_k,
                 top_p=self.top_p, no_baseline=not self.baseline)
        if self.dataset is not None:
            b["dataset"] = self.dataset
        return b


_FIELDS = tuple(f.name for f in fields(BlocksConfig) if f.init)


def run(
    run_dir: str | Path,
    config: BlocksConfig | dict | None = None,
    *,
    models: Callable[[], tuple],
    model_names: dict,
    seed: int = 0,
    log: Callable[[str], None] = lambda _m: None,
    progress=None,
    **fields_,
) -> Path:
    """Run the missing (prompt, verifier, law, K, depth) cells of ``config`` (a
    :class:`BlocksConfig`, validated once when made) into ``RUN_DIR/blocks.jsonl``, bound to
    ``config.binding(model_names)``; returns the path.

    The older call still works: the fields as keywords (``verifiers``, ``laws``, ``ks``,
    ``depths``, ``budget``, ``n_prompts``, ...; ``depths`` ignored with a ``budget``) and
    ``config`` the dict to bind the file to."""
    binding = None
    if config is None or isinstance(config, dict):
        bad = sorted(set(fields_) - set(_FIELDS))
        if bad:
            raise TypeError(f"blocks.run: unexpected keyword arguments {bad}")
        if fields_.get("budget") is not None:
            fields_["depths"] = None  # the budget sets each depth
        binding = config
        config = BlocksConfig(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in fields_.items()})
    elif fields_:
        raise TypeError(f"blocks.run: give the fields in the BlocksConfig, not as keywords {sorted(fields_)}")
    elif not isinstance(config, BlocksConfig):
        raise ArgumentError("config", f"must be a BlocksConfig, got {type(config).__name__}")
    c = config
    if binding is None:
        binding = c.binding(model_names)
    methods: Sequence[MethodSpec] = c.methods
    dataset = c.prompts_dataset
    prompts = load_prompts(dataset, c.n_prompts, seed=seed)
    path = Path(run_dir) / "blocks.jsonl"
    with lock_run_dir(run_dir):  # one process per run directory
        done = resume(path, binding, seed, key_fields=KEY, keyed=KEYED)  # refuses another run's file

        def finished(pid: str, m) -> bool:
            return row_key(_key(pid, m), KEY) in done

        todo = [(pid, text) for pid, text in prompts if not all(finished(pid, m) for m in methods)]
        if not todo:
            return path
        target, draft, tokenizer = models()
        encoded = []
        for pid, text in todo:
            ids = prompt_ids(tokenizer, dataset, text)
            if c.max_prompt_tokens is not None:
                ids = ids[:, -c.max_prompt_tokens:]  # keep the end of the prompt (the function header)
            encoded.append((pid, ids))
        with JsonlWriter(path, binding, seed, keyed=KEYED, models=model_names) as w:
            decode_runs.run(target, draft, encoded, methods, seed=seed, max_new_tokens=c.max_new_tokens,
                            skip=finished, write=lambda row: w.write(**row), progress=progress, desc="blocks", log=log)
        return path


def _key(pid: str, m: MethodSpec) -> dict:
    """The row key of method ``m`` on prompt ``pid`` (``KEY``'s fields of its row)."""
    return {**m.describe(), "prompt": pid}
