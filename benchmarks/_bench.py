"""What the benchmark scripts share: their common flags (:func:`common_args`), the provenance
record of a timing (:func:`provenance`, :func:`load_average`: ``multidraft._machine``, the one
record every runner writes), a median timer and the JSONL writer (meta row first).

Scripts import it as ``_bench`` after putting ``benchmarks/`` on ``sys.path``.

Provenance keys: a script's meta row carries :func:`provenance` (``versions``, ``cpu``,
``cpu_flags``, ``cores``, ``torch_threads``, ``load_average``, ``platform``) and, beside it, the
keys its committed result files already had (``load_average_before``, ``loadavg_start``,
``cpu_count``, ``machine``, ...), so their readers read old and new files alike."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Callable, Sequence

from multidraft._machine import load_average, provenance, versions  # noqa: F401 (the scripts' provenance)

CLOCKS = {"wall": time.perf_counter, "thread": time.thread_time}  # --clock: wall time or this thread's CPU time

_HELP = {
    "seed": "seed of the run: every seed the script uses is derived from it (multidraft._validate.derive_seed)",
    "out": "JSONL results file: one meta row (the run's provenance), then the rows",
    "repeats": "timed repeats (the median is reported)",
    "threads": "torch threads",
    "clock": "wall: time.perf_counter; thread: time.thread_time (CPU time of this thread; robust on a shared, "
             "oversubscribed machine)",
}
_TYPE = {"seed": int, "out": Path, "repeats": int, "threads": int, "clock": str}


def common_args(ap: argparse.ArgumentParser, *, helps: dict | None = None, out_type=Path, **defaults) -> None:
    """Add the flags the benchmark scripts share, each named in ``defaults`` with its default:
    ``seed``, ``out``, ``repeats``, ``threads``, ``clock`` (choices :data:`CLOCKS`). ``helps``
    overrides a flag's help; ``out_type`` is the type of ``--out`` (``str`` where the parsed
    arguments are written as JSON)."""
    unknown = set(defaults) - set(_HELP)
    if unknown:
        raise ValueError(f"no common flag {', '.join(sorted(unknown))}; common flags: {', '.join(_HELP)}")
    helps = {**_HELP, **(helps or {})}
    for name, default in defaults.items():
        kw = {"choices": tuple(CLOCKS)} if name == "clock" else {"type": out_type if name == "out" else _TYPE[name]}
        ap.add_argument(f"--{name}", default=default, help=helps[name], **({"metavar": "FILE"} if name == "out" else {}),
                        **kw)


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
