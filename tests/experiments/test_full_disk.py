"""A full disk leaves whole files and whole rows, and says so in one line (issue 41, item 8):
rows are appended with one write each and cut back when that write fails or comes up short;
whole files (report, plots, Markdown) go through a temporary file and ``os.replace``."""
from __future__ import annotations

import errno
import json

import pytest

from multidraft.cli import main, os_error_message
from multidraft.experiments import records
from multidraft.experiments.records import JsonlWriter, read_jsonl, write_file

ALPHA = dict(dataset="d", t_target=1.0, t_draft=1.0, top_k=None, top_p=None, law="iid", K=2, verifier="alpha*",
             acceptance=0.6, se=0.01, values=[0.5, 0.6, 0.7], n_positions=3)
CELL = dict(ALPHA, verifier="specinfer", acceptance=0.5, alpha_star=0.6, gap_pct=16.7, values=[0.4, 0.5, 0.6])


class _FullDisk:
    """The writer's file, whose next write writes ``part`` of the bytes and then fails with ENOSPC
    (``short=False``) or returns the short count (``short=True``)."""

    def __init__(self, f, part: float, short: bool):
        self.f, self.part, self.short = f, part, short

    def write(self, data):
        n = int(len(data) * self.part)
        self.f.write(bytes(data[:n]))
        if self.short:
            return n
        raise OSError(errno.ENOSPC, "No space left on device")

    def __getattr__(self, name):
        return getattr(self.f, name)


@pytest.mark.parametrize("short", [False, True], ids=["ENOSPC", "short write"])
@pytest.mark.parametrize("part", [0.0, 0.5])
def test_a_failed_append_leaves_whole_rows_and_says_the_row_was_not_written(short, part, tmp_path):
    path = tmp_path / "acceptance.jsonl"
    w = JsonlWriter(path, {"x": 1}, 0)
    w.write(**ALPHA)
    before = path.read_bytes()
    real = w._f
    w._f = _FullDisk(real, part, short)
    with pytest.raises(OSError) as e:
        w.write(**CELL)
    assert e.value.errno == errno.ENOSPC and e.value.filename == str(path)
    msg = os_error_message(e.value)
    assert msg.startswith(f"{path}: cannot write results (") and msg.endswith("): the row was not written")
    assert "\n" not in msg and ("short write" in msg) == short
    assert path.read_bytes() == before  # no torn line (before: half a row at part 0.5)
    torn: list = []
    assert read_jsonl(path, torn=torn)[1] == w.rows and torn == []
    w._f = real  # the disk has room again: the next row appends after the whole ones
    w.write(**CELL)
    w.close()
    meta, rows = read_jsonl(path)
    assert [r["verifier"] for r in rows] == ["alpha*", "specinfer"]


def test_write_file_is_all_or_nothing(tmp_path, monkeypatch):
    path = tmp_path / "report.md"
    path.write_text("old\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records.os, "fsync", full)
    with pytest.raises(OSError) as e:
        write_file(path, "new " * 1000, "write the report")
    assert os_error_message(e.value) == (f"{path}: cannot write the report (No space left on device): nothing was "
                                         "written, the earlier file is unchanged")
    assert path.read_text() == "old\n" and sorted(p.name for p in tmp_path.iterdir()) == ["report.md"]
    with pytest.raises(OSError, match="no file was made"):
        write_file(tmp_path / "new.md", "x")
    assert not (tmp_path / "new.md").exists()
    monkeypatch.undo()
    assert write_file(path, "new\n").read_text() == "new\n"


def test_report_on_a_full_disk_is_one_line_and_keeps_the_earlier_report(tmp_path, monkeypatch, capsys):
    with JsonlWriter(tmp_path / "acceptance.jsonl", {}, 0) as w:
        w.write(**ALPHA)
        w.write(**CELL)
    (tmp_path / "report.md").write_text("old\n")

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records.os, "fsync", full)
    assert main(["report", str(tmp_path), "--no-plots"]) == 1
    err = capsys.readouterr().err.strip()
    assert err == (f"multidraft report: error: {tmp_path / 'report.md'}: cannot write the report (No space left on "
                   "device): nothing was written, the earlier file is unchanged")
    assert (tmp_path / "report.md").read_text() == "old\n"


def test_a_plot_on_a_full_disk_leaves_no_half_png(tmp_path, monkeypatch):
    pytest.importorskip("matplotlib")
    from multidraft.experiments import plots

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(records.os, "fsync", full)
    with pytest.raises(OSError, match="cannot write the plot .No space left on device.: nothing was written, no file"):
        plots.lines(tmp_path / "plots" / "a.png", {"x": ([1, 2], [0.5, 0.6], None)}, title="t", xlabel="x", ylabel="y")
    assert list((tmp_path / "plots").iterdir()) == []


def test_a_torn_last_line_is_named_by_the_readers(tmp_path, capsys):
    path = tmp_path / "acceptance.jsonl"
    with JsonlWriter(path, {}, 0) as w:
        w.write(**ALPHA)
        w.write(**CELL)
    with open(path, "ab") as f:  # what a process killed mid-write leaves
        f.write(json.dumps(dict(CELL, K=3)).encode()[:40])
    torn: list = []
    assert len(read_jsonl(path, torn=torn)[1]) == 2
    assert torn == [f"{path}:4: a torn last line (40 bytes, no newline: an interrupted or failed write), not read"]
    assert main(["report", str(tmp_path), "--no-plots"]) == 2  # before: 0, the line dropped without a word
    assert f"{path}:4: a torn last line" in capsys.readouterr().err
    assert main(["compare-runs", str(path), str(path)]) == 2
    assert f"{path}:4: a torn last line" in capsys.readouterr().err
