"""``create_app(api_key=...)`` (``multidraft serve --api-key``): the API routes need
``Authorization: Bearer KEY`` (the ``openai`` client's ``api_key``), a missing or wrong key is a
401 with OpenAI's error object, ``/health`` stays open."""
import pytest

from live_server import MODEL, start, tiny_served

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")


@pytest.fixture(scope="module")
def keyed():
    srv = start(tiny_served(), queue_size=4, api_key="s3cret")
    yield srv
    srv.close()


def test_the_key_is_needed_on_the_api_routes_only(keyed):
    good = openai.OpenAI(base_url=keyed.url + "/v1", api_key="s3cret", max_retries=0, timeout=60)
    r = good.completions.create(model=MODEL, prompt="in the", max_tokens=2, temperature=0)
    assert r.usage.completion_tokens >= 1
    assert [m.id for m in good.models.list().data] == [MODEL]
    bad = openai.OpenAI(base_url=keyed.url + "/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as e:
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert e.value.status_code == 401 and e.value.body["code"] == "invalid_api_key"
    for path, body in (("/v1/completions", {"model": MODEL, "prompt": "a"}), ("/tokenize", {"content": "a"}),
                       ("/detokenize", {"tokens": [1]})):
        r = httpx.post(keyed.url + path, json=body, timeout=60)
        assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key", (path, r.text)
    assert httpx.get(keyed.url + "/v1/models", timeout=60).status_code == 401
    ok = httpx.post(keyed.url + "/tokenize", json={"content": "a"}, headers={"Authorization": "Bearer s3cret"})
    assert ok.status_code == 200 and ok.json()["count"] >= 1
    assert httpx.get(keyed.url + "/health", timeout=60).json()["status"] == "ok"


def test_a_bad_key_argument_is_refused():
    from multidraft.serve import create_app

    with pytest.raises(ValueError, match="api_key"):
        create_app(tiny_served(), api_key="")
