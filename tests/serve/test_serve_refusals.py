"""What users of llama-server / vllm serve reach for first and this server does not implement:
each is refused with a 400 naming it (OpenAI's error object, ``param`` set), never silently
ignored; at its neutral value it is accepted (clients that send the defaults keep working)."""
import pytest

from live_server import MODEL

openai = pytest.importorskip("openai")
httpx = pytest.importorskip("httpx")

MSGS = [{"role": "user", "content": "hi"}]

REFUSED = [  # (field, value): OpenAI's fields go through the client's own arguments, the others through extra_body
    ("n", 2), ("frequency_penalty", 0.5), ("presence_penalty", -0.5), ("repetition_penalty", 1.1), ("min_p", 0.05),
    ("response_format", {"type": "json_object"}),
    ("response_format", {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}),
    ("logit_bias", {"5": 10}), ("guided_json", {"type": "object"}), ("guided_regex", "a+"), ("grammar", "root ::= \"a\""),
    ("json_schema", {"type": "object"}), ("structured_outputs", {"json": {}}),
]


@pytest.mark.parametrize("field, value", REFUSED, ids=[f"{f}={v}" for f, v in REFUSED])
@pytest.mark.parametrize("endpoint", ["chat", "completions"])
def test_unimplemented_field_is_a_400_naming_it(client, field, value, endpoint):
    if endpoint == "completions" and field == "response_format":
        pytest.skip("not a completions field")
    with pytest.raises(openai.BadRequestError) as e:
        if endpoint == "chat":
            client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2, extra_body={field: value})
        else:
            client.completions.create(model=MODEL, prompt="in the", max_tokens=2, extra_body={field: value})
    err = e.value.body
    assert e.value.status_code == 400 and err["param"] == field and field in err["message"], err


def test_neutral_values_are_accepted(client):
    neutral = dict(n=1, frequency_penalty=0, presence_penalty=0.0, response_format={"type": "text"}, logit_bias={})
    r = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2, temperature=0, **neutral,
                                       extra_body={"repetition_penalty": 1.0, "min_p": 0})
    plain = client.chat.completions.create(model=MODEL, messages=MSGS, max_tokens=2, temperature=0)
    assert r.choices[0].message.content == plain.choices[0].message.content


def test_infill_is_a_400_naming_it(live):
    r = httpx.post(live.url + "/infill", json={"input_prefix": "def f(", "input_suffix": "):"}, timeout=60)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == "/infill" and err["code"] == "unsupported_endpoint" and "/infill" in err["message"]
