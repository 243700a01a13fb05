"""A call that must not hang: ``with guard(20):`` fails with ``error`` after that many seconds
(SIGALRM, main thread), so a hang becomes a failure naming the time."""
from __future__ import annotations

import contextlib
import signal


@contextlib.contextmanager
def guard(seconds: int, error: type[BaseException] = AssertionError):
    def fire(*_):
        raise error(f"still running after {seconds} s")

    old = signal.signal(signal.SIGALRM, fire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)
