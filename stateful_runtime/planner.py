"""Planner: turns a job graph into the plan of its Spark Structured Streaming queries, as data.

The plan says, per query, which nodes it runs, the path chosen for its stateful operator and
why, its sinks and what each takes from the query's output, and the state's layout (what a
savepoint's fingerprint compares). Nothing here touches Spark: the runtime builds each query's
DataFrame from this data (:mod:`stateful_runtime.runtime.dataframes`), writes its batches
(:mod:`stateful_runtime.runtime.batch_writes`) and renders it for ``srt explain``
(:mod:`stateful_runtime.runtime.explain`).

One query per stateful pipeline: a keyed process function and all the sinks of its main and side
outputs share one query (its foreachBatch writes every output of a micro-batch); a window or
stateless chain gets one query per sink. The first query reading a source owns its dead
letters: its read tasks stage rejected records under ``<checkpoint.dir>/_dead_letters/<source>``
and the job process publishes them once their batch commits
(:mod:`stateful_runtime.connectors.dead_letters`); no second query reads the source. Each query
has its own checkpoint directory ``<checkpoint.dir>/<query name>`` in which Spark commits source
offsets, state and the watermark together per micro-batch.

Windows are one node in the graph (:class:`~stateful_runtime.streams.WindowNode`); the planner
alone decides how each runs (:func:`native_window_reason`). Paths:

* ``native``: a window that needs nothing beyond Spark's semantics (tumbling, sliding or session
  event-time windows with built-in aggregates, fired by the watermark) compiles to
  ``groupBy(window(...))`` or ``groupBy(session_window(...))`` running in the JVM on the RocksDB
  state store — the fast path.
* ``process``: a keyed process function (connected streams, broadcast state and the joins too),
  in the Python worker over whole Arrow batches, its state and timers in the worker's RocksDB,
  versioned with each batch (:mod:`stateful_runtime.operators.arrow_keyed`).
* ``window``: any other window (a user aggregate or window function, global + count trigger,
  allowed lateness, late side output, early firing) on the runtime's window operator, itself a
  keyed process function.
* ``stateless``: filters and maps straight to a sink.

``map`` / ``flat_map`` run on any path before its stateful operator, as Spark's ``mapInArrow``
over whole Arrow batches (:mod:`stateful_runtime.operators.maps`), keeping each record's event
time and the watermark.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Any

from stateful_runtime.checkpoints.layout import CheckpointLayout
from stateful_runtime.connectors.dead_letters import DeadLetters, StepDeadLetters
from stateful_runtime.exceptions import PlanError
from stateful_runtime.functions import (
    BroadcastProcess,
    CoProcess,
    OutputTag,
    defines_on_timer,
    function_name,
)
from stateful_runtime.job import ErrorPolicy, RocksDBMemory
from stateful_runtime.joins import JoinOperator
from stateful_runtime.operators.keyed import describe_states, has_ttl
from stateful_runtime.operators.window import WindowOperator
from stateful_runtime.state import TimeDomain
from stateful_runtime.streams import (
    FilterNode,
    KeyByNode,
    MapNode,
    Node,
    ProcessNode,
    SideOutputNode,
    SinkNode,
    SourceNode,
    UnionNode,
    WindowNode,
    record_schema,
)
from stateful_runtime.windows import (
    EventTimeSessionWindows,
    SlidingEventTimeWindows,
    TumblingEventTimeWindows,
)

if TYPE_CHECKING:
    from stateful_runtime.aggregates import Aggregate
    from stateful_runtime.connectors.base import KeyPlacement, Sink
    from stateful_runtime.job import StreamJob


NativeAssigner = TumblingEventTimeWindows | SlidingEventTimeWindows | EventTimeSessionWindows


class QueryPath(StrEnum):
    """How a query's stateful operator runs (``explain`` shows it with the reason)."""

    NATIVE = "native"  # Spark's groupBy(window | session_window) in the JVM
    PROCESS = "process"  # a keyed process function, state in the worker's RocksDB
    WINDOW = "window"  # the runtime's window operator, itself a keyed process function
    STATELESS = "stateless"  # filters and maps straight to the sinks


@dataclass(frozen=True)
class NativeWindowNode:
    """A window the planner compiles to Spark's native ``groupBy(window)`` or
    ``groupBy(session_window)`` (JVM speed)."""

    parent: KeyByNode
    assigner: NativeAssigner
    aggregates: Mapping[str, Aggregate]
    name: str

    @property
    def session(self) -> bool:
        return isinstance(self.assigner, EventTimeSessionWindows)


PlannedNode = Node | NativeWindowNode


def native_window_reason(node: WindowNode) -> str | None:
    """Why ``node`` cannot run on Spark's native window aggregation (None: it can)."""
    needs = []
    if not isinstance(node.assigner, NativeAssigner):
        needs.append(node.assigner.describe())
    if not isinstance(node.contents, Mapping):
        needs.append(f"a {type(node.contents).__name__}")
    if node.lateness:
        needs.append("allowed lateness")
    if node.late_tag is not None:
        needs.append("a late side output")
    if node.trigger is not None:
        needs.append("a custom trigger")
    return ", ".join(needs) or None


def _lower(node: Node) -> PlannedNode:
    """The planner's one decision on windows: Spark's native aggregation when nothing more is
    needed, else the runtime's window operator (a keyed process function)."""
    if not isinstance(node, WindowNode):
        return node
    if native_window_reason(node) is None:
        assert isinstance(node.assigner, NativeAssigner)
        assert isinstance(node.contents, Mapping)
        return NativeWindowNode(node.parent, node.assigner, dict(node.contents), node.name)
    operator = WindowOperator(
        node.assigner,
        node.parent.keys,
        node.contents,
        node.output_schema,
        allowed_lateness=node.lateness,
        late_tag=node.late_tag,
        trigger=node.trigger,
    )
    return ProcessNode(node.parent, operator, node.name)


@dataclass(frozen=True)
class QueryOutput:
    """One sink of a query and which of the query's rows it takes.

    Attributes:
        name: the sink's stable name.
        sink: the sink.
        side: on a process path, the side output the sink takes (None: the function's main
            output, or every row of a query without a process function).
    """

    name: str
    sink: Sink
    side: OutputTag | None = None


@dataclass(frozen=True)
class QueryInput:
    """One source a query reads, with the steps its records take before a union.

    Attributes:
        source: the source node.
        nodes: filters and maps on this input before the union (empty without one).
        dead_letters: the source's dead letters when this query owns them (the first query
            reading the source), else None.
        index: the source's place in Spark's offset log of the query (``offsets/N`` holds one
            line per source, in the order of the inputs).
    """

    source: SourceNode
    nodes: tuple[PlannedNode, ...] = ()
    dead_letters: DeadLetters | None = None
    index: int = 0


@dataclass(frozen=True)
class QueryPlan:
    """One Spark streaming query of a job, as data.

    Attributes:
        name: the query's name (and its checkpoint directory's).
        inputs: the sources the query reads (more than one: a union), each with its steps
            before the union and its dead letters.
        nodes: what runs between the source (or the union of the inputs) and the sinks, in
            order (windows lowered to :class:`NativeWindowNode` or to the window operator's
            :class:`ProcessNode`).
        outputs: the query's sinks.
        path: how its stateful operator runs; ``reason``: why that path.
        output_mode: Spark's output mode (``update`` when an upsert sink takes every update
            of an open native window, else ``append``).
        step_dead_letters: where the query's steps stage the records they reject, published
            to the source's dead-letter topic (every query has its own).
        errors: what a step does with a record it cannot process (the job's).
        parallelism: the job's state partitions (and a partitioned sink's default).
        rocksdb: the memory of the keyed state's RocksDB in a worker (``StreamJob.rocksdb``).
    """

    name: str
    inputs: tuple[QueryInput, ...]
    nodes: tuple[PlannedNode, ...]
    outputs: tuple[QueryOutput, ...]
    path: QueryPath
    reason: str
    output_mode: str
    parallelism: int
    step_dead_letters: StepDeadLetters | None = None
    errors: ErrorPolicy = field(default_factory=ErrorPolicy)
    rocksdb: RocksDBMemory = field(default_factory=RocksDBMemory.default)
    # False for a checkpoint written before the runtime kept each input's watermark with the
    # batch (runtime/input_watermarks.py): the query runs as it was written
    input_watermarks: bool = True
    # True for a checkpoint written when a process function whose timers can emit carried the
    # watermark's branch (watermark_carrier) instead of reading the event-time ticks: the
    # query runs as it was written
    watermark_carrier_kept: bool = False
    # Whether a checkpoint written before now reads the event-time ticks, None for as planned
    # (ticks): True, written by a function whose timers could emit then (it reads them
    # still); False, written before a function whose only timers are event-time TTL's
    # cleanups read them (it reads none still: runtime/final_timers.py fires those at the end
    # of a bounded run)
    event_ticks_written: bool | None = None
    # The source's placement when its records are in the partitions that keep their keys'
    # state (copartitioning): see by_partition
    copartitioned: KeyPlacement | None = None
    # Whether the copartitioned source's records need nothing of Spark's before the keyed
    # operator (no filter, an event time read as Spark reads it): see keyed_read
    keyed_read_fits: bool = False

    @property
    def by_partition(self) -> bool:
        """Whether the keyed operator reads its source's partition in the task that keeps its
        state, read, decode and operator one Spark stage without a shuffle: a source placed
        by the key groups of the job's key into as many partitions as the query's state
        partitions (``copartitioned``), and no watermark's branch (which reads the shuffle).
        Timer ticks come in as splits of their own after the source's
        (``runtime/dataframes.py``)."""
        return self.copartitioned is not None and not self.watermark_carrier

    @property
    def keyed_read(self) -> bool:
        """Whether the keyed operator runs inside its source's read, in the same Python task
        (:mod:`stateful_runtime.operators.keyed_read`): a source read ``by_partition`` whose
        records reach the operator with nothing of Spark's between them (no filter)."""
        return self.by_partition and self.keyed_read_fits and self.process is not None

    @property
    def spark_state(self) -> bool:
        """Whether Spark's own state store (its RocksDB, in the JVM) holds part of the
        query's state: a native window, or the watermark carrier's deduplication."""
        return self.watermark_carrier or any(isinstance(n, NativeWindowNode) for n in self.nodes)

    @property
    def watermark_carrier(self) -> bool:
        """Whether the query carries the branch that makes Spark run a batch when the
        watermark moved (``runtime/dataframes.py``): only a checkpoint written with it does."""
        return self.process is not None and self.watermark_carrier_kept

    @property
    def ticks(self) -> TimeDomain | None:
        """The time domain of the timer ticks the query reads (``operators/ticks.py``: a
        source whose offset moves when one of the process function's timers is due, so Spark
        runs that batch), None when it reads none: a function in processing time, or one in
        event time with timers (:func:`~stateful_runtime.functions.defines_on_timer`, or state
        with event-time TTL, whose cleanups are timers), unless its checkpoint was written
        otherwise (the watermark's branch, ``event_ticks_written``)."""
        proc = self.process
        if proc is None:
            return None
        fn = proc.function
        if fn.time_domain is TimeDomain.PROCESSING_TIME:
            return TimeDomain.PROCESSING_TIME
        if self.watermark_carrier_kept:
            return None
        ticked = self.event_ticks_written
        if ticked is None:
            ticked = defines_on_timer(fn) or has_ttl(fn)
        return TimeDomain.EVENT_TIME if ticked else None

    @property
    def source(self) -> SourceNode:
        """The (first) source the query reads."""
        return self.inputs[0].source

    @property
    def dead_letters(self) -> DeadLetters | None:
        """The (first) source's dead letters when this query owns them, else None."""
        return self.inputs[0].dead_letters

    @property
    def source_names(self) -> list[str]:
        return [i.source.name for i in self.inputs]

    @property
    def union(self) -> bool:
        """The query reads more than one source (a union)."""
        return len(self.inputs) > 1

    @property
    def stateful_operators(self) -> list[str]:
        return [n.name for n in self.nodes if isinstance(n, NativeWindowNode | ProcessNode)]

    @property
    def state_layout(self) -> dict[str, dict]:
        """Operator name -> what its state looks like (kind, key fields, state name ->
        signature): the part of a savepoint's fingerprint that decides whether new code can
        restore it."""
        return {
            n.name: state_layout(n)
            for n in self.nodes
            if isinstance(n, NativeWindowNode | ProcessNode)
        }

    @property
    def process(self) -> ProcessNode | None:
        """The query's process function (a process or window path), else None."""
        last = self.nodes[-1] if self.nodes else None
        return last if isinstance(last, ProcessNode) else None


@dataclass(frozen=True)
class Plan:
    """The job and its planned queries."""

    job: StreamJob
    queries: list[QueryPlan] = field(default_factory=list)


def chain(node: Node) -> list[Node]:
    """The nodes from the source (or the union of several) down to ``node``."""
    out: list[Node] = []
    cur: Node | None = node
    while cur is not None:
        out.append(cur)
        cur = None if isinstance(cur, UnionNode) else getattr(cur, "parent", None)
    return out[::-1]


def _type_name(t: object) -> str:
    return getattr(t, "__name__", None) or repr(t)


def _state_signature(desc: object) -> str:
    """A descriptor as restore compatibility sees it: kind, types and TTL clock (not its
    duration, which may change between runs)."""
    from stateful_runtime.state import MapStateDescriptor

    if isinstance(desc, MapStateDescriptor):
        types = f"{_type_name(desc.key_type)}, {_type_name(desc.value_type)}"
    else:
        types = _type_name(getattr(desc, "type", object))
    ttl = getattr(desc, "ttl", None)
    clock = f" ttl:{ttl.time_domain.value}" if ttl else ""
    return f"{desc.kind}<{types}>{clock}"  # type: ignore[attr-defined]


def native_aggregates(node: NativeWindowNode) -> str:
    """A native window's aggregates as its state signature: each with the type its state
    keeps where that is not the input's (``sum(amount) in decimal(38,0)``), so a checkpoint
    whose state holds another type is refused by name, not by Spark's state schema check."""
    types = {f.name: f.dataType for f in record_schema(node.parent).fields}
    out = []
    for k, a in node.aggregates.items():
        acc = a.accumulator(types.get(a.field or ""))
        out.append(f"{k}={a.describe()}" + (f" in {acc}" if acc else ""))
    return ", ".join(out)


def _key_types(keyed: Any) -> list[str] | None:
    """The types of a keyed stream's key fields (None where the records' schema is not known
    here): a key is stored as its values, so the same name with another type is another key."""
    try:
        types = {f.name: f.dataType.simpleString() for f in record_schema(keyed).fields}
    except AttributeError:
        return None
    if not all(k in types for k in keyed.keys):
        return None
    return [types[k] for k in keyed.keys]


def state_layout(node: NativeWindowNode | ProcessNode) -> dict:
    """Kind, key fields (names and types) and named states of one stateful operator."""
    keys = list(node.parent.keys)
    key_types = _key_types(node.parent)
    typed = {"key_types": key_types} if key_types is not None else {}
    if isinstance(node, NativeWindowNode):
        # Spark keeps one state row per (window, key) whose schema follows every aggregate.
        return {
            "kind": "native-window",
            "keys": keys,
            **typed,
            "states": {"window": f"{node.assigner.describe()}: " + native_aggregates(node)},
        }
    fn = node.function
    kind = (
        "window"
        if isinstance(fn, WindowOperator)
        else "broadcast-process"
        if isinstance(fn, BroadcastProcess)
        else fn.connected.kind.replace(" ", "-")
        if isinstance(fn, CoProcess) and isinstance(fn.connected, JoinOperator)
        else "co-process"
        if isinstance(fn, CoProcess)
        else "process"
    )
    states = {d.name: _state_signature(d) for d in describe_states(fn)}
    if isinstance(fn, BroadcastProcess):
        states.update(
            {name: "broadcast " + _state_signature(d) for name, d in fn.descriptors.items()}
        )
    return {"kind": kind, "keys": keys, **typed, "function": function_name(fn), "states": states}


@dataclass
class _Pipeline:
    """What the planner gathers for one query before building it."""

    name: str
    inputs: list[tuple[SourceNode, tuple[PlannedNode, ...]]]
    nodes: list[Node | NativeWindowNode]
    sinks: list[tuple[SinkNode, SideOutputNode | None]] = field(default_factory=list)


def _inputs(first: PlannedNode, sink: str) -> list[tuple[SourceNode, tuple[PlannedNode, ...]]]:
    """Each source a query reads, with the steps on it before the union (if any)."""
    if not isinstance(first, UnionNode):
        if not isinstance(first, SourceNode):
            raise PlanError(f"sink {sink!r} is not connected to a source")
        return [(first, ())]
    out: list[tuple[SourceNode, tuple[PlannedNode, ...]]] = []
    for start in first.inputs:
        nodes: list[PlannedNode] = list(chain(start))
        src = nodes[0]
        if not isinstance(src, SourceNode):
            raise PlanError(f"sink {sink!r} is not connected to a source")
        out.append((src, tuple(nodes[1:])))
    return out


def _split(sink_node: SinkNode) -> tuple[str, _Pipeline, SideOutputNode | None]:
    nodes = [_lower(n) for n in chain(sink_node.parent)]
    inputs = _inputs(nodes[0], sink_node.name)
    side = nodes[-1] if isinstance(nodes[-1], SideOutputNode) else None
    body = nodes[1:-1] if side else nodes[1:]
    procs = [n for n in body if isinstance(n, ProcessNode)]
    if procs:
        proc = procs[0]
        if body[-1] is not proc:
            raise PlanError(
                f"operator {proc.name!r}: only sink_to() and get_side_output() may follow a "
                f"process function in this version; sink its output and read it back"
            )
        return proc.name, _Pipeline(proc.name, inputs, body), side
    return sink_node.name, _Pipeline(sink_node.name, inputs, body), None


_KEYED_STATE = (
    "in the Python worker over whole Arrow batches (mapInArrow), named state and timers in the "
    "worker's RocksDB, versioned with each batch"
)


def _path(nodes: tuple[PlannedNode, ...]) -> tuple[QueryPath, str]:
    """The path of a query's stateful operator (its last), and why."""
    where = _KEYED_STATE
    for node in reversed(nodes):
        if isinstance(node, NativeWindowNode):
            return QueryPath.NATIVE, (
                f"{node.assigner.describe()} with built-in aggregates and no allowed "
                f"lateness, side output or custom trigger: Spark's groupBy("
                f"{'session_window' if node.session else 'window'}) in the JVM, state in "
                f"RocksDB"
            )
        if isinstance(node, ProcessNode):
            if isinstance(node.function, WindowOperator):
                return QueryPath.WINDOW, (
                    f"the window needs {node.function.needs()}: the runtime's window "
                    f"operator, a keyed process function {where}"
                )
            if isinstance(node.function, BroadcastProcess):
                return QueryPath.PROCESS, (
                    "keyed broadcast process function: the keyed stream and the broadcast "
                    "stream as one, each broadcast element copied to every state partition "
                    "and processed there before the batch's keyed elements; broadcast state "
                    "in every key group of the worker's RocksDB"
                )
            if isinstance(node.function, CoProcess) and isinstance(
                node.function.connected, JoinOperator
            ):
                return QueryPath.PROCESS, (
                    f"{node.function.connected.kind} on connected streams: the two inputs as "
                    "one (tagged, keyed), each side buffered in keyed map state by event time "
                    "and cleaned by event-time timers as the watermark passes; not Spark's "
                    "own stream-stream join, which has no late side output and counts late "
                    "rows per operator, not per source"
                )
            if isinstance(node.function, CoProcess):
                return QueryPath.PROCESS, (
                    "keyed co-process function: the two connected streams as one (each record "
                    "tagged with its input and carrying both inputs' columns), keyed, each "
                    "element handed to process_element1 or 2 by its input; shared state and "
                    f"timers as a keyed process function's, {where}"
                )
            return QueryPath.PROCESS, f"keyed process function {where}"
    if any(isinstance(n, MapNode) for n in nodes):
        return (
            QueryPath.STATELESS,
            "no stateful operator: records pass through the map(s) to the sink",
        )
    return QueryPath.STATELESS, "no stateful operator: records pass straight to the sink"


def _query(job: StreamJob, p: _Pipeline, inputs: tuple[QueryInput, ...]) -> QueryPlan:
    nodes = tuple(p.nodes)
    path, reason = _path(nodes)
    if any(isinstance(n, MapNode) for i in inputs for n in i.nodes) and reason.startswith(
        "no stateful operator: records pass straight"
    ):
        reason = "no stateful operator: records pass through the map(s) to the sink"
    outputs = tuple(
        QueryOutput(
            sink_node.name,
            sink_node.sink,
            side.tag
            if side is not None and path in (QueryPath.PROCESS, QueryPath.WINDOW)
            else None,
        )
        for sink_node, side in p.sinks
    )
    output_mode = "append"
    if path is QueryPath.NATIVE:
        # Sessions are emitted once, closed: an open session's start moves when it merges with
        # an earlier one, so its earlier updates would stay behind in an upsert sink as rows
        # of their own.
        native = next(n for n in reversed(nodes) if isinstance(n, NativeWindowNode))
        if outputs[0].sink.upsert and not native.session:
            output_mode = "update"
    layout = CheckpointLayout(Path(job.checkpoint.dir).resolve())
    steps = StepDeadLetters(
        str(layout.step_dead_letters(p.name)), inputs[0].source.source.dead_letter_sink(job.name)
    )
    placement, why, fits = _copartitioning(nodes, inputs, job.parallelism)
    return QueryPlan(
        p.name,
        inputs,
        nodes,
        outputs,
        path,
        f"{reason}; {why}" if why else reason,
        output_mode,
        job.parallelism,
        steps,
        job.errors,
        job.rocksdb,
        copartitioned=placement,
        keyed_read_fits=fits,
    )


def _copartitioning(
    nodes: tuple[PlannedNode, ...], inputs: tuple[QueryInput, ...], parallelism: int
) -> tuple[KeyPlacement | None, str, bool]:
    """Whether a keyed operator's source is placed by its key groups (``QueryPlan.
    by_partition``), what to say of it (why its records are not shuffled, or what keeps a
    source placed by a key from being read so), and whether the operator can run in the
    source's read (``QueryPlan.keyed_read``)."""
    proc = next((n for n in reversed(nodes) if isinstance(n, ProcessNode)), None)
    if proc is None or len(inputs) != 1 or isinstance(proc.function, BroadcastProcess):
        return None, "", False
    placement = inputs[0].source.source.key_placement()
    if placement is None:
        return None, "", False
    keys = tuple(proc.parent.keys) if isinstance(proc.parent, KeyByNode) else ()
    schema = inputs[0].source.source.schema
    field_type = (
        schema[placement.field].dataType.simpleString()
        if placement.field in schema.fieldNames()
        else None
    )
    steps = [*inputs[0].nodes, *nodes[: nodes.index(proc)]]
    where = f"{placement.where} is placed by the key groups of {placement.field!r}"
    if keys != (placement.field,):
        return None, f"{where}, not of the job's key {list(keys)}: records are shuffled", False
    if field_type != placement.spark_type:
        return (
            None,
            (
                f"{where} as a {placement.spark_type}, the job reads it as a {field_type}: "
                f"records are shuffled"
            ),
            False,
        )
    if any(not isinstance(n, (FilterNode, KeyByNode)) for n in steps):
        return None, f"{where}, but a map before the key may change it: records are shuffled", False
    if placement.partitions != parallelism:
        return (
            None,
            (
                f"{where} into {placement.partitions} partitions, the job has {parallelism} state "
                f"partitions (parallelism): records are shuffled; parallelism="
                f"{placement.partitions} reads each partition in the task that keeps its state"
            ),
            False,
        )
    read = (
        f"{where} into as many partitions as the job's state partitions: each partition is "
        f"read, decoded and processed in one task, without a shuffle"
    )
    wm = inputs[0].source.watermark
    time_type = (
        schema[wm.timestamp_field].dataType.simpleString()
        if wm.timestamp_field in schema.fieldNames()
        else None
    )
    if any(isinstance(n, FilterNode) for n in steps):
        return (
            placement,
            f"{read}; the filter before the key runs in Spark, between the read's Python "
            f"worker and the operator's",
            False,
        )
    if not (
        time_type == "timestamp" or (time_type in _INTEGERS and wm.timestamp_unit in ("ms", "s"))
    ):
        return (
            placement,
            (
                f"{read}; an event time of type {time_type} ({wm.timestamp_unit}) is read by "
                f"Spark, between the read's Python worker and the operator's"
            ),
            False,
        )
    return placement, f"{read}, the operator in the read's own Python worker", True


_INTEGERS = ("tinyint", "smallint", "int", "bigint")


def plan(job: StreamJob) -> Plan:
    """Plan every sink of ``job`` into Spark queries; the first query reading a source owns
    its dead letters (:mod:`stateful_runtime.connectors.dead_letters`)."""
    pipelines: dict[str, _Pipeline] = {}
    for sink_node in job.sinks:
        name, pipeline, side = _split(sink_node)
        pipelines.setdefault(name, pipeline).sinks.append((sink_node, side))
    queries = []
    owners: set[int] = set()
    layout = CheckpointLayout(Path(job.checkpoint.dir).resolve())
    for p in pipelines.values():
        inputs = []
        for index, (src, before) in enumerate(p.inputs):
            # The first query reading a source owns its dead letters (one writer per topic).
            dead_letters = None
            if id(src) not in owners:
                owners.add(id(src))
                dead_letters = DeadLetters(
                    str(layout.dead_letters(src.name)), src.source.dead_letter_sink(job.name), index
                )
            inputs.append(QueryInput(src, before, dead_letters, index))
        queries.append(_query(job, p, tuple(inputs)))
    names = [q.name for q in queries]
    if len(set(names)) != len(names):
        raise PlanError(f"query names collide: {names}; rename a sink, operator or source")
    return Plan(job, queries)
