"""Dead letters into a Kafka topic stay exactly once while batches are planned again with other
boundaries: the same plans as the event log's property test, on a real broker."""

from __future__ import annotations

import pytest

from stateful_runtime.connectors.kafka.dead_letters import KafkaDeadLetterSink
from tests.connectors.dead_letter_plans import Job, Source, run

PLANS = [
    # restored to the start, planned again as one large split
    [("batch", 5), ("batch", 5), ("batch", 5), ("restore", 3), ("batch", 40)],
    # killed batches leave splits of another cap staged; planned again smaller, then larger
    [
        ("batch", 7),
        ("killed", 20),
        ("batch", 3),
        ("crash_after_publish", 9),
        ("restore", 2),
        ("batch", 11),
        ("killed", 2),
        ("batch", 40),
    ],
    # a rewind's replay rejects records the first run accepted, below the topic's mark, then a
    # restore plans the replayed range again
    [("batch", 6), ("batch", 30), ("rewind", 2), ("batch", 4), ("restore", 1), ("batch", 40)],
]


@pytest.mark.parametrize("plan", range(len(PLANS)))
def test_each_rejected_record_once_whatever_the_plans(kafka, tmp_path, plan):
    source_topic, topic = f"dl-in-{plan}", f"dl-in-{plan}-dlq"
    kafka.create_topic(source_topic, 2)
    sink = KafkaDeadLetterSink(
        {"bootstrap.servers": kafka.bootstrap},
        topic,
        source="in",
        job=f"j{plan}",
        source_topics=[source_topic],
    )
    source = Source(
        2,
        40,
        {0: {0, 4, 6, 13, 21, 33}, 1: {2, 9, 10, 27, 39}},
        key=lambda p: f"{source_topic}:{p}",
        stricter={0: {1, 2, 35}, 1: {3, 11}} if plan == 2 else {},
    )

    def read() -> list[tuple[int, int]]:
        return [
            (int(h["source.partition"]), int(h["source.offset"]))
            for h in (dict((k, v.decode()) for k, v in m.headers()) for m in kafka.read(topic))
        ]

    run(Job(source, tmp_path / "staging", sink), PLANS[plan], read)
