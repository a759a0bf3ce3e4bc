"""A keyed broadcast process function through the test harness (the cluster's code): rules in
broadcast state read by every key, keyed state beside it, a broadcast element's writes undone
when it raises, apply_to_keyed_state over every key."""

from __future__ import annotations

import pytest

from examples.fraud_rules import RULES, FraudRules
from stateful_runtime import KeyedBroadcastProcessFunction, MapStateDescriptor, ValueStateDescriptor
from stateful_runtime.exceptions import ConfigError
from stateful_runtime.testing import KeyedBroadcastProcessHarness

# Every test runs on each state backend (tests/operators/conftest.py).


def pay(txn: str, payer: str, device: str, paise: int, ts: int = 0) -> dict:
    return {
        "txn_id": txn,
        "payer_id": payer,
        "device_id": device,
        "amount_paise": paise,
        "ts_ms": ts,
    }


def rule(rid: str, min_paise: int, new_only: bool = True, active: bool = True) -> dict:
    return {
        "rule_id": rid,
        "min_paise": min_paise,
        "new_device_only": new_only,
        "active": active,
        "ts_ms": 0,
    }


def harness() -> KeyedBroadcastProcessHarness:
    return KeyedBroadcastProcessHarness(
        FraudRules(), RULES, key_by="payer_id", timestamp_field="ts_ms"
    )


def test_rules_in_broadcast_state_apply_to_every_key_from_when_they_come():
    h = harness()
    assert h.process_element(pay("t1", "P1", "D1", 9_000_000)) == []  # no rule yet
    h.process_broadcast_element(rule("big-new-device", 5_000_000))
    assert h.broadcast_state("rules") == {"big-new-device": rule("big-new-device", 5_000_000)}
    assert h.process_element(pay("t2", "P1", "D1", 9_000_000)) == []  # D1 is not new for P1
    [alert] = h.process_element(pay("t3", "P2", "D1", 9_000_000))  # another key: D1 is new
    assert (alert["rule_id"], alert["new_device"]) == ("big-new-device", True)
    h.process_broadcast_element(rule("huge", 20_000_000, new_only=False))
    h.process_broadcast_element(rule("big-new-device", 0, active=False))  # withdrawn
    assert [a["rule_id"] for a in h.process_element(pay("t4", "P1", "D1", 30_000_000))] == ["huge"]
    assert h.state("P1", "devices") == {"D1": 0}


class Strict(KeyedBroadcastProcessFunction):
    """Raises on a broadcast element after writing the broadcast state; counts per key, and a
    ``reset`` element zeroes every key's count (apply_to_keyed_state)."""

    output_schema = {"k": str, "n": int}
    COUNT = ValueStateDescriptor("count", int)
    LIMITS = MapStateDescriptor("limits", str, int)

    def open(self, ctx):
        self.count = ctx.get_state(self.COUNT)

    def process_broadcast_element(self, value, ctx):
        limits = ctx.get_broadcast_state(self.LIMITS)
        limits.put(value["name"], value["limit"])
        if value["limit"] < 0:
            raise ValueError("negative limit")
        if value["name"] == "reset":
            ctx.apply_to_keyed_state(self.COUNT, lambda key, state: state.update(0))
        return ()

    def process_element(self, value, ctx):
        n = (self.count.value() or 0) + 1
        self.count.update(n)
        limit = ctx.get_broadcast_state(self.LIMITS).get("max")
        if limit is not None and n > limit:
            yield {"k": value["k"], "n": n}


def test_a_broadcast_element_that_raises_changes_nothing_and_is_dead_lettered():
    h = KeyedBroadcastProcessHarness(Strict(), Strict.LIMITS, key_by="k", timestamp_field="ts")
    h.process_broadcast_element({"name": "max", "limit": 1, "ts": 0})
    h.process_broadcast_element({"name": "max", "limit": -1, "ts": 1})
    assert h.broadcast_state("limits") == {"max": 1}
    [(record, reason)] = h.dead_letters
    assert record == {"name": "max", "limit": -1, "ts": 1}
    assert reason.startswith("Strict: process_broadcast_element (input 2) raised ValueError")
    h.process_element({"k": "a", "ts": 2})
    assert h.process_element({"k": "a", "ts": 3}) == [{"k": "a", "n": 2}]


def test_apply_to_keyed_state_reaches_every_key_with_the_state():
    h = KeyedBroadcastProcessHarness(Strict(), Strict.LIMITS, key_by="k", timestamp_field="ts")
    for k in ("a", "b", "b", "c"):
        h.process_element({"k": k, "ts": 0})
    h.process_broadcast_element({"name": "reset", "limit": 0, "ts": 1})
    assert [h.state(k, "count") for k in ("a", "b", "c")] == [0, 0, 0]
    h.process_element({"k": "b", "ts": 2})
    assert h.state("b", "count") == 1


def test_a_broadcast_state_not_given_to_broadcast_is_refused():
    class Other(Strict):
        def process_element(self, value, ctx):
            ctx.get_broadcast_state(MapStateDescriptor("other", str, int))
            return ()

    h = KeyedBroadcastProcessHarness(Other(), Strict.LIMITS, key_by="k", timestamp_field="ts")
    with pytest.raises(ConfigError, match="pass it to broadcast"):
        h.process_element({"k": "a", "ts": 0})


def test_keyed_state_written_by_a_broadcast_element_is_refused_naming_the_way():
    class Keyed(Strict):
        def process_broadcast_element(self, value, ctx):
            self.count.update(1)
            return ()

    h = KeyedBroadcastProcessHarness(Keyed(), Strict.LIMITS, key_by="k", timestamp_field="ts")
    with pytest.raises(ConfigError, match="ctx.apply_to_keyed_state"):
        h.process_broadcast_element({"name": "max", "limit": 1, "ts": 0})
