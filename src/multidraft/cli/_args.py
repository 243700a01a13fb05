"""Argument parsing shared by every subcommand: ONE parser per kind of value, and the run
inputs that the ``experiment`` and ``experiment paper`` commands make from parsed arguments.

Each turns the raw text of a flag into values and raises ``ArgumentError`` naming the library
argument the value goes to (``k``, ``laws``, ...), so ``multidraft.cli.main`` prints it with
the flag from its one table (``ARG_FLAGS``) as one line and exits 2. They parse only: the
values are validated once, by the settings or config object they go to (``k >= 1`` by
``decoding.Settings`` or the experiment's config). Call them on the raw string after
``argparse`` (not as ``type=``), so the message is ours, not argparse's.
"""
from __future__ import annotations

import sys

from .._errors import ArgumentError

__all__ = ["k_list", "int_list", "float_list", "name_list", "draft_ftype",
           "eprint", "model_loader", "model_names", "progress_bar", "mapper_kw", "close_mapper"]


def name_list(text, arg: str) -> list[str]:
    """Comma-separated names, stripped, empty items dropped; at least one."""
    out = [x.strip() for x in str(text).split(",") if x.strip()]
    if not out:
        raise ArgumentError(arg, "is empty")
    return out


def int_list(text, arg: str, *, lo: int | None = None) -> list[int]:
    """Comma-separated integers and ranges ``a-b`` (inclusive), sorted, no duplicates; each >= ``lo``
    when given (for values that no library object checks)."""
    out: set[int] = set()
    for part in name_list(text, arg):
        a, sep, b = part.partition("-")
        try:
            vals = range(int(a), int(b) + 1) if sep and a else [int(part)]
        except ValueError:
            raise ArgumentError(arg, f": expected comma-separated integers or ranges like 1-8, got {part!r}") from None
        if sep and a and int(b) < int(a):
            raise ArgumentError(arg, f": empty range {part!r}")
        out.update(vals)
    if lo is not None and min(out) < lo:
        raise ArgumentError(arg, f": every value must be >= {lo}, got {text!r}")
    return sorted(out)


def k_list(text, arg: str = "k") -> list[int]:
    """Numbers of drafts K (``--k 2,4`` or ``--k 1-8``), parsed; ``>= 1`` is checked where they go."""
    return int_list(text, arg)


def float_list(text, arg: str) -> list[float]:
    """Comma-separated finite numbers."""
    out = []
    for part in name_list(text, arg):
        try:
            x = float(part)
        except ValueError:
            raise ArgumentError(arg, f": {part!r} is not a number") from None
        if x != x or x in (float("inf"), float("-inf")):
            raise ArgumentError(arg, f": {part!r} is not a finite number")
        out.append(x)
    return out


def draft_ftype(text, draft_path, flag: str = "--draft-ftype") -> str | None:
    """The ftype of the default draft's requantized GGUF (a key of ``models.GGUF_FTYPES``), or
    None; refused together with an explicit draft file."""
    from ..models import check_gguf_ftype

    key = check_gguf_ftype(text, flag)
    if key is not None and draft_path is not None:
        raise ValueError(f"{flag} picks the default draft's requantized GGUF; drop it or --draft")
    return key


# ---------------------------------------------------------------------------------------
# run inputs from parsed arguments (``experiment`` and ``experiment paper``)
# ---------------------------------------------------------------------------------------
def eprint(msg: str) -> None:
    """A progress line on stderr (the ``log`` of every long step)."""
    print(msg, file=sys.stderr, flush=True)


def model_loader(args):
    """A callable loading ``(target, draft, tokenizer)`` of ``--engine`` (default transformers)
    from ``--target`` / ``--draft`` (the default pair where absent; on llama.cpp the GGUF target
    is its own tokenizer), called only when a stage needs models."""
    engine = getattr(args, "engine", "transformers")

    def load():
        from ..decoding.pair import load_pair

        eprint(f"loading models ({engine}) ...")
        return load_pair(engine, target=args.target, draft=args.draft, log=eprint)

    return load


def model_names(args) -> dict:
    """``{"target", "draft"}``: the model paths given, or the default models' titles; the
    llama.cpp engine's names say so, so its stores and rows never mix with the transformers ones."""
    from ..models import DEFAULT_DRAFT, DEFAULT_TARGET

    names = {
        "target": str(args.target) if args.target else DEFAULT_TARGET.title,
        "draft": str(args.draft) if args.draft else DEFAULT_DRAFT.title,
    }
    if getattr(args, "engine", "transformers") == "llama.cpp":
        names = {k: f"{v} via llama.cpp" for k, v in names.items()}
    return names


def progress_bar(args):
    """The progress-bar factory, or None with ``--no-progress``."""
    if args.no_progress:
        return None
    from ..experiments.progress import progress

    return progress


def mapper_kw(args) -> dict:
    """``{"mapper": RayMapper}`` for ``--ray``, else nothing (the single-process default)."""
    if not args.ray:
        return {}
    from ..experiments.distributed import ray_mapper
    from . import UserError

    try:
        return {"mapper": ray_mapper(args.ray)}  # connects on the first cell, after collection
    except ImportError as exc:
        raise UserError(str(exc)) from None


def close_mapper(kw: dict) -> None:
    """Shut down a Ray session that ``--ray`` started (nothing otherwise)."""
    close = getattr(kw.get("mapper"), "close", None)
    if close is not None:
        close()
