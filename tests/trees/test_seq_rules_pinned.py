"""The sequence-level rules reproduce their recorded outputs: same verdicts for the same generator
(and the same number of uniforms read), same exact laws, same expected tokens.

``seq_rules_pinned.json`` holds, for each case below (a rule and one sampled tree, duplicate
drafts included), ``verify`` on generator seeds 0..23 (accepted path, emitted token, and the
next integer the generator gives after the verdict: it tells how many uniforms the rule read),
``output_distribution`` and ``expected_tokens``. Recorded before the rules' recursions and
backward scans were merged into shared helpers (the refactor must change nothing); regenerate
only on purpose: ``PYTHONPATH=src python tests/trees/test_seq_rules_pinned.py``.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from multidraft import trees

PINS = Path(__file__).with_name("seq_rules_pinned.json")
SEEDS = 24
TOL = 1e-14  # laws and values: the same arithmetic, read on any CPU


def _float32_chain() -> trees.DraftTree:
    """A chain of float32 rows at V = 200 that sum to 1 only to ~1e-7 (the decoder's rows)."""
    V, g = 200, torch.Generator().manual_seed(5)
    rows, logits = {}, {}

    def row(key):  # p near q: the same logits at a prefix, p's with noise
        if key not in rows:
            z = logits.setdefault(key[1:], 2.0 * torch.randn(V, generator=g))
            rows[key] = torch.softmax(z + (0.5 * torch.randn(V, generator=g) if key[0] == "p" else 0.0), -1).float()
        return rows[key]

    tree = trees.chain(3).new_tree()
    i = 0
    for _ in range(3):
        q = row(("q",) + tree.prefix(i))
        tree.nodes[i].q = q
        t = int(torch.multinomial(q.double(), 1, generator=g))
        i = tree.add_drafts(i, [t])[0]
    tree.set_target(lambda j: row(("p",) + tree.prefix(j)))
    return tree


def cases():
    """(name, rule, tree): every rule on trees of the laws it takes, duplicates included."""
    out = []

    def add(name, rule, law, V, mseed, tseed, style="random"):
        model = trees.TableModel.random(V, seed=mseed, style=style)
        out.append((name, rule, law.sample(model, torch.Generator().manual_seed(tseed))))

    add("block chain(3) V4", trees.get("block"), trees.chain(3), 4, 1, 2)
    add("block chain(3) V3 q_zero", trees.get("block"), trees.chain(3), 3, 2, 3, "q_zero")
    out.append(("block chain(3) V200 float32", trees.get("block"), _float32_chain()))
    add("traversal kary(3,2) V3", trees.get("traversal"), trees.kary(3, 2), 3, 3, 4)
    add("traversal sequences(2,3) V3", trees.get("traversal"), trees.sequences(2, 3), 3, 4, 1)
    add("traversal sequences(2,2) V3 mixed", trees.get("traversal"), trees.sequences(2, 2), 3, 12, 7, "mixed")
    add("traversal split sequences(3,2) V3", trees.get("traversal", split=True), trees.sequences(3, 2), 3, 5, 2)
    add("gbv sequences(3,2) V3", trees.get("gbv"), trees.sequences(3, 2), 3, 6, 0)
    add("gbv kary(2,2) V4", trees.get("gbv"), trees.kary(2, 2), 4, 7, 3, "mixed")
    add("spectr_gbv sequences(3,2) V3", trees.get("spectr_gbv"), trees.sequences(3, 2), 3, 8, 4)
    add("spectr_gbv kary(2,2) V3", trees.get("spectr_gbv"), trees.kary(2, 2), 3, 9, 1, "mixed")
    add("univer kary(2,2,wor) V4", trees.get("univer"), trees.kary(2, 2, "wor"), 4, 10, 2)
    add("univer kary(3,2,iid) V3", trees.get("univer"), trees.kary(3, 2), 3, 3, 4)
    add("univer sequences(2,2) V3 mixed", trees.get("univer"), trees.sequences(2, 2), 3, 12, 7, "mixed")
    add("univer ot kary(2,2,wor) V3", trees.get("univer", plan="ot"), trees.kary(2, 2, "wor"), 3, 11, 6)
    return out


def record(rule, tree) -> dict:
    verdicts = []
    for s in range(SEEDS):
        g = torch.Generator().manual_seed(s)
        v = rule.verify(tree, g)
        verdicts.append([list(v.path), int(v.token), int(torch.randint(1 << 30, (), generator=g))])
    law = rule.output_distribution(tree)
    return {"verdicts": verdicts, "law": [[list(y), w] for y, w in law.items()],
            "expected_tokens": rule.expected_tokens(tree)}


@pytest.mark.parametrize("name, rule, tree", cases(), ids=lambda x: x if isinstance(x, str) else "")
def test_rules_reproduce_their_recorded_outputs(name, rule, tree, one_thread):
    want = json.loads(PINS.read_text())[name]
    got = record(rule, tree)
    assert got["verdicts"] == want["verdicts"], name
    assert [y for y, _ in got["law"]] == [y for y, _ in want["law"]], name  # same sequences, same order
    assert max(abs(a[1] - b[1]) for a, b in zip(got["law"], want["law"])) <= TOL, name
    assert abs(got["expected_tokens"] - want["expected_tokens"]) <= TOL, name


def test_the_cases_cover_duplicate_drafts_and_every_rule():
    cs = cases()
    assert {type(r).__name__ for _, r, _ in cs} >= {"BlockVerification", "TraversalVerification", "GreedyBlockVerification",
                                                     "SpecTrGBV", "UniVer"}
    dup = {n for n, _, t in cs if any(len(set(nd.drafts)) < len(nd.drafts) for nd in t.nodes)}
    assert {"traversal kary(3,2) V3", "univer kary(3,2,iid) V3", "gbv kary(2,2) V4"} <= dup


if __name__ == "__main__":
    PINS.write_text(json.dumps({n: record(r, t) for n, r, t in cases()}, indent=None) + "\n", encoding="utf-8")
    print(f"wrote {PINS}")
