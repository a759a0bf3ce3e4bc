"""How streaming jobs and sink tables become Dagster asset specs; subclass to change it."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from dagster import AssetKey, AssetSpec

from dagster_defs._specs import SinkTableSpec, StreamingJobSpec


def identifier(name: str) -> str:
    """A Dagster name (asset key part, op name) from a job or table name: ``upi-per-minute``
    becomes ``upi_per_minute``."""
    out = re.sub(r"[^A-Za-z0-9_]", "_", name)
    return out if not out[:1].isdigit() else f"_{out}"


class StreamingJobTranslator:
    """Maps :class:`StreamingJobSpec` and :class:`SinkTableSpec` to asset keys, groups,
    descriptions, kinds and metadata.

    Override any ``get_*`` method; the factory asks only :meth:`get_job_asset_spec` and
    :meth:`get_sink_asset_spec`, which combine the others. Keys must stay stable: Dagster's
    history (materialisations, observations, check results) is keyed by them.
    """

    def get_job_asset_key(self, job: StreamingJobSpec) -> AssetKey:
        return AssetKey([identifier(job.name)])

    def get_sink_asset_key(self, job: StreamingJobSpec, table: SinkTableSpec) -> AssetKey:
        return AssetKey([identifier(table.table)])

    def get_group_name(self, job: StreamingJobSpec) -> str | None:
        return "streaming"

    def get_job_description(self, job: StreamingJobSpec) -> str:
        return job.description or (
            f"Streaming job `{job.name}` ({job.job_file}). Materialising it starts the job as a "
            f"detached `srt run` process, or reuses the live one; the job keeps running after "
            f"the run ends. Stop it with the `stop_streaming_job` job or `srt stop {job.name}`."
        )

    def get_sink_description(self, job: StreamingJobSpec, table: SinkTableSpec) -> str:
        return table.description or (
            f"Table `{table.table}`, upserted by query `{table.query}` of streaming job "
            f"`{job.name}` every micro-batch. Materialising it records a snapshot (rows, last "
            f"sink batch) and runs its checks; it does not write the table."
        )

    def get_job_metadata(self, job: StreamingJobSpec) -> Mapping[str, Any]:
        return {"job_file": job.job_file, "job_name": job.name}

    def get_sink_metadata(self, job: StreamingJobSpec, table: SinkTableSpec) -> Mapping[str, Any]:
        return {"table": table.table, "unique_key": ", ".join(table.key), "query": table.query}

    def get_job_kinds(self, job: StreamingJobSpec) -> set[str]:
        return {"spark", "python"}

    def get_sink_kinds(self, job: StreamingJobSpec, table: SinkTableSpec) -> set[str]:
        return {"duckdb", "table"}

    def get_job_asset_spec(self, job: StreamingJobSpec) -> AssetSpec:
        return AssetSpec(
            key=self.get_job_asset_key(job),
            description=self.get_job_description(job),
            group_name=self.get_group_name(job),
            metadata=self.get_job_metadata(job),
            kinds=self.get_job_kinds(job),
        )

    def get_sink_asset_spec(self, job: StreamingJobSpec, table: SinkTableSpec) -> AssetSpec:
        return AssetSpec(
            key=self.get_sink_asset_key(job, table),
            deps=[self.get_job_asset_key(job)],
            description=self.get_sink_description(job, table),
            group_name=self.get_group_name(job),
            metadata=self.get_sink_metadata(job, table),
            kinds=self.get_sink_kinds(job, table),
        )
