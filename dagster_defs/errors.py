"""Errors the Dagster plugin raises.

Every one derives from the runtime's root, ``stateful_runtime.exceptions.StatefulRuntimeError``
(re-exported here with the types the plugin raises itself), so ``except StatefulRuntimeError``
catches the whole family::

    StatefulRuntimeError
    ├── ConfigError          a spec or its resources are wrong (raised at definition load)
    ├── JobError             an op was given a job these definitions do not have
    └── SrtCommandError      an ``srt`` command the StreamingRuntime resource ran failed;
                             ``kind`` is the runtime's own error type

Import this module only when an error is raised or caught: it imports
``stateful_runtime.exceptions``, which definition load leaves alone.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stateful_runtime.contract import ErrorKind
from stateful_runtime.exceptions import ConfigError, JobError, StatefulRuntimeError

__all__ = ["ConfigError", "JobError", "SrtCommandError", "StatefulRuntimeError"]


class SrtCommandError(StatefulRuntimeError):
    """An ``srt`` command failed; the message is the runtime's own.

    Attributes:
        kind: the runtime's error type (``JobError``, ``IncompatibleSavepointError``,
            ``UpgradeError``, ...), ``ProcessError`` if the command failed without saying why
            in JSON (a crash: the message is the end of its stderr), or ``Timeout``
            (:class:`~stateful_runtime.contract.ErrorKind`).
        details: the error's fields as the command reported them, e.g. ``differences``
            (compatibility check), ``stage`` and ``savepoint_location`` (upgrade).
        command: the command line that was run.
        returncode: its exit status (None on a timeout).
    """

    def __init__(
        self,
        message: str,
        *,
        kind: ErrorKind,
        details: Mapping[str, Any] | None = None,
        command: Sequence[str] = (),
        returncode: int | None = None,
    ) -> None:
        self.kind = kind
        self.details = dict(details or {})
        self.command = list(command)
        self.returncode = returncode
        super().__init__(message)
