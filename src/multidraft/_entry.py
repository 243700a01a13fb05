"""The console script's entry (``multidraft`` and ``python -m multidraft``).

It imports nothing but ``sys``, so the interpreter reaches it within its own start-up; the
command line itself (argparse, the subcommands) is imported inside the interrupt guard: a
Ctrl-C that lands there ends like one anywhere else, in the one line ``multidraft:
interrupted`` and death by SIGINT (a shell reports 130). Only an interrupt inside the
interpreter's own start-up, before this module runs, is reported by Python itself.
"""
import sys


def main() -> int:
    try:
        from .cli import run
    except KeyboardInterrupt:  # Ctrl-C while the command line itself is imported
        import signal

        sys.stderr.write("multidraft: interrupted\n")
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.raise_signal(signal.SIGINT)
        return 130  # pragma: no cover (not reached: SIGINT ends the process)
    return run()
