"""Building a process node on the worker's keyed state: what is refused, and why."""

from __future__ import annotations

import pytest


def test_speculative_tasks_are_refused_for_keyed_state_in_the_worker():
    from stateful_runtime.exceptions import ConfigError
    from stateful_runtime.runtime.dataframes import refuse_speculation

    with pytest.raises(ConfigError, match="set spark.speculation=false for this job"):
        refuse_speculation(" True")
    refuse_speculation("false")
