"""Hostile inputs (issue 29 items 2 and 3): bounded work and one line for every misuse.

Every command here must end at once with exactly ONE line on stderr naming the flag, a
non-zero exit, and no model loaded (the loaders are replaced by ones that fail the test).
A SIGALRM guard turns a hang into a failure (a guard only: nothing asserts on speed).
"""
from __future__ import annotations

import math
import os
import signal
import time

import pytest
import torch

from alarm import guard
from multidraft import cli
from multidraft.cli import _args

GUARD_S = 120  # a hang becomes a failure after this long; the commands take well under a second


def _sigint_default():
    """In the child: SIGINT as a terminal gives it, whatever the suite was started under (a
    background job or nohup starts with SIGINT ignored, and the command line keeps an ignored
    SIGINT ignored, so the interrupt would never arrive)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)



class Hung(Exception):
    pass




def _guard(seconds: int = GUARD_S):
    return guard(seconds, Hung)


def _run(argv, capsys) -> tuple[int, list[str]]:
    with _guard():
        try:
            rc = cli.main(argv)
        except SystemExit as exc:  # argparse's own errors
            rc = exc.code
    err = capsys.readouterr().err
    return rc, [line for line in err.splitlines() if line.strip()]


@pytest.fixture
def paths(tmp_path):
    a_file = tmp_path / "a_file.txt"
    a_file.write_text("not a model\n")
    model_dir = tmp_path / "empty_dir"
    model_dir.mkdir()
    return {"tmp": str(tmp_path), "file": str(a_file), "dir": str(model_dir)}


BIG = "1-1000000000"
HUGE_SEED = str(2**64)

# (argv with {tmp}/{file}/{dir} placeholders, the flag the one line must name)
CASES = [
    # item 2: sizes checked before anything is allocated or loaded
    ("decode --prompt hi --k 4 --depth 16", "--depth"),
    ("decode --prompt hi --k 1000000000", "--k"),
    ("decode --prompt hi --depth 100000", "--depth"),
    (f"decode --prompt hi --k {BIG}", "--k"),
    ("decode --prompt hi --tree sequences --k 40 --depth 40", "--depth"),
    ("decode --prompt hi --tree dynamic --k-max 1000000000", "--k-max"),
    ("decode --prompt hi --tree " + "[" + ",".join(f"[{i}]" for i in range(1100)) + "]", "--tree"),
    (f"bound --p {{file}} --q {{file}} --k {BIG}", "--k"),
    (f"compare --k {BIG}", "--k"),
    ("compare --k 100000000", "--k"),
    (f"demo --k {BIG} --out {{tmp}}/demo", "--k"),
    ("demo --depth 100 --out {tmp}/demo", "--depth"),
    ("experiment blocks {tmp}/run --depths 1-100", "--depths"),
    (f"experiment blocks {{tmp}}/run --k {BIG}", "--k"),
    (f"experiment acceptance {{tmp}}/run --k {BIG}", "--k"),
    (f"experiment temperature {{tmp}}/run --k {BIG}", "--k"),
    (f"profile --nodes {BIG}", "--nodes"),
    (f"profile --draft-nodes {BIG}", "--draft-nodes"),
    # item 3: misuse refused before any work
    ("decode --prompt hi --temperature 1e-40 --verifier none", "--temperature"),
    ("decode --prompt hi --temperature 1e-40", "--temperature"),
    ("decode --prompt hi --draft-temperature 1e-45", "--draft-temperature"),
    ("decode --prompt hi --draft-law iid --draft-temperature 1,2", "--draft-temperature"),
    ("decode --prompt hi --profile {file}", "--profile"),
    ("decode --prompt hi --accept-stats {file}", "--accept-stats"),
    ("decode --prompt hi --warmup-tokens 3", "--warmup-tokens"),
    ("decode --prompt hi --force-tree", "--force-tree"),
    ("decode --prompt hi --max-nodes 8", "--max-nodes"),
    ("decode --prompt hi --max-depth 3", "--max-depth"),
    ("decode --prompt hi --k-max 3", "--k-max"),
    ("decode --prompt hi --tree sequences --min-gain 0.1", "--min-gain"),
    ("decode --prompt hi --tree dynamic --k 3", "--k"),
    ("decode --prompt hi --tree dynamic --depth 3", "--depth"),
    ("decode --prompt hi --tree auto --depth 3", "--depth"),
    ("decode --prompt hi --threads 0", "--threads"),
    ("decode --prompt hi --out {file}/x.json", "--out"),
    ("decode --prompt hi --out {dir}", "--out"),
    ("decode --prompt hi --draft {file}", "--draft"),
    ("decode --prompt hi --target {dir}", "--target"),
    (f"decode --prompt hi --seed {HUGE_SEED}", "--seed"),
    ("decode --prompt hi --seed -1", "--seed"),
    ("profile --out {dir}", "--out"),
    ("profile --out {file}/p.json", "--out"),
    ("profile --threads 0", "--threads"),
    ("demo --out {file}", "--out"),
    (f"demo --seed {HUGE_SEED} --out {{tmp}}/demo", "--seed"),
    ("experiment acceptance {tmp}/run --eps -1", "--eps"),
    ("experiment acceptance {tmp}/run --texts 0", "--texts"),
    ("experiment acceptance {tmp}/run --datasets file:/nonexistent/texts.txt", "--datasets"),
    ("experiment acceptance {file}", "RUN_DIR"),
    ("experiment acceptance {tmp}/run --draft {file}", "--draft"),
    (f"experiment acceptance {{tmp}}/run --seed {HUGE_SEED}", "--seed"),
    ("experiment temperature {tmp}/run --draft-temperatures 1e-40", "--draft-temperatures"),
    (f"experiment paper {{tmp}}/run --seed {HUGE_SEED}", "--seed"),
    (f"compare --seed {HUGE_SEED}", "--seed"),
    ("experiment blocks {tmp}/run --temperature 1e-40", "--temperature"),
    ("bound --p {file} --q {file} --logits --temperature 1e-40", "--temperature"),
    ("bound --p {file} --q {file} --logits --draft-temperature 1e-40", "--draft-temperature"),
]


def test_bound_logits_at_tiny_and_zero_temperature(tmp_path, capsys):
    """bound --logits goes through sampling.process_logits: the smallest allowed temperature gives a
    finite law (its alpha* printed), temperature 0 the one-hot greedy law; never a NaN row."""
    import json

    import numpy as np

    from multidraft._validate import MIN_TEMPERATURE

    p, q = tmp_path / "p.npy", tmp_path / "q.npy"
    np.save(p, np.array([3.0, 1.0, -2.0, 0.5]))
    np.save(q, np.array([2.5, 2.0, -1.0, 0.0]))
    for t in (MIN_TEMPERATURE, 0.0):
        rc = cli.main(["bound", "--p", str(p), "--q", str(q), "--logits", "--temperature", str(t), "--k", "1,2",
                       "--laws", "iid", "--json"])
        out = capsys.readouterr().out
        assert rc == 0 and "nan" not in out.lower(), out
        rows = json.loads(out)["rows"]
        # p and q are (numerically) one-hot on token 0: alpha* = 1 at K = 1 and 2
        assert [(r["K"], r["acceptance"]) for r in rows] == [(1, 1.0), (2, 1.0)], rows


@pytest.mark.parametrize("command,flag", CASES, ids=[c[:80] for c, _ in CASES])
def test_one_line_naming_the_flag_no_model(command, flag, no_models, paths, capsys):
    argv = command.format(**paths).split()
    rc, lines = _run(argv, capsys)
    assert rc not in (0, None), (rc, lines)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"multidraft {argv[0]}: error: "), lines
    assert flag in lines[0], lines
    assert "Traceback" not in lines[0]
    assert no_models == []


# argparse's own errors: one line, ``multidraft <cmd>: error: ...``, exit 2 (not the usage block)
ARGPARSE = [
    ("decode", "--prompt"), ("decode --prompt x --depth x", "--depth"), ("compare --kk 3", "--kk"),
    ("bound", "--p"), ("bound --p", "--p"), ("experiment blocks", "RUN_DIR"), ("experiment nosuch", "nosuch"),
    ("profile --engine foo", "--engine"), ("nosuch", "nosuch"), ("demo --prompts two", "--prompts"),
    ("decode --prompt x --dtype float8", "--dtype"), ("experiment acceptance {tmp}/r --texts x", "--texts"),
    ("compare --samples 1e3", "--samples"), ("report", "RUN_DIR"),
]


@pytest.mark.parametrize("command,needle", ARGPARSE, ids=[c for c, _ in ARGPARSE])
def test_argparse_errors_are_one_line(command, needle, no_models, paths, capsys):
    argv = command.format(**paths).split()
    rc, lines = _run(argv, capsys)
    assert rc == 2, (rc, lines)
    assert len(lines) == 1, lines
    assert lines[0].startswith("multidraft") and ": error: " in lines[0], lines
    assert needle in lines[0], lines
    assert no_models == []


# --------------------------------------------------------------------------------------
# the bounds themselves, from the library
# --------------------------------------------------------------------------------------
def test_ranges_are_bounded_before_they_are_expanded():
    with _guard(30):
        with pytest.raises(ValueError, match=r"at most 4,096 values.*1,000,000,000"):
            _args.int_list("1-1000000000", "k")
        with pytest.raises(ValueError, match=r"<= 64"):
            _args.int_list("1,2,1-10000000000000000000", "nodes", hi=64)
        with pytest.raises(ValueError, match=r"at most 10 values"):
            _args.int_list("1-6,20-25", "k", max_values=10)
    assert _args.int_list("3,1-4,2", "k") == [1, 2, 3, 4]
    assert _args.k_list("1-4096") == list(range(1, 4097))


def test_tree_sizes_are_counted_not_built():
    from multidraft.trees import MAX_TREE_NODES, TreeShape, tree_nodes

    assert tree_nodes("full", 2, 3) == 2 + 4 + 8
    assert tree_nodes("full", 4, 16) == MAX_TREE_NODES + 1  # capped: nothing of size 4^16 exists
    assert tree_nodes("full", 10**9, 10**9) == MAX_TREE_NODES + 1
    assert tree_nodes("sequences", 3, 5) == 15
    cap = MAX_TREE_NODES - 1
    # the largest full trees that fit are accepted, one level more is refused
    assert TreeShape.from_args(None, 3, 4).max_nodes() == 1 + 3 + 9 + 27 + 81
    assert TreeShape.from_args(None, 1, cap).max_nodes() == MAX_TREE_NODES
    with pytest.raises(ValueError, match="depth"):
        TreeShape.from_args(None, 1, cap + 1)
    with pytest.raises(ValueError, match="depth"):
        TreeShape.from_args(None, 3, 7)
    with pytest.raises(ValueError, match="depth"):
        TreeShape.from_args(None, 4, 5)  # 1,364 drafted nodes
    assert TreeShape.from_args(None, 4, 4).max_nodes() == 1 + 4 + 16 + 64 + 256
    with pytest.raises(ValueError, match="depth"):
        TreeShape.from_args("sequences", 4, cap // 4 + 1)
    assert TreeShape.from_args("sequences", 3, cap // 3).max_nodes() == 1 + 3 * (cap // 3)


@pytest.mark.parametrize("kw,arg", [(dict(k=3, depth=40), "depth"), (dict(k=4, depth=16), "depth"),
                                    (dict(k=10**9), "k"), (dict(depth=100000), "depth"),
                                    (dict(k=10**9, tree="dynamic"), "k"),
                                    (dict(tree="sequences", k=10**6, depth=10**6), "k")])
def test_generate_settings_refuse_huge_trees_up_front(kw, arg):
    from multidraft.decoding import Settings

    with _guard(30):
        with pytest.raises(ValueError) as ei:
            Settings.from_args(verifier="specinfer", **kw)
    from multidraft.trees import MAX_DYNAMIC_NODES, MAX_TREE_NODES

    limit = (MAX_DYNAMIC_NODES if kw.get("tree") == "dynamic" else MAX_TREE_NODES) - 1
    assert ei.value.arg == arg and f"{limit}" in str(ei.value)


def test_llama_cpp_trees_fit_one_batch(no_models, capsys, monkeypatch, tmp_path):
    """On llama.cpp a step's tree is one batch of at most 255 new entries: refused up front."""
    from multidraft import _optional

    monkeypatch.setattr(_optional, "available", lambda name: True)
    for argv, flag in ((["decode", "--prompt", "hi", "--engine", "llama.cpp", "--k", "4", "--depth", "4"], "--depth"),
                       (["experiment", "blocks", str(tmp_path / "r"), "--engine", "llama.cpp", "--k", "4",
                         "--depths", "4"], "--depths")):
        rc, lines = _run(argv, capsys)
        assert rc == 2 and len(lines) == 1 and flag in lines[0] and "255" in lines[0], lines
    assert no_models == []


def test_generate_refuses_before_touching_the_models():
    import multidraft as md

    class NoModel:
        def __getattr__(self, name):
            raise AssertionError(f"the model was used ({name})")

    with _guard(30):
        with pytest.raises(ValueError, match="depth"):
            md.generate(NoModel(), NoModel(), torch.tensor([[1, 2]]), k=3, depth=40, generator=0)


def test_certify_size_check_does_not_count_huge_tuple_sets():
    import multidraft as md
    from multidraft.limits import tuple_count

    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)
    with _guard(30):
        with pytest.raises(ValueError, match="more than .* per-tuple output laws"):
            md.certify("specinfer", p, md.drafts.iid(q, 10**8))
        assert tuple_count(md.drafts.iid(q, 10**8), cap=1000) == 1001
        assert tuple_count(md.drafts.iid(q, 5), cap=1000) == 3**5
        assert tuple_count(md.drafts.without_replacement(q, 3), cap=5) == 6  # 3! = 6 > 5: capped
        assert tuple_count(md.drafts.without_replacement(q, 3), cap=6) == 6
    # small cases are still exact
    cert = md.certify("specinfer", p, md.drafts.iid(q, 3))
    assert cert.max_abs_error < 1e-12


def test_compare_plan_refuses_monte_carlo_beyond_its_limit():
    from multidraft.experiments import verifier_table as C

    s = C.CompareConfig(ks=(10**8,), laws=("iid",))
    with _guard(30):
        with pytest.raises(ValueError) as ei:
            C.plan(C.builtin_cases(), s)
    assert ei.value.arg == "k" and f"{C.MAX_MC_DRAFT_TOKENS:,}" in str(ei.value)
    s = C.CompareConfig(ks=(50,), laws=("iid",), samples=10)  # 500 draft tokens: fine, and estimated
    pl = C.plan(C.builtin_cases(), s)
    assert pl.n_monte_carlo > 0 and "> 10^100" not in pl.describe(10)
    assert C.estimate_seconds(C.builtin_cases(), s, pl) > 0


def test_long_compare_says_so_and_shows_progress(monkeypatch, capsys):
    """Work estimated over a few seconds is announced with its estimate, then a line per step
    where no bar can be drawn (stderr is not a terminal here)."""
    from multidraft.experiments import verifier_table as C

    monkeypatch.setattr(C, "estimate_seconds", lambda *a, **k: 2400.0)
    rc, lines = _run(["compare", "--k", "9", "--laws", "iid", "--verifiers", "specinfer", "--samples", "50"], capsys)
    assert rc == 0
    assert any("take about 40 min" in line for line in lines), lines
    assert any(line.startswith("compare: step ") and "specinfer" in line for line in lines), lines


# --------------------------------------------------------------------------------------
# temperatures: the smallest one is well-defined, below it refused
# --------------------------------------------------------------------------------------
def test_tiny_temperatures_are_refused_or_exact():
    from multidraft._validate import MIN_TEMPERATURE, as_temperature
    from multidraft.sampling import process_logits

    for bad in (1e-40, 5e-324, MIN_TEMPERATURE / 2):
        with pytest.raises(ValueError, match=r"0 \(greedy\)"):
            as_temperature(bad)
    assert as_temperature(0) == 0.0 and as_temperature(MIN_TEMPERATURE) == MIN_TEMPERATURE
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 151_936, generator=g) * 30  # [R, V], a realistic range and then some
    logits[:8] *= 1e5  # |logits| up to ~1e7
    for t in (MIN_TEMPERATURE, 1e-20, 1e-8, 1e-4):
        for dtype in (torch.float32, torch.float64):
            p = process_logits(logits, t, dtype=dtype)
            assert bool(torch.isfinite(p).all())
            assert torch.equal(p, process_logits(logits, 0, dtype=dtype))  # distinct maxima: exactly greedy
    tied = torch.tensor([[1.0, 3.0, 3.0, -2.0]])
    p = process_logits(tied, MIN_TEMPERATURE)
    assert torch.equal(p, torch.tensor([[0.0, 0.5, 0.5, 0.0]]))  # the T -> 0 limit: uniform on the ties


def test_small_temperatures_keep_the_law():
    """The max shift used below 1e-3 changes no law beyond rounding (softmax is shift-invariant)."""
    from multidraft.sampling import process_logits

    x = torch.randn(4, 1000, generator=torch.Generator().manual_seed(1)) * 0.001
    for t in (9e-4, 1e-4):
        ref = torch.softmax(x.double() / t, -1)
        assert torch.allclose(process_logits(x, t, dtype=torch.float64), ref, atol=1e-12, rtol=0)


# --------------------------------------------------------------------------------------
# output paths, --quiet, Ctrl-C inside a C extension's import
# --------------------------------------------------------------------------------------
def test_read_only_output_is_refused_before_the_work(tmp_path, no_models, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    ro.chmod(0o500)
    try:
        try:  # root writes anyway: then there is nothing to refuse
            (ro / "probe").write_text("x")
        except OSError:
            pass
        else:
            pytest.skip("this user can write in a read-only directory (root)")
        for argv in (["profile", "--out", str(ro / "p.json")], ["demo", "--out", str(ro / "demo")],
                     ["decode", "--prompt", "hi", "--out", str(ro / "d.json")],
                     ["experiment", "blocks", str(ro / "run")]):
            rc, lines = _run(argv, capsys)
            assert rc == 2 and len(lines) == 1, (argv, lines)
            assert ("--out" in lines[0] or "RUN_DIR" in lines[0]) and str(ro) in lines[0], lines
        assert no_models == []
    finally:
        ro.chmod(0o700)


def test_unwritable_output_is_refused_before_the_work(tmp_path, no_models, capsys, monkeypatch):
    """The same refusal wherever this user cannot create a file (here simulated for root, who
    can write in a read-only directory): the probe's error, one line, before any model loads."""

    def denied(*a, **kw):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(_args.tempfile, "NamedTemporaryFile", denied)
    for argv, flag in ((["profile", "--out", str(tmp_path / "p.json")], "--out"),
                       (["demo", "--out", str(tmp_path / "demo")], "--out"),
                       (["decode", "--prompt", "hi", "--out", str(tmp_path / "d.json")], "--out"),
                       (["experiment", "blocks", str(tmp_path / "run")], "RUN_DIR"),
                       (["experiment", "acceptance", str(tmp_path / "run")], "RUN_DIR")):
        rc, lines = _run(argv, capsys)
        assert rc == 2 and len(lines) == 1, (argv, lines)
        assert lines[0].endswith(f"{flag}: cannot write in {tmp_path}: Permission denied"), lines
    assert no_models == []


def test_out_helpers(tmp_path):
    f = tmp_path / "f"
    f.write_text("")
    assert _args.check_out_file(None) is None
    assert _args.check_out_file(str(tmp_path / "new.json")) == tmp_path / "new.json"
    assert _args.check_out_dir(str(tmp_path / "a" / "b")) == tmp_path / "a" / "b"
    assert not (tmp_path / "a").exists()  # checked, not created
    with pytest.raises(ValueError, match="--out: .* is a directory"):
        _args.check_out_file(str(tmp_path))
    with pytest.raises(ValueError, match="not a directory"):
        _args.check_out_dir(str(f / "sub"))
    assert sorted(os.listdir(tmp_path)) == ["f"]  # the probes leave nothing behind


def test_quiet_silences_loading_bars(monkeypatch):
    """--quiet: transformers' "Loading checkpoint shards" bar and the hub's bars are off."""
    tf_logging = pytest.importorskip("transformers.utils.logging")
    hub_utils = pytest.importorskip("huggingface_hub.utils")
    for var in ("TQDM_DISABLE", "HF_HUB_DISABLE_PROGRESS_BARS"):
        monkeypatch.setenv(var, "0")  # restored after the test
    was = tf_logging.is_progress_bar_enabled()
    try:
        _args.quiet_loading()
        assert not tf_logging.is_progress_bar_enabled()
        assert hub_utils.are_progress_bars_disabled()
        assert os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] == "1"
    finally:
        hub_utils.enable_progress_bars()
        if was:
            tf_logging.enable_progress_bar()


def test_interrupt_inside_a_c_extension_import_is_an_interrupt(monkeypatch, capsys):
    """numpy turns a KeyboardInterrupt inside its C extension's import into an ImportError
    ("bad install"); main() recognises it down the chain: the one line, 130."""
    # Python's own SIGINT handler, as in a foreground run (a shell without job control starts a
    # background job with SIGINT ignored, and then no interrupt can reach the process at all)
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _interrupt_inside_import(monkeypatch, capsys)
    finally:
        signal.signal(signal.SIGINT, previous)


def _interrupt_inside_import(monkeypatch, capsys):
    def interrupted_import():
        try:
            raise KeyboardInterrupt
        except KeyboardInterrupt as exc:
            raise ImportError("Importing the numpy C-extensions failed ... bad install") from exc

    monkeypatch.setattr(cli, "build_parser", interrupted_import)
    assert cli.main(["compare"]) == 130
    assert capsys.readouterr().err.strip() == "multidraft: interrupted"
    def unchained():  # the C extension replaced the KeyboardInterrupt: only the signal tells
        try:
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(5)
        except KeyboardInterrupt:
            pass
        raise ImportError("Importing the numpy C-extensions failed ... bad install")

    monkeypatch.setattr(cli, "build_parser", unchained)
    assert cli.main(["compare"]) == 130
    assert capsys.readouterr().err.strip() == "multidraft: interrupted"
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # restored
    monkeypatch.setattr(cli, "build_parser", lambda: (_ for _ in ()).throw(ImportError("a real one")))
    with pytest.raises(ImportError, match="a real one"):
        cli.main(["compare"])


def test_guard_fires():
    """The guard this module relies on does fire (so a hang is a failure, not a stuck run)."""
    t0 = time.monotonic()
    with pytest.raises(Hung):
        with _guard(1):
            while time.monotonic() - t0 < 30:
                math.sqrt(2.0)


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.03, 0.05, 0.08, 0.12, 0.2, 0.3, 0.45])
def test_early_ctrl_c_never_reports_a_bad_install(delay):
    """SIGINT while the interpreter imports numpy and torch: never numpy's "bad install"
    ImportError (an interrupt inside a C extension's import is reported as an interrupt).
    Before the command line's own code runs (the first tens of ms) Python itself reports the
    KeyboardInterrupt; nothing here can change that, so only the ImportError is asserted on."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "multidraft", "compare", "--k", "1,2,3,4,5"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_sigint_default)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=GUARD_S)
    assert "bad install" not in err and "ImportError" not in err, err
