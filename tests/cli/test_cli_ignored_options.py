"""Issue 41, item 5: an option the chosen mode would ignore is refused (or named in a warning);
every check that needs no model comes before any model loads (addresses, sizes, prefixes);
a bad flag is refused before torch is imported; running out of memory while loading a model
is one line. In-process calls of ``cli.main`` with the loaders replaced (``no_models``), one
subprocess for the import check."""
from __future__ import annotations

import json
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from multidraft import cli
from multidraft.cli import main

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _one_line(capsys, prefix: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(prefix), lines[0]
    return lines[0]


# ---- refused before torch ----------------------------------------------------------------------
# each refused by main() in ONE fresh interpreter, which must not have imported torch after any
BAD_BEFORE_TORCH = [
    ["decode", "--prompt", "x", "--k", "-1"],
    ["decode", "--prompt", "x", "--depth", "0"],
    ["decode", "--prompt", "x", "--bogus"],
    ["decode", "--prompt", "x", "--verifier", "none", "--k", "3", "--depth", "7"],
    ["decode", "--prompt", "x", "--tree", "dynamic", "--depth", "3"],
    ["serve", "--port", "70000"],
    ["bound", "--p", "p.npy", "--q", "q.npy", "--temperature", "2"],
    ["bound", "--p", "p.npy", "--q", "q.npy", "--max-set", "3"],
    ["bound", "--p", "p.npy", "--q", "q.npy", "--k", "0"],
    ["experiment", "acceptance", "run", "--texts", "x"],
    ["experiment", "paper", "run", "--nope"],
    ["profile", "--prefix", "0"],
    ["verifier-table", "--bogus"],
]


def test_a_bad_flag_is_refused_before_torch_is_imported():
    code = (
        "import sys, json\n"
        "from multidraft.cli import main\n"
        "out = []\n"
        "for argv in json.loads(sys.argv[1]):\n"
        "    try:\n"
        "        rc = main(argv)\n"
        "    except SystemExit as e:\n"
        "        rc = e.code\n"
        "    out.append([rc, 'torch' in sys.modules, 'transformers' in sys.modules])\n"
        "print(json.dumps(out))\n"
    )
    res = subprocess.run([sys.executable, "-c", code, json.dumps(BAD_BEFORE_TORCH)], capture_output=True, text=True,
                         env={"PYTHONPATH": SRC, "PATH": "/usr/bin:/bin"}, timeout=120)
    got = json.loads(res.stdout.strip().splitlines()[-1])
    for argv, (rc, torch_in, tf_in) in zip(BAD_BEFORE_TORCH, got):
        assert rc == 2, (argv, res.stderr)
        assert not torch_in and not tf_in, f"{argv} imported torch before refusing it"
    errs = res.stderr.strip().splitlines()
    assert len(errs) == len(BAD_BEFORE_TORCH) and "Traceback" not in res.stderr, res.stderr


def test_the_names_spelled_in_the_cli_are_the_library_s():
    from multidraft import datasets, drafts
    from multidraft.cli import decode, experiment, paper
    from multidraft.experiments import collect
    from multidraft.experiments import paper as paper_study

    assert decode.LAW_KINDS == drafts.LAW_KINDS
    assert experiment.DATASETS == datasets.DATASETS
    assert experiment.POSITIONS_FROM == collect.POSITIONS_FROM
    assert paper.STAGES == paper_study.STAGES


# ---- bound: options that only some inputs read ---------------------------------------------------
@pytest.fixture
def pq(tmp_path):
    p = np.array([0.5, 0.3, 0.2, 0.0])
    q = np.array([0.25, 0.25, 0.25, 0.25])
    np.save(tmp_path / "p.npy", p)
    np.save(tmp_path / "q.npy", q)
    np.save(tmp_path / "q2.npy", np.stack([q, p]))
    return tmp_path


@pytest.mark.parametrize("extra,words", [
    (["--temperature", "0.5"], "--temperature applies to --logits only"),
    (["--draft-temperature", "0.5"], "--draft-temperature applies to --logits only"),
    (["--max-set", "3"], "--max-set applies to --show-set only"),
    (["--laws", "independent"], "--laws independent needs a 2-D --q"),
    (["--laws", "iid,independent"], "--laws independent needs a 2-D --q"),
])
def test_bound_refuses_what_it_would_ignore(pq, capsys, extra, words):
    assert main(["bound", "--p", str(pq / "p.npy"), "--q", str(pq / "q.npy"), "--k", "1,2", *extra]) == 2
    assert words in _one_line(capsys, "multidraft bound: error:")


def test_bound_default_laws_are_those_the_q_describes(pq, capsys):
    assert main(["bound", "--p", str(pq / "p.npy"), "--q", str(pq / "q.npy"), "--k", "1,2", "--json"]) == 0
    one = json.loads(capsys.readouterr().out)
    assert one["laws"] == ["iid", "wor", "greedy"]
    assert main(["bound", "--p", str(pq / "p.npy"), "--q", str(pq / "q2.npy"), "--k", "1,2", "--json"]) == 0
    two = json.loads(capsys.readouterr().out)
    assert two["laws"] == ["iid", "wor", "greedy", "independent"]
    assert main(["bound", "--p", str(pq / "p.npy"), "--q", str(pq / "q2.npy"), "--k", "2", "--laws", "independent",
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["rows"][0]["acceptance"] is not None


def test_bound_takes_minus_inf_logits_as_masked_tokens(tmp_path, capsys):
    lp = np.array([1.0, 0.5, -np.inf, 0.0])
    lq = np.array([0.0, -np.inf, 0.2, 0.1])
    np.save(tmp_path / "lp.npy", lp)
    np.save(tmp_path / "lq.npy", lq)
    soft = lambda x: np.exp(x - x.max()) / np.exp(x - x.max()).sum()  # noqa: E731  (exp(-inf) = 0)
    np.save(tmp_path / "p.npy", soft(lp))
    np.save(tmp_path / "q.npy", soft(lq))
    assert main(["bound", "--p", str(tmp_path / "lp.npy"), "--q", str(tmp_path / "lq.npy"), "--logits", "--k", "1-3",
                 "--json"]) == 0
    logits = json.loads(capsys.readouterr().out)["rows"]
    assert main(["bound", "--p", str(tmp_path / "p.npy"), "--q", str(tmp_path / "q.npy"), "--k", "1-3", "--json"]) == 0
    probs = json.loads(capsys.readouterr().out)["rows"]
    assert len(logits) == len(probs) == 9
    for a, b in zip(logits, probs):
        assert (a["acceptance"] is None) == (b["acceptance"] is None)
        if a["acceptance"] is not None:
            assert abs(a["acceptance"] - b["acceptance"]) < 1e-12


@pytest.mark.parametrize("row,words", [
    ([-np.inf, -np.inf, -np.inf], "every logit is -inf"),
    ([0.0, np.inf, 1.0], "NaN or +infinite entry"),
    ([0.0, np.nan, 1.0], "NaN or +infinite entry"),
])
def test_bound_refuses_logits_with_no_probability(tmp_path, capsys, row, words):
    np.save(tmp_path / "bad.npy", np.array(row))
    np.save(tmp_path / "ok.npy", np.zeros(3))
    assert main(["bound", "--p", str(tmp_path / "ok.npy"), "--q", str(tmp_path / "bad.npy"), "--logits"]) == 2
    line = _one_line(capsys, "multidraft bound: error: --q")
    assert words in line and "bad.npy" in line


def test_minus_inf_is_still_refused_in_probability_files(tmp_path, capsys):
    np.save(tmp_path / "p.npy", np.array([0.5, 0.5, -np.inf]))
    np.save(tmp_path / "q.npy", np.array([0.5, 0.5, 0.0]))
    assert main(["bound", "--p", str(tmp_path / "p.npy"), "--q", str(tmp_path / "q.npy")]) == 2
    assert "NaN or infinite entry" in _one_line(capsys, "multidraft bound: error: --p")


# ---- decode / serve: the target alone takes no draft flags -----------------------------------------
@pytest.mark.parametrize("cmd", ["decode", "serve"])
@pytest.mark.parametrize("extra,flag", [
    (["--k", "3", "--depth", "7"], "--k"),
    (["--depth", "7"], "--depth"),
    (["--draft-law", "wor"], "--draft-law"),
    (["--draft-temperature", "0.5"], "--draft-temperature"),
    (["--sources", "model"], "--sources"),
    (["--tree", "[[0],[0,0]]"], "--tree"),
    (["--tree", "sequences"], "--tree"),
])
def test_target_alone_refuses_the_draft_flags(no_models, capsys, cmd, extra, flag):
    argv = [cmd, "--engine", "transformers", "--verifier", "none", *extra]
    if cmd == "decode":
        argv[1:1] = ["--prompt", "x", "--quiet"]
    assert main(argv) == 2
    line = _one_line(capsys, f"multidraft {cmd}: error: {flag}")
    assert "--verifier none" in line
    assert no_models == []


def test_target_alone_names_the_unloaded_draft_in_a_warning(no_models, capsys, tmp_path):
    d = tmp_path / "draft"
    d.mkdir()
    (d / "config.json").write_text("{}")
    with pytest.raises(Exception, match="a model would have been loaded"):  # the checks passed: the target loads now
        main(["decode", "--prompt", "x", "--quiet", "--verifier", "none", "--draft", str(d)])
    assert len(no_models) == 1
    err = capsys.readouterr().err
    assert "multidraft decode: warning: --draft is not loaded: --verifier none" in err


@pytest.mark.parametrize("extra, warned", [
    (["--temperature", "0", "--top-k", "5"], True),
    (["--temperature", "0", "--top-p", "0.9"], True),
    (["--temperature", "0", "--top-k", "5", "--draft-temperature", "1"], False),  # the draft samples: top-k applies
    (["--temperature", "0.7", "--top-k", "5"], False),
])
def test_top_k_and_top_p_at_greedy_are_named(no_models, capsys, extra, warned):
    """Greedy target and drafts: the argmax is in every top-k and top-p set, so they change nothing."""
    with pytest.raises(Exception, match="a model would have been loaded"):
        main(["decode", "--prompt", "x", "--quiet", "--engine", "transformers", *extra])
    err = capsys.readouterr().err
    assert ("multidraft decode: warning: --top-k and --top-p change nothing at --temperature 0" in err) == warned


def test_dtype_is_refused_on_llama_cpp(no_models, capsys):
    from multidraft import _optional

    if not _optional.available("llama_cpp"):
        pytest.skip("llama-cpp-python is not installed")
    assert main(["decode", "--prompt", "x", "--engine", "llama.cpp", "--dtype", "float32"]) == 2
    assert "--engine transformers only" in _one_line(capsys, "multidraft decode: error: --dtype")


# ---- checks that need no model come before the models ---------------------------------------------
def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # bound, never listened, closed: nothing answers there


@pytest.mark.parametrize("address,words", [
    ("127.0.0.1:{port}", "cannot reach"),
    ("ray://127.0.0.1:{port}", "cannot reach"),
    ("nonsense", "expected auto, HOST:PORT"),
    ("127.0.0.1:99999", "expected auto, HOST:PORT"),
])
def test_ray_address_is_tried_before_any_model(no_models, capsys, tmp_path, address, words):
    ray = address.format(port=_closed_port())
    assert main(["experiment", "acceptance", str(tmp_path / "run"), "--k", "2", "--no-progress", "--ray", ray]) == 2
    assert words in _one_line(capsys, "multidraft experiment: error: --ray")
    assert no_models == []


def test_serve_refuses_a_busy_port_before_any_model(no_models, capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["serve", "--engine", "transformers", "--port", str(port)]) == 2
    assert "cannot listen there" in _one_line(capsys, "multidraft serve: error: --host 127.0.0.1 --port")
    assert no_models == []


def test_serve_refuses_an_address_of_no_interface_before_any_model(no_models, capsys):
    assert main(["serve", "--engine", "transformers", "--host", "192.0.2.1", "--port", "0"]) == 2  # TEST-NET-1
    assert "cannot listen there" in _one_line(capsys, "multidraft serve: error: --host 192.0.2.1")
    assert no_models == []


def test_serve_refuses_an_unresolvable_host_before_any_model(no_models, capsys):
    """A name under the reserved .invalid TLD (RFC 2606: it never resolves) is refused in one line."""
    assert main(["serve", "--engine", "transformers", "--host", "no-such-host.invalid", "--port", "0"]) == 2
    assert "not an address to listen on" in _one_line(capsys, "multidraft serve: error: --host 'no-such-host.invalid'")
    assert no_models == []


def test_serve_refuses_a_host_whose_lookup_does_not_answer(no_models, capsys, monkeypatch):
    """A resolver that never answers (getaddrinfo blocked until the test ends) is given
    RESOLVE_TIMEOUT_S (0.2 s here) and the command refuses the host in one line."""
    import threading

    from multidraft.cli import serve as serve_cli

    answered, release = threading.Event(), threading.Event()
    real = socket.getaddrinfo

    def stuck(host, *a, **kw):
        if host == "slow.example":
            release.wait(60)
            answered.set()
        return real(host, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", stuck)
    monkeypatch.setattr(serve_cli, "RESOLVE_TIMEOUT_S", 0.2)
    try:
        assert main(["serve", "--engine", "transformers", "--host", "slow.example", "--port", "0"]) == 2
        assert not answered.is_set()  # refused while the lookup was still waiting
    finally:
        release.set()
    assert "not resolved within 0.2 s" in _one_line(capsys, "multidraft serve: error: --host 'slow.example'")
    assert no_models == []


def _model_dir(path: Path, context: int) -> Path:
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"max_position_embeddings": context}))
    return path


def test_profile_prefix_beyond_the_context_is_refused_before_any_model(no_models, capsys, tmp_path):
    t, d = _model_dir(tmp_path / "t", 4096), _model_dir(tmp_path / "d", 2048)
    base = ["profile", "--target", str(t), "--draft", str(d), "--out", str(tmp_path / "p.json"), "--quiet"]
    assert main(base + ["--prefix", "10000000"]) == 2
    line = _one_line(capsys, "multidraft profile: error: --prefix 10000000")
    assert "target model's context is 4,096" in line
    assert main(base + ["--prefix", "2000"]) == 2  # fits the target, not the draft (2000 + 1 + 64 > 2048)
    assert "draft model's context is 2,048" in _one_line(capsys, "multidraft profile: error: --prefix 2000")
    assert no_models == []
    with pytest.raises(Exception, match="a model would have been loaded"):  # fits both: the models load now
        main(base + ["--prefix", "1000"])


# ---- out of memory while loading ------------------------------------------------------------------
@pytest.mark.parametrize("exc", [
    MemoryError(),
    RuntimeError("[enforce fail at alloc_cpu.cpp:117] data. DefaultCPUAllocator: can't allocate memory: you tried "
                 "to allocate 6442450944 bytes.\nError code 12 (Cannot allocate memory)"),
    "torch.OutOfMemoryError",
])
def test_out_of_memory_while_loading_is_one_line(monkeypatch, capsys, exc):
    import torch

    from multidraft.decoding import pair

    if exc == "torch.OutOfMemoryError":
        exc = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    def load(*a, **kw):
        raise exc

    monkeypatch.setattr(pair, "load_pair", load)
    assert main(["decode", "--prompt", "x", "--quiet", "--verifier", "none"]) == 1
    line = _one_line(capsys, "multidraft decode: error: out of memory while loading the models (transformers)")
    assert "\n" not in line


def test_another_load_error_is_not_called_out_of_memory(monkeypatch):
    from multidraft.decoding import pair

    def load(*a, **kw):
        raise RuntimeError("size mismatch for lm_head.weight")

    monkeypatch.setattr(pair, "load_pair", load)
    with pytest.raises(RuntimeError, match="size mismatch"):
        cli.main(["decode", "--prompt", "x", "--quiet", "--verifier", "none"])


# ---- profile: measuring and comparing read different flags ------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["--k", "3"], "--k applies to --compare only"),
    (["--max-nodes", "8"], "--max-nodes applies to --compare only"),
    (["--accept-stats", "s.json"], "--accept-stats applies to --compare only"),
    (["--markdown", "m.md"], "--markdown applies to --compare only"),
    (["--compare", "a.json", "--prefix", "64"], "--prefix applies to measuring a profile"),
    (["--compare", "a.json", "--out", "p.json"], "--out applies to measuring a profile"),
    (["--compare", "a.json", "--engine", "transformers"], "--engine applies to measuring a profile"),
    (["--compare", "a.json", "--verifier", "nss"], "--verifier rates trees by acceptances"),
    (["--compare", "a.json", "--temperature", "0.5"], "--temperature rates trees by acceptances"),
])
def test_profile_refuses_the_other_mode_s_flags(no_models, capsys, argv, words):
    assert main(["profile", *argv]) == 2
    assert words in _one_line(capsys, "multidraft profile: error:")
    assert no_models == []


# ---- experiment: each --positions-from reads its own flags ------------------------------------------
@pytest.mark.parametrize("argv,words", [
    (["--max-tokens", "24"], "--max-tokens applies to --positions-from teacher-forcing only"),
    (["--positions-from", "teacher-forcing", "--new-tokens", "8"], "--new-tokens applies to --positions-from continuation"),
    (["--positions-from", "teacher-forcing", "--sample-temperature", "0.5"], "--sample-temperature applies to"),
])
def test_experiment_refuses_the_other_position_mode_s_flags(no_models, capsys, tmp_path, argv, words):
    assert main(["experiment", "acceptance", str(tmp_path / "run"), "--no-progress", *argv]) == 2
    assert words in _one_line(capsys, "multidraft experiment: error:")
    assert no_models == []


def test_out_of_memory_inside_a_study_is_one_line_too(monkeypatch, capsys, tmp_path):
    from multidraft.experiments import demo

    def run_demo(*a, **kw):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 6442450944 bytes.")

    monkeypatch.setattr(demo, "run_demo", run_demo)
    assert main(["demo", "--out", str(tmp_path / "out"), "--no-progress"]) == 1
    assert "can't allocate memory" in _one_line(capsys, "multidraft demo: error: out of memory:")
