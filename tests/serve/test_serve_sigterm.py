"""`python -m multidraft serve` as a process: SIGTERM while a request is being decoded finishes
it, answers the queued one with 503 and Retry-After, logs the drain and one JSON line per request,
and exits 0 without a traceback (``--drain-timeout``, the other name of ``--shutdown-grace``)."""
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

SRC = str(Path(__file__).resolve().parents[2] / "src")


@pytest.mark.slow
def test_sigterm_mid_request_exits_cleanly(saved_pair):
    _, _, t, d = saved_pair
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "multidraft", "serve", "--engine", "transformers", "--target", str(t), "--draft", str(d),
         "--dtype", "float32", "--k", "2", "--depth", "3", "--port", "0", "--ignore-eos", "--queue-size", "2",
         "--model-name", "tiny", "--drain-timeout", "60"],
        stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
    lines: list[str] = []
    url = []

    def read():
        for line in proc.stderr:
            lines.append(line)
            m = re.search(r"running on (http://\S+)", line, re.I)
            if m:
                url.append(m.group(1))

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        t0 = time.monotonic()
        while not url:
            assert proc.poll() is None, "".join(lines)
            assert time.monotonic() - t0 < 120, "".join(lines)
            time.sleep(0.05)
        base = url[0]
        assert httpx.get(base + "/ready", timeout=30).status_code == 200
        body = {"model": "tiny", "prompt": "in the", "max_tokens": 200, "stream": True, "seed": 3,
                "stream_options": {"include_usage": True}}
        queued = []

        def second():  # waits in the queue behind the streamed one
            r = httpx.post(base + "/v1/completions", json={"model": "tiny", "prompt": "and", "max_tokens": 5},
                           timeout=120)
            queued.append(r)

        chunks = []
        with httpx.Client(timeout=120) as c, c.stream("POST", base + "/v1/completions", json=body) as r:
            assert r.status_code == 200
            it = r.iter_lines()
            for line in it:
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
                    break
            q = threading.Thread(target=second)
            q.start()
            t1 = time.monotonic()
            while httpx.get(base + "/health", timeout=30).json()["queued"] < 1:  # the second one waits
                assert time.monotonic() - t1 < 60 and q.is_alive(), queued
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            for line in it:
                if line.startswith("data: {"):
                    chunks.append(json.loads(line[6:]))
                elif line == "data: [DONE]":
                    chunks.append("DONE")
            q.join(60)
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    err = "".join(lines)
    assert rc == 0, err
    assert "Traceback" not in err, err
    assert chunks[-1] == "DONE"  # the request in flight was finished, not cut off
    last, usage = chunks[-3], chunks[-2]  # the finish_reason chunk, then the usage chunk
    assert last["choices"][0]["finish_reason"] == "length" and usage["usage"]["completion_tokens"] == 200
    assert usage["choices"] == [] and "".join(c["choices"][0]["text"] for c in chunks[:-2])
    assert queued and queued[0].status_code == 503 and queued[0].json()["error"]["code"] == "server_shutting_down"
    assert queued[0].headers["retry-after"] == "1"
    assert "draining: 1 requests decoding may take 60 s; 1 queued are answered 503" in err, err
    logged = [json.loads(line.split("multidraft.serve.requests: ", 1)[1]) for line in lines
              if "multidraft.serve.requests: " in line]
    assert sorted((d["status"], d["completion_tokens"], d["error"]) for d in logged) == \
        [(200, 200, None), (503, None, "server_shutting_down")]
    assert [d["seed"] for d in logged if d["status"] == 200] == [3]
    assert [type(d["seed"]) for d in logged if d["status"] == 503] == [int]  # the queued one's, drawn, logged too
