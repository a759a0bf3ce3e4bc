"""map_async / flat_map_async on Arrow batches (the code Spark's mapInArrow runs): calls of a
batch run concurrently up to the capacity on the worker's event loop, each with its timeout and
retries; a record whose calls all fail is dead-lettered with the attempts and the last
exception while the rest go on; outputs in input or completion order, each with its own
input's carried columns; a service down for every call stops the job by the step's bounds."""

from __future__ import annotations

import asyncio
from datetime import timedelta

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from stateful_runtime import CheckpointConfig, StreamJob
from stateful_runtime.calls import AsyncCall, RetryPolicy
from stateful_runtime.exceptions import ConfigError, UserFunctionError
from stateful_runtime.job import ErrorPolicy
from stateful_runtime.operators.isolation import ORIGIN_OFFSET, StepGuard
from stateful_runtime.operators.maps import AsyncMapOperator
from tests.operators.map_batches import CARRIED, NO_BOUND, OUT, batch

FAST = RetryPolicy(max_attempts=3, backoff=timedelta(milliseconds=1))


def operator(fn, call: AsyncCall, flat: bool = False, errors: ErrorPolicy = NO_BOUND):
    guard = StepGuard("score", "payments", errors, None)
    return AsyncMapOperator("score", fn, flat, ["user", "n"], OUT, CARRIED, call, guard)


class Service:
    """A service a call awaits: ``delay`` seconds an answer; counts the calls in flight."""

    def __init__(self, delay: float = 0.0, fails: dict[int, int] | None = None) -> None:
        self.delay, self.fails = delay, dict(fails or {})
        self.in_flight = self.most = self.calls = 0

    async def __call__(self, record):
        self.calls += 1
        self.in_flight += 1
        self.most = max(self.most, self.in_flight)
        try:
            await asyncio.sleep(self.delay * (record["n"] % 3 + 1))
            left = self.fails.get(record["n"], 0)
            if left:
                self.fails[record["n"]] = left - 1
                raise ConnectionError(f"refused n={record['n']}")
            return {"user": record["user"], "k": record["n"] * 10}
        finally:
            self.in_flight -= 1


def test_calls_run_concurrently_up_to_the_capacity_and_keep_input_order():
    service = Service(delay=0.002)
    op = operator(service, AsyncCall(capacity=7))
    rows = [(f"u{i}", i, 1000 + i) for i in range(60)]
    out = op.apply(batch(rows)).to_pydict()
    assert service.most == 7 and service.calls == 60
    assert out["k"] == [i * 10 for i in range(60)]
    assert out[ORIGIN_OFFSET] == [100 + i for i in range(60)]
    times = pa.array(out["_event_time"], pa.timestamp("us", "UTC")).cast(pa.int64()).to_pylist()
    assert times == [1000 + i for i in range(60)]


def test_unordered_outputs_come_in_completion_order_each_with_its_own_columns():
    service = Service(delay=0.003)  # n % 3 == 0 answers first, then 1, then 2
    op = operator(service, AsyncCall(capacity=100, ordered=False))
    out = op.apply(batch([(f"u{i}", i, i) for i in range(9)])).to_pydict()
    assert sorted(out["k"]) == [i * 10 for i in range(9)]
    assert [k // 10 % 3 for k in out["k"]] == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert out[ORIGIN_OFFSET] == [100 + k // 10 for k in out["k"]]


@settings(max_examples=25, deadline=None)
@given(
    fails=st.dictionaries(st.integers(0, 19), st.integers(0, 4), max_size=10),
    attempts=st.integers(1, 4),
    ordered=st.booleans(),
)
def test_a_call_is_retried_and_a_record_that_keeps_failing_is_dead_lettered(
    fails, attempts, ordered
):
    service = Service(fails=fails)
    retry = RetryPolicy(max_attempts=attempts, backoff=timedelta(milliseconds=1))
    op = operator(service, AsyncCall(capacity=4, retry=retry, ordered=ordered))
    out = op.apply(batch([(f"u{i}", i, i) for i in range(20)])).to_pydict()
    lost = sorted(n for n, f in fails.items() if f >= attempts)
    assert sorted(out["k"]) == [i * 10 for i in range(20) if i not in lost]
    if ordered:
        assert out["k"] == [i * 10 for i in range(20) if i not in lost]
    rejected = op.guard.rejected_records
    assert sorted(o - 100 for _, _, _, o in rejected) == lost
    for _, reason, _, _ in rejected:
        assert f"the map_async function failed {attempts} time(s)" in reason
        assert "ConnectionError: refused" in reason
    assert service.calls == sum(min(fails.get(i, 0), attempts - 1) + 1 for i in range(20))


def test_a_call_past_its_timeout_is_retried_then_dead_lettered_and_a_flat_map_too():
    async def slow_for_two(record):
        if record["n"] == 2:
            await asyncio.sleep(5)
        return [{"user": record["user"], "k": record["n"]}] * record["n"]

    call = AsyncCall(capacity=10, timeout_s=0.05, retry=FAST)
    op = operator(slow_for_two, call, flat=True)
    out = op.apply(batch([("a", 1, 1), ("b", 2, 2), ("c", 3, 3)])).to_pydict()
    assert out["k"] == [1, 3, 3, 3] and out[ORIGIN_OFFSET] == [100, 102, 102, 102]
    [(_, reason, _, offset)] = op.guard.rejected_records
    assert offset == 101
    assert "failed 3 time(s), last: TimeoutError: no answer within 0.05 s" in reason


def test_an_exception_the_policy_does_not_retry_fails_at_once():
    service = Service(fails={1: 5})
    retry = RetryPolicy(max_attempts=5, retry_on=(TimeoutError,))
    op = operator(service, AsyncCall(retry=retry))
    assert op.apply(batch([("a", 1, 1), ("b", 2, 2)])).to_pydict()["k"] == [20]
    assert service.calls == 2
    assert "failed 1 time(s)" in op.guard.rejected_records[0][1]


def test_a_service_down_for_every_call_stops_the_job():
    service = Service(fails={n: 99 for n in range(50)})
    op = operator(service, AsyncCall(retry=FAST), errors=ErrorPolicy())
    with pytest.raises(UserFunctionError, match=r"max_fraction") as stopped:
        list(op(iter([batch([(f"u{i}", i, i) for i in range(50)])])))
    assert "the service is down or refusing" in str(stopped.value)
    assert "replayed when it runs again" in str(stopped.value)


def test_the_rate_caps_call_starts_and_the_loop_outlives_a_batch():
    starts: list[float] = []
    loops: set[int] = set()

    async def stamp(record):
        loop = asyncio.get_running_loop()
        starts.append(loop.time())
        loops.add(id(loop))
        return {"user": record["user"], "k": record["n"]}

    op = operator(stamp, AsyncCall(capacity=50, rate_per_s=200))
    for _ in range(2):
        op.apply(batch([(f"u{i}", i, i) for i in range(10)]))
    # 10 starts at 200 a second span at least 9/200 s (a lower bound: a slow machine only
    # spreads them more), less the loop's timer resolution
    assert starts[9] - starts[0] >= 0.04 and starts[19] - starts[10] >= 0.04
    assert len(loops) == 1  # clients made on the loop serve the worker's later batches


def test_map_async_takes_an_async_function_and_map_a_plain_one(tmp_path):
    from stateful_runtime import LogSource, WatermarkStrategy

    job = StreamJob("j", CheckpointConfig(str(tmp_path / "ck")))
    s = job.from_source(
        LogSource(str(tmp_path), "t", {"user": str, "n": int}),
        WatermarkStrategy.for_bounded_out_of_orderness(timedelta(0)).with_timestamp_field("n"),
        name="t",
    )

    async def score(record):
        return record

    with pytest.raises(ConfigError, match="map_async takes an async def function"):
        s.map_async(lambda r: r)
    with pytest.raises(ConfigError, match="use map_async for an async def"):
        s.map(score)
    with pytest.raises(ConfigError, match="capacity"):
        s.map_async(score, capacity=0)
    with pytest.raises(ConfigError, match="timeout"):
        s.map_async(score, timeout=-1)
    node = s.map_async(Service(), capacity=8, timeout=timedelta(seconds=2)).node
    assert node.kind == "map_async" and node.call == AsyncCall(8, 2.0)
