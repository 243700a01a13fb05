"""The decoder's walk through ``trees.TokenWalk`` reproduces the pre-move decoder token for token.

``engine_walk_tokens.json`` holds what the decoder produced before the walk moved into
``multidraft.trees`` (recorded at commit fbe1cd4 with the recipes below, at temperature 1
and 0): for each tree mode the generated tokens, the accepted lengths and the node log
(``node_log``: drafts, entered slot and depth of every verified node). The same seeds must
give the same everything, on the transformers engine (tiny random pair) and on llama.cpp
(tiny random GGUF models; skipped without ``llama_cpp``).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import torch

import multidraft as md

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
RECORDED = json.loads((Path(__file__).with_name("engine_walk_tokens.json")).read_text())


def _check(got: dict, want: dict, what: str) -> None:
    assert got["tokens"] == want["tokens"], what
    assert got["accepted"] == want["accepted"], what
    assert got["node_log"] == want["node_log"], what


def _run(t, d, prompt, temp, seed, kw, **extra):
    log = []
    r = md.generate(t, d, torch.tensor([prompt]), temperature=temp, generator=seed, node_log=log, **extra, **kw)
    return dict(tokens=r.tokens.tolist(), accepted=r.accepted_lengths, node_log=[list(x) for x in log])


@pytest.mark.filterwarnings("ignore:optimal verifier. fit stopped")  # the optimal mode: a known, exact shortfall
def test_transformers_engine_reproduces_the_recorded_tokens(one_thread):
    pytest.importorskip("transformers")
    import tiny_models as tm

    rec = RECORDED["transformers"]
    t, d = tm.tiny_pair(vocab_size=24, seed=0)
    for want in rec["runs"]:
        kw = rec["modes"][want["mode"]]
        got = _run(t, d, want["prompt"], want["temperature"], 11 + want["mode"], kw, max_new_tokens=20)
        _check(got, want, f"{kw} T={want['temperature']} prompt={want['prompt']}")
    assert any(r["temperature"] == 1.0 and max(r["accepted"]) > 0 for r in rec["runs"])  # drafts were accepted


def test_llama_cpp_engine_reproduces_the_recorded_tokens(tmp_path, one_thread):
    pytest.importorskip("llama_cpp")
    from multidraft.decoding.llamacpp import LlamaCppModel
    from multidraft.testing import tiny_gguf

    rec = RECORDED["llama.cpp"]
    t_path, o_path = tiny_gguf(tmp_path / "target.gguf", seed=1), tiny_gguf(tmp_path / "other.gguf", seed=2)
    kw0 = dict(n_ctx=512, cache_type="f32", flash_attn=False)
    ms = [LlamaCppModel(t_path, **kw0), LlamaCppModel(t_path, **kw0), LlamaCppModel(o_path, **kw0)]
    try:
        t, drafts = ms[0], {"same": ms[1], "other": ms[2]}
        for want in rec["runs"]:
            kw = rec["modes"][want["mode"]]
            temp = want["temperature"]
            got = _run(t, drafts[want["draft"]], [3, 1, 4, 1, 5], temp, 21 + want["mode"], kw, max_new_tokens=16,
                       draft_temperature=1.3 if temp else None)
            _check(got, want, f"{kw} T={temp} draft={want['draft']}")
    finally:
        for m in ms:
            m.close()
