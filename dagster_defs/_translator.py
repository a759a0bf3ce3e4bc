"""How streaming jobs and sink tables become Dagster asset specs; subclass to change it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from dagster import AssetKey, AssetSpec, FreshnessPolicy

from dagster_defs._specs import SinkTableSpec, StreamingJobSpec

# The sink-table key and the names derived from job and table names are the dbt sources', so
# that the sources `srt dbt sources` generates point at these assets by construction.
from stateful_runtime.dbt_sources import identifier, sink_asset_key

__all__ = ["StreamingJobTranslator", "identifier"]


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
        # What a generated dbt source's meta.dagster.asset_key says (dbt_sources); if you
        # override this, give `srt dbt sources` the same prefix (--asset-key-prefix).
        return AssetKey(sink_asset_key(table.table))

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
            f"`{job.name}` every micro-batch. It materialises as the stream commits: the "
            f"health sensor reports the batches committed since its last tick (batch range, "
            f"rows written, watermark, windows closed), and its checks run then by automation. "
            f"Materialising it by hand records a snapshot (rows, last sink batch); it never "
            f"writes the table. Its freshness check fails only when the source holds records "
            f"the job has not committed (an idle source is fresh): then look at the job "
            f"asset's health checks (running, checkpoint_age, lag)."
        )

    def get_job_metadata(self, job: StreamingJobSpec) -> Mapping[str, Any]:
        return {"job_file": job.job_file, "job_name": job.name}

    def get_sink_metadata(self, job: StreamingJobSpec, table: SinkTableSpec) -> Mapping[str, Any]:
        return {"table": table.table, "unique_key": ", ".join(table.key), "query": table.query}

    def get_job_kinds(self, job: StreamingJobSpec) -> set[str]:
        return {"spark", "python"}

    def get_sink_kinds(self, job: StreamingJobSpec, table: SinkTableSpec) -> set[str]:
        return {"duckdb", "table"}

    def get_sink_freshness_policy(
        self, job: StreamingJobSpec, table: SinkTableSpec
    ) -> FreshnessPolicy | None:
        """None: a time-window policy on the last materialisation turns an idle, healthy
        stream stale (Dagster's freshness knows no idle). The table's ``freshness`` check
        (:func:`dagster_defs._health.table_freshness`, from ``expected_latency``) is stale
        only when the source holds records the job has not committed. Override to add one."""
        return None

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
            freshness_policy=self.get_sink_freshness_policy(job, table),
        )
