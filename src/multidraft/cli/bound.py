"""``multidraft bound``: the optimal acceptance alpha* for each draft law and K."""
from __future__ import annotations

import json

import torch

from ..drafts import LAW_KINDS, parse_laws
from ._args import k_list


def register(sub) -> None:
    ap = sub.add_parser(
        "bound",
        help="optimal acceptance alpha* (the ceiling of every verifier) per draft law and K",
        description=(
            "Read a target distribution p and a draft distribution q (.npy probability vectors, or logit "
            "vectors with --logits and a temperature) and print the exact optimal acceptance alpha* for "
            "each draft law and K, computed by the transport dual at full vocabulary size. A 2-D q of "
            "shape [K, V] also gives the 'independent' law (draft j from row j); the other laws then use row 0."
        ),
    )
    ap.add_argument("--p", metavar="P.npy", required=True, help="target: 1-D .npy of probabilities (or logits)")
    ap.add_argument("--q", metavar="Q.npy", required=True, help="draft: 1-D [V] or 2-D [K, V] .npy of probabilities (or logits)")
    ap.add_argument("--logits", action="store_true", help="the files hold logits: p = softmax(logits / temperature)")
    ap.add_argument("--temperature", type=float, default=1.0, help="temperature for --logits (default 1.0)")
    ap.add_argument("--draft-temperature", type=float, default=None, help="temperature for the draft logits (default: --temperature)")
    ap.add_argument("--k", default="1-8", help="numbers of drafts, e.g. 1-8 or 2,4 (default 1-8)")
    ap.add_argument("--laws", default="iid,wor,greedy,independent", help="comma-separated laws (default all four)")
    ap.add_argument("--show-set", action="store_true", help="also print the minimising token set H (the certificate)")
    ap.add_argument("--max-set", type=int, default=20, help="print at most this many token ids of each set (default 20)")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of the table")
    ap.set_defaults(func=run)


def _load(path: str, name: str, logits: bool, temperature: float, ndims: tuple[int, ...] = (1,)) -> torch.Tensor:
    """The array of ``--name`` (shape, dtype, finiteness checked, the path in every error:
    ``experiments.verifier_table.load_array``), as probabilities (softmax with ``--logits``)."""
    from ..experiments.verifier_table import load_array

    from ..sampling import process_logits

    x = load_array(path, f"--{name}", ndims=ndims)
    if logits:  # the one logits -> probabilities function (temperature 0: one-hot at the first maximum)
        x = process_logits(x.double(), temperature, dtype=torch.float64)
    return x


def run(args) -> int:
    from .._validate import as_ks, as_probs, as_temperature
    from ..drafts import greedy, iid, independent, without_replacement
    from ..limits import optimal_acceptance

    laws = parse_laws(args.laws, LAW_KINDS, "laws")   # checked kinds from here on
    ks = as_ks(k_list(args.k), "k")                   # each K >= 1, checked once
    t = as_temperature(args.temperature, "temperature")  # tiny temperatures refused (MIN_TEMPERATURE)
    dt = t if args.draft_temperature is None else as_temperature(args.draft_temperature, "draft_temperature")
    p = _load(args.p, "p", args.logits, t)
    q = _load(args.q, "q", args.logits, dt, ndims=(1, 2))
    if q.shape[-1] != p.shape[-1]:
        raise ValueError(f"--q {args.q} must be [V] or [K, V] with V = {p.shape[-1]} (the length of --p {args.p}), "
                         f"got shape {tuple(q.shape)}")
    for flag, path, x in (("--p", args.p, p), ("--q", args.q, q)):
        try:
            as_probs(x, flag)
        except ValueError as exc:
            raise ValueError(f"{flag}: {path}: {str(exc).removeprefix(flag).lstrip(': ')}") from None
    qs = q if q.ndim == 2 else None
    q1 = q[0] if q.ndim == 2 else q
    nnz = int((q1 > 0).sum())
    rows = []  # one row per (law, K): {"law", "K", "acceptance"} (+ "set_size", "set" with --show-set)
    for k in ks:
        for law in laws:
            row = {"law": law, "K": k, "acceptance": None}
            rows.append(row)
            if law == "iid":
                L = iid(q1, k)
            elif law in ("wor", "greedy"):
                if k > nnz:
                    continue
                L = without_replacement(q1, k) if law == "wor" else greedy(q1, k)
            else:
                if qs is None or k > qs.shape[0]:
                    continue
                L = independent(qs[:k])
            a, H = optimal_acceptance(p, L, return_set=True)
            row["acceptance"] = a
            if args.show_set:
                ids = torch.nonzero(H).flatten().tolist()
                row["set_size"] = len(ids)
                row["set"] = ids[: args.max_set]
    if args.json:
        print(json.dumps({"V": int(p.shape[-1]), "laws": list(laws), "rows": rows}))
        return 0
    cell = {(r["law"], r["K"]): r for r in rows}
    print(f"optimal acceptance alpha* (V = {p.shape[-1]}, 1 - TV = {1 - 0.5 * float((p - q1).abs().sum()):.6f})")
    head = "  K " + "".join(f"{law:>13}" for law in laws)
    print(head)
    for k in ks:
        vals = [cell[(law, k)]["acceptance"] for law in laws]
        print(f"{k:>3} " + "".join(f"{a:13.6f}" if a is not None else f"{'-':>13}" for a in vals))
    if args.show_set:
        print("\nminimising sets H (alpha* = 1 + p(H) - Q(all K drafts in H)):")
        for r in rows:
            if r["acceptance"] is not None:
                more = r["set_size"] - len(r["set"])
                print(f"  K={r['K']} {r['law']}: |H| = {r['set_size']}  {r['set']}" + (f" ... (+{more})" if more > 0 else ""))
    return 0
