"""SIGINT and SIGTERM as a stop request: recorded and told, never raised."""

from __future__ import annotations

import os
import signal

import pytest

from stateful_runtime.contract import StopSignal
from stateful_runtime.runtime.stop_signals import StopRequested, StopSignals
from tests.helpers import poll


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_a_stop_signal_is_recorded_and_told_not_raised(sig):
    before = signal.getsignal(sig)
    heard: list[StopSignal] = []
    signals = StopSignals().install()
    signals.interrupt = False  # (the runner's mode once Spark starts: record, never raise)
    try:
        signals.listen(heard.append)
        os.kill(os.getpid(), sig)  # without the handler: KeyboardInterrupt, or the end of pytest
        poll(lambda: heard, 5, "the handler")
        os.kill(os.getpid(), sig)
        poll(lambda: len(heard) == 2, 5, "the second signal")
    finally:
        signals.restore()
    assert heard == [StopSignal(sig.name)] * 2
    assert signals.first is StopSignal(sig.name)
    assert signal.getsignal(sig) == before


def test_a_listener_hears_the_signals_received_before_it_listened():
    signals = StopSignals()
    signals.note(StopSignal.SIGTERM)
    heard: list[StopSignal] = []
    signals.listen(heard.append)
    assert heard == [StopSignal.SIGTERM]


def test_before_spark_starts_the_first_signal_unwinds_and_a_second_only_records():
    signals = StopSignals().install()
    try:
        with pytest.raises(StopRequested) as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            poll(lambda: False, 5, "StopRequested")  # interrupted by the handler
        assert stop.value.signal is StopSignal.SIGTERM
        os.kill(os.getpid(), signal.SIGINT)  # during the unwinding: recorded, not raised
        poll(lambda: len(signals.received) == 2, 5, "the second signal")
    finally:
        signals.restore()


# A process of its own: pytest replaces sys.unraisablehook with one that warns.
_UNWINDLESS = """
import signal, weakref
from stateful_runtime.runtime.stop_signals import StopSignals

class Held:
    pass

def callback(_):
    signal.raise_signal(signal.SIGINT)  # the handler runs inside this callback
    for _ in range(1000):  # bytecodes for it to run between
        pass

signals = StopSignals().install()
held = Held()
ref = weakref.ref(held, callback)
del held  # the callback runs here
print(ref() is None, [str(s) for s in signals.received])
"""


def test_a_stop_raised_where_python_cannot_unwind_is_kept_and_not_printed():
    """The first signal's StopRequested, raised inside a weakref callback (an import's module
    lock has one) or a ``__del__``, cannot unwind: Python prints it as "Exception ignored" and
    goes on. The stop stands all the same (recorded: the runner stops before the job starts),
    so nothing is printed."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", _UNWINDLESS], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["True", "['SIGINT']"]
    assert done.stderr == ""
