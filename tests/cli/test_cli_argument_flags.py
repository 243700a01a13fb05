"""Bad arguments on the command line: one line naming the flag, exit 2, no model loaded.

The library raises ``ArgumentError`` with the argument's name; ``cli.main`` restates it with
the flag from ONE table (``cli.ARG_FLAGS`` / ``cli.MODE_FLAGS``). These tests go through
``main`` with the model loader replaced by one that fails the test if called.
"""
from __future__ import annotations

import argparse
import json

import pytest
from conftest import ModelLoaded

from multidraft import cli, models
from multidraft.cli import main






def _one_line(capsys, prog: str, flag: str) -> str:
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith(f"{prog}: error: {flag}"), lines[0]
    return lines[0]


DECODE = ["decode", "--prompt", "x", "--quiet"]


@pytest.mark.parametrize("extra,flag", [
    (["--k", "0"], "--k"),
    (["--k", "x"], "--k"),
    (["--depth", "0"], "--depth"),
    (["--draft-law", "bogus"], "--draft-law"),
    (["--verifier", "rrs_wor", "--draft-law", "iid"], "--draft-law"),
    (["--verifier", "bogus"], "--verifier"),
    (["--temperature", "-2"], "--temperature"),
    (["--draft-temperature", "-1"], "--draft-temperature"),
    (["--draft-temperature", "1,2,3"], "--draft-temperature"),
    (["--top-k", "0"], "--top-k"),
    (["--top-p", "1.5"], "--top-p"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--tree", "[[1]]"], "--tree"),
    (["--tree", "bushy"], "--tree"),
    # --tree dynamic: the caps come from --k-max and --max-depth (cli.MODE_FLAGS)
    (["--tree", "dynamic", "--k-max", "0"], "--k-max"),
    (["--tree", "dynamic", "--verifier", "spechub", "--k-max", "3"], "--k-max"),
    (["--tree", "dynamic", "--max-nodes", "1"], "--max-nodes"),
    (["--tree", "dynamic", "--min-gain", "2"], "--min-gain"),
])
def test_bad_decode_argument_names_its_flag(no_models, capsys, extra, flag):
    assert main(DECODE + extra) == 2
    _one_line(capsys, "multidraft decode", flag)
    assert no_models == []


@pytest.mark.parametrize("command,extra,flag", [
    ("acceptance", ["--k", "0"], "--k"),
    ("acceptance", ["--k", "2-1"], "--k"),
    ("acceptance", ["--laws", "bogus"], "--laws"),
    ("acceptance", ["--verifiers", "nope"], "--verifiers"),
    ("acceptance", ["--datasets", "nope"], "--datasets"),
    ("acceptance", ["--draws", "1"], "--draws"),
    ("acceptance", ["--eval-support", "1"], "--eval-support"),
    ("acceptance", ["--top-p", "2"], "--top-p"),
    ("acceptance", ["--top-k", "0"], "--top-k"),
    ("acceptance", ["--texts", "0"], "--texts"),
    ("acceptance", ["--draft-temperature", "0"], "--draft-temperature"),
    ("acceptance", ["--target-temperature", "-1"], "--target-temperature"),
    ("temperature", ["--draft-temperatures", "0.5,0"], "--draft-temperatures"),
    ("temperature", ["--target-temperatures", "x"], "--target-temperatures"),
    ("temperature", ["--fixed-draft-temperature", "0"], "--fixed-draft-temperature"),
    ("temperature", ["--k", "0"], "--k"),
    ("blocks", ["--k", "0"], "--k"),
    ("blocks", ["--laws", "bogus"], "--laws"),
    ("blocks", ["--verifiers", "nope"], "--verifiers"),
    ("blocks", ["--depths", "0"], "--depths"),
    # every field of experiments.blocks.BlocksConfig, refused by the config (validated once) with its flag
    ("blocks", ["--budget", "1", "--k", "1,2"], "--budget"),
    ("blocks", ["--budget", "0", "--k", "1"], "--budget"),
    ("blocks", ["--budget", "4", "--depths", "2"], "--budget"),
    ("blocks", ["--prompts", "0"], "--prompts"),
    ("blocks", ["--max-new-tokens", "0"], "--max-new-tokens"),
    ("blocks", ["--max-prompt-tokens", "0"], "--max-prompt-tokens"),
    ("blocks", ["--temperature", "-1"], "--temperature"),
    ("blocks", ["--draft-temperature", "-1"], "--draft-temperature"),
    ("blocks", ["--top-k", "0"], "--top-k"),
    ("blocks", ["--top-p", "2"], "--top-p"),
    ("blocks", ["--verifiers", "specinfer", "--laws", "greedy", "--k", "2"], "--laws"),
])
def test_bad_experiment_argument_names_its_flag(no_models, capsys, tmp_path, command, extra, flag):
    assert main(["experiment", command, str(tmp_path / "run"), "--no-progress", *extra]) == 2
    _one_line(capsys, "multidraft experiment", flag)
    assert no_models == []
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize("argv,flag", [
    (["compare", "--k", "0"], "--k"),
    (["compare", "--laws", "independent"], "--laws"),
    (["compare", "--verifiers", "nope"], "--verifiers"),
    (["compare", "--samples", "0"], "--samples"),
    (["bound", "--p", "p.npy", "--q", "q.npy", "--k", "0"], "--k"),
    (["bound", "--p", "p.npy", "--q", "q.npy", "--laws", "bogus"], "--laws"),
])
def test_bad_math_command_argument_names_its_flag(capsys, argv, flag):
    assert main(argv) == 2
    _one_line(capsys, f"multidraft {argv[0]}", flag)


def _options(parser: argparse.ArgumentParser) -> set[str]:
    out = set(parser._option_string_actions)
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                out |= _options(sub)
    return out


def test_every_flag_of_the_table_exists():
    flags = _options(cli.build_parser())
    table = set(cli.ARG_FLAGS.values()) | {f for m in cli.MODE_FLAGS.values() for f in m.values()}
    assert table - flags == set()
    assert cli.flag_for("k") == "--k" and cli.flag_for("k", "decode", "dynamic") == "--k-max"
    assert cli.flag_for("n_texts") == "--texts" and cli.flag_for("some_arg") == "--some-arg"
    assert cli.flag_for("--already-a-flag") == "--already-a-flag"


def test_decode_builds_its_settings_once(monkeypatch, capsys):
    pytest.importorskip("transformers")
    import tiny_models as tm

    from multidraft.decoding import Settings

    t, d = tm.tiny_pair(vocab_size=32, seed=4)
    monkeypatch.setattr(models, "resolve_pair", lambda *a, **kw: (t, d, tm.tiny_tokenizer()))
    made = []
    real = Settings.from_args.__func__
    monkeypatch.setattr(Settings, "from_args", classmethod(lambda cls, **kw: made.append(kw) or real(cls, **kw)))
    argv = ["decode", "--prompt", "hellothere", "--quiet", "--ignore-eos", "--max-new-tokens", "5", "--verifier", "nss",
            "--k", "2", "--depth", "2", "--seed", "3", "--json"]
    assert main(argv) == 0
    obj = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert len(made) == 1 and obj["new_tokens"] == 5
    # the tokens are those of the library call with the same settings
    import multidraft as md

    ids = tm.tiny_tokenizer()("hellothere", return_tensors="pt")["input_ids"]
    ref = md.generate(t, d, ids, verifier="nss", k=2, depth=2, max_new_tokens=5, generator=3)
    assert obj["tokens"] == ref.tokens.tolist()


def test_experiment_validates_k_and_laws_once(monkeypatch, tmp_path):
    """K is checked once under the name k and the law string parsed once, before the models."""
    from multidraft import drafts
    from multidraft.experiments import acceptance

    ks, laws = [], []
    real_ks, real_laws = acceptance.as_ks, drafts.parse_laws
    monkeypatch.setattr(acceptance, "as_ks", lambda *a, **kw: ks.append(a) or real_ks(*a, **kw))
    monkeypatch.setattr(drafts, "parse_laws", lambda *a, **kw: laws.append(a) or real_laws(*a, **kw))

    def boom(*a, **kw):
        raise ModelLoaded("models")

    monkeypatch.setattr(models, "resolve_pair", boom)
    f = tmp_path / "t.txt"
    f.write_text("in the beginning\n", encoding="utf-8")
    with pytest.raises(ModelLoaded):
        main(["experiment", "acceptance", str(tmp_path / "run"), "--datasets", f"file:{f}", "--k", "1-3",
              "--laws", "iid,wor", "--no-progress"])
    assert len(ks) == 1 and ks[0][1] == "k"
    assert len(laws) == 1


def test_blocks_config_names_each_bad_field_once(monkeypatch):
    """Each bad field of BlocksConfig is one ArgumentError naming it, raised when the config is
    made (never later); its flag, through the CLI's one table, is a flag of the blocks subcommand."""
    from multidraft._errors import ArgumentError
    from multidraft.experiments import blocks

    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices["experiment"]
    blocks_flags = _options(next(a for a in sub._actions if isinstance(a, argparse._SubParsersAction)).choices["blocks"])
    cases = [({"ks": (0,)}, "k"), ({"verifiers": ("nope",)}, "verifiers"), ({"laws": ("bogus",)}, "laws"),
             ({"depths": (0,)}, "depths"), ({"budget": 1, "ks": (1, 2)}, "budget"), ({"budget": 4, "depths": (2,)}, "budget"),
             ({"n_prompts": 0}, "n_prompts"), ({"max_new_tokens": 0}, "max_new_tokens"),
             ({"max_prompt_tokens": 0}, "max_prompt_tokens"), ({"temperature": -1.0}, "temperature"),
             ({"draft_temperature": 1e-40}, "draft_temperature"), ({"top_k": 0}, "top_k"), ({"top_p": 0.0}, "top_p"),
             ({"baseline": "yes"}, "baseline"), ({"engine": "vllm"}, "engine"),
             ({"verifiers": ("specinfer",), "laws": ("greedy",), "ks": (2,)}, "laws"),
             ({"engine": "llama.cpp", "ks": (4,), "depths": (4,), "verifiers": ("specinfer",)}, "depths")]
    for kw, arg in cases:
        with pytest.raises(ArgumentError) as ei:
            blocks.BlocksConfig(**kw)
        assert ei.value.arg == arg, (kw, ei.value)
        assert cli.flag_for(arg, "experiment", "blocks") in blocks_flags, arg
    with pytest.raises(ArgumentError) as ei:
        blocks.BlocksConfig(dataset="nope")  # no flag (the paper study's field): named all the same
    assert ei.value.arg == "dataset"


def test_frozen_configs_cannot_be_changed(tmp_path):
    import dataclasses

    from multidraft.experiments.blocks import BlocksConfig
    from multidraft.experiments.demo import DemoConfig

    for cfg, field, value in ((BlocksConfig(verifiers=("specinfer",), ks=(2,)), "ks", (0,)),
                              (DemoConfig(out_dir=str(tmp_path)), "depth", 0)):
        before = getattr(cfg, field)
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(cfg, field, value)
        with pytest.raises(dataclasses.FrozenInstanceError):
            cfg.methods = ()  # nor its methods, planned and checked once
        assert getattr(cfg, field) == before != value
        with pytest.raises(ValueError):  # a variant is a new config, validated again
            dataclasses.replace(cfg, **{field: value})


@pytest.mark.parametrize("extra,flag", [
    (["--k", "1"], "--k"),                    # the SD row is K = 1: multi-draft rows need K >= 2
    (["--prompts", "0"], "--prompts"),
    (["--max-new-tokens", "0"], "--max-new-tokens"),
    (["--temperature", "-1"], "--temperature"),
    (["--time-budget", "-5"], "--time-budget"),
    (["--verifiers", "nope"], "--verifiers"),
])
def test_bad_demo_argument_names_its_flag(no_models, capsys, tmp_path, extra, flag):
    """DemoConfig validates once, when made: a bad field is one line naming its flag, exit 2, no model."""
    assert main(["demo", "--out", str(tmp_path / "demo"), "--no-progress", *extra]) == 2
    _one_line(capsys, "multidraft demo", flag)
    assert no_models == []
