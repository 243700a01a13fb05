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
