"""Building a process node on the worker's keyed state: what is refused, and why."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from stateful_runtime.exceptions import PlanError
from stateful_runtime.runtime.dataframes import _refuse_other_backend


def _committed(query) -> None:
    (query / "commits").mkdir(parents=True)
    (query / "commits" / "0").write_text("v1\n{}\n")


def test_a_checkpoint_keeps_the_backend_it_started_with(tmp_path):
    node = SimpleNamespace(name="count")
    spark_written, local_written, fresh = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    _committed(spark_written)
    _committed(local_written)
    (local_written / "keyed" / "count").mkdir(parents=True)
    fresh.mkdir()
    with pytest.raises(PlanError, match=r"state.backend=spark.*--set state.backend=spark"):
        _refuse_other_backend(str(spark_written), node, "rocksdb_local")
    with pytest.raises(PlanError, match=r"--set state.backend=rocksdb_local"):
        _refuse_other_backend(str(local_written), node, "spark")
    for query, backend in [(spark_written, "spark"), (local_written, "rocksdb_local")]:
        _refuse_other_backend(str(query), node, backend)
    for backend in ("spark", "rocksdb_local"):  # nothing committed yet, or explain only
        _refuse_other_backend(str(fresh), node, backend)
        _refuse_other_backend(None, node, backend)


def test_speculative_tasks_are_refused_for_keyed_state_in_the_worker():
    from stateful_runtime.exceptions import ConfigError
    from stateful_runtime.runtime.dataframes import refuse_speculation

    with pytest.raises(ConfigError, match="set spark.speculation=false for this job"):
        refuse_speculation(" True")
    refuse_speculation("false")
