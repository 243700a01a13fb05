"""multidraft.cli (main): interrupts and the lazy top-level package."""
import os
import signal
import subprocess
import sys
import time

import pytest


def test_import_multidraft_is_lazy():
    code = "import sys, multidraft; assert 'torch' not in sys.modules; multidraft.drafts; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize("delay", [0.15, 0.6, 2.5])
def test_ctrl_c_at_any_time_is_one_line(delay):
    """SIGINT while the interpreter loads torch, builds the parser or runs: one line, exit 130."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, "-m", "multidraft", "compare", "--k", "1,2,3,4,5", "--seed", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the command finished before the interrupt arrived")
    assert "Traceback" not in err, err
    assert proc.returncode == 130, (proc.returncode, err)
    assert err.strip().splitlines()[-1].endswith("interrupted")
