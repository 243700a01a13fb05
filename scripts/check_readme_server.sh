#!/usr/bin/env bash
# CI step (issue 40): the README's server command works right after the README's setup, on a fresh
# clone. Runs `make serve` (what README.md documents) on a free port, waits for /health, asks one
# chat completion with curl-like Python (no extra tools), then stops the server with SIGTERM.
# Exit 0 when the answer is an OpenAI chat completion with text; 1 otherwise (the server's log is
# printed). Bounded: 15 minutes for the setup and the models' load, 2 minutes for the answer.
set -uo pipefail
cd "$(dirname "$0")/.."
grep -q '`make serve`' README.md || { echo "check_readme_server: README.md documents no \`make serve\`" >&2; exit 1; }
PY=.venv/bin/python
PORT=$($PY -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
LOG=$(mktemp)
setsid make serve SERVE_ARGS="--port $PORT" >"$LOG" 2>&1 &
PID=$!
stop() { kill -TERM -- -"$PID" 2>/dev/null; for _ in $(seq 60); do kill -0 "$PID" 2>/dev/null || return 0; sleep 0.5; done
         kill -KILL -- -"$PID" 2>/dev/null; }
trap stop EXIT
$PY - "$PORT" "$PID" <<'PYEOF'
import json, os, sys, time, urllib.request

port, pid = int(sys.argv[1]), int(sys.argv[2])
base = f"http://127.0.0.1:{port}"
deadline = time.monotonic() + 900
while True:
    try:
        with urllib.request.urlopen(base + "/health", timeout=5) as r:
            if r.status == 200:
                break
    except OSError:
        pass
    try:
        os.kill(pid, 0)
    except OSError:
        sys.exit("check_readme_server: `make serve` exited before /health answered")
    if time.monotonic() > deadline:
        sys.exit("check_readme_server: no /health answer within 15 minutes")
    time.sleep(2)
with urllib.request.urlopen(base + "/v1/models", timeout=30) as r:
    model = json.load(r)["data"][0]["id"]
body = json.dumps({"model": model, "max_tokens": 8, "temperature": 0, "seed": 0,
                   "messages": [{"role": "user", "content": "Write a Python function that adds two numbers."}]})
req = urllib.request.Request(base + "/v1/chat/completions", data=body.encode(), headers={"Content-Type": "application/json"})
with urllib.request.urlopen(req, timeout=120) as r:
    out = json.load(r)
text = out["choices"][0]["message"]["content"]
assert out["object"] == "chat.completion" and isinstance(text, str) and text, out
print(f"check_readme_server: `make serve` answered on port {port}: {text!r} ({out['usage']})")
PYEOF
rc=$?
[ "$rc" -eq 0 ] || { echo "check_readme_server: failed; the server's log:" >&2; tail -40 "$LOG" >&2; }
rm -f "$LOG"
exit "$rc"
