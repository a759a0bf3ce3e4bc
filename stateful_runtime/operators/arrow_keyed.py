"""A keyed process function on whole Arrow batches, state in the worker's RocksDB: what
``mapInArrow`` runs after the query repartitions by key group.

The plan (:func:`stateful_runtime.runtime.dataframes._process`): the JVM computes each record's
key group (``pmod(hash(key fields), 128)``) and a routing value that Spark's hash partitioner
sends to the partition owning that group's range, repartitions, and calls
:class:`ArrowKeyedOperator` once per partition and batch. The task then

1. reads the batch id (Spark's ``streaming.sql.batchId`` task property) and the batch's
   watermark and processing time from Spark's offset log (``offsets/<batch>``, written before
   the batch's tasks run: the same values on every replay);
2. opens the partition's :class:`~stateful_runtime.operators.keyed_store.KeyedStore` at the
   version before the batch;
3. fires the timers due at the batch's time, in time order (Flink's order: a key's due timers
   act before its new elements), groups each Arrow batch by key in Arrow and runs the function
   per key over its records, fires timers its elements registered that are already due, and
   commits the batch's changes as the next version, under the attempt's token, and hands the
   token to the driver as a last output row (tagged :data:`COMMIT_TAG`), which records it with
   the batch (:func:`stateful_runtime.runtime.batch_writes.record_keyed_commits`).

Spark runs a batch without data only for its own stateful operators; the plan of a function
whose timers can emit carries one that holds nothing (see
:func:`stateful_runtime.runtime.dataframes._process_local`), so a watermark that advanced
without new data still fires its event-time timers, and an ``--available-now`` run ends with
the timers due at its final watermark fired. A function without an ``on_timer`` of its own
has only event-time TTL's cleanup timers, which wait for the next batch (reads check
expiry). A processing-time function's query also reads a source whose offset moves when one
of its timers is due (:mod:`.ticks`): each task records its partition's earliest timer after
its commit.
"""

from __future__ import annotations

import copy
import itertools
import json
import pickle
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from stateful_runtime._process import freeze_worker_heap, full_collections_deferred
from stateful_runtime.checkpoints.keyed import (
    BROADCAST_ROW,
    COMMIT_TAG,
    KEYED_DIR,
    owner_of,
    spark_hash_int,
)
from stateful_runtime.checkpoints.layout import QueryLayout
from stateful_runtime.checkpoints.storage import checkpoint_path
from stateful_runtime.exceptions import StateError
from stateful_runtime.functions import (
    BROADCAST_KEY,
    CO_INPUT,
    UNION_INPUT,
    BroadcastProcess,
    KeyedProcessFunction,
)
from stateful_runtime.job import RocksDBMemory
from stateful_runtime.operators.isolation import (
    ORIGIN_OFFSET,
    ORIGIN_PARTITION,
    SERVICE_FAILING,
    StepGuard,
)
from stateful_runtime.operators.keyed import KeyedOperator, Origin, ReadsShared
from stateful_runtime.operators.keyed_store import (
    MAX_PARALLELISM,
    KeyedStore,
    group_prefix,
    key_groups,
)
from stateful_runtime.operators.local_state import LocalBackend, keep_values, warm_values
from stateful_runtime.operators.output import SIDE, TAG
from stateful_runtime.operators.ticks import write_next_timer
from stateful_runtime.state import TimeDomain

KEY_GROUP = "srt_key_group"
ROUTE = "srt_route"
BATCH_ID = "streaming.sql.batchId"
# Output rows a task holds before handing a batch to Spark.
FLUSH_ROWS = 10_000


def store_dir(query_checkpoint: str | Path, operator: str, partition: int) -> Path:
    """A state partition's directory in a query's checkpoint."""
    return checkpoint_path(query_checkpoint) / KEYED_DIR / operator / str(partition)


# -- routing: key group -> Spark partition -------------------------------------------------------
def route_values(parallelism: int) -> list[int]:
    """For each partition ``p``, an int that Spark's hash partitioner (``pmod(hash(v), n)``)
    sends to ``p``: repartitioning by ``route_values[group * n // 128]`` gives each partition
    exactly its contiguous key-group range."""
    found: dict[int, int] = {}
    v = 0
    while len(found) < parallelism:
        found.setdefault(spark_hash_int(v) % parallelism, v)
        v += 1
    return [found[p] for p in range(parallelism)]


# -- the task ------------------------------------------------------------------------------------
def _batch_time(query_checkpoint: str, batch: int) -> tuple[int, int]:
    """The watermark and processing time (ms) of ``batch``, as Spark logged them."""
    lines = QueryLayout(query_checkpoint).offsets(batch).read_text().splitlines()
    meta = json.loads(lines[1])
    return max(0, int(meta.get("batchWatermarkMs", 0))), int(meta.get("batchTimestampMs", 0))


# Due timers a task looks ahead at: their keys' states are read in one multi-get
# (LocalBackend.read_ahead_timers; a TTL cleanup wave is mostly such reads).
READ_AHEAD = 512


class KeyedTask:
    """One task of a keyed operator: one state partition (its key groups ``groups``, its store
    opened at the batch's version) through one batch at ``watermark`` and processing time
    ``now``. What a Spark task runs (:class:`ArrowKeyedOperator`, from Arrow batches) and what
    the test harness runs (:mod:`stateful_runtime.testing`, from Python records): due timers
    first (:meth:`fire_due`), the broadcast elements, each key's elements in key-group and key
    order (:meth:`process`), the timers they made due, then :meth:`commit`.

    The function is a copy of its own and ``open``-ed for the task, as Spark ships it to each
    task; ``shared``: its reads shared with the state (:meth:`KeyedOperator.share_reads`)."""

    def __init__(
        self,
        fn: KeyedProcessFunction,
        guard: StepGuard | None,
        store: KeyedStore,
        groups: range,
        watermark: int,
        now: int,
        *,
        shared: bool = False,
    ) -> None:
        op = self.op = KeyedOperator(copy.deepcopy(fn), copy.deepcopy(guard))
        if shared:
            op.share_reads()
        # A run after a shared one starts from the store: the first changed values in place
        # (they are not kept, see warm_values).
        warm = warm_values(store)
        backend = self.backend = LocalBackend(
            store,
            clock=lambda: op.processing_ms,
            key_timers=False,
            values=warm[0] if warm else None,
            value_bytes=warm[1] if warm else 0,
        )
        backend.groups = groups
        self.store, self.groups = store, groups
        op.set_time(watermark, now)
        op.open(backend)
        self.broadcast = op.fn if isinstance(op.fn, BroadcastProcess) else None
        if self.broadcast is not None:
            load_broadcast(store, groups, self.broadcast)
        # Due timers fire for the whole partition before any element (fire_due), so a key's
        # turn need not list its own timers first.
        op._fire_first = False
        self.upto = watermark if op.domain is TimeDomain.EVENT_TIME else now

    def fire_due(self) -> Iterator[None]:
        """Fire every timer due at the batch's time, in time order (then key group, then
        key), a timer made due by another's firing included; yields after each that
        emitted."""
        op, backend = self.op, self.backend
        cleanups = op.cleanups_only
        while True:
            fired = False
            due = backend.due(self.upto, self.groups)
            for rows in iter(lambda: list(itertools.islice(due, READ_AHEAD)), []):  # noqa: B023
                backend.read_ahead_timers(rows)
                if cleanups is not None:  # (they emit nothing, and remove no other timer)
                    fired = backend.expire(rows, cleanups) or fired
                    continue
                for row in rows:
                    taken = backend.take(row)
                    if taken is None:
                        continue
                    fired = True
                    op.fire(taken[1], taken[0])
                    if op.main or op.side:
                        yield
            if not fired:
                return

    def process(self, group: int, key: tuple, elements: Iterable[tuple[int, dict]]) -> None:
        """One key's elements (event time, record) of the batch, in the order they came."""
        self.backend.group = group
        self.op.process(key, elements)

    def process_broadcast(self, elements: list[tuple[int, dict[str, Any]]], first: bool) -> None:
        """The batch's broadcast elements, in event-time order; ``first``: the task of the
        first partition, which alone dead-letters an element every partition raised on."""
        op = self.op
        self.backend.group = self.groups.start
        mark = len(op.guard.rejects.rows)
        op.process(BROADCAST_KEY, elements)
        if not first:
            del op.guard.rejects.rows[mark:]

    def commit(self) -> int:
        """The task's changes as the store's next version (the function closed first); the
        rejects staged before it, and the partition's next timer after it
        (``operators/ticks.py``)."""
        op, backend, store = self.op, self.backend, self.store
        if self.broadcast is not None:
            backend.raw.update(broadcast_rows(self.groups, self.broadcast))
        op.guard.stage()  # before the version commits: a retried task stages the same
        version = backend.commit()
        keep_values(store, backend)
        # when the next batch must run, for a query that reads its timer ticks
        write_next_timer(store.checkpoint, version, backend.next_timer(self.groups))
        return version


class ArrowKeyedOperator:
    """The function ``mapInArrow`` calls with one partition's batches; pickled to workers.

    Args:
        fn: the keyed process function (or the window operator).
        name: the operator's name (its state directory).
        keys: key fields; ``fields``: the record's fields the function sees.
        time_field: the column holding each record's event time (ms).
        output: the Arrow schema of the output (main columns, ``_tag``, ``_side``).
        checkpoint: the query's checkpoint directory (None: explain only, never run).
        parallelism: the query's state partitions.
        guard: how the task isolates an element or timer the function raises on (None: the
            task fails).
        memory: the RocksDB's memory in the worker (default :meth:`RocksDBMemory.default`).
        placed_by: the source whose partitions the task reads unshuffled (they hold its key
            groups), None after a shuffle.
    """

    def __init__(
        self,
        fn: KeyedProcessFunction,
        name: str,
        keys: Sequence[str],
        fields: Sequence[str],
        time_field: str,
        output: pa.Schema,
        checkpoint: str | None,
        parallelism: int,
        guard: StepGuard | None = None,
        memory: RocksDBMemory | None = None,
        placed_by: str | None = None,
    ) -> None:
        self.fn, self.name, self.guard = fn, name, guard
        self.placed_by = placed_by
        self.memory = memory or RocksDBMemory.default()
        self.keys, self.fields, self.time_field = list(keys), list(fields), time_field
        self.output, self.checkpoint, self.parallelism = output, checkpoint, parallelism
        self.main_columns = [f.name for f in output if f.name not in (TAG, SIDE)]
        # The driver's accumulator of the function's service calls (an enrich_async lookup's
        # ``tally``), added to once a task (None: not counted).
        self.stats: Any = None

    def __call__(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        from pyspark import TaskContext

        freeze_worker_heap()
        task = TaskContext.get()
        if self.checkpoint is None or task is None:
            raise StateError(f"operator {self.name!r}: keyed state runs only in a streaming query")
        raw_batch = task.getLocalProperty(BATCH_ID)
        if raw_batch is None:
            raise StateError(f"operator {self.name!r}: Spark gave the task no batch id")
        partition = task.partitionId()
        if self.placed_by is not None and partition >= self.parallelism:
            # A timer tick's empty split after a read of the source's P partitions, whose
            # tasks fire the timers (runtime/dataframes.py): nothing to do.
            for arrow in batches:
                if arrow.num_rows:
                    raise StateError(
                        f"operator {self.name!r}: task {partition} of a query with "
                        f"{self.parallelism} state partitions read records; the source "
                        f"{self.placed_by} gave more splits than its partitions"
                    )
            return
        yield from self.run(int(raw_batch), partition, batches)

    def run(
        self, batch: int, partition: int, batches: Iterator[pa.RecordBatch]
    ) -> Iterator[pa.RecordBatch]:
        """Batch ``batch`` of partition ``partition`` (``__call__`` without Spark's task).

        A function that writes back what it changes (``writes_back_reads``: the window
        operator) runs with its reads shared with the state; when one of its calls raises
        (:class:`ReadsShared`), the task runs again from the batch's version with copies on
        read, over the input it had read and the rest, where the call is isolated as usual.
        The output the first run had handed to Spark already is the second's first rows
        (the same calls in the same order), which it does not hand over again.
        """
        self.yielded = [0, 0]  # main and side rows handed to Spark
        self.skip = [0, 0]
        with full_collections_deferred():
            if not getattr(self.fn, "writes_back_reads", False):
                yield from self._run(batch, partition, batches, shared=False)
                return
            read: list[pa.RecordBatch] = []
            try:
                yield from self._run(batch, partition, _keeping(batches, read), shared=True)
            except ReadsShared:
                self.skip = self.yielded
                self.yielded = [0, 0]
                yield from self._run(batch, partition, itertools.chain(read, batches), shared=False)

    def _run(
        self, batch: int, partition: int, batches: Iterator[pa.RecordBatch], shared: bool
    ) -> Iterator[pa.RecordBatch]:
        assert self.checkpoint is not None
        watermark, now = _batch_time(self.checkpoint, batch)
        groups = key_groups(partition, self.parallelism, MAX_PARALLELISM)
        store = KeyedStore(store_dir(self.checkpoint, self.name, partition), memory=self.memory)
        store.open(batch)
        try:
            if getattr(self.fn, "tally", None) is not None and self.guard is not None:
                self.guard.failing = SERVICE_FAILING  # (a lookup's calls)
            task = KeyedTask(self.fn, self.guard, store, groups, watermark, now, shared=shared)
            op, backend = task.op, task.backend
            self.out: list[dict[str, Any]] = []
            self.side: list[tuple[str, dict[str, Any]]] = []
            yield from self._fire(task)
            if task.broadcast is not None:
                # The batch's broadcast elements first, in event-time order: a rule applies
                # to the keyed elements of the batch it came in.
                elements, keyed = self._split_broadcast(list(batches))
                if elements:
                    task.process_broadcast(elements, first=partition == 0)
                    self._collect(op)
                    yield from self._flush()
                batches = iter(keyed)
            for arrow in batches:
                if arrow.num_rows:
                    yield from self._process(op, backend, groups, arrow)
            yield from self._fire(task)
            op.close()
            yield from self._flush(force=True)
            version = task.commit()
            tally = getattr(op.fn, "tally", None)
            if self.stats is not None and tally is not None:
                self.stats.add({self.name: tally.stats()})
            # The attempt's token to the driver, which records it once the batch's output
            # (this row with it) is written: only then is the version this attempt's.
            yield self._commit_row(partition, version, store.token)
        finally:
            store.close()

    def _commit_row(self, partition: int, version: int, token: str) -> pa.RecordBatch:
        cols: dict[str, list[Any]] = {c: [None] for c in self.main_columns}
        cols[TAG] = [COMMIT_TAG]
        done = {"operator": self.name, "partition": partition, "version": version, "token": token}
        cols[SIDE] = [json.dumps(done)]
        return pa.RecordBatch.from_pydict(cols, schema=self.output)

    def _split_broadcast(
        self, batches: list[pa.RecordBatch]
    ) -> tuple[list[tuple[int, dict[str, Any]]], list[pa.RecordBatch]]:
        """The broadcast elements of the task's batches as (event time, record), in
        event-time order, and the keyed input's batches."""
        elements: list[tuple[int, dict[str, Any]]] = []
        keyed = []
        for arrow in batches:
            if not arrow.num_rows:
                continue
            mine = pc.equal(arrow.column(CO_INPUT), 2)
            copies = arrow.filter(mine)
            if copies.num_rows:
                times = copies.column(self.time_field).to_pylist()
                records = copies.select(self.fields).to_pylist()
                elements += zip(times, records, strict=True)
            keyed.append(arrow.filter(pc.invert(mine)))
        elements.sort(key=lambda e: e[0])
        return elements, keyed

    def _fire(self, task: KeyedTask) -> Iterator[pa.RecordBatch]:
        for _ in task.fire_due():
            self._collect(task.op)
            yield from self._flush()

    def _process(
        self, op: KeyedOperator, backend: LocalBackend, groups: range, arrow: pa.RecordBatch
    ) -> Iterator[pa.RecordBatch]:
        # A stable sort by key group and key in Arrow: each key's records are one run, in
        # the order they came (a key's turn reads its rows once), and the turns walk the
        # store in key order.
        lo, hi = groups.start, groups.stop
        low, high = pc.min_max(arrow.column(KEY_GROUP)).values()
        if not lo <= low.as_py() <= high.as_py() < hi and self.placed_by is not None:
            raise StateError(
                f"operator {self.name!r}: a record of key group "
                f"{low.as_py() if low.as_py() < lo else high.as_py()} was read from partition "
                f"{owner_of(groups.start, self.parallelism)} of {self.placed_by}, "
                f"whose records should be of key groups {lo}..{hi - 1}: the topic's records "
                f"are not placed by the job's key (appended or produced with another key, or "
                f"another partitioner?); nothing of the batch is committed"
            )
        if not lo <= low.as_py() <= high.as_py() < hi:
            raise StateError(
                f"operator {self.name!r}: a record of key group "
                f"{low.as_py() if low.as_py() < lo else high.as_py()} reached the task of "
                f"key groups {lo}..{hi - 1}; the query's partitioning changed under its "
                f"checkpoint (parallelism is fixed by the first run: rescale with srt "
                f"savepoint, then srt run --from-savepoint <id> --parallelism N)"
            )
        order = pc.sort_indices(
            arrow, sort_keys=[(KEY_GROUP, "ascending"), *((k, "ascending") for k in self.keys)]
        )
        arrow = arrow.take(order)
        n = arrow.num_rows
        starts = _run_starts(arrow, [KEY_GROUP, *self.keys])
        key_columns = [arrow.column(k).to_pylist() for k in self.keys]
        group_column = arrow.column(KEY_GROUP).to_pylist()
        records = arrow.select(self.fields).to_pylist()
        times = arrow.column(self.time_field).to_pylist()
        where = _Origins(arrow, records)
        op.origin_of = where if where.parts is not None else None
        single = key_columns[0] if len(key_columns) == 1 else None
        process = op.process
        starts.append(n)
        prefetch = getattr(op.fn, "prefetch", None)
        if prefetch is not None:  # (a lookup: the batch's keys without an answer, at once)
            needs_lookup = op.fn.needs_lookup  # type: ignore[attr-defined]
            wanted = []
            for s in starts[:-1]:
                backend.group = group_column[s]
                key = (single[s],) if single is not None else tuple(c[s] for c in key_columns)
                if op.visit(key, needs_lookup):
                    wanted.append(key[0] if len(key) == 1 else key)
            prefetch(wanted)
        for j in range(len(starts) - 1):
            s = where.lo = starts[j]
            e = where.hi = starts[j + 1]
            backend.group = group_column[s]
            key = (single[s],) if single is not None else tuple(c[s] for c in key_columns)
            process(key, zip(times[s:e], records[s:e], strict=True))
            if len(op.main) + len(op.side) >= FLUSH_ROWS:
                self._collect(op)
                yield from self._flush()
        self._collect(op)

    def _collect(self, op: KeyedOperator) -> None:
        main, side = op.drain()
        skip = self.skip
        if skip[0] or skip[1]:  # what a shared run handed to Spark already
            cut_main, cut_side = min(skip[0], len(main)), min(skip[1], len(side))
            main, side = main[cut_main:], side[cut_side:]
            self.skip = [skip[0] - cut_main, skip[1] - cut_side]
        if main:
            self.out.extend(main)
        if side:
            self.side.extend(side)

    def _flush(self, force: bool = False) -> Iterator[pa.RecordBatch]:
        main, side = self.out, self.side
        if not main and not side:
            return
        if not force and len(main) + len(side) < FLUSH_ROWS:
            return
        self.out, self.side = [], []
        self.yielded = [self.yielded[0] + len(main), self.yielded[1] + len(side)]
        cols: dict[str, list[Any]] = {c: [r.get(c) for r in main] for c in self.main_columns}
        cols[TAG] = [None] * len(main)
        cols[SIDE] = [None] * len(main)
        for tag, record in side:
            for c in self.main_columns:
                cols[c].append(None)
            cols[TAG].append(tag)
            cols[SIDE].append(json.dumps(record, default=str))
        yield pa.RecordBatch.from_pydict(cols, schema=self.output)


# -- broadcast state ------------------------------------------------------------------------------
# A broadcast state is one row per key group, ``<group> b <state name>`` → the pickled dict: every
# key group of a partition holds the same copy, so a rescale (whole key-group ranges to new
# partitions) gives every new partition its copy, and a savepoint holds it with the keyed state.
def broadcast_row(group: int, name: str) -> bytes:
    return group_prefix(group) + BROADCAST_ROW + name.encode()


def load_broadcast(store: KeyedStore, groups: range, fn: BroadcastProcess) -> None:
    """``fn``'s broadcast states as the store holds them (its partition's first key group)."""
    for name in fn.broadcast:
        raw = store.get(broadcast_row(groups.start, name))
        fn.broadcast[name] = pickle.loads(raw) if raw is not None else {}


def broadcast_rows(groups: range, fn: BroadcastProcess) -> dict[bytes, bytes | None]:
    """The rows of the broadcast states the task changed, in every key group it owns."""
    rows: dict[bytes, bytes | None] = {}
    for name in sorted(fn.changed):
        entries = fn.broadcast[name]
        value = pickle.dumps(entries, pickle.HIGHEST_PROTOCOL) if entries else None
        for group in groups:
            rows[broadcast_row(group, name)] = value
    return rows


def _keeping(
    batches: Iterator[pa.RecordBatch], read: list[pa.RecordBatch]
) -> Iterator[pa.RecordBatch]:
    """``batches``, each also kept in ``read`` before it is handed on."""
    for arrow in batches:
        read.append(arrow)
        yield arrow


def _run_starts(arrow: pa.RecordBatch, columns: list[str]) -> list[int]:
    """Where each run of equal values of ``columns`` starts in ``arrow`` (nulls equal)."""
    n = arrow.num_rows
    if n == 0:
        return []
    change = None
    for name in columns:
        col = arrow.column(name)
        a, b = col.slice(1), col.slice(0, n - 1)
        differs = pc.fill_null(pc.not_equal(a, b), False)
        if col.null_count:
            differs = pc.or_(differs, pc.xor(pc.is_null(a), pc.is_null(b)))
        change = differs if change is None else pc.or_(change, differs)
    assert change is not None
    return [0, *(pc.indices_nonzero(change).to_numpy() + 1).tolist()]


class _Origins:
    """The source partition, offset and union input of an element of the current key's run
    (rows ``lo..hi`` of the sorted batch), found by the element's identity when the function
    raised on it or it was late: nothing is done per element (the dead letter and the late
    count name them). The element asked for is the one being processed, so the search starts
    where the last one was found: a run's lookups cost one pass over it, however many of its
    elements are late."""

    __slots__ = ("at", "hi", "inputs", "lo", "offsets", "parts", "records")

    def __init__(self, arrow: pa.RecordBatch, records: list[dict[str, Any]]) -> None:
        names = arrow.schema.names
        present = ORIGIN_PARTITION in names and ORIGIN_OFFSET in names
        self.parts = arrow.column(ORIGIN_PARTITION) if present else None
        self.offsets = arrow.column(ORIGIN_OFFSET) if present else None
        self.inputs = arrow.column(UNION_INPUT) if UNION_INPUT in names else None
        self.records, self.lo, self.hi, self.at = records, 0, 0, 0

    def __call__(self, element: dict[str, Any]) -> Origin:
        assert self.parts is not None and self.offsets is not None
        lo, hi, records = self.lo, self.hi, self.records
        at = self.at if lo <= self.at < hi else lo
        for r in itertools.chain(range(at, hi), range(lo, at)):
            if records[r] is element:
                self.at = r
                input = self.inputs[r].as_py() if self.inputs is not None else None
                return self.parts[r].as_py(), self.offsets[r].as_py(), input
        return None, None, None
