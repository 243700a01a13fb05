"""What the benchmark scripts share: a median timer and the JSONL writer (meta row first).

Scripts import it as ``_bench`` after putting ``benchmarks/`` on ``sys.path``."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Callable, Sequence


def timed(fn: Callable[[], object], repeats: int, sync: Callable[[], object] | None = None) -> float:
    """Wall ms of ``fn()``: the middle of ``repeats`` calls (the upper one of an even count) after
    one warm-up call; ``sync`` (a device's synchronise) runs before and after every call."""
    wait = sync or (lambda: None)
    fn()
    wait()
    ts = []
    for _ in range(repeats):
        wait()
        t0 = time.perf_counter()
        fn()
        wait()
        ts.append(time.perf_counter() - t0)
    ts.sort()
    return 1e3 * ts[len(ts) // 2]


def write_jsonl(path: str | Path, meta: dict, rows: Sequence[dict]) -> None:
    """``meta`` then every row, one JSON object a line, to ``path``; says where."""
    with open(path, "w") as f:
        for r in [meta, *rows]:
            f.write(json.dumps(r) + "\n")
    print(f"wrote {path}")
