"""Triggers: the waiting half of the deferrable operators and sensors, and the event trigger
that schedules DAGs on a sink table's fresh commits (``AssetWatcher``).

They run in the triggerer's event loop and reach the runtime as the hook does, through ``srt
... --json`` (:meth:`SrtClient.arun_json`, awaited, never blocking the loop). Each takes the
``srt`` connection's id and reads the connection in the triggerer. A trigger's event payload
is ``{"status": "success" | "error", "message": ..., ...}``; the task's ``execute_complete``
fails on ``error`` with the runtime's message.

==============================  ===========================================================
:class:`SrtJobStartTrigger`     a launched process RUNNING (``srt wait``), then its first
                                commit
:class:`SrtJobConditionTrigger` the job healthy, or committed past a batch or a watermark
                                (``srt status`` every ``poll_interval``)
:class:`SrtSavepointTrigger`    a complete savepoint of the job since a time
:class:`SrtSinkCommitTrigger`   ``BaseEventTrigger``: an event each time a sink table's query
                                has newly committed batches
==============================  ===========================================================
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

from airflow.triggers.base import BaseEventTrigger, BaseTrigger, TriggerEvent

from srt_airflow._client import READ_TIMEOUT_S, SrtClient

_MODULE = __name__


async def _client(srt_conn_id: str) -> SrtClient:
    """The connection's client, read in the triggerer (``srt_default`` may be absent: this
    machine's defaults)."""
    from airflow.sdk import BaseHook
    from airflow.sdk.exceptions import AirflowNotFoundException

    from srt_airflow.hooks.srt import SrtHook, client_of

    try:
        conn = await BaseHook.aget_connection(srt_conn_id)
    except AirflowNotFoundException:
        if srt_conn_id != SrtHook.default_conn_name:
            raise
        conn = None
    return client_of(conn)


async def _status(client: SrtClient, job: str) -> Any:
    from stateful_runtime.contract import JobStatus

    found = await client.arun_json(["status", job], timeout=READ_TIMEOUT_S)
    return JobStatus.from_json(found[0]) if found else None


def _error(message: str, **more: Any) -> TriggerEvent:
    from stateful_runtime.masking import mask_text

    return TriggerEvent({"status": "error", "message": mask_text(message), **more})


class SrtJobStartTrigger(BaseTrigger):
    """Fires when process ``pid`` of ``job`` is RUNNING and (``wait_for_commit``) has
    committed a micro-batch at or after ``since`` (epoch seconds).

    The event's ``last_committed`` is each query's last committed batch; ``committed`` is
    False when no batch came within ``commit_timeout`` (no input yet): the task decides.
    """

    def __init__(
        self,
        *,
        job: str,
        pid: int,
        since: float,
        running_timeout: float = 300.0,
        commit_timeout: float = 300.0,
        wait_for_commit: bool = True,
        srt_conn_id: str = "srt_default",
    ) -> None:
        super().__init__()
        self.job, self.pid, self.since = job, int(pid), float(since)
        self.running_timeout, self.commit_timeout = float(running_timeout), float(commit_timeout)
        self.wait_for_commit = bool(wait_for_commit)
        self.srt_conn_id = srt_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{_MODULE}.SrtJobStartTrigger",
            {
                "job": self.job,
                "pid": self.pid,
                "since": self.since,
                "running_timeout": self.running_timeout,
                "commit_timeout": self.commit_timeout,
                "wait_for_commit": self.wait_for_commit,
                "srt_conn_id": self.srt_conn_id,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from srt_airflow.errors import SrtAirflowError
        from srt_airflow.hooks.srt import wait_args
        from stateful_runtime.contract import Wait

        try:
            client = await _client(self.srt_conn_id)
            t = self.running_timeout
            running = Wait.from_json(
                await client.arun_json(
                    wait_args(self.job, "running", self.pid, None, t), timeout=t + 60
                )
            )
            if not self.wait_for_commit:
                yield TriggerEvent(_success(self.job, self.pid, running, committed=None))
                return
            t = self.commit_timeout
            waited = Wait.from_json(
                await client.arun_json(
                    wait_args(self.job, "commit", self.pid, self.since, t), timeout=t + 60
                )
            )
        except SrtAirflowError as exc:
            yield _error(str(exc), kind=str(exc.kind))
            return
        yield TriggerEvent(_success(self.job, self.pid, waited, committed=waited.reached))


def _success(job: str, pid: int, waited: Any, *, committed: bool | None) -> dict[str, Any]:
    status = waited.status
    return {
        "status": "success",
        "job": job,
        "pid": pid,
        "state": None if status.entry_state is None else str(status.entry_state),
        "committed": committed,
        "last_committed": dict(waited.last_committed or status.last_committed),
        "spark_app_id": status.spark_app_id,
        "log_path": status.log_path,
    }


class SrtJobConditionTrigger(BaseTrigger):
    """Fires when the job is healthy (``condition="healthy"``) or has committed past a batch
    or a watermark (``condition="committed"``), polling ``srt status`` every
    ``poll_interval`` seconds; fires an error when the job ended or failed first.

    Args:
        job: the job.
        condition: ``healthy`` or ``committed``.
        query: ``committed``: the query (sink) to look at (default: every query of the job).
        batch: ``committed``: a micro-batch id the query must have committed.
        watermark: ``committed``: an event time (ISO 8601) the query's watermark must reach.
        max_batch_age_s: ``healthy``: longest a micro-batch may be in flight.
        poll_interval: seconds between two looks.
    """

    def __init__(
        self,
        *,
        job: str,
        condition: str,
        query: str | None = None,
        batch: int | None = None,
        watermark: str | None = None,
        max_batch_age_s: float = 300.0,
        poll_interval: float = 5.0,
        srt_conn_id: str = "srt_default",
    ) -> None:
        super().__init__()
        if condition not in ("healthy", "committed"):
            raise ValueError(f"condition {condition!r}: use 'healthy' or 'committed'")
        self.job, self.condition, self.query = job, condition, query
        self.batch = None if batch is None else int(batch)
        self.watermark = watermark
        self.max_batch_age_s, self.poll_interval = float(max_batch_age_s), float(poll_interval)
        self.srt_conn_id = srt_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{_MODULE}.SrtJobConditionTrigger",
            {
                "job": self.job,
                "condition": self.condition,
                "query": self.query,
                "batch": self.batch,
                "watermark": self.watermark,
                "max_batch_age_s": self.max_batch_age_s,
                "poll_interval": self.poll_interval,
                "srt_conn_id": self.srt_conn_id,
            },
        )

    def verdict(self, status: Any) -> Any:
        """The condition on one status document."""
        from srt_airflow._conditions import committed_past, healthy

        if self.condition == "healthy":
            return healthy(status, self.job, max_batch_age_s=self.max_batch_age_s)
        return committed_past(
            status, self.job, query=self.query, batch=self.batch, watermark=self.watermark
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from srt_airflow._conditions import Outcome
        from srt_airflow.errors import SrtAirflowError

        last_reason = None
        try:
            client = await _client(self.srt_conn_id)
            while True:
                status = await _status(client, self.job)
                verdict = self.verdict(status)
                if verdict.outcome is Outcome.MET:
                    yield TriggerEvent(
                        {
                            "status": "success",
                            "job": self.job,
                            "message": verdict.reason,
                            "last_committed": dict(status.last_committed),
                        }
                    )
                    return
                if verdict.outcome is Outcome.NEVER:
                    yield _error(verdict.reason)
                    return
                if verdict.reason != last_reason:
                    self.log.info("%s", verdict.reason)
                    last_reason = verdict.reason
                await asyncio.sleep(self.poll_interval)
        except (SrtAirflowError, ValueError) as exc:
            yield _error(str(exc))


class SrtSavepointTrigger(BaseTrigger):
    """Fires when a complete savepoint of ``job`` created at or after ``since`` (epoch
    seconds) is listed (``srt savepoint list``, in ``target`` or the default roots)."""

    def __init__(
        self,
        *,
        job: str,
        since: float,
        target: str | None = None,
        poll_interval: float = 5.0,
        srt_conn_id: str = "srt_default",
    ) -> None:
        super().__init__()
        self.job, self.since, self.target = job, float(since), target
        self.poll_interval, self.srt_conn_id = float(poll_interval), srt_conn_id

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{_MODULE}.SrtSavepointTrigger",
            {
                "job": self.job,
                "since": self.since,
                "target": self.target,
                "poll_interval": self.poll_interval,
                "srt_conn_id": self.srt_conn_id,
            },
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from srt_airflow._conditions import Outcome, savepoint_since
        from srt_airflow.errors import SrtAirflowError
        from srt_airflow.hooks.srt import savepoint_list_args
        from stateful_runtime.contract import SavepointSummary

        since = datetime.fromtimestamp(self.since, UTC)
        try:
            client = await _client(self.srt_conn_id)
            while True:
                rows = await client.arun_json(
                    savepoint_list_args(self.job, self.target), timeout=READ_TIMEOUT_S
                )
                found = [SavepointSummary.from_json(r) for r in rows]
                verdict, newest = savepoint_since(found, self.job, since)
                if verdict.outcome is Outcome.MET and newest is not None:
                    yield TriggerEvent(
                        {"status": "success", "message": verdict.reason, **newest.to_json()}
                    )
                    return
                await asyncio.sleep(self.poll_interval)
        except SrtAirflowError as exc:
            yield _error(str(exc))


class SrtSinkCommitTrigger(BaseEventTrigger):
    """An event each time ``query`` (the sink writing ``table``) of ``job`` has committed new
    micro-batches: for ``AssetWatcher``, so a DAG scheduled on the table's asset runs on fresh
    results.

    A batch is committed in the job's checkpoint only after its sink wrote its rows and its
    ledger row (``srt_sink_ledger``), so a new committed batch means the rows are in the
    table. The trigger reads the checkpoint facts through ``srt status`` every
    ``poll_interval`` seconds (files only: no warehouse connection, no Spark). Its cursor,
    the last batch reported, is kept in the asset's state store, so a triggerer restart
    reports neither a batch twice nor skips one; the first look reports what is committed
    already. A job that is not running is waited for (a stream has pauses), not an error.

    Payload: ``job``, ``query``, ``table``, ``first_batch``, ``last_batch``, ``batches``,
    ``watermark`` (the query's, ISO 8601, if it has one), ``committed_at`` (ISO 8601).
    """

    def __init__(
        self,
        *,
        job: str,
        query: str,
        table: str,
        poll_interval: float = 10.0,
        srt_conn_id: str = "srt_default",
    ) -> None:
        super().__init__()
        self.job, self.query, self.table = job, query, table
        self.poll_interval, self.srt_conn_id = float(poll_interval), srt_conn_id
        self._last: int | None = None

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return (
            f"{_MODULE}.SrtSinkCommitTrigger",
            {
                "job": self.job,
                "query": self.query,
                "table": self.table,
                "poll_interval": self.poll_interval,
                "srt_conn_id": self.srt_conn_id,
            },
        )

    @property
    def cursor_key(self) -> str:
        """The asset state store's key of this trigger's cursor."""
        return f"srt/{self.job}/{self.query}/last_batch"

    async def _load_cursor(self) -> int | None:
        store = self.asset_state_store
        if store is None:
            return self._last
        try:
            value = await store.aget(self.cursor_key)
        except Exception as exc:  # noqa: BLE001 - no store (one asset per trigger): memory
            self.log.warning("asset state store unavailable (%s); cursor kept in memory", exc)
            return self._last
        return None if value is None else int(value)  # type: ignore[arg-type]

    async def _save_cursor(self, batch: int) -> None:
        self._last = batch
        store = self.asset_state_store
        if store is None:
            return
        try:
            await store.aset(self.cursor_key, batch)
        except Exception as exc:  # noqa: BLE001 - the event is out; memory keeps the cursor
            self.log.warning("could not save the cursor in the asset state store: %s", exc)

    def step(
        self, status: Any, after: int | None
    ) -> tuple[int | None, dict[str, Any] | None, bool]:
        """One look: ``(cursor, payload, restored)``. The payload covers the batches committed
        after ``after`` (None: nothing new); a checkpoint that went back (a restore from an
        older savepoint) moves the cursor back to it (``restored``), so the batches run again
        are reported again."""
        from srt_airflow._conditions import new_commits

        after, span, restored = new_commits(status, self.query, after)
        if span is None:
            return after, None, restored
        first, last = span
        facts = status.queries[self.query].checkpoint
        batch = status.query_health(self.query).batch
        watermark = None if batch is None else batch.watermark
        if watermark and watermark.startswith("1970-01-01T00:00:00"):
            watermark = None  # Spark's "no watermark yet"
        at = None if facts is None else facts.last_commit_time
        payload = {
            "job": self.job,
            "query": self.query,
            "table": self.table,
            "first_batch": first,
            "last_batch": last,
            "batches": last - first + 1,
            "watermark": watermark,
            "committed_at": None
            if at is None
            else datetime.fromtimestamp(at, UTC).isoformat().replace("+00:00", "Z"),
        }
        return last, payload, False

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from srt_airflow.errors import SrtAirflowError

        client = await _client(self.srt_conn_id)
        after = await self._load_cursor()
        problem = None
        while True:
            started = time.monotonic()
            try:
                status = await _status(client, self.job)
                problem = None
            except SrtAirflowError as exc:
                # The registry unreadable for a moment (a job being replaced): say it once.
                if str(exc) != problem:
                    self.log.warning("srt status %s: %s", self.job, exc)
                    problem = str(exc)
                status = None
            after, payload, restored = self.step(status, after)
            if restored:
                # Restored from an older savepoint: its batches after the restored one run
                # again (the sinks rewound their ledgers), so they are reported again.
                self.log.info("%s went back to batch %s (restored)", self.job, after)
                await self._save_cursor(after)  # type: ignore[arg-type]
            if payload is not None:
                self.log.info(
                    "%s committed batches %s-%s to %s",
                    self.job,
                    payload["first_batch"],
                    payload["last_batch"],
                    self.table,
                )
                yield TriggerEvent(payload)
                await self._save_cursor(payload["last_batch"])
            await asyncio.sleep(max(0.0, self.poll_interval - (time.monotonic() - started)))
