"""Same behaviour across a refactor: decode the same things with the code of two revisions and
compare the tokens.

    python scripts/same_behaviour.py BASE_REV WORK_DIR [--checks summaries,demo,blocks,realtrees,serve]

BASE_REV is checked out (``git worktree``) under WORK_DIR/base; the other side is this checkout's
``src/``. Each check runs a committed command on both sides (the same python, PYTHONPATH pointing
at each side's ``src/``) and prints, per row, whether the generated tokens (and the counts made
from them) are identical; the exit status is 1 when any differs. The checks:

* ``summaries``: every committed ``docs/results/decode_speed/*.jsonl`` summarized by
  ``benchmarks/decode_speed.py --summarize``: the tables, byte for byte;
* ``demo``: ``multidraft demo`` on its built-in defaults (the fresh-clone table): every run's tokens;
* ``blocks``: ``multidraft experiment blocks`` on 2 HumanEval prompts x 16 tokens (specinfer and
  optimal at K = 2, depth 2, and the target alone): every row's tokens, calls and block efficiency;
* ``realtrees``: the real-tree study (``experiment realtrees run``; ``python -m
  multidraft.experiments.realtrees run`` on a revision before that command existed) on 2 HumanEval
  prompts, 2 trees: every row's tree and each rule's expected tokens;
* ``serve``: ``multidraft serve`` (transformers engine, the default pair) answering one
  completion per seed for three seeds: the text of each answer.

Decode rows are read through the current ``records.read_jsonl`` on both sides, so rows written in
the spelling before ``Settings.describe`` compare in the current one.
"""
from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))


def side_env(src: Path) -> dict:
    return {**os.environ, "PYTHONPATH": str(src), "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "2")}


def run(cmd: list[str], src: Path, log: Path) -> None:
    with open(log, "w") as f:
        res = subprocess.run([sys.executable, "-m", "multidraft", *cmd], env=side_env(src), stdout=f,
                             stderr=subprocess.STDOUT, cwd=ROOT)
    if res.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed on {src} (see {log})")


def rows(path: Path) -> list[dict]:
    from multidraft.experiments.records import read_jsonl
    return [r for r in read_jsonl(path)[1] if r.get("kind", "run") == "run"]


def compare(name: str, a: list[dict], b: list[dict], key, fields) -> bool:
    ka = {key(r): r for r in a}
    kb = {key(r): r for r in b}
    same = True
    if set(ka) != set(kb):
        print(f"{name}: different rows: only before {sorted(set(ka) - set(kb))}, only after {sorted(set(kb) - set(ka))}")
        same = False
    n = 0
    for k in sorted(set(ka) & set(kb), key=str):
        diff = [f for f in fields if ka[k].get(f) != kb[k].get(f)]
        n += 1
        if diff:
            same = False
            print(f"{name}: {k}: differs in {', '.join(diff)}")
    print(f"{name}: {n} rows compared, {'all identical' if same else 'DIFFERENCES above'} "
          f"({', '.join(fields)})")
    return same


def check_demo(sides: dict, work: Path) -> bool:
    out = {}
    for s, src in sides.items():
        d = work / f"demo-{s}"
        run(["demo", "--out", str(d), "--no-progress", "--time-budget", "100000"], src, work / f"demo-{s}.log")
        out[s] = rows(next(d.glob("*.jsonl")))
    return compare("demo", out["before"], out["after"], lambda r: (r["prompt"], r["method"]),
                   ("tokens", "new_tokens", "target_calls", "draft_calls"))


def check_blocks(sides: dict, work: Path) -> bool:
    out = {}
    for s, src in sides.items():
        d = work / f"blocks-{s}"
        run(["experiment", "blocks", str(d), "--prompts", "2", "--max-new-tokens", "16", "--k", "2", "--depths", "2",
             "--verifiers", "specinfer,optimal", "--laws", "iid", "--no-progress"], src, work / f"blocks-{s}.log")
        out[s] = rows(d / "blocks.jsonl")
    return compare("blocks", out["before"], out["after"], lambda r: (r["prompt"], r["verifier"], r["k"], r["depth"]),
                   ("tokens", "new_tokens", "target_calls", "draft_calls", "block_efficiency", "seed"))


def check_realtrees(sides: dict, work: Path) -> bool:
    out = {}
    args = ["--dataset", "humaneval", "-n", "2", "--cont-tokens", "16", "--stride", "8", "--shapes", "seq2",
            "--budgets", "4", "--max-trees", "2"]
    for s, src in sides.items():
        f = work / f"realtrees-{s}.jsonl"
        new = "_register_realtrees" in (src / "multidraft" / "cli" / "experiment.py").read_text()
        if new:
            run(["experiment", "realtrees", "run", *args, "--out", str(f)], src, work / f"realtrees-{s}.log")
        else:
            with open(work / f"realtrees-{s}.log", "w") as log:
                subprocess.run([sys.executable, "-m", "multidraft.experiments.realtrees", "run", *args, "--out", str(f)],
                               env=side_env(src), stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, check=True)
        from multidraft.experiments.records import read_jsonl
        out[s] = [r for r in read_jsonl(f)[1]]
    keys = sorted({k for r in out["before"] for k in r} - {"run_id", "code", "model_seconds", "rule_seconds", "type"})
    return compare("realtrees", out["before"], out["after"], lambda r: json.dumps(
        {k: r.get(k) for k in ("kind", "prompt", "position", "shape", "budget")}, sort_keys=True), keys)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_serve(sides: dict, work: Path) -> bool:
    texts = {}
    for s, src in sides.items():
        port = _free_port()
        log = open(work / f"serve-{s}.log", "w")
        proc = subprocess.Popen([sys.executable, "-m", "multidraft", "serve", "--engine", "transformers", "--port",
                                 str(port), "--log-level", "warning"], env=side_env(src), stdout=log,
                                stderr=subprocess.STDOUT, cwd=ROOT)
        try:
            url = f"http://127.0.0.1:{port}"
            for _ in range(600):
                try:
                    urllib.request.urlopen(url + "/health", timeout=2)
                    break
                except OSError:
                    time.sleep(1)
            texts[s] = {}
            for seed in (0, 1, 2):
                body = json.dumps({"model": "x", "prompt": "def fibonacci(n):", "max_tokens": 24, "seed": seed,
                                   "temperature": 1.0}).encode()
                models = json.loads(urllib.request.urlopen(url + "/v1/models", timeout=30).read())
                body = json.dumps({**json.loads(body), "model": models["data"][0]["id"]}).encode()
                req = urllib.request.Request(url + "/v1/completions", data=body,
                                             headers={"Content-Type": "application/json"})
                ans = json.loads(urllib.request.urlopen(req, timeout=600).read())
                texts[s][seed] = ans["choices"][0]["text"]
        finally:
            proc.terminate()
            proc.wait(60)
            log.close()
    same = texts["before"] == texts["after"]
    for seed in texts["before"]:
        print(f"serve: seed {seed}: {'identical' if texts['before'][seed] == texts['after'][seed] else 'DIFFERS'} "
              f"({texts['after'][seed]!r})")
    return same


def check_summaries(sides: dict, work: Path) -> bool:
    """Every committed decode_speed JSONL summarized (``--summarize``) by both revisions: the tables
    must be byte-identical (rows written before ``Settings.describe`` read in its spelling)."""
    same = True
    files = sorted((ROOT / "docs" / "results" / "decode_speed").glob("*.jsonl"))
    for f in files:
        out = {}
        for s, src in sides.items():
            md = work / f"summary-{s}-{f.stem}.md"
            script = src.parent / "benchmarks" / "decode_speed.py"
            subprocess.run([sys.executable, str(script), "--summarize", str(f), "--markdown", str(md)],
                           env=side_env(src), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=ROOT, check=True)
            out[s] = md.read_bytes()
        if out["before"] != out["after"]:
            same = False
            print(f"summaries: {f.relative_to(ROOT)}: DIFFERS")
    print(f"summaries: {len(files)} committed decode_speed files summarized, "
          f"{'all identical' if same else 'DIFFERENCES above'}")
    return same


CHECKS = {"summaries": check_summaries, "demo": check_demo, "blocks": check_blocks, "realtrees": check_realtrees, "serve": check_serve}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("base")
    ap.add_argument("work_dir")
    ap.add_argument("--checks", default=",".join(CHECKS))
    a = ap.parse_args()
    work = Path(a.work_dir).resolve()
    work.mkdir(parents=True, exist_ok=True)
    base = work / "base"
    if not base.exists():
        subprocess.run(["git", "worktree", "add", "--detach", str(base), a.base], cwd=ROOT, check=True)
    sides = {"before": base / "src", "after": ROOT / "src"}
    ok = True
    for name in a.checks.split(","):
        ok &= CHECKS[name](sides, work)
    print("same behaviour" if ok else "DIFFERENCES: see above")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
