"""Shared fixtures."""
import os

import pytest
import torch


def pytest_configure(config):
    """Under pytest-xdist (``make test`` runs ``-n 2``) each worker decodes with one torch thread:
    two workers with the default threads each would oversubscribe the 2 cores."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        torch.set_num_threads(1)


@pytest.fixture
def one_thread():
    """Run single-threaded: many small chunked ops, where on a shared 2-core machine intra-op
    threads waiting on each other dominate the time."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def tiny_sharp():
    """(target, draft, tokenizer): the tiny related pair with sharper next-token laws (init_scale 3)."""
    pytest.importorskip("transformers")
    from tiny_models import tiny_pair, tiny_tokenizer

    t, d = tiny_pair(vocab_size=32, seed=0, init_scale=3.0)
    return t, d, tiny_tokenizer()


@pytest.fixture
def prompt_file(tmp_path):
    """A ``file:`` dataset of four short prompts (passages separated by blank lines)."""
    f = tmp_path / "prompts.txt"
    f.write_text("in the beginning god created\n\nand the earth was without form\n\ndef add(a, b):\n\nwhat is the sum of\n",
                 encoding="utf-8")
    return f


class ModelLoaded(Exception):
    """Raised by the ``no_models`` fixture: a model would have been loaded."""


@pytest.fixture
def no_models(monkeypatch):
    """Every way to load a model fails (raises ``ModelLoaded``) and is counted: the list of calls.
    For the tests that every check comes before any model loads."""
    from multidraft import models
    from multidraft.decoding import pair

    calls = []

    def boom(*a, **kw):
        calls.append((a, kw))
        raise ModelLoaded("a model would have been loaded")

    for name in ("resolve_pair", "ensure_default_models"):
        monkeypatch.setattr(models, name, boom)
    monkeypatch.setattr(pair, "load_pair", boom)
    return calls


@pytest.fixture
def tiny_resolved(monkeypatch):
    """The default pair replaced by the tiny pair (V = 32): ``models.resolve_pair`` returns it and
    counts its calls (the list returned)."""
    pytest.importorskip("transformers")
    import multidraft.models as dm
    from tiny_models import tiny_pair, tiny_tokenizer

    t, d = tiny_pair(vocab_size=32, seed=0)
    calls = []
    monkeypatch.setattr(dm, "resolve_pair", lambda *a, **k: calls.append(1) or (t, d, tiny_tokenizer()))
    return calls


@pytest.fixture
def corpus_file(tmp_path):
    """A two-passage ``file:`` data set (KJV-like text)."""
    f = tmp_path / "corpus.txt"
    f.write_text("in the beginning god created the heaven and the earth.\n\n"
                 "and the earth was without form, and void; and darkness was upon the face of the deep.\n", encoding="utf-8")
    return f


@pytest.fixture
def saved_pair(tmp_path):
    """A tiny pair (V = 32) with its tokenizer saved as model directories, for the command line's
    ``--target DIR --draft DIR``: ``(target, tokenizer, target_dir, draft_dir)``."""
    pytest.importorskip("transformers")
    import tiny_models as tm

    t, d = tm.tiny_pair(vocab_size=32, seed=4)
    tok = tm.tiny_tokenizer()
    for m, name in [(t, "t"), (d, "d")]:
        m.save_pretrained(tmp_path / name)
        tok.save_pretrained(tmp_path / name)
    return t, tok, tmp_path / "t", tmp_path / "d"
