"""``multidraft serve`` argument checks: decode's settings flags checked by the same code, and the
server's own flags; every misuse is one line, exit 2, before any model is loaded."""
from __future__ import annotations

import pytest

from multidraft.cli import main


@pytest.mark.parametrize("bad,words", [
    (["--verifier", "bogus"], "unknown verifier"),
    (["--k", "0"], "--k"),
    (["--temperature", "-1"], "--temperature"),
    (["--verifier", "rrs_wor", "--draft-law", "iid"], "laws that work with 2 drafts: wor"),
    (["--tree", "dynamic", "--k", "3"], "--k applies to"),
    (["--tree", "dynamic", "--k-max", "0"], "--k-max"),
    (["--tree", "auto"], "--profile"),
    (["--engine", "transformers", "--bf16-target"], "--engine llama.cpp only"),
    (["--port", "70000"], "--port"),
    (["--queue-size", "0"], "--queue-size"),
    (["--shutdown-grace", "-1"], "--shutdown-grace"),
    (["--drain-timeout", "-1"], "--drain-timeout (--shutdown-grace) must be >= 0, got -1"),
    (["--warmup-prompt", "x"], "--tree auto only"),
    (["--api-key", " "], "--api-key must not be empty"),
    (["--sources", "lookup", "--tree", "auto", "--warmup-prompt", "x"], "--warmup-prompt measures the draft model's"),
    (["--sources", "lookup", "--tree", "auto"], "--profile FILE is needed by --tree auto"),
    (["--sources", "lookup", "--tree", "sequences"], "--tree sequences shapes the draft model's trees"),
    (["--sources", "model,bogus"], "unknown draft source"),
    (["--sources", "lookup", "--k", "2"], "--k applies to the draft model"),
    (["--ctx-size", "512"], "--ctx-size applies to --engine llama.cpp only"),
    (["--replicas", "0"], "--replicas must be >= 1, got 0"),
    (["--replicas", "-3"], "--replicas must be >= 1, got -3"),
    (["--ray", "auto"], "--ray applies to --replicas N >= 2 only"),
    (["--engine", "llama.cpp", "--ctx-size", "8"], "--ctx-size must be in [256, 131072]"),
    (["--engine", "llama.cpp", "--ctx-size", "1000000"], "--ctx-size must be in [256, 131072]"),
])
def test_serve_misuse_is_one_line_before_any_model(no_models, capsys, bad, words):
    assert main(["serve", "--engine", "transformers"] + bad if "--engine" not in bad else ["serve"] + bad) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert words in lines[0] and "Traceback" not in err
    assert lines[0].startswith("multidraft serve: error:")
    assert no_models == []


def test_serve_replicas_without_ray_is_one_line(no_models, capsys, monkeypatch):
    """``--replicas 2`` where ray is not installed: one line naming the flag and the install
    command, before any model loads (one replica needs no Ray)."""
    import sys

    monkeypatch.setitem(sys.modules, "ray", None)  # ray looks missing
    assert main(["serve", "--engine", "transformers", "--replicas", "2"]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("multidraft serve: error: --replicas 2 needs ray: pip install 'multidraft[ray]'")
    assert no_models == []


def test_serve_is_listed_with_the_decode_flags(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in ("--verifier", "--tree", "--engine", "--port", "--queue-size", "--shutdown-grace", "--drain-timeout",
                 "--model-name", "--replicas", "--ray"):
        assert flag in out
    assert "default llama.cpp" in out


def test_serve_sources_are_the_served_settings(monkeypatch):
    """``serve --sources model,lookup,suffix``: the served settings' sources, parsed at the edge as
    ``decode`` parses them (the models and the server replaced by stand-ins)."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import multidraft.serve as serve
    from multidraft.cli import _args

    served = {}
    monkeypatch.setattr(_args, "load_models", lambda *a, **kw: (object(), object(), object()))
    monkeypatch.setattr(serve, "TextCodec", lambda *a, **kw: object())
    monkeypatch.setattr(serve, "run_server", lambda model, **kw: served.setdefault("model", model) and 0)
    assert main(["serve", "--engine", "transformers", "--port", "0", "--sources", "model,lookup,suffix",
                 "--model-name", "m"]) == 0
    model = served["model"]
    assert [s.name for s in model.settings.sources] == ["model", "lookup", "suffix"]
    assert model.describe()["sources"] == ["model", "lookup", "suffix"] and model.name == "m"
    assert len(model.index) == 0  # the server's one shared suffix index


@pytest.mark.parametrize("flags,n_ctx", [([], 4096), (["--ctx-size", "512"], 512)])
def test_serve_ctx_size_is_the_llama_cpp_context(monkeypatch, tmp_path, flags, n_ctx):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import multidraft.serve as serve
    from multidraft.cli import _args

    loaded = {}
    monkeypatch.setattr(_args, "load_models", lambda *a, **kw: loaded.update(kw) or (object(), object(), object()))
    monkeypatch.setattr(serve, "TextCodec", lambda *a, **kw: object())
    monkeypatch.setattr(serve, "run_server", lambda model, **kw: 0)
    for name in ("t.gguf", "d.gguf"):
        (tmp_path / name).write_bytes(b"GGUF")
    assert main(["serve", "--engine", "llama.cpp", "--port", "0", "--target", str(tmp_path / "t.gguf"),
                 "--draft", str(tmp_path / "d.gguf")] + flags) == 0
    assert loaded["n_ctx"] == n_ctx


@pytest.mark.parametrize("flags,env,key", [([], None, None), (["--api-key", "k1"], "k2", "k1"), ([], "k2", "k2")])
def test_serve_api_key_reaches_the_server(monkeypatch, flags, env, key):
    """``--api-key`` (else ``MULTIDRAFT_API_KEY``) is the server's ``api_key``."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import multidraft.serve as serve
    from multidraft.cli import _args

    got = {}
    if env is None:
        monkeypatch.delenv("MULTIDRAFT_API_KEY", raising=False)
    else:
        monkeypatch.setenv("MULTIDRAFT_API_KEY", env)
    monkeypatch.setattr(_args, "load_models", lambda *a, **kw: (object(), object(), object()))
    monkeypatch.setattr(serve, "TextCodec", lambda *a, **kw: object())
    monkeypatch.setattr(serve, "run_server", lambda model, **kw: got.update(kw) and 0)
    assert main(["serve", "--engine", "transformers", "--port", "0", "--model-name", "m"] + flags) == 0
    assert got["api_key"] == key


def test_serve_free_only_loads_no_draft_and_names_draft_in_a_warning(monkeypatch, capsys, tmp_path):
    """``serve --sources lookup --draft DIR``: the draft is not loaded (``load_models`` asked with
    ``draft=False``), the served pair holds none, and ``--draft`` is named in one warning."""
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    import multidraft.serve as serve
    from multidraft.cli import _args

    asked, served = [], {}
    monkeypatch.setattr(_args, "load_models", lambda *a, **kw: asked.append(kw["draft"]) or (object(), None, object()))
    monkeypatch.setattr(serve, "TextCodec", lambda *a, **kw: object())
    monkeypatch.setattr(serve, "run_server", lambda model, **kw: served.setdefault("model", model) and 0)
    (tmp_path / "config.json").write_text("{}")
    assert main(["serve", "--engine", "transformers", "--port", "0", "--model-name", "m", "--sources", "lookup",
                 "--draft", str(tmp_path), "--log-level", "error"]) == 0
    assert asked == [False] and served["model"].draft is None
    err = capsys.readouterr().err
    assert "warning: --draft is not loaded: --sources lookup drafts with free sources alone" in err
