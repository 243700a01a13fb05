"""Results files bound to their run: config binding, foreign rows, torn tails, I/O errors, kill-and-resume."""
from __future__ import annotations

import errno
import json
from fractions import Fraction

import pytest
import torch

from multidraft.experiments import acceptance, records, store
from multidraft.experiments.records import JsonlWriter, check_binding, read_jsonl, resume

CFG = {"draws": 200, "eval_support": None, "k": [1, 2], "eps": 1e-4}
KEYED = ("k",)


def _write(path, cfg=CFG, seed=0, n=2):
    with JsonlWriter(path, cfg, seed, keyed=KEYED) as w:
        for i in range(n):
            w.write(K=i + 1, verifier="naive", acceptance=0.5)


def test_resume_with_other_config_names_the_keys(tmp_path):
    f = tmp_path / "a.jsonl"
    _write(f)
    with pytest.raises(ValueError) as e:
        JsonlWriter(f, {**CFG, "draws": 100, "eval_support": 64}, 0, keyed=KEYED)
    msg = str(e.value)
    assert str(f) in msg and "draws 200 -> 100" in msg and "eval_support null -> 64" in msg and "eps" not in msg
    with pytest.raises(ValueError, match="seed 0 -> 1"):
        resume(f, CFG, 1, key_fields=("K",), keyed=KEYED)
    # a keyed key (rows carry it) may grow: the run is extended
    with JsonlWriter(f, {**CFG, "k": [1, 2, 3]}, 0, keyed=KEYED) as w:
        assert w.done(("K",)) == {("1",), ("2",)}
        w.write(K=3, verifier="naive", acceptance=0.5)
    meta, rows = read_jsonl(f)
    assert [r["K"] for r in rows] == [1, 2, 3] and all(r["run_id"] == meta["run_id"] for r in rows)
    assert meta["config"]["k"] == [1, 2]  # the meta row keeps the first invocation


def test_foreign_rows_are_refused_not_done(tmp_path):
    f = tmp_path / "a.jsonl"
    _write(f)
    good = f.read_text()
    other = tmp_path / "b.jsonl"
    _write(other, seed=7)
    # rows of another run appended (another seed): a second meta row
    f.write_text(good + other.read_text())
    with pytest.raises(ValueError, match=rf"{f.name}:4: a second meta row"):
        resume(f, CFG, 0, key_fields=("K",), keyed=KEYED)
    # a row carrying another run's id
    row = json.loads(other.read_text().splitlines()[1])
    f.write_text(good + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=rf"{f.name}:4: row from another run"):
        resume(f, CFG, 0, key_fields=("K",), keyed=KEYED)
    # a row without a run id
    row.pop("run_id")
    f.write_text(good + json.dumps(row) + "\n")
    with pytest.raises(ValueError, match=rf"{f.name}:4: row without the run id"):
        read_jsonl(f)
    # a whole file of another seed in the run directory is not treated as done
    with pytest.raises(ValueError, match="seed 7 -> 0"):
        resume(other, CFG, 0, key_fields=("K",), keyed=KEYED)
    # a file without meta (or an old one without run id) cannot be checked: refused
    f.write_text(json.dumps({"type": "row", "K": 1}) + "\n")
    with pytest.raises(ValueError, match="no meta row"):
        check_binding(f, CFG, 0, KEYED)


def test_torn_tail_and_corrupt_line(tmp_path):
    f = tmp_path / "a.jsonl"
    _write(f)
    with open(f, "a") as fh:
        fh.write('{"type": "row", "K"')  # interrupted write
    assert len(read_jsonl(f)[1]) == 2
    with JsonlWriter(f, CFG, 0, keyed=KEYED) as w:  # the torn line is cut before appending
        w.write(K=9, verifier="x", acceptance=0.1)
    assert [r["K"] for r in read_jsonl(f)[1]] == [1, 2, 9]
    lines = f.read_text().splitlines()
    lines[2] = "{not json"
    f.write_text("\n".join(lines) + "\n")
    with pytest.raises(ValueError, match=rf"{f.name}:3: not valid JSON"):
        read_jsonl(f)


def test_io_errors_name_the_path(tmp_path, monkeypatch):
    afile = tmp_path / "file"
    afile.write_text("x")
    with pytest.raises(NotADirectoryError) as e:
        records.ensure_dir(afile)
    assert e.value.filename == str(afile)
    with pytest.raises(IsADirectoryError) as e:
        JsonlWriter(tmp_path, CFG, 0)
    assert e.value.filename == str(tmp_path)
    # disk full during a row: OSError naming the file
    w = JsonlWriter(tmp_path / "a.jsonl", CFG, 0)

    class Full:
        def write(self, _b):
            raise OSError(errno.ENOSPC, "No space left on device")

        def close(self):
            pass

    w._f = Full()
    with pytest.raises(OSError) as e:
        w.write(K=1)
    assert e.value.filename == str(tmp_path / "a.jsonl") and "No space left" in str(e.value)


def test_corrupt_position_store_never_suggests_unpickling(tmp_path):
    f = tmp_path / "s.pt"

    torch.save({"format": store.FORMAT, "obj": Fraction(1, 3)}, f)  # loads only with weights_only=False
    with pytest.raises(Exception) as torch_err:
        torch.load(f, weights_only=True)
    assert "weights_only" in str(torch_err.value)  # torch's own message: what we must never show
    with pytest.raises(ValueError) as e:
        store.load(f)
    assert str(f) in str(e.value) and "weights_only" not in str(e.value)
    f.write_bytes(b"garbage" * 10)
    with pytest.raises(ValueError) as e:
        store.load(f)
    assert "weights_only" not in str(e.value) and "corrupt" in str(e.value)


def _pairs(n=3, V=5, seed=11):
    g = torch.Generator().manual_seed(seed)
    lp = torch.randn(n, V, generator=g, dtype=torch.float64)
    lq = lp + 0.8 * torch.randn(n, V, generator=g, dtype=torch.float64)
    return torch.softmax(lp, -1), torch.softmax(lq, -1)


def test_kill_and_resume_loses_and_duplicates_nothing(tmp_path, monkeypatch):
    P, Q = _pairs()
    info = {"dataset": "synthetic", "t_target": 1.0, "t_draft": 1.0, "settings": {"top_k": None, "top_p": None, "eps": 0.0}}
    s = tmp_path / "s.pt"
    store.save(store.from_rows(store.truncate(P, Q, eps=0.0, k_max=3), info), s)
    kw = dict(config={"draws": 30}, seed=0, ks=(1, 2, 3), draws=30, verifiers=["naive", "nss", "specinfer"])
    ref = read_jsonl(acceptance.run(tmp_path / "ref", [s], **kw))[1]

    real = acceptance.verifier_acceptance
    calls = []

    def interrupted(*a, **k):
        calls.append(1)
        if len(calls) == 4:
            raise KeyboardInterrupt
        return real(*a, **k)

    monkeypatch.setattr(acceptance, "verifier_acceptance", interrupted)
    with pytest.raises(KeyboardInterrupt):
        acceptance.run(tmp_path / "run", [s], **kw)
    monkeypatch.undo()
    _, partial = read_jsonl(tmp_path / "run" / "acceptance.jsonl")
    assert 0 < len(partial) < len(ref)
    acceptance.run(tmp_path / "run", [s], **kw)
    _, rows = read_jsonl(tmp_path / "run" / "acceptance.jsonl")
    assert rows[: len(partial)] == partial
    key = lambda r: tuple(r[f] for f in acceptance.KEY)  # noqa: E731
    assert sorted(map(key, rows)) == sorted(map(key, ref)) and len(set(map(key, rows))) == len(rows)
    strip = lambda r: {k: v for k, v in r.items() if k != "seconds"}  # noqa: E731
    assert sorted(map(json.dumps, map(strip, rows))) == sorted(map(json.dumps, map(strip, ref)))  # same values


def test_every_row_and_the_meta_name_the_code_that_wrote_them(tmp_path):
    """A resumed file may mix rows of two checkouts: each row carries its own code version."""
    import multidraft
    from multidraft.experiments.records import JsonlWriter, code_version, read_jsonl

    with JsonlWriter(tmp_path / "r.jsonl", {"a": 1}, 0) as w:
        w.write(x=1)
    meta, rows = read_jsonl(tmp_path / "r.jsonl")
    assert code_version().startswith(multidraft.__version__)
    assert meta["code"] == rows[0]["code"] == code_version()
    import re
    assert re.fullmatch(re.escape(multidraft.__version__) + r"(\+g[0-9a-f]{7,40}(-dirty)?)?", code_version())


def test_a_gzipped_results_file_reads_as_the_plain_one_and_is_never_appended(tmp_path):
    """Committed bulk rows are stored as ``.jsonl.gz``: the reader takes the file or its name
    without ``.gz``; a writer refuses to extend it (it would start a second, empty run)."""
    import gzip

    f = tmp_path / "a.jsonl"
    _write(f, n=3)
    plain = read_jsonl(f, line_numbers=True)
    gz = tmp_path / "a.jsonl.gz"
    gz.write_bytes(gzip.compress(f.read_bytes(), mtime=0))
    assert read_jsonl(gz, line_numbers=True) == plain
    f.unlink()
    assert records.results_path(f) == gz
    assert read_jsonl(f, line_numbers=True) == plain  # found by its uncompressed name
    assert records.done_keys(f, ("K",)) == {("1",), ("2",), ("3",)}
    with pytest.raises(ValueError, match="gunzip"):
        JsonlWriter(f, CFG, 0, keyed=KEYED)
    with pytest.raises(ValueError, match="gunzip"):
        resume(f, CFG, 0, key_fields=("K",), keyed=KEYED)
    assert not f.exists()
    gz.write_bytes(gz.read_bytes()[:-12])  # cut short
    with pytest.raises(ValueError, match="not a complete gzip file"):
        read_jsonl(gz)
    assert records.results_path(tmp_path / "none.jsonl") == tmp_path / "none.jsonl"
