"""Speculation per request (issue 40 item 2): a server with a cost profile paces each request's
drafting depth from that request's own acceptances (``decoding.pace``); the text stays the one
without pacing (T = 0), and where drafting cannot pay the request decodes mostly alone."""
import pytest

from live_server import MODEL, start, tiny_served

from multidraft.decoding.treeopt import CostProfile

STEEP = CostProfile((1, 2, 40), (1.0, 2.0, 40.0), (1,), (0.01,))  # every tree token costs a whole pass
FLAT = CostProfile((1, 40), (1.0, 1.0), (1,), (0.01,))            # width costs nothing


@pytest.fixture(scope="module")
def servers():
    made = {name: start(tiny_served(cost_profile=cost), queue_size=4, shutdown_grace_s=5)
            for name, cost in (("plain", None), ("steep", STEEP), ("flat", FLAT))}
    yield made
    for srv in made.values():
        srv.close()


def _ask(srv, **kw):
    import httpx

    body = {"model": MODEL, "prompt": "in the beginning god created", "max_tokens": 24, "temperature": 0, "seed": 1,
            **kw}
    r = httpx.post(srv.url + "/v1/completions", json=body, timeout=60)
    assert r.status_code == 200, r.text
    return r.json()


def test_paced_requests_keep_the_text_and_draft_only_where_it_pays(servers):
    got = {name: _ask(srv) for name, srv in servers.items()}
    texts = {name: g["choices"][0]["text"] for name, g in got.items()}
    assert texts["steep"] == texts["plain"] == texts["flat"]
    spec = {name: g["speculative"] for name, g in got.items()}
    n = got["plain"]["usage"]["completion_tokens"]
    # steep: after the 4 warm-up steps mostly the target alone, so about one target call a token
    assert spec["steep"]["target_calls"] > spec["plain"]["target_calls"]
    assert spec["steep"]["target_calls"] >= n - 4 * 4 - n // 8 - 1
    # flat: width is free, so every step drafts as deep as the plain server
    assert spec["flat"]["target_calls"] == spec["plain"]["target_calls"]


def test_paced_sampling_is_reproducible_per_seed(servers):
    a, b = _ask(servers["steep"], temperature=1.0, seed=7), _ask(servers["steep"], temperature=1.0, seed=7)
    assert a["choices"][0]["text"] == b["choices"][0]["text"]
