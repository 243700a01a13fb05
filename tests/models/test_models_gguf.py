"""GGUF files for llama.cpp: models.gguf (names, the assembled file), decoding.quantize
(requantize_gguf, ensure_gguf), load_pair("llama.cpp") and `setup-models --gguf/--bf16-target`.

Everything runs on the tiny random GGUF of multidraft.testing (milliseconds per file): the
"default model" is a fake spec whose part packages are slices of a tiny F32 GGUF. Tests
that run llama.cpp are skipped when llama-cpp-python is not installed.
"""
from __future__ import annotations

import ctypes
import hashlib
import sys

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")

from multidraft import models as M  # noqa: E402
from multidraft import testing as T  # noqa: E402
from multidraft.cli import main  # noqa: E402
from multidraft.decoding import quantize as Q  # noqa: E402
from multidraft.decoding.pair import load_pair  # noqa: E402
from multidraft.models import assets as A  # noqa: E402
from multidraft.models import gguf as G  # noqa: E402

IDS = [10, 32, 256, 104, 101, 262, 3, 200, 7, 266, 77, 32]


def _llama_cpp():
    return pytest.importorskip("llama_cpp")


def _logits(path, ids=IDS):
    llama_cpp = _llama_cpp()
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, logits_all=True, verbose=False, n_threads=1,
                          type_k=llama_cpp.GGML_TYPE_F32, type_v=llama_cpp.GGML_TYPE_F32, flash_attn=False)
    try:
        llm.eval(list(ids))
        return np.array(llm.scores[: len(ids)], dtype=np.float64)
    finally:
        llm.close()


def _types(path):
    return {t.name: t.tensor_type.name for t in gguf.GGUFReader(str(path)).tensors}


def _probs(logits):
    p = np.exp(logits - logits.max(-1, keepdims=True))
    return p / p.sum(-1, keepdims=True)


@pytest.fixture
def tiny(tmp_path):
    return T.tiny_gguf(tmp_path / "src" / "tiny.gguf", seed=7)


def _no_llama(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # import llama_cpp -> ImportError


# ---------------------------------------------------------------------------------------
# requantize_gguf
# ---------------------------------------------------------------------------------------
# measured on seeds 0-2 and 7: bf16 max |dlogit| 0.035-0.042, TV 0.004-0.007; f16 0.005, TV 0.0009
@pytest.mark.parametrize("ftype, atol, max_tv", [("bf16", 0.15, 0.03), ("f16", 0.02, 0.004), ("f32", 0.0, 0.0)])
def test_requantize_keeps_the_model(tmp_path, tiny, ftype, atol, max_tv):
    _llama_cpp()
    logs = []
    out = Q.requantize_gguf(tiny, tmp_path / "out" / f"tiny.{ftype}.gguf", ftype, nthread=1, log=logs.append)
    assert out == tmp_path / "out" / f"tiny.{ftype}.gguf" and out.is_file()
    assert not out.with_name(out.name + ".partial").exists()
    assert "requantizing tiny.gguf" in logs[0] and str(out) in logs[-1]
    # matrices in the new type, 1-D tensors (norms, biases) kept in F32
    want = ftype.upper()
    for name, typ in _types(out).items():
        is_matrix = name.endswith(".weight") and "_norm" not in name
        assert typ == (want if is_matrix else "F32"), (name, typ)
    # metadata and tokenizer copied
    a, b = gguf.GGUFReader(str(tiny)), gguf.GGUFReader(str(out))
    for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.merges", "qwen2.rope.freq_base", "tokenizer.ggml.eos_token_id"):
        assert a.get_field(key).contents() == b.get_field(key).contents(), key
    # the weights are the source's, rounded to the new type
    for name in ("blk.0.attn_q.weight", "output.weight"):
        x, y = (gguf.quants.dequantize(t.data, t.tensor_type) for r in (a, b) for t in r.tensors if t.name == name)
        # round to nearest: half an ulp, relative; f16 subnormals (< 2^-14) keep 2^-25 absolute
        rel, floor = {"bf16": (2.0 ** -8, 0.0), "f16": (2.0 ** -11, 2.0 ** -25), "f32": (0.0, 0.0)}[ftype]
        assert np.all(np.abs(y - x) <= rel * np.abs(x) + floor), name
    # llama.cpp: the same next-token distributions up to the precision of the type
    la, lb = _logits(tiny), _logits(out)
    if ftype == "f32":
        np.testing.assert_array_equal(la, lb)
    else:
        d = np.abs(la - lb).max()
        assert 1e-5 < d < atol, d  # > 0: the weights really were rounded
        tv = 0.5 * np.abs(_probs(la) - _probs(lb)).sum(-1)
        assert tv.max() < max_tv, tv.max()


def test_requantize_reports_llamacpp_errors(tmp_path):
    llama_cpp = _llama_cpp()
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF" + bytes(60))
    dst = tmp_path / "dst.gguf"
    before_cb, before_ud = llama_cpp.llama_log_callback(), ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(before_cb), ctypes.byref(before_ud))
    with pytest.raises(RuntimeError, match=r"could not requantize .*bad\.gguf to BF16 .*returned 1\).*bad GGUF version") as e:
        Q.requantize_gguf(bad, dst)
    assert "\n" not in str(e.value)
    assert not dst.exists() and not (tmp_path / "dst.gguf.partial").exists()
    # the process-wide log callback is given back
    after_cb, after_ud = llama_cpp.llama_log_callback(), ctypes.c_void_p()
    llama_cpp.llama_log_get(ctypes.byref(after_cb), ctypes.byref(after_ud))
    assert ctypes.cast(after_cb, ctypes.c_void_p).value == ctypes.cast(before_cb, ctypes.c_void_p).value
    assert after_ud.value == before_ud.value


def test_requantize_bad_arguments(tmp_path, tiny):
    with pytest.raises(ValueError, match=r"ftype must be one of \['bf16', 'f16', 'f32', 'q4_0'\], got 'q4_k'"):
        Q.requantize_gguf(tiny, tmp_path / "x.gguf", "q4_k")
    with pytest.raises(ValueError, match="nthread"):
        Q.requantize_gguf(tiny, tmp_path / "x.gguf", nthread=-1)
    with pytest.raises(FileNotFoundError, match="no GGUF file at"):
        Q.requantize_gguf(tmp_path / "none.gguf", tmp_path / "x.gguf")
    with pytest.raises(ValueError, match="dst must differ from src"):
        Q.requantize_gguf(tiny, tiny)


def test_requantize_without_llama_cpp_names_the_extra(tmp_path, tiny, monkeypatch):
    _no_llama(monkeypatch)
    with pytest.raises(ImportError, match=r"needs the 'llama' extra: scripts/install_llama_cpp.sh") as e:
        Q.requantize_gguf(tiny, tmp_path / "x.gguf")
    assert "\n" not in str(e.value)
    assert not (tmp_path / "x.gguf").exists()


def test_requantize_checks_disk_space(tmp_path, tiny, monkeypatch):
    _llama_cpp()
    real = A.shutil.disk_usage

    def tiny_disk(path):
        u = real(path)
        return type(u)(u.total, u.total - 1000, 1000)

    monkeypatch.setattr(A.shutil, "disk_usage", tiny_disk)
    with pytest.raises(OSError, match="not enough disk space .* requantizing tiny.gguf to BF16"):
        Q.requantize_gguf(tiny, tmp_path / "x.gguf")


# ---------------------------------------------------------------------------------------
# ensure_gguf on a fake default model whose slices are a tiny GGUF
# ---------------------------------------------------------------------------------------
def _fake_spec(site, data: bytes, stem="tinygguf", parts=3) -> M.ModelSpec:
    cut = [len(data) * i // parts for i in range(parts + 1)]
    for i in range(1, parts + 1):
        pkg = site / f"{stem}_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        (pkg / "data" / f"part{i:02d}.bin").write_bytes(data[cut[i - 1]:cut[i]])
    return M.ModelSpec(
        name=stem, title=f"Fake {stem}", dist=f"{stem}-part{{i}}", module=f"{stem}_part{{i}}", version="1.0",
        parts=parts, data_glob="*.bin", size=len(data), sha256=hashlib.sha256(data).hexdigest(),
    )


def test_ensure_gguf_assembles_trusts_and_reassembles(tmp_path, tiny):
    spec = _fake_spec(tmp_path / "site", tiny.read_bytes())
    kw = dict(cache_dir=tmp_path / "cache", search_path=[tmp_path / "site"])
    q4 = Q.ensure_gguf(spec, **kw)
    assert q4 == tmp_path / "cache" / "gguf" / spec.gguf_name
    assert q4.read_bytes() == tiny.read_bytes()
    # a file of the right size is trusted (no re-hash) unless verify=True
    q4.write_bytes(b"\0" * spec.size)
    assert Q.ensure_gguf(spec, **kw) == q4 and q4.read_bytes() == b"\0" * spec.size
    assert Q.ensure_gguf(spec, verify=True, **kw) == q4 and q4.read_bytes() == tiny.read_bytes()
    # deleted (ensure_model drops it after conversion): assembled again
    q4.unlink()
    assert Q.ensure_gguf(spec, **kw).read_bytes() == tiny.read_bytes()
    # a truncated file is assembled again
    q4.write_bytes(b"x")
    assert Q.ensure_gguf(spec, **kw).read_bytes() == tiny.read_bytes()


def test_ensure_gguf_bf16_is_built_once(tmp_path, tiny, monkeypatch):
    _llama_cpp()
    spec = _fake_spec(tmp_path / "site", tiny.read_bytes())
    kw = dict(cache_dir=tmp_path / "cache", search_path=[tmp_path / "site"])
    out = Q.ensure_gguf(spec, bf16=True, **kw)
    assert out == tmp_path / "cache" / "gguf" / f"{spec.name}.BF16.gguf"
    assert _types(out)["blk.0.ffn_up.weight"] == "BF16"
    assert (tmp_path / "cache" / "gguf" / spec.gguf_name).is_file()  # the source stays
    np.testing.assert_allclose(_logits(out), _logits(tiny), rtol=0, atol=0.15)
    # cached: neither assembled nor requantized again
    monkeypatch.setattr(Q, "requantize_gguf", lambda *a, **k: pytest.fail("requantized again"))
    monkeypatch.setattr(G, "assemble_gguf", lambda *a, **k: pytest.fail("assembled again"))
    assert Q.ensure_gguf(spec, bf16=True, **kw) == out


def test_ensure_gguf_bf16_without_llama_cpp_fails_first(tmp_path, tiny, monkeypatch):
    spec = _fake_spec(tmp_path / "site", tiny.read_bytes())
    _no_llama(monkeypatch)
    with pytest.raises(ImportError, match=r"scripts/install_llama_cpp.sh"):
        Q.ensure_gguf(spec, bf16=True, cache_dir=tmp_path / "cache", search_path=[tmp_path / "site"])
    assert not (tmp_path / "cache" / "gguf" / spec.gguf_name).exists()  # nothing assembled


def test_ensure_gguf_names(tmp_path):
    with pytest.raises(ValueError, match="spec_or_name must be a ModelSpec or one of 'target', 'draft'"):
        Q.ensure_gguf("big", cache_dir=tmp_path)
    assert M.default_spec("target") is M.DEFAULT_TARGET
    assert M.default_spec(M.DEFAULT_DRAFT.name) is M.DEFAULT_DRAFT
    assert M.DEFAULT_TARGET.requantized_name("bf16") == "qwen2.5-coder-1.5b-instruct.BF16.gguf"


# ---------------------------------------------------------------------------------------
# the CLI
# ---------------------------------------------------------------------------------------
@pytest.fixture
def fake_defaults(tmp_path, monkeypatch):
    """Two fake default models (tiny GGUFs) on sys.path, and a stub for the HF conversion."""
    site = tmp_path / "site"
    target = _fake_spec(site, T.tiny_gguf(tmp_path / "t.gguf", seed=0).read_bytes(), stem="faketarget")
    draft = _fake_spec(site, T.tiny_gguf(tmp_path / "d.gguf", seed=1, n_layer=1).read_bytes(), stem="fakedraft")
    monkeypatch.syspath_prepend(str(site))
    for module in (M, A):  # the package's names (the CLI's) and the ones default_spec("target") reads
        monkeypatch.setattr(module, "DEFAULT_TARGET", target)
        monkeypatch.setattr(module, "DEFAULT_DRAFT", draft)
    calls = []
    monkeypatch.setattr(M, "ensure_default_models", lambda cache_dir, log=None: calls.append(cache_dir) or
                        (tmp_path / "cache" / "target-hf", tmp_path / "cache" / "draft-hf"))
    return target, draft, calls


def test_cli_setup_models_gguf_and_bf16(tmp_path, fake_defaults, capsys):
    _llama_cpp()
    target, draft, calls = fake_defaults
    cache = tmp_path / "cache"
    assert main(["setup-models", "--cache-dir", str(cache), "--gguf", "--bf16-target"]) == 0
    out = capsys.readouterr().out.splitlines()
    g = cache / "gguf"
    assert calls == [str(cache)]
    assert out[0] == f"target: {cache / 'target-hf'}"
    assert out[2].startswith(f"target gguf: {g / target.gguf_name} (0.00 GiB)")
    assert out[3].startswith(f"draft gguf: {g / draft.gguf_name} (")
    assert out[4] == f"target bf16 gguf: {g / 'faketarget.BF16.gguf'} (0.00 GiB)"
    assert len(out) == 5
    assert (g / "faketarget.BF16.gguf").is_file() and not (g / "fakedraft.BF16.gguf").exists()


def test_cli_setup_models_bf16_only(tmp_path, fake_defaults, capsys):
    _llama_cpp()
    cache = tmp_path / "cache"
    assert main(["setup-models", "--cache-dir", str(cache), "--bf16-target"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[2].startswith("target bf16 gguf: ")
    assert not (cache / "gguf" / "fakedraft.Q4_K_M.gguf").exists()


def test_cli_setup_models_bf16_without_llama_cpp(tmp_path, fake_defaults, monkeypatch, capsys):
    _, _, calls = fake_defaults
    _no_llama(monkeypatch)
    assert main(["setup-models", "--cache-dir", str(tmp_path / "cache"), "--bf16-target"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("multidraft setup-models: error: llama.cpp support needs the 'llama' extra: "
                          "scripts/install_llama_cpp.sh .venv/bin/python")
    assert "\n" not in err
    assert calls == []  # failed before the long steps


# ---------------------------------------------------------------------------------------
# Q4_0 drafts (the fast CPU draft)
# ---------------------------------------------------------------------------------------
def test_requantize_q4_0_is_a_smaller_working_model(tmp_path, tiny):
    _llama_cpp()
    out = Q.requantize_gguf(tiny, tmp_path / "tiny.Q4_0.gguf", "q4_0", nthread=1)
    types = _types(out)
    blocks = {n: t for n, t in types.items() if n.startswith("blk.") and n.endswith(".weight") and "_norm" not in n}
    assert blocks and set(blocks.values()) == {"Q4_0"}, blocks
    assert all(types[n] == "F32" for n in types if "_norm" in n)
    assert out.stat().st_size < tiny.stat().st_size
    # llama.cpp reads it; its next-token laws are a coarser copy of the source's (a draft may be any q)
    la, lb = _logits(tiny), _logits(out)
    assert np.isfinite(lb).all() and np.abs(la - lb).max() > 1e-4
    tv = 0.5 * np.abs(_probs(la) - _probs(lb)).sum(-1)
    assert tv.mean() < 0.5, tv


def test_ensure_gguf_ftype(tmp_path, tiny, monkeypatch):
    _llama_cpp()
    spec = _fake_spec(tmp_path / "site", tiny.read_bytes())
    kw = dict(cache_dir=tmp_path / "cache", search_path=[tmp_path / "site"])
    out = Q.ensure_gguf(spec, ftype="Q4_0", **kw)
    assert out == tmp_path / "cache" / "gguf" / f"{spec.name}.Q4_0.gguf"
    assert _types(out)["blk.0.ffn_up.weight"] == "Q4_0"
    assert Q.ensure_gguf(spec, ftype="bf16", **kw) == tmp_path / "cache" / "gguf" / f"{spec.name}.BF16.gguf"
    monkeypatch.setattr(Q, "requantize_gguf", lambda *a, **k: pytest.fail("requantized again"))
    assert Q.ensure_gguf(spec, ftype="q4_0", **kw) == out
    assert Q.ensure_gguf(spec, bf16=True, ftype="bf16", **kw).name == f"{spec.name}.BF16.gguf"
    with pytest.raises(ValueError, match="ftype must be None or one of bf16, f16, f32, q4_0, got 'q2_k'"):
        Q.ensure_gguf(spec, ftype="q2_k", **kw)
    with pytest.raises(ValueError, match="bf16=True and ftype='q4_0' disagree"):
        Q.ensure_gguf(spec, bf16=True, ftype="q4_0", **kw)


def test_load_pair_llama_draft_ftype_misuse(tmp_path, tiny):
    with pytest.raises(ValueError, match="draft_ftype applies to the default draft only"):
        load_pair("llama.cpp", target=tiny, draft=tiny, draft_ftype="q4_0")
    with pytest.raises(ValueError, match="draft_ftype must be one of"):
        load_pair("llama.cpp", target=tiny, draft_ftype="q9")


def test_load_pair_llama_loads_the_requantized_draft(tmp_path, fake_defaults):
    _llama_cpp()
    target, draft, _ = fake_defaults
    t, d, tok = load_pair("llama.cpp", draft_ftype="q4_0", cache_dir=tmp_path / "cache", n_threads=1, n_ctx=256)
    try:
        assert tok is t
        assert t.path.name == target.gguf_name and d.path.name == "fakedraft.Q4_0.gguf"
    finally:
        t.close()
        d.close()


def test_cli_setup_models_draft_q4_0(tmp_path, fake_defaults, capsys):
    _llama_cpp()
    cache = tmp_path / "cache"
    assert main(["setup-models", "--cache-dir", str(cache), "--draft-ftype", "q4_0"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert len(out) == 3 and out[2].startswith(f"draft q4_0 gguf: {cache / 'gguf' / 'fakedraft.Q4_0.gguf'} (")
    assert main(["setup-models", "--cache-dir", str(cache), "--draft-ftype", "q5"]) == 2
    assert "--draft-ftype must be one of" in capsys.readouterr().err
