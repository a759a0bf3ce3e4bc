"""Checkpoints and savepoints of the removed ``state.backend=spark`` run on in the engine.

The fixtures (``spark_backend_fixtures.py``) hold each stateful example job's checkpoint, and a
job of every state kind, after the first half of its input, as that backend wrote them. The
state must come over whole at the same batch (every state, TTL and timer as ``srt state
inspect`` read it through Spark), and the second half must leave the sinks as that backend
left them."""

from __future__ import annotations

import json
import pickle
import tarfile
from pathlib import Path

import pytest

from stateful_runtime.checkpoints import keyed
from stateful_runtime.checkpoints.layout import CheckpointLayout, QueryLayout
from stateful_runtime.checkpoints.migrate import SET_ASIDE, written_by_spark_backend
from stateful_runtime.checkpoints.restore import relocate_operator_metadata
from stateful_runtime.checkpoints.state_reader import inspect
from stateful_runtime.planner import plan
from stateful_runtime.runtime.loader import load_job_file
from stateful_runtime.runtime.runner import migrate_spark_backend
from tests.checkpoints.spark_backend_fixtures import (
    FIXTURES,
    HERE,
    append,
    outputs,
    run_job,
    settings_for,
    state_of,
)
from tests.helpers import ROOT

pytestmark = pytest.mark.slow


def _lay_out(name: str, root: Path) -> dict:
    with tarfile.open(HERE / f"{name}.tar.gz") as tar:
        tar.extractall(root, filter="data")
    return json.loads((root / "fixture.json").read_text())


def _job_file(name: str, root: Path, meta: dict, **more: str):  # noqa: ANN202
    values = {**settings_for(FIXTURES[name], root), "state.backend": "rocksdb_local", **more}
    return load_job_file(ROOT / meta["job"], values)


def _queries(root: Path) -> list[QueryLayout]:
    ckpt = CheckpointLayout(root / "checkpoint")
    return [ckpt.query(q) for q in json.loads(ckpt.marker.read_text())["queries"]]


def _without_timer_rows(found: dict[str, list[str]]) -> dict[str, list[str]]:
    """The sinks less the rows of processing-time timers: the backend fired them in the hour
    after the fixture was made, the engine fires them when it first runs (they are due)."""
    return {k: [r for r in rows if "'recent-timer'" not in r] for k, rows in found.items()}


def _spark_timers(spark, query: QueryLayout) -> list[tuple[tuple, int]]:
    """The timers Spark's state store holds for the query's operator at its last batch."""
    relocate_operator_metadata(query, query)  # (laid out elsewhere than where it was written)
    rows = (
        spark.read.format("statestore")
        .option("path", str(query.root))
        .option("batchId", query.last_committed())
        .option("readRegisteredTimers", "true")
        .load()
        .collect()
    )
    return sorted((tuple(r["key"]), r["expiration_timestamp_ms"]) for r in rows)


def _engine_timers(query: QueryLayout, operator: Path) -> list[tuple[tuple, int]]:
    """The timers of the engine's timer index at the query's last batch, in every partition."""
    version = query.last_committed() + 1
    found = []
    for part in sorted(p for p in operator.iterdir() if p.is_dir()):
        for row in keyed.state_at(part, version):
            group, tag, rest = keyed.parse_row(row)
            if tag == keyed.TIMER_ROW:
                found.append((pickle.loads(rest[8:]), keyed.decode_ts(rest[:8])))
    return sorted(found)


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_the_spark_backends_state_moves_whole_and_the_job_runs_on(spark, tmp_path, name):
    meta = _lay_out(name, tmp_path)
    moved = [q for q in _queries(tmp_path) if written_by_spark_backend(q)]
    assert moved  # the fixture holds the removed backend's state
    batches = {q.root.name: q.last_committed() for q in moved}
    jf = _job_file(name, tmp_path, meta)

    timers = {q.root.name: _spark_timers(spark, q) for q in moved}
    assert any(timers.values())

    notes = migrate_spark_backend(
        spark, CheckpointLayout(tmp_path / "checkpoint"), plan(jf.job).queries
    )

    assert len(notes) == len(moved)
    for q in moved:
        assert not written_by_spark_backend(q) and (q.root / SET_ASIDE).is_dir()
        assert q.last_committed() == batches[q.root.name]  # the same batch
        [operator] = keyed.operators(q.root)
        assert keyed.recorded(operator, batches[q.root.name] + 1) is not None
        assert _engine_timers(q, operator) == timers[q.root.name]
    # Every state, map entry, TTL expiry, as the backend held them.
    assert state_of(inspect(None, tmp_path / "checkpoint", limit=10_000_000)) == meta["state"]

    append(tmp_path / "log", FIXTURES[name], meta["second"])
    run_job(jf, tmp_path, meta["second"])
    got = outputs(tmp_path, set(meta["second"]))
    assert _without_timer_rows(got) == _without_timer_rows(meta["outputs"])


def test_a_savepoint_of_the_spark_backend_restores_into_the_engine(spark, tmp_path):
    meta = _lay_out("fraud_rate_limit", tmp_path)
    [savepoint] = [p.name for p in (tmp_path / "savepoints").iterdir() if p.is_dir()]
    append(tmp_path / "log", FIXTURES["fraud_rate_limit"], meta["second"])
    fresh = {"checkpoint.dir": str(tmp_path / "restored")}
    jf = _job_file("fraud_rate_limit", tmp_path, meta, **fresh)

    out = run_job(jf, tmp_path, meta["second"], from_savepoint=savepoint)

    assert "removed state.backend=spark" in out, out
    [query] = [CheckpointLayout(tmp_path / "restored").query(q) for q in ["fraud-counter"]]
    assert keyed.operators(query.root) and (query.root / SET_ASIDE).is_dir()
    assert outputs(tmp_path, set(meta["second"])) == meta["outputs"]
