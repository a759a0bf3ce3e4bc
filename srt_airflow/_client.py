"""The provider's one door to the runtime: the runtime's control-plane client
(:class:`stateful_runtime.control_client.SrtClient`: ``srt ... --json`` as a child process,
secrets in its environment only) raising :class:`~srt_airflow.errors.SrtAirflowError`.

No Airflow here: the hook runs commands in a worker (:meth:`SrtClient.run_json`) and the
triggers in the triggerer's event loop (:meth:`SrtClient.arun_json`, which never blocks it).
"""

from __future__ import annotations

from dataclasses import dataclass

from srt_airflow.errors import SrtAirflowError
from stateful_runtime.control_client import READ_TIMEOUT_S, ErrorFactory
from stateful_runtime.control_client import SrtClient as _Client

__all__ = ["READ_TIMEOUT_S", "SrtClient"]


@dataclass(frozen=True)
class SrtClient(_Client):
    """An ``srt`` connection's client; its failures are :class:`SrtAirflowError` (masked)."""

    error: ErrorFactory = SrtAirflowError
