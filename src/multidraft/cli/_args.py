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

import os
import sys
import tempfile
from pathlib import Path

from .._errors import ArgumentError

__all__ = ["k_list", "int_list", "float_list", "name_list", "draft_ftype", "check_out_file", "check_out_dir", "check_common", "quiet_loading",
           "eprint", "warn", "SHOWN", "print_skipped", "model_loader", "model_names", "progress_bar", "mapper_kw", "close_mapper",
           "load_models", "out_of_memory"]


def name_list(text, arg: str) -> list[str]:
    """Comma-separated names, stripped, empty items dropped; at least one."""
    out = [x.strip() for x in str(text).split(",") if x.strip()]
    if not out:
        raise ArgumentError(arg, "is empty")
    return out


# The most values a list flag may expand to (``--k 1-1000000000`` is refused before anything is
# built: a range is checked by its endpoints, never expanded first).
MAX_LIST_VALUES = 4096


def int_list(text, arg: str, *, lo: int | None = None, hi: int | None = None,
             max_values: int = MAX_LIST_VALUES) -> list[int]:
    """Comma-separated integers and ranges ``a-b`` (inclusive), sorted, no duplicates; each >= ``lo``
    and <= ``hi`` when given, and at most ``max_values`` values in all.

    Lazy and bounded: every part is parsed and checked by its endpoints first (a range's size
    is ``b - a + 1``, computed, not expanded), so a huge range costs nothing before it is
    refused."""
    parts = []
    for part in name_list(text, arg):
        a, sep, b = part.partition("-")
        try:
            lo_v, hi_v = (int(a), int(b)) if sep and a else (int(part), int(part))
        except ValueError:
            raise ArgumentError(arg, f": expected comma-separated integers or ranges like 1-8, got {part!r}") from None
        if hi_v < lo_v:
            raise ArgumentError(arg, f": empty range {part!r}")
        if lo is not None and lo_v < lo:
            raise ArgumentError(arg, f": every value must be >= {lo}, got {text!r}")
        if hi is not None and hi_v > hi:
            raise ArgumentError(arg, f": every value must be <= {hi:,}, got {part!r}")
        parts.append((lo_v, hi_v, part))
    if sum(h - l + 1 for l, h, _ in parts) > max_values:
        big = max(parts, key=lambda t: t[1] - t[0])
        raise ArgumentError(arg, f": at most {max_values:,} values, got {sum(h - l + 1 for l, h, _ in parts):,} "
                                 f"(the range {big[2]!r} alone has {big[1] - big[0] + 1:,})")
    out: set[int] = set()
    for l, h, _ in parts:
        out.update(range(l, h + 1))
    return sorted(out)


def k_list(text, arg: str = "k", *, hi: int | None = None) -> list[int]:
    """Numbers of drafts K (``--k 2,4`` or ``--k 1-8``), parsed lazily and bounded (:func:`int_list`;
    ``hi`` the command's largest K); ``>= 1`` is checked where they go."""
    return int_list(text, arg, hi=hi)


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
# output paths, checked before any work (the ONE check for every --out and run directory)
# ---------------------------------------------------------------------------------------
def _probe_writable(directory: Path, flag: str) -> None:
    """ValueError naming ``flag`` unless a file can be created in ``directory`` (tried, not
    guessed from permission bits: a read-only file system, or root's rights, decide it)."""
    try:
        with tempfile.NamedTemporaryFile(dir=directory, prefix=".multidraft-probe-"):
            pass
    except OSError as exc:
        raise ValueError(f"{flag}: cannot write in {directory}: {exc.strerror or exc}") from None


def check_out_file(raw, flag: str = "--out") -> Path | None:
    """The output file of ``flag`` (None when not given): not a directory, in an existing
    directory where a file can be written, itself writable if it exists. Call it before any
    model loads or work starts, so a bad path costs nothing."""
    if raw is None:
        return None
    path = Path(raw).expanduser()
    if path.is_dir():
        raise ValueError(f"{flag}: {path} is a directory; give a file name")
    parent = path.parent if str(path.parent) else Path(".")
    if not parent.is_dir():
        raise ValueError(f"{flag}: directory {parent} does not exist")
    _probe_writable(parent, flag)
    if path.exists() and not os.access(path, os.W_OK):
        raise ValueError(f"{flag}: {path} is not writable")
    return path


def check_out_dir(raw, flag: str = "--out") -> Path:
    """The output directory of ``flag``: an existing writable directory, or one that can be
    created (its nearest existing ancestor is a writable directory); never a file."""
    path = Path(raw).expanduser()
    if path.exists() and not path.is_dir():
        raise ValueError(f"{flag}: {path} is a file, not a directory")
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if not probe.is_dir():
        raise ValueError(f"{flag}: cannot create {path}: {probe} is not a directory")
    _probe_writable(probe, flag)
    return path


# ---------------------------------------------------------------------------------------
# checks every command shares, run by ``cli.main`` right after parsing (before any work)
# ---------------------------------------------------------------------------------------
SEED_LIMIT = 2**64  # torch.Generator.manual_seed takes [0, 2^64)


def check_common(args) -> None:
    """The flags several commands share, checked the same way everywhere: each command calls it
    after its own checks, before any model loads or work starts:
    ``--seed`` within 64 bits, ``--target`` / ``--draft`` paths that exist and suit ``--engine``
    (transformers: a model directory with its config.json, or a .gguf file; llama.cpp: a .gguf
    file), ``file:PATH`` data sets that exist. ValueError naming the flag."""
    seed = getattr(args, "seed", None)
    if isinstance(seed, int) and not 0 <= seed < SEED_LIMIT:
        raise ValueError(f"--seed must be an integer in [0, 2^64 - 1], got {seed}")
    engine = getattr(args, "engine", "transformers")
    for name in ("target", "draft"):
        raw = getattr(args, name, None)
        if raw is None or raw is False:
            continue
        path = Path(str(raw)).expanduser()
        if not path.exists():
            raise ValueError(f"--{name}: {path} does not exist (a local model directory or .gguf file)")
        if engine == "llama.cpp" and not path.is_file():
            raise ValueError(f"--{name}: {path} is not a file (--engine llama.cpp reads .gguf files)")
        if engine != "llama.cpp":
            if path.is_file() and path.suffix.lower() != ".gguf":
                raise ValueError(f"--{name}: {path} is a file, not a model directory (or a .gguf file)")
            if path.is_dir() and not (path / "config.json").is_file():
                raise ValueError(f"--{name}: {path} is not a model directory (no config.json)")
    if getattr(args, "command", None) == "experiment" and getattr(args, "run_dir", None):
        check_out_dir(args.run_dir, "RUN_DIR")  # a directory this run can write in, before the work
    datasets = getattr(args, "datasets", None)
    if isinstance(datasets, str):
        for d in (x.strip() for x in datasets.split(",")):
            if d.startswith("file:") and len(d) > 5 and not Path(d[5:]).expanduser().is_file():
                raise ValueError(f"--datasets: {d}: no such file")


def quiet_loading() -> None:
    """``--quiet``: no progress bars while models load either (transformers' "Loading checkpoint
    shards", the hub's downloads): the environment variables they read when imported, and their
    switches when they already are."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # the hub's bars, and transformers' (it asks the hub)
    os.environ["TQDM_DISABLE"] = "1"  # tqdm reads it when imported
    hub = sys.modules.get("huggingface_hub")
    if hub is not None:
        hub.utils.disable_progress_bars()
    if "transformers" in sys.modules:
        import transformers.utils.logging as tf_logging

        tf_logging.disable_progress_bar()


# ---------------------------------------------------------------------------------------
# run inputs from parsed arguments (``experiment`` and ``experiment paper``)
# ---------------------------------------------------------------------------------------
def eprint(msg: str) -> None:
    """A progress line on stderr (the ``log`` of every long step)."""
    print(msg, file=sys.stderr, flush=True)


def warn(args, msg: str) -> None:
    """``multidraft COMMAND: warning: msg`` on stderr: an option given where the chosen mode
    ignores part of what it asks (one line; the command carries on)."""
    cmd = " ".join(x for x in (getattr(args, "command", None), getattr(args, "experiment", None)) if x)
    print(f"multidraft{' ' + cmd if cmd else ''}: warning: {msg}", file=sys.stderr, flush=True)


SHOWN = 20  # damaged rows named one per line on stderr; the rest are counted


def print_skipped(command: str, skipped: list[str], more: str = "") -> None:
    """The rows a command left out (damaged or duplicated), on stderr as ``multidraft COMMAND: ...``:
    the first :data:`SHOWN` one line each, then how many more (``more`` ends that line)."""
    for line in skipped[:SHOWN]:
        print(f"multidraft {command}: {line}", file=sys.stderr)
    if len(skipped) > SHOWN:
        print(f"multidraft {command}: ... and {len(skipped) - SHOWN} more damaged rows{more}", file=sys.stderr)


def out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` is an allocation failure: ``MemoryError``, torch's ``OutOfMemoryError``
    (CUDA), or the RuntimeError of torch's CPU allocator."""
    if isinstance(exc, MemoryError) or "OutOfMemory" in type(exc).__name__:
        return True
    text = str(exc).lower()
    return isinstance(exc, RuntimeError) and any(
        w in text for w in ("out of memory", "can't allocate memory", "not enough memory", "cannot allocate memory"))


def load_models(*args, **kw):
    """``decoding.pair.load_pair(*args, **kw)``, the one load boundary of the command line: running
    out of memory there is a ``MemoryError`` whose text says so in one line (``cli.main`` prints
    it and exits 1), not a traceback."""
    from ..decoding.pair import load_pair

    try:
        return load_pair(*args, **kw)
    except (MemoryError, RuntimeError) as exc:
        if not out_of_memory(exc):
            raise
        detail = " ".join(str(exc).split())[:300]
        raise MemoryError(f"out of memory while loading the models ({args[0] if args else kw.get('engine', '')}): "
                          f"{detail or type(exc).__name__}; try a smaller --dtype, a smaller model, or free memory") from None


def model_loader(args):
    """A callable loading ``(target, draft, tokenizer)`` of ``--engine`` (default transformers)
    from ``--target`` / ``--draft`` (the default pair where absent; on llama.cpp the GGUF target
    is its own tokenizer), called only when a stage needs models."""
    engine = getattr(args, "engine", "transformers")

    def load():
        eprint(f"loading models ({engine}) ...")
        return load_models(engine, target=args.target, draft=args.draft, log=eprint)

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


RAY_CONNECT_TIMEOUT_S = 5.0  # how long --ray HOST:PORT may take to accept a connection before it is refused


def check_ray_address(raw, flag: str = "--ray") -> None:
    """``--ray``: ``auto``, ``local``, or ``HOST:PORT`` / ``ray://HOST:PORT`` that accepts a TCP
    connection now (tried, within :data:`RAY_CONNECT_TIMEOUT_S`), so an unreachable cluster is
    refused before any model loads or position is collected, not after. ValueError naming ``flag``."""
    import socket

    text = str(raw).strip()
    if text in ("auto", "local"):
        return
    rest = text.removeprefix("ray://")
    host, sep, port_text = rest.rpartition(":")
    host = host.strip("[]")  # [::1]:6379
    if not sep or not host or not port_text.isdigit() or not 0 < int(port_text) < 65536:
        raise ValueError(f"{flag}: expected auto, HOST:PORT or ray://HOST:PORT, got {text!r}")
    try:
        with socket.create_connection((host, int(port_text)), timeout=RAY_CONNECT_TIMEOUT_S):
            pass
    except OSError as exc:
        reason = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or str(exc))
        raise ValueError(f"{flag}: cannot reach {text}: {reason} (is the Ray cluster up?)") from None


def mapper_kw(args) -> dict:
    """``{"mapper": RayMapper}`` for ``--ray``, else nothing (the single-process default). The
    address is tried first (:func:`check_ray_address`): call it before any model loads."""
    if not args.ray:
        return {}
    check_ray_address(args.ray)
    from ..experiments.distributed import ray_mapper

    try:
        return {"mapper": ray_mapper(args.ray)}  # connects on the first cell, after collection
    except ImportError as exc:  # ray not installed: one line, as a refused argument
        raise ValueError(str(exc)) from None


def close_mapper(kw: dict) -> None:
    """Shut down a Ray session that ``--ray`` started (nothing otherwise)."""
    close = getattr(kw.get("mapper"), "close", None)
    if close is not None:
        close()
