"""Results are data: JSONL rows bound to the run that wrote them.

A results file starts with one ``{"type": "meta", ...}`` row (run id, config, seed,
versions, command, start time) followed by ``{"type": "row", "run_id": ..., ...}``
measurement rows. This module is the ONE place that decides whether rows belong to a run:

* **Binding.** The run id is a digest of the config and the seed, *minus* the ``keyed``
  config keys: options that only select which rows exist (the Ks, laws, verifiers,
  datasets, temperatures to add) and whose values every row carries in its key fields.
  Reopening a file (:class:`JsonlWriter`, :func:`resume`) with any other difference is
  refused with one line naming the differing keys (``draws 200 -> 100``); extending a run
  with new K values is not. The meta row keeps the config of the first invocation.
* **Provenance per row.** A resumed run may append rows from a later checkout, so every row
  carries the code that wrote it (``code``: :func:`code_version`, the package version and,
  in a git checkout, the commit, ``-dirty`` with uncommitted changes).
* **Foreign rows.** :func:`read_jsonl` refuses a second meta row, a row whose ``run_id``
  is not the meta's, and (in a file whose meta has a run id) a row without one, naming
  ``file:line``; such rows are never counted as done.
* **Interrupts.** Each row is ONE ``write`` of a complete line on an unbuffered file, so
  Ctrl-C leaves complete rows only, or at worst a torn last line after a failed write
  (disk full): readers skip it and a writer cuts it before appending (``_drop_torn_tail``).
* **I/O errors** are ``OSError`` with ``filename`` set to the path (:func:`ensure_dir`,
  the writer), which ``multidraft.cli.main`` prints as one line.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import platform
import sys
import time
import zlib
from pathlib import Path
from typing import Any, Iterable, Sequence

__all__ = [
    "versions", "code_version", "meta_row", "run_id", "io_error", "ensure_dir", "check_binding", "resume", "JsonlWriter",
    "read_jsonl", "done_keys", "row_key", "require_fields", "derived_seed",
]


def versions() -> dict[str, str]:
    """Versions of the packages that shape a result."""
    out = {"python": platform.python_version()}
    for mod in ("multidraft", "torch", "numpy", "scipy", "transformers"):
        m = sys.modules.get(mod)
        if m is None:
            continue  # not imported by this run: it did not shape the result
        out[mod] = str(getattr(m, "__version__", "?"))
    return out


_CODE: list = []


def code_version() -> str:
    """The code that writes a row: ``multidraft`` version, plus ``+g<commit>`` (and ``-dirty``
    with uncommitted changes to tracked files) when the package runs from a git checkout.
    Computed once per process."""
    if not _CODE:
        from .. import __version__

        out = str(__version__)
        root = Path(__file__).resolve().parents[3]  # src/multidraft/experiments -> the checkout
        try:
            import subprocess  # noqa: PLC0415

            if (root / ".git").exists():
                run = lambda *a: subprocess.run(["git", "-C", str(root), *a], capture_output=True, text=True, timeout=10)  # noqa: E731
                head = run("rev-parse", "--short=12", "HEAD")
                if head.returncode == 0 and head.stdout.strip():
                    dirty = run("status", "--porcelain", "--untracked-files=no")
                    out += f"+g{head.stdout.strip()}" + ("-dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")
        except (OSError, subprocess.SubprocessError):  # no git here: the version alone
            pass
        _CODE.append(out)
    return _CODE[0]


def derived_seed(seed: int, name: str) -> int:
    """The seed of one named unit of work (a cell, a text, a decoding run): a function of
    (seed, name) alone, so units can run in any order or process with the same draws."""
    return (int(seed) * 1_000_003 + zlib.crc32(str(name).encode())) % (2**63 - 1)


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


def _canon(config: dict) -> dict:
    """The config as it reads back from JSON (tuples -> lists, numpy scalars -> numbers)."""
    return json.loads(json.dumps(_clean(dict(config)), sort_keys=True))


def run_id(config: dict, seed: int | None, keyed: Iterable[str] = ()) -> str:
    """Digest of the bound part of a config (every key but ``keyed``) and the seed."""
    keyed = set(keyed)
    bound = {k: v for k, v in _canon(config).items() if k not in keyed}
    blob = json.dumps({"config": bound, "seed": seed}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def meta_row(config: dict, seed: int | None, *, keyed: Iterable[str] = (), **extra) -> dict:
    return _clean({
        "type": "meta",
        "run_id": run_id(config, seed, keyed),
        "seed": seed,
        "config": config,
        "keyed": sorted(set(keyed)),
        "versions": versions(),
        "code": code_version(),
        "command": " ".join(sys.argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    })


def io_error(exc: OSError, path: Path, what: str) -> OSError:
    """The same error, with the path and what we were doing in one line."""
    reason = exc.strerror or str(exc)
    return type(exc)(exc.errno, f"cannot {what} ({reason})", str(path)) if exc.errno else OSError(f"{path}: cannot {what} ({reason})")


def ensure_dir(path: str | os.PathLike, what: str = "run directory") -> Path:
    """Create ``path`` (and parents) if needed and check it is a writable directory.

    Raises ``NotADirectoryError`` / ``PermissionError`` / ``OSError`` whose ``filename`` is
    the path, before any model is loaded or any work is done."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(20, f"{what} is a file, not a directory", str(path))
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise NotADirectoryError(20, f"{what} is a file, not a directory", str(path)) from None
    except OSError as exc:
        raise io_error(exc, path, f"create the {what}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PermissionError(13, f"{what} is not writable", str(path))
    return path


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


def _fmt(v: Any) -> str:
    s = json.dumps(v, sort_keys=True)
    return s if len(s) <= 40 else s[:37] + "..."


def check_binding(path: str | os.PathLike, config: dict, seed: int | None, keyed: Iterable[str] = ()) -> list[dict]:
    """Rows of an existing results file that this run (config, seed) may extend.

    An absent or empty file gives ``[]``. Otherwise the file must have been written by the
    same run: ``ValueError`` naming the path and the differing config keys (or the foreign
    rows) if not."""
    path = Path(path)
    if not path.exists() or path.stat().st_size == 0:
        return []
    if not path.is_file():
        raise IsADirectoryError(21, "expected a results file, found a directory", str(path))
    meta, rows = read_jsonl(path)
    if meta is None:
        if not rows:
            return []  # only a torn line: nothing was finished
        raise ValueError(f"{path} has rows but no meta row: not a results file of this run; use a new file or run directory")
    if meta.get("run_id") is None:
        raise ValueError(f"{path} has no run id (written by an older multidraft): its rows cannot be checked against "
                         "this run; use a new file or run directory")
    keyed = set(keyed)
    old = {k: v for k, v in _canon(meta.get("config") or {}).items() if k not in keyed}
    new = {k: v for k, v in _canon(config).items() if k not in keyed}
    diff = [f"{k} {_fmt(old.get(k))} -> {_fmt(new.get(k))}" for k in sorted(set(old) | set(new)) if old.get(k) != new.get(k)]
    if meta.get("seed") != seed:
        diff.insert(0, f"seed {_fmt(meta.get('seed'))} -> {_fmt(seed)}")
    if diff:
        raise ValueError(f"{path} was written with another config ({'; '.join(diff)}); rerun with the same settings "
                         "or use a new run directory")
    if meta["run_id"] != run_id(config, seed, keyed):
        raise ValueError(f"{path} belongs to run {meta['run_id']}, not to this run ({run_id(config, seed, keyed)}); "
                         "use a new run directory")
    return rows


def row_key(row: dict, key_fields: Iterable[str]) -> tuple:
    return tuple(json.dumps(_clean(row.get(f)), sort_keys=True) for f in key_fields)


def resume(path: str | os.PathLike, config: dict, seed: int | None, *, key_fields: Sequence[str],
           keyed: Iterable[str] = ()) -> set[tuple]:
    """Check that this run may write ``path`` and return the keys of its finished rows.

    Call it before loading models or starting work: it creates the parent directory,
    checks it is writable, and refuses a file of another run (:func:`check_binding`)."""
    path = Path(path)
    ensure_dir(path.parent)
    return {row_key(r, key_fields) for r in check_binding(path, config, seed, keyed)}


class JsonlWriter:
    """Append-only JSONL results file bound to ``(config, seed)``.

    A new file gets the meta row; an existing one must belong to the same run (see
    :func:`check_binding`, ``keyed`` names the config keys that may differ). Every row
    gets the run id; each is written with one ``write`` on an unbuffered file."""

    def __init__(self, path: str | os.PathLike, config: dict, seed: int | None, *, keyed: Iterable[str] = (), **meta_extra):
        self.path = Path(path)
        keyed = tuple(keyed)
        if self.path.is_dir():
            raise IsADirectoryError(21, "expected a results file, found a directory", str(self.path))
        ensure_dir(self.path.parent, "directory")
        self.rows = check_binding(self.path, config, seed, keyed)
        self.run_id = run_id(config, seed, keyed)
        try:
            if self.path.exists():
                _drop_torn_tail(self.path)
            new = not self.path.exists() or self.path.stat().st_size == 0
            self._f = open(self.path, "ab", buffering=0)
        except OSError as exc:
            raise io_error(exc, self.path, "open the results file for writing") from None
        if new:
            self._write(meta_row(config, seed, keyed=keyed, **meta_extra))

    def done(self, key_fields: Sequence[str]) -> set[tuple]:
        """Keys of the rows this run already wrote (read when the writer was opened, plus since)."""
        return {row_key(r, key_fields) for r in self.rows}

    def _write(self, obj: dict) -> None:
        data = (json.dumps(_clean(obj), sort_keys=False) + "\n").encode("utf-8")
        try:
            view = memoryview(data)
            while view:  # one write for a regular file; loop only on a short write
                n = self._f.write(view)
                view = view[n:]
        except OSError as exc:
            raise io_error(exc, self.path, "write results") from None

    def write(self, **row) -> None:
        full = {"type": "row", "run_id": self.run_id, **row, "code": code_version()}
        self._write(full)
        self.rows.append(full)

    def close(self) -> None:
        self._f.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def read_jsonl(path: str | os.PathLike, *, line_numbers: bool = False):
    """``(meta or None, rows)``, or ``(meta, rows, line numbers)`` with ``line_numbers=True``.

    A torn last line (interrupted write) is skipped. Any other unreadable line, a second
    meta row, or a row from another run (``run_id`` not the meta's, or missing where the
    meta has one) raises ``ValueError`` naming ``file:line``."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(2, "no results file", str(path))
    if not path.is_file():
        raise IsADirectoryError(21, "expected a results file, found a directory", str(path))
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise io_error(exc, path, "read the results file") from None
    lines = data.split(b"\n")
    torn = not data.endswith(b"\n")
    meta, rows, nums = None, [], []
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            if torn and i == len(lines):
                break  # torn final line from an interrupted run
            raise ValueError(f"{path}:{i}: not valid JSON (corrupt results file)") from None
        if not isinstance(obj, dict):
            raise ValueError(f"{path}:{i}: not a JSON object (corrupt results file)")
        if obj.get("type") == "meta":
            if meta is not None or rows:
                raise ValueError(f"{path}:{i}: a second meta row (rows of another run were appended); "
                                 "keep one run per file")
            meta = obj
            continue
        rid = meta.get("run_id") if meta else None
        if rid is not None and obj.get("run_id") != rid:
            got = obj.get("run_id")
            raise ValueError(f"{path}:{i}: row from another run (run id {got!r}, the file's meta says {rid!r})"
                             if got is not None else f"{path}:{i}: row without the run id {rid!r} of this file")
        rows.append(obj)
        nums.append(i)
    return (meta, rows, nums) if line_numbers else (meta, rows)


def done_keys(path: str | os.PathLike, key_fields: Iterable[str]) -> set[tuple]:
    """Keys of the rows already in a results file (checked by :func:`read_jsonl`). Prefer
    :func:`resume`, which also checks the file belongs to this run's config."""
    path = Path(path)
    if not path.exists():
        return set()
    fields = tuple(key_fields)
    _, rows = read_jsonl(path)
    return {row_key(r, fields) for r in rows}


def require_fields(path, rows: Sequence[dict], lines: Sequence[int], fields: Sequence[str], *,
                   numeric: Sequence[str] = (), when=None) -> None:
    """``ValueError('file:line: missing field X')`` for the first row lacking a field (only rows
    with ``when(row)`` true, if given); fields in ``numeric`` must be numbers (or null)."""
    for row, line in zip(rows, lines):
        if when is not None and not when(row):
            continue
        for f in fields:
            if f not in row:
                raise ValueError(f"{path}:{line}: missing field {f!r}")
            if f in numeric and row[f] is not None and (isinstance(row[f], bool) or not isinstance(row[f], (int, float))):
                raise ValueError(f"{path}:{line}: field {f!r} must be a number, got {_fmt(row[f])}")
