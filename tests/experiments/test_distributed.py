"""Sharded evaluation: the Ray path and any shard order give the single-process rows exactly."""
from __future__ import annotations

import sys
from types import SimpleNamespace

import pytest
import torch

from multidraft.cli import main
from multidraft.experiments import acceptance, distributed, store
from multidraft.experiments.records import JsonlWriter, read_jsonl

TIMING = ("seconds",)  # the only fields allowed to differ between two runs of the same cells


def _position_set(n: int, seed: int = 0) -> store.PositionSet:
    """n random lumped positions with supports of 3..9 tokens and small tails (no model)."""
    g = torch.Generator().manual_seed(seed)
    rows = []
    for i in range(n):
        m = 3 + i % 7
        lp = torch.randn(m, generator=g, dtype=torch.float64) * 1.5
        lq = lp + torch.randn(m, generator=g, dtype=torch.float64) * 0.8
        rows.append((torch.arange(m), torch.softmax(lp, -1) * 0.999, torch.softmax(lq, -1) * 0.998, 1e-3, 2e-3))
    info = {"dataset": "synthetic", "t_target": 1.0, "t_draft": 1.0, "settings": {"top_k": None, "top_p": None, "eps": 2e-3}}
    return store.from_rows(rows, info)


# 150 positions: shards of 64, 64 and a partial one of 22
CELLS = dict(laws=("iid", "wor"), ks=(2, 3), verifiers=["specinfer", "rrs_wor", "optimal"], draws=8, seed=3)


def _rows(tmp_path, name, mapper, ps=None, **kw):
    path = tmp_path / f"{name}.jsonl"
    with JsonlWriter(path, {}, 3) as w:
        acceptance.evaluate(ps if ps is not None else _position_set(150), w, done=set(), mapper=mapper, **{**CELLS, **kw})
    return read_jsonl(path)[1]


def _assert_same_rows(a, b):
    assert len(a) == len(b) > 0
    for ra, rb in zip(a, b):
        assert set(ra) == set(rb)
        for f in ra:
            if f not in TIMING:
                assert ra[f] == rb[f], (f, ra["law"], ra["K"], ra["verifier"])


def test_shard_seeding_makes_rows_independent_of_shard_order(tmp_path):
    order = []

    def reversed_map(tasks):
        res = [acceptance.shard_acceptance(*t) for t in reversed(tasks)][::-1]
        order.append([t[-1] for t in reversed(tasks)])
        return res

    local = _rows(tmp_path, "local", acceptance.local_map)
    rev = _rows(tmp_path, "reversed", reversed_map)
    assert order and order[0] == [2, 1, 0]
    _assert_same_rows(local, rev)
    assert {r["n_positions"] for r in local} == {150}


def test_shard_estimates_do_not_depend_on_torch_threads():
    P, Q = store.lumped(_position_set(64, seed=5))
    before = torch.get_num_threads()
    try:
        res = []
        for th in (1, 2):
            torch.set_num_threads(th)
            res.append(acceptance.shard_acceptance("optimal", P, Q, "iid", 3, 16, 0, ("c",), 0))
    finally:
        torch.set_num_threads(before)
    assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1])


def test_missing_ray_is_one_line_naming_the_extra(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"pip install 'multidraft\[ray\]'"):
        distributed.ray_mapper("auto")
    assert main(["experiment", "acceptance", str(tmp_path / "run"), "--ray", "auto", "--no-progress"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "multidraft[ray]" in err[0], err


def test_cli_passes_the_ray_mapper_and_closes_it(monkeypatch, tmp_path):
    pytest.importorskip("ray")
    seen = {}

    def fake_run(run_dir, **kw):
        seen.update(kw)
        raise ValueError("stop here")  # before any model or Ray call

    monkeypatch.setattr(acceptance, "run_experiment", fake_run)
    closed = []
    monkeypatch.setattr(distributed.RayMapper, "close", lambda self: closed.append(self))
    assert main(["experiment", "acceptance", str(tmp_path / "run"), "--ray", "auto", "--no-progress"]) == 2
    m = seen["mapper"]
    assert isinstance(m, distributed.RayMapper) and m.address == "auto" and closed == [m]


@pytest.mark.xdist_group("local_ray")  # with the serve replicas' local Ray: one xdist worker
def test_ray_rows_equal_single_process_rows(tmp_path):
    ray = pytest.importorskip("ray")
    if ray.is_initialized():
        pytest.skip("a Ray session is already open in this process")
    ps = _position_set(150)
    local = _rows(tmp_path, "local", acceptance.local_map, ps)
    # a fresh local cluster with 2 worker CPUs; max_in_flight 2 makes the task window slide
    puts = []
    with distributed.ray_mapper("local", num_cpus=2, max_in_flight=2) as mapper:
        # the ray module as the mapper sees it, with put counted
        mapper._ray = SimpleNamespace(**{a: getattr(ray, a) for a in dir(ray) if not a.startswith("_")})
        mapper._ray.put = lambda x: puts.append(1) or ray.put(x)
        remote = _rows(tmp_path, "ray", mapper, ps)
        assert ray.is_initialized() and ray.cluster_resources().get("CPU") == 2
    assert not ray.is_initialized()  # the mapper started Ray, so it shut it down
    _assert_same_rows(local, remote)
    # P and Q of each of the 3 shards are put once per (law, K) and shared by its verifiers
    assert len(puts) == 2 * 3 * 4 < 2 * 3 * sum(1 for r in remote if r["verifier"] != "alpha*")


def test_workers_run_one_thread_and_inherit_a_pinned_cpu_capability(monkeypatch):
    monkeypatch.delenv("ATEN_CPU_CAPABILITY", raising=False)
    env = distributed.worker_env()
    assert env["OMP_NUM_THREADS"] == env["MKL_NUM_THREADS"] == "1" and "ATEN_CPU_CAPABILITY" not in env
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx2")
    assert distributed.worker_env()["ATEN_CPU_CAPABILITY"] == "avx2"
