"""``multidraft._alloc``: the decoder keeps freed full-V buffers in the process (glibc), once,
never raising; the opt-out and the user's own glibc settings are respected (in a child process:
mallopt is process-wide)."""
from __future__ import annotations

import os
import platform
import subprocess
import sys

import pytest

CODE = ("from multidraft._alloc import keep_freed_memory, allocator_state as s; a = s(); "
        "r = keep_freed_memory(); print(a, '|', r, '|', s(), '|', keep_freed_memory())")


def _child(**env):
    e = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "MULTIDRAFT_MALLOC"}
    e.update(env)
    out = subprocess.run([sys.executable, "-c", CODE], env=e, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [x.strip() for x in out.stdout.strip().split("|")]


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc only")
def test_tuned_once_on_glibc():
    assert _child() == ["glibc defaults", "True", "tuned", "True"]


def test_opt_out_and_user_settings_are_respected():
    assert _child(MULTIDRAFT_MALLOC="default") == ["glibc defaults", "False", "MULTIDRAFT_MALLOC=default", "False"]
    got = _child(MALLOC_TRIM_THRESHOLD_="1000000")
    assert got[1] == "False" and ("MALLOC_TRIM_THRESHOLD_" in got[2] or got[2] == "not glibc")


def test_a_decoder_tunes_the_process():
    code = ("import sys, torch, multidraft as md; sys.path.insert(0, sys.argv[1]); from tiny_models import tiny_pair; "
            "from multidraft._alloc import allocator_state as s; t, d = tiny_pair(); print(s()); "
            "md.generate(t, d, torch.tensor([[1, 2, 3]]), max_new_tokens=2, generator=torch.Generator().manual_seed(0)); print(s())")
    e = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_") and k != "MULTIDRAFT_MALLOC"}
    here = os.path.dirname(os.path.abspath(__file__))
    out = subprocess.run([sys.executable, "-c", code, here], env=e, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.strip().splitlines()
    assert lines[0] == "glibc defaults"
    assert lines[-1] in ("tuned", "not glibc")
