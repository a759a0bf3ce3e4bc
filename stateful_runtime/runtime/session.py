"""The one place Spark is configured for stateful streaming."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

LOG4J = Path(__file__).with_name("log4j2.properties")


def spark_conf(parallelism: int, master: str) -> dict[str, str]:
    """Settings every job runs with (``--master`` and parallelism are the job's)."""
    java_opts = f"-Dlog4j2.configurationFile=file:{LOG4J}"
    return {
        "spark.master": master,
        "spark.app.name": "stateful-runtime",
        # Keyed state in RocksDB with incremental (changelog) checkpoints: each batch uploads
        # only the changelog of the keys it touched, not a full snapshot.
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        "spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled": "true",
        # One state partition per shuffle partition; Spark's default of 200 would open 200
        # RocksDB instances per stateful operator on a 2-core machine.
        "spark.sql.shuffle.partitions": str(parallelism),
        "spark.default.parallelism": str(parallelism),
        "spark.sql.session.timeZone": "UTC",
        # Adaptive execution does not apply to streaming; leaving it on only logs a warning.
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "127.0.0.1",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.driver.extraJavaOptions": java_opts,
        "spark.executor.extraJavaOptions": java_opts,
        "spark.executorEnv.PYSPARK_PYTHON": os.environ.get("PYSPARK_PYTHON", sys.executable),
        # A Python worker that dies (a native crash in a client library) reports where, in the
        # query's error, instead of a bare EOFException.
        "spark.python.worker.faulthandler.enabled": "true",
        # Data source options carrying client settings (the Kafka source's "config"), DSNs
        # and URLs are shown redacted in plans and explain output (Spark's default: url only).
        "spark.sql.redaction.options.regex":
            "(?i)url|uri|dsn|config|password|secret|token|credential|key",
    }


def default_master() -> str:
    return os.environ.get("SRT_SPARK_MASTER", "local[*]")


def build_session(parallelism: int = 4, master: str | None = None,
                  extra: dict[str, str] | None = None) -> SparkSession:
    """Start (or reuse) the process's SparkSession with the runtime's settings."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder
    conf = spark_conf(parallelism, master or default_master())
    conf.update(extra or {})
    for key, value in conf.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    # A reused session keeps its launch settings; the per-job ones are runtime-settable.
    spark.conf.set("spark.sql.shuffle.partitions", str(parallelism))
    spark.sparkContext.setLogLevel("WARN")
    return spark
