"""Operators: launch (or reuse) a streaming job and wait for it, savepoint, upgrade and
rescale from a savepoint, stop, prune savepoints.

Each runs ``srt ... --json`` through :class:`~srt_airflow.hooks.srt.SrtHook` and returns the
runtime's document as its XCom (JSON, secrets masked). Waiting is deferred to the triggerer
(``deferrable=True``, the default): a worker slot is not held while Spark starts.

==============================  ==========================================================
:class:`SrtLaunchJobOperator`   ``srt launch`` (reuses a live process), then RUNNING and
                                the first commit
:class:`SrtSavepointOperator`   ``srt savepoint create`` (``stop=True``: stop-with-savepoint)
:class:`SrtUpgradeJobOperator`  ``srt upgrade``: stop with a savepoint, relaunch the job file
                                from it, then RUNNING and a commit of its own
:class:`SrtRescaleJobOperator`  the same with a new parallelism (the state is repartitioned)
:class:`SrtStopJobOperator`     ``srt stop`` (``kill=True``: ``srt stop --kill``)
:class:`SrtPruneSavepointsOperator`  ``srt savepoint prune``: the retention policy
==============================  ==========================================================
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from airflow.sdk import BaseOperator

from srt_airflow.hooks.srt import SrtHook

if TYPE_CHECKING:
    from airflow.sdk import Context


def _json(value: Any) -> Any:
    """A value as an XCom: JSON types, secrets masked."""
    from stateful_runtime.masking import mask_data

    return mask_data(json.loads(json.dumps(value, default=str)))


def _fail_on_error(event: Mapping[str, Any] | None, what: str) -> Mapping[str, Any]:
    from srt_airflow.errors import SrtAirflowError
    from stateful_runtime.contract import ErrorKind

    if not event or event.get("status") != "success":
        message = (event or {}).get("message") or f"{what}: the trigger ended without an event"
        raise SrtAirflowError(str(message), kind=ErrorKind.of(str((event or {}).get("kind"))))
    return event


class _SrtOperator(BaseOperator):
    """What every srt operator shares: the connection and the hook."""

    def __init__(self, *, srt_conn_id: str = SrtHook.default_conn_name, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.srt_conn_id = srt_conn_id

    @property
    def hook(self) -> SrtHook:
        return SrtHook(srt_conn_id=self.srt_conn_id)


class _StartsJob(_SrtOperator):
    """Waiting for a (re)started job process: RUNNING, then a commit of its own."""

    def __init__(
        self,
        *,
        wait_for_commit: bool = True,
        fail_without_commit: bool = True,
        running_timeout: float = 300.0,
        commit_timeout: float = 300.0,
        deferrable: bool = True,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.wait_for_commit = wait_for_commit
        self.fail_without_commit = fail_without_commit
        self.running_timeout = running_timeout
        self.commit_timeout = commit_timeout
        self.deferrable = deferrable

    def _wait(self, job: str, pid: int, since: float, result: dict[str, Any]) -> dict[str, Any]:
        if self.deferrable:
            from srt_airflow.triggers.srt import SrtJobStartTrigger

            self.defer(
                trigger=SrtJobStartTrigger(
                    job=job,
                    pid=pid,
                    since=since,
                    running_timeout=self.running_timeout,
                    commit_timeout=self.commit_timeout,
                    wait_for_commit=self.wait_for_commit,
                    srt_conn_id=self.srt_conn_id,
                ),
                method_name="execute_complete",
                kwargs={"result": result},
                timeout=timedelta(seconds=self.running_timeout + self.commit_timeout + 120),
            )
        hook = self.hook
        running = hook.wait(job, until="running", pid=pid, timeout=self.running_timeout)
        event: dict[str, Any] = {
            "status": "success",
            "committed": None,
            "last_committed": dict(running.last_committed),
        }
        if self.wait_for_commit:
            waited = hook.wait(
                job, until="commit", pid=pid, since=since, timeout=self.commit_timeout
            )
            event.update(committed=waited.reached, last_committed=dict(waited.last_committed))
        return self.execute_complete({}, event, result)

    def execute_complete(
        self, context: Context, event: Mapping[str, Any] | None = None, result: Any = None
    ) -> dict[str, Any]:
        """After the wait: fail with the runtime's reason, or on no commit (when
        ``fail_without_commit``); else the result with each query's last committed batch."""
        from srt_airflow.errors import SrtAirflowError
        from stateful_runtime.contract import ErrorKind

        done = _fail_on_error(event, "waiting for the job")
        out = dict(result or {})
        out["last_committed"] = dict(done.get("last_committed") or {})
        out["committed"] = done.get("committed")
        job = out.get("job")
        if done.get("committed") is False:
            message = (
                f"{job} is RUNNING but committed no micro-batch within "
                f"{self.commit_timeout:.0f} s: is there input in its source? (the job keeps "
                f"running; its log: "
                f"{out.get('log_path')})"
            )
            if self.fail_without_commit:
                raise SrtAirflowError(message, kind=ErrorKind.TIMEOUT)
            self.log.warning("%s", message)
        else:
            self.log.info("%s is RUNNING; last committed %s", job, out["last_committed"])
        return _json(out)


class SrtLaunchJobOperator(_StartsJob):
    """Launch a streaming job, or reuse its live process, and wait until it is RUNNING and has
    committed a micro-batch (deferred to the triggerer by default).

    A job already running is reused as it is (``config_drift`` in the XCom lists what differs
    from ``config``; stop it and launch again to apply). Starting from a savepoint with another
    parallelism is :class:`SrtUpgradeJobOperator`'s business; ``from_savepoint`` here starts a
    job that is not running.

    Args:
        job: the job's name (the job file must build it).
        job_file: the job file (relative: to the connection's ``working_directory``).
        config: ``--set`` overrides (templated). Secret values (``sink.password``...) go to
            ``srt`` through its environment, never its command line.
        config_from_connections: config values read from Airflow connections,
            ``{"sink.password": "warehouse_pg.password"}``.
        from_savepoint: a savepoint id or path to start from.
        parallelism: state partitions (with ``from_savepoint``: rescale).
        wait_for_commit: wait for a micro-batch committed after the launch.
        fail_without_commit: fail when none comes within ``commit_timeout`` (else warn).
        running_timeout, commit_timeout: seconds.
        deferrable: wait in the triggerer (default) or in the worker.
        srt_conn_id: the ``srt`` connection.
    """

    template_fields: Sequence[str] = ("job", "job_file", "config", "from_savepoint")
    template_fields_renderers = {"config": "json"}
    ui_color = "#e8f1fb"

    def __init__(
        self,
        *,
        job: str,
        job_file: str,
        config: Mapping[str, Any] | None = None,
        config_from_connections: Mapping[str, str] | None = None,
        from_savepoint: str | None = None,
        parallelism: int | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job, self.job_file = job, job_file
        self.config = dict(config or {})
        self.config_from_connections = dict(config_from_connections or {})
        self.from_savepoint, self.parallelism = from_savepoint, parallelism

    def execute(self, context: Context) -> Any:
        from srt_airflow.hooks.srt import config_from_connections

        config = {**self.config, **config_from_connections(self.config_from_connections)}
        since = time.time()
        launch = self.hook.launch(
            self.job,
            self.job_file,
            config,
            from_savepoint=self.from_savepoint,
            parallelism=self.parallelism,
        )
        status = launch.status
        result = {
            "job": launch.job,
            "pid": launch.pid,
            "launched": launch.launched,
            "log_path": launch.log_path,
            "config_drift": list(launch.config_drift),
            "checkpoint_dir": status.checkpoint_dir,
        }
        if launch.launched:
            self.log.info("launched %s as pid %s; log %s", launch.job, launch.pid, launch.log_path)
            return self._wait(launch.job, launch.pid, since, result)
        self.log.info(
            "%s is already %s as pid %s: reusing it", launch.job, status.entry_state, launch.pid
        )
        if launch.config_drift:
            self.log.warning(
                "the live %s runs with different %s than this task's config; stop it "
                "(SrtStopJobOperator) and launch again to apply",
                launch.job,
                ", ".join(launch.config_drift),
            )
        if status.entry_state == "STARTING" or not any(
            b is not None for b in status.last_committed.values()
        ):
            # Reused before its first commit: wait for one, as for a launch.
            return self._wait(launch.job, launch.pid, since, result)
        result.update(last_committed=dict(status.last_committed), committed=True)
        return _json(result)


class SrtSavepointOperator(_SrtOperator):
    """A savepoint of the job's last committed batch (``srt savepoint create``); with
    ``stop=True``, stop the job cleanly first and take it of the final batch
    (stop-with-savepoint). Returns the savepoint's summary (``id``, ``location``,
    ``batches``, ``watermark_ms``, ``created_at``...).

    Args:
        job: the job.
        target: the savepoint root (a directory or ``s3://bucket/prefix``; default the job's
            ``savepoint.dir``, else ``$SRT_HOME/savepoints``).
        stop: stop-with-savepoint.
        timeout: seconds for the job to answer (and, with ``stop``, to stop).
    """

    template_fields: Sequence[str] = ("job", "target")

    def __init__(
        self,
        *,
        job: str,
        target: str | None = None,
        stop: bool = False,
        timeout: float = 120.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job, self.target, self.stop, self.timeout = job, target, stop, timeout

    def execute(self, context: Context) -> Any:
        sp = self.hook.savepoint(self.job, target=self.target, stop=self.stop, timeout=self.timeout)
        self.log.info(
            "savepoint %s of %s at batch %s: %s", sp.id, self.job, dict(sp.batches), sp.location
        )
        return _json(sp.to_json())


class SrtUpgradeJobOperator(_StartsJob):
    """A stateful upgrade (``srt upgrade``): check that the job file's code takes the job's
    state, stop the job with a savepoint (a job that is not running: start from
    ``from_savepoint``), relaunch the file from it detached, then wait for RUNNING and a
    commit of its own (deferred by default). A failure says the stage it reached and where
    the state is (``savepoint_location``).

    Args:
        job, job_file, config, config_from_connections: as :class:`SrtLaunchJobOperator`
            (``config`` is the new run's: the running job's is not reused).
        parallelism: new state partitions: a rescale (default: unchanged).
        from_savepoint: for a job that is not running.
        target: root of the stop-with-savepoint.
        allow_non_restored_state: let the new code drop state of removed operators.
        stop_timeout: seconds for the running job to stop.
    """

    template_fields: Sequence[str] = ("job", "job_file", "config", "from_savepoint", "target")
    template_fields_renderers = {"config": "json"}

    def __init__(
        self,
        *,
        job: str,
        job_file: str,
        config: Mapping[str, Any] | None = None,
        config_from_connections: Mapping[str, str] | None = None,
        parallelism: int | None = None,
        from_savepoint: str | None = None,
        target: str | None = None,
        allow_non_restored_state: bool = False,
        stop_timeout: float = 120.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        self.job, self.job_file = job, job_file
        self.config = dict(config or {})
        self.config_from_connections = dict(config_from_connections or {})
        self.parallelism, self.from_savepoint, self.target = parallelism, from_savepoint, target
        self.allow_non_restored_state = allow_non_restored_state
        self.stop_timeout = stop_timeout

    def execute(self, context: Context) -> Any:
        from srt_airflow.hooks.srt import config_from_connections

        config = {**self.config, **config_from_connections(self.config_from_connections)}
        since = time.time()
        up = self.hook.upgrade(
            self.job,
            self.job_file,
            config,
            parallelism=self.parallelism,
            from_savepoint=self.from_savepoint,
            target=self.target,
            allow_non_restored_state=self.allow_non_restored_state,
            stop_timeout=self.stop_timeout,
            running_timeout=self.running_timeout,
            # The commit is waited for by this task (deferred), not by srt upgrade.
            commit_timeout=0,
        )
        self.log.info(
            "%s restored from %s as pid %s (parallelism %s)",
            up.job,
            up.restored_from,
            up.pid,
            up.parallelism,
        )
        result = {
            "job": up.job,
            "pid": up.pid,
            "restored_from": up.restored_from,
            "savepoint": None if up.savepoint is None else up.savepoint.to_json(),
            "parallelism": up.parallelism,
            "state_partitions": dict(up.state_partitions),
            "not_restored": list(up.not_restored),
            "log_path": up.log_path,
        }
        if not self.wait_for_commit:
            result.update(last_committed=dict(up.last_committed), committed=None)
            return _json(result)
        return self._wait(up.job, up.pid, since, result)


class SrtRescaleJobOperator(SrtUpgradeJobOperator):
    """:class:`SrtUpgradeJobOperator` to ``parallelism`` state partitions (required): the
    job's state is repartitioned from the stop-with-savepoint."""

    def __init__(self, *, parallelism: int, **kwargs: Any) -> None:
        if parallelism is None or int(parallelism) < 1:
            raise ValueError(f"parallelism must be 1 or more, not {parallelism!r}")
        super().__init__(parallelism=int(parallelism), **kwargs)


class SrtStopJobOperator(_SrtOperator):
    """Stop a job cleanly (``srt stop``: the batch in flight commits, queries stop, sinks
    close; it resumes from its checkpoint when launched again). A job that is not running
    succeeds and says so. ``kill=True``: ``srt stop --kill`` (SIGTERM, SIGKILL to its process
    group after ``timeout``), for a job that does not stop cleanly.
    """

    template_fields: Sequence[str] = ("job",)

    def __init__(
        self, *, job: str, timeout: float = 120.0, kill: bool = False, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        self.job, self.timeout, self.kill = job, timeout, kill

    def execute(self, context: Context) -> Any:
        hook = self.hook
        status = hook.status(self.job)
        if status is None or not status.live:
            state = "never ran" if status is None else status.entry_state
            self.log.info("%s is not running (%s): nothing to stop", self.job, state)
            return _json({"job": self.job, "stopped": False, "state": state})
        stopped: Any
        if self.kill:
            stopped = hook.kill(self.job, pid=status.pid, grace=self.timeout)
        else:
            stopped = hook.stop(self.job, timeout=self.timeout)
        after = stopped.status
        self.log.info("stopped %s (pid %s): %s", self.job, stopped.pid, after.entry_state)
        return _json(
            {
                "job": self.job,
                "stopped": True,
                "pid": stopped.pid,
                "signal": str(stopped.signal),
                "state": after.entry_state,
                "ended_at": after.ended_at,
            }
        )


class SrtPruneSavepointsOperator(_SrtOperator):
    """The savepoint retention policy (``srt savepoint prune``): keep at most ``keep``, dispose
    of those older than ``max_age``; the newest always stays, and so does one a registered
    job was restored from. Returns the locations disposed of."""

    template_fields: Sequence[str] = ("job", "target")

    def __init__(
        self,
        *,
        job: str,
        target: str | None = None,
        keep: int | None = None,
        max_age: timedelta | float | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(**kwargs)
        if keep is None and max_age is None:
            raise ValueError("give keep (how many to keep) or max_age (or both)")
        if keep is not None and int(keep) < 1:
            raise ValueError(f"keep must be 1 or more (the newest always stays), not {keep!r}")
        self.job, self.target, self.keep = job, target, keep
        self.max_age_s = max_age.total_seconds() if isinstance(max_age, timedelta) else max_age

    def execute(self, context: Context) -> Any:
        disposed = self.hook.prune_savepoints(
            self.job, target=self.target, keep=self.keep, max_age_s=self.max_age_s
        )
        self.log.info("disposed of %d savepoints of %s: %s", len(disposed), self.job, disposed)
        return _json({"job": self.job, "disposed": disposed})
