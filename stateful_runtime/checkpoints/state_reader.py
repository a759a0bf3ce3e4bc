"""``srt state inspect``: keyed state of a checkpoint or savepoint as rows.

Spark's state data source (``spark.read.format("statestore")``) reads one operator's state at
one batch; this module finds the queries, operators and state names from the job's fingerprint,
unpickles the values our keyed operators store, and filters by key. An operator whose state
lives in the worker's RocksDB (``keyed/<operator>/``, every keyed operator's) is read
from its checkpoint files without Spark (:func:`~stateful_runtime.checkpoints.keyed.state_at`),
rows tagged with their key group and size. A savepoint is laid out in a temporary directory
first (checksums verified), so S3 savepoints read the same way.

The local backend's rows (their format is :mod:`stateful_runtime.checkpoints.keyed`'s; a test
reads the rows :mod:`stateful_runtime.operators.local_state` writes back through
:func:`local_entries`): a key's row holds all its states, shown one row per state by name, and
each timer row is shown as a row of state ``timer``.
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateful_runtime.checkpoints import keyed, layout, restore, savepoints
from stateful_runtime.checkpoints.layout import CheckpointLayout, QueryLayout
from stateful_runtime.checkpoints.storage import checkpoint_path, s3a_url
from stateful_runtime.exceptions import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Our queries hold one stateful operator each, so Spark numbers it 0.
OPERATOR_ID = 0
# The harness's per-key timer set, kept among a key's states (not a state of the function).
_TIMER_SET = "_srt_timers_of"
TIMER_STATE = "timer"  # the state name timer rows are shown under


@contextmanager
def checkpoint_of(ref: str, roots: list[str]) -> Iterator[Path]:
    """A checkpoint directory for ``ref``: itself if it is one, else the savepoint laid out in
    a temporary directory."""
    path = checkpoint_path(ref)
    if CheckpointLayout(path).marker.is_file():
        yield path.resolve()
        return
    sp = savepoints.resolve(ref, roots)
    with tempfile.TemporaryDirectory(prefix="srt-inspect-") as tmp:
        dest = Path(tmp) / "checkpoint"
        restore.materialize(sp, dest)
        layout.write_marker(
            dest,
            {
                "format_version": layout.FORMAT_VERSION,
                "job": sp.job,
                "queries": list(sp.manifest["queries"]),
                "fingerprint": sp.manifest["fingerprint"],
            },
        )
        yield dest


def _decode(value: Any) -> Any:
    if isinstance(value, bytes | bytearray):
        try:
            return pickle.loads(value)
        except Exception:
            return value.hex()
    if hasattr(value, "asDict"):
        return {k: _decode(v) for k, v in value.asDict().items()}
    return value


def _plain(row: dict[str, Any]) -> dict[str, Any]:
    """One state row: key fields flattened, values unpickled."""
    out: dict[str, Any] = {}
    key: Any = row.get("key")
    if hasattr(key, "asDict"):
        for k, v in key.asDict(recursive=True).items():
            out[k] = _decode(v)
    for name, v in row.items():
        if name in ("key", "partition_id"):
            continue
        v = _decode(v)
        if isinstance(v, dict) and name == "value" and len(v) == 1:
            v = next(iter(v.values()))  # our value states are one pickled column "v"
        out[name] = v
    out["partition"] = row.get("partition_id")
    return out


def local_entries(row: bytes, value: bytes) -> list[tuple[int, str | int, bytes, Any, int]]:
    """A local backend row as (key group, state name or timer timestamp, pickled key, the
    state's value or None for a timer, bytes): one per state of a key's row, one for a timer
    row, none for the backend's own entries (the harness's timer set) and broadcast rows."""
    group, tag, rest = keyed.parse_row(row)
    if tag == keyed.TIMER_ROW:
        return [(group, keyed.decode_ts(rest[:8]), rest[8:], None, len(row) + len(value))]
    if tag != keyed.STATE_ROW:
        return []
    states = keyed.decode_states(value)
    # A row's bytes shared among its states (what each costs is not stored apart).
    size = (len(row) + len(value)) // max(1, len(states))
    return [
        (group, name, rest, state, size) for name, state in states.items() if name != _TIMER_SET
    ]


def parse_broadcast_row(row: bytes) -> tuple[int, str] | None:
    """A broadcast state's row as (key group, state name); None for any other row. Every key
    group of a partition holds the same copy (``operators/arrow_keyed.py``)."""
    group, tag, rest = keyed.parse_row(row)
    return (group, rest.decode()) if tag == keyed.BROADCAST_ROW else None


def local_operator(query: QueryLayout, operator: str) -> Path | None:
    """The keyed state directory of ``operator`` when it ran on the local backend."""
    path = query.keyed / operator
    return path if path.is_dir() else None


def needs_spark(ckpt: Path, operator: str | None = None) -> bool:
    """Whether inspecting ``ckpt`` reads state through Spark (an operator not on the local
    backend)."""
    fp = layout.owner(ckpt).get("fingerprint") or {}
    return any(
        local_operator(CheckpointLayout(ckpt).query(q), op) is None
        for q, spec in fp.get("queries", {}).items()
        for op in spec.get("operators", {})
        if operator is None or op == operator
    )


def _local_rows(
    query: QueryLayout,
    directory: Path,
    keys: list[str],
    batch: int,
    names: list[str | None],
    key: str | None,
) -> Iterator[dict[str, Any]]:
    """Rows of one operator's local keyed state at committed ``batch``, partition by
    partition in key order: each state row, then (with every state asked for) its timers."""
    partitions = query.state_partitions(batch) or 0
    wanted = {n for n in names if n is not None}
    for part in keyed.partitions(directory, partitions):
        first = keyed.key_groups(int(part.name), partitions).start
        for row, value in sorted(keyed.state_at(part, batch + 1).items()):
            shared = parse_broadcast_row(row)
            if shared is not None:  # one row per partition: its copy in its first group
                group, name = shared
                if group == first and key is None and (not wanted or name in wanted):
                    yield {
                        "state": name,
                        "value": _decode(value),
                        "broadcast": True,
                        "partition": int(part.name),
                        "key_group": group,
                        "bytes": len(row) + len(value),
                    }
                continue
            for group, what, key_bytes, state, size in local_entries(row, value):
                timer = isinstance(what, int)
                if wanted and (timer or what not in wanted):
                    continue
                key_values = pickle.loads(key_bytes)
                if key is not None and str(key_values[0]) != key:
                    continue
                yield {
                    **dict(zip(keys, key_values, strict=False)),
                    "state": TIMER_STATE if timer else what,
                    "value": what if timer else state,
                    "partition": int(part.name),
                    "key_group": group,
                    "bytes": size,
                }


def summary(ckpt: Path) -> list[dict[str, Any]]:
    """Per operator on the local backend: its partitions, key groups, rows per state and
    bytes at the last committed batch (what ``srt state inspect`` prints above the rows)."""
    fp = layout.owner(ckpt).get("fingerprint") or {}
    out = []
    for qname, spec in fp.get("queries", {}).items():
        query = CheckpointLayout(ckpt).query(qname)
        batch = query.last_committed()
        for op in spec.get("operators", {}):
            directory = local_operator(query, op)
            if directory is None or batch is None:
                continue
            n = query.state_partitions(batch) or 0
            states: dict[str, int] = {}
            groups: set[int] = set()
            size = 0
            for part in keyed.partitions(directory, n):
                first = keyed.key_groups(int(part.name), n).start
                for row, value in keyed.state_at(part, batch + 1).items():
                    size += len(row) + len(value)
                    shared = parse_broadcast_row(row)
                    if shared is not None and shared[0] == first:  # a partition's copy
                        label = f"{shared[1]} (broadcast, per partition)"
                        states[label] = states.get(label, 0) + 1
                    for group, what, _, _, _ in local_entries(row, value):
                        name = TIMER_STATE if isinstance(what, int) else str(what)
                        states[name] = states.get(name, 0) + 1
                        groups.add(group)
            out.append(
                {
                    "query": qname,
                    "operator": op,
                    "batch": batch,
                    "partitions": n,
                    "key_groups": f"{len(groups)} of {keyed.MAX_PARALLELISM} key groups hold state",
                    "rows": states,
                    "bytes": size,
                }
            )
    return out


def inspect(
    spark: SparkSession | None,
    ckpt: Path,
    *,
    operator: str | None = None,
    state: str | None = None,
    key: str | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    """State rows of ``ckpt`` at its last committed batch, each tagged with query, operator and
    state name. ``spark`` may be None when every operator read ran on the local backend
    (:func:`needs_spark`)."""
    from pyspark.sql import functions as F

    owner = layout.owner(ckpt)
    fp = owner.get("fingerprint") or {}
    operators = [
        (q, op, spec_)
        for q, spec in fp.get("queries", {}).items()
        for op, spec_ in spec.get("operators", {}).items()
    ]
    known = ", ".join(op for _, op, _ in operators) or "none"
    if operator is not None:
        operators = [o for o in operators if o[1] == operator]
        if not operators:
            raise ConfigError(
                f"no stateful operator {operator!r} in job {owner['job']!r} (operators: {known})"
            )
    rows: list[dict[str, Any]] = []
    for qname, op, op_layout in operators:
        query = CheckpointLayout(ckpt).query(qname)
        batch = query.last_committed()
        if batch is None:
            continue
        names: list[str | None] = (
            [None] if op_layout["kind"] == "native-window" else list(op_layout["states"])
        )
        if state is not None:
            if op_layout["kind"] == "native-window" or state not in op_layout["states"]:
                raise ConfigError(
                    f"operator {op!r} has no state {state!r} (states: "
                    f"{', '.join(op_layout['states'])})"
                )
            names = [state]
        directory = local_operator(query, op)
        if directory is not None:
            for local in _local_rows(query, directory, op_layout["keys"], batch, names, key):
                rows.append({"query": qname, "operator": op, "batch": batch, **local})
                if len(rows) >= limit:
                    return rows
            continue
        assert spark is not None, "needs_spark() said no Spark is needed"
        for name in names:
            reader = (
                spark.read.format("statestore")
                .option("path", s3a_url(query.root))
                .option("operatorId", OPERATOR_ID)
                .option("batchId", batch)
            )
            if name is not None:
                reader = reader.option("stateVarName", name)
            df = reader.load()
            if key is not None:
                # The job's first key field (a window's state key starts with the window).
                fields = df.schema["key"].dataType.fieldNames()  # type: ignore[attr-defined]
                first = next((k for k in op_layout["keys"] if k in fields), fields[0])
                df = df.filter(F.col(f"key.{first}").cast("string") == key)
            for r in df.limit(max(0, limit - len(rows))).collect():
                rows.append(
                    {
                        "query": qname,
                        "operator": op,
                        "state": name or "window",
                        "batch": batch,
                        **_plain(r.asDict()),
                    }
                )
            if len(rows) >= limit:
                return rows
    return rows
