"""Deferrable sensors on a streaming job: healthy; committed past a batch or a watermark; a
savepoint complete. ``deferrable=True`` (the default) waits in the triggerer; ``False`` pokes
from the worker (``mode="reschedule"`` frees the slot between pokes). A job that ended or
failed before the condition holds fails the sensor with the reason (``soft_fail``: skipped).
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseSensorOperator

from srt_airflow.hooks.srt import SrtHook

if TYPE_CHECKING:
    from airflow.sdk import Context


class _SrtSensor(BaseSensorOperator):
    def __init__(
        self,
        *,
        job: str,
        deferrable: bool = True,
        srt_conn_id: str = SrtHook.default_conn_name,
        **kwargs: Any,
    ) -> None:
        # Each look is one `srt status` process (~0.2-0.4 s of CPU): every 10 s by default.
        kwargs.setdefault("poke_interval", 10.0)
        super().__init__(**kwargs)
        self.job, self.deferrable, self.srt_conn_id = job, deferrable, srt_conn_id

    @property
    def hook(self) -> SrtHook:
        return SrtHook(srt_conn_id=self.srt_conn_id)

    def trigger(self, context: Context) -> Any:
        raise NotImplementedError

    def execute(self, context: Context) -> Any:
        if not self.deferrable:
            return super().execute(context)
        self.defer(
            trigger=self.trigger(context),
            method_name="execute_complete",
            timeout=timedelta(seconds=float(self.timeout)),
        )

    def execute_complete(self, context: Context, event: Mapping[str, Any] | None = None) -> Any:
        """The trigger's answer: its payload, or the failure it reported."""
        from srt_airflow.errors import SrtAirflowError
        from stateful_runtime.contract import ErrorKind

        if not event or event.get("status") != "success":
            message = (event or {}).get("message") or "the trigger ended without an event"
            raise SrtAirflowError(str(message), kind=ErrorKind.JOB_ERROR)
        self.log.info("%s", event.get("message"))
        return dict(event)

    def _never(self, reason: str) -> None:
        """A condition that cannot hold any more: fail (or skip, with ``soft_fail``)."""
        from airflow.sdk.exceptions import AirflowSkipException

        from srt_airflow.errors import SrtAirflowError
        from stateful_runtime.contract import ErrorKind

        if self.soft_fail:
            raise AirflowSkipException(reason)
        raise SrtAirflowError(reason, kind=ErrorKind.JOB_ERROR)


class SrtJobHealthySensor(_SrtSensor):
    """Waits until the job is healthy: RUNNING, its process alive, no micro-batch in flight
    (or records waiting with no commit) longer than ``max_batch_age``.

    Args:
        job: the job.
        max_batch_age: longest a micro-batch may be in flight (seconds or a timedelta).
    """

    template_fields: Sequence[str] = ("job",)

    def __init__(self, *, max_batch_age: timedelta | float = 300.0, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.max_batch_age_s = (
            max_batch_age.total_seconds()
            if isinstance(max_batch_age, timedelta)
            else float(max_batch_age)
        )

    def trigger(self, context: Context) -> Any:
        from srt_airflow.triggers.srt import SrtJobConditionTrigger

        return SrtJobConditionTrigger(
            job=self.job,
            condition="healthy",
            max_batch_age_s=self.max_batch_age_s,
            poll_interval=float(self.poke_interval),
            srt_conn_id=self.srt_conn_id,
        )

    def poke(self, context: Context) -> bool:
        from srt_airflow._conditions import Outcome, healthy

        verdict = healthy(
            self.hook.status(self.job), self.job, max_batch_age_s=self.max_batch_age_s
        )
        if verdict.outcome is Outcome.NEVER:
            self._never(verdict.reason)
        self.log.info("%s", verdict.reason)
        return verdict.outcome is Outcome.MET


class SrtCommittedSensor(_SrtSensor):
    """Waits until the job's query has committed micro-batch ``batch`` (or a later one) and/or
    its watermark reached ``watermark``: results up to that point are in the sink table.

    Args:
        job: the job.
        query: the query (sink) to look at (default: every query of the job).
        batch: a micro-batch id (templated: e.g. from an upstream task's XCom).
        watermark: an event time, ISO 8601 (templated, e.g. ``"{{ data_interval_end }}"``) or
            a datetime: windows ending at or before it are final.
    """

    template_fields: Sequence[str] = ("job", "query", "batch", "watermark")

    def __init__(
        self,
        *,
        query: str | None = None,
        batch: int | str | None = None,
        watermark: str | datetime | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if batch is None and watermark is None:
            raise ValueError("SrtCommittedSensor needs batch or watermark (or both)")
        self.query, self.batch, self.watermark = query, batch, watermark

    def _marks(self) -> tuple[int | None, str | None]:
        from srt_airflow._conditions import parse_time

        batch = None if self.batch in (None, "") else int(self.batch)  # type: ignore[arg-type]
        mark = None if self.watermark in (None, "") else parse_time(self.watermark).isoformat()  # type: ignore[arg-type]
        return batch, mark

    def trigger(self, context: Context) -> Any:
        from srt_airflow.triggers.srt import SrtJobConditionTrigger

        batch, mark = self._marks()
        return SrtJobConditionTrigger(
            job=self.job,
            condition="committed",
            query=self.query,
            batch=batch,
            watermark=mark,
            poll_interval=float(self.poke_interval),
            srt_conn_id=self.srt_conn_id,
        )

    def poke(self, context: Context) -> bool:
        from srt_airflow._conditions import Outcome, committed_past

        batch, mark = self._marks()
        verdict = committed_past(
            self.hook.status(self.job), self.job, query=self.query, batch=batch, watermark=mark
        )
        if verdict.outcome is Outcome.NEVER:
            self._never(verdict.reason)
        self.log.info("%s", verdict.reason)
        return verdict.outcome is Outcome.MET


class SrtSavepointSensor(_SrtSensor):
    """Waits until a complete savepoint of the job, created at or after ``since``, is listed
    (one taken by another DAG, Dagster's schedule or ``srt savepoint create``). Returns its
    summary.

    Args:
        job: the job.
        since: a time (ISO 8601, templated; default: when the sensor starts).
        target: the savepoint root to look in (default: the job's and ``$SRT_HOME``'s).
    """

    template_fields: Sequence[str] = ("job", "since", "target")

    def __init__(
        self,
        *,
        since: str | datetime | None = None,
        target: str | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.since, self.target = since, target

    def _since(self) -> float:
        from srt_airflow._conditions import parse_time

        if self.since in (None, ""):
            if getattr(self, "_started", None) is None:
                self._started = time.time()
            return self._started
        return parse_time(self.since).timestamp()  # type: ignore[arg-type]

    def trigger(self, context: Context) -> Any:
        from srt_airflow.triggers.srt import SrtSavepointTrigger

        return SrtSavepointTrigger(
            job=self.job,
            since=self._since(),
            target=self.target,
            poll_interval=float(self.poke_interval),
            srt_conn_id=self.srt_conn_id,
        )

    def poke(self, context: Context) -> bool:
        from srt_airflow._conditions import Outcome, savepoint_since

        since = datetime.fromtimestamp(self._since(), UTC)
        verdict, _ = savepoint_since(
            self.hook.savepoints(self.job, target=self.target), self.job, since
        )
        self.log.info("%s", verdict.reason)
        return verdict.outcome is Outcome.MET
