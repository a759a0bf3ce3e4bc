"""SIGINT and SIGTERM to ``srt run``: a request to stop the job cleanly, whenever they come.

``srt run`` catches both from its first moment (:func:`catch`, before the job file is loaded)
until its end. A handler only records the signal and tells whoever listens (the runner, once
there is one): it never raises, so no ``KeyboardInterrupt`` unwinds the process from wherever
it happened to be (loading the job file, checking its checkpoint, Spark starting). The runner
acts on the request at its next step: before Spark starts it does not start it; once the
queries run it stops them as ``srt stop`` does (the batch in flight commits, sinks close,
registry STOPPED). A second signal while it stops abandons the batch in flight instead of
waiting for it (it is replayed on restart). The process exits 0, as a stop through ``srt stop``
does, and its registry entry records the signal (``stopped_by``).
"""

from __future__ import annotations

import signal
import threading
from collections.abc import Callable
from typing import Any

from stateful_runtime.contract import StopSignal

CAUGHT = (signal.SIGINT, signal.SIGTERM)


class StopSignals:
    """The stop signals this process has received, and who is told of each."""

    def __init__(self) -> None:
        self.received: list[StopSignal] = []
        self._listeners: list[Callable[[StopSignal], None]] = []
        self._previous: dict[int, Any] = {}

    @property
    def first(self) -> StopSignal | None:
        """The signal that asked for the stop (None: none came)."""
        return self.received[0] if self.received else None

    def install(self) -> StopSignals:
        """Catch :data:`CAUGHT` in this process (only its main thread can)."""
        if threading.current_thread() is threading.main_thread() and not self._previous:
            self._previous = {sig: signal.signal(sig, self._handle) for sig in CAUGHT}
        return self

    def restore(self) -> None:
        """Give the signals back to the handlers they had before :meth:`install`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous = {}

    def listen(self, listener: Callable[[StopSignal], None]) -> None:
        """Tell ``listener`` of each signal from now on (and of those already received)."""
        self._listeners.append(listener)
        for sig in list(self.received):
            listener(sig)

    def note(self, sig: StopSignal) -> None:
        """A stop signal another handler received (PySpark's, while its context starts)."""
        self.received.append(sig)
        for listener in list(self._listeners):
            listener(sig)

    def _handle(self, signum: int, frame: Any) -> None:
        # Runs on the main thread between two bytecodes of whatever it was doing: no output
        # (a print interrupted inside another print raises), no locks; flags only.
        sig = StopSignal(signal.Signals(signum).name)
        self.received.append(sig)
        for listener in list(self._listeners):
            listener(sig)


def catch() -> StopSignals:
    """Start catching SIGINT and SIGTERM as a stop request."""
    return StopSignals().install()
