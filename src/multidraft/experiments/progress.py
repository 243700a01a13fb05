"""Progress bars on stderr for long steps (tqdm, a hard dependency)."""
from __future__ import annotations

import sys
from typing import Iterable, Iterator, TypeVar

from tqdm import tqdm

T = TypeVar("T")

__all__ = ["progress"]


def progress(it: Iterable[T], *, total: int | None = None, desc: str = "", enabled: bool = True) -> Iterator[T]:
    if not enabled:
        yield from it
        return
    yield from tqdm(it, total=total, desc=desc, file=sys.stderr, dynamic_ncols=True, leave=False)
