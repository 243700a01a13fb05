"""Argument parsing shared by every subcommand: ONE parser per kind of value.

Each returns the parsed value or raises ``ValueError`` whose message starts with the flag
name, so ``multidraft.cli.main`` prints it as one line and exits 2. Call them on the raw
string after ``argparse`` (not as ``type=``), so the message is ours, not argparse's.
"""
from __future__ import annotations

__all__ = ["k_list", "int_list", "float_list", "name_list", "draft_ftype"]


def name_list(text, flag: str) -> list[str]:
    """Comma-separated names, stripped, empty items dropped; at least one."""
    out = [x.strip() for x in str(text).split(",") if x.strip()]
    if not out:
        raise ValueError(f"{flag} is empty")
    return out


def int_list(text, flag: str, *, lo: int = 1) -> list[int]:
    """Comma-separated integers and ranges ``a-b`` (inclusive), sorted, no duplicates, each >= lo."""
    out: set[int] = set()
    for part in name_list(text, flag):
        a, sep, b = part.partition("-")
        try:
            vals = range(int(a), int(b) + 1) if sep and a else [int(part)]
        except ValueError:
            raise ValueError(f"{flag}: expected comma-separated integers or ranges like 1-8, got {part!r}") from None
        if sep and a and int(b) < int(a):
            raise ValueError(f"{flag}: empty range {part!r}")
        out.update(vals)
    if min(out) < lo:
        raise ValueError(f"{flag}: every value must be >= {lo}, got {text!r}")
    return sorted(out)


def k_list(text, flag: str = "--k") -> list[int]:
    """Numbers of drafts K (``--k 2,4`` or ``--k 1-8``)."""
    return int_list(text, flag, lo=1)


def float_list(text, flag: str) -> list[float]:
    """Comma-separated finite numbers."""
    out = []
    for part in name_list(text, flag):
        try:
            x = float(part)
        except ValueError:
            raise ValueError(f"{flag}: {part!r} is not a number") from None
        if x != x or x in (float("inf"), float("-inf")):
            raise ValueError(f"{flag}: {part!r} is not a finite number")
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
