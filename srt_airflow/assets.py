"""A sink table as an Airflow asset, updated by the stream's commits (``AssetWatcher``)."""

from __future__ import annotations

from typing import Any

from airflow.sdk import Asset, AssetWatcher

from srt_airflow.triggers.srt import SrtSinkCommitTrigger

# Asset URIs of sink tables: srt://<job>/<table>.
SCHEME = "srt"


def sink_table_uri(job: str, table: str) -> str:
    """The URI of ``table`` as written by ``job``."""
    return f"{SCHEME}://{job}/{table}"


def sink_table_asset(
    job: str,
    table: str,
    query: str,
    *,
    poll_interval: float = 10.0,
    srt_conn_id: str = "srt_default",
    **asset_kwargs: Any,
) -> Asset:
    """The asset of sink table ``table``, which query ``query`` of ``job`` writes: an asset
    event each time the query commits new micro-batches (:class:`SrtSinkCommitTrigger`), so
    a DAG with ``schedule=[asset]`` runs on fresh results. ``asset_kwargs`` go to
    :class:`~airflow.sdk.Asset` (``group``, ``extra``...); its name is the table's."""
    trigger = SrtSinkCommitTrigger(
        job=job, query=query, table=table, poll_interval=poll_interval, srt_conn_id=srt_conn_id
    )
    asset_kwargs.setdefault("name", table)
    return Asset(
        uri=sink_table_uri(job, table),
        watchers=[AssetWatcher(name=f"srt_{job}_{table}_commits", trigger=trigger)],
        **asset_kwargs,
    )
