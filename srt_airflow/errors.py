"""Errors the Airflow provider raises.

Each derives from the runtime's root, ``stateful_runtime.exceptions.StatefulRuntimeError``::

    StatefulRuntimeError
    └── SrtAirflowError   an srt command the provider ran failed, or a job did not get where a
                          task waited for it; ``kind`` is the runtime's own error type

A task that raises it fails with the runtime's message (secrets masked), which says what to do.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from stateful_runtime.contract import ErrorKind
from stateful_runtime.exceptions import StatefulRuntimeError
from stateful_runtime.masking import mask_data, mask_text

__all__ = ["SrtAirflowError", "StatefulRuntimeError", "from_process"]


class SrtAirflowError(StatefulRuntimeError):
    """An ``srt`` command failed, or a job did not reach what a task waited for.

    Attributes:
        kind: the runtime's error type (``JobError``, ``IncompatibleSavepointError``,
            ``UpgradeError``...), ``ProcessError`` for a command that failed without saying
            why in JSON (the message is the end of its stderr), ``Timeout``
            (:class:`~stateful_runtime.contract.ErrorKind`).
        details: the error's fields as the runtime reported them (``stage``,
            ``savepoint_location``, ``differences``...).
        command: the command line that was run (it carries no secret).
        returncode: its exit status (None when it did not end by itself).
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
        self.details = mask_data(dict(details or {}))
        self.command = list(command)
        self.returncode = returncode
        super().__init__(mask_text(message))


def from_process(
    what: str, command: Sequence[str], returncode: int, stderr: str
) -> SrtAirflowError:
    """The error a failed ``srt ... --json`` reported, else a crash
    (:func:`stateful_runtime.control_client.failed`)."""
    from stateful_runtime.control_client import failed

    error = failed(SrtAirflowError, what, command, returncode, stderr)
    assert isinstance(error, SrtAirflowError)
    return error
