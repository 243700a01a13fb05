import sys

try:
    from .cli import run
except KeyboardInterrupt:  # Ctrl-C while the command line itself is imported: the one line, then SIGINT
    import signal

    sys.stderr.write("multidraft: interrupted\n")
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.raise_signal(signal.SIGINT)
    sys.exit(130)  # pragma: no cover (not reached: SIGINT ends the process)

sys.exit(run())
