"""End-to-end decoding speed: multidraft against the target alone and against the peers, one run.

Every method decodes every prompt in turn (interleaved, so load swings on a shared machine
hit all methods alike); HumanEval prompts through the chat template, temperature 1 (pure
sampling: no top-k / top-p / min-p), ``--max-new-tokens`` each (the run stops early at an
end-of-turn token unless ``--no-eos``). Tokens/s counts the decoding steps only (prompt
prefill excluded), for every method and peer alike.

Engines (``--engine``):

* ``transformers`` (default pair converted to safetensors, ``--dtype``): the peers are
  transformers' own assisted generation (``hf``: ``target.generate(assistant_model=draft,
  do_sample=True)``, its default dynamic number of draft tokens) and its prompt lookup decoding
  (``hf-lookup[:N]``: ``target.generate(prompt_lookup_num_tokens=N)``, default N = 10 as
  transformers' docs suggest, n-grams of at most ``max_matching_ngram_size`` = 2 tokens, its
  default; no draft model: the target samples every verified position and a copied token is kept
  while they agree, so its law is the target's at every T). Both count every target forward pass
  as a target call (prefill included); at T = 0 both decode greedily.
* ``llama.cpp`` (the GGUF files read directly; ``--bf16-target`` for the BF16 target made
  from the same weights; ``--draft-ftype q4_0`` for the draft requantized to Q4_0, the fast CPU
  draft, else the draft stays Q4_K_M): the peers are llama.cpp's own binaries,
  built by ``scripts/build_llama_tools.sh`` from the llama.cpp commit the Python binding
  vendors: ``llama-target`` (``llama-completion``, target alone), ``llama-spec:D[:NP]``
  (``llama-speculative`` with ``--spec-draft-n-max D`` and NP parallel draft sequences; NP > 1
  is its tree mode) and ``llama-lookup[:D]`` (``llama-lookup``, examples/lookup: prompt lookup
  from an n-gram cache of 1 to 4 tokens over the prompt and the text so far, up to D = 10 drafted
  tokens a step by default, no draft model; its rows' acceptance is n_accept / n_drafted and its
  target calls n_predict - n_accept, as llama-speculative's). Neither llama-speculative mode is
  exactly the target's law at T > 0: it drafts the draft's top-ranked tokens and verifies them as
  if sampled (docs/guide/llama_cpp_peer.md: a total variation of about 0.045 per token at T = 1 on
  HumanEval positions); llama-lookup keeps the target's sampled token where the copy agrees, the
  target's law.

Methods (``--methods``, comma separated):

``target``            multidraft with the target alone (the reference of every ratio)
``sd:D``              single-draft SD (``naive``), a chain of depth D
``V:KxD``             verifier V on the full K-ary tree of depth D (its implied draft law); V may also
                      be a sequence-level tree rule (``decoding.decoder_rules()``: ``block``, on
                      K = 1 only, ``traversal``, ...) verifying the tree instead of a verifier's
                      walk (the i.i.d. law), in every form below: ``block:1x6``, ``traversal:seq2x6``
``V:seqKxD``          verifier V on K draft sequences of length D (a trie)
``V:dyn:K:N:D[:G]``   verifier V on dynamic trees: at most K drafts per node, N nodes (root
                      included), depth D; a draft only where it is worth >= G expected tokens
``V:auto:K``          verifier V on the tree ``decoding.auto`` picks (as ``multidraft decode
                      --tree auto``) from ``--profile`` (points recomputed by
                      ``--profile-statistic``, default median where it keeps samples) and the
                      acceptances of ``--accept-stats`` (the study's JSONL, rated along the
                      text; data set ``--accept-dataset``) or, without it, of decoding.auto's
                      warm-up decode (32 tokens, its own seed stream) on a held-out prompt;
                      the best tree even where it is predicted slower than the target alone;
                      for a rule, among the node sizes it supports, rated with the specinfer
                      walk's acceptances
``M+SOURCE[+SOURCE]`` a drafted method M above (not ``target`` nor ``V:auto:K``) with free draft
                      sources joining its tree (``lookup``, ``suffix``; ``decoding.sources``):
                      ``sd:4+lookup``, ``optimal:2x3+lookup+suffix``
``lookup`` / ``suffix`` / ``lookup+suffix``   free sources alone, no draft model run (no draft pass, no draft cache)
                      (``Settings.free_only``, vLLM's ``ngram`` method): each step's tree is their copied
                      chains, verified exactly (the walk's free-first rule); nothing to copy: one
                      target step. Rows: ``sources`` without ``model``, ``verifier`` None, ``k`` =
                      ``depth`` = 0, ``draft_calls`` 0; labels ``lookup alone``, ``lookup + suffix alone``
``M@paced``          a drafted or free-only method M decoded with ``--profile``'s costs: each
                      step drafts only as deep as pays by them and the decode's own acceptances
                      (depth 0: the target alone; ``decoding.pace``) and free chains are cut where
                      a copied token no longer pays (``decoding.sources.budget``):
                      ``sd:4+lookup+suffix@paced``; the same seeds as M
``hf`` / ``hf-lookup[:N]``   the transformers peers above
``llama-target`` / ``llama-spec:D[:NP]`` / ``llama-lookup[:D]``   the llama.cpp peers above

The runs, their seeds, rows and summary table are the one decode runner's
(``multidraft.experiments.decode_runs``: interleaved prompts x methods, one ``PromptCache`` per
prompt, the seed of each run a function of (seed, prompt, verifier, law, K, depth) alone; a
peer's seed likewise of (seed, prompt, peer kind), reduced below 2^32 - 1 for llama.cpp's
``--seed``). This script is the timing entry point: it loads the pair, binds the peers, and
prints the table and the headline ratios against references measured in the same run.

Printed: per method tokens/s (pooled over prompts, and the per-prompt mean with its 95%
t-interval), block efficiency (new tokens per target forward, with its 95% interval),
acceptance, the speed-up over the target alone (paired per prompt, 95% interval), and the
headline ratios: best multi-draft against the best single-draft SD, against the peers, and
against the target alone; with sequence-level rules, the best of them against the best
token-level walk (multi-draft) and the best single-draft SD, paired per prompt; where several
verifiers walk the same fixed tree (``specinfer:2x2,optimal:2x2``), the one with the highest block
efficiency against the fastest of them, paired per prompt (``decode_runs.same_tree``). ``--minutes M``
stops before a (prompt, round) unit that would overrun M minutes (whole units only; the header says
so). ``--out FILE`` writes JSONL (config, seed, versions, load average, one row per (prompt, method,
round), one end row per session, one summary row per method); ``--markdown FILE`` the table.

``--rounds R`` decodes every prompt R times with every method, with the same seed (the same
tokens: only the timing differs), reversing the method order every other round, round-major: round
0 of every prompt first, then round 1, ... (``decode_runs.run(rounds_first=True)``: a run cut by
``--minutes`` still covers every prompt once; each (prompt, round) unit prefills its prompt once,
outside tokens/s); each prompt's rounds are pooled before the per-prompt statistics, and the
headline adds each method's round-to-round spread. On the shared 2-core VM a memory-bound BF16
target-only decode swings between about 70 and 95 ms a token within minutes while a 5-token verify
pass barely moves (docs/results/decode_speed/README.md), so single-round ratios against the target
alone carry that swing.

``--resume`` (with ``--out FILE``) continues the run of FILE, so that a study too long for one
session accumulates over several (the same command each session; an absent FILE starts the run): its
meta row must show the same settings (``--rounds`` and ``--minutes`` aside: a resumed run may add
rounds; else a one-line refusal naming the first differing setting) and the same CPU; the (prompt,
round) units FILE holds for every method are skipped, a unit only some methods finished (an
interrupted session) is decoded again and its rows dropped; the seeds are those of one uninterrupted
run (a function of the seed, the prompt and the method alone). FILE is rewritten once, atomically:
its meta row gains the resumption (time, load average, versions, code, command, rounds, minutes) in
``resumed``, and the earlier summary rows go; then the new rows are appended, and the table, the
summary rows and ``--markdown`` are made from all the file's run rows by the one path of
``--summarize``. Without ``--resume`` an existing FILE is refused. One process at a time writes FILE
(``records.lock_results_file``: a lock file ``.FILE.multidraft.lock`` beside it).

    .venv/bin/python benchmarks/decode_speed.py --engine llama.cpp --bf16-target --prompts 20
    .venv/bin/python benchmarks/decode_speed.py --prompts 2 --max-new-tokens 32 --methods target,sd:3,specinfer:2x3

The sequence-level comparison of issue 26 and the verifiers of one tree of issue 27 (llama.cpp, 20
HumanEval prompts x 128 tokens x 2 rounds, T = 1; ``docs/results/decode_speed/README.md``):
``--methods`` = ``SEQ_RULE_METHODS`` (``--methods seq-rules``).
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from multidraft.datasets import DATASETS, encode_prompt, instruction_for, load_prompts, prompt_messages
from multidraft.experiments import decode_runs as dr
from multidraft.experiments.records import JsonlWriter, code_version

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _bench import common_args, load_average, provenance  # noqa: E402

ENGINE_PACKAGES = ("transformers", "llama_cpp")  # their versions are recorded whichever engine ran

DEFAULT_METHODS = {
    "transformers": "target,hf,sd:3,sd:4,sd:5,specinfer:2x3,specinfer:seq2x4,specinfer:dyn:4:12:6",
    "llama.cpp": ("llama-target,target,llama-spec:4,llama-spec:6,llama-spec:6:2,sd:4,sd:6,sd:8,"
                  "specinfer:2x4,specinfer:seq2x6,specinfer:dyn:4:16:8,specinfer:dyn:4:24:8"),
}
# the run of issues 26 and 27 (docs/results/decode_speed/README.md): block verification against SD on
# the same chain (depth 4, the fastest SD depth on this engine), traversal and gbv against the specinfer
# walk on two sequences of 4, and the four token-level verifiers with traversal on the binary tree of depth 2
SEQ_RULE_METHODS = ("target,sd:4,block:1x4,specinfer:seq2x4,traversal:seq2x4,gbv:seq2x4,"
                    "specinfer:2x2,spectr:2x2,khisti_is:2x2,optimal:2x2,traversal:2x2")
LLAMA_BIN = Path(os.environ.get("MULTIDRAFT_LLAMA_CACHE", Path.home() / ".cache/multidraft/llama.cpp")) / "build-0.3.36/bin"


def _eprint(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- methods -----------------------------------------------------------------------------------
PEERS = ("hf", "hf-lookup", "llama-target", "llama-spec", "llama-lookup")
# prompt lookup's default sizes: transformers' docs suggest prompt_lookup_num_tokens=10 (their
# PromptLookupCandidateGenerator's default, with max_matching_ngram_size 2); llama-lookup the same
# 10 drafted tokens at most (llama.cpp's own --spec-draft-n-max default is 3, made for draft models)
HF_LOOKUP_TOKENS = 10
LLAMA_LOOKUP_DRAFT = 10


def parse_method(spec: str, engine: str, temperature: float = 1.0) -> dr.MethodSpec:
    """A method of ``--methods``: a peer here, the library's own methods by ``decode_runs.parse_method``.
    A peer's callable is bound once the models are loaded (``bind_peer``); ``llama-spec:D[:NP]``
    carries D as its depth and NP as its K, ``hf-lookup:N`` and ``llama-lookup:D`` N and D as their depth."""
    s = spec.strip()
    t = float(temperature)
    if s == "hf":
        if engine != "transformers":
            raise ValueError("method hf (assisted generation) needs --engine transformers")
        return dr.peer_method("hf-assisted", "hf", temperature=t)
    if s == "llama-target":
        if engine != "llama.cpp":
            raise ValueError("method llama-target needs --engine llama.cpp")
        return dr.peer_method("llama.cpp target-only (llama-completion)", "llama-target", temperature=t)
    for kind, needs, default, size, label in (
            ("hf-lookup", "transformers", HF_LOOKUP_TOKENS, "N needs N >= 1 tokens a lookup", "hf prompt lookup N={}"),
            ("llama-lookup", "llama.cpp", LLAMA_LOOKUP_DRAFT, "D needs D >= 1 drafted tokens", "llama-lookup D={}")):
        m = re.fullmatch(kind + r"(?::(\d+))?", s)
        if m:
            if engine != needs:
                raise ValueError(f"method {kind}" + (" (prompt lookup)" if kind == "hf-lookup" else "")
                                 + f" needs --engine {needs}")
            n = int(m.group(1) or default)
            if n < 1:
                raise ValueError(f"method {spec!r}: {kind}:{size}, got {n}")
            return dr.peer_method(label.format(n), kind, temperature=t, depth=n)
    m = re.fullmatch(r"llama-spec:(\d+)(?::(\d+))?", s)
    if m:
        if engine != "llama.cpp":
            raise ValueError("method llama-spec needs --engine llama.cpp")
        d, np_ = int(m.group(1)), int(m.group(2) or 1)
        return dr.peer_method(f"llama-speculative D={d}" + (f" NP={np_}" if np_ > 1 else ""), "llama-spec",
                              temperature=t, k=np_, depth=d)
    try:
        return dr.parse_method(s, temperature=t)
    except ValueError:
        raise ValueError(f"--methods: cannot read {spec!r} (target, sd:D, V:KxD, V:seqKxD, V:dyn:K:N:D[:G], V:auto:K, "
                         "M+lookup[+suffix], lookup, suffix, lookup+suffix, hf, hf-lookup[:N], llama-target, "
                         "llama-spec:D[:NP], llama-lookup[:D])") from None


# --- peers -------------------------------------------------------------------------------------
class CallCounter:
    """Counts forward passes of a module (pre-hook)."""

    def __init__(self, module):
        self.n = 0
        self._h = module.register_forward_pre_hook(self._hook)

    def _hook(self, *_):
        self.n += 1

    def close(self):
        self._h.remove()


def hf_assisted(target, draft, ids, *, max_new_tokens, temperature, eos, pad, seed) -> dict:
    torch.manual_seed(seed)  # transformers samples from the global RNG
    t_calls, d_calls = CallCounter(target), CallCounter(draft)
    try:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(
                ids, attention_mask=torch.ones_like(ids), assistant_model=draft, **_hf_sampling(temperature),
                max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad,
            )
        secs = time.perf_counter() - t0
    finally:
        t_calls.close()
        d_calls.close()
    new = int(out.shape[1] - ids.shape[1])
    # every target call counts: assisted generation verifies its first candidates in the same
    # forward pass as the prompt prefill (its prefill is inside `secs` too: a small advantage
    # to multidraft on short outputs, stated in the report)
    calls = max(t_calls.n, 1)
    return {"new_tokens": new, "target_calls": calls, "draft_calls": d_calls.n, "seconds": secs,
            "block_efficiency": new / calls, "acceptance_rate": float("nan")}


def _hf_sampling(temperature: float) -> dict:
    """transformers' sampling arguments: pure sampling at T > 0 (no top-k / top-p), greedy at T = 0."""
    if temperature == 0:
        return {"do_sample": False}
    return {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}


def hf_lookup(target, ids, *, num_tokens, max_new_tokens, temperature, eos, pad, seed,
              max_matching_ngram_size: int | None = None) -> dict:
    """transformers' prompt lookup decoding (``target.generate(prompt_lookup_num_tokens=N)``, Saxena
    2023): at each step the latest n-gram of the text (n from ``max_matching_ngram_size``, default 2,
    down to 1) is matched earlier in the prompt and the text so far, and the N tokens that followed
    it are verified by one target pass. No draft model and no draft law: the target's token is
    sampled at every verified position and the copy is kept while they agree, so the output law is
    the target's at every T (greedy at T = 0). Timed and counted like ``hf_assisted``: every target
    forward pass counts, the prefill pass included (it also verifies the first candidates)."""
    torch.manual_seed(seed)  # transformers samples from the global RNG
    t_calls = CallCounter(target)
    extra = {} if max_matching_ngram_size is None else {"max_matching_ngram_size": max_matching_ngram_size}
    try:
        t0 = time.perf_counter()
        with torch.inference_mode():
            out = target.generate(
                ids, attention_mask=torch.ones_like(ids), prompt_lookup_num_tokens=num_tokens,
                max_new_tokens=max_new_tokens, eos_token_id=eos, pad_token_id=pad, **_hf_sampling(temperature), **extra,
            )
        secs = time.perf_counter() - t0
    finally:
        t_calls.close()
    new = int(out.shape[1] - ids.shape[1])
    calls = max(t_calls.n, 1)
    # no draft model: 0 draft calls; the drafted / accepted counts are not exposed by generate
    return {"new_tokens": new, "target_calls": calls, "draft_calls": 0, "seconds": secs,
            "block_efficiency": new / calls, "acceptance_rate": float("nan"), "tokens": out[0, ids.shape[1]:].tolist()}


def _sampling_flags(temperature: float, seed: int, threads: int) -> list[str]:
    # pure sampling like every other row: llama.cpp's default chain has top-k 40, top-p 0.95, min-p 0.05
    return ["--temp", f"{temperature:g}", "--top-k", "0", "--top-p", "1.0", "--min-p", "0.0",
            "--seed", str(seed), "-t", str(threads), "-tb", str(threads), "-c", "4096"]  # its own warm-up run stays on


def _run(cmd: list[str], timeout: float) -> str:
    try:
        # errors="replace": a token may print half a UTF-8 character (a tiny model prints any bytes)
        p = subprocess.run(cmd, capture_output=True, text=True, errors="replace", timeout=timeout)
    except subprocess.TimeoutExpired:
        raise RuntimeError(f"{Path(cmd[0]).name} did not finish in {timeout:.0f} s") from None
    if p.returncode != 0:
        tail = (p.stderr or p.stdout).strip().splitlines()[-3:]
        raise RuntimeError(f"{Path(cmd[0]).name} exited {p.returncode}: {' | '.join(tail)}")
    return p.stdout + "\n" + p.stderr


def llama_speculative(bin_dir: Path, target: Path, draft: Path, prompt_file: Path, *, max_new_tokens, temperature,
                      seed, threads, draft_max, n_parallel, eos: bool) -> dict:
    cmd = [str(bin_dir / "llama-speculative"), "-m", str(target), "-md", str(draft), "-f", str(prompt_file),
           "-n", str(max_new_tokens), "--spec-draft-n-max", str(draft_max), "-np", str(n_parallel),
           "-td", str(threads), "-tbd", str(threads), *_sampling_flags(temperature, seed, threads)]
    if n_parallel > 1:  # its tree mode shares target tokens between branches: unified KV cache
        cmd.append("-kvu")  # (accepted by the build of scripts/build_llama_tools.sh, see docs/guide/llama_cpp_peer.md)
    if not eos:
        cmd.append("--ignore-eos")
    return parse_spec_output(_run(cmd, 900), "llama-speculative")


def parse_spec_output(out: str, name: str) -> dict:
    """The measurements of llama-speculative's or llama-lookup's output (both print, at this commit,
    ``decoded N tokens in S seconds`` for the decoding phase and the counters ``n_predict``,
    ``n_drafted``, ``n_accept``): N new tokens in S seconds, target calls = n_predict - n_accept
    (every target pass yields one token that was not a draft; the first is the prompt pass's),
    acceptance n_accept / n_drafted (NaN where nothing was drafted). Draft calls are not reported:
    None (llama-lookup has no draft model, but its rows keep the one convention of the binaries).
    RuntimeError naming the missing counter."""
    def num(pat):
        m = re.search(pat, out)
        if not m:
            raise RuntimeError(f"{name}: no {pat!r} in its output")
        return float(m.group(1))

    n_pred = int(num(r"n_predict\s*=\s*(\d+)"))
    n_acc = int(num(r"n_accept\s*=\s*(\d+)"))
    n_drafted = int(num(r"n_drafted\s*=\s*(\d+)"))
    secs = num(r"decoded\s+\d+\s+tokens in\s+([\d.]+)\s+seconds")
    new = int(num(r"decoded\s+(\d+)\s+tokens in"))
    calls = max(1, n_pred - n_acc)  # every target pass yields one token that was not a draft
    return {"new_tokens": new, "target_calls": calls, "draft_calls": None, "seconds": secs,  # not reported
            "block_efficiency": n_pred / calls, "acceptance_rate": n_acc / n_drafted if n_drafted else float("nan"),
            "drafted": n_drafted, "accepted": n_acc}


def llama_lookup(bin_dir: Path, target: Path, prompt_file: Path, *, max_new_tokens, temperature, seed, threads,
                 draft_max, eos: bool) -> dict:
    """llama.cpp's prompt lookup example (examples/lookup): n-grams of 1 to 4 tokens
    (LLAMA_NGRAM_MIN..MAX) of the prompt and the text so far, in an n-gram cache; each step drafts
    up to ``draft_max`` tokens (``--spec-draft-n-max``) while the cache's continuation counts are
    confident, and one target pass verifies them: the target samples at each position (the same
    sampler chain as the other binaries) and the copy is kept while they agree. No dynamic or static
    cache files (nothing is carried between prompts)."""
    cmd = [str(bin_dir / "llama-lookup"), "-m", str(target), "-f", str(prompt_file), "-n", str(max_new_tokens),
           "--spec-draft-n-max", str(draft_max), *_sampling_flags(temperature, seed, threads)]
    if not eos:
        cmd.append("--ignore-eos")
    return parse_spec_output(_run(cmd, 900), "llama-lookup")


def llama_completion(bin_dir: Path, target: Path, prompt_file: Path, *, max_new_tokens, temperature, seed, threads,
                     eos: bool) -> dict:
    cmd = [str(bin_dir / "llama-completion"), "-m", str(target), "-f", str(prompt_file), "-n", str(max_new_tokens),
           "-no-cnv", *_sampling_flags(temperature, seed, threads)]
    if not eos:
        cmd.append("--ignore-eos")
    out = _run(cmd, 900)
    m = re.search(r"eval time\s*=\s*([\d.]+)\s*ms\s*/\s*(\d+)\s*runs", out.split("prompt eval time")[-1])
    if not m:
        raise RuntimeError("llama-completion: no 'eval time' line in its output")
    ms, runs = float(m.group(1)), int(m.group(2))
    # one single-token target pass per eval run, each followed by one sampled token (its first
    # token comes from the prompt pass, which is prefill): tokens/s = runs / eval seconds
    return {"new_tokens": runs, "target_calls": runs, "draft_calls": 0, "seconds": ms / 1000.0,
            "block_efficiency": 1.0, "acceptance_rate": float("nan")}


# --- the headline: ratios against the references of the same run ---------------------------------
def _sequence_level(s: dict) -> bool:
    """A summary row of a sequence-level tree rule (not a verifier's walk)."""
    return s.get("rule") not in (None, "token_walk")


def _free_only(s: dict) -> bool:
    """A summary row of free sources alone (no draft model: ``sources`` without 'model')."""
    return bool(s.get("sources")) and "model" not in s["sources"]


def _chain(s: dict) -> bool:
    """A summary row of single-draft SD: verifier naive or K = 1 (or a chosen tree that is a chain)."""
    t = s.get("auto")
    if isinstance(t, dict) and t.get("paths"):
        return all(p[-1] == 0 for p in t["paths"])
    return s.get("verifier") == "naive" or s.get("k") == 1 or str(s["method"]).startswith("SD ")


def headline(summary: list[dict], rows: list[dict]) -> list[str]:
    """The best multi-draft and the best single-draft method against each other, the peers and the
    target alone (pooled, and paired per prompt with 95% intervals); the round-to-round spread."""
    free = [s for s in summary if s["method_kind"] == "tree" and _free_only(s)]
    ours = [s for s in summary if s["method_kind"] in ("tree", "auto") and not _sequence_level(s) and not _free_only(s)]
    seq = [s for s in summary if s["method_kind"] in ("tree", "auto") and _sequence_level(s)]
    multi = [s for s in ours if not _chain(s)]
    single = [s for s in ours if _chain(s)]
    peers = [s for s in summary if s["method_kind"] in PEERS]
    base = next((s for s in summary if s["method_kind"] == "target"), None)
    out = []
    best = max(multi, key=lambda s: s["tokens_per_s"]) if multi else None
    sd = max(single, key=lambda s: s["tokens_per_s"]) if single else None
    chosen = [s for s in summary if s["method_kind"] == "auto" and _chain(s)]
    for s in chosen:
        out.append(f"{s['method']}: the cost model chose a chain (single-draft SD, {s['auto']['nodes'] - 1} drafts "
                   "deep): no branching pays under this profile; counted with single-draft SD")
    for s in summary:
        t = s.get("auto") or {}
        if s["method_kind"] == "auto" and "predicted_seconds_per_step" in t:
            out.append(f"{s['method']}: predicted {t['predicted_tokens_per_step']:.2f} tokens and "
                       f"{1e3 * t['predicted_seconds_per_step']:.1f} ms a step ({t['predicted_speedup']:.2f}x the "
                       f"target alone), measured {s['block_efficiency']:.2f} tokens and {s['ms_per_step']:.1f} ms")
    refs = peers + ([base] if base else [])

    def versus(s, ref, name=None):
        m, ci, n = dr.paired_ratio(rows, s["method"], ref["method"])
        who = f"{name} ({ref['method']})" if name else ref["method"]
        return (f"  vs {who} at {ref['tokens_per_s']:.2f} tok/s: "
                f"pooled {s['tokens_per_s'] / ref['tokens_per_s']:.3f}x, per prompt {m:.3f}x ± {ci:.3f} (95%, {n} prompts)")
    if best:
        out.append(f"best multi-draft: {best['method']} at {best['tokens_per_s']:.2f} tok/s, block efficiency "
                   f"{best['block_efficiency']:.2f} (pooled)")
        out += [versus(best, sd, "best single-draft SD")] if sd else []
        out += [versus(best, ref) for ref in refs]
    if sd:
        out.append(f"best single-draft SD: {sd['method']} at {sd['tokens_per_s']:.2f} tok/s, block efficiency "
                   f"{sd['block_efficiency']:.2f} (pooled)")
        out += [versus(sd, ref) for ref in refs]
    if seq:
        bs = max(seq, key=lambda s: s["tokens_per_s"])
        out.append(f"best sequence-level rule: {bs['method']} ({bs['rule']}) at {bs['tokens_per_s']:.2f} tok/s, "
                   f"block efficiency {bs['block_efficiency']:.2f} (pooled)")
        out += [versus(bs, best, "best token-level walk")] if best else []
        out += [versus(bs, sd, "best single-draft SD")] if sd else []
        out += [versus(bs, ref) for ref in refs]
    if free:
        bf = max(free, key=lambda s: s["tokens_per_s"])
        out.append(f"best free sources alone (no draft model): {bf['method']} at {bf['tokens_per_s']:.2f} tok/s, "
                   f"block efficiency {bf['block_efficiency']:.2f} (pooled)")
        out += [versus(bf, sd, "best single-draft SD")] if sd else []
        out += [versus(bf, ref) for ref in refs]
    mixed = [s for s in ours if "model" in (s.get("sources") or ()) and len(s["sources"]) > 1]
    if mixed:  # issue 39's aims: the draft model and free sources in one tree against each alone
        bm = max(mixed, key=lambda s: s["tokens_per_s"])
        alone = [s for s in ours + seq if list(s.get("sources") or ()) == ["model"]]
        out.append(f"best mixed (draft model + free sources): {bm['method']} at {bm['tokens_per_s']:.2f} tok/s, "
                   f"block efficiency {bm['block_efficiency']:.2f} (pooled)")
        if alone:
            out.append(versus(bm, max(alone, key=lambda s: s["tokens_per_s"]), "best draft model alone"))
        one = [s for s in free if len(s["sources"]) == 1]
        if one:
            out.append(versus(bm, max(one, key=lambda s: s["tokens_per_s"]), "best single free source"))
        if free:
            out.append(versus(bm, max(free, key=lambda s: s["tokens_per_s"]), "best free sources alone"))
        out += [versus(bm, ref) for ref in refs]
    for g in dr.same_tree(rows):
        head = (f"same tree, {g['tree']}: highest block efficiency {g['best_block']} ({g['block_efficiency']:.2f})")
        if g["verdict"] == "fastest":
            out.append(f"{head} is also the fastest ({g['tokens_per_s']:.2f} tok/s) of {len(g['methods'])} verifiers")
        else:
            out.append(f"{head} at {g['best_block_tokens_per_s']:.2f} tok/s; fastest {g['fastest']} at "
                       f"{g['tokens_per_s']:.2f}: per prompt {g['ratio']:.3f}x ± {g['ci95']:.3f} (95%, {g['prompts']} "
                       f"prompts), " + {"within": "within the interval of the fastest",
                                         "slower": "slower than the fastest beyond the interval",
                                         "undetermined": "no interval from one prompt"}[g["verdict"]])
        if g["others"]:
            out.append(f"  against the fastest {g['fastest']}, per prompt (95%): " + "; ".join(
                f"{o['method']} tokens/s {o['ratio']:.3f}x ± {o['ci95']:.3f}, block efficiency {o['block_ratio']:.3f}x "
                f"± {o['block_ci95']:.3f}" for o in g["others"]))
    for g in dr.rules_against_walks(rows):
        out.append(f"same tree, {g['tree']}: {g['rule']} against the fastest walk {g['walk']}: tokens/s per prompt "
                   f"{g['ratio']:.3f}x ± {g['ci95']:.3f}, block efficiency {g['block_ratio']:.3f}x ± {g['block_ci95']:.3f} "
                   f"(95%, {g['prompts']} prompts)")
    for p in peers:
        if best is None and sd is None:
            out.append(f"peer {p['method']}: {p['tokens_per_s']:.2f} tok/s")
    spread = dr.round_spread(rows)
    if spread:
        out.append("round-to-round spread of tokens/s on one prompt and seed (median over prompts of "
                   "(max - min) / mean): " + ", ".join(f"{m} {100 * v:.1f}%" for m, v in spread.items()))
    return out


def report(rows: list[dict], methods, header: str, markdown: str | None) -> list[dict]:
    """Print (and with ``markdown`` write) the table and the headline; returns the summary."""
    summary = dr.summarize(rows, methods)
    lines = headline(summary, rows)
    table = dr.format_table(summary)
    print()
    print(table)
    print()
    print("\n".join(lines))
    if markdown:
        from multidraft.experiments.records import write_file

        write_file(markdown, header + "\n\n" + table + "\n\n" + "\n".join(f"- {x.strip()}" for x in lines) + "\n",
                   "write the --markdown file")
    return summary


def run_header(engine, prompts, max_new_tokens, rounds, temperature, threads, seed, load_start, load_end,
               cpu=None, cpu_flags=None) -> str:
    """The line above a run's table; a run and ``--summarize`` of its JSONL print the same one."""
    def num(x, fmt):
        return "?" if x is None else format(x, fmt)
    where = f"; CPU {cpu} ({', '.join(cpu_flags) if cpu_flags else 'flags unknown'})" if cpu else ""
    return (f"engine {engine}, {prompts} prompts x {max_new_tokens} tokens"
            f"{f' x {rounds} rounds' if rounds and rounds != 1 else ''}, T={num(temperature, 'g')}, "
            f"{threads} threads, seed {seed}, load average {num(load_start, '.2f')} -> {num(load_end, '.2f')}{where}")


def summarize_file(path: Path, markdown: str | None, *, writer: JsonlWriter | None = None) -> int:
    """The table and headline of a run from its JSONL alone (nothing is rerun): ``--summarize``, and
    the end of every run with ``--out`` (resumed or not: all the file's run rows, one summary path;
    ``writer`` appends the summary rows). Every run row is read in the one spelling and checked against
    the row schema (``records.read_decode_rows``: rows of older runs completed from their labels); the
    first damaged row ends the command with one line naming ``file:line``. The header counts the
    prompts and rounds the rows hold, the load average from the first session's start to the last
    session's end, the resumptions, and why the last session stopped early, if it did."""
    from multidraft.experiments.records import read_decode_rows, read_jsonl

    try:
        meta, rows, _ = read_decode_rows(path)
        ends = [r for r in read_jsonl(path)[1] if r.get("kind") == "end"]
    except (OSError, ValueError) as exc:
        raise SystemExit(str(exc) if isinstance(exc, ValueError) or not exc.filename
                         else f"{exc.filename}: {exc.strerror or exc}") from None
    meta = meta or {}
    cfg = meta.get("config") or {}
    present = list(dict.fromkeys(r["method"] for r in rows))
    methods = [m for m in cfg.get("methods") or () if m in present] + \
        [m for m in present if m not in (cfg.get("methods") or ())]  # the run's order, then any other
    per: dict[tuple, int] = {}  # rounds of each (method, prompt)
    for r in rows:
        per[(r["method"], r["prompt"])] = per.get((r["method"], r["prompt"]), 0) + 1
    lo, hi = min(per.values()), max(per.values())
    end = ends[-1] if ends else {}
    header = run_header(cfg.get("engine"), len({r["prompt"] for r in rows}), cfg.get("max_new_tokens"),
                        hi if lo == hi else f"{lo}-{hi}", cfg.get("temperature"),
                        cfg.get("threads") or meta.get("threads", "?"), cfg.get("seed"),
                        meta.get("load_average_start", [None])[0], (end.get("load_average_end") or [None])[0],
                        meta.get("cpu"), meta.get("cpu_flags"))
    if meta.get("resumed"):
        header += f"; resumed {len(meta['resumed'])} time{'s' if len(meta['resumed']) > 1 else ''}"
    if end.get("stopped"):
        header += f"; {end['stopped']}"
    print(header)
    summary = report(rows, methods, header, markdown)
    if writer is not None:
        for s in summary:
            writer.write(kind="summary", **s)
    return 0


# --- run -----------------------------------------------------------------------------------------
def auto_inputs(args, m: dr.MethodSpec):
    """``(settings, auto)`` of a V:auto:K method, checked before any model loads: ``settings`` its
    decoding settings with a placeholder tree (a K-ary tree of depth 1, one chain for a rule) until
    the tree is chosen, ``auto`` the ``decoding.auto.check_auto`` of ``--profile`` (points by
    ``--profile-statistic``) and ``--accept-stats`` (a study JSONL read by
    ``experiments.acceptance.tree_acceptance``, data set ``--accept-dataset``; without it the
    warm-up decode of ``decoding.auto.choose`` measures the acceptances after the models load).
    The method may name a sequence-level rule: its node sizes, rated with the
    ``settings.AUTO_PROXY`` walk's acceptances, as ``multidraft decode --tree auto`` does. Every
    V:auto:K method decodes with the best tree even when it is predicted slower than the target
    alone (``force_tree``): that is what the benchmark measures."""
    from multidraft.decoding.auto import AutoRequest, check_auto
    from multidraft.experiments.acceptance import tree_acceptance

    settings = m.settings.derive(max_new_tokens=args.max_new_tokens)  # its placeholder tree (dr.parse_method)
    request = AutoRequest(profile=args.profile, profile_statistic=args.profile_statistic,
                          accept_stats=args.accept_stats or None,
                          accept_dataset=args.accept_dataset if args.accept_stats else None,
                          force_tree=True, seed=args.seed, engine=args.engine, dtype=args.dtype)
    return settings, check_auto(request, settings, read_acceptance=tree_acceptance)


def _restated(exc: ValueError) -> str:
    """The message of ``exc`` with this script's flag in place of an ``ArgumentError``'s argument."""
    arg = getattr(exc, "arg", None)
    if arg is None:
        return str(exc)
    return exc.restated({"rule": "--methods"}.get(arg, "--" + arg.replace("_", "-")))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--engine", default="transformers", choices=("transformers", "llama.cpp"))
    ap.add_argument("--target", default=None, help="target model dir (transformers) or .gguf (llama.cpp); default pair otherwise")
    ap.add_argument("--draft", default=None, help="draft model dir or .gguf")
    ap.add_argument("--bf16-target", action="store_true", help="llama.cpp: the default target's BF16 GGUF")
    ap.add_argument("--draft-ftype", default=None, metavar="FTYPE",
                    help="llama.cpp: the default draft requantized to FTYPE (q4_0: the fast CPU draft); the peers use it too")
    ap.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"), help="transformers dtype")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--dataset", default="humaneval", choices=DATASETS,
                    help="the prompts' data set (multidraft.datasets; default humaneval): codeedit, mtbench2 and "
                         "aclsum copy from the context, humaneval and mtbench are fresh generation")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--methods", default=None, help="comma-separated methods (see the module docstring), or "
                    "'seq-rules' (alone or in the list): the sequence-level rules against the token walks and SD "
                    "(SEQ_RULE_METHODS)")
    ap.add_argument("--profile", default=None, help="cost profile JSON for V:auto:K methods (multidraft profile)")
    ap.add_argument("--profile-statistic", default=None, choices=("median", "mean", "min", "stored"),
                    help="V:auto:K: recompute the profile's points from its samples by this statistic "
                         "(default: median where the profile keeps samples, else its points as written; "
                         "'stored': its points as written)")
    ap.add_argument("--accept-stats", default=None, metavar="FILE",
                    help="V:auto:K: the study's acceptance JSONL (or an acceptance statistics JSON) instead of a "
                         "warm-up decode")
    ap.add_argument("--accept-dataset", default=None, metavar="NAME",
                    help="V:auto:K with a study JSONL: its data set (default --dataset, the prompts decoded here)")
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=1,
                    help="decode every prompt R times with every method (same seed; the method order reversed "
                         "every other round) and pool the rounds per prompt: timing noise averages out")
    ap.add_argument("--minutes", type=float, default=None,
                    help="stop before a (prompt, round) unit of every method that would overrun this many minutes "
                         "(projected from the units done): a run that must end by a deadline keeps whole units "
                         "(round 0 of every prompt comes first; --resume continues it)")
    ap.add_argument("--no-eos", action="store_true", help="always generate max-new-tokens tokens")
    ap.add_argument("--llama-bin", default=str(LLAMA_BIN),
                    help="directory of llama-speculative / llama-completion / llama-lookup")
    common_args(ap, threads=None, seed=0, out=None, out_type=str,
                helps={"threads": "llama.cpp threads (default: all cores)"})
    ap.add_argument("--markdown", default=None, help="also write the table and headline to this Markdown file")
    ap.add_argument("--resume", action="store_true",
                    help="continue the run of --out FILE (a new one if absent): the same settings (--rounds and "
                         "--minutes aside: a resumed run may add rounds), the (prompt, round) units it holds for "
                         "every method skipped, an interrupted unit decoded again; the table is made from all its rows")
    ap.add_argument("--summarize", metavar="JSONL", default=None,
                    help="print (and --markdown) the table and headline of an earlier run's JSONL; runs nothing")
    args = ap.parse_args(argv)
    if args.summarize:
        return summarize_file(Path(args.summarize), args.markdown)
    if args.minutes is not None and not args.minutes > 0:
        ap.error(f"--minutes must be a positive number of minutes, got {args.minutes}")

    if args.methods:  # 'seq-rules' may stand among other methods
        args.methods = ",".join(SEQ_RULE_METHODS if x.strip() == "seq-rules" else x for x in args.methods.split(","))
    try:
        methods = [parse_method(s, args.engine, args.temperature)
                   for s in (args.methods or DEFAULT_METHODS[args.engine]).split(",") if s.strip()]
    except ValueError as exc:
        ap.error(str(exc))
    if len({m.label for m in methods}) != len(methods):
        ap.error("--methods: a method is listed twice")
    if any(m.method_kind == "auto" for m in methods) and not args.profile:
        ap.error("--methods V:auto:K needs --profile FILE")
    paced_profile = None
    if any(m.paced for m in methods):  # M@paced: decoded with the profile (decoding.pace, sources.budget)
        if not args.profile:
            ap.error("--methods M@paced needs --profile FILE")
        from multidraft.decoding.auto import load_profile

        try:
            paced_profile = load_profile(args.profile, args.profile_statistic)
        except ValueError as exc:
            ap.error(_restated(exc))
    auto_in = {}
    for m in methods:      # V:auto:K: the cost profile and the study's acceptances, checked before any model loads
        if m.method_kind == "auto":
            try:
                auto_in[m.label] = auto_inputs(args, m)
            except ValueError as exc:
                ap.error(f"{m.label}: {_restated(exc)}")
    try:
        dr.check_methods([m for m in methods if m.method_kind not in PEERS], max_new_tokens=args.max_new_tokens)
    except ValueError as exc:
        ap.error(f"--methods: {exc}")
    if args.bf16_target and args.engine != "llama.cpp":
        ap.error("--bf16-target needs --engine llama.cpp")
    if args.draft_ftype is not None:
        if args.engine != "llama.cpp":
            ap.error("--draft-ftype needs --engine llama.cpp")
        from multidraft.cli._args import draft_ftype

        try:
            args.draft_ftype = draft_ftype(args.draft_ftype, args.draft)
        except ValueError as exc:
            ap.error(str(exc))
    if args.rounds < 1:
        ap.error(f"--rounds must be >= 1, got {args.rounds}")
    bin_dir = Path(args.llama_bin)
    for m in methods:
        exe = {"llama-spec": "llama-speculative", "llama-target": "llama-completion",
               "llama-lookup": "llama-lookup"}.get(m.method_kind)
        if exe and not (bin_dir / exe).is_file():
            ap.error(f"{m.label}: {bin_dir / exe} not found (build it with scripts/build_llama_tools.sh)")
    if not any(m.method_kind == "target" for m in methods):
        ap.error("--methods must include target (the reference of every ratio)")

    if args.resume and not args.out:
        ap.error("--resume needs --out FILE (the run to continue)")

    if args.accept_dataset is None:
        args.accept_dataset = args.dataset
    prompts = load_prompts(args.dataset, args.prompts + 1)  # the last one is held out for tree auto's warm-up
    held_out, prompts = prompts[-1], prompts[:-1]
    # the draft model loads only where a method runs it (free sources alone, the lookup peers and the
    # target alone need none)
    args.needs_draft = any(m.method_kind in ("hf", "llama-spec") or
                           (m.method_kind in ("tree", "auto") and m.settings.uses_draft) for m in methods)
    cfg = {k: v for k, v in vars(args).items() if k not in ("out", "markdown", "resume")} | \
        {"methods": [m.label for m in methods], "llama_bin": _home_relative(args.llama_bin)}
    if not args.out:
        return _session(ap, args, cfg, methods, prompts, held_out, auto_in, paced_profile, bin_dir, None)
    from multidraft.experiments.records import lock_results_file

    with contextlib.ExitStack() as held:
        try:
            held.enter_context(lock_results_file(args.out))  # one process at a time appends to a run's file
        except OSError as exc:  # locked by another process, or a directory that cannot be made
            ap.error(f"--out: {exc.filename + ': ' if exc.filename else ''}{exc.strerror or exc}")
        resumed = _resumable(ap, args, cfg, prompts)
        if resumed is not None and resumed.left == 0:
            print(f"decode_speed: {args.out} holds every (prompt, round) of this run: nothing left to decode")
            return summarize_file(Path(args.out), args.markdown)
        return _session(ap, args, cfg, methods, prompts, held_out, auto_in, paced_profile, bin_dir, resumed)


# --- resume ------------------------------------------------------------------------------------
FREE_ON_RESUME = ("rounds", "minutes")  # the settings a resumed run may change: it may add rounds


@dataclasses.dataclass
class Resumed:
    """An existing ``--out`` file this run continues: its meta row, its raw lines (kept verbatim),
    the (prompt, round) units it holds for every method, and how many of this run's units are left."""

    meta: dict
    lines: list  # (raw line, row) of every row after the meta row
    done: set
    left: int


def _resumable(ap, args, cfg: dict, prompts) -> Resumed | None:
    """None for a new ``--out`` (absent or empty); with ``--resume``, the file's state once its meta row
    shows the same run (``FREE_ON_RESUME`` aside) on the same CPU; else the one-line refusal naming the
    first differing setting. Without ``--resume`` an existing file is refused (rows are never appended
    to a finished run by accident)."""
    from multidraft.experiments.records import read_jsonl

    path = Path(args.out)
    if not path.exists() or (path.is_file() and path.stat().st_size == 0):
        return None
    if not args.resume:
        ap.error(f"--out {path} exists: --resume continues that run, or name a new file")
    try:
        meta, _ = read_jsonl(path)  # refuses rows of another run, a second meta row, damaged lines
    except (OSError, ValueError) as exc:
        ap.error(f"--resume: {exc}")
    if meta is None or meta.get("kind") != "decode_speed" or not isinstance(meta.get("config"), dict):
        ap.error(f"--resume: {path} is not a decode_speed results file (no decode_speed meta row)")
    diff = dr.first_difference(meta["config"], cfg, FREE_ON_RESUME)
    if diff is None and meta.get("seed") != args.seed:
        diff = ("seed", meta.get("seed"), args.seed)
    if diff is not None:
        key, old, new = diff
        ap.error(f"--resume: {path} was run with another --{key.replace('_', '-')} ({json.dumps(old)} -> "
                 f"{json.dumps(new)}); resume it with its own settings or name a new --out")
    cpu = provenance()["cpu"]
    if meta.get("cpu") and cpu and meta["cpu"] != cpu:
        ap.error(f"--resume: {path} was timed on CPU {meta['cpu']!r}, this machine's is {cpu!r}: its tokens/s "
                 "cannot be pooled; name a new --out")
    lines = []
    for raw in path.read_bytes().split(b"\n"):
        if not raw.strip():
            continue
        try:
            row = json.loads(raw)
        except ValueError:  # the torn last line of an interrupted write (read_jsonl refused any other)
            continue
        if row.get("type") != "meta":
            lines.append((raw, row))
    done = dr.complete_units([r for _, r in lines if r.get("kind") == "run"], cfg["methods"])
    ids = {pid for pid, _ in prompts}
    left = sum((pid, rnd) not in done for pid in ids for rnd in range(args.rounds))
    return Resumed(meta, lines, done, left)


def _reopen(path: Path, resumed: Resumed, record: dict) -> JsonlWriter:
    """The resumed file rewritten once (atomically: ``records.write_file``) and opened for appending:
    its meta row with this resumption added to ``resumed`` (time, load, versions, ...), then its rows
    as they were, less the rows of units some method lacks (an interrupted unit, decoded again) and
    the earlier summary rows (the summary is rebuilt from all the run rows at the end); the earlier
    ``end`` rows stay (each session's record)."""
    from multidraft.experiments.records import write_file

    meta = dict(resumed.meta, resumed=[*resumed.meta.get("resumed", []), record])
    keep = [raw for raw, r in resumed.lines if r.get("kind") == "end" or
            (r.get("kind") == "run" and (r["prompt"], int(r.get("round") or 0)) in resumed.done)]
    write_file(path, b"".join(x + b"\n" for x in [json.dumps(meta).encode("utf-8"), *keep]),
               "rewrite the resumed results file")
    return JsonlWriter(path, meta["config"], meta.get("seed"), keyed=meta.get("keyed") or ())


def _session(ap, args, cfg: dict, methods, prompts, held_out, auto_in, paced_profile, bin_dir: Path,
             resumed: Resumed | None) -> int:
    """Load the models, decode what is left of the run (every unit, or those ``resumed`` lacks), write
    the rows and print the table: with ``--out`` from every row of the file (``summarize_file``, the
    one summary of a file, resumed or not), else from this run's rows."""
    instruction = instruction_for(args.dataset)
    target, draft, tok = load_models(args)
    if args.engine == "llama.cpp":
        threads = target.n_threads
        eos = None if args.no_eos else target.eos_token_ids
    else:
        threads = torch.get_num_threads()
        eos = None if args.no_eos else tok.eos_token_id
    encode = lambda text: encode_prompt(tok, text, instruction=instruction)  # noqa: E731
    encoded = [(tid, encode(text)) for tid, text in prompts]
    load0 = load_average() or [float("nan")] * 3
    where = provenance(also=ENGINE_PACKAGES)  # the CPU of this timing: model and the flags that price width
    print(f"decode_speed: engine {args.engine}, {len(encoded)} {args.dataset} prompts, {args.max_new_tokens} new tokens, "
          f"T={args.temperature:g}, {threads} threads, seed {args.seed}, load average {load0[0]:.2f}"
          + (f"; resumed: {len(resumed.done)} (prompt, round) units done, {resumed.left} left" if resumed else ""),
          flush=True)
    if load0[0] > 0.7:
        print(f"note: load average {load0[0]:.2f} at the start: other processes share the cores "
              "(llama.cpp's multi-threaded decode slows down sharply under load)", flush=True)

    # warm-up: the first decodes of a process pay one-off costs (graph allocation, kernels)
    dr.warm_up(target, draft, encoded[0][1], depth=4)

    # tree auto: the tree from the profile and the acceptances (a warm-up decode on the held-out prompt
    # without --accept-stats: decoding.auto's one warm-up rule)
    for i, m in enumerate(methods):
        if m.method_kind != "auto":
            continue
        from multidraft.decoding.auto import choose

        settings, auto = auto_in[m.label]
        paths, got = choose(target, draft, encode(held_out[1]), settings, auto, eos, _eprint)
        if paths is None:
            raise SystemExit(f"{m.label}: no tree with drafts under this profile and these acceptances")
        t = got["tree"]
        info = {"nodes": t["nodes"], "depth": t["depth"], "paths": t["paths"],
                "predicted_tokens_per_s": t["tokens_per_s"], "predicted_speedup": got["predicted_speedup"],
                "predicted_tokens_per_step": t["expected_tokens"],
                "predicted_seconds_per_step": t["seconds_per_step"],
                "per_step_seconds": got["per_step_seconds"], "per_node_seconds": got["per_node_seconds"],
                "acceptance": got["accept_stats"]["source"] or "warm-up decode",
                "acceptance_model": got["acceptance_model"], "profile_statistic": got["profile_statistic"]}
        paths = tuple(tuple(p) for p in paths)
        earlier = next((r.get("auto") for _, r in (resumed.lines if resumed else ())
                        if r.get("kind") == "run" and r.get("method") == m.label and r.get("auto")), None)
        if earlier is not None and earlier.get("paths") != [list(p) for p in paths]:
            raise SystemExit(f"--resume: {m.label} chose another tree than the run being resumed "
                             f"({earlier.get('paths')} -> {[list(p) for p in paths]}); name a new --out")
        methods[i] = m.chosen(paths, info)
        print(f"{m.label}: tree of {t['nodes']} nodes, depth {t['depth']}, predicted "
              f"{got['predicted_speedup']:.2f}x target-only", flush=True)

    writer = None
    if resumed is not None:
        writer = _reopen(Path(args.out), resumed, {
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "load_average_start": load_average(),
            "versions": where["versions"], "code": code_version(), "command": " ".join(sys.argv),
            "rounds": args.rounds, "minutes": args.minutes, "threads": threads, "units_done": len(resumed.done),
            "units_left": resumed.left})
    elif args.out:
        writer = JsonlWriter(Path(args.out), cfg, args.seed, kind="decode_speed", **where,
                             load_average_start=list(load0), threads=threads, machine=where["platform"])
    done = resumed.done if resumed is not None else set()
    t_all = time.perf_counter()

    def log_row(row, n, total):
        rnd = f" round {row['round']}" if args.rounds > 1 else ""
        _eprint(f"[{n}/{total}] {row['prompt']}{rnd} "
                f"{row['method']}: {row['new_tokens']} tokens, {row['tokens_per_s']:.2f} tok/s, "
                f"block eff {row['block_efficiency']:.2f}")

    try:
        with tempfile.TemporaryDirectory() as tmp:
            files = {}
            if args.engine == "llama.cpp":  # the peers read each prompt, chat template applied, from a file
                for pi, (tid, text) in enumerate(prompts):
                    files[tid] = Path(tmp) / f"prompt{pi}.txt"
                    files[tid].write_text(target.chat_prompt(prompt_messages(text, instruction)), encoding="utf-8")
            methods = [bind_peer(m, args, target, draft, tok, eos, files, bin_dir, threads) for m in methods]
            # round-major: round 0 of every prompt first, so a run cut by --minutes still covers every prompt
            out = dr.run(target, draft, encoded, methods, seed=args.seed, max_new_tokens=args.max_new_tokens,
                         eos_token_id=eos, rounds=args.rounds,
                         write=(lambda row: writer.write(**row)) if writer else None, on_row=log_row,
                         time_budget_s=None if args.minutes is None else 60.0 * args.minutes, log=_eprint,
                         cost_profile=paced_profile, rounds_first=True, skip_unit=lambda pid, rnd: (pid, rnd) in done)
        load1 = load_average() or [float("nan")] * 3
        if writer:
            writer.write(kind="end", load_average_end=list(load1), wall_seconds=time.perf_counter() - t_all,
                         prompts_done=out.prompts_done, stopped=out.stopped)
            summarize_file(Path(args.out), args.markdown, writer=writer)  # every row of the file, resumed or not
        else:
            header = run_header(args.engine, out.prompts_done, args.max_new_tokens, args.rounds, args.temperature,
                                threads, args.seed, load0[0], load1[0], where["cpu"], where["cpu_flags"]) + \
                (f"; {out.stopped}" if out.stopped else "")
            print(header)
            report(out.rows, methods, header, args.markdown)
    finally:
        if writer:
            writer.close()
    print(f"load average start {load0[0]:.2f}, end {load1[0]:.2f}; wall time {time.perf_counter() - t_all:.0f} s")
    return 0


def load_models(args):
    """``(target, draft, tokenizer)`` of ``--engine`` (llama.cpp: the GGUF target is its own tokenizer);
    draft None when no method runs one (``args.needs_draft`` False)."""
    from multidraft.decoding.pair import load_pair

    llama = args.engine == "llama.cpp"
    needs = getattr(args, "needs_draft", True)
    return load_pair(args.engine, target=args.target, draft=args.draft if needs else False,
                     dtype=None if llama else getattr(torch, args.dtype), bf16_target=args.bf16_target,
                     draft_ftype=args.draft_ftype if needs else None, n_threads=args.threads if llama else None, log=_eprint)


def _home_relative(path) -> str:
    """``path`` with the user's home written ``~`` (result files name no machine's own paths)."""
    p, home = str(path), str(Path.home())
    return "~" + p[len(home):] if p == home or p.startswith(home + os.sep) else p


def bind_peer(m: dr.MethodSpec, args, target, draft, tok, eos, files: dict, bin_dir: Path, threads: int) -> dr.MethodSpec:
    """The method with its peer callable ``peer(prompt_id, input_ids, seed) -> measurements`` bound
    to the loaded models (methods that are not peers come back as they are)."""
    kind = m.method_kind
    if kind not in PEERS:
        return m
    n, temp, use_eos = args.max_new_tokens, args.temperature, not args.no_eos
    if kind == "hf":
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        peer = lambda pid, ids, seed: hf_assisted(target, draft, ids, max_new_tokens=n, temperature=temp,  # noqa: E731
                                                  eos=eos, pad=pad, seed=seed)
    elif kind == "hf-lookup":
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        peer = lambda pid, ids, seed: hf_lookup(target, ids, num_tokens=dict(m.facts)["depth"],  # noqa: E731
                                                max_new_tokens=n, temperature=temp, eos=eos, pad=pad, seed=seed)
    elif kind == "llama-lookup":
        peer = lambda pid, ids, seed: llama_lookup(  # noqa: E731
            bin_dir, target.path, files[pid], max_new_tokens=n, temperature=temp, seed=seed % 0xFFFFFFFF,
            threads=threads, draft_max=dict(m.facts)["depth"], eos=use_eos)
    elif kind == "llama-spec":
        peer = lambda pid, ids, seed: llama_speculative(  # noqa: E731
            bin_dir, target.path, draft.path, files[pid], max_new_tokens=n, temperature=temp, seed=seed % 0xFFFFFFFF,
            threads=threads, draft_max=dict(m.facts)["depth"], n_parallel=dict(m.facts)["k"], eos=use_eos)
    else:
        peer = lambda pid, ids, seed: llama_completion(  # noqa: E731
            bin_dir, target.path, files[pid], max_new_tokens=n, temperature=temp, seed=seed % 0xFFFFFFFF,
            threads=threads, eos=use_eos)
    return dataclasses.replace(m, peer=peer)


if __name__ == "__main__":
    sys.exit(main())
