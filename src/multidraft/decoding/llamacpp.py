"""llama.cpp as a decoding engine (``pip install 'multidraft[llama]'``: llama-cpp-python).

``LlamaCppModel(path)`` loads a GGUF file directly (any quantisation llama.cpp reads: the
default pair's Q4_K_M files, or a BF16 requantisation, ``decoding.quantize.ensure_gguf``) and can be
passed to ``generate`` as target and draft, exactly where a transformers model goes; the
drafting, the verifiers and the walk are the engine's own (``step.DecoderStep``), only the
forward passes and the KV cache are llama.cpp's.

Tree attention through sequence ids. The context has a *unified* KV cache
(``kv_unified``): one pool of cells, each cell holding a token's K/V at a position and the
set of sequence ids it belongs to. llama.cpp lets a batch token attend to exactly the cells
that hold the token's *first* sequence id at positions <= its own. ``LlamaRunner`` keeps:

* sequence 0 = the committed prefix;
* each uncommitted entry with handle h (see ``runners``) owns sequence ``1 + h``, which is
  held by the committed prefix, by h's ancestors and by h itself: before a batch, every new
  entry's sequence is copied from its nearest ancestor already in the cache
  (``llama_memory_seq_cp``, no data moved in a unified cache), and in the batch an entry's
  cell carries its own sequence first and then the sequences of its descendants in the same
  batch. So entry h sees the prefix, its ancestors and itself, and nothing else: the tree
  attention mask, built by llama.cpp from sequence ids. (Every entry has its own first
  sequence, so llama.cpp's per-sequence mask reuse never applies across entries.)
* ``commit(path)``: keep the cells of the deepest entry's sequence (``seq_keep``), rename it
  to 0 (``seq_cp`` then ``seq_rm``); every other uncommitted cell is freed.

One holder at a time. The context's cells and sequence ids belong to one holder: the single
runners (``LlamaRunner``: ``generate`` on the model; their prefill resets sequence 0 and frees
every other) or one ``batch.LlamaBatchRunner`` (a ``BatchDecoder``'s lanes, e.g. a server's
requests, each lane on sequence ids of its own). ``LlamaCppModel.hold`` hands the context over
and clears its cells on every change of holder, so a holder never finds cells it did not write
(a ``generate`` between two server requests would otherwise leave its prefix in sequence 0,
unknown to the lanes' bookkeeping of free cells, and a later request fails to find a KV slot); a
``generate`` while a batch runner has lanes open is refused (it would wipe their cells).

A batch holds at most ``n_seq_max - 1`` new entries per step (default 255 with
llama.cpp's limit of 256 sequences): tree budgets up to 64 nodes fit with room to spare.

Logits are float32 rows from llama.cpp's output buffer; ``extend`` returns a view of that
buffer (no copy), valid until the next ``extend`` or ``prefill`` of the same model, which is
how the decoder uses it.
"""
from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
import time
import weakref
from pathlib import Path

import numpy as np
import torch

from .. import _optional
from .llama_build import check_build, cpu_flags

__all__ = ["LlamaCppModel", "LlamaRunner", "llama_cpp_available", "import_llama_cpp", "llama_log_to"]


def llama_cpp_available() -> bool:
    """Whether llama-cpp-python can be imported (``multidraft._optional``)."""
    return _optional.available("llama_cpp")


_BUILD_CHECKED = False


def import_llama_cpp():
    """The ``llama_cpp`` module, or a one-line ``ImportError`` naming the extra, or naming the
    rebuild when the installed build could die by SIGILL here (``llama_build.check_build``:
    AMX kernels, or an instruction set this CPU lacks); the build is checked once a process."""
    global _BUILD_CHECKED
    L = _optional.require("llama_cpp")
    if not _BUILD_CHECKED:
        check_build(L.llama_print_system_info().decode("utf-8", "replace"), cpu_flags())
        _BUILD_CHECKED = True
    return L


_CACHE_TYPES = {"f16": 1, "f32": 0}  # GGML_TYPE_F16, GGML_TYPE_F32
# enum ggml_log_level of the bundled llama.cpp: DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (llama-cpp-python
# 0.3.36's own _logger still maps the older numbering, in which 4 was DEBUG)
LOG_WARN, LOG_ERROR = 3, 4
_LOG: list[str] = []  # recent llama.cpp error lines (attached to exceptions)
_LOG_CB = None


def _install_log(L) -> None:
    """Route llama.cpp's log through a callback that keeps warnings and errors only (quiet load)."""
    global _LOG_CB
    if _LOG_CB is not None:
        return

    @ctypes.CFUNCTYPE(None, ctypes.c_int, ctypes.c_char_p, ctypes.c_void_p)
    def cb(level, text, _user):
        if level >= LOG_WARN and text:
            _LOG.append(text.decode("utf-8", "replace").rstrip())
            del _LOG[:-20]

    _LOG_CB = cb
    L.llama_log_set(cb, ctypes.c_void_p())


@contextlib.contextmanager
def interrupts_held():
    """Hold Ctrl-C while llama.cpp runs a long C call that logs through a Python callback (a model
    load, a context, a requantisation), and deliver it when the call returns.

    Python runs a SIGINT handler at the next bytecode, which during such a call is inside the log
    callback: the KeyboardInterrupt it raises there is printed by ctypes as "Exception ignored"
    and dropped, and the call (and the command) carried on. Held, the handler only notes the
    signal; afterwards SIGINT is raised again for the handler that was in place, so the interrupt
    arrives as if it had come just after the call (which no one could stop sooner: the C code
    never checks). Off the main thread (where handlers cannot be set) it does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []
    prev = signal.signal(signal.SIGINT, lambda signum, _frame: seen.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, prev)
        if seen:
            signal.raise_signal(signal.SIGINT)


@contextlib.contextmanager
def llama_log_to(llama_cpp, sink: list):
    """Route llama.cpp's log (a process-wide callback) into ``sink`` as ``(level, text)``
    pairs, warnings and errors only, and restore the previous callback afterwards; a Ctrl-C
    meanwhile arrives when the block ends (``interrupts_held``)."""
    prev_cb = llama_cpp.llama_log_callback()
    prev_ud = ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(prev_cb), ctypes.byref(prev_ud))

    @llama_cpp.llama_log_callback
    def _callback(level, text, _user_data):
        if level in (LOG_WARN, LOG_ERROR) and text:
            sink.append((int(level), text.decode("utf-8", "replace").strip()))

    llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))
    try:
        with interrupts_held():
            yield
    finally:
        llama_cpp.llama_log_set(prev_cb, prev_ud)


class LlamaCppModel:
    """A GGUF model in a llama.cpp context with a unified KV cache, usable by ``generate``.

    path        a ``.gguf`` file.
    n_ctx       context size in tokens (KV cells; the prompt, the output and one step's tree
                must fit); capped by the model's training context; at least llama.cpp's
                parallel sequence count (256: llama.cpp cuts its batch to n_ctx and aborts
                the process when that batch is below its sequence count).
    n_threads   CPU threads for decoding (default: ``os.cpu_count()``).
    n_batch     most tokens per llama_decode call (prompt prefill is chunked by it). The context
                itself is created with a batch of at least ``n_seq_max`` (llama.cpp aborts the
                process, GGML_ASSERT, when its batch is smaller than its sequence count).
    cache_type  KV cache element type, "f16" (llama.cpp's default) or "f32" (the tests use it
                to compare tree passes with plain decodes at float32 precision).
    flash_attn  None: llama.cpp decides (its default); False / True force it off / on (on the
                CPU, flash attention forms Q.K in float16).
    """

    engine = "llama.cpp"

    def __init__(self, path: str | os.PathLike, *, n_ctx: int = 4096, n_threads: int | None = None,
                 n_batch: int = 512, cache_type: str = "f16", flash_attn: bool | None = None):
        L = import_llama_cpp()  # ImportError naming the extra
        self._L = L
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"no GGUF file at {path}")
        for name, v, lo in (("n_ctx", n_ctx, 16), ("n_batch", n_batch, 1)):
            if isinstance(v, bool) or not isinstance(v, int) or v < lo:
                raise ValueError(f"{name} must be an integer >= {lo}, got {v!r}")
        if cache_type not in _CACHE_TYPES:
            raise ValueError(f"cache_type must be one of {', '.join(_CACHE_TYPES)}, got {cache_type!r}")
        n_threads = (os.cpu_count() or 1) if n_threads is None else n_threads
        if isinstance(n_threads, bool) or not isinstance(n_threads, int) or n_threads < 1:
            raise ValueError(f"n_threads must be a positive integer, got {n_threads!r}")
        n_seq_max = int(L.llama_max_parallel_sequences())
        if n_ctx < n_seq_max:  # llama.cpp cuts its batch to n_ctx, below n_seq_max: GGML_ASSERT, a SIGABRT
            raise ValueError(f"n_ctx must be at least {n_seq_max} (llama.cpp's parallel sequences: a smaller "
                             f"context makes it abort the process), got {n_ctx}")
        _install_log(L)
        L.llama_backend_init()
        self.path = path
        self.n_threads = n_threads
        mp = L.llama_model_default_params()
        with interrupts_held():  # the load logs through a Python callback
            self._model = L.llama_model_load_from_file(str(path).encode(), mp)
        if not self._model:
            raise ValueError(f"llama.cpp could not load {path}: " + " | ".join(_LOG[-3:]))
        self.n_seq_max = n_seq_max
        cp = L.llama_context_default_params()
        cp.n_ctx = n_ctx
        cp.n_batch = cp.n_ubatch = max(n_batch, self.n_seq_max)  # smaller: GGML_ASSERT in llama.cpp, a SIGABRT
        cp.n_seq_max = self.n_seq_max
        cp.kv_unified = True
        cp.n_threads = cp.n_threads_batch = n_threads
        cp.no_perf = True
        cp.type_k = cp.type_v = _CACHE_TYPES[cache_type]
        if flash_attn is not None:
            cp.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attn else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        with interrupts_held():
            self._ctx = L.llama_init_from_model(self._model, cp)
        if not self._ctx:
            L.llama_model_free(self._model)
            raise ValueError(f"llama.cpp could not create a context for {path}: " + " | ".join(_LOG[-3:]))
        self._mem = L.llama_get_memory(self._ctx)
        self._vocab = L.llama_model_get_vocab(self._model)
        self.vocab_size = int(L.llama_vocab_n_tokens(self._vocab))
        self.context = int(min(L.llama_n_ctx(self._ctx), L.llama_model_n_ctx_train(self._model)))
        self.n_batch = n_batch
        self._batch = L.llama_batch_init(n_batch, 0, self.n_seq_max)
        self._prompt: list[int] | None = None  # tokens of the last prefill (reused when equal)
        self.decode_seconds = 0.0             # model time of every llama_decode so far
        self._holder = None  # who holds the context's cells (hold): None (the single runners) or a batch runner's weakref

    def __repr__(self) -> str:
        return f"LlamaCppModel({str(self.path)!r}, vocab={self.vocab_size}, context={self.context})"

    def runner(self) -> "LlamaRunner":
        return LlamaRunner(self)

    def close(self) -> None:
        L = self._L
        if getattr(self, "_batch", None) is not None:
            L.llama_batch_free(self._batch)
            self._batch = None
        if getattr(self, "_ctx", None):
            L.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)
            self._model = None

    def __del__(self):  # pragma: no cover - interpreter shutdown order varies
        try:
            self.close()
        except Exception:
            pass

    # text ---------------------------------------------------------------------------------
    def tokenize(self, text: str, *, chat: bool = False) -> list[int]:
        """Token ids of ``text`` by the GGUF's own tokenizer (special tokens parsed); with
        ``chat`` the text is first wrapped as one user turn by the GGUF's chat template."""
        L = self._L
        if chat:
            text = self.chat_prompt(text)
        raw = text.encode("utf-8")
        n = len(raw) + 16
        buf = (L.llama_token * n)()
        k = L.llama_tokenize(self._vocab, raw, len(raw), buf, n, False, True)
        if k < 0:
            raise ValueError(f"tokenizing {len(raw)} bytes needs {-k} tokens")  # pragma: no cover
        return list(buf[:k])

    def chat_prompt(self, text) -> str:
        """``text`` as one user message in the GGUF's chat template (its Jinja text, rendered as
        transformers renders it, default system message included), assistant turn opened; a list
        of ``{"role", "content"}`` messages (a conversation) is rendered as it is."""
        L = self._L
        tmpl = L.llama_model_chat_template(self._model, None)
        if not tmpl:
            raise ValueError(f"{self.path.name} has no chat template")
        from llama_cpp.llama_chat_format import Jinja2ChatFormatter

        piece = lambda t: self.detokenize_special([t]) if t >= 0 else ""  # noqa: E731
        fmt = Jinja2ChatFormatter(template=tmpl.decode("utf-8"), eos_token=piece(L.llama_vocab_eos(self._vocab)),
                                  bos_token=piece(L.llama_vocab_bos(self._vocab)))
        messages = [{"role": "user", "content": text}] if isinstance(text, str) else list(text)
        return fmt(messages=messages).prompt

    def token_byte_bound(self) -> int | None:
        """``B``, the most bytes of text one token of :meth:`tokenize` stands for, or None where
        no such bound holds. For a byte-level BPE vocabulary (llama.cpp's ``LLAMA_VOCAB_TYPE_BPE``,
        as Qwen's and the tiny GGUFs') that has a token for each of the 256 bytes, the tokens of a
        text are pieces whose bytes, joined, are the text's bytes (no normalization; a special
        token written in the text is its piece), so each token covers at most ``B = max piece
        length`` bytes (special pieces included) and ``len(tokenize(text)) >= len(utf8(text)) / B``.
        Other vocabularies (SentencePiece's prefix space and unknown token, WordPiece) give None.
        Computed once (a pass over the vocabulary) and kept."""
        if getattr(self, "_byte_bound", False) is not False:
            return self._byte_bound
        L = self._L
        bound = None
        if int(L.llama_vocab_type(self._vocab)) == int(L.LLAMA_VOCAB_TYPE_BPE):
            buf = ctypes.create_string_buffer(4096)
            longest, single = 0, set()
            for t in range(self.vocab_size):
                k = L.llama_token_to_piece(self._vocab, t, buf, len(buf), 0, True)
                if k < 0:  # a piece longer than the buffer: no usable bound
                    longest = None
                    break
                longest = max(longest, k)
                if k == 1:
                    single.add(buf.raw[0])
            if longest and len(single) == 256:
                bound = int(longest)
        self._byte_bound = bound
        return bound

    def detokenize_special(self, ids) -> str:
        """The text of ``ids`` with special tokens rendered (e.g. ``<|im_end|>``)."""
        return self._detok(ids, special=True)

    def detokenize(self, ids) -> str:
        """The text of ``ids`` (special tokens such as end-of-turn are left out)."""
        return self._detok(ids, special=False)

    def _detok(self, ids, special: bool) -> str:
        L = self._L
        ids = [int(i) for i in ids]
        if not ids:
            return ""
        arr = (L.llama_token * len(ids))(*ids)
        n = 16 * len(ids) + 64
        buf = ctypes.create_string_buffer(n)
        k = L.llama_detokenize(self._vocab, arr, len(ids), buf, n, False, special)
        if k < 0:
            buf = ctypes.create_string_buffer(-k)
            k = L.llama_detokenize(self._vocab, arr, len(ids), buf, -k, False, special)
        return buf.raw[:k].decode("utf-8", "replace")

    @property
    def eos_token_ids(self) -> list[int]:
        """Every end-of-generation token of the vocabulary (``llama_vocab_is_eog``)."""
        if getattr(self, "_eog", None) is None:
            L = self._L
            self._eog = [i for i in range(self.vocab_size) if L.llama_vocab_is_eog(self._vocab, i)]
        return self._eog

    # llama.cpp calls --------------------------------------------------------------------
    def decode(self, tokens: list[int], pos: list[int], seqs: list[list[int]], want: list[bool]) -> torch.Tensor:
        """One llama_decode of ``tokens`` at ``pos`` with sequence ids ``seqs`` (first one is the
        token's own); returns the logits ``[sum(want), V]`` of the tokens marked in ``want``
        (a view of llama.cpp's buffer, valid until the next decode)."""
        L, b, n = self._L, self._batch, len(tokens)
        if n > self.n_batch:
            raise ValueError(f"{n} tokens in one batch but n_batch = {self.n_batch}")
        for i in range(n):
            b.token[i] = tokens[i]
            b.pos[i] = pos[i]
            s = seqs[i]
            b.n_seq_id[i] = len(s)
            row = b.seq_id[i]
            for j, x in enumerate(s):
                row[j] = x
            b.logits[i] = bool(want[i])
        b.n_tokens = n
        t0 = time.perf_counter()
        rc = L.llama_decode(self._ctx, b)
        self.decode_seconds += time.perf_counter() - t0
        if rc != 0:
            raise RuntimeError(f"llama_decode failed (code {rc}) on {n} tokens: " + " | ".join(_LOG[-3:]))
        k = sum(1 for w in want if w)
        if k == 0:
            return torch.zeros(0, self.vocab_size)
        ptr = L.llama_get_logits(self._ctx)
        return torch.from_numpy(np.ctypeslib.as_array(ptr, shape=(k, self.vocab_size)))

    def seq_cp(self, src: int, dst: int) -> None:
        self._L.llama_memory_seq_cp(self._mem, src, dst, -1, -1)

    def seq_keep(self, s: int) -> None:
        self._L.llama_memory_seq_keep(self._mem, s)

    def seq_rm(self, s: int, p0: int = -1, p1: int = -1) -> None:
        self._L.llama_memory_seq_rm(self._mem, s, p0, p1)

    def clear(self) -> None:
        self._L.llama_memory_clear(self._mem, True)
        self._prompt = None

    def hold(self, holder) -> None:
        """Give the context's cells and sequence ids to ``holder``: None (the single runners,
        ``LlamaRunner``) or a ``batch.LlamaBatchRunner`` (module notes, "One holder at a time").
        A change of holder clears every cell, so the new holder starts from an empty context;
        ``ValueError`` when the single runners ask while a batch runner has lanes open (its
        ``lanes_open``; a batch runner no longer referenced holds nothing)."""
        if holder is None and self._holder is None:
            return
        cur = self.holder
        if holder is not None and cur is holder:
            return
        if holder is None and cur is not None and cur.lanes_open:
            raise ValueError(f"this LlamaCppModel's context holds {cur.lanes_open} open lane(s) of a BatchDecoder (e.g. "
                             "a server's requests being decoded): a generate on it now would wipe their KV cells; "
                             "call it when they have finished, or on another LlamaCppModel of the same file")
        self.clear()
        self._holder = None if holder is None else weakref.ref(holder)

    @property
    def holder(self):
        """The batch runner holding the context (:meth:`hold`), or None (the single runners)."""
        return None if self._holder is None else self._holder()


class LlamaRunner:
    """The ``runners`` protocol on a ``LlamaCppModel`` (see the module docstring)."""

    engine = "llama.cpp"

    def __init__(self, model: LlamaCppModel):
        self.m = model
        self.base = 0
        self._pos: list[int] = []     # position of each uncommitted handle
        self._anchor: list[int] = []  # nearest cached ancestor of each handle at its batch (-1: prefix)

    @property
    def vocab_size(self) -> int:
        return self.m.vocab_size

    @property
    def context(self) -> int:
        return self.m.context

    def prefill(self, ids: torch.Tensor) -> float:  # ids [1, T]
        m = self.m
        toks = [int(x) for x in ids[0].tolist()]
        m.hold(None)  # after a batch runner's lanes: their cells cleared, nothing of theirs reused
        self._pos, self._anchor = [], []
        self.base = len(toks)
        if m._prompt is not None and m._prompt == toks:
            # the same prompt as the last prefill: drop what came after it, recompute nothing
            m.seq_keep(0)
            m.seq_rm(0, len(toks), -1)
            return 0.0
        m.clear()
        t0 = time.perf_counter()
        for a in range(0, len(toks), m.n_batch):
            chunk = toks[a:a + m.n_batch]
            last = a + len(chunk) == len(toks)
            m.decode(chunk, list(range(a, a + len(chunk))), [[0]] * len(chunk),
                     [last and i == len(chunk) - 1 for i in range(len(chunk))])
        m._prompt = toks
        return time.perf_counter() - t0

    def extend(self, tokens: list[int], parents: list[int], last_only: bool = False) -> torch.Tensor:
        m = self.m
        M, n = len(self._pos), len(tokens)
        if 1 + M + n > m.n_seq_max:
            raise ValueError(f"llama.cpp engine: {M + n} uncommitted tree entries in one step exceed the "
                             f"{m.n_seq_max - 1} that llama.cpp's {m.n_seq_max} sequences allow")
        seqs: list[list[int]] = []
        for i, par in enumerate(parents):
            h = M + i
            if par >= M:  # parent in this batch
                anchor, pos = self._anchor[par], self._pos[par] + 1
            else:
                anchor, pos = par, (self._pos[par] + 1 if par >= 0 else self.base)
            self._pos.append(pos)
            self._anchor.append(anchor)
            m.seq_cp(0 if anchor < 0 else 1 + anchor, 1 + h)
            seqs.append([1 + h])
            a = par
            while a >= M:  # every ancestor in this batch also carries h's sequence
                seqs[a - M].append(1 + h)
                a = parents[a - M]
        want = [True] * n if not last_only else [i == n - 1 for i in range(n)]
        out = m.decode(tokens, self._pos[M:], seqs, want)
        for i in range(n):  # later batches anchor on these entries directly
            self._anchor[M + i] = M + i
        return out

    def commit(self, handles: list[int]) -> None:
        m = self.m
        if handles:
            s = 1 + handles[-1]
            m.seq_keep(s)  # the prefix and the path to the last handle; every other cell is freed
            m.seq_cp(s, 0)
            m.seq_rm(s)
        else:
            m.seq_keep(0)
        self.base += len(handles)
        self._pos, self._anchor = [], []

    @property
    def uncommitted(self) -> int:
        """Entries appended by ``extend`` since the last commit (their handles are 0..n-1)."""
        return len(self._pos)
