"""Keyed state written by the removed ``state.backend=spark`` (Spark's transformWithState),
moved into the worker's RocksDB engine at the same batch: what ``srt run`` does, before its
queries start, to a checkpoint (or a restored savepoint) that holds such state.

A query's operator kept each state as a Spark state variable of the same name, pickled values
in a ``v`` column (a map state: pickled ``k`` → pickled ``v``), its timers as Spark's, and a
processing-time TTL as Spark's expiry beside the value. Spark's state data source
(``spark.read.format("statestore")``) reads them at the query's last committed batch ``B``;
each key's states become one row of the engine (``<group> k <key>``, the layout of
:mod:`~stateful_runtime.checkpoints.keyed`), its timers rows of the timer index, in the key
group Spark's hash of the key fields gives (the one the engine's shuffle computes). Each
partition's rows are the snapshot of version ``B + 1`` (the state after batch ``B``), its commit
record naming them.

The query's Spark checkpoint changes with its plan: the engine's query reads its inputs a
second time when it carries the watermark's branch (a Spark deduplication that sees no row,
whose store starts empty at ``B + 1``) and reads its timer ticks in processing time, so the
offsets of batch ``B``, the batch before it and a batch planned after it gain those lines (the
inputs' offsets again; no tick yet). Spark's state of the removed operator is kept, set aside
under :data:`SET_ASIDE` (nothing reads it; delete it once the job runs on).

Each step is done again, or found done, by a run that starts after a crash between them:
everything is staged under :data:`STAGING` first, then put in place, the offsets last but one
and the keyed state last (a query holding ``keyed/<operator>`` reads as migrated).
"""

from __future__ import annotations

import json
import os
import pickle
import shutil
import uuid
import zipfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from stateful_runtime.checkpoints import keyed
from stateful_runtime.checkpoints.layout import QueryLayout

# Where a migration stages its files, under the query's checkpoint.
STAGING = ".migrating"
# Where Spark's state of the removed backend is set aside, under the query's checkpoint.
SET_ASIDE = "state-of-spark-backend"
# The name Spark's operator metadata gives the removed backend's operator.
_SPARK_OPERATOR = "transformWithState"
# The operator's own map of timer kinds (``operators/keyed.py``), a state like the others.
_TIMERS_STATE = "_srt_timers"
_OPERATOR_ID = 0  # the removed backend's query held one stateful operator of Spark's
_PICKLE = pickle.HIGHEST_PROTOCOL
_NEVER = 2**62  # (ms: an expiry no clock reaches)


def written_by_spark_backend(query: QueryLayout) -> bool:
    """Whether the query's checkpoint holds state of the removed backend still to move (or a
    move a crash interrupted)."""
    if (query.root / STAGING / "offsets").is_file():
        return True
    if query.last_committed() is None or keyed.operators(query.root):
        return False
    return any(_SPARK_OPERATOR in meta.read_text() for meta in query.schema_metadata())


def migrate(
    spark: Any,
    query: QueryLayout,
    operator: str,
    keys: Sequence[str],
    states: Sequence[str],
    processing_ttl: Sequence[str],
    *,
    carrier: bool,
    ticks: bool,
    resumes: bool,
) -> str:
    """Move the query's keyed state of the removed backend into the engine (see the module);
    returns what was done. ``states``: the operator's state names; ``processing_ttl``: those
    under a processing-time TTL; ``carrier``, ``ticks``, ``resumes``: whether the engine's
    query carries the watermark's branch, reads timer ticks, reads the source that starts a
    run's batches."""
    from stateful_runtime.checkpoints.restore import relocate_operator_metadata

    batch = query.last_committed()
    assert batch is not None
    staging = query.root / STAGING
    if not (staging / "offsets").is_file():
        shutil.rmtree(staging, ignore_errors=True)
        relocate_operator_metadata(query, query)
        partitions = query.state_partitions(batch) or 1
        rows = _read(spark, query, batch, keys, [*states, _TIMERS_STATE], set(processing_ttl))
        _stage_keyed(staging / keyed.KEYED_DIR / operator, rows, partitions, batch + 1)
        # Spark reads the batch before the last too, and runs a planned batch after it again.
        for b in (batch - 1, batch, batch + 1):
            if query.offsets(b).is_file():
                lines = query.offsets(b).read_text().splitlines()
                new = _engine_offsets(lines, carrier=carrier, ticks=ticks, resumes=resumes)
                _put(staging / f"offsets.{b}", "\n".join(new))
        _put(staging / "offsets", str(batch))
    partitions = sum(p.is_dir() for p in (staging / keyed.KEYED_DIR / operator).iterdir())
    if query.state.is_dir():
        os.replace(query.state, query.root / SET_ASIDE)
    if carrier:
        _empty_spark_store(query.state / str(_OPERATOR_ID), partitions, batch + 1)
    for staged in staging.glob("offsets.*"):
        b = int(staged.suffix[1:])
        os.replace(staged, query.offsets(b))
        query.offsets(b).with_name(f".{b}.crc").unlink(missing_ok=True)
    query.keyed.mkdir(exist_ok=True)
    os.replace(staging / keyed.KEYED_DIR / operator, query.keyed / operator)
    shutil.rmtree(staging)
    return (
        f"query {query.root.name}: moved the state of operator {operator!r}, written by the "
        f"removed state.backend=spark, into the worker's RocksDB at batch {batch} "
        f"({partitions} partitions); Spark's copy is set aside in {query.root / SET_ASIDE} "
        f"(delete it once the job runs on)"
    )


def _read(
    spark: Any,
    query: QueryLayout,
    batch: int,
    keys: Sequence[str],
    states: Sequence[str],
    processing_ttl: set[str],
) -> dict[int, dict[bytes, bytes]]:
    """key group → the engine's rows of the operator at ``batch``: each key's states in one
    row, its timers as index rows."""
    from pyspark.sql import functions as F

    def reader() -> Any:
        return (
            spark.read.format("statestore")
            .option("path", str(query.root))
            .option("operatorId", _OPERATOR_ID)
            .option("batchId", batch)
        )

    def grouped(df: Any) -> Any:
        fields = [F.col(f"key.{k}") for k in keys]
        return df.withColumn("_group", F.pmod(F.hash(*fields), F.lit(keyed.MAX_PARALLELISM)))

    per_key: dict[tuple[int, bytes], dict[str, Any]] = defaultdict(dict)
    for name in states:
        # Every state the function declares was registered with Spark in its processor's
        # init, written or not: one Spark cannot read fails the move (nothing is skipped).
        df = grouped(reader().option("stateVarName", name).load())
        columns = df.columns
        for row in df.toLocalIterator():
            key = pickle.dumps(tuple(row["key"]), _PICKLE)
            states_of = per_key[(row["_group"], key)]
            if "user_map_key" in columns:
                entries = states_of.setdefault(name, {})
                value = _stored(row["user_map_value"], name in processing_ttl)
                entries[pickle.loads(row["user_map_key"]["k"])] = value
            else:
                states_of[name] = _stored(row["value"], name in processing_ttl)
    out: dict[int, dict[bytes, bytes]] = defaultdict(dict)
    for (group, key), states_of in per_key.items():
        out[group][keyed.group_prefix(group) + keyed.STATE_ROW + key] = pickle.dumps(
            states_of, _PICKLE
        )
    timers = grouped(reader().option("readRegisteredTimers", "true").load())
    for row in timers.toLocalIterator():
        key = pickle.dumps(tuple(row["key"]), _PICKLE)
        index = keyed.TIMER_ROW + keyed.encode_ts(row["expiration_timestamp_ms"]) + key
        out[row["_group"]][keyed.group_prefix(row["_group"]) + index] = b""
    return out


def _engine_offsets(lines: list[str], *, carrier: bool, ticks: bool, resumes: bool) -> list[str]:
    """An offset log entry of the removed backend's query (its inputs, then the source that
    starts a run's batches) as the engine's query logs it: the inputs again for the
    watermark's branch, the ticks' first offset, then the rest."""
    inputs = len(lines) - 2 - resumes
    sources = lines[2 : 2 + inputs]
    return [
        *lines[:2],
        *sources,
        *(sources if carrier else []),
        *([json.dumps({"due": 0})] if ticks else []),
        *lines[2 + inputs :],
    ]


def _stored(value: Any, ttl: bool) -> Any:
    """A state value as the engine stores it: unpickled; under a processing-time TTL with
    its expiry, Spark's (the value's ``ttlExpirationMs``; a value Spark kept without one, the
    TTL new in this code, expires never, until it is written again)."""
    fields = value.asDict()
    if "ttlExpirationMs" in fields:
        raw, expires = pickle.loads(fields["value"]["v"]), fields["ttlExpirationMs"]
    else:
        raw, expires = pickle.loads(fields["v"]), None
    if not ttl:
        return raw
    return (raw, _NEVER if expires is None else int(expires))


def _stage_keyed(
    directory: Path, rows: dict[int, dict[bytes, bytes]], partitions: int, version: int
) -> None:
    token = uuid.uuid4().hex
    for p in range(partitions):
        mine = {k: v for g in keyed.key_groups(p, partitions) for k, v in rows.get(g, {}).items()}
        keyed.write(directory / str(p), version, keyed.SNAPSHOT, token, keyed.as_batches(mine))
    keyed.record(directory, version, dict.fromkeys(range(partitions), token))


def _empty_spark_store(operator: Path, partitions: int, version: int) -> None:
    """An empty RocksDB state store of Spark's at ``version`` for each partition: a snapshot
    of no files and no keys (what Spark loads a store from, then replays no changelog)."""
    for p in range(partitions):
        path = operator / str(p) / f"{version}.zip"
        if path.exists():
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        with zipfile.ZipFile(tmp, "w") as z:
            z.writestr("metadata", 'v1\n{"sstFiles":[],"logFiles":[],"numKeys":0}')
        os.replace(tmp, path)


def _put(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)
