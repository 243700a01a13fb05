"""Fixtures of the decoding tests: the tiny random model pairs (tests/tiny_models.py)."""
import pytest


@pytest.fixture(scope="module")
def pair():
    """(target, draft): the tiny related pair, V = 24."""
    pytest.importorskip("transformers")
    import tiny_models as tm

    return tm.tiny_pair(vocab_size=24, seed=0)


@pytest.fixture(scope="module")
def small_pair():
    """(target, draft) at V = 8: joint laws of two tokens have 64 cells."""
    pytest.importorskip("transformers")
    import tiny_models as tm

    return tm.tiny_pair(vocab_size=8, hidden=16, seed=3)


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
