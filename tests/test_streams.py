"""The DataStream API."""

from __future__ import annotations

from datetime import timedelta

import pytest

from stateful_runtime import Count, TumblingEventTimeWindows
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
