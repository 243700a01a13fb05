"""multidraft._optional: one probe and one install hint per optional dependency."""
from __future__ import annotations

import sys

import pytest

from multidraft import _optional


def test_every_dependency_has_its_extra_and_hint():
    assert set(_optional.OPTIONAL) == {"transformers", "gguf", "llama_cpp", "matplotlib", "ray", "fastapi",
                                      "uvicorn", "prometheus_client"}
    assert _optional.hint("llama_cpp") == "scripts/install_llama_cpp.sh .venv/bin/python"
    assert _optional.hint("ray") == "pip install 'multidraft[ray]'"
    assert _optional.hint("fastapi") == _optional.hint("uvicorn") == _optional.hint("prometheus_client") == \
        "pip install -e '.[serve]'"
    for dep in _optional.OPTIONAL.values():  # llama: the project's portable build of the extra (issue 25)
        assert f"'{dep.extra}'" in dep.install or f"[{dep.extra}]" in dep.install or dep.module == "llama_cpp"
    with pytest.raises(ValueError, match="name must be one of transformers, gguf, llama_cpp, matplotlib, ray, "
                                         "fastapi, uvicorn, prometheus_client"):
        _optional.hint("numpy")


def test_missing_dependency_is_one_line_naming_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # `import llama_cpp` raises ImportError
    assert _optional.available("llama_cpp") is False
    with pytest.raises(ImportError) as e:
        _optional.require("llama_cpp")
    msg = str(e.value)
    assert msg.startswith("llama.cpp support needs the 'llama' extra: scripts/install_llama_cpp.sh .venv/bin/python (")
    assert "\n" not in msg
    with pytest.raises(ImportError, match=r"^--ray needs the 'ray' extra: pip install 'multidraft\[ray\]'"):
        monkeypatch.setitem(sys.modules, "ray", None)
        _optional.require("ray")


def test_an_installed_dependency_is_returned(monkeypatch):
    fake = type(sys)("matplotlib")
    monkeypatch.setitem(sys.modules, "matplotlib", fake)
    assert _optional.available("matplotlib") is True
    assert _optional.require("matplotlib") is fake
