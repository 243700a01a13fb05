"""Helpers of the server tests: the tiny pair (tests/tiny_models.py) as a ``ServedModel``, served
by a real uvicorn server on a free local port in a thread of the test process."""
import threading
import time

import pytest

CHAT_TEMPLATE = ("{% for m in messages %}{{ m['role'] }} {{ m['content'] }}\n{% endfor %}"
                 "{% if add_generation_prompt %}assistant {% endif %}")
MODEL = "tiny"


def tiny_served(verifier="specinfer", k=2, depth=3, default_max_tokens=24, **kw):
    """A ``ServedModel`` of the tiny pair (V = 32, context 256) with a chat template."""
    pytest.importorskip("transformers")
    import tiny_models as tm
    from multidraft.decoding import Settings
    from multidraft.serve import ServedModel, TextCodec

    t, d = tm.tiny_pair(vocab_size=32, seed=4)
    tok = tm.tiny_tokenizer()
    tok.chat_template = CHAT_TEMPLATE
    settings = Settings.from_args(verifier=verifier, k=k, depth=depth)
    spec = settings.verifier is not None
    return ServedModel(name=MODEL, engine="transformers", target=t, draft=d if spec else None,
                       codec=TextCodec("transformers", t, tok, d if spec else None), settings=settings,
                       default_max_tokens=default_max_tokens, **kw)


class LiveServer:
    """A uvicorn server of ``app`` on 127.0.0.1 and a free port, in a thread."""

    def __init__(self, app):
        import uvicorn

        self.app = app
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, log_config=None,
                                                    log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        t0 = time.monotonic()
        while not self.server.started:
            if time.monotonic() - t0 > 30 or not self.thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"

    def close(self):
        self.server.should_exit = True
        self.thread.join(30)


def start(model, **kw):
    pytest.importorskip("fastapi")
    pytest.importorskip("uvicorn")
    from multidraft.serve import create_app

    return LiveServer(create_app(model, **kw))


def slow_tiny_served(delay_s=0.02, **kw):
    """``tiny_served`` whose target sleeps ``delay_s`` seconds before each forward pass, so a
    request stays in flight long enough to be caught (the replica tests kill a replica under it);
    the tokens are those of ``tiny_served``."""
    import time

    model = tiny_served(**kw)
    model.target.register_forward_pre_hook(lambda module, args: time.sleep(delay_s))
    return model
