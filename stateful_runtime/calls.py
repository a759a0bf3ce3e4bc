"""Calling services from the stream: how a call is made (:class:`AsyncCall`, its
:class:`RetryPolicy`), the Python worker's event loop and the clients kept on it
(:func:`worker_resource`), the concurrent caller ``map_async`` runs a batch's calls with
(:class:`Caller`), and the keyed lookup with a cache in keyed state ``enrich_async`` runs
(:class:`AsyncLookup`).
"""

from __future__ import annotations

import asyncio
import bisect
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pyspark.sql.types import StructType

from stateful_runtime.contract import CALL_BUCKETS_MS, CallStats
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.functions import KeyedProcessFunction
from stateful_runtime.state import StateTtlConfig, TimeDomain, ValueStateDescriptor


def _seconds(name: str, value: timedelta | float | int | None) -> float | None:
    if value is None:
        return None
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    if isinstance(seconds, bool) or not isinstance(seconds, int | float) or seconds <= 0:
        raise ConfigError(f"{name}={value!r}: give a positive timedelta (or seconds)")
    return float(seconds)


@dataclass(frozen=True)
class RetryPolicy:
    """How ``map_async`` retries a call that raised or timed out: up to ``max_attempts`` calls
    in all, waiting ``backoff`` before the second, twice as long before each next one (at most
    ``max_backoff``); an exception not among ``retry_on`` is not retried. A record whose last
    attempt still fails is dead-lettered with the step, the attempts and the last exception.
    """

    max_attempts: int = 3
    backoff: timedelta = timedelta(milliseconds=100)
    max_backoff: timedelta = timedelta(seconds=5)
    retry_on: tuple[type[BaseException], ...] = (Exception,)

    def __post_init__(self) -> None:
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int):
            raise ConfigError(f"RetryPolicy(max_attempts={self.max_attempts!r}): give a count")
        if self.max_attempts < 1:
            raise ConfigError("RetryPolicy(max_attempts=...) must be >= 1 (1: no retry)")
        for name in ("backoff", "max_backoff"):
            if not isinstance(getattr(self, name), timedelta):
                raise ConfigError(f"RetryPolicy({name}=...) takes a timedelta")
        if not isinstance(self.retry_on, tuple) or not all(
            isinstance(t, type) and issubclass(t, BaseException) for t in self.retry_on
        ):
            raise ConfigError("RetryPolicy(retry_on=...) takes a tuple of exception classes")

    def wait_s(self, attempt: int) -> float:
        """Seconds to wait after failed attempt ``attempt`` (1-based)."""
        return min(
            self.backoff.total_seconds() * 2 ** (attempt - 1), self.max_backoff.total_seconds()
        )


@dataclass(frozen=True)
class AsyncCall:
    """How a ``map_async`` step calls its ``async def`` function: at most ``capacity`` calls
    in flight per parallel instance (a Python worker's task), each given ``timeout_s``, retried
    by ``retry``, at most ``rate_per_s`` started a second per instance (None: no limit), the
    outputs in input order (``ordered``) or in completion order within the batch."""

    capacity: int = 100
    timeout_s: float = 10.0
    retry: RetryPolicy = RetryPolicy()
    ordered: bool = True
    rate_per_s: float | None = None

    @staticmethod
    def of(
        capacity: int,
        timeout: timedelta | float,
        retry: RetryPolicy | None,
        ordered: bool,
        rate_per_s: float | None,
    ) -> AsyncCall:
        if isinstance(capacity, bool) or not isinstance(capacity, int) or capacity < 1:
            raise ConfigError(f"map_async(capacity={capacity!r}): give a count >= 1")
        if retry is not None and not isinstance(retry, RetryPolicy):
            raise ConfigError(f"map_async(retry={retry!r}): give a RetryPolicy")
        timeout_s = _seconds("map_async(timeout)", timeout)
        assert timeout_s is not None
        return AsyncCall(
            capacity,
            timeout_s,
            retry or RetryPolicy(),
            bool(ordered),
            _seconds("map_async(rate_per_s)", rate_per_s),
        )

    def describe(self) -> str:
        attempts = self.retry.max_attempts
        return (
            f"up to {self.capacity} calls in flight, {self.timeout_s:g} s each, "
            f"{attempts} attempt{'s' if attempts > 1 else ''}"
            + (f", at most {self.rate_per_s:g}/s" if self.rate_per_s else "")
            + (", in input order" if self.ordered else ", in completion order")
        )


_RESOURCES: dict[str, Any] = {}


def worker_resource(name: str, make: Callable[[], Any]) -> Any:
    """The Python worker's ``name`` resource, made by ``make()`` on first use and kept for the
    worker's life: a client a ``map_async`` function calls through (``aiohttp.ClientSession``, a
    connection pool), set up once per worker rather than per batch. (A job file's own globals
    do not last: Spark hands each task the function anew.)"""
    found = _RESOURCES.get(name)
    if found is None:
        found = _RESOURCES[name] = make()
    return found


def worker_loop() -> asyncio.AbstractEventLoop:
    """The Python worker's event loop, for as long as the worker lives: clients a function
    made on it (an HTTP client's connections, a database pool) serve its later batches."""
    global _LOOP
    if _LOOP is None or _LOOP.is_closed():
        _LOOP = asyncio.new_event_loop()
    return _LOOP


_LOOP: asyncio.AbstractEventLoop | None = None


class Tally:
    """A task's calls: counts and latency buckets (``contract.CallStats``)."""

    def __init__(self) -> None:
        self.calls = self.retries = self.failed = 0
        self.buckets = [0] * (len(CALL_BUCKETS_MS) + 1)

    def call(self, attempt: int, seconds: float) -> None:
        self.calls += 1
        self.retries += attempt > 1
        self.buckets[bisect.bisect_left(CALL_BUCKETS_MS, seconds * 1000)] += 1

    def stats(self) -> CallStats:
        return CallStats(self.calls, self.retries, self.failed, tuple(self.buckets))


class CallFailed(Exception):
    """An item whose every attempt failed: ``attempts`` made, ``last`` the last exception."""

    def __init__(self, attempts: int, last: BaseException) -> None:
        super().__init__(f"failed {attempts} time(s), last: {type(last).__name__}: {last}")
        self.attempts, self.last = attempts, last


class Caller:
    """Calls ``function(item)`` for many items at once on the worker's loop, as ``call``
    says (capacity, timeout, retries, rate), counting them in ``tally``."""

    def __init__(self, function: Callable[[Any], Any], call: AsyncCall, tally: Tally) -> None:
        self.function, self.call, self.tally = function, call, tally

    def run(self, items: list[Any]) -> tuple[list[Any], list[int], dict[int, CallFailed]]:
        """Every item's result (None where it failed), the items in completion order, and
        the failed ones."""
        results: list[Any] = [None] * len(items)
        done: list[int] = []
        failed: dict[int, CallFailed] = {}
        worker_loop().run_until_complete(self._all(items, results, done, failed))
        return results, done, failed

    async def _all(
        self, items: list[Any], results: list[Any], done: list[int], failed: dict
    ) -> None:
        todo = iter(enumerate(items))
        pace = _Pace(self.call.rate_per_s)

        async def caller() -> None:
            for i, item in todo:  # shared by the callers: each takes the next item
                try:
                    results[i] = await self._one(item, pace)
                except CallFailed as exc:
                    failed[i] = exc
                done.append(i)

        await asyncio.gather(*(caller() for _ in range(min(self.call.capacity, len(items)))))

    async def _one(self, item: Any, pace: _Pace) -> Any:
        retry, timeout, tally = self.call.retry, self.call.timeout_s, self.tally
        clock = asyncio.get_running_loop().time
        last: BaseException | None = None
        attempt = 0
        for attempt in range(1, retry.max_attempts + 1):
            if pace.gap:
                await pace.wait()
            started = clock()
            try:
                async with asyncio.timeout(timeout):  # (no task of its own, as wait_for makes)
                    result = await self.function(item)
                tally.call(attempt, clock() - started)
                return result
            except Exception as exc:
                tally.call(attempt, clock() - started)
                last = (
                    TimeoutError(f"no answer within {timeout:g} s")
                    if isinstance(exc, TimeoutError) and not str(exc)
                    else exc
                )
                if attempt == retry.max_attempts or not isinstance(exc, retry.retry_on):
                    break
                await asyncio.sleep(retry.wait_s(attempt))
        assert last is not None
        tally.failed += 1
        raise CallFailed(attempt, last)


class _Pace:
    """At most ``rate`` call starts a second (None: no limit), on the worker's loop."""

    def __init__(self, rate: float | None) -> None:
        self.gap = 1.0 / rate if rate else 0.0
        self.next = 0.0

    async def wait(self) -> None:
        now = asyncio.get_running_loop().time()
        at = max(now, self.next)
        self.next = at + self.gap
        if at > now:
            await asyncio.sleep(at - now)


class AsyncLookup(KeyedProcessFunction):
    """``KeyedStream.enrich_async``: each element with the fields ``lookup(key)`` answers for
    its key (an ``async def`` returning a dict), the answer kept in keyed state (``lookup``)
    for ``ttl`` of event time, so a key is looked up once per ``ttl`` (a customer's tier once
    an hour), not per element: live, event time is about the wall clock; a replay looks keys
    up per ``ttl`` of the stream's time, as the live run did. A batch's keys without a fresh
    answer are looked up at once, before its elements (``prefetch``, called by the keyed
    operator), as ``call`` says; a key whose lookup still fails after its retries fails each of
    its elements (each one a dead letter with the reason, or the job stops, by the step's error
    policy)."""

    def __init__(
        self,
        lookup: Callable[[Any], Any],
        output_schema: StructType,
        lookup_fields: list[str],
        ttl: timedelta,
        call: AsyncCall,
    ) -> None:
        self.lookup, self.call, self.ttl = lookup, call, ttl
        self.output_schema = output_schema  # type: ignore[misc]
        self.lookup_fields = lookup_fields
        self.tally = Tally()
        self.fetched: dict[Any, Any] = {}

    def open(self, ctx: Any) -> None:
        self.cache = ctx.get_state(
            ValueStateDescriptor(
                "lookup", dict, ttl=StateTtlConfig(self.ttl, time_domain=TimeDomain.EVENT_TIME)
            )
        )
        self.fetched = {}
        self.tally = Tally()  # (a task's calls)

    def needs_lookup(self) -> bool:
        """In a key's turn: whether the key has no fresh answer."""
        return self.cache.value() is None

    def prefetch(self, keys: Iterable[Any]) -> None:
        """Look ``keys`` up (as ``ctx.get_current_key()`` gives them), all at once."""
        keys = [k for k in keys if k not in self.fetched]
        if not keys:
            return
        results, _, failed = Caller(self._call, self.call, self.tally).run(keys)
        for i, key in enumerate(keys):
            self.fetched[key] = failed.get(i, results[i])

    async def _call(self, key: Any) -> dict[str, Any]:
        value = await self.lookup(key)
        if not isinstance(value, Mapping):
            raise TypeError(f"the lookup returned {type(value).__name__} {value!r:.80}, not a dict")
        return {f: value.get(f) for f in self.lookup_fields}

    def process_element(self, record: dict[str, Any], ctx: Any) -> Iterator[dict[str, Any]]:
        answer = self.cache.value()
        if answer is None:
            key = ctx.get_current_key()
            if key not in self.fetched:  # (a function driven without the operator's prefetch)
                self.prefetch([key])
            answer = self.fetched[key]
            if isinstance(answer, CallFailed):
                raise answer
            self.cache.update(answer)
        return iter(({**record, **answer},))
