"""Stateless Python functions over records (``DataStream.map`` / ``flat_map``), run by
Spark's ``mapInArrow`` on whole Arrow batches: a batch becomes a list of dicts once, the
function runs per record, and the outputs become one Arrow batch again — no per-row pandas
work and no state store.

Columns the function does not see (the event time, and the late-data bound the native window
path counts against) are carried from each input row to its outputs, so every output record
keeps its input's event time, and the watermark (its metadata travels on the event-time
column's field) holds downstream as without the map.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import pyarrow as pa

from stateful_runtime._process import freeze_worker_heap
from stateful_runtime.exceptions import UserFunctionError


class MapOperator:
    """The function ``mapInArrow`` calls with a task's batches; pickled to the workers."""

    def __init__(
        self,
        name: str,
        function: Callable[[dict[str, Any]], Any],
        flat: bool,
        fields: list[str],
        output: pa.Schema,
        carried: list[str],
    ) -> None:
        self.name, self.function, self.flat = name, function, flat
        self.fields, self.output, self.carried = fields, output, carried

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        freeze_worker_heap()
        for batch in batches:
            if batch.num_rows:
                yield self.apply(batch)

    def apply(self, batch: pa.RecordBatch) -> pa.RecordBatch:
        records = batch.select(self.fields).to_pylist()
        fn, out = self.function, []
        kind = "flat_map" if self.flat else "map"
        rows: list[int] | None = [] if self.flat else None
        for i, record in enumerate(records):
            try:
                result = fn(record)
                if self.flat:
                    produced = list(result) if result is not None else []
                    out.extend(produced)
                    rows.extend([i] * len(produced))  # type: ignore[union-attr]
                else:
                    out.append(result)
            except Exception as exc:
                raise UserFunctionError(
                    self.name, record, f"the {kind} function raised {exc!r}"
                ) from exc
        bad = next((r for r in out if not isinstance(r, Mapping)), _NONE)
        if bad is not _NONE:
            at = out.index(bad) if rows is None else rows[out.index(bad)]
            raise UserFunctionError(
                self.name,
                records[at],
                f"the {kind} function returned "
                f"{type(bad).__name__} {bad!r:.100}, not a record (a dict)",
            )
        try:
            mapped = pa.RecordBatch.from_pylist(out, schema=self.output)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError) as exc:
            raise UserFunctionError(
                self.name,
                records[_first_bad(out, self.output, rows)],
                f"an output record does not fit the declared output ({exc})",
            ) from exc
        carried = batch.select(self.carried)
        if rows is not None:
            carried = carried.take(pa.array(rows, pa.int64()))
        return pa.RecordBatch.from_arrays(
            [*mapped.columns, *carried.columns], schema=_joined(self.output, carried.schema)
        )


_NONE = object()


def _joined(a: pa.Schema, b: pa.Schema) -> pa.Schema:
    return pa.schema([*a, *b])


def _first_bad(out: list[Mapping[str, Any]], schema: pa.Schema, rows: list[int] | None) -> int:
    """The input row of the first output record Arrow refuses (for the error message)."""
    for i, record in enumerate(out):
        try:
            pa.RecordBatch.from_pylist([record], schema=schema)
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            return i if rows is None else rows[i]
    return 0
