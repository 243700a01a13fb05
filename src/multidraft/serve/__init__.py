"""``multidraft serve``: an OpenAI-compatible HTTP server for lossless multi-draft decoding
(the ``serve`` extra: FastAPI and uvicorn).

Endpoints: ``/health`` (liveness), ``/ready`` (readiness, also ``/readyz``: 503 while starting or
draining), ``/metrics`` (Prometheus' text format, ``metrics``), ``/v1/models``, ``/tokenize`` and
``/detokenize`` (llama-server's and vLLM's shapes), ``/v1/completions``, ``/v1/chat/completions`` (the
model's chat template), with ``stream`` (server-sent events, one event per decoding step's
text), ``temperature``, ``top_p``, ``top_k``, ``max_tokens``, ``stop``, ``seed`` (the same seed
and settings give the same text; without one a seed is drawn and returned as ``seed``) and
``n = 1``, ``logprobs`` / ``top_logprobs`` (the target's, exactly, from the verification passes:
``decoding.step.TokenLogprobs``; the unimplemented fields are refused naming them, see
``protocol``). Each response carries ``usage`` and a ``speculative`` object (target calls, accepted
tokens, block efficiency, the verifier and tree). Bad requests get a 4xx and OpenAI's error
object, never a 500: a body over ``protocol.MAX_BODY_BYTES`` is 413 before it is parsed; JSON
nested past ``protocol.MAX_JSON_DEPTH``, NaN and strings that are not valid Unicode are 400;
bodies are parsed and prompts tokenized off the event loop, so ``/health`` answers at once;
a text prompt that cannot fit the context (tokens >= bytes / B, ``datasets.ByteBound``) is
refused before the tokenizer runs on it.
At most ``max_in_flight`` requests are in flight (503 with Retry-After beyond it, see ``app``).
One worker decodes the requests of a bounded queue (429 when full) in the lanes of a
``decoding.BatchDecoder`` (``max_lanes``; continuous batching, see ``worker``).

Modules: ``protocol`` (request checks, errors), ``worker`` (the served pair, the queue, text
streaming with stop sequences), ``metrics`` (the Prometheus metrics of one app and the one JSON
log line per request), ``app`` (the FastAPI app and ``run_server``), ``replicas`` (``--replicas N``:
the decoder as Ray actors behind the one app, routed by requests in flight; the ``ray`` extra). This package
sits beside ``experiments``: it decodes through ``multidraft.decoding`` and logs through
``logging`` (the command line configures it); it never prints.
"""
from __future__ import annotations

from .protocol import APIError
from .worker import ServedModel, TextCodec, TextStream, Worker

__all__ = ["APIError", "ServedModel", "TextCodec", "TextStream", "Worker", "create_app", "run_server"]


def create_app(*args, **kwargs):
    """``app.create_app`` (imports FastAPI on first use)."""
    from .app import create_app as make

    return make(*args, **kwargs)


def run_server(*args, **kwargs) -> int:
    """``app.run_server`` (imports uvicorn on first use)."""
    from .app import run_server as run

    return run(*args, **kwargs)
