"""The ``srt`` connection type and its hook: the runtime on a machine, through ``srt --json``.

A connection of type ``srt`` says where ``srt`` runs: ``srt_home`` (the job registry,
``$SRT_HOME``), ``working_directory`` (where the job files are; relative paths resolve there),
optionally ``master``, ``srt_executable`` and ``env`` (extra environment: an S3 endpoint,
credentials). Its password, if set, is the value of the job config key ``password_key`` names
(``sink.password`` by default). Secrets reach ``srt`` in its environment, never its argv, and
every message is masked (:mod:`stateful_runtime.masking`).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseHook

from srt_airflow._client import READ_TIMEOUT_S, SrtClient

if TYPE_CHECKING:
    from airflow.sdk import Connection

    from stateful_runtime.contract import (
        JobStatus,
        Killed,
        Launch,
        SavepointSummary,
        Stopped,
        Upgrade,
        Wait,
    )

# The connection's extra keys.
EXTRA_FIELDS = ("srt_home", "working_directory", "master", "srt_executable", "password_key", "env")
DEFAULT_PASSWORD_KEY = "sink.password"


def client_of(conn: Connection | None) -> SrtClient:
    """The :class:`SrtClient` an ``srt`` connection describes (``None``: this machine's
    defaults, ``$SRT_HOME`` or ``~/.srt``, in the current directory)."""
    from srt_airflow.errors import SrtAirflowError
    from stateful_runtime.contract import ErrorKind

    extra: dict[str, Any] = {}
    if conn is not None:
        try:
            extra = dict(conn.extra_dejson or {})
        except Exception as exc:  # noqa: BLE001 - any unreadable extra gets the same advice
            raise SrtAirflowError(
                f"connection {conn.conn_id!r}: its extra is not a JSON object ({exc}); give "
                f'e.g. {{"srt_home": "/srv/srt", "working_directory": "/srv/jobs"}}',
                kind=ErrorKind.CONFIG_ERROR,
            ) from None
    # The form stores a field under its name (older UIs: extra__srt__<name>).
    extra = {k.removeprefix("extra__srt__"): v for k, v in extra.items()}
    env = extra.get("env") or {}
    if isinstance(env, str):
        try:
            env = json.loads(env) if env.strip() else {}
        except ValueError:
            env = None
    if not isinstance(env, Mapping):
        raise SrtAirflowError(
            "the srt connection's 'env' must be a JSON object of environment variables, e.g. "
            '{"SRT_S3_ENDPOINT_URL": "http://127.0.0.1:9000"}',
            kind=ErrorKind.CONFIG_ERROR,
        )
    secrets: dict[str, str] = {}
    if conn is not None and conn.password:
        secrets[str(extra.get("password_key") or DEFAULT_PASSWORD_KEY)] = conn.password
    home = extra.get("srt_home") or os.environ.get("SRT_HOME") or str(Path.home() / ".srt")
    return SrtClient(
        home=str(home),
        working_directory=str(extra.get("working_directory") or os.getcwd()),
        master=extra.get("master") or None,
        executable=extra.get("srt_executable") or None,
        env={str(k): str(v) for k, v in env.items()},
        secrets=secrets,
    )


def config_from_connections(refs: Mapping[str, str] | None) -> dict[str, str]:
    """Job config values read from Airflow connections: ``{"sink.password":
    "warehouse_pg.password"}`` gives the ``password`` of connection ``warehouse_pg``. A field is
    ``password``, ``login``, ``host``, ``port``, ``schema`` or a key of the connection's
    extra. Secret values go to ``srt`` through its environment only."""
    from srt_airflow.errors import SrtAirflowError
    from stateful_runtime.contract import ErrorKind

    out: dict[str, str] = {}
    for key, ref in (refs or {}).items():
        conn_id, _, attr = str(ref).partition(".")
        if not conn_id or not attr:
            raise SrtAirflowError(
                f"config_from_connections[{key!r}] = {ref!r}: give CONN_ID.FIELD, e.g. "
                f"'warehouse_pg.password'",
                kind=ErrorKind.CONFIG_ERROR,
            )
        conn = BaseHook.get_connection(conn_id)
        if attr in ("password", "login", "host", "port", "schema"):
            value = getattr(conn, attr)
        else:
            value = (conn.extra_dejson or {}).get(attr)
        if value is None or value == "":
            raise SrtAirflowError(
                f"config_from_connections[{key!r}]: connection {conn_id!r} has no {attr!r}",
                kind=ErrorKind.CONFIG_ERROR,
            )
        out[str(key)] = str(value)
    return out


class SrtHook(BaseHook):
    """The stateful runtime on the worker's machine, through ``srt ... --json``.

    Every method runs one ``srt`` command against the connection's registry and returns its
    document parsed with :mod:`stateful_runtime.contract`; a failed command raises
    :class:`~srt_airflow.errors.SrtAirflowError` with the runtime's own message. Nothing is
    imported from the runtime's engine, and no job file is loaded in this process.

    Args:
        srt_conn_id: an ``srt`` connection (default ``srt_default``; a missing
            ``srt_default`` means ``$SRT_HOME`` in the worker's current directory).
    """

    conn_name_attr = "srt_conn_id"
    default_conn_name = "srt_default"
    conn_type = "srt"
    hook_name = "Stateful Runtime (srt)"

    def __init__(self, srt_conn_id: str = default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.srt_conn_id = srt_conn_id

    @cached_property
    def client(self) -> SrtClient:
        """The connection's :class:`SrtClient` (this machine's defaults for a missing
        ``srt_default``)."""
        from airflow.sdk.exceptions import AirflowNotFoundException

        try:
            conn = self.get_connection(self.srt_conn_id)
        except AirflowNotFoundException:
            # Only a missing srt_default means "this machine"; a broken one is an error.
            if self.srt_conn_id != self.default_conn_name:
                raise
            conn = None
        return client_of(conn)

    def get_conn(self) -> SrtClient:
        """:attr:`client` (Airflow's name for a hook's connection object)."""
        return self.client

    # ------------------------------------------------------------------ jobs

    def status(self, job: str) -> JobStatus | None:
        """The job's registry entry, liveness, health and checkpoint facts (None: never ran)."""
        from stateful_runtime.contract import JobStatus

        found = self.client.run_json(["status", job], timeout=READ_TIMEOUT_S)
        return JobStatus.from_json(found[0]) if found else None

    def launch(
        self,
        job: str,
        job_file: str,
        config: Mapping[str, Any] | None = None,
        *,
        from_savepoint: str | None = None,
        parallelism: int | None = None,
    ) -> Launch:
        """``srt launch``: plan the file (it must build ``job``), then reuse the job's live
        process or start ``srt run`` detached. Returns at once."""
        from stateful_runtime.contract import Launch

        c = self.client
        args = ["launch", c.resolve(job_file), "--job", job, *c.set_args(config)]
        if c.master:
            args += ["--master", c.master]
        if from_savepoint:
            args += ["--from-savepoint", from_savepoint]
        if parallelism is not None:
            args += ["--parallelism", str(int(parallelism))]
        return Launch.from_json(c.run_json(args, timeout=300, config=config))

    def wait(
        self, job: str, *, until: str, pid: int, since: float | None = None, timeout: float
    ) -> Wait:
        """``srt wait``: until process ``pid`` is RUNNING, or (``commit``) has committed a
        micro-batch at or after ``since``."""
        from stateful_runtime.contract import Wait

        return Wait.from_json(
            self.client.run_json(wait_args(job, until, pid, since, timeout), timeout=timeout + 60)
        )

    def stop(self, job: str, *, timeout: float = 120.0) -> Stopped:
        """``srt stop``: a clean stop (the job resumes from its checkpoint next time)."""
        from stateful_runtime.contract import Stopped

        args = ["stop", job, "--timeout", str(timeout)]
        return Stopped.from_json(self.client.run_json(args, timeout=timeout + 60))

    def kill(self, job: str, *, pid: int | None = None, grace: float = 30.0) -> Killed:
        """``srt stop --kill``: SIGTERM, then SIGKILL to the job's process group after
        ``grace`` s (only a process verified to be the job; ``pid``: only if still it)."""
        from stateful_runtime.contract import Killed

        args = ["stop", job, "--kill", "--timeout", str(grace)]
        if pid is not None:
            args += ["--pid", str(pid)]
        return Killed.from_json(self.client.run_json(args, timeout=grace + 90))

    # ------------------------------------------------------------------ savepoints

    def savepoint(
        self, job: str, *, target: str | None = None, stop: bool = False, timeout: float = 120.0
    ) -> SavepointSummary:
        """``srt savepoint create``: a savepoint of the last committed batch (``stop``: after
        stopping the job cleanly, of its final batch)."""
        from stateful_runtime.contract import SavepointSummary

        args = ["savepoint", "create", job, "--timeout", str(timeout)]
        if stop:
            args.append("--stop")
        if target:
            args += ["--target", target]
        return SavepointSummary.from_json(self.client.run_json(args, timeout=timeout + 300))

    def savepoints(self, job: str, *, target: str | None = None) -> list[SavepointSummary]:
        """``srt savepoint list JOB``: the job's complete savepoints."""
        from stateful_runtime.contract import SavepointSummary

        rows = self.client.run_json(savepoint_list_args(job, target), timeout=READ_TIMEOUT_S)
        return [SavepointSummary.from_json(r) for r in rows]

    def prune_savepoints(
        self,
        job: str,
        *,
        target: str | None = None,
        keep: int | None = None,
        max_age_s: float | None = None,
    ) -> list[str]:
        """``srt savepoint prune``: keep at most ``keep``, dispose of those older than
        ``max_age_s`` (the newest and any a registered job was restored from stay). Returns
        the locations disposed of."""
        from stateful_runtime.contract import Disposed

        args = ["savepoint", "prune", job]
        if target:
            args += ["--target", target]
        if keep is not None:
            args += ["--keep", str(int(keep))]
        if max_age_s is not None:
            args += ["--max-age", f"{int(max_age_s)}s"]
        disposed = Disposed.from_json(self.client.run_json(args, timeout=300))
        return [location for _, location in disposed.disposed]

    def upgrade(
        self,
        job: str,
        job_file: str,
        config: Mapping[str, Any] | None = None,
        *,
        parallelism: int | None = None,
        from_savepoint: str | None = None,
        target: str | None = None,
        allow_non_restored_state: bool = False,
        stop_timeout: float = 120.0,
        running_timeout: float = 300.0,
        commit_timeout: float = 0.0,
    ) -> Upgrade:
        """``srt upgrade``: check the file's code takes the job's state, stop it with a
        savepoint (a job that is not running: start from ``from_savepoint``), relaunch the
        file from it detached (``parallelism``: rescale), wait for RUNNING (and, with
        ``commit_timeout``, for a batch of its own)."""
        from stateful_runtime.contract import Upgrade

        c = self.client
        args = [
            "upgrade",
            job,
            c.resolve(job_file),
            *c.set_args(config),
            "--stop-timeout",
            str(stop_timeout),
            "--timeout",
            str(running_timeout),
            "--commit-timeout",
            str(commit_timeout),
        ]
        if parallelism is not None:
            args += ["--parallelism", str(int(parallelism))]
        if from_savepoint:
            args += ["--from-savepoint", from_savepoint]
        if target:
            args += ["--target", target]
        if allow_non_restored_state:
            args.append("--allow-non-restored-state")
        if c.master:
            args += ["--master", c.master]
        budget = stop_timeout + running_timeout + commit_timeout + 600
        return Upgrade.from_json(c.run_json(args, timeout=budget, config=config))


def wait_args(job: str, until: str, pid: int, since: float | None, timeout: float) -> list[str]:
    """``srt wait`` arguments (shared by the hook and the start trigger)."""
    args = ["wait", job, "--until", until, "--pid", str(int(pid)), "--timeout", str(timeout)]
    if since is not None:
        args += ["--since", repr(float(since))]
    return args


def savepoint_list_args(job: str, target: str | None) -> list[str]:
    """``srt savepoint list`` arguments (shared by the hook and the savepoint trigger)."""
    return ["savepoint", "list", job, *(["--target", target] if target else [])]
