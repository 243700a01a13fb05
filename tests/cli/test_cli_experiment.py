"""`multidraft experiment` through multidraft.cli.main: binding, resume, one-line errors, Ctrl-C."""
from __future__ import annotations

import pytest

from multidraft import cli
from multidraft.cli import main
from multidraft.experiments import acceptance, records
from multidraft.experiments.records import read_jsonl


@pytest.fixture
def tiny(tiny_resolved):
    return tiny_resolved


@pytest.fixture
def textfile(corpus_file):
    return corpus_file


def _argv(run_dir, textfile, *extra):
    return ["experiment", "acceptance", str(run_dir), "--datasets", f"file:{textfile}", "--texts", "2",
            "--positions-per-text", "2", "--k", "1-2", "--draws", "20", "--verifiers", "naive,nss", "--no-progress", *extra]


def _one_line_error(capsys, *needles):
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    for n in needles:
        assert n in err, err
    return err


def _key(r):
    return tuple(r[f] for f in acceptance.KEY)


def test_changed_config_resume_refused_and_k_extends(tiny, textfile, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(_argv(run, textfile)) == 0
    _, rows = read_jsonl(run / "acceptance.jsonl")
    capsys.readouterr()
    assert main(_argv(run, textfile, "--draws", "30", "--eval-support", "8")) == 2
    _one_line_error(capsys, "draws 20 -> 30", "eval_support null -> 8", "acceptance.jsonl")
    assert tiny == [1]  # refused before the models were loaded (stores exist: never loaded again)
    assert read_jsonl(run / "acceptance.jsonl")[1] == rows  # nothing appended
    # another verifier (a keyed option: rows carry it): the run is extended, nothing recomputed or duplicated
    argv = _argv(run, textfile)
    argv[argv.index("--verifiers") + 1] = "naive,nss,specinfer"
    assert main(argv) == 0
    _, more = read_jsonl(run / "acceptance.jsonl")
    assert more[: len(rows)] == rows and {r["verifier"] for r in more[len(rows):]} == {"specinfer"}
    assert len({_key(r) for r in more}) == len(more)
    # a K beyond what the stores were collected for extends the run too: the stores are collected
    # again for K <= 3 (the models load once more), the old rows are kept, only K = 3 is new
    argv[argv.index("--k") + 1] = "1-3"
    capsys.readouterr()
    assert main(argv) == 0
    assert tiny == [1, 1]
    _, most = read_jsonl(run / "acceptance.jsonl")
    assert most[: len(more)] == more and {r["K"] for r in most[len(more):]} == {3}
    assert len({_key(r) for r in most}) == len(most)


def test_kill_and_resume_through_the_cli(tiny, textfile, tmp_path, capsys, monkeypatch):
    assert main(_argv(tmp_path / "ref", textfile)) == 0
    _, ref = read_jsonl(tmp_path / "ref" / "acceptance.jsonl")
    real, calls = acceptance.verifier_acceptance, []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(acceptance, "verifier_acceptance", interrupted)
    run = tmp_path / "run"
    capsys.readouterr()
    assert main(_argv(run, textfile)) == 130
    assert capsys.readouterr().err.strip().splitlines()[-1] == "multidraft experiment: interrupted"
    _, partial = read_jsonl(run / "acceptance.jsonl")
    assert 0 < len(partial) < len(ref)
    monkeypatch.setattr(acceptance, "verifier_acceptance", real)
    assert main(_argv(run, textfile)) == 0
    _, rows = read_jsonl(run / "acceptance.jsonl")
    assert rows[: len(partial)] == partial
    assert sorted(map(_key, rows)) == sorted(map(_key, ref)) and len(set(map(_key, rows))) == len(rows)
    assert [r["acceptance"] for r in sorted(rows, key=_key)] == [r["acceptance"] for r in sorted(ref, key=_key)]


def test_run_dir_errors_are_one_line(tiny, textfile, tmp_path, capsys, monkeypatch):
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert main(_argv(afile, textfile)) == 2
    _one_line_error(capsys, str(afile), "is a file")
    # a read-only run directory (simulated: the tests may run as root, where chmod does not bind)
    ro = tmp_path / "ro"
    ro.mkdir()
    real_access = records.os.access
    monkeypatch.setattr(records.os, "access", lambda p, m: False if str(p) == str(ro) else real_access(p, m))
    assert main(_argv(ro, textfile)) == 2
    _one_line_error(capsys, str(ro), "not writable")
    assert tiny == []  # no model was loaded for either


def test_ctrl_c_during_start_up_and_model_loading(tiny, textfile, tmp_path, capsys, monkeypatch):
    import multidraft.models as dm

    def ctrl_c(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(dm, "resolve_pair", ctrl_c)
    assert main(_argv(tmp_path / "r", textfile)) == 130
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.strip().splitlines()[-1] == "multidraft experiment: interrupted"
    monkeypatch.setattr(cli, "build_parser", ctrl_c)  # during the imports of the subcommands
    assert main(["compare"]) == 130
    assert capsys.readouterr().err.strip() == "multidraft: interrupted"


def test_bad_k_is_one_line(tmp_path, capsys):
    assert main(["experiment", "acceptance", str(tmp_path), "--k", "abc"]) == 2
    _one_line_error(capsys, "--k")


def test_temperature_sweep_through_the_cli(tiny, textfile, tmp_path, capsys):
    argv = ["experiment", "temperature", str(tmp_path), "--datasets", f"file:{textfile}", "--texts", "2",
            "--positions-per-text", "2", "--k", "2", "--draws", "10", "--verifiers", "naive,specinfer", "--laws", "iid",
            "--draft-temperatures", "0.5,1", "--target-temperatures", "0.7", "--no-progress"]
    assert main(argv) == 0
    assert "temperature sweep" in capsys.readouterr().out
    meta, rows = read_jsonl(tmp_path / "temperature.jsonl")
    assert meta["config"]["temperatures"] == [[1.0, 0.5], [1.0, 1.0], [0.7, 1.0]]
    assert {(r["t_target"], r["t_draft"]) for r in rows} == {(1.0, 0.5), (1.0, 1.0), (0.7, 1.0)}
    assert all(r["K"] == 2 and "acceptance" in r and "mean" not in r for r in rows)
    # one more draft temperature extends the run (temperatures are keyed), nothing duplicated
    argv[argv.index("--draft-temperatures") + 1] = "0.5,1,1.5"
    assert main(argv) == 0
    _, more = read_jsonl(tmp_path / "temperature.jsonl")
    assert more[: len(rows)] == rows and {r["t_draft"] for r in more[len(rows):]} == {1.5}
    assert tiny == [1, 1]  # the models were loaded again only for the new store


def test_acceptance_cli_continuation_and_independent_law(tiny, textfile, tmp_path, capsys):
    run = tmp_path / "cont"
    argv = ["experiment", "acceptance", str(run), "--datasets", f"file:{textfile}", "--texts", "2", "--new-tokens", "6",
            "--k", "1-2", "--draws", "8", "--verifiers", "specinfer,nss", "--laws", "iid,independent",
            "--independent-temperatures", "1,0.5", "--no-progress"]
    assert main(argv) == 0
    meta, rows = read_jsonl(run / "acceptance.jsonl")
    assert meta["config"]["positions"] == {"positions_from": "continuation", "new_tokens": 6, "sample_temperature": 1.0,
                                           "independent_temperatures": [1.0, 0.5]}
    assert {(r["law"], r["K"], r["verifier"]) for r in rows} >= {("independent", 2, "specinfer"), ("independent", 2, "alpha*")}
    assert all(r["n_positions"] <= 12 for r in rows)  # two prompts x at most 6 continuation positions
    capsys.readouterr()
    assert main(argv[:-3] + ["--no-progress"]) == 2  # --laws independent without its temperatures
    _one_line_error(capsys, "--independent-temperatures")
    assert main(argv + ["--positions-from", "teacher-forcing", "--min-positions", "5"]) == 2
    _one_line_error(capsys, "--min-positions needs --positions-from continuation")


def test_paper_cli_quick_runs_every_stage_and_writes_the_report(tiny, tmp_path, capsys, monkeypatch):
    from dataclasses import replace

    from multidraft.experiments import paper

    f = tmp_path / "p.txt"
    f.write_text("in the beginning\n\nand the earth was\n\ndef add(a, b):\n", encoding="utf-8")
    monkeypatch.setattr(paper, "QUICK", replace(paper.QUICK, datasets=(f"file:{f}",), min_positions=20,
                                                block_dataset=f"file:{f}", block_prompts=1))
    run = tmp_path / "paper"
    assert main(["experiment", "paper", str(run), "--quick", "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert all(s in out for s in paper.STAGES) and "report:" in out
    assert (run / "report.md").exists() and (run / "stages.jsonl").exists()
    assert main(["experiment", "paper", str(run), "--quick", "--stages", "collect,nope", "--no-progress"]) == 2
    _one_line_error(capsys, "unknown", "nope")


# experiment realtrees / seqrules (issue 38: the module mains moved here) ------------------------
@pytest.mark.parametrize("argv,needles", [
    (["realtrees", "run", "--dataset", "humaneval", "--out", "OUT", "--bogus"], ["unrecognized arguments: --bogus"]),
    (["realtrees", "run", "--dataset", "nope", "--out", "OUT"], ["--dataset", "nope"]),
    (["realtrees", "run", "--dataset", "file:/no/such/prompts.txt", "--out", "OUT"], ["--dataset", "no such file"]),
    (["realtrees", "run", "--dataset", "humaneval", "--out", "OUT", "--shapes", "chain,star"], ["--shapes", "'star'"]),
    (["realtrees", "run", "--dataset", "humaneval", "--out", "OUT", "--shapes", "seq4", "--budgets", "6"],
     ["--budgets: seq4 needs a multiple of 4 nodes, got 6"]),
    (["realtrees", "run", "--dataset", "humaneval", "--out", "OUT", "--stride", "0"], ["--stride must be >= 1"]),
    (["realtrees", "run", "--dataset", "humaneval", "--out", "OUT", "--minutes", "0"], ["--minutes"]),
    (["realtrees", "run", "--dataset", "humaneval", "--out", "TMP"], ["--out", "is a directory"]),
    (["realtrees", "run", "--dataset", "humaneval"], ["--out"]),
    (["realtrees", "report", "/no/such/rows.jsonl"], ["/no/such/rows.jsonl", "no such file"]),
    (["seqrules", "TMP"], ["give --grid, --report, --root, or one cell"]),
    (["seqrules", "TMP", "--grid", "--bogus"], ["unrecognized arguments: --bogus"]),
    (["seqrules", "TMP", "--law", "chain", "--k", "2"], ["--k: a chain has one draft per node"]),
    (["seqrules", "TMP", "--grid", "--k", "3"], ["--k describes one cell: give --law too"]),
    (["seqrules", "TMP", "--law", "kary", "--vocab", "1"], ["--vocab must be >= 2"]),
    (["seqrules", "TMP", "--grid", "--rules", "univer_lp"], ["--rules: unknown sequence-level rule 'univer_lp'"]),
    (["seqrules", "TMP/none", "--report"], ["RUN_DIR", "does not exist"]),
    (["seqrules"], ["RUN_DIR"]),
])
def test_realtrees_and_seqrules_flags_are_checked_up_front(no_models, tmp_path, capsys, argv, needles):
    argv = [str(tmp_path / "rows.jsonl") if x == "OUT" else x.replace("TMP", str(tmp_path)) for x in argv]
    try:
        rc = main(["experiment", *argv])
    except SystemExit as exc:  # argparse's own errors (a missing required flag) exit from the parser
        rc = exc.code
    assert rc == 2
    _one_line_error(capsys, *needles)
    assert no_models == [] and list(tmp_path.iterdir()) == []


def test_realtrees_writes_where_told_and_as_the_runner_does(tiny_sharp, prompt_file, tmp_path, capsys, monkeypatch,
                                                            one_thread):
    from multidraft.decoding import pair
    from multidraft.experiments import realtrees

    t, d, tok = tiny_sharp
    monkeypatch.setattr(pair, "load_pair", lambda *a, **kw: (t, d, tok))
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "new" / "dir" / "rows.jsonl"
    argv = ["experiment", "realtrees", "run", "--dataset", f"file:{prompt_file}", "-n", "1", "--seed", "3",
            "--cont-tokens", "6", "--stride", "3", "--shapes", "chain,seq2", "--budgets", "4"]
    assert main([*argv, "--out", str(out)]) == 0
    assert "new trees" in capsys.readouterr().out
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file()) == \
        ["new/dir/rows.jsonl", prompt_file.name]
    ref = tmp_path / "ref.jsonl"
    realtrees.run(t, d, tok, dataset=f"file:{prompt_file}", n=1, out=ref, seed=3, cont_tokens=6, stride=3,
                  shapes=["chain", "seq2"], budgets=[4], model_names={})
    rows = lambda p: {tuple(r.get(k) for k in realtrees.KEY): r["tokens"] for r in read_jsonl(p)[1]}  # noqa: E731
    got, want = rows(out), rows(ref)
    assert got == want and sum(k[0] == "tree" for k in got) == 4
    md = tmp_path / "table.md"
    assert main(["experiment", "realtrees", "report", str(out), "--markdown", str(md)]) == 0
    assert md.read_text() == realtrees.report([out]) and "chain, budget 4" in md.read_text()


def test_seqrules_writes_in_run_dir_only(tmp_path, capsys, monkeypatch):
    from multidraft.experiments import seqrules

    monkeypatch.setattr(seqrules, "GRID", (("chain", 1, 2, 2),))
    monkeypatch.chdir(tmp_path)
    run = tmp_path / "runs" / "seq"
    assert main(["experiment", "seqrules", str(run), "--grid", "-n", "2", "--report"]) == 0
    assert sorted(p.name for p in run.iterdir()) == ["chain_k1_l2_v2.jsonl", "table.md"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]        # nothing in docs/ or elsewhere
    ref = tmp_path / "ref"
    from multidraft.trees import rule_table

    # the command's default rules, as the module's main had them: every registered one and the variants
    seqrules.run_cell("chain", 1, 2, 2, n=2, out_dir=ref, rules=rule_table.sequence_rules() + list(rule_table.VARIANTS),
                      show_progress=False)
    strip = lambda rows: [{k: v for k, v in r.items() if k != "seconds"} for r in rows]  # noqa: E731
    assert strip(read_jsonl(run / "chain_k1_l2_v2.jsonl")[1]) == strip(read_jsonl(ref / "chain_k1_l2_v2.jsonl")[1])
    md = tmp_path / "elsewhere.md"
    assert main(["experiment", "seqrules", str(run), "--report", "--markdown", str(md)]) == 0
    assert md.read_text() == (run / "table.md").read_text()


def test_the_realtrees_flags_name_the_study_shapes_and_budgets():
    """cli/experiment.py spells the real-tree study's shapes and budgets for --help without importing
    torch; they are the study's own lists."""
    from multidraft.cli import experiment as cli_experiment
    from multidraft.experiments import realtrees

    assert cli_experiment._SHAPES == realtrees.SHAPES and cli_experiment._BUDGETS == realtrees.BUDGETS
