"""``multidraft serve``: the OpenAI-compatible HTTP server (``multidraft.serve``; the ``serve`` extra).

The models, engine and speculative configuration are ``decode``'s flags, checked by the same
code (``decode.check_settings``: ``decoding.Settings.from_args``, flags named from
``cli.ARG_FLAGS``) before anything loads. Defaults: ``--engine llama.cpp`` with the default pair
as ``decode`` uses it for speed, the BF16 target and the Q4_0 draft where those files are
built (``multidraft setup-models --gguf --bf16-target --draft-ftype q4_0``), else the Q4_K_M
files; ``--engine transformers`` for model directories. ``--tree auto --profile FILE`` chooses
the tree once at start-up (from ``--accept-stats`` or a warm-up decode of ``--warmup-prompt``; the
best tree even where the warm-up predicts it slower than the target alone), and each request then
drafts, step by step, only as deep as pays by the profile and its own acceptances so far (depth 0:
the target alone; ``decoding.pace``, and free chains cut by ``decoding.sources.budget``):
speculation chosen per request, as it goes. With free sources alone (``--sources lookup,suffix
--tree auto --profile FILE``) there is no tree to choose and no warm-up: each request's copied
chains are cut by cost from the profile as it goes (``decoding.auto`` notes).
Each request's temperature, top_p, top_k and max_tokens replace ``--temperature`` etc.;
``--max-new-tokens`` is the default ``max_tokens`` of a chat request (a completion's is 16, as
OpenAI's). ``--sources`` (a comma list, ``decoding.sources.parse_sources``) is the default draft
sources of every request, a request's ``sources`` field replaces it; the server holds one
``decoding.sources.SuffixIndex`` (bounded) that the ``suffix`` source of every request reads
and that every finished output of such a request joins. Sources without ``model`` (``--sources
lookup``, a request's ``["lookup", "suffix"]``) decode with the free sources alone (no draft model
runs for that request). A server whose ``--sources`` are free-only (``Settings.free_only``) loads no
draft model at all (no draft weights, no draft cache; ``--draft`` is named in a warning and not
loaded), and a request whose ``sources`` name ``model`` there is a 400 naming ``sources``; a server
with ``model`` in its sources loads the draft, and its requests may name free sources alone.
Logs go to stderr through ``logging``
(``--log-level``).
"""
from __future__ import annotations

import logging
import sys

from ._args import quiet_loading, warn
from .decode import DEFAULT_CTX, add_settings_flags, auto_request, check_settings

WARMUP_PROMPT = "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"


def register(sub) -> None:
    p = sub.add_parser(
        "serve",
        help="an OpenAI-compatible HTTP server (/v1/completions, /v1/chat/completions) with lossless speculation",
        description="Serve the pair over HTTP with OpenAI's API (streaming, seeds, stop sequences); one worker "
                    "decodes queued requests in --max-lanes lanes sharing the forward passes. Needs the serve extra (pip install -e '.[serve]').",
    )
    add_settings_flags(p, engine="llama.cpp")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    p.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port, logged)")
    p.add_argument("--model-name", default=None, metavar="NAME",
                   help="the model id /v1/models lists and every request must send (another id is answered 404; "
                        "default: the --target file or directory name without .gguf, for the default pair "
                        "'qwen2.5-coder-1.5b-instruct')")
    p.add_argument("--queue-size", type=int, default=64, metavar="N",
                   help="requests waiting at most; more are refused with 429 (default 64)")
    p.add_argument("--max-in-flight", type=int, default=None, metavar="N",
                   help="requests in flight at most, from their first byte to the end of their answer (being read, "
                        "parsed, tokenized, queued, decoded); more are answered 503 with Retry-After (default: "
                        "--queue-size + --max-lanes + 16)")
    p.add_argument("--max-lanes", type=int, default=1, metavar="N",
                   help="requests decoded at once, sharing the models' forward passes (continuous batching; "
                        "default 1: one at a time, each token for token as `multidraft decode` with its seed; "
                        "beside others a request's tokens may differ by the engines' floating-point differences "
                        "between batch shapes, its law is the target's either way)")
    p.add_argument("--shutdown-grace", "--drain-timeout", dest="shutdown_grace", type=float, default=30.0,
                   metavar="S",
                   help="on SIGTERM (a drain: /ready turns 503, no new connection is accepted), seconds the requests "
                        "being decoded may take to finish before they are stopped (default 30; queued requests are "
                        "answered 503 with Retry-After at once); then the process exits 0")
    p.add_argument("--replicas", type=int, default=1, metavar="N",
                   help="N >= 2: N replicas of the decoder on Ray (each loads the pair once and owns --max-lanes lanes "
                        "and a --queue-size queue) behind this one server, each request sent to the replica with the "
                        "fewest in flight; a local Ray unless --ray (needs the ray extra: pip install "
                        "'multidraft[ray]'). Default 1: one process, no Ray")
    p.add_argument("--ray", default=None, metavar="ADDRESS",
                   help="with --replicas N >= 2: the Ray cluster to run the replicas on (ray.init's address, e.g. "
                        "'auto' or 'ray://host:10001'; default: a local Ray of N CPUs)")
    p.add_argument("--warmup-prompt", default=None, metavar="TEXT",
                   help="--tree auto without --accept-stats: the prompt of the warm-up decode that measures acceptance")
    p.add_argument("--api-key", default=None, metavar="KEY",
                   help="the key every API route (/v1/..., /tokenize, /detokenize) needs as 'Authorization: Bearer "
                        "KEY' (401 without it; /health stays open); default: the MULTIDRAFT_API_KEY environment "
                        "variable, else no key")
    p.add_argument("--log-level", default="info", choices=("debug", "info", "warning", "error"))
    p.set_defaults(func=run)


def _default_gguf(args) -> None:
    """llama.cpp with the default pair: the BF16 target and the Q4_0 draft where built."""
    if args.engine != "llama.cpp":
        return
    from ..models import default_gguf

    if args.target is None and not args.bf16_target and default_gguf("target", "bf16").is_file():
        args.bf16_target = True
    if args.draft is None and args.draft_ftype is None and default_gguf("draft", "q4_0").is_file():
        args.draft_ftype = "q4_0"


def run(args) -> int:
    # the server's own flags first (no torch needed), then the decoding settings, then the address
    if not 0 <= args.port < 65536:
        raise ValueError(f"--port must be in [0, 65535], got {args.port}")
    if args.queue_size < 1:
        raise ValueError(f"--queue-size must be >= 1, got {args.queue_size}")
    if not 1 <= args.max_lanes <= 64:
        raise ValueError(f"--max-lanes must be in [1, 64], got {args.max_lanes}")
    if args.max_in_flight is not None and args.max_in_flight < 1:
        raise ValueError(f"--max-in-flight must be >= 1, got {args.max_in_flight}")
    if not args.shutdown_grace >= 0:
        raise ValueError(f"--drain-timeout (--shutdown-grace) must be >= 0, got {args.shutdown_grace}")
    if args.api_key is None:
        import os

        args.api_key = os.environ.get("MULTIDRAFT_API_KEY") or None
    if args.api_key is not None and not args.api_key.strip():
        raise ValueError("--api-key must not be empty")
    if args.warmup_prompt is not None and args.tree != "auto":
        raise ValueError("--warmup-prompt applies to --tree auto only")
    check_replicas(args.replicas, args.ray)
    settings, draft_temperature, tree = check_settings(args)
    if settings.free_only and args.draft is not None:
        warn(args, f"--draft is not loaded: --sources {args.sources} drafts with free sources alone")
    auto = None
    if tree == "auto":  # checked before any model loads
        from ..decoding.auto import check_auto
        from ..experiments.acceptance import tree_acceptance

        from dataclasses import replace

        # the best tree is kept even where the warm-up predicts it slower than the target alone:
        # each request paces its own depth from its own acceptances (0: the target alone); free
        # sources alone have no tree to keep (their chains are cut by cost, decoding.auto notes)
        if settings.free_only and args.warmup_prompt is not None:
            raise ValueError(f"--warmup-prompt measures the draft model's acceptance; --sources {args.sources} "
                             "--tree auto has no draft model (each request's free chains are cut by cost from "
                             "--profile as it goes): drop it, or add model to --sources")
        force = bool(args.force_tree) if settings.free_only else True
        auto = check_auto(replace(auto_request(args), force_tree=force), settings, read_acceptance=tree_acceptance)
    check_listen(args.host, args.port)  # a busy port or a bad --host, before the models load
    from .. import _optional

    for mod in ("fastapi", "uvicorn"):
        if not _optional.available(mod):
            raise ValueError(f"multidraft serve needs {mod}: {_optional.hint(mod)}")
    _default_gguf(args)

    from ..serve import run_server

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level in ("warning", "error"):
        quiet_loading()  # no loading progress bars either
    logger = logging.getLogger("multidraft.serve")
    model = load_served(args, settings, draft_temperature, auto, logger.info)
    router = None
    max_in_flight = args.max_in_flight
    if args.replicas > 1:
        import functools

        from ..serve.replicas import Router, connect

        connect(args.ray, num_cpus=args.replicas)
        # the replicas load the pair with the settings chosen here (a --tree auto choice is made once)
        load = functools.partial(load_served, args, model.settings, draft_temperature, None, None,
                                 cost_profile=model.cost_profile)
        router = Router(load, args.replicas, queue_size=args.queue_size, max_lanes=args.max_lanes,
                        threads=args.threads)
        logger.info("%d replicas starting on Ray (%s)", args.replicas, args.ray or "local")
        if max_in_flight is None:
            max_in_flight = args.replicas * (args.queue_size + args.max_lanes) + 16
    try:
        return run_server(model, host=args.host, port=args.port, queue_size=args.queue_size,
                          shutdown_grace_s=args.shutdown_grace, log_level=args.log_level, max_lanes=args.max_lanes,
                          max_in_flight=max_in_flight, api_key=args.api_key, worker=router)
    finally:
        if router is not None:
            import ray

            ray.shutdown()


def check_replicas(replicas: int, address: str | None) -> None:
    """ValueError (one line, naming the flag) unless ``--replicas`` is >= 1, ``--ray`` comes with
    ``--replicas N >= 2``, and Ray is installed for N >= 2; checked before any model loads."""
    if replicas < 1:
        raise ValueError(f"--replicas must be >= 1, got {replicas}")
    if address is not None and replicas < 2:
        raise ValueError("--ray applies to --replicas N >= 2 only")
    if replicas >= 2:
        from .. import _optional

        if not _optional.available("ray"):
            raise ValueError(f"--replicas {replicas} needs ray: {_optional.hint('ray')}")


def load_served(args, settings, draft_temperature, auto, say=None, cost_profile=None):
    """The served pair of ``args`` (a ``serve.ServedModel``): the models loaded, the tree of
    ``--tree auto`` chosen when ``auto`` is given (its profile then paces each request). A replica
    calls it (through Ray) with the settings and ``cost_profile`` the server chose, ``auto`` None."""
    import torch

    from ._args import load_models
    from ..serve import ServedModel, TextCodec

    say = say or (lambda *a: None)
    llama = args.engine == "llama.cpp"
    spec = settings.uses_draft  # the target alone and free-only sources load no draft model
    target, draft, tok = load_models(
        args.engine, target=args.target, draft=args.draft if spec else False,
        dtype=None if llama else getattr(torch, args.dtype), bf16_target=args.bf16_target,
        draft_ftype=args.draft_ftype if spec else None, n_threads=args.threads, log=say,
        **({"n_ctx": args.ctx_size or DEFAULT_CTX} if llama else {}))
    codec = TextCodec(args.engine, target, tok, draft if spec else None)
    if auto is not None and not auto.free_only:  # free sources alone: no tree to choose, the profile paces them
        text = args.warmup_prompt or WARMUP_PROMPT
        ids = codec.encode(text)
        if not ids:
            raise ValueError("--warmup-prompt encodes to no tokens")
        from ..decoding.auto import choose

        chosen, _ = choose(target, draft, torch.tensor([ids], dtype=torch.long), settings, auto,
                           None if args.ignore_eos else codec.eos, say)
        if chosen is not None:
            settings = settings.derive(tree=chosen)
        else:
            settings = settings.derive(verifier=None)
            draft = None
    name = args.model_name or _model_name(args)
    return ServedModel(name=name, engine=args.engine, target=target, draft=None if settings.target_alone else draft,
                       codec=codec, settings=settings, draft_temperature=draft_temperature,
                       default_max_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos,
                       cost_profile=None if settings.target_alone else (auto.profile if auto is not None else cost_profile))


RESOLVE_TIMEOUT_S = 5.0  # how long ``check_listen`` waits for a --host name to resolve


def check_listen(host: str, port: int) -> None:
    """ValueError naming ``--host`` / ``--port`` unless a listening socket can be bound there now
    (tried and closed at once, with SO_REUSEADDR as uvicorn binds): a bad host name, a name
    that does not resolve within ``RESOLVE_TIMEOUT_S`` seconds (a resolver that does not
    answer), an address of no interface here, or a port another process listens on is refused
    before any model loads. Port 0 (any free port) passes whenever the host does."""
    import socket

    infos = _resolve(host, port, RESOLVE_TIMEOUT_S)
    family, kind, proto, _, addr = infos[0]
    try:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(addr)
    except OSError as exc:
        raise ValueError(f"--host {host} --port {port}: cannot listen there: {exc.strerror or exc}") from None


def _resolve(host: str, port: int, timeout: float) -> list:
    """``socket.getaddrinfo`` of the listening address, in a daemon thread given ``timeout``
    seconds (a lookup cannot be cancelled: one that hangs is left behind and never delays the
    exit); ValueError naming ``--host`` when it fails or takes longer."""
    import socket
    import threading

    out: dict = {}

    def lookup():
        try:
            out["infos"] = socket.getaddrinfo(host or None, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
        except (OSError, UnicodeError) as exc:
            out["error"] = exc

    t = threading.Thread(target=lookup, name="multidraft-resolve-host", daemon=True)
    t.start()
    t.join(timeout)
    if "infos" in out and out["infos"]:
        return out["infos"]
    exc = out.get("error")
    if exc is None:
        raise ValueError(f"--host {host!r}: not resolved within {timeout:g} s (this machine's resolver does not answer "
                         f"for it); give an address such as 127.0.0.1 or 0.0.0.0")
    raise ValueError(f"--host {host!r}: not an address to listen on ({getattr(exc, 'strerror', None) or exc})")


def _model_name(args) -> str:
    from pathlib import Path

    if args.target is not None:
        return Path(str(args.target)).expanduser().name.removesuffix(".gguf")
    from ..models import DEFAULT_TARGET

    return getattr(DEFAULT_TARGET, "name", "multidraft")
