"""Results are data: JSONL rows with seed, versions and config.

A results file starts with one ``{"type": "meta", ...}`` row (versions, config, seed,
command, start time) followed by ``{"type": "row", ...}`` measurement rows. Rows are
flushed as they are written, so an interrupted run keeps everything it finished and
``done_keys`` lets a resumed run skip it. Readers never rerun experiments.
"""
from __future__ import annotations

import json
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Iterable, Iterator


def versions() -> dict[str, str]:
    """Versions of the packages that shape a result."""
    out = {"python": platform.python_version()}
    for mod in ("multidraft", "torch", "numpy", "scipy", "transformers"):
        try:
            m = sys.modules.get(mod) or __import__(mod)
            out[mod] = str(getattr(m, "__version__", "?"))
        except Exception:  # noqa: BLE001
            continue
    return out


def _clean(x: Any) -> Any:
    if isinstance(x, float) and not math.isfinite(x):
        return None
    if isinstance(x, dict):
        return {str(k): _clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_clean(v) for v in x]
    if isinstance(x, Path):
        return str(x)
    if hasattr(x, "item") and callable(x.item) and getattr(x, "ndim", 1) == 0:
        return _clean(x.item())
    return x


def meta_row(config: dict, seed: int | None, **extra) -> dict:
    return _clean({
        "type": "meta",
        "seed": seed,
        "config": config,
        "versions": versions(),
        "command": " ".join(sys.argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    })


def _drop_torn_tail(path: Path) -> None:
    """Cut a torn final line (no newline: an interrupted write) before appending to the file,
    so that resuming never turns it into a corrupt line in the middle. Complete rows are kept."""
    with open(path, "rb+") as f:
        f.seek(0, os.SEEK_END)
        size = f.tell()
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return
        pos = size
        while pos > 0:
            step = min(65536, pos)
            f.seek(pos - step)
            chunk = f.read(step)
            nl = chunk.rfind(b"\n")
            if nl >= 0:
                f.truncate(pos - step + nl + 1)
                return
            pos -= step
        f.truncate(0)


class JsonlWriter:
    """Append-only JSONL results file; writes the meta row when the file is new."""

    def __init__(self, path: str | os.PathLike, config: dict, seed: int | None, **meta_extra):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        new = not self.path.exists() or self.path.stat().st_size == 0
        if not new:
            _drop_torn_tail(self.path)
            new = self.path.stat().st_size == 0
        self._f = open(self.path, "a", encoding="utf-8")
        if new:
            self._write(meta_row(config, seed, **meta_extra))

    def _write(self, obj: dict) -> None:
        self._f.write(json.dumps(_clean(obj), sort_keys=False) + "\n")
        self._f.flush()

    def write(self, **row) -> None:
        self._write({"type": "row", **row})

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_jsonl(path: str | os.PathLike) -> tuple[dict | None, list[dict]]:
    """(meta row or None, measurement rows). A torn last line (interrupted write) is skipped;
    any other unreadable line raises ``ValueError`` naming the file and line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no results file at {path}")
    meta, rows = None, []
    lines = path.read_text(encoding="utf-8").splitlines()
    for i, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            if i == len(lines):
                break  # torn final line from an interrupted run
            raise ValueError(f"{path}:{i} is not valid JSON (corrupt results file)") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{i} is not a JSON object")
        if obj.get("type") == "meta":
            meta = meta or obj
        else:
            rows.append(obj)
    return meta, rows


def done_keys(path: str | os.PathLike, key_fields: Iterable[str]) -> set[tuple]:
    """Keys of the rows already in a results file (for resuming)."""
    path = Path(path)
    if not path.exists():
        return set()
    fields = tuple(key_fields)
    _, rows = read_jsonl(path)
    return {tuple(json.dumps(r.get(f), sort_keys=True) for f in fields) for r in rows}


def row_key(row: dict, key_fields: Iterable[str]) -> tuple:
    return tuple(json.dumps(_clean(row.get(f)), sort_keys=True) for f in key_fields)
