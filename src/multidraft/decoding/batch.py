"""Batched multi-draft decoding: concurrent sequences (lanes) share every forward pass.

A lane is one ``generate`` call: its own prompt, :class:`Settings` (temperature, top-k / top-p,
tree, rule, ``max_new_tokens``), eos ids and ``torch.Generator``. Each lane's decode is the
engine's own code path (``engine._Decoder.decode`` over the lane's ``step.DecoderStep``: a
generator that yields every forward pass it needs as a ``step.Call`` and is sent the logits
back); :class:`BatchDecoder` runs the pending calls of all lanes as ONE forward per model:

* a draft tick: every lane that asks for a draft level (its level-0 chain or a tree level)
  has it run in one draft forward; lanes waiting for their target pass wait;
* a target tick, when no lane asks for the draft: every lane's ``[root] + tree`` in one
  target forward.

Why per-lane equivalence is the property to keep: batched speculative decoding is where
exactness breaks in practice (Batch speculative decoding done right, arXiv 2510.22876: ragged
tensors mixed up between rows in existing implementations); here a lane shares no state with
another lane but the forward pass, and each lane's rows of it are its own (the masks below).

Lanes join (:meth:`BatchDecoder.add`) and leave (when they finish, or :meth:`BatchDecoder.cancel`)
between ticks: continuous batching. Per lane, the calls, their arguments and the order in
which the lane's generator is consumed are those of ``generate`` alone; the only things shared
are the forward passes. So **a lane's tokens equal those of ``generate`` with the same seed**
exactly when each lane's logits in a batched forward equal its logits alone, and differ by no
more than the logit differences otherwise (``docs/guide/decoding.md``, "Batches", gives the
measured differences per engine and what the tests check).

Batch runners (the runner protocol of ``runners`` with a lane argument): ``open(lane, ids)``
(prefill the lane's committed prefix, ``ids`` ``[1, T]``), ``extend(calls)`` with calls
``(lane, tokens, parents, last_only)`` (one forward; per lane exactly the single runner's
``extend`` semantics and logits ``[n, V]`` or ``[1, V]``), ``commit(lane, handles)`` and
``close(lane)``.

* :class:`HFBatchRunner` (transformers): each lane keeps its own ``DynamicCache`` (compacted by
  ``kv.keep`` as in ``HFRunner``). A forward stacks the lanes' caches right-padded to a common
  length ``P`` and the lanes' new tokens right-padded to a common count ``N``: inputs ``[B, N]``,
  per-row positions ``[B, N]`` and an additive mask ``[B, 1, N, P + N]`` in which row b sees
  its committed prefix, its uncommitted ancestors and itself (its tree mask) and nothing of
  the padding; a padding token sees only itself, its logits and cache entries are dropped.
  The lanes' new entries are appended to their own caches.
* :class:`LlamaBatchRunner` (llama.cpp): one context for all lanes; a lane holds its own
  sequence ids, as many as its trees need (``reserve``: one for its committed prefix, one per
  uncommitted entry of a step), taken from the context's ``n_seq_max`` (256): exactly
  ``llamacpp.LlamaRunner``'s tree attention by sequence ids with the lane's ids in place of
  0, 1, 2, ...; one ``llama_decode`` per tick. The context's ``n_ctx`` cells and its sequence
  ids are shared: a lane is admitted only when its prompt, ``max_new_tokens`` and one step's
  tree fit beside the lanes already open (``BatchDecoder.fits``).
"""
from __future__ import annotations

import operator
import time

import torch

from .._validate import ArgumentError, as_generator, derive_seed
from .pace import check_cost_profile
from .engine import GenerationResult, _check_models, _Decoder, decode_context
from .kv import fresh_prefill, keep, new_cache
from .runners import _is_llama, hf_forward
from .settings import Settings, settings_or_kwargs
from .step import DecoderStep

__all__ = ["BatchDecoder", "LaneError", "generate_batch", "HFBatchRunner", "LlamaBatchRunner", "DEFAULT_MAX_LANES"]

DEFAULT_MAX_LANES = 8


class LaneError(RuntimeError):
    """A lane's decode raised ``__cause__`` in :meth:`BatchDecoder.step`: ``lane`` (now closed)
    and ``finished``, the ``{lane: GenerationResult}`` that step finished otherwise."""

    def __init__(self, lane: int, exc: BaseException, finished: dict):
        super().__init__(f"lane {lane}: {type(exc).__name__}: {exc}")
        self.lane, self.finished = lane, finished


class _Lane:
    """One lane's view of a batch runner in the single runner protocol (prefill / commit; its
    ``extend`` calls go through the batch decoder, which serves them for all lanes at once)."""

    def __init__(self, runner, lane: int):
        self.runner, self.lane = runner, lane

    def prefill(self, ids: torch.Tensor) -> float:  # ids [1, T]
        return self.runner.open(self.lane, ids)

    def extend(self, tokens, parents, last_only=False):  # one lane alone (step.drive)
        return self.runner.extend([(self.lane, tokens, parents, last_only)])[0]

    def commit(self, handles: list[int]) -> None:
        self.runner.commit(self.lane, handles)


# ---------------------------------------------------------------------------------------------
class _TreeBook:
    """The uncommitted entries of one lane (the single runners' bookkeeping): the position of
    each handle and its ancestor-or-self matrix."""

    def __init__(self, base: int = 0):
        self.base = base
        self.pos: list[int] = []
        self.anc = torch.zeros(0, 0, dtype=torch.bool)  # [M, M]

    def add(self, parents: list[int]) -> torch.Tensor:
        """Append entries with these parents; returns their rows of the ancestor matrix ``[n, M + n]``."""
        M, n = len(self.pos), len(parents)
        anc = torch.zeros(M + n, M + n, dtype=torch.bool)
        anc[:M, :M] = self.anc
        for i, par in enumerate(parents):
            h = M + i
            if not -1 <= par < h:
                raise ValueError(f"parents[{i}] = {par}: a parent is -1 or an earlier handle (< {h})")
            if par >= 0:
                anc[h] = anc[par]
            anc[h, h] = True
            self.pos.append(self.pos[par] + 1 if par >= 0 else self.base)
        self.anc = anc
        return anc[M:]

    def commit(self, n: int) -> None:
        self.base += n
        self.pos, self.anc = [], torch.zeros(0, 0, dtype=torch.bool)


def _check_lane(lane, max_lanes: int) -> int:
    if isinstance(lane, bool) or not isinstance(lane, int) or not 0 <= lane < max_lanes:
        raise ArgumentError("lane", f"must be an integer in [0, {max_lanes}), got {lane!r}")
    return lane


class HFBatchRunner:
    """Lanes of a transformers causal LM sharing its forward passes (see the module notes).

    Row b of a forward: queries ``[N]`` (its n_b tokens, then padding), keys ``[P + N]`` (its
    cache of L_b entries, zero padding to P, the N new ones); additive mask
    ``m[b, 0, i, j] = 0`` iff (j < base_b) or (base_b <= j < L_b and uncommitted entry j is an
    ancestor of token i) or (j = P + i' with i' an ancestor-or-self of i in this call), else the
    dtype's minimum; a padding query i >= n_b sees only j = P + i.
    """

    engine = "transformers"

    def __init__(self, model, max_lanes: int = DEFAULT_MAX_LANES):
        self.model = model
        self.max_lanes = max_lanes
        self.dtype = next(model.parameters()).dtype
        self.device = next(model.parameters()).device
        self.caches: dict[int, object] = {}
        self.books: dict[int, _TreeBook] = {}

    def open(self, lane: int, ids: torch.Tensor) -> float:  # ids [1, T]
        _check_lane(lane, self.max_lanes)
        self.caches[lane], secs = fresh_prefill(self.model, ids.to(self.device))
        self.books[lane] = _TreeBook(int(ids.shape[1]))
        return secs

    def close(self, lane: int) -> None:
        self.caches.pop(lane, None)
        self.books.pop(lane, None)

    def reserve(self, lane: int, settings: Settings) -> None:
        """Nothing to reserve (the llama.cpp runner's sequence ids); checks the lane id."""
        _check_lane(lane, self.max_lanes)

    def _length(self, lane: int) -> int:
        return int(self.caches[lane].get_seq_length())

    def extend(self, calls: list) -> list[torch.Tensor]:
        """One forward for ``calls`` = ``[(lane, tokens, parents, last_only), ...]`` (distinct
        lanes); returns each call's logits (``[n, V]``, or ``[1, V]`` with ``last_only``)."""
        B = len(calls)
        if len({c[0] for c in calls}) != B:
            raise ValueError("calls: one call per lane in a forward")
        if B == 1:  # a lone lane: HFRunner's own forward on the lane's cache (bitwise generate)
            lane, tokens, parents, last_only = calls[0]
            book = self.books[lane]
            M = len(book.pos)
            vis = book.add(parents)
            chain = M == 0 and all(p == i - 1 for i, p in enumerate(parents))
            return [hf_forward(self.model, self.caches[lane], tokens, book.pos[M:], vis, book.base, chain, last_only)]
        lens = [self._length(c[0]) for c in calls]
        ns = [len(c[1]) for c in calls]
        P, N = max(lens), max(ns)
        tok = torch.zeros(B, N, dtype=torch.long)
        pos = torch.zeros(B, N, dtype=torch.long)
        allowed = torch.zeros(B, N, P + N, dtype=torch.bool)
        for b, (lane, tokens, parents, _) in enumerate(calls):
            book = self.books[lane]
            if len(parents) != len(tokens):
                raise ValueError(f"calls: lane {lane} has {len(tokens)} tokens but {len(parents)} parents")
            M, n = len(book.pos), ns[b]
            vis = book.add(parents)  # [n, M + n]
            tok[b, :n] = torch.tensor(tokens, dtype=torch.long)
            pos[b, :n] = torch.tensor(book.pos[M:], dtype=torch.long)
            allowed[b, :n, : book.base] = True
            allowed[b, :n, book.base : book.base + M] = vis[:, :M]
            allowed[b, :n, P : P + n] = vis[:, M:]
            idx = torch.arange(n, N)
            allowed[b, idx, P + idx] = True  # padding queries: themselves only
            pos[b, n:] = book.base
        mask = torch.zeros(B, 1, N, P + N, dtype=self.dtype)
        mask.masked_fill_(~allowed.view(B, 1, N, P + N), torch.finfo(self.dtype).min)
        cache = self._stacked([c[0] for c in calls], lens, P)
        out = self.model(input_ids=tok.to(self.device), position_ids=pos.to(self.device),
                         attention_mask=mask.to(self.device), cache=cache, use_cache=True)
        logits = out.logits  # [B, N, V]
        for b, (lane, *_rest) in enumerate(calls):  # the new entries join each lane's own cache
            own = self.caches[lane]
            for src, dst in zip(cache.layers, own.layers):
                k = src.keys[b : b + 1, :, P : P + ns[b]]
                v = src.values[b : b + 1, :, P : P + ns[b]]
                if dst.is_initialized and dst.keys is not None and dst.keys.numel():
                    k, v = torch.cat([dst.keys, k], dim=-2), torch.cat([dst.values, v], dim=-2)
                _set_layer(dst, k.contiguous(), v.contiguous())
        return [logits[b, ns[b] - 1 : ns[b]] if c[3] else logits[b, : ns[b]] for b, c in enumerate(calls)]

    def _stacked(self, lanes: list[int], lens: list[int], P: int):
        """A fresh cache whose row b is lane b's cache right-padded with zeros to P entries."""
        cache = new_cache(self.model)
        if P == 0:
            return cache
        ref = next(self.caches[l] for l, n in zip(lanes, lens) if n == P)
        for i, layer in enumerate(cache.layers):
            rk, rv = ref.layers[i].keys, ref.layers[i].values  # [1, H, P, D]
            if len(lanes) == 1:
                k, v = rk, rv
            else:
                k = rk.new_zeros((len(lanes),) + tuple(rk.shape[1:]))
                v = rv.new_zeros((len(lanes),) + tuple(rv.shape[1:]))
                for b, (lane, n) in enumerate(zip(lanes, lens)):
                    if n:
                        k[b, :, :n] = self.caches[lane].layers[i].keys[0]
                        v[b, :, :n] = self.caches[lane].layers[i].values[0]
            _set_layer(layer, k, v)
        return cache

    def commit(self, lane: int, handles: list[int]) -> None:
        book = self.books[lane]
        j = 0  # handles already in place (a committed chain) are not moved
        while j < len(handles) and handles[j] == j:
            j += 1
        extra = torch.tensor([book.base + h for h in handles[j:]], dtype=torch.long)
        keep(self.caches[lane], book.base + j, extra)
        book.commit(len(handles))


def _set_layer(layer, keys: torch.Tensor, values: torch.Tensor) -> None:
    """Set a ``DynamicLayer``'s tensors (``[B, H, T, D]``) as its ``update`` would have."""
    if not layer.is_initialized:
        layer.lazy_initialization(keys, values)
    layer.keys, layer.values = keys, values


class LlamaBatchRunner:
    """Lanes of a ``LlamaCppModel`` sharing its ``llama_decode`` calls (see the module notes)."""

    engine = "llama.cpp"

    def __init__(self, model, max_lanes: int = DEFAULT_MAX_LANES):
        self.m = model
        self.max_lanes = max_lanes
        if 2 * max_lanes > model.n_seq_max:
            raise ArgumentError("max_lanes", f"= {max_lanes}: llama.cpp allows {model.n_seq_max} sequences, at "
                                             f"least 2 per lane; use max_lanes <= {model.n_seq_max // 2}")
        model.hold(self)  # the lanes hold the context from here, cleared (llamacpp notes, "One holder at a time")
        self.n_cells = int(model._L.llama_n_ctx(model._ctx))  # KV cells shared by the lanes
        self.free: list[int] = list(range(model.n_seq_max))  # sequence ids no lane holds
        self.seqs: dict[int, list[int]] = {}  # lane -> its prefix's sequence id, then one per handle
        self.books: dict[int, _TreeBook] = {}
        self.anchor: dict[int, list[int]] = {}

    @staticmethod
    def handles(settings: Settings) -> int:
        """Most uncommitted entries a lane holds in one step on either model: the target's tree
        (free sources' chains included: ``Settings.max_nodes``), or the draft's pending chain (up to depth + 1 tokens) and the nodes it feeds."""
        if settings.target_alone:
            return 1
        return settings.max_nodes + (settings.shape.depth + 1 if settings.uses_draft else 0)

    @property
    def lanes_open(self) -> int:
        """Lanes holding sequence ids (``LlamaCppModel.hold`` refuses a ``generate`` on the model then)."""
        return len(self.seqs)

    def reserve(self, lane: int, settings: Settings) -> None:
        """Give ``lane`` the sequence ids its settings need (``handles`` + 1; before ``open``). When
        another decoder used the model's context since (a ``generate`` on it between two requests),
        the context is taken back, cleared: its cells are none of the lanes' (``LlamaCppModel.hold``);
        ``ValueError`` if lanes of this runner were open then (their cells are gone)."""
        _check_lane(lane, self.max_lanes)
        self.close(lane)
        if self.m.holder is not self:
            if self.seqs:
                raise ValueError(f"llama.cpp batch: another decoder took this model's context while lanes "
                                 f"{sorted(self.seqs)} were open; their KV cells are gone")
            self.m.hold(self)
        n = 1 + self.handles(settings)
        if n > len(self.free):
            raise ArgumentError("settings", f": this lane's trees need {n} llama.cpp sequence ids but {len(self.free)} "
                                            f"of {self.m.n_seq_max} are free; wait for a lane to finish, or use "
                                            "smaller trees")
        self.seqs[lane], self.free = self.free[:n], self.free[n:]

    def cells(self, T: int, settings: Settings) -> int:
        """KV cells a lane may hold at once: prompt, output and one step's uncommitted entries."""
        return T + settings.max_new_tokens + self.handles(settings)

    def _seq(self, lane: int, h: int = -1) -> int:
        """Lane's sequence id of its committed prefix (h = -1) or of its uncommitted handle h."""
        return self.seqs[lane][1 + h]

    def open(self, lane: int, ids: torch.Tensor) -> float:  # ids [1, T]
        if lane not in self.seqs:
            raise ValueError(f"lane {lane} has no sequence ids: reserve(lane, settings) before open")
        for s in self.seqs[lane]:
            self.m.seq_rm(s)
        m, toks = self.m, [int(x) for x in ids[0].tolist()]
        s = self._seq(lane)
        t0 = time.perf_counter()
        for a in range(0, len(toks), m.n_batch):
            chunk = toks[a:a + m.n_batch]
            last = a + len(chunk) == len(toks)
            m.decode(chunk, list(range(a, a + len(chunk))), [[s]] * len(chunk),
                     [last and i == len(chunk) - 1 for i in range(len(chunk))])
        self.books[lane] = _TreeBook(len(toks))
        self.anchor[lane] = []
        return time.perf_counter() - t0

    def close(self, lane: int) -> None:
        for s in self.seqs.pop(lane, []):
            self.m.seq_rm(s)
            self.free.append(s)
        self.books.pop(lane, None)
        self.anchor.pop(lane, None)

    def extend(self, calls: list) -> list[torch.Tensor]:
        """One ``llama_decode`` (more when the tokens exceed ``n_batch``) for ``calls`` =
        ``[(lane, tokens, parents, last_only), ...]``; each call's logits (views of llama.cpp's
        buffer when one decode served them all, valid until the next decode)."""
        m = self.m
        groups, cur, size = [], [], 0
        for c in calls:
            if len(c[1]) > m.n_batch:
                raise ValueError(f"{len(c[1])} tokens in one call but n_batch = {m.n_batch}")
            if cur and size + len(c[1]) > m.n_batch:
                groups.append(cur)
                cur, size = [], 0
            cur.append(c)
            size += len(c[1])
        groups.append(cur)
        out: list[torch.Tensor] = []
        for g in groups:
            rows = self._decode(g)
            out.extend(r.clone() for r in rows) if len(groups) > 1 else out.extend(rows)
        return out

    def _decode(self, calls: list) -> list[torch.Tensor]:
        m = self.m
        if m.holder is not self:  # another BatchDecoder took the context (LlamaCppModel.hold): the lanes' cells are gone
            raise ValueError("llama.cpp batch: another decoder took this model's context; the lanes' KV cells are gone")
        tokens, pos, seqs, want, counts = [], [], [], [], []
        for lane, toks, parents, last_only in calls:
            book, anchor = self.books[lane], self.anchor[lane]
            M, n = len(book.pos), len(toks)
            if M + n > len(self.seqs[lane]) - 1:
                raise ValueError(f"llama.cpp batch: lane {lane} has {M + n} uncommitted entries in one step but "
                                 f"{len(self.seqs[lane]) - 1} sequence ids for them (reserve(lane, settings))")
            book.add(parents)
            first = len(seqs)
            for i, par in enumerate(parents):
                h = M + i
                anchor.append(anchor[par] if par >= M else par)
                m.seq_cp(self._seq(lane, anchor[h]), self._seq(lane, h))
                seqs.append([self._seq(lane, h)])
                a = par
                while a >= M:  # every ancestor in this batch also carries h's sequence
                    seqs[first + a - M].append(self._seq(lane, h))
                    a = parents[a - M]
            tokens.extend(toks)
            pos.extend(book.pos[M:])
            want.extend([True] * n if not last_only else [i == n - 1 for i in range(n)])
            counts.append(1 if last_only else n)
            for i in range(n):  # later batches anchor on these entries directly
                anchor[M + i] = M + i
        logits = m.decode(tokens, pos, seqs, want)
        out, a = [], 0
        for k in counts:
            out.append(logits[a:a + k])
            a += k
        return out

    def commit(self, lane: int, handles: list[int]) -> None:
        m, book = self.m, self.books[lane]
        if handles:
            m.seq_cp(self._seq(lane, handles[-1]), self._seq(lane))  # the path joins the prefix
        for h in range(len(book.pos)):
            m.seq_rm(self._seq(lane, h))  # cells of no sequence left are freed
        book.commit(len(handles))
        self.anchor[lane] = []


def batch_runner(model, max_lanes: int):
    """The batch runner of ``model``: ``LlamaBatchRunner`` or ``HFBatchRunner``."""
    return LlamaBatchRunner(model, max_lanes) if _is_llama(model) else HFBatchRunner(model, max_lanes)


# ---------------------------------------------------------------------------------------------
class BatchDecoder:
    """Lanes of multi-draft decoding sharing the target's and the draft's forward passes.

    ``BatchDecoder(target, draft, max_lanes=8)``; ``add(input_ids, settings, generator=...)``
    opens a lane (returns its id) and prefills it; ``step()`` runs one shared forward (a draft
    tick or a target tick, module notes) and returns ``{lane: GenerationResult}`` of the lanes
    that finished in it (their lane ids are free again); ``run()`` steps until every lane is
    done; ``cancel(lane)`` drops a lane mid-decode. Lane i's tokens are those of
    ``generate(target, draft, input_ids_i, settings_i, generator=g_i, eos_token_id=eos_i)``
    (the engines' floating-point caveat: ``docs/guide/decoding.md``, "Batches").

    A lane's ``GenerationResult.seconds`` is its wall time from its first step to its last,
    the other lanes' share of the forwards included. An exception raised in a lane's decode
    (e.g. by its ``on_step``) closes that lane and, after every other lane of the tick has
    been served, is raised from ``step`` as a :class:`LaneError` (``lane``, and ``finished``:
    the results that tick finished); the other lanes go on at the next ``step``.

    The models serve this decoder alone while it has lanes (a llama.cpp model's context is
    cleared when the decoder is made; a single ``generate`` on it clears it again).

    ``index``: the free sources' shared state across lanes (``sources.SuffixIndex``: the suffix
    source reads the earlier lanes' outputs, each lane's indexed when it finishes; None: each
    lane's suffix source reads its own text only).

    ``cost_profile``: None, or a ``treeopt.CostProfile`` by which every lane paces its own
    drafting depth from its own acceptances and cuts its free chains (``generate``'s
    ``cost_profile``: ``decoding.pace``, ``decoding.sources.budget``): speculation chosen per
    request, as it goes.
    """

    def __init__(self, target, draft=None, *, max_lanes: int = DEFAULT_MAX_LANES, index=None, cost_profile=None):
        if isinstance(max_lanes, bool) or not isinstance(max_lanes, int) or max_lanes < 1:
            raise ArgumentError("max_lanes", f"must be a positive integer, got {max_lanes!r}")
        from .runners import is_model

        if not is_model(target):
            raise ArgumentError("target", "must be a loaded transformers causal LM or a multidraft.decoding.LlamaCppModel")
        if draft is not None and not is_model(draft):
            raise ArgumentError("draft", "must be None or a loaded transformers causal LM or LlamaCppModel")
        self.target, self.draft, self.max_lanes = target, draft, max_lanes
        self.index = index
        check_cost_profile(cost_profile)
        self.cost_profile = cost_profile
        self.tr = batch_runner(target, max_lanes)
        self.dr = batch_runner(draft, max_lanes) if draft is not None else None
        self.lanes: dict[int, dict] = {}  # lane -> {dec, gen, call, cells}

    @property
    def free_lanes(self) -> int:
        return self.max_lanes - len(self.lanes)

    def _cells_free(self) -> int | None:
        if not _is_llama(self.target):
            return None
        n = min(self.tr.n_cells, self.dr.n_cells) if self.dr is not None else self.tr.n_cells
        return n - sum(ln["cells"] for ln in self.lanes.values())

    def fits(self, input_ids: torch.Tensor, settings: Settings) -> bool:
        """Whether ``add`` would admit this prompt now (a free lane and, on llama.cpp, free KV cells)."""
        if not self.free_lanes:
            return False
        free = self._cells_free()
        if free is None:
            return True
        ids_needed = 1 + self.tr.handles(settings)
        runners = [self.tr] + ([self.dr] if self.dr is not None and settings.uses_draft else [])
        return self.tr.cells(int(input_ids.shape[-1]), settings) <= free and \
            all(ids_needed <= len(r.free) for r in runners)

    def add(self, input_ids: torch.Tensor, settings: Settings | None = None, *, generator=None,
            eos_token_id=None, on_step=None, logprobs=None, **kwargs) -> int:
        """Open a lane decoding ``input_ids`` ``[1, T]``: ``generate``'s arguments (settings or
        keyword settings, ``generator`` a torch.Generator or a seed, ``eos_token_id``,
        ``on_step``); returns the lane id. The lane's prompt is prefilled here (alone).
        ``logprobs``: None or a ``step.TokenLogprobs`` the lane's steps extend (the target's
        log-probabilities of the emitted tokens, from the scoring passes)."""
        g = as_generator(generator)
        settings = settings_or_kwargs(settings, kwargs, "a multidraft.decoding.Settings")
        if settings.uses_draft and self.draft is None:
            raise ArgumentError("draft", "is None but these settings draft; give the BatchDecoder a draft model "
                                         "(or verifier=None for the target alone)")
        eos = _check_models(self.target, self.draft if settings.uses_draft else None, input_ids, settings, eos_token_id)
        if on_step is not None and not callable(on_step):
            raise ArgumentError("on_step", "must be None or a callable on_step(tokens)")
        if not self.free_lanes:
            raise ArgumentError("max_lanes", f": all {self.max_lanes} lanes are busy; wait for one to finish "
                                             "(step() returns the finished lanes) or make the decoder with more")
        cells = 0
        free = self._cells_free()
        if free is not None:
            cells = self.tr.cells(int(input_ids.shape[1]), settings)
            if cells > free:
                raise ArgumentError("input_ids", f": this lane may need {cells} KV cells (prompt, max_new_tokens and "
                                                 f"one step's tree) but {free} of the llama.cpp context are free; wait "
                                                 "for a lane to finish, or load the models with a larger n_ctx")
        lane = next(i for i in range(self.max_lanes) if i not in self.lanes)
        views = (_Lane(self.tr, lane), _Lane(self.dr, lane) if (self.dr is not None and settings.uses_draft) else None)
        try:
            self.tr.reserve(lane, settings)
            if views[1] is not None:
                self.dr.reserve(lane, settings)
            with torch.inference_mode():
                step = DecoderStep(views[0], views[1], settings, g, index=self.index, logprobs=logprobs,
                                   cost=self.cost_profile)
                dec = _Decoder(step, decode_context(self.target, views[1] and self.draft), eos=eos, on_step=on_step)
                gen = dec.decode(input_ids)
                call = next(gen)  # prefills the lane; a decode always runs at least one forward
        except BaseException:
            self._free(lane)
            raise
        self.lanes[lane] = dict(dec=dec, gen=gen, call=call, cells=cells)
        return lane

    def cancel(self, lane: int) -> None:
        """Drop ``lane`` (its decode is abandoned; its caches freed)."""
        ln = self.lanes.pop(lane, None)
        if ln is None:
            raise ArgumentError("lane", f"= {lane!r} is not an open lane")
        ln["gen"].close()
        self._free(lane)

    def _free(self, lane: int) -> None:
        self.tr.close(lane)
        if self.dr is not None:
            self.dr.close(lane)

    def step(self) -> dict[int, GenerationResult]:
        """One shared forward (module notes); ``{lane: result}`` of the lanes finished by it."""
        if not self.lanes:
            return {}
        want = "d" if any(ln["call"].model == "d" for ln in self.lanes.values()) else "t"
        lanes = sorted(l for l, ln in self.lanes.items() if ln["call"].model == want)
        runner = self.dr if want == "d" else self.tr
        done: dict[int, GenerationResult] = {}
        with torch.inference_mode():
            calls = [(l, self.lanes[l]["call"].tokens, self.lanes[l]["call"].parents, self.lanes[l]["call"].last_only)
                     for l in lanes]
            logits = runner.extend(calls)
            failed: dict[int, BaseException] = {}
            for l, lg in zip(lanes, logits):  # every lane is sent its logits, whatever another raises
                ln = self.lanes[l]
                try:
                    ln["call"] = ln["gen"].send(lg)
                except StopIteration as stop:
                    done[l] = stop.value
                except Exception as exc:  # noqa: BLE001 - re-raised below as LaneError
                    failed[l] = exc
                else:
                    continue
                del self.lanes[l]
                self._free(l)
        if failed:
            lane, exc = next(iter(failed.items()))
            raise LaneError(lane, exc, done) from exc
        return done

    def run(self) -> dict[int, GenerationResult]:
        """Step until every lane is done; ``{lane: result}``."""
        out: dict[int, GenerationResult] = {}
        while self.lanes:
            out.update(self.step())
        return out


def _as_prompt(p, i: int) -> torch.Tensor:
    if isinstance(p, torch.Tensor):
        ids = p.view(1, -1) if p.ndim == 1 else p
    else:
        try:
            ids = torch.tensor([[operator.index(t) for t in p]], dtype=torch.long)
        except TypeError:
            raise ArgumentError("prompts", f": prompt {i} must be a LongTensor [1, T] or [T] or a list of token ids") from None
    return ids


def generate_batch(target, draft, prompts, settings=None, *, generator=None, eos_token_id=None,
                   max_lanes: int | None = None, **kwargs) -> list[GenerationResult]:
    """``generate`` for many prompts at once, the prompts sharing every forward pass.

    prompts      a list of prompts (LongTensor ``[1, T]`` or ``[T]``, or lists of token ids).
    settings     None (keyword settings in ``**kwargs``, as ``generate``), one ``Settings`` for
                 every prompt, or a list with one ``Settings`` per prompt.
    generator    one per prompt: a list of ``torch.Generator`` objects or integer seeds, or one
                 integer seed s, meaning seed s + i for prompt i (required).
    eos_token_id as ``generate``, for every prompt (``BatchDecoder.add`` takes one per lane).
    max_lanes    most prompts decoded at once (default min(len(prompts), 8)); the others join
                 as lanes finish (continuous batching).

    Returns one ``GenerationResult`` per prompt, in order. Result i's tokens are those of
    ``generate(target, draft, prompts[i], settings_i, generator=generator_i, eos_token_id=...)``
    (bitwise where the engine's batched logits equal its logits alone; ``docs/guide/decoding.md``).
    """
    if isinstance(prompts, torch.Tensor) or not isinstance(prompts, (list, tuple)):
        raise ArgumentError("prompts", "must be a list of prompts (LongTensors [1, T] or lists of token ids)")
    n = len(prompts)
    if n == 0:
        raise ArgumentError("prompts", "is empty; give at least one prompt")
    ids = [_as_prompt(p, i) for i, p in enumerate(prompts)]
    if isinstance(settings, (list, tuple)):
        if kwargs:
            raise ArgumentError("settings", f": give Settings or keyword settings, not both (got {', '.join(sorted(kwargs))})")
        if len(settings) != n:
            raise ArgumentError("settings", f"has {len(settings)} entries but there are {n} prompts; give one per prompt")
        for i, s in enumerate(settings):
            if not isinstance(s, Settings):
                raise ArgumentError("settings", f": entry {i} must be a multidraft.decoding.Settings, got {type(s).__name__}")
        plans = list(settings)
    else:
        plans = [settings_or_kwargs(settings, kwargs, "a Settings, a list of them")] * n
    if generator is None:
        raise ArgumentError("generator", "is required: a list of torch.Generator objects or seeds (one per prompt), "
                                         "or one integer seed s (prompt i gets s + i)")
    if isinstance(generator, (list, tuple)):
        if len(generator) != n:
            raise ArgumentError("generator", f"has {len(generator)} entries but there are {n} prompts; give one per prompt")
        gens = [as_generator(g) for g in generator]
    elif isinstance(generator, torch.Generator):
        raise ArgumentError("generator", "is one torch.Generator; each prompt needs its own: give a list of them, "
                                         "or one integer seed s (prompt i gets s + i)")
    else:
        try:
            s0 = operator.index(generator)
        except TypeError:
            raise ArgumentError("generator", f"must be a list of generators / seeds or one integer seed, got {generator!r}") from None
        gens = [as_generator(derive_seed(s0, i, rule="linear")) for i in range(n)]
    if max_lanes is None:
        max_lanes = min(n, DEFAULT_MAX_LANES)
    elif isinstance(max_lanes, bool) or not isinstance(max_lanes, int) or max_lanes < 1:
        raise ArgumentError("max_lanes", f"must be a positive integer, got {max_lanes!r}")
    needs_draft = any(s.uses_draft for s in plans)
    bd = BatchDecoder(target, draft if needs_draft else None, max_lanes=max_lanes)
    for i in range(n):  # every check before any decoding (each prompt against the models)
        try:
            eos = _check_models(target, draft if plans[i].uses_draft else None, ids[i], plans[i], eos_token_id)
        except ArgumentError as exc:
            if exc.arg != "input_ids":
                raise
            raise ArgumentError("prompts", f": prompt {i}{exc.detail}") from None
        if bd._cells_free() is not None and 1 + bd.tr.handles(plans[i]) > target.n_seq_max:
            raise ArgumentError("settings", f": entry {i}: its trees need {1 + bd.tr.handles(plans[i])} llama.cpp sequence "
                                            f"ids, more than the context's {target.n_seq_max}; use smaller trees")
        if bd._cells_free() is not None and bd.tr.cells(int(ids[i].shape[1]), plans[i]) > bd._cells_free():
            raise ArgumentError("prompts", f": prompt {i} may need {bd.tr.cells(int(ids[i].shape[1]), plans[i])} KV cells "
                                           f"(prompt, max_new_tokens and one step's tree), more than the llama.cpp "
                                           f"context's {bd._cells_free()}; load the models with a larger n_ctx")
    del eos
    results: list[GenerationResult | None] = [None] * n
    where: dict[int, int] = {}
    nxt = 0
    try:
        while nxt < n or bd.lanes:
            while nxt < n and bd.fits(ids[nxt], plans[nxt]):
                where[bd.add(ids[nxt], plans[nxt], generator=gens[nxt], eos_token_id=eos_token_id)] = nxt
                nxt += 1
            for lane, res in bd.step().items():
                results[where.pop(lane)] = res
    finally:  # a decode that raised leaves no lane open (the models' caches free for the next decode)
        for lane in list(bd.lanes):
            bd.cancel(lane)
    return results
