"""Shared fixtures."""
import pytest
import torch


@pytest.fixture
def one_thread():
    """Run single-threaded: many small chunked ops, where on a shared 2-core machine intra-op
    threads waiting on each other dominate the time."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)
