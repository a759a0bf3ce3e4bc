"""SIGINT and SIGTERM to ``srt run``: a request to stop the job cleanly, whenever they come.

``srt run`` catches both from its first moment (:func:`catch`, before the job file is loaded)
until its end. A handler records the signal and tells whoever listens (the runner, once there
is one). Before Spark starts (loading the job file, checking and recovering the checkpoint,
which may wait on a source) the first one also unwinds what the process was doing with
:class:`StopRequested` — as a crash there would, which those steps survive — and the process
ends STOPPED; from Spark's start on it only asks (``interrupt`` off): the runner lets Spark
finish starting and starts no query, or stops the running queries as ``srt stop`` does (the
batch in flight commits, sinks close, registry STOPPED). A second signal while it stops
abandons the batch in flight instead of waiting for it (it is replayed on restart). The process
exits 0, as a stop through ``srt stop`` does, and its registry entry records the signal
(``stopped_by``).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

from stateful_runtime.contract import StopSignal

CAUGHT = (signal.SIGINT, signal.SIGTERM)


class StopRequested(BaseException):  # noqa: N818 - not an error: a stop, as KeyboardInterrupt
    """Raised by the first stop signal while the process may be unwound (``interrupt``)."""

    def __init__(self, sig: StopSignal) -> None:
        super().__init__(f"stopped by {sig}")
        self.signal = sig


class StopSignals:
    """The stop signals this process has received, and who is told of each."""

    def __init__(self) -> None:
        self.received: list[StopSignal] = []
        self._listeners: list[Callable[[StopSignal], None]] = []
        self._previous: dict[int, Any] = {}
        self._unraisable: Callable[[Any], Any] = sys.unraisablehook
        # The first signal raises StopRequested (before Spark starts); once it raised, or once
        # this is turned off, signals are only recorded.
        self.interrupt = True

    @property
    def first(self) -> StopSignal | None:
        """The signal that asked for the stop (None: none came)."""
        return self.received[0] if self.received else None

    def install(self) -> StopSignals:
        """Catch :data:`CAUGHT` in this process (only its main thread can)."""
        if threading.current_thread() is threading.main_thread() and not self._previous:
            self._previous = {sig: signal.signal(sig, self._handle) for sig in CAUGHT}
            self._unraisable = sys.unraisablehook
            sys.unraisablehook = self._unraisable_hook
        return self

    def restore(self) -> None:
        """Give the signals back to the handlers they had before :meth:`install`."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        if self._previous and sys.unraisablehook == self._unraisable_hook:
            sys.unraisablehook = self._unraisable
        self._previous = {}

    def _unraisable_hook(self, unraisable: Any) -> None:
        # The first signal's StopRequested, raised where Python cannot unwind (a weakref
        # callback such as an import's module lock has, a __del__), is dropped there with an
        # "Exception ignored" traceback. The stop stands all the same: it is recorded, and the
        # runner hears it before it starts anything. So it is not printed.
        if not isinstance(unraisable.exc_value, StopRequested):
            self._unraisable(unraisable)

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
        if self.interrupt:
            self.interrupt = False
            raise StopRequested(sig)


def stopped_early(sig: StopSignal) -> None:
    """A stop that unwound the process before the runner could record it (the job file
    loading): the entry naming this process, STARTING (a launcher's), is set STOPPED, else a
    supervisor takes it for a failed launch."""
    from stateful_runtime.contract import JobState
    from stateful_runtime.runtime import registry
    from stateful_runtime.runtime.progress import now_iso

    for entry in registry.entries():
        if entry.get("pid") == os.getpid() and entry.get("state") == JobState.STARTING:
            registry.update(
                entry["job"],
                state=JobState.STOPPED,
                stopped_by=sig,
                ended_at=now_iso(),
            )


def catch() -> StopSignals:
    """Start catching SIGINT and SIGTERM as a stop request."""
    return StopSignals().install()
