"""Runs a KeyedOperator inside Spark's transformWithStateInPandas (state in RocksDB).

Every state is one Spark state variable of the same name holding pickled Python values
(``v BINARY``; map states ``k BINARY -> v BINARY``), so any picklable value can be state and
state names in checkpoints and savepoints are exactly the descriptors' names. Cells cache per
key and write back once at the end of the key's turn: a per-element state call would cross
the Python↔JVM socket for every element.

Output rows carry the main output's columns plus ``_tag`` (null for the main output, else the
side output's name) and ``_side`` (the side record as JSON); the query's foreachBatch routes
each row to its sink.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import pickle
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import pandas as pd
from pyspark.sql.streaming.stateful_processor import (
    ExpiredTimerInfo,
    StatefulProcessor,
    StatefulProcessorHandle,
    TimerValues,
)
from pyspark.sql.streaming.stateful_processor_util import (
    TransformWithStateInPandasFuncMode,
    TransformWithStateInPandasUdfUtils,
)
from pyspark.sql.types import StringType, StructField, StructType

from stateful_runtime._process import freeze_worker_heap
from stateful_runtime.functions import UNION_INPUT, KeyedProcessFunction
from stateful_runtime.operators.backend import MapCell, StateBackend, ValueCell
from stateful_runtime.operators.isolation import (
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    StepGuard,
)
from stateful_runtime.operators.keyed import KeyedOperator

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, GroupedData

TAG = "_tag"
SIDE = "_side"
# No leading underscore: Spark rebuilds pandas frames via itertuples, which renames such columns.
TS = "srt_event_ms"
_PICKLE = pickle.HIGHEST_PROTOCOL
# Output rows a task holds before handing a frame to Spark (see SparkKeyedProcessor._buffer).
FLUSH_ROWS = 10_000
_MISSING = object()


def output_struct(main: StructType) -> StructType:
    fields = [StructField(f.name, f.dataType, True) for f in main.fields]
    return StructType([*fields, StructField(TAG, StringType()), StructField(SIDE, StringType())])


class _SparkValue(ValueCell):
    def __init__(self, state: Any) -> None:
        self.state = state
        self.cached: Any = _MISSING
        self.dirty = False

    def get(self) -> Any:
        if self.cached is _MISSING:
            raw = self.state.get()
            self.cached = None if raw is None else pickle.loads(raw[0])
        return self.cached

    def put(self, value: Any) -> None:
        self.cached, self.dirty = value, True

    def clear(self) -> None:
        self.cached, self.dirty = None, True

    def flush(self) -> None:
        if self.dirty:
            if self.cached is None:
                self.state.clear()
            else:
                self.state.update((pickle.dumps(self.cached, _PICKLE),))
        self.cached, self.dirty = _MISSING, False


class _SparkMap(MapCell):
    """A map state cached for the key's turn as a dict by the entries' own (Python) keys, as
    the in-memory backend keeps them: keys are pickled when the map loads and when it writes
    back, not on every access (the window operator reads and writes a window's entry per
    element and window: two pickles each, ~10% of a sliding window's worker time)."""

    def __init__(self, state: Any) -> None:
        self.state = state
        self.entries_: dict[Any, Any] | None = None
        self.stored: dict[Any, bytes] = {}  # the pickled form of each key read from Spark
        self.dirty: set[Any] = set()
        self.removed: set[Any] = set()
        self.cleared = False

    def _load(self) -> dict[Any, Any]:
        if self.entries_ is None:
            self.entries_ = {}
            if not self.cleared:  # an absent map iterates empty: no exists() round trip
                for (k,), (v,) in self.state.iterator():
                    key = pickle.loads(k)
                    self.entries_[key] = pickle.loads(v)
                    self.stored[key] = k
        return self.entries_

    def get_entry(self, key: Any) -> Any:
        return self._load().get(key)

    def put_entry(self, key: Any, value: Any) -> None:
        self._load()[key] = value
        self.dirty.add(key)
        self.removed.discard(key)

    def remove_entry(self, key: Any) -> None:
        if self._load().pop(key, _MISSING) is not _MISSING:
            self.removed.add(key)
            self.dirty.discard(key)

    def entries(self) -> Iterator[tuple[Any, Any]]:
        return iter(list(self._load().items()))

    def clear(self) -> None:
        self.entries_, self.dirty, self.removed, self.cleared = {}, set(), set(), True
        self.stored = {}

    def _raw(self, key: Any) -> bytes:
        raw = self.stored.get(key)
        return pickle.dumps(key, _PICKLE) if raw is None else raw

    def flush(self) -> None:
        if self.cleared:
            self.state.clear()
        for key in self.removed:
            self.state.removeKey((self._raw(key),))
        if self.entries_ is not None:
            for key in self.dirty:
                self.state.updateValue(
                    (self._raw(key),), (pickle.dumps(self.entries_[key], _PICKLE),)
                )
        self.entries_, self.dirty, self.removed, self.cleared = None, set(), set(), False
        self.stored = {}


class SparkBackend(StateBackend):
    """Spark's state handles behind cached cells; timer changes are netted per key turn and
    sent at ``end_key`` (a session window moves its timer on every element: two JVM calls per
    element otherwise)."""

    def __init__(self, handle: StatefulProcessorHandle) -> None:
        self.handle = handle
        self.cells: list[_SparkValue | _SparkMap] = []
        self.added: set[int] = set()
        self.deleted: set[int] = set()

    def value_cell(self, name: str, processing_ttl_ms: int | None) -> ValueCell:
        cell = _SparkValue(self.handle.getValueState(name, "v BINARY", processing_ttl_ms))
        self.cells.append(cell)
        return cell

    def map_cell(self, name: str, processing_ttl_ms: int | None) -> MapCell:
        cell = _SparkMap(self.handle.getMapState(name, "k BINARY", "v BINARY", processing_ttl_ms))
        self.cells.append(cell)
        return cell

    def register_timer(self, ts: int) -> None:
        if ts in self.deleted:
            self.deleted.discard(ts)
        else:
            self.added.add(ts)

    def delete_timer(self, ts: int) -> None:
        if ts in self.added:
            self.added.discard(ts)
        else:
            self.deleted.add(ts)

    def list_timers(self) -> Iterable[int]:
        return (set(self.handle.listTimers()) - self.deleted) | self.added

    def end_key(self) -> None:
        for cell in self.cells:
            cell.flush()
        for ts in self.deleted:
            self.handle.deleteTimer(ts)
        for ts in self.added:
            self.handle.registerTimer(ts)
        self.added.clear()
        self.deleted.clear()


def _whole(value: Any) -> int | None:
    return None if value is None else int(value)


def _clean(value: Any) -> Any:
    # pandas turns a null in a numeric column into NaN
    return None if isinstance(value, float) and math.isnan(value) else value


class SparkKeyedProcessor(StatefulProcessor):
    """The StatefulProcessor Spark runs; one instance per task (Spark deep-copies it)."""

    def __init__(
        self,
        fn: KeyedProcessFunction,
        fields: Sequence[str],
        output_columns: Sequence[str],
        guard: StepGuard | None = None,
    ) -> None:
        self.fn = fn
        self.fields = list(fields)
        self.output_columns = list(output_columns)
        self.guard = guard

    def init(self, handle: StatefulProcessorHandle) -> None:
        freeze_worker_heap()
        self.pending_main: list[dict[str, Any]] = []
        self.pending_side: list[tuple[str, Any]] = []
        self.op = KeyedOperator(copy.deepcopy(self.fn), copy.deepcopy(self.guard))
        self.op.open(SparkBackend(handle))

    def _buffer(self) -> Iterator[pd.DataFrame]:
        """Take the operator's output into the task's buffer; yield a frame only once it holds
        ``FLUSH_ROWS`` rows. Spark converts every frame a key's turn yields to Arrow on its own
        (a fixed cost per frame, per key: a quarter of the worker's time when most keys emit
        a row or two); the rest leaves in :meth:`flush` at the end of the task's timer phase."""
        main, side = self.op.drain()
        if main or side:
            self.pending_main.extend(main)
            self.pending_side.extend(side)
            if len(self.pending_main) + len(self.pending_side) >= FLUSH_ROWS:
                yield from self.flush()

    def flush(self) -> Iterator[pd.DataFrame]:
        main, side = self.pending_main, self.pending_side
        if not main and not side:
            return
        self.pending_main, self.pending_side = [], []
        cols: dict[str, list[Any]] = {c: [r.get(c) for r in main] for c in self.output_columns}
        cols[TAG] = [None] * len(main)
        cols[SIDE] = [None] * len(main)
        for tag, record in side:
            for c in self.output_columns:
                cols[c].append(None)
            cols[TAG].append(tag)
            cols[SIDE].append(json.dumps(record, default=str))
        yield pd.DataFrame({c: pd.Series(v, dtype=object) for c, v in cols.items()})

    def handleInputRows(
        self, key: Any, rows: Iterator[pd.DataFrame], timerValues: TimerValues
    ) -> Iterator[pd.DataFrame]:
        self.op.set_time(
            timerValues.getCurrentWatermarkInMs(), timerValues.getCurrentProcessingTimeInMs()
        )
        self.op.process(tuple(key), self._elements(rows))
        yield from self._buffer()

    def _elements(self, frames: Iterator[pd.DataFrame]) -> Iterator[tuple[int, dict[str, Any]]]:
        """(event time, record) of each row. One ``to_numpy(dtype=object)`` per frame gives
        every cell as a Python value without upcasting across columns: 8 µs for a one-row
        frame where a lookup per column took 127 µs (most keys of a deduplication carry one
        row), 0.6 µs a row in large frames."""
        fields, op = self.fields, getattr(self, "op", None)
        for pdf in frames:
            names = list(pdf.columns)
            at = [names.index(f) for f in fields]
            ts = names.index(TS)
            # The element's source partition and offset, for the dead letter of an element the
            # function raises on, and its union input, for a late one's count (set as each
            # element is handed over: the operator is lazy).
            part = names.index(ORIGIN_PARTITION) if ORIGIN_PARTITION in names else None
            off = names.index(ORIGIN_OFFSET) if ORIGIN_OFFSET in names else None
            union = names.index(UNION_INPUT) if UNION_INPUT in names else None
            nan = [i for i, dtype in enumerate(pdf.dtypes) if dtype.kind == "f"]
            for row in pdf.to_numpy(dtype=object).tolist():
                for i in nan:  # pandas turns a null in a numeric column into NaN
                    row[i] = _clean(row[i])
                if op is not None and part is not None and off is not None:
                    input = _whole(row[union]) if union is not None else None
                    op.origin = (_whole(row[part]), _whole(row[off]), input)
                yield row[ts], {f: row[i] for f, i in zip(fields, at, strict=True)}

    def handleExpiredTimer(
        self, key: Any, timerValues: TimerValues, expiredTimerInfo: ExpiredTimerInfo
    ) -> Iterator[pd.DataFrame]:
        self.op.set_time(
            timerValues.getCurrentWatermarkInMs(), timerValues.getCurrentProcessingTimeInMs()
        )
        self.op.fire(tuple(key), expiredTimerInfo.getExpiryTimeInMs())
        yield from self._buffer()

    def stage_rejects(self) -> None:
        """End of the task: stage the elements and timers it isolated (before the task
        reports success, so a retry writes the same file)."""
        if hasattr(self, "op"):
            self.op.guard.stage()

    def close(self) -> None:
        if hasattr(self, "op"):
            self.op.guard.stage()
            self.op.close()


def transform_with_state(
    grouped: GroupedData, processor: SparkKeyedProcessor, output: StructType, time_mode: str
) -> DataFrame:
    """``grouped.transformWithStateInPandas(processor, output, "Append", time_mode)``, except
    that the processor's buffered output is flushed after each task's timers (Spark calls no
    processor method at that point; :class:`_FlushingUdf` adds the call). Built as PySpark
    4.3's ``GroupedData.__transformWithState`` builds it (pyproject pins PySpark < 4.4)."""
    from pyspark.sql import DataFrame
    from pyspark.sql.functions import pandas_udf
    from pyspark.util import PythonEvalType

    util = _FlushingUdf(processor, time_mode)
    udf = pandas_udf(
        util.transformWithStateUDF,
        returnType=output,  # type: ignore[call-overload]
        functionType=PythonEvalType.SQL_TRANSFORM_WITH_STATE_PANDAS_UDF,
    )
    df = grouped._df
    column = udf(*[df[c] for c in df.columns])
    session = grouped.session
    jdf = grouped._jgd.transformWithStateInPandas(
        column._jc,
        session._jsparkSession.parseDataType(output.json()),
        "Append",
        time_mode,
        None,
        "",
    )
    return DataFrame(jdf, session)


class _FlushingUdf(TransformWithStateInPandasUdfUtils):
    def transformWithStateUDF(
        self, client: Any, mode: Any, key: Any, input_rows: Any
    ) -> Iterator[pd.DataFrame]:
        out = super().transformWithStateUDF(client, mode, key, input_rows)
        if mode == TransformWithStateInPandasFuncMode.PROCESS_TIMER:
            processor = self._stateful_processor
            assert isinstance(processor, SparkKeyedProcessor)
            return itertools.chain(out, processor.flush(), _after(processor.stage_rejects))
        return out


def _after(action: Any) -> Iterator[pd.DataFrame]:
    """Nothing to yield; runs ``action`` once the frames before it were taken."""
    action()
    yield from ()
