"""A Ctrl-C during a llama.cpp call that logs through a Python callback (issue 41): it used to be
raised inside the ctypes callback, printed as "Exception ignored" and dropped, and the load (and
the command) carried on. ``interrupts_held`` delivers it when the call returns. A C function that
calls back into Python (libc's qsort with a Python comparator) stands in for llama.cpp's load."""
import ctypes
import os
import signal

import pytest

from multidraft.decoding.llamacpp import interrupts_held

CMP = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int))


def _sort_with_an_interrupt_inside(calls):
    def cmp(a, b):
        calls.append(1)
        if len(calls) == 1:
            os.kill(os.getpid(), signal.SIGINT)  # the handler runs at the next bytecode: in this callback
        return a[0] - b[0]

    arr = (ctypes.c_int * 8)(*range(8, 0, -1))
    ctypes.CDLL(None).qsort(arr, 8, ctypes.sizeof(ctypes.c_int), CMP(cmp))
    return list(arr)


@pytest.fixture
def python_sigint():
    prev = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, prev)


@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_the_callback_swallows_an_interrupt_unheld(python_sigint):
    """The hazard itself: unheld, the interrupt is raised inside the callback, dropped by ctypes,
    and the C call carries on calling back; no KeyboardInterrupt comes out."""
    calls = []
    _sort_with_an_interrupt_inside(calls)
    assert len(calls) > 1


def test_held_the_interrupt_arrives_when_the_call_returns(python_sigint):
    calls, after = [], []
    with pytest.raises(KeyboardInterrupt):
        with interrupts_held():
            out = _sort_with_an_interrupt_inside(calls)
            after.append(out)
    assert after == [list(range(1, 9))] and len(calls) > 1  # the C call ran to its end, then the interrupt came
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # the handler is restored


def test_nothing_held_nothing_raised(python_sigint):
    with interrupts_held():
        assert _sort_with_an_interrupt_inside.__name__
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
