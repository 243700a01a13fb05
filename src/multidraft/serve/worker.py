"""The model side of ``multidraft serve``: the served pair, the request queue and its one worker.

One worker thread owns the models and a ``decoding.BatchDecoder`` of ``max_lanes`` lanes; the
HTTP side puts a :class:`Job` in a bounded queue and reads its events. A full queue refuses the
request with 429 at once; nothing is dropped silently. Between two shared forward passes the
worker admits queued jobs into free lanes (continuous batching: requests join and leave between
steps), so concurrent requests share the target's and the draft's forward passes; each lane has
its own settings, seed and stopping. With ``max_lanes = 1`` requests are decoded one at a time,
in arrival order, token for token as ``decoding.generate`` decodes them alone (a lone lane is
bitwise ``generate``); beside other lanes a request's tokens are those of ``generate`` up to the
engines' floating-point differences between batch shapes (``docs/guide/decoding.md``,
"Batches"), its law exactly the target's.

Streaming: each lane's ``on_step`` hands the worker that step's tokens; :class:`TextStream`
turns the growing token list into text deltas, holding back a trailing incomplete UTF-8
character and any suffix that could begin a stop sequence, and cuts the text at the first
stop sequence (the stop sequence itself is not returned, as OpenAI does). ``on_step`` also
stops the lane when the client has gone (the job's ``cancel`` event) or the server is
shutting down past its grace period.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from .._errors import ArgumentError
from ..datasets import encode, has_chat_template, render_chat, token_byte_bound
from ..decoding import Settings
from ..decoding.batch import BatchDecoder, LaneError
from ..decoding.runners import model_context
from ..decoding.sources import DraftModel, SuffixIndex, parse_sources
from ..decoding.step import TokenLogprobs
from .protocol import APIError

__all__ = ["ServedModel", "TextCodec", "TextStream", "Job", "Worker", "logprob_entries"]

log = logging.getLogger("multidraft.serve")
RETRY_AFTER_S = 1  # the Retry-After (seconds) of a refusal for load: a full queue (429), too many in flight (503)


class TextCodec:
    """Text <-> token ids for the served pair: the llama.cpp target's own tokenizer, or the
    transformers tokenizer; ``chat(messages)`` renders the model's chat template.

    ``bound`` is the tokenizer's ``datasets.ByteBound`` (None where none is proven), read once
    here: ``min_tokens(text)`` is a lower bound on ``len(encode(text))`` computed without the
    tokenizer, so a prompt that cannot fit ``context`` is refused before it is tokenized."""

    def __init__(self, engine: str, target, tokenizer, draft=None):
        self.engine = engine
        self.target, self.tok = target, tokenizer
        ctx = model_context(target)
        if draft is not None:
            ctx = min(ctx, model_context(draft))
        self.context = int(ctx)
        if engine == "llama.cpp":
            self.eos = list(target.eos_token_ids)
        else:
            eos = getattr(tokenizer, "eos_token_id", None)
            self.eos = None if eos is None else ([eos] if isinstance(eos, int) else list(eos))
        self.bound = token_byte_bound(self._encoder())

    def _encoder(self):
        return self.target if self.engine == "llama.cpp" else self.tok

    def min_tokens(self, text: str) -> int:
        """A lower bound on ``len(encode(text))`` (and on the tokens of a rendered chat text), found
        without tokenizing (``datasets.ByteBound``); 0 where the tokenizer has no proven bound."""
        return 0 if self.bound is None else self.bound.min_tokens(text)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        # the one encoder (datasets.encode), as ``decode``
        return encode(self._encoder(), text, add_special_tokens=add_special_tokens)

    def chat_text(self, messages: list[dict]) -> str:
        """``messages`` rendered by the model's chat template (the text :meth:`chat` tokenizes); a
        message's ``name`` is given to the template, and refused (400 naming it) when the rendered
        text is the same without the names (the template does not use them)."""
        if not has_chat_template(self._encoder()):
            raise APIError(400, "this model's tokenizer has no chat template; use /v1/completions", param="messages",
                           code="no_chat_template")
        try:
            text = render_chat(self._encoder(), messages)
            named = [i for i, m in enumerate(messages) if "name" in m]
            if named and text == render_chat(self._encoder(), [{k: v for k, v in m.items() if k != "name"}
                                                               for m in messages]):
                where = f"messages.[{named[0]}].name"
                raise APIError(400, f"{where}: this model's chat template does not render a message's name (it "
                                    f"would be ignored); leave it out", param=where, code="unsupported_parameter")
            return text
        except ValueError as exc:  # a GGUF without a chat template
            raise APIError(400, f"this model cannot chat: {exc}; use /v1/completions", param="messages",
                           code="no_chat_template") from None

    def encode_chat_text(self, text: str) -> list[int]:
        """The ids of a rendered chat ``text`` (no special token added: the template wrote them)."""
        return encode(self._encoder(), text, add_special_tokens=False)

    def chat(self, messages: list[dict]) -> list[int]:
        """``messages`` as ``decode --chat`` encodes one message (``datasets.encode`` with ``chat``)."""
        return self.encode_chat_text(self.chat_text(messages))

    def piece(self, token: int) -> str:
        """One token's text, special tokens written out (a logprobs entry's ``token``)."""
        if self.engine == "llama.cpp":
            return self.target.detokenize_special([token])
        return self.tok.decode([token], skip_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        if self.engine == "llama.cpp":
            return self.target.detokenize(ids)
        return self.tok.decode(ids, skip_special_tokens=True)


@dataclass
class ServedModel:
    """The served pair and the server's speculative configuration.

    ``settings`` the server's ``decoding.Settings`` (from the command line, checked once);
    each request's settings are these with the request's changes (:meth:`request_settings`):
    its temperature, top_p, top_k, max_tokens and decode extensions (``sources``), applied to
    the resolved object (the draft temperature follows the request's temperature unless the
    server fixed it: ``draft_temperature``). ``draft`` None: no draft model is loaded (the target
    alone, or free-only sources: ``Settings.free_only``), and a request whose sources name
    'model' is refused (``ArgumentError`` naming ``sources``; the app answers 400).

    ``index`` the one ``decoding.sources.SuffixIndex`` of the server, shared by every request
    (bounded by its own ``max_tokens``): a request with the ``suffix`` source reads the earlier
    requests' outputs from it, and every finished output of such a request joins it.

    ``cost_profile`` None, or the ``decoding.treeopt.CostProfile`` by which each request paces
    its own drafting depth (the target alone included) from its own acceptances as it goes
    (``decoding.pace``; ``serve --tree auto``)."""

    name: str
    engine: str
    target: object
    draft: object
    codec: TextCodec
    settings: Settings
    draft_temperature: object = None
    default_max_tokens: int = 128
    ignore_eos: bool = False
    index: SuffixIndex = field(default_factory=SuffixIndex)
    cost_profile: object = None

    def request_settings(self, changes: dict, max_tokens: int) -> Settings:
        """The settings of one request: ``changes`` (keyword arguments of ``Settings.derive``, as
        ``protocol.SamplingRequest.settings_changes`` gives them) and its ``max_tokens``."""
        changes = dict(changes, max_new_tokens=max_tokens)
        drafts = self.settings.uses_draft if "sources" not in changes else \
            not self.settings.target_alone and DraftModel.name in parse_sources(changes["sources"])
        if drafts and "temperature" in changes and self.draft_temperature is None:  # free-only: no draft temperature
            changes.setdefault("draft_temperature", changes["temperature"])
        settings = self.settings.derive(**changes)
        if settings.uses_draft and self.draft is None:  # a free-only server loaded no draft model
            raise ArgumentError("sources", f": this server loaded no draft model (its sources are "
                                           f"{','.join(src.name for src in self.settings.sources) or 'none'}), so a request's sources "
                                           f"cannot name 'model'; name free sources only (lookup, suffix)")
        return settings

    def describe(self, settings: Settings | None = None) -> dict:
        """The ``speculative`` object: the engine and ``Settings.describe()`` of ``settings`` (a
        request's) or of the server's."""
        return {"engine": self.engine, **(settings or self.settings).describe()}


class TextStream:
    """The text of a growing token list, released as deltas that never need taking back.

    ``push(tokens)`` returns the new text that is safe to send: the whole text so far minus a
    trailing U+FFFD (bytes of a character not yet complete) and minus the longest suffix that
    is a proper prefix of a stop sequence. When a stop sequence appears, the text is cut before
    it, ``stopped`` is set and the rest up to the cut is released. ``finish()`` releases what
    was held back (a decode that ended without a stop sequence). ``used`` counts the tokens the
    returned text stands for: all pushed tokens, or after a stop sequence the fewest whose text
    holds it (the completion's tokens; a draft step's tokens after the stop are not)."""

    def __init__(self, decode, stop: tuple = ()):
        self._decode, self.stop = decode, tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.text = ""
        self.sent = 0
        self.stopped = False
        self.used = 0  # the tokens the returned text stands for (the completion's tokens)

    def push(self, tokens) -> str:
        if self.stopped:
            return ""
        before = len(self.ids)
        self.ids.extend(int(t) for t in tokens)
        self.used = len(self.ids)
        text = self._decode(self.ids)
        cuts = [i for i in (text.find(s) for s in self.stop) if i >= 0]
        if cuts:
            self.text = text[: min(cuts)]
            self.stopped = True
            # the fewest tokens whose text holds the stop sequence (the rest of the draft step's
            # tokens are not the completion's); the text before this push held none
            self.used = next((n for n in range(before + 1, len(self.ids))
                              if any(s in self._decode(self.ids[:n]) for s in self.stop)), len(self.ids))
            return self._release(len(self.text))
        self.text = text
        safe = len(text)
        while safe > self.sent and text[safe - 1] == "\ufffd":
            safe -= 1
        hold = 0
        for s in self.stop:
            for j in range(min(len(s) - 1, safe - self.sent), hold, -1):
                if text.endswith(s[:j], 0, safe):
                    hold = j
                    break
        return self._release(safe - hold)

    def finish(self) -> str:
        return self._release(len(self.text))

    def _release(self, upto: int) -> str:
        if upto <= self.sent:
            return ""
        out = self.text[self.sent:upto]
        self.sent = upto
        return out


@dataclass
class Job:
    """One request in the queue: its prompt ids, settings and seed; the worker answers through
    ``emit`` (called from the worker thread): ``("delta", text, tokens, logprobs)`` (``tokens``
    the completion's tokens so far; ``logprobs`` None, or the entries of the tokens not yet
    sent, see :func:`logprob_entries`), ``("done", result)`` (``result["logprobs"]`` the entries
    not yet sent) or ``("error", APIError)``. ``cancel`` is set by the HTTP side when the client
    goes away. ``logprobs``: None, or the alternatives per token of the target's log-probabilities
    (``decoding.step.TokenLogprobs``, recorded from the verification passes: no extra forward)."""

    prompt_ids: list[int]
    settings: Settings
    seed: int
    stop: tuple
    emit: object
    cancel: threading.Event = field(default_factory=threading.Event)
    enqueued: float = field(default_factory=time.perf_counter)
    arrived: float | None = None  # perf_counter at the request's first byte (default: ``enqueued``)
    logprobs: int | None = None

    def __post_init__(self):
        if self.arrived is None:
            self.arrived = self.enqueued


def logprob_entries(piece, ids: list[int], rows: list, a: int, b: int) -> list[dict]:
    """OpenAI's chat logprob entries of tokens ``ids[a:b]`` from ``TokenLogprobs.rows``:
    ``{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}``, a token's
    text ``piece(id)`` (``TextCodec.piece``: special tokens written out; a token holding part of a
    UTF-8 character reads U+FFFD)."""
    def one(t: int, lp: float) -> dict:
        text = piece(t)
        return {"token": text, "logprob": lp, "bytes": list(text.encode("utf-8"))}

    out = []
    for j in range(a, b):
        lp, tops = rows[j]
        out.append({**one(ids[j], lp), "top_logprobs": [one(v, l) for v, l in tops]})
    return out


def deliver(job: Job, done: dict, observe=None) -> None:
    """A finished request's last event: ``done`` to ``observe(job, done)`` first (the metrics and
    the request's log line; a failure there never fails the request), then to the job's client.
    The one ending of a request, in a ``Worker`` and in the replicas' ``Router``."""
    if observe is not None:
        try:
            observe(job, done)
        except Exception:  # metrics never fail a request
            log.exception("observing a request failed")
    job.emit(("done", done))


class _Active:
    """A job in a lane: its text stream, its logprobs record (None when not asked) and the
    tokens whose entries were sent, and when it started."""

    def __init__(self, job: Job, text: TextStream, piece=None):
        self.job, self.text, self.piece = job, text, piece
        self.started = time.perf_counter()
        self.first_token: float | None = None  # perf_counter at the step that gave the first token
        self.lp = None if job.logprobs is None else TokenLogprobs(job.logprobs)
        self.lp_sent = 0

    def take(self, upto: int) -> list[dict] | None:
        """The logprob entries of the tokens after those sent, up to ``upto`` (None: not asked)."""
        if self.lp is None:
            return None
        out = logprob_entries(self.piece, self.text.ids, self.lp.rows, self.lp_sent, max(upto, self.lp_sent))
        self.lp_sent = max(upto, self.lp_sent)
        return out


class Worker:
    """One thread decoding queued jobs in the lanes of one ``BatchDecoder`` (module docstring)."""

    def __init__(self, model: ServedModel, queue_size: int = 64, max_lanes: int = 1):
        if isinstance(queue_size, bool) or not isinstance(queue_size, int) or queue_size < 1:
            raise ValueError(f"queue_size must be a positive integer, got {queue_size!r}")
        if isinstance(max_lanes, bool) or not isinstance(max_lanes, int) or max_lanes < 1:
            raise ValueError(f"max_lanes must be a positive integer, got {max_lanes!r}")
        self.model = model
        self.max_lanes = max_lanes
        self.queue: queue.Queue = queue.Queue(maxsize=queue_size)
        self._thread = threading.Thread(target=self._loop, name="multidraft-serve-worker", daemon=True)
        self._stop = threading.Event()
        self.draining = threading.Event()
        self._deadline: float | None = None
        self.active: dict[int, _Active] = {}   # lane -> its job (worker thread; read under _lock)
        self._held: Job | None = None          # the next job, waiting for room in the decoder
        self.counts = {"served": 0, "cancelled": 0, "refused": 0, "failed": 0}
        self.observe = None  # observe(job, done): each decoded request's result, from this thread (metrics)
        self._built = threading.Event()  # the decoder is built: requests can be admitted
        self._lock = threading.Lock()
        self._decoder: BatchDecoder | None = None

    # HTTP side --------------------------------------------------------------------------
    def start(self) -> None:
        self._thread.start()

    def submit(self, job: Job) -> None:
        """Queue ``job``, or raise 503 (shutting down) or 429 (the queue is full)."""
        if self.draining.is_set():
            raise APIError(503, "the server is shutting down", type="server_error", code="server_shutting_down",
                           headers={"Retry-After": str(RETRY_AFTER_S)})
        try:
            self.queue.put_nowait(job)
        except queue.Full:
            with self._lock:
                self.counts["refused"] += 1
            raise APIError(429, f"the server is busy: {self.queue.maxsize} requests are waiting; retry later",
                           type="rate_limit_error", code="rate_limit_exceeded",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from None

    @property
    def ready(self) -> bool:
        """Admitting requests: the worker thread runs with its decoder built and is not draining."""
        return self._built.is_set() and self._thread.is_alive() and not self.draining.is_set() \
            and not self._stop.is_set()

    @property
    def running(self) -> bool:
        with self._lock:
            return bool(self.active)

    def status(self) -> dict:
        with self._lock:
            out = {"queued": self.queue.qsize() + (self._held is not None), "running": bool(self.active),
                   "lanes": len(self.active), "max_lanes": self.max_lanes, **self.counts,
                   "draining": self.draining.is_set()}
        ix = self.model.index
        out["suffix_index"] = {"outputs": len(ix.outputs), "tokens": len(ix), "max_tokens": ix.max_tokens}
        return out

    def drain(self, grace_s: float) -> None:
        """Shutting down: refuse new jobs, answer every queued one with 503, let the running ones
        finish within ``grace_s`` seconds (then they are stopped; finish_reason 'abort')."""
        if self.draining.is_set():
            return
        self._deadline = time.monotonic() + grace_s
        self.draining.set()
        while True:
            try:
                job = self.queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                self._refuse_shutdown(job)

    @staticmethod
    def _refuse_shutdown(job: Job) -> None:
        job.emit(("error", APIError(503, "the server is shutting down; the request was not started",
                                    type="server_error", code="server_shutting_down",
                                    headers={"Retry-After": str(RETRY_AFTER_S)})))

    def stop(self, timeout: float = 10.0) -> None:
        self.drain(0.0)
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    # worker thread ----------------------------------------------------------------------
    def _loop(self) -> None:
        m = self.model
        while not self._stop.is_set() or self.active:  # lanes running at stop finish (halted past the grace)
            if self._decoder is None:
                self._decoder = BatchDecoder(m.target, m.draft, max_lanes=self.max_lanes, index=m.index,
                                             cost_profile=m.cost_profile)
                self._built.set()
            self._admit()
            if not self.active:
                continue
            try:
                done = self._decoder.step()
            except LaneError as err:  # one lane's decode raised: it is closed, the others go on
                done = err.finished
                self._fail_lost(done, err.__cause__ or err)
            except Exception as exc:  # a shared forward failed: every lane of it is answered
                log.exception("batched forward failed")
                for lane in list(self.active):
                    self._fail(lane, exc)
                self._decoder = None
                continue
            for lane, res in done.items():
                self._finish(lane, res)
        held = self._held
        if held is not None:
            self._held = None
            self._refuse_shutdown(held)

    def _next_job(self) -> Job | None:
        if self._held is not None:
            job, self._held = self._held, None
            return job
        try:  # block briefly only when nothing is decoding
            return self.queue.get(timeout=0.1) if not self.active else self.queue.get_nowait()
        except queue.Empty:
            return None

    def _admit(self) -> None:
        """Open lanes for queued jobs while the decoder has room (in arrival order)."""
        dec, m = self._decoder, self.model
        while dec.free_lanes and not self._stop.is_set():
            job = self._next_job()
            if job is None:
                return
            if job.cancel.is_set():
                with self._lock:
                    self.counts["cancelled"] += 1
                continue
            if self.draining.is_set():
                self._refuse_shutdown(job)
                continue
            ids = torch.tensor([job.prompt_ids], dtype=torch.long)
            if not dec.fits(ids, job.settings):
                if self.active:  # room comes back when a lane finishes
                    self._held = job
                    return
            text = TextStream(m.codec.decode, job.stop)
            act = _Active(job, text, m.codec.piece)

            def on_step(tokens, act=act):
                if act.first_token is None and len(tokens):
                    act.first_token = time.perf_counter()
                delta = act.text.push(tokens)
                if delta:
                    act.job.emit(("delta", delta, act.text.used, act.take(act.text.used)))
                return act.text.stopped or self._halt(act.job)

            try:
                lane = dec.add(ids, job.settings, generator=job.seed, on_step=on_step,
                               eos_token_id=None if m.ignore_eos else m.codec.eos, logprobs=act.lp)
            except ArgumentError as exc:  # e.g. prompt + max_tokens + a tree beyond the llama.cpp context
                with self._lock:  # the request's fault, not the server's (the HTTP side checks this first)
                    self.counts["refused"] += 1
                job.emit(("error", APIError(400, f"{exc}", param="max_tokens", code="context_length_exceeded")))
                continue
            except Exception as exc:  # the prefill or the admission failed: answered, the others go on
                log.exception("request failed at admission")
                with self._lock:
                    self.counts["failed"] += 1
                job.emit(("error", _internal(exc)))
                continue
            with self._lock:
                self.active[lane] = act

    def _halt(self, job: Job) -> bool:
        if job.cancel.is_set():
            return True
        return self._deadline is not None and time.monotonic() > self._deadline

    def _fail(self, lane: int, exc: BaseException) -> None:
        with self._lock:
            act = self.active.pop(lane)
            self.counts["failed"] += 1
        act.job.emit(("error", _internal(exc)))

    def _fail_lost(self, done: dict, exc: BaseException) -> None:
        """After a LaneError: every lane that left the decoder without a result failed."""
        log.error("request failed: %s: %s", type(exc).__name__, exc)
        for lane in [l for l in self.active if l not in self._decoder.lanes and l not in done]:
            self._fail(lane, exc)

    def _finish(self, lane: int, res) -> None:
        m = self.model
        with self._lock:
            act = self.active.pop(lane)
        job, text = act.job, act.text
        tail = text.finish()
        n = text.used if text.stopped else res.new_tokens
        if tail:
            job.emit(("delta", tail, n, act.take(n)))
        cancelled = job.cancel.is_set()
        if res.stop_reason == "eos" or text.stopped:
            finish = "stop"
        elif res.stop_reason == "stopped":
            finish = "abort"
        else:
            finish = "length"
        with self._lock:
            self.counts["cancelled" if cancelled else "served"] += 1
        spec = m.describe(job.settings)
        spec.update(new_tokens=res.new_tokens, target_calls=res.target_calls, draft_calls=res.draft_calls,
                    accepted_tokens=int(sum(res.accepted_lengths)), block_efficiency=res.block_efficiency,
                    acceptance_rate=res.acceptance_rate, decode_seconds=res.seconds,
                    prefill_seconds=res.prefill_seconds, queue_seconds=act.started - job.enqueued,
                    source_stats=res.source_stats)
        done = {"text": text.text, "finish_reason": finish, "completion_tokens": n,
                "tokens": res.tokens.tolist()[:n], "speculative": spec, "first_token_at": act.first_token,
                "logprobs": act.take(n)}
        deliver(job, done, self.observe)
        log.debug("request done: %d prompt + %d tokens, %d target calls, finish %s, %.2f s",
                 len(job.prompt_ids), n, res.target_calls, finish, time.perf_counter() - act.started)


def _internal(exc: BaseException) -> APIError:
    return APIError(500, f"decoding failed: {type(exc).__name__}: {exc}", type="server_error", code="internal_error")
