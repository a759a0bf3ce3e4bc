"""Dagster resources of the stateful runtime; nothing here touches Spark or the network at load.

* :class:`StreamingRuntime` — the runtime's one door: typed methods over ``srt ... --json``.
* :class:`Warehouse` — where sink tables are written (DuckDB, PostgreSQL, ClickHouse, Delta);
  :class:`DuckDBWarehouse` — the DuckDB-only form.
* :class:`KafkaResource` — connection settings of a Kafka cluster (confluent-kafka config).
* S3 is dagster-aws's ``S3Resource`` (``endpoint_url`` for MinIO, moto or SeaweedFS).
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource
from pydantic import Field

# The runtime's contract (what srt --json prints) is imported where a result is parsed: loading
# the definitions needs none of it.
if TYPE_CHECKING:
    import duckdb

    from stateful_runtime.contract import (
        Explain,
        JobStatus,
        Killed,
        Launch,
        SavepointSummary,
        Stopped,
        Upgrade,
        Wait,
        WindowCounts,
    )
    from stateful_runtime.control_client import SrtClient
    from stateful_runtime.ledger import LedgerEntry


class StreamingRuntime(ConfigurableResource):
    """The stateful runtime on this machine, through one door: the ``srt`` command line.

    Jobs run as detached ``srt run`` processes (they outlive Dagster runs). Every method runs
    one ``srt ... --json`` command in :attr:`working_directory` with this registry
    (``--home``) and returns its result parsed with the classes the runtime writes it with
    (:mod:`stateful_runtime.contract`); a failed command raises
    :class:`dagster_defs.errors.SrtCommandError` with the runtime's own message. The Dagster
    process itself never imports the runtime's engine or a job file.
    """

    home: str = Field(
        default_factory=lambda: os.environ.get("SRT_HOME", str(Path.home() / ".srt")),
        description="Job registry directory ($SRT_HOME, default ~/.srt): one JSON entry and "
        "one log file per job. Passed to every srt process (--home).",
    )
    working_directory: str = Field(
        default_factory=os.getcwd,
        description="Working directory of srt processes and launched jobs; job files and "
        "relative paths in job config resolve against it (default: the Dagster process's).",
    )
    master: str | None = Field(
        default=None,
        description="Spark master URL for launched jobs (default $SRT_SPARK_MASTER or local[*]).",
    )
    srt_executable: str | None = Field(
        default=None,
        description="The srt command (default: the srt script next to this Python "
        "interpreter, else `python -m stateful_runtime.cli`).",
    )
    launch_timeout_s: float = Field(
        default=300.0,
        description="How long a materialisation waits for a launched job to reach RUNNING "
        "(Spark starts in ~6 s on an idle machine, much slower on a busy one).",
    )
    commit_timeout_s: float = Field(
        default=60.0,
        description="How long a materialisation then waits for a newly committed micro-batch; "
        "when none comes (no input yet) it succeeds and says so.",
    )
    stop_timeout_s: float = Field(
        default=120.0,
        description="How long `srt stop` waits for a job to stop cleanly.",
    )
    dagster_url: str | None = Field(
        default_factory=lambda: os.environ.get("SRT_DAGSTER_URL") or None,
        description="URL of the Dagster webserver (e.g. http://127.0.0.1:3000; default "
        "$SRT_DAGSTER_URL). Set: jobs launched from Dagster report each committed batch "
        "to it at once as a materialisation of their sink tables (the external-asset REST "
        "API), within seconds; the health sensor reports what they could not. Unset: the "
        "sensor reports commits, once a tick.",
    )

    # ------------------------------------------------------------------ plumbing

    def client(self) -> SrtClient:
        """The runtime's control-plane client for this registry and working directory; its
        failures are :class:`~dagster_defs.errors.SrtCommandError`."""
        from dagster_defs.errors import SrtCommandError
        from stateful_runtime.control_client import SrtClient

        return SrtClient(
            home=self.home,
            working_directory=self.working_directory,
            master=self.master,
            executable=self.srt_executable,
            error=SrtCommandError,
        )

    def resolve(self, path: str | os.PathLike[str]) -> Path:
        """``path`` made absolute against the working directory."""
        return Path(self.working_directory, path).resolve()

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for ``srt`` processes: this one's, with this registry's SRT_HOME, plus
        ``extra`` (e.g. :func:`s3_env` of the run's S3 resource). This process's own
        environment is never changed."""
        return self.client().environment(extra=extra)

    def command(self, args: Sequence[str]) -> list[str]:
        """The full command line of ``srt ARGS`` against this registry."""
        return self.client().command(args)

    def run_json(
        self,
        args: Sequence[str],
        *,
        timeout: float,
        env: Mapping[str, str] | None = None,
        config: Mapping[str, Any] | None = None,
    ) -> Any:
        """Run ``srt ARGS --json`` and return the JSON document it printed (``config``: a job
        config whose secrets reach the process in its environment, never its argv); raise
        :class:`~dagster_defs.errors.SrtCommandError` with the runtime's error if it failed."""
        return self.client().run_json(args, timeout=timeout, env=env, config=config)

    # ------------------------------------------------------------------ jobs

    def statuses(self) -> list[JobStatus]:
        """Every job this registry knows (``srt status --json``)."""
        from stateful_runtime.contract import JobStatus

        return [JobStatus.from_json(e) for e in self.run_json(["status"], timeout=120)]

    def status(self, job: str) -> JobStatus | None:
        """The job's state, liveness, config and per-query health and checkpoint facts (last
        committed batch, checkpoint age, batch in flight); None if it never ran here."""
        from stateful_runtime.contract import JobStatus

        found = self.run_json(["status", job], timeout=120)
        return JobStatus.from_json(found[0]) if found else None

    def last_committed(self, job: str) -> dict[str, int | None]:
        """Last committed micro-batch of each of the job's queries (empty if it never ran)."""
        status = self.status(job)
        return {} if status is None else status.last_committed

    def explain(self, job_file: str, config: Mapping[str, Any]) -> Explain:
        """``srt explain JOB_FILE --no-spark``: the planned queries, without starting Spark."""
        from stateful_runtime.contract import Explain

        data = self.run_json(
            ["explain", str(self.resolve(job_file)), "--no-spark", *self.client().set_args(config)],
            timeout=120,
            config=config,
        )
        return Explain.from_json(data)

    def launch(
        self,
        job: str,
        job_file: str,
        config: Mapping[str, Any],
        *,
        from_savepoint: str | None = None,
        parallelism: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Launch:
        """``srt launch``: plan the job file (it must build ``job``), then reuse the job's live
        process or start ``srt run`` detached, optionally from a savepoint and with a new
        parallelism. Returns at once; see :meth:`wait_running` and :meth:`wait_committed`."""
        from stateful_runtime.contract import Launch

        args = [
            "launch",
            str(self.resolve(job_file)),
            "--job",
            job,
            *self.client().set_args(config),
        ]
        if self.master:
            args += ["--master", self.master]
        if from_savepoint:
            args += ["--from-savepoint", from_savepoint]
        if parallelism is not None:
            args += ["--parallelism", str(int(parallelism))]
        return Launch.from_json(self.run_json(args, timeout=300, env=env, config=config))

    def wait_running(self, job: str, pid: int, *, timeout: float | None = None) -> JobStatus:
        """Wait until process ``pid`` of the job has started its queries (RUNNING); raises
        with the end of the job's log if it ends first or time runs out."""
        from stateful_runtime.contract import Wait

        t = self.launch_timeout_s if timeout is None else timeout
        data = self.run_json(
            ["wait", job, "--until", "running", "--pid", str(pid), "--timeout", str(t)],
            timeout=t + 60,
        )
        return Wait.from_json(data).status

    def wait_committed(
        self, job: str, pid: int, *, since: float, timeout: float | None = None
    ) -> Wait:
        """Wait until one of the job's queries commits a micro-batch at or after ``since``
        (epoch seconds); ``reached`` is False if the job runs but committed none in time (no
        input)."""
        from stateful_runtime.contract import Wait

        t = self.commit_timeout_s if timeout is None else timeout
        data = self.run_json(
            [
                "wait",
                job,
                "--until",
                "commit",
                "--pid",
                str(pid),
                "--since",
                repr(since),
                "--timeout",
                str(t),
            ],
            timeout=t + 60,
        )
        return Wait.from_json(data)

    def stop(self, job: str, *, timeout: float | None = None) -> Stopped:
        """``srt stop JOB``: a clean stop (the job resumes from its checkpoint next time)."""
        from stateful_runtime.contract import Stopped

        t = self.stop_timeout_s if timeout is None else timeout
        return Stopped.from_json(self.run_json(["stop", job, "--timeout", str(t)], timeout=t + 60))

    def kill(self, job: str, *, pid: int, grace: float) -> Killed:
        """``srt stop JOB --kill``: end process ``pid`` of the job whatever its state (SIGTERM,
        SIGKILL to its process group after ``grace`` s; a gone process's group is SIGKILLed).
        Refused if the job's process is no longer ``pid``."""
        from stateful_runtime.contract import Killed

        args = ["stop", job, "--kill", "--pid", str(pid), "--timeout", str(grace)]
        return Killed.from_json(self.run_json(args, timeout=grace + 90))

    # ------------------------------------------------------------------ savepoints

    def savepoint(
        self,
        job: str,
        *,
        target: str | None = None,
        stop: bool = False,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> SavepointSummary:
        """``srt savepoint create JOB [--stop] [--target ROOT]``: a savepoint of the job's last
        committed batch (with ``stop``, after stopping it cleanly)."""
        from stateful_runtime.contract import SavepointSummary

        t = self.stop_timeout_s if timeout is None else timeout
        args = ["savepoint", "create", job, "--timeout", str(t)]
        if stop:
            args.append("--stop")
        if target:
            args += ["--target", target]
        return SavepointSummary.from_json(self.run_json(args, timeout=t + 300, env=env))

    def savepoints(
        self, job: str | None, *, target: str | None = None, env: Mapping[str, str] | None = None
    ) -> list[SavepointSummary]:
        """``srt savepoint list [JOB] [--target ROOT]``: the job's (None: every job's) complete
        savepoints under ``target`` (default: every root the registry knows), oldest first."""
        from stateful_runtime.contract import SavepointSummary

        args = ["savepoint", "list", *([job] if job else [])]
        args += ["--target", target] if target else []
        found = self.run_json(args, timeout=120, env=env)
        return sorted(
            (SavepointSummary.from_json(s) for s in found), key=lambda s: (s.created_at, s.id)
        )

    def prune_savepoints(
        self,
        job: str,
        root: str,
        *,
        keep: int | None,
        max_age_s: float | None,
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        """``srt savepoint prune JOB --target ROOT --keep N --max-age AGE``: the retention policy
        (the newest savepoint and any a registered job was restored from are kept). Returns
        the locations it disposed of."""
        from stateful_runtime.contract import Disposed

        args = ["savepoint", "prune", job, "--target", root]
        if keep is not None:
            args += ["--keep", str(keep)]
        if max_age_s is not None:
            args += ["--max-age", f"{int(max_age_s)}s"]
        disposed = Disposed.from_json(self.run_json(args, timeout=300, env=env))
        return [location for _, location in disposed.disposed]

    def upgrade(
        self,
        job: str,
        job_file: str,
        config: Mapping[str, Any],
        *,
        parallelism: int | None = None,
        from_savepoint: str | None = None,
        target: str | None = None,
        stop_timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Upgrade:
        """``srt upgrade JOB JOB_FILE``: check that the file's code takes the job's state, stop
        the job with a savepoint (or, for a job that is not running, start from
        ``from_savepoint``), relaunch the file from it detached (``parallelism``: rescale;
        default the job's current one), wait until RUNNING and for a batch of its own (up to
        :attr:`commit_timeout_s`). A failure's ``details`` say the ``stage`` it reached and
        the ``savepoint_location`` holding the state."""
        from stateful_runtime.contract import Upgrade

        st = self.stop_timeout_s if stop_timeout is None else stop_timeout
        args = [
            "upgrade",
            job,
            str(self.resolve(job_file)),
            *self.client().set_args(config),
            "--stop-timeout",
            str(st),
            "--timeout",
            str(self.launch_timeout_s),
            "--commit-timeout",
            str(self.commit_timeout_s),
        ]
        if parallelism is not None:
            args += ["--parallelism", str(int(parallelism))]
        if from_savepoint:
            args += ["--from-savepoint", from_savepoint]
        if target:
            args += ["--target", target]
        if self.master:
            args += ["--master", self.master]
        budget = st + self.launch_timeout_s + self.commit_timeout_s + 600
        return Upgrade.from_json(self.run_json(args, timeout=budget, env=env, config=config))

    def rescale(
        self, job: str, job_file: str, config: Mapping[str, Any], parallelism: int, **kwargs: Any
    ) -> Upgrade:
        """:meth:`upgrade` to ``parallelism`` state partitions (the state is repartitioned)."""
        return self.upgrade(job, job_file, config, parallelism=parallelism, **kwargs)

    # ------------------------------------------------------------------ reconciliation

    def window_counts(
        self,
        job: str,
        query: str,
        *,
        window: timedelta,
        batch: int | None = None,
        source: str | None = None,
    ) -> WindowCounts:
        """``srt reconcile JOB --query Q --window W --batch B``: the good records of the
        query's source topic per closed tumbling window, up to committed batch ``batch``'s
        offsets (computed by an srt process, which loads the job file as the job runs it)."""
        from stateful_runtime.contract import WindowCounts

        args = ["reconcile", job, "--query", query, "--window", f"{window.total_seconds()!r}s"]
        if batch is not None:
            args += ["--batch", str(int(batch))]
        if source:
            args += ["--source", source]
        return WindowCounts.from_json(self.run_json(args, timeout=1800))


def s3_env(s3: Any) -> dict[str, str]:
    """Environment that points an ``srt`` process's S3 client where a dagster-aws
    ``S3Resource`` points (endpoint, region, credentials, profile); empty for unset fields,
    so boto3's own configuration applies."""
    if s3 is None:
        return {}
    fields = {
        "SRT_S3_ENDPOINT_URL": "endpoint_url",
        "AWS_REGION": "region_name",
        "AWS_DEFAULT_REGION": "region_name",
        "AWS_ACCESS_KEY_ID": "aws_access_key_id",
        "AWS_SECRET_ACCESS_KEY": "aws_secret_access_key",
        "AWS_SESSION_TOKEN": "aws_session_token",
        "AWS_PROFILE": "profile_name",
    }
    return {var: str(v) for var, attr in fields.items() if (v := getattr(s3, attr, None))}


@dataclass
class TableRead:
    """A sink table as the asset and its checks see it.

    Attributes:
        frame: the table (pandas); ClickHouse's read with FINAL, without its version column.
        columns: (name, warehouse type) per column.
        last: the last micro-batch the sink committed (its ledger), read before or with the
            table: windows closed by that batch's watermark are final in ``frame``.
        location: where the table lives (secrets masked).
    """

    frame: Any
    columns: list[tuple[str, str]]
    last: LedgerEntry | None
    location: str


class DuckDBWarehouse(ConfigurableResource):
    """The DuckDB database streaming jobs upsert their sink tables into.

    Reads open the file read-only and briefly: DuckDB allows one writing process, and a job's
    sink opens its connection per micro-batch, waiting for readers to let go.
    """

    path: str = Field(
        description="DuckDB database file; relative paths resolve against the Dagster "
        "process's working directory. Jobs bound to it with "
        "config_from_resources={'sink.database': 'warehouse.path'} write here.",
    )
    lock_wait_s: float = Field(
        default=30.0,
        description="How long a read waits while a micro-batch holds the database's write lock.",
    )

    def database(self) -> Path:
        return Path(self.path).resolve()

    @contextmanager
    def read_only(self) -> Iterator[duckdb.DuckDBPyConnection]:
        """A read-only connection: a consistent view, held only for the block."""
        import duckdb

        db = self.database()
        if not db.exists():
            raise FileNotFoundError(
                f"DuckDB database {db} does not exist yet: no job has written a micro-batch to it"
            )
        deadline = time.monotonic() + self.lock_wait_s
        while True:
            try:
                con = duckdb.connect(str(db), read_only=True)
                break
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        try:
            yield con
        finally:
            con.close()

    kind: str = Field(default="duckdb", description="Always duckdb (see Warehouse).")

    def sink_config(self) -> dict[str, str]:
        """The job's ``sink.*`` keys that make it write here
        (``config_from_resources={"sink.*": "warehouse.sink_config"}``)."""
        from stateful_runtime.sink_kinds import SINK_KINDS

        return {"sink.kind": "duckdb", SINK_KINDS["duckdb"].location_key: str(self.database())}

    def location(self) -> str:
        return str(self.database())

    def read(self, table: str, job: str, sink: str) -> TableRead:
        """The table and its sink's last committed batch, in one snapshot; LookupError if the
        table is not there yet."""
        with self.read_only() as con:
            exists = con.execute(
                "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [table]
            ).fetchall()[0][0]
            if not exists:
                raise LookupError(f"table {table} is not in {self.database()}")
            quoted = '"' + table.replace('"', '""') + '"'
            frame = con.execute(f"SELECT * FROM {quoted}").df()
            columns = [(r[0], str(r[1])) for r in con.execute(f"DESCRIBE {quoted}").fetchall()]
            last = self.committed_batches(job, sink, newest=1, con=con)
        return TableRead(frame, columns, last[0] if last else None, str(self.database()))

    def committed_batches(
        self,
        job: str,
        sink: str,
        *,
        newest: int | None = None,
        con: duckdb.DuckDBPyConnection | None = None,
    ) -> list[LedgerEntry]:
        """The micro-batches the job's sink ``sink`` (its query's name) committed here, newest
        first, from the sink ledger (``dbt_sink.committed_batches``). Pass ``con`` to read them
        in the same snapshot as a table read on it."""
        from dbt_sink import committed_batches

        if con is not None:
            return committed_batches(con, job, sink, newest=newest)
        with self.read_only() as own:
            return committed_batches(own, job, sink, newest=newest)


class Warehouse(ConfigurableResource):
    """The warehouse streaming jobs write their sink tables to: DuckDB, PostgreSQL,
    ClickHouse or Delta Lake (``kind``). Jobs bound with
    ``config_from_resources={"sink.*": "warehouse.sink_config"}`` get ``sink.kind`` and the
    kind's location keys; the sink-table assets and checks read the same place (ClickHouse
    with ``FINAL``). Nothing connects at load.
    """

    kind: str = Field(default="duckdb", description="duckdb, postgres, clickhouse or delta.")
    path: str | None = Field(
        default=None,
        description="duckdb: the database file; delta: the table's location (a directory or "
        "s3://bucket/prefix). Relative paths resolve against the Dagster process's working "
        "directory.",
    )
    dsn: str | None = Field(
        default=None, description="postgres: postgresql://user@host:port/database (no password)."
    )
    url: str | None = Field(
        default=None,
        description="clickhouse: clickhouse://user@host:port/database (native protocol, no "
        "password).",
    )
    password: str | None = Field(
        default=None,
        description="postgres/clickhouse: env:NAME, the environment variable holding the "
        "password (read by the job and by the checks; never shown).",
    )

    def _check(self) -> None:
        from dagster_defs._specs import config_error
        from stateful_runtime.sink_kinds import WAREHOUSE_KINDS

        if self.kind not in WAREHOUSE_KINDS:
            raise config_error(f"warehouse kind {self.kind!r}: use one of {WAREHOUSE_KINDS}")
        need = {"duckdb": "path", "postgres": "dsn", "clickhouse": "url", "delta": "path"}
        if not getattr(self, need[self.kind]):
            raise config_error(f"warehouse kind {self.kind!r} needs {need[self.kind]!r}")
        for value in (self.dsn, self.url):
            if value and "@" in value and ":" in value.split("://", 1)[-1].split("@", 1)[0]:
                raise config_error(
                    "warehouse: give the password as password='env:NAME', not "
                    "inside the URL (URLs are shown in run metadata)"
                )
        if self.password and not self.password.startswith("env:"):
            raise config_error(
                "warehouse: password must be env:NAME (an environment variable "
                "the job and the checks read), never the password itself"
            )

    def location(self) -> str:
        self._check()
        if self.kind in ("duckdb", "delta"):
            assert self.path is not None
            return str(Path(self.path).resolve()) if "://" not in self.path else self.path
        return str(self.dsn if self.kind == "postgres" else self.url)

    def sink_config(self) -> dict[str, str]:
        """The job's ``sink.*`` keys that make it write here."""
        from stateful_runtime.sink_kinds import SINK_KINDS

        location = self.location()
        kind = SINK_KINDS[self.kind]
        out = {"sink.kind": self.kind, kind.location_key: location}
        if self.password and "sink.password" in kind.config_keys:
            out["sink.password"] = self.password
        return out

    def _sink(self, table: str, job: str, sink: str) -> Any:
        from stateful_runtime.sink_kinds import sink_class

        config = {**self.sink_config(), "sink.table": table}
        out = sink_class(self.kind).from_config(config, key=("_key",))
        out.open(job, sink)
        return out

    def read(self, table: str, job: str, sink: str) -> TableRead:
        """The table and its sink's last committed batch (see :class:`TableRead`);
        LookupError if the table is not there yet."""
        if self.kind == "duckdb":
            assert self.path is not None
            return DuckDBWarehouse(path=self.path).read(table, job, sink)
        target = self._sink(table, job, sink)
        arrow, last = target.snapshot()
        columns = [(f.name, str(f.type)) for f in arrow.schema]
        return TableRead(arrow.to_pandas(), columns, last, target.location)


class KafkaResource(ConfigurableResource):
    """Connection settings of a Kafka cluster (or a Kafka-protocol broker) for jobs and checks.

    Nothing connects at load; :meth:`client_config` gives the confluent-kafka configuration.
    """

    bootstrap_servers: str = Field(
        default="127.0.0.1:9092",
        description="Comma-separated host:port list of brokers (bootstrap.servers).",
    )
    security_protocol: str = Field(
        default="PLAINTEXT",
        description="PLAINTEXT, SSL, SASL_PLAINTEXT or SASL_SSL (security.protocol).",
    )
    sasl_mechanism: str | None = Field(
        default=None,
        description="SASL mechanism, e.g. PLAIN or SCRAM-SHA-512 (sasl.mechanism).",
    )
    sasl_username: str | None = Field(default=None, description="SASL user name.")
    sasl_password: str | None = Field(default=None, description="SASL password.")
    client_id: str = Field(default="stateful-runtime", description="Client id (client.id).")

    def client_config(self) -> dict[str, str]:
        """confluent-kafka configuration for a producer, consumer or admin client."""
        conf = {
            "bootstrap.servers": self.bootstrap_servers,
            "security.protocol": self.security_protocol,
            "client.id": self.client_id,
        }
        optional = {
            "sasl.mechanism": self.sasl_mechanism,
            "sasl.username": self.sasl_username,
            "sasl.password": self.sasl_password,
        }
        conf.update({k: v for k, v in optional.items() if v is not None})
        return conf
