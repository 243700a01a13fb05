"""The sequence-rules runner: JSON lines per instance and the summary table read back."""
from __future__ import annotations

import io
import json

from multidraft.experiments import seqrules


def test_runner_writes_lines_and_a_table():
    buf = io.StringIO()
    seqrules.run(buf, "chain", 1, 2, 2, n=3)
    lines = buf.getvalue().splitlines()
    assert len(lines) == 3
    rec = json.loads(lines[0])
    assert rec["tokens"]["block"] <= rec["tokens"]["ceiling_upper"] + 1e-12
    assert abs(rec["tokens"]["block"] - rec["tokens"]["ceiling"]) <= 1e-9
    table = seqrules.summarize(lines)
    assert "| block |" in table and "100.0%" in table and "chain, K = 1, L = 2, V = 2: 3 instances" in table
