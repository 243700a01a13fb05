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
* **Compressed files.** :func:`read_jsonl` reads ``rows.jsonl.gz`` as it reads ``rows.jsonl``,
  and given ``rows.jsonl`` where only ``rows.jsonl.gz`` exists it reads the compressed file
  (:func:`results_path`); committed bulk rows are stored that way. A writer never appends to a
  compressed file: it refuses, asking for ``gunzip`` first.
* **Foreign rows.** :func:`read_jsonl` refuses a second meta row, a row whose ``run_id``
  is not the meta's, and (in a file whose meta has a run id) a row without one, naming
  ``file:line``; such rows are never counted as done.
* **Interrupts, full disks.** Each row is ONE ``write`` of a complete line on an unbuffered
  file; a write that fails or comes up short (disk full) is cut back and raises ``OSError``
  saying the row was not written, so the file keeps whole rows. A torn last line (a process
  killed mid-write) is skipped by readers, who name it (``torn``), and cut by a writer before
  appending (``_drop_torn_tail``). Whole files (reports, plots, Markdown) are written by
  :func:`write_file`: a temporary file, then ``os.replace``: all or nothing.
* **I/O errors** are ``OSError`` with ``filename`` set to the path (:func:`ensure_dir`,
  the writer), which ``multidraft.cli.main`` prints as one line.
* **Refusals in full.** A refused reopening names each differing config key (nested objects
  by dotted key, ``positions.sample_temperature 1.0 -> 0.7``) with both values in full.
* **One row schema.** :data:`SCHEMAS` says what a row of each kind is (the fields the runners
  write, their types and ranges, the key that identifies a row); every reader checks rows
  against it with :func:`valid_rows` (``report``, ``compare-runs``, the tree choice's study),
  which names ``file:line``, the field and what was expected for each row it leaves out, and
  leaves out a row that repeats an earlier row's key.
* **alpha* at full V.** An ``alpha*`` row is exact on the stored (lumped) support; at full V it
  is certified to ``[alpha_full_lower, alpha_full_upper]`` and ``alpha_exact`` says whether that
  interval is at most :data:`EXACT_TOL` wide. :func:`read_jsonl` derives the three fields for
  rows written before they existed (:func:`alpha_interval_fields`).
* **One process per run directory.** :func:`lock_run_dir` holds an exclusive ``flock`` on
  ``RUN_DIR/.multidraft.lock`` for a run; a second process is refused with one line naming
  the directory and the holder's pid (two concurrent resumes would write every row twice).
"""
from __future__ import annotations

import contextlib
import errno
import gzip
import hashlib
import json
import math
import os
import re
import sys
import time
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import _machine

__all__ = [
    "versions", "code_version", "meta_row", "run_id", "io_error", "write_file", "ensure_dir", "check_binding", "resume", "JsonlWriter",
    "read_jsonl", "results_path", "decode_row_spelling", "alpha_interval_fields", "EXACT_TOL", "finite_number", "target_alone_row", "done_keys", "row_key", "require_fields",
    "Field", "Schema", "SCHEMAS", "LAW_NAMES", "VERIFIER_NAMES", "TREE_RULE_NAMES", "IMPLIED_LAWS", "DECODE_ROW_KINDS", "read_decode_rows", "row_problem", "meta_problem", "valid_rows", "RunDirLocked", "lock_run_dir", "lock_results_file",
]


def versions() -> dict[str, str]:
    """Versions of the packages that shape a result (``_machine.versions``: python and the
    packages this run imported)."""
    return _machine.versions()


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
        **_machine.provenance(),  # versions, CPU model and flags, cores, threads, load average, platform
        "code": code_version(),
        "command": " ".join(sys.argv),
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        **extra,
    })


def io_error(exc: OSError, path: Path, what: str) -> OSError:
    """The same error, with the path and what we were doing in one line."""
    reason = exc.strerror or str(exc)
    return type(exc)(exc.errno, f"cannot {what} ({reason})", str(path)) if exc.errno else OSError(f"{path}: cannot {what} ({reason})")


def write_file(path: str | os.PathLike, data: str | bytes, what: str = "write the file") -> Path:
    """Write the whole of ``data`` to ``path``, or nothing: into a temporary file beside it
    (``.NAME.PID.tmp``), flushed to disk, then ``os.replace``d over ``path`` (atomic on POSIX), so
    that a full disk or an interrupt never leaves a half-written file; an earlier file at ``path``
    stays as it was. ``OSError`` (the path as ``filename``) saying what could not be done and that
    nothing was written; the temporary file is removed. ``str`` data is written as UTF-8."""
    path = Path(path)
    raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(raw)  # a buffered file writes all of it or raises
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        if not isinstance(exc, OSError):
            raise
        kept = "the earlier file is unchanged" if path.exists() else "no file was made"
        raise _not_written(exc, path, what, f"nothing was written, {kept}") from None
    return path


def _not_written(exc: OSError, path: Path, what: str, outcome: str) -> OSError:
    """:func:`io_error` with what became of the data: ``cannot write results (No space left on
    device): the row was not written``."""
    reason = exc.strerror or str(exc)
    code = exc.errno or errno.EIO
    return OSError(code, f"cannot {what} ({reason}): {outcome}", str(path))


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


def _fmt(v: Any, limit: int | None = 40) -> str:
    s = json.dumps(v, sort_keys=True)
    return s if limit is None or len(s) <= limit else s[: limit - 3] + "..."


def _config_diff(old: dict, new: dict, prefix: str = "") -> list[str]:
    """``key old -> new`` for every differing key, nested objects by dotted key, each value in
    full (two long values that share a prefix must never print as the same text)."""
    out = []
    for k in sorted(set(old) | set(new)):
        a, b = old.get(k), new.get(k)
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            out += _config_diff(a, b, f"{prefix}{k}.")
        else:
            out.append(f"{prefix}{k} {_fmt(a, None)} -> {_fmt(b, None)}")
    return out


def check_binding(path: str | os.PathLike, config: dict, seed: int | None, keyed: Iterable[str] = ()) -> list[dict]:
    """Rows of an existing results file that this run (config, seed) may extend.

    An absent or empty file gives ``[]``. Otherwise the file must have been written by the
    same run: ``ValueError`` naming the path and the differing config keys (or the foreign
    rows) if not."""
    path = Path(path)
    if not path.exists() and _gz_sibling(path).is_file():
        raise ValueError(f"{path} is stored compressed ({_gz_sibling(path).name}); gunzip it to extend the run, "
                         "or use a new file or run directory")
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
    if not isinstance(meta.get("config", {}), dict):
        raise ValueError(f"{path}: damaged meta row (field 'config' must be an object, got {_fmt(meta.get('config'))}); "
                         "use a new file or run directory")
    keyed = set(keyed)
    old = {k: v for k, v in _canon(meta.get("config") or {}).items() if k not in keyed}
    new = {k: v for k, v in _canon(config).items() if k not in keyed}
    diff = _config_diff(old, new)
    if meta.get("seed") != seed:
        diff.insert(0, f"seed {_fmt(meta.get('seed'), None)} -> {_fmt(seed, None)}")
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
        """One ``write`` of one whole line. A write that fails (``ENOSPC``: disk full) or writes
        only part of the line (a short write: the disk filled up) is cut back to the file's size
        before it, so the file keeps whole rows only, and raises ``OSError`` naming the file and
        saying the row was not written."""
        data = (json.dumps(_clean(obj), sort_keys=False) + "\n").encode("utf-8")
        try:
            start = os.stat(self.path).st_size
        except OSError as exc:
            raise _not_written(exc, self.path, "write results", "the row was not written") from None
        try:
            n = self._f.write(data)
            if n is not None and n != len(data):
                raise OSError(errno.ENOSPC, f"short write, {n} of {len(data)} bytes; disk full?")
        except OSError as exc:
            try:
                os.truncate(self.path, start)  # no torn line left behind
                outcome = "the row was not written"
            except OSError:
                outcome = "the row was not written; its torn line is cut before the next append"
            raise _not_written(exc, self.path, "write results", outcome) from None

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


def read_jsonl(path: str | os.PathLike, *, line_numbers: bool = False, torn: list | None = None):
    """``(meta or None, rows)``, or ``(meta, rows, line numbers)`` with ``line_numbers=True``.

    A torn last line (interrupted write) is skipped; with a list ``torn``, one ``file:line``
    line saying so is added to it (a reader that must not drop rows without a word). Any other unreadable line, a second
    meta row, or a row from another run (``run_id`` not the meta's, or missing where the
    meta has one) raises ``ValueError`` naming ``file:line``. A ``.gz`` file is decompressed;
    a missing ``rows.jsonl`` whose ``rows.jsonl.gz`` exists is read from that (:func:`results_path`)."""
    path = results_path(path)
    if not path.exists():
        raise FileNotFoundError(2, "no results file", str(path))
    if not path.is_file():
        raise IsADirectoryError(21, "expected a results file, found a directory", str(path))
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise io_error(exc, path, "read the results file") from None
    if path.name.endswith(".gz"):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error):
            raise ValueError(f"{path}: not a complete gzip file (corrupt results file)") from None
    lines = data.split(b"\n")
    cut = not data.endswith(b"\n")
    meta, rows, nums = None, [], []
    for i, raw in enumerate(lines, 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw.decode("utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError):
            if cut and i == len(lines):  # torn final line from an interrupted run
                if torn is not None:
                    torn.append(f"{path}:{i}: a torn last line ({len(raw)} bytes, no newline: an interrupted or "
                                "failed write), not read")
                break
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
        rows.append(alpha_interval_fields(decode_row_spelling(obj, meta)))
        nums.append(i)
    return (meta, rows, nums) if line_numbers else (meta, rows)


def _gz_sibling(path: Path) -> Path:
    return path.with_name(path.name + ".gz")


def results_path(path: str | os.PathLike) -> Path:
    """``path``, or its compressed sibling ``path.gz`` when only that exists (committed bulk rows
    are stored as ``.jsonl.gz``). Use it wherever a results file is looked up by name."""
    path = Path(path)
    if not path.exists() and not path.name.endswith(".gz") and _gz_sibling(path).is_file():
        return _gz_sibling(path)
    return path


_TARGET_ALONE_SPELLINGS = ("autoregressive", "none", "-")  # a decode row's verifier before Settings.describe


def target_alone_row(row: dict) -> bool:
    """Whether a decode row (as :func:`read_jsonl` gives it) is a run of the target alone: no rule,
    no verifier, and not a peer's run."""
    return row.get("method_kind", "target") == "target" and row.get("rule") is None and row.get("verifier") is None


def decode_row_spelling(row: dict, meta: dict | None = None) -> dict:
    """A decode row (one with ``block_efficiency``) in the one spelling of ``Settings.describe``:
    rows written before it carry ``K`` for ``k``, ``verifier`` 'autoregressive' (the target alone)
    or '-' (a sequence-level rule) for None, ``law`` '-' for None, ``draft_calls`` -1 (not counted,
    a peer's) for None, and an automatically chosen tree's facts in ``tree`` (now ``auto``, with
    ``tree`` its paths). Rows written before the one
    description have no ``verifier``, ``rule``, ``law``, ``k``, ``depth`` or ``temperature`` at
    all: what their method label, ``method_kind`` and the file's ``meta`` config determine is
    filled in (:func:`_legacy_decode_fields`), nothing present is changed, and what cannot be
    derived stays missing (the schema then refuses the row). Other rows pass unchanged."""
    if "block_efficiency" not in row:
        return row
    if "K" in row and "k" not in row:
        row["k"] = row.pop("K")
    if row.get("verifier") in _TARGET_ALONE_SPELLINGS:
        row["verifier"] = None
    if row.get("law") == "-":
        row["law"] = None
    if row.get("draft_calls") == -1:  # a peer that does not count them (llama-speculative), before None
        row["draft_calls"] = None
    if isinstance(row.get("tree"), dict) and "auto" not in row:
        row["auto"] = row["tree"]
        row["tree"] = row["auto"].get("paths")
    if "method" in row and not {"verifier", "rule", "law", "k", "depth", "temperature"} <= set(row):
        for f, v in _legacy_decode_fields(row, meta).items():
            row.setdefault(f, v)
    return row


# A verifier's law when none is named (``Verifier.implied_law``), spelled here so that reading rows
# needs no torch; every other verifier's is 'iid' (a test keeps this equal to the verifiers').
IMPLIED_LAWS = {"rrs_wor": "wor", "greedy_optimal": "greedy", "spechub": "greedy"}
_PEER_KINDS = ("hf", "llama-target", "llama-spec")  # benchmarks/decode_speed.py's peers (no verifier, no law)
_TREE_LABELS = (  # the labels of decode_runs.parse_method, as rows before Settings.describe carry them
    (re.compile(r"SD depth (?P<depth>\d+)"), {"name": "naive", "k": 1}),
    (re.compile(r"(?P<name>\w+) (?P<seq>seq )?K=(?P<k>\d+) depth (?P<depth>\d+)"), {}),
    (re.compile(r"(?P<name>\w+) dynamic K<=(?P<k>\d+) (?P<max_nodes>\d+) nodes depth<=(?P<depth>\d+)"
                r"(?: gain>=(?P<min_gain>[0-9.]+))?"), {"tree": "dynamic"}),
    (re.compile(r"(?P<name>\w+) auto K<=(?P<k>\d+)"), {}),
)


def _tree_size(paths) -> tuple[int, int] | None:
    """``(k, depth)`` of an explicit tree given by its root-to-node ``paths``: the most children of
    one node and the longest path (``Settings.describe`` of the chosen tree); None if not paths."""
    if not isinstance(paths, list) or not paths or not all(isinstance(p, list) and p for p in paths):
        return None
    children: dict[tuple, int] = {}
    for p in paths:
        children[tuple(p[:-1])] = children.get(tuple(p[:-1]), 0) + 1
    return max(children.values()), max(len(p) for p in paths)


def _legacy_decode_fields(row: dict, meta: dict | None) -> dict:
    """What a decode row written before ``Settings.describe`` implies of its description:
    ``temperature`` from the file's meta config; for the target alone and the peers of
    ``benchmarks/decode_speed.py`` no verifier, rule or law and their own ``k``, ``depth``
    (``llama-speculative D=d [NP=n]``: k = n, depth = d); for a tree method the verifier (the
    walk ``token_walk``), ``k`` and ``depth`` of its label (an automatically chosen tree's from
    its paths) and the verifier's implied law (:data:`IMPLIED_LAWS`). A label of no known form
    gives only the temperature."""
    out: dict = {}
    cfg = (meta or {}).get("config")
    t = cfg.get("temperature") if isinstance(cfg, dict) else None
    if isinstance(t, (int, float)) and not isinstance(t, bool):
        out["temperature"] = t
    kind, label = row.get("method_kind"), row.get("method")
    if not isinstance(label, str):
        return out
    if kind == "target" or kind in _PEER_KINDS:
        out.update(rule=None, verifier=None, law=None, k=0, depth=0)
        m = re.fullmatch(r"llama-speculative D=(\d+)(?: NP=(\d+))?", label) if kind == "llama-spec" else None
        if kind == "llama-spec" and m is None:
            return {"temperature": out["temperature"]} if "temperature" in out else {}
        if m is not None:
            out.update(k=int(m.group(2) or 1), depth=int(m.group(1)))
        return out
    if kind not in ("tree", "auto"):
        return out
    for pattern, fixed in _TREE_LABELS:
        m = pattern.fullmatch(label)
        if m is None:
            continue
        got = {**{f: v for f, v in m.groupdict().items() if v is not None}, **fixed}
        name = got.pop("name")
        if name not in VERIFIER_NAMES:  # labels before the one description name verifiers only
            return out
        fields = {"rule": "token_walk", "verifier": name, "law": IMPLIED_LAWS.get(name, "iid"), "k": int(got["k"])}
        if "depth" in got:
            fields["depth"] = int(got["depth"])
        if got.pop("seq", None):
            fields["tree"] = "sequences"
        if "max_nodes" in got:
            fields.update(tree=got["tree"], max_nodes=int(got["max_nodes"]), min_gain=float(got.get("min_gain", 0.0)))
        if kind == "auto":
            size = _tree_size(row.get("tree"))
            if size is None:
                return out  # the chosen tree is not in the row: its k and depth are unknown
            fields["k"], fields["depth"] = size
        return {**out, **fields}
    return out


EXACT_TOL = 1e-3  # an alpha* row is "exact at full V" when its certified interval is at most this wide


def finite_number(x) -> bool:
    """Whether a row's value ``x`` is a finite number (int or float, not a bool, not NaN or inf)."""
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def alpha_interval_fields(row: dict) -> dict:
    """An ``alpha*`` row of ``experiment acceptance|temperature`` with its full-vocabulary
    interval: rows written before the fields existed get ``alpha_full_lower``,
    ``alpha_full_upper`` and ``alpha_exact`` from the fields they carry. Other rows, rows that
    already have them, and rows without the numbers (no ``lump_bound_mean``: older runs, or a
    damaged row the schema check names) pass unchanged.

    With ``a`` the row's mean alpha* on the stored support, ``b`` its ``lump_bound_mean`` (the
    mean over positions of the proved per-position bound, :func:`.store.alpha_bounds`) and
    ``l`` its ``alpha_lower`` (the independent law's certified lower end; ``a`` elsewhere), the
    mean over the same positions of alpha* at full V lies in

    * ``[l - b, a]`` for iid, greedy and independent drafts and every law at K = 1 (Lemma 1:
      ``0 <= alpha*_stored - alpha*_full <= p(T)`` per position),
    * ``[a - b, a + b]`` for drafts without replacement at K >= 2
      (``|alpha*_stored - alpha*_full| <= p(T) + TV`` per position),

    cut to ``[0, 1]`` (the study's README, "What is stored, and the truncation bound"). A row
    is exact when ``alpha_full_upper - alpha_full_lower <= EXACT_TOL``. The runner writes the
    same fields from the per-position bounds (:func:`.acceptance.evaluate`), which can only be
    narrower (each position cut to ``[0, 1]`` on its own)."""
    if row.get("verifier") != "alpha*" or "alpha_exact" in row:
        return row
    a, b, law, k = row.get("acceptance"), row.get("lump_bound_mean"), row.get("law"), row.get("K")
    low = row.get("alpha_lower", a)
    if not (finite_number(a) and finite_number(b) and finite_number(low) and 0.0 <= low <= a + 1e-9 and a <= 1.0 and b >= 0.0
            and law in LAW_NAMES and isinstance(k, int) and not isinstance(k, bool) and k >= 1):
        return row
    lo, hi = (a - b, a + b) if law == "wor" and k >= 2 else (min(low, a) - b, a)
    lo, hi = max(0.0, lo), min(1.0, hi)
    row["alpha_full_lower"], row["alpha_full_upper"] = lo, hi
    row["alpha_exact"] = hi - lo <= EXACT_TOL
    return row


def done_keys(path: str | os.PathLike, key_fields: Iterable[str]) -> set[tuple]:
    """Keys of the rows already in a results file (checked by :func:`read_jsonl`). Prefer
    :func:`resume`, which also checks the file belongs to this run's config."""
    path = results_path(path)
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


# --- the row schema: what the runners write, checked by every reader ---------------------------
@dataclass(frozen=True)
class Field:
    """One field of a row: ``kind`` is ``text``, ``number``, ``integer``, ``numbers`` (a list of
    numbers), ``integers``, ``object``, ``list`` or ``bool``; numbers lie in ``[lo, hi]`` (either
    end None: open) up to ``tol``; ``null`` allows JSON null; ``required`` fields must be present
    (in rows where ``when(row)`` holds, if given); ``choices``: the only values a text may take."""

    name: str
    kind: str = "number"
    lo: float | None = None
    hi: float | None = None
    required: bool = False
    null: bool = False
    tol: float = 0.0
    when: Callable[[dict], bool] | None = None
    choices: tuple | None = None

    def expected(self) -> str:
        what = {"text": "a string", "number": "a number", "integer": "an integer", "numbers": "a list of numbers",
                "integers": "a list of integers", "object": "an object", "list": "a list", "bool": "true or false"}[self.kind]
        if self.choices:
            what = "one of " + ", ".join(map(repr, self.choices))
        if self.lo is not None and self.hi is not None:
            what += f" in [{self.lo:g}, {self.hi:g}]"
        elif self.lo is not None:
            what += f" >= {self.lo:g}"
        elif self.hi is not None:
            what += f" <= {self.hi:g}"
        return what + (" or null" if self.null else "")

    def _num_ok(self, x, integer: bool) -> bool:
        if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
            return False
        if integer and not isinstance(x, int):
            return False
        return (self.lo is None or x >= self.lo - self.tol) and (self.hi is None or x <= self.hi + self.tol)

    def problem(self, row: dict, needed: Iterable[str] | None = None) -> str | None:
        """None when ``row`` satisfies this field, else ``field 'x' must be ..., got ...``.
        ``needed``: if given, only these of the required fields are required (a reader that
        uses fewer); every field present is still checked."""
        if self.name not in row:
            if self.required and (needed is None or self.name in needed) and (self.when is None or self.when(row)):
                return f"missing field {self.name!r} ({self.expected()})"
            return None
        v = row[self.name]
        if v is None:
            return None if self.null else f"field {self.name!r} must be {self.expected()}, got null"
        k = self.kind
        ok = (k == "text" and isinstance(v, str)) or (k == "object" and isinstance(v, dict)) \
            or (k == "list" and isinstance(v, list)) or (k == "bool" and isinstance(v, bool)) \
            or (k in ("number", "integer") and self._num_ok(v, k == "integer")) \
            or (k in ("numbers", "integers") and isinstance(v, list) and all(self._num_ok(x, k == "integers") for x in v))
        if ok and self.choices is not None and v not in self.choices:
            ok = False
        if ok:
            return None
        if k in ("numbers", "integers") and isinstance(v, list):
            i, x = next((i, x) for i, x in enumerate(v) if not self._num_ok(x, k == "integers"))
            return f"field {self.name!r} must be {self.expected()}, entry {i} is {_fmt(x)}"
        return f"field {self.name!r} must be {self.expected()}, got {_fmt(v)}"


@dataclass(frozen=True)
class Schema:
    """The fields of one kind of row and ``key``, the fields that identify a row (two rows with
    the same key are duplicates)."""

    fields: tuple
    key: tuple = ()


LAW_NAMES = ("iid", "wor", "greedy", "independent")  # drafts.LAW_KINDS, spelled here so reading rows needs no torch (a test keeps them equal)
# verifiers.names() and decoding.settings.decoder_rules(), spelled here for the same reason (a test keeps them equal)
VERIFIER_NAMES = ("naive", "nss", "specinfer", "rrs_wor", "spectr", "greedy_optimal", "spechub", "khisti_is",
                  "lp_optimal", "optimal")
TREE_RULE_NAMES = ("token_walk", "block", "traversal", "gbv", "spectr_gbv", "univer")


def _verifier_row(row: dict) -> bool:
    return row.get("verifier") != "alpha*"


def _cell_fields() -> tuple:
    """Rows of ``experiment acceptance`` / ``temperature`` (:func:`.acceptance.evaluate`)."""
    req = dict(required=True)
    return (
        Field("dataset", "text", **req), Field("t_target", lo=0, **req), Field("t_draft", lo=0, **req),
        Field("law", "text", choices=LAW_NAMES, **req), Field("K", "integer", lo=1, **req), Field("verifier", "text", **req),
        Field("acceptance", lo=0, hi=1, tol=1e-9, **req), Field("se", lo=0, **req),
        Field("alpha_star", lo=0, hi=1, tol=1e-9, required=True, when=_verifier_row),
        Field("gap_pct", required=True, when=_verifier_row),
        Field("top_k", "integer", lo=1, null=True), Field("top_p", lo=0, hi=1, null=True),
        Field("values", "numbers", lo=0, hi=1, tol=1e-6),  # rounded to 1e-6: 1.0000005 is a 1
        Field("se_mc", lo=0, null=True), Field("sd_positions", lo=0, null=True),
        Field("gap", required=True, when=lambda r: r.get("gap_se") is not None),
        Field("gap_se", lo=0, null=True), Field("gap_pct_se", lo=0, null=True),
        Field("n_positions", "integer", lo=0), Field("n_excluded", "integer", lo=0), Field("draws", "integer", lo=1),
        Field("above_alpha_positions", "integer", lo=0), Field("estimator", "text"),
        Field("lump_bound_mean", lo=0, null=True), Field("lump_bound_max", lo=0, null=True),
        Field("p_tail_max", lo=0, hi=1, tol=1e-9, null=True), Field("q_tail_max", lo=0, hi=1, tol=1e-9, null=True),
        Field("eval_support", "integer", lo=2, null=True), Field("eval_support_warning", "text"),
        Field("seconds", lo=0, null=True), Field("independent_temperatures", "numbers", lo=0),
        Field("alpha_lower", lo=0, hi=1, tol=1e-9, null=True), Field("bound_width_max", lo=0, null=True),
        Field("alpha_full_lower", lo=0, hi=1, tol=1e-9, null=True), Field("alpha_full_upper", lo=0, hi=1, tol=1e-9, null=True),
        Field("alpha_exact", "bool"),
    )


_CELL = _cell_fields()

# ONE place that says what a results row is: the runners write these fields, the readers
# (``multidraft report``, ``compare-runs``) check every row against them (:func:`valid_rows`)
SCHEMAS: dict[str, Schema] = {
    "acceptance": Schema(_CELL, ("dataset", "t_target", "t_draft", "top_k", "top_p", "law", "K", "verifier")),
    "temperature": Schema(_CELL, ("dataset", "t_target", "t_draft", "top_k", "top_p", "law", "K", "verifier")),
    # decode runs (:func:`.decode_runs.run_row`); the blocks table reads the required ones
    "blocks": Schema((
        Field("verifier", "text", null=True, required=True, choices=VERIFIER_NAMES),
        Field("law", "text", null=True, required=True, choices=LAW_NAMES), Field("k", "integer", lo=0, required=True), Field("depth", "integer", lo=0, required=True),
        Field("temperature", lo=0, required=True), Field("prompt", "text", required=True),
        Field("block_efficiency", lo=0, required=True), Field("tokens_per_s", lo=0, null=True, required=True),
        Field("acceptance_rate", lo=0, hi=1, tol=1e-9, null=True), Field("draft_temperature", lo=0, null=True),
        Field("top_k", "integer", lo=1, null=True), Field("top_p", lo=0, hi=1, null=True),
        Field("new_tokens", "integer", lo=0), Field("target_calls", "integer", lo=0),
        Field("draft_calls", "integer", lo=0, null=True), Field("tree_tokens", "integer", lo=0, null=True),
        Field("prompt_tokens", "integer", lo=0), Field("round", "integer", lo=0), Field("seed", "integer"),
        Field("seconds", lo=0, null=True), Field("prefill_seconds", lo=0, null=True),
        Field("tokens", "integers", lo=0, null=True), Field("method", "text"), Field("rule", "text", null=True, choices=TREE_RULE_NAMES),
    ), ("verifier", "rule", "law", "k", "depth", "temperature", "prompt", "round", "method", "tree", "draft_temperature",
        "top_k", "top_p")),
    # ``experiment paper``'s stage timings (stages.jsonl)
    "stages": Schema((
        Field("stage", "text", required=True), Field("seconds", lo=0, null=True), Field("complete", "bool"),
        Field("rows_written", "integer", lo=0, null=True), Field("load_average", "numbers", lo=0),
        Field("config", "object", null=True),
    )),
    "meta": Schema((
        Field("run_id", "text", null=True), Field("seed", "integer", null=True), Field("config", "object"),
        Field("keyed", "list"), Field("versions", "object"), Field("command", "text"), Field("started", "text"),
    )),
}
_META_CONFIG = (Field("models", "object", null=True), Field("eps", lo=0, hi=1, null=True))


def row_problem(row: dict, kind: str, needed: Iterable[str] | None = None) -> str | None:
    """The first way ``row`` breaks the schema of ``kind`` (``SCHEMAS``), or None; ``needed``
    narrows the required fields to those a reader uses (:meth:`Field.problem`)."""
    if kind not in SCHEMAS:
        raise ValueError(f"kind must be one of {', '.join(SCHEMAS)}, got {kind!r}")
    needed = None if needed is None else set(needed)
    for f in SCHEMAS[kind].fields:
        msg = f.problem(row, needed)
        if msg:
            return msg
    return None


def meta_problem(meta: dict) -> str | None:
    """The first way a meta row breaks its schema (its config's ``models`` and ``eps`` included), or None."""
    msg = row_problem(meta, "meta")
    if msg is None and isinstance(meta.get("config"), dict):
        for f in _META_CONFIG:
            msg = f.problem(meta["config"])
            if msg:
                return "config: " + msg
    return msg


def valid_rows(path, rows: Sequence[dict], lines: Sequence[int], kind: str,
               needed: Iterable[str] | None = None) -> tuple[list[dict], list[str]]:
    """``(good rows, messages)``: the rows of ``path`` that satisfy the schema of ``kind``, the
    first of each key among them, and one ``file:line: what; row skipped`` message per row left
    out (the field and what was expected, or the line it duplicates). ``needed``: the required
    fields this reader uses (default: all the schema requires)."""
    key = SCHEMAS[kind].key
    needed = None if needed is None else tuple(needed)
    good, skipped, seen = [], [], {}
    for row, line in zip(rows, lines):
        msg = row_problem(row, kind, needed)
        if msg is None and key:
            k = row_key(row, key)
            if k in seen:
                msg = f"duplicate of line {seen[k]} (same {', '.join(f for f in key if f in row)})"
            else:
                seen[k] = line
        if msg is None:
            good.append(row)
        else:
            skipped.append(f"{path}:{line}: {msg}; row skipped")
    return good, skipped


DECODE_ROW_KINDS = ("run", "summary", "end")  # the rows of decode_runs' files (demo, decode_speed, blocks)


def read_decode_rows(path: str | os.PathLike) -> tuple[dict | None, list[dict], list[int]]:
    """``(meta, run rows, their line numbers)`` of a decode runner's results file (``multidraft demo``,
    ``benchmarks/decode_speed.py``): every row read in the one spelling (:func:`decode_row_spelling`,
    legacy rows completed from their label and the meta config) and every run row checked against
    ``SCHEMAS["blocks"]``. ``ValueError`` naming ``file:line`` for the first row of another kind than
    :data:`DECODE_ROW_KINDS`, the first run row that breaks the schema or repeats an earlier run, and
    for a file without run rows."""
    meta, rows, lines = read_jsonl(path, line_numbers=True)
    path = results_path(path)
    runs, run_lines = [], []
    for row, line in zip(rows, lines):
        kind = row.get("kind", "run" if "block_efficiency" in row else None)
        if kind not in DECODE_ROW_KINDS:
            what = f"a row of kind {_fmt(kind)}" if "kind" in row else "a row without a kind or block_efficiency"
            raise ValueError(f"{path}:{line}: {what}, not a decode row ({', '.join(DECODE_ROW_KINDS)}): "
                             "not a demo or decode-speed results file")
        if kind == "run":
            runs.append(row)
            run_lines.append(line)
    _, bad = valid_rows(path, runs, run_lines, "blocks")
    if bad:
        raise ValueError(bad[0].removesuffix("; row skipped") + (f" (and {len(bad) - 1} more rows)" if len(bad) > 1 else ""))
    if not runs:
        raise ValueError(f"{path}: no run rows (kind 'run'): nothing to summarize")
    return meta, runs, run_lines


# --- one process per run directory ---------------------------------------------------------
LOCK_NAME = ".multidraft.lock"
_HELD: dict[str, list] = {}  # resolved run directory -> [open lock file, depth]: re-entrant in one process


class RunDirLocked(OSError):
    """Another process holds the run directory's lock (its pid in the message)."""


@contextlib.contextmanager
def lock_run_dir(run_dir: str | os.PathLike):
    """Hold the exclusive lock of a run directory (``fcntl.flock`` on ``RUN_DIR/.multidraft.lock``,
    which records the holder's pid) for the ``with`` block; released on exit, and by the system
    if the process dies. Re-entrant within one process. A second process gets
    :class:`RunDirLocked` (an ``OSError`` whose ``filename`` is the directory), one line naming
    the holder's pid; creates the directory first (:func:`ensure_dir`)."""
    run_dir = ensure_dir(run_dir)
    with _held(run_dir, run_dir / LOCK_NAME, "run directory", "use another run directory"):
        yield run_dir


@contextlib.contextmanager
def lock_results_file(path: str | os.PathLike):
    """:func:`lock_run_dir` for one results file written outside a run directory (``compare
    --out``): the lock is ``.NAME.multidraft.lock`` beside it; a second process writing the same
    file gets :class:`RunDirLocked` naming the file and the holder's pid."""
    path = Path(path)
    ensure_dir(path.parent, "directory")
    with _held(path, path.parent / f".{path.name}{LOCK_NAME}", "results file", "use another --out file"):
        yield path


@contextlib.contextmanager
def _held(target: Path, path: Path, what: str, instead: str):
    """The flock of ``path`` (the lock file of ``target``, a run directory or a results file)."""
    name = str(target.resolve())
    if name in _HELD:
        _HELD[name][1] += 1
        try:
            yield
        finally:
            _HELD[name][1] -= 1
        return
    try:
        import fcntl
    except ImportError:  # pragma: no cover (not a POSIX system: no lock)
        yield
        return
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as exc:
        raise io_error(exc, path, f"open the {what}'s lock file") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as exc:
        try:
            holder = os.pread(fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
        except OSError:
            holder = "unknown"
        os.close(fd)
        if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            raise RunDirLocked(errno.EBUSY, f"{what} is in use by another multidraft process (pid {holder}); "
                                            f"wait for it to finish or {instead}", str(target)) from None
        raise io_error(exc, path, f"lock the {what}") from None
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
    except OSError:
        pass  # the lock holds without the pid
    _HELD[name] = [fd, 1]
    try:
        yield
    finally:
        del _HELD[name]
        os.close(fd)  # releases the flock
