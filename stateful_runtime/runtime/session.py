"""The one place Spark is configured for stateful streaming."""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateful_runtime._process import import_ahead, one_blas_thread, process_dir
from stateful_runtime.checkpoints.storage import s3_endpoint
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.runtime import forkserver, spark_home

if TYPE_CHECKING:
    import pyarrow as pa
    from pyspark.sql import SparkSession
    from pyspark.sql.types import StructType

LOG4J = Path(__file__).with_name("log4j2.properties")
# A job process's driver JVM logs Spark's warnings to the job's log file, not its terminal.
LOG4J_JOB = Path(__file__).with_name("log4j2-job.properties")
LOG_FILE_ENV = "SRT_SPARK_LOG"  # that file, for log4j2-job.properties


# -- the driver JVM's class archive (start-up) ---------------------------------------------------
# Spark's driver JVM loads and verifies ~10,000 classes from 300 jars on every start. A dynamic
# AppCDS archive (JDK 13+) of the classes a small job loads, mapped at start, halves that: on
# this machine session start 4.4 s -> 2.5 s and the first Spark job 2.1 s -> 1.1 s.
# ``platform/bootstrap.sh`` builds it once per venv by running the UPI example with
# ``SRT_CLASS_ARCHIVE_DUMP`` (the JVM writes the archive when it exits) and seals it
# (:func:`seal_class_archive`). The JVM checks its own version and the class path against the
# archive and ignores one that does not match; a truncated archive, though, crashes it (SIGBUS),
# so only an archive whose size is the one recorded when it was sealed is used.
SESSION_TIME_ZONE = "UTC"  # every job's; a datetime a function returns is read in it
CLASS_ARCHIVE_ENV = "SRT_CLASS_ARCHIVE"  # another archive, or "off"
CLASS_ARCHIVE_DUMP_ENV = "SRT_CLASS_ARCHIVE_DUMP"  # write one to this path at JVM exit


def class_archive() -> Path:
    where = os.environ.get(CLASS_ARCHIVE_ENV)
    if where and where != "off":
        return Path(where)
    return Path(sys.prefix) / "share" / "stateful-runtime" / "spark-classes.jsa"


def _seal(archive: Path) -> Path:
    return archive.with_name(archive.name + ".sealed")


def seal_class_archive(dumped: str | Path) -> Path:
    """Move a complete archive written at a JVM's exit into place and record its size."""
    dumped, archive = Path(dumped), class_archive()
    size = dumped.stat().st_size
    if size == 0:
        raise ValueError(f"class archive {dumped} is empty")
    archive.parent.mkdir(parents=True, exist_ok=True)
    _seal(archive).unlink(missing_ok=True)
    os.replace(dumped, archive)
    _seal(archive).write_text(f"{size}\n")
    return archive


# -- the JIT on a local master ------------------------------------------------------------------
# A local master runs the driver and every task in one JVM, on the same cores as the job's Python
# workers. HotSpot's optimising compiler (C2) goes on compiling Spark's code for minutes after
# start: in a 30 s latency run on this 2-core machine the compiler threads spent 24.5 s
# (jdk.CompilerStatistics), still ~0.3 s per second at the end, CPU the batches wait for. So a
# local master's JVM leaves C2 to the hottest code only (its thresholds x20; C1 compiles the
# rest at once). Measured on this machine (NOTES.md, "The JIT of a local master"), against
# HotSpot's default: UPI on 1M events start 8.0 -> 6.8 s, steady 229k -> 319k events/s; on
# 10M, steady 413k -> 471k; latency at 20k events/s p99 1.1 s -> 0.83 s. ``SRT_JVM_JIT``
# chooses another mode: ``quick`` (C1 only: the fastest start, 5.9 s, and lowest latency, p99
# 0.6-0.7 s, but steady state 361k on 10M events; with the serial collector on a local master,
# SERIAL_GC below) or ``full`` (HotSpot's default). A bounded
# run on a local master whose sources hold at most SHORT_RUN_RECORDS records ends before C2
# pays back, so it gets ``quick`` unless a mode is set: at 1M events ``quick`` was 4-17% ahead
# whole process on four workloads, at 2M ``hot`` 2-5% ahead on three (NOTES.md, "The JIT of a
# local master"). Cluster executors, long-lived on their own cores, keep HotSpot's default
# unless a mode is set.
JIT_ENV = "SRT_JVM_JIT"
JIT_MODES = {
    "hot": (
        "-XX:Tier4InvocationThreshold=100000 -XX:Tier4MinInvocationThreshold=20000 "
        "-XX:Tier4CompileThreshold=100000 -XX:Tier4BackEdgeThreshold=400000"
    ),
    "quick": "-XX:TieredStopAtLevel=1",
    "full": "",
}


SHORT_RUN_RECORDS = 1_000_000


def short_run(available_now: bool, held: list[int | None]) -> bool:
    """Whether a run is short enough for C1 only: bounded, and its sources' records
    (``Source.records_held``, each known) at most :data:`SHORT_RUN_RECORDS` in all."""
    return available_now and None not in held and sum(n or 0 for n in held) <= SHORT_RUN_RECORDS


def _jit_choice() -> str:
    """The mode ``SRT_JVM_JIT`` sets (``""``: none)."""
    choice = os.environ.get(JIT_ENV, "").strip().lower()
    if choice and choice not in JIT_MODES:
        raise ConfigError(
            f"{JIT_ENV}={os.environ[JIT_ENV]!r}: use 'hot' (C2 for the hottest "
            f"code only, the default on a local master), 'quick' (C1 only) or "
            f"'full' (HotSpot's default)"
        )
    return choice


def sized_jit_note(master: str, short: bool, records: int) -> str | None:
    """What ``srt run`` says when the run's size chose its JVM's JIT (None: it did not)."""
    if not short or not master.startswith("local") or _jit_choice():
        return None
    return f"a bounded run of {records:,} records: its JVM compiles with C1 only ({JIT_ENV})"


# A local master's JVM in ``quick`` mode also takes the serial collector: G1's concurrent
# threads and regions are work a short run's small heap never pays back on 2 cores (NOTES.md,
# "The JIT of a local master": less CPU and memory a run). Not where the environment already
# chooses a collector (two choices stop the JVM), nor on a cluster's long-lived executors.
SERIAL_GC = "-XX:+UseSerialGC"
_GC_CHOSEN = re.compile(r"-XX:[+]Use\w*GC\b")
_JVM_OPTION_VARS = ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS", "_JAVA_OPTIONS")  # read by a JVM too


def _jit_options(master: str, short: bool = False) -> dict[str, str]:
    """The JIT options for the driver's and the executors' JVMs (``""``: HotSpot's default);
    ``short``: a run :func:`short_run` says ends before C2 pays back."""
    choice = _jit_choice()
    if master.startswith("local"):  # no executors: the driver's JVM runs the tasks
        mode = choice or ("quick" if short else "hot")
        driver = JIT_MODES[mode]
        if mode == "quick" and not any(
            _GC_CHOSEN.search(os.environ.get(v, "")) for v in _JVM_OPTION_VARS
        ):
            driver = f"{driver} {SERIAL_GC}"
        return {"driver": driver, "executor": ""}
    return {"driver": JIT_MODES[choice or "full"], "executor": JIT_MODES[choice or "full"]}


_JVM_EXIT_S = 30.0  # how long a process's exit waits for its JVM (a dump: 300 s)
_ENDING: set[int] = set()


_STOPPED_CLEANLY: set[int] = set()  # id() of the contexts stop_application stopped cleanly
TASKS_END_TIMEOUT_S = 10.0  # what the end of a run waits for cancelled tasks to end


def stop_application(spark: SparkSession) -> None:
    """End the Spark application once a job is done (FINISHED on a cluster): the warm-up's
    tasks settled, then the context stopped as :func:`_stop_context` does. PySpark's own
    ``SparkSession.stop`` waited for its accumulator server's poll, and left the exit's
    :func:`_end_jvm` a stopped context it could not tell from a failed stop, so it waited for
    the JVM's own shutdown instead of killing it: 0.2 s and 0.4 s of every run's end."""
    from stateful_runtime.runtime import warmup

    sc = spark.sparkContext
    warmup.settle(spark)  # no task of it cut off (errors after the summary)
    # A query stopped with a batch in flight (a second stop signal) had its job cancelled; its
    # tasks end as their kill reaches them (a Python worker's). One cut off by the context's
    # stop logs an ERROR about a block already gone.
    warmup.tasks_ended(spark, TASKS_END_TIMEOUT_S)
    if _stop_context(spark):
        _STOPPED_CLEANLY.add(id(sc))


def _stop_context(spark: SparkSession) -> bool:
    """Stop the SparkContext in the JVM (jobs, executors and their Python workers, block
    manager, state stores); True if it stopped cleanly.

    PySpark's own ``SparkContext.stop`` then shuts its accumulator server down, which waits
    for the server's ``serve_forever`` poll (0.5 s): 0.41 s of every job's exit on this
    machine. At exit nothing is accumulated any more, so the server (a daemon thread) is only
    told to stop: its socket file removed, the JVM's connection ending (an EOF the server
    would print as an error) ignored, the thread left to end with the process."""
    sc = spark.sparkContext
    server = getattr(sc, "_accumulatorServer", None)
    stopped = False
    try:
        if getattr(sc, "_jsc", None) is not None:
            sc._jsc.stop()  # type: ignore[union-attr]
            stopped = True
    except Exception:  # noqa: BLE001 - a JVM already gone; nothing to stop
        pass
    if server is not None:
        sc._accumulatorServer = None  # type: ignore[assignment]
        server.server_shutdown = True
        server.handle_error = lambda request, client_address: None
        address = getattr(server, "server_address", None)
        if isinstance(address, str):  # a Unix socket
            with contextlib.suppress(OSError):
                os.remove(address)
    try:
        spark.stop()  # the Python side: active session and context cleared
    except Exception:  # noqa: BLE001
        pass
    return stopped


def _writes_at_exit() -> bool:
    """Whether the JVM was asked to write a file in its own shutdown."""
    options = " ".join(os.environ.get(v, "") for v in ("JAVA_TOOL_OPTIONS", "JDK_JAVA_OPTIONS"))
    return bool(os.environ.get(CLASS_ARCHIVE_DUMP_ENV)) or any(
        flag in options for flag in ("StartFlightRecording", "AtExit")
    )


# py4j reports a command its JVM did not answer with ``logging.exception`` on the root logger
# (an ERROR and a traceback on stderr), then the call raises. Once the job is stopping, the
# JVM ending under a call is expected: a signal to the job's process group reaches the JVM as
# well (a SIGTERM to the group before Spark started printed one after "stopped by SIGTERM"),
# and the caller handles the raise.
_SEND_FAILED = "Exception while sending command."


class _JvmEnding(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return record.getMessage() != _SEND_FAILED


def jvm_ending() -> None:
    """From now on in this process, py4j's report of a command the JVM did not answer is not
    printed (the call's own exception stands): the job is stopping, or the process exits."""
    root = logging.getLogger()
    if not any(isinstance(f, _JvmEnding) for f in root.filters):
        root.addFilter(_JvmEnding())


def _end_jvm(
    spark: SparkSession, proc: subprocess.Popen | None, timeout: float, scratch: bool
) -> None:
    """At this process's exit: stop Spark and end the JVM, so the job's process is the last of
    its tree to go and reaps its JVM itself. Left alone, the JVM would start its shutdown only
    once this process had gone (its stdin closes then) and end as an orphan, seconds later.

    Once the SparkContext has stopped, the JVM's own shutdown (its hooks, then HotSpot's exit)
    still took 0.37 s here and does nothing a job needs when its temporary files are in this
    process's scratch (``scratch``, removed after this): the JVM is then killed (0.02 s).
    A JVM asked to write something as it exits (a class-archive dump, a flight recording) gets
    the orderly exit, and so does a JVM whose context did not stop cleanly.

    py4j's finalizer thread tells the JVM about each Python proxy of a Java object that is
    garbage-collected; one in flight as the JVM went failed and py4j logged it as an ERROR with
    a traceback, printed after the job's summary (the UPI example on 200k new events: two runs
    of four; none of four since). The gateway client is marked disconnected before the JVM
    ends, and py4j then skips those messages."""
    from stateful_runtime.runtime import warmup

    jvm_ending()
    client = getattr(getattr(spark.sparkContext, "_gateway", None), "_gateway_client", None)
    warmup.settle(spark)  # its tasks end before Spark stops under them
    stopped = id(spark.sparkContext) in _STOPPED_CLEANLY or _stop_context(spark)
    if proc is None or proc.stdin is None:
        return
    if client is not None:
        client.is_connected = False
    try:
        if stopped and scratch and not _writes_at_exit():
            proc.kill()
        proc.stdin.close()  # the gateway JVM exits when its stdin closes
        proc.wait(timeout=timeout)
    except (OSError, subprocess.TimeoutExpired):
        pass


# -- the local file system of a local master ---------------------------------------------------
# Spark writes each checkpoint file (offsets, commits, state store changelogs and snapshots) and
# its .crc through Hadoop's local file system, which, without Hadoop's native library (pip's
# PySpark has none), sets the file's permissions by forking a `chmod` process: two per file, ~7
# ms and a process spawn from the driver JVM each, on the batch's critical path. A local master
# uses the venv's NioLocalFileSystem instead (platform/jvm/, built by platform/jvm-classes.sh):
# Hadoop's LocalFileSystem with chmod(2) through Java. A cluster's executors keep Hadoop's own
# (they run elsewhere, without this venv). The jar goes at the end of the driver's class path
# through spark-submit's SPARK_DIST_CLASSPATH, not ``spark.driver.extraClassPath``, which would
# replace a user's own (spark-defaults.conf); the class archive is built with it
# (platform/bootstrap.sh builds the jar first).
LOCAL_FS_CLASS = "statefulruntime.hadoop.NioLocalFileSystem"
DIST_CLASSPATH_ENV = "SPARK_DIST_CLASSPATH"


def jvm_classes() -> Path:
    return Path(sys.prefix) / "share" / "stateful-runtime" / "srt-jvm.jar"


def _local_fs_conf(master: str) -> dict[str, str]:
    jar = jvm_classes()
    if not master.startswith("local") or not jar.is_file():
        return {}
    return {"spark.hadoop.fs.file.impl": LOCAL_FS_CLASS}


def _dist_classpath(conf: dict[str, str]) -> str | None:
    """SPARK_DIST_CLASSPATH for a JVM started with ``conf``: the environment's, with the
    runtime's jar appended when ``conf`` uses its file system (None: leave it as it is)."""
    if conf.get("spark.hadoop.fs.file.impl") != LOCAL_FS_CLASS:
        return None
    before = os.environ.get(DIST_CLASSPATH_ENV)
    return f"{before}{os.pathsep}{jvm_classes()}" if before else str(jvm_classes())


def _class_archive_options() -> str:
    dump = os.environ.get(CLASS_ARCHIVE_DUMP_ENV)
    if dump:
        return f" -XX:ArchiveClassesAtExit={dump}"
    if os.environ.get(CLASS_ARCHIVE_ENV) == "off":
        return ""
    archive = class_archive()
    try:
        sealed = int(_seal(archive).read_text().strip())
        usable = archive.stat().st_size == sealed
    except (OSError, ValueError):
        usable = False
    # -Xshare:auto: a JVM or class path that does not match the archive runs without it.
    return f" -XX:SharedArchiveFile={archive} -Xshare:auto" if usable else ""


# -- task retries on a local master ---------------------------------------------------------------
# A cluster retries a failed task (spark.task.maxFailures, 4); a local master fails the query at
# the first failure, so a Python worker killed mid-batch (the OOM killer, a crash) stopped the
# job with Spark's stack trace. A local master given without its own count gets the cluster's:
# the task runs again, from the batch's state version (tests/faults/test_python_worker_kill.py).
LOCAL_TASK_ATTEMPTS = 4
_LOCAL = re.compile(r"local(\[(?P<threads>[^,\]]+)\])?")


def with_task_retries(master: str) -> str:
    """``local`` / ``local[N]`` / ``local[*]`` with :data:`LOCAL_TASK_ATTEMPTS` attempts per
    task; any other master (a count of its own, a cluster) as given."""
    m = _LOCAL.fullmatch(master)
    if m is None:
        return master
    return f"local[{m['threads'] or 1},{LOCAL_TASK_ATTEMPTS}]"


def spark_conf(
    parallelism: int, master: str, *, job_log: bool = False, short_run: bool = False
) -> dict[str, str]:
    """Settings every job runs with (``--master`` and parallelism are the job's; ``job_log``:
    the driver logs to the file ``$SRT_SPARK_LOG`` names, and only errors to stderr;
    ``short_run``: a bounded run :func:`short_run` says is short)."""
    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    driver_log = f"-Dlog4j2.configurationFile=file:{LOG4J_JOB if job_log else LOG4J}"
    jit = _jit_options(master, short_run)
    return {
        "spark.master": with_task_retries(master),
        "spark.app.name": "stateful-runtime",
        # Keyed state in RocksDB with incremental (changelog) checkpoints: each batch uploads
        # only the changelog of the keys it touched, not a full snapshot.
        "spark.sql.streaming.stateStore.providerClass": (
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider"
        ),
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # Checkpoint files (offsets/N, commits/N, state changelogs) are written to a temp file
        # and renamed. Spark's default manager renames through Hadoop's FileContext, which on
        # the local file system (no native Hadoop library) runs `readlink` in a new process 8
        # times per file: ~25 ms of process spawns per file, ~0.1 s per micro-batch on the
        # critical path. The FileSystem-based manager renames with one rename(2), as atomic on
        # a local disk; the files and their .crc sidecars are the same.
        "spark.sql.streaming.checkpointFileManagerClass": (
            "org.apache.spark.sql.execution.streaming.checkpointing."
            "FileSystemBasedCheckpointFileManager"
        ),
        # One state partition per shuffle partition; Spark's default of 200 would open 200
        # RocksDB instances per stateful operator on a 2-core machine.
        "spark.sql.shuffle.partitions": str(parallelism),
        "spark.default.parallelism": str(parallelism),
        "spark.sql.session.timeZone": SESSION_TIME_ZONE,
        # Adaptive execution does not apply to streaming; leaving it on only logs a warning.
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        # Rows go to a Python worker in Arrow batches of at most maxRecordsPerBatch rows. A byte
        # bound as well makes Spark measure the batch's buffers after every row it appends
        # (ArrowWriter.sizeInBytes: every vector's buffers, per row): 18% of the executor task
        # threads' samples in a keyed counter job (JFR). Int.MaxValue is Spark's "no bound".
        "spark.sql.execution.arrow.maxBytesPerBatch": str(2**31 - 1),
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": " ".join(
            filter(None, (driver_log, jit["driver"], _class_archive_options().strip()))
        ),
        "spark.executor.extraJavaOptions": " ".join(filter(None, (java_opts, jit["executor"]))),
        "spark.executorEnv.PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        # A Python worker that dies (a native crash in a client library) reports where, in the
        # query's error, instead of a bare EOFException.
        "spark.python.worker.faulthandler.enabled": "true",
        # Data source options carrying client settings (the Kafka source's "config"), DSNs
        # and URLs are shown redacted in plans and explain output (Spark's default: url only).
        "spark.sql.redaction.options.regex": (
            "(?i)url|uri|dsn|config|password|secret|token|credential|key"
        ),
        **_local_fs_conf(master),
    }


# -- checkpoints on S3 -------------------------------------------------------------------------
# What a job whose checkpoint.dir is s3://... needs: Hadoop's S3A filesystem (the pinned jar set
# ``s3``, platform/jvm-artifacts.sh) for Spark's logs and state files, and the S3 settings of
# this process (endpoint, region, credentials) for the executors' Python workers, which write
# the keyed state files through boto3.
S3_ENVIRONMENT = (
    "AWS_ENDPOINT_URL",
    "SRT_S3_ENDPOINT_URL",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
)


def jar_set(name: str) -> list[Path]:
    """The jars of a pinned set (platform/jvm-artifacts.sh puts them under the venv)."""
    return sorted((Path(sys.prefix) / "share" / "stateful-runtime" / "jars" / name).glob("*.jar"))


def s3_conf() -> dict[str, str]:
    """Spark's settings for a checkpoint on S3: the S3A jars, S3A's endpoint (path-style
    against an S3-compatible one), region and the AWS settings of this process, which the
    executors get as well. Credentials come from AWS's chain (environment, profile, instance
    role): none is written into the settings."""
    jars = jar_set("s3")
    if not any(j.name.startswith("org.apache.hadoop.hadoop-aws-") for j in jars):
        raise ConfigError(
            "checkpoint.dir is on S3 but Hadoop's S3A jars are not installed in this venv; run "
            "platform/bootstrap.sh (it fetches the pinned set 's3': platform/jvm-artifacts.sh s3)"
        )
    conf = {"spark.jars": ",".join(str(j) for j in jars)}
    endpoint = s3_endpoint()
    if endpoint:
        conf["spark.hadoop.fs.s3a.endpoint"] = endpoint
        conf["spark.hadoop.fs.s3a.path.style.access"] = "true"
        conf["spark.hadoop.fs.s3a.connection.ssl.enabled"] = str(
            endpoint.startswith("https:")
        ).lower()
    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION")
    if region:
        conf["spark.hadoop.fs.s3a.endpoint.region"] = region
    for name in S3_ENVIRONMENT:
        if os.environ.get(name):
            conf[f"spark.executorEnv.{name}"] = os.environ[name]
    return conf


# -- scratch space: a killed job leaves none behind ------------------------------------------
# Spark writes its block manager's directories (shuffle and spill files) and the native
# libraries it unpacks (lz4, RocksDB) under the temp directory, and PySpark's workers their
# fault-handler files; a JVM killed with SIGKILL removes none of them (this machine's /tmp
# held over a thousand of each after the fault trials). A job process on a local master gives
# them one scratch directory named by its pid; the next session to start removes those of
# processes that are gone, and a process that ends normally removes its own
# (:func:`~stateful_runtime._process.process_dir`).
def arrow_schema(struct: StructType) -> pa.Schema:
    """Spark's Arrow schema of a struct, its timestamps in the session's time zone (UTC): the
    one conversion every Arrow batch the runtime builds or checks goes through (PySpark's own
    fails with a bare AssertionError on a timestamp field unless it is given a zone)."""
    from pyspark.sql.pandas.types import to_arrow_schema

    return to_arrow_schema(struct, timezone=SESSION_TIME_ZONE)


def _scratch_conf(master: str) -> dict[str, str]:
    """Settings that put a new local JVM's and its workers' temporary files in a scratch
    directory of this process (removed at its exit); none for a cluster, whose executors run
    elsewhere."""
    from pyspark import SparkContext

    if not master.startswith("local") or SparkContext._active_spark_context is not None:
        return {}
    try:  # its removal at exit is registered first: it runs after the JVM has ended
        scratch = process_dir("srt-spark")
    except OSError:  # an unwritable temp directory: Spark's own defaults, and its errors
        return {}
    return {
        "spark.local.dir": str(scratch),
        "spark.executorEnv.TMPDIR": str(scratch),
        "spark.driver.extraJavaOptions": f"-Djava.io.tmpdir={scratch}",
    }


@contextlib.contextmanager
def _environment(name: str, value: str | None) -> Iterator[None]:
    """``name=value`` in this process's environment for the block (nothing if ``value`` is
    None), as the JVM Spark starts in it inherits it."""
    if value is None:
        yield
        return
    before = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


# -- the JVM and the job's stop signals ------------------------------------------------------
# A job process's JVM is in its process group: Ctrl-C, and the SIGTERM that `timeout`, systemd,
# Kubernetes and `srt stop` send to the group, reach it as they reach the driver. HotSpot's
# answer to SIGTERM is its shutdown hooks, and Spark's stops the SparkContext under the running
# queries: the driver then failed with "Cannot call methods on a stopped SparkContext" (or a
# StackOverflowError) instead of stopping them. PySpark starts the JVM ignoring SIGINT; it is
# started ignoring SIGTERM too (an ignored signal stays ignored across exec, through
# spark-submit's shell, and HotSpot leaves an ignored shutdown signal ignored), and the driver
# ends it once the queries have stopped (:func:`_end_jvm`). SIGKILL still reaches it, and it
# exits when the driver is gone (its stdin closes). PySpark's Python daemon and workers run in a
# process group of their own already (pyspark.daemon).
JVM_IGNORES = (signal.SIGINT, signal.SIGTERM)


# The driver JVM runs ``PYSPARK_DRIVER_PYTHON`` for one thing: a lookup of "static" Python data
# sources (pip packages named ``pyspark_*``), before the first data source registers, when that
# name is a command (``command -v``). A job reads only the runtime's own sources, registered by
# name, so its JVM gets a name that is no command: one Python process fewer on every start, and
# the first batch 0.15-0.3 s sooner (UPI on 3,000 events: 10 of 12 alternating pairs, NOTES).
NO_STATIC_DATA_SOURCES = "srt-no-static-python-data-sources"


class _JvmPopen(dict):  # type: ignore[type-arg]
    """``popen_kwargs`` for PySpark's ``launch_gateway``, which sets its own ``preexec_fn``
    (SIGINT ignored) and ``env`` in them: the function it sets ignores :data:`JVM_IGNORES` as
    well, and the JVM's environment names :data:`NO_STATIC_DATA_SOURCES` as the driver's
    Python (this process's own environment keeps its value)."""

    def __setitem__(self, key: str, value: Any) -> None:
        if key == "preexec_fn":
            value = _ignore_stop_signals(value)
        elif key == "env":
            value = {**value, "PYSPARK_DRIVER_PYTHON": NO_STATIC_DATA_SOURCES}
        super().__setitem__(key, value)


def _ignore_stop_signals(before: Any) -> Any:
    def preexec() -> None:  # in the child, between fork and exec
        if before is not None:
            before()
        for sig in JVM_IGNORES:
            signal.signal(sig, signal.SIG_IGN)

    return preexec


def _driver_home(master: str) -> str | None:
    """The Spark home a local master's JVM starts from: the one with PySpark's jars merged
    (:mod:`stateful_runtime.runtime.spark_home`) when it is built and no Spark home is set."""
    from pyspark import SparkContext

    if (
        not master.startswith("local")
        or "SPARK_HOME" in os.environ
        or SparkContext._gateway is not None
    ):
        return None
    merged = spark_home.merged_home()
    return str(merged) if merged is not None else None


# What the driver imports while its JVM boots (_launch_jvm).
LAUNCH_IMPORTS = ("pyspark.testing.utils",)


def _launch_jvm(conf: dict[str, str]) -> None:
    """Start the JVM PySpark's session will use, ignoring the job's stop signals, unless this
    process has one already."""
    from pyspark import SparkConf, SparkContext
    from pyspark.java_gateway import launch_gateway

    if SparkContext._gateway is not None or os.name != "posix":
        return
    # PySpark's py4j converters import pyspark.testing.utils (pandas with it, ~0.2 s) on the
    # first call that passes an argument, the session's first: done while this thread waits
    # for the JVM instead (NOTES.md, "Imports during the JVM's boot": the session ~0.2 s sooner).
    threading.Thread(
        target=import_ahead, args=(LAUNCH_IMPORTS,), name="srt-launch-imports", daemon=True
    ).start()
    spark_conf = SparkConf(loadDefaults=False)
    for key, value in conf.items():
        spark_conf.set(key, value)
    SparkContext._ensure_initialized(gateway=launch_gateway(spark_conf, popen_kwargs=_JvmPopen()))


def default_master() -> str:
    return os.environ.get("SRT_SPARK_MASTER", "local[*]")


def worker_python(configured: str | None) -> str:
    """The interpreter of the job's Python workers: ``srt-python`` beside this one
    (:mod:`stateful_runtime.runtime.python_worker`: a worker Spark starts on its own connects
    back before its imports, so a loaded machine does not fail the query's start) when the
    workers run this interpreter, as they do unless ``PYSPARK_PYTHON`` names another."""
    here = os.path.abspath(sys.executable)
    if configured and os.path.abspath(configured) not in (here, _launcher(here)):
        return configured
    launcher = _launcher(here)
    return launcher if os.access(launcher, os.X_OK) else here


def _launcher(python: str) -> str:
    return os.path.join(os.path.dirname(python), "srt-python")


def build_session(
    parallelism: int = 4,
    master: str | None = None,
    extra: dict[str, str] | None = None,
    *,
    log_file: str | Path | None = None,
    short_run: bool = False,
) -> SparkSession:
    """Start (or reuse) the process's SparkSession with the runtime's settings. With
    ``log_file``, a JVM started now logs Spark's warnings there and only errors to stderr (a job
    process's terminal shows the job, not Spark's start-up); ``short_run``: a bounded run
    :func:`short_run` says is short (a local master's JVM compiles with C1 only)."""
    workers = os.environ["PYSPARK_PYTHON"] = worker_python(os.environ.get("PYSPARK_PYTHON"))
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    master = master or default_master()
    conf = spark_conf(parallelism, master, job_log=log_file is not None, short_run=short_run)
    scratch = _scratch_conf(master)
    one_blas_thread()  # for the processes the session starts
    if os.path.basename(workers) == "srt-python":
        # before the JVM starts: it, and the processes it starts, inherit the server's socket
        forkserver.start(scratch.get("spark.local.dir"), log_file)
    for key, value in scratch.items():
        conf[key] = f"{conf[key]} {value}" if key.endswith("JavaOptions") else value
    conf.update(extra or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    # PySpark's context sets a SIGINT handler of its own for interactive shells (cancel every
    # Spark job, raise KeyboardInterrupt), over the job process's: the one there before is put
    # back (a Ctrl-C inside the call itself still meets PySpark's: the caller's to handle).
    main = threading.current_thread() is threading.main_thread()
    sigint = signal.getsignal(signal.SIGINT) if main else None
    try:
        with (
            _environment(LOG_FILE_ENV, None if log_file is None else str(log_file)),
            _environment(DIST_CLASSPATH_ENV, _dist_classpath(conf)),
            _environment("SPARK_HOME", _driver_home(master)),
        ):
            _launch_jvm(conf)
            spark = builder.getOrCreate()  # a JVM started here reads the log file's name
    finally:
        if main and sigint is not None:
            signal.signal(signal.SIGINT, sigint)
    proc = getattr(spark.sparkContext._gateway, "proc", None)  # type: ignore[union-attr]
    if proc is not None and proc.pid not in _ENDING:
        _ENDING.add(proc.pid)
        atexit.register(
            _end_jvm,
            spark,
            proc,
            300.0 if os.environ.get(CLASS_ARCHIVE_DUMP_ENV) else _JVM_EXIT_S,
            bool(scratch),
        )
    # A reused session keeps its launch settings; the per-job ones are runtime-settable.
    spark.conf.set("spark.sql.shuffle.partitions", str(parallelism))
    spark.sparkContext.setLogLevel("WARN")
    return spark
