"""multidraft.cli (main): interrupts and the lazy top-level package."""
import os
from pathlib import Path
import signal
import subprocess
import sys
import time

import pytest


def _sigint_default():
    """In the child: SIGINT as a terminal gives it, whatever the suite was started under (a
    background job or nohup starts with SIGINT ignored, and the command line keeps an ignored
    SIGINT ignored, so the interrupt would never arrive)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_import_multidraft_is_lazy():
    code = "import sys, multidraft; assert 'torch' not in sys.modules; multidraft.drafts; assert 'torch' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def _console_script():
    return [str(Path(sys.executable).with_name("multidraft"))]


@pytest.mark.parametrize("entry", ["module", "script"])
@pytest.mark.parametrize("delay", [0.15, 0.6, 1.0, 2.5])
def test_ctrl_c_at_any_time_is_one_line(delay, entry):
    """SIGINT while the interpreter loads torch, builds the parser or runs: one line, then the
    process ends by SIGINT (a shell reports 130) -- the same way wherever the interrupt hits."""
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    command = [sys.executable, "-m", "multidraft"] if entry == "module" else _console_script()
    if entry == "script" and not Path(command[0]).exists():
        pytest.skip("the console script is not installed next to this interpreter")
    proc = subprocess.Popen(command + ["compare", "--k", "1,2,3,4,5", "--seed", "1"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=_sigint_default)
    time.sleep(delay)
    proc.send_signal(signal.SIGINT)
    out, err = proc.communicate(timeout=120)
    if proc.returncode == 0:
        pytest.skip("the command finished before the interrupt arrived")
    assert "Traceback" not in err, err
    assert proc.returncode == -signal.SIGINT, (proc.returncode, err)
    assert err.strip().splitlines()[-1].endswith("interrupted")


def test_shell_sees_130_and_main_returns_130(monkeypatch):
    """A shell reports the SIGINT death as 130; called as a function, main() returns 130."""
    script = f"{sys.executable} -c 'import os, signal, sys; sys.argv = [\"multidraft\", \"compare\"]; " \
             f"from multidraft import cli; cli.main = lambda: 130; sys.exit(cli.run())'; echo rc=$?"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert "rc=130" in done.stdout, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr, done.stderr
    from multidraft import cli

    monkeypatch.setattr(cli, "build_parser", lambda: (_ for _ in ()).throw(KeyboardInterrupt()))
    assert cli.main(["compare"]) == 130


@pytest.mark.parametrize("after", [ImportError("numpy: bad install"), RecursionError("maximum recursion depth exceeded")])
def test_what_an_interrupted_import_leaves_behind_is_the_interrupt(monkeypatch, capsys, after):
    """The interrupt of a lazy import (numpy left half-imported: an ImportError, or a RecursionError
    from its __getattr__) is one line and 130 once the SIGINT was seen; the same exception without
    an interrupt is a real error and propagates."""
    from multidraft import cli
    from multidraft.cli import verifier_table

    def interrupted_then(args):
        cli._SIGINT_SEEN[0] = True
        raise after

    def plain(args):
        raise after

    monkeypatch.setattr(verifier_table, "run", interrupted_then)
    assert cli.main(["compare"]) == 130
    assert capsys.readouterr().err.strip() == "multidraft compare: interrupted"
    monkeypatch.setattr(verifier_table, "run", plain)
    with pytest.raises(type(after)):
        cli.main(["compare"])


def test_ctrl_c_while_the_command_line_is_imported_is_one_line():
    """The console script's entry (``multidraft._entry``, imported within the interpreter's own
    start-up) imports the command line inside the guard: an interrupt while argparse and the
    subcommands load is the one line and death by SIGINT, not Python's traceback (the loaded-
    machine failure of test_ctrl_c_at_any_time_is_one_line[0.15-script], issue 41). Made
    deterministic by an import hook that raises KeyboardInterrupt on ``multidraft.cli``."""
    code = (
        "import sys\n"
        "class Hook:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'multidraft.cli':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, Hook())\n"
        "from multidraft._entry import main\n"
        "sys.exit(main())\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          preexec_fn=_sigint_default)
    assert proc.returncode == -signal.SIGINT, (proc.returncode, proc.stderr)
    assert proc.stderr == "multidraft: interrupted\n"
