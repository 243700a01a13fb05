"""``multidraft bound``: the optimal acceptance alpha* for each draft law and K."""
from __future__ import annotations

import json

from .._errors import ArgumentError
from ._args import k_list

# torch and the library load in run(), after the arguments are parsed: a bad flag is refused at once


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
    ap.add_argument("--temperature", type=float, default=None, help="temperature for --logits (default 1.0)")
    ap.add_argument("--draft-temperature", type=float, default=None,
                    help="temperature for the draft logits with --logits (default: --temperature)")
    ap.add_argument("--k", default="1-8", help="numbers of drafts, e.g. 1-8 or 2,4 (default 1-8)")
    ap.add_argument("--laws", default=None,
                    help="comma-separated laws (default: iid,wor,greedy, and independent when --q is 2-D)")
    ap.add_argument("--show-set", action="store_true", help="also print the minimising token set H (the certificate)")
    ap.add_argument("--max-set", type=int, default=None,
                    help="with --show-set: print at most this many token ids of each set (default 20)")
    ap.add_argument("--json", action="store_true", help="print JSON rows instead of the table")
    ap.set_defaults(func=run)


def _load(path: str, name: str, logits: bool, temperature: float, ndims: tuple[int, ...] = (1,)):
    """The array of ``--name`` (shape, dtype, finiteness checked, the path in every error:
    ``experiments.verifier_table.load_array``), as probabilities (softmax with ``--logits``;
    a logit of -inf is a masked token, probability 0, as the samplers treat it).
    Returns a float64 tensor of the file's shape."""
    import torch

    from ..experiments.verifier_table import load_array
    from ..sampling import process_logits

    x = load_array(path, f"--{name}", ndims=ndims, neg_inf=logits)  # [V] or [K, V]
    if logits:  # the one logits -> probabilities function (temperature 0: one-hot at the first maximum)
        masked = torch.isneginf(x).all(dim=-1)  # [] or [K]
        if bool(masked.any()):
            at = "" if x.ndim == 1 else f" (row {int(masked.nonzero()[0])})"
            raise ValueError(f"--{name}: {path}: every logit is -inf{at}: no token has positive probability")
        x = process_logits(x.double(), temperature, dtype=torch.float64)
    return x


def check_args(args) -> None:
    """The flags that only some inputs read, checked before any file is read: each one given
    where it would be ignored is refused, naming what reads it."""
    bad = next((k for k in k_list(args.k) if k < 1), None)  # before torch loads (as_ks checks it again, fully)
    if bad is not None:
        raise ArgumentError("k", f"must be >= 1 (number of drafts), got {bad}")
    if not args.logits:
        for flag, val in (("--temperature", args.temperature), ("--draft-temperature", args.draft_temperature)):
            if val is not None:
                raise ValueError(f"{flag} applies to --logits only (the files hold probabilities without it)")
    if args.max_set is not None:
        if not args.show_set:
            raise ValueError("--max-set applies to --show-set only")
        if args.max_set < 0:
            raise ValueError(f"--max-set must be >= 0, got {args.max_set}")


def run(args) -> int:
    check_args(args)
    import torch

    from .._validate import as_ks, as_probs, as_temperature
    from ..drafts import LAW_KINDS, greedy, iid, independent, parse_laws, without_replacement
    from ..limits import optimal_acceptance

    laws = parse_laws(args.laws, LAW_KINDS, "laws") if args.laws is not None else None  # checked kinds from here on
    ks = as_ks(k_list(args.k), "k")                   # each K >= 1, checked once
    t = as_temperature(1.0 if args.temperature is None else args.temperature, "temperature")  # MIN_TEMPERATURE
    dt = t if args.draft_temperature is None else as_temperature(args.draft_temperature, "draft_temperature")
    max_set = 20 if args.max_set is None else args.max_set
    p = _load(args.p, "p", args.logits, t)
    q = _load(args.q, "q", args.logits, dt, ndims=(1, 2))
    if laws is None:  # the default: every law the files describe
        laws = LAW_KINDS if q.ndim == 2 else tuple(x for x in LAW_KINDS if x != "independent")
    elif "independent" in laws and q.ndim == 1:
        raise ValueError(f"--laws independent needs a 2-D --q [K, V] (one row per draft); {args.q} is 1-D")
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
                row["set"] = ids[:max_set]
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
