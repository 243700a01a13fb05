"""``multidraft serve``: the OpenAI-compatible HTTP server (``multidraft.serve``; the ``serve`` extra).

The models, engine and speculative configuration are ``decode``'s flags, checked by the same
code (``decode.check_settings``: ``decoding.Settings.from_args``, flags named from
``cli.ARG_FLAGS``) before anything loads. Defaults: ``--engine llama.cpp`` with the default pair
as ``decode`` uses it for speed, the BF16 target and the Q4_0 draft where those files are
built (``multidraft setup-models --gguf --bf16-target --draft-ftype q4_0``), else the Q4_K_M
files; ``--engine transformers`` for model directories. ``--tree auto --profile FILE`` chooses
the tree once at start-up (from ``--accept-stats`` or a warm-up decode of ``--warmup-prompt``).
Each request's temperature, top_p, top_k and max_tokens replace ``--temperature`` etc.;
``--max-new-tokens`` is the default ``max_tokens`` of a chat request (a completion's is 16, as
OpenAI's). ``--sources`` (a comma list, ``decoding.sources.parse_sources``) is the default draft
sources of every request, a request's ``sources`` field replaces it; the server holds one
``decoding.sources.SuffixIndex`` (bounded) that the ``suffix`` source of every request reads
and that every finished output of such a request joins. Sources without ``model`` (``--sources
lookup``, a request's ``["lookup", "suffix"]``) decode with the free sources alone (no draft model
runs for that request; the server still loads its draft, which a request naming ``model`` uses).
Logs go to stderr through ``logging``
(``--log-level``).
"""
from __future__ import annotations

import logging
import sys

from ._args import quiet_loading
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
    p.add_argument("--shutdown-grace", type=float, default=30.0, metavar="S",
                   help="on SIGTERM, seconds the request being decoded may take to finish before it is stopped "
                        "(default 30; queued requests are answered 503 at once)")
    p.add_argument("--warmup-prompt", default=None, metavar="TEXT",
                   help="--tree auto without --accept-stats: the prompt of the warm-up decode that measures acceptance")
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
        raise ValueError(f"--shutdown-grace must be >= 0, got {args.shutdown_grace}")
    if args.warmup_prompt is not None and args.tree != "auto":
        raise ValueError("--warmup-prompt applies to --tree auto only")
    settings, draft_temperature, tree = check_settings(args)
    auto = None
    if tree == "auto":  # checked before any model loads
        from ..decoding.auto import check_auto
        from ..experiments.acceptance import tree_acceptance

        auto = check_auto(auto_request(args), settings, read_acceptance=tree_acceptance)
    check_listen(args.host, args.port)  # a busy port or a bad --host, before the models load
    from .. import _optional

    for mod in ("fastapi", "uvicorn"):
        if not _optional.available(mod):
            raise ValueError(f"multidraft serve needs {mod}: {_optional.hint(mod)}")
    _default_gguf(args)

    import torch

    from ._args import load_models
    from ..serve import ServedModel, TextCodec, run_server

    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.log_level in ("warning", "error"):
        quiet_loading()  # no loading progress bars either
    logger = logging.getLogger("multidraft.serve")
    say = logger.info
    llama = args.engine == "llama.cpp"
    spec = not settings.target_alone
    target, draft, tok = load_models(
        args.engine, target=args.target, draft=args.draft if spec else False,
        dtype=None if llama else getattr(torch, args.dtype), bf16_target=args.bf16_target,
        draft_ftype=args.draft_ftype if spec else None, n_threads=args.threads, log=say,
        **({"n_ctx": args.ctx_size or DEFAULT_CTX} if llama else {}))
    codec = TextCodec(args.engine, target, tok, draft if spec else None)
    if auto is not None:
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
    model = ServedModel(name=name, engine=args.engine, target=target, draft=None if settings.target_alone else draft,
                        codec=codec, settings=settings, draft_temperature=draft_temperature,
                        default_max_tokens=args.max_new_tokens, ignore_eos=args.ignore_eos)
    return run_server(model, host=args.host, port=args.port, queue_size=args.queue_size,
                      shutdown_grace_s=args.shutdown_grace, log_level=args.log_level, max_lanes=args.max_lanes,
                      max_in_flight=args.max_in_flight)


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
