"""``multidraft setup-models``: the default model pair, assembled, checked and converted once.

Assembles, checksums and converts the default model pair once (progress on stderr) and
prints the two model directories; ``--gguf`` also keeps the two Q4_K_M GGUF files for
llama.cpp, ``--bf16-target`` makes the BF16 GGUF of the target and ``--draft-ftype q4_0``
the Q4_0 GGUF of the draft (the fast CPU draft; both need the ``llama`` extra: llama.cpp
writes them, ``decoding.quantize``), printing their paths and sizes.
"""
from __future__ import annotations

from . import UserError
from ._args import draft_ftype, eprint


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "setup-models",
        help="assemble, verify and convert the default model pair (cached)",
        description="Find the GGUF slices of the default pair in site-packages, check size and sha256, "
                    "convert each model once to bf16 safetensors in the cache and print the directories.",
    )
    p.add_argument("--cache-dir", default=None, help="cache directory (default $MULTIDRAFT_CACHE or ~/.cache/multidraft/models)")
    p.add_argument("--gguf", action="store_true",
                   help="also keep the assembled Q4_K_M GGUF files of both models in <cache>/gguf (for llama.cpp)")
    p.add_argument("--bf16-target", action="store_true",
                   help="also write the target requantized to BF16 by llama.cpp, <cache>/gguf/<name>.BF16.gguf "
                        "(3.3 GiB, about 10-15 s; needs the llama extra: scripts/install_llama_cpp.sh .venv/bin/python)")
    p.add_argument("--draft-ftype", default=None, metavar="FTYPE",
                   help="also write the draft requantized by llama.cpp to FTYPE, <cache>/gguf/<name>.<FTYPE>.gguf "
                        "(q4_0: about a third cheaper per draft token on AVX2 / AVX-512 CPUs; a few seconds; "
                        "needs the llama extra)")
    p.set_defaults(func=run)


def _size(path) -> str:
    return f"{path.stat().st_size / 2**30:.2f} GiB"


def run(args) -> int:
    from .. import _optional
    from ..models import DEFAULT_DRAFT, DEFAULT_TARGET, ensure_assembled_gguf, ensure_default_models

    ftype = draft_ftype(args.draft_ftype, None)
    try:
        if args.bf16_target or ftype:
            _optional.require("llama_cpp")  # fail before any long step
        target, draft = ensure_default_models(args.cache_dir, log=eprint)
        ggufs = []
        if args.gguf:
            ggufs += [("target gguf", ensure_assembled_gguf(DEFAULT_TARGET, cache_dir=args.cache_dir, log=eprint)),
                      ("draft gguf", ensure_assembled_gguf(DEFAULT_DRAFT, cache_dir=args.cache_dir, log=eprint))]
        if args.bf16_target or ftype:
            from ..decoding.quantize import ensure_gguf

            if args.bf16_target:
                ggufs.append(("target bf16 gguf", ensure_gguf(DEFAULT_TARGET, bf16=True, cache_dir=args.cache_dir,
                                                              log=eprint)))
            if ftype:
                ggufs.append((f"draft {ftype} gguf", ensure_gguf(DEFAULT_DRAFT, ftype=ftype, cache_dir=args.cache_dir,
                                                                 log=eprint)))
    except (ImportError, RuntimeError) as exc:
        raise UserError(str(exc)) from None
    except OSError as exc:
        if isinstance(exc, FileNotFoundError):
            raise
        raise UserError(str(exc)) from None
    print(f"target: {target}")
    print(f"draft:  {draft}")
    for label, path in ggufs:
        print(f"{label}: {path} ({_size(path)})")
    return 0
