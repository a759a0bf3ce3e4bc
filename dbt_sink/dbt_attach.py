"""A dbt-duckdb plugin: attach a streaming job's DuckDB database read-only, waiting for locks.

DuckDB lets one process write a database file, and a reader cannot open it while a writer
has it. The job's DuckDB sink opens the file for each micro-batch (milliseconds to a second)
and waits up to 30 s for readers to let go; dbt-duckdb's own ``attach:`` fails at once when a
batch is being written. This plugin attaches the file with retries instead, for each
connection dbt opens (with ``keep_open`` off, dbt-duckdb closes the connection when a model or
test is done, so the sink is never held up for a whole dbt run)::

    plugins:
      - module: dbt_sink.dbt_attach
        config:
          path: /abs/path/upi.duckdb     # the sink's database (sink.database)
          alias: srt_sink                # the dbt sources' database
          lock_wait_s: 60                # optional

Needs dbt-duckdb (``pip install 'stateful-runtime[dbt]'``).
"""

from __future__ import annotations

import time
from typing import Any

from dbt.adapters.duckdb.plugins import BasePlugin

# Retry interval while a micro-batch holds the write lock: batches commit in well under a second.
RETRY_S = 0.1


class Plugin(BasePlugin):
    def initialize(self, plugin_config: dict[str, Any]) -> None:
        try:
            self.path = str(plugin_config["path"])
        except KeyError:
            raise ValueError(
                "dbt_sink.dbt_attach needs config: path (the sink's DuckDB database)"
            ) from None
        self.alias = str(plugin_config.get("alias") or "srt_sink")
        self.lock_wait_s = float(plugin_config.get("lock_wait_s", 60.0))
        if not self.alias.isidentifier():
            raise ValueError(f"dbt_sink.dbt_attach: alias {self.alias!r} must be an identifier")

    def configure_connection(self, conn: Any) -> None:
        import duckdb

        path = self.path.replace("'", "''")
        sql = f"ATTACH IF NOT EXISTS '{path}' AS {self.alias} (READ_ONLY)"
        deadline = time.monotonic() + self.lock_wait_s
        while True:
            try:
                conn.execute(sql)
                return
            except duckdb.IOException as exc:
                if "lock" not in str(exc).lower() or time.monotonic() > deadline:
                    raise
                time.sleep(RETRY_S)
