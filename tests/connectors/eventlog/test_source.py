"""The event-log source."""

from __future__ import annotations

import pytest

from stateful_runtime import LogSource
from stateful_runtime.exceptions import ConfigError


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: LogSource("d", "t", {"a": str}, starting_offsets="middle"), "starting_offsets"),
    ],
)
def test_invalid_sources_are_rejected_at_construction(build, message):
    with pytest.raises(ConfigError, match=message):
        build()


def test_records_held_is_what_a_bounded_run_reads_at_most(tmp_path):
    from stateful_runtime.connectors.eventlog import EventLog
    from tests.helpers import append_lines

    source = LogSource(str(tmp_path / "log"), "t", {"k": str})
    assert source.records_held() is None  # no topic yet: cannot say
    EventLog(tmp_path / "log").create_topic("t", 3)
    assert source.records_held() == 0
    append_lines(tmp_path / "log", [b'{"k": "%d"}' % i for i in range(25)] + [b"{bad"], "t", "k")
    assert source.records_held() == 26  # a record the job will dead-letter is read too
