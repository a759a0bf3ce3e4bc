"""The DataStream API."""

from __future__ import annotations

from datetime import timedelta

import pytest

from stateful_runtime import Count, OutputTag, TumblingEventTimeWindows
from stateful_runtime.exceptions import ConfigError
from tests.helpers import windowed_job


def test_stateful_operators_need_names_and_outputs_must_not_clash(tmp_path):
    job = windowed_job(tmp_path)
    windowed = job.sources[0]
    from stateful_runtime.streams import DataStream

    keyed = (
        DataStream(job, windowed)
        .key_by("k")
        .window(TumblingEventTimeWindows.of(timedelta(seconds=1)))
    )
    with pytest.raises(ConfigError, match="operator name"):
        keyed.aggregate({"n": Count()}, name="")
    with pytest.raises(ConfigError, match="clash"):
        keyed.aggregate({"k": Count()}, name="x")


def _union_job(tmp_path):
    from stateful_runtime import LogSource, StreamJob, WatermarkStrategy
    from stateful_runtime.job import CheckpointConfig

    job = StreamJob("u", CheckpointConfig(str(tmp_path / "ck")))

    def source(name, schema, bound=5):
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(timedelta(seconds=bound))
        return job.from_source(
            LogSource(str(tmp_path / "log"), name, schema=schema),
            strategy.with_timestamp_field("ts"),
            name=name,
        )

    return job, source


def test_union_refuses_other_schemas_itself_and_a_source_twice_naming_what_differs(tmp_path):
    job, source = _union_job(tmp_path)
    a = source("a", {"k": str, "amount": int, "ts": int})
    b = source("b", {"k": str, "amount": float, "ts": int, "note": str})
    c = source("c", {"amount": int, "k": str, "ts": int})
    with pytest.raises(ConfigError, match=r"only the other has note string.*amount is bigint vs"):
        a.union(b)
    with pytest.raises(ConfigError, match="field order differs"):
        a.union(c)
    with pytest.raises(ConfigError, match="cannot be unioned with itself"):
        a.union(a)
    with pytest.raises(ConfigError, match="two inputs of the union read source 'a'"):
        a.filter("amount > 0").union(a.filter("amount < 0"))
    with pytest.raises(ConfigError, match="at least one"):
        a.union()
    keyed = a.key_by("k").window(TumblingEventTimeWindows.of(timedelta(seconds=1)))
    with pytest.raises(ConfigError, match="before any window or process function"):
        a.union(keyed.count(name="n"))


def test_union_of_unions_is_flat_and_plans_one_query_reading_every_source(tmp_path):
    from stateful_runtime.connectors.eventlog.sink import LogSink
    from stateful_runtime.planner import QueryPath, plan
    from stateful_runtime.streams import UnionNode

    job, source = _union_job(tmp_path)
    schema = {"k": str, "amount": int, "ts": int}
    a, b, c = source("a", schema), source("b", schema, bound=30), source("c", schema)
    doubled = b.map(lambda r: {**r, "amount": r["amount"] * 2}, name="double")
    u = a.union(doubled).union(c.filter("amount > 0"))
    assert isinstance(u.node, UnionNode) and len(u.node.inputs) == 3
    u.key_by("k").window(TumblingEventTimeWindows.of(timedelta(seconds=1))).count(name="n").sink_to(
        LogSink(str(tmp_path / "log"), "out"), name="out"
    )
    (q,) = plan(job).queries
    assert q.union and q.source_names == ["a", "b", "c"] and q.path is QueryPath.NATIVE
    assert [i.index for i in q.inputs] == [0, 1, 2]
    assert [type(n).__name__ for i in q.inputs for n in i.nodes] == ["MapNode", "FilterNode"]
    # Each input owns its source's dead letters, each read from its own line of offsets/N.
    assert [i.dead_letters.index for i in q.inputs if i.dead_letters] == [0, 1, 2]
    assert q.stateful_operators == ["n"]
    # explain: each input with its watermark, then the union and where its watermark comes from.
    from stateful_runtime.runtime.explain import steps

    lines = steps(q)
    assert [ln.split(":")[0] for ln in lines if ln.startswith("input ")] == [
        "input 1",
        "input 2",
        "input 3",
    ]
    assert any("bounded out-of-orderness 0:00:30" in ln for ln in lines)
    (union,) = [ln for ln in lines if ln.startswith("union of a, b, c")]
    assert "minimum of the inputs' watermarks" in union


class _Match:
    """A co-process function class built per test (its state's type a parameter)."""

    @staticmethod
    def make(state_type: type):
        from stateful_runtime import KeyedCoProcessFunction, ValueStateDescriptor

        class Match(KeyedCoProcessFunction):
            output_schema = {"k": str}

            def open(self, ctx):
                self.seen = ctx.get_state(ValueStateDescriptor("seen", state_type))

        return Match()


def test_connect_refuses_what_cannot_share_a_key_or_a_column_naming_it(tmp_path):
    job, source = _union_job(tmp_path)
    a = source("a", {"k": str, "amount": int, "ts": int})
    b = source("b", {"id": str, "amount": float, "ts": int})
    c = source("c", {"n": int, "ts": int})
    d = source("d", {"k": str, "id": str, "ts": int})
    fn = _Match.make(int)
    with pytest.raises(ConfigError, match=r"amount is bigint vs double.*map one stream"):
        a.key_by("k").connect(b.key_by("id")).process(fn, name="m")
    with pytest.raises(ConfigError, match=r"as many fields, of the same types: \(k string\) vs"):
        a.key_by("k").connect(c.key_by("n")).process(fn, name="m")
    with pytest.raises(ConfigError, match=r"second stream has field\(s\) \['k'\]"):
        a.key_by("k").connect(d.key_by("id")).process(fn, name="m")
    with pytest.raises(ConfigError, match="cannot be connected with itself"):
        a.key_by("k").connect(a.key_by("k")).process(fn, name="m")
    with pytest.raises(ConfigError, match="takes a KeyedCoProcessFunction"):
        a.key_by("k").connect(d.key_by("k")).process(object(), name="m")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="takes a KeyedStream"):
        a.key_by("k").connect(d)  # type: ignore[arg-type]


def _connected_plan(tmp_path, state_type: type):
    from stateful_runtime.connectors.eventlog.sink import LogSink
    from stateful_runtime.planner import plan

    job, source = _union_job(tmp_path)
    a = source("a", {"k": str, "amount": int, "ts": int})
    b = source("b", {"id": str, "note": str, "ts": int})
    c = source("c", {"id": str, "note": str, "ts": int})
    out = a.key_by("k").connect(b.union(c).key_by("id")).process(_Match.make(state_type), name="m")
    out.sink_to(LogSink(str(tmp_path / "log"), "out"), name="out")
    return plan(job)


def test_connected_streams_plan_one_query_whose_fingerprint_guards_their_state(tmp_path):
    from stateful_runtime.checkpoints.manifest import fingerprint
    from stateful_runtime.checkpoints.restore import compatibility
    from stateful_runtime.functions import CO_INPUT
    from stateful_runtime.streams import CoInputNode

    p = _connected_plan(tmp_path, int)
    [q] = p.queries
    assert q.source_names == ["a", "b", "c"] and q.path == "process"
    assert q.state_layout == {
        "m": {
            "kind": "co-process",
            "keys": ["k"],
            "key_types": ["string"],
            "function": "Match",
            "states": {"seen": "value<int>"},
        }
    }
    # The second input's records fill the first's key column and keep their own fields.
    steps = [n for i in q.inputs for n in i.nodes]
    assert all(isinstance(n, CoInputNode) for n in steps)
    assert [n.input for n in steps] == [1, 2, 2]
    assert dict(steps[1].columns) == {
        "k": "id",
        "amount": None,
        "ts": "ts",
        "id": "id",
        "note": "note",
    }
    assert CO_INPUT not in dict(steps[1].columns)
    saved = fingerprint("u", p.queries)
    bad, _ = compatibility(saved, fingerprint("u", _connected_plan(tmp_path, str).queries))
    assert bad == ["query m, operator m: state 'seen' was value<int>, is now value<str>"]


def test_broadcast_plans_the_rules_into_the_fingerprint_and_refuses_what_it_cannot_keep(tmp_path):
    from stateful_runtime import KeyedBroadcastProcessFunction, MapStateDescriptor, StateTtlConfig
    from stateful_runtime.connectors.eventlog.sink import LogSink
    from stateful_runtime.planner import plan

    class Rules(KeyedBroadcastProcessFunction):
        output_schema = {"k": str}

    rules_state = MapStateDescriptor("rules", str, dict)
    job, source = _union_job(tmp_path)
    a = source("a", {"k": str, "amount": int, "ts": int})
    r = source("r", {"rule": str, "ts": int})
    with pytest.raises(ConfigError, match="at least one MapStateDescriptor"):
        r.broadcast()
    with pytest.raises(ConfigError, match="has no TTL"):
        r.broadcast(MapStateDescriptor("x", str, int, ttl=StateTtlConfig(timedelta(seconds=1))))
    with pytest.raises(ConfigError, match="takes a KeyedBroadcastProcessFunction"):
        a.key_by("k").connect(r.broadcast(rules_state)).process(_Match.make(int), name="m")
    out = a.key_by("k").connect(r.broadcast(rules_state)).process(Rules(), name="m")
    out.sink_to(LogSink(str(tmp_path / "log"), "out"), name="out")
    [q] = plan(job).queries
    assert q.state_layout["m"]["kind"] == "broadcast-process"
    assert q.state_layout["m"]["states"] == {"rules": "broadcast map<str, dict>"}


def test_explain_names_each_input_the_call_its_records_go_to_and_the_shared_state(tmp_path):
    from stateful_runtime.runtime.explain import explain

    text = explain(_connected_plan(tmp_path, int))
    assert "connect: input 2 of the connected streams (its records tagged 2, for " in text
    assert "co-process m: Match in event_time: process_element1 ← input 1 (a); " in text
    assert "process_element2 ← input 2 (b+c); shared state and timers by key" in text


def test_joins_plan_as_connected_streams_whose_fingerprint_and_explain_name_the_join(tmp_path):
    from stateful_runtime import ProcessJoinFunction, TemporalJoinFunction
    from stateful_runtime.checkpoints.manifest import fingerprint
    from stateful_runtime.checkpoints.restore import compatibility
    from stateful_runtime.connectors.eventlog.sink import LogSink
    from stateful_runtime.planner import plan
    from stateful_runtime.runtime.explain import explain

    class Pair(ProcessJoinFunction):
        output_schema = {"k": str}

    class AsOf(TemporalJoinFunction):
        output_schema = {"k": str}

    def joined(lower: timedelta):
        job, source = _union_job(tmp_path)
        a = source("a", {"k": str, "amount": int, "ts": int})
        b = source("b", {"id": str, "note": str, "ts": int})
        a2 = source("a2", {"k": str, "amount": int, "ts": int})
        v = source("v", {"id": str, "tier": str, "ts": int})
        late = OutputTag("late-a", {"k": str})
        a.key_by("k").interval_join(b.key_by("id")).between(
            lower, timedelta(minutes=5)
        ).side_output_left_late_data(late).process(Pair(), name="pairs").sink_to(
            LogSink(str(tmp_path / "log"), "o1"), name="o1"
        )
        a2.key_by("k").temporal_join(v.key_by("id")).process(AsOf(), name="as-of").sink_to(
            LogSink(str(tmp_path / "log"), "o2"), name="o2"
        )
        return plan(job)

    p = joined(timedelta(minutes=-1))
    layouts = {name: layout for q in p.queries for name, layout in q.state_layout.items()}
    assert layouts == {
        "pairs": {
            "kind": "interval-join",
            "keys": ["k"],
            "key_types": ["string"],
            "function": "Pair",
            "states": {"left_buffer": "map<int, list>", "right_buffer": "map<int, list>"},
        },
        "as-of": {
            "kind": "temporal-join",
            "keys": ["k"],
            "key_types": ["string"],
            "function": "AsOf",
            "states": {"pending": "map<int, list>", "versions": "map<int, dict>"},
        },
    }
    text = explain(p)
    assert (
        "interval join pairs: Pair in event time: left ← input 1 (a); right ← input 2 (b); "
        "left.ts - 0:01:00 <= right.ts <= left.ts + 0:05:00"
    ) in text
    assert "late records → side output late-a (state: left_buffer:map, right_buffer:map)" in text
    assert "temporal join as-of: AsOf in event time: stream ← input 1 (a2); versions ← " in text
    assert "late records dropped, counted as late (state: pending:map, versions:map)" in text
    same, _ = compatibility(
        fingerprint("u", p.queries), fingerprint("u", joined(timedelta(0)).queries)
    )
    assert same == []


def test_window_join_plans_as_connected_streams_and_refuses_what_it_cannot_join(tmp_path):
    from stateful_runtime import (
        EventTimeSessionWindows,
        JoinFunction,
        SlidingEventTimeWindows,
    )
    from stateful_runtime.connectors.eventlog.sink import LogSink
    from stateful_runtime.planner import plan
    from stateful_runtime.runtime.explain import explain

    class Pair(JoinFunction):
        output_schema = {"k": str}

    job, source = _union_job(tmp_path)
    a = source("a", {"k": str, "amount": int, "ts": int})
    b = source("b", {"id": str, "note": str, "ts": int})
    with pytest.raises(ConfigError, match="where"):
        a.join(b).equal_to("id")
    with pytest.raises(ConfigError, match="use interval_join"):
        a.join(b).where("k").equal_to("id").window(
            EventTimeSessionWindows.with_gap(timedelta(minutes=1))
        )
    with pytest.raises(ConfigError, match="takes a JoinFunction"):
        a.join(b).where("k").equal_to("id").window(
            TumblingEventTimeWindows.of(timedelta(minutes=1))
        ).apply(_Match.make(int), name="w")
    windows = SlidingEventTimeWindows.of(timedelta(minutes=10), timedelta(minutes=5))
    out = a.join(b).where("k").equal_to("id").window(windows).apply(Pair(), name="w")
    out.sink_to(LogSink(str(tmp_path / "log"), "out"), name="out")
    p = plan(job)
    [q] = p.queries
    assert q.state_layout["w"] == {
        "kind": "window-join",
        "keys": ["k"],
        "key_types": ["string"],
        "function": "Pair",
        "states": {"windows": "map<int, list>"},
    }
    assert (
        "window join w: Pair in event time: first ← input 1 (a); second ← input 2 (b); "
        "sliding event-time windows of 0:10:00 every 0:05:00: each window's records"
    ) in explain(p)
