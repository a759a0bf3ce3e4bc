"""The end of an ``--available-now`` run: the event-time TTL cleanup timers its final watermark
made due, fired.

Spark runs a batch without new data only when a source offers new offsets or a stateful
operator of its own asks for one. A keyed function with event-time timers (its own, or TTL's
cleanups) reads its timer ticks (``operators/ticks.py``), which keep offering a batch while one
of its timers is behind the watermark, so the run ends with a batch at its final watermark
that fires them in Spark's tasks (a checkpoint written before the ticks carries a Spark
operator that holds nothing for the same end, the watermark carrier of
``runtime/dataframes.py``). A checkpoint written while a function whose only timers were
TTL's cleanups read no ticks keeps reading none (Spark refuses a source added to a
checkpoint, ``QueryPlan.event_ticks_written``), so its run would end with those due at the
final watermark unfired: reads already treat their values as gone, but they hold storage, and
a savepoint taken then holds them too.

Those timers call no ``on_timer`` and emit nothing (the function is only opened and closed, as
for any task), so the runner fires them itself once the
queries ended: each state partition's :class:`~stateful_runtime.operators.arrow_keyed.KeyedTask`
at the watermark the last batch left, committed as the next version, recorded, and logged as a
batch without input that went to no sink (as a rescale's batch is). A crash part way leaves the
versions unrecorded or the batch planned and not committed: either way the next run's batch
redoes it.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from stateful_runtime.checkpoints import keyed
from stateful_runtime.checkpoints.layout import CheckpointLayout, QueryLayout
from stateful_runtime.exceptions import StateError
from stateful_runtime.operators.arrow_keyed import KeyedTask, store_dir
from stateful_runtime.operators.keyed import has_ttl
from stateful_runtime.operators.keyed_store import KeyedStore
from stateful_runtime.planner import QueryPlan
from stateful_runtime.runtime import sink_check
from stateful_runtime.state import TimeDomain


def fire(checkpoint: CheckpointLayout, queries: Sequence[QueryPlan]) -> list[str]:
    """Fire the cleanup timers due at each query's final watermark (see the module doc);
    what was done."""
    notes = []
    for q in queries:
        note = _fire_query(checkpoint.query(q.name), q)
        if note is not None:
            notes.append(note)
    return notes


def _ttl_only(q: QueryPlan) -> bool:
    """A query whose keyed function has event-time TTL state and neither timer ticks nor a
    watermark carrier (either makes Spark run the batch that fires everything). A union's
    inputs' watermarks need no entry for the batch logged here: they did not move, and a
    restart reads the newest entry at or before its batch
    (``QueryLayout.input_watermarks_upto``)."""
    proc = q.process
    if proc is None or q.watermark_carrier or q.ticks is not None:
        return False
    fn = proc.function
    if fn.time_domain is not TimeDomain.EVENT_TIME:
        return False
    return has_ttl(fn)


def _fire_query(query: QueryLayout, q: QueryPlan) -> str | None:
    if not _ttl_only(q):
        return None
    assert q.process is not None
    batch = query.last_committed()
    if batch is None:
        return None
    watermark, before = query.next_watermark_ms(batch), query.watermark_ms(batch)
    if watermark is None or before is None or watermark <= before:
        return None
    partitions = query.state_partitions(batch) or q.parallelism
    name, fn = q.process.name, q.process.function
    now = int(time.time() * 1000)

    @contextmanager
    def task(p: int) -> Iterator[KeyedTask]:
        """Partition ``p``'s task at the final watermark, its store open at the last version."""
        store = KeyedStore(store_dir(query.root, name, p), memory=q.rocksdb)
        store.open(batch + 1)
        try:
            yield KeyedTask(fn, None, store, keyed.key_groups(p, partitions), watermark, now)
        finally:
            store.close()

    def due(p: int) -> bool:
        with task(p) as t:
            first = t.backend.next_timer(t.groups)
            t.op.close()
        return first is not None and first <= watermark

    if not any(due(p) for p in range(partitions)):
        return None
    tokens: dict[int, str] = {}
    for p in range(partitions):
        with task(p) as t:
            for _ in t.fire_due():
                raise StateError(
                    f"operator {name!r}: a cleanup timer emitted a record at the end of the "
                    f"run; nothing was committed (the next run's first batch fires it)"
                )
            t.op.close()
            t.commit()
            tokens[p] = t.store.token
    keyed.record(query.keyed / name, batch + 2, tokens)
    query.log_batch_without_input(batch, watermark=watermark, timestamp=now)
    sink_check.record_no_output(query, q, batch + 1)
    return (
        f"query {q.name}: fired the state cleanup timers due at the final watermark as batch "
        f"{batch + 1} (no output)"
    )
