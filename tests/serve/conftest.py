"""Fixtures of the server tests: the tiny pair served by a live uvicorn server (live_server.py)."""
import pytest
import torch

from live_server import start, tiny_served


@pytest.fixture(scope="module", autouse=True)
def _one_thread():
    """Every server test module decodes with one torch thread."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture(scope="module")
def live():
    """The tiny pair (specinfer, K = 2, depth 3) served with a queue of 8."""
    srv = start(tiny_served(), queue_size=8, shutdown_grace_s=5)
    yield srv
    srv.close()


@pytest.fixture(scope="module")
def client(live):
    """The official ``openai`` client pointed at the live server."""
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=live.url + "/v1", api_key="none", max_retries=0, timeout=60)
