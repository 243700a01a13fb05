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
    (["--warmup-prompt", "x"], "--tree auto only"),
])
def test_serve_misuse_is_one_line_before_any_model(no_models, capsys, bad, words):
    assert main(["serve", "--engine", "transformers"] + bad if "--engine" not in bad else ["serve"] + bad) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert words in lines[0] and "Traceback" not in err
    assert lines[0].startswith("multidraft serve: error:")
    assert no_models == []


def test_serve_is_listed_with_the_decode_flags(capsys):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    for flag in ("--verifier", "--tree", "--engine", "--port", "--queue-size", "--shutdown-grace", "--model-name"):
        assert flag in out
    assert "default llama.cpp" in out
