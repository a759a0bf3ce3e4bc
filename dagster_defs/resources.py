"""Dagster resources of the stateful runtime; nothing here touches Spark or the network at load.

* :class:`StreamingRuntime` — the job registry (``$SRT_HOME``) and the ``srt`` processes.
* :class:`DuckDBWarehouse` — the DuckDB database sink tables are written to.
* :class:`KafkaResource` — connection settings of a Kafka cluster (confluent-kafka config).
* S3 is dagster-aws's ``S3Resource`` (``endpoint_url`` for MinIO, moto or SeaweedFS).
"""

from __future__ import annotations

import os
import re
import subprocess
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dagster import ConfigurableResource
from pydantic import Field

if TYPE_CHECKING:
    import duckdb

    from stateful_runtime.runtime.launcher import Launch


class StreamingRuntime(ConfigurableResource):
    """The stateful runtime on this machine: where jobs register and how they are launched.

    Jobs run as detached ``srt run`` processes (they outlive Dagster runs); this resource
    starts, finds and stops them through the job registry, the files ``srt status`` reads.
    """

    home: str = Field(
        default_factory=lambda: os.environ.get("SRT_HOME", str(Path.home() / ".srt")),
        description="Job registry directory ($SRT_HOME, default ~/.srt): one JSON entry and "
        "one log file per job.",
    )
    working_directory: str = Field(
        default_factory=os.getcwd,
        description="Working directory of launched jobs; job files and relative paths in job "
        "config resolve against it (default: the Dagster process's).",
    )
    master: str | None = Field(
        default=None,
        description="Spark master URL for launched jobs (default $SRT_SPARK_MASTER or local[*]).",
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

    def _registry(self):  # -> module stateful_runtime.runtime.registry
        # The registry reads $SRT_HOME; imported here because the runtime package imports
        # pyspark, which definition load must not.
        os.environ["SRT_HOME"] = self.home
        from stateful_runtime.runtime import registry

        return registry

    def jobs(self) -> list[dict]:
        """Registry entries of every job this runtime has run."""
        return self._registry().entries()

    def entry(self, job: str) -> dict[str, Any] | None:
        """The job's registry entry, or None if it never ran here."""
        return self._registry().read(job)

    def pid_alive(self, pid: int | None) -> bool:
        return self._registry().pid_alive(pid)

    def resolve(self, path: str | os.PathLike[str]) -> Path:
        """``path`` made absolute against the working directory."""
        return Path(self.working_directory, path).resolve()

    def env(self, extra: Mapping[str, str] | None = None) -> dict[str, str]:
        """Environment for ``srt`` processes: this one's, with this registry's SRT_HOME, plus
        ``extra`` (e.g. :func:`s3_env` of the run's S3 resource)."""
        env = dict(os.environ)
        env["SRT_HOME"] = self.home
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(extra or {})
        return env

    def srt(
        self, args: Sequence[str], *, timeout: float, env: Mapping[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """Run an ``srt`` command in the working directory and capture its output; ``env``
        adds to :meth:`env`."""
        self._registry()
        from stateful_runtime.runtime.launcher import srt_command

        return subprocess.run(
            [*srt_command(), *args],
            cwd=self.working_directory,
            env=self.env(env),
            capture_output=True,
            text=True,
            timeout=timeout,
        )

    def explain(self, job_file: str, config: Mapping[str, Any]) -> str:
        """``srt explain JOB_FILE --no-spark``: the planned queries, without starting Spark."""
        from stateful_runtime.exceptions import ConfigError
        from stateful_runtime.runtime.launcher import set_args

        out = self.srt(
            ["explain", str(self.resolve(job_file)), "--no-spark", *set_args(config)], timeout=120
        )
        if out.returncode != 0:
            raise ConfigError(f"srt explain {job_file} failed: {out.stderr.strip()[-3000:]}")
        return out.stdout.rstrip()

    def ensure_running(
        self,
        job: str,
        job_file: str,
        config: Mapping[str, Any],
        *,
        from_savepoint: str | None = None,
        parallelism: int | None = None,
        env: Mapping[str, str] | None = None,
    ) -> Launch:
        """Reuse the job's live process or launch ``srt run`` detached (see the launcher),
        optionally from a savepoint and with a new parallelism; ``env`` adds to :meth:`env`."""
        self._registry()
        from stateful_runtime.runtime import launcher

        return launcher.ensure_running(
            job,
            self.resolve(job_file),
            config,
            cwd=self.working_directory,
            env=self.env(env),
            master=self.master,
            from_savepoint=from_savepoint,
            parallelism=parallelism,
        )

    def stop(self, job: str, *, timeout: float | None = None) -> str:
        """``srt stop JOB``: a clean stop (the job resumes from its checkpoint next time)."""
        from stateful_runtime.exceptions import JobError

        t = self.stop_timeout_s if timeout is None else timeout
        out = self.srt(["stop", job, "--timeout", str(t)], timeout=t + 30)
        if out.returncode != 0:
            raise JobError(out.stderr.strip() or out.stdout.strip())
        return out.stdout.strip()

    def savepoint(
        self,
        job: str,
        *,
        target: str | None = None,
        stop: bool = False,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
    ) -> dict[str, Any]:
        """``srt savepoint create JOB --json [--stop] [--target ROOT]``: a savepoint of the
        job's last committed batch (with ``stop``, after stopping it cleanly). Returns the
        savepoint's summary (id, location, batches, size_bytes, ...); raises the runtime's
        message as a :class:`~stateful_runtime.exceptions.SavepointError`."""
        import json

        from stateful_runtime.exceptions import SavepointError

        t = self.stop_timeout_s if timeout is None else timeout
        args = ["savepoint", "create", job, "--json", "--timeout", str(t)]
        if stop:
            args.append("--stop")
        if target:
            args += ["--target", target]
        out = self.srt(args, timeout=t + 300, env=env)
        if out.returncode != 0:
            raise SavepointError(out.stderr.strip() or out.stdout.strip())
        return json.loads(out.stdout)

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
        from stateful_runtime.exceptions import SavepointError

        args = ["savepoint", "prune", job, "--target", root]
        if keep is not None:
            args += ["--keep", str(keep)]
        if max_age_s is not None:
            args += ["--max-age", f"{int(max_age_s)}s"]
        out = self.srt(args, timeout=300, env=env)
        if out.returncode != 0:
            raise SavepointError(out.stderr.strip() or out.stdout.strip())
        return _DISPOSED.findall(out.stdout)


# `srt savepoint prune` prints one line per savepoint it disposed of.
_DISPOSED = re.compile(r"^disposed of savepoint \S+ \((.*)\)$", re.MULTILINE)


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
