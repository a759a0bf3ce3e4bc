"""``srt state inspect``: keyed state of a checkpoint or savepoint as rows.

Spark's state data source (``spark.read.format("statestore")``) reads one operator's state at
one batch; this module finds the queries, operators and state names from the job's fingerprint,
unpickles the values our keyed operators store, and filters by key. A savepoint is laid out in a
temporary directory first (checksums verified), so S3 savepoints read the same way.
"""

from __future__ import annotations

import pickle
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateful_runtime.checkpoints import layout, restore, savepoints
from stateful_runtime.checkpoints.layout import CheckpointLayout
from stateful_runtime.exceptions import ConfigError

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

# Our queries hold one stateful operator each, so Spark numbers it 0.
OPERATOR_ID = 0


@contextmanager
def checkpoint_of(ref: str, roots: list[str]) -> Iterator[Path]:
    """A checkpoint directory for ``ref``: itself if it is one, else the savepoint laid out in
    a temporary directory."""
    path = Path(ref)
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


def inspect(
    spark: SparkSession,
    ckpt: Path,
    *,
    operator: str | None = None,
    state: str | None = None,
    key: str | None = None,
    limit: int = 1000,
) -> list[dict[str, Any]]:
    """State rows of ``ckpt`` at its last committed batch, each tagged with query, operator and
    state name."""
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
        for name in names:
            reader = (
                spark.read.format("statestore")
                .option("path", str(query.root))
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
