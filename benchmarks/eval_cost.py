"""Per-position cost of the evaluation step (alpha* and each verifier's cell), and Ray's overhead.

Builds synthetic lumped position stores (no model) whose positions all have a support of M
real tokens plus the lumped tail token (heavy-tailed target, tempered and perturbed draft,
tails p(T) = q(T) = 1e-4), and times, single-threaded, exactly what
``multidraft experiment acceptance`` runs per cell on one 64-position shard:

* ``alpha*``: ``acceptance.optimal`` (exact, batched over the shard);
* each verifier: ``acceptance.shard_acceptance`` (``draws`` draft tuples per position, the
  exact conditional acceptance per draw, or plain Monte Carlo where a verifier has no
  ``output_distribution``).

Printed: milliseconds per position for every (M, law, K) and verifier, and the sum over the
row (one (law, K) of one store: alpha* plus every verifier). Then, unless ``--no-ray``, the
Ray overhead: a cell of ``--ray-shards`` shards evaluated by ``local_map`` and by a
``ray_mapper`` on a fresh local cluster of 1 and of 2 worker CPUs, in the same run, with the
rows checked equal.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/eval_cost.py [--supports 200,1000,5000] \\
        [--ks 2,4,8] [--laws iid,wor,greedy] [--draws 64] [--positions 64] [--ray-shards 8] [--no-ray]

The numbers are from one run on a shared machine (no repetitions): read them as costs to
within tens of percent, and compare columns of the same run.
"""
from __future__ import annotations

import argparse
import time

import torch

from multidraft import verifiers as V
from multidraft.experiments import acceptance, store


def position_set(n: int, m: int, seed: int) -> store.PositionSet:
    """n positions with a support of m tokens each (token ids 0..m-1) and tails of 1e-4."""
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, m, generator=g, dtype=torch.float64) * 2.0
    top = max(1, m // 100)
    logits[:, :top] += 6.0 * torch.rand(n, top, generator=g, dtype=torch.float64)
    p = torch.softmax(logits, -1) * (1 - 1e-4)
    q = torch.softmax(logits / 1.3 + 0.6 * torch.randn(n, m, generator=g, dtype=torch.float64), -1) * (1 - 1e-4)
    rows = [(torch.arange(m), p[i], q[i], 1e-4, 1e-4) for i in range(n)]
    info = {"dataset": f"synthetic-{m}", "t_target": 1.0, "t_draft": 1.0, "settings": {"eps": 1e-4}}
    return store.from_rows(rows, info)


def per_position_costs(args) -> None:
    names = args.verifiers.split(",") if args.verifiers else acceptance.default_verifiers()
    laws = args.laws.split(",")
    ks = [int(k) for k in args.ks.split(",")]
    short = {"greedy_optimal": "g_opt", "khisti_is": "khisti", "specinfer": "specinf"}
    head = f"{'M':>6} {'law':>6} {'K':>2} {'alpha*':>8} " + " ".join(f"{short.get(n, n):>8}" for n in names) + f" {'row':>8}"
    print(f"ms per position, 1 thread, draws {args.draws}, shards of {args.positions} positions ('-': verifier does not support the law/K)")
    print(head)
    P, Q = store.lumped(position_set(2, 50, seed=0))  # warm-up: first calls (imports, caches) are not timed
    for law in laws:
        for k in ks:
            acceptance.optimal(P, Q, law, k)
            for name in names:
                if V.get(name).supports(law, k):
                    acceptance.shard_acceptance(name, P, Q, law, k, 2, 0, ("warm-up",), 0)
    for m in [int(x) for x in args.supports.split(",")]:
        P, Q = store.lumped(position_set(args.positions, m, seed=m))
        n = P.shape[0]
        for law in laws:
            for k in ks:
                t0 = time.perf_counter()
                acceptance.optimal(P, Q, law, k)
                cells = [1e3 * (time.perf_counter() - t0) / n]
                for name in names:
                    if not V.get(name).supports(law, k):
                        cells.append(None)
                        continue
                    t0 = time.perf_counter()
                    acceptance.shard_acceptance(name, P, Q, law, k, args.draws, 0, ("bench", m, law, k, name), 0)
                    cells.append(1e3 * (time.perf_counter() - t0) / n)
                total = sum(c for c in cells if c is not None)
                print(f"{m:>6} {law:>6} {k:>2} " + " ".join(f"{c:8.2f}" if c is not None else f"{'-':>8}" for c in cells)
                      + f" {total:8.2f}", flush=True)


def _shape(P, Q):
    return tuple(P.shape)


def ray_overhead(args) -> None:
    from multidraft.experiments.distributed import import_ray, ray_mapper

    ray = import_ray()
    print(f"\nRay overhead: one cell of {args.ray_shards} shards x {acceptance.SHARD} positions, draws {args.draws}, "
          "first task per worker not timed, best of --reps")
    print(f"{'M':>6} {'verifier':>9} {'local s':>8} {'ray1 s':>8} {'ray2 s':>8} {'+ms/shard (1 cpu)':>18} {'speed-up (2 cpus)':>18}")
    setups = [(200, "specinfer", "iid", 2), (1000, "rrs_wor", "wor", 4)]
    data, local, bare = {}, {}, {}
    for m, name, law, k in setups:
        P, Q = store.lumped(position_set(args.ray_shards * acceptance.SHARD, m, seed=m))
        key = ("bench", m, name)
        data[m] = (P, Q)
        acceptance.cell_acceptance(name, P[:1], Q[:1], law, k, args.draws, 0, key)  # warm-up
        ts = []
        for _ in range(args.reps):
            t1 = time.perf_counter()
            ref = acceptance.cell_acceptance(name, P, Q, law, k, args.draws, 0, key)
            ts.append(time.perf_counter() - t1)
        local[m] = (min(ts), ref)
    for cpus in (1, 2):
        t0 = time.perf_counter()
        with ray_mapper("local", num_cpus=cpus) as mapper:
            mapper._connect()  # otherwise done on the first cell
            start = time.perf_counter() - t0
            for m, name, law, k in setups:
                P, Q = data[m]
                key = ("bench", m, name)
                # warm every worker (process start, imports, first task) outside the timing
                mapper([(name, P[:1], Q[:1], law, k, 2, 0, key, b) for b in range(2 * cpus)])
                ts = []
                for _ in range(args.reps):
                    t1 = time.perf_counter()
                    got = acceptance.cell_acceptance(name, P, Q, law, k, args.draws, 0, key, mapper)
                    ts.append(time.perf_counter() - t1)
                data[(m, cpus)] = (min(ts), got)
            if cpus == 1:  # the bare cost of a shard task: put its P, Q, run nothing, fetch the result
                echo = ray.remote(num_cpus=1)(_shape)
                for m in data:
                    if isinstance(m, int):
                        P, Q = data[m]
                        trip = []
                        for _ in range(30):
                            t1 = time.perf_counter()
                            ray.get(echo.remote(ray.put(P[:acceptance.SHARD].clone()), ray.put(Q[:acceptance.SHARD].clone())))
                            trip.append(time.perf_counter() - t1)
                        bare[m] = 1e3 * sorted(trip)[len(trip) // 2]
        print(f"ray.init + connect, local cluster of {cpus} cpu(s): {start:.1f} s (shut down at exit)", flush=True)
    for m, ms in bare.items():
        print(f"bare shard task round trip (put P, Q of 64 x {m + 1} float64, empty task, get), median of 30: {ms:.1f} ms")
    for m, name, law, k in setups:
        lt, ref = local[m]
        (r1, g1), (r2, g2) = data[(m, 1)], data[(m, 2)]
        for g in (g1, g2):
            assert torch.equal(g[0], ref[0]) and torch.equal(g[1], ref[1]), "Ray rows differ from the local rows"
        print(f"{m:>6} {name:>9} {lt:8.2f} {r1:8.2f} {r2:8.2f} {1e3 * (r1 - lt) / args.ray_shards:18.1f} "
              f"{lt / r2:18.2f}")
    assert not ray.is_initialized()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--supports", default="200,1000,5000", help="support sizes M (tokens per position)")
    ap.add_argument("--laws", default="iid,wor,greedy")
    ap.add_argument("--ks", default="2,4,8")
    ap.add_argument("--draws", type=int, default=64)
    ap.add_argument("--positions", type=int, default=acceptance.SHARD, help="positions per timed shard")
    ap.add_argument("--verifiers", default=None, help="default: every registered verifier but lp_optimal")
    ap.add_argument("--ray-shards", "--ray-blocks", dest="ray_shards", type=int, default=8,
                    help="shards of 64 positions in the Ray-overhead cell (--ray-blocks: its old name)")
    ap.add_argument("--reps", type=int, default=3, help="repetitions of each Ray-overhead timing (the minimum is shown)")
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--no-costs", action="store_true", help="only the Ray overhead")
    args = ap.parse_args()
    torch.set_num_threads(1)
    if not args.no_costs:
        per_position_costs(args)
    if not args.no_ray:
        ray_overhead(args)


if __name__ == "__main__":
    main()
