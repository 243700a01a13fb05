"""Load test of ``multidraft serve`` against ``llama-server`` and against itself with speculation off.

Servers (``--servers``, comma separated; each started here as a subprocess on its own port,
waited for on ``/health``, warmed up with one untimed request, run through every
(temperature, concurrency) cell, then stopped with SIGTERM before the next starts, so they
never compete for the cores):

``ours``          ``multidraft serve`` with ``--serve-args`` (default: the llama.cpp engine, the
                  default pair as ``serve`` picks it: the BF16 target and the Q4_0 draft where
                  built; specinfer K = 2, depth 4)
``ours-batched``  the same server with ``--max-lanes`` = the most clients of the run: concurrent
                  requests share the forward passes (continuous batching)
``ours-nospec``   the same server with ``--verifier none`` (the target alone)
``ours-sources``  the same server with ``--sources`` ``--free-sources`` (default
                  ``model,lookup,suffix``: prompt lookup and the server's shared suffix index
                  beside the draft model, issue 39); its texts at T = 1 may change between
                  cells (the shared index grows, so the trees and the draws they read differ;
                  the law does not), so ``differs`` is reported for it, not required
``ours-replicas`` the same server with ``--replicas`` ``--replicas`` (default 2; ``multidraft serve
                  --replicas``: each replica loads the pair, one ingress routes each request to
                  the least-loaded replica; on a 2-core machine this shows the routing overhead,
                  not scale); one lane a replica, so a seed fixes the text as for ``ours``
``llama-server``  llama.cpp's server on the same two GGUF files with its own draft-model
                  speculation (``--spec-type draft-simple``: at this commit ``-md`` alone loads
                  the draft but drafts nothing; ``--llama-args``, default ``--spec-draft-n-max 4
                  --spec-draft-n-min 0``), built by ``LLAMA_TOOLS_TARGETS="llama-speculative
                  llama-completion llama-server" scripts/build_llama_tools.sh`` from the llama.cpp
                  commit the Python binding vendors. Its sampling is made the same law as ours:
                  ``--top-k 0 --top-p 1.0 --min-p 0.0`` (its default chain has top-k 40, top-p
                  0.95, min-p 0.05; the other samplers of that chain are off by default, which
                  the meta row's ``/props`` shows), one slot per client (``-np``) each with our
                  context (``-c`` = context x slots), ``--threads`` threads for both of its
                  models, and no prompt cache (``--no-cache-prompt --cache-ram 0``: ours has none,
                  and the cells repeat prompts).

Workload: ``--clients`` concurrent clients (default 1,4,8), each sending ``--requests``
requests one after the other (with ``--per-cell``: ``--requests`` requests in each cell, k = 0 ..
R - 1, the clients taking the next one from one queue as they finish, so every cell sends the
same requests), streamed, to ``/v1/chat/completions``, the same body for every
server: request k (client c sends k = c * R + j, j < R) carries prompt k (``--dataset``: ``mixed``,
the default, HumanEval and MT-bench alternating; or one set of ``multidraft.datasets``, e.g. the
copy-heavy ``codeedit``, ``mtbench2`` (a two-turn conversation) or ``aclsum``), seed ``--seed`` * 100003 + k, ``max_tokens``
``--max-tokens``, at each temperature of ``--temperatures`` (default 0,1).

Checks. Each response, as it arrives (``check_stream``): HTTP 200, parseable events, exactly
one finish_reason (``stop`` or ``length``), the final ``[DONE]``, the usage object,
completion_tokens <= max_tokens and == max_tokens when the finish is ``length`` (not cut
short), a non-empty text unless the model stopped at once, and for ``ours`` the request's own
seed echoed in every chunk. Across cells (``summarize``, from the JSONL only): request k's
``prompt_tokens`` must equal the first cell's value for k (a response given to the wrong
request shows another prompt's length: ``mixed``), and its text is compared with the first
cell's text for k (``differs``): 0 is required of ``ours`` and ``ours-nospec`` at every
temperature (a seed fixes the tokens; requests are decoded one at a time), and reported for
``ours-batched`` and llama-server (batched forwards change the floating-point reduction order,
so a seed's text may change beside other requests; its law does not).

Output: ``--out FILE.jsonl``: a ``meta`` row (commands, llama.cpp commit, CPU model and flags,
load average, versions, seeds, git commit), one ``server`` row per server (its command line,
model id, llama-server's ``/props``), one ``request`` row per request (timings, tokens, the
text, the problems found, the speculative statistics each server returns), one ``cell`` row
per cell (its wall time), and an ``end`` row. ``--summarize FILE.jsonl [--markdown FILE.md]``
prints the table from that file alone: per (server, T, clients) ok/sent, problems, mixed,
differs, p50 / p99 latency, p50 / p99 time to first token, aggregate completion tokens/s (all
tokens of the cell over its wall time) and the tokens per target call; then ours against
llama-server and against ours-nospec. A run ends by summarizing its own file (exit 1 when a
request failed or ``ours`` broke a check).

Smoke run (docs/results/serve/smoke.*):
    python benchmarks/serve_load.py --clients 1,4 --requests 2 --max-tokens 32 --temperatures 1 \\
        --out docs/results/serve/smoke.jsonl --markdown docs/results/serve/smoke.md
Full run (issue 28; docs/results/serve/README.md gives its wall time):
    python benchmarks/serve_load.py --clients 1,4,8 --requests 20 --max-tokens 128 --temperatures 0,1 \\
        --out docs/results/serve/load.jsonl --markdown docs/results/serve/load.md
"""
from __future__ import annotations

import argparse
import asyncio
import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from _bench import common_args, load_average, provenance  # noqa: E402

LLAMA_CACHE = Path(os.environ.get("MULTIDRAFT_LLAMA_CACHE", Path.home() / ".cache/multidraft/llama.cpp"))
LLAMA_SERVER = LLAMA_CACHE / "build-0.3.36/bin/llama-server"
SERVERS = ("ours", "ours-batched", "ours-nospec", "ours-sources", "ours-replicas", "llama-server")
DEFAULT_SERVERS = ("ours", "ours-batched", "ours-nospec", "llama-server")  # ours-sources on request (--servers)
OURS = ("ours", "ours-batched", "ours-nospec", "ours-sources", "ours-replicas")  # our server: the request's seed is echoed in every chunk
SAME_TEXT = ("ours", "ours-nospec", "ours-replicas")  # one lane, deterministic per seed: a differing text is an error
CONTEXT = 4096  # multidraft's llama.cpp engine context (decoding.pair.load_pair's n_ctx)
SEED_STRIDE = 100_003
PACKAGES = ("multidraft", "llama_cpp", "torch", "httpx", "fastapi", "uvicorn")  # versions recorded, imported or not
FINISH = ("stop", "length")


# --- arguments ------------------------------------------------------------------------------------
def _int_list(name: str, text: str, lo: int = 1) -> list[int]:
    try:
        xs = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{name} takes comma-separated integers, got {text!r}") from None
    if not xs or any(x < lo for x in xs) or len(set(xs)) != len(xs):
        raise argparse.ArgumentTypeError(f"{name} takes distinct integers >= {lo}, got {text!r}")
    return xs


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--servers", default=",".join(DEFAULT_SERVERS),
                    help=f"comma-separated, of {', '.join(SERVERS)} (default {','.join(DEFAULT_SERVERS)})")
    ap.add_argument("--clients", default="1,4,8", help="concurrent clients per cell (1 is always run first)")
    ap.add_argument("--requests", type=int, default=20,
                    help="requests per client per cell (with --per-cell: requests per cell, taken by the clients "
                         "from one queue)")
    ap.add_argument("--per-cell", action="store_true",
                    help="--requests counts the requests of a cell, not of a client: every cell sends requests "
                         "0 .. R-1, each client taking the next one when its last is answered (the same requests "
                         "at every concurrency)")
    ap.add_argument("--temperatures", default="0,1")
    ap.add_argument("--dataset", default="mixed",
                    help="the requests' prompts: mixed (HumanEval and MT-bench alternating, default) or a data set of "
                         "multidraft.datasets, e.g. codeedit, mtbench2, aclsum (copy-heavy)")
    ap.add_argument("--replicas", type=int, default=2, help="ours-replicas: its --replicas (default 2)")
    ap.add_argument("--free-sources", default="model,lookup,suffix",
                    help="ours-sources: its --sources (default model,lookup,suffix)")
    ap.add_argument("--max-tokens", type=int, default=128)
    common_args(ap, seed=0, threads=2, helps={"seed": "request k's seed is SEED * 100003 + k",
                                              "threads": "threads of every server (both models)"})
    ap.add_argument("--context", type=int, default=CONTEXT,
                    help=f"context per request: ours loads {CONTEXT}; llama-server gets -c CONTEXT x slots")
    ap.add_argument("--timeout", type=float, default=1800.0, help="seconds a request may take")
    ap.add_argument("--serve-args", default="--engine llama.cpp --verifier specinfer --k 2 --depth 4",
                    help="arguments of `multidraft serve` for 'ours' (one quoted string)")
    ap.add_argument("--llama-server", default=str(LLAMA_SERVER), help="the llama-server binary")
    ap.add_argument("--llama-args", default="--spec-draft-n-max 4 --spec-draft-n-min 0",
                    help="extra llama-server arguments (its draft-model speculation)")
    ap.add_argument("--logs", default="/tmp/serve_load_logs", help="directory of the servers' logs")
    common_args(ap, out=None, out_type=str, helps={"out": "JSONL file of the run (meta, server, request, cell, end rows)"})
    ap.add_argument("--markdown", default=None, help="write the summary table there too")
    ap.add_argument("--summarize", default=None, metavar="JSONL", help="only print the table of a finished run")
    return ap


def parse_args(argv=None) -> argparse.Namespace:
    ap = parser()
    args = ap.parse_args(argv)
    if args.summarize is not None:
        return args
    try:
        args.server_list = [s.strip() for s in args.servers.split(",") if s.strip()]
        bad = [s for s in args.server_list if s not in SERVERS]
        if bad or not args.server_list or len(set(args.server_list)) != len(args.server_list):
            raise argparse.ArgumentTypeError(f"--servers takes distinct names of {', '.join(SERVERS)}, got {args.servers!r}")
        clients = _int_list("--clients", args.clients)
        args.client_list = [1] + sorted(c for c in clients if c != 1)  # 1 first: the reference of every check
        try:
            temps = [float(t) for t in args.temperatures.split(",") if t.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"--temperatures takes comma-separated numbers, got {args.temperatures!r}") \
                from None
        if not temps or any(not 0 <= t <= 2 for t in temps) or len(set(temps)) != len(temps):
            raise argparse.ArgumentTypeError(f"--temperatures takes distinct numbers in [0, 2], got {args.temperatures!r}")
        args.temperature_list = temps
        from multidraft.datasets import DATASETS
        if args.dataset != "mixed" and args.dataset not in DATASETS:
            raise argparse.ArgumentTypeError(f"--dataset takes mixed or one of {', '.join(DATASETS)}, got {args.dataset!r}")
        from multidraft.decoding.sources import parse_sources
        try:
            parse_sources(args.free_sources)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(f"--free-sources: {exc}") from None
        if args.replicas < 2:
            raise argparse.ArgumentTypeError(f"--replicas must be >= 2 (ours is one replica), got {args.replicas}")
        for name in ("requests", "max_tokens", "threads", "context"):
            if getattr(args, name) < 1:
                raise argparse.ArgumentTypeError(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
        if args.max_tokens >= args.context:
            raise argparse.ArgumentTypeError(f"--max-tokens must be below --context ({args.context}), got {args.max_tokens}")
        if args.timeout <= 0:
            raise argparse.ArgumentTypeError(f"--timeout must be > 0, got {args.timeout}")
    except argparse.ArgumentTypeError as exc:
        ap.error(str(exc))
    return args


# --- workload -------------------------------------------------------------------------------------
def prompts(n: int, dataset: str = "mixed") -> list[dict]:
    """``n`` chat prompts: ``mixed`` HumanEval (with its instruction) and MT-bench alternating;
    another name, the first ``n`` of that data set (``datasets.prompt_messages``: a conversation
    stays one). Each ``{"dataset", "id", "messages"}``."""
    from multidraft.datasets import instruction_for, load_prompts, prompt_messages

    if dataset != "mixed":
        got = load_prompts(dataset, n)
        if len(got) < n:
            raise ValueError(f"--dataset {dataset}: {len(got)} prompts, the run needs {n}")
        return [{"dataset": dataset, "id": i, "messages": prompt_messages(p, instruction_for(dataset))} for i, p in got]
    half = (n + 1) // 2
    he = [("humaneval", i, instruction_for("humaneval") + p) for i, p in load_prompts("humaneval", half)]
    mt = [("mtbench", i, p) for i, p in load_prompts("mtbench", n - half)]
    out = []
    for j in range(max(len(he), len(mt))):
        out += ([he[j]] if j < len(he) else []) + ([mt[j]] if j < len(mt) else [])
    return [{"dataset": d, "id": i, "messages": prompt_messages(t)} for d, i, t in out[:n]]


def request_seed(seed: int, k: int) -> int:
    from multidraft._validate import derive_seed
    return derive_seed(seed, k, rule="linear", weights=(SEED_STRIDE, 1))


def request_body(model: str, messages: list, seed: int, max_tokens: int, temperature: float) -> dict:
    """The one body every server gets (OpenAI's fields only)."""
    return {"model": model, "messages": messages, "max_tokens": max_tokens,
            "temperature": temperature, "seed": seed, "stream": True, "stream_options": {"include_usage": True}}


# --- checking a response --------------------------------------------------------------------------
def check_stream(lines: list[str], *, kind: str, seed: int, max_tokens: int, model: str | None = None) -> dict:
    """Parse and check one streamed chat response (its SSE lines, in order).

    Returns ``{"text", "finish_reason", "prompt_tokens", "completion_tokens", "spec", "problems"}``:
    ``problems`` lists what is wrong (empty: the response is whole and is this request's).
    ``kind`` is the server's name; for ``ours``/``ours-nospec`` the request's seed must be
    echoed in every chunk and the model id must be ``model``."""
    problems: list[str] = []
    parts: list[str] = []
    finishes: list[str] = []
    usage, spec, done, after_done = None, None, False, False
    seeds: set = set()
    models: set = set()
    for line in lines:
        if not line.startswith("data:"):
            continue
        data = line[5:].strip()
        if done:
            after_done = True
            continue
        if data == "[DONE]":
            done = True
            continue
        try:
            ev = json.loads(data)
        except json.JSONDecodeError:
            problems.append(f"unparseable event {data[:60]!r}")
            continue
        if not isinstance(ev, dict):
            problems.append(f"event is not an object: {data[:60]!r}")
            continue
        if "error" in ev:
            problems.append(f"error event: {json.dumps(ev['error'])[:160]}")
            continue
        if "seed" in ev:
            seeds.add(ev["seed"])
        if "model" in ev:
            models.add(ev["model"])
        if ev.get("usage"):
            usage = ev["usage"]
        if ev.get("speculative"):
            spec = {k: ev["speculative"].get(k) for k in ("target_calls", "accepted_tokens", "block_efficiency")}
        if ev.get("timings"):  # llama-server: its draft statistics
            t = ev["timings"]
            spec = {"draft_n": t.get("draft_n", 0), "draft_n_accepted": t.get("draft_n_accepted", 0),
                    "predicted_n": t.get("predicted_n")}
        choices = ev.get("choices")
        if choices is None:
            problems.append("event without choices")
            continue
        for ch in choices:
            if ch.get("index", 0) != 0:
                problems.append(f"choice index {ch.get('index')}")
            piece = (ch.get("delta") or {}).get("content")
            if piece:
                parts.append(piece)
            if ch.get("finish_reason") is not None:
                finishes.append(ch["finish_reason"])
    text = "".join(parts)
    if not done:
        problems.append("no [DONE]")
    if after_done:
        problems.append("events after [DONE]")
    if len(finishes) != 1:
        problems.append(f"{len(finishes)} finish_reasons")
    finish = finishes[-1] if finishes else None
    if finish is not None and finish not in FINISH:
        problems.append(f"finish_reason {finish!r}")
    ptok = ctok = None
    if usage is None:
        problems.append("no usage")
    else:
        ptok, ctok = usage.get("prompt_tokens"), usage.get("completion_tokens")
        if not isinstance(ptok, int) or ptok < 1:
            problems.append(f"prompt_tokens {ptok!r}")
        if not isinstance(ctok, int) or ctok < 0:
            problems.append(f"completion_tokens {ctok!r}")
        elif ctok > max_tokens:
            problems.append(f"completion_tokens {ctok} > max_tokens {max_tokens}")
        elif finish == "length" and ctok != max_tokens:
            problems.append(f"finish 'length' after {ctok} of {max_tokens} tokens (truncated)")
    if max_tokens > 0 and not text and finish != "stop":
        problems.append("empty text")
    if kind in OURS:
        if seeds != {seed}:
            problems.append(f"seed(s) {sorted(seeds, key=str)[:3]} echoed for request seed {seed}")
        if model is not None and models != {model}:
            problems.append(f"model(s) {sorted(models)[:3]} in the chunks, expected {model!r}")
    return {"text": text, "finish_reason": finish, "prompt_tokens": ptok, "completion_tokens": ctok, "spec": spec,
            "problems": problems}


# --- talking to a server --------------------------------------------------------------------------
@dataclass
class Endpoint:
    """A running server as the clients see it."""

    name: str   # ours, ours-nospec or llama-server
    url: str
    model: str


def _has_content(line: str) -> bool:
    """Whether an SSE line carries generated text (the time to first token ends there)."""
    if not line.startswith("data:") or '"content"' not in line:
        return False
    try:
        ev = json.loads(line[5:])
    except json.JSONDecodeError:
        return False
    return isinstance(ev, dict) and any((ch.get("delta") or {}).get("content") for ch in ev.get("choices") or [])


async def one_request(client, ep: Endpoint, k: int, work: list[dict], seed: int, max_tokens: int,
                      temperature: float) -> dict:
    """Send request k, time it, check its response; returns the JSONL ``request`` row's fields."""
    body = request_body(ep.model, work[k]["messages"], seed, max_tokens, temperature)
    lines: list[str] = []
    status, ttft = None, None
    t0 = time.perf_counter()
    try:
        async with client.stream("POST", ep.url + "/v1/chat/completions", json=body) as r:
            status = r.status_code
            if status != 200:
                raw = (await r.aread())[:300].decode("utf-8", "replace")
                lines, problems = [], [f"HTTP {status}: {raw}"]
            else:
                async for line in r.aiter_lines():
                    if ttft is None and _has_content(line):
                        ttft = time.perf_counter() - t0
                    lines.append(line)
                problems = None
    except Exception as exc:  # a lost or cut-off response: counted, never raised
        problems = [f"{type(exc).__name__}: {exc}"[:200]]
    latency = time.perf_counter() - t0
    row = {"k": k, "seed": seed, "status": status, "latency_s": latency, "ttft_s": ttft, "start_s": t0}
    if problems is not None:
        return {**row, "text": None, "finish_reason": None, "prompt_tokens": None, "completion_tokens": None,
                "spec": None, "problems": problems}
    return {**row, **check_stream(lines, kind=ep.name, seed=seed, max_tokens=max_tokens, model=ep.model)}


def cell_size(clients: int, requests: int, per_cell: bool) -> int:
    """How many requests a cell sends: ``requests`` in all (``per_cell``) or per client."""
    return requests if per_cell else clients * requests


async def run_cell(ep: Endpoint, work: list[dict], clients: int, requests: int, *, base_seed: int, max_tokens: int,
                   temperature: float, timeout: float, per_cell: bool = False) -> tuple[list[dict], float]:
    """``clients`` concurrent clients, each sending ``requests`` requests in turn (client c sends
    k = c * requests + j), or, with ``per_cell``, ``requests`` requests in all (k = 0 .. requests - 1),
    each client taking the next k from one queue when its last one is answered; returns the
    request rows (ordered by k) and the cell's wall time."""
    import httpx

    n = cell_size(clients, requests, per_cell)
    if n > len(work):
        raise ValueError(f"the cell needs {n} prompts, the work list has {len(work)}")
    rows: list = [None] * n
    queue = iter(range(n))  # per_cell: one queue; asyncio runs one client at a time between awaits

    async def client_loop(c, client):
        ks = queue if per_cell else range(c * requests, c * requests + requests)
        for k in ks:
            rows[k] = await one_request(client, ep, k, work, request_seed(base_seed, k), max_tokens, temperature)
            rows[k]["client"] = c

    # a fresh connection per request: llama-server (cpp-httplib) may close an idle kept-alive
    # connection just as the next request is written on it, which the client would count as lost
    limits = httpx.Limits(max_connections=clients + 2, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=httpx.Timeout(timeout, connect=30.0), limits=limits) as client:
        t0 = time.perf_counter()
        await asyncio.gather(*(client_loop(c, client) for c in range(clients)))
        wall = time.perf_counter() - t0
    for r in rows:
        r["start_s"] -= t0
    return rows, wall


# --- the servers ----------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def without_spec(extra: list[str]) -> list[str]:
    """``--serve-args`` with the speculative flags replaced by ``--verifier none``."""
    drop_value = {"--verifier", "--k", "--depth", "--tree", "--draft-law", "--draft-temperature", "--max-nodes",
                  "--max-depth", "--k-max", "--min-gain", "--profile", "--accept-stats", "--draft", "--draft-ftype",
                  "--warmup-prompt"}
    out, skip = [], False
    for a in extra:
        if skip:
            skip = False
            continue
        key = a.split("=", 1)[0]
        if key in drop_value:
            skip = "=" not in a
            continue
        if key == "--force-tree":
            continue
        out.append(a)
    return out + ["--verifier", "none"]


def gguf_pair() -> tuple[Path, Path]:
    """The GGUF files ``multidraft serve`` loads by default: BF16 target and Q4_0 draft where built."""
    from multidraft.models import default_gguf

    t, d = default_gguf("target", "bf16"), default_gguf("draft", "q4_0")
    return (t if t.is_file() else default_gguf("target")), (d if d.is_file() else default_gguf("draft"))


def ours_cmd(name: str, args, port: int) -> list[str]:
    extra = shlex.split(args.serve_args)
    if name == "ours-nospec":
        extra = without_spec(extra)
    if name == "ours-sources":  # free draft sources beside the draft model (issue 39)
        extra = [*extra, "--sources", args.free_sources]
    if name == "ours-replicas":  # the one ingress routing to replicas on a local Ray
        extra = [*extra, "--replicas", str(args.replicas)]
    if name == "ours-batched":  # every concurrent client in its own lane, sharing the forward passes
        extra = [*extra, "--max-lanes", str(max(args.client_list))]
    return [sys.executable, "-m", "multidraft", "serve", *extra, "--threads", str(args.threads), "--port", str(port),
            "--queue-size", str(max(args.client_list) * 2), "--log-level", "warning"]


def llama_server_cmd(binary: str, target: Path, draft: Path, args, port: int) -> list[str]:
    slots = max(args.client_list)
    t = str(args.threads)
    return [binary, "-m", str(target), "-md", str(draft), "--host", "127.0.0.1", "--port", str(port),
            "-np", str(slots), "-c", str(args.context * slots), "-t", t, "-tb", t, "-td", t, "-tbd", t,
            "--top-k", "0", "--top-p", "1.0", "--min-p", "0.0", "--no-cache-prompt", "--cache-ram", "0",
            "--no-webui", "--spec-type", "draft-simple", *shlex.split(args.llama_args)]


class Server:
    """A server subprocess, ready once ``/health`` answers 200 (``endpoint`` then set)."""

    def __init__(self, name: str, cmd: list[str], port: int, log_path: Path, start_timeout: float = 900.0):
        import httpx

        self.name, self.cmd = name, cmd
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        self.log = open(log_path, "w")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(cmd, stdout=self.log, stderr=subprocess.STDOUT, cwd=ROOT,
                                     env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"{name} exited with {self.proc.returncode} before /health answered; "
                                       f"see {log_path}")
                try:
                    if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - t0 > start_timeout:
                    raise RuntimeError(f"{name} did not answer /health in {start_timeout:.0f} s; see {log_path}")
                time.sleep(0.5)
            self.start_s = time.monotonic() - t0
            self.models = httpx.get(self.url + "/v1/models", timeout=10).json()
            self.props = None
            if name == "llama-server":
                self.props = httpx.get(self.url + "/props", timeout=10).json()
        except BaseException:
            self.stop()
            raise
        self.endpoint = Endpoint(name, self.url, self.models["data"][0]["id"])

    def stop(self) -> int | None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def _run_text(cmd: list[str]) -> str | None:
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False)
        return (p.stdout + p.stderr).strip()
    except (OSError, subprocess.SubprocessError):
        return None


def cpu_info() -> dict:
    out = {"nproc": os.cpu_count()}
    text = _run_text(["lscpu"]) or ""
    for line in text.splitlines():
        key, _, val = line.partition(":")
        key = key.strip()
        if key in ("Model name", "Architecture", "CPU(s)", "Thread(s) per core", "Core(s) per socket", "Socket(s)",
                   "L3 cache", "Flags", "Hypervisor vendor"):
            out[key] = val.strip()
    return out


def llama_commit() -> str | None:
    text = (ROOT / "scripts/build_llama_tools.sh").read_text()
    for line in text.splitlines():
        if line.startswith("LLAMA_COMMIT="):
            return line.split("=", 1)[1].strip()
    return None


def git_commit() -> str | None:
    head = _run_text(["git", "-C", str(ROOT), "rev-parse", "HEAD"])
    dirty = _run_text(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"])
    return None if head is None else head + ("-dirty" if dirty else "")


# --- the run --------------------------------------------------------------------------------------
class Log:
    """The JSONL file (or nothing): one row a line, flushed at once."""

    def __init__(self, path):
        self.f = open(path, "w") if path else None
        self.rows: list[dict] = []

    def write(self, row: dict) -> None:
        self.rows.append(row)
        if self.f:
            self.f.write(json.dumps(row) + "\n")
            self.f.flush()

    def close(self):
        if self.f:
            self.f.close()


def run(args) -> int:
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    n_work = max(cell_size(c, args.requests, args.per_cell) for c in args.client_list)
    work = prompts(n_work, args.dataset)
    target, draft = gguf_pair()
    log = Log(args.out)
    t_run = time.perf_counter()
    commands = {}
    binary = Path(args.llama_server)
    servers = list(args.server_list)
    notes = []
    if "llama-server" in servers and not binary.is_file():
        notes.append(f"llama-server skipped: no binary at {binary}; build it with LLAMA_TOOLS_TARGETS=\"llama-speculative "
                     f"llama-completion llama-server\" scripts/build_llama_tools.sh or pass --llama-server PATH")
        print(notes[-1], file=sys.stderr)
        servers.remove("llama-server")
    ports = {name: free_port() for name in servers}
    for name in servers:
        commands[name] = (ours_cmd(name, args, ports[name]) if name in OURS
                          else llama_server_cmd(str(binary), target, draft, args, ports[name]))
    meta = {"kind": "meta", "argv": sys.argv, "args": {k: v for k, v in vars(args).items()},
            "servers": servers, "commands": {k: shlex.join(v) for k, v in commands.items()},
            "gguf": {"target": str(target), "draft": str(draft),
                     "target_bytes": target.stat().st_size if target.is_file() else None,
                     "draft_bytes": draft.stat().st_size if draft.is_file() else None},
            "llama_cpp_commit": llama_commit(),
            "llama_server_version": _run_text([str(binary), "--version"]) if binary.is_file() else None,
            **provenance(also=PACKAGES), "lscpu": cpu_info(), "loadavg_start": load_average(), "git": git_commit(),
            "seed": args.seed, "seed_rule": f"request k: seed * {SEED_STRIDE} + k", "n_prompts": len(work),
            "prompts": [{"k": k, "dataset": w["dataset"], "id": w["id"]} for k, w in enumerate(work)],
            "notes": notes, "time_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    log.write(meta)
    try:
        for name in servers:
            print(f"starting {name}: {shlex.join(commands[name])}", file=sys.stderr, flush=True)
            srv = Server(name, commands[name], ports[name], logs / f"{name}.log")
            rc = None
            try:
                log.write({"kind": "server", "server": name, "command": commands[name], "start_s": srv.start_s,
                           "model": srv.endpoint.model, "models": srv.models, "props": srv.props})
                ep = srv.endpoint
                # untimed: the weights paged in, the first-call costs paid
                asyncio.run(run_cell(ep, work, 1, 1, base_seed=args.seed, max_tokens=min(8, args.max_tokens),
                                     temperature=0.0, timeout=args.timeout))
                for temp in args.temperature_list:
                    for c in args.client_list:
                        rows, wall = asyncio.run(run_cell(ep, work, c, args.requests, base_seed=args.seed,
                                                          max_tokens=args.max_tokens, temperature=temp,
                                                          timeout=args.timeout, per_cell=args.per_cell))
                        for r in rows:
                            log.write({"kind": "request", "server": name, "temperature": temp, "clients": c, **r})
                        log.write({"kind": "cell", "server": name, "temperature": temp, "clients": c,
                                   "requests_per_client": None if args.per_cell else args.requests,
                                   "requests_per_cell": len(rows), "sent": len(rows), "wall_s": wall,
                                   "loadavg": load_average()})
                        row = summarize_cells(log.rows)[-1]
                        print(_line(row), file=sys.stderr, flush=True)
            finally:
                rc = srv.stop()
                log.write({"kind": "stop", "server": name, "returncode": rc})
    finally:
        log.write({"kind": "end", "loadavg_end": load_average(), "wall_s": time.perf_counter() - t_run})
        log.close()
    table, bad = report(log.rows)
    print(table)
    if args.markdown:
        Path(args.markdown).write_text(table + "\n")
    return 1 if bad else 0


# --- the summary (from the JSONL rows only) -------------------------------------------------------
def pct(xs, q: float) -> float:
    """The q-th percentile by the nearest rank (NaN for no values)."""
    xs = sorted(x for x in xs if x is not None)
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, round(q / 100 * (len(xs) - 1)))]


def summarize_cells(rows: list[dict]) -> list[dict]:
    """One summary per cell row, in file order, with the cross-cell checks against the first
    cell (of the same server and temperature) that answered request k."""
    first: dict = {}  # (server, T, k) -> (prompt_tokens, text)
    reqs: dict = {}
    for r in rows:
        if r.get("kind") == "request":
            reqs.setdefault((r["server"], r["temperature"], r["clients"]), []).append(r)
    out = []
    for cell in (r for r in rows if r.get("kind") == "cell"):
        key = (cell["server"], cell["temperature"], cell["clients"])
        rs = sorted(reqs.get(key, []), key=lambda r: r["k"])
        good = [r for r in rs if not r["problems"]]
        mixed = differs = compared = 0
        for r in good:
            ref = first.get((key[0], key[1], r["k"]))
            if ref is None:
                first[(key[0], key[1], r["k"])] = (r["prompt_tokens"], r["text"])
                continue
            compared += 1
            mixed += r["prompt_tokens"] != ref[0]
            differs += r["text"] != ref[1]
        toks = sum(r["completion_tokens"] for r in good)
        spec = [r["spec"] for r in good if r.get("spec")]
        calls = None
        if spec and "target_calls" in spec[0]:
            tc = sum(s["target_calls"] or 0 for s in spec)
            calls = toks / tc if tc else None
        elif spec and "draft_n" in spec[0]:
            # llama-server: draft_n drafted, draft_n_accepted kept; its target calls are not reported
            dn = sum(s["draft_n"] or 0 for s in spec)
            calls = {"drafted": dn, "draft_acceptance": sum(s["draft_n_accepted"] or 0 for s in spec) / dn if dn else None}
        wall = cell["wall_s"]
        out.append({"server": key[0], "temperature": key[1], "clients": key[2], "sent": cell["sent"],
                    "answered": len(rs), "ok": len(good), "problems": sorted({p for r in rs for p in r["problems"]})[:3],
                    "mixed": mixed, "differs": differs, "compared": compared,
                    "p50_latency_s": pct([r["latency_s"] for r in good], 50),
                    "p99_latency_s": pct([r["latency_s"] for r in good], 99),
                    "p50_ttft_s": pct([r["ttft_s"] for r in good], 50), "p99_ttft_s": pct([r["ttft_s"] for r in good], 99),
                    "tokens": toks, "wall_s": wall, "tokens_per_s": toks / wall if wall > 0 else float("nan"),
                    "mean_latency_s": sum(r["latency_s"] for r in good) / len(good) if good else float("nan"),
                    "p50_stream_tps": pct([stream_rate(r) for r in good], 50),
                    "spec": calls})
    return out


def stream_rate(r: dict) -> float | None:
    """A response's decoding speed as its client sees it stream: the tokens after the first over the
    time after the first (prompt prefill and queueing excluded); None below 2 tokens."""
    n, ttft = r.get("completion_tokens"), r.get("ttft_s")
    if not n or n < 2 or ttft is None or r["latency_s"] <= ttft:
        return None
    return (n - 1) / (r["latency_s"] - ttft)


def failures(cells: list[dict]) -> list[str]:
    """What makes a run fail: a request lost or answered wrongly, a response mixed up, or a
    text of ours that a seed did not reproduce."""
    bad = []
    for c in cells:
        where = f"{c['server']} T={c['temperature']:g} clients={c['clients']}"
        if c["ok"] < c["sent"]:
            bad.append(f"{where}: {c['sent'] - c['ok']} of {c['sent']} requests failed ({'; '.join(c['problems'])})")
        if c["mixed"]:
            bad.append(f"{where}: {c['mixed']} responses with another request's prompt length")
        if c["server"] in SAME_TEXT and c["differs"]:
            bad.append(f"{where}: {c['differs']} texts differ from the same request's (same seed) in the first cell")
        if c["server"] == "llama-server" and c["ok"] and not (isinstance(c["spec"], dict) and c["spec"]["drafted"]):
            bad.append(f"{where}: llama-server drafted no token (its speculation was off: without --spec-type "
                       f"draft-simple, -md only loads the draft model)")
    return bad


def dataset_table(rows: list[dict], meta: dict) -> list[str]:
    """Markdown lines: the one-client cells split by the prompts' data set (from the meta row's
    prompt list): requests, mean completion tokens, mean time to first token, tokens/s over the
    requests' whole time and decoding tok/s after the first token (sums over the requests)."""
    ds = {p["k"]: p["dataset"] for p in meta.get("prompts", [])}
    groups: dict = {}
    for r in rows:
        if r.get("kind") == "request" and r["clients"] == 1 and not r["problems"] and r["k"] in ds:
            groups.setdefault((r["server"], r["temperature"], ds[r["k"]]), []).append(r)
    if not groups:
        return []
    out = ["", "One client, by data set (sums over the requests: tokens/s = tokens / time; decoding = tokens after "
               "the first / time after the first):", "",
           "| server | T | data set | requests | mean tokens | mean TTFT s | tokens/s | decoding tok/s |",
           "|---|---|---|---|---|---|---|---|"]
    for (srv, t, d), rs in groups.items():
        n, lat = sum(r["completion_tokens"] for r in rs), sum(r["latency_s"] for r in rs)
        timed = [r for r in rs if r["ttft_s"] is not None]
        after = sum(r["latency_s"] - r["ttft_s"] for r in timed)
        dec = sum(r["completion_tokens"] - 1 for r in timed) / after if after > 0 else float("nan")
        ttft = sum(r["ttft_s"] for r in timed) / len(timed) if timed else float("nan")
        out.append(f"| {srv} | {t:g} | {d} | {len(rs)} | {n / len(rs):.1f} | {ttft:.2f} | {n / lat:.2f} | {dec:.2f} |")
    return out


def _spec_cell(s) -> str:
    if s is None:
        return "-"
    if isinstance(s, dict):
        a = s.get("draft_acceptance")
        return "no drafts" if a is None else f"draft acc. {a:.2f}"
    return f"{s:.2f} tok/call"


def _line(c: dict) -> str:
    return (f"{c['server']:>13} T={c['temperature']:g} clients={c['clients']}: {c['ok']}/{c['sent']} ok, "
            f"{c['mixed']} mixed, {c['differs']}/{c['compared']} differ, p50 {c['p50_latency_s']:.2f} s, "
            f"p99 {c['p99_latency_s']:.2f} s, TTFT p50 {c['p50_ttft_s']:.2f} s, {c['tokens_per_s']:.2f} tok/s"
            + (f"  problems: {c['problems']}" if c["problems"] else ""))


def report(rows: list[dict]) -> tuple[str, list[str]]:
    """The markdown summary of a run's rows and its failures."""
    meta = next((r for r in rows if r.get("kind") == "meta"), {})
    end = next((r for r in rows if r.get("kind") == "end"), {})
    a = meta.get("args", {})
    cells = summarize_cells(rows)
    cpu = meta.get("cpu", {})  # the provenance record's CPU model; a dict of lscpu fields in older runs
    cpu = cpu if isinstance(cpu, dict) else {"Model name": cpu, "nproc": meta.get("cores")}
    la0, la1 = meta.get("loadavg_start"), end.get("loadavg_end")
    per = "cell" if a.get("per_cell") else "client"
    out = [(f"serve_load: {a.get('requests')} requests per {per}, max_tokens {a.get('max_tokens')}, "
            f"{a.get('threads')} threads, seed {meta.get('seed')}; llama.cpp {meta.get('llama_cpp_commit')}; "
            f"CPU {cpu.get('Model name')} ({cpu.get('nproc')} cores); load average "
            f"{la0[0] if la0 else float('nan'):.2f} at the start, {la1[0] if la1 else float('nan'):.2f} at the end; "
            f"run {end.get('wall_s', float('nan')):.0f} s; {meta.get('time_utc')}"), ""]
    if meta.get("argv"):
        out += [f"command: `python {shlex.join(meta['argv'])}`", ""]
    for name, cmd in meta.get("commands", {}).items():
        out.append(f"- `{name}`: `{cmd}`")
    for srv in (r for r in rows if r.get("kind") == "server" and r.get("props")):
        g = srv["props"].get("default_generation_settings") or {}
        g = g.get("params", g)
        keys = ("top_k", "top_p", "min_p", "typical_p", "xtc_probability", "dry_multiplier", "repeat_penalty",
                "top_n_sigma", "samplers", "speculative.types")
        out.append(f"- `{srv['server']}` /props: " + ", ".join(f"{k} {g.get(k)}" for k in keys if k in g))
    out += ["", ("| server | T | clients | ok/sent | mixed | differ/compared | p50 latency s | p99 latency s | "
                 "p50 TTFT s | p99 TTFT s | tokens/s | p50 stream tok/s | speculation |"),
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in cells:
        out.append(f"| {c['server']} | {c['temperature']:g} | {c['clients']} | {c['ok']}/{c['sent']} | {c['mixed']} | "
                   f"{c['differs']}/{c['compared']} | {c['p50_latency_s']:.2f} | {c['p99_latency_s']:.2f} | "
                   f"{c['p50_ttft_s']:.2f} | {c['p99_ttft_s']:.2f} | {c['tokens_per_s']:.2f} | {c['p50_stream_tps']:.2f} | "
                   f"{_spec_cell(c['spec'])} |")
    by = {(c["server"], c["temperature"], c["clients"]): c for c in cells}
    ratios = []
    for (s, t, n), c in by.items():
        if s not in ("ours", "ours-batched", "ours-sources", "ours-replicas"):
            continue
        for other in ("llama-server", "ours-nospec") + (("ours",) if s == "ours-replicas" else ()):
            o = by.get((other, t, n))
            if o and o["tokens_per_s"] > 0:
                ratios.append(f"- T={t:g}, {n} clients: {s} / {other} aggregate tokens/s = "
                              f"{c['tokens_per_s'] / o['tokens_per_s']:.2f}x, p50 stream tok/s = "
                              f"{c['p50_stream_tps'] / o['p50_stream_tps']:.2f}x")
    if ratios:
        out += [""] + ratios
    out += dataset_table(rows, meta)
    bad = failures(cells)
    out += ["", ("Every response checked (status, events, one finish_reason, [DONE], usage, no truncation; ours: the "
                 "request's seed echoed). mixed: prompt_tokens differ from the first cell's for the same request; "
                 "differ: texts differ from the first cell's for the same request and seed (required 0 for ours and "
                 "ours-nospec). tokens/s: the cell's completion tokens over its wall time (prefill and queueing "
                 "included); stream tok/s: a response's tokens after the first over its time after the first (what its "
                 "client sees stream). speculation: ours, completion tokens per target forward; llama-server, its "
                 "accepted / drafted tokens.")]
    out += [f"- note: {n}" for n in meta.get("notes", [])]
    out += [f"- FAILED: {b}" for b in bad] or ["- every request answered and checked: no failure"]
    return "\n".join(out), bad


def summarize_file(path: str, markdown: str | None) -> int:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not any(r.get("kind") == "cell" for r in rows):
        raise SystemExit(f"--summarize: {path} holds no cell rows (not a serve_load JSONL?)")
    table, bad = report(rows)
    print(table)
    if markdown:
        Path(markdown).write_text(table + "\n")
    return 1 if bad else 0


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.summarize is not None:
        return summarize_file(args.summarize, args.markdown)
    # SIGTERM (a timeout, a job manager) unwinds like Ctrl-C: the running server is stopped too
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(143))
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
