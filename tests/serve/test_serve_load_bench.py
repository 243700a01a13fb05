"""benchmarks/serve_load.py without the llama.cpp binaries: its arguments, the servers' command
lines, the response checker, the summary rebuilt from a JSONL fixture, and its client driving
the tiny pair's live server (tests/serve/live_server.py)."""
from __future__ import annotations

import asyncio
import json
import math
from pathlib import Path

import pytest
from live_server import MODEL
from bench_loader import benchmark_module



@pytest.fixture(scope="module")
def sl():
    with benchmark_module("serve_load") as mod:
        yield mod


# --- arguments and command lines -------------------------------------------------------------
def test_arguments_defaults_and_the_one_client_reference_first(sl):
    a = sl.parse_args([])
    assert a.server_list == ["ours", "ours-batched", "ours-nospec", "llama-server"]
    assert a.client_list == [1, 4, 8] and a.temperature_list == [0.0, 1.0]
    assert a.requests == 20 and a.max_tokens == 128 and a.threads == 2
    assert sl.parse_args(["--clients", "8,4"]).client_list == [1, 4, 8]
    assert sl.parse_args(["--summarize", "x.jsonl"]).summarize == "x.jsonl"
    assert a.dataset == "mixed" and a.free_sources == "model,lookup,suffix"


def test_copy_heavy_request_set(sl):
    """``--dataset codeedit`` / ``mtbench2``: the data set's own prompts (a conversation stays one);
    ``ours-sources``: ours with the free sources (issue 39)."""
    work = sl.prompts(3, "mtbench2")
    assert [w["dataset"] for w in work] == ["mtbench2"] * 3
    roles = [m["role"] for m in work[0]["messages"]]
    assert roles == ["user", "assistant", "user"]
    edit = sl.prompts(2, "codeedit")
    assert len(edit[0]["messages"]) == 1 and "def " in edit[0]["messages"][0]["content"]
    mixed = sl.prompts(3)
    assert [w["dataset"] for w in mixed] == ["humaneval", "mtbench", "humaneval"]
    a = sl.parse_args(["--servers", "ours-sources,llama-server", "--free-sources", "model,suffix"])
    cmd = sl.ours_cmd("ours-sources", a, 1234)
    assert cmd[cmd.index("--sources") + 1] == "model,suffix" and "specinfer" in cmd
    assert "--sources" not in sl.ours_cmd("ours", a, 1234)
    r = sl.ours_cmd("ours-replicas", sl.parse_args(["--replicas", "3"]), 1234)
    assert r[r.index("--replicas") + 1] == "3" and "ours-replicas" in sl.SAME_TEXT


@pytest.mark.parametrize("argv", [["--servers", "ours,vllm"], ["--servers", "ours,ours"], ["--clients", "0"],
                                  ["--clients", "1,x"], ["--clients", "2,2"], ["--temperatures", "3"],
                                  ["--temperatures", "a"], ["--requests", "0"], ["--max-tokens", "0"],
                                  ["--max-tokens", "4096"], ["--threads", "0"], ["--timeout", "0"],
                                  ["--dataset", "nope"], ["--free-sources", "model,nope"], ["--replicas", "1"]])
def test_bad_arguments_are_refused_with_a_message(sl, argv, capsys):
    with pytest.raises(SystemExit) as e:
        sl.parse_args(argv)
    assert e.value.code == 2
    assert argv[0] in capsys.readouterr().err


def test_command_lines(sl):
    a = sl.parse_args(["--clients", "1,4", "--threads", "3"])
    ours = sl.ours_cmd("ours", a, 1234)
    assert ours[1:4] == ["-m", "multidraft", "serve"] and "--verifier" in ours and "specinfer" in ours
    assert ours[ours.index("--threads") + 1] == "3" and ours[ours.index("--queue-size") + 1] == "8"
    assert "--max-lanes" not in ours
    batched = sl.ours_cmd("ours-batched", a, 1234)
    assert batched[batched.index("--max-lanes") + 1] == "4" and "specinfer" in batched
    nospec = sl.ours_cmd("ours-nospec", a, 1234)
    assert nospec[nospec.index("--verifier") + 1] == "none" and "specinfer" not in nospec and "--k" not in nospec
    assert sl.without_spec(["--engine", "llama.cpp", "--k=3", "--depth", "4", "--force-tree", "--x"]) == \
        ["--engine", "llama.cpp", "--x", "--verifier", "none"]
    ll = sl.llama_server_cmd("/bin/llama-server", Path("t.gguf"), Path("d.gguf"), a, 99)
    def flag(f):
        return ll[ll.index(f) + 1]

    assert flag("-m") == "t.gguf" and flag("-md") == "d.gguf" and flag("--port") == "99"
    assert flag("-np") == "4" and flag("-c") == str(4 * sl.CONTEXT)
    assert flag("-t") == flag("-tb") == flag("-td") == flag("-tbd") == "3"
    # the same law as ours at T = 1: llama.cpp's default top-k 40, top-p 0.95, min-p 0.05 off
    assert flag("--top-k") == "0" and flag("--top-p") == "1.0" and flag("--min-p") == "0.0"
    assert flag("--spec-draft-n-max") == "4" and "--no-cache-prompt" in ll
    assert flag("--spec-type") == "draft-simple"  # -md alone loads the draft and drafts nothing


def test_request_body_is_openai_only(sl):
    b = sl.request_body("m", [{"role": "user", "content": "hi"}], 7, 16, 1.0)
    assert b == {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 16, "temperature": 1.0,
                 "seed": 7, "stream": True, "stream_options": {"include_usage": True}}
    assert sl.request_seed(2, 5) == 2 * 100_003 + 5


# --- the response checker --------------------------------------------------------------------
def _sse(obj) -> str:
    return "data: " + (obj if isinstance(obj, str) else json.dumps(obj))


def ours_stream(seed=7, pieces=("Hel", "lo"), finish="length", ctok=2, ptok=5, model="m", done=True):
    head = {"id": "chatcmpl-1", "model": model, "seed": seed}
    lines = [_sse({**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""},
                                        "finish_reason": None}]}), ""]
    lines += [_sse({**head, "choices": [{"index": 0, "delta": {"content": p}, "finish_reason": None}]}) for p in pieces]
    usage = {"prompt_tokens": ptok, "completion_tokens": ctok, "total_tokens": ptok + ctok}
    spec = {"target_calls": 1, "accepted_tokens": 1, "block_efficiency": 2.0}
    lines.append(_sse({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": finish}], "usage": usage,
                       "speculative": spec}))
    lines.append(_sse({**head, "choices": [], "usage": usage, "speculative": spec}))
    if done:
        lines.append(_sse("[DONE]"))
    return lines


def test_checker_accepts_a_whole_response(sl):
    r = sl.check_stream(ours_stream(), kind="ours", seed=7, max_tokens=2, model="m")
    assert r["problems"] == [] and r["text"] == "Hello" and r["finish_reason"] == "length"
    assert r["prompt_tokens"] == 5 and r["completion_tokens"] == 2 and r["spec"]["target_calls"] == 1
    # stopped early at eos: fewer tokens with 'stop' is whole
    assert sl.check_stream(ours_stream(finish="stop", ctok=1), kind="ours", seed=7, max_tokens=8)["problems"] == []


def test_checker_reads_llama_servers_stream(sl):
    lines = [_sse({"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}, "finish_reason": None}]}),
             _sse({"choices": [{"index": 0, "delta": {"content": "ab"}, "finish_reason": None}]}),
             _sse({"choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
                   "timings": {"predicted_n": 3, "draft_n": 4, "draft_n_accepted": 1}}),
             _sse({"choices": [], "usage": {"prompt_tokens": 9, "completion_tokens": 3, "total_tokens": 12}}),
             _sse("[DONE]")]
    r = sl.check_stream(lines, kind="llama-server", seed=1, max_tokens=3)
    assert r["problems"] == [] and r["text"] == "ab" and r["spec"] == {"draft_n": 4, "draft_n_accepted": 1,
                                                                      "predicted_n": 3}


@pytest.mark.parametrize("lines, kw, problem", [
    (ours_stream(done=False), {}, "no [DONE]"),
    (ours_stream() + [_sse({"choices": []})], {}, "events after [DONE]"),
    (ours_stream(seed=8), {}, "echoed for request seed 7"),                      # another request's response
    (ours_stream(model="other"), {}, "in the chunks"),
    (ours_stream(ctok=1), {}, "truncated"),                                      # 'length' before max_tokens
    (ours_stream(ctok=3), {}, "> max_tokens"),
    (ours_stream(pieces=(), finish="length"), {}, "empty text"),
    (ours_stream(finish="tool_calls"), {}, "finish_reason 'tool_calls'"),
    (ours_stream()[:-3] + ours_stream()[-3:-2] + ours_stream()[-3:], {}, "2 finish_reasons"),
    ([_sse({"error": {"message": "boom"}}), _sse("[DONE]")], {}, "error event"),
    ([_sse("{not json"), _sse("[DONE]")], {}, "unparseable"),
    ([l for l in ours_stream() if "usage" not in l], {}, "no usage"),
])
def test_checker_finds_what_is_wrong(sl, lines, kw, problem):
    r = sl.check_stream(lines, kind="ours", seed=7, max_tokens=2, model="m", **kw)
    assert any(problem in p for p in r["problems"]), r["problems"]


# --- the summary from a JSONL fixture --------------------------------------------------------
def _req(server, T, clients, k, text, ptok=10, ctok=4, latency=1.0, ttft=0.2, problems=(), spec=None):
    return {"kind": "request", "server": server, "temperature": T, "clients": clients, "k": k, "client": 0,
            "seed": k, "status": 200, "latency_s": latency, "ttft_s": ttft, "start_s": 0.0, "text": text,
            "finish_reason": "length", "prompt_tokens": ptok, "completion_tokens": ctok, "spec": spec,
            "problems": list(problems)}


def _cell(server, T, clients, sent, wall):
    return {"kind": "cell", "server": server, "temperature": T, "clients": clients, "requests_per_client": 2,
            "sent": sent, "wall_s": wall, "loadavg": [0.1, 0.1, 0.1]}


def fixture_rows(bad: bool):
    meta = {"kind": "meta", "argv": ["benchmarks/serve_load.py", "--requests", "2"], "args": {"requests": 2, "max_tokens": 4, "threads": 2}, "seed": 0,
            "prompts": [{"k": k, "dataset": ("humaneval", "mtbench")[k % 2], "id": str(k)} for k in range(8)],
            "llama_cpp_commit": "0c1e57098", "cpu": {"Model name": "Test CPU", "nproc": 2}, "loadavg_start": [0.5, 0, 0],
            "commands": {"ours": "python -m multidraft serve", "llama-server": "llama-server -m t"}, "notes": [],
            "time_utc": "2026-12-06T00:00:00Z"}
    sp = {"target_calls": 2, "accepted_tokens": 2, "block_efficiency": 2.0}
    ls = {"draft_n": 4, "draft_n_accepted": 2, "predicted_n": 4}
    props = {"default_generation_settings": {"params": {"top_k": 0, "top_p": 1.0, "min_p": 0.0,
                                                        "samplers": ["top_k", "temperature"]}}}
    rows = [meta, {"kind": "server", "server": "llama-server", "command": ["llama-server"], "props": props}]
    rows += [_req("ours", 1.0, 1, k, f"t{k}", latency=1.0 + k, spec=sp) for k in range(2)] + [_cell("ours", 1.0, 1, 2, 4.0)]
    four = [_req("ours", 1.0, 4, k, f"t{k}", latency=2.0, ttft=0.5, spec=sp) for k in range(8)]
    if bad:
        four[1]["text"] = "other"                       # a seed that did not reproduce its text
        four[0]["prompt_tokens"] = 11                   # another request's prompt length
        four[7]["problems"] = ["no [DONE]"]
    rows += four + [_cell("ours", 1.0, 4, 8, 8.0)]
    rows += [_req("llama-server", 1.0, 1, k, f"l{k}", spec=ls) for k in range(2)] + [_cell("llama-server", 1.0, 1, 2, 8.0)]
    rows += [_req("llama-server", 1.0, 4, k, "x" if k == 1 else f"l{k}", spec=ls) for k in range(8)]
    rows += [_cell("llama-server", 1.0, 4, 8, 16.0), {"kind": "end", "loadavg_end": [0.7, 0, 0], "wall_s": 40.0}]
    return rows


def test_summary_of_a_clean_run(sl, tmp_path):
    rows = fixture_rows(bad=False)
    cells = sl.summarize_cells(rows)
    assert [(c["server"], c["clients"]) for c in cells] == [("ours", 1), ("ours", 4), ("llama-server", 1),
                                                            ("llama-server", 4)]
    c1, c4, _, l4 = cells
    assert c1["ok"] == 2 and c1["tokens"] == 8 and c1["tokens_per_s"] == pytest.approx(2.0)
    assert c1["p50_latency_s"] == 1.0 and c1["p99_latency_s"] == 2.0 and c1["spec"] == pytest.approx(2.0)
    assert c4["compared"] == 2 and c4["differs"] == 0 and c4["mixed"] == 0 and c4["p50_ttft_s"] == 0.5
    # stream tok/s: 3 tokens after the first over the time after the first
    assert c1["p50_stream_tps"] == pytest.approx(3 / 1.8) and c4["p50_stream_tps"] == pytest.approx(2.0)
    assert sl.stream_rate({"completion_tokens": 1, "ttft_s": 0.1, "latency_s": 1.0}) is None
    assert sl.stream_rate({"completion_tokens": 5, "ttft_s": None, "latency_s": 1.0}) is None
    assert l4["differs"] == 1 and l4["spec"] == {"drafted": 32, "draft_acceptance": 0.5}  # reported, not failed
    assert sl.failures(cells) == []
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    md = tmp_path / "run.md"
    assert sl.main(["--summarize", str(path), "--markdown", str(md)]) == 0
    text = md.read_text()
    assert "| ours | 1 | 4 | 8/8 | 0 | 0/2 |" in text and "| llama-server | 1 | 4 | 8/8 | 0 | 1/2 |" in text
    assert "ours / llama-server aggregate tokens/s = 2.00x" in text    # 32/8 against 32/16
    assert "| 4.00 | 2.00 | 2.00 tok/call |" in text  # ours at 4 clients: tokens/s, p50 stream tok/s, speculation
    # one client by data set: k = 0 HumanEval (4 tokens in 1 s, ttft 0.2), k = 1 MT-bench (4 tokens in 2 s)
    assert "| ours | 1 | humaneval | 1 | 4.0 | 0.20 | 4.00 | 3.75 |" in text
    assert "| ours | 1 | mtbench | 1 | 4.0 | 0.20 | 2.00 | 1.67 |" in text
    assert "Test CPU" in text and "0c1e57098" in text and "no failure" in text
    assert "command: `python benchmarks/serve_load.py --requests 2`" in text
    assert "/props: top_k 0, top_p 1.0, min_p 0.0, samplers ['top_k', 'temperature']" in text


def test_summary_fails_a_run_with_a_lost_mixed_or_irreproducible_response(sl, tmp_path):
    rows = fixture_rows(bad=True)
    c4 = sl.summarize_cells(rows)[1]
    assert c4["ok"] == 7 and c4["mixed"] == 1 and c4["differs"] == 1 and c4["problems"] == ["no [DONE]"]
    bad = sl.failures(sl.summarize_cells(rows))
    assert len(bad) == 3 and all(b.startswith("ours T=1 clients=4") for b in bad)
    path = tmp_path / "run.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert sl.main(["--summarize", str(path)]) == 1


def test_a_llama_server_that_drafted_nothing_fails_the_run(sl):
    rows = fixture_rows(bad=False)
    for r in rows:
        if r.get("kind") == "request" and r["server"] == "llama-server":
            r["spec"] = {"draft_n": 0, "draft_n_accepted": 0, "predicted_n": 4}
    cells = sl.summarize_cells(rows)
    assert cells[2]["spec"] == {"drafted": 0, "draft_acceptance": None}
    bad = sl.failures(cells)
    assert len(bad) == 2 and all("drafted no token" in b for b in bad)


def test_percentiles(sl):
    assert sl.pct([3.0, 1.0, 2.0], 50) == 2.0 and sl.pct(list(range(100)), 99) == 98
    assert math.isnan(sl.pct([None], 50))


def test_summarize_refuses_a_file_without_cells(sl, tmp_path):
    p = tmp_path / "x.jsonl"
    p.write_text(json.dumps({"kind": "meta"}) + "\n")
    with pytest.raises(SystemExit, match="no cell rows"):
        sl.main(["--summarize", str(p)])


# --- the client against a live server (the tiny pair) ----------------------------------------
def test_client_against_the_live_tiny_server(sl, live):
    ep = sl.Endpoint("ours", live.url, MODEL)
    work = [{"messages": [{"role": "user", "content": t}]} for t in ("in the beginning", "and the earth", "god said", "let there be")]
    one, wall1 = asyncio.run(sl.run_cell(ep, work, 1, 2, base_seed=3, max_tokens=6, temperature=1.0, timeout=60))
    two, wall2 = asyncio.run(sl.run_cell(ep, work, 2, 2, base_seed=3, max_tokens=6, temperature=1.0, timeout=60))
    assert [r["k"] for r in two] == [0, 1, 2, 3] and [r["client"] for r in two] == [0, 0, 1, 1]
    for r in one + two:
        assert r["problems"] == [] and r["status"] == 200 and r["seed"] == sl.request_seed(3, r["k"])
        assert r["latency_s"] > 0 and (r["ttft_s"] is None or r["ttft_s"] <= r["latency_s"])
        assert 1 <= r["completion_tokens"] <= 6 and r["spec"]["target_calls"] >= 1
    # the same request and seed alone and beside another client: the same text
    assert [r["text"] for r in two[:2]] == [r["text"] for r in one]
    rows = [{"kind": "request", "server": "ours", "temperature": 1.0, "clients": c, **r}
            for c, rs in ((1, one), (2, two)) for r in rs]
    rows += [_cell("ours", 1.0, 1, 2, wall1), _cell("ours", 1.0, 2, 4, wall2)]
    rows.sort(key=lambda r: (r["clients"], r["kind"] == "cell"))
    cells = sl.summarize_cells(rows)
    assert cells[1]["compared"] == 2 and sl.failures(cells) == []


def test_per_cell_sends_the_same_requests_at_every_concurrency(sl, live):
    ep = sl.Endpoint("ours", live.url, MODEL)
    work = [{"messages": [{"role": "user", "content": t}]} for t in ("in the beginning", "and the earth", "god said")]
    one, _ = asyncio.run(sl.run_cell(ep, work, 1, 3, base_seed=5, max_tokens=4, temperature=1.0, timeout=60,
                                     per_cell=True))
    two, _ = asyncio.run(sl.run_cell(ep, work, 2, 3, base_seed=5, max_tokens=4, temperature=1.0, timeout=60,
                                     per_cell=True))
    assert [r["k"] for r in one] == [r["k"] for r in two] == [0, 1, 2]
    assert {r["client"] for r in two} == {0, 1} and all(r["problems"] == [] for r in one + two)
    assert [r["text"] for r in two] == [r["text"] for r in one]  # one lane: a seed fixes the tokens
    assert sl.cell_size(8, 20, True) == 20 and sl.cell_size(8, 20, False) == 160
    with pytest.raises(ValueError, match="needs 4 prompts"):
        asyncio.run(sl.run_cell(ep, work, 2, 4, base_seed=5, max_tokens=4, temperature=1.0, timeout=60,
                                per_cell=True))
