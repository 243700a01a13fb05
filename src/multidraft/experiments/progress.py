"""Progress bars on stderr for long steps (tqdm when installed, a plain counter otherwise)."""
from __future__ import annotations

import sys
from typing import Iterable, Iterator, TypeVar

T = TypeVar("T")


def progress(it: Iterable[T], *, total: int | None = None, desc: str = "", enabled: bool = True) -> Iterator[T]:
    if not enabled:
        yield from it
        return
    try:
        from tqdm import tqdm
    except ImportError:  # pragma: no cover
        n = total if total is not None else (len(it) if hasattr(it, "__len__") else None)
        for i, x in enumerate(it, 1):
            print(f"\r{desc} {i}/{n if n is not None else '?'}", end="", file=sys.stderr, flush=True)
            yield x
        print(file=sys.stderr)
        return
    yield from tqdm(it, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, leave=False)
